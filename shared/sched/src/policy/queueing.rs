//! Queueing baselines beyond strict FIFO: SRTF with true durations, EASY backfill, and
//! Tiresias' discretized two-dimensional least-attained-service.

use super::{Contender, PendingView, Policy, QueueKey, WhenBlocked};
use crate::model::{TaskSpec, Time};
use crate::quota::{Amounts, Quotas};

/// The policies of this module by name.
pub(super) fn by_name(name: &str) -> Option<Box<dyn Policy>> {
    match name {
        "srtf-oracle" => Some(Box::new(SrtfOracle)),
        "fifo-backfill" => Some(Box::new(FifoBackfill)),
        "tiresias" => Some(Box::new(Tiresias::default())),
        "kueue" => Some(Box::new(Kueue)),
        _ => None,
    }
}

/// Shortest remaining time first with true durations, preemptive (Helios' SRTF): at every
/// event running and waiting tasks are ordered by remaining time and the cluster is filled in
/// that order; a waiting task that does not fit preempts running tasks with more remaining.
/// Remaining = true duration − run time so far: the core does not see the simulator's
/// checkpoints, so work lost to a preemption still counts as done when ordering.
#[derive(Debug, Clone, Copy, Default)]
pub struct SrtfOracle;

impl Policy for SrtfOracle {
    fn name(&self) -> &'static str {
        "srtf-oracle"
    }
    fn key(&self, task: PendingView<'_>, _now: Time) -> QueueKey {
        let total = task.spec.oracle_duration.unwrap_or(u64::MAX >> 2);
        let remaining = total.saturating_sub(task.attained);
        QueueKey(remaining as i64, task.submitted as i64, task.seq)
    }
    fn dynamic(&self) -> bool {
        true
    }
    fn when_blocked(&self) -> WhenBlocked {
        WhenBlocked::Continue
    }
    fn preemptive(&self) -> bool {
        true
    }
    fn uses_oracle(&self) -> bool {
        true
    }
    fn parameters(&self) -> String {
        "order=true remaining time (duration − run time so far); preemptive; fills in order".into()
    }
}

/// FIFO with EASY backfill (Lifka 1995; Slurm `sched/backfill`).
#[derive(Debug, Clone, Copy, Default)]
pub struct FifoBackfill;

impl Policy for FifoBackfill {
    fn name(&self) -> &'static str {
        "fifo-backfill"
    }
    fn key(&self, task: PendingView<'_>, _now: Time) -> QueueKey {
        QueueKey(task.submitted as i64, 0, task.seq)
    }
    fn when_blocked(&self) -> WhenBlocked {
        WhenBlocked::Reserve
    }
    fn parameters(&self) -> String {
        "order=submit time; the head reserves its earliest start by running tasks' estimates; \
         later tasks backfill if they do not delay it (by their estimates)"
            .into()
    }
}

/// Tiresias' discretized 2D-LAS (Gu et al., NSDI'19; SymbioticLab/Tiresias `dlas-gpu`):
/// priority = attained service in GPU·seconds; two queues split at 3,600 GPU·s; FIFO by arrival
/// within a queue; a task in a higher queue preempts lower-queue tasks when it cannot
/// otherwise start. The starvation guard is off, as in the repository's default.
#[derive(Debug, Clone)]
pub struct Tiresias {
    /// Queue thresholds in GPU·ms (the simulator's `queue_limit`).
    pub thresholds: Vec<u64>,
}

impl Default for Tiresias {
    fn default() -> Self {
        Self {
            thresholds: vec![3_600 * 1_000],
        }
    }
}

impl Policy for Tiresias {
    fn name(&self) -> &'static str {
        "tiresias"
    }
    fn key(&self, task: PendingView<'_>, _now: Time) -> QueueKey {
        let queue = self
            .thresholds
            .iter()
            .take_while(|limit| task.attained_gpu >= **limit)
            .count();
        QueueKey(queue as i64, task.submitted as i64, task.seq)
    }
    fn dynamic(&self) -> bool {
        true
    }
    fn when_blocked(&self) -> WhenBlocked {
        WhenBlocked::Continue
    }
    fn preemptive(&self) -> bool {
        true
    }
    fn parameters(&self) -> String {
        let limits: Vec<String> = self
            .thresholds
            .iter()
            .map(|t| format!("{} GPU·s", t / 1000))
            .collect();
        format!(
            "{} queues split at [{}] of attained GPU·s; FIFO by arrival within a queue; preemptive; \
             starvation guard off",
            self.thresholds.len() + 1,
            limits.join(", ")
        )
    }
}

/// Kueue ClusterQueues in one cohort (kubernetes-sigs/kueue, `cluster_queue.md`,
/// `preemption.md`): one queue per team with its nominal quota; `BestEffortFIFO` (priority,
/// then creation time; a blocked head does not block others); admission within the team's
/// unused nominal quota or by borrowing the cohort's unused quota (within the borrowing limit,
/// unlimited by default); preemption `withinClusterQueue: LowerPriority`,
/// `reclaimWithinCohort: Any`, `borrowWithinCohort: Never`; best-fit placement after admission.
#[derive(Debug, Clone, Copy, Default)]
pub struct Kueue;

impl Policy for Kueue {
    fn name(&self) -> &'static str {
        "kueue"
    }
    fn key(&self, task: PendingView<'_>, _now: Time) -> QueueKey {
        QueueKey(
            -i64::from(task.spec.priority),
            task.submitted as i64,
            task.seq,
        )
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
    fn may_preempt(
        &self,
        preemptor: Contender<'_>,
        victim: Contender<'_>,
        quotas: &Quotas,
    ) -> bool {
        if preemptor.spec.team == victim.spec.team {
            // withinClusterQueue: LowerPriority
            victim.spec.priority < preemptor.spec.priority
        } else {
            // reclaimWithinCohort: Any — a team entitled to its nominal quota takes it back from
            // teams that borrowed, whatever their priority.
            quotas.within_nominal(&preemptor.spec.team, preemptor.demand)
                && quotas.borrowing(&victim.spec.team)
        }
    }
    fn may_preempt_teammate(
        &self,
        preemptor: Contender<'_>,
        victim_key: QueueKey,
        _victim_lost: Time,
    ) -> Option<bool> {
        // The key's first part is the priority, negated.
        Some(victim_key.0 > preemptor.key.0)
    }
    fn victim_floor(&self, preemptor: Contender<'_>) -> Option<QueueKey> {
        // Task by task (within its own team) only lower priorities: keys past the last of its
        // own priority's.
        Some(QueueKey(preemptor.key.0, i64::MAX, u64::MAX))
    }
    fn class(&self, task: &TaskSpec) -> Option<i64> {
        Some(-i64::from(task.priority))
    }
    fn may_preempt_team(
        &self,
        preemptor: Contender<'_>,
        team: &str,
        quotas: &Quotas,
    ) -> Option<bool> {
        // Across teams the answer is the team's: reclaim from a borrower, or nothing.
        (preemptor.spec.team != team).then(|| {
            quotas.within_nominal(&preemptor.spec.team, preemptor.demand) && quotas.borrowing(team)
        })
    }
    fn preemption_reason(
        &self,
        preemptor: Contender<'_>,
        victim: Contender<'_>,
        _quotas: &Quotas,
    ) -> String {
        if preemptor.spec.team == victim.spec.team {
            format!(
                "kueue: {} of team {} has priority {} over {}",
                preemptor.spec.id,
                preemptor.spec.team,
                preemptor.spec.priority,
                victim.spec.priority
            )
        } else {
            format!(
                "kueue: team {} reclaims its nominal quota from team {}, which borrows",
                preemptor.spec.team, victim.spec.team
            )
        }
    }
    fn parameters(&self) -> String {
        "one ClusterQueue per team (nominal = scenario quota), one cohort, unlimited borrowing; \
         BestEffortFIFO; preemption withinClusterQueue=LowerPriority, reclaimWithinCohort=Any, \
         borrowWithinCohort=Never; best fit"
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TaskSpec;

    /// Kueue's teammate shortcut answers what `may_preempt` answers within a team: a lower
    /// priority may be taken, an equal or higher one not.
    #[test]
    fn kueue_s_teammate_shortcut_agrees_with_may_preempt() {
        let spec = |priority| {
            let mut s = TaskSpec::new(1, "vision", 1);
            s.priority = priority;
            s
        };
        let specs: Vec<TaskSpec> = (-1..=1).map(spec).collect();
        let key = |s: &TaskSpec| {
            let view = PendingView {
                spec: s,
                submitted: 0,
                seq: 0,
                attained: 0,
                attained_gpu: 0,
                estimate: 0,
                estimate_learned: true,
                pending_since: None,
                waited_before_run: None,
                risk: crate::policy::DeadlineRisk::None,
            };
            Kueue.key(view, 0)
        };
        for p in &specs {
            for v in &specs {
                let contender = |s| Contender {
                    spec: s,
                    key: key(s),
                    demand: [1_000, 0, 0],
                    lost: 0,
                };
                let full = Kueue.may_preempt(contender(p), contender(v), &Quotas::default());
                assert_eq!(full, v.priority < p.priority);
                assert_eq!(
                    Kueue.may_preempt_teammate(contender(p), key(v), 0),
                    Some(full)
                );
            }
        }
    }
}
