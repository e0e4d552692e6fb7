//! What a trace is once loaded: jobs to replay and, when the trace has one, the cluster it ran
//! on. Every loader produces these types; the simulator consumes nothing else.

use std::fmt;
use std::path::PathBuf;

/// Milliseconds: trace times are relative to the trace's start, durations are run times.
pub type Millis = u64;

/// A job of a trace, as the simulator replays it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceJob {
    /// Position among the loaded jobs (0-based, in file order): ties in submit time keep it.
    pub id: u32,
    /// A name from the trace where it has one (`openb-pod-0017`), else `<file>:<line>`.
    pub name: String,
    /// When it was submitted, ms after the trace's start.
    pub submit: Millis,
    /// How long it runs once started on the GPUs it asked for (the oracle's duration).
    pub duration: Millis,
    /// GPUs requested: whole GPUs, or 1 with `gpu_milli` < 1000 for a fraction; 0 = CPU only.
    pub gpus: u32,
    /// Share of each requested GPU in milli-GPU: 1000 for whole GPUs, 1..=999 for a fraction.
    pub gpu_milli: u32,
    /// GPU models the job accepts; empty = any.
    pub gpu_models: Vec<String>,
    /// Team (Philly: the virtual cluster; openb: none → "default").
    pub team: String,
    /// Higher runs first where a policy honours priorities (0 when the trace has none).
    pub priority: i32,
    /// CPU requested, millicores (0 when the trace does not say).
    pub cpu_milli: u64,
    /// Memory requested, MiB (0 when the trace does not say).
    pub memory_mib: u64,
    /// When it should be done, ms after the trace's start (`None`: no deadline; no public
    /// trace records one, so only generated workloads have them).
    pub deadline: Option<Millis>,
}

impl TraceJob {
    /// The job as a scheduler task with id `id`; the true duration is disclosed only to oracle
    /// policies.
    pub fn task_spec(&self, id: u64, oracle: bool) -> allot_sched::TaskSpec {
        allot_sched::TaskSpec {
            priority: self.priority,
            gpus: self.gpus,
            gpu_milli: self.gpu_milli,
            gpu_models: self.gpu_models.clone(),
            cpu_milli: self.cpu_milli,
            memory_mib: self.memory_mib,
            deadline: self.deadline,
            oracle_duration: oracle.then_some(self.duration),
            ..allot_sched::TaskSpec::new(id, self.team.clone(), self.gpus)
        }
    }
}

/// A node of the trace's cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceNode {
    /// Node name.
    pub name: String,
    /// GPUs on the node.
    pub gpus: u32,
    /// GPU model (empty for CPU-only nodes).
    pub model: String,
    /// CPU, millicores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
}

/// A team and its nominal quota in whole GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceTeam {
    /// Team name.
    pub name: String,
    /// Nominal quota, GPUs.
    pub nominal_gpus: u32,
}

/// A loaded trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// Where it came from, for reports (`philly:../shared/traces/philly/jobs.csv`).
    pub source: String,
    /// The jobs, sorted by (submit, id).
    pub jobs: Vec<TraceJob>,
    /// The cluster, when the trace defines one (empty otherwise: the caller supplies it).
    pub nodes: Vec<TraceNode>,
    /// Teams with quotas, when the trace defines them.
    pub teams: Vec<TraceTeam>,
}

/// A trace that cannot be loaded, naming the file, line and column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct LoadError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line, when the problem is in one row.
    pub line: Option<u64>,
    /// The column (header name), when the problem is in one field.
    pub column: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(column) = &self.column {
            write!(f, ": column `{column}`")?;
        }
        write!(f, ": {}", self.message)
    }
}
