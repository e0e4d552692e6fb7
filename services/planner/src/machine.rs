//! One workload's DAG as a state machine: pure functions from what happened (a task completed,
//! failed, was granted, an operator aborted) to the new state and the [`Effect`]s to publish.
//!
//! No I/O and no clock: times come with the events (the server's timestamp of a failure), so
//! the same events always give the same state and effects. [`crate::store`] loads and saves a
//! [`Workload`]; the consumers call one transition per event and put its effects in the outbox
//! in the same transaction.
//!
//! # Task states
//!
//! ```text
//! waiting ──deps succeeded──▶ ready ──granted──▶ running ──completed──▶ succeeded
//!                               ▲  ◀──preempted──┘   │
//!                               └──failed, attempts left (after backoff)┘
//!                                                     └──failed, last attempt──▶ failed
//! any state but succeeded/failed ──abort, or another task failed for good──▶ cancelled
//! ```
//!
//! `ready` means "handed to the allocator": queued there or granted before the planner has read
//! the grant. Each attempt has its own [`TaskId`] ([`crate::plan::task_id`]), because the
//! scheduler never takes an id twice; an event about an earlier attempt is stale and ignored,
//! except a grant, which is cancelled (nobody wants that run any more).

use std::collections::BTreeSet;

use allot_events::task::RunSpec;
use allot_events::workload::WorkloadOutcome;
use allot_sched::{Gang, LeaseId, TaskId, TaskSpec, Time};

use crate::plan::task_id;

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    /// Some dependency has not succeeded yet.
    Waiting,
    /// Handed to the allocator (or about to be, after a retry's backoff).
    Ready,
    /// Granted: it runs (as far as the planner has read).
    Running,
    /// Completed.
    Succeeded,
    /// Failed on its last attempt.
    Failed,
    /// Given up: aborted, or another task failed for good.
    Cancelled,
}

impl TaskStatus {
    /// Every status, for parsing.
    pub const ALL: [TaskStatus; 6] = [
        Self::Waiting,
        Self::Ready,
        Self::Running,
        Self::Succeeded,
        Self::Failed,
        Self::Cancelled,
    ];

    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Ready => "ready",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// The status named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Whether nothing more will happen to the task.
    pub fn is_done(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }

    /// Whether the allocator has (or is about to have) it.
    fn is_active(self) -> bool {
        matches!(self, Self::Ready | Self::Running)
    }
}

/// One task of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Its name in the workload.
    pub name: String,
    /// Tasks that must succeed first.
    pub after: Vec<String>,
    /// Its gang in the spec, if any.
    pub gang: Option<String>,
    /// Where it is.
    pub status: TaskStatus,
    /// The current attempt, from 1.
    pub attempt: u32,
    /// Attempts allowed in all (1: no retry).
    pub max_attempts: u32,
    /// Wait before the first retry, ms; doubled for each further one.
    pub backoff: Time,
    /// What the current attempt asks of the scheduler; its `id` is filled in per attempt.
    pub template: TaskSpec,
    /// How an executor runs it; its `attempt` is filled in per attempt.
    pub run: RunSpec,
    /// When its current run was granted (ms since the epoch), while it runs.
    pub started: Option<Time>,
    /// The predictor's estimate of the current attempt's run time, ms, once it has one; the
    /// look-ahead prefers it to the declared estimate.
    pub predicted: Option<Time>,
    /// Why it failed or was cancelled.
    pub reason: Option<String>,
    /// The spec opts in to right-sizing (`resources.rightSize`): its attempts start with the
    /// predictor's latest advice for its task key, when there is one.
    pub right_size: bool,
}

impl Task {
    /// Applies right-sizing advice to what the task's next attempts ask for: the advised GPU
    /// model (only it), share and GPU memory.
    pub fn right_size(&mut self, advice: &allot_events::task::Recommendation) {
        self.template.gpu_models = vec![advice.model.clone()];
        self.template.gpus = advice.gpus;
        self.template.gpu_milli = advice.gpu_milli;
        self.template.gpu_memory_mib = advice.gpu_memory_mib;
    }
}

/// Where a workload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadStatus {
    /// Some task is not done.
    Running,
    /// Finished this way.
    Finished(WorkloadOutcome),
}

impl WorkloadStatus {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Finished(WorkloadOutcome::Succeeded) => "succeeded",
            Self::Finished(WorkloadOutcome::Failed) => "failed",
            Self::Finished(WorkloadOutcome::Aborted) => "aborted",
        }
    }

    /// The status named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => Self::Running,
            "succeeded" => Self::Finished(WorkloadOutcome::Succeeded),
            "failed" => Self::Finished(WorkloadOutcome::Failed),
            "aborted" => Self::Finished(WorkloadOutcome::Aborted),
            _ => return None,
        })
    }
}

/// A workload's DAG state.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// The workload id.
    pub id: String,
    /// The owning team.
    pub team: String,
    /// The pool its tasks run in.
    pub pool: String,
    /// Where it is.
    pub status: WorkloadStatus,
    /// Why it did not succeed (set by an abort or a final failure).
    pub reason: Option<String>,
    /// Its tasks, in the spec's order.
    pub tasks: Vec<Task>,
}

/// What a transition asks the world to learn.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Publish `TaskReady` for this attempt, not before `not_before` (ms since the epoch; 0:
    /// now).
    Ready {
        /// Task name.
        task: String,
        /// Its attempt.
        attempt: u32,
        /// The spec, with the attempt's id.
        spec: TaskSpec,
        /// Earliest publish time (a retry's backoff).
        not_before: Time,
    },
    /// Publish `TaskPreload` for this attempt at `not_before`: its predecessors are expected
    /// to finish at `expected_at`.
    Preload {
        /// Task name.
        task: String,
        /// The spec, with the attempt's id.
        spec: TaskSpec,
        /// When it is expected to become ready (ms since the epoch).
        expected_at: Time,
        /// When to publish it: `expected_at` less the look-ahead window.
        not_before: Time,
    },
    /// Publish `TaskCancelled`: the allocator must withdraw this run — take it out of its
    /// queue, or release what it holds.
    Cancel {
        /// Task name.
        task: String,
        /// The attempt.
        attempt: u32,
        /// The run's id.
        id: TaskId,
        /// The grant that prompted it, if a grant did (so two grants of one id each get
        /// their own cancellation).
        lease: Option<LeaseId>,
        /// Why.
        reason: String,
    },
    /// Publish `WorkloadFinished`.
    Finished {
        /// How it ended.
        outcome: WorkloadOutcome,
        /// Why, unless it succeeded.
        reason: Option<String>,
    },
}

/// An abort named a task the workload does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("workload {workload} has no task {task:?}")]
pub struct UnknownTask {
    /// The workload.
    pub workload: String,
    /// The name given.
    pub task: String,
}

impl Workload {
    /// The task called `name`.
    pub fn task(&self, name: &str) -> Option<&Task> {
        self.tasks.iter().find(|t| t.name == name)
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.tasks.iter().position(|t| t.name == name)
    }

    /// The spec of `task`'s current attempt.
    /// How attempt `attempt` of the task called `name` runs.
    pub fn run_spec(&self, name: &str, attempt: u32) -> RunSpec {
        let mut run = self.task(name).map(|t| t.run.clone()).unwrap_or_default();
        run.attempt = attempt;
        run
    }

    fn spec(&self, i: usize) -> TaskSpec {
        let t = &self.tasks[i];
        let mut spec = t.template.clone();
        spec.id = task_id(&self.id, &t.name, t.attempt);
        spec
    }

    /// Starts a newly submitted workload: every task without dependencies becomes ready.
    pub fn start(&mut self) -> Vec<Effect> {
        let mut out = Vec::new();
        self.unblock(&mut out);
        out
    }

    /// Attempt `attempt` of `task` was granted under `lease`.
    ///
    /// With a look-ahead `window` (ms), each waiting task that this grant leaves waiting only
    /// on running predecessors with duration estimates is preloaded `window` before the last of
    /// them is expected to end.
    pub fn granted(
        &mut self,
        task: &str,
        attempt: u32,
        lease: LeaseId,
        at: Time,
        window: Option<Time>,
    ) -> Vec<Effect> {
        let Some(i) = self.index(task) else {
            return Vec::new();
        };
        let t = &mut self.tasks[i];
        if attempt == t.attempt {
            match t.status {
                TaskStatus::Ready => {
                    t.status = TaskStatus::Running;
                    t.started = Some(at);
                    if let Some(window) = window {
                        return self.preloads(task, window);
                    }
                }
                TaskStatus::Cancelled => {
                    // Cancelled while it was queued: release it now that it holds something.
                    let reason = t.reason.clone().unwrap_or_else(|| "cancelled".into());
                    return vec![Effect::Cancel {
                        task: task.into(),
                        attempt,
                        id: task_id(&self.id, task, attempt),
                        lease: Some(lease),
                        reason,
                    }];
                }
                _ => {}
            }
            return Vec::new();
        }
        // A run that was given up (its gang was retried as a whole) got its grant late.
        vec![Effect::Cancel {
            task: task.into(),
            attempt,
            id: task_id(&self.id, task, attempt),
            lease: Some(lease),
            reason: format!("attempt {attempt} was superseded by attempt {}", t.attempt),
        }]
    }

    /// The preloads due now that `granted` runs: for each waiting dependent of it whose
    /// predecessors have all succeeded or run with an estimate, expected when the last ends.
    fn preloads(&self, granted: &str, window: Time) -> Vec<Effect> {
        let mut out = Vec::new();
        for (j, d) in self.tasks.iter().enumerate() {
            if d.status != TaskStatus::Waiting || !d.after.iter().any(|a| a == granted) {
                continue;
            }
            let mut expected: Option<Time> = Some(0);
            for dep in &d.after {
                let end = self.task(dep).and_then(|p| match p.status {
                    TaskStatus::Succeeded => Some(0),
                    TaskStatus::Running => p
                        .started
                        .zip(p.predicted.or(p.template.predicted_duration))
                        .map(|(s, e)| s + e),
                    _ => None,
                });
                expected = expected.zip(end).map(|(a, b)| a.max(b));
            }
            if let Some(expected_at) = expected.filter(|e| *e > 0) {
                out.push(Effect::Preload {
                    task: d.name.clone(),
                    spec: self.spec(j),
                    expected_at,
                    not_before: expected_at.saturating_sub(window),
                });
            }
        }
        out
    }

    /// Attempt `attempt` of `task` is predicted to run `ms` in all. While it runs, its
    /// waiting dependents' preloads are timed again by the prediction (a preload not yet
    /// published is replaced; one already published stands).
    pub fn predicted(
        &mut self,
        task: &str,
        attempt: u32,
        ms: Time,
        window: Option<Time>,
    ) -> Vec<Effect> {
        let Some(i) = self.index(task) else {
            return Vec::new();
        };
        let t = &mut self.tasks[i];
        if t.attempt != attempt || t.predicted == Some(ms) {
            return Vec::new();
        }
        t.predicted = Some(ms);
        match (t.status, window) {
            (TaskStatus::Running, Some(window)) => self.preloads(task, window),
            _ => Vec::new(),
        }
    }

    /// Attempt `attempt` of `task` was preempted: it is queued again.
    pub fn preempted(&mut self, task: &str, attempt: u32) -> Vec<Effect> {
        if let Some(i) = self.index(task) {
            let t = &mut self.tasks[i];
            if t.attempt == attempt && t.status == TaskStatus::Running {
                t.status = TaskStatus::Ready;
                t.started = None;
            }
        }
        Vec::new()
    }

    /// Attempt `attempt` of `task` completed.
    pub fn completed(&mut self, task: &str, attempt: u32) -> Vec<Effect> {
        let Some(i) = self.index(task) else {
            return Vec::new();
        };
        let t = &mut self.tasks[i];
        if t.attempt != attempt || !t.status.is_active() {
            return Vec::new();
        }
        t.status = TaskStatus::Succeeded;
        let mut out = Vec::new();
        if self.status == WorkloadStatus::Running {
            self.unblock(&mut out);
        }
        self.settle(&mut out);
        out
    }

    /// Attempt `attempt` of `task` failed at `at` (ms) because of `reason`: retried after the
    /// backoff while attempts remain (a gang member with its whole gang), otherwise the task
    /// fails, everything not done is cancelled, and the workload fails.
    pub fn failed(&mut self, task: &str, attempt: u32, reason: &str, at: Time) -> Vec<Effect> {
        let Some(i) = self.index(task) else {
            return Vec::new();
        };
        let t = &self.tasks[i];
        if t.attempt != attempt || !t.status.is_active() || self.status != WorkloadStatus::Running {
            return Vec::new();
        }
        let mut out = Vec::new();
        if t.attempt < t.max_attempts {
            let next = t.attempt + 1;
            // The retry's wait: backoff × 2^(retries before this one).
            let wait = t
                .backoff
                .saturating_mul(1u64.checked_shl(next - 2).unwrap_or(u64::MAX));
            let not_before = at.saturating_add(wait);
            let retried: Vec<usize> = match &t.gang {
                // A gang starts together, so it is retried together: its other runs are
                // cancelled, and all its members not yet done form a new gang.
                Some(g) => (0..self.tasks.len())
                    .filter(|&j| {
                        self.tasks[j].gang.as_ref() == Some(g) && !self.tasks[j].status.is_done()
                    })
                    .collect(),
                None => vec![i],
            };
            let gang = t.gang.clone().map(|g| Gang {
                name: format!("{}/{g}#{next}", self.id),
                size: retried.len() as u32,
            });
            for j in retried {
                let cancel = j != i && self.tasks[j].status == TaskStatus::Running;
                if cancel {
                    out.push(Effect::Cancel {
                        task: self.tasks[j].name.clone(),
                        attempt: self.tasks[j].attempt,
                        id: self.spec(j).id,
                        lease: None,
                        reason: format!("gang mate {task} failed; the gang is retried"),
                    });
                }
                let m = &mut self.tasks[j];
                m.template.gang.clone_from(&gang);
                m.attempt = next;
                // The new attempt gets a prediction of its own.
                m.predicted = None;
                if m.status.is_active() {
                    m.status = TaskStatus::Ready;
                    out.push(Effect::Ready {
                        task: m.name.clone(),
                        attempt: next,
                        spec: self.spec(j),
                        not_before,
                    });
                }
            }
            return out;
        }
        let why = format!(
            "task {task} failed after {attempt} attempt{}: {reason}",
            if attempt == 1 { "" } else { "s" }
        );
        let t = &mut self.tasks[i];
        t.status = TaskStatus::Failed;
        t.reason = Some(reason.to_owned());
        let all: Vec<usize> = (0..self.tasks.len()).collect();
        self.cancel(&all, &format!("task {task} failed"), &mut out);
        self.finish(WorkloadOutcome::Failed, Some(why), &mut out);
        out
    }

    /// An operator aborted the workload (`task` = `None`) or one task with everything that
    /// waits for it (and their gang mates). What is still running is cancelled; the workload
    /// finishes as aborted once nothing of it runs.
    pub fn abort(
        &mut self,
        task: Option<&str>,
        by: &str,
        reason: &str,
    ) -> Result<Vec<Effect>, UnknownTask> {
        let why = format!("aborted by {by}: {reason}");
        let chosen: Vec<usize> = match task {
            None => (0..self.tasks.len()).collect(),
            Some(name) => {
                let i = self.index(name).ok_or_else(|| UnknownTask {
                    workload: self.id.clone(),
                    task: name.into(),
                })?;
                self.downstream(i).into_iter().collect()
            }
        };
        let mut out = Vec::new();
        if self.status != WorkloadStatus::Running {
            return Ok(out);
        }
        self.reason.get_or_insert_with(|| why.clone());
        self.cancel(&chosen, &why, &mut out);
        if task.is_none() {
            self.finish(WorkloadOutcome::Aborted, Some(why), &mut out);
        } else {
            self.settle(&mut out);
        }
        Ok(out)
    }

    /// Task `i`, every task that waits for it directly or not, and the gang mates of all of
    /// them (a gang cannot start short of a member), closed under both.
    fn downstream(&self, i: usize) -> BTreeSet<usize> {
        let mut set = BTreeSet::from([i]);
        let mut todo = vec![i];
        while let Some(j) = todo.pop() {
            let name = &self.tasks[j].name;
            let gang = self.tasks[j].gang.as_ref();
            for (k, t) in self.tasks.iter().enumerate() {
                let related = t.after.contains(name) || (gang.is_some() && t.gang.as_ref() == gang);
                if related && set.insert(k) {
                    todo.push(k);
                }
            }
        }
        set
    }

    /// Cancels the tasks `which` that are not done; those running or ready (queued in the
    /// allocator) get a [`Effect::Cancel`], which withdraws them there. (One granted before
    /// the allocator saw the cancellation is cancelled again by its grant, see
    /// [`Workload::granted`].)
    fn cancel(&mut self, which: &[usize], reason: &str, out: &mut Vec<Effect>) {
        for &i in which {
            if self.tasks[i].status.is_done() {
                continue;
            }
            if matches!(
                self.tasks[i].status,
                TaskStatus::Running | TaskStatus::Ready
            ) {
                out.push(Effect::Cancel {
                    task: self.tasks[i].name.clone(),
                    attempt: self.tasks[i].attempt,
                    id: self.spec(i).id,
                    lease: None,
                    reason: reason.to_owned(),
                });
            }
            let t = &mut self.tasks[i];
            t.status = TaskStatus::Cancelled;
            t.reason = Some(reason.to_owned());
        }
    }

    /// Makes ready every waiting task whose dependencies all succeeded.
    fn unblock(&mut self, out: &mut Vec<Effect>) {
        for i in 0..self.tasks.len() {
            let t = &self.tasks[i];
            let free = t.status == TaskStatus::Waiting
                && t.after.iter().all(|d| {
                    self.task(d)
                        .is_some_and(|d| d.status == TaskStatus::Succeeded)
                });
            if free {
                self.tasks[i].status = TaskStatus::Ready;
                out.push(Effect::Ready {
                    task: self.tasks[i].name.clone(),
                    attempt: self.tasks[i].attempt,
                    spec: self.spec(i),
                    not_before: 0,
                });
            }
        }
    }

    /// Finishes the workload once every task is done: succeeded if all did, otherwise aborted
    /// (a final failure finishes it at once, in [`Workload::failed`]).
    fn settle(&mut self, out: &mut Vec<Effect>) {
        if !self.tasks.iter().all(|t| t.status.is_done()) {
            return;
        }
        if self.tasks.iter().all(|t| t.status == TaskStatus::Succeeded) {
            self.finish(WorkloadOutcome::Succeeded, None, out);
        } else {
            let reason = self.reason.clone();
            self.finish(WorkloadOutcome::Aborted, reason, out);
        }
    }

    fn finish(&mut self, outcome: WorkloadOutcome, reason: Option<String>, out: &mut Vec<Effect>) {
        if self.status != WorkloadStatus::Running {
            return;
        }
        self.status = WorkloadStatus::Finished(outcome);
        self.reason.clone_from(&reason);
        out.push(Effect::Finished { outcome, reason });
    }
}

#[cfg(test)]
mod tests;
