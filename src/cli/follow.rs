//! What `allot submit --wait` / `--follow` make of a workload's events: a pure state machine,
//! fed with the events about one workload as they arrive from the bus, that says what to print
//! and, at the end, how the workload went.
//!
//! The events come from two streams read by two consumers: the planner's and the executors'
//! (WORKLOADS: task ready, started, checkpointed, stopped, completed, failed, cancelled; the
//! workload aborted and finished) and the allocator's journal (DECISIONS: waiting, granted,
//! preempted). Each stream arrives in order, but the two may interleave in any way, so an event
//! whose cause has not been seen yet is **held** until it has: a decision about an attempt
//! waits for that attempt's `TaskReady`, an executor's report waits for the attempt's grant.
//! Causality then gives a CI log its order (`preprocess completed` is on WORKLOADS before the
//! `TaskReady` of `train`, which comes before `train granted`). `WorkloadFinished` releases
//! everything still held (the driver reads the journal up to its end before passing it on).
//!
//! Lines carry the server's timestamp of the message, as an offset from the submission's.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use serde::Serialize;

use allot_events::alloc::Dispatch;
use allot_events::query::planner::{TaskDetail, WorkloadDetail, WorkloadState};
use allot_events::task::StopCause;
use allot_events::workload::{Workload, WorkloadAborted, WorkloadFinished, WorkloadOutcome};
use allot_events::{AnyEvent, TaskEvent, WorkloadEvent};
use allot_sched::{Decision, LeaseId, TaskId};

#[cfg(test)]
mod tests;

/// One event about the workload, as the driver hands it over.
// Taken and dropped one at a time (or held briefly): boxing the task variant buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Observed {
    /// A task lifecycle event (WORKLOADS `allot.task.>`).
    Task(TaskEvent),
    /// One journal entry's decisions and the grants' node names (DECISIONS).
    Journal {
        /// The entry's decisions.
        decisions: Vec<Decision>,
        /// Where each grant runs.
        dispatch: Vec<Dispatch>,
    },
    /// The workload, or one of its tasks, was aborted.
    Aborted(WorkloadAborted),
    /// The planner finished the workload.
    Finished(WorkloadFinished),
}

impl Observed {
    /// The stream it came from (events of one stream arrive in their causal order).
    fn stream(&self) -> &'static str {
        match self {
            Observed::Journal { .. } => "DECISIONS",
            _ => "WORKLOADS",
        }
    }

    /// The part of a decoded event `--follow` cares about, if any.
    pub fn from_event(event: AnyEvent) -> Option<Observed> {
        match event {
            AnyEvent::Task(e) => Some(Observed::Task(e)),
            AnyEvent::Workload(WorkloadEvent::Aborted(a)) => Some(Observed::Aborted(a)),
            AnyEvent::Workload(WorkloadEvent::Finished(f)) => Some(Observed::Finished(f)),
            AnyEvent::Alloc(allot_events::AllocEvent::Applied(a)) => Some(Observed::Journal {
                decisions: a.entry.decisions,
                dispatch: a.dispatch,
            }),
            _ => None,
        }
    }
}

/// What happened, one line of a CI log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Line {
    /// Milliseconds since the submission was stored (server time).
    pub t_ms: i64,
    /// The task; `None` for the workload as a whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The task's attempt the line is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The attempt's task id (`task-42`), what `allot explain` and the journal name it by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// `ready`, `retried`, `waiting`, `granted`, `started`, `checkpointed`, `preempted`,
    /// `stopped`, `completed`, `failed`, `cancelled`, `aborted`, `succeeded` (the workload).
    pub state: &'static str,
    /// Reason, nodes, ETA — whatever explains the line.
    pub detail: String,
}

impl Line {
    /// `[+  12.345s] train-0     granted      n1 GPUs 0,1`, with the task column `width` wide.
    pub fn render(&self, width: usize) -> String {
        let task = self.task.as_deref().unwrap_or(WORKLOAD_COLUMN);
        let mut out = format!(
            "[+{:>9}] {task:<width$}  {:<12}",
            seconds(self.t_ms),
            self.state
        );
        if !self.detail.is_empty() {
            out.push(' ');
            out.push_str(&self.detail);
        }
        out.trim_end().to_owned()
    }
}

/// What the task column says for lines about the whole workload.
const WORKLOAD_COLUMN: &str = "(workload)";

/// How the wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// Every task succeeded.
    Succeeded,
    /// A task failed on its last attempt.
    Failed,
    /// The workload was aborted.
    Aborted,
    /// `--timeout` ran out first; the workload goes on.
    TimedOut,
}

/// A task's state at the end, for the summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskSummary {
    /// Its name.
    pub name: String,
    /// `succeeded`, `failed`, `cancelled`, `not run`, `running`, `queued`, `waiting` (for its
    /// dependencies).
    pub state: &'static str,
    /// Attempts handed to the allocator.
    pub attempts: u32,
    /// Attempts allowed by its retry policy.
    pub max_attempts: u32,
    /// The latest attempt's task id (`task-42`); `None` before its first attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The failure or cancellation reason, or where it ran.
    pub detail: String,
}

/// The summary printed when the wait ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The workload id.
    pub workload: String,
    /// How the wait ended.
    pub ending: Ending,
    /// What ended it, when it did not succeed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// From the submission to the last event seen, ms.
    pub elapsed_ms: i64,
    /// How long the command waited before giving up, ms (only when it timed out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<i64>,
    /// Every task, in the spec's order.
    pub tasks: Vec<TaskSummary>,
}

impl Summary {
    /// A header line and a table, one row per task.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let how = match self.ending {
            Ending::Succeeded => "succeeded",
            Ending::Failed => "failed",
            Ending::Aborted => "was aborted",
            Ending::TimedOut => "is still running",
        };
        let _ = match (self.ending, self.waited_ms) {
            (Ending::TimedOut, Some(waited)) => write!(
                out,
                "workload {} {how}: stopped waiting after {}s (--timeout)",
                self.workload,
                seconds(waited)
            ),
            _ => write!(
                out,
                "workload {} {how} after {}s",
                self.workload,
                seconds(self.elapsed_ms)
            ),
        };
        if let Some(reason) = &self.reason {
            let _ = write!(out, ": {reason}");
        }
        out.push('\n');
        let width = self
            .tasks
            .iter()
            .map(|t| t.name.len())
            .chain([4])
            .max()
            .unwrap_or(4);
        let id_width = self
            .tasks
            .iter()
            .filter_map(|t| t.task_id.as_ref().map(String::len))
            .chain([2])
            .max()
            .unwrap_or(2);
        let _ = writeln!(
            out,
            "  {:<width$}  {:<id_width$}  {:<10} {:<8} DETAIL",
            "TASK", "ID", "STATE", "ATTEMPTS"
        );
        for t in &self.tasks {
            let attempts = format!("{}/{}", t.attempts, t.max_attempts);
            let row = format!(
                "  {:<width$}  {:<id_width$}  {:<10} {:<8} {}",
                t.name,
                t.task_id.as_deref().unwrap_or("-"),
                t.state,
                attempts,
                t.detail
            );
            out.push_str(row.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Where one task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for its dependencies (no `TaskReady` yet).
    Pending,
    /// Handed to the allocator, not granted.
    Queued,
    /// Granted (and maybe started).
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

#[derive(Debug, Clone)]
struct Task {
    name: String,
    max_attempts: u32,
    /// The latest attempt handed to the allocator (0: none yet).
    attempt: u32,
    state: State,
    /// Attempts whose `TaskReady` was seen.
    ready: BTreeSet<u32>,
    /// Attempts granted at least once.
    granted: BTreeSet<u32>,
    /// The last waiting reason printed per attempt (repeated passes repeat it).
    waiting: HashMap<u32, String>,
    /// Leases whose run was seen starting: a second start under one lease is the executor
    /// resuming the run after a restart.
    started: BTreeSet<LeaseId>,
    detail: String,
}

/// The progress of one workload.
#[derive(Debug, Clone)]
pub struct Progress {
    workload: String,
    submitted_ms: i64,
    last_ms: i64,
    tasks: Vec<Task>,
    /// Task id → (index in `tasks`, attempt).
    ids: HashMap<TaskId, (usize, u32)>,
    held: Vec<(i64, Observed)>,
    finished: Option<WorkloadFinished>,
    width: usize,
}

impl Progress {
    /// Progress of `workload` (its id and spec), submitted at `submitted_ms` (server time, ms
    /// since the epoch).
    pub fn new(workload_id: &str, spec: &Workload, submitted_ms: i64) -> Progress {
        let tasks: Vec<Task> = spec
            .spec
            .tasks
            .iter()
            .map(|t| Task {
                name: t.name.clone(),
                max_attempts: t.retry.as_ref().map_or(1, |r| r.max_attempts.max(1)),
                attempt: 0,
                state: State::Pending,
                ready: BTreeSet::new(),
                granted: BTreeSet::new(),
                waiting: HashMap::new(),
                started: BTreeSet::new(),
                detail: String::new(),
            })
            .collect();
        // A gang retries as a whole, so a member may run more attempts than its own policy
        // allows: map every task's ids up to the workload's highest limit.
        let limit = tasks.iter().map(|t| t.max_attempts).max().unwrap_or(1);
        let ids = tasks
            .iter()
            .enumerate()
            .flat_map(|(i, t)| {
                (1..=limit)
                    .map(move |a| (allot_events::task::task_id(workload_id, &t.name, a), (i, a)))
            })
            .collect();
        let width = tasks
            .iter()
            .map(|t| t.name.len())
            .chain([WORKLOAD_COLUMN.len()])
            .max()
            .unwrap_or(0);
        Progress {
            workload: workload_id.to_owned(),
            submitted_ms,
            last_ms: submitted_ms,
            tasks,
            ids,
            held: Vec::new(),
            finished: None,
            width,
        }
    }

    /// How wide the task column of [`Line::render`] should be.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Whether the planner has finished the workload.
    pub fn is_finished(&self) -> bool {
        self.finished.is_some()
    }

    /// Whether any event about the workload was seen (for the "is the planner running?" hint).
    pub fn seen_anything(&self) -> bool {
        self.tasks.iter().any(|t| t.attempt > 0) || self.finished.is_some()
    }

    /// Takes one event stored at `at_ms` (server time); returns the lines to print, in order.
    pub fn observe(&mut self, at_ms: i64, event: Observed) -> Vec<Line> {
        if self.finished.is_some() || !self.concerns(&event) {
            return Vec::new();
        }
        self.last_ms = self.last_ms.max(at_ms);
        let mut lines = Vec::new();
        if let Observed::Finished(f) = event {
            // Everything held is released: nothing more will come to explain it.
            for (at, held) in std::mem::take(&mut self.held) {
                self.apply(at, held, &mut lines);
            }
            self.finish(at_ms, f, &mut lines);
            return lines;
        }
        // Each stream's own order is causal too: nothing overtakes what its stream held back.
        if self.blocked(&event) || self.held.iter().any(|(_, e)| e.stream() == event.stream()) {
            self.held.push((at_ms, event));
            return lines;
        }
        self.apply(at_ms, event, &mut lines);
        // What was held may now follow, each stream's in the order it arrived.
        while let Some(i) = self.releasable() {
            let (at, event) = self.held.remove(i);
            self.apply(at, event, &mut lines);
        }
        lines
    }

    /// The first held event whose cause has been seen and that no earlier held event of its
    /// stream precedes.
    fn releasable(&self) -> Option<usize> {
        let mut blocked_streams = Vec::new();
        for (i, (_, e)) in self.held.iter().enumerate() {
            if blocked_streams.contains(&e.stream()) {
                continue;
            }
            if !self.blocked(e) {
                return Some(i);
            }
            blocked_streams.push(e.stream());
        }
        None
    }

    /// The summary as things stand (`TimedOut` unless the workload finished).
    pub fn summary(&self) -> Summary {
        let (ending, reason) = match &self.finished {
            Some(f) => (
                match f.outcome {
                    WorkloadOutcome::Succeeded => Ending::Succeeded,
                    WorkloadOutcome::Failed => Ending::Failed,
                    WorkloadOutcome::Aborted => Ending::Aborted,
                },
                f.reason.clone(),
            ),
            None => (Ending::TimedOut, None),
        };
        let tasks = self
            .tasks
            .iter()
            .map(|t| TaskSummary {
                name: t.name.clone(),
                state: match t.state {
                    State::Pending if t.attempt == 0 && self.finished.is_some() => "not run",
                    State::Pending => "waiting",
                    State::Queued => "queued",
                    State::Running => "running",
                    State::Succeeded => "succeeded",
                    State::Failed => "failed",
                    State::Cancelled => "cancelled",
                },
                attempts: t.attempt,
                max_attempts: t.max_attempts,
                task_id: (t.attempt > 0)
                    .then(|| allot_events::task::task_id(&self.workload, &t.name, t.attempt))
                    .map(|id| id.to_string()),
                detail: t.detail.clone(),
            })
            .collect();
        Summary {
            workload: self.workload.clone(),
            ending,
            reason,
            elapsed_ms: self.last_ms - self.submitted_ms,
            waited_ms: None,
            tasks,
        }
    }

    /// Whether the event is about this workload at all.
    fn concerns(&self, event: &Observed) -> bool {
        match event {
            Observed::Task(TaskEvent::Ready(r)) => r.workload == self.workload,
            Observed::Task(TaskEvent::Preload(_)) => false,
            Observed::Task(e) => task_of(e).is_some_and(|id| self.ids.contains_key(&id)),
            Observed::Journal {
                decisions,
                dispatch: _,
            } => decisions
                .iter()
                .any(|d| self.ids.contains_key(&decision_task(d))),
            Observed::Aborted(a) => a.workload_id == self.workload,
            Observed::Finished(f) => f.workload_id == self.workload,
        }
    }

    /// Whether the event must wait for its cause: a decision for its attempt's `TaskReady`,
    /// an executor's report for its attempt's grant.
    fn blocked(&self, event: &Observed) -> bool {
        let seen = |id: TaskId, needs_grant: bool| {
            self.ids.get(&id).is_none_or(|&(i, a)| {
                let t = &self.tasks[i];
                if needs_grant {
                    t.granted.contains(&a)
                } else {
                    t.ready.contains(&a)
                }
            })
        };
        match event {
            Observed::Task(TaskEvent::Ready(_) | TaskEvent::Preload(_)) => false,
            Observed::Task(e) => task_of(e).is_some_and(|id| !seen(id, true)),
            // Room held for a task expected soon comes before its ready: it waits for nothing.
            Observed::Journal { decisions, .. } => decisions
                .iter()
                .filter(|d| !matches!(d, Decision::Reserved { .. }))
                .any(|d| !seen(decision_task(d), false)),
            Observed::Aborted(_) | Observed::Finished(_) => false,
        }
    }

    fn apply(&mut self, at_ms: i64, event: Observed, lines: &mut Vec<Line>) {
        let t_ms = at_ms - self.submitted_ms;
        let workload = self.workload.clone();
        let mut line = |task: Option<&Task>, attempt: u32, state: &'static str, detail: String| {
            lines.push(Line {
                t_ms,
                task: task.map(|t| t.name.clone()),
                attempt: task.map(|_| attempt),
                task_id: task
                    .map(|t| allot_events::task::task_id(&workload, &t.name, attempt).to_string()),
                state,
                detail,
            });
        };
        match event {
            Observed::Task(TaskEvent::Ready(r)) => {
                let Some(i) = self.tasks.iter().position(|t| t.name == r.name) else {
                    return;
                };
                let attempt = self
                    .ids
                    .get(&r.task.id)
                    .map_or(r.run.attempt.max(1), |&(_, a)| a);
                let t = &mut self.tasks[i];
                if !t.ready.insert(attempt) {
                    return;
                }
                t.attempt = t.attempt.max(attempt);
                t.state = State::Queued;
                // The id is printed once per attempt, where it first appears: it is what
                // `allot explain` and the journal's decisions name the attempt by.
                let what = format!("{}; pool {}", resources(&r.task), r.pool);
                if attempt > 1 {
                    let max = t.max_attempts;
                    let detail = format!("{}: attempt {attempt} of {max}: {what}", r.task.id);
                    line(Some(t), attempt, "retried", detail);
                } else {
                    line(Some(t), attempt, "ready", format!("{}: {what}", r.task.id));
                }
            }
            Observed::Task(e) => {
                let Some(&(i, attempt)) = task_of(&e).and_then(|id| self.ids.get(&id)) else {
                    return;
                };
                let current = attempt == self.tasks[i].attempt;
                let t = &mut self.tasks[i];
                let (state, detail) = match e {
                    TaskEvent::Started(s) if !t.started.insert(s.lease) => (
                        "resumed",
                        format!(
                            "on {} ({}), the same run (lease {}) after its executor restarted",
                            s.node, s.how, s.lease.0
                        ),
                    ),
                    TaskEvent::Started(s) => ("started", format!("on {} ({})", s.node, s.how)),
                    TaskEvent::Checkpointed(c) => ("checkpointed", format!("on {}", c.node)),
                    TaskEvent::Completed(c) => {
                        if current {
                            t.state = State::Succeeded;
                            t.detail = format!("ran on {}", c.node);
                        }
                        ("completed", format!("on {}", c.node))
                    }
                    TaskEvent::Failed(f) => {
                        let next = if attempt < t.max_attempts {
                            "a retry follows"
                        } else {
                            "no attempts left"
                        };
                        if current {
                            t.state = if attempt < t.max_attempts {
                                State::Queued
                            } else {
                                State::Failed
                            };
                            t.detail = f.reason.clone();
                        }
                        (
                            "failed",
                            format!(
                                "{} on {} (attempt {attempt} of {}; {next})",
                                f.reason, f.node, t.max_attempts
                            ),
                        )
                    }
                    TaskEvent::Cancelled(c) => {
                        if current {
                            t.state = State::Cancelled;
                            t.detail = c.reason.clone();
                        }
                        ("cancelled", c.reason)
                    }
                    TaskEvent::Stopped(s) => {
                        let cause = match s.cause {
                            StopCause::Preempted => "preempted",
                            StopCause::Cancelled => "cancelled",
                        };
                        let mut detail = format!(
                            "on {} ({cause}) after {}s",
                            s.node,
                            seconds(s.ran_ms as i64)
                        );
                        if s.checkpointed {
                            detail.push_str(", checkpointed");
                        }
                        if s.killed {
                            detail.push_str(", killed after the grace period");
                        }
                        ("stopped", detail)
                    }
                    TaskEvent::Predicted(p) => ("predicted", prediction(&p)),
                    TaskEvent::Ready(_) | TaskEvent::Preload(_) => return,
                };
                line(Some(t), attempt, state, detail);
            }
            Observed::Journal {
                decisions,
                dispatch,
            } => {
                for d in decisions {
                    let Some(&(i, attempt)) = self.ids.get(&decision_task(&d)) else {
                        continue;
                    };
                    match d {
                        Decision::Waiting {
                            reason,
                            eta,
                            at_risk,
                            at,
                            ..
                        } => {
                            let eta = match eta {
                                Some(eta) => format!(
                                    "expected to start in {}s",
                                    seconds(eta.saturating_sub(at) as i64)
                                ),
                                None => "no start time estimate".to_owned(),
                            };
                            let risk = if at_risk {
                                "; AT RISK of missing its deadline"
                            } else {
                                ""
                            };
                            let detail = format!("{reason}; {eta}{risk}");
                            let t = &mut self.tasks[i];
                            if t.waiting.get(&attempt) == Some(&detail) {
                                continue;
                            }
                            t.waiting.insert(attempt, detail.clone());
                            line(Some(t), attempt, "waiting", detail);
                        }
                        Decision::Granted {
                            task, placement, ..
                        } => {
                            let detail = match dispatch.iter().find(|g| g.task == task) {
                                Some(g) => nodes(g),
                                None => format!("{} node(s)", placement.shares.len()),
                            };
                            let t = &mut self.tasks[i];
                            t.granted.insert(attempt);
                            t.waiting.remove(&attempt);
                            if attempt == t.attempt && t.state == State::Queued {
                                t.state = State::Running;
                            }
                            line(Some(t), attempt, "granted", detail);
                        }
                        Decision::Preempted {
                            for_task,
                            lost,
                            reason,
                            ..
                        } => {
                            let whom = match for_task {
                                Some(other) => match self.ids.get(&other) {
                                    Some(&(j, a)) => {
                                        format!("for {} (attempt {a})", self.tasks[j].name)
                                    }
                                    None => format!("for {other}"),
                                },
                                None => "requeued".to_owned(),
                            };
                            let t = &mut self.tasks[i];
                            if attempt == t.attempt && t.state == State::Running {
                                t.state = State::Queued;
                            }
                            line(
                                Some(t),
                                attempt,
                                "preempted",
                                format!("{whom}; {}s of work lost; {reason}", seconds(lost as i64)),
                            );
                        }
                        // The end of a run is told by the executor's report.
                        Decision::Released { .. } => {}
                        Decision::Withdrawn { reason, .. } => {
                            let t = &self.tasks[i];
                            line(
                                Some(t),
                                attempt,
                                "withdrawn",
                                format!("left the queue before it was granted; {reason}"),
                            );
                        }
                        Decision::Reserved { until, at, .. } => {
                            let t = &self.tasks[i];
                            line(
                                Some(t),
                                attempt,
                                "preloaded",
                                format!(
                                    "room held for it (its predecessors end soon), for at most {}s",
                                    seconds(until.saturating_sub(at) as i64)
                                ),
                            );
                        }
                    }
                }
            }
            Observed::Aborted(a) => {
                let what = match &a.task {
                    Some(task) => format!("task {task} and what follows it"),
                    None => "the workload".to_owned(),
                };
                line(
                    None,
                    0,
                    "aborted",
                    format!("{what}, by {}: {}", a.by, a.reason),
                );
            }
            Observed::Finished(_) => {}
        }
    }

    fn finish(&mut self, at_ms: i64, finished: WorkloadFinished, lines: &mut Vec<Line>) {
        let succeeded = finished.outcome == WorkloadOutcome::Succeeded;
        for t in &mut self.tasks {
            match t.state {
                State::Succeeded | State::Failed | State::Cancelled => {}
                // The planner finishes a workload as succeeded only once every task did, even
                // if a report was not seen here.
                _ if succeeded => t.state = State::Succeeded,
                // The planner cancels whatever is not done.
                State::Pending if t.attempt == 0 => {
                    t.detail = "its dependencies never succeeded".into()
                }
                _ => {
                    t.state = State::Cancelled;
                    t.detail = "cancelled with the workload".into();
                }
            }
        }
        let (state, detail) = match finished.outcome {
            WorkloadOutcome::Succeeded => ("succeeded", String::new()),
            WorkloadOutcome::Failed => ("failed", finished.reason.clone().unwrap_or_default()),
            WorkloadOutcome::Aborted => ("aborted", finished.reason.clone().unwrap_or_default()),
        };
        lines.push(Line {
            t_ms: at_ms - self.submitted_ms,
            task: None,
            attempt: None,
            task_id: None,
            state,
            detail,
        });
        self.finished = Some(finished);
    }
}

/// What `--follow` and `--wait` can tell from the planner's answers alone, for a team's user,
/// whom the server lets read no stream (they hold every team's events): each task's state as
/// each answer shows it. A state that came and went between two answers is not seen, and
/// waits, grants and preemptions are not told apart — the full log needs the platform's
/// credentials.
#[derive(Debug, Clone)]
pub struct Polled {
    workload: String,
    /// Each task's (state, attempt) in the last answer.
    seen: HashMap<String, (String, u32)>,
    width: usize,
}

impl Polled {
    /// Watching `workload_id`, whose spec is `spec`.
    pub fn new(workload_id: &str, spec: &Workload) -> Polled {
        let width = spec
            .spec
            .tasks
            .iter()
            .map(|t| t.name.len())
            .chain([WORKLOAD_COLUMN.len()])
            .max()
            .unwrap_or(0);
        Polled {
            workload: workload_id.to_owned(),
            seen: HashMap::new(),
            width,
        }
    }

    /// How wide the task column of [`Line::render`] should be.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The lines for what changed since the last answer, in the spec's order; the workload's
    /// end last.
    pub fn observe(&mut self, detail: &WorkloadDetail) -> Vec<Line> {
        let t_ms = elapsed_ms(detail);
        let mut lines = Vec::new();
        for t in &detail.tasks {
            let now = (t.state.clone(), t.attempt);
            if self.seen.get(&t.name) == Some(&now) || (t.state == "waiting" && t.attempt <= 1) {
                self.seen.insert(t.name.clone(), now);
                continue;
            }
            self.seen.insert(t.name.clone(), now);
            let (state, detail) = match t.state.as_str() {
                "ready" if t.attempt > 1 => (
                    "retried",
                    format!("attempt {} of {}", t.attempt, t.max_attempts),
                ),
                "ready" => ("ready", "handed to the allocator".to_owned()),
                "running" => ("running", format!("on {}", where_ran(t))),
                "succeeded" => ("completed", format!("on {}", where_ran(t))),
                "failed" => ("failed", t.reason.clone().unwrap_or_default()),
                "cancelled" => ("cancelled", t.reason.clone().unwrap_or_default()),
                _ => ("waiting", String::new()),
            };
            lines.push(Line {
                t_ms,
                task: Some(t.name.clone()),
                attempt: Some(t.attempt),
                task_id: Some(
                    allot_events::task::task_id(&self.workload, &t.name, t.attempt.max(1))
                        .to_string(),
                ),
                state,
                detail,
            });
        }
        let state = detail.workload.state;
        if state != WorkloadState::Running {
            lines.push(Line {
                t_ms,
                task: None,
                attempt: None,
                task_id: None,
                state: state.as_str(),
                detail: detail.workload.reason.clone().unwrap_or_default(),
            });
        }
        lines
    }

    /// The summary of the workload as `detail` shows it (`TimedOut` while it runs).
    pub fn summary(detail: &WorkloadDetail) -> Summary {
        let w = &detail.workload;
        let ending = match w.state {
            WorkloadState::Running => Ending::TimedOut,
            WorkloadState::Succeeded => Ending::Succeeded,
            WorkloadState::Failed => Ending::Failed,
            WorkloadState::Aborted => Ending::Aborted,
        };
        let done = ending != Ending::TimedOut;
        let tasks = detail
            .tasks
            .iter()
            .map(|t| {
                let never_ran = t.state == "waiting" && t.started_at.is_none();
                let (state, detail) = match t.state.as_str() {
                    "waiting" if never_ran && done => {
                        ("not run", "its dependencies never succeeded".to_owned())
                    }
                    "waiting" => ("waiting", String::new()),
                    "ready" => ("queued", String::new()),
                    "running" => ("running", format!("on {}", where_ran(t))),
                    "succeeded" => ("succeeded", format!("ran on {}", where_ran(t))),
                    "failed" => ("failed", t.reason.clone().unwrap_or_default()),
                    _ => ("cancelled", t.reason.clone().unwrap_or_default()),
                };
                let attempts = if never_ran { 0 } else { t.attempt };
                TaskSummary {
                    name: t.name.clone(),
                    state,
                    attempts,
                    max_attempts: t.max_attempts,
                    task_id: (attempts > 0)
                        .then(|| allot_events::task::task_id(&w.id, &t.name, attempts).to_string()),
                    detail,
                }
            })
            .collect();
        Summary {
            workload: w.id.clone(),
            ending,
            reason: w.reason.clone(),
            elapsed_ms: elapsed_ms(detail),
            waited_ms: None,
            tasks,
        }
    }
}

/// From the submission to the answer, or for a workload that ended to its last task's end, ms
/// (0 when the planner does not know the submission's time).
fn elapsed_ms(detail: &WorkloadDetail) -> i64 {
    let ended = detail.tasks.iter().filter_map(|t| t.ended_at).max();
    let until = match (detail.workload.state, ended) {
        (WorkloadState::Running, _) | (_, None) => detail.at,
        (_, Some(ended)) => ended,
    };
    detail
        .workload
        .submitted_at
        .map_or(0, |s| (until - s).num_milliseconds())
}

/// Where a task's run was granted, as the grant lines say it (`n1 GPUs 0,1, n2 GPUs 0,1`).
fn where_ran(t: &TaskDetail) -> String {
    if t.nodes.is_empty() {
        return "no node yet".into();
    }
    t.nodes
        .iter()
        .map(|n| {
            let gpus: Vec<(u32, u32)> = n.gpus.iter().map(|g| (g.index, g.milli)).collect();
            node_gpus(&n.node, &gpus)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The task an executor's or the planner's event names.
fn task_of(event: &TaskEvent) -> Option<TaskId> {
    match event {
        TaskEvent::Ready(e) => Some(e.task.id),
        TaskEvent::Preload(_) => None,
        TaskEvent::Started(e) => Some(e.task),
        TaskEvent::Checkpointed(e) => Some(e.task),
        TaskEvent::Completed(e) => Some(e.task),
        TaskEvent::Failed(e) => Some(e.task),
        TaskEvent::Cancelled(e) => Some(e.task),
        TaskEvent::Stopped(e) => Some(e.task),
        TaskEvent::Predicted(e) => Some(e.task),
    }
}

/// `runs about 12m30s (10-90%: 4m00s-40m00s; from team_gpus, model 3)`.
fn prediction(p: &allot_events::task::TaskPredicted) -> String {
    let rough = super::workloads::span_ms;
    let model = match p.model_version {
        Some(v) => format!("model {v}"),
        None => "no model yet".to_owned(),
    };
    format!(
        "runs about {} (10-90%: {}-{}; from {}, {model})",
        rough(p.duration_ms),
        rough(p.p10_ms),
        rough(p.p90_ms),
        p.basis.as_str()
    )
}

fn decision_task(d: &Decision) -> TaskId {
    match d {
        Decision::Granted { task, .. }
        | Decision::Waiting { task, .. }
        | Decision::Preempted { task, .. }
        | Decision::Released { task, .. }
        | Decision::Reserved { task, .. }
        | Decision::Withdrawn { task, .. } => *task,
    }
}

/// `n1 GPUs 0,1` / `n1 GPU 0 (250m)` / `n1 (no GPU)`, per node, comma-separated.
fn nodes(grant: &Dispatch) -> String {
    grant
        .nodes
        .iter()
        .map(|n| match &n.mig {
            Some(mig) => format!("{} MIG {mig}", n.node),
            None => node_gpus(&n.node, &n.gpus),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One node's share of a grant: `n1 GPUs 0,1` / `n1 GPU 0 (250m)` / `n1 (no GPU)`, from its
/// (GPU index, milli-GPU) pairs.
fn node_gpus(node: &str, gpus: &[(u32, u32)]) -> String {
    match gpus {
        [] => format!("{node} (no GPU)"),
        [(gpu, milli)] if *milli < allot_sched::model::WHOLE_GPU_MILLI => {
            format!("{node} GPU {gpu} ({milli}m)")
        }
        gpus => {
            let list: Vec<String> = gpus.iter().map(|(g, _)| g.to_string()).collect();
            let noun = if gpus.len() == 1 { "GPU" } else { "GPUs" };
            format!("{node} {noun} {}", list.join(","))
        }
    }
}

/// `2 GPUs` / `250m of a GPU` / `MIG 1g.10gb` / `no GPU`.
fn resources(task: &allot_sched::TaskSpec) -> String {
    if let Some(mig) = &task.mig_profile {
        return format!("MIG {mig}");
    }
    match (task.gpus, task.gpu_milli) {
        (0, _) => "no GPU".to_owned(),
        (1, m) if m < allot_sched::model::WHOLE_GPU_MILLI => format!("{m}m of a GPU"),
        (1, _) => "1 GPU".to_owned(),
        (n, _) => format!("{n} GPUs"),
    }
}

/// `12.345` for 12 345 ms (negative offsets, from clock skew, as `-0.003`).
fn seconds(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let ms = ms.unsigned_abs();
    format!("{sign}{}.{:03}", ms / 1000, ms % 1000)
}
