//! The Alibaba GPU-sharing trace "openb" (clusterdata `cluster-trace-gpu-v2023`, the FGD paper's
//! trace): `pods.csv` (`name`, `cpu_milli`, `memory_mib`, `num_gpu`, `gpu_milli`, `gpu_spec`,
//! `qos`, `creation_time`, `deletion_time`, `scheduled_time`) and a node list (`sn`,
//! `cpu_milli`, `memory_mib`, `gpu`, `model`): `nodes.csv` for the GPU nodes, `nodes_all.csv`
//! for the whole cluster.
//!
//! Only `name`, `cpu_milli`, `memory_mib`, `num_gpu` and `gpu_milli` are required in the pod
//! list: FGD's published pod-list variants have just those. A missing optional column
//! constrains nothing — as if every field in it were empty.
//!
//! How pods become jobs:
//! - `submit` = `creation_time`; without that column every pod arrives at 0, in file order
//!   (the order FGD's experiment submits them in).
//! - `duration` = `deletion_time − scheduled_time` when both are present and in that order, else
//!   0 (pods never scheduled, or a file without those columns). The experiment this trace is
//!   known for (GPU packing, FGD) has no departures, so durations matter only to replays that
//!   choose to use them.
//! - A pod asks for a fraction of one GPU when `num_gpu` = 1 and 0 < `gpu_milli` < 1000; any other
//!   GPU pod asks for whole GPUs (`gpu_milli` 1000); `num_gpu` = 0 is a CPU-only pod
//!   (`gpu_milli` 0).
//! - `gpu_spec` lists the accepted GPU models separated by `|`; empty, `nan` or no such column
//!   accepts any.
//! - Priority from `qos`: LS (latency-sensitive), Guaranteed and Burstable → 1, BE (best
//!   effort) → 0. Kubernetes ranks Guaranteed above Burstable, but the trace has few of either
//!   (7 and 100 of 8,152 pods) and the FGD experiment treats them alike; what matters is that
//!   best-effort work yields to the rest. Without a `qos` column no pod is declared best effort:
//!   all are 1, and none yields to another.
//! - The trace has no teams: every job is in team "default".

use std::collections::HashSet;
use std::path::Path;

use super::{Column, CsvFile, DEFAULT_TEAM, Row, gpu_models, next_job_id, sort_jobs};
use crate::trace::{LoadError, Millis, Trace, TraceJob, TraceNode};

/// Loads the pods of `pods` as jobs and the nodes of `nodes` (`nodes.csv` or `nodes_all.csv`).
pub fn load(pods: &Path, nodes: &Path) -> Result<Trace, LoadError> {
    let mut jobs = load_pods(pods)?;
    sort_jobs(&mut jobs);
    Ok(Trace {
        source: format!("openb:{}", pods.display()),
        jobs,
        nodes: load_nodes(nodes)?,
        teams: Vec::new(),
    })
}

fn load_pods(pods: &Path) -> Result<Vec<TraceJob>, LoadError> {
    let mut file = CsvFile::open(pods)?;
    let name = file.column("name")?;
    let cpu_milli = file.column("cpu_milli")?;
    let memory_mib = file.column("memory_mib")?;
    let num_gpu = file.column("num_gpu")?;
    let gpu_milli = file.column("gpu_milli")?;
    let gpu_spec = file.optional_column("gpu_spec");
    let qos = file.optional_column("qos");
    let creation_time = file.optional_column("creation_time");
    let deletion_time = file.optional_column("deletion_time");
    let scheduled_time = file.optional_column("scheduled_time");

    let mut jobs = Vec::new();
    for row in file.rows() {
        let row = row?;
        let gpus: u32 = row.parse(num_gpu, "a whole number of GPUs")?;
        let milli: u32 = row.parse(gpu_milli, "a share of a GPU in milli-GPU")?;
        let duration = match (
            optional_seconds(&row, scheduled_time)?,
            optional_seconds(&row, deletion_time)?,
        ) {
            (Some(scheduled), Some(deleted)) if deleted >= scheduled => deleted - scheduled,
            _ => 0,
        };
        jobs.push(TraceJob {
            id: next_job_id(jobs.len(), &row)?,
            name: row.non_empty(name)?.to_owned(),
            submit: match creation_time {
                Some(column) => row.seconds(column)?,
                None => 0,
            },
            duration,
            gpus,
            gpu_milli: match gpus {
                0 => 0,
                1 if 0 < milli && milli < 1000 => milli,
                _ => 1000,
            },
            gpu_models: gpu_models(row.get_optional(gpu_spec).unwrap_or_default()),
            team: DEFAULT_TEAM.to_owned(),
            priority: priority(&row, qos)?,
            cpu_milli: row.parse(cpu_milli, "CPU in millicores")?,
            memory_mib: row.parse(memory_mib, "memory in MiB")?,
            deadline: None,
        });
    }
    Ok(jobs)
}

/// `column`'s field in seconds; `None` when the field is empty or the file has no such column.
fn optional_seconds(row: &Row<'_>, column: Option<Column>) -> Result<Option<Millis>, LoadError> {
    column.map_or(Ok(None), |column| row.seconds_optional(column))
}

/// Best effort yields to everything else; see the module documentation.
fn priority(row: &Row<'_>, qos: Option<Column>) -> Result<i32, LoadError> {
    let Some(qos) = qos else {
        return Ok(1);
    };
    match row.get(qos) {
        "LS" | "Guaranteed" | "Burstable" => Ok(1),
        "BE" => Ok(0),
        other => Err(row.error(
            qos,
            format!("unknown QoS `{other}` (expected LS, Guaranteed, Burstable or BE)"),
        )),
    }
}

fn load_nodes(nodes: &Path) -> Result<Vec<TraceNode>, LoadError> {
    let mut file = CsvFile::open(nodes)?;
    let sn = file.column("sn")?;
    let cpu_milli = file.column("cpu_milli")?;
    let memory_mib = file.column("memory_mib")?;
    let gpu = file.column("gpu")?;
    let model = file.column("model")?;

    let mut names = HashSet::new();
    let mut out = Vec::new();
    for row in file.rows() {
        let row = row?;
        let name = row.non_empty(sn)?;
        if !names.insert(name.to_owned()) {
            return Err(row.error(sn, format!("node `{name}` is listed twice")));
        }
        let model = match row.get(model) {
            // pandas writes a missing model (a CPU-only node) as `nan`.
            field if field.eq_ignore_ascii_case("nan") => "",
            field => field,
        };
        out.push(TraceNode {
            name: name.to_owned(),
            gpus: row.parse(gpu, "a whole number of GPUs")?,
            model: model.to_owned(),
            cpu_milli: row.parse(cpu_milli, "CPU in millicores")?,
            memory_mib: row.parse(memory_mib, "memory in MiB")?,
        });
    }
    Ok(out)
}
