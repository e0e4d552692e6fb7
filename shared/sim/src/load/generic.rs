//! Allot's own minimal trace CSV, for traces converted from anywhere else.
//!
//! Required columns: `submit_time` (seconds after the trace's start), `duration` (seconds), both
//! possibly fractional, and `num_gpus` (whole GPUs). Optional columns, with their defaults when
//! the column or the field is absent:
//!
//! | column | meaning | default |
//! |---|---|---|
//! | `team` | the job's team | `default` |
//! | `gpu_milli` | share of each GPU, 1..=1000; below 1000 only with `num_gpus` = 1 | 1000 |
//! | `gpu_model` | accepted GPU model, or several separated by a vertical bar (`A10\|T4`) | any |
//! | `priority` | higher runs first where a policy honours priorities | 0 |
//! | `cpu_milli` | CPU, millicores | 0 |
//! | `memory_mib` | memory, MiB | 0 |
//!
//! Any other column is an error, so that a misspelt optional column is caught rather than
//! silently defaulted. Jobs are named `<file name>:<line>`; the trace defines no nodes or teams.

use std::path::Path;

use super::{CsvFile, DEFAULT_TEAM, gpu_models, next_job_id, sort_jobs};
use crate::trace::{LoadError, Trace, TraceJob};

const REQUIRED: [&str; 3] = ["submit_time", "duration", "num_gpus"];
const OPTIONAL: [&str; 6] = [
    "team",
    "gpu_milli",
    "gpu_model",
    "priority",
    "cpu_milli",
    "memory_mib",
];

/// Loads a generic trace CSV.
pub fn load(path: &Path) -> Result<Trace, LoadError> {
    let mut file = CsvFile::open(path)?;
    file.reject_unknown_columns(&[REQUIRED.as_slice(), OPTIONAL.as_slice()].concat())?;
    let submit_time = file.column("submit_time")?;
    let duration = file.column("duration")?;
    let num_gpus = file.column("num_gpus")?;
    let team = file.optional_column("team");
    let gpu_milli = file.optional_column("gpu_milli");
    let gpu_model = file.optional_column("gpu_model");
    let priority = file.optional_column("priority");
    let cpu_milli = file.optional_column("cpu_milli");
    let memory_mib = file.optional_column("memory_mib");

    let mut jobs = Vec::new();
    for row in file.rows() {
        let row = row?;
        let gpus: u32 = row.parse(num_gpus, "a whole number of GPUs")?;
        let milli = match gpu_milli.filter(|&column| !row.get(column).is_empty()) {
            None => 1000,
            Some(column) => {
                let milli: u32 = row.parse(column, "a share of a GPU in milli-GPU")?;
                if !(1..=1000).contains(&milli) {
                    return Err(row.error(
                        column,
                        format!("{milli} is not a share of a GPU (1..=1000 milli-GPU)"),
                    ));
                }
                if milli < 1000 && gpus != 1 {
                    return Err(row.error(
                        column,
                        format!(
                            "a fraction of a GPU ({milli} milli-GPU) needs num_gpus = 1, not {gpus}"
                        ),
                    ));
                }
                milli
            }
        };
        jobs.push(TraceJob {
            id: next_job_id(jobs.len(), &row)?,
            name: row.default_name(),
            submit: row.seconds(submit_time)?,
            duration: row.seconds(duration)?,
            gpus,
            // A CPU-only job asks for no share of a GPU, whatever the column says.
            gpu_milli: if gpus == 0 { 0 } else { milli },
            gpu_models: row
                .get_optional(gpu_model)
                .map(gpu_models)
                .unwrap_or_default(),
            team: row.get_optional(team).unwrap_or(DEFAULT_TEAM).to_owned(),
            priority: row.parse_optional(priority, "a whole number")?.unwrap_or(0),
            cpu_milli: row
                .parse_optional(cpu_milli, "CPU in millicores")?
                .unwrap_or(0),
            memory_mib: row
                .parse_optional(memory_mib, "memory in MiB")?
                .unwrap_or(0),
            deadline: None,
        });
    }
    sort_jobs(&mut jobs);
    Ok(Trace {
        source: format!("generic:{}", path.display()),
        jobs,
        nodes: Vec::new(),
        teams: Vec::new(),
    })
}
