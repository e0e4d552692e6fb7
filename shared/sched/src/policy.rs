//! Policies: what differs between schedulers, behind one small trait. Everything else — the
//! cluster view, placement, the pass, decisions — is shared, so a comparison between policies
//! compares policies and nothing else.

use crate::cluster::{Cluster, Placement};
use crate::model::{TaskSpec, Time};
use crate::placement;
use crate::quota::{Amounts, Quotas};

pub mod packing;

pub mod allot;
pub mod queueing;

/// The order of pending tasks: smaller keys go first. The last field is the submission
/// sequence, so equal keys keep arrival order and the order is total and deterministic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueKey(pub i64, pub i64, pub u64);

/// A task — pending, or running when a preemptive policy weighs victims — as a policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct PendingView<'a> {
    /// The task.
    pub spec: &'a TaskSpec,
    /// When it was submitted.
    pub submitted: Time,
    /// Submission sequence number (arrival order, ties in file order).
    pub seq: u64,
    /// Run time so far, over all its runs, ms.
    pub attained: Time,
    /// GPU-time so far: GPUs × run time, GPU-ms.
    pub attained_gpu: u64,
    /// The estimator's total run time for it (see [`crate::estimate`]).
    pub estimate: Time,
    /// Whether `estimate` was learned (a prediction, or finished tasks) rather than the
    /// estimator's default ([`crate::estimate::DurationEstimator::learned`]).
    pub estimate_learned: bool,
    /// Since when it has waited in the queue this time (its submission, or the end of its
    /// last run); `None` while it runs.
    pub pending_since: Option<Time>,
    /// While it runs: how long it waited in the queue before this run started; `None` while
    /// it waits.
    pub waited_before_run: Option<Time>,
    /// Pending: how the scheduler expects it to fare against its [`TaskSpec::deadline`];
    /// running: how it was judged when it started. Policies that keep deadlines read it.
    pub risk: DeadlineRisk,
}

/// How a task with a deadline is expected to fare, as the scheduler judges it (see
/// `Scheduler::judge_deadlines`; only for policies that [`Policy::keeps_deadlines`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum DeadlineRisk {
    /// No deadline, not judged yet, or on course for it.
    #[default]
    None,
    /// Waiting its turn, it would miss the deadline; first in line, it would make it when
    /// running work ends.
    AtRisk,
    /// Even first in line it would miss the deadline unless running work made room for it.
    Urgent,
}

/// A task in a preemption decision: its spec and its key at this instant.
#[derive(Debug, Clone, Copy)]
pub struct Contender<'a> {
    /// The task (for a gang, its first member: members share team and priority).
    pub spec: &'a TaskSpec,
    /// Its key now.
    pub key: QueueKey,
    /// What it holds or asks of its team's quota (a gang: all its members).
    pub demand: Amounts,
    /// Run time, ms, that preempting it now would lose: everything since its last checkpoint
    /// (0 for the preemptor, which does not run).
    pub lost: Time,
}

/// The order in which the victims a policy allows are preempted until there is room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VictimOrder {
    /// The worst key first (the baselines' rule).
    WorstFirst,
    /// The least work lost first — GPUs × run time since the last checkpoint — ties to the
    /// worst key.
    LeastLostWork,
}

/// What a pass does when the next task in order cannot be placed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenBlocked {
    /// Stop the pass: nothing behind it starts (strict FIFO, head-of-line blocking).
    Stop,
    /// Try the tasks behind it.
    Continue,
    /// EASY backfill: the first blocked task gets a reservation at the earliest time enough
    /// capacity frees up (by the estimates of running tasks); tasks behind it start only if
    /// they fit now and, by their own estimate, do not delay that reservation.
    Reserve,
}

/// A scheduling policy.
pub trait Policy: Send + std::fmt::Debug {
    /// Its name on the command line and in reports.
    fn name(&self) -> &'static str;
    /// Where a pending task stands in the queue at `now`.
    fn key(&self, task: PendingView<'_>, now: Time) -> QueueKey;
    /// Whether keys change as time passes (then the queue is re-ordered as they do).
    fn dynamic(&self) -> bool {
        false
    }
    /// Until when (exclusive) a dynamic policy's [`Self::key`] of a waiting task stays what it
    /// is at `now`, as long as nothing it is keyed by changes but the time. A pass re-keys a
    /// task once that time has come (and every task after any input other than a submission).
    /// By default, `now` only: re-keyed at every later time.
    fn key_holds_until(&self, _task: PendingView<'_>, now: Time) -> Time {
        now.saturating_add(1)
    }
    /// What a pass does when the next task does not fit.
    fn when_blocked(&self) -> WhenBlocked;
    /// Whether the policy orders work by deadline risk ([`PendingView::at_risk`]): the
    /// scheduler then judges queued tasks with deadlines each pass (it must be
    /// [`Policy::dynamic`], so the new order is used at once).
    fn keeps_deadlines(&self) -> bool {
        false
    }
    /// Whether a task that does not fit may preempt running tasks whose keys are worse.
    fn preemptive(&self) -> bool {
        false
    }
    /// Whether `preemptor` may preempt the running `victim`. Must never hold both ways for two
    /// tasks; by default, the victim's key must be strictly worse.
    fn may_preempt(
        &self,
        preemptor: Contender<'_>,
        victim: Contender<'_>,
        _quotas: &Quotas,
    ) -> bool {
        victim.key > preemptor.key
    }
    /// [`Policy::may_preempt`] for every running task of `team` at once, where the answer does
    /// not depend on the task: `Some(true)` if it holds for each of them, `Some(false)` if for
    /// none, `None` to ask task by task (the default). A shortcut only — it must agree with
    /// `may_preempt` — that lets a preemption search settle a whole team in one question.
    fn may_preempt_team(
        &self,
        _preemptor: Contender<'_>,
        _team: &str,
        _quotas: &Quotas,
    ) -> Option<bool> {
        None
    }
    /// [`Policy::may_preempt`] for a victim of the preemptor's own team, answered from the
    /// victim's key and the work preempting it would lose alone, where the policy can: `None`
    /// (the default) to be asked with the whole victim. A shortcut only — it must agree with
    /// `may_preempt` — that spares a preemption search a look-up per teammate it weighs.
    fn may_preempt_teammate(
        &self,
        _preemptor: Contender<'_>,
        _victim_key: QueueKey,
        _victim_lost: Time,
    ) -> Option<bool> {
        None
    }
    /// A key every victim [`Policy::may_preempt`] allows task by task is worse than (victims
    /// past their usage limits aside), if the policy knows one: a preemption search then looks
    /// no further down a team's running tasks. `None` (the default): no such bound.
    fn victim_floor(&self, _preemptor: Contender<'_>) -> Option<QueueKey> {
        None
    }
    /// The first part of every key `task` will ever have, if its spec alone fixes it (a
    /// priority class). With a [`Policy::victim_floor`], the classes past the floor then
    /// bound a search's victims, and a search no node could end is ruled out before any running
    /// task is weighed. `None` (the default): keys have no such class.
    fn class(&self, _task: &TaskSpec) -> Option<i64> {
        None
    }
    /// Why `preemptor` preempts `victim`, for the decision log (called when
    /// [`Policy::may_preempt`] holds, before anything changes).
    fn preemption_reason(
        &self,
        preemptor: Contender<'_>,
        _victim: Contender<'_>,
        _quotas: &Quotas,
    ) -> String {
        format!(
            "{}: {} ranks ahead and needs its GPUs",
            self.name(),
            preemptor.spec.id
        )
    }
    /// What restarting a task costs beyond its lost work, ms, if the policy moves smaller
    /// running tasks to make room for a task blocked by fragmentation alone (they restart at
    /// once elsewhere; see `Scheduler::relocate_for`); `None`: it never does.
    fn relocation_cost(&self) -> Option<Time> {
        None
    }
    /// In which order allowed victims are taken.
    fn victim_order(&self) -> VictimOrder {
        VictimOrder::WorstFirst
    }
    /// Whether quotas let `demand` more start now for `team` (policies without quotas admit
    /// everything).
    fn admits(&self, _team: &str, _demand: Amounts, _quotas: &Quotas) -> bool {
        true
    }
    /// Whether keys read [`PendingView::estimate`] (estimates are only computed for those).
    fn needs_estimates(&self) -> bool {
        false
    }
    /// Whether the policy is meant to run with the run-time predictor's predictions in
    /// [`TaskSpec::predicted_duration`] (the simulator then makes them, as the predictor
    /// service does live); baselines keep their own estimators.
    fn uses_predictor(&self) -> bool {
        false
    }
    /// Whether the policy reads true durations (allowed for oracle baselines only).
    fn uses_oracle(&self) -> bool {
        false
    }
    /// Where `task` goes on the cluster as it is now, if anywhere. Best fit unless the policy
    /// places differently (FGD, topology-aware placement …).
    fn place(&self, cluster: &Cluster, task: &TaskSpec) -> Option<Placement> {
        placement::best_fit(cluster, task)
    }
    /// Whether every placement of `task` (not a MIG instance) that [`Policy::place`] can find
    /// is on one node: placement searches rely on it (only a node that might hold such a task
    /// can take it). Unless the policy knows better: no more GPUs than a node of every model
    /// with GPUs has (larger tasks may span nodes of smaller models).
    fn one_node(&self, cluster: &Cluster, task: &TaskSpec) -> bool {
        task.gpus <= cluster.one_node_gpus()
    }
    /// The FGD packer [`Policy::place`] places with, if it is one: for many tasks of one shape
    /// on a changing cluster, a [`packing::Incremental`] built on it places exactly as
    /// [`Policy::place`] would, at a fraction of the cost per placement.
    fn packer(&self) -> Option<&packing::Fgd> {
        None
    }
    /// Tells the policy a task was submitted (FGD learns the distribution of task shapes).
    /// What it learns must not change the keys of running tasks: a sweep's ranking of them is
    /// kept for the next pass at the same time while only submissions come in between.
    fn observe_submitted(&mut self, _task: &TaskSpec) {}
    /// The parameters it runs with, printed beside results.
    fn parameters(&self) -> String {
        String::new()
    }
}

/// Strict first-come-first-served with head-of-line blocking (DESIGN.md's reference).
#[derive(Debug, Clone, Copy, Default)]
pub struct Fifo;

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }
    fn key(&self, task: PendingView<'_>, _now: Time) -> QueueKey {
        QueueKey(task.submitted as i64, 0, task.seq)
    }
    fn when_blocked(&self) -> WhenBlocked {
        WhenBlocked::Stop
    }
    fn parameters(&self) -> String {
        "order=submit time; head-of-line blocking; best-fit placement".into()
    }
}

/// Shortest job first by true duration, non-preemptive, head-of-line blocking (Helios' SJF).
#[derive(Debug, Clone, Copy, Default)]
pub struct SjfOracle;

impl Policy for SjfOracle {
    fn name(&self) -> &'static str {
        "sjf-oracle"
    }
    fn key(&self, task: PendingView<'_>, _now: Time) -> QueueKey {
        let duration = task.spec.oracle_duration.unwrap_or(u64::MAX >> 1);
        QueueKey(duration as i64, task.submitted as i64, task.seq)
    }
    fn when_blocked(&self) -> WhenBlocked {
        WhenBlocked::Stop
    }
    fn uses_oracle(&self) -> bool {
        true
    }
    fn parameters(&self) -> String {
        "order=true duration; head-of-line blocking; non-preemptive".into()
    }
}

/// The policies known by name.
pub fn by_name(name: &str) -> Option<Box<dyn Policy>> {
    match name {
        "allot" => return Some(Box::new(allot::Allot::default())),
        "allot-oracle" => return Some(Box::new(allot::Allot::oracle())),
        _ => {}
    }
    if let Some(policy) = queueing::by_name(name) {
        return Some(policy);
    }
    match name {
        "fifo" => Some(Box::new(Fifo)),
        "sjf-oracle" => Some(Box::new(SjfOracle)),
        "bestfit" => Some(Box::new(packing::BestFit)),
        "fgd" => Some(Box::new(packing::Fgd::new())),
        _ => None,
    }
}

/// Names accepted by [`by_name`].
pub const NAMES: &[&str] = &[
    "fifo",
    "sjf-oracle",
    "srtf-oracle",
    "fifo-backfill",
    "tiresias",
    "kueue",
    "allot",
    "allot-oracle",
    "bestfit",
    "fgd",
];
