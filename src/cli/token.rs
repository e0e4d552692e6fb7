//! `allot token create --team T --role R`: issues a gateway API token and prints it, once.
//!
//! The token is made here and only its SHA-256 is published (`TokenIssued` on
//! `allot.access.token_issued.<team>`, the ACCESS stream): every gateway learns it from there.
//! Issuing is the platform operators' (the admin login; a team's login is refused with
//! exit 2), as is `POST /api/v1/tokens` with an admin token.
//!
//! | exit | meaning |
//! |---|---|
//! | 0 | issued; the token is on standard output |
//! | 1 | the bus could not be reached; nothing was issued |
//! | 2 | bad flags (team, role, expiry), or a team's login |

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use allot_bus::Publisher;
use allot_events::AccessEvent;
use allot_events::access::TokenRole;
use allot_events::subject;

use super::local;
use super::remediation::Target;
use super::settings::Lookup;

/// `allot token …`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Issue a token for the gateway's API and dashboard; it is printed once.
    Create(CreateArgs),
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
    let TokenCommand::Create(args) = cmd;
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
    let connection = local::connect_client(
        "allot-token",
        args.target.nats.as_deref(),
        args.target.data_dir.as_deref(),
        env,
        "nothing was issued",
    )
    .await?;
    if let Some(team) = &connection.team {
        eprintln!(
            "allot: tokens are issued by the platform's operators; the login from {} is team \
             {team}'s; nothing was issued",
            connection.origin
        );
        return Ok(ExitCode::from(2));
    }
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
