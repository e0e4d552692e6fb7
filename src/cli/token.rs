//! `allot token create --team T --role R`: issues a gateway API token and prints it, once.
//! `allot token revoke ID`: revokes one.
//!
//! The token is made here and only its SHA-256 is published (`TokenIssued` on
//! `allot.access.token_issued.<team>`, the ACCESS stream): every gateway learns it from there.
//! A revocation is a `TokenRevoked` on the same stream, published only for a token the stream
//! says was issued and not revoked yet; every gateway refuses the token once it reads it.
//! Both are the platform operators' (the admin login; a team's login is refused with exit 2),
//! as are `POST /api/v1/tokens` and `DELETE /api/v1/tokens/{id}` with an admin token.
//!
//! | exit | meaning |
//! |---|---|
//! | 0 | issued (the token is on standard output), revoked, or already revoked |
//! | 1 | the bus could not be reached; nothing was issued or revoked |
//! | 2 | bad flags (team, role, expiry, id), no such token, or a team's login |

use std::process::ExitCode;

use anyhow::Context as _;
use async_nats::jetstream;
use clap::{Args, Subcommand};

use allot_bus::Publisher;
use allot_bus::streams::names;
use allot_events::access::{TokenRevoked, TokenRole};
use allot_events::{AccessEvent, AnyEvent, subject};

use super::local;
use super::remediation::Target;
use super::settings::Lookup;

/// `allot token …`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Issue a token for the gateway's API and dashboard; it is printed once.
    Create(CreateArgs),
    /// Revoke a token: every gateway refuses it once it reads the revocation.
    Revoke(RevokeArgs),
}

/// Flags of `allot token revoke`.
#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The token's id, as `allot token create` printed it (12 hex digits; not the secret).
    pub id: String,
    #[command(flatten)]
    pub target: Target,
}

/// Flags of `allot token create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The team it acts for.
    #[arg(long)]
    pub team: String,
    /// admin, operator, member or viewer.
    #[arg(long)]
    pub role: String,
    /// What it is for (kept with it).
    #[arg(long, default_value = "")]
    pub description: String,
    /// How long it is accepted (e.g. `30d`; default: until revoked).
    #[arg(long)]
    pub expires_in: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

/// Runs `allot token …`.
pub async fn token(cmd: TokenCommand, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    match cmd {
        TokenCommand::Create(args) => create(args, env).await,
        TokenCommand::Revoke(args) => revoke(args, env).await,
    }
}

async fn create(args: CreateArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let mut problems = Vec::new();
    let role = TokenRole::parse(&args.role);
    if role.is_none() {
        problems.push(format!(
            "--role {:?}: use admin, operator, member or viewer",
            args.role
        ));
    }
    if let Err(e) = subject::validate_token("team", &args.team) {
        problems.push(format!("--team: {e}"));
    }
    let expires = match args.expires_in.as_deref().map(humantime::parse_duration) {
        None => None,
        Some(Ok(d)) => chrono::Duration::from_std(d)
            .ok()
            .and_then(|d| chrono::Utc::now().checked_add_signed(d))
            .or_else(|| {
                problems.push("--expires-in: too far in the future".to_owned());
                None
            }),
        Some(Err(e)) => {
            problems.push(format!("--expires-in: {e}"));
            None
        }
    };
    let Some(role) = role.filter(|_| problems.is_empty()) else {
        for p in problems {
            eprintln!("allot: {p}");
        }
        eprintln!("allot: nothing was issued");
        return Ok(ExitCode::from(2));
    };
    let Some(connection) = operators_connection(&args.target, env, "issued").await? else {
        return Ok(ExitCode::from(2));
    };
    let secret = allot_gateway::token::generate();
    let by = env("ALLOT_SUBMITTER").unwrap_or_else(|| "admin (allot token create)".to_owned());
    let event =
        allot_gateway::token::issued(&secret, &args.team, role, &by, &args.description, expires);
    let id = event.token_id.clone();
    Publisher::new(connection.client.clone(), "/allot/cli")
        .publish(AccessEvent::TokenIssued(event))
        .await
        .context("publishing the token; it was not issued")?;
    connection.client.drain().await.ok();
    eprintln!(
        "allot: issued token {id} ({role} of team {}); it is shown only now",
        args.team
    );
    println!("{secret}");
    Ok(ExitCode::SUCCESS)
}

/// The connection to the bus of `target`, if its login is the platform operators' (tokens are
/// theirs); a team's login is told so (nothing was `done`) and gets `None`.
async fn operators_connection(
    target: &Target,
    env: Lookup<'_>,
    done: &str,
) -> anyhow::Result<Option<local::Connection>> {
    let nothing = format!("nothing was {done}");
    let connection = local::connect_client(
        "allot-token",
        target.nats.as_deref(),
        target.data_dir.as_deref(),
        env,
        &nothing,
    )
    .await?;
    if let Some(team) = &connection.team {
        eprintln!(
            "allot: tokens are {done} by the platform's operators; the login from {} is team \
             {team}'s; {nothing}",
            connection.origin
        );
        return Ok(None);
    }
    Ok(Some(connection))
}

/// Whether `id` has the shape of a token id: the first 12 hex digits of the token's SHA-256.
fn is_token_id(id: &str) -> bool {
    id.len() == 12
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `allot token revoke ID`.
async fn revoke(args: RevokeArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    if !is_token_id(&args.id) {
        eprintln!(
            "allot: {:?} is not a token id (12 lowercase hex digits, as `allot token create` \
             printed; not the token itself); nothing was revoked",
            args.id
        );
        return Ok(ExitCode::from(2));
    }
    let Some(connection) = operators_connection(&args.target, env, "revoked").await? else {
        return Ok(ExitCode::from(2));
    };
    // What the stream says of it: the team it was issued for, and whether it was revoked.
    let js = jetstream::new(connection.client.clone());
    let stored = super::costs::read(&js, names::ACCESS, subject::ACCESS_ALL)
        .await
        .context("reading the tokens issued; nothing was revoked")?;
    let mut team = None;
    let mut revoked = false;
    for message in &stored {
        match allot_events::decode(&message.payload).map(|e| e.data) {
            Ok(AnyEvent::Access(AccessEvent::TokenIssued(t))) if t.token_id == args.id => {
                team = Some(t.team);
            }
            Ok(AnyEvent::Access(AccessEvent::TokenRevoked(t))) if t.token_id == args.id => {
                revoked = true;
            }
            _ => {}
        }
    }
    let Some(team) = team else {
        eprintln!(
            "allot: no token {} was issued (`GET /api/v1/tokens` lists them); nothing was revoked",
            args.id
        );
        return Ok(ExitCode::from(2));
    };
    if revoked {
        eprintln!("allot: token {} (team {team}) was already revoked", args.id);
        return Ok(ExitCode::SUCCESS);
    }
    let by = env("ALLOT_SUBMITTER").unwrap_or_else(|| "admin (allot token revoke)".to_owned());
    Publisher::new(connection.client.clone(), "/allot/cli")
        .publish(AccessEvent::TokenRevoked(TokenRevoked {
            token_id: args.id.clone(),
            team: team.clone(),
            by,
        }))
        .await
        .context("publishing the revocation; the token was not revoked")?;
    connection.client.drain().await.ok();
    eprintln!(
        "allot: revoked token {} (team {team}); every gateway refuses it once it reads this",
        args.id
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_id_is_twelve_lowercase_hex_digits() {
        assert!(is_token_id("0123456789ab"));
        assert!(!is_token_id("0123456789AB"));
        assert!(!is_token_id("0123456789a"));
        assert!(!is_token_id("0123456789abc"));
        assert!(!is_token_id("0123456789ag"));
    }
}
