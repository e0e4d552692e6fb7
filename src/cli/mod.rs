//! The `allot` command line.
//!
//! - [`up`]: everything in one process against an embedded nats-server, with a simulated
//!   cluster (laptops, CI).
//! - [`run`]: one service, for Kubernetes.
//! - [`status`]: the cluster as the inventory sees it.
//! - [`workload`]: `allot validate` and `allot submit` — check a workload spec, publish it once.
//! - [`workloads`]: `allot workloads` and `allot workload ID` — what the planner knows of them.
//! - [`follow`]: what `allot submit --wait`/`--follow` make of a workload's events (pure), and
//!   [`watch`]: the consumers that feed it from the bus.
//! - [`sim`]: trace-driven simulation of the scheduling policies (`allot sim`).
//! - [`audit`]: the hash-chained archive of the decision log (`allot audit archive|verify`).
//! - [`remediation`]: an operator's `allot cordon` / `allot uncordon`, and `allot remediation
//!   log`.
//! - [`bench`]: benchmarks that need the real bus (`allot bench telemetry`, `submit`,
//!   `remediation`).
//! - [`settings`]: flags and `ALLOT_*` variables, all problems reported at once.
//! - [`nats_config`]: per-team NATS accounts and credentials, and the teams' cost streams.
//! - [`local`]: the embedded nats-server and how client commands find it (`./.allot/`), and
//!   [`auth`]: its users — one per role, their credentials in `./.allot/auth/`.

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

pub mod abort;
pub mod audit;
pub mod auth;
pub mod bench;
pub mod costs;
pub mod follow;
pub mod local;
pub mod nats_config;
pub mod plots;
pub mod predict;
pub mod queue;
pub mod remediation;
pub mod replay;
pub mod run;
pub mod settings;
pub mod sim;
pub mod status;
pub mod token;
pub mod up;
pub mod watch;
pub mod workload;
pub mod workloads;

/// Allot: an elastic GPU service for shared GPU pools.
#[derive(Debug, Parser)]
#[command(name = "allot", version, about)]
pub struct Cli {
    /// Log filter (e.g. `info`, `allot_inventory=debug`); also ALLOT_LOG.
    #[arg(long, global = true)]
    pub log: Option<String>,
    /// Log format: `text` or `json`; also ALLOT_LOG_FORMAT.
    #[arg(long, global = true)]
    pub log_format: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every service in one process with a simulated GPU cluster.
    Up(up::UpArgs),
    /// Run one service (for Kubernetes or a real GPU node).
    Run(run::RunArgs),
    /// Show nodes, GPUs, health and utilization.
    Status(status::StatusArgs),
    /// Check a workload spec (YAML or JSON) offline and list every problem.
    Validate(workload::ValidateArgs),
    /// Validate a workload spec and submit it, once per spec and run id (for CI).
    Submit(workload::SubmitArgs),
    /// List workloads, newest first: state, tasks, who submitted them and when.
    Workloads(workloads::WorkloadsArgs),
    /// Show one workload: its tasks' states, attempts, nodes, GPUs and run times.
    Workload(workloads::WorkloadArgs),
    /// Stop a workload, or one of its stages: running tasks stop, downstream tasks are cancelled.
    Abort(abort::AbortArgs),
    /// The chargeback report: what each team, workload, project or GPU model cost.
    Costs(costs::CostsArgs),
    /// Replay a GPU-cluster trace through the scheduling core under several policies.
    Sim(sim::SimArgs),
    /// The run-time predictor: `allot predict eval` scores it on a trace; `allot predict
    /// report` shows what it learned per task and its right-sizing advice.
    #[command(subcommand)]
    Predict(predict::PredictCommand),
    /// Rebuild the allocator's state from its journal and recompute every decision.
    Replay(replay::ReplayArgs),
    /// Print a task's decision history, with reasons, from the journal.
    Explain(replay::ExplainArgs),
    /// The pool's waiting tasks in order: position, why each waits, when it should start.
    Queue(queue::QueueArgs),
    /// Take a node out of service for new work (an operator's cordon; remediation keeps it).
    Cordon(remediation::CordonArgs),
    /// Gateway API tokens: `allot token create --team T --role R`.
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Lift an operator's cordon.
    Uncordon(remediation::UncordonArgs),
    /// Remediation's record: `allot remediation log` lists every action and cordon.
    #[command(subcommand)]
    Remediation(remediation::RemediationCommand),
    /// The hash-chained archive of the decision log: copy it, verify it.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// Benchmarks: the live path against a real nats-server, and the scheduling core.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Generate the nats-server accounts (platform + one per team) and per-team credentials.
    NatsConfig(nats_config::NatsConfigArgs),
    /// Write the JSON Schemas of every event type into a folder (default `schemas/events`).
    Schemas {
        /// Output folder.
        #[arg(long, default_value = allot_events::schema::DIR)]
        out: PathBuf,
        /// Where the workload spec's schema goes.
        #[arg(long, default_value = allot_events::schema::WORKLOAD_SPEC_FILE)]
        spec_out: PathBuf,
    },
}

impl Command {
    /// Whether the command runs until stopped (services, the simulator, benchmarks), whose
    /// progress is what its log is for; the others are client commands, whose answer is
    /// their output.
    fn runs_until_stopped(&self) -> bool {
        matches!(
            self,
            Self::Up(_)
                | Self::Run(_)
                | Self::Sim(_)
                | Self::Bench(_)
                | Self::Predict(predict::PredictCommand::Eval(_))
        )
    }
}

/// Sets up `tracing` from `--log`/`ALLOT_LOG` and `--log-format`/`ALLOT_LOG_FORMAT`.
///
/// Long-running commands log at `info` by default; client commands only warnings and errors,
/// so their output is their answer (`--log info` shows more). Colour only on a terminal, and
/// never with `NO_COLOR` set: a log file or a CI log gets plain text.
pub fn init_tracing(cli: &Cli) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let default = if cli.command.runs_until_stopped() {
        "info,async_nats=warn"
    } else {
        "warn"
    };
    let filter = cli
        .log
        .clone()
        .or_else(|| std::env::var("ALLOT_LOG").ok())
        .unwrap_or_else(|| default.into());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("allot: ignoring invalid log filter {filter:?}: {e}");
        EnvFilter::new("info")
    });
    let json = cli
        .log_format
        .clone()
        .or_else(|| std::env::var("ALLOT_LOG_FORMAT").ok())
        .is_some_and(|f| f == "json");
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Runs the chosen command.
pub async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let env = settings::process_env;
    match cli.command {
        Command::Up(args) => up::up(args, &env).await,
        Command::Run(args) => run::run(args, &env).await,
        Command::Status(args) => status::status(args, &env).await,
        Command::Validate(args) => workload::validate(args, &env),
        Command::Submit(args) => workload::submit(args, &env).await,
        Command::Workloads(args) => workloads::workloads(args, &env).await,
        Command::Workload(args) => workloads::workload(args, &env).await,
        Command::Abort(args) => abort::abort(args, &env).await,
        Command::Costs(args) => costs::costs(args, &env).await,
        Command::Audit(cmd) => audit::audit(cmd, &env).await,
        Command::Bench(cmd) => bench::bench(cmd, &env).await,
        Command::Sim(args) => sim::sim(args),
        Command::Predict(cmd) => predict::predict(cmd, &env),
        Command::Replay(args) => replay::replay(args, &env).await,
        Command::Explain(args) => replay::explain(args, &env).await,
        Command::Queue(args) => queue::queue(args, &env).await,
        Command::Cordon(args) => remediation::cordon(args, &env).await,
        Command::Token(cmd) => token::token(cmd, &env).await,
        Command::Uncordon(args) => remediation::uncordon(args, &env).await,
        Command::Remediation(cmd) => remediation::remediation(cmd, &env).await,
        Command::NatsConfig(args) => nats_config::nats_config(args).await,
        Command::Schemas { out, spec_out } => {
            allot_events::schema::write_all(&out)?;
            std::fs::write(
                &spec_out,
                allot_events::schema::render(&allot_events::schema::workload_spec()),
            )?;
            eprintln!(
                "wrote {} schemas to {} and the workload spec's to {}",
                allot_events::schema::all().len(),
                out.display(),
                spec_out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A shutdown signal every task can await.
pub type Shutdown = Shared<BoxFuture<'static, ()>>;

/// A [`Shutdown`] that completes on SIGINT or SIGTERM, or when `trigger` is fired.
pub fn shutdown_on_signal() -> (tokio::sync::oneshot::Sender<()>, Shutdown) {
    let (trigger, fired) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received; shutting down"),
            _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
            _ = fired => {}
        }
    };
    (trigger, signal.boxed().shared())
}

/// Waits for `task`, bounded by `grace`; logs when it overruns.
pub async fn within_grace<T>(
    what: &str,
    grace: std::time::Duration,
    task: impl Future<Output = T>,
) -> Option<T> {
    match tokio::time::timeout(grace, task).await {
        Ok(v) => Some(v),
        Err(_) => {
            tracing::warn!(
                task = what,
                grace_ms = grace.as_millis() as u64,
                "did not stop within the grace period"
            );
            None
        }
    }
}
