//! A chronological evaluation: replay a history in time order, train the predictor on what
//! finished before a split time, and score every job submitted after it — the predictor
//! against the baselines, each seeing only what had finished when the job was submitted.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Instant;

use rustc_hash::FxHashMap as HashMap;
use serde::Serialize;

use crate::recency::{Job, Key, quantile_of};
use crate::{Millis, Predictor, TrainParams};

/// One job of the history: what was known at submission, and how long it really ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalJob {
    /// The job as submitted.
    pub job: Job,
    /// Its true run time, ms.
    pub duration_ms: Millis,
}

/// How well one predictor did on the test jobs. Errors are in natural-log units:
/// |ln predicted − ln true|.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metrics {
    /// Median absolute log error.
    pub mdale: f64,
    /// Share of predictions within a factor of 2 of the truth.
    pub within_2x: f64,
    /// 90th percentile of the absolute log error.
    pub p90_ale: f64,
    /// Spearman rank correlation of predicted and true run times.
    pub spearman: f64,
    /// Share of true run times inside the predicted 10–90% interval (predictors that give one).
    pub coverage_p10_p90: Option<f64>,
}

/// The evaluation's result, as `allot predict eval --json` writes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Jobs submitted before the split.
    pub train_jobs: usize,
    /// Jobs submitted at or after it, each scored.
    pub test_jobs: usize,
    /// Finished runs the first model learned from (the newest of those that ended before the
    /// split, up to its window).
    pub trained_on: usize,
    /// Seconds the training took.
    pub train_seconds: f64,
    /// Retrainings during the test period, as new runs finished (each on finished runs only).
    pub retrains: usize,
    /// Mean time of one prediction (features and model), µs.
    pub predict_us: f64,
    /// Each predictor's metrics, by name.
    pub predictors: BTreeMap<String, Metrics>,
}

/// The name of the shipped predictor in the report.
pub const ALLOT: &str = "allot";
/// The median of everything that finished.
pub const GLOBAL_MEDIAN: &str = "global-median";
/// The median of everything of the team and GPU count that finished (then the team's, then
/// everyone's).
pub const TEAM_GPUS_MEDIAN: &str = "team-gpus-median";
/// The median of the last ten of the team and GPU count that finished (then the team's, then
/// everyone's).
pub const TEAM_GPUS_LAST10: &str = "team-gpus-last10";

/// One prediction as scored: the point estimate and, if the predictor gives one, its 10–90%
/// interval, ms.
pub type Scored = (f64, Option<(f64, f64)>);

/// Replays `jobs` (any order) and scores every job submitted at or after `split_ms`.
pub fn evaluate(jobs: &[EvalJob], split_ms: Millis, params: TrainParams) -> Report {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| (jobs[i].job.submit_ms, i));
    // Finishes, earliest first.
    let mut finishes: BinaryHeap<Reverse<(Millis, usize)>> = BinaryHeap::new();

    let mut predictor = Predictor::new(params);
    let mut global = RunningMedian::default();
    let mut by_team_gpus: HashMap<(String, u32), RunningMedian> = HashMap::default();
    let mut by_team: HashMap<String, RunningMedian> = HashMap::default();

    let mut scored: BTreeMap<&'static str, Vec<Scored>> = BTreeMap::new();
    let mut truth = Vec::new();
    let (mut train_jobs, mut trained_on, mut train_seconds) = (0, 0, 0.0);
    let mut trained = false;
    let mut predict_time = 0.0;
    let mut retrains = 0;

    for &i in &order {
        let EvalJob { job, duration_ms } = &jobs[i];
        let now = job.submit_ms;
        while let Some(&Reverse((at, j))) = finishes.peek() {
            if at > now {
                break;
            }
            finishes.pop();
            let done = &jobs[j];
            predictor.finished(j as u64, &done.job, done.duration_ms);
            let d = done.duration_ms.max(1) as f64;
            global.push(d);
            by_team_gpus
                .entry((done.job.team.clone(), done.job.gpus))
                .or_default()
                .push(d);
            by_team.entry(done.job.team.clone()).or_default().push(d);
        }
        if now < split_ms {
            train_jobs += 1;
            predictor.submitted(i as u64, job);
        } else {
            if !trained {
                trained = true;
                let started = Instant::now();
                predictor.retrain();
                train_seconds = started.elapsed().as_secs_f64();
                trained_on = predictor.model().map_or(0, |m| m.trained_on);
            } else if predictor.retrain_due() {
                // As the service does: retrain on what finished since, never on the future.
                predictor.retrain();
                retrains += 1;
            }
            // The last-ten baselines read the history the predictor holds, before this job's
            // own submission is recorded in it (a submission moves no finished statistic).
            let recency = predictor.recency();
            let fallback = global.median().unwrap_or(3_600_000.0);
            let team = by_team.get(&job.team).and_then(RunningMedian::median);
            let team_last10 = recency
                .get(&Key::Team(job.team.clone()))
                .and_then(|r| r.median(10, 1));
            let tg = recency
                .get(&Key::TeamGpus(job.team.clone(), job.gpus))
                .and_then(|r| r.median(10, 1));
            let started = Instant::now();
            let p = predictor.submitted(i as u64, job);
            predict_time += started.elapsed().as_secs_f64();
            let tg_all = by_team_gpus
                .get(&(job.team.clone(), job.gpus))
                .and_then(RunningMedian::median);
            let interval = Some((p.p10_ms as f64, p.p90_ms as f64));
            let entries: [(&'static str, Scored); 4] = [
                (ALLOT, (p.point_ms as f64, interval)),
                (GLOBAL_MEDIAN, (fallback, None)),
                (
                    TEAM_GPUS_MEDIAN,
                    (tg_all.or(team).unwrap_or(fallback), None),
                ),
                (
                    TEAM_GPUS_LAST10,
                    (tg.or(team_last10).unwrap_or(fallback), None),
                ),
            ];
            for (name, prediction) in entries {
                scored.entry(name).or_default().push(prediction);
            }
            truth.push((*duration_ms).max(1) as f64);
        }
        finishes.push(Reverse((now + duration_ms, i)));
    }
    let test_jobs = truth.len();
    let predictors = scored
        .into_iter()
        .map(|(name, predictions)| (name.to_owned(), metrics(&predictions, &truth)))
        .collect();
    Report {
        train_jobs,
        test_jobs,
        trained_on,
        train_seconds,
        retrains,
        predict_us: if test_jobs == 0 {
            0.0
        } else {
            predict_time / test_jobs as f64 * 1e6
        },
        predictors,
    }
}

/// The metrics of `predictions` (point, optional 10–90% interval) against `truth`.
pub fn metrics(predictions: &[Scored], truth: &[f64]) -> Metrics {
    let n = truth.len().max(1) as f64;
    let mut ale: Vec<f64> = predictions
        .iter()
        .zip(truth)
        .map(|((p, _), t)| (p.max(1.0).ln() - t.max(1.0).ln()).abs())
        .collect();
    let within_2x = ale.iter().filter(|&&e| e < std::f64::consts::LN_2).count() as f64 / n;
    let (mdale, p90_ale) = if ale.is_empty() {
        (f64::NAN, f64::NAN)
    } else {
        (quantile_of(&mut ale, 0.5), quantile_of(&mut ale, 0.9))
    };
    let coverage = predictions.iter().all(|(_, i)| i.is_some()).then(|| {
        predictions
            .iter()
            .zip(truth)
            .filter(|((_, i), t)| i.is_some_and(|(lo, hi)| lo <= **t && **t <= hi))
            .count() as f64
            / n
    });
    let points: Vec<f64> = predictions.iter().map(|(p, _)| *p).collect();
    Metrics {
        mdale,
        within_2x,
        p90_ale,
        spearman: spearman(&points, truth),
        coverage_p10_p90: coverage,
    }
}

/// Spearman's rank correlation (ties get their mean rank).
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    if n < 2.0 {
        return f64::NAN;
    }
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let (mut cov, mut va, mut vb) = (0.0, 0.0, 0.0);
    for (x, y) in ra.iter().zip(&rb) {
        cov += (x - ma) * (y - mb);
        va += (x - ma).powi(2);
        vb += (y - mb).powi(2);
    }
    cov / (va.sqrt() * vb.sqrt())
}

fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&i, &j| v[i].total_cmp(&v[j]));
    let mut ranks = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let mean = (i + j) as f64 / 2.0;
        for &k in &idx[i..=j] {
            ranks[k] = mean;
        }
        i = j + 1;
    }
    ranks
}

/// The median of a growing set: two heaps, O(log n) per value.
#[derive(Debug, Clone, Default)]
struct RunningMedian {
    /// The lower half, largest on top.
    low: BinaryHeap<Ordered>,
    /// The upper half, smallest on top.
    high: BinaryHeap<Reverse<Ordered>>,
}

/// An `f64` with a total order, for the heaps.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ordered(f64);

impl Eq for Ordered {}
impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl RunningMedian {
    fn push(&mut self, v: f64) {
        if self.low.peek().is_none_or(|top| v <= top.0) {
            self.low.push(Ordered(v));
        } else {
            self.high.push(Reverse(Ordered(v)));
        }
        if self.low.len() > self.high.len() + 1 {
            let moved = self.low.pop().expect("low is not empty");
            self.high.push(Reverse(moved));
        } else if self.high.len() > self.low.len() {
            let Reverse(moved) = self.high.pop().expect("high is not empty");
            self.low.push(moved);
        }
    }

    fn median(&self) -> Option<f64> {
        let low = self.low.peek()?.0;
        Some(if self.low.len() > self.high.len() {
            low
        } else {
            (low + self.high.peek().map_or(low, |h| h.0.0)) / 2.0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_median_is_the_median_of_everything_pushed() {
        let mut m = RunningMedian::default();
        assert_eq!(m.median(), None);
        let mut seen = Vec::new();
        for v in [5.0, 1.0, 9.0, 3.0, 3.0, 12.0, 0.5, 7.0] {
            m.push(v);
            seen.push(v);
            assert_eq!(
                m.median(),
                Some(quantile_of(&mut seen.clone(), 0.5)),
                "{seen:?}"
            );
        }
    }

    #[test]
    fn spearman_is_one_for_the_same_order_and_minus_one_for_the_reverse() {
        let a = [1.0, 2.0, 3.0, 4.0];
        assert!((spearman(&a, &[10.0, 20.0, 30.0, 40.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&a, &[4.0, 3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
    }
}
