//! `allot abort WORKLOAD [--task T]`: an operator stops a workload, or one of its stages.
//!
//! Publishes `WorkloadAborted` on `allot.workload.aborted.<team>`. The planner stops the
//! workload's running tasks (their executors get SIGTERM, then SIGKILL after the grace
//! period), releases their GPUs and cancels every task downstream; aborting the whole workload
//! finishes it as `aborted`. An abort names the team that owns the workload: the planner
//! refuses one from another team.
//!
//! While NATS does not store the abort (no acknowledgement, a stream electing a leader, the
//! connection down) it sends it again for up to 30 s, under the same id, so it is stored once.
//!
//! Then it waits for the planner's answer (`WorkloadAbortAnswered` on
//! `allot.workload.abort_answered.<team>`, subscribed to before publishing so it cannot be
//! missed) and says what it was:
//!
//! | exit | meaning |
//! |---|---|
//! | 0 | carried out; it says what was cancelled |
//! | 2 | refused (unknown workload or task, another team's, already finished): the reason; also when a team's user (`ALLOT_CREDENTIALS`) names another team |
//! | 5 | no answer within `--timeout`: the abort is stored and will be applied when the planner runs |

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use futures::StreamExt;

use allot_bus::Publisher;
use allot_events::workload::{AbortOutcome, WorkloadAbortAnswered, WorkloadAborted};
use allot_events::{AnyEvent, WorkloadEvent};

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
    /// How long to wait for the planner's answer (exit 5 past it; the abort stays stored).
    #[arg(long, value_parser = allot_workload::quantity::duration, default_value = "30s")]
    pub timeout: Duration,
}

/// `allot abort`: publishes the abort and waits for JetStream to store it.
pub async fn abort(args: AbortArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    allot_events::subject::validate_token("workload id", &args.workload)?;
    if let Some(team) = &args.team {
        allot_events::subject::validate_token("team", team)?;
    }
    let by = args
        .by
        .clone()
        .or_else(|| env("ALLOT_SUBMITTER"))
        .unwrap_or_else(|| {
            let user = env("USER").unwrap_or_else(|| "someone".into());
            format!("{user}@{}", allot_events::node::hostname())
        });
    let connection = local::connect_client(
        "allot-abort",
        args.nats.as_deref(),
        args.data_dir.as_deref(),
        env,
        "nothing was aborted",
    )
    .await?;
    // A team's user aborts for its team: `--team` is then implied, and another is refused here
    // rather than by the server's permissions (which would only time out).
    let Some(team) = args
        .team
        .clone()
        .or_else(|| env("ALLOT_TEAM"))
        .or_else(|| connection.team.clone())
    else {
        anyhow::bail!(
            "--team (or ALLOT_TEAM): name the team that owns {}; nothing was aborted",
            args.workload
        );
    };
    allot_events::subject::validate_token("team", &team)?;
    if let Some(why) = connection.refuses_team(&team, &format!("aborting {}", args.workload)) {
        eprintln!("allot: {why}; nothing was aborted");
        return Ok(ExitCode::from(2));
    }
    let client = connection.client;
    let event = WorkloadAborted {
        workload_id: args.workload.clone(),
        team: team.clone(),
        task: args.task.clone(),
        reason: args.reason.clone(),
        by,
    };
    // Listening first: the answer may come before the publish returns.
    let mut answers = client
        .subscribe(allot_events::subject::workload_abort_answered(&team))
        .await
        .with_context(|| format!("listening for the planner's answers to team {team}"))?;
    let publisher = Publisher::new(client.clone(), "/allot/cli");
    let envelope = publisher.envelope(event);
    let abort_id = envelope.id.to_string();
    publisher
        .publish_envelope_patiently(&envelope, super::workload::RETRY_FOR)
        .await
        .with_context(|| format!("publishing the abort of {}", args.workload))?;
    let what = match &args.task {
        Some(task) => format!("{}: abort of task {task}", args.workload),
        None => format!("{}: abort", args.workload),
    };
    let answer = tokio::time::timeout(args.timeout, async {
        while let Some(message) = answers.next().await {
            let Ok(envelope) = allot_events::decode(&message.payload) else {
                continue;
            };
            if let AnyEvent::Workload(WorkloadEvent::AbortAnswered(a)) = envelope.data
                && a.abort == abort_id
            {
                return Some(a);
            }
        }
        None
    })
    .await;
    client.drain().await.ok();
    match answer {
        Ok(Some(WorkloadAbortAnswered {
            outcome: AbortOutcome::Accepted,
            detail,
            ..
        })) => {
            eprintln!("{what} carried out: {detail}");
            Ok(ExitCode::SUCCESS)
        }
        Ok(Some(WorkloadAbortAnswered {
            outcome: AbortOutcome::Refused,
            detail,
            ..
        })) => {
            eprintln!("{what} refused: {detail}");
            Ok(ExitCode::from(super::workload::REJECTED))
        }
        Ok(None) | Err(_) => {
            eprintln!(
                "{what} is stored, but the planner did not answer within {} — is it running \
                 (`allot up`, or `allot run planner`)? It will be applied when the planner runs.",
                humantime::format_duration(args.timeout)
            );
            Ok(ExitCode::from(super::workload::TIMED_OUT))
        }
    }
}
