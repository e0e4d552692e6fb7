//! What the scheduler decides, each with its explanation.

use crate::cluster::Placement;
use crate::model::{LeaseId, TaskId, Time};

/// A decision.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// The task may start on `placement`.
    Granted {
        /// The task.
        task: TaskId,
        /// The lease to release when it ends.
        lease: LeaseId,
        /// Where.
        placement: Placement,
        /// When.
        at: Time,
        /// Why now and why there.
        reason: String,
    },
    /// The task cannot start now.
    Waiting {
        /// The task.
        task: TaskId,
        /// Why.
        reason: WaitReason,
        /// When it is expected to start, if running tasks end when their estimates say
        /// (`None`: not before something else changes, e.g. a quota or a node).
        eta: Option<Time>,
        /// It has a deadline it is expected to miss if it waits its turn: policies that keep
        /// deadlines move it ahead of equal priorities (earliest deadline first).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        at_risk: bool,
        /// When.
        at: Time,
    },
    /// A running task must stop — so a more important one can start, or because its node was
    /// drained — and goes back to the queue.
    Preempted {
        /// The task stopped.
        task: TaskId,
        /// Its lease, now released.
        lease: LeaseId,
        /// When.
        at: Time,
        /// The task it made room for (`None`: requeued by the caller, e.g. a drained node).
        for_task: Option<TaskId>,
        /// Work lost since its last checkpoint, ms of run time.
        lost: Time,
        /// Why.
        reason: String,
    },
    /// Room is held for a task expected soon (see `Input::TaskPreloaded`): nothing runs there
    /// yet, and other work is kept off it until the task arrives or `until` passes.
    Reserved {
        /// The task expected.
        task: TaskId,
        /// The room held for it.
        placement: Placement,
        /// When the hold lapses if the task has not arrived.
        until: Time,
        /// When.
        at: Time,
    },
    /// A queued or preloaded task was withdrawn (see `Input::TaskWithdrawn`): it left the
    /// queue without ever running again, or its hold ended.
    Withdrawn {
        /// The task.
        task: TaskId,
        /// Why.
        reason: String,
        /// When.
        at: Time,
    },
    /// A finished or cancelled task's resources were returned.
    Released {
        /// The task.
        task: TaskId,
        /// Its lease.
        lease: LeaseId,
        /// When.
        at: Time,
    },
}

/// Why a task waits.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WaitReason {
    /// No placement exists on the free capacity now.
    NoCapacity {
        /// GPUs requested.
        gpus: u32,
        /// Free GPUs in the whole cluster.
        free_gpus: u64,
    },
    /// The policy starts tasks in order and this one is behind a task that cannot start.
    BehindHead {
        /// The task at the head.
        head: TaskId,
    },
    /// Its team's quota does not admit it now.
    Quota {
        /// Which limit, and by how much.
        why: String,
    },
    /// Its team has spent its budget, and the budget policy starts nothing below `floor`.
    Budget {
        /// The team.
        team: String,
        /// The lowest priority still started while the team is over budget.
        floor: i32,
    },
    /// It belongs to a gang not all of whose members have been submitted yet.
    GangIncomplete {
        /// The gang.
        gang: String,
        /// Members submitted.
        submitted: u32,
        /// Members in all.
        size: u32,
    },
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoCapacity { gpus, free_gpus } => write!(
                f,
                "needs {gpus} GPUs placed together; {free_gpus} GPUs are free but no placement fits"
            ),
            Self::BehindHead { head } => write!(f, "queued behind {head}, which cannot start yet"),
            Self::Quota { why } => write!(f, "quota: {why}"),
            Self::Budget { team, floor } => write!(
                f,
                "team {team} is over budget: only priority {floor} and above starts"
            ),
            Self::GangIncomplete {
                gang,
                submitted,
                size,
            } => write!(f, "gang {gang} has {submitted} of its {size} members"),
        }
    }
}
