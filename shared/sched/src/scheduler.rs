//! The scheduler: a live cluster view and a queue, changed only by applying inputs; each
//! `Schedule` input runs one pass of a short numbered pipeline (after Kueue's
//! `scheduler.go`):
//!
//! 1. **order** — pending tasks in the policy's order (re-keyed first if the policy's keys move
//!    with time);
//! 2. **nominate** — for the next task, find a placement on the free capacity;
//! 3. **preempt** — if none and the policy is preemptive, free room by preempting the running
//!    tasks the policy allows (and any task past its usage limit), in the policy's victim order
//!    (worst key first, or least work lost), keeping only victims on the nodes the placement
//!    uses (gangs leave whole);
//! 4. **admit** — grant it: take the resources, open a lease, explain the decision;
//! 5. **blocked** — if it still does not fit, record why, then stop, go on, or reserve its
//!    earliest start and backfill around it, as the policy says.
//!
//! A *unit* of the queue is one task, or a whole gang: a gang enters the queue once all its
//! members have been submitted, is placed all-or-nothing, tightest topology level first
//! ([`crate::gang`]), and is preempted or requeued whole.
//!
//! A victim goes back to the queue with its original arrival. Policies decide who may preempt
//! whom ([`Policy::may_preempt`]) under one rule: never both ways — by key (a victim's key is
//! strictly worse) or by quota (only a team within its nominal quota reclaims, only from teams
//! that borrow) — so no two tasks can preempt each other in turn.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use smallvec::{SmallVec, smallvec};

use crate::cluster::{Cluster, Freeing, FreeingNodes, NodeShare, Placement};
use crate::decision::{Decision, WaitReason};
use crate::estimate::{self, DurationEstimator, History};
use crate::gang;
use crate::model::{
    LeaseId, NodeIdx, NodeSpec, RequestShape as Shape, TaskId, TaskSpec, Time, WHOLE_GPU_MILLI,
};
use crate::placement::{self, Level};
use crate::policy::packing::Incremental;
use crate::policy::{Contender, DeadlineRisk, PendingView, Policy, QueueKey, WhenBlocked};
use crate::quota::{self, Amounts, Quota, Quotas};

/// How a task's run ended, as its executor reported it: carried by the input that ends the
/// run ([`Input::TaskFinished`], or [`Input::TaskWithdrawn`] for a run that ended as it was
/// being stopped), so the journal records which run ended and how, and whoever acts on a run's
/// end (the planner: the next task, a retry) reads it from the journal, where a report the
/// allocator refused never appears.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RunEnd {
    /// It completed.
    Completed {
        /// The lease it ran under.
        lease: LeaseId,
    },
    /// It failed.
    Failed {
        /// The lease it ran under.
        lease: LeaseId,
        /// Why, as its executor reported it.
        reason: String,
    },
}

impl RunEnd {
    /// The lease the run held.
    pub fn lease(&self) -> LeaseId {
        match self {
            RunEnd::Completed { lease } | RunEnd::Failed { lease, .. } => *lease,
        }
    }

    /// How it ended, in a word: `completed`, `failed`.
    pub fn outcome(&self) -> &'static str {
        match self {
            RunEnd::Completed { .. } => "completed",
            RunEnd::Failed { .. } => "failed",
        }
    }
}

/// Something that happened, in the one total order the scheduler sees.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(tag = "input", rename_all = "snake_case")]
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
    /// A running task completed (or failed, or was cancelled): its resources are released.
    TaskFinished {
        /// The task.
        task: TaskId,
        /// When.
        at: Time,
        /// How its run ended, as its executor reported it (absent in older journals, and
        /// where no report is behind the input): it must be the task's running lease, and the
        /// journal is then the record of the run's end that readers (the planner) act on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<RunEnd>,
    },
    /// A running task wrote a checkpoint: a preemption from now on loses only what follows.
    TaskCheckpointed {
        /// The task.
        task: TaskId,
        /// When.
        at: Time,
    },
    /// A running task stopped without finishing — its node was drained or failed — and must
    /// run again: its resources are released and it goes back to the queue (a gang whole).
    TaskRequeued {
        /// The task.
        task: TaskId,
        /// Why, for the decision log.
        reason: String,
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
    /// An operator or remediation took a node out of service for new work (`held: true`) or
    /// gave it back. Each holder holds on its own, and so does the inventory's reachability
    /// ([`Input::NodeSchedulable`]): the node takes new work only when nobody holds it; one
    /// held before it joins joins held. With
    /// `drain`, what runs there is stopped now and goes back to the queue, gangs whole (a task
    /// that checkpoints loses only what followed its last checkpoint).
    NodeHeld {
        /// Node name.
        node: String,
        /// Who.
        by: Holder,
        /// Held (`true`) or given back.
        held: bool,
        /// Also stop and requeue what runs there.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        drain: bool,
        /// Why, for the decision log.
        reason: String,
        /// When.
        at: Time,
    },
    /// One GPU of a node was taken out of service (`in_service: false`: whatever holds it is
    /// stopped and requeued, gangs whole, and nothing is placed on it) or returned to service.
    GpuService {
        /// Node name.
        node: String,
        /// The GPU's index on the node.
        gpu: u32,
        /// In service again (`true`) or out of it.
        in_service: bool,
        /// Why, for the decision log.
        reason: String,
        /// When.
        at: Time,
    },
    /// A team's budget standing changed (from billing). Over budget with `block_below`, its
    /// new work of a priority under that floor waits (what runs keeps running); over budget
    /// without one, its work is still granted, each grant flagged. Within budget again: no
    /// restriction.
    TeamBudget {
        /// The team.
        team: String,
        /// Whether it has spent its budget for the period.
        exceeded: bool,
        /// The policy while exceeded: the lowest priority still started (`None`: allow and
        /// flag).
        block_below: Option<i32>,
    },
    /// A team's quota was set (or changed).
    TeamQuota {
        /// The team.
        team: String,
        /// Its quota.
        quota: Quota,
    },
    /// A task is expected to become ready at `expected_at` (the planner's look-ahead: its
    /// predecessors are about to finish). Each pass holds a placement for it on free capacity,
    /// so work that arrives meanwhile does not take the room it will need; the hold ends when
    /// the task is submitted, or [`PRELOAD_GRACE`] after `expected_at` if it never is. A hold
    /// never preempts anything.
    TaskPreloaded {
        /// The task, as it will be submitted.
        task: TaskSpec,
        /// When it is expected to be submitted.
        expected_at: Time,
        /// When.
        at: Time,
    },
    /// A task is no longer wanted (its workload was aborted, or gave it up): queued, it
    /// leaves the queue at once — a gang whole, so no part of it is ever granted — and a
    /// preloaded one's hold ends; running, its resources are released like a finished one's,
    /// but the cut-short run teaches the duration estimator nothing.
    TaskWithdrawn {
        /// The task.
        task: TaskId,
        /// Why, for the decision log.
        reason: String,
        /// When.
        at: Time,
        /// Set when the withdrawal is because the task's stopped run ended as it was being
        /// stopped ([`Scheduler::stopped_run`]): how it ended. That run was the task's; it
        /// must not run again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<RunEnd>,
    },
    /// The predictor's estimate of how long a task it holds (preloaded, queued or running)
    /// runs in all. It replaces any estimate the task was submitted with — a queued task takes
    /// its new place in line, a running one is weighed by it as a preemption victim — and is
    /// journalled like every input, so a replay reads the prediction instead of running a
    /// model.
    TaskPredicted {
        /// The task.
        task: TaskId,
        /// Its predicted run time in all, ms.
        duration: Time,
        /// When.
        at: Time,
    },
    /// Run a scheduling pass.
    Schedule {
        /// When.
        at: Time,
    },
}

/// Where a displaced task waits: ahead of every key of its priority (below any at-risk
/// deadline key, whose second part is at least −2⁶²), in its policy's order among displaced
/// tasks (the second part, scaled down to fit).
fn displaced_key(key: QueueKey) -> QueueKey {
    const BASE: i64 = i64::MIN + (1 << 61);
    QueueKey(key.0, BASE + (key.1 >> 2), key.2)
}

/// Who holds a node out of service (see [`Input::NodeHeld`]).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Holder {
    /// The inventory: the node stopped sending heartbeats ([`Input::NodeSchedulable`]).
    Unreachable,
    /// An operator (`allot cordon`); remediation never lifts it.
    Operator,
    /// The remediation service, by one of its rules.
    Remediation,
}

/// An input the scheduler cannot apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// A task id was submitted twice.
    #[error("{0} was already submitted")]
    DuplicateTask(TaskId),
    /// A finish, checkpoint or requeue for a task that is not running.
    #[error("{0} is not running")]
    NotRunning(TaskId),
    /// A run's end under a lease that is not the task's run: not its running lease (a
    /// finish), or not its stopped run's (a withdrawal because that run ended).
    #[error("{task} has no run under lease {} to end", lease.0)]
    NoSuchRun {
        /// The task.
        task: TaskId,
        /// The lease named.
        lease: LeaseId,
    },
    /// A withdrawal of a task the scheduler does not hold (never submitted, or already
    /// finished).
    #[error("{0} is neither queued, preloaded nor running")]
    UnknownTask(TaskId),
    /// An input named a node the scheduler does not know.
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    /// An input named a GPU its node does not have.
    #[error("node {node:?} has no GPU {gpu}")]
    UnknownGpu {
        /// The node.
        node: String,
        /// The GPU index named.
        gpu: u32,
    },
    /// A request no node could ever satisfy.
    #[error("{task} can never be placed: {why}")]
    Unplaceable {
        /// The task.
        task: TaskId,
        /// Why.
        why: String,
    },
    /// A task whose spec contradicts itself or its gang.
    #[error("{task} is invalid: {why}")]
    Invalid {
        /// The task.
        task: TaskId,
        /// Why.
        why: String,
    },
}

#[derive(Debug)]
enum State {
    /// Waiting. Only a unit's first member is in the queue; `key` is meaningful for it alone.
    Pending {
        key: QueueKey,
        last_wait: Option<WaitReason>,
    },
    Running {
        lease: LeaseId,
        placement: Placement,
        since: Time,
        /// Its last reported checkpoint (`since` until one is reported).
        checkpointed: Time,
    },
}

#[derive(Debug)]
struct Task {
    spec: Arc<TaskSpec>,
    /// Its team's number ([`Scheduler::teams`]).
    team: usize,
    /// What placement depends on in `spec`, computed once.
    shape: Shape,
    submitted: Time,
    seq: u64,
    /// Run time of earlier runs (before preemptions), ms.
    attained: Time,
    /// When it last joined the queue: its submission, or the end of its last run.
    pending_since: Time,
    /// How long it waited in the queue before its current (or last) run started, ms.
    waited: Time,
    /// The lease and nodes of its last run, once one was stopped (preempted or requeued).
    last_run: Option<(LeaseId, Vec<NodeIdx>)>,
    /// Pending: how it is expected to fare against its deadline (see
    /// [`Scheduler::judge_deadlines`]); running: how it was judged when it started. Cleared
    /// when it is stopped.
    risk: DeadlineRisk,
    /// When its deadline risk was last judged while pending (`None`: not since it joined
    /// the queue).
    risk_judged: Option<Time>,
    /// Moved off its node by a drain or a GPU taken out of service: until it runs again it
    /// waits ahead of everything else of its priority (by its policy's order among such
    /// tasks), without gaining a right to preempt from it.
    displaced: bool,
    state: State,
}

impl Task {
    fn view(&self, now: Time, estimate: Time) -> PendingView<'_> {
        let attained = self.attained + self.run_time(now);
        PendingView {
            spec: &self.spec,
            submitted: self.submitted,
            seq: self.seq,
            attained,
            attained_gpu: attained.saturating_mul(u64::from(self.spec.gpus.max(1))),
            estimate,
            estimate_learned: false,
            pending_since: match self.state {
                State::Pending { .. } => Some(self.pending_since),
                State::Running { .. } => None,
            },
            waited_before_run: match self.state {
                State::Pending { .. } => None,
                State::Running { .. } => Some(self.waited),
            },
            risk: self.risk,
        }
    }

    /// How long the current run has lasted (0 when pending).
    fn run_time(&self, now: Time) -> Time {
        match self.state {
            State::Running { since, .. } => now.saturating_sub(since),
            State::Pending { .. } => 0,
        }
    }

    /// Whether the current run has lasted past the task's usage limit.
    fn over_limit(&self, now: Time) -> bool {
        self.spec
            .max_runtime
            .is_some_and(|limit| self.run_time(now) >= limit)
    }

    /// Where it runs and how a relocation weighs it, if it is running and a relocation could
    /// move it: on one node, outside any gang, on a GPU share that is not a MIG instance.
    fn movable(&self) -> Option<(NodeIdx, movable::Entry)> {
        let State::Running {
            placement,
            since,
            checkpointed,
            ..
        } = &self.state
        else {
            return None;
        };
        let milli = quota::demand(&self.spec)[quota::GPU];
        let [share] = placement.shares.as_slice() else {
            return None;
        };
        if self.spec.gang.is_some() || self.spec.mig_profile.is_some() || milli == 0 {
            return None;
        }
        let entry = movable::Entry {
            milli,
            priority: self.spec.priority,
            seq: self.seq,
            id: self.spec.id,
            since: *since,
            checkpointed: *checkpointed,
            checkpoint_every: self.spec.checkpoint_every,
        };
        Some((share.node, entry))
    }

    /// Run time a preemption now would lose: everything since the last checkpoint, whether
    /// reported or implied by the task's checkpoint interval.
    fn lost_work(&self, now: Time) -> Time {
        let State::Running {
            since,
            checkpointed,
            ..
        } = self.state
        else {
            return 0;
        };
        lost_work(since, checkpointed, self.spec.checkpoint_every, now)
    }

    fn is_running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }
}

/// Why a pending task waits, and when it is expected to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// Why.
    pub reason: WaitReason,
    /// Expected start if running tasks end when their estimates say (`None`: not before
    /// something else changes).
    pub eta: Option<Time>,
    /// It has a deadline, and its expected start plus its expected run time passes it (or no
    /// start can be foreseen).
    pub at_risk: bool,
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
    /// Shapes that found no placement, until capacity frees where they might fit: the
    /// search is skipped for them.
    no_room: NoRoom,
    queue: BTreeMap<QueueKey, Queued>,
    tasks: HashMap<TaskId, Task>,
    /// How many tasks of the table have a deadline: with none, a pass judges no deadlines
    /// without walking the queue to find out.
    with_deadline: usize,
    /// Members of every gang with a member not yet finished, in submission order.
    gangs: HashMap<String, Vec<TaskId>>,
    /// Distinct request shapes among pending tasks outside gangs, with how many tasks have
    /// each: whether any pending task could start is a question about shapes, not tasks.
    shapes: HashMap<Shape, (usize, TaskSpec)>,
    next_seq: u64,
    next_lease: u64,
    /// Tasks expected soon, by id (ordered, so holds are placed in a deterministic order).
    preloads: BTreeMap<TaskId, Preload>,
    /// Teams over budget, with the priority floor their new work must reach (`None`: allowed
    /// and flagged).
    over_budget: BTreeMap<String, Option<i32>>,
    /// Nodes held out of service, by name (a node may be held before it joins: it then joins
    /// held), and by whom.
    holds: BTreeMap<String, BTreeSet<Holder>>,
    /// When a preemption search that released victims in vain sorts out those that cannot help
    /// ([`Scheduler::useful_nodes`]): after `(n, d)` — `n` releases, or 1/`d` of the victims
    /// left if more.
    sort_out_after: (usize, usize),
    /// Teams numbered as they first submit: a pass groups running tasks by team by number.
    teams: HashMap<String, usize>,
    /// The running tasks by team, kept as tasks start and stop: what a sweep's preemption
    /// searches index (unranked here; a sweep ranks a copy).
    running: Running,
    /// The last sweep's ranked copy, with the time of its pass: what a search reads of a
    /// running task is fixed by the time, so the next pass at the same time ranks nothing
    /// again while only submissions come in between (any other input forgets it). A trace's
    /// arrivals often share a time: openb's re-sampled pods all arrive at its last.
    ranked: Option<(Time, Running)>,
    /// When queued tasks' keys may next change ([`Policy::key_holds_until`]), earliest first,
    /// for a dynamic policy, while `keys` is [`Keys::Tracked`]: a pass re-keys those whose time
    /// has come. An entry may outlive its key (the task started, or was keyed again):
    /// re-keying it then changes nothing.
    key_due: BinaryHeap<Reverse<(Time, QueueKey)>>,
    /// How the next pass re-keys the queue.
    keys: Keys,
    /// The running tasks a relocation could move, by node, kept as tasks start and stop.
    movable: Movable,
    /// The running tasks by when they are expected to end, kept as tasks start and stop.
    ends: Ends,
    /// What running tasks hold on each node by class ([`Policy::class`]), kept as tasks start
    /// and stop, for policies whose keys have one.
    reclaimable: Reclaimable,
    /// How many searches sorted their victims out.
    #[cfg(test)]
    sorted_out: usize,
    /// Whether searches for a unit that fits nowhere walk node by node where they can (tests
    /// compare; see [`by_node`]).
    #[cfg(test)]
    by_node: bool,
    /// How many searches found a placement so.
    #[cfg(test)]
    walked_by_node: usize,
    /// Whether a sweep's ranking is kept for the next pass at the same time (tests compare).
    #[cfg(test)]
    keep_ranking: bool,
    /// How many sweeps started from a kept ranking.
    #[cfg(test)]
    rankings_kept: usize,
    /// Whether searches no node could end are ruled out before ranking (tests compare).
    #[cfg(test)]
    rule_out: bool,
    /// How many searches were ruled out so.
    #[cfg(test)]
    ruled_out: usize,
    /// Whether moves that cannot work are passed over before they are tried (tests compare).
    #[cfg(test)]
    rule_out_moves: bool,
    /// How many moves were passed over so.
    #[cfg(test)]
    moves_ruled_out: usize,
}

/// How many moments (running tasks' ends) an ETA looks through before it gives up.
const MAX_ETA_STEPS: usize = 10_000;

/// How often a pending task with a deadline has its risk of missing it judged again, ms of
/// the scheduler's clock (each judgement replays the queue ahead of it; see
/// [`Scheduler::judge_deadlines`]).
pub const DEADLINE_RECHECK: Time = 60_000;

/// The most queued units [`Scheduler::judge_deadlines`] judges in one pass, earliest deadline
/// first (each judgement replays the queue ahead): a pass stays cheap however many tasks with
/// deadlines wait, and the rest are judged in the passes after.
pub const DEADLINE_JUDGEMENTS_PER_PASS: usize = 32;

/// How long past its expected time a preloaded task's hold lasts if it never arrives (its
/// predecessors ran late, or failed).
pub const PRELOAD_GRACE: Time = 5 * 60 * 1000;

/// A task expected soon.
#[derive(Debug, Clone)]
struct Preload {
    spec: TaskSpec,
    expected_at: Time,
    /// Its place in line, taken when it was preloaded.
    seq: u64,
    /// When it was preloaded.
    at: Time,
    /// The placement last announced for it.
    announced: Option<Placement>,
}

/// A unit's placements, one per member, and for a gang the topology level they fit within.
type Placed = (Vec<Placement>, Option<Level>);

/// The work a task running since `since`, last checkpointed at `checkpointed` (`since` if
/// never) and checkpointing every `every` ms if it says so, would lose if stopped at `now`.
fn lost_work(since: Time, checkpointed: Time, every: Option<Time>, now: Time) -> Time {
    let ran = now.saturating_sub(since);
    let periodic = every
        .filter(|every| *every > 0)
        .map_or(since, |every| since + ran / every * every);
    now.saturating_sub(periodic.max(checkpointed))
}

/// A unit in the queue: its leader, and what a sweep reads to pass over it without looking the
/// task up (most of a long queue is passed over so, every sweep).
#[derive(Debug, Clone, Copy)]
struct Queued {
    /// The unit's leader.
    id: TaskId,
    /// The GPUs its leader asks for.
    gpus: u32,
    /// Its leader is in a gang.
    gang: bool,
    /// Where [`NoRoom`] keeps its shape, once that was found to fit nowhere: while nothing was
    /// freed since ([`NoRoom::read_to_end`]), it still fits nowhere.
    no_room_at: Option<Slot>,
}

/// How a pass re-keys the queue of a dynamic policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// Every task, and nothing more: an input other than a submission came in since the last
    /// pass (a task's estimate, state or risk may have changed), or a deadline judgement
    /// raised some task's risk. Where such inputs come between most passes (a live cluster's
    /// completions), tracking when each key may change would be work thrown away.
    Stale,
    /// Every task, noting when each key may change (`key_due`): the last pass re-keyed every
    /// task, and only submissions came in since (or `key_due` grew past twice the queue).
    Settled,
    /// Only the tasks `key_due` names whose time has come.
    Tracked,
}

/// How many nodes [`Scheduler::relocate_for`] tries, cheapest move first, before giving up.
const RELOCATION_TRIES: usize = 4;

/// A preemption search that released this many victims in vain, and at least 1/`SORT_OUT_SHARE`
/// of the tasks it has not read yet (those left, at most), sorts out those that cannot help:
/// sorting out costs about as much as releasing a victim per task left, and most searches end
/// after a few.
const SORT_OUT_AFTER: usize = 16;
const SORT_OUT_SHARE: usize = 8;

/// The resources of a unit, in placement order, and what it asks of the quota.
struct Unit {
    /// Inline for one task (see `specs`).
    members: SmallVec<[TaskId; 1]>,
    /// Shared with the task table: a pass builds a unit for every task it looks at, so a unit
    /// of one task allocates nothing.
    specs: SmallVec<[Arc<TaskSpec>; 1]>,
    demand: Amounts,
    gpus: u32,
    /// One task outside any gang: its shape caches apply.
    single: bool,
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
        let order = policy.victim_order();
        Self {
            cluster: Cluster::new(),
            policy,
            estimator,
            quotas: Quotas::default(),
            pristine: Cluster::new(),
            fits_empty: HashMap::default(),
            no_room: NoRoom::default(),
            queue: BTreeMap::new(),
            tasks: HashMap::default(),
            with_deadline: 0,
            gangs: HashMap::default(),
            shapes: HashMap::default(),
            next_seq: 0,
            next_lease: 1,
            preloads: BTreeMap::new(),
            over_budget: BTreeMap::new(),
            holds: BTreeMap::new(),
            sort_out_after: (SORT_OUT_AFTER, SORT_OUT_SHARE),
            teams: HashMap::default(),
            running: Running::of(order, std::iter::empty()),
            ranked: None,
            key_due: BinaryHeap::new(),
            keys: Keys::Stale,
            ends: Ends::new(),
            movable: Movable::default(),
            reclaimable: Reclaimable::default(),
            #[cfg(test)]
            sorted_out: 0,
            #[cfg(test)]
            by_node: true,
            #[cfg(test)]
            walked_by_node: 0,
            #[cfg(test)]
            keep_ranking: true,
            #[cfg(test)]
            rankings_kept: 0,
            #[cfg(test)]
            rule_out: true,
            #[cfg(test)]
            ruled_out: 0,
            #[cfg(test)]
            rule_out_moves: true,
            #[cfg(test)]
            moves_ruled_out: 0,
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

    /// Units waiting in the queue (a gang counts once).
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// Pending tasks in queue order (a gang's members together).
    pub fn pending_specs(&self) -> impl Iterator<Item = &TaskSpec> {
        self.queue
            .values()
            .flat_map(|q| self.unit_ids(q.id))
            .map(|id| &*self.tasks[&id].spec)
    }

    /// Whether some pending task outside a gang could be placed on the free capacity as it
    /// is now — the question behind WR_fit (capacity idle while a task that fits waits).
    pub fn some_pending_fits(&self) -> bool {
        self.shapes
            .values()
            .any(|(_, spec)| self.place_on(&self.cluster, spec).is_some())
    }

    /// The queue at `now`: each waiting task in the order the scheduler would start them,
    /// with its place (from 1, counting every pending task) and why it waits — what `allot
    /// queue` and the gateway show.
    ///
    /// Every ETA comes from one simulation of the whole queue ([`Self::expected_starts`]), not
    /// one per task as [`Self::waiting`] runs: a queue of thousands is answered in
    /// milliseconds. The two differ in one respect: here work behind a task that is expected
    /// to start before it (backfill) holds its resources too, as it will.
    pub fn queue(&self, now: Time) -> impl Iterator<Item = (usize, &TaskSpec, Waiting)> + '_ {
        let starts = self.expected_starts(now);
        self.pending_specs()
            .enumerate()
            .filter_map(move |(i, spec)| {
                self.waiting_with(spec.id, |unit, _| starts.get(&unit.members[0]).copied())
                    .map(|w| (i + 1, spec, w))
            })
    }

    /// Why a pending task waits and when it is expected to start; `None` if it is not
    /// pending. The ETA looks further than a pass's `Waiting` decision, whose `eta` is only
    /// the blocked head's reservation: the units ahead in the queue start first, quotas admit
    /// as usage falls, and a task that has run past its estimate is still expected to take
    /// time (see [`Self::expected_start`]) — so it moves as the queue does, and asking again
    /// is how a user sees it move (decisions are logged only when the reason changes).
    pub fn waiting(&self, task: TaskId, now: Time) -> Option<Waiting> {
        self.waiting_with(task, |unit, key| self.expected_start(unit, key, now))
    }

    /// [`Self::waiting`], with the ETA of a unit (a task, or a gang led by its first member)
    /// whose queue key is given from `eta`.
    fn waiting_with(
        &self,
        task: TaskId,
        eta: impl FnOnce(&Unit, QueueKey) -> Option<Time>,
    ) -> Option<Waiting> {
        let t = self.tasks.get(&task)?;
        let State::Pending { key, .. } = t.state else {
            return None;
        };
        if let Some(g) = &t.spec.gang {
            let submitted = self.gangs.get(&g.name).map_or(0, Vec::len) as u32;
            if submitted < g.size {
                return Some(Waiting {
                    reason: WaitReason::GangIncomplete {
                        gang: g.name.clone(),
                        submitted,
                        size: g.size,
                    },
                    eta: None,
                    at_risk: t.spec.deadline.is_some(),
                });
            }
        }
        let leader = self.leader(task);
        let unit = self.unit(leader);
        let team = &self.tasks[&leader].spec.team;
        if let Some(floor) = self
            .over_budget
            .get(team)
            .copied()
            .flatten()
            .filter(|floor| unit.specs[0].priority < *floor)
        {
            return Some(Waiting {
                reason: WaitReason::Budget {
                    team: team.clone(),
                    floor,
                },
                eta: None,
                at_risk: self.misses_deadline(&unit, None),
            });
        }
        let key = match self.tasks[&leader].state {
            State::Pending { key: k, .. } => k,
            State::Running { .. } => key,
        };
        let reason = if !self.policy.admits(team, unit.demand, &self.quotas) {
            self.quota_refusal(team, unit.demand)
        } else if self.policy.when_blocked() == WhenBlocked::Stop
            && let Some((_, head)) = self.queue.range(..key).next()
        {
            WaitReason::BehindHead { head: head.id }
        } else {
            self.no_capacity(&unit)
        };
        let eta = eta(&unit, key);
        Some(Waiting {
            reason,
            eta,
            at_risk: self.tasks[&leader].risk != DeadlineRisk::None
                || self.misses_deadline(&unit, eta),
        })
    }

    /// Whether `unit`, started at `start` (`None`: no start foreseen), is expected to end
    /// after the earliest deadline of its members; `false` when none has one.
    fn misses_deadline(&self, unit: &Unit, start: Option<Time>) -> bool {
        let Some(deadline) = Self::deadline(unit) else {
            return false;
        };
        start.is_none_or(|start| start.saturating_add(self.remaining(unit)) > deadline)
    }

    /// The earliest deadline of `unit`'s members, if any has one.
    fn deadline(unit: &Unit) -> Option<Time> {
        unit.specs.iter().filter_map(|s| s.deadline).min()
    }

    /// How long `unit` is expected to run from its next start: the longest of its members'
    /// estimates less what they ran before — or, for one that ran past its estimate, as long
    /// again as it has run (heavy-tailed run times; see [`Self::expected_end`]).
    fn remaining(&self, unit: &Unit) -> Time {
        unit.members
            .iter()
            .map(|m| {
                let task = &self.tasks[m];
                estimate::remaining(self.estimator.estimate(&task.spec), task.attained)
            })
            .max()
            .unwrap_or(0)
    }

    /// Judges each queued unit with a deadline ([`DEADLINE_RECHECK`] apart) against it, if its
    /// estimate is learned and it could still make the deadline were it started now (one
    /// that cannot gets no precedence: moving it ahead would only make others late too):
    /// - **at risk** when its expected start waiting its turn ([`Self::expected_start`], the
    ///   queue ahead starting first) plus its expected run time passes the deadline — policies
    ///   that keep deadlines then order it ahead of equal priorities, earliest deadline first;
    /// - **urgent** when even its earliest start as running work ends
    ///   ([`Self::earliest_fit`]) would miss it — they may then preempt for it.
    ///
    /// A judgement only rises while the unit waits; the first raise is logged as a `Waiting`
    /// decision that says so. At most [`DEADLINE_JUDGEMENTS_PER_PASS`] units are judged per
    /// pass, earliest deadline first. Returns whether any judgement rose.
    fn judge_deadlines(&mut self, now: Time, out: &mut Vec<Decision>) -> bool {
        debug_assert_eq!(
            self.with_deadline,
            self.tasks
                .values()
                .filter(|t| t.spec.deadline.is_some())
                .count(),
            "the count of tasks with a deadline is the task table's"
        );
        if self.with_deadline == 0 {
            return false;
        }
        let mut due: Vec<(Time, QueueKey, TaskId)> = self
            .queue
            .iter()
            .filter_map(|(key, queued)| {
                let leader = &queued.id;
                let task = &self.tasks[leader];
                let judge = task.risk != DeadlineRisk::Urgent
                    && task
                        .risk_judged
                        .is_none_or(|at| now >= at.saturating_add(DEADLINE_RECHECK));
                task.spec
                    .deadline
                    .filter(|_| judge)
                    .map(|deadline| (deadline, *key, *leader))
            })
            .collect();
        due.sort_unstable();
        due.truncate(DEADLINE_JUDGEMENTS_PER_PASS);
        let due = due.into_iter().map(|(_, key, leader)| (key, leader));
        let mut raised = false;
        for (key, leader) in due {
            let unit = self.unit(leader);
            let remaining = self.remaining(&unit);
            let feasible = Self::deadline(&unit)
                .is_some_and(|deadline| now.saturating_add(remaining) <= deadline);
            let learned = unit.specs.iter().all(|s| self.estimator.learned(s));
            let before = self.tasks[&leader].risk;
            let mut risk = before;
            let mut eta = None;
            if feasible && learned {
                if risk == DeadlineRisk::None {
                    eta = self.expected_start(&unit, key, now);
                    if self.misses_deadline(&unit, eta) {
                        risk = DeadlineRisk::AtRisk;
                    }
                }
                if risk == DeadlineRisk::AtRisk {
                    let first = self.earliest_fit(&unit, now, true).start;
                    if self.misses_deadline(&unit, (first != Time::MAX).then_some(first)) {
                        risk = DeadlineRisk::Urgent;
                    }
                }
            }
            let Some(task) = self.tasks.get_mut(&leader) else {
                continue;
            };
            task.risk_judged = Some(now);
            task.risk = risk;
            if risk == before {
                continue;
            }
            raised = true;
            if before != DeadlineRisk::None {
                continue;
            }
            let reason = match &task.state {
                State::Pending {
                    last_wait: Some(reason),
                    ..
                } => reason.clone(),
                _ if !self
                    .policy
                    .admits(&unit.specs[0].team, unit.demand, &self.quotas) =>
                {
                    self.quota_refusal(&unit.specs[0].team, unit.demand)
                }
                _ => self.no_capacity(&unit),
            };
            if let Some(Task {
                state: State::Pending { last_wait, .. },
                ..
            }) = self.tasks.get_mut(&leader)
            {
                *last_wait = Some(reason.clone());
            }
            out.push(Decision::Waiting {
                task: leader,
                reason,
                eta,
                at_risk: true,
                at: now,
            });
        }
        raised
    }

    /// Applies one input and returns what was decided.
    pub fn apply(&mut self, input: Input) -> Result<Vec<Decision>, ApplyError> {
        let mut out = Vec::new();
        self.apply_into(input, &mut out)?;
        Ok(out)
    }

    /// Applies one input, appending decisions to `out` (no allocation per call).
    pub fn apply_into(&mut self, input: Input, out: &mut Vec<Decision>) -> Result<(), ApplyError> {
        if !matches!(input, Input::TaskSubmitted { .. } | Input::Schedule { .. }) {
            self.ranked = None;
            self.keys = Keys::Stale;
            self.ends.forget();
        }
        match input {
            Input::NodeAdded(spec) => {
                self.pristine.add_node(spec.clone());
                let held = self.holds.contains_key(&spec.name);
                let idx = self.cluster.add_node(spec);
                if held {
                    self.cluster.set_schedulable(idx, false);
                }
                self.fits_empty.clear();
                self.no_room.clear();
            }
            Input::TaskSubmitted { task, at } => self.submit(task, at)?,
            Input::TaskFinished { task, at, run } => {
                if let (Some(run), Some((held, _))) = (&run, self.running_lease(task))
                    && held != run.lease()
                {
                    return Err(ApplyError::NoSuchRun {
                        task,
                        lease: run.lease(),
                    });
                }
                self.end(task, at, true, out)?
            }
            Input::TaskCheckpointed { task, at } => match self.tasks.get_mut(&task) {
                Some(Task {
                    state:
                        State::Running {
                            checkpointed,
                            placement,
                            ..
                        },
                    ..
                }) => {
                    *checkpointed = (*checkpointed).max(at);
                    self.movable.checkpointed(placement, task, *checkpointed);
                }
                _ => return Err(ApplyError::NotRunning(task)),
            },
            Input::TaskRequeued { task, reason, at } => {
                self.requeue(task, &reason, at, false, out)?;
            }
            Input::TaskWithdrawn {
                task,
                reason,
                at,
                run,
            } => {
                if let Some(run) = run
                    && self.stopped_run(task).map(|(l, _)| l) != Some(run.lease())
                {
                    return Err(ApplyError::NoSuchRun {
                        task,
                        lease: run.lease(),
                    });
                }
                self.withdraw(task, reason, at, out)?
            }
            Input::TaskPredicted { task, duration, at } => self.predicted(task, duration, at)?,
            Input::TeamBudget {
                team,
                exceeded,
                block_below,
            } => {
                if exceeded {
                    self.over_budget.insert(team, block_below);
                } else {
                    self.over_budget.remove(&team);
                }
                self.no_room.clear();
            }
            Input::TeamQuota { team, quota } => {
                self.quotas.set(&team, quota);
                self.no_room.clear();
            }
            Input::NodeSchedulable { node, schedulable } => {
                if self.cluster.find(&node).is_none() {
                    return Err(ApplyError::UnknownNode(node));
                }
                self.hold_node(&node, Holder::Unreachable, !schedulable);
            }
            Input::NodeHeld {
                node,
                by,
                held,
                drain,
                reason,
                at,
            } => {
                self.hold_node(&node, by, held);
                if drain && let Some(idx) = self.cluster.find(&node) {
                    let on_node = self.running_on(idx, None);
                    for leader in on_node {
                        self.requeue(leader, &reason, at, true, out)?;
                    }
                }
            }
            Input::GpuService {
                node,
                gpu,
                in_service,
                reason,
                at,
            } => {
                let idx = self
                    .cluster
                    .find(&node)
                    .ok_or_else(|| ApplyError::UnknownNode(node.clone()))?;
                if gpu >= self.cluster.node(idx).spec.gpus {
                    return Err(ApplyError::UnknownGpu { node, gpu });
                }
                if !in_service {
                    let on_gpu = self.running_on(idx, Some(gpu));
                    for leader in on_gpu {
                        self.requeue(leader, &reason, at, true, out)?;
                    }
                }
                self.cluster.set_gpu_in_service(idx, gpu, in_service);
                self.no_room.clear();
            }
            Input::TaskPreloaded {
                task,
                expected_at,
                at,
            } => {
                if self.tasks.contains_key(&task.id) {
                    return Err(ApplyError::DuplicateTask(task.id));
                }
                self.validate(&task)?;
                if !self.preloads.contains_key(&task.id) {
                    self.preloads.insert(
                        task.id,
                        Preload {
                            spec: task,
                            expected_at,
                            seq: self.next_seq,
                            at,
                            announced: None,
                        },
                    );
                    self.next_seq += 1;
                }
            }
            Input::Schedule { at } => {
                let held = self.hold_preloads(at, out);
                self.pass(at, out);
                if !held.is_empty() {
                    for placement in &held {
                        self.cluster.release(placement);
                    }
                    self.no_room.clear();
                }
            }
        }
        Ok(())
    }

    /// Places every preloaded task still expected on free capacity and takes it for the pass
    /// (highest priority first, then the earliest expected); announces each new placement;
    /// drops holds past their grace. Returns what it took, for release after the pass.
    fn hold_preloads(&mut self, now: Time, out: &mut Vec<Decision>) -> Vec<Placement> {
        self.preloads
            .retain(|_, p| p.expected_at.saturating_add(PRELOAD_GRACE) >= now);
        let mut order: Vec<(i32, Time, TaskId)> = self
            .preloads
            .values()
            .map(|p| (-p.spec.priority, p.expected_at, p.spec.id))
            .collect();
        order.sort_unstable();
        let mut held = Vec::new();
        // Preloads come in few shapes and each takes a little of a large cluster: a shape's
        // placer ranks the cluster once and then looks only at the nodes taken since.
        let mut placers = Placers::default();
        let (policy, cluster) = (&*self.policy, &mut self.cluster);
        cluster.log_changes(true);
        for (_, _, id) in order {
            let spec = &self.preloads[&id].spec;
            let found = placers.place(policy, cluster, spec, &Shape::of(spec));
            let Some(placement) = found else {
                continue;
            };
            cluster.allocate(&placement);
            let preload = self.preloads.get_mut(&id).expect("listed above");
            if preload.announced.as_ref() != Some(&placement) {
                preload.announced = Some(placement.clone());
                out.push(Decision::Reserved {
                    task: id,
                    placement: placement.clone(),
                    until: preload.expected_at.saturating_add(PRELOAD_GRACE),
                    at: now,
                });
            }
            held.push(placement);
        }
        cluster.log_changes(false);
        held
    }

    fn submit(&mut self, spec: TaskSpec, at: Time) -> Result<(), ApplyError> {
        if self.tasks.contains_key(&spec.id) {
            return Err(ApplyError::DuplicateTask(spec.id));
        }
        self.validate(&spec)?;
        if let Some(why) = self.never_fits(&spec) {
            self.preloads.remove(&spec.id);
            return Err(ApplyError::Unplaceable { task: spec.id, why });
        }
        // A preloaded task keeps the place in line it took when it was announced (its order and
        // its time): work that arrived during its hold does not overtake it.
        let (seq, at) = match self.preloads.remove(&spec.id) {
            Some(preload) => (preload.seq, preload.at.min(at)),
            None => {
                self.next_seq += 1;
                (self.next_seq - 1, at)
            }
        };
        self.policy.observe_submitted(&spec);
        let id = spec.id;
        let gang = spec.gang.clone();
        let team = match self.teams.get(&spec.team) {
            Some(team) => *team,
            None => {
                let team = self.teams.len();
                self.teams.insert(spec.team.clone(), team);
                team
            }
        };
        self.with_deadline += usize::from(spec.deadline.is_some());
        self.tasks.insert(
            id,
            Task {
                shape: Shape::of(&spec),
                team,
                spec: Arc::new(spec),
                submitted: at,
                seq,
                attained: 0,
                pending_since: at,
                waited: 0,
                last_run: None,
                risk: DeadlineRisk::None,
                risk_judged: None,
                displaced: false,
                state: State::Pending {
                    key: QueueKey(0, 0, 0),
                    last_wait: None,
                },
            },
        );
        let Some(gang) = gang else {
            self.enqueue(id, at);
            return Ok(());
        };
        let members = self.gangs.entry(gang.name.clone()).or_default();
        members.push(id);
        if members.len() < gang.size as usize {
            return Ok(());
        }
        // Complete: can the gang as a whole ever be placed?
        let leader = members[0];
        let unit = self.unit(leader);
        let specs: Vec<&TaskSpec> = unit.specs.iter().map(|s| &**s).collect();
        if gang::place(&mut self.pristine, &specs).is_none() {
            for member in self.gangs.remove(&gang.name).unwrap_or_default() {
                self.remove_task(member);
            }
            return Err(ApplyError::Unplaceable {
                task: id,
                why: format!(
                    "gang {} ({} tasks, {} GPUs in all) does not fit even on the idle \
                     cluster; all its members were withdrawn",
                    gang.name, gang.size, unit.gpus
                ),
            });
        }
        self.enqueue(leader, at);
        Ok(())
    }

    /// Checks a spec against itself and its gang.
    fn validate(&self, spec: &TaskSpec) -> Result<(), ApplyError> {
        let invalid = |why: String| ApplyError::Invalid { task: spec.id, why };
        if spec.max_runtime == Some(0) {
            return Err(invalid("max_runtime must be longer than 0".into()));
        }
        let Some(gang) = &spec.gang else {
            return Ok(());
        };
        if gang.size == 0 {
            return Err(invalid(format!("gang {} has size 0", gang.name)));
        }
        let Some(members) = self.gangs.get(&gang.name) else {
            return Ok(());
        };
        let first = &self.tasks[&members[0]].spec;
        let theirs = first.gang.as_ref().map_or(0, |g| g.size);
        if members.len() >= theirs as usize || self.tasks[&members[0]].is_running() {
            return Err(invalid(format!(
                "gang {} already has all its {theirs} members",
                gang.name
            )));
        }
        if theirs != gang.size || first.team != spec.team || first.priority != spec.priority {
            return Err(invalid(format!(
                "gang {}: every member must have the same size, team and priority as {} \
                 (size {theirs}, team {}, priority {})",
                gang.name, first.id, first.team, first.priority
            )));
        }
        Ok(())
    }

    fn key_of(&self, task: &Task, now: Time) -> QueueKey {
        let key = self.policy_key_of(task, now);
        if task.displaced && !task.is_running() {
            displaced_key(key)
        } else {
            key
        }
    }

    /// The policy's own key of `task` at `now` — without a displaced task's place ahead:
    /// what preemption weighs it by.
    fn policy_key_of(&self, task: &Task, now: Time) -> QueueKey {
        self.policy.key(self.view_of(task, now), now)
    }

    /// [`Self::key_of`] `task` at `now`, and until when it holds
    /// ([`Policy::key_holds_until`]).
    fn keyed(&self, task: &Task, now: Time) -> (QueueKey, Time) {
        let view = self.view_of(task, now);
        let until = self.policy.key_holds_until(view, now);
        let key = self.policy.key(view, now);
        if task.displaced && !task.is_running() {
            (displaced_key(key), until)
        } else {
            (key, until)
        }
    }

    /// What the policy reads of `task` at `now`.
    fn view_of<'t>(&self, task: &'t Task, now: Time) -> PendingView<'t> {
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
        view
    }

    /// Puts the unit led by `leader` (pending) in the queue, keyed at `now`.
    fn enqueue(&mut self, leader: TaskId, now: Time) {
        let (key, until) = self.keyed(&self.tasks[&leader], now);
        if self.keys == Keys::Tracked && self.policy.dynamic() && until != Time::MAX {
            self.key_due.push(Reverse((until, key)));
        }
        let Some(task) = self.tasks.get_mut(&leader) else {
            return;
        };
        task.state = State::Pending {
            key,
            last_wait: None,
        };
        self.queue.insert(
            key,
            Queued {
                id: leader,
                gpus: task.spec.gpus,
                gang: task.spec.gang.is_some(),
                no_room_at: None,
            },
        );
        if task.spec.gang.is_none() {
            self.shapes
                .entry(task.shape.clone())
                .or_insert_with(|| (0, (*task.spec).clone()))
                .0 += 1;
        }
    }

    /// Task `id` is predicted to run `duration` in all: a preloaded task will be submitted
    /// with it; a queued unit is keyed again (its leader's key decides its place); a running
    /// task keeps running, weighed by the new estimate from now on.
    fn predicted(&mut self, id: TaskId, duration: Time, at: Time) -> Result<(), ApplyError> {
        if let Some(preload) = self.preloads.get_mut(&id) {
            preload.spec.predicted_duration = Some(duration);
            return Ok(());
        }
        let task = self.tasks.get_mut(&id).ok_or(ApplyError::UnknownTask(id))?;
        Arc::make_mut(&mut task.spec).predicted_duration = Some(duration);
        let State::Pending { key: old, .. } = task.state else {
            return Ok(());
        };
        if self.queue.get(&old).is_some_and(|q| q.id == id)
            && let Some(queued) = self.queue.remove(&old)
        {
            let new = self.key_of(&self.tasks[&id], at);
            self.queue.insert(new, queued);
            if let Some(Task {
                state: State::Pending { key, .. },
                ..
            }) = self.tasks.get_mut(&id)
            {
                *key = new;
            }
        }
        Ok(())
    }

    fn forget_shape(&mut self, shape: &Shape) {
        if let Some(entry) = self.shapes.get_mut(shape) {
            entry.0 -= 1;
            if entry.0 == 0 {
                self.shapes.remove(shape);
            }
        }
    }

    /// Whether task `id`, on its own, is known to fit nowhere ([`NoRoom::excludes`]).
    fn fits_nowhere(&mut self, id: TaskId) -> bool {
        let task = &self.tasks[&id];
        self.no_room
            .excludes(&task.shape, &task.spec, &self.cluster, &*self.policy)
    }

    /// Where task `id`, on its own, may fit ([`NoRoom::room`]).
    fn room_of(&mut self, id: TaskId) -> Room {
        let task = &self.tasks[&id];
        self.no_room
            .room(&task.shape, &task.spec, &self.cluster, &*self.policy)
    }

    /// The unit's first member: the gang's first pending member, or the task itself.
    fn leader(&self, id: TaskId) -> TaskId {
        self.tasks[&id]
            .spec
            .gang
            .as_ref()
            .and_then(|g| self.gangs.get(&g.name))
            .and_then(|m| m.first().copied())
            .unwrap_or(id)
    }

    /// The ids of the unit led by `leader`: its gang's members in the same state, or itself.
    fn unit_ids(&self, leader: TaskId) -> Vec<TaskId> {
        let running = self.tasks[&leader].is_running();
        self.members(leader)
            .iter()
            .copied()
            .filter(|m| self.tasks[m].is_running() == running)
            .collect()
    }

    /// Every member of `leader`'s gang, or `leader` alone.
    fn members(&self, leader: TaskId) -> &[TaskId] {
        let task = &self.tasks[&leader];
        match task
            .spec
            .gang
            .as_ref()
            .and_then(|g| self.gangs.get(&g.name))
        {
            Some(members) => members,
            None => std::slice::from_ref(&task.spec.id),
        }
    }

    /// Takes a task out of the table.
    fn remove_task(&mut self, id: TaskId) -> Option<Task> {
        let task = self.tasks.remove(&id)?;
        self.with_deadline -= usize::from(task.spec.deadline.is_some());
        Some(task)
    }

    fn unit(&self, leader: TaskId) -> Unit {
        let task = &self.tasks[&leader];
        if task.spec.gang.is_none() {
            // One task: no gang to look up (a pass builds a unit for every task it looks at).
            return Unit {
                members: smallvec![leader],
                gpus: task.spec.gpus,
                single: true,
                demand: quota::demand(&task.spec),
                specs: smallvec![Arc::clone(&task.spec)],
            };
        }
        let members = SmallVec::from_vec(self.unit_ids(leader));
        let specs: SmallVec<[Arc<TaskSpec>; 1]> = members
            .iter()
            .map(|m| Arc::clone(&self.tasks[m].spec))
            .collect();
        let mut demand = [0; 3];
        for spec in &specs {
            let d = quota::demand(spec);
            for r in 0..3 {
                demand[r] += d[r];
            }
        }
        Unit {
            gpus: specs.iter().map(|s| s.gpus).sum(),
            single: specs.len() == 1 && specs[0].gang.is_none(),
            members,
            specs,
            demand,
        }
    }

    /// Where one task goes on `cluster`: MIG instances by the shared rule, the rest as the
    /// policy places them.
    fn place_on(&self, cluster: &Cluster, spec: &TaskSpec) -> Option<Placement> {
        place_with(&*self.policy, cluster, spec)
    }

    /// [`Self::place_on`] the live cluster for a task that no node outside `nodes` can hold.
    fn place_among(&self, spec: &TaskSpec, nodes: &[NodeIdx]) -> Option<Placement> {
        match self.policy.packer() {
            Some(fgd) if spec.mig_profile.is_none() => fgd.place_among(&self.cluster, spec, nodes),
            _ => self.place_on(&self.cluster, spec),
        }
    }

    /// Whether [`Self::place_on`] the live cluster would find `spec` a placement.
    fn fits_anywhere(&self, spec: &TaskSpec) -> bool {
        match self.policy.packer() {
            Some(fgd) if spec.mig_profile.is_none() => fgd.fits_anywhere(&self.cluster, spec),
            _ => self.place_on(&self.cluster, spec).is_some(),
        }
    }

    /// Where the unit goes on `cluster` as it is, one placement per member, and for a gang
    /// the topology level it fits within.
    fn place_unit_on(&self, cluster: &mut Cluster, unit: &Unit) -> Option<Placed> {
        if unit.single {
            return self
                .place_on(cluster, &unit.specs[0])
                .map(|p| (vec![p], None));
        }
        let specs: Vec<&TaskSpec> = unit.specs.iter().map(|s| &**s).collect();
        gang::place(cluster, &specs).map(|(p, level)| (p, Some(level)))
    }

    /// [`Self::place_unit`] during a sweep: a single task through `placers` (kept for the
    /// sweep).
    fn place_in_sweep(&mut self, unit: &Unit, placers: &mut Placers) -> Option<Placed> {
        if !unit.single {
            return self.place_unit(unit);
        }
        let shape = &self.tasks[&unit.members[0]].shape;
        placers
            .place(&*self.policy, &self.cluster, &unit.specs[0], shape)
            .map(|p| (vec![p], None))
    }

    fn place_unit(&mut self, unit: &Unit) -> Option<Placed> {
        let mut cluster = std::mem::take(&mut self.cluster);
        let found = self.place_unit_on(&mut cluster, unit);
        self.cluster = cluster;
        found
    }

    /// Why no node of the cluster, even empty, could ever hold the task.
    fn never_fits(&mut self, spec: &TaskSpec) -> Option<String> {
        let shape = Shape::of(spec);
        if let Some(fits) = self.fits_empty.get(&shape) {
            return (!fits).then(|| Self::unplaceable_reason(spec));
        }
        // The placement rules themselves decide, on the cluster with nothing running.
        let fits = self.place_on(&self.pristine, spec).is_some();
        self.fits_empty.insert(shape, fits);
        (!fits).then(|| Self::unplaceable_reason(spec))
    }

    fn unplaceable_reason(spec: &TaskSpec) -> String {
        let models = if spec.gpu_models.is_empty() {
            "any model".to_owned()
        } else {
            spec.gpu_models.join(" or ")
        };
        if let Some(profile) = &spec.mig_profile {
            return format!(
                "no node offers a MIG instance {profile} ({models}, {} m CPU, {} MiB)",
                spec.cpu_milli, spec.memory_mib
            );
        }
        format!(
            "no placement holds {} GPU(s) of {} milli-GPU and {} MiB of GPU memory each \
             ({models}, {} m CPU, {} MiB) even on the idle cluster",
            spec.gpus, spec.gpu_milli, spec.gpu_memory_mib, spec.cpu_milli, spec.memory_mib
        )
    }

    /// The lease a running task holds and where, or `None` if it is not running.
    pub fn running_lease(&self, task: TaskId) -> Option<(LeaseId, &Placement)> {
        match &self.tasks.get(&task)?.state {
            State::Running {
                lease, placement, ..
            } => Some((*lease, placement)),
            State::Pending { .. } => None,
        }
    }

    /// Where each of `ids` that runs is placed, in that order.
    fn placements_of(&self, ids: &[TaskId]) -> Vec<Placement> {
        ids.iter()
            .filter_map(|id| self.running_lease(*id).map(|(_, p)| p.clone()))
            .collect()
    }

    /// The task running under `lease`, if one does.
    pub fn task_of_lease(&self, lease: LeaseId) -> Option<TaskId> {
        self.tasks
            .iter()
            .find(|(_, t)| matches!(t.state, State::Running { lease: l, .. } if l == lease))
            .map(|(id, _)| *id)
    }

    /// For a task waiting to run again after its run was stopped (preempted or requeued), and
    /// not part of a gang: the lease and nodes of that run. A report that this run ended — it
    /// completed or failed just as it was stopped — means the task needs no second run.
    pub fn stopped_run(&self, task: TaskId) -> Option<(LeaseId, &[NodeIdx])> {
        let t = self.tasks.get(&task)?;
        match (&t.state, &t.last_run, &t.spec.gang) {
            (State::Pending { .. }, Some((lease, nodes)), None) => Some((*lease, nodes)),
            _ => None,
        }
    }

    /// Whether the task is queued, preloaded or running: one a withdrawal would affect.
    pub fn holds(&self, task: TaskId) -> bool {
        self.tasks.contains_key(&task) || self.preloads.contains_key(&task)
    }

    /// Takes a task that is no longer wanted out of the scheduler; see
    /// [`Input::TaskWithdrawn`].
    fn withdraw(
        &mut self,
        id: TaskId,
        reason: String,
        at: Time,
        out: &mut Vec<Decision>,
    ) -> Result<(), ApplyError> {
        let members = if self.preloads.remove(&id).is_some() {
            vec![id]
        } else {
            let Some(task) = self.tasks.get(&id) else {
                return Err(ApplyError::UnknownTask(id));
            };
            if task.is_running() {
                return self.end(id, at, false, out);
            }
            // Pending: the whole unit goes, whether queued or a gang still incomplete.
            match task.spec.gang.as_ref().map(|g| g.name.clone()) {
                Some(gang) => {
                    let all = self.gangs.remove(&gang).unwrap_or_default();
                    let (running, pending): (Vec<TaskId>, Vec<TaskId>) =
                        all.into_iter().partition(|m| self.tasks[m].is_running());
                    if !running.is_empty() {
                        self.gangs.insert(gang, running);
                    }
                    pending
                }
                None => vec![id],
            }
        };
        for member in members {
            if let Some(task) = self.remove_task(member)
                && let State::Pending { key, .. } = task.state
                && self.queue.get(&key).is_some_and(|q| q.id == member)
            {
                self.queue.remove(&key);
                if task.spec.gang.is_none() {
                    self.forget_shape(&task.shape);
                }
            }
            out.push(Decision::Withdrawn {
                task: member,
                reason: reason.clone(),
                at,
            });
        }
        Ok(())
    }

    /// Ends a running task: releases its resources and, when it ran to its end (`observed`),
    /// tells the estimator how long it took.
    fn end(
        &mut self,
        id: TaskId,
        at: Time,
        observed: bool,
        out: &mut Vec<Decision>,
    ) -> Result<(), ApplyError> {
        if !self.tasks.get(&id).is_some_and(Task::is_running) {
            return Err(ApplyError::NotRunning(id));
        }
        let Some(task) = self.remove_task(id) else {
            return Ok(());
        };
        self.running
            .remove(task.team, id, task.spec.max_runtime.is_some());
        if let Some(g) = &task.spec.gang
            && let Some(members) = self.gangs.get_mut(&g.name)
        {
            members.retain(|m| *m != id);
            if members.is_empty() {
                self.gangs.remove(&g.name);
            }
        }
        if let State::Running {
            lease,
            placement,
            since,
            ..
        } = task.state
        {
            self.cluster.release(&placement);
            self.movable.remove(&placement, id);
            self.ends.remove(id);
            if let Some(class) = self.policy.class(&task.spec) {
                self.reclaimable.remove(class, &placement);
            }
            self.no_room.freed(placement.shares.iter().map(|s| s.node));
            self.quotas
                .refund(&task.spec.team, quota::demand(&task.spec));
            if observed {
                self.estimator
                    .observe(&task.spec, task.attained + at.saturating_sub(since));
            }
            out.push(Decision::Released {
                task: id,
                lease,
                at,
            });
        }
        Ok(())
    }

    /// `by` holds `node` out of service (or no longer does): the node takes new work only
    /// while nobody holds it. A node not yet joined keeps the hold until it joins.
    fn hold_node(&mut self, node: &str, by: Holder, held: bool) {
        let holders = self.holds.entry(node.to_owned()).or_default();
        if held {
            holders.insert(by);
        } else {
            holders.remove(&by);
        }
        let free = holders.is_empty();
        if free {
            self.holds.remove(node);
        }
        if let Some(idx) = self.cluster.find(node) {
            self.cluster.set_schedulable(idx, free);
            self.no_room.clear();
        }
    }

    /// Who holds `node` out of service, if anyone.
    pub fn holders(&self, node: &str) -> impl Iterator<Item = Holder> + '_ {
        self.holds.get(node).into_iter().flatten().copied()
    }

    /// The leaders of the units running on node `idx` (on its GPU `gpu` only, if given), in
    /// task order.
    fn running_on(&self, idx: NodeIdx, gpu: Option<u32>) -> Vec<TaskId> {
        let mut leaders: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| match &t.state {
                State::Running { placement, .. } => placement.shares.iter().any(|s| {
                    s.node == idx && gpu.is_none_or(|g| s.gpus.iter().any(|(i, _)| *i == g))
                }),
                _ => false,
            })
            .map(|(id, _)| self.leader(*id))
            .collect();
        leaders.sort_unstable();
        leaders.dedup();
        leaders
    }

    /// Stops a running task (its whole gang) and puts it back in the queue.
    /// `displaced`: moved off its node (a drain, a GPU out of service) — it then waits ahead of
    /// its priority until it runs again.
    fn requeue(
        &mut self,
        id: TaskId,
        reason: &str,
        at: Time,
        displaced: bool,
        out: &mut Vec<Decision>,
    ) -> Result<(), ApplyError> {
        if !self.tasks.get(&id).is_some_and(Task::is_running) {
            return Err(ApplyError::NotRunning(id));
        }
        let members = self.unit_ids(self.leader(id));
        for member in &members {
            self.stop(*member, at, None, reason.to_owned(), out);
            if let Some(task) = self.tasks.get_mut(member) {
                task.displaced = displaced;
            }
        }
        self.enqueue(self.leader(id), at);
        Ok(())
    }

    /// Takes a running task off its resources (already released by the caller when
    /// `released`), records the decision, and leaves it pending outside the queue.
    fn stop(
        &mut self,
        id: TaskId,
        now: Time,
        for_task: Option<TaskId>,
        reason: String,
        out: &mut Vec<Decision>,
    ) {
        let lost = self.tasks[&id].lost_work(now);
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        let State::Running {
            lease,
            placement,
            since,
            ..
        } = std::mem::replace(
            &mut task.state,
            State::Pending {
                key: QueueKey(0, 0, 0),
                last_wait: None,
            },
        )
        else {
            return;
        };
        self.running
            .remove(task.team, id, task.spec.max_runtime.is_some());
        self.movable.remove(&placement, id);
        self.ends.remove(id);
        if let Some(class) = self.policy.class(&task.spec) {
            self.reclaimable.remove(class, &placement);
        }
        if for_task.is_none() {
            // A requeue by the caller: the resources are still held.
            self.cluster.release(&placement);
            self.quotas
                .refund(&task.spec.team, quota::demand(&task.spec));
            self.no_room.freed(placement.shares.iter().map(|s| s.node));
        }
        task.attained += now.saturating_sub(since);
        task.pending_since = now;
        task.risk = DeadlineRisk::None;
        task.risk_judged = None;
        task.last_run = Some((lease, placement.shares.iter().map(|s| s.node).collect()));
        out.push(Decision::Preempted {
            task: id,
            lease,
            at: now,
            for_task,
            lost,
            reason,
        });
    }

    fn pass(&mut self, now: Time, out: &mut Vec<Decision>) {
        // 1. order
        if self.policy.dynamic() {
            self.rekey(now);
        }
        let mut blocked = self.sweep(now, out, true);
        // Victims leave more room than their preemptor needed: give it to whoever fits.
        if blocked.1 {
            self.sweep(now, out, false);
        }
        // Work now found at risk of missing its deadline moves ahead: order and walk again.
        if self.policy.keeps_deadlines() && self.judge_deadlines(now, out) {
            self.keys = Keys::Stale;
            self.rekey(now);
            blocked = self.sweep(now, out, true);
            if blocked.1 {
                self.sweep(now, out, false);
            }
        }
        if let Some((id, reason)) = blocked.0 {
            let changed = match &self.tasks.get(&id).map(|t| &t.state) {
                Some(State::Pending { last_wait, .. }) => last_wait
                    .as_ref()
                    .is_none_or(|w| std::mem::discriminant(w) != std::mem::discriminant(&reason)),
                _ => false,
            };
            if changed {
                let eta = match reason {
                    WaitReason::NoCapacity { .. } => {
                        let start = self.reserve(&self.unit(id), now).start;
                        (start != Time::MAX).then_some(start)
                    }
                    _ => None,
                };
                if let Some(Task {
                    state: State::Pending { last_wait, .. },
                    ..
                }) = self.tasks.get_mut(&id)
                {
                    *last_wait = Some(reason.clone());
                }
                let at_risk = self
                    .tasks
                    .get(&id)
                    .is_some_and(|t| t.risk != DeadlineRisk::None);
                out.push(Decision::Waiting {
                    task: id,
                    reason,
                    eta,
                    at_risk,
                    at: now,
                });
            }
        }
    }

    /// Why `team`'s quota (or the policy) does not admit `demand` now.
    fn quota_refusal(&self, team: &str, demand: Amounts) -> WaitReason {
        WaitReason::Quota {
            why: self
                .quotas
                .refusal(team, demand)
                .unwrap_or_else(|| format!("{} does not admit it", self.policy.name())),
        }
    }

    fn no_capacity(&self, unit: &Unit) -> WaitReason {
        WaitReason::NoCapacity {
            gpus: unit.gpus,
            free_gpus: self.cluster.free_milli() / u64::from(WHOLE_GPU_MILLI),
        }
    }

    /// One walk over the queue (steps 2-5); returns the first blocked unit and whether any
    /// task was preempted.
    fn sweep(
        &mut self,
        now: Time,
        out: &mut Vec<Decision>,
        may_preempt: bool,
    ) -> (Option<(TaskId, WaitReason)>, bool) {
        let mut queue = std::mem::take(&mut self.queue);
        let mut started: Vec<QueueKey> = Vec::new();
        let mut requeued: Vec<TaskId> = Vec::new();
        let mut blocked: Option<(TaskId, WaitReason)> = None;
        let mut reservation: Option<Reservation> = None;
        let mut hopeless_gpus = u32::MAX;
        let mut unmovable_gpus = u32::MAX;
        let mut running: Option<Running> = self
            .ranked
            .take()
            .and_then(|(at, ranked)| (at == now).then_some(ranked));
        #[cfg(test)]
        {
            running = running.filter(|_| self.keep_ranking);
            self.rankings_kept += usize::from(running.is_some());
        }
        #[cfg(debug_assertions)]
        if let Some(ranked) = &running {
            debug_assert!(
                ranked.same_tasks(&self.running),
                "a ranking kept from a pass at the same time holds the running tasks"
            );
            let stale = ranked.runners().find(|r| {
                let fresh = self.runner(&self.tasks[&r.id], now);
                (fresh.key, fresh.lost, fresh.over, fresh.gpus) != (r.key, r.lost, r.over, r.gpus)
            });
            debug_assert!(
                stale.is_none(),
                "a ranking kept from a pass at the same time ranks as a fresh one: {stale:?}"
            );
        }
        // Each shape's placer, for the sweep (the cluster logs where it changes meanwhile).
        let mut placers = Placers::default();
        self.cluster.log_changes(true);
        let when_blocked = self.policy.when_blocked();
        let preemptive = self.policy.preemptive();
        for (key, queued) in queue.iter_mut() {
            let goes_on = match when_blocked {
                WhenBlocked::Stop => false,
                WhenBlocked::Continue => true,
                WhenBlocked::Reserve => reservation.is_some(),
            };
            // Where a task on its own may fit, asked once a sweep: one whose shape was found to
            // fit nowhere, while no capacity was freed since, without looking it up (most of a
            // long queue waits with a few shapes, and the first of each reads what was freed).
            let room = if queued.gang {
                Room::Anywhere
            } else if queued
                .no_room_at
                .is_some_and(|slot| self.no_room.read_to_end(slot))
            {
                // (Asked again, it answers the same and changes nothing: its shape's log of
                // freed nodes was read to the end, and has not grown.)
                debug_assert!(
                    self.fits_nowhere(queued.id),
                    "a shape found to fit nowhere still does while nothing was freed"
                );
                Room::Nowhere
            } else {
                let room = self.room_of(queued.id);
                if room == Room::Nowhere {
                    queued.no_room_at = self.no_room.slot(&self.tasks[&queued.id].shape);
                }
                room
            };
            // Once a unit is blocked, a task on its own that fits nowhere does nothing where
            // the sweep goes on past blocked units and would neither move tasks nor preempt for
            // one of its size: it is passed over before its unit is built (most of a long queue
            // is passed over so, every sweep).
            if blocked.is_some() && goes_on && room == Room::Nowhere {
                let gpus = queued.gpus;
                let inert = !may_preempt
                    || reservation.is_some()
                    || (gpus >= unmovable_gpus && (!preemptive || gpus >= hopeless_gpus));
                if inert {
                    continue;
                }
            }
            let leader = &queued.id;
            let unit = self.unit(*leader);
            debug_assert_eq!(unit.single, !queued.gang, "a task on its own is its unit");
            let spec = Arc::clone(&unit.specs[0]);
            let team = &spec.team;
            // 2. nominate (a team over budget starts nothing below its floor)
            let floor = self
                .over_budget
                .get(team)
                .copied()
                .flatten()
                .filter(|floor| unit.specs[0].priority < *floor);
            let admitted = floor.is_none() && self.policy.admits(team, unit.demand, &self.quotas);
            let mut placed = if !admitted || room == Room::Nowhere {
                None
            } else {
                let found = if let Room::Among(nodes) = &room {
                    let found = self
                        .place_among(&unit.specs[0], nodes)
                        .map(|p| (vec![p], None));
                    debug_assert_eq!(
                        found,
                        self.place_unit(&unit),
                        "a task that fitted nowhere can only go where capacity was freed since"
                    );
                    found
                } else {
                    self.place_in_sweep(&unit, &mut placers)
                };
                if found.is_none() && unit.single {
                    queued.no_room_at = Some(self.no_room.insert(self.tasks[leader].shape.clone()));
                }
                found
            };
            if let (Some((ps, _)), Some(r)) = (&placed, &reservation)
                && !ps
                    .iter()
                    .zip(&unit.specs)
                    .all(|(p, spec)| r.allows(p, now + self.estimator.estimate(spec)))
            {
                placed = None;
            }
            // 3. preempt: move smaller tasks if fragmentation alone blocks it, else preempt
            let mut victims = 0;
            if placed.is_none()
                && admitted
                && floor.is_none()
                && may_preempt
                && reservation.is_none()
                && unit.gpus < unmovable_gpus
            {
                match self.relocate_for(&unit, now, out, &mut requeued, &mut running) {
                    Some((p, n)) => {
                        placed = Some(p);
                        victims = n;
                    }
                    None => unmovable_gpus = unit.gpus,
                }
            }
            if placed.is_none()
                && floor.is_none()
                && may_preempt
                && self.policy.preemptive()
                && reservation.is_none()
                && unit.gpus < hopeless_gpus
            {
                let found = self.preempt_for(&unit, *key, now, out, &mut requeued, &mut running);
                match found {
                    Some((p, n)) => {
                        placed = Some(p);
                        victims = n;
                    }
                    None => hopeless_gpus = unit.gpus,
                }
            }
            let Some((placements, level)) = placed else {
                // 5. blocked
                if blocked.is_none() {
                    let reason = if let Some(floor) = floor {
                        WaitReason::Budget {
                            team: team.clone(),
                            floor,
                        }
                    } else if admitted {
                        self.no_capacity(&unit)
                    } else {
                        self.quota_refusal(team, unit.demand)
                    };
                    blocked = Some((*leader, reason));
                }
                // Held back by its team's budget, not by capacity: it blocks no one.
                if floor.is_some() {
                    continue;
                }
                match self.policy.when_blocked() {
                    WhenBlocked::Stop => break,
                    WhenBlocked::Continue => continue,
                    WhenBlocked::Reserve => {
                        if reservation.is_none() {
                            reservation = Some(self.reserve(&unit, now));
                        }
                        continue;
                    }
                }
            };
            // 4. admit
            let why = self.grant_reason(&unit, victims, level);
            let risk = self.tasks[leader].risk;
            for (member, placement) in unit.members.iter().zip(placements) {
                let spec = &self.tasks[member].spec;
                self.cluster.allocate(&placement);
                self.quotas.charge(&spec.team, quota::demand(spec));
                let lease = LeaseId(self.next_lease);
                self.next_lease += 1;
                out.push(Decision::Granted {
                    task: *member,
                    lease,
                    placement: placement.clone(),
                    at: now,
                    reason: why.clone(),
                });
                if let Some(task) = self.tasks.get_mut(member) {
                    task.waited = now.saturating_sub(task.pending_since);
                    task.risk = risk;
                    task.displaced = false;
                    task.state = State::Running {
                        lease,
                        placement,
                        since: now,
                        checkpointed: now,
                    };
                    self.running.enter(
                        task.team,
                        &task.spec.team,
                        *member,
                        (
                            task.spec.max_runtime.is_some(),
                            self.policy.class(&task.spec),
                        ),
                    );
                    if let Some((node, entry)) = task.movable() {
                        self.movable.enter(node, entry);
                    }
                    if !self.ends.stale() {
                        let estimate = self.estimator.estimate(&task.spec);
                        self.ends.enter(*member, now, task.attained, estimate);
                    }
                    if let (Some(class), State::Running { placement, .. }) =
                        (self.policy.class(&task.spec), &task.state)
                    {
                        self.reclaimable.enter(class, placement);
                    }
                }
                if let Some(cache) = running.as_mut()
                    && let Some(task) = self.tasks.get(member)
                {
                    cache.insert(
                        task.team,
                        &task.spec.team,
                        *member,
                        (
                            task.spec.max_runtime.is_some(),
                            self.policy.class(&task.spec),
                        ),
                        |_| self.runner(task, now),
                    );
                }
            }
            started.push(*key);
            if unit.single {
                let shape = self.tasks[leader].shape.clone();
                self.forget_shape(&shape);
            }
        }
        self.cluster.log_changes(false);
        self.ranked = running.map(|ranked| (now, ranked));
        self.queue = queue;
        for key in started {
            self.queue.remove(&key);
        }
        let preempted = !requeued.is_empty();
        for leader in requeued {
            self.enqueue(leader, now);
        }
        (blocked, preempted)
    }

    fn grant_reason(&self, unit: &Unit, victims: usize, level: Option<Level>) -> String {
        let mut why = format!(
            "{}: first in the queue's order that fits",
            self.policy.name()
        );
        if victims > 0 {
            why += &format!(", after preempting {victims} task(s)");
        }
        if let (Some(level), Some(g)) = (level, &unit.specs[0].gang) {
            why += &format!(
                "; gang {} of {} placed within {}",
                g.name,
                unit.members.len(),
                level.name()
            );
        }
        if self.over_budget.contains_key(&unit.specs[0].team) {
            why += &format!("; team {} is over budget (flagged)", unit.specs[0].team);
        }
        why
    }

    /// Frees room for `unit` by preempting running tasks the policy allows (and tasks past
    /// their usage limits), in the policy's victim order; returns the placements and how many
    /// tasks were preempted if enough room was found (victims already preempted), else leaves
    /// everything as it was.
    fn preempt_for(
        &mut self,
        unit: &Unit,
        key: QueueKey,
        now: Time,
        out: &mut Vec<Decision>,
        requeued: &mut Vec<TaskId>,
        running: &mut Option<Running>,
    ) -> Option<(Placed, usize)> {
        // What a search reads of running tasks does not move within a pass: computed once per
        // sweep and kept current as tasks start and are preempted.
        let order = self.policy.victim_order();
        let running = running.get_or_insert_with(|| {
            debug_assert!(
                self.running.same_tasks(&Running::of(
                    order,
                    self.tasks.values().filter(|t| t.is_running()).map(|t| {
                        (
                            t.team,
                            t.spec.team.as_str(),
                            t.spec.id,
                            (t.spec.max_runtime.is_some(), self.policy.class(&t.spec)),
                        )
                    }),
                )),
                "the running index kept as tasks start and stop is the task table's"
            );
            self.running.clone()
        });
        let team = unit.specs[0].team.clone();
        // A displaced unit waits ahead of its priority but preempts by its policy's own key.
        let key = match self.tasks.get(&unit.specs[0].id) {
            Some(leader) if leader.displaced => self.policy_key_of(leader, now),
            _ => key,
        };
        let preemptor = Contender {
            spec: &unit.specs[0],
            key,
            demand: unit.demand,
            lost: 0,
        };
        // Every task the policy lets it take (or past its usage limit), in victim order. The
        // policy is asked about a task only when the search gets to it, of the quotas as they
        // are now (the search refunds its victims' as it goes).
        let floor = self.policy.victim_floor(preemptor);
        if self.no_victims_could_make_room(unit, preemptor, floor) {
            return None;
        }
        let mark = self.cluster.changes().len();
        let (mut victims, most) = running.search(
            |team| match self
                .policy
                .may_preempt_team(preemptor, &team.name, &self.quotas)
            {
                Some(false) if team.limited == 0 => None,
                // The whole team may be taken (or only those past their limits).
                whole @ Some(_) => Some(Terms { whole, floor: None }),
                // Task by task, only keys past the policy's floor can qualify.
                None => Some(Terms {
                    whole: None,
                    floor: floor.filter(|_| team.limited == 0),
                }),
            },
            |id| self.runner(&self.tasks[&id], now),
        );
        let quotas = self.quotas.clone();
        let own = self.tasks[&unit.specs[0].id].team;
        macro_rules! ask {
            () => {
                |r: &Runner| may_take(&*self.policy, &self.tasks, &quotas, preemptor, own, r)
            };
        }
        // A search goes on only if the victims hold enough GPUs with what is free (counted
        // until they do, in no order).
        let free = self.cluster.free_milli() / u64::from(WHOLE_GPU_MILLI);
        let need = u64::from(unit.gpus).saturating_sub(free);
        if most < need {
            return None;
        }
        if need > 0 {
            let mut held = 0;
            let mut victims = victims.remaining(running, ask!());
            if !victims.any(|(v, _)| {
                held += v.gpus();
                held >= need
            }) {
                return None;
            }
        }
        // A unit its quota admits already and bound to one node can use only victims on a node
        // they could make room on. Once a search has released a few victims in vain, the
        // others' resources are no longer released (see `useful_nodes`); only their quota is,
        // in turn, so that every admission and every victim's explanation reads the quotas as
        // before. (Most searches end after a few victims: they never pay for the sorting out.)
        let one_node =
            unit.single && no_room::one_node(&*self.policy, &self.cluster, &unit.specs[0]);
        let may_sort_out = one_node && self.policy.admits(&team, unit.demand, &self.quotas);
        let mut useful: Option<Vec<bool>> = None;
        // Victims released so far, a gang as one group; groups whose quota alone was.
        let mut released: Vec<Vec<(TaskId, String)>> = Vec::new();
        let mut refunded: Vec<TaskId> = Vec::new();
        // When the unit is known to fit nowhere and can only go on one node, only a node a
        // victim freed can take it: a placement is tried only once such a node might hold it,
        // and it weighs those nodes alone (`freed`, kept sorted). `None`: no such knowledge,
        // try on every node whenever there is room.
        let unplaceable = one_node && self.fits_nowhere(unit.members[0]);
        #[cfg(test)]
        let by_node = self.by_node;
        #[cfg(not(test))]
        let by_node = true;
        if by_node && unplaceable && may_sort_out && unit.specs[0].mig_profile.is_none() {
            let walk = victims.clone();
            match self.preempt_by_node(unit, preemptor, &quotas, walk, running, now) {
                ByNode::Found(found, stopped) => {
                    #[cfg(test)]
                    {
                        self.walked_by_node += 1;
                    }
                    let nodes: Vec<NodeIdx> = found.0[0].shares.iter().map(|s| s.node).collect();
                    let preempted = stopped.len();
                    for (member, why) in stopped {
                        let lost = self.tasks[&member].lost_work(now) / 1000;
                        let reason =
                            format!("{why}; loses {lost} s of work since its last checkpoint");
                        let task = &self.tasks[&member];
                        running.remove(task.team, member, task.spec.max_runtime.is_some());
                        self.stop(member, now, Some(unit.members[0]), reason, out);
                        requeued.push(member);
                    }
                    self.cluster
                        .forget_changes_since(mark, nodes.iter().copied());
                    self.no_room.freed(nodes);
                    return Some((found, preempted));
                }
                ByNode::Nowhere => {
                    self.cluster.forget_changes_since(mark, []);
                    return None;
                }
                ByNode::Undecided => {}
            }
        }
        let mut freed_fits: Option<bool> = unplaceable.then_some(false);
        let mut freed: Vec<NodeIdx> = Vec::new();
        let mut gone: HashSet<TaskId> = HashSet::default();
        let mut found = None;
        while let Some(taken) = victims.next(running, ask!()) {
            let victim = &taken.id();
            // A search yields each task once: only a gang's members can come up again after
            // their group went.
            let in_gang = victims.taken(running).gang;
            if in_gang && gone.contains(victim) {
                continue;
            }
            if may_sort_out
                && useful.is_none()
                && released.len()
                    >= self
                        .sort_out_after
                        .0
                        .max(victims.left() / self.sort_out_after.1)
            {
                #[cfg(test)]
                {
                    self.sorted_out += 1;
                }
                let rest = victims.remaining(running, ask!());
                let first = (taken, victims.taken(running));
                let nodes =
                    self.useful_nodes(std::iter::once(first).chain(rest), &gone, &unit.specs[0]);
                if !nodes.contains(&true) {
                    // No node the unit could use will ever hold it.
                    break;
                }
                useful = Some(nodes);
            }
            let leader = if in_gang {
                self.leader(*victim)
            } else {
                *victim
            };
            // The victim's group: its gang's running members, or itself alone.
            let gang;
            let group: &[TaskId] = if in_gang {
                gang = self.unit_ids(leader);
                &gang
            } else {
                std::slice::from_ref(victim)
            };
            if let Some(nodes) = &useful
                && !(if in_gang {
                    self.group_shares(leader).any(|s| nodes[s.node.0 as usize])
                } else {
                    let held = self.held_by(victims.taken(running));
                    held.iter().any(|s| nodes[s.node.0 as usize])
                })
            {
                for member in group {
                    let task = &self.tasks[member];
                    if task.is_running() {
                        self.quotas
                            .refund(&task.spec.team, quota::demand(&task.spec));
                        refunded.push(*member);
                    }
                    if in_gang {
                        gone.insert(*member);
                    }
                }
                continue;
            }
            // Explained now, before its resources change hands (only the victims taken pay
            // for the words).
            let why = self.why_taken(preemptor, taken, now);
            for member in group {
                let task = &self.tasks[member];
                if let State::Running { placement, .. } = &task.state {
                    self.cluster.release(placement);
                    self.quotas
                        .refund(&task.spec.team, quota::demand(&task.spec));
                    if let Some(fits) = freed_fits.as_mut() {
                        *fits = *fits
                            || placement
                                .shares
                                .iter()
                                .any(|s| self.cluster.node(s.node).might_hold(&unit.specs[0]));
                        for share in &placement.shares {
                            if let Err(at) = freed.binary_search(&share.node) {
                                freed.insert(at, share.node);
                            }
                        }
                    }
                }
                if in_gang {
                    gone.insert(*member);
                }
            }
            released.push(group.iter().map(|m| (*m, why.clone())).collect());
            // Placing is the expensive step: try only once enough GPU capacity is free (MIG
            // instances are not counted in it, so MIG units always try).
            let enough = unit.specs.iter().any(|s| s.mig_profile.is_some())
                || self.cluster.free_milli() >= unit.demand[quota::GPU];
            if enough
                && freed_fits != Some(false)
                && self.policy.admits(&team, unit.demand, &self.quotas)
            {
                let placed = if freed_fits.is_some() {
                    let placed = self
                        .place_among(&unit.specs[0], &freed)
                        .map(|p| (vec![p], None));
                    debug_assert_eq!(
                        placed,
                        self.place_unit(unit),
                        "a unit that fitted nowhere can only go where victims were released"
                    );
                    placed
                } else {
                    self.place_unit(unit)
                };
                if let Some(p) = placed {
                    found = Some(p);
                    break;
                }
                // It fits nowhere again: only nodes freed from now on can change that.
                if freed_fits.is_some() {
                    freed_fits = Some(false);
                }
            }
        }
        // Whatever is found, those kept only their place: they keep running.
        for member in refunded {
            let spec = &self.tasks[&member].spec;
            self.quotas.charge(&spec.team, quota::demand(spec));
        }
        let Some(found) = found else {
            for (member, _) in released.iter().flatten() {
                let task = &self.tasks[member];
                if let State::Running { placement, .. } = &task.state {
                    self.cluster.allocate(placement);
                    self.quotas
                        .charge(&task.spec.team, quota::demand(&task.spec));
                }
            }
            // Every node is as it was.
            self.cluster.forget_changes_since(mark, []);
            return None;
        };
        // Keep running every victim group whose nodes the placement does not use.
        let used: BTreeSet<NodeIdx> = found
            .0
            .iter()
            .flat_map(|p| p.shares.iter().map(|s| s.node))
            .collect();
        let mut preempted = 0;
        let mut stopped: Vec<NodeIdx> = Vec::new();
        for group in released {
            let off = group.iter().all(|(m, _)| match &self.tasks[m].state {
                State::Running { placement, .. } => {
                    placement.shares.iter().all(|s| !used.contains(&s.node))
                }
                State::Pending { .. } => true,
            });
            if off {
                // Off the placement's nodes: it keeps running, unless quotas still need what
                // it holds (then admission, checked with it refunded, would no longer hold).
                self.hold(&group, true);
                if self.policy.admits(&team, unit.demand, &self.quotas) {
                    continue;
                }
                self.hold(&group, false);
            }
            let leader = group[0].0;
            for (member, why) in group {
                if let State::Running { placement, .. } = &self.tasks[&member].state {
                    stopped.extend(placement.shares.iter().map(|s| s.node));
                }
                let lost = self.tasks[&member].lost_work(now) / 1000;
                let reason = format!("{why}; loses {lost} s of work since its last checkpoint");
                let task = &self.tasks[&member];
                running.remove(task.team, member, task.spec.max_runtime.is_some());
                self.stop(member, now, Some(unit.members[0]), reason, out);
                preempted += 1;
            }
            requeued.push(self.leader(leader));
        }
        // Only the stopped victims' nodes changed: the others are back as they were.
        self.cluster
            .forget_changes_since(mark, stopped.iter().copied());
        // Victims may have freed more than the preemptor took.
        self.no_room.freed(stopped);
        Some((found, preempted))
    }

    /// Why a search for `preemptor` takes `victim`, in words, as the quotas are now.
    fn why_taken(&self, preemptor: Contender<'_>, victim: Victim, now: Time) -> String {
        let task = &self.tasks[&victim.id()];
        if victim.over() {
            return format!(
                "ran {} s, past its usage limit of {} s",
                task.run_time(now) / 1000,
                task.spec.max_runtime.unwrap_or(0) / 1000
            );
        }
        let victim = Contender {
            spec: &task.spec,
            key: victim.key(),
            demand: quota::demand(&task.spec),
            lost: task.lost_work(now),
        };
        self.policy
            .preemption_reason(preemptor, victim, &self.quotas)
    }

    /// Whether no node could hold `unit` — one its policy places on one node — were every
    /// task the search for `preemptor` may take gone: the victims are bounded by the key
    /// `floor` (no team is taken whole, none has a usage limit) and keys have classes
    /// ([`Policy::class`]), so what the classes past the floor hold on each node
    /// ([`Reclaimable`]) is the most a search could free there. Answered from the nodes alone,
    /// before any running task is weighed; `false` when it cannot be. A shape found so is
    /// remembered, and asked again only of the nodes freed since ([`NoRoom::beyond_help`]).
    fn no_victims_could_make_room(
        &mut self,
        unit: &Unit,
        preemptor: Contender<'_>,
        floor: Option<QueueKey>,
    ) -> bool {
        #[cfg(test)]
        if !self.rule_out {
            return false;
        }
        let task = &unit.specs[0];
        let Some(floor) = floor.filter(|_| self.policy.class(task).is_some()) else {
            return false;
        };
        if !unit.single
            || !no_room::one_node(&*self.policy, &self.cluster, task)
            || self.running.teams().any(|team| {
                team.limited > 0
                    || self
                        .policy
                        .may_preempt_team(preemptor, &team.name, &self.quotas)
                        == Some(true)
            })
        {
            return false;
        }
        debug_assert_eq!(
            self.reclaimable.normalized(),
            {
                let mut all = Reclaimable::default();
                for t in self.tasks.values() {
                    if let (Some(class), State::Running { placement, .. }) =
                        (self.policy.class(&t.spec), &t.state)
                    {
                        all.enter(class, placement);
                    }
                }
                all.normalized()
            },
            "what running tasks hold by class, kept as they start and stop, is the task table's"
        );
        // As a search reads the classes: one wholly at or below the floor holds no victim.
        let counts = |class: i64| !victims::below(class, floor);
        let classes = (floor.0, (floor.1, floor.2) == (i64::MAX, u64::MAX));
        let shape = &self.tasks[&unit.members[0]].shape;
        let (cluster, reclaimable) = (&self.cluster, &self.reclaimable);
        let known = self.no_room.beyond_help(shape, classes, |at| {
            reclaimable.might_hold(cluster.node(at), at, counts, task)
        });
        let might =
            !known
                && cluster.nodes().iter().enumerate().any(|(at, node)| {
                    reclaimable.might_hold(node, NodeIdx(at as u32), counts, task)
                });
        if !known && !might {
            self.no_room.insert_beyond_help(shape, classes);
        }
        #[cfg(test)]
        {
            self.ruled_out += usize::from(!might);
        }
        !might
    }

    /// The nodes on which `victims`, not yet released or refunded (a gang member whose group
    /// is in `gone` is passed over), could help `task` — which its quota
    /// admits and which goes on one node — to a placement: those that might hold the task were
    /// every one of their groups (a gang whole) released. Releasing a group on none of them
    /// changes no node the task could use, and its team's admission holds whatever is released
    /// (usage only falls), so such a group would be released, then kept running: a search that
    /// only refunds its quota, in turn, takes the same victims, explains them in the same words
    /// and finds the same placement, without releasing and restoring resources on the way.
    fn useful_nodes<'r>(
        &self,
        victims: impl Iterator<Item = (Victim, &'r Runner)>,
        gone: &HashSet<TaskId>,
        task: &TaskSpec,
    ) -> Vec<bool> {
        let mut freeing = FreeingNodes::new(&self.cluster);
        let mut seen: HashSet<TaskId> = HashSet::default();
        for (victim, runner) in victims {
            if !runner.gang {
                // A search yields a task once: only gangs' members repeat a group, or come
                // up after their group went. Read in place, not kept: most of these are never
                // looked at again, and a copy of each one's shares cost more than this walk.
                let held = match runner.held_known() {
                    Some(held) => held,
                    None => self.shares_of(runner.id),
                };
                held.iter().for_each(|s| freeing.release(&self.cluster, s));
                continue;
            }
            if gone.contains(&victim.id()) {
                continue;
            }
            let leader = self.leader(victim.id());
            if seen.insert(leader) {
                self.group_shares(leader)
                    .for_each(|s| freeing.release(&self.cluster, s));
            }
        }
        freeing.might_hold(&self.cluster, task)
    }

    /// The node shares of the running group (a gang whole, as [`Self::unit_ids`] has it) led by
    /// `leader`.
    fn group_shares(&self, leader: TaskId) -> impl Iterator<Item = &NodeShare> + '_ {
        self.members(leader).iter().flat_map(|m| self.shares_of(*m))
    }

    /// Makes room for `unit`, blocked by fragmentation alone, by moving smaller running tasks
    /// of no higher priority off one node onto capacity that stays free (Gandiva's
    /// defragmenting migration, done as preempt-and-restart). Only when the policy relocates
    /// ([`Policy::relocation_cost`]), the unit is one task whose demand the free GPUs already
    /// cover, every victim can start again at once elsewhere, and the move costs less than it
    /// saves: Σ victims' GPUs × (restart + work since their checkpoint) below the unit's GPUs ×
    /// the time until it would fit without the move (heavy-tailed expectations). Victims are
    /// stopped and requeued (the pass's second sweep starts them again); returns the unit's
    /// placement and how many tasks moved, or leaves everything as it was.
    fn relocate_for(
        &mut self,
        unit: &Unit,
        now: Time,
        out: &mut Vec<Decision>,
        requeued: &mut Vec<TaskId>,
        running: &mut Option<Running>,
    ) -> Option<(Placed, usize)> {
        let restart = self.policy.relocation_cost()?;
        let spec = &unit.specs[0];
        let free_gpus = self.cluster.free_milli() / u64::from(WHOLE_GPU_MILLI);
        let need = unit.demand[quota::GPU];
        if !unit.single || spec.mig_profile.is_some() || self.cluster.free_milli() < need {
            return None;
        }
        debug_assert!(
            self.place_on(&self.cluster, spec).is_none(),
            "a move is only sought for a unit that fits nowhere"
        );
        debug_assert_eq!(
            self.movable.all(),
            {
                let mut all: Vec<(NodeIdx, movable::Entry)> =
                    self.tasks.values().filter_map(Task::movable).collect();
                all.sort_unstable_by_key(|(node, e)| (*node, e.id));
                all
            },
            "the movable tasks kept as tasks start and stop are the task table's"
        );
        // Per node, the cheapest victims (cost in milli-GPU·ms, then arrival) whose GPUs with
        // the node's free ones cover the need; the nodes whose victims cost least are tried
        // (ties to the earlier node). Every node is first read from what its movable tasks hold
        // together ([`movable::Summary`]): one they cannot make room on however few are
        // movable is passed over, and the others are weighed from the cheapest bound up, so
        // the entries are read only on nodes whose victims could still cost less than those
        // of every node kept so far. Which nodes are kept does not depend on the bound, only
        // how many are weighed: each is kept or not by its own victims' cost.
        let ask = movable::Ask {
            need,
            priority: spec.priority,
            restart,
            now,
        };
        // Each node that might make room, with what its victims cost at least
        // ([`movable::Summary::least_cost`]), in 64 bits: one too large for them is kept as the
        // largest, still a bound below the cost, and which nodes are kept does not depend on
        // the bound (a heap of 64-bit bounds is about half the work of one of 128-bit ones).
        // (Sized once: grown push by push, it was copied over and over, about 3% of openb.)
        let mut floors: Vec<Reverse<(u64, NodeIdx, u64)>> =
            Vec::with_capacity(self.cluster.nodes().len());
        for (node, summary) in self.movable.summaries() {
            let state = self.cluster.node(node);
            let free = state.free_milli();
            if free >= need || free + summary.milli < need || !state.schedulable {
                continue;
            }
            let floor =
                u64::try_from(summary.least_cost(need - free, restart, now)).unwrap_or(u64::MAX);
            #[cfg(test)]
            let floor = if self.rule_out_moves { floor } else { 0 };
            floors.push(Reverse((floor, node, free)));
        }
        let mut floors = BinaryHeap::from(floors);
        let mut cheapest: Vec<(u128, NodeIdx, u64)> = Vec::with_capacity(RELOCATION_TRIES + 1);
        while let Some(Reverse((floor, node, free))) = floors.pop() {
            // Every node left costs more than each of those kept.
            if cheapest.len() == RELOCATION_TRIES
                && u128::from(floor) > cheapest[RELOCATION_TRIES - 1].0
            {
                break;
            }
            let Some(cost) = self.movable.cover_cost(node, free, ask) else {
                continue;
            };
            debug_assert!(
                u128::from(floor) <= cost,
                "a node's victims cost no less than its bound"
            );
            let at = cheapest.partition_point(|(c, at, _)| (*c, *at) <= (cost, node));
            if at < RELOCATION_TRIES {
                cheapest.insert(at, (cost, node, free));
                cheapest.truncate(RELOCATION_TRIES);
            }
        }
        if cheapest.is_empty() {
            return None;
        }
        let cheapest: Vec<(u128, NodeIdx, Vec<TaskId>)> = cheapest
            .into_iter()
            .map(|(cost, node, free)| (cost, node, self.movable.cover(node, free, ask)))
            .collect();
        // What waiting would cost the unit, asked only once a move is possible: most tries
        // fail because a victim fits nowhere else, and the question reads every running task.
        // Candidates come cheapest first, so the first possible move too costly ends the search.
        let mut fits_at: Option<Time> = None;
        let saved = |fits_at: Time| u128::from(need) * u128::from(fits_at.saturating_sub(now));
        let one_node = no_room::one_node(&*self.policy, &self.cluster, spec);
        for (cost, node, victims) in cheapest {
            if fits_at.is_some_and(|at| cost >= saved(at)) {
                break;
            }
            if one_node && self.relocation_cannot_work(unit, node, &victims) {
                continue;
            }
            // A move is tried in two steps: first what can rule it out cheaply (the unit's
            // placement on `node`, and whether each victim fits anywhere at all), then — once
            // it is known to save more than it costs, which most moves do not — every victim
            // placed in turn. Candidates come cheapest first, so the first move too costly ends
            // the search, whether or not its victims would have found room.
            #[cfg(test)]
            let two_steps = self.rule_out_moves;
            #[cfg(not(test))]
            let two_steps = true;
            if two_steps
                && self
                    .try_move(spec, node, &victims, one_node, false)
                    .is_none()
            {
                #[cfg(test)]
                {
                    self.moves_ruled_out += 1;
                }
                continue;
            }
            let mut trial = None;
            if !two_steps {
                trial = self.try_move(spec, node, &victims, false, true);
                if trial.is_none() {
                    continue;
                }
            }
            // Worth it only if the unit would otherwise wait longer than the move costs: it
            // must not fit by `now` + cost ÷ need. That is asked first, before when it would
            // fit: the answer rules out most moves, and is found from one placement.
            let by = now.saturating_add((cost / u128::from(need)).try_into().unwrap_or(Time::MAX));
            if fits_at.is_none() && one_node && by < Time::MAX && self.fits_by(unit, now, by) {
                break;
            }
            let fits_at = *fits_at.get_or_insert_with(|| self.earliest_fit(unit, now, true).start);
            if cost >= saved(fits_at) {
                break;
            }
            let Some(mut trial) =
                trial.or_else(|| self.try_move(spec, node, &victims, one_node, true))
            else {
                continue;
            };
            for p in self.placements_of(&victims) {
                self.cluster.release(&p);
            }
            let placement = trial.swap_remove(0);
            let wait = if fits_at == Time::MAX {
                "for as long as anything now running runs".to_owned()
            } else {
                format!("about {} s", (fits_at - now) / 1000)
            };
            for id in &victims {
                let task = &self.tasks[id];
                self.quotas
                    .refund(&task.spec.team, quota::demand(&task.spec));
                let lost = task.lost_work(now) / 1000;
                let reason = format!(
                    "{}: moved to make room for {} ({} GPUs), which fits on none of the {} free \
                     GPUs and would otherwise wait {wait}; restarts at once on free \
                     capacity, losing {lost} s of work since its last checkpoint",
                    self.policy.name(),
                    spec.id,
                    unit.gpus,
                    free_gpus,
                );
                if let Some(cache) = running.as_mut() {
                    let moved = &self.tasks[id];
                    cache.remove(moved.team, *id, moved.spec.max_runtime.is_some());
                }
                self.stop(*id, now, Some(spec.id), reason, out);
                requeued.push(*id);
            }
            self.no_room.clear();
            return Some(((vec![placement], None), victims.len()));
        }
        None
    }

    /// Tries moving `victims` off `node` for the task `spec`, which fits nowhere as the cluster
    /// is, on the live cluster, and leaves every node as it was: the task placed first, then
    /// (`full`) each victim in turn on what is left; returns those placements, in that order,
    /// if all were found. Not `full`: only the task's placement and whether each victim fits
    /// anywhere once it is placed — necessary for the full move (the victims placed before one
    /// only take room), answered without weighing where any would go. Only `node` changes, so
    /// a task bound to one node (`one_node`) can only go there, and only `node` is weighed.
    fn try_move(
        &mut self,
        spec: &TaskSpec,
        node: NodeIdx,
        victims: &[TaskId],
        one_node: bool,
        full: bool,
    ) -> Option<Vec<Placement>> {
        let mark = self.cluster.changes().len();
        let originals = self.placements_of(victims);
        for p in &originals {
            self.cluster.release(p);
        }
        let mut trial: Vec<Placement> = Vec::new();
        let mut ok = false;
        let placed = if one_node {
            self.place_among(spec, &[node])
        } else {
            self.place_on(&self.cluster, spec)
        };
        if let Some(p) = placed {
            self.cluster.allocate(&p);
            trial.push(p);
            ok = full
                || victims
                    .iter()
                    .all(|id| self.fits_anywhere(&self.tasks[id].spec));
            for id in if ok && full { victims } else { &[] } {
                match self.place_on(&self.cluster, &self.tasks[id].spec) {
                    Some(p) => {
                        self.cluster.allocate(&p);
                        trial.push(p);
                    }
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
        }
        for p in &trial {
            self.cluster.release(p);
        }
        for p in &originals {
            self.cluster.allocate(p);
        }
        // Every node is as it was (a sweep's placers need not look at them again).
        self.cluster.forget_changes_since(mark, []);
        ok.then_some(trial)
    }

    /// Whether moving `victims` off `node` surely fails to make room for `unit`: one task, bound
    /// to one node, that fits nowhere as the cluster is. Only `node` changes, so the unit could
    /// only go there, and must fit once they are gone; and a victim of a shape that fits
    /// nowhere now could only go back on `node`, so must fit in what the unit leaves there
    /// (the last victim never does: it took the node past the need). Answered from the node
    /// and the shapes that found no room, before a move is tried in full — most tries fail one
    /// way or the other, and a full try places the unit and each victim on the whole cluster.
    fn relocation_cannot_work(&mut self, unit: &Unit, node: NodeIdx, victims: &[TaskId]) -> bool {
        #[cfg(test)]
        if !self.rule_out_moves {
            return false;
        }
        let spec = &unit.specs[0];
        let mut freeing = Freeing::new(self.cluster.node(node));
        for id in victims {
            if let State::Running { placement, .. } = &self.tasks[id].state {
                for share in placement.shares.iter().filter(|s| s.node == node) {
                    freeing.release(share);
                }
            }
        }
        if !freeing.might_hold(spec) {
            #[cfg(test)]
            {
                self.moves_ruled_out += 1;
            }
            return true;
        }
        let (gpu, cpu, memory) = freeing.room();
        let left = (
            gpu.saturating_sub(unit.demand[quota::GPU]),
            cpu.saturating_sub(spec.cpu_milli),
            memory.saturating_sub(spec.memory_mib),
        );
        let doomed = victims.iter().any(|id| {
            let task = &self.tasks[id];
            let victim = &task.spec;
            let misses = quota::demand(victim)[quota::GPU] > left.0
                || victim.cpu_milli > left.1
                || victim.memory_mib > left.2;
            misses
                && no_room::one_node(&*self.policy, &self.cluster, victim)
                && self
                    .no_room
                    .excludes(&task.shape, victim, &self.cluster, &*self.policy)
        });
        #[cfg(test)]
        {
            self.moves_ruled_out += usize::from(doomed);
        }
        doomed
    }

    /// A running task as preemption searches weigh it during a pass at `now`.
    fn runner(&self, task: &Task, now: Time) -> Runner {
        Runner::new(
            task.team,
            self.key_of(task, now),
            task.spec.id,
            task.spec.gpus,
            task.over_limit(now),
            task.lost_work(now),
            task.spec.gang.is_some(),
        )
    }

    /// What running task `r` holds, looked up once per sweep.
    fn held_by<'r>(&self, r: &'r Runner) -> &'r [NodeShare] {
        r.held(|| self.shares_of(r.id).into())
    }

    /// What task `id` holds, one share per node (nothing while it waits).
    fn shares_of(&self, id: TaskId) -> &[NodeShare] {
        match &self.tasks[&id].state {
            State::Running { placement, .. } => placement.shares.as_slice(),
            State::Pending { .. } => &[],
        }
    }

    /// Takes (`true`) or gives back (`false`) the resources and quota of running tasks.
    fn hold(&mut self, group: &[(TaskId, String)], take: bool) {
        for (member, _) in group {
            let task = &self.tasks[member];
            if let State::Running { placement, .. } = &task.state {
                if take {
                    self.cluster.allocate(placement);
                    self.quotas
                        .charge(&task.spec.team, quota::demand(&task.spec));
                } else {
                    self.cluster.release(placement);
                    self.quotas
                        .refund(&task.spec.team, quota::demand(&task.spec));
                }
            }
        }
    }

    /// The earliest start of `unit` if running tasks end when their estimates say, and the
    /// nodes it would use then.
    fn reserve(&mut self, unit: &Unit, now: Time) -> Reservation {
        self.earliest_fit(unit, now, false)
    }

    /// The earliest moment `unit` fits if running tasks end, in order, when their estimates
    /// say (`heavy_tailed`: as [`Self::expected_end`] expects, a task past its estimate
    /// running as long again), and the nodes it would use then.
    fn earliest_fit(&mut self, unit: &Unit, now: Time, heavy_tailed: bool) -> Reservation {
        // (expected end, arrival order): a total order, so the reservation never depends on
        // how the task table happens to iterate.
        let mut ends: BinaryHeap<Reverse<(Time, u64, TaskId)>> = self
            .tasks
            .values()
            .filter_map(|t| match &t.state {
                State::Running { since, .. } => {
                    let end = if heavy_tailed {
                        self.expected_end(t, now)
                    } else {
                        let total = self.estimator.estimate(&t.spec);
                        (since + total.saturating_sub(t.attained)).max(now + 1)
                    };
                    Some(Reverse((end, t.seq, t.spec.id)))
                }
                State::Pending { .. } => None,
            })
            .collect();
        // Released on the live cluster, in that order, and taken back before returning: most
        // questions look at a few ends, so they come from a heap, not a sort, and a copy of
        // the cluster would cost more than they do.
        let mut cluster = std::mem::take(&mut self.cluster);
        let mark = cluster.changes().len();
        // Once a placement failed, a unit bound to one node can only fit after a release
        // frees a node that might hold it.
        let one_node = unit.single && no_room::one_node(&*self.policy, &cluster, &unit.specs[0]);
        let mut failed = false;
        let mut fit = Reservation {
            start: Time::MAX,
            nodes: BTreeSet::new(),
        };
        let mut released = Vec::new();
        while let Some(Reverse((end, _, id))) = ends.pop() {
            let State::Running { placement, .. } = &self.tasks[&id].state else {
                continue;
            };
            cluster.release(placement);
            released.push(id);
            if failed
                && one_node
                && !placement
                    .shares
                    .iter()
                    .any(|s| cluster.node(s.node).might_hold(&unit.specs[0]))
            {
                continue;
            }
            match self.place_unit_on(&mut cluster, unit) {
                Some((ps, _)) => {
                    fit = Reservation {
                        start: end,
                        nodes: ps
                            .iter()
                            .flat_map(|p| p.shares.iter().map(|s| s.node))
                            .collect(),
                    };
                    break;
                }
                None => failed = true,
            }
        }
        for id in released {
            if let State::Running { placement, .. } = &self.tasks[&id].state {
                cluster.allocate(placement);
            }
        }
        // Every node is as it was: a sweep's placers need not look at them again.
        cluster.forget_changes_since(mark, []);
        self.cluster = cluster;
        fit
    }

    /// When `unit` (queued under `key`) is expected to start, for [`Self::waiting`]: a short
    /// replay of the future in which nothing new arrives, nothing is preempted and every
    /// running or started task ends when [`Self::expected_end`] says. At each end the units
    /// ahead of it in the queue start first, as the policy would start them (strictly in order
    /// under head-of-line blocking, whatever fits and its quota admits otherwise); `unit`
    /// starts at the first moment it is admitted and fits on what they leave. `None` when it
    /// never does, or not within [`MAX_ETA_STEPS`] ends. Decisions depend on it only through
    /// deadlines ([`Self::judge_deadlines`]); it is deterministic, so replays agree.
    fn expected_start(&self, unit: &Unit, key: QueueKey, now: Time) -> Option<Time> {
        let mut sim = self.eta_sim(now);
        // Units ahead, but not those held back by their team's budget: they start no sooner
        // than the budget changes, and block no one meanwhile.
        let mut ahead: Vec<(Unit, u64)> = self
            .queue
            .range(..key)
            .map(|(_, q)| (self.unit(q.id), self.tasks[&q.id].seq))
            .filter(|(u, _)| self.within_budget(&u.specs[0]))
            .collect();
        let in_order = self.policy.when_blocked() == WhenBlocked::Stop;
        let mut at = now;
        for _ in 0..MAX_ETA_STEPS {
            let mut started: Vec<usize> = Vec::new();
            // Requests refused at this moment are refused again until something ends.
            let mut refused: HashSet<(&str, Amounts, u32)> = HashSet::default();
            for (i, (u, seq)) in ahead.iter().enumerate() {
                let class = (u.specs[0].team.as_str(), u.demand, u.gpus);
                if refused.contains(&class) || !self.start_in(&mut sim, u, *seq, at) {
                    if in_order {
                        break;
                    }
                    refused.insert(class);
                    continue;
                }
                started.push(i);
            }
            for i in started.into_iter().rev() {
                ahead.remove(i);
            }
            if (!in_order || ahead.is_empty())
                && self
                    .policy
                    .admits(&unit.specs[0].team, unit.demand, &sim.quotas)
                && self.place_unit_on(&mut sim.cluster, unit).is_some()
            {
                return Some(at);
            }
            at = sim.end_next()?;
        }
        None
    }

    /// When each pending unit is expected to start (by its leader, the first member), from one
    /// simulation of the whole queue with the model of [`Self::expected_start`]: running work
    /// ends as expected, units start in queue order as capacity and quotas allow (in strict
    /// order under a policy that stops at a blocked head), each running for its estimate.
    /// Units of the same team, demand and GPU count form a class; a class refused at one
    /// moment is refused until something ends, so each moment costs a look at each class's
    /// first unit rather than at every unit. Units held back by their team's budget, and
    /// those not expected to start within [`MAX_ETA_STEPS`] ends, have none.
    pub fn expected_starts(&self, now: Time) -> HashMap<TaskId, Time> {
        let mut sim = self.eta_sim(now);
        type Class = (String, Amounts, u32);
        // Each class's units in queue order (by their place in line), and each class's first
        // unit in a heap by that place.
        let mut classes: HashMap<Class, std::collections::VecDeque<(usize, Unit, u64)>> =
            HashMap::default();
        for (place, queued) in self.queue.values().enumerate() {
            let leader = &queued.id;
            let unit = self.unit(*leader);
            let spec = &unit.specs[0];
            let budget_ok = self.within_budget(spec);
            let complete = spec
                .gang
                .as_ref()
                .is_none_or(|g| self.gangs.get(&g.name).map_or(0, Vec::len) as u32 >= g.size);
            if budget_ok && complete {
                let class = (spec.team.clone(), unit.demand, unit.gpus);
                let seq = self.tasks[leader].seq;
                classes
                    .entry(class)
                    .or_default()
                    .push_back((place, unit, seq));
            }
        }
        let in_order = self.policy.when_blocked() == WhenBlocked::Stop;
        let mut starts: HashMap<TaskId, Time> = HashMap::default();
        let mut at = now;
        for _ in 0..MAX_ETA_STEPS {
            let mut heads: BinaryHeap<Reverse<(usize, &Class)>> = classes
                .iter()
                .filter_map(|(class, units)| units.front().map(|u| Reverse((u.0, class))))
                .collect();
            let mut taken: HashMap<&Class, usize> = HashMap::default();
            while let Some(Reverse((_, class))) = heads.pop() {
                let units = &classes[class];
                let next = taken.get(class).copied().unwrap_or(0);
                let Some((_, unit, seq)) = units.get(next) else {
                    continue;
                };
                if !self.start_in(&mut sim, unit, *seq, at) {
                    if in_order {
                        break;
                    }
                    continue; // refused until something ends
                }
                starts.insert(unit.members[0], at);
                taken.insert(class, next + 1);
                if let Some((place, _, _)) = units.get(next + 1) {
                    heads.push(Reverse((*place, class)));
                }
            }
            let taken: Vec<(Class, usize)> =
                taken.into_iter().map(|(c, n)| (c.clone(), n)).collect();
            for (class, n) in taken {
                if let Some(units) = classes.get_mut(&class) {
                    units.drain(..n);
                    if units.is_empty() {
                        classes.remove(&class);
                    }
                }
            }
            if classes.is_empty() {
                break;
            }
            // Everything that ends at the next moment ends together.
            let Some(end) = sim.end_next() else {
                break;
            };
            while sim.next_end() == Some(end) {
                sim.end_next();
            }
            at = end;
        }
        starts
    }

    /// An ETA simulation starting at `now` from the cluster, quotas and running work as they
    /// are, each running task expected to end at [`Self::expected_end`].
    fn eta_sim(&self, now: Time) -> EtaSim {
        let mut sim = EtaSim {
            cluster: self.cluster.clone(),
            quotas: self.quotas.clone(),
            held: Vec::new(),
            ends: BinaryHeap::new(),
        };
        for t in self.tasks.values() {
            if let State::Running { placement, .. } = &t.state {
                sim.hold(placement.clone(), &t.spec, self.expected_end(t, now), t.seq);
            }
        }
        sim
    }

    /// Starts `unit` (place `seq` in line) in `sim` at `at` if its team's quota admits it and
    /// it fits; each member then runs for its estimate.
    fn start_in(&self, sim: &mut EtaSim, unit: &Unit, seq: u64, at: Time) -> bool {
        if !self
            .policy
            .admits(&unit.specs[0].team, unit.demand, &sim.quotas)
        {
            return false;
        }
        let Some((placements, _)) = self.place_unit_on(&mut sim.cluster, unit) else {
            return false;
        };
        for (spec, placement) in unit.specs.iter().zip(placements) {
            sim.cluster.allocate(&placement);
            sim.quotas.charge(&spec.team, quota::demand(spec));
            let end = at.saturating_add(self.estimator.estimate(spec)).max(at + 1);
            sim.hold(placement, spec, end, seq);
        }
        true
    }

    /// Whether `spec`'s team's budget lets it start (a team over budget starts only work at or
    /// above its floor).
    fn within_budget(&self, spec: &TaskSpec) -> bool {
        self.over_budget
            .get(&spec.team)
            .copied()
            .flatten()
            .is_none_or(|floor| spec.priority >= floor)
    }

    /// Whether `unit`, one task that goes on one node and fits nowhere now, fits once every
    /// running task expected ([`Self::expected_end`]) to end by `by` has ended: whether
    /// [`Self::earliest_fit`] (heavy tailed) starts it by then. A release only makes room, so
    /// they are all released at once and one placement is asked for, instead of one after each
    /// end in turn; and only a node they release on that might then hold it can, so their
    /// releases are counted first, and only those on such nodes are made.
    fn fits_by(&mut self, unit: &Unit, now: Time, by: Time) -> bool {
        let spec = &unit.specs[0];
        debug_assert!(
            self.place_on(&self.cluster, spec).is_none(),
            "{} fits nowhere now",
            spec.id
        );
        if self.ends.stale() && self.ends.asked_stale() {
            self.ends
                .list(self.tasks.values().filter_map(|t| match &t.state {
                    State::Running { since, .. } => Some((
                        t.spec.id,
                        *since,
                        t.attained,
                        self.estimator.estimate(&t.spec),
                    )),
                    State::Pending { .. } => None,
                }));
        }
        let scanned = || -> Vec<TaskId> {
            let mut ids: Vec<TaskId> = self
                .tasks
                .values()
                .filter(|t| t.is_running() && self.expected_end(t, now) <= by)
                .map(|t| t.spec.id)
                .collect();
            ids.sort_unstable();
            ids
        };
        // Right after estimates may have changed, the tasks are read once; only a second
        // question before they change again lists them afresh.
        let ending = if self.ends.stale() {
            scanned()
        } else {
            let kept = self.ends.ending_by(now, by);
            debug_assert_eq!(
                {
                    let mut ids = kept.clone();
                    ids.sort_unstable();
                    ids
                },
                scanned(),
                "the tasks kept by their ends are those expected to end by {by}"
            );
            kept
        };
        let mut freeing = FreeingNodes::new(&self.cluster);
        for id in &ending {
            for share in self.shares_of(*id) {
                freeing.release(&self.cluster, share);
            }
        }
        let nodes: Vec<NodeIdx> = freeing
            .might_hold(&self.cluster, spec)
            .into_iter()
            .enumerate()
            .filter_map(|(at, might)| might.then_some(NodeIdx(at as u32)))
            .collect();
        let fits = !nodes.is_empty() && {
            let on_them: Vec<TaskId> = ending
                .into_iter()
                .filter(|id| {
                    self.shares_of(*id)
                        .iter()
                        .any(|s| nodes.binary_search(&s.node).is_ok())
                })
                .collect();
            let mark = self.cluster.changes().len();
            let placements = self.placements_of(&on_them);
            for p in &placements {
                self.cluster.release(p);
            }
            let fits = self.place_among(spec, &nodes).is_some();
            for p in &placements {
                self.cluster.allocate(p);
            }
            // Every node is as it was (a sweep's placers need not look at them again).
            self.cluster.forget_changes_since(mark, []);
            fits
        };
        debug_assert_eq!(
            fits,
            self.earliest_fit(unit, now, true).start <= by,
            "{} fits by {by} as it would one end at a time",
            unit.specs[0].id
        );
        fits
    }

    /// When a running task is expected to end, for ETAs: when its estimate says, or — once it
    /// has run past it — after as long again as it has run so far in all. Run times are
    /// heavy-tailed: a task that outlived its estimate is likely to run much longer, and under
    /// a Pareto tail of index 1 the median of what is left equals what has run; expecting it
    /// to end "now" would promise the next start every pass, and break it every pass.
    fn expected_end(&self, task: &Task, now: Time) -> Time {
        let estimate = self.estimator.estimate(&task.spec);
        let left = estimate::remaining(estimate, task.attained + task.run_time(now));
        now.saturating_add(left).max(now + 1)
    }

    fn rekey(&mut self, now: Time) {
        // Only the tasks whose key may have moved since they were keyed are keyed again
        // (`key_due`, or all of them), and only those whose key did move are taken out and put
        // back. Keys end in the task's sequence number, so no two are equal and the queue's
        // order is the same whichever way it is built.
        if self.keys == Keys::Tracked && self.key_due.len() > 2 * self.queue.len() + 1024 {
            self.keys = Keys::Settled;
        }
        let track = self.keys != Keys::Stale;
        let due: Vec<(QueueKey, TaskId)> = if self.keys != Keys::Tracked {
            self.key_due.clear();
            self.keys = if track { Keys::Tracked } else { Keys::Settled };
            self.queue.iter().map(|(key, q)| (*key, q.id)).collect()
        } else {
            let mut due = Vec::new();
            while let Some(Reverse((until, key))) = self.key_due.peek().copied()
                && until <= now
            {
                self.key_due.pop();
                if let Some(q) = self.queue.get(&key) {
                    due.push((key, q.id));
                }
            }
            due.sort_unstable();
            due.dedup();
            due
        };
        let mut moved: Vec<(QueueKey, QueueKey, TaskId)> = Vec::new();
        let mut gone: Vec<QueueKey> = Vec::new();
        for (old, id) in due {
            match self.tasks.get(&id) {
                Some(task) => {
                    let key = if track {
                        let (key, until) = self.keyed(task, now);
                        if until != Time::MAX {
                            self.key_due.push(Reverse((until, key)));
                        }
                        key
                    } else {
                        self.key_of(task, now)
                    };
                    if key != old {
                        moved.push((old, key, id));
                    }
                }
                None => gone.push(old),
            }
        }
        for old in gone {
            self.queue.remove(&old);
        }
        let mut back = Vec::with_capacity(moved.len());
        for (old, key, id) in moved {
            back.extend(self.queue.remove(&old).map(|q| (key, q)));
            if let Some(Task {
                state: State::Pending { key: k, .. },
                ..
            }) = self.tasks.get_mut(&id)
            {
                *k = key;
            }
        }
        for (key, queued) in back {
            let displaced = self.queue.insert(key, queued);
            debug_assert!(displaced.is_none(), "two queued tasks keyed {key:?}");
        }
        #[cfg(debug_assertions)]
        for (key, Queued { id, .. }) in &self.queue {
            debug_assert_eq!(
                *key,
                self.key_of(&self.tasks[id], now),
                "{id:?}'s key is kept until the policy says it may change"
            );
        }
    }
}

/// The state an ETA simulation moves forward: free capacity and quotas, what holds resources
/// until it ends (placement, team, quota demand) and a min-heap of (expected end, place in
/// line, index into `held`) — a total order, so simulations are deterministic.
struct EtaSim {
    cluster: Cluster,
    quotas: Quotas,
    held: Vec<(Placement, String, Amounts)>,
    ends: BinaryHeap<Reverse<(Time, u64, usize)>>,
}

impl EtaSim {
    /// Records `placement` (already allocated) as held by `spec` until `end`.
    fn hold(&mut self, placement: Placement, spec: &TaskSpec, end: Time, seq: u64) {
        self.ends.push(Reverse((end, seq, self.held.len())));
        self.held
            .push((placement, spec.team.clone(), quota::demand(spec)));
    }

    /// When the next held work ends, if any does.
    fn next_end(&self) -> Option<Time> {
        self.ends.peek().map(|Reverse((end, _, _))| *end)
    }

    /// Ends the next held work, freeing its capacity and quota: its end.
    fn end_next(&mut self) -> Option<Time> {
        let Reverse((end, _, i)) = self.ends.pop()?;
        let (placement, team, demand) = &self.held[i];
        self.cluster.release(placement);
        self.quotas.refund(team, *demand);
        Some(end)
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

mod by_node;
mod ends;
mod movable;
mod no_room;
mod reclaimable;

/// Placements of many tasks on a cluster that changes meanwhile (a sweep, a pass's preload
/// holds), while the cluster logs its changes: a task the policy places by FGD goes, from the
/// second of its shape on, through that shape's incremental placer, which looks again only at
/// the nodes changed since it was last asked. (A shape placed once — the common case when a
/// pass places one arrival — is placed from scratch: ranking every node costs more than one
/// search.) Every placement is the one `place_with` finds.
#[derive(Default)]
struct Placers(HashMap<Shape, Placer>);

/// How a shape's tasks are placed.
enum Placer {
    /// Placed once so far, from scratch.
    Once,
    /// By this placer, which has seen the cluster's changes up to this many.
    Ranked(Box<Incremental>, usize),
    /// From scratch: the policy has no incremental placer for it.
    FromScratch,
}

impl Placers {
    /// Where `policy` puts `spec`, of `shape`, on `cluster` now.
    fn place(
        &mut self,
        policy: &dyn Policy,
        cluster: &Cluster,
        spec: &TaskSpec,
        shape: &Shape,
    ) -> Option<Placement> {
        if let (None, Some(fgd)) = (&spec.mig_profile, policy.packer()) {
            let Some(slot) = self.0.get_mut(shape) else {
                self.0.insert(shape.clone(), Placer::Once);
                return place_with(policy, cluster, spec);
            };
            if matches!(slot, Placer::Once) {
                *slot = match Incremental::new(fgd, cluster, spec) {
                    Some(placer) => Placer::Ranked(Box::new(placer), cluster.changes().len()),
                    None => Placer::FromScratch,
                };
            }
            if let Placer::Ranked(placer, seen) = slot {
                placer.update(fgd, cluster, &cluster.changes()[*seen..]);
                *seen = cluster.changes().len();
                return placer.place(cluster);
            }
        }
        place_with(policy, cluster, spec)
    }
}

/// Where `policy` puts `spec` on `cluster`: a MIG instance by best fit, anything else as the
/// policy places it.
fn place_with(policy: &dyn Policy, cluster: &Cluster, spec: &TaskSpec) -> Option<Placement> {
    if spec.mig_profile.is_some() {
        placement::best_fit(cluster, spec)
    } else {
        policy.place(cluster, spec)
    }
}
#[cfg(test)]
mod tests;
mod victims;

use by_node::ByNode;
use ends::Ends;
use movable::Movable;
use no_room::{NoRoom, Room, Slot};
use reclaimable::Reclaimable;
use victims::{Runner, Running, Terms, Victim};

/// Whether `policy` lets `preemptor` (of team number `own`) take the running task `r`, asked
/// of `quotas`.
fn may_take(
    policy: &dyn Policy,
    tasks: &HashMap<TaskId, Task>,
    quotas: &Quotas,
    preemptor: Contender<'_>,
    own: usize,
    r: &Runner,
) -> bool {
    if r.team == own
        && let Some(answer) = policy.may_preempt_teammate(preemptor, r.key, r.lost)
    {
        return answer;
    }
    let spec = r.spec(|| Arc::clone(&tasks[&r.id].spec));
    let victim = Contender {
        spec,
        key: r.key,
        demand: quota::demand(spec),
        lost: r.lost,
    };
    policy.may_preempt(preemptor, victim, quotas)
}
