//! The Tiresias simulator's traces (SymbioticLab/Tiresias): a job list (`job_id`, `num_gpu`,
//! `submit_time`, `duration`, both in seconds; `iterations`, `model_name` and `interval` are not
//! used) and a one-row cluster spec (`num_switch`, `num_node_p_switch`, `num_gpu_p_node`,
//! `num_cpu_p_node`, `mem_p_node` in GB).
//!
//! The spec becomes `num_switch × num_node_p_switch` identical nodes named `switch<s>-node<n>`
//! (both 0-based), with no GPU model. Jobs are named `job-<job_id>`, ask for whole GPUs, and are
//! all in team "default".

use std::path::Path;

use super::{CsvFile, DEFAULT_TEAM, next_job_id, sort_jobs};
use crate::trace::{LoadError, Trace, TraceJob, TraceNode};

/// Loads the jobs of `jobs` and the cluster of `cluster_spec`.
pub fn load(jobs: &Path, cluster_spec: &Path) -> Result<Trace, LoadError> {
    let nodes = load_cluster(cluster_spec)?;
    let mut jobs_out = load_jobs(jobs)?;
    sort_jobs(&mut jobs_out);
    Ok(Trace {
        source: format!("tiresias:{}", jobs.display()),
        jobs: jobs_out,
        nodes,
        teams: Vec::new(),
    })
}

fn load_jobs(jobs: &Path) -> Result<Vec<TraceJob>, LoadError> {
    let mut file = CsvFile::open(jobs)?;
    let job_id = file.column("job_id")?;
    let num_gpu = file.column("num_gpu")?;
    let submit_time = file.column("submit_time")?;
    let duration = file.column("duration")?;

    let mut out = Vec::new();
    for row in file.rows() {
        let row = row?;
        let gpus: u32 = row.parse(num_gpu, "a whole number of GPUs")?;
        out.push(TraceJob {
            id: next_job_id(out.len(), &row)?,
            name: format!("job-{}", row.non_empty(job_id)?),
            submit: row.seconds(submit_time)?,
            duration: row.seconds(duration)?,
            gpus,
            gpu_milli: if gpus == 0 { 0 } else { 1000 },
            gpu_models: Vec::new(),
            team: DEFAULT_TEAM.to_owned(),
            priority: 0,
            cpu_milli: 0,
            memory_mib: 0,
            deadline: None,
        });
    }
    Ok(out)
}

fn load_cluster(cluster_spec: &Path) -> Result<Vec<TraceNode>, LoadError> {
    let mut file = CsvFile::open(cluster_spec)?;
    let num_switch = file.column("num_switch")?;
    let num_node_p_switch = file.column("num_node_p_switch")?;
    let num_gpu_p_node = file.column("num_gpu_p_node")?;
    let num_cpu_p_node = file.column("num_cpu_p_node")?;
    let mem_p_node = file.column("mem_p_node")?;

    let mut rows = file.rows();
    let Some(row) = rows.next().transpose()? else {
        return Err(file.error("the cluster spec has no row"));
    };
    if let Some(extra) = rows.next().transpose()? {
        return Err(extra.row_error("the cluster spec has more than one row"));
    }
    let switches: u32 = row.parse(num_switch, "a whole number of switches")?;
    let nodes_per_switch: u32 = row.parse(num_node_p_switch, "a whole number of nodes")?;
    let gpus: u32 = row.parse(num_gpu_p_node, "a whole number of GPUs")?;
    let cpus: u64 = row.parse(num_cpu_p_node, "a whole number of CPUs")?;
    let mem_gb: u64 = row.parse(mem_p_node, "a whole number of GB")?;
    let cpu_milli = cpus
        .checked_mul(1000)
        .ok_or_else(|| row.error(num_cpu_p_node, "too many CPUs"))?;
    let memory_mib = mem_gb
        .checked_mul(1024)
        .ok_or_else(|| row.error(mem_p_node, "too much memory"))?;

    let mut nodes = Vec::new();
    for switch in 0..switches {
        for node in 0..nodes_per_switch {
            nodes.push(TraceNode {
                name: format!("switch{switch}-node{node}"),
                gpus,
                model: String::new(),
                cpu_milli,
                memory_mib,
            });
        }
    }
    Ok(nodes)
}
