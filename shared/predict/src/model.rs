//! The learned part: a decision table that chooses, per task, which recency statistic to
//! trust, learned from the finished runs, with intervals calibrated on the most recent runs it
//! did not learn from.
//!
//! Why a chooser, and why not a forest: on Philly (docs/benchmarks.md, "Predictor") smartcore
//! random forests fit their training months and then lost to the plain last-ten median on the
//! weeks after — a regressor of the log ratio to the recency estimate scored MdALE 0.80 in
//! time against 0.21 in sample, a forest classifier choosing among the statistics 0.52 — since
//! bursts of near-identical jobs let them memorise what does not carry over. A choice among
//! recency statistics cannot stray from what the task's neighbours really ran; what is learned
//! is *when* each one is right, per context: how soon after the previous submission of its kind
//! it came, how many of its burst already finished, whether its kind failed fast lately, how
//! spread its kind's runs are.

use crate::features::Features;
use crate::recency::quantile_of;

/// How the model learns. The defaults are the one configuration Allot ships: nothing is tuned
/// per trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainParams {
    /// Fewest finished runs to learn from; fewer, and the predictor falls back.
    pub min_samples: usize,
    /// Learn from the newest this many finished runs only: what predicts drifts from month to
    /// month.
    pub window: usize,
    /// The newest share of those kept out of learning to calibrate the intervals.
    pub calibration_share: f64,
    /// Fewest learning runs for a context to choose its own statistic (else the choice of all).
    pub min_per_context: usize,
}

impl Default for TrainParams {
    fn default() -> Self {
        TrainParams {
            min_samples: 200,
            window: 25_000,
            calibration_share: 0.15,
            min_per_context: 40,
        }
    }
}

/// The statistics the model chooses among, as indices into [`Features::values`]; `None` is
/// the base estimate itself. Each value there is ln(statistic / base), 0 where the statistic
/// is missing (so a missing one is the base).
const CANDIDATES: [Option<usize>; 10] = [
    None,     // the key's last-ten median
    Some(1),  // last three
    Some(2),  // last five by submission
    Some(3),  // censored (Kaplan–Meier) median
    Some(10), // the burst's finished siblings
    Some(13), // the team's last ten
    Some(16), // the same task's last five
    Some(4),  // the key's short mode (p10)
    Some(5),  // the key's long mode (p90)
    Some(14), // the declared estimate
];

/// Bands of the recent history's spread (ln p90 − ln p10 of the last ten runs of the key), each
/// with its own residual quantiles: a key whose runs vary a lot gets a wider interval.
const SPREAD_BANDS: [f64; 3] = [0.5, 1.5, 3.0];
/// Contexts: gap to the previous submission of the key (< 10 s, < 5 min, more) × finished burst
/// siblings (0, 1, 2+) × any fast failure among the key's last ten × spread band.
const CONTEXTS: usize = 3 * 3 * 2 * (SPREAD_BANDS.len() + 1);

/// A trained model.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// Its version: the caller's counter, carried by every prediction it makes.
    pub version: u64,
    /// How many finished runs it learned from and was calibrated on.
    pub trained_on: usize,
    /// Per context, the index of the statistic it trusts.
    choice: Vec<usize>,
    /// Per spread band (`SPREAD_BANDS.len() + 1`), the 10% and 90% quantiles of ln(true /
    /// predicted) on the calibration runs.
    bands: Vec<(f64, f64)>,
}

impl Model {
    /// Learns from `samples` (the features each run had at its submission, and how long it ran,
    /// ms), oldest first; `None` with fewer than `params.min_samples`.
    pub fn train(samples: &[(Features, f64)], params: TrainParams, version: u64) -> Option<Model> {
        if samples.len() < params.min_samples.max(10) {
            return None;
        }
        let cut = ((samples.len() as f64) * (1.0 - params.calibration_share)) as usize;
        let (learn, calibrate) = samples.split_at(cut.clamp(1, samples.len() - 1));
        let choice = choices(learn, params.min_per_context);
        let mut all = Vec::with_capacity(calibrate.len());
        let mut by_band: Vec<Vec<f64>> = vec![Vec::new(); SPREAD_BANDS.len() + 1];
        for (f, ran) in calibrate {
            let residual = ran.max(1.0).ln() - ln_candidate(f, choice[context(f)]);
            all.push(residual);
            by_band[band(f)].push(residual);
        }
        let overall = (
            quantile_of(&mut all.clone(), 0.1),
            quantile_of(&mut all, 0.9),
        );
        let bands = by_band
            .into_iter()
            .map(|mut r| {
                if r.len() < 50 {
                    overall
                } else {
                    (quantile_of(&mut r, 0.1), quantile_of(&mut r, 0.9))
                }
            })
            .collect();
        Some(Model {
            version,
            trained_on: samples.len(),
            choice,
            bands,
        })
    }

    /// The predicted run time of a task with `features`, and its 10% and 90% quantiles, ms.
    pub fn predict(&self, features: &Features) -> (f64, f64, f64) {
        let ln_point = ln_candidate(features, self.choice[context(features)]);
        let (lo, hi) = self.bands[band(features)];
        (ln_point.exp(), (ln_point + lo).exp(), (ln_point + hi).exp())
    }

    /// The statistic it trusts for a task with `features` (for explanations and tests).
    pub fn trusts(&self, features: &Features) -> &'static str {
        STATISTIC_NAMES[self.choice[context(features)]]
    }
}

/// The names of [`CANDIDATES`], in order.
const STATISTIC_NAMES: [&str; 10] = [
    "last ten of its team and size",
    "last three of its team and size",
    "last five submitted of its team and size",
    "censored median of its team and size",
    "its burst's finished runs",
    "last ten of its team",
    "its own last five runs",
    "short mode of its team and size",
    "long mode of its team and size",
    "its declared estimate",
];

/// Per context, the statistic with the smallest median error on `samples`; contexts with fewer
/// than `min` samples take the choice of all.
fn choices(samples: &[(Features, f64)], min: usize) -> Vec<usize> {
    let mut errors: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); CANDIDATES.len()]; CONTEXTS];
    let mut all: Vec<Vec<f64>> = vec![Vec::new(); CANDIDATES.len()];
    for (f, ran) in samples {
        let truth = ran.max(1.0).ln();
        let c = context(f);
        for (k, errs) in errors[c].iter_mut().enumerate() {
            let e = (ln_candidate(f, k) - truth).abs();
            errs.push(e);
            all[k].push(e);
        }
    }
    let best = |errs: &mut [Vec<f64>]| -> usize {
        (0..errs.len())
            .map(|k| (k, quantile_of(&mut errs[k], 0.5)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
            .map_or(0, |(k, _)| k)
    };
    let overall = best(&mut all);
    errors
        .into_iter()
        .map(|mut errs| {
            if errs[0].len() < min {
                overall
            } else {
                best(&mut errs)
            }
        })
        .collect()
}

/// ln of candidate `k`'s estimate for `f`.
fn ln_candidate(f: &Features, k: usize) -> f64 {
    let ln_base = f.base_ms.ln();
    match CANDIDATES.get(k).copied().flatten() {
        Some(i) => ln_base + f.values[i],
        None => ln_base,
    }
}

/// The context of `f` (see [`CONTEXTS`]).
fn context(f: &Features) -> usize {
    let gap_s = f.values[7].exp() - 1.0;
    let gap = usize::from(gap_s >= 10.0) + usize::from(gap_s >= 300.0);
    let siblings = ((f.values[11].exp() - 1.0).round() as usize).min(2);
    let short = usize::from(f.values[6] > 0.0);
    ((gap * 3 + siblings) * 2 + short) * (SPREAD_BANDS.len() + 1) + band(f)
}

/// The spread band of `f`.
fn band(f: &Features) -> usize {
    let spread = f.values[5] - f.values[4];
    SPREAD_BANDS.iter().take_while(|&&b| spread >= b).count()
}
