//! Right-sizing (auto-tiering), pure: what a task's last runs really used of their GPUs in, the
//! cheapest GPU model and the smallest share of it that would have held them out.
//!
//! # The rules
//!
//! - **History.** The last [`Params::window`] finished attempts of the task (its identity across
//!   runs) that telemetry saw at least once; fewer than [`Params::min_runs`]: no recommendation,
//!   and [`NoRecommendation`] says why.
//! - **Memory needed** per GPU: the *largest* peak among those runs plus
//!   [`Params::headroom_pct`] (10%). The largest, not a quantile: running out of GPU memory kills
//!   a run, it does not slow it down, and with ten runs a p90 is the largest but one.
//! - **Compute needed**: the highest mean utilization among those runs (percent of one whole
//!   GPU, as [`RunUsage::mean_util_pct`] attributes it) plus the same headroom, in milli-GPU. A
//!   run that kept its GPU busy 90% of the time or more so needs all of it: it is compute bound.
//! - **A model fits** when its memory holds the memory needed; its **share** is the larger of
//!   the memory share (needed ÷ the model's memory) and the compute needed, rounded up to a
//!   multiple of [`FRACTION_STEP_MILLI`] (an eighth). The scheduler takes any milli-GPU, but
//!   eighths are shares people read at a glance and that pack without slivers. A task of more
//!   than one GPU keeps its GPU count and whole GPUs (the scheduler gives fractions only to
//!   one-GPU tasks); only its model can change.
//! - **Cheapest**: among the models that fit and have a price, the lowest price × share × GPUs
//!   per hour (ties: less memory, then the name). Utilization is measured on the model the task
//!   ran on; a slower model is not assumed slower — the headroom is the only margin.
//! - **Saving** per hour: what the request costs on the model it last ran on (its share of that
//!   model's price) minus what the recommendation costs; unknown when that model has no price.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Recommended shares are multiples of this (milli-GPU): eighths of a GPU.
pub const FRACTION_STEP_MILLI: u32 = 125;
/// A whole GPU, milli-GPU.
const WHOLE: u32 = 1000;

/// What telemetry saw of one finished attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunUsage {
    /// The highest GPU memory attributed to the run on any one of its GPUs, MiB.
    pub peak_memory_mib: u64,
    /// Its mean GPU utilization, percent of one whole GPU; `None` when its GPUs never reported
    /// utilization (MIG mode).
    pub mean_util_pct: Option<f64>,
    /// Samples it was seen in.
    pub samples: u64,
    /// The GPU model it ran on, when the fleet said.
    pub model: Option<String>,
}

/// What the spec asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// GPUs (1 with `gpu_milli` < 1000 for a share of one).
    pub gpus: u32,
    /// Milli-GPU per GPU.
    pub gpu_milli: u32,
    /// A MIG profile instead of GPUs: not right-sized.
    pub mig_profile: Option<String>,
}

/// A GPU model the task could run on: in its pool, with its price.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// The model as the fleet names it.
    pub model: String,
    /// Its memory, MiB.
    pub memory_mib: u64,
    /// A whole GPU-hour of it, micro-units; `None`: the price table does not list it.
    pub price_micros_per_hour: Option<i64>,
}

/// How cautious the recommendation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// The newest finished runs looked at.
    pub window: usize,
    /// Fewer measured runs than this: no recommendation.
    pub min_runs: usize,
    /// Added to the memory and compute the runs used, percent.
    pub headroom_pct: u32,
}

impl Default for Params {
    /// The last 10 runs, at least 3, 10% headroom.
    fn default() -> Self {
        Self {
            window: 10,
            min_runs: 3,
            headroom_pct: 10,
        }
    }
}

/// The cheapest GPU model and the smallest share that held the task's last runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Recommendation {
    /// The GPU model.
    pub model: String,
    /// GPUs (unchanged from the request).
    pub gpus: u32,
    /// Milli-GPU per GPU (1000: whole GPUs).
    pub gpu_milli: u32,
    /// GPU memory to ask for on each GPU, MiB: the largest peak plus headroom.
    pub gpu_memory_mib: u64,
    /// The runs it rests on.
    pub runs: u32,
    /// What it costs per hour, micro-units.
    pub micros_per_hour: i64,
    /// What the request costs per hour on the model it last ran on, micro-units, when priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_micros_per_hour: Option<i64>,
}

impl Recommendation {
    /// Requested minus recommended, per hour, micro-units, when the request's cost is known.
    pub fn saving_micros_per_hour(&self) -> Option<i64> {
        self.requested_micros_per_hour
            .map(|r| r - self.micros_per_hour)
    }
}

/// Why there is no recommendation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoRecommendation {
    /// The task takes no GPU.
    NoGpu,
    /// The task asks for a MIG instance; MIG profiles are not right-sized.
    Mig(String),
    /// Too few finished runs were measured.
    TooFewRuns {
        /// Measured runs.
        runs: usize,
        /// Needed.
        needed: usize,
    },
    /// No GPU model of the pool both holds the memory needed and has a price.
    NothingFits {
        /// Memory needed per GPU, MiB.
        memory_mib: u64,
    },
}

impl std::fmt::Display for NoRecommendation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoGpu => write!(f, "it takes no GPU"),
            Self::Mig(p) => write!(
                f,
                "it asks for a MIG instance ({p}), which is not right-sized"
            ),
            Self::TooFewRuns { runs, needed } => write!(
                f,
                "{runs} finished run(s) measured by telemetry, {needed} needed"
            ),
            Self::NothingFits { memory_mib } => write!(
                f,
                "no priced GPU model of its pool holds {memory_mib} MiB (its largest peak plus headroom)"
            ),
        }
    }
}

impl std::error::Error for NoRecommendation {}

/// The recommendation for a task asking `request`, from its finished runs `history` (oldest
/// first), among `offers`.
pub fn recommend(
    history: &[RunUsage],
    request: &Request,
    offers: &[Offer],
    params: Params,
) -> Result<Recommendation, NoRecommendation> {
    if let Some(p) = &request.mig_profile {
        return Err(NoRecommendation::Mig(p.clone()));
    }
    if request.gpus == 0 {
        return Err(NoRecommendation::NoGpu);
    }
    let measured: Vec<&RunUsage> = history.iter().filter(|r| r.samples > 0).collect();
    let recent = &measured[measured.len().saturating_sub(params.window)..];
    if recent.len() < params.min_runs.max(1) {
        return Err(NoRecommendation::TooFewRuns {
            runs: recent.len(),
            needed: params.min_runs.max(1),
        });
    }
    let grow = |v: u64| v + (v * u64::from(params.headroom_pct)).div_ceil(100);
    let peak = recent.iter().map(|r| r.peak_memory_mib).max().unwrap_or(0);
    let memory_mib = grow(peak);
    let busiest = recent
        .iter()
        .filter_map(|r| r.mean_util_pct)
        .fold(0.0_f64, f64::max);
    // Percent of a GPU × 10 = milli-GPU; a run with no utilization reading needs none proven.
    let compute_milli = if busiest >= 90.0 {
        WHOLE
    } else {
        grow((busiest * 10.0).ceil() as u64).min(u64::from(WHOLE)) as u32
    };
    let fractional = request.gpus == 1;
    let best = offers
        .iter()
        .filter(|o| o.memory_mib >= memory_mib && o.memory_mib > 0)
        .filter_map(|o| {
            let price = o.price_micros_per_hour?;
            let milli = if fractional {
                let memory_share = (memory_mib * u64::from(WHOLE)).div_ceil(o.memory_mib) as u32;
                round_up(memory_share.max(compute_milli).max(1))
            } else {
                WHOLE
            };
            Some((cost(price, request.gpus, milli), o, milli))
        })
        .min_by(|a, b| (a.0, a.1.memory_mib, &a.1.model).cmp(&(b.0, b.1.memory_mib, &b.1.model)));
    let Some((micros_per_hour, offer, gpu_milli)) = best else {
        return Err(NoRecommendation::NothingFits { memory_mib });
    };
    let ran_on = recent.iter().rev().find_map(|r| r.model.as_deref());
    let requested_micros_per_hour = ran_on
        .and_then(|m| offers.iter().find(|o| o.model == m))
        .and_then(|o| o.price_micros_per_hour)
        .map(|p| cost(p, request.gpus, request.gpu_milli.min(WHOLE)));
    Ok(Recommendation {
        model: offer.model.clone(),
        gpus: request.gpus,
        gpu_milli,
        gpu_memory_mib: memory_mib,
        runs: recent.len() as u32,
        micros_per_hour,
        requested_micros_per_hour,
    })
}

/// `milli` rounded up to a multiple of [`FRACTION_STEP_MILLI`], at most a whole GPU.
fn round_up(milli: u32) -> u32 {
    milli
        .div_ceil(FRACTION_STEP_MILLI)
        .saturating_mul(FRACTION_STEP_MILLI)
        .min(WHOLE)
}

/// `gpus` × `milli` of a GPU priced `price` per whole GPU-hour.
fn cost(price: i64, gpus: u32, milli: u32) -> i64 {
    (i128::from(price) * i128::from(gpus) * i128::from(milli) / i128::from(WHOLE)) as i64
}

#[cfg(test)]
mod tests;
