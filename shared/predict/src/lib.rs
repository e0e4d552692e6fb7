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
//!   time: last-k medians and quantiles, a Kaplan–Meier median that counts still-running
//!   submissions as censored (a sweep whose first jobs have run for hours is a long sweep), the
//!   submission burst the task arrived in, the calendar. Nothing after the question is asked is
//!   used.
//! - [`Model`] learns, per context (how soon after the previous submission of its kind a task
//!   came, how many of its burst finished, recent fast failures, how spread its kind's runs
//!   are), which of those statistics to trust; its 10–90% interval is calibrated on the newest
//!   runs it did not learn from. It stays within what the task's neighbours really ran; the
//!   smartcore forests we measured did not (see the module docs of `model`).
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
