//! The allocators' own view, rebuilt from their journals: the queue with every waiting task's
//! reason and ETA, what runs where, and the cluster's KPIs over time.
//!
//! Each pool's journal is applied, entry by entry, to an [`allot_sched::Scheduler`] with the
//! journal's policy — exactly what `allot replay` does — so the queue shown is the allocator's,
//! with nothing estimated twice. The mirror lives in memory: on start it reads the journals
//! from their first entry (an ordered consumer; nothing durable to keep in step), then follows
//! them. Looking back is the same, stopped at the moment asked for ([`lookback`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::Serialize;
use utoipa::ToSchema;

use allot_events::alloc::{Applied, NodeGrant};
use allot_events::{AllocEvent, AnyEvent, decode, subject};
use allot_sched::{Decision, Input, Scheduler, TaskId, Time};

/// One waiting task, as `GET /api/v1/queue` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct QueueEntry {
    /// The pool whose queue it is in.
    pub pool: String,
    /// Its place in the pool's queue, from 1 (the whole queue's, also in one team's view).
    pub position: usize,
    /// The attempt's id.
    pub task_id: u64,
    /// Its workload.
    pub workload: Option<String>,
    /// Its name in the workload.
    pub task: Option<String>,
    /// Its team.
    pub team: String,
    /// Its priority.
    pub priority: i32,
    /// GPUs asked for.
    pub gpus: u32,
    /// Milli-GPU per GPU.
    pub gpu_milli: u32,
    /// When it joined the queue.
    pub submitted: Option<DateTime<Utc>>,
    /// Why it waits, in words.
    pub reason: String,
    /// When it is expected to start (absent: not before something else changes — a quota, a
    /// budget, a node).
    pub eta: Option<DateTime<Utc>>,
    /// The run time the scheduler expects (a prediction, once one was journalled), ms.
    pub predicted_ms: Option<u64>,
    /// Its deadline, if its spec gives one.
    pub deadline: Option<DateTime<Utc>>,
    /// It is expected to miss its deadline.
    pub at_risk: bool,
}

/// One running task's share of a node.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Allocation {
    /// The pool.
    pub pool: String,
    /// The attempt's id.
    pub task_id: u64,
    /// Its lease.
    pub lease: u64,
    /// Its workload.
    pub workload: String,
    /// Its name.
    pub task: String,
    /// Its team.
    pub team: String,
    /// The node.
    pub node: String,
    /// `[GPU index, milli-GPU]` pairs held there.
    pub gpus: Vec<[u32; 2]>,
    /// Since when.
    pub since: Option<DateTime<Utc>>,
}

/// The cluster over one minute of the journal's time.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct KpiPoint {
    /// The pool.
    pub pool: String,
    /// The minute's start.
    pub at: DateTime<Utc>,
    /// GPU capacity allocated, averaged over the minute (0–1).
    pub allocation_ratio: f64,
    /// Of the idle GPU capacity, the share that sat idle while a waiting task would have fitted
    /// on it (WR_fit, as `allot sim` measures it; 0–1).
    pub wastage_ratio: f64,
    /// Tasks that finished in the minute.
    pub finished: u64,
    /// Tasks waiting at the minute's end.
    pub waiting: u64,
}

/// Integrated over the current minute.
#[derive(Debug, Default, Clone)]
struct Minute {
    start: Time,
    capacity: f64,
    allocated: f64,
    idle: f64,
    wasted: f64,
    finished: u64,
}

/// One pool, as its journal leaves it.
#[derive(Debug)]
struct Pool {
    scheduler: Scheduler,
    names: HashMap<TaskId, (String, String, String)>,
    submitted: HashMap<TaskId, Time>,
    running: BTreeMap<TaskId, (u64, Vec<NodeGrant>, Time)>,
    last_at: Time,
    fits: bool,
    minute: Minute,
    kpis: VecDeque<KpiPoint>,
}

/// At most this many minutes of KPIs per pool (a week).
const KPI_MINUTES: usize = 7 * 24 * 60;

impl Pool {
    fn new(policy: &str) -> Option<Self> {
        Some(Self {
            scheduler: Scheduler::new(allot_sched::policy::by_name(policy)?),
            names: HashMap::new(),
            submitted: HashMap::new(),
            running: BTreeMap::new(),
            last_at: 0,
            fits: false,
            minute: Minute::default(),
            kpis: VecDeque::new(),
        })
    }

    /// Integrates the cluster's state from the last input's time to `at`.
    fn advance(&mut self, pool: &str, at: Time) {
        if at <= self.last_at {
            return;
        }
        if at - self.last_at > KPI_MINUTES as u64 * 60_000 {
            // The first input (the journal's clock starts there, not at the epoch), or a pause
            // longer than the window kept: nothing before it would be kept anyway.
            self.kpis.clear();
            self.minute = Minute {
                start: at - at % 60_000,
                ..Minute::default()
            };
            self.last_at = at;
            return;
        }
        let cluster = self.scheduler.cluster();
        let capacity = cluster.capacity_milli() as f64;
        let allocated = cluster.allocated_milli() as f64;
        let mut from = self.last_at;
        while from < at {
            let end = (self.minute.start + 60_000).min(at);
            let dt = (end - from) as f64;
            self.minute.capacity += capacity * dt;
            self.minute.allocated += allocated * dt;
            self.minute.idle += (capacity - allocated) * dt;
            if self.fits {
                self.minute.wasted += (capacity - allocated) * dt;
            }
            from = end;
            if end == self.minute.start + 60_000 {
                self.close_minute(pool);
            }
        }
        self.last_at = at;
    }

    fn close_minute(&mut self, pool: &str) {
        let m = std::mem::take(&mut self.minute);
        let point = KpiPoint {
            pool: pool.to_owned(),
            at: at_utc(m.start).unwrap_or_default(),
            allocation_ratio: if m.capacity > 0.0 {
                m.allocated / m.capacity
            } else {
                0.0
            },
            wastage_ratio: if m.idle > 0.0 { m.wasted / m.idle } else { 0.0 },
            finished: m.finished,
            waiting: self.scheduler.pending() as u64,
        };
        if self.kpis.len() == KPI_MINUTES {
            self.kpis.pop_front();
        }
        self.kpis.push_back(point);
        self.minute.start = m.start + 60_000;
    }

    fn apply(&mut self, pool: &str, a: &Applied) {
        let entry = &a.entry;
        if let Some(at) = entry.input.at() {
            self.advance(pool, at);
        }
        if let Input::TaskSubmitted { task, at } = &entry.input {
            self.submitted.insert(task.id, *at);
            if let Some(l) = &a.launch {
                let team = if l.team.is_empty() {
                    task.team.clone()
                } else {
                    l.team.clone()
                };
                self.names
                    .insert(task.id, (l.workload.clone(), l.name.clone(), team));
            }
        }
        // Rejected inputs changed nothing when they were logged, and change nothing here.
        let _ = self.scheduler.apply(entry.input.clone());
        for d in &entry.decisions {
            match d {
                Decision::Granted {
                    task, lease, at, ..
                } => {
                    let nodes = a
                        .dispatch
                        .iter()
                        .filter(|g| g.task == *task)
                        .flat_map(|g| g.nodes.iter().cloned())
                        .collect();
                    self.running.insert(*task, (lease.0, nodes, *at));
                }
                Decision::Preempted { task, .. } => {
                    self.running.remove(task);
                }
                Decision::Released { task, .. } => {
                    // A release ends a run: what the throughput chart counts.
                    self.minute.finished += u64::from(self.running.remove(task).is_some());
                }
                _ => {}
            }
        }
        if let Input::TaskFinished { task, .. } = &entry.input {
            self.running.remove(task);
        }
        self.forget_gone(a);
        self.fits = self.scheduler.some_pending_fits();
    }

    /// Forgets the names and submission times of the tasks `a` took out of the scheduler
    /// (finished, withdrawn, or refused as they were submitted): nothing shows them again, and
    /// a gateway that kept them would grow by every task it ever saw.
    fn forget_gone(&mut self, a: &Applied) {
        let from_input = match &a.entry.input {
            Input::TaskSubmitted { task, .. } => Some(task.id),
            Input::TaskFinished { task, .. } | Input::TaskWithdrawn { task, .. } => Some(*task),
            _ => None,
        };
        let from_decisions = a.entry.decisions.iter().filter_map(|d| match d {
            Decision::Released { task, .. } | Decision::Withdrawn { task, .. } => Some(*task),
            _ => None,
        });
        for task in from_input.into_iter().chain(from_decisions) {
            if !self.scheduler.holds(task) {
                self.names.remove(&task);
                self.submitted.remove(&task);
            }
        }
    }

    fn queue(&self, pool: &str, now: Time) -> Vec<QueueEntry> {
        self.scheduler
            .queue(now)
            .map(|(position, spec, w)| {
                let names = self.names.get(&spec.id);
                QueueEntry {
                    pool: pool.to_owned(),
                    position,
                    task_id: spec.id.0,
                    workload: names.map(|n| n.0.clone()),
                    task: names.map(|n| n.1.clone()),
                    team: spec.team.clone(),
                    priority: spec.priority,
                    gpus: spec.gpus,
                    gpu_milli: spec.gpu_milli,
                    submitted: self.submitted.get(&spec.id).and_then(|t| at_utc(*t)),
                    reason: w.reason.to_string(),
                    eta: w.eta.and_then(at_utc),
                    predicted_ms: spec.predicted_duration,
                    deadline: spec.deadline.and_then(at_utc),
                    at_risk: w.at_risk,
                }
            })
            .collect()
    }

    fn allocations(&self, pool: &str) -> Vec<Allocation> {
        let mut out = Vec::new();
        for (task, (lease, nodes, since)) in &self.running {
            let (workload, name, team) = self.names.get(task).cloned().unwrap_or_default();
            for n in nodes {
                out.push(Allocation {
                    pool: pool.to_owned(),
                    task_id: task.0,
                    lease: *lease,
                    workload: workload.clone(),
                    task: name.clone(),
                    team: team.clone(),
                    node: n.node.clone(),
                    gpus: n.gpus.iter().map(|&(g, m)| [g, m]).collect(),
                    since: at_utc(*since),
                });
            }
        }
        out
    }
}

/// A journal time (ms since the epoch under a live allocator) as a UTC time.
pub fn at_utc(ms: Time) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(i64::try_from(ms).ok()?)
}

/// Every pool's scheduler, rebuilt from the journals.
#[derive(Debug, Default)]
pub struct Mirror {
    pools: BTreeMap<String, Pool>,
}

impl Mirror {
    /// Applies one journal event.
    pub fn apply(&mut self, event: &AllocEvent) {
        match event {
            AllocEvent::LeaderElected(e) => {
                if !self.pools.contains_key(&e.pool) {
                    match Pool::new(&e.policy) {
                        Some(p) => {
                            self.pools.insert(e.pool.clone(), p);
                        }
                        None => {
                            tracing::warn!(pool = %e.pool, policy = %e.policy, "journal of an unknown policy: not mirrored")
                        }
                    }
                }
            }
            AllocEvent::Applied(a) => {
                if let Some(p) = self.pools.get_mut(&a.pool) {
                    p.apply(&a.pool, a);
                }
            }
        }
    }

    /// Every waiting task of every pool at `now`, in queue order per pool.
    pub fn queue(&self, now: DateTime<Utc>) -> Vec<QueueEntry> {
        self.pools
            .iter()
            .flat_map(|(name, p)| {
                let now = (now.timestamp_millis().max(0) as Time).max(p.last_at);
                p.queue(name, now)
            })
            .collect()
    }

    /// The queue as it stood at the last entry applied (for a look back).
    pub fn queue_at_last(&self) -> Vec<QueueEntry> {
        self.pools
            .iter()
            .flat_map(|(name, p)| p.queue(name, p.last_at))
            .collect()
    }

    /// What runs where.
    pub fn allocations(&self) -> Vec<Allocation> {
        self.pools
            .iter()
            .flat_map(|(name, p)| p.allocations(name))
            .collect()
    }

    /// Per pool: GPU capacity and allocation (milli-GPU) and the pending count now.
    pub fn usage(&self) -> Vec<(String, u64, u64, usize)> {
        self.pools
            .iter()
            .map(|(name, p)| {
                let c = p.scheduler.cluster();
                (
                    name.clone(),
                    c.capacity_milli(),
                    c.allocated_milli(),
                    p.scheduler.pending(),
                )
            })
            .collect()
    }

    /// KPIs per minute, oldest first, for every pool.
    pub fn kpis(&self) -> Vec<KpiPoint> {
        self.pools
            .values()
            .flat_map(|p| p.kpis.iter().cloned())
            .collect()
    }

    /// Node names that each pool's scheduler holds, with whether it takes work.
    pub fn schedulable(&self) -> HashMap<String, bool> {
        self.pools
            .values()
            .flat_map(|p| {
                p.scheduler
                    .cluster()
                    .nodes()
                    .iter()
                    .map(|n| (n.spec.name.clone(), n.schedulable))
            })
            .collect()
    }
}

/// The messages of an ordered read of every pool's journal from its first entry.
type Journals = async_nats::jetstream::consumer::pull::Ordered;

/// Starts reading every pool's journal from its first entry; with it, the DECISIONS stream's
/// last sequence at the start (0: nothing to read).
async fn journals(js: &jetstream::Context) -> Result<(u64, Journals), String> {
    let failed = |e: &dyn std::fmt::Display| format!("reading the journals: {e}");
    let stream = js
        .get_stream(allot_bus::streams::names::DECISIONS)
        .await
        .map_err(|e| failed(&e))?;
    let last = stream
        .get_info()
        .await
        .map_err(|e| failed(&e))?
        .state
        .last_sequence;
    let messages = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: subject::alloc_journal("*"),
            deliver_policy: DeliverPolicy::All,
            max_expires: allot_bus::consumer::ORDERED_MAX_EXPIRES,
            ..Default::default()
        })
        .await
        .map_err(|e| failed(&e))?
        .messages()
        .await
        .map_err(|e| failed(&e))?;
    Ok((last, messages))
}

/// One journal message: its stream sequence, when it was stored, whether it is the last one
/// for now (the server says none is pending), and its event if it is one.
struct Read {
    sequence: u64,
    published: DateTime<Utc>,
    newest: bool,
    event: Option<AllocEvent>,
}

async fn next(messages: &mut Journals) -> Result<Option<Read>, String> {
    loop {
        let Some(message) = messages.next().await else {
            return Ok(None);
        };
        let message = message.map_err(|e| format!("reading the journals: {e}"))?;
        let Ok(info) = message.info() else { continue };
        let event = match decode(&message.payload).map(|e| e.data) {
            Ok(AnyEvent::Alloc(event)) => Some(event),
            _ => None,
        };
        return Ok(Some(Read {
            sequence: info.stream_sequence,
            published: allot_bus::consumer::stored_at(&info),
            newest: info.pending == 0,
            event,
        }));
    }
}

/// Follows every pool's journal into `mirror` for as long as the service runs. `caught_up`
/// opens once the journals as they were at the start have been applied.
///
/// The read is an ordered consumer, which the server does not keep across its own restart:
/// when the read fails, the mirror is rebuilt from the journals' first entry (it is derived
/// from them alone), in the background, and swapped in once caught up — meanwhile the last one
/// keeps answering.
pub async fn follow(
    js: jetstream::Context,
    mirror: Arc<Mutex<Mirror>>,
    caught_up: allot_runtime::Gate,
) {
    let mut caught_up = Some(caught_up);
    let mut backoff = Duration::from_millis(250);
    loop {
        match follow_once(&js, &mirror, &mut caught_up).await {
            Ok(()) => backoff = Duration::from_millis(250),
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "reading the journals; rebuilding the mirror from their start");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// One read of the journals from their first entry: into a fresh mirror until caught up, then
/// swapped in and followed in place. Returns when the read ends.
async fn follow_once(
    js: &jetstream::Context,
    shared: &Mutex<Mirror>,
    caught_up: &mut Option<allot_runtime::Gate>,
) -> Result<(), String> {
    let (last, mut messages) = journals(js).await?;
    let mut fresh = Some(Mirror::default());
    let mut swap = |fresh: &mut Option<Mirror>| {
        if let Some(m) = fresh.take() {
            *shared.lock().expect("mirror lock") = m;
        }
        if let Some(gate) = caught_up.take() {
            gate.open();
        }
    };
    if last == 0 {
        swap(&mut fresh);
    }
    while let Some(read) = next(&mut messages).await? {
        if let Some(event) = &read.event {
            match &mut fresh {
                Some(m) => m.apply(event),
                None => shared.lock().expect("mirror lock").apply(event),
            }
        }
        if read.sequence >= last || read.newest {
            swap(&mut fresh);
        }
    }
    Ok(())
}

/// Every pool as its journal stood at `at` (entries stored at or before it).
pub async fn lookback(js: &jetstream::Context, at: DateTime<Utc>) -> Result<Mirror, String> {
    let mut mirror = Mirror::default();
    let (last, mut messages) = journals(js).await?;
    if last == 0 {
        return Ok(mirror);
    }
    while let Some(read) = next(&mut messages).await? {
        if read.published > at {
            break;
        }
        if let Some(event) = &read.event {
            mirror.apply(event);
        }
        if read.sequence >= last || read.newest {
            break;
        }
    }
    Ok(mirror)
}

#[cfg(test)]
mod tests;
