//! What tasks used of their GPUs, from telemetry, and the right-sizing built on it.
//!
//! Two more durable consumers feed `predictor.db` beside the lifecycle one, each in its own
//! transactions with its own position (as billing's and the inventory's do):
//!
//! - **fleet** (`allot.node.registered.*` in FLEET): each node's GPUs — pool, model, memory —
//!   replaced whole at every registration. Right-sizing chooses among the models of a task's
//!   pool, and a run's model is the model of the GPU it was sampled on.
//! - **telemetry** (`allot.telemetry.*` in TELEMETRY): each `GpusSampled` is attributed to the
//!   runs it names as holding each GPU (`held`: workload, task, lease, share). A GPU shared by
//!   several runs is split **by their shares**: a run holding `m` of the `M` milli-GPU held on
//!   it is charged `m / M` of the GPU's used memory and of its utilization (alone on a GPU, a
//!   run is charged all of it, whatever its share). Per run and GPU it keeps the samples, the
//!   peak memory charged and the sum of the utilization charged.
//!
//! The streams are read independently, so a sample may be applied before the predictor has
//! seen the run start; samples are therefore kept by what they name (workload, task name,
//! lease, node) and joined to attempts only when read (`runs`, written by the lifecycle
//! consumer at `TaskStarted`). No table is written by two consumers, so the result does not
//! depend on how the streams interleave, and a redelivered sample is skipped by its
//! consumer's position.

use std::collections::BTreeMap;

use allot_bus::consumer::Delivery;
use allot_events::{AnyEvent, NodeEvent, TelemetryEvent};
use allot_predict::rightsize::{
    self, NoRecommendation, Offer, Params, Recommendation, Request, RunUsage,
};
use allot_prices::PriceTable;
use allot_store::rusqlite::{Connection, params};
use serde::Serialize;

/// Applies a node registration: the node's GPUs, replaced whole (the fleet consumer's
/// projection; other events are skipped).
pub(crate) fn apply_registration(
    tx: &Connection,
    d: &Delivery,
) -> allot_store::rusqlite::Result<()> {
    let AnyEvent::Node(NodeEvent::Registered(n)) = &d.event.data else {
        return Ok(());
    };
    tx.execute("DELETE FROM gpus WHERE node = ?1", [&n.node])?;
    for g in &n.gpus {
        tx.execute(
            "INSERT INTO gpus (node, gpu, pool, model, memory_total_mib)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![n.node, g.index, n.pool, g.model, g.memory_total_mib as i64],
        )?;
    }
    Ok(())
}

/// Applies a GPU sample to the runs holding the GPUs sampled (the telemetry consumer's
/// projection; other events are skipped).
pub(crate) fn apply_sample(tx: &Connection, d: &Delivery) -> allot_store::rusqlite::Result<()> {
    let AnyEvent::Telemetry(TelemetryEvent::GpusSampled(s)) = &d.event.data else {
        return Ok(());
    };
    let mut held_milli: BTreeMap<u32, u64> = BTreeMap::new();
    for h in &s.held {
        *held_milli.entry(h.index).or_default() += u64::from(h.milli.max(1));
    }
    for h in &s.held {
        let Some(g) = s.samples.iter().find(|g| g.index == h.index) else {
            continue;
        };
        let total = held_milli[&h.index] as f64;
        let share = f64::from(h.milli.max(1)) / total;
        let memory = (g.memory_used_mib as f64 * share).round() as i64;
        let util = g.utilization_pct.map(|u| f64::from(u) * share);
        tx.prepare_cached(
            "INSERT INTO usage (workload, name, lease, node, gpu, samples,
                 peak_memory_mib, util_samples, util_sum, memory_total_mib)
             VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7, ?8, ?9)
             ON CONFLICT (workload, name, lease, node, gpu) DO UPDATE SET
                 samples = samples + 1,
                 peak_memory_mib = max(peak_memory_mib, excluded.peak_memory_mib),
                 util_samples = util_samples + excluded.util_samples,
                 util_sum = util_sum + excluded.util_sum,
                 memory_total_mib = excluded.memory_total_mib",
        )?
        .execute(params![
            h.workload,
            h.task,
            h.lease.0 as i64,
            s.node,
            h.index,
            memory,
            i64::from(util.is_some()),
            util.unwrap_or(0.0),
            g.memory_total_mib as i64
        ])?;
    }
    Ok(())
}

/// What telemetry saw of one attempt, in all its runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptUsage {
    /// The attempt's task id.
    pub task: u64,
    /// Peak GPU memory charged to it on any one GPU, MiB.
    pub peak_memory_mib: u64,
    /// Its mean GPU utilization, percent of one GPU; `None` without utilization readings.
    pub mean_util_pct: Option<f64>,
    /// Samples that saw it (the most of any of its GPUs).
    pub samples: u64,
    /// The model of the GPUs it ran on, when the fleet said.
    pub model: Option<String>,
    /// Their memory, MiB.
    pub memory_total_mib: u64,
}

impl From<&AttemptUsage> for RunUsage {
    fn from(u: &AttemptUsage) -> Self {
        RunUsage {
            peak_memory_mib: u.peak_memory_mib,
            mean_util_pct: u.mean_util_pct,
            samples: u.samples,
            model: u.model.clone(),
        }
    }
}

/// What telemetry saw of attempt `task` (nothing: `None`).
pub fn attempt_usage(
    conn: &Connection,
    task: u64,
) -> Result<Option<AttemptUsage>, allot_store::rusqlite::Error> {
    let mut rows = usage_rows(conn, "t.task = ?1", &[&(task as i64)])?;
    Ok(rows.pop())
}

/// What telemetry saw of the finished attempts of the task `identity`, oldest first.
pub fn finished_usage(
    conn: &Connection,
    identity: &str,
) -> Result<Vec<AttemptUsage>, allot_store::rusqlite::Error> {
    usage_rows(
        conn,
        "t.identity = ?1 AND t.outcome IN ('completed', 'failed')",
        &[&identity],
    )
}

fn usage_rows(
    conn: &Connection,
    filter: &str,
    args: &[&dyn allot_store::rusqlite::ToSql],
) -> Result<Vec<AttemptUsage>, allot_store::rusqlite::Error> {
    let sql = format!(
        "SELECT t.task, max(u.peak_memory_mib), sum(u.util_sum), sum(u.util_samples),
                max(u.samples), max(g.model), max(u.memory_total_mib)
         FROM tasks t
         JOIN runs r ON r.task = t.task
         JOIN usage u ON u.workload = t.workload AND u.name = t.name AND u.lease = r.lease
                     AND u.node = r.node
         LEFT JOIN gpus g ON g.node = u.node AND g.gpu = u.gpu
         WHERE {filter}
         GROUP BY t.task
         ORDER BY coalesce(t.finished_ms, t.submit_ms), t.task"
    );
    conn.prepare_cached(&sql)?
        .query_map(args, |r| {
            let util_sum: f64 = r.get(2)?;
            let util_samples: i64 = r.get(3)?;
            Ok(AttemptUsage {
                task: r.get::<_, i64>(0)? as u64,
                peak_memory_mib: r.get::<_, i64>(1)? as u64,
                mean_util_pct: (util_samples > 0).then(|| util_sum / util_samples as f64),
                samples: r.get::<_, i64>(4)? as u64,
                model: r.get(5)?,
                memory_total_mib: r.get::<_, i64>(6)? as u64,
            })
        })?
        .collect()
}

/// The GPU models of `pool` (the largest memory registered for each), priced by `prices` at
/// `at_ms`.
pub fn offers(
    conn: &Connection,
    pool: &str,
    prices: &PriceTable,
    at_ms: u64,
) -> Result<Vec<Offer>, allot_store::rusqlite::Error> {
    let table = prices.at(at_ms);
    // One model at a time through `gpus_pool_model`: the next model after the last, then its
    // largest memory — a few index seeks per model, where grouping read every GPU of the pool
    // (16,000 at fleet scale) for every task announced.
    conn.prepare_cached(
        "WITH RECURSIVE models (model) AS (
             SELECT min(model) FROM gpus WHERE pool = ?1
             UNION ALL
             SELECT (SELECT min(model) FROM gpus WHERE pool = ?1 AND model > models.model)
             FROM models WHERE models.model IS NOT NULL
         )
         SELECT model, (SELECT max(memory_total_mib) FROM gpus
                        WHERE pool = ?1 AND model = models.model)
         FROM models WHERE model IS NOT NULL ORDER BY model",
    )?
    .query_map([pool], |r| {
        let model: String = r.get(0)?;
        Ok(Offer {
            price_micros_per_hour: table.gpu(&model),
            memory_mib: r.get::<_, i64>(1)? as u64,
            model,
        })
    })?
    .collect()
}

/// What telemetry saw of the newest `wanted` finished attempts of the task `identity` that it
/// saw at all, oldest first: the same as the tail of [`finished_usage`], read newest first
/// from `tasks_identity` and stopped there, so a task run every hour for a year costs what
/// one run ten times does.
pub fn recent_usage(
    conn: &Connection,
    identity: &str,
    wanted: usize,
) -> Result<Vec<AttemptUsage>, allot_store::rusqlite::Error> {
    let mut newest = conn.prepare_cached(
        "SELECT task FROM tasks WHERE identity = ?1 AND outcome IN ('completed', 'failed')
         ORDER BY finished_ms DESC, task DESC",
    )?;
    let mut tasks = newest.query([identity])?;
    let mut out = Vec::with_capacity(wanted);
    while out.len() < wanted
        && let Some(row) = tasks.next()?
    {
        let task: i64 = row.get(0)?;
        if let Some(seen) = attempt_usage(conn, task as u64)?.filter(|u| u.samples > 0) {
            out.push(seen);
        }
    }
    out.reverse();
    Ok(out)
}

/// The recommendation for a task `identity` of `pool` asking `request`, from what is stored.
pub fn recommend(
    conn: &Connection,
    identity: &str,
    pool: &str,
    request: &Request,
    prices: &PriceTable,
    at_ms: u64,
) -> Result<Result<Recommendation, NoRecommendation>, allot_store::rusqlite::Error> {
    let params = Params::default();
    let history: Vec<RunUsage> = recent_usage(conn, identity, params.window)?
        .iter()
        .map(RunUsage::from)
        .collect();
    let offers = offers(conn, pool, prices, at_ms)?;
    Ok(rightsize::recommend(&history, request, &offers, params))
}

#[cfg(test)]
mod tests;
