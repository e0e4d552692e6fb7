//! The predictor online: submissions and finishes in, predictions out, retraining as history
//! grows.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Millis;
use crate::features::Features;
use crate::model::{Model, TrainParams};
use crate::recency::{Job, Recency};

/// Where a prediction's estimate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// The same task's last runs (corrected by the model when there is one).
    Identity,
    /// The last runs of the team's tasks of this GPU count (corrected by the model when there
    /// is one).
    TeamGpus,
    /// Cold start: nothing of its kind finished yet, the spec's `durationEstimate`.
    Declared,
    /// Cold start: the team's last runs of any size.
    Team,
    /// Cold start: everyone's last runs.
    Global,
    /// Cold start: nothing finished at all; one hour.
    Default,
}

impl Basis {
    /// Its name, as events and reports show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Identity => "identity",
            Basis::TeamGpus => "team_gpus",
            Basis::Declared => "declared",
            Basis::Team => "team",
            Basis::Global => "global",
            Basis::Default => "default",
        }
    }
}

/// A predicted run time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// The point estimate, ms.
    pub point_ms: Millis,
    /// 10% quantile, ms.
    pub p10_ms: Millis,
    /// 90% quantile, ms.
    pub p90_ms: Millis,
    /// The model that made it; `None` when no model was trained yet (a fallback).
    pub model_version: Option<u64>,
    /// Where the estimate comes from.
    pub basis: Basis,
}

/// How many finished runs the predictor keeps at most: the most recent.
const MAX_SAMPLES: usize = 50_000;

/// The predictor: recency history, the training set, the current model.
#[derive(Debug)]
pub struct Predictor {
    params: TrainParams,
    recency: Recency,
    /// Features of submitted tasks not finished yet, by id.
    pending: HashMap<u64, (Job, Features)>,
    /// Finished runs: the features they had when submitted, and how long they ran.
    samples: VecDeque<(Features, f64)>,
    /// Samples added since the last training.
    fresh: usize,
    model: Option<Model>,
    versions: u64,
}

impl Predictor {
    /// An empty predictor that learns with `params`.
    pub fn new(params: TrainParams) -> Predictor {
        Predictor {
            params,
            recency: Recency::default(),
            pending: HashMap::default(),
            samples: VecDeque::new(),
            fresh: 0,
            model: None,
            versions: 0,
        }
    }

    /// Task `id` is submitted: records its features and returns its prediction.
    pub fn submitted(&mut self, id: u64, job: &Job) -> Prediction {
        let features = Features::of(job, &self.recency, job.submit_ms);
        let prediction = self.predict_features(&features);
        self.recency.submitted(id, job);
        self.pending.insert(id, (job.clone(), features));
        prediction
    }

    /// Task `id` finished after running `ran_ms`. Unknown ids (submitted before the predictor
    /// started) count in the recency statistics only.
    pub fn finished(&mut self, id: u64, job: &Job, ran_ms: Millis) {
        self.recency.finished(id, job, ran_ms);
        if let Some((_, features)) = self.pending.remove(&id) {
            if self.samples.len() == MAX_SAMPLES {
                self.samples.pop_front();
            }
            self.samples.push_back((features, ran_ms as f64));
            self.fresh += 1;
        }
    }

    /// Whether enough new history arrived to retrain: the first `min_samples`, then a tenth
    /// more than the last model saw.
    pub fn retrain_due(&self) -> bool {
        match &self.model {
            None => self.samples.len() >= self.params.min_samples,
            Some(m) => self.fresh * 10 >= m.trained_on.max(self.params.min_samples),
        }
    }

    /// Trains a new model on the history so far; returns its version (`None`: too little).
    pub fn retrain(&mut self) -> Option<u64> {
        let skip = self.samples.len().saturating_sub(self.params.window);
        let samples = &self.samples.make_contiguous()[skip..];
        let model = Model::train(samples, self.params, self.versions + 1)?;
        self.versions += 1;
        self.fresh = 0;
        self.model = Some(model);
        Some(self.versions)
    }

    /// Task `id` will not finish (it was cancelled): it is no training sample.
    pub fn withdrawn(&mut self, id: u64) {
        self.pending.remove(&id);
    }

    /// Finished runs learned since the last training.
    pub fn fresh(&self) -> usize {
        self.fresh
    }

    /// Numbers the next model after `last`: a predictor rebuilt from stored history after a
    /// restart goes on with its versions instead of reusing them.
    pub fn continue_versions(&mut self, last: u64) {
        self.versions = self.versions.max(last);
    }

    /// The recent history it predicts from.
    pub fn recency(&self) -> &Recency {
        &self.recency
    }

    /// The current model, if one was trained.
    pub fn model(&self) -> Option<&Model> {
        self.model.as_ref()
    }

    /// `job`'s prediction at its submission, without recording it.
    pub fn predict(&self, job: &Job) -> Prediction {
        self.predict_features(&Features::of(job, &self.recency, job.submit_ms))
    }

    fn predict_features(&self, f: &Features) -> Prediction {
        let (point, p10, p90, version) = match &self.model {
            Some(model) => {
                let (p, lo, hi) = model.predict(f);
                (p, lo, hi, Some(model.version))
            }
            // Cold start, the fallback alone; its interval a factor of 3 either way, what a
            // stranger's or a declared estimate is worth.
            None => (f.base_ms, f.base_ms / 3.0, f.base_ms * 3.0, None),
        };
        let ms = |v: f64| v.round().clamp(1.0, u64::MAX as f64 / 2.0) as Millis;
        Prediction {
            point_ms: ms(point),
            p10_ms: ms(p10.min(point)),
            p90_ms: ms(p90.max(point)),
            model_version: version,
            basis: f.basis,
        }
    }
}
