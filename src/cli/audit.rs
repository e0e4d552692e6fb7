//! `allot audit …`: the hash-chained archive of the DECISIONS stream.
//!
//! - `allot audit archive --nats URL --db PATH` copies the stream into the archive up to its
//!   current end and exits (the long-running archiver is `allot_archiver::run`).
//! - `allot audit verify --db PATH [--expect-head HASH] [--expect-count N]` walks the chain
//!   and prints a summary (exit 0) or the first bad record (exit 1). It needs only the file.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use allot_archiver::chain::{self, hex};
use allot_store::rusqlite::{Connection, OpenFlags};

use super::settings::Lookup;
use super::{local, shutdown_on_signal};

/// The audit archive.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Copy the DECISIONS stream into the archive, up to its current end, and exit.
    Archive(ArchiveArgs),
    /// Check the archive's hash chain; name the first edited, dropped or reordered record.
    Verify(VerifyArgs),
}

/// Flags of `allot audit archive`.
#[derive(Debug, Args)]
pub struct ArchiveArgs {
    /// NATS URL (ALLOT_NATS_URL; default: ./.allot/nats.url, then nats://127.0.0.1:4222).
    #[arg(long)]
    pub nats: Option<String>,
    /// The archive file (created if missing).
    #[arg(long)]
    pub db: PathBuf,
    /// Durable consumer name. Keep it apart from a running archiver's (`archiver`): two
    /// writers on one consumer would take each other's messages.
    #[arg(long, default_value = "audit-archive")]
    pub consumer: String,
}

/// Flags of `allot audit verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The archive file (default: `archive.db` of the data folder, which `allot up`'s archiver
    /// keeps).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Folder where `allot up` keeps its state (ALLOT_DATA_DIR; default `.allot`).
    #[arg(long, conflicts_with = "db")]
    pub data_dir: Option<PathBuf>,
    /// A head hash you were given earlier (64 hex digits): the chain must still pass through
    /// it. Detects a cut tail and a rewritten chain.
    #[arg(long, value_parser = parse_head)]
    pub expect_head: Option<chain::Hash>,
    /// How many records the archive held when you were given that head: it must hold at
    /// least that many, and with --expect-head the head must be exactly that record.
    #[arg(long)]
    pub expect_count: Option<u64>,
}

fn parse_head(text: &str) -> Result<chain::Hash, String> {
    chain::parse_hash(text).ok_or_else(|| "expected a SHA-256 as 64 hex digits".to_owned())
}

/// Runs an audit command.
pub async fn audit(cmd: AuditCommand, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    match cmd {
        AuditCommand::Archive(args) => archive(args, env).await,
        AuditCommand::Verify(args) => verify(&args, env),
    }
}

async fn archive(args: ArchiveArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let (url, origin) = local::instance_url(args.nats.as_deref(), None, env)?;
    let mut config = allot_archiver::Config::new(url.clone(), &args.db);
    config.durable = args.consumer;
    let (_trigger, shutdown) = shutdown_on_signal();
    let done = allot_archiver::catch_up(config, shutdown)
        .await
        .with_context(|| {
            format!(
                "archiving from {} (from {origin}) into {}",
                allot_bus::users::without_credentials(&url),
                args.db.display()
            )
        })?;
    let conn = allot_archiver::open(&args.db)?;
    let head = chain::head(&conn)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "archived {} new records; the stream ended at seq {} when the pass began",
        done.appended, done.stream_last
    )?;
    match head {
        Some(h) => writeln!(
            out,
            "archive head: seq {} (record {}), hash {}",
            h.seq,
            h.position,
            hex(&h.hash)
        )?,
        None => writeln!(out, "archive is empty")?,
    }
    Ok(ExitCode::SUCCESS)
}

fn verify(args: &VerifyArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let db = match &args.db {
        Some(db) => db.clone(),
        None => args
            .data_dir
            .clone()
            .or_else(|| env("ALLOT_DATA_DIR").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(".allot"))
            .join("archive.db"),
    };
    if !db.exists() {
        bail!(
            "no archive at {} (give --db FILE, or run this where `allot up` keeps its state)",
            db.display()
        );
    }
    // Read-only: an auditor's check must not change the file it checks.
    let conn = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .with_context(|| format!("opening {}", db.display()))?;
    let expect = chain::Expect {
        head: args.expect_head,
        count: args.expect_count,
    };
    let mut out = std::io::stdout().lock();
    match chain::verify_against(&conn, &expect) {
        Ok(s) => {
            writeln!(out, "archive {}: chain intact", db.display())?;
            writeln!(out, "  records   {}", s.records)?;
            if let (Some(first), Some(last)) = (s.first_seq, s.last_seq) {
                writeln!(out, "  sequences {first}..={last}")?;
            }
            writeln!(out, "  head      {}", hex(&s.head))?;
            if let Some((position, seq)) = s.pinned {
                writeln!(
                    out,
                    "  pinned head found at record {position} (seq {seq}); {} records after it",
                    s.records - position
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(broken) => {
            writeln!(out, "archive {}: chain BROKEN", db.display())?;
            writeln!(out, "{broken}")?;
            Ok(ExitCode::FAILURE)
        }
    }
}
