//! Applying bus events to the planner's state, exactly once: one handler type serves its three
//! durable consumers (WORKLOADS: submissions, aborts, predictions; DECISIONS: the allocators'
//! journals, for grants, preemptions and the ends of runs; FLEET: node registrations, for the
//! capacity check).
//!
//! A run's end is taken from the journal, not from the executor's report: the allocator
//! journals a report only when it is about the task's run (its running lease, or the run that
//! ended as it was being stopped), with how the run ended. A report it refused (a run stopped
//! and superseded by a new grant) never reaches the planner, whichever of its two consumers
//! is ahead.
//!
//! A batch of messages is applied in one transaction with the consumer's position and the
//! events their transitions produced ([`crate::store`]), so the planner takes its database's
//! write lock once per batch; the handler makes no decision of its own beyond finding the
//! workload a message is about and calling its [`crate::machine`] transition.

use std::sync::Arc;

use chrono::Utc;
use tokio::sync::Notify;
use tracing::{info, warn};

use allot_bus::consumer::{Delivery, Handler, HandlerError, Outcome};
use allot_events::alloc::Applied;
use allot_events::query::planner::{GpuShare, TaskNode};
use allot_events::task::{TaskCancelled, TaskPreload, TaskReady};
use allot_events::workload::{
    AbortOutcome, WorkloadAbortAnswered, WorkloadAborted, WorkloadFinished, WorkloadOutcome,
    WorkloadSubmitted,
};
use allot_events::{AllocEvent, AnyEvent, Envelope, NodeEvent, TaskEvent, WorkloadEvent};
use allot_sched::{Decision, Input, LeaseId, RunEnd, TaskId, Time};
use allot_store::rusqlite::Connection;
use allot_workload::TeamsConfig;

use crate::machine::{Effect, TaskStatus, Workload, WorkloadStatus};
use crate::plan::{event_id, plan};
use crate::store::{self, StoreError};

/// The `source` of the planner's events.
pub const SOURCE: &str = "/allot/planner";

/// Applies one consumer's messages to the planner's database.
#[derive(Debug)]
pub struct Planner {
    conn: Connection,
    consumer: String,
    pool: String,
    teams: Option<TeamsConfig>,
    window: Option<Time>,
    /// How long after the newest node registration a submission waits for the fleet to form
    /// before its capacity is checked, ms ([`crate::store::cluster`]).
    settle: Time,
    /// The fleet's shape as last read (`store::cluster`).
    fleet: store::FleetCache,
    wake: Arc<Notify>,
}

impl Planner {
    /// A handler writing through `conn`, recording its position under `consumer`, planning
    /// workloads into `pool`, checking teams against `teams`, preloading tasks `window` ms
    /// before they are expected (`None`: no look-ahead), and waking the relay through `wake`
    /// after each commit that queued events.
    pub fn new(
        conn: Connection,
        consumer: String,
        pool: String,
        teams: Option<TeamsConfig>,
        window: Option<Time>,
        wake: Arc<Notify>,
    ) -> Self {
        Self {
            conn,
            consumer,
            pool,
            teams,
            window,
            settle: DEFAULT_SETTLE_MS,
            fleet: store::FleetCache::default(),
            wake,
        }
    }

    /// Checks capacity only against a fleet whose newest registration is `settle_ms` older than
    /// the submission (default 30 s).
    pub fn with_settle(mut self, settle_ms: Time) -> Self {
        self.settle = settle_ms;
        self
    }
}

/// How long the fleet must have been still before a submission's capacity is checked: 30 s.
pub const DEFAULT_SETTLE_MS: Time = 30_000;

impl Handler for Planner {
    fn resume_after(&mut self) -> Result<Option<u64>, HandlerError> {
        let position = allot_store::position(&self.conn, &self.consumer)
            .map_err(|e| HandlerError::transient(format!("planner database: {e}")))?;
        Ok(Some(position.unwrap_or(0)))
    }

    async fn handle(&mut self, batch: &[Delivery]) -> Result<Vec<Outcome>, HandlerError> {
        let mut outcomes = vec![Outcome::Handled; batch.len()];
        let mut queued = false;
        let items: Vec<(u64, (usize, &Delivery))> = batch
            .iter()
            .enumerate()
            .map(|(i, d)| (d.stream_sequence, (i, d)))
            .collect();
        let (pool, teams, window) = (&self.pool, self.teams.as_ref(), self.window);
        let (settle, fleet) = (self.settle, &mut self.fleet);
        allot_store::apply_batch(&mut self.conn, &self.consumer, &items, |c, fresh| {
            for (i, d) in fresh {
                let step = step(c, pool, teams, window, (settle, &mut *fleet), d)?;
                queued |= step.queued;
                outcomes[*i] = step.outcome;
            }
            Ok::<_, StoreError>(())
        })
        .map_err(|e| HandlerError::transient(format!("planner database: {e}")))?;
        if queued {
            self.wake.notify_one();
        }
        Ok(outcomes)
    }
}

/// What applying one message did.
struct Step {
    outcome: Outcome,
    queued: bool,
}

impl Step {
    fn handled(queued: bool) -> Self {
        Self {
            outcome: Outcome::Handled,
            queued,
        }
    }
    fn rejected(why: String) -> Self {
        Self {
            outcome: Outcome::Rejected(why),
            queued: false,
        }
    }
}

/// Applies one message inside the caller's transaction.
fn step(
    c: &Connection,
    pool: &str,
    teams: Option<&TeamsConfig>,
    window: Option<Time>,
    fleet: (Time, &mut store::FleetCache),
    d: &Delivery,
) -> Result<Step, StoreError> {
    let at = d.published.timestamp_millis().max(0) as Time;
    match &d.event.data {
        AnyEvent::Workload(WorkloadEvent::Submitted(s)) => submitted(c, pool, teams, fleet, s, d),
        AnyEvent::Workload(WorkloadEvent::Aborted(a)) => aborted(c, a, d),
        AnyEvent::Task(TaskEvent::Predicted(p)) => {
            if let Some(advice) = &p.right_size {
                keep_advice(c, p.task, advice)?;
            }
            on_attempt(c, p.task, None, |w, name, attempt| {
                w.predicted(name, attempt, p.duration_ms, window)
            })
        }
        AnyEvent::Alloc(AllocEvent::Applied(applied)) => {
            let mut queued = false;
            if applied.entry.rejected.is_none()
                && let Input::TaskFinished {
                    task,
                    at,
                    run: Some(run),
                }
                | Input::TaskWithdrawn {
                    task,
                    at,
                    run: Some(run),
                    ..
                } = &applied.entry.input
            {
                queued |= run_ended(c, *task, run, *at)?.queued;
            }
            for decision in &applied.entry.decisions {
                let step = match decision {
                    Decision::Granted {
                        task, lease, at, ..
                    } => {
                        let nodes = nodes_of(applied, *task, *lease);
                        store::run_granted(c, *task, *lease, &nodes, *at)?;
                        on_attempt(c, *task, None, |w, name, attempt| {
                            w.granted(name, attempt, *lease, *at, window)
                        })?
                    }
                    Decision::Preempted { task, at, .. } => {
                        store::run_stopped(c, *task, *at)?;
                        on_attempt(c, *task, None, |w, name, attempt| {
                            w.preempted(name, attempt)
                        })?
                    }
                    Decision::Released { task, at, .. } => {
                        store::run_stopped(c, *task, *at)?;
                        continue;
                    }
                    Decision::Waiting { .. }
                    | Decision::Reserved { .. }
                    | Decision::Withdrawn { .. } => continue,
                };
                queued |= step.queued;
            }
            Ok(Step::handled(queued))
        }
        AnyEvent::Node(NodeEvent::Registered(r)) if r.pool == pool => {
            store::register_node(c, r, at)?;
            Ok(Step::handled(false))
        }
        // Not the planner's (its own events, other task events): nothing to do.
        _ => Ok(Step::handled(false)),
    }
}

fn submitted(
    c: &Connection,
    pool: &str,
    teams: Option<&TeamsConfig>,
    (settle, fleet): (Time, &mut store::FleetCache),
    s: &WorkloadSubmitted,
    d: &Delivery,
) -> Result<Step, StoreError> {
    // The id is derived from the team and the key; one that does not follow was chosen by
    // hand, perhaps to take the id someone else's submission will have.
    let derived = allot_workload::submit::workload_id(&s.spec, &s.idempotency_key);
    if s.workload_id != derived {
        warn!(workload.id = %s.workload_id, %derived, "submission rejected: id not derived");
        return Ok(Step::rejected(format!(
            "workload id {} is not derived from the submission (team {} and idempotency key \
             {:?} give {derived}; see allot_workload::submit::workload_id)",
            s.workload_id, s.spec.metadata.team, s.idempotency_key
        )));
    }
    if let Some(earlier) = store::known(c, &s.workload_id)? {
        // The same submission again (a CI retry after the duplicate window): already planned.
        // The same key with another spec is not the same submission.
        let earlier: Option<WorkloadSubmitted> = serde_json::from_str(&earlier).ok();
        if earlier.is_some_and(|e| e.spec != s.spec) {
            warn!(workload.id = %s.workload_id, "submission rejected: key reused for another spec");
            return Ok(Step::rejected(format!(
                "workload {} already exists with a different spec: idempotency key {:?} was \
                 used before by team {} for other content (choose another key or run id)",
                s.workload_id, s.idempotency_key, s.spec.metadata.team
            )));
        }
        return Ok(Step::handled(false));
    }
    let at = d.published.timestamp_millis().max(0) as Time;
    let cluster = store::cluster(c, at, settle, fleet)?;
    let mut w = match plan(s, at, pool, teams, cluster.as_deref()) {
        Ok(w) => w,
        Err(why) => {
            warn!(workload.id = %s.workload_id, reason = %why, "submission rejected");
            return Ok(Step::rejected(why));
        }
    };
    // Tasks that opt in start with the latest advice for their key.
    for t in w.tasks.iter_mut().filter(|t| t.right_size) {
        let key = allot_events::task::task_key(&w.team, &w.id, &t.name);
        if let Some(advice) = store::advice(c, &key)? {
            info!(workload.id = %w.id, task = %t.name, model = %advice.model, gpu_milli = advice.gpu_milli, "right-sized as the predictor advises");
            t.right_size(&advice);
        }
    }
    let effects = w.start();
    let at = d.published.timestamp_millis().max(0) as Time;
    store::insert(c, &w, s, d.stream_sequence, at)?;
    info!(workload.id = %w.id, tasks = w.tasks.len(), "workload planned");
    emit(c, &w, effects)?;
    Ok(Step::handled(true))
}

/// Carries out an abort, or refuses it; either way its answer goes in the outbox, for whoever
/// aborted (`allot abort` waits for it).
fn aborted(c: &Connection, a: &WorkloadAborted, d: &Delivery) -> Result<Step, StoreError> {
    let refuse = |why: String| -> Result<Step, StoreError> {
        warn!(workload.id = %a.workload_id, team = %a.team, reason = %why, "abort refused");
        answer(c, a, d, AbortOutcome::Refused, &why)?;
        Ok(Step {
            outcome: Outcome::Rejected(why),
            queued: true,
        })
    };
    let Some(mut w) = store::load(c, &a.workload_id)? else {
        return refuse(format!("abort of unknown workload {}", a.workload_id));
    };
    if a.team != w.team {
        return refuse(format!(
            "abort of workload {} by team {}: it belongs to team {}",
            a.workload_id, a.team, w.team
        ));
    }
    if w.status != WorkloadStatus::Running {
        return refuse(format!(
            "workload {} has already {}: nothing to abort",
            w.id,
            match w.status {
                WorkloadStatus::Finished(WorkloadOutcome::Succeeded) => "succeeded",
                WorkloadStatus::Finished(WorkloadOutcome::Failed) => "failed",
                WorkloadStatus::Finished(WorkloadOutcome::Aborted) => "been aborted",
                WorkloadStatus::Running => "run",
            }
        ));
    }
    let loaded = w.clone();
    match w.abort(a.task.as_deref(), &a.by, &a.reason) {
        Ok(effects) => {
            let cancelled: Vec<&str> = w
                .tasks
                .iter()
                .zip(&loaded.tasks)
                .filter(|(t, was)| t.status == TaskStatus::Cancelled && was.status != t.status)
                .map(|(t, _)| t.name.as_str())
                .collect();
            let detail = if cancelled.is_empty() {
                "nothing was left to stop".to_owned()
            } else {
                format!("cancelled {}", cancelled.join(", "))
            };
            info!(workload.id = %w.id, task = ?a.task, by = %a.by, %detail, "workload aborted");
            commit(c, &loaded, &w, effects)?;
            answer(c, a, d, AbortOutcome::Accepted, &detail)?;
            Ok(Step::handled(true))
        }
        Err(e) => refuse(e.to_string()),
    }
}

/// Queues the answer to abort `d`.
fn answer(
    c: &Connection,
    a: &WorkloadAborted,
    d: &Delivery,
    outcome: AbortOutcome,
    detail: &str,
) -> Result<(), StoreError> {
    let answer = WorkloadAbortAnswered {
        abort: d.event.id.to_string(),
        workload_id: a.workload_id.clone(),
        team: a.team.clone(),
        task: a.task.clone(),
        outcome,
        detail: detail.to_owned(),
    };
    let mut envelope = Envelope::at(SOURCE, answer, Utc::now());
    envelope.id = event_id(&format!("abort-answer/{}", d.event.id));
    store::enqueue(
        c,
        0,
        &envelope.nats_subject(),
        &envelope.id.to_string(),
        &envelope.to_json(),
    )?;
    Ok(())
}

/// Where grant `lease` of `task` runs, as the journal entry's dispatch resolved it to node
/// names (empty when the entry has none for it).
fn nodes_of(applied: &Applied, task: TaskId, lease: LeaseId) -> Vec<TaskNode> {
    applied
        .dispatch
        .iter()
        .filter(|d| d.task == task && d.lease == lease)
        .flat_map(|d| &d.nodes)
        .map(|n| TaskNode {
            node: n.node.clone(),
            gpus: n
                .gpus
                .iter()
                .map(|&(index, milli)| GpuShare { index, milli })
                .collect(),
        })
        .collect()
}

/// Runs `transition` on the workload that attempt `id` belongs to, if it is one of the
/// planner's; `ends` is when the event ends the attempt, if it does (recorded, so a late grant
/// of a run that already ended is not mistaken for one nobody wants).
fn on_attempt(
    c: &Connection,
    id: TaskId,
    ends: Option<(Time, LeaseId)>,
    transition: impl FnOnce(&mut Workload, &str, u32) -> Vec<Effect>,
) -> Result<Step, StoreError> {
    let Some(attempt) = store::attempt(c, id)? else {
        return Ok(Step::handled(false));
    };
    if attempt.ended {
        return Ok(Step::handled(false));
    }
    if let Some((at, lease)) = ends {
        if stale(&attempt, id, lease) {
            return Ok(Step::handled(false));
        }
        store::ended(c, id, at)?;
    }
    let Some(mut w) = store::load(c, &attempt.workload)? else {
        return Err(StoreError::Corrupt(format!(
            "{id} belongs to workload {}, which is not stored",
            attempt.workload
        )));
    };
    let before = w.clone();
    let effects = transition(&mut w, &attempt.name, attempt.attempt);
    commit(c, &before, &w, effects)
}

/// Attempt `id`'s run under `run`'s lease ended, as the journal records it: the attempt
/// completed, or failed (a retry is a new attempt, which starts with the latest advice if its
/// task opted in).
fn run_ended(c: &Connection, id: TaskId, run: &RunEnd, at: Time) -> Result<Step, StoreError> {
    let ends = Some((at, run.lease()));
    match run {
        RunEnd::Completed { .. } => {
            on_attempt(c, id, ends, |w, name, attempt| w.completed(name, attempt))
        }
        RunEnd::Failed { lease, reason } => {
            if superseded(c, id, *lease)? {
                return Ok(Step::handled(false));
            }
            right_size_next(c, id)?;
            on_attempt(c, id, ends, |w, name, attempt| {
                w.failed(name, attempt, reason, at)
            })
        }
    }
}

/// [`stale`] for attempt `id`, if it is one of the planner's.
fn superseded(c: &Connection, id: TaskId, lease: LeaseId) -> Result<bool, StoreError> {
    Ok(store::attempt(c, id)?.is_some_and(|a| stale(&a, id, lease)))
}

/// Whether a run's end for `attempt` under `lease` comes from a run that was stopped and
/// superseded: the attempt was granted a later lease since (leases are numbered in the order
/// the allocator grants them). The allocator refuses such a report — the task runs again under
/// its new lease — so a journal in order never records one; this guards against one that is
/// not (taken as the attempt's failure, it would start the next attempt while the new run goes
/// on). Says so in the log when it is.
fn stale(attempt: &store::Attempt, id: TaskId, lease: LeaseId) -> bool {
    let stale = attempt.lease.is_some_and(|latest| lease < latest);
    if stale {
        warn!(
            task = %id, lease = lease.0, "a run's end under a lease the task was granted \
             again after is not the attempt's: ignored"
        );
    }
    stale
}

/// Keeps the predictor's right-sizing `advice`, which came with the prediction of attempt
/// `id`, as the latest for its task's key (whether or not that task opted in: a later
/// submission of the key may).
fn keep_advice(
    c: &Connection,
    id: TaskId,
    advice: &allot_events::task::Recommendation,
) -> Result<(), StoreError> {
    let Some(attempt) = store::attempt(c, id)? else {
        return Ok(());
    };
    let Some(w) = store::load(c, &attempt.workload)? else {
        return Ok(());
    };
    let key = allot_events::task::task_key(&w.team, &w.id, &attempt.name);
    store::save_advice(c, &key, advice)?;
    Ok(())
}

/// Before attempt `id` of an opted-in task ends, points its next attempts at the latest
/// advice for its key. The ending attempt's own spec was published already; only a retry
/// reads the template after this.
fn right_size_next(c: &Connection, id: TaskId) -> Result<(), StoreError> {
    let Some(attempt) = store::attempt(c, id)? else {
        return Ok(());
    };
    let Some(mut w) = store::load(c, &attempt.workload)? else {
        return Ok(());
    };
    let Some(i) = w.tasks.iter().position(|t| t.name == attempt.name) else {
        return Ok(());
    };
    if !w.tasks[i].right_size || attempt.ended || w.tasks[i].attempt != attempt.attempt {
        return Ok(());
    }
    let key = allot_events::task::task_key(&w.team, &w.id, &attempt.name);
    let Some(advice) = store::advice(c, &key)? else {
        return Ok(());
    };
    let before = w.clone();
    w.tasks[i].right_size(&advice);
    if w.tasks[i] != before.tasks[i] {
        info!(workload.id = %w.id, task = %attempt.name, model = %advice.model, gpu_milli = advice.gpu_milli, "retry right-sized as the predictor advises");
        store::save_changes(c, &before, &w)?;
    }
    Ok(())
}

/// Saves what changed of `w` since it was loaded as `before`, and queues its effects.
fn commit(
    c: &Connection,
    before: &Workload,
    w: &Workload,
    effects: Vec<Effect>,
) -> Result<Step, StoreError> {
    store::save_changes(c, before, w)?;
    let queued = !effects.is_empty();
    emit(c, w, effects)?;
    Ok(Step::handled(queued))
}

/// Puts each effect's event in the outbox, with an id derived from what it says.
fn emit(c: &Connection, w: &Workload, effects: Vec<Effect>) -> Result<(), StoreError> {
    for effect in effects {
        let (key, not_before, event): (String, Time, AnyEvent) = match effect {
            Effect::Ready {
                task,
                attempt,
                spec,
                not_before,
            } => {
                info!(workload.id = %w.id, task = %task, attempt, task.id = %spec.id, "task ready");
                // A preload still queued for it came too late to matter: the task is here.
                store::withdraw(c, &event_id(&format!("preload/{}", spec.id.0)).to_string())?;
                (
                    format!("ready/{}/{attempt}", spec.id.0),
                    not_before,
                    TaskReady {
                        pool: w.pool.clone(),
                        workload: w.id.clone(),
                        run: w.run_spec(&task, attempt),
                        name: task,
                        task: spec,
                    }
                    .into(),
                )
            }
            Effect::Preload {
                task,
                spec,
                expected_at,
                not_before,
            } => {
                info!(workload.id = %w.id, task = %task, task.id = %spec.id, expected_at, "task preloaded");
                // Timed again (its predecessor's prediction came): the new time replaces one
                // still queued.
                store::withdraw(c, &event_id(&format!("preload/{}", spec.id.0)).to_string())?;
                (
                    format!("preload/{}", spec.id.0),
                    not_before,
                    TaskPreload {
                        pool: w.pool.clone(),
                        workload: w.id.clone(),
                        name: task,
                        task: spec,
                        expected_at,
                    }
                    .into(),
                )
            }
            Effect::Cancel {
                task,
                attempt,
                id,
                lease,
                reason,
            } => {
                // Whatever of the run is still in the outbox goes with it; a run whose
                // `TaskReady` was never published is unknown to the allocator, so there is
                // nothing to withdraw there.
                store::withdraw(c, &event_id(&format!("preload/{}", id.0)).to_string())?;
                let unpublished = lease.is_none()
                    && store::withdraw(
                        c,
                        &event_id(&format!("ready/{}/{attempt}", id.0)).to_string(),
                    )?;
                if unpublished {
                    info!(workload.id = %w.id, task = %task, task.id = %id, reason = %reason, "task cancelled before it was published");
                    continue;
                }
                info!(workload.id = %w.id, task = %task, task.id = %id, reason = %reason, "task cancelled");
                (
                    format!("cancelled/{}/{}", id.0, lease.map_or(0, |l| l.0 + 1)),
                    0,
                    TaskCancelled {
                        pool: w.pool.clone(),
                        task: id,
                        workload: w.id.clone(),
                        name: task,
                        reason,
                    }
                    .into(),
                )
            }
            Effect::Finished { outcome, reason } => {
                info!(workload.id = %w.id, outcome = ?outcome, reason = ?reason, "workload finished");
                (
                    format!("finished/{}", w.id),
                    0,
                    WorkloadFinished {
                        workload_id: w.id.clone(),
                        team: w.team.clone(),
                        outcome,
                        reason,
                    }
                    .into(),
                )
            }
        };
        let mut envelope = Envelope::at(SOURCE, event, Utc::now());
        envelope.id = event_id(&key);
        store::enqueue(
            c,
            not_before,
            &envelope.nats_subject(),
            &envelope.id.to_string(),
            &envelope.to_json(),
        )?;
    }
    Ok(())
}
