//! The Microsoft Philly trace, as processed by the Pollux artifact (`jobs.csv`: `timestamp`,
//! `duration`, `num_gpus`, `gpu_time`, `cluster`), with the nodes per virtual cluster of the
//! Helios artifact (`vc_nodes.csv`: `vc`, `node num`).
//!
//! The trace does not define the cluster the jobs ran on (the scenario does: `philly-640` is
//! 80 nodes × 8 GPUs), so [`Trace::nodes`] stays empty. Each listed VC becomes a team whose
//! nominal quota is its node count × 8 GPUs.

use std::collections::HashSet;
use std::path::Path;

use chrono::{NaiveDate, NaiveDateTime};

use super::{CsvFile, next_job_id, sort_jobs};
use crate::trace::{LoadError, Trace, TraceJob, TraceTeam};

/// GPUs per Philly node.
const GPUS_PER_NODE: u32 = 8;

/// How `timestamp` is written (UTC).
const TIMESTAMP_FORMAT: &str = "%Y-%m-%d %H:%M:%S";

/// The submit times to keep, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// First submit time kept; job submit times are counted from here.
    pub from: NaiveDateTime,
    /// Last submit time kept.
    pub to: NaiveDateTime,
}

impl Window {
    /// The window of the reference scenario `philly-640` (DESIGN.md): October and November 2017,
    /// 2017-10-01 00:00:00 to 2017-11-30 23:59:59.
    pub fn philly_640() -> Window {
        let at = |month, day, hour, min, sec| {
            NaiveDate::from_ymd_opt(2017, month, day)
                .and_then(|date| date.and_hms_opt(hour, min, sec))
                .expect("a valid calendar time")
        };
        Window {
            from: at(10, 1, 0, 0, 0),
            to: at(11, 30, 23, 59, 59),
        }
    }

    fn contains(&self, time: NaiveDateTime) -> bool {
        self.from <= time && time <= self.to
    }
}

/// Loads the jobs of `jobs` submitted within `window` (all of them when `None`) by the virtual
/// clusters listed in `vc_nodes`; jobs of other VCs are skipped.
///
/// Submit times count from `window.from`, or from the earliest kept job without a window. Every
/// row is checked, including those skipped, so a malformed file fails whatever the window.
/// `gpu_time` is not used (it is `duration × num_gpus`) and need not be present.
pub fn load(jobs: &Path, vc_nodes: &Path, window: Option<Window>) -> Result<Trace, LoadError> {
    let teams = load_teams(vc_nodes)?;
    let listed: HashSet<&str> = teams.iter().map(|team| team.name.as_str()).collect();

    let mut file = CsvFile::open(jobs)?;
    if let Some(window) = window
        && window.from > window.to
    {
        return Err(file.error(format!(
            "the window ends ({}) before it starts ({})",
            window.to, window.from
        )));
    }
    let timestamp = file.column("timestamp")?;
    let duration = file.column("duration")?;
    let num_gpus = file.column("num_gpus")?;
    let cluster = file.column("cluster")?;

    // Submit times are only known once the earliest kept job is, so keep the timestamps aside.
    let mut kept: Vec<(NaiveDateTime, TraceJob)> = Vec::new();
    for row in file.rows() {
        let row = row?;
        let field = row.get(timestamp);
        let submitted = NaiveDateTime::parse_from_str(field, TIMESTAMP_FORMAT).map_err(|_| {
            row.error(
                timestamp,
                format!("expected a UTC time like `2017-10-01 00:00:00`, found `{field}`"),
            )
        })?;
        let duration = row.seconds(duration)?;
        let gpus: u32 = row.parse(num_gpus, "a whole number of GPUs")?;
        let team = row.non_empty(cluster)?;
        if !listed.contains(team) || window.is_some_and(|window| !window.contains(submitted)) {
            continue;
        }
        let job = TraceJob {
            id: next_job_id(kept.len(), &row)?,
            name: row.default_name(),
            submit: 0,
            duration,
            gpus,
            gpu_milli: if gpus == 0 { 0 } else { 1000 },
            gpu_models: Vec::new(),
            team: team.to_owned(),
            priority: 0,
            cpu_milli: 0,
            memory_mib: 0,
            deadline: None,
        };
        kept.push((submitted, job));
    }

    let start = match window {
        Some(window) => Some(window.from),
        None => kept.iter().map(|(submitted, _)| *submitted).min(),
    };
    let mut jobs_out: Vec<TraceJob> = kept
        .into_iter()
        .map(|(submitted, mut job)| {
            let since_start = start.map_or(0, |start| (submitted - start).num_milliseconds());
            // Kept jobs are never before the start: it is the window's opening or the earliest.
            job.submit = u64::try_from(since_start).unwrap_or(0);
            job
        })
        .collect();
    sort_jobs(&mut jobs_out);

    Ok(Trace {
        source: format!("philly:{}", jobs.display()),
        jobs: jobs_out,
        nodes: Vec::new(),
        teams,
    })
}

/// The VCs of `vc_nodes.csv` in file order, each with nominal quota = nodes × 8 GPUs.
fn load_teams(vc_nodes: &Path) -> Result<Vec<TraceTeam>, LoadError> {
    let mut file = CsvFile::open(vc_nodes)?;
    let vc = file.column("vc")?;
    let node_num = file.column("node num")?;
    let mut teams: Vec<TraceTeam> = Vec::new();
    for row in file.rows() {
        let row = row?;
        let name = row.non_empty(vc)?;
        if teams.iter().any(|team| team.name == name) {
            return Err(row.error(vc, format!("VC `{name}` is listed twice")));
        }
        let nodes: u32 = row.parse(node_num, "a whole number of nodes")?;
        let nominal_gpus = nodes
            .checked_mul(GPUS_PER_NODE)
            .ok_or_else(|| row.error(node_num, format!("{nodes} nodes is too many")))?;
        teams.push(TraceTeam {
            name: name.to_owned(),
            nominal_gpus,
        });
    }
    Ok(teams)
}
