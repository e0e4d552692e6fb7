//! Recent history per key: the runs that finished last and the submissions made last.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;

use crate::Millis;

/// What is known of a task when it is submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Its team (Philly: the virtual cluster).
    pub team: String,
    /// Its identity across runs where the spec gives one (workload and task name, command):
    /// the same task submitted again. `None` where the history has no names (Philly).
    pub identity: Option<String>,
    /// GPUs asked for (0: CPU only).
    pub gpus: u32,
    /// Share of each GPU, milli-GPU (1000: whole GPUs).
    pub gpu_milli: u32,
    /// When it was submitted.
    pub submit_ms: Millis,
    /// The spec's `durationEstimate`, if it declared one.
    pub declared_ms: Option<Millis>,
}

/// How many finished runs and submissions are kept per key.
pub(crate) const KEPT: usize = 64;
/// Submissions closer than this to the previous one of their key belong to its burst (a sweep,
/// a resubmission).
pub(crate) const BURST_GAP_MS: Millis = 300_000;

/// The keys statistics are kept under, most specific first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    /// The same task submitted again.
    Identity(String),
    /// The team's tasks of this GPU count.
    TeamGpus(String, u32),
    /// The team's tasks.
    Team(String),
    /// Everyone's.
    Global,
}

/// One submission of a key, and its run time once it finished.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Submission {
    pub id: u64,
    pub submit_ms: Millis,
    pub duration_ms: Option<Millis>,
}

/// Recent history of one key.
#[derive(Debug, Clone, Default)]
pub(crate) struct Recent {
    /// Run times of the last runs that finished, oldest first.
    pub finished: VecDeque<Millis>,
    /// How many runs finished in all.
    pub finished_total: u64,
    /// The last submissions, oldest first.
    pub submissions: VecDeque<Submission>,
}

impl Recent {
    /// The median of the last `k` finished runs; `None` before `min` have finished.
    pub fn median(&self, k: usize, min: usize) -> Option<f64> {
        self.quantile(k, min, 0.5)
    }

    /// The `q` quantile (linear interpolation) of the last `k` finished runs.
    pub fn quantile(&self, k: usize, min: usize, q: f64) -> Option<f64> {
        let n = self.finished.len().min(k);
        if n == 0 || n < min {
            return None;
        }
        let mut last: Vec<f64> = self
            .finished
            .iter()
            .rev()
            .take(n)
            .map(|&d| d as f64)
            .collect();
        Some(quantile_of(&mut last, q))
    }
}

/// The `q` quantile of `values` (reordered in place), by linear interpolation between the two
/// order statistics around it. Found by selection, not a sort: learning takes the median error
/// of every candidate ensemble over tens of thousands of runs.
pub(crate) fn quantile_of(values: &mut [f64], q: f64) -> f64 {
    let at = (values.len() - 1) as f64 * q.clamp(0.0, 1.0);
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    let (_, &mut low, above) = values.select_nth_unstable_by(lo, f64::total_cmp);
    // Everything after `lo` is at least as large: the next order statistic is their least.
    let high = if hi == lo {
        low
    } else {
        above
            .iter()
            .copied()
            .min_by(f64::total_cmp)
            .expect("hi is within the values")
    };
    low + (high - low) * (at - lo as f64)
}

/// Recent history under every key, as submissions and finishes arrive in time order.
#[derive(Debug, Clone, Default)]
pub struct Recency {
    pub(crate) keys: HashMap<Key, Recent>,
}

impl Recency {
    /// The keys `job` counts under.
    pub(crate) fn keys_of(job: &Job) -> Vec<Key> {
        let mut keys = Vec::with_capacity(4);
        if let Some(identity) = &job.identity {
            keys.push(Key::Identity(identity.clone()));
        }
        keys.push(Key::TeamGpus(job.team.clone(), job.gpus));
        keys.push(Key::Team(job.team.clone()));
        keys.push(Key::Global);
        keys
    }

    /// Task `id` was submitted (call in time order, before asking for its features is fine:
    /// a task is not its own burst sibling).
    pub fn submitted(&mut self, id: u64, job: &Job) {
        for key in Self::keys_of(job) {
            let recent = self.keys.entry(key).or_default();
            if recent.submissions.len() == KEPT {
                recent.submissions.pop_front();
            }
            recent.submissions.push_back(Submission {
                id,
                submit_ms: job.submit_ms,
                duration_ms: None,
            });
        }
    }

    /// Task `id` finished after running `duration_ms`.
    pub fn finished(&mut self, id: u64, job: &Job, duration_ms: Millis) {
        for key in Self::keys_of(job) {
            let recent = self.keys.entry(key).or_default();
            if recent.finished.len() == KEPT {
                recent.finished.pop_front();
            }
            recent.finished.push_back(duration_ms.max(1));
            recent.finished_total += 1;
            if let Some(s) = recent.submissions.iter_mut().rev().find(|s| s.id == id) {
                s.duration_ms = Some(duration_ms.max(1));
            }
        }
    }

    /// The history of `key`, if any.
    pub(crate) fn get(&self, key: &Key) -> Option<&Recent> {
        self.keys.get(key)
    }
}
