//! `allot bench …`: benchmarks that need a real nats-server.

use std::process::ExitCode;

use clap::Subcommand;

use super::settings::Lookup;

/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Telemetry ingest: collector → JetStream → inventory SQLite, against raw JetStream.
    Telemetry,
}

/// Runs a benchmark.
pub async fn bench(cmd: BenchCommand, _env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Telemetry => anyhow::bail!("not implemented yet"),
    }
}
