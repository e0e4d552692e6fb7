//! `allot`: Allot's own policy. One configuration for every scenario — nothing here is tuned to
//! a trace.
//!
//! Priority first; among equal priorities, shortest *estimated* remaining time first, weighted
//! by what the task unblocks (Smith's rule: remaining ÷ (1 + dependents), which minimises the
//! mean completion time of tasks and of the stages waiting on them); preemptive, never
//! head-of-line blocked:
//! - the estimate comes from the history estimator (finished tasks of the same team and GPU
//!   count, or the predictor's word — no oracle);
//! - a task that has outlived its estimate is treated as heavy-tailed: its expected remaining
//!   time is taken to be what it has run so far (the least-attained-service rule), so a long
//!   job that was mispredicted as short cannot hold the cluster;
//! - preemption must pay for itself: a running task is preempted only for one of higher
//!   priority, or of the same priority whose weighted remaining time is at most half its own
//!   *and* shorter by more than the preemption costs — a restart ([`Allot::restart_cost`]) plus
//!   the victim's work since its last checkpoint — which bounds the work lost to checkpoint
//!   gaps and restarts (without the second test, two tasks expected to finish in 0.9 s and
//!   0.4 s trade places for nothing) — and, for the latter, only when both expectations rest on
//!   something learned. Before any task has finished (and without a
//!   prediction) the estimate is a fixed default that says nothing about either task, so
//!   comparing them cannot show a gain: the task waits instead. Without this, a cluster where
//!   nothing has finished yet keeps trading running tasks for newcomers that are no shorter,
//!   and every trade loses their work and can strand capacity. Among the tasks it may preempt,
//!   those that lose the least work since their last checkpoint go first;
//! - no task starves: one that has waited in the queue for an hour ([`Allot::starve_after`],
//!   counted from its submission or the end of its last run) goes to the front of its
//!   priority, in arrival order — Tiresias' starvation guard, as a bound on how long later,
//!   shorter work may pass it. The guard moves it ahead of new arrivals; it gives it no right
//!   to preempt (a guarded task takes room as it frees, or by the quota and priority rules);
//! - deadlines are kept: a task whose expected start (the queue ahead of it starting first)
//!   plus its expected run time passes its deadline, but which could still make it if it
//!   started now, is *at risk* (judged by the scheduler, `Scheduler::judge_deadlines`); it goes
//!   ahead of everything else of its priority, earliest deadline first; only when it is
//!   *urgent* — even first in line it would miss the deadline waiting for running work to
//!   end — may it preempt by the rules above, with its deadline as its measure; once started
//!   that way it is not preempted by gain. A task that cannot make its deadline even now gets no precedence: moving it
//!   ahead would only make others late too, and a deadline set too tight to keep cannot buy
//!   a place in line (ElasticFlow's admission test, Gu et al. ASPLOS'23, as a guard rather
//!   than a refusal);
//! - fragmentation does not keep a task waiting: one that fits in the free GPUs' number but on
//!   no node may move smaller running tasks of no higher priority off a node onto free
//!   capacity elsewhere, where they restart at once (Gandiva's defragmenting migration, as
//!   preempt-and-restart), when the move — their GPUs × (a restart plus their work since the
//!   last checkpoint) — costs less than the task's GPUs × the time it would otherwise wait
//!   (see `Scheduler::relocate_for`);
//! - quotas hold (when teams have them): admission within nominal quota or by borrowing from
//!   the cohort. Across teams, a task preempts only to reclaim its team's nominal quota from a
//!   team that borrows, or — with the gain above — from a team that borrows more of the
//!   cohort's lendable capacity than its own team would (dominant-resource fair share); so no
//!   team's guarantee is taken by another team's short jobs, and no two tasks can preempt each
//!   other in turn.
//!
//! Placement is fragmentation-aware: Fragmentation Gradient Descent ([`Fgd`], Weng et al.,
//! ATC'23) under the host-aware measure ([`Measure::HostAware`]) — a node's GPUs count as usable
//! for a task shape only as far as its free CPU and memory can still accompany them, so tasks do
//! not leave GPUs stranded behind exhausted CPU or memory.

use super::packing::{Fgd, Measure};
use super::{Contender, DeadlineRisk, PendingView, Policy, QueueKey, VictimOrder, WhenBlocked};
use crate::cluster::{Cluster, Placement};
use crate::model::{TaskSpec, Time};
use crate::quota::{Amounts, Quotas};

/// Set in the last field of a key (the submission sequence) when the task's estimate is the
/// estimator's default rather than learned: among equal priorities and expected remaining
/// times, learned estimates go first, and [`Allot::may_preempt`] reads it.
const UNLEARNED: u64 = 1 << 62;

/// Set in the last field of a key when the starvation guard moved the task to the front of
/// its priority, and while the run it started that way lasts: it goes first, but the guard
/// gives it no right to preempt by gain, and the run it started is not preempted by gain.
const PROMOTED: u64 = 1 << 61;

/// The second field of a key at risk of missing its deadline is its deadline less this: below
/// every other key of its priority (whose second field is a time left, never negative), in
/// deadline order.
const AT_RISK_BASE: i64 = 1 << 62;

/// Allot's policy; see the module docs.
#[derive(Debug, Clone)]
pub struct Allot {
    /// A victim's expected remaining time must be at least this many times the preemptor's.
    pub preemption_gain: i64,
    /// What restarting a preempted task costs beyond its lost work, ms (scheduling, start-up,
    /// loading the checkpoint): a same-priority preemption must save more than this plus the
    /// victim's work since its last checkpoint.
    pub restart_cost: Time,
    /// The starvation guard: a task that has waited this long in the queue (since its
    /// submission or its last run) goes to the front of its priority, ms.
    pub starve_after: Time,
    /// Where tasks go: FGD under the host-aware measure, learning task shapes as they arrive.
    placer: Fgd,
    /// Reads true durations instead of predictions (`allot-oracle`, the simulator's ceiling:
    /// what the policy would do with a perfect predictor).
    oracle: bool,
}

impl Default for Allot {
    fn default() -> Self {
        Self {
            preemption_gain: 2,
            restart_cost: 60_000,
            starve_after: 3_600_000,
            placer: Fgd::with_measure(Measure::HostAware),
            oracle: false,
        }
    }
}

impl Allot {
    /// The same policy on true durations (`allot-oracle`): a ceiling for simulations only.
    pub fn oracle() -> Self {
        Self {
            oracle: true,
            ..Self::default()
        }
    }

    /// Expected remaining run time, ms.
    fn remaining(task: &PendingView<'_>) -> Time {
        crate::estimate::remaining(task.estimate, task.attained).max(1)
    }

    /// Whether the key's expected remaining time rests on a learned estimate.
    fn learned(key: QueueKey) -> bool {
        key.2 & UNLEARNED == 0
    }

    /// Higher priority; or the same priority, both estimates learned, a weighted remaining
    /// time at most 1 / `preemption_gain` of the victim's, and a gain over what the preemption
    /// costs (a restart and the victim's work since its checkpoint).
    fn pays_off(&self, preemptor: QueueKey, victim: QueueKey, victim_lost: Time) -> bool {
        let cost = self.restart_cost.saturating_add(victim_lost);
        victim > preemptor
            && (victim.0 > preemptor.0
                || (Self::learned(preemptor)
                    && preemptor.2 & PROMOTED == 0
                    && victim.2 & PROMOTED == 0
                    && Self::learned(victim)
                    && victim.1 >= preemptor.1.saturating_mul(self.preemption_gain)
                    && victim.1.saturating_sub(preemptor.1) > cost.min(i64::MAX as u64) as i64))
    }
}

impl Policy for Allot {
    fn name(&self) -> &'static str {
        if self.oracle { "allot-oracle" } else { "allot" }
    }
    fn uses_predictor(&self) -> bool {
        !self.oracle
    }
    fn uses_oracle(&self) -> bool {
        self.oracle
    }
    fn key(&self, task: PendingView<'_>, now: Time) -> QueueKey {
        let weight = 1 + u64::from(task.spec.dag.dependents);
        let remaining = Self::remaining(&task);
        let mut weighted = remaining / weight;
        let mut promoted = 0;
        // At risk of missing its deadline, and still able to make it: earliest deadline first,
        // ahead of everything else of its priority — preempting by gain only when urgent (not
        // even first in line would it make it); once started, not preempted by gain.
        let deadline = task
            .spec
            .deadline
            .filter(|d| task.risk != DeadlineRisk::None && now.saturating_add(remaining) <= *d);
        if let Some(deadline) = deadline {
            let seq = task.seq.min(PROMOTED - 1);
            if task.pending_since.is_some() {
                let at = (deadline.min(AT_RISK_BASE as u64) as i64) - AT_RISK_BASE;
                let may_preempt = task.risk == DeadlineRisk::Urgent;
                let flags = if may_preempt { 0 } else { PROMOTED };
                return QueueKey(-i64::from(task.spec.priority), at, seq | flags);
            }
            promoted = PROMOTED;
        }
        if task
            .pending_since
            .is_some_and(|since| now.saturating_sub(since) >= self.starve_after)
        {
            weighted = 0;
            promoted = PROMOTED;
        } else if task
            .waited_before_run
            .is_some_and(|waited| waited >= self.starve_after)
        {
            promoted = PROMOTED;
        }
        let unlearned = if task.estimate_learned { 0 } else { UNLEARNED };
        QueueKey(
            -i64::from(task.spec.priority),
            weighted.min(i64::MAX as u64) as i64,
            task.seq.min(PROMOTED - 1) | unlearned | promoted,
        )
    }
    fn dynamic(&self) -> bool {
        true
    }
    fn key_holds_until(&self, task: PendingView<'_>, now: Time) -> Time {
        // What [`Self::key`] reads of the time: whether a task at risk can still make its
        // deadline (until `deadline` − remaining; meanwhile nothing else counts), and whether
        // it has waited past the starvation guard (from `since` + `starve_after`). Each
        // turns once, at most.
        let remaining = Self::remaining(&task);
        if let Some(deadline) = task
            .spec
            .deadline
            .filter(|d| task.risk != DeadlineRisk::None && now.saturating_add(remaining) <= *d)
        {
            return deadline - remaining + 1;
        }
        task.pending_since
            .map(|since| since.saturating_add(self.starve_after))
            .filter(|at| *at > now)
            .unwrap_or(Time::MAX)
    }
    fn needs_estimates(&self) -> bool {
        true
    }
    fn keeps_deadlines(&self) -> bool {
        true
    }
    fn when_blocked(&self) -> WhenBlocked {
        WhenBlocked::Continue
    }
    fn preemptive(&self) -> bool {
        true
    }
    fn admits(&self, team: &str, demand: Amounts, quotas: &Quotas) -> bool {
        quotas.is_empty() || quotas.admits(team, demand)
    }
    fn relocation_cost(&self) -> Option<Time> {
        Some(self.restart_cost)
    }
    fn victim_order(&self) -> VictimOrder {
        VictimOrder::LeastLostWork
    }
    fn may_preempt(
        &self,
        preemptor: Contender<'_>,
        victim: Contender<'_>,
        quotas: &Quotas,
    ) -> bool {
        let (p, v) = (&preemptor.spec.team, &victim.spec.team);
        let pays_off = || self.pays_off(preemptor.key, victim.key, victim.lost);
        if quotas.is_empty() || p == v {
            return pays_off();
        }
        let reclaims = quotas.within_nominal(p, preemptor.demand) && quotas.borrowing(v);
        reclaims || (pays_off() && quotas.fairer(p, preemptor.demand, v, victim.demand))
    }
    fn may_preempt_teammate(
        &self,
        preemptor: Contender<'_>,
        victim_key: QueueKey,
        victim_lost: Time,
    ) -> Option<bool> {
        // Within a team only the gain counts.
        Some(self.pays_off(preemptor.key, victim_key, victim_lost))
    }
    fn may_preempt_team(
        &self,
        preemptor: Contender<'_>,
        team: &str,
        quotas: &Quotas,
    ) -> Option<bool> {
        let p = &preemptor.spec.team;
        if quotas.is_empty() || p == team {
            return None;
        }
        if quotas.within_nominal(p, preemptor.demand) && quotas.borrowing(team) {
            return Some(true);
        }
        // Fair share needs the victim's team to borrow even after losing the task: a team
        // within its nominal quota loses nothing to another team.
        (!quotas.borrowing(team)).then_some(false)
    }
    fn victim_floor(&self, preemptor: Contender<'_>) -> Option<QueueKey> {
        // Task by task a victim must pay off: a worse key, and unless the preemptor's estimate
        // is learned and it was not promoted, a lower priority.
        let key = preemptor.key;
        if Self::learned(key) && key.2 & PROMOTED == 0 {
            Some(key)
        } else {
            Some(QueueKey(key.0, i64::MAX, u64::MAX))
        }
    }
    fn class(&self, task: &TaskSpec) -> Option<i64> {
        // Every key starts with the priority, negated.
        Some(-i64::from(task.priority))
    }
    fn preemption_reason(
        &self,
        preemptor: Contender<'_>,
        victim: Contender<'_>,
        quotas: &Quotas,
    ) -> String {
        let (p, v) = (&preemptor.spec.team, &victim.spec.team);
        let id = preemptor.spec.id;
        if preemptor.spec.priority > victim.spec.priority {
            return format!(
                "allot: {id} has priority {} over {}",
                preemptor.spec.priority, victim.spec.priority
            );
        }
        if !quotas.is_empty() && p != v && quotas.within_nominal(p, preemptor.demand) {
            return format!(
                "allot: team {p} reclaims its nominal quota from team {v}, which borrows"
            );
        }
        let fair = if !quotas.is_empty() && p != v {
            format!(" and team {v} borrows a larger share of the cohort than team {p}")
        } else {
            String::new()
        };
        if preemptor.key.1 < 0 {
            return format!(
                "allot: {id} would miss its deadline waiting its turn, so it goes first among \
                 equal priorities (earliest deadline first){fair}"
            );
        }
        format!(
            "allot: {id} is expected to finish in {} s (weighted by what it unblocks), under \
             1/{} of this task's {} s and {} s sooner than a restart and the {} s of work since \
             its checkpoint cost{fair}",
            preemptor.key.1 / 1000,
            self.preemption_gain,
            victim.key.1 / 1000,
            (victim.key.1 - preemptor.key.1) / 1000,
            victim.lost / 1000
        )
    }
    fn place(&self, cluster: &Cluster, task: &TaskSpec) -> Option<Placement> {
        self.placer.place(cluster, task)
    }
    fn one_node(&self, cluster: &Cluster, task: &TaskSpec) -> bool {
        self.placer.one_node(cluster, task)
    }
    fn packer(&self) -> Option<&super::packing::Fgd> {
        self.placer.packer()
    }
    fn observe_submitted(&mut self, task: &TaskSpec) {
        self.placer.observe_submitted(task);
    }
    fn parameters(&self) -> String {
        format!(
            "order=priority, then expected remaining time ÷ (1 + dependents) (history estimate; \
             attained once past it); preemptive for higher priority, or when the victim's is ≥ \
             {}× the preemptor's, the gain exceeds a {} s restart plus the victim's work \
             since its checkpoint, and both estimates are learned; least lost work first; a task \
             waiting {} s goes to the front of its priority (no preemption right); smaller tasks \
             moved off a node when fragmentation alone blocks a task and the move costs less than \
             the wait; work at risk of missing its deadline first among its priority, earliest \
             deadline first; quotas \
             with reclaim and fair share; no head-of-line blocking; placement=FGD, host-aware \
             (GPUs count as usable only as far as free CPU and memory can feed them)",
            self.preemption_gain,
            self.restart_cost / 1000,
            self.starve_after / 1000
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::QueueKey;
    use crate::quota::Quota;

    /// The teammate shortcut answers what `may_preempt` answers for a victim of the same team,
    /// with and without quotas, over keys of every kind (priority, remaining time, learned
    /// or not, promoted or not) and lost work around the restart cost.
    #[test]
    fn the_teammate_shortcut_agrees_with_may_preempt() {
        let policy = Allot::default();
        let spec = TaskSpec::new(1, "vision", 1);
        let mut quotas = Quotas::default();
        quotas.set("vision", Quota::gpus(8_000));
        let flags = [0, UNLEARNED, PROMOTED, UNLEARNED | PROMOTED];
        let keys: Vec<QueueKey> = [0, -1]
            .into_iter()
            .flat_map(|class| {
                [0, 30_000, 61_000, 200_000, 10_000_000]
                    .into_iter()
                    .flat_map(move |time| flags.map(|f| QueueKey(class, time, 7 | f)))
            })
            .collect();
        let mut allowed = 0;
        for &p in &keys {
            for &v in &keys {
                for lost in [0, 60_000, 500_000] {
                    let contender = |key, lost| Contender {
                        spec: &spec,
                        key,
                        demand: [1_000, 0, 0],
                        lost,
                    };
                    let short = policy.may_preempt_teammate(contender(p, 0), v, lost);
                    for q in [&Quotas::default(), &quotas] {
                        let full = policy.may_preempt(contender(p, 0), contender(v, lost), q);
                        assert_eq!(
                            short,
                            Some(full),
                            "preemptor {p:?}, victim {v:?}, lost {lost}"
                        );
                        allowed += usize::from(full);
                    }
                }
            }
        }
        assert!(
            allowed > 0,
            "some victims are allowed, or the check proves nothing"
        );
    }

    /// A waiting task's key is what it was at every time before the one `key_holds_until`
    /// names, and differs at that time: tasks with and without a deadline, at risk or not,
    /// waiting briefly or past the starvation guard.
    #[test]
    fn a_key_holds_exactly_until_the_policy_says() {
        let policy = Allot::default();
        let hour = 3_600_000;
        let mut turns = 0;
        for deadline in [None, Some(2 * hour), Some(9 * hour)] {
            let mut spec = TaskSpec::new(1, "vision", 1);
            spec.deadline = deadline;
            for risk in [
                DeadlineRisk::None,
                DeadlineRisk::AtRisk,
                DeadlineRisk::Urgent,
            ] {
                for (since, now) in [(0, 0), (0, hour / 2), (0, 2 * hour), (hour, 3 * hour / 2)] {
                    let view = |risk| PendingView {
                        spec: &spec,
                        submitted: since,
                        seq: 7,
                        attained: 0,
                        attained_gpu: 0,
                        estimate: 3 * hour / 4,
                        estimate_learned: true,
                        pending_since: Some(since),
                        waited_before_run: None,
                        risk,
                    };
                    let key = |at| policy.key(view(risk), at);
                    let until = policy.key_holds_until(view(risk), now);
                    assert!(until > now);
                    let last = until.min(now + 12 * hour) - 1;
                    for at in [now, (now + last) / 2, last] {
                        assert_eq!(
                            key(at),
                            key(now),
                            "{deadline:?} {risk:?} {since} {now} {at}"
                        );
                    }
                    if until != Time::MAX {
                        assert_ne!(key(until), key(now), "{deadline:?} {risk:?} {since} {now}");
                        turns += 1;
                    }
                }
            }
        }
        assert!(
            turns >= 10,
            "keys turn in most cases, or this proves little"
        );
    }
}
