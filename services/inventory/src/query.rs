//! What `allot status` asks: the cluster as the inventory sees it, over NATS request/reply.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use allot_store::rusqlite::{self, Connection};

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
    /// `ready` or `unreachable`.
    pub state: String,
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
}

impl ClusterStatus {
    /// Total GPUs.
    pub fn gpu_count(&self) -> usize {
        self.nodes.iter().map(|n| n.gpus.len()).sum()
    }
}

/// Reads the status from the inventory's database.
pub fn status(conn: &Connection, now: DateTime<Utc>) -> Result<ClusterStatus, rusqlite::Error> {
    let mut nodes_stmt = conn.prepare_cached(
        "SELECT name, pool, rack, reported_reachable, gpu_source, cpu_milli, memory_mib,
                last_heartbeat_at
         FROM nodes ORDER BY length(name), name",
    )?;
    let mut nodes: Vec<NodeStatus> = nodes_stmt
        .query_map([], |r| {
            Ok(NodeStatus {
                name: r.get(0)?,
                pool: r.get(1)?,
                rack: r.get(2)?,
                state: if r.get::<_, i64>(3)? == 1 {
                    "ready"
                } else {
                    "unreachable"
                }
                .to_owned(),
                gpu_source: r.get(4)?,
                cpu_milli: r.get::<_, i64>(5)? as u64,
                memory_mib: r.get::<_, i64>(6)? as u64,
                last_heartbeat_at: r
                    .get::<_, Option<String>>(7)?
                    .and_then(|s| DateTime::parse_from_rfc3339(&s).ok())
                    .map(|t| t.with_timezone(&Utc)),
                gpus: Vec::new(),
            })
        })?
        .collect::<Result<_, _>>()?;
    let mut gpus_stmt = conn.prepare_cached(
        "SELECT idx, uuid, model, health, health_reason, utilization_pct, memory_used_mib,
                memory_total_mib, temperature_c, power_mw
         FROM gpus WHERE node = ?1 ORDER BY idx",
    )?;
    for node in &mut nodes {
        node.gpus = gpus_stmt
            .query_map([&node.name], |r| {
                Ok(GpuStatus {
                    index: r.get(0)?,
                    uuid: r.get(1)?,
                    model: r.get(2)?,
                    health: r.get(3)?,
                    health_reason: r.get(4)?,
                    utilization_pct: r.get(5)?,
                    memory_used_mib: r.get::<_, Option<i64>>(6)?.map(|v| v as u64),
                    memory_total_mib: r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
                    temperature_c: r.get(8)?,
                    power_mw: r.get::<_, Option<i64>>(9)?.map(|v| v as u64),
                })
            })?
            .collect::<Result<_, _>>()?;
    }
    Ok(ClusterStatus { at: now, nodes })
}
