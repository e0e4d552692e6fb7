//! `allot nats-config`: per-team isolation on the bus (see `allot_bus::accounts`).
//!
//! - `allot nats-config --teams teams.yaml [--out DIR] [--url URL]` writes `accounts.conf` (the
//!   `accounts { … }` block to include from the server's configuration), one credentials file
//!   per user (`platform.credentials.json`, `team-<team>.credentials.json`) and each team
//!   stream's configuration (`COSTS_<team>.stream.json`), and prints what it wrote. Every run
//!   draws new passwords.
//! - `allot nats-config --teams teams.yaml --ensure-streams --credentials DIR/platform.credentials.json`
//!   connects as the platform user and creates (or puts back) COSTS and every team's stream.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use allot_bus::accounts::{self, Accounts, Credentials};
use allot_workload::TeamsConfig;

/// Flags of `allot nats-config`.
#[derive(Debug, Args)]
pub struct NatsConfigArgs {
    /// The teams file: one NATS account per team listed.
    #[arg(long)]
    pub teams: PathBuf,
    /// Where to write the configuration and credentials (created if missing).
    #[arg(long, default_value = "nats-config")]
    pub out: PathBuf,
    /// The server URL(s) written into the credentials files.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub url: String,
    /// Instead of generating: create or update COSTS and every team's stream, as the platform
    /// user of `--credentials`, on a server already running the generated configuration.
    #[arg(long, requires = "credentials")]
    pub ensure_streams: bool,
    /// The platform user's credentials file (for --ensure-streams).
    #[arg(long)]
    pub credentials: Option<PathBuf>,
    /// Stream replicas (1 on one server, 3 on a cluster; for --ensure-streams).
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
}

/// Runs `allot nats-config`.
pub async fn nats_config(args: NatsConfigArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.teams)
        .with_context(|| format!("reading the teams file {}", args.teams.display()))?;
    // The loader lists every problem of the file at once.
    let teams = TeamsConfig::from_yaml(&text).with_context(|| args.teams.display().to_string())?;
    let names: Vec<&str> = teams.teams.iter().map(|t| t.name.as_str()).collect();
    if args.ensure_streams {
        let Some(path) = args.credentials.as_deref() else {
            bail!("--ensure-streams needs --credentials (the platform user's file)");
        };
        return ensure(path, &names, args.replicas).await;
    }
    let generated =
        Accounts::generate_random(&names).with_context(|| args.teams.display().to_string())?;
    for path in write_all(&generated, &args.out, &args.url)? {
        println!("wrote {}", path.display());
    }
    println!(
        "next: add `include \"{}\"` to the server's configuration (beside `jetstream {{ … }}`), \
         reload it, then run `allot nats-config --teams {} --ensure-streams --credentials {}`",
        args.out.join(ACCOUNTS_FILE).display(),
        args.teams.display(),
        args.out.join(PLATFORM_FILE).display()
    );
    Ok(ExitCode::SUCCESS)
}

const ACCOUNTS_FILE: &str = "accounts.conf";
const PLATFORM_FILE: &str = "platform.credentials.json";

/// Writes every file into `out` and returns their paths, secrets readable by the owner only.
fn write_all(generated: &Accounts, out: &Path, url: &str) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut written = Vec::new();
    let mut write = |name: String, text: String| -> anyhow::Result<()> {
        let path = out.join(name);
        write_private(&path, &text)?;
        written.push(path);
        Ok(())
    };
    write(ACCOUNTS_FILE.to_owned(), generated.render())?;
    write(
        PLATFORM_FILE.to_owned(),
        json(&generated.platform_credentials(url))?,
    )?;
    for team in generated.team_names() {
        let creds = generated
            .team_credentials(team, url)
            .context("a generated team has credentials")?;
        write(format!("{}.credentials.json", creds.user), json(&creds)?)?;
        write(
            format!("{}.stream.json", accounts::team_stream(team)),
            json(&accounts::team_stream_config(team, 1))?,
        )?;
    }
    Ok(written)
}

fn json(value: &impl serde::Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(value)? + "\n")
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

async fn ensure(credentials: &Path, teams: &[&str], replicas: usize) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(credentials)
        .with_context(|| format!("reading {}", credentials.display()))?;
    let creds: Credentials = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a credentials file", credentials.display()))?;
    let servers = allot_bus::server_list(&creds.url);
    let client = creds
        .connect_options()
        .name("allot-nats-config")
        .connect(servers)
        .await
        .with_context(|| format!("connecting to {} as {}", creds.url, creds.user))?;
    let js = allot_bus::async_nats::jetstream::new(client.clone());
    for (name, outcome) in allot_bus::ensure_streams(&js, &allot_bus::catalog(replicas)).await? {
        println!("{name}: {outcome:?}");
    }
    for (name, outcome) in allot_bus::ensure_team_streams(&client, teams, replicas).await? {
        println!("{name}: {outcome:?}");
    }
    client.flush().await?;
    Ok(ExitCode::SUCCESS)
}
