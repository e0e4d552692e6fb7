//! The inventory's tables and how each collector event — and each operator's cordon and
//! remediation action — changes them.
//!
//! Applying holds no decisions beyond the pure health rules in [`crate::health`]; what the
//! inventory *publishes* about these rows is the reporter's job. Telemetry and registrations
//! arrive on different streams in no fixed relative order, so each event touches only its own
//! columns and the final state does not depend on how the two interleave.

use allot_bus::Delivery;
use allot_events::node::{HeartbeatSent, NodeEvent, NodeRegistered};
use allot_events::remediation::Action;
use allot_events::telemetry::{GpuHeld, GpuSample, GpusSampled, TelemetryEvent};
use allot_events::{AnyEvent, EventKind, RemediationEvent, subject};
use allot_store::rusqlite::{self, Connection, params};

use crate::health;

/// The inventory's schema, in order. Never edit a shipped migration: add one.
pub const MIGRATIONS: &[&str] = &[
    "
CREATE TABLE nodes (
    name               TEXT PRIMARY KEY,
    hostname           TEXT NOT NULL,
    pool               TEXT NOT NULL,
    rack               TEXT,
    cpu_milli          INTEGER NOT NULL,
    memory_mib         INTEGER NOT NULL,
    gpu_source         TEXT NOT NULL,
    driver_version     TEXT,
    registered_at      TEXT NOT NULL,
    registrations      INTEGER NOT NULL DEFAULT 1,
    last_heartbeat_at  TEXT,
    last_heartbeat_seq INTEGER,
    heartbeats         INTEGER NOT NULL DEFAULT 0,
    -- what the reporter last published; not part of the projection of events
    reported_reachable INTEGER NOT NULL DEFAULT 1
) STRICT;

CREATE TABLE gpus (
    uuid             TEXT PRIMARY KEY,
    node             TEXT NOT NULL,
    idx              INTEGER NOT NULL,
    model            TEXT,
    memory_total_mib INTEGER,
    power_limit_mw   INTEGER,
    nvlink_peers     TEXT NOT NULL DEFAULT '[]',
    utilization_pct  INTEGER,
    memory_used_mib  INTEGER,
    temperature_c    INTEGER,
    power_mw         INTEGER,
    ecc_corrected    INTEGER,
    ecc_uncorrected  INTEGER,
    xid_errors       INTEGER,
    last_xid         INTEGER,
    sampled_at       TEXT,
    samples          INTEGER NOT NULL DEFAULT 0,
    health           TEXT NOT NULL DEFAULT 'healthy',
    health_reason    TEXT NOT NULL DEFAULT '',
    -- what the reporter last published; not part of the projection of events
    reported_health  TEXT NOT NULL DEFAULT 'healthy'
) STRICT;
CREATE INDEX gpus_by_node ON gpus (node, idx);
",
    "
-- What holds each GPU, as its node's executor last reported it (JSON array of GpuHeld).
ALTER TABLE gpus ADD COLUMN held_by TEXT NOT NULL DEFAULT '[]';
",
    "
-- Who holds a node out of service, and why: an operator's cordon, remediation's action.
CREATE TABLE node_holds (
    node            TEXT PRIMARY KEY,
    operator_reason TEXT,
    action          TEXT,
    action_reason   TEXT
) STRICT;
-- GPUs remediation took out of service.
CREATE TABLE gpus_out (
    node   TEXT NOT NULL,
    idx    INTEGER NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (node, idx)
) STRICT;
",
    "
-- The reporter looks every second for GPUs whose health it has not reported yet: usually
-- none, found without reading every GPU of the fleet.
CREATE INDEX gpus_unreported ON gpus (node, idx) WHERE health != reported_health;
",
];

/// Why an event cannot be applied (it is dead-lettered with this reason).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The event is not one the inventory consumes, or names something invalid.
    #[error("{0}")]
    Rejected(String),
    /// The database failed.
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

/// Checks, without touching the database, that the inventory can apply `delivery`; the reason
/// it cannot is the dead letter's reason.
pub fn check(delivery: &Delivery) -> Result<(), ApplyError> {
    let node = match &delivery.event.data {
        AnyEvent::Node(NodeEvent::Registered(e)) => &e.node,
        AnyEvent::Node(NodeEvent::HeartbeatSent(e)) => &e.node,
        AnyEvent::Telemetry(TelemetryEvent::GpusSampled(e)) => &e.node,
        AnyEvent::Remediation(r) => {
            let expected = r.nats_subject();
            if delivery.subject != expected {
                return Err(ApplyError::Rejected(format!(
                    "a remediation event about node {} arrived on {}, not {expected}",
                    r.entity(),
                    delivery.subject
                )));
            }
            return valid_node(&r.entity());
        }
        _ => {
            return Err(ApplyError::Rejected(format!(
                "inventory does not consume {}",
                delivery.event.ty
            )));
        }
    };
    valid_node(node)
}

/// Applies one delivered event to the tables (inside the caller's transaction).
pub fn apply(conn: &Connection, delivery: &Delivery) -> Result<(), ApplyError> {
    apply_all(conn, &[delivery])
}

/// Applies deliveries in order (inside the caller's transaction).
///
/// Consecutive telemetry is coalesced: each GPU's row is written once with the latest sample
/// and the number of samples, which leaves exactly the state that applying them one by one
/// would — at a fraction of the writes when a batch holds several samples per GPU.
pub fn apply_all(conn: &Connection, deliveries: &[&Delivery]) -> Result<(), ApplyError> {
    let mut telemetry = Coalesced::default();
    for delivery in deliveries {
        check(delivery)?;
        if let AnyEvent::Telemetry(TelemetryEvent::GpusSampled(e)) = &delivery.event.data {
            telemetry.add(e, delivery.published);
            continue;
        }
        let at = delivery.published.to_rfc3339();
        match &delivery.event.data {
            AnyEvent::Node(event) => {
                // Registrations also write GPU rows: keep the order by writing telemetry first.
                telemetry.flush(conn)?;
                match event {
                    NodeEvent::Registered(e) => registered(conn, e, &at)?,
                    NodeEvent::HeartbeatSent(e) => heartbeat(conn, e, &at)?,
                }
            }
            AnyEvent::Remediation(event) => {
                telemetry.flush(conn)?;
                remediation(conn, event)?;
            }
            _ => unreachable!("check() admits only node, telemetry and remediation events"),
        }
    }
    telemetry.flush(conn)
}

/// An operator's cordon, or remediation's action on a node or a GPU.
fn remediation(conn: &Connection, event: &RemediationEvent) -> Result<(), ApplyError> {
    match event {
        RemediationEvent::OperatorCordon(c) => {
            let reason = c
                .cordoned
                .then(|| format!("cordoned by {}: {}", c.by, c.reason));
            conn.execute(
                "INSERT INTO node_holds (node, operator_reason) VALUES (?1, ?2)
                 ON CONFLICT (node) DO UPDATE SET operator_reason = excluded.operator_reason",
                params![c.node, reason],
            )?;
        }
        RemediationEvent::ActionTaken(a) => {
            let hold = |action: Option<&str>| {
                conn.execute(
                    "INSERT INTO node_holds (node, action, action_reason) VALUES (?1, ?2, ?3)
                     ON CONFLICT (node) DO UPDATE SET
                        action = excluded.action, action_reason = excluded.action_reason",
                    params![a.node, action, action.map(|_| a.reason.as_str())],
                )
            };
            match (a.action, a.gpu) {
                (Action::SoftCordon | Action::Cordon | Action::Drain, _) => {
                    hold(Some(a.action.as_str()))?;
                }
                (Action::ReturnToService, _) => {
                    hold(None)?;
                }
                (Action::GpuOutOfService, Some(gpu)) => {
                    conn.execute(
                        "INSERT OR REPLACE INTO gpus_out (node, idx, reason) VALUES (?1, ?2, ?3)",
                        params![a.node, gpu, a.reason],
                    )?;
                }
                (Action::GpuReturnToService, Some(gpu)) => {
                    conn.execute(
                        "DELETE FROM gpus_out WHERE node = ?1 AND idx = ?2",
                        params![a.node, gpu],
                    )?;
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn valid_node(node: &str) -> Result<(), ApplyError> {
    subject::validate_token("node name", node).map_err(|e| ApplyError::Rejected(e.to_string()))
}

fn registered(conn: &Connection, e: &NodeRegistered, at: &str) -> Result<(), ApplyError> {
    valid_node(&e.node)?;
    conn.execute(
        "INSERT INTO nodes (name, hostname, pool, rack, cpu_milli, memory_mib, gpu_source,
                            driver_version, registered_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (name) DO UPDATE SET
            hostname = excluded.hostname, pool = excluded.pool, rack = excluded.rack,
            cpu_milli = excluded.cpu_milli, memory_mib = excluded.memory_mib,
            gpu_source = excluded.gpu_source, driver_version = excluded.driver_version,
            registered_at = excluded.registered_at, registrations = registrations + 1",
        params![
            e.node,
            e.hostname,
            e.pool,
            e.rack,
            e.cpu_milli as i64,
            e.memory_mib as i64,
            serde_json::to_value(e.gpu_source)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            e.driver_version,
            at,
        ],
    )?;
    // A re-registration describes the node's GPUs as they are now: forget GPUs it no longer has.
    let uuids: Vec<&str> = e.gpus.iter().map(|g| g.uuid.as_str()).collect();
    let keep = serde_json::to_string(&uuids).unwrap_or_default();
    conn.execute(
        "DELETE FROM gpus WHERE node = ?1 AND uuid NOT IN (SELECT value FROM json_each(?2))",
        params![e.node, keep],
    )?;
    let mut upsert = conn.prepare_cached(
        "INSERT INTO gpus (uuid, node, idx, model, memory_total_mib, power_limit_mw, nvlink_peers)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (uuid) DO UPDATE SET
            node = excluded.node, idx = excluded.idx, model = excluded.model,
            memory_total_mib = excluded.memory_total_mib, power_limit_mw = excluded.power_limit_mw,
            nvlink_peers = excluded.nvlink_peers",
    )?;
    for g in &e.gpus {
        upsert.execute(params![
            g.uuid,
            e.node,
            g.index,
            g.model,
            g.memory_total_mib as i64,
            g.power_limit_mw.map(|p| p as i64),
            serde_json::to_string(&g.nvlink_peers).unwrap_or_else(|_| "[]".into()),
        ])?;
    }
    Ok(())
}

fn heartbeat(conn: &Connection, e: &HeartbeatSent, at: &str) -> Result<(), ApplyError> {
    valid_node(&e.node)?;
    // A heartbeat from a node whose registration this consumer has not seen (different
    // stream order, or a registration that aged out) still counts: the row is created bare
    // and filled in when the registration arrives.
    conn.prepare_cached(
        "INSERT INTO nodes (name, hostname, pool, cpu_milli, memory_mib, gpu_source,
                            registered_at, registrations, last_heartbeat_at, last_heartbeat_seq, heartbeats)
         VALUES (?1, '', '', 0, 0, 'unknown', ?2, 0, ?2, ?3, 1)
         ON CONFLICT (name) DO UPDATE SET
            last_heartbeat_at = excluded.last_heartbeat_at,
            last_heartbeat_seq = excluded.last_heartbeat_seq,
            heartbeats = heartbeats + 1",
    )?
    .execute(params![e.node, at, e.seq as i64])?;
    Ok(())
}

/// Telemetry waiting to be written: per GPU, the latest sample and how many there were,
/// borrowed from the batch's deliveries — nothing is copied or formatted for a sample that a
/// later one in the same batch replaces.
#[derive(Default)]
struct Coalesced<'a> {
    order: Vec<&'a str>,
    gpus: std::collections::HashMap<&'a str, Pending<'a>>,
}

struct Pending<'a> {
    event: &'a GpusSampled,
    at: chrono::DateTime<chrono::Utc>,
    sample: &'a GpuSample,
    count: i64,
    /// The latest power limit reported, if any sample reported one.
    power_limit_mw: Option<u64>,
}

impl<'a> Coalesced<'a> {
    fn add(&mut self, e: &'a GpusSampled, at: chrono::DateTime<chrono::Utc>) {
        for s in &e.samples {
            match self.gpus.get_mut(s.uuid.as_str()) {
                Some(p) => {
                    p.event = e;
                    p.at = at;
                    p.sample = s;
                    p.count += 1;
                    p.power_limit_mw = s.power_limit_mw.or(p.power_limit_mw);
                }
                None => {
                    self.order.push(&s.uuid);
                    self.gpus.insert(
                        &s.uuid,
                        Pending {
                            event: e,
                            at,
                            sample: s,
                            count: 1,
                            power_limit_mw: s.power_limit_mw,
                        },
                    );
                }
            }
        }
    }

    fn flush(&mut self, conn: &Connection) -> Result<(), ApplyError> {
        if self.order.is_empty() {
            return Ok(());
        }
        // Two statements. The first updates a GPU's row in place and leaves its node and index
        // alone: setting them, even to the values they have, rewrites the GPU's entry in
        // `gpus_by_node`. It changes nothing for a GPU that now reports from another node or
        // index, and the second moves that one.
        macro_rules! upsert_sample {
            ($tail:literal) => {
                concat!(
                    "INSERT INTO gpus (uuid, node, idx, memory_total_mib, power_limit_mw,
                               utilization_pct, memory_used_mib, temperature_c, power_mw,
                               ecc_corrected, ecc_uncorrected, xid_errors, last_xid,
                               sampled_at, samples, health, health_reason, held_by)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                     ?18)
             ON CONFLICT (uuid) DO UPDATE SET
                memory_total_mib = excluded.memory_total_mib,
                power_limit_mw = coalesce(excluded.power_limit_mw, power_limit_mw),
                utilization_pct = excluded.utilization_pct, memory_used_mib = excluded.memory_used_mib,
                temperature_c = excluded.temperature_c, power_mw = excluded.power_mw,
                ecc_corrected = excluded.ecc_corrected, ecc_uncorrected = excluded.ecc_uncorrected,
                xid_errors = excluded.xid_errors, last_xid = excluded.last_xid,
                sampled_at = excluded.sampled_at, samples = samples + excluded.samples,
                health = excluded.health, health_reason = excluded.health_reason,
                held_by = excluded.held_by",
                    $tail
                )
            };
        }
        let mut in_place = conn.prepare_cached(upsert_sample!(
            " WHERE node = excluded.node AND idx = excluded.idx"
        ))?;
        let mut moved =
            conn.prepare_cached(upsert_sample!(", node = excluded.node, idx = excluded.idx"))?;
        for uuid in self.order.drain(..) {
            let Some(p) = self.gpus.remove(uuid) else {
                continue;
            };
            let s = p.sample;
            let (health, reason) = health::judge(s);
            // The runs holding the GPU at the latest sample (JSON array of `GpuHeld`).
            let held: Vec<&GpuHeld> = p.event.held.iter().filter(|h| h.index == s.index).collect();
            let held = serde_json::to_string(&held).expect("GpuHeld serializes");
            let row = params![
                uuid,
                p.event.node,
                s.index,
                s.memory_total_mib as i64,
                p.power_limit_mw.map(|v| v as i64),
                s.utilization_pct,
                s.memory_used_mib as i64,
                s.temperature_c,
                s.power_mw.map(|v| v as i64),
                s.ecc_corrected.map(|v| v as i64),
                s.ecc_uncorrected.map(|v| v as i64),
                s.xid_errors.map(|v| v as i64),
                s.last_xid.map(|v| v as i64),
                p.at.to_rfc3339(),
                p.count,
                health::as_str(health),
                reason,
                held,
            ];
            if in_place.execute(row)? == 0 {
                moved.execute(row)?;
            }
        }
        Ok(())
    }
}

/// A canonical text dump of everything the events determine (not what the reporter has
/// published): two inventories that applied the same events produce the same dump.
pub fn dump(conn: &Connection) -> Result<String, rusqlite::Error> {
    let mut out = String::new();
    let mut nodes = conn.prepare(
        "SELECT name, hostname, pool, rack, cpu_milli, memory_mib, gpu_source, driver_version,
                registrations, last_heartbeat_seq, heartbeats
         FROM nodes ORDER BY name",
    )?;
    let rows = nodes.query_map([], |r| {
        Ok(format!(
            "node {} host={} pool={} rack={:?} cpu={} mem={} src={} drv={:?} regs={} hb_seq={:?} hbs={}\n",
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, Option<String>>(3)?,
            r.get::<_, i64>(4)?,
            r.get::<_, i64>(5)?,
            r.get::<_, String>(6)?,
            r.get::<_, Option<String>>(7)?,
            r.get::<_, i64>(8)?,
            r.get::<_, Option<i64>>(9)?,
            r.get::<_, i64>(10)?,
        ))
    })?;
    for row in rows {
        out.push_str(&row?);
    }
    let mut gpus = conn.prepare(
        "SELECT uuid, node, idx, model, memory_total_mib, nvlink_peers, utilization_pct,
                memory_used_mib, temperature_c, power_mw, ecc_uncorrected, xid_errors, samples,
                health, health_reason
         FROM gpus ORDER BY node, idx, uuid",
    )?;
    let rows = gpus.query_map([], |r| {
        let mut line = String::from("gpu");
        for i in 0..15 {
            let v: rusqlite::types::Value = r.get(i)?;
            line.push(' ');
            line.push_str(&format!("{v:?}"));
        }
        line.push('\n');
        Ok(line)
    })?;
    for row in rows {
        out.push_str(&row?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
