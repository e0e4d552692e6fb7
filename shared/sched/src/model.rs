//! The scheduler's vocabulary: time, ids, nodes and tasks as the core sees them.

use std::fmt;

/// Milliseconds on the caller's clock. The core never reads a clock: every input carries its
/// time, and the same inputs always give the same decisions.
pub type Time = u64;

/// A task's id, unique for the scheduler's lifetime (the allocator derives it from the
/// workload and task; the simulator uses the trace position).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId(pub u64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task-{}", self.0)
    }
}

/// A node's position in the cluster, in the order nodes were added (the placement tie-break:
/// lowest index first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeIdx(pub u32);

/// A lease: one grant of resources to one task; released exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(pub u64);

/// One milli-GPU is a thousandth of a GPU; a whole GPU is 1000.
pub const WHOLE_GPU_MILLI: u32 = 1000;

/// A node as it joins the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Node name.
    pub name: String,
    /// GPUs on the node.
    pub gpus: u32,
    /// Their model (one model per node).
    pub gpu_model: String,
    /// Allocatable CPU, millicores (0: not tracked).
    pub cpu_milli: u64,
    /// Allocatable memory, MiB (0: not tracked).
    pub memory_mib: u64,
}

impl NodeSpec {
    /// A node of `gpus` GPUs of `model`, CPU and memory not tracked.
    pub fn new(name: impl Into<String>, gpus: u32, model: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            gpus,
            gpu_model: model.into(),
            cpu_milli: 0,
            memory_mib: 0,
        }
    }
}

/// A task as submitted to the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub gpu_models: Vec<String>,
    /// CPU, millicores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// The true duration, known only in simulation; only oracle policies may read it.
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
            oracle_duration: None,
        }
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
        }
    }
}
