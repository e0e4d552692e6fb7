//! The scheduler's vocabulary: time, ids, nodes and tasks as the core sees them.

use std::collections::BTreeMap;
use std::fmt;

/// Milliseconds on the caller's clock. The core never reads a clock: every input carries its
/// time, and the same inputs always give the same decisions.
pub type Time = u64;

/// A task's id, unique for the scheduler's lifetime (the allocator derives it from the
/// workload and task; the simulator uses the trace position).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(transparent)]
pub struct TaskId(pub u64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task-{}", self.0)
    }
}

/// A node's position in the cluster, in the order nodes were added (the placement tie-break:
/// lowest index first).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(transparent)]
pub struct NodeIdx(pub u32);

/// A lease: one grant of resources to one task; released exactly once.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(transparent)]
pub struct LeaseId(pub u64);

/// One milli-GPU is a thousandth of a GPU; a whole GPU is 1000.
pub const WHOLE_GPU_MILLI: u32 = 1000;

/// A node as it joins the cluster. One scheduler schedules one pool: the nodes it is given are
/// the pool's, and the quotas it is given are the pool's quotas.
#[derive(
    Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(default)]
pub struct NodeSpec {
    /// Node name.
    pub name: String,
    /// Whole GPUs on the node (not counting GPUs partitioned into MIG instances).
    pub gpus: u32,
    /// Their model (one model per node).
    pub gpu_model: String,
    /// Memory of each GPU, MiB (0: not tracked).
    pub gpu_memory_mib: u64,
    /// Allocatable CPU, millicores (0: not tracked).
    pub cpu_milli: u64,
    /// Allocatable memory, MiB (0: not tracked).
    pub memory_mib: u64,
    /// The NVLink (or NVSwitch) domain the node belongs to; empty: a domain of its own.
    pub nvlink_domain: String,
    /// The rack (or network block) it sits in; empty: unknown.
    pub rack: String,
    /// MIG instances the node offers besides its whole GPUs, by profile (`"1g.10gb"` → 7): the
    /// Kubernetes "mixed" strategy, where each profile is a resource of its own.
    pub mig: BTreeMap<String, u32>,
    /// What one of its GPUs costs per hour, in any unit common to the pool (0: unknown). When
    /// models have costs, a task that accepts several goes to the cheapest that fits
    /// (auto-tiering).
    pub gpu_cost: u64,
}

impl NodeSpec {
    /// A node of `gpus` GPUs of `model`, CPU and memory not tracked.
    pub fn new(name: impl Into<String>, gpus: u32, model: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            gpus,
            gpu_model: model.into(),
            ..Self::default()
        }
    }

    /// The node in NVLink domain `domain` of rack `rack`.
    pub fn in_topology(mut self, rack: impl Into<String>, domain: impl Into<String>) -> Self {
        self.rack = rack.into();
        self.nvlink_domain = domain.into();
        self
    }
}

/// A gang: tasks that start together or not at all (a distributed training job's workers).
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub struct Gang {
    /// Its name, unique for the scheduler's lifetime (the allocator uses workload/gang).
    pub name: String,
    /// How many tasks it has: none is placed before all have been submitted.
    pub size: u32,
}

/// What the DAG planner knows of a task's place in its pipeline.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub struct DagFacts {
    /// Tasks that wait for this one, directly or not.
    pub dependents: u32,
    /// Length of the longest chain of tasks from this one to the end of its pipeline
    /// (1: nothing follows it).
    pub critical_path_rank: u32,
}

/// Compute slices per GPU in NVIDIA's MIG profiles (`"3g.40gb"` has 3 of 7).
pub const MIG_SLICES_PER_GPU: u32 = 7;

/// The milli-GPU a MIG profile amounts to, from its compute slices (`"3g.40gb"` → 428), if the
/// name has the `<n>g.<m>gb` form.
pub fn mig_milli(profile: &str) -> Option<u32> {
    let slices: u32 = profile.split_once('g')?.0.parse().ok()?;
    (1..=MIG_SLICES_PER_GPU)
        .contains(&slices)
        .then(|| slices * WHOLE_GPU_MILLI / MIG_SLICES_PER_GPU)
}

/// A task as submitted to the scheduler.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct TaskSpec {
    /// Unique id.
    pub id: TaskId,
    /// Owning team.
    pub team: String,
    /// Higher is more important.
    pub priority: i32,
    /// Whole GPUs, or 1 with `gpu_milli` < 1000 for a fraction; 0 for a CPU-only task.
    pub gpus: u32,
    /// Milli-GPU per GPU: 1000 for whole GPUs.
    pub gpu_milli: u32,
    /// Accepted GPU models; empty = any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_models: Vec<String>,
    /// CPU, millicores.
    #[serde(default)]
    pub cpu_milli: u64,
    /// Memory, MiB.
    #[serde(default)]
    pub memory_mib: u64,
    /// GPU memory needed on each GPU, MiB (0: any); a fraction goes only to a GPU with this
    /// much memory free.
    #[serde(default)]
    pub gpu_memory_mib: u64,
    /// A MIG profile: the task takes one MIG instance of it instead of GPUs (set by
    /// [`TaskSpec::mig`], which also sets `gpus` and `gpu_milli` to its share of a GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// The gang it belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<Gang>,
    /// Its place in its pipeline: among equals, tasks that unblock more go first.
    #[serde(default)]
    pub dag: DagFacts,
    /// A predicted run time from the predictor (not the truth: any policy may read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_duration: Option<Time>,
    /// How often it checkpoints, ms of run time (`None`: never — a preemption loses all of
    /// its current run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<Time>,
    /// Its usage limit: once a run has lasted this long, any waiting task may preempt it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runtime: Option<Time>,
    /// When it should be done, on the scheduler's clock. Policies that keep deadlines (`allot`)
    /// start work that would otherwise miss its deadline ahead of equal priorities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Time>,
    /// The true duration, known only in simulation; only oracle policies may read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_duration: Option<Time>,
}

impl TaskSpec {
    /// A task of `gpus` whole GPUs for `team`, priority 0, any model.
    pub fn new(id: u64, team: impl Into<String>, gpus: u32) -> Self {
        Self {
            id: TaskId(id),
            team: team.into(),
            priority: 0,
            gpus,
            gpu_milli: WHOLE_GPU_MILLI,
            gpu_models: Vec::new(),
            cpu_milli: 0,
            memory_mib: 0,
            gpu_memory_mib: 0,
            mig_profile: None,
            gang: None,
            dag: DagFacts::default(),
            predicted_duration: None,
            checkpoint_every: None,
            max_runtime: None,
            deadline: None,
            oracle_duration: None,
        }
    }

    /// A task that takes one MIG instance of `profile` (see [`mig_milli`]; an unknown profile
    /// name counts as a whole GPU).
    pub fn mig(id: u64, team: impl Into<String>, profile: impl Into<String>) -> Self {
        let profile = profile.into();
        let mut task = Self::new(id, team, 1);
        task.gpu_milli = mig_milli(&profile).unwrap_or(WHOLE_GPU_MILLI);
        task.mig_profile = Some(profile);
        task
    }

    /// The task as a member of `gang`.
    pub fn in_gang(mut self, name: impl Into<String>, size: u32) -> Self {
        self.gang = Some(Gang {
            name: name.into(),
            size,
        });
        self
    }

    /// GPU demand in milli-GPU.
    pub fn gpu_demand_milli(&self) -> u64 {
        u64::from(self.gpus) * u64::from(self.gpu_milli)
    }

    /// Whether the task accepts GPUs of `model`.
    pub fn accepts(&self, model: &str) -> bool {
        self.gpu_models.is_empty() || self.gpu_models.iter().any(|m| m == model)
    }
}

/// What placement depends on in a request — tasks with equal shapes fit in exactly the same
/// places. Accepted models are sorted and deduplicated, so their order does not matter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestShape {
    /// GPUs.
    pub gpus: u32,
    /// Milli-GPU per GPU.
    pub gpu_milli: u32,
    /// Accepted models, sorted; empty = any.
    pub gpu_models: Vec<String>,
    /// CPU, millicores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// GPU memory per GPU, MiB.
    pub gpu_memory_mib: u64,
    /// MIG profile.
    pub mig_profile: Option<String>,
}

impl RequestShape {
    /// The shape of `task`.
    pub fn of(task: &TaskSpec) -> Self {
        let mut gpu_models = task.gpu_models.clone();
        gpu_models.sort_unstable();
        gpu_models.dedup();
        Self {
            gpus: task.gpus,
            gpu_milli: task.gpu_milli,
            gpu_models,
            cpu_milli: task.cpu_milli,
            memory_mib: task.memory_mib,
            gpu_memory_mib: task.gpu_memory_mib,
            mig_profile: task.mig_profile.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_profiles_count_their_compute_slices() {
        for (profile, want) in [
            ("1g.10gb", Some(142)),
            ("3g.40gb", Some(428)),
            ("7g.80gb", Some(1000)),
            ("8g.90gb", None),
            ("big", None),
        ] {
            assert_eq!(mig_milli(profile), want, "{profile}");
        }
    }
}
