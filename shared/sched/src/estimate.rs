//! Duration estimates behind one trait: an oracle (true durations, for oracle baselines only)
//! and a history-based online estimator that learns only from tasks that have finished.

use rustc_hash::FxHashMap as HashMap;

use crate::model::{TaskSpec, Time};

/// How much longer a task estimated to run `estimate` in all is expected to run once it has
/// run `ran`: the rest of its estimate or — once past it — as long again as it has run so far.
/// Run times are heavy-tailed: under a Pareto tail of index 1 the median of what is left of a
/// run that outlived its estimate equals what has run.
pub fn remaining(estimate: Time, ran: Time) -> Time {
    if ran < estimate { estimate - ran } else { ran }
}

/// Estimates how long a task runs in all.
pub trait DurationEstimator: Send + std::fmt::Debug {
    /// The estimated total run time of `task`.
    fn estimate(&self, task: &TaskSpec) -> Time;
    /// A task completed after running `ran` in all.
    fn observe(&mut self, task: &TaskSpec, ran: Time);
    /// Whether [`Self::estimate`] of `task` rests on something learned — a prediction, or
    /// tasks that finished — rather than a fixed default that says nothing about the task.
    fn learned(&self, _task: &TaskSpec) -> bool {
        true
    }
    /// Its name, printed with results.
    fn name(&self) -> &'static str;
}

/// The true duration, where the caller knows it (simulation); for oracle baselines only.
#[derive(Debug, Clone, Copy, Default)]
pub struct Oracle;

impl DurationEstimator for Oracle {
    fn estimate(&self, task: &TaskSpec) -> Time {
        task.oracle_duration.unwrap_or(History::DEFAULT)
    }
    fn observe(&mut self, _task: &TaskSpec, _ran: Time) {}
    fn name(&self) -> &'static str {
        "oracle"
    }
}

/// A task's own predicted duration when the predictor gave one; otherwise the mean run time of
/// finished tasks of the same team and GPU count (Helios' QSSF groups jobs the same way),
/// falling back to the team, then to everyone, then to one hour. Only tasks that finished
/// before the question is asked count: no peeking at the future.
#[derive(Debug, Clone, Default)]
pub struct History {
    by_team_gpus: HashMap<String, HashMap<u32, Mean>>,
    by_team: HashMap<String, Mean>,
    all: Mean,
}

#[derive(Debug, Clone, Copy, Default)]
struct Mean {
    sum: u128,
    n: u64,
}

impl Mean {
    fn add(&mut self, v: Time) {
        self.sum += u128::from(v);
        self.n += 1;
    }
    fn get(&self, min_samples: u64) -> Option<Time> {
        (self.n >= min_samples).then(|| (self.sum / u128::from(self.n)) as Time)
    }
}

impl History {
    /// The estimate before anything has finished: one hour.
    pub const DEFAULT: Time = 3_600_000;
}

impl DurationEstimator for History {
    fn estimate(&self, task: &TaskSpec) -> Time {
        if let Some(predicted) = task.predicted_duration {
            return predicted;
        }
        if self.all.n == 0 {
            // Nothing finished yet (all of openb's run): no key to look up.
            return Self::DEFAULT;
        }
        self.by_team_gpus
            .get(&task.team)
            .and_then(|by_gpus| by_gpus.get(&task.gpus))
            .and_then(|m| m.get(3))
            .or_else(|| self.by_team.get(&task.team).and_then(|m| m.get(3)))
            .or_else(|| self.all.get(1))
            .unwrap_or(Self::DEFAULT)
    }
    fn observe(&mut self, task: &TaskSpec, ran: Time) {
        self.by_team_gpus
            .entry(task.team.clone())
            .or_default()
            .entry(task.gpus)
            .or_default()
            .add(ran);
        self.by_team.entry(task.team.clone()).or_default().add(ran);
        self.all.add(ran);
    }
    fn learned(&self, task: &TaskSpec) -> bool {
        task.predicted_duration.is_some() || self.all.n > 0
    }
    fn name(&self) -> &'static str {
        "history(team, gpus)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_learns_per_team_and_gpu_count_and_falls_back_when_it_has_too_few() {
        let mut h = History::default();
        let small = TaskSpec::new(1, "vision", 1);
        let big = TaskSpec::new(2, "vision", 8);
        assert_eq!(h.estimate(&small), History::DEFAULT, "nothing finished yet");
        assert!(!h.learned(&small), "the default is no estimate of the task");
        for ran in [100, 200, 300] {
            h.observe(&small, ran);
        }
        h.observe(&big, 10_000);
        assert_eq!(h.estimate(&small), 200, "three of its kind: their mean");
        assert!(h.learned(&small));
        assert_eq!(
            h.estimate(&big),
            2_650,
            "one of its kind is too few: the team's mean"
        );
        assert_eq!(
            h.estimate(&TaskSpec::new(3, "nlp", 1)),
            2_650,
            "unknown team: everyone's mean"
        );
        let mut predicted = TaskSpec::new(4, "vision", 1);
        predicted.predicted_duration = Some(42);
        assert_eq!(h.estimate(&predicted), 42, "the predictor's word first");
    }
}
