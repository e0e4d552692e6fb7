//! Who may use the gateway: API tokens issued and revoked.
//!
//! A token is a bearer secret bound to one team and one role. Only its SHA-256 travels and is
//! kept; the secret is shown once, to whoever issued it. The gateway projects these events
//! into its token table, so every gateway instance, after any restart, knows the same tokens,
//! and the stream is the audit trail of who granted what to whom.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::envelope::EventKind;
use crate::subject;

domain_events! {
    /// API tokens.
    pub enum AccessEvent in "access" {
        /// A token was issued.
        TokenIssued(TokenIssued) = "token_issued",
        /// A token was revoked: it is refused from now on.
        TokenRevoked(TokenRevoked) = "token_revoked",
    }
}

impl EventKind for AccessEvent {
    fn event_type(&self) -> String {
        AccessEvent::event_type(self)
    }
    fn nats_subject(&self) -> String {
        subject::access(self.name(), &self.entity())
    }
    /// The token's team.
    fn entity(&self) -> String {
        match self {
            Self::TokenIssued(e) => e.team.clone(),
            Self::TokenRevoked(e) => e.team.clone(),
        }
    }
    fn team(&self) -> Option<&str> {
        Some(match self {
            Self::TokenIssued(e) => &e.team,
            Self::TokenRevoked(e) => &e.team,
        })
    }
}

/// What a token's holder may do.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TokenRole {
    /// Everything, for every team, including issuing tokens.
    Admin,
    /// Reads every team's work and may abort any of it.
    Operator,
    /// Reads, submits and aborts its own team's work.
    Member,
    /// Reads its own team's work.
    Viewer,
}

impl TokenRole {
    /// Every role, most powerful first.
    pub const ALL: [TokenRole; 4] = [Self::Admin, Self::Operator, Self::Member, Self::Viewer];

    /// The name as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Operator => "operator",
            Self::Member => "member",
            Self::Viewer => "viewer",
        }
    }

    /// The role named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

impl std::fmt::Display for TokenRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A token was issued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenIssued {
    /// The token's public id (the first 12 hex digits of its hash), shown in logs and in
    /// the names of what its holder did.
    pub token_id: String,
    /// SHA-256 of the token, lowercase hex. The token itself is never published.
    pub sha256: String,
    /// The team it acts for.
    pub team: String,
    /// What it may do.
    pub role: TokenRole,
    /// Who issued it (`admin`, or the gateway caller's name).
    pub by: String,
    /// A note for people (what it is for).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// When it stops being accepted, if ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<DateTime<Utc>>,
}

/// A token was revoked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRevoked {
    /// The token's public id.
    pub token_id: String,
    /// The team it acted for (the subject's key).
    pub team: String,
    /// Who revoked it.
    pub by: String,
}
