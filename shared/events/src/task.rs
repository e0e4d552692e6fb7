//! Tasks' lifecycle as the allocator sees it: a task is ready to run (from the planner), it
//! checkpointed, completed or failed (from the executor on its node), or it was cancelled
//! (from the planner, when its workload is aborted or failed).
//!
//! Task ids are the scheduler's ([`allot_sched::TaskId`]): the planner derives one per task of
//! a workload and every later event names it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use allot_sched::{LeaseId, TaskId, TaskSpec};

use crate::envelope::EventKind;
use crate::subject;

domain_events! {
    /// A task's lifecycle.
    // Events are decoded, matched and dropped one at a time: boxing the big variant would buy
    // nothing but an allocation.
    #[allow(clippy::large_enum_variant)]
    pub enum TaskEvent in "task" {
        /// Its dependencies succeeded: the allocator may schedule it.
        Ready(TaskReady) = "ready",
        /// A predecessor is expected to finish soon: the allocator may hold room for it and the
        /// executor may warm it (pull its image), but it must not start yet.
        Preload(TaskPreload) = "preload",
        /// An executor started a granted run.
        Started(TaskStarted) = "started",
        /// It wrote a checkpoint: a preemption from now on loses only what follows.
        Checkpointed(TaskCheckpointed) = "checkpointed",
        /// It exited successfully.
        Completed(TaskCompleted) = "completed",
        /// It exited with an error, or could not be started.
        Failed(TaskFailed) = "failed",
        /// The planner gave it up (its workload was aborted or failed): the allocator releases
        /// what it holds, and the executor stops it.
        Cancelled(TaskCancelled) = "cancelled",
        /// An executor stopped a run because it was preempted or cancelled.
        Stopped(TaskStopped) = "stopped",
        /// The predictor estimated how long it will run.
        Predicted(TaskPredicted) = "predicted",
    }
}

impl EventKind for TaskEvent {
    fn event_type(&self) -> String {
        TaskEvent::event_type(self)
    }
    /// A run's events name its node too, so each collector may publish only its own.
    fn nats_subject(&self) -> String {
        let node = match self {
            Self::Ready(_) | Self::Preload(_) | Self::Cancelled(_) | Self::Predicted(_) => None,
            Self::Started(e) => Some(&e.node),
            Self::Stopped(e) => Some(&e.node),
            Self::Checkpointed(e) => Some(&e.node),
            Self::Completed(e) => Some(&e.node),
            Self::Failed(e) => Some(&e.node),
        };
        match node {
            None => subject::task(self.name(), &self.entity()),
            Some(node) => subject::task_on_node(self.name(), &self.entity(), node),
        }
    }
    /// The pool: every task event of a pool goes to its allocator, in one order.
    fn entity(&self) -> String {
        match self {
            Self::Ready(e) => e.pool.clone(),
            Self::Preload(e) => e.pool.clone(),
            Self::Started(e) => e.pool.clone(),
            Self::Stopped(e) => e.pool.clone(),
            Self::Checkpointed(e) => e.pool.clone(),
            Self::Completed(e) => e.pool.clone(),
            Self::Failed(e) => e.pool.clone(),
            Self::Cancelled(e) => e.pool.clone(),
            Self::Predicted(e) => e.pool.clone(),
        }
    }
    fn team(&self) -> Option<&str> {
        match self {
            Self::Ready(e) => Some(&e.task.team),
            _ => None,
        }
    }
}

/// A task whose dependencies have succeeded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskReady {
    /// The pool that must run it.
    pub pool: String,
    /// The workload it belongs to.
    pub workload: String,
    /// Its name in the workload.
    pub name: String,
    /// What the scheduler is asked to place.
    pub task: TaskSpec,
    /// How an executor runs it.
    #[serde(default)]
    pub run: RunSpec,
}

/// How an executor runs a task: what the workload spec says about the program, carried from the
/// planner through the allocator's journal to the node that is granted the task.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// Which attempt this is (from 1); a retry is a new task with a new id.
    #[serde(default)]
    pub attempt: u32,
    /// The program and its arguments (argv; no shell).
    #[serde(default)]
    pub command: Vec<String>,
    /// The container image, if the spec names one (process executors run on the host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The spec's duration estimate, ms: how long a simulated executor runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The task saves its state on SIGTERM and resumes from it.
    #[serde(default)]
    pub checkpoint: bool,
    /// How often it checkpoints while running, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every_ms: Option<u64>,
    /// Its usage limit, ms: a run that lasts longer is stopped and fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runtime_ms: Option<u64>,
    /// The spec opted out of idle reclaim (`idleReclaim: false`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_idle_reclaim: bool,
}

/// A waiting task whose predecessors are expected to finish within the planner's look-ahead
/// window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskPreload {
    /// The pool that will run it.
    pub pool: String,
    /// The workload it belongs to.
    pub workload: String,
    /// Its name in the workload.
    pub name: String,
    /// What the scheduler will be asked to place.
    pub task: TaskSpec,
    /// When the planner expects it to become ready (ms since the Unix epoch).
    pub expected_at: u64,
}

/// An executor started a run of a granted task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskStarted {
    /// Its pool.
    pub pool: String,
    /// The task.
    pub task: TaskId,
    /// The node it runs on.
    pub node: String,
    /// The lease it runs under.
    pub lease: LeaseId,
    /// The workload it belongs to.
    pub workload: String,
    /// Its name in the workload.
    pub name: String,
    /// How: `simulated` or `process <pid>`.
    pub how: String,
    /// Where its output goes, if anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
}

/// Why an executor stopped a run it did not see end by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StopCause {
    /// The allocator preempted it; it is queued again.
    Preempted,
    /// Its lease was released while it ran (the planner cancelled it).
    Cancelled,
}

/// An executor stopped a run: SIGTERM, then SIGKILL if the grace period ran out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskStopped {
    /// Its pool.
    pub pool: String,
    /// The task.
    pub task: TaskId,
    /// The node it ran on.
    pub node: String,
    /// Why it was stopped.
    pub cause: StopCause,
    /// It checkpointed before exiting (its next run resumes from there).
    pub checkpointed: bool,
    /// It had to be killed: it did not exit within the grace period.
    pub killed: bool,
    /// How long the run lasted, ms.
    pub ran_ms: u64,
    /// The run's lease: a report that arrives after the task's next run began (a move's old
    /// run stops within its grace period while the new one starts) names the run it is about.
    /// Absent from executors older than the field; consumers then take the report as it comes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseId>,
}

/// A running task checkpointed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskCheckpointed {
    /// Its pool.
    pub pool: String,
    /// The task.
    pub task: TaskId,
    /// Where it runs.
    pub node: String,
    /// The lease it ran under: a report about any other lease of the task is stale or forged.
    pub lease: LeaseId,
}

/// A task exited successfully.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskCompleted {
    /// Its pool.
    pub pool: String,
    /// The task.
    pub task: TaskId,
    /// Where it ran.
    pub node: String,
    /// The lease it ran under: a report about any other lease of the task is stale or forged.
    pub lease: LeaseId,
}

/// A task failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskFailed {
    /// Its pool.
    pub pool: String,
    /// The task.
    pub task: TaskId,
    /// Where it ran.
    pub node: String,
    /// The lease it ran under: a report about any other lease of the task is stale or forged.
    pub lease: LeaseId,
    /// Why (exit status, signal, start error).
    pub reason: String,
}

/// A task was cancelled by the planner while it held (or was about to be granted) resources.
///
/// Not a failure: nothing went wrong with the run, its workload no longer wants it. The
/// allocator treats it as the end of the task (its lease is released, like a completion); the
/// executor running it stops it. The planner publishes it for a task it believes running, and
/// again for any later grant of a task it has cancelled, so a task that was still queued when
/// it was cancelled is released as soon as it is granted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskCancelled {
    /// Its pool.
    pub pool: String,
    /// The task.
    pub task: TaskId,
    /// The workload it belongs to.
    pub workload: String,
    /// Its name in the workload.
    pub name: String,
    /// Why (`aborted by alice: wrong learning rate`, `task prep failed`).
    pub reason: String,
}

/// How long a task is predicted to run, from the predictor: an input to the allocator (which
/// journals it before its scheduler weighs the task by it) and to the planner (which times its
/// look-ahead by it). Not the truth: a run may take any time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskPredicted {
    /// Its pool.
    pub pool: String,
    /// The task (one attempt).
    pub task: TaskId,
    /// The workload it belongs to.
    pub workload: String,
    /// Its name in the workload.
    pub name: String,
    /// The point estimate of its run time in all, ms.
    pub duration_ms: u64,
    /// The 10% quantile, ms: nine runs in ten should take longer.
    pub p10_ms: u64,
    /// The 90% quantile, ms: nine runs in ten should be done by then.
    pub p90_ms: u64,
    /// The model that made it; absent on a cold start (a fallback alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<u64>,
    /// What the estimate rests on: the task's own runs, its team's runs of this size, or on a
    /// cold start the declared estimate, the team's, everyone's, or nothing (`default`).
    pub basis: allot_predict::Basis,
    /// Right-sizing: the cheapest GPU model and smallest share that held the task's last
    /// finished runs (peak GPU memory and utilization from telemetry, priced by the price
    /// table), with what the request costs beside it. Absent when there is none (too few
    /// measured runs, nothing fits, no price table). Advice: the planner applies it only to a
    /// task whose spec opts in (`resources.rightSize: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub right_size: Option<allot_predict::rightsize::Recommendation>,
}

/// The predictor's right-sizing advice, as [`TaskPredicted::right_size`] carries it.
pub use allot_predict::rightsize::Recommendation;

/// A task's key across submissions, `<team>/<workload name>/<task name>`: the same task of
/// the same workload (a workload id is its name and a hash suffix, `train-3f9a2c71d0`)
/// submitted again by the same team. The predictor learns per key; the planner applies its
/// right-sizing advice per key.
pub fn task_key(team: &str, workload: &str, name: &str) -> String {
    let base = match workload.rsplit_once('-') {
        Some((base, hash)) if hash.len() == 10 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            base
        }
        _ => workload,
    };
    format!("{team}/{base}/{name}")
}

/// The id of attempt `attempt` (from 1) of task `task` of workload `workload`: the first 53
/// bits of SHA-256(`<workload>/<task>/<attempt>`).
///
/// One id per attempt, because the scheduler never accepts an id twice (a retry is a new
/// task to it); stable, so a planner that crashed and replays its events derives the same
/// ids. 53 bits, so the id survives any JSON reader (JavaScript and `jq` read numbers as
/// doubles); a collision needs tens of millions of live tasks to become likely.
pub fn task_id(workload: &str, task: &str, attempt: u32) -> allot_sched::TaskId {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{workload}/{task}/{attempt}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    allot_sched::TaskId(u64::from_be_bytes(first) >> 11)
}
