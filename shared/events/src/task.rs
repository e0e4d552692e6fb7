//! Tasks' lifecycle as the allocator sees it: a task is ready to run (from the planner), it
//! checkpointed, completed or failed (from the executor on its node), or it was cancelled
//! (from the planner, when its workload is aborted or failed).
//!
//! Task ids are the scheduler's ([`allot_sched::TaskId`]): the planner derives one per task of
//! a workload and every later event names it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use allot_sched::{TaskId, TaskSpec};

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
        /// It wrote a checkpoint: a preemption from now on loses only what follows.
        Checkpointed(TaskCheckpointed) = "checkpointed",
        /// It exited successfully.
        Completed(TaskCompleted) = "completed",
        /// It exited with an error, or could not be started.
        Failed(TaskFailed) = "failed",
        /// The planner gave it up (its workload was aborted or failed): the allocator releases
        /// what it holds, and the executor stops it.
        Cancelled(TaskCancelled) = "cancelled",
    }
}

impl EventKind for TaskEvent {
    fn event_type(&self) -> String {
        TaskEvent::event_type(self)
    }
    fn nats_subject(&self) -> String {
        subject::task(self.name(), &self.entity())
    }
    /// The pool: every task event of a pool goes to its allocator, in one order.
    fn entity(&self) -> String {
        match self {
            Self::Ready(e) => e.pool.clone(),
            Self::Checkpointed(e) => e.pool.clone(),
            Self::Completed(e) => e.pool.clone(),
            Self::Failed(e) => e.pool.clone(),
            Self::Cancelled(e) => e.pool.clone(),
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
