//! Query contracts: what clients ask services over NATS request/reply, and the answers'
//! shapes. The services answer them; clients only read them.
//!
//! - This module: the inventory's (`allot status`), answered by `allot_inventory::query`.
//! - [`planner`]: the planner's workloads (`allot workloads`, `allot workload ID`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub mod planner;

/// The name of the inventory's NATS micro-service (`nats micro ls` shows it).
pub const SERVICE_NAME: &str = "allot-inventory";
/// Endpoint subject for [`ClusterStatus`] (request body ignored).
pub const STATUS_SUBJECT: &str = "allot.query.inventory.status";

/// The cluster as the inventory sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// When the answer was computed.
    pub at: DateTime<Utc>,
    /// Every known node, by name.
    pub nodes: Vec<NodeStatus>,
}

/// One node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Node name.
    pub name: String,
    /// GPU pool.
    pub pool: String,
    /// Rack, when known.
    pub rack: Option<String>,
    /// `ready`, `unreachable`, `cordoned` (by an operator, or by remediation), `soft-cordoned`
    /// or `drained` (by remediation).
    pub state: String,
    /// Why it is not `ready`: who holds it and the rule or the operator's words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// `nvml`, `simulated`, or `unknown` before the registration is seen.
    pub gpu_source: String,
    /// Allocatable CPU, millicores.
    pub cpu_milli: u64,
    /// Allocatable memory, MiB.
    pub memory_mib: u64,
    /// Last heartbeat, as stored by the bus.
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// The node's GPUs, by index.
    pub gpus: Vec<GpuStatus>,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// Index on the node.
    pub index: u32,
    /// GPU id.
    pub uuid: String,
    /// Model, once registered.
    pub model: Option<String>,
    /// `healthy`, `degraded` or `unhealthy`.
    pub health: String,
    /// Why, when not healthy.
    pub health_reason: String,
    /// Why remediation took it out of service, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_service: Option<String>,
    /// Utilization at the last sample, percent.
    pub utilization_pct: Option<u8>,
    /// Memory used at the last sample, MiB.
    pub memory_used_mib: Option<u64>,
    /// Total memory, MiB.
    pub memory_total_mib: Option<u64>,
    /// Temperature at the last sample, °C.
    pub temperature_c: Option<u32>,
    /// Power draw at the last sample, mW.
    pub power_mw: Option<u64>,
    /// The runs holding it at the last sample (workload, task, lease, share), as its node's
    /// executor reported them.
    #[serde(default)]
    pub held_by: Vec<crate::telemetry::GpuHeld>,
}

impl ClusterStatus {
    /// Total GPUs.
    pub fn gpu_count(&self) -> usize {
        self.nodes.iter().map(|n| n.gpus.len()).sum()
    }
}
