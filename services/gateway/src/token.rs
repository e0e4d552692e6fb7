//! Bearer tokens: made, hashed and checked; and what each role may do.
//!
//! A token is `allot_` and 64 hex digits: 256 bits from a CSPRNG seeded by the OS. Only its
//! SHA-256 is published (`TokenIssued`) and stored. A plain hash is enough: the secret has full
//! entropy, so nothing short of a preimage attack on SHA-256 turns a leaked table back into
//! tokens — the reason password stores need slow hashes (guessable secrets) does not apply, and
//! checking a request stays a microsecond. Lookups go by hash, so comparing against a stored
//! secret (and its timing) never happens.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use rand::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};

use allot_events::access::{TokenIssued, TokenRole};

/// What every token starts with (so a leaked one is recognisable by secret scanners).
pub const PREFIX: &str = "allot_";

/// A new random token.
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::StdRng::from_os_rng().fill_bytes(&mut bytes);
    format!("{PREFIX}{}", hex(&bytes))
}

/// The SHA-256 of `token`, lowercase hex: what is published and stored.
pub fn sha256_hex(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

/// A token's public id: the first 12 hex digits of its hash.
pub fn token_id(sha256: &str) -> String {
    sha256.chars().take(12).collect()
}

/// The `TokenIssued` event for `token`.
pub fn issued(
    token: &str,
    team: &str,
    role: TokenRole,
    by: &str,
    description: &str,
    expires: Option<DateTime<Utc>>,
) -> TokenIssued {
    let sha256 = sha256_hex(token);
    TokenIssued {
        token_id: token_id(&sha256),
        sha256,
        team: team.to_owned(),
        role,
        by: by.to_owned(),
        description: description.to_owned(),
        expires,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Who is calling: the token's id, team and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's public id.
    pub token_id: String,
    /// The team it acts for.
    pub team: String,
    /// What it may do.
    pub role: TokenRole,
}

impl Caller {
    /// How the caller is named in the events it causes: `token:<id> (<role> of <team>)`.
    pub fn name(&self) -> String {
        format!("token:{} ({} of {})", self.token_id, self.role, self.team)
    }

    /// Whether it sees every team's work (admins and operators) or only its own.
    pub fn sees_all(&self) -> bool {
        matches!(self.role, TokenRole::Admin | TokenRole::Operator)
    }

    /// Whether it may see `team`'s objects (otherwise they do not exist for it: 404).
    pub fn sees(&self, team: &str) -> bool {
        self.sees_all() || self.team == team
    }

    /// The team to restrict a listing to: `None` for those who see all (unless they ask
    /// for one), the caller's own team for everyone else.
    pub fn scope<'a>(&'a self, asked: Option<&'a str>) -> Option<&'a str> {
        if self.sees_all() {
            asked
        } else {
            Some(&self.team)
        }
    }

    /// Whether it may submit work for `team`.
    pub fn may_submit(&self, team: &str) -> bool {
        match self.role {
            TokenRole::Admin => true,
            TokenRole::Member => self.team == team,
            TokenRole::Operator | TokenRole::Viewer => false,
        }
    }

    /// Whether it may abort `team`'s work (operators may abort anything).
    pub fn may_abort(&self, team: &str) -> bool {
        match self.role {
            TokenRole::Admin | TokenRole::Operator => true,
            TokenRole::Member => self.team == team,
            TokenRole::Viewer => false,
        }
    }

    /// Whether it may issue tokens.
    pub fn may_issue_tokens(&self) -> bool {
        self.role == TokenRole::Admin
    }
}

/// One known token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    /// Its public id.
    pub token_id: String,
    /// Its team.
    pub team: String,
    /// Its role.
    pub role: TokenRole,
    /// When it stops being accepted.
    pub expires: Option<DateTime<Utc>>,
    /// Revoked.
    pub revoked: bool,
}

/// The tokens the gateway accepts, by hash.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    by_hash: HashMap<String, Known>,
}

impl Tokens {
    /// Adds (or replaces) the token with hash `sha256`. A revocation is for good: a token
    /// revoked here stays revoked whatever an older read of the read model says.
    pub fn insert(&mut self, sha256: String, mut known: Known) {
        known.revoked |= self.by_hash.get(&sha256).is_some_and(|k| k.revoked);
        self.by_hash.insert(sha256, known);
    }

    /// The token with public id `token_id`, if known.
    pub fn by_id(&self, token_id: &str) -> Option<&Known> {
        self.by_hash.values().find(|k| k.token_id == token_id)
    }

    /// Refuses the token with public id `token_id` from now on.
    pub fn revoke(&mut self, token_id: &str) {
        for known in self.by_hash.values_mut() {
            if known.token_id == token_id {
                known.revoked = true;
            }
        }
    }

    /// The caller presenting `token` at `now`, if it is known, not revoked and not expired.
    pub fn authenticate(&self, token: &str, now: DateTime<Utc>) -> Option<Caller> {
        let known = self.by_hash.get(&sha256_hex(token))?;
        if known.revoked || known.expires.is_some_and(|e| e <= now) {
            return None;
        }
        Some(Caller {
            token_id: known.token_id.clone(),
            team: known.team.clone(),
            role: known.role,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_found_by_its_hash_and_refused_once_revoked_or_expired() {
        let token = generate();
        assert!(token.starts_with(PREFIX) && token.len() == PREFIX.len() + 64);
        assert_ne!(token, generate());
        let e = issued(&token, "vision", TokenRole::Member, "admin", "ci", None);
        assert_eq!(e.sha256.len(), 64);
        assert!(!e.sha256.contains(&token[PREFIX.len()..]));
        let mut tokens = Tokens::default();
        let known = Known {
            token_id: e.token_id.clone(),
            team: e.team.clone(),
            role: e.role,
            expires: None,
            revoked: false,
        };
        tokens.insert(e.sha256.clone(), known.clone());
        let now = Utc::now();
        let caller = tokens.authenticate(&token, now).expect("known");
        assert_eq!(caller.team, "vision");
        assert_eq!(caller.role, TokenRole::Member);
        assert!(tokens.authenticate(&generate(), now).is_none());
        assert!(tokens.authenticate("", now).is_none());

        tokens.insert(
            e.sha256.clone(),
            Known {
                expires: Some(now),
                ..known.clone()
            },
        );
        assert!(tokens.authenticate(&token, now).is_none(), "expired");
        tokens.insert(
            e.sha256,
            Known {
                revoked: true,
                ..known
            },
        );
        assert!(tokens.authenticate(&token, now).is_none(), "revoked");
    }
}
