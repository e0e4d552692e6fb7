//! Allot's run-time predictor, pure: what finished, and when, goes in; a prediction of how long a
//! newly submitted task will run comes out — a point estimate, a 10–90% interval, the version of
//! the model that made it, and, on a cold start, which fallback stood in for the model.
//!
//! The design rests on what the Philly trace shows (the predictor issue's measurements): recency
//! is what predicts — the median of the last ten finished jobs of the same team and GPU count
//! beats every all-history statistic and a random forest on raw features — and durations are
//! bimodal, so a squared-error model of the duration itself lands between the modes. So:
//!
//! - [`Recency`] keeps, per key (team × GPUs, team, the task's own identity, everyone), the last
//!   runs that finished and the last submissions, and turns them into [`Features`] at submission
//!   time: last-k medians and quantiles, the densest cluster of the last runs (where runs are
//!   bimodal, the median lands between the modes; the densest cluster lands on one), a
//!   Kaplan–Meier median that counts still-running submissions as censored (a sweep whose first
//!   jobs have run for hours is a long sweep), the submission burst the task arrived in, the
//!   calendar. Nothing after the question is asked is used.
//! - [`Model`] predicts the median of three to five of those statistics — which ones learned
//!   from the finished runs — since every one of them drifts from month to month on its own
//!   jobs and the median of them errs only where most do; a single statistic stands in where it
//!   was all but exact (the same task run again, a burst whose identical siblings finished). Its
//!   10–90% interval is calibrated on the newest runs it did not learn from. It stays within
//!   what the task's neighbours really ran; the smartcore forests and the per-context choice we
//!   measured did not carry over (see the module docs of `model`).
//! - [`Predictor`] ties them together online: it records each submission's features, learns from
//!   each finish, retrains when enough new history arrived, and falls back — declared
//!   estimate, then the team's statistics, then everyone's — while it has too little to train.
//!
//! [`rightsize`] turns what telemetry saw of a task's last runs (peak GPU memory, mean
//! utilization) into the cheapest GPU model and smallest share that would have held them.
//!
//! [`eval`] replays a history chronologically (train before a split date, test after) against
//! the baselines, for `allot predict eval`.

pub mod eval;
mod features;
mod model;
mod predictor;
mod recency;
pub mod rightsize;

pub use features::{FEATURE_NAMES, Features};
pub use model::{Model, TrainParams};
pub use predictor::{Basis, Prediction, Predictor};
pub use recency::{Job, Recency};

/// Milliseconds: submit and finish times since any fixed origin, durations.
pub type Millis = u64;

#[cfg(test)]
mod tests;
