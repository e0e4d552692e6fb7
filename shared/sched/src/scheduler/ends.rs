//! The running tasks by when they are expected to end, kept as tasks start and stop.
//!
//! Whether a relocation is worth it turns on whether the unit it is for would fit anyway
//! once the tasks expected to end within the move's cost have ended
//! ([`Scheduler::fits_by`]). Finding those tasks used to read every task in the table (on
//! openb, some 800 questions each read 11,000 tasks, most of them to learn that they end
//! later). A running task is expected to end ([`Scheduler::expected_end`]) when its estimate
//! says while it runs within it — at a time fixed by when it started, what it had attained and
//! the estimate — and, once past it, after as long again as it has run, which counts from the
//! time its run would have begun had it never been stopped. Kept here in both orders, the
//! tasks that end by a time are the few at the front of one and the back of the other.
//!
//! Estimates change as the estimator learns: any input but a submission or a pass may change
//! them ([`Ends::forget`]). The first question after that reads the task table as before; a
//! second before the next change lists every running task afresh (where such inputs come
//! between most questions, a list would be work thrown away).
//!
//! [`Scheduler::fits_by`]: super::Scheduler::fits_by
//! [`Scheduler::expected_end`]: super::Scheduler::expected_end

use std::collections::BTreeSet;

use rustc_hash::FxHashMap as HashMap;

use crate::model::{TaskId, Time};

/// The running tasks by when they are expected to end (see the module's docs).
#[derive(Debug, Clone, Default)]
pub(super) struct Ends {
    /// Per running task: the end its estimate gives (`since` + estimate − attained).
    by_estimate: BTreeSet<(Time, TaskId)>,
    /// Per running task: when its run would have begun had it never been stopped (`since` −
    /// attained); past its estimate, it has run `now` − that.
    by_origin: BTreeSet<(Time, TaskId)>,
    /// Each task's two times, to find its entries.
    of: HashMap<TaskId, (Time, Time)>,
    /// Estimates may have changed: listed afresh before it is asked.
    stale: bool,
    /// Asked once since it went stale.
    asked: bool,
}

impl Ends {
    /// Lists nothing, and is to be listed afresh before it is asked.
    pub fn new() -> Self {
        Self {
            stale: true,
            ..Self::default()
        }
    }

    /// Estimates may have changed since the tasks were entered.
    pub fn forget(&mut self) {
        self.stale = true;
        self.asked = false;
    }

    /// Whether it was asked for already since it went stale (then it is worth listing);
    /// counts this time.
    pub fn asked_stale(&mut self) -> bool {
        std::mem::replace(&mut self.asked, true)
    }

    /// Whether it must be listed afresh ([`Self::list`]) before it is asked.
    pub fn stale(&self) -> bool {
        self.stale
    }

    /// Lists `running` afresh: (task, since, attained, estimate) of every running task.
    pub fn list(&mut self, running: impl Iterator<Item = (TaskId, Time, Time, Time)>) {
        self.by_estimate.clear();
        self.by_origin.clear();
        self.of.clear();
        self.stale = false;
        for (id, since, attained, estimate) in running {
            self.enter(id, since, attained, estimate);
        }
    }

    /// Task `id` started at `since`, having attained `attained` before, estimated to run
    /// `estimate` in all.
    pub fn enter(&mut self, id: TaskId, since: Time, attained: Time, estimate: Time) {
        if self.stale {
            return;
        }
        let origin = since.saturating_sub(attained);
        let end = origin.saturating_add(estimate);
        self.by_estimate.insert((end, id));
        self.by_origin.insert((origin, id));
        self.of.insert(id, (end, origin));
    }

    /// Task `id` stopped, if it was running.
    pub fn remove(&mut self, id: TaskId) {
        if let Some((end, origin)) = self.of.remove(&id) {
            self.by_estimate.remove(&(end, id));
            self.by_origin.remove(&(origin, id));
        }
    }

    /// The running tasks expected at `now` to end by `by`, in no order (none ends by `now`).
    pub fn ending_by(&self, now: Time, by: Time) -> Vec<TaskId> {
        debug_assert!(!self.stale, "asked before it was listed afresh");
        if by <= now {
            return Vec::new();
        }
        // Within its estimate (its estimate's end is later than now), it ends then.
        let within = self
            .by_estimate
            .range((now.saturating_add(1), TaskId(0))..=(by, TaskId(u64::MAX)))
            .map(|(_, id)| *id);
        // Past it, it ends after as long again as it has run (at least 1 ms from now): those
        // that have run no longer than `by` − `now`.
        let most = by - now;
        let past = self
            .by_origin
            .range((now.saturating_sub(most), TaskId(0))..)
            .filter(move |(origin, id)| {
                self.of[id].0 <= now && now.saturating_sub(*origin).max(1) <= most
            })
            .map(|(_, id)| *id);
        within.chain(past).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task's expected end at `now`, as the scheduler works it out.
    fn expected_end(since: Time, attained: Time, estimate: Time, now: Time) -> Time {
        let ran = attained + (now - since);
        let left = crate::estimate::remaining(estimate, ran);
        (now + left).max(now + 1)
    }

    #[test]
    fn the_tasks_ending_by_a_time_are_those_the_estimates_say() {
        // (since, attained, estimate): within the estimate, just past it, long past it, one
        // that started now, one with an estimate of nothing, one restarted after a run.
        let tasks: Vec<(Time, Time, Time)> = vec![
            (9_000, 0, 2_000),
            (9_000, 0, 1_000),
            (2_000, 0, 1_000),
            (10_000, 0, 5_000),
            (10_000, 0, 0),
            (8_000, 3_000, 4_000),
            (9_500, 0, 600),
        ];
        let mut ends = Ends::new();
        ends.list(
            tasks
                .iter()
                .enumerate()
                .map(|(i, (s, a, e))| (TaskId(i as u64), *s, *a, *e)),
        );
        for now in [10_000, 10_400, 12_000] {
            for by in [now + 1, now + 500, now + 1_000, now + 2_000, now + 20_000] {
                let mut got: Vec<u64> = ends.ending_by(now, by).iter().map(|id| id.0).collect();
                got.sort_unstable();
                let want: Vec<u64> = (0..tasks.len() as u64)
                    .filter(|i| {
                        let (s, a, e) = tasks[*i as usize];
                        s <= now && expected_end(s, a, e, now) <= by
                    })
                    .collect();
                assert_eq!(got, want, "now {now}, by {by}");
            }
        }
        // A stopped task ends nowhere; one entered later does.
        ends.remove(TaskId(1));
        ends.enter(TaskId(9), 10_000, 0, 300);
        let mut got: Vec<u64> = ends
            .ending_by(10_000, 11_000)
            .iter()
            .map(|id| id.0)
            .collect();
        got.sort_unstable();
        assert_eq!(got, [0, 4, 6, 9]);
        assert!(ends.ending_by(10_000, 10_000).is_empty());
    }

    #[test]
    fn entries_wait_for_a_fresh_list_once_estimates_may_have_changed() {
        let mut ends = Ends::new();
        assert!(ends.stale());
        assert!(!ends.asked_stale());
        assert!(ends.asked_stale());
        ends.list(std::iter::once((TaskId(1), 0, 0, 1_000)));
        assert_eq!(ends.ending_by(0, 1_000), [TaskId(1)]);
        ends.forget();
        assert!(ends.stale());
        assert!(!ends.asked_stale());
        ends.enter(TaskId(2), 0, 0, 500);
        ends.list(std::iter::once((TaskId(1), 0, 0, 2_000)));
        assert!(ends.ending_by(0, 1_000).is_empty());
    }
}
