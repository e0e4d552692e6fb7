//! What the model sees of a task at submission: recency statistics of its keys, the burst it
//! arrived in, what it asked for and the calendar. Durations enter as natural logs.

use std::hash::BuildHasher;

use rustc_hash::FxBuildHasher;

use crate::Millis;
use crate::predictor::Basis;
use crate::recency::{BURST_GAP_MS, Job, Key, Recency, Recent, quantile_of};

/// The estimate before anything has finished: one hour.
pub(crate) const DEFAULT_MS: f64 = 3_600_000.0;
/// Runs shorter than this are the fast-failure mode of the duration distribution.
const SHORT_MS: f64 = 60_000.0;
/// Submissions looked at for the censored (Kaplan–Meier) median.
const KM_WINDOW: usize = 40;

/// The names of [`Features::values`], in order (for reports and feature importances).
pub const FEATURE_NAMES: [&str; 19] = [
    "ln_base",
    "team_gpus_last3",
    "team_gpus_last5_by_submission",
    "team_gpus_km_median",
    "team_gpus_p10",
    "team_gpus_p90",
    "team_gpus_short_share",
    "ln_gap_s",
    "ln_burst",
    "ln_running",
    "burst_finished_median",
    "ln_burst_finished",
    "log2_gpus",
    "team_last10",
    "declared",
    "has_declared",
    "identity_last5",
    "team_gpus_densest_recent",
    "team_gpus_densest_all",
];

/// A task's features at submission.
#[derive(Debug, Clone, PartialEq)]
pub struct Features {
    /// The model's inputs, named by [`FEATURE_NAMES`].
    pub values: [f64; FEATURE_NAMES.len()],
    /// The recency estimate the model corrects, ms.
    pub base_ms: f64,
    /// Where that estimate came from.
    pub basis: Basis,
    /// Its team, hashed: the model may learn which statistics to trust per team.
    pub group: u64,
}

impl Features {
    /// `job`'s features at `now_ms`, from what `recency` holds (call before recording the
    /// job's own submission).
    pub fn of(job: &Job, recency: &Recency, now_ms: Millis) -> Features {
        let empty = Recent::default();
        let get = |key: Key| recency.get(&key).unwrap_or(&empty);
        let identity = job.identity.clone().map(|i| get(Key::Identity(i)));
        let team_gpus = get(Key::TeamGpus(job.team.clone(), job.gpus));
        let team = get(Key::Team(job.team.clone()));
        let global = get(Key::Global);

        let (base_ms, basis) = identity
            .and_then(|r| r.median(5, 2))
            .map(|m| (m, Basis::Identity))
            .or_else(|| team_gpus.median(10, 1).map(|m| (m, Basis::TeamGpus)))
            .or_else(|| job.declared_ms.map(|d| (d as f64, Basis::Declared)))
            .or_else(|| team.median(10, 1).map(|m| (m, Basis::Team)))
            .or_else(|| global.median(100, 1).map(|m| (m, Basis::Global)))
            .unwrap_or((DEFAULT_MS, Basis::Default));
        let base_ms = base_ms.max(1.0);
        let ln_base = base_ms.ln();
        // Other statistics relative to the base: the model corrects the base, and ratios are
        // far more alike from one month to the next than the durations themselves.
        let rel = |v: Option<f64>| v.map_or(0.0, |v| v.max(1.0).ln() - ln_base);

        let mut by_submission: Vec<f64> = team_gpus
            .submissions
            .iter()
            .rev()
            .filter_map(|s| s.duration_ms)
            .take(5)
            .map(|d| d as f64)
            .collect();
        let last10: Vec<f64> = team_gpus
            .finished
            .iter()
            .rev()
            .take(10)
            .map(|&d| d as f64)
            .collect();
        let short_share = if last10.is_empty() {
            0.0
        } else {
            last10.iter().filter(|&&d| d < SHORT_MS).count() as f64 / last10.len() as f64
        };

        // The burst: the chain of submissions of the key, each within BURST_GAP_MS of the next.
        let mut burst = Vec::new();
        let mut after = now_ms;
        for s in team_gpus.submissions.iter().rev() {
            if after.saturating_sub(s.submit_ms) >= BURST_GAP_MS {
                break;
            }
            burst.push(*s);
            after = s.submit_ms;
        }
        let mut burst_finished: Vec<f64> = burst
            .iter()
            .filter_map(|s| s.duration_ms)
            .map(|d| d as f64)
            .collect();
        let burst_median =
            (!burst_finished.is_empty()).then(|| quantile_of(&mut burst_finished, 0.5));
        let gap_s = team_gpus
            .submissions
            .back()
            .map_or(1e7, |s| now_ms.saturating_sub(s.submit_ms) as f64 / 1000.0);
        let running = team_gpus
            .submissions
            .iter()
            .filter(|s| s.duration_ms.is_none())
            .count();

        let newest: Vec<Millis> = team_gpus.finished.iter().rev().copied().collect();

        let gpus = f64::from(job.gpus.max(1)) * f64::from(job.gpu_milli.clamp(1, 1000)) / 1000.0;

        let values = [
            ln_base,
            rel(team_gpus.median(3, 1)),
            rel((!by_submission.is_empty()).then(|| quantile_of(&mut by_submission, 0.5))),
            rel(km_median(team_gpus, now_ms, base_ms)),
            rel(team_gpus.quantile(10, 1, 0.1)),
            rel(team_gpus.quantile(10, 1, 0.9)),
            short_share,
            (1.0 + gap_s).ln(),
            (1.0 + burst.len() as f64).ln(),
            (1.0 + running as f64).ln(),
            rel(burst_median),
            (1.0 + burst_finished.len() as f64).ln(),
            gpus.log2(),
            rel(team.median(10, 1)),
            rel(job.declared_ms.map(|d| d as f64)),
            f64::from(u8::from(job.declared_ms.is_some())),
            rel(identity.and_then(|r| r.median(5, 1))),
            rel(bagged_mode(&newest, &[20, 30, 40], &[0.95, 1.0])),
            rel(bagged_mode(&newest, &[40, 64], &[0.98, 1.0])),
        ];
        Features {
            values,
            base_ms,
            basis,
            group: FxBuildHasher.hash_one(job.team.as_str()),
        }
    }
}

/// The Kaplan–Meier median run time of the key's last submissions at `now`: finished ones are
/// events, those still running are censored at the time they have run so far. When more than
/// half are still running, the median is beyond every event: the median time they have run so
/// far, or `base` if that is larger, stands in.
fn km_median(recent: &Recent, now: Millis, base: f64) -> Option<f64> {
    let mut obs: Vec<(f64, bool)> = recent
        .submissions
        .iter()
        .rev()
        .take(KM_WINDOW)
        .map(|s| match s.duration_ms {
            Some(d) => (d as f64, true),
            None => (now.saturating_sub(s.submit_ms).max(1) as f64, false),
        })
        .collect();
    if obs.is_empty() {
        return None;
    }
    obs.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
    let n = obs.len();
    let mut survival = 1.0;
    let mut i = 0;
    while i < n {
        let t = obs[i].0;
        let at_risk = (n - i) as f64;
        let mut events = 0.0;
        while i < n && obs[i].0 == t {
            if obs[i].1 {
                events += 1.0;
            }
            i += 1;
        }
        if events > 0.0 {
            survival *= 1.0 - events / at_risk;
            if survival <= 0.5 {
                return Some(t);
            }
        }
    }
    let mut censored: Vec<f64> = obs.iter().filter(|o| !o.1).map(|o| o.0).collect();
    Some(if censored.is_empty() {
        base
    } else {
        quantile_of(&mut censored, 0.5).max(base)
    })
}

/// Half-widths (natural-log units) of the windows the densest cluster is sought with: ±0.5
/// (1.65×) and ±ln 2 (2×), about as wide as the errors the metrics count as close.
const MODE_HALF_WIDTHS: [f64; 2] = [0.5, std::f64::consts::LN_2];

/// The median, in log space, of [`dense_mode`] over the last `ks` runs of `newest_first`, each
/// half-width of [`MODE_HALF_WIDTHS`] and each recency decay of `decays`: no single window is
/// trusted, since which one does best moves from month to month (docs/benchmarks.md).
fn bagged_mode(newest_first: &[Millis], ks: &[usize], decays: &[f64]) -> Option<f64> {
    let mut modes = Vec::with_capacity(ks.len() * MODE_HALF_WIDTHS.len() * decays.len());
    for &k in ks {
        let runs = &newest_first[..k.min(newest_first.len())];
        for half_width in MODE_HALF_WIDTHS {
            for &decay in decays {
                modes.extend(dense_mode(runs, half_width, decay).map(f64::ln));
            }
        }
    }
    (!modes.is_empty()).then(|| quantile_of(&mut modes, 0.5).exp())
}

/// The densest cluster of `newest_first` runs, in log space: the run time whose window
/// [ln d, ln d + 2 × `half_width`] holds the most weight, each run weighing `decay^age` (age 0:
/// the newest); the weighted median of that window. Where run times are bimodal (fast failures
/// and real runs), the median of them lands between the modes and is close to neither; this
/// lands on one of them.
fn dense_mode(newest_first: &[Millis], half_width: f64, decay: f64) -> Option<f64> {
    let mut runs: Vec<(f64, f64)> = Vec::with_capacity(newest_first.len());
    let mut w = 1.0;
    for &d in newest_first {
        runs.push(((d.max(1) as f64).ln(), w));
        w *= decay;
    }
    let n = runs.len();
    if n == 0 {
        return None;
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Windows [ln d_a, ln d_a + 2 × half_width], two pointers over the sorted runs.
    let (mut best, mut best_weight) = ((0, 0), f64::NEG_INFINITY);
    let (mut end, mut weight) = (0, 0.0);
    for start in 0..n {
        while end < n && runs[end].0 <= runs[start].0 + 2.0 * half_width {
            weight += runs[end].1;
            end += 1;
        }
        if weight > best_weight + 1e-12 {
            (best, best_weight) = ((start, end), weight);
        }
        weight -= runs[start].1;
    }
    let window = &runs[best.0..best.1];
    let mut acc = 0.0;
    let at = window
        .iter()
        .find(|r| {
            acc += r.1;
            acc >= best_weight / 2.0
        })
        .map_or(window[window.len() - 1].0, |r| r.0);
    Some(at.exp())
}
