//! `allot`: Allot's own policy. One configuration for every scenario — nothing here is tuned to
//! a trace.
//!
//! Shortest *estimated* remaining time first (the rule that minimises mean completion time),
//! preemptive, never head-of-line blocked:
//! - the estimate comes from the history estimator (finished tasks of the same team and GPU
//!   count — no oracle);
//! - a task that has outlived its estimate is treated as heavy-tailed: its expected remaining
//!   time is taken to be what it has run so far (the least-attained-service rule), so a long
//!   job that was mispredicted as short cannot hold the cluster;
//! - preemption must pay for itself: a running task is preempted only for one whose expected
//!   remaining time is at most half its own, which bounds the work lost to checkpoint gaps and
//!   restarts — and only when both expectations rest on something learned. Before any task has
//!   finished (and without a prediction) the estimate is a fixed default that says nothing about
//!   either task, so comparing them cannot show a gain: the task waits instead. Without this, a
//!   cluster where nothing has finished yet keeps trading running tasks for newcomers that are
//!   no shorter, and every trade loses their work and can strand capacity.
//!
//! Placement is fragmentation-aware: Fragmentation Gradient Descent ([`Fgd`], Weng et al.,
//! ATC'23) under the host-aware measure ([`Measure::HostAware`]) — a node's GPUs count as usable
//! for a task shape only as far as its free CPU and memory can still accompany them, so tasks do
//! not leave GPUs stranded behind exhausted CPU or memory.

use super::packing::{Fgd, Measure};
use super::{Contender, PendingView, Policy, QueueKey, WhenBlocked};
use crate::cluster::{Cluster, Placement};
use crate::model::{TaskSpec, Time};
use crate::quota::Quotas;

/// Set in the second field of a key (the submit time) when the task's estimate is the
/// estimator's default rather than learned: among equal expected remaining times, learned
/// estimates go first, and [`Allot::may_preempt`] reads it.
const UNLEARNED: i64 = 1 << 62;

/// Allot's policy; see the module docs.
#[derive(Debug, Clone)]
pub struct Allot {
    /// A victim's expected remaining time must be at least this many times the preemptor's.
    pub preemption_gain: i64,
    /// Where tasks go: FGD under the host-aware measure, learning task shapes as they arrive.
    placer: Fgd,
}

impl Default for Allot {
    fn default() -> Self {
        Self {
            preemption_gain: 2,
            placer: Fgd::with_measure(Measure::HostAware),
        }
    }
}

impl Allot {
    /// Expected remaining run time, ms.
    fn remaining(task: &PendingView<'_>) -> Time {
        if task.attained < task.estimate {
            task.estimate - task.attained
        } else {
            task.attained.max(1)
        }
    }

    /// Whether the key's expected remaining time rests on a learned estimate.
    fn learned(key: QueueKey) -> bool {
        key.1 & UNLEARNED == 0
    }
}

impl Policy for Allot {
    fn name(&self) -> &'static str {
        "allot"
    }
    fn key(&self, task: PendingView<'_>, _now: Time) -> QueueKey {
        let remaining = Self::remaining(&task);
        let unlearned = if task.estimate_learned { 0 } else { UNLEARNED };
        QueueKey(
            remaining.min(i64::MAX as u64) as i64,
            task.submitted.min(UNLEARNED as u64 - 1) as i64 | unlearned,
            task.seq,
        )
    }
    fn dynamic(&self) -> bool {
        true
    }
    fn needs_estimates(&self) -> bool {
        true
    }
    fn when_blocked(&self) -> WhenBlocked {
        WhenBlocked::Continue
    }
    fn preemptive(&self) -> bool {
        true
    }
    fn may_preempt(
        &self,
        preemptor: Contender<'_>,
        victim: Contender<'_>,
        _quotas: &Quotas,
    ) -> bool {
        Self::learned(preemptor.key)
            && Self::learned(victim.key)
            && victim.key > preemptor.key
            && victim.key.0 >= preemptor.key.0.saturating_mul(self.preemption_gain)
    }
    fn place(&self, cluster: &Cluster, task: &TaskSpec) -> Option<Placement> {
        self.placer.place(cluster, task)
    }
    fn observe_submitted(&mut self, task: &TaskSpec) {
        self.placer.observe_submitted(task);
    }
    fn parameters(&self) -> String {
        format!(
            "order=expected remaining time (history estimate; attained once past it); \
             preemptive when the victim's is ≥ {}× the preemptor's and both estimates are \
             learned; no head-of-line blocking; placement=FGD, host-aware (GPUs count as usable \
             only as far as free CPU and memory can feed them)",
            self.preemption_gain
        )
    }
}
