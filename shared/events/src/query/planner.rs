//! The planner's query contract: the workloads it knows, listed or one by id, over NATS
//! request/reply (the `allot-planner` micro-service). The planner answers from its database;
//! `allot workloads` and `allot workload ID` ask.
//!
//! # Subjects and who may ask
//!
//! | subject | answers | asked by |
//! |---|---|---|
//! | `allot.query.planner.workloads` | [`WorkloadList`] for a [`WorkloadsQuery`] | `admin` |
//! | `allot.query.planner.workloads.<team>` | the same, only team `<team>`'s | `admin`, `team-<team>` |
//! | `allot.query.planner.workload` | [`WorkloadDetail`] for a [`WorkloadQuery`] | `admin` |
//! | `allot.query.planner.workload.<team>` | the same, if the workload is `<team>`'s | `admin`, `team-<team>` |
//!
//! The team in the subject is what scopes an answer: the server lets a team's user publish on
//! its own team's subjects only (`allot_bus::users`), so a team sees its own workloads and
//! nothing of anyone else's — another team's workload is "unknown" to it, as one that does not
//! exist.
//!
//! Errors come back as micro-service errors (`Nats-Service-Error` and
//! `Nats-Service-Error-Code` headers): [`NOT_FOUND`] for an unknown workload, [`BAD_REQUEST`]
//! for a query the planner cannot read, 500 when its database fails.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::subject::PLANNER_QUERY;

/// The name of the planner's NATS micro-service (`nats micro ls` shows it).
pub const SERVICE_NAME: &str = "allot-planner";
/// The error code of an answer about a workload the planner does not know (or not the asking
/// team's).
pub const NOT_FOUND: usize = 404;
/// The error code of an answer to a query the planner cannot read.
pub const BAD_REQUEST: usize = 400;
/// How many workloads one answer lists when the query does not say.
pub const DEFAULT_LIMIT: u32 = 50;
/// The most workloads one answer lists; ask again with the cursor for more.
pub const MAX_LIMIT: u32 = 1000;

/// `allot.query.planner.workloads`, or `allot.query.planner.workloads.<team>` scoped to a team.
pub fn workloads_subject(team: Option<&str>) -> String {
    scoped("workloads", team)
}

/// `allot.query.planner.workload`, or `allot.query.planner.workload.<team>` scoped to a team.
pub fn workload_subject(team: Option<&str>) -> String {
    scoped("workload", team)
}

fn scoped(what: &str, team: Option<&str>) -> String {
    match team {
        Some(team) => format!("{PLANNER_QUERY}.{what}.{team}"),
        None => format!("{PLANNER_QUERY}.{what}"),
    }
}

/// Where a workload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadState {
    /// Some task is not done.
    Running,
    /// Every task succeeded.
    Succeeded,
    /// A task failed on its last attempt.
    Failed,
    /// An operator aborted it.
    Aborted,
}

impl WorkloadState {
    /// Every state.
    pub const ALL: [WorkloadState; 4] =
        [Self::Running, Self::Succeeded, Self::Failed, Self::Aborted];

    /// Its name (as the planner stores it and `--state` takes it).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Aborted => "aborted",
        }
    }

    /// The state named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// List workloads, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadsQuery {
    /// Only this team's (on a team-scoped subject it must be that team, or absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// Only workloads in this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<WorkloadState>,
    /// Only workloads submitted at or after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// At most this many ([`DEFAULT_LIMIT`] when absent; 1 to [`MAX_LIMIT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Continue after the previous answer's [`WorkloadList::next_cursor`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// The workloads a [`WorkloadsQuery`] asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadList {
    /// When the answer was computed.
    pub at: DateTime<Utc>,
    /// Newest first.
    pub workloads: Vec<WorkloadSummary>,
    /// There are more: ask again with this cursor (and the same filters).
    pub next_cursor: Option<String>,
}

/// One workload, as listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSummary {
    /// Its id.
    pub id: String,
    /// The owning team.
    pub team: String,
    /// Who submitted it (user, CI job), as the submitting tool saw it.
    pub submitter: String,
    /// The CI run (or other attempt) that submitted it, when given.
    pub run_id: Option<String>,
    /// When the bus stored its submission (`None` for workloads the planner stored before it
    /// kept that).
    pub submitted_at: Option<DateTime<Utc>>,
    /// Where it is.
    pub state: WorkloadState,
    /// Why it did not succeed (an abort or a final failure).
    pub reason: Option<String>,
    /// Its tasks: how many in all, and how many of them succeeded and run now.
    pub tasks: TaskCounts,
}

/// How many of a workload's tasks are where.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCounts {
    /// Every task.
    pub total: u32,
    /// Succeeded.
    pub succeeded: u32,
    /// Running now.
    pub running: u32,
}

/// Show one workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadQuery {
    /// Its id.
    pub id: String,
}

/// One workload and its tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadDetail {
    /// When the answer was computed.
    pub at: DateTime<Utc>,
    /// The workload.
    pub workload: WorkloadSummary,
    /// Its tasks, in the spec's order.
    pub tasks: Vec<TaskDetail>,
}

/// One task of a workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskDetail {
    /// Its name in the workload.
    pub name: String,
    /// `waiting`, `ready` (handed to the allocator), `running`, `succeeded`, `failed` or
    /// `cancelled`.
    pub state: String,
    /// The current attempt, from 1.
    pub attempt: u32,
    /// Attempts allowed in all.
    pub max_attempts: u32,
    /// Where its current or last run was granted (empty: never granted).
    pub nodes: Vec<TaskNode>,
    /// When that run was granted.
    pub started_at: Option<DateTime<Utc>>,
    /// When that run ended (completed, failed, was preempted or released).
    pub ended_at: Option<DateTime<Utc>>,
    /// Why it failed or was cancelled.
    pub reason: Option<String>,
}

/// A run's share of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskNode {
    /// The node.
    pub node: String,
    /// The GPUs it may use (none for a CPU task).
    pub gpus: Vec<GpuShare>,
}

/// A run's share of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuShare {
    /// The GPU's index on its node.
    pub index: u32,
    /// How much of it, milli-GPU (1000: all of it).
    pub milli: u32,
}
