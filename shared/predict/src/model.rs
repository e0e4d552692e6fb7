//! The learned part: the median of a few recency statistics, which ones learned from the
//! finished runs, with intervals calibrated on the most recent runs it did not learn from.
//!
//! Why a median of statistics, and why not a forest: on Philly (docs/benchmarks.md, "Run-time
//! predictor on Philly") smartcore random forests fit their training months and then lost to the plain
//! last-ten median on the weeks after — a regressor of the log ratio to the recency estimate
//! scored MdALE 0.80 in time against 0.21 in sample, a forest classifier choosing among the
//! statistics 0.52 — since bursts of near-identical jobs let them memorise what does not carry
//! over. The decision table that came next (per context — gap since the previous submission of
//! its kind, finished burst siblings, recent fast failures, spread — the statistic with the
//! smallest median error) drifted the same way, only less: the statistic best in one context in
//! October was often worst there in November (0.405 against the last-ten median's 0.409).
//!
//! What carries over from month to month is an ensemble: the median of three to five
//! statistics (which ones is learned, as the subset of [`POOL`] whose median has the smallest
//! median error on the learning window; never one or two, whose own drift the median is there
//! to outvote). Each statistic errs on its own jobs — the last runs by finish time lean towards
//! the runs that end fast, the densest cluster of a bimodal history lands on the wrong mode
//! part of the time, the last runs by submission lag — and the median of them errs where
//! most do. It also cannot stray from what the task's neighbours really ran.
//!
//! Teams differ in which statistics predict them (one resubmits the same job in bursts,
//! another runs sweeps), so a team with enough runs, and then its tasks by how many of their
//! burst's siblings finished, learn an ensemble of their own ([`Ensembles`]), kept only where it
//! beats the coarser one on that segment's held-out runs; once chosen, every ensemble is
//! learned again on the whole window, held-out runs included, since what predicts drifts. On
//! Philly after 2017-11-01 the model scores MdALE 0.367 and 63.1% within 2×, against 0.409 and
//! 61.8% for the last-ten median (0.382 with one shared ensemble) — 10.3% below, just inside
//! the floor. A smartcore decision tree gating between the shared ensemble and the
//! last-ten median did worse (0.385–0.395), so smartcore is not used.
//!
//! One choice per context remains: where a single statistic is all but exact on the learning
//! window (median error below [`EXACT`], and under half the ensemble's) — the same task run
//! again, a burst of identical jobs whose siblings finished — the context trusts it instead.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

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
    /// Fewest learning runs for a context to trust a single statistic over the ensemble.
    pub min_per_context: usize,
    /// Fewest learning runs for a team (or a team's tasks with as many finished burst
    /// siblings) to get an ensemble of its own, which it keeps only if it beats the coarser
    /// one on its calibration runs.
    pub min_per_team: usize,
}

impl Default for TrainParams {
    fn default() -> Self {
        TrainParams {
            min_samples: 200,
            window: 25_000,
            calibration_share: 0.15,
            min_per_context: 40,
            min_per_team: 1_000,
        }
    }
}

/// The statistics the model combines or chooses among, as indices into [`Features::values`];
/// `None` is the base estimate itself. Each value there is ln(statistic / base), 0 where the statistic
/// is missing (so a missing one is the base).
const CANDIDATES: [Option<usize>; 12] = [
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
    Some(17), // the densest cluster of the key's last 20–40 runs
    Some(18), // the densest cluster of all the key's kept runs (40–64)
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
    /// Per context, the index in [`CANDIDATES`] of the statistic it trusts, or [`ENSEMBLE`].
    choice: Vec<usize>,
    /// Which statistics the ensemble's estimate is the median of, for each team.
    ensembles: Ensembles,
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
        let ensembles = Ensembles::learn(learn, calibrate, params.min_per_team);
        let choice = choices(learn, params.min_per_context, &ensembles);
        let mut all = Vec::with_capacity(calibrate.len());
        let mut by_band: Vec<Vec<f64>> = vec![Vec::new(); SPREAD_BANDS.len() + 1];
        for (f, ran) in calibrate {
            let residual = ran.max(1.0).ln() - ln_choice(f, choice[context(f)], ensembles.of(f));
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
            ensembles,
            bands,
        })
    }

    /// The predicted run time of a task with `features`, and its 10% and 90% quantiles, ms.
    pub fn predict(&self, features: &Features) -> (f64, f64, f64) {
        let ln_point = ln_choice(
            features,
            self.choice[context(features)],
            self.ensembles.of(features),
        );
        let (lo, hi) = self.bands[band(features)];
        (ln_point.exp(), (ln_point + lo).exp(), (ln_point + hi).exp())
    }

    /// The statistics whose median is its estimate wherever no single one is all but exact,
    /// for the teams without an ensemble of their own.
    pub fn ensemble(&self) -> Vec<&'static str> {
        names(&self.ensembles.shared)
    }

    /// The statistics whose median is its estimate for a task with `features` wherever no
    /// single one is all but exact: its team's own, or the shared [`Model::ensemble`].
    pub fn ensemble_for(&self, features: &Features) -> Vec<&'static str> {
        names(self.ensembles.of(features))
    }

    /// How many segments (teams, or a team's tasks by finished burst siblings) have an
    /// ensemble of their own.
    pub fn segment_ensembles(&self) -> usize {
        self.ensembles.by_segment.len()
    }

    /// The statistic it trusts for a task with `features` (for explanations and tests): one
    /// of them, or the median of the [`Model::ensemble`] ones.
    pub fn trusts(&self, features: &Features) -> &'static str {
        STATISTIC_NAMES
            .get(self.choice[context(features)])
            .copied()
            .unwrap_or("the median of several statistics")
    }
}

/// The names of [`CANDIDATES`], in order.
const STATISTIC_NAMES: [&str; 12] = [
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
    "densest cluster of the recent runs of its team and size",
    "densest cluster of the runs of its team and size",
];

fn names(ensemble: &[usize]) -> Vec<&'static str> {
    ensemble.iter().map(|&k| STATISTIC_NAMES[k]).collect()
}

/// The ensembles of a model: one learned on every team's runs, and ones learned on the runs of
/// a segment — a team, then a team's tasks with none, one or several burst siblings finished —
/// that has enough runs of its own and whose own ensemble beat its parent's on the segment's
/// held-out runs. Each is then learned again on all of its runs, held-out ones included.
///
/// Teams differ in what predicts their jobs: on Philly one VC resubmits the same job in
/// bursts (its burst siblings and last three predict it), another runs long sweeps whose
/// densest cluster does; and the first of a burst wants other statistics than the tenth. The
/// check on held-out runs keeps a segment's ensemble only where it carries over in time;
/// elsewhere the segment keeps its parent's, learned on more runs.
#[derive(Debug, Clone, PartialEq)]
struct Ensembles {
    /// Indices in [`CANDIDATES`] of the statistics whose median is the estimate.
    shared: Vec<usize>,
    /// The same, per segment ([`segments`]) that has one of its own.
    by_segment: HashMap<Segment, Vec<usize>>,
}

/// A segment: [`Features::group`] (the team), and [`WHOLE_TEAM`] or the number of the burst's
/// finished siblings (0, 1, 2 or more).
type Segment = (u64, u64);
const WHOLE_TEAM: u64 = u64::MAX;

/// Fewest calibration runs of a segment to judge its own ensemble on.
const MIN_SEGMENT_CALIBRATION: usize = 50;

/// The segments of a task with `f`, coarsest first.
fn segments(f: &Features) -> [Segment; 2] {
    [
        (f.group, WHOLE_TEAM),
        (f.group, finished_siblings(f) as u64),
    ]
}

impl Ensembles {
    fn learn(learn: &[(Features, f64)], calibrate: &[(Features, f64)], min: usize) -> Ensembles {
        let mut ensembles = Ensembles {
            shared: best_ensemble(learn),
            by_segment: HashMap::default(),
        };
        type Runs<'a> = Vec<&'a (Features, f64)>;
        for level in 0..2 {
            let mut runs: BTreeMap<Segment, (Runs, Runs)> = BTreeMap::new();
            for sample in learn {
                runs.entry(segments(&sample.0)[level])
                    .or_default()
                    .0
                    .push(sample);
            }
            for sample in calibrate {
                if let Some(segment) = runs.get_mut(&segments(&sample.0)[level]) {
                    segment.1.push(sample);
                }
            }
            let learned: Vec<(Segment, Vec<usize>)> = runs
                .into_iter()
                .filter(|(_, (learn, held_out))| {
                    learn.len() >= min && held_out.len() >= MIN_SEGMENT_CALIBRATION
                })
                .filter_map(|(segment, (learn, held_out))| {
                    let own = best_ensemble(learn);
                    // Every run of the segment has the same parent.
                    let parent = ensembles.of(&held_out[0].0);
                    let error = |ensemble: &[usize]| {
                        let mut errs: Vec<f64> = held_out
                            .iter()
                            .map(|(f, ran)| {
                                (ln_choice(f, ENSEMBLE, ensemble) - ran.max(1.0).ln()).abs()
                            })
                            .collect();
                        quantile_of(&mut errs, 0.5)
                    };
                    (own != parent && error(&own) < error(parent)).then_some((segment, own))
                })
                .collect();
            ensembles.by_segment.extend(learned);
        }
        // What predicts drifts: once chosen, each ensemble is learned again on every run of
        // the window, the newest (held out to judge it) included.
        ensembles.shared = best_ensemble(learn.iter().chain(calibrate));
        let mut runs: HashMap<Segment, Vec<&(Features, f64)>> = HashMap::default();
        for sample in learn.iter().chain(calibrate) {
            for segment in segments(&sample.0) {
                if ensembles.by_segment.contains_key(&segment) {
                    runs.entry(segment).or_default().push(sample);
                }
            }
        }
        for (segment, runs) in runs {
            ensembles.by_segment.insert(segment, best_ensemble(runs));
        }
        ensembles
    }

    /// The ensemble for a task with `f`: its finest segment's that has one.
    fn of(&self, f: &Features) -> &[usize] {
        segments(f)
            .iter()
            .rev()
            .find_map(|s| self.by_segment.get(s))
            .unwrap_or(&self.shared)
    }
}

/// The choice that is the ensemble rather than one statistic.
const ENSEMBLE: usize = CANDIDATES.len();

/// Per context, the ensemble ([`ENSEMBLE`]), or the single statistic that was all but
/// exact on `samples` there: median error below [`EXACT`] and under half the ensemble's, in a
/// context with at least `min` samples.
fn choices(samples: &[(Features, f64)], min: usize, ensembles: &Ensembles) -> Vec<usize> {
    let mut errors: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); ENSEMBLE + 1]; CONTEXTS];
    for (f, ran) in samples {
        let truth = ran.max(1.0).ln();
        let ensemble = ensembles.of(f);
        for (k, errs) in errors[context(f)].iter_mut().enumerate() {
            errs.push((ln_choice(f, k, ensemble) - truth).abs());
        }
    }
    errors
        .into_iter()
        .map(|mut errs| {
            if errs[ENSEMBLE].len() < min {
                return ENSEMBLE;
            }
            let of_ensemble = quantile_of(&mut errs[ENSEMBLE], 0.5);
            (0..ENSEMBLE)
                .map(|k| (k, quantile_of(&mut errs[k], 0.5)))
                .filter(|&(_, e)| e < EXACT && e < 0.5 * of_ensemble)
                .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
                .map_or(ENSEMBLE, |(k, _)| k)
        })
        .collect()
}

/// A median error (natural-log units) below which a statistic is all but exact: within 10%.
const EXACT: f64 = 0.1;

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
    let siblings = finished_siblings(f);
    let short = usize::from(f.values[6] > 0.0);
    ((gap * 3 + siblings) * 2 + short) * (SPREAD_BANDS.len() + 1) + band(f)
}

/// How many of the burst's siblings of `f` finished: 0, 1, or 2 for two or more.
fn finished_siblings(f: &Features) -> usize {
    ((f.values[11].exp() - 1.0).round() as usize).min(2)
}

/// The spread band of `f`.
fn band(f: &Features) -> usize {
    let spread = f.values[5] - f.values[4];
    SPREAD_BANDS.iter().take_while(|&&b| spread >= b).count()
}

/// The [`CANDIDATES`] an ensemble is drawn from: the statistics of the task's key (team × GPUs),
/// its burst and its team — not the modes (p10, p90), which are extremes, nor the declared
/// estimate or the task's own runs, which exist only for some tasks.
const POOL: [usize; 8] = [0, 1, 2, 3, 4, 5, 10, 11];

/// ln of choice `k` for `f`: candidate `k`, or ([`ENSEMBLE`]) the median of `ensemble`'s.
fn ln_choice(f: &Features, k: usize, ensemble: &[usize]) -> f64 {
    if k < ENSEMBLE {
        return ln_candidate(f, k);
    }
    let mut v = [0.0; POOL.len()];
    for (slot, &c) in v.iter_mut().zip(ensemble) {
        *slot = ln_candidate(f, c);
    }
    quantile_of(&mut v[..ensemble.len()], 0.5)
}

/// Ensembles are the median of this many statistics.
const ENSEMBLE_SIZES: std::ops::RangeInclusive<u32> = 3..=5;

/// The subset of [`POOL`] ([`ENSEMBLE_SIZES`] statistics) whose median has the smallest median
/// error on `samples` (the first such subset, by bit mask, on ties: deterministic).
fn best_ensemble<'a>(samples: impl IntoIterator<Item = &'a (Features, f64)>) -> Vec<usize> {
    // Per run, the pool's statistics and the order they sort in: a subset's median is then
    // read off by walking that order, with no copy and no sort per subset (182 subsets).
    let lns: Vec<([f64; POOL.len()], [u8; POOL.len()], f64)> = samples
        .into_iter()
        .map(|(f, ran)| {
            let mut v = [0.0; POOL.len()];
            for (slot, &c) in v.iter_mut().zip(&POOL) {
                *slot = ln_candidate(f, c);
            }
            let mut order: [u8; POOL.len()] = std::array::from_fn(|i| i as u8);
            order.sort_by(|&a, &b| v[usize::from(a)].total_cmp(&v[usize::from(b)]));
            (v, order, ran.max(1.0).ln())
        })
        .collect();
    let mut best = (f64::INFINITY, 0u32);
    let mut errs = Vec::with_capacity(lns.len());
    for mask in 1u32..(1 << POOL.len()) {
        let m = mask.count_ones();
        if !ENSEMBLE_SIZES.contains(&m) {
            continue;
        }
        // The median as [`quantile_of`] interpolates it: between the order statistics `lo`
        // and `hi` of the subset's values, the same arithmetic to the bit.
        let at = f64::from(m - 1) * 0.5;
        let (lo, hi) = (at.floor() as u32, at.ceil() as u32);
        errs.clear();
        for (v, order, truth) in &lns {
            let (mut seen, mut low, mut high) = (0, 0.0, 0.0);
            for &i in order {
                if mask & (1 << i) != 0 {
                    if seen == lo {
                        low = v[usize::from(i)];
                    }
                    if seen == hi {
                        high = v[usize::from(i)];
                        break;
                    }
                    seen += 1;
                }
            }
            let median = low + (high - low) * (at - f64::from(lo));
            errs.push((median - truth).abs());
        }
        let score = quantile_of(&mut errs, 0.5);
        if score < best.0 {
            best = (score, mask);
        }
    }
    (0..POOL.len())
        .filter(|i| best.1 & (1 << i) != 0)
        .map(|i| POOL[i])
        .collect()
}
