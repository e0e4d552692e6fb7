//! The scheduler: a live cluster view and a queue, changed only by applying inputs; each
//! `Schedule` input runs one pass of a short numbered pipeline (after Kueue's
//! `scheduler.go`):
//!
//! 1. **order** — pending tasks in the policy's order (re-keyed first if the policy's keys move
//!    with time);
//! 2. **nominate** — for the next task, find a placement on the free capacity;
//! 3. **preempt** — if none and the policy is preemptive, free room by preempting running
//!    tasks whose keys are strictly worse, worst first, keeping only victims on the nodes the
//!    placement uses (gangs leave whole);
//! 4. **admit** — grant it: take the resources, open a lease, explain the decision;
//! 5. **blocked** — if it still does not fit, record why, then stop, go on, or reserve its
//!    earliest start and backfill around it, as the policy says.
//!
//! A victim goes back to the queue with its original arrival. Policies decide who may preempt
//! whom ([`Policy::may_preempt`]) under one rule: never both ways — by key (a victim's key is
//! strictly worse) or by quota (only a team within its nominal quota reclaims, only from teams
//! that borrow) — so no two tasks can preempt each other in turn.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::cluster::{Cluster, Placement};
use crate::decision::{Decision, WaitReason};
use crate::estimate::{DurationEstimator, History};
use crate::model::{
    LeaseId, NodeIdx, NodeSpec, RequestShape as Shape, TaskId, TaskSpec, Time, WHOLE_GPU_MILLI,
};
use crate::policy::{Contender, PendingView, Policy, QueueKey, WhenBlocked};
use crate::quota::{Quota, Quotas};

/// Something that happened, in the one total order the scheduler sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A node joined.
    NodeAdded(NodeSpec),
    /// A task is ready to run.
    TaskSubmitted {
        /// The task.
        task: TaskSpec,
        /// When.
        at: Time,
    },
    /// A running task completed.
    TaskFinished {
        /// The task.
        task: TaskId,
        /// When.
        at: Time,
    },
    /// A node was cordoned or became unhealthy (`schedulable: false`), or returned to service.
    /// Nothing new is placed on an unschedulable node; what runs there keeps running until the
    /// caller drains it (finishes or requeues its tasks).
    NodeSchedulable {
        /// Node name.
        node: String,
        /// Whether new work may be placed there.
        schedulable: bool,
    },
    /// A team's quota was set (or changed).
    TeamQuota {
        /// The team.
        team: String,
        /// Its quota.
        quota: Quota,
    },
    /// Run a scheduling pass.
    Schedule {
        /// When.
        at: Time,
    },
}

/// An input the scheduler cannot apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// A task id was submitted twice.
    #[error("{0} was already submitted")]
    DuplicateTask(TaskId),
    /// A finish for a task that is not running.
    #[error("{0} is not running")]
    NotRunning(TaskId),
    /// An input named a node the scheduler does not know.
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    /// A request no node could ever satisfy.
    #[error("{task} can never be placed: {why}")]
    Unplaceable {
        /// The task.
        task: TaskId,
        /// Why.
        why: String,
    },
}

#[derive(Debug)]
enum State {
    Pending {
        key: QueueKey,
        last_wait: Option<WaitReason>,
    },
    Running {
        lease: LeaseId,
        placement: Placement,
        since: Time,
    },
}

#[derive(Debug)]
struct Task {
    spec: TaskSpec,
    /// What placement depends on in `spec`, computed once.
    shape: Shape,
    submitted: Time,
    seq: u64,
    /// Run time of earlier runs (before preemptions), ms.
    attained: Time,
    state: State,
}

impl Task {
    fn view(&self, now: Time, estimate: Time) -> PendingView<'_> {
        let attained = self.attained
            + match self.state {
                State::Running { since, .. } => now.saturating_sub(since),
                State::Pending { .. } => 0,
            };
        PendingView {
            spec: &self.spec,
            submitted: self.submitted,
            seq: self.seq,
            attained,
            attained_gpu: attained.saturating_mul(u64::from(self.spec.gpus.max(1))),
            estimate,
            estimate_learned: false,
        }
    }
}

/// The scheduling core. See the module docs for the pass.
#[derive(Debug)]
pub struct Scheduler {
    cluster: Cluster,
    policy: Box<dyn Policy>,
    estimator: Box<dyn DurationEstimator>,
    quotas: Quotas,
    /// The cluster with nothing running: what "can this task ever be placed" is asked of.
    pristine: Cluster,
    /// Answers of `pristine`, per request shape.
    fits_empty: HashMap<Shape, bool>,
    /// Shapes that found no placement since capacity was last freed: capacity only shrinks in
    /// between, so they cannot fit now either, and the search is skipped.
    no_room: HashSet<Shape>,
    queue: BTreeMap<QueueKey, TaskId>,
    tasks: HashMap<TaskId, Task>,
    /// Distinct request shapes among pending tasks, with how many tasks have each: whether
    /// any pending task could start is a question about shapes, not tasks.
    shapes: HashMap<Shape, (usize, TaskSpec)>,
    next_seq: u64,
    next_lease: u64,
}

impl Scheduler {
    /// A scheduler with an empty cluster, deciding by `policy`, estimating durations from
    /// history (or with the oracle, for policies that are oracle baselines).
    pub fn new(policy: Box<dyn Policy>) -> Self {
        let estimator: Box<dyn DurationEstimator> = if policy.uses_oracle() {
            Box::new(crate::estimate::Oracle)
        } else {
            Box::new(History::default())
        };
        Self {
            cluster: Cluster::new(),
            policy,
            estimator,
            quotas: Quotas::default(),
            pristine: Cluster::new(),
            fits_empty: HashMap::default(),
            no_room: HashSet::default(),
            queue: BTreeMap::new(),
            tasks: HashMap::default(),
            shapes: HashMap::default(),
            next_seq: 0,
            next_lease: 1,
        }
    }

    /// The cluster as it is now.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The policy.
    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }

    /// The duration estimator.
    pub fn estimator(&self) -> &dyn DurationEstimator {
        self.estimator.as_ref()
    }

    /// Team quotas and usage.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// Tasks waiting.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// Pending tasks in queue order.
    pub fn pending_specs(&self) -> impl Iterator<Item = &TaskSpec> {
        self.queue.values().map(|id| &self.tasks[id].spec)
    }

    /// Whether some pending task could be placed on the free capacity as it is now — the
    /// question behind WR_fit (capacity idle while a task that fits waits).
    pub fn some_pending_fits(&self) -> bool {
        self.shapes
            .values()
            .any(|(_, spec)| self.policy.place(&self.cluster, spec).is_some())
    }

    /// Applies one input and returns what was decided.
    pub fn apply(&mut self, input: Input) -> Result<Vec<Decision>, ApplyError> {
        let mut out = Vec::new();
        self.apply_into(input, &mut out)?;
        Ok(out)
    }

    /// Applies one input, appending decisions to `out` (no allocation per call).
    pub fn apply_into(&mut self, input: Input, out: &mut Vec<Decision>) -> Result<(), ApplyError> {
        match input {
            Input::NodeAdded(spec) => {
                self.pristine.add_node(spec.clone());
                self.cluster.add_node(spec);
                self.fits_empty.clear();
                self.no_room.clear();
            }
            Input::TaskSubmitted { task, at } => self.submit(task, at)?,
            Input::TaskFinished { task, at } => self.finish(task, at, out)?,
            Input::TeamQuota { team, quota } => self.quotas.set(&team, quota),
            Input::NodeSchedulable { node, schedulable } => {
                let idx = self
                    .cluster
                    .find(&node)
                    .ok_or(ApplyError::UnknownNode(node))?;
                self.cluster.set_schedulable(idx, schedulable);
                self.no_room.clear();
            }
            Input::Schedule { at } => self.pass(at, out),
        }
        Ok(())
    }

    fn submit(&mut self, spec: TaskSpec, at: Time) -> Result<(), ApplyError> {
        if self.tasks.contains_key(&spec.id) {
            return Err(ApplyError::DuplicateTask(spec.id));
        }
        if let Some(why) = self.never_fits(&spec) {
            return Err(ApplyError::Unplaceable { task: spec.id, why });
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.policy.observe_submitted(&spec);
        let mut task = Task {
            shape: Shape::of(&spec),
            spec,
            submitted: at,
            seq,
            attained: 0,
            state: State::Pending {
                key: QueueKey(0, 0, 0),
                last_wait: None,
            },
        };
        let key = self.key_of(&task, at);
        task.state = State::Pending {
            key,
            last_wait: None,
        };
        self.enqueue(key, task);
        Ok(())
    }

    fn key_of(&self, task: &Task, now: Time) -> QueueKey {
        let (estimate, learned) = if self.policy.needs_estimates() {
            (
                self.estimator.estimate(&task.spec),
                self.estimator.learned(&task.spec),
            )
        } else {
            (0, false)
        };
        let mut view = task.view(now, estimate);
        // Hook (openb-allot): whether the estimate was learned, for policies that must not act
        // on a default guess (`allot` does not preempt for one).
        view.estimate_learned = learned;
        self.policy.key(view, now)
    }

    fn enqueue(&mut self, key: QueueKey, task: Task) {
        let id = task.spec.id;
        self.queue.insert(key, id);
        self.shapes
            .entry(task.shape.clone())
            .or_insert_with(|| (0, task.spec.clone()))
            .0 += 1;
        self.tasks.insert(id, task);
    }

    fn forget_shape(&mut self, spec: &TaskSpec) {
        let shape = Shape::of(spec);
        if let Some(entry) = self.shapes.get_mut(&shape) {
            entry.0 -= 1;
            if entry.0 == 0 {
                self.shapes.remove(&shape);
            }
        }
    }

    /// Why no node of the cluster, even empty, could ever hold the task.
    fn never_fits(&mut self, spec: &TaskSpec) -> Option<String> {
        let shape = Shape::of(spec);
        if let Some(fits) = self.fits_empty.get(&shape) {
            return (!fits).then(|| Self::unplaceable_reason(spec));
        }
        // The placement rules themselves decide, on the cluster with nothing running.
        let fits = self.policy.place(&self.pristine, spec).is_some();
        self.fits_empty.insert(shape, fits);
        (!fits).then(|| Self::unplaceable_reason(spec))
    }

    fn unplaceable_reason(spec: &TaskSpec) -> String {
        let models = if spec.gpu_models.is_empty() {
            "any model".to_owned()
        } else {
            spec.gpu_models.join(" or ")
        };
        format!(
            "no placement holds {} GPU(s) of {} milli-GPU each ({models}, {} m CPU, {} MiB) even on the idle cluster",
            spec.gpus, spec.gpu_milli, spec.cpu_milli, spec.memory_mib
        )
    }

    fn finish(&mut self, id: TaskId, at: Time, out: &mut Vec<Decision>) -> Result<(), ApplyError> {
        let running = matches!(
            self.tasks.get(&id),
            Some(Task {
                state: State::Running { .. },
                ..
            })
        );
        if !running {
            return Err(ApplyError::NotRunning(id));
        }
        if let Some(task) = self.tasks.remove(&id)
            && let State::Running {
                lease,
                placement,
                since,
            } = task.state
        {
            self.cluster.release(&placement);
            self.no_room.clear();
            self.quotas
                .refund(&task.spec.team, task.spec.gpu_demand_milli());
            self.estimator
                .observe(&task.spec, task.attained + at.saturating_sub(since));
            out.push(Decision::Released {
                task: id,
                lease,
                at,
            });
        }
        Ok(())
    }

    fn pass(&mut self, now: Time, out: &mut Vec<Decision>) {
        // 1. order
        if self.policy.dynamic() {
            self.rekey(now);
        }
        let blocked = self.sweep(now, out, true);
        // Victims leave more room than their preemptor needed: give it to whoever fits.
        if blocked.1 {
            self.sweep(now, out, false);
        }
        if let Some((id, reason)) = blocked.0
            && let Some(Task {
                state: State::Pending { last_wait, .. },
                ..
            }) = self.tasks.get_mut(&id)
            && last_wait.as_ref() != Some(&reason)
        {
            *last_wait = Some(reason.clone());
            out.push(Decision::Waiting {
                task: id,
                reason,
                at: now,
            });
        }
    }

    /// One walk over the queue (steps 2-5); returns the first blocked task and whether any
    /// task was preempted.
    fn sweep(
        &mut self,
        now: Time,
        out: &mut Vec<Decision>,
        may_preempt: bool,
    ) -> (Option<(TaskId, WaitReason)>, bool) {
        let queue = std::mem::take(&mut self.queue);
        let mut started: Vec<QueueKey> = Vec::new();
        let mut requeued: Vec<TaskId> = Vec::new();
        let mut blocked: Option<(TaskId, WaitReason)> = None;
        let mut reservation: Option<Reservation> = None;
        let mut hopeless_gpus = u32::MAX;
        let mut running: Option<Vec<(QueueKey, TaskId)>> = None;
        for (key, id) in &queue {
            let task = &self.tasks[id];
            let spec = &task.spec;
            // 2. nominate
            let mut placement =
                if !self.policy.admits(spec, &self.quotas) || self.no_room.contains(&task.shape) {
                    None
                } else {
                    let found = self.policy.place(&self.cluster, spec);
                    if found.is_none() {
                        self.no_room.insert(task.shape.clone());
                    }
                    found
                };
            if let (Some(p), Some(r)) = (&placement, &reservation)
                && !r.allows(p, now + self.estimator.estimate(spec))
            {
                placement = None;
            }
            // 3. preempt
            if placement.is_none()
                && may_preempt
                && self.policy.preemptive()
                && reservation.is_none()
                && spec.gpus < hopeless_gpus
            {
                let spec = spec.clone();
                placement = self.preempt_for(&spec, *key, now, out, &mut requeued, &mut running);
                if placement.is_none() {
                    hopeless_gpus = spec.gpus;
                }
            }
            let spec = &self.tasks[id].spec;
            let Some(placement) = placement else {
                // 5. blocked
                if blocked.is_none() {
                    let free = self.cluster.free_milli();
                    let reason = WaitReason::NoCapacity {
                        gpus: spec.gpus,
                        free_gpus: free / u64::from(WHOLE_GPU_MILLI),
                    };
                    blocked = Some((*id, reason));
                }
                match self.policy.when_blocked() {
                    WhenBlocked::Stop => break,
                    WhenBlocked::Continue => continue,
                    WhenBlocked::Reserve => {
                        if reservation.is_none() {
                            reservation = Some(self.reserve(spec, now));
                        }
                        continue;
                    }
                }
            };
            // 4. admit
            self.cluster.allocate(&placement);
            self.quotas.charge(&spec.team, spec.gpu_demand_milli());
            let lease = LeaseId(self.next_lease);
            self.next_lease += 1;
            out.push(Decision::Granted {
                task: *id,
                lease,
                placement: placement.clone(),
                at: now,
                reason: format!(
                    "{}: first in the queue's order that fits",
                    self.policy.name()
                ),
            });
            started.push(*key);
            let spec = spec.clone();
            self.forget_shape(&spec);
            if let Some(task) = self.tasks.get_mut(id) {
                task.state = State::Running {
                    lease,
                    placement,
                    since: now,
                };
            }
            if let Some(cache) = running.as_mut()
                && let Some(task) = self.tasks.get(id)
            {
                let entry = (self.key_of(task, now), *id);
                let at = cache.partition_point(|e| *e > entry);
                cache.insert(at, entry);
            }
        }
        self.queue = queue;
        for key in started {
            self.queue.remove(&key);
        }
        let preempted = !requeued.is_empty();
        for id in requeued {
            if let Some(task) = self.tasks.remove(&id) {
                let key = self.key_of(&task, now);
                let mut task = task;
                task.state = State::Pending {
                    key,
                    last_wait: None,
                };
                self.enqueue(key, task);
            }
        }
        (blocked, preempted)
    }

    /// Frees room for `spec` by preempting running tasks with strictly worse keys, worst first;
    /// returns the placement if enough room was found (victims already preempted), else leaves
    /// everything as it was.
    fn preempt_for(
        &mut self,
        spec: &TaskSpec,
        key: QueueKey,
        now: Time,
        out: &mut Vec<Decision>,
        requeued: &mut Vec<TaskId>,
        running: &mut Option<Vec<(QueueKey, TaskId)>>,
    ) -> Option<Placement> {
        // Running tasks by key, worst first: keys do not move within a pass, so they are
        // computed once per sweep and kept current as tasks start and are preempted.
        let running = running.get_or_insert_with(|| {
            let mut all: Vec<(QueueKey, TaskId)> = self
                .tasks
                .values()
                .filter(|t| matches!(t.state, State::Running { .. }))
                .map(|t| (self.key_of(t, now), t.spec.id))
                .collect();
            all.sort_unstable_by(|a, b| b.cmp(a));
            all
        });
        let victims: Vec<(QueueKey, TaskId)> = running
            .iter()
            .copied()
            .filter(|(k, id)| {
                let preemptor = Contender { spec, key };
                let victim = Contender {
                    spec: &self.tasks[id].spec,
                    key: *k,
                };
                self.policy.may_preempt(preemptor, victim, &self.quotas)
            })
            .collect();
        let held: u64 = victims
            .iter()
            .map(|(_, id)| u64::from(self.tasks[id].spec.gpus))
            .sum();
        let free = (self.cluster.free_milli()) / u64::from(WHOLE_GPU_MILLI);
        if held + free < u64::from(spec.gpus) {
            return None;
        }
        let mut released: Vec<TaskId> = Vec::new();
        let mut found = None;
        for (_, victim) in &victims {
            let task = &self.tasks[victim];
            if let State::Running { placement, .. } = &task.state {
                self.cluster.release(placement);
                self.quotas
                    .refund(&task.spec.team, task.spec.gpu_demand_milli());
                released.push(*victim);
            }
            if self.policy.admits(spec, &self.quotas)
                && let Some(p) = self.policy.place(&self.cluster, spec)
            {
                found = Some(p);
                break;
            }
        }
        let Some(placement) = found else {
            for victim in released {
                let task = &self.tasks[&victim];
                if let State::Running { placement, .. } = &task.state {
                    self.cluster.allocate(placement);
                    self.quotas
                        .charge(&task.spec.team, task.spec.gpu_demand_milli());
                }
            }
            return None;
        };
        // Keep running every victim whose nodes the placement does not use.
        let used: BTreeSet<NodeIdx> = placement.shares.iter().map(|s| s.node).collect();
        for victim in released {
            let Some(task) = self.tasks.get_mut(&victim) else {
                continue;
            };
            let State::Running {
                placement: held,
                lease,
                since,
            } = &task.state
            else {
                continue;
            };
            if held.shares.iter().all(|s| !used.contains(&s.node)) {
                // Off the placement's nodes: it keeps running, unless quotas still need what it
                // holds (then admission, checked with it refunded, would no longer hold).
                self.cluster.allocate(held);
                self.quotas
                    .charge(&task.spec.team, task.spec.gpu_demand_milli());
                if self.policy.admits(spec, &self.quotas) {
                    continue;
                }
                self.cluster.release(held);
                self.quotas
                    .refund(&task.spec.team, task.spec.gpu_demand_milli());
            }
            let (lease, since) = (*lease, *since);
            task.attained += now.saturating_sub(since);
            out.push(Decision::Preempted {
                task: victim,
                lease,
                at: now,
                for_task: spec.id,
                reason: format!(
                    "{}: {} ranks ahead and needs its GPUs",
                    self.policy.name(),
                    spec.id
                ),
            });
            task.state = State::Pending {
                key: QueueKey(0, 0, 0),
                last_wait: None,
            };
            requeued.push(victim);
            running.retain(|(_, id)| *id != victim);
        }
        // Victims may have freed more than the preemptor took.
        self.no_room.clear();
        Some(placement)
    }

    /// The earliest start of `spec` if running tasks end when their estimates say, and the
    /// nodes it would use then.
    fn reserve(&self, spec: &TaskSpec, now: Time) -> Reservation {
        // (expected end, arrival order): a total order, so the reservation never depends on
        // how the task table happens to iterate.
        let mut ends: Vec<(Time, u64, &Placement)> = self
            .tasks
            .values()
            .filter_map(|t| match &t.state {
                State::Running {
                    placement, since, ..
                } => {
                    let total = self.estimator.estimate(&t.spec);
                    let end = (since + total.saturating_sub(t.attained)).max(now + 1);
                    Some((end, t.seq, placement))
                }
                State::Pending { .. } => None,
            })
            .collect();
        ends.sort_by_key(|(end, seq, _)| (*end, *seq));
        let mut cluster = self.cluster.clone();
        for (end, _, placement) in ends {
            cluster.release(placement);
            if let Some(p) = self.policy.place(&cluster, spec) {
                return Reservation {
                    start: end,
                    nodes: p.shares.iter().map(|s| s.node).collect(),
                };
            }
        }
        Reservation {
            start: Time::MAX,
            nodes: BTreeSet::new(),
        }
    }

    fn rekey(&mut self, now: Time) {
        let ids: Vec<TaskId> = self.queue.values().copied().collect();
        self.queue.clear();
        for id in ids {
            let key = match self.tasks.get(&id) {
                Some(task) => self.key_of(task, now),
                None => continue,
            };
            if let Some(Task {
                state: State::Pending { key: k, .. },
                ..
            }) = self.tasks.get_mut(&id)
            {
                *k = key;
            }
            self.queue.insert(key, id);
        }
    }
}

/// An EASY reservation: when the blocked head will start and on which nodes.
#[derive(Debug)]
struct Reservation {
    start: Time,
    nodes: BTreeSet<NodeIdx>,
}

impl Reservation {
    /// Whether a task placed at `placement` and expected to end at `end` leaves the
    /// reservation intact: it ends before the head starts, or stays off the head's nodes.
    fn allows(&self, placement: &Placement, end: Time) -> bool {
        end <= self.start
            || placement
                .shares
                .iter()
                .all(|s| !self.nodes.contains(&s.node))
    }
}

#[cfg(test)]
mod tests;
