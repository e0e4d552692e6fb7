//! What `allot status` asks: the cluster as the inventory sees it, over NATS request/reply. The
//! contract (subject, answer) lives in `allot_events::query`; this module computes the answer.

use chrono::{DateTime, Utc};

use allot_store::rusqlite::{self, Connection};

pub use allot_events::query::{ClusterStatus, GpuStatus, NodeStatus, SERVICE_NAME, STATUS_SUBJECT};

/// Reads the status from the inventory's database.
pub fn status(conn: &Connection, now: DateTime<Utc>) -> Result<ClusterStatus, rusqlite::Error> {
    let mut nodes_stmt = conn.prepare_cached(
        "SELECT name, pool, rack, reported_reachable, gpu_source, cpu_milli, memory_mib,
                last_heartbeat_at, h.operator_reason, h.action, h.action_reason
         FROM nodes LEFT JOIN node_holds h ON h.node = nodes.name
         ORDER BY length(name), name",
    )?;
    let mut nodes: Vec<NodeStatus> = nodes_stmt
        .query_map([], |r| {
            let reachable = r.get::<_, i64>(3)? == 1;
            let operator: Option<String> = r.get(8)?;
            let action: Option<String> = r.get(9)?;
            let action_reason: Option<String> = r.get(10)?;
            let (state, reason) = node_state(reachable, operator, action, action_reason);
            Ok(NodeStatus {
                name: r.get(0)?,
                pool: r.get(1)?,
                rack: r.get(2)?,
                state,
                reason,
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
        "SELECT g.idx, uuid, model, health, health_reason, utilization_pct, memory_used_mib,
                memory_total_mib, temperature_c, power_mw, held_by, o.reason
         FROM gpus g LEFT JOIN gpus_out o ON o.node = g.node AND o.idx = g.idx
         WHERE g.node = ?1 ORDER BY g.idx",
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
                    out_of_service: r.get(11)?,
                    utilization_pct: r.get(5)?,
                    memory_used_mib: r.get::<_, Option<i64>>(6)?.map(|v| v as u64),
                    memory_total_mib: r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
                    temperature_c: r.get(8)?,
                    power_mw: r.get::<_, Option<i64>>(9)?.map(|v| v as u64),
                    // Written by this service from a typed event: unreadable only if edited.
                    held_by: serde_json::from_str(&r.get::<_, String>(10)?).unwrap_or_default(),
                })
            })?
            .collect::<Result<_, _>>()?;
    }
    Ok(ClusterStatus { at: now, nodes })
}

/// A node's state and why: unreachable first (nothing reaches it), then an operator's cordon
/// (remediation leaves it alone), then remediation's action.
fn node_state(
    reachable: bool,
    operator: Option<String>,
    action: Option<String>,
    action_reason: Option<String>,
) -> (String, String) {
    let remediation = action.map(|a| {
        let state = match a.as_str() {
            "soft_cordon" => "soft-cordoned",
            "drain" => "drained",
            _ => "cordoned",
        };
        (state, action_reason.unwrap_or_default())
    });
    let (state, reason) = match (reachable, operator, remediation) {
        (false, operator, remediation) => (
            "unreachable",
            operator.or(remediation.map(|(_, r)| r)).unwrap_or_default(),
        ),
        (true, Some(why), _) => ("cordoned", why),
        (true, None, Some((state, why))) => (state, why),
        (true, None, None) => ("ready", String::new()),
    };
    (state.to_owned(), reason)
}
