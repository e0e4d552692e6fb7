//! `allot abort WORKLOAD [--task T]`: an operator stops a workload, or one of its stages.
//!
//! Publishes `WorkloadAborted` on `allot.workload.aborted.<team>`. The planner stops the
//! workload's running tasks (their executors get SIGTERM, then SIGKILL after the grace
//! period), releases their GPUs and cancels every task downstream; aborting the whole workload
//! finishes it as `aborted`. An abort names the team that owns the workload: the planner
//! refuses one from another team.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use allot_bus::Publisher;
use allot_events::workload::WorkloadAborted;

use super::local;
use super::settings::Lookup;

/// Flags of `allot abort`.
#[derive(Debug, Args)]
pub struct AbortArgs {
    /// The workload id `allot submit` printed.
    pub workload: String,
    /// Abort only this task (and what depends on it); the rest of the workload goes on.
    #[arg(long)]
    pub task: Option<String>,
    /// The team that owns the workload (ALLOT_TEAM).
    #[arg(long)]
    pub team: Option<String>,
    /// Why, for the record and for the workload's summary.
    #[arg(long)]
    pub reason: String,
    /// Who aborts (ALLOT_SUBMITTER; default `$USER@<hostname>`).
    #[arg(long)]
    pub by: Option<String>,
    /// NATS URL (ALLOT_NATS_URL; default: ./.allot/nats.url, then nats://127.0.0.1:4222).
    #[arg(long)]
    pub nats: Option<String>,
    /// Folder where `allot up` keeps its state (ALLOT_DATA_DIR).
    #[arg(long)]
    pub data_dir: Option<String>,
}

/// `allot abort`: publishes the abort and waits for JetStream to store it.
pub async fn abort(args: AbortArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let Some(team) = args.team.clone().or_else(|| env("ALLOT_TEAM")) else {
        anyhow::bail!(
            "--team (or ALLOT_TEAM): name the team that owns {}",
            args.workload
        );
    };
    for (what, value) in [("workload id", &args.workload), ("team", &team)] {
        allot_events::subject::validate_token(what, value)?;
    }
    let by = args
        .by
        .clone()
        .or_else(|| env("ALLOT_SUBMITTER"))
        .unwrap_or_else(|| {
            let user = env("USER").unwrap_or_else(|| "someone".into());
            format!("{user}@{}", allot_events::node::hostname())
        });
    let client = local::connect_client(
        "allot-abort",
        args.nats.as_deref(),
        args.data_dir.as_deref(),
        env,
        "nothing was aborted",
    )
    .await?;
    let event = WorkloadAborted {
        workload_id: args.workload.clone(),
        team,
        task: args.task.clone(),
        reason: args.reason.clone(),
        by,
    };
    Publisher::new(client.clone(), "/allot/cli")
        .publish(event)
        .await
        .with_context(|| format!("publishing the abort of {}", args.workload))?;
    client.drain().await.ok();
    match &args.task {
        Some(task) => eprintln!("{}: abort of task {task} requested", args.workload),
        None => eprintln!("{}: abort requested", args.workload),
    }
    Ok(ExitCode::SUCCESS)
}
