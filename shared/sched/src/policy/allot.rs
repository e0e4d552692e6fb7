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
//!   restarts.

use super::{Contender, PendingView, Policy, QueueKey, WhenBlocked};
use crate::model::Time;
use crate::quota::Quotas;

/// Allot's policy; see the module docs.
#[derive(Debug, Clone)]
pub struct Allot {
    /// A victim's expected remaining time must be at least this many times the preemptor's.
    pub preemption_gain: i64,
}

impl Default for Allot {
    fn default() -> Self {
        Self { preemption_gain: 2 }
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
}

impl Policy for Allot {
    fn name(&self) -> &'static str {
        "allot"
    }
    fn key(&self, task: PendingView<'_>, _now: Time) -> QueueKey {
        let remaining = Self::remaining(&task);
        QueueKey(
            remaining.min(i64::MAX as u64) as i64,
            task.submitted as i64,
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
        victim.key > preemptor.key
            && victim.key.0 >= preemptor.key.0.saturating_mul(self.preemption_gain)
    }
    fn parameters(&self) -> String {
        format!(
            "order=expected remaining time (history estimate; attained once past it); \
             preemptive when the victim's is ≥ {}× the preemptor's; no head-of-line blocking",
            self.preemption_gain
        )
    }
}
