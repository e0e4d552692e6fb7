//! `allot predict report`'s data: per task (its identity across runs), what the predictor has
//! learned — runs, the latest predicted run time, GPU memory and utilization — and the
//! right-sizing recommendation, read from `predictor.db`.

use allot_predict::rightsize::{Params, Recommendation, Request};
use allot_prices::PriceTable;
use allot_store::rusqlite::Connection;
use serde::Serialize;

use crate::usage;

/// One task's line of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskReport {
    /// `<team>/<workload name>/<task name>`.
    pub task_key: String,
    /// Its pool (of its latest attempt).
    pub pool: String,
    /// Attempts that finished (completed or failed).
    pub runs: u32,
    /// Of them, those telemetry saw.
    pub measured_runs: u32,
    /// The latest attempt's predicted run time, ms.
    pub predicted_ms: Option<u64>,
    /// The largest peak GPU memory of the recent measured runs (on one GPU), MiB.
    pub peak_memory_mib: Option<u64>,
    /// The mean of the recent measured runs' mean GPU utilization, percent of one GPU.
    pub mean_util_pct: Option<f64>,
    /// What the latest attempt asked for: GPUs, milli-GPU each, accepted models (empty: any).
    pub requested_gpus: u32,
    /// Milli-GPU per GPU.
    pub requested_milli: u32,
    /// Accepted models.
    pub requested_models: Vec<String>,
    /// The model its latest measured run ran on.
    pub ran_on: Option<String>,
    /// The recommendation, if there is one.
    pub recommendation: Option<Recommendation>,
    /// Why there is none.
    pub no_recommendation: Option<String>,
    /// Requested minus recommended per hour, micro-units.
    pub saving_micros_per_hour: Option<i64>,
}

/// Every task key the predictor has seen, in name order; recommendations priced by `prices`
/// at `at_ms` (`None`: no recommendations, and each says so).
pub fn tasks(
    conn: &Connection,
    prices: Option<&PriceTable>,
    at_ms: u64,
) -> Result<Vec<TaskReport>, allot_store::rusqlite::Error> {
    struct Latest {
        identity: String,
        pool: String,
        gpus: u32,
        milli: u32,
        models: String,
        mig: Option<String>,
        prediction: String,
        runs: u32,
    }
    let latest: Vec<Latest> = conn
        .prepare(
            "SELECT t.identity, t.pool, t.gpus, t.gpu_milli, t.gpu_models, t.mig_profile,
                    t.prediction,
                    (SELECT count(*) FROM tasks f WHERE f.identity = t.identity
                         AND f.outcome IN ('completed', 'failed'))
             FROM tasks t
             WHERE t.task = (SELECT l.task FROM tasks l WHERE l.identity = t.identity
                             ORDER BY l.submit_ms DESC, l.task DESC LIMIT 1)
             ORDER BY t.identity",
        )?
        .query_map([], |r| {
            Ok(Latest {
                identity: r.get(0)?,
                pool: r.get(1)?,
                gpus: r.get(2)?,
                milli: r.get(3)?,
                models: r.get(4)?,
                mig: r.get(5)?,
                prediction: r.get(6)?,
                runs: r.get(7)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    let window = Params::default().window;
    let mut out = Vec::with_capacity(latest.len());
    for l in latest {
        let measured = usage::finished_usage(conn, &l.identity)?;
        let recent = &measured[measured.len().saturating_sub(window)..];
        let utils: Vec<f64> = recent.iter().filter_map(|u| u.mean_util_pct).collect();
        let request = Request {
            gpus: l.gpus,
            gpu_milli: l.milli,
            mig_profile: l.mig,
        };
        let advice = match prices {
            Some(p) => usage::recommend(conn, &l.identity, &l.pool, &request, p, at_ms)?
                .map_err(|why| why.to_string()),
            None => Err("no price table".to_owned()),
        };
        let predicted_ms = serde_json::from_str::<allot_events::task::TaskPredicted>(&l.prediction)
            .ok()
            .map(|p| p.duration_ms);
        let saving = advice
            .as_ref()
            .ok()
            .and_then(Recommendation::saving_micros_per_hour);
        out.push(TaskReport {
            task_key: l.identity,
            pool: l.pool,
            runs: l.runs,
            measured_runs: measured.len() as u32,
            predicted_ms,
            peak_memory_mib: recent.iter().map(|u| u.peak_memory_mib).max(),
            mean_util_pct: (!utils.is_empty())
                .then(|| utils.iter().sum::<f64>() / utils.len() as f64),
            requested_gpus: request.gpus,
            requested_milli: request.gpu_milli,
            requested_models: serde_json::from_str(&l.models).unwrap_or_default(),
            ran_on: recent.iter().rev().find_map(|u| u.model.clone()),
            recommendation: advice.as_ref().ok().cloned(),
            no_recommendation: advice.err(),
            saving_micros_per_hour: saving,
        });
    }
    Ok(out)
}
