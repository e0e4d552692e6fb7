//! The gateway's read models: what every stream says, projected into SQLite exactly once.
//!
//! One projection per stream ([`allot_store::Projection`]: the rows and the stream position
//! commit in one transaction, so a redelivery or a restart never applies an event twice), all
//! in `gateway.db`. Besides the tables the API reads, each projection appends what changed to
//! `changes`: the log `GET /api/v1/events` streams. Its ids are assigned by SQLite as rows are
//! written, and writers are serialised (every apply transaction begins `IMMEDIATE`), so a
//! reader that has seen id *n* can never later find a new row below *n*: resuming after
//! `Last-Event-ID: n` loses nothing and repeats nothing.
//!
//! Telemetry is not projected here: the latest readings are kept in memory
//! ([`crate::samples`]), and not logged as changes (one a second per GPU would drown the log).

use allot_bus::consumer::Delivery;
use allot_events::alloc::Applied;
use allot_events::cost::BudgetLevel;
use allot_events::task::StopCause;
use allot_events::{
    AccessEvent, AllocEvent, AnyEvent, CostEvent, InventoryEvent, NodeEvent, RemediationEvent,
    TaskEvent, WorkloadEvent,
};
use allot_sched::{Decision, Input, RunEnd};
use allot_store::rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

/// The schema. Never edit a shipped script: add one.
pub const MIGRATIONS: &[&str] = &["
-- Workloads as submitted, and how they ended.
CREATE TABLE workloads (
    id           TEXT PRIMARY KEY,
    seq          INTEGER NOT NULL UNIQUE,   -- WORKLOADS stream sequence of the submission
    team         TEXT NOT NULL,
    name         TEXT NOT NULL,
    project      TEXT,
    submitter    TEXT NOT NULL,
    submitted_at TEXT NOT NULL,
    state        TEXT NOT NULL,             -- running | succeeded | failed | aborted
    reason       TEXT,
    finished_at  TEXT,
    spec         TEXT NOT NULL
) STRICT;
CREATE INDEX workloads_team ON workloads (team, seq);

-- Each task of each workload, as it stands.
CREATE TABLE tasks (
    workload     TEXT NOT NULL,
    name         TEXT NOT NULL,
    team         TEXT NOT NULL,
    position     INTEGER NOT NULL,          -- its place in the spec
    after        TEXT NOT NULL,             -- JSON array of the tasks it waits for
    gpus         TEXT,                      -- as requested
    state        TEXT NOT NULL,             -- pending | waiting | running | succeeded | failed | cancelled | preempted
    attempt      INTEGER NOT NULL DEFAULT 0,
    task_id      INTEGER,                   -- the current attempt's id
    pool         TEXT,
    node         TEXT,
    reason       TEXT,
    eta_ms       INTEGER,
    predicted_ms INTEGER,
    updated_at   TEXT NOT NULL,
    PRIMARY KEY (workload, name)
) STRICT;

-- Every attempt's id, to name the task that an event about an attempt concerns.
CREATE TABLE attempts (
    task_id  INTEGER PRIMARY KEY,
    workload TEXT NOT NULL,
    name     TEXT NOT NULL,
    team     TEXT NOT NULL,
    attempt  INTEGER NOT NULL
) STRICT;

-- Every decision and every input about a task, from the allocators' journals.
CREATE TABLE decisions (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    stream_seq INTEGER NOT NULL,
    pool       TEXT NOT NULL,
    entry      INTEGER NOT NULL,
    at_ms      INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    task_id    INTEGER,
    team       TEXT,
    workload   TEXT,
    name       TEXT,
    detail     TEXT NOT NULL               -- JSON
) STRICT;
CREATE INDEX decisions_task ON decisions (task_id, id);
CREATE INDEX decisions_team ON decisions (team, id);

-- Nodes, as registered, with reachability and holds.
CREATE TABLE nodes (
    name           TEXT PRIMARY KEY,
    pool           TEXT NOT NULL,
    hostname       TEXT NOT NULL,
    rack           TEXT,
    cpu_milli      INTEGER NOT NULL,
    memory_mib     INTEGER NOT NULL,
    gpu_source     TEXT NOT NULL,
    registered_at  TEXT NOT NULL,
    last_heartbeat TEXT,
    reachable      INTEGER NOT NULL DEFAULT 1,
    state          TEXT NOT NULL DEFAULT 'ready',   -- ready | soft-cordoned | cordoned | drained
    state_reason   TEXT,
    operator_hold  TEXT                             -- an operator's cordon reason
) STRICT;

-- Each GPU: what it is, its health and its last reading.
CREATE TABLE gpus (
    node          TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    uuid          TEXT NOT NULL,
    model         TEXT NOT NULL,
    memory_mib    INTEGER NOT NULL,
    health        TEXT NOT NULL DEFAULT 'healthy',
    in_service    INTEGER NOT NULL DEFAULT 1,
    utilization   INTEGER,
    temperature_c INTEGER,
    memory_used   INTEGER,
    power_mw      INTEGER,
    sampled_at    TEXT,
    PRIMARY KEY (node, idx)
) STRICT;

-- Cost events (each once, by event id).
CREATE TABLE costs (
    event_id  TEXT PRIMARY KEY,
    team      TEXT NOT NULL,
    workload  TEXT NOT NULL,
    task_name TEXT NOT NULL,
    pool      TEXT NOT NULL,
    from_ms   INTEGER NOT NULL,
    to_ms     INTEGER NOT NULL,
    currency  TEXT NOT NULL,
    amount    INTEGER NOT NULL,             -- micro-units
    at        TEXT NOT NULL
) STRICT;
CREATE INDEX costs_team ON costs (team, workload);

-- Each team's budget state per period, as billing last announced it.
CREATE TABLE budgets (
    team     TEXT NOT NULL,
    period   TEXT NOT NULL,
    level    TEXT NOT NULL,
    spent    INTEGER NOT NULL,
    budget   INTEGER NOT NULL,
    currency TEXT NOT NULL,
    at       TEXT NOT NULL,
    PRIMARY KEY (team, period)
) STRICT;

-- API tokens (hashes only).
CREATE TABLE tokens (
    token_id    TEXT PRIMARY KEY,
    sha256      TEXT NOT NULL UNIQUE,
    team        TEXT NOT NULL,
    role        TEXT NOT NULL,
    issued_by   TEXT NOT NULL,
    description TEXT NOT NULL,
    expires     TEXT,
    issued_at   TEXT NOT NULL,
    revoked_at  TEXT
) STRICT;

-- What changed, in order: the live event log (SSE ids).
CREATE TABLE changes (
    id   INTEGER PRIMARY KEY AUTOINCREMENT,
    at   TEXT NOT NULL,
    kind TEXT NOT NULL,
    team TEXT,                              -- NULL: of the cluster, for everyone
    data TEXT NOT NULL
) STRICT;
", "
-- The latest readings are kept in memory now (crate::samples), not projected.
ALTER TABLE gpus DROP COLUMN utilization;
ALTER TABLE gpus DROP COLUMN temperature_c;
ALTER TABLE gpus DROP COLUMN memory_used;
ALTER TABLE gpus DROP COLUMN power_mw;
ALTER TABLE gpus DROP COLUMN sampled_at;
", "
-- Events about an attempt name its task id: without an index, each update by task id read
-- the whole table (at fleet scale, a quarter of the gateway's time by the end of the run).
CREATE INDEX tasks_task_id ON tasks (task_id);
", "
-- What each team's workloads have cost so far, per currency: added to as each cost event is
-- stored (once, by its id), so `GET /costs` reads a row per workload instead of adding up every
-- event (one per open lease per billing period: millions a day at fleet scale).
CREATE TABLE cost_totals (
    team     TEXT NOT NULL,
    currency TEXT NOT NULL,
    workload TEXT NOT NULL,
    amount   INTEGER NOT NULL,              -- micro-units
    PRIMARY KEY (team, currency, workload)
) STRICT;
INSERT INTO cost_totals (team, currency, workload, amount)
    SELECT team, currency, workload, SUM(amount) FROM costs GROUP BY team, currency, workload;
", "
-- How many of each team's workloads are in each state: kept by the triggers below in the
-- transaction that stores or ends a workload, so `GET /kpis` reads a row per team and state
-- instead of counting every workload ever submitted.
CREATE TABLE workload_counts (
    team  TEXT NOT NULL,
    state TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (team, state)
) STRICT;
INSERT INTO workload_counts (team, state, count)
    SELECT team, state, COUNT(*) FROM workloads GROUP BY team, state;
CREATE TRIGGER workload_counted AFTER INSERT ON workloads BEGIN
    INSERT INTO workload_counts (team, state, count) VALUES (NEW.team, NEW.state, 1)
        ON CONFLICT (team, state) DO UPDATE SET count = count + 1;
END;
CREATE TRIGGER workload_recounted AFTER UPDATE OF state ON workloads
    WHEN OLD.state IS NOT NEW.state BEGIN
    UPDATE workload_counts SET count = count - 1 WHERE team = OLD.team AND state = OLD.state;
    INSERT INTO workload_counts (team, state, count) VALUES (NEW.team, NEW.state, 1)
        ON CONFLICT (team, state) DO UPDATE SET count = count + 1;
END;
CREATE TRIGGER workload_uncounted AFTER DELETE ON workloads BEGIN
    UPDATE workload_counts SET count = count - 1 WHERE team = OLD.team AND state = OLD.state;
END;
", "
-- Retention (`prune`): finished workloads by when they finished, and each workload's
-- attempts, so its decisions are found through `decisions_task`.
CREATE INDEX workloads_finished ON workloads (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX attempts_workload ON attempts (workload);
", "
-- Bumped by every node registration, in its transaction: a submission's capacity check reads
-- the fleet's shape again only when it moved (at 2,000 nodes reading it took 7.6 ms).
CREATE TABLE fleet_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
) STRICT;
INSERT INTO fleet_version (id, version) VALUES (1, 0);
", "
-- The lease of each attempt's newest run seen starting: a late report about a run superseded
-- since (a moved task's old run, stopping while the new one starts) leaves the state alone.
ALTER TABLE attempts ADD COLUMN lease INTEGER;
"];

/// The fleet's version: it moves with every node registration.
pub fn fleet_version(c: &Connection) -> Result<i64> {
    c.prepare_cached("SELECT version FROM fleet_version WHERE id = 1")?
        .query_row([], |r| r.get(0))
}

/// What one [`prune`] took out.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    /// Workloads, with their tasks, attempts and decisions.
    pub workloads: usize,
    /// Decisions about no workload the gateway knows (a node joining, a quota).
    pub decisions: usize,
}

/// Takes out of the read models, in one transaction, up to `batch` workloads that finished
/// before `before` — with their tasks, attempts and the decisions about them — and up to
/// `batch` decisions about no workload made before it. Their costs stay (`GET /costs` adds
/// them up); the journal on the bus keeps every decision for `allot replay` and audits.
pub fn prune(conn: &mut Connection, before: DateTime<Utc>, batch: usize) -> Result<Pruned> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let finished_before = before.to_rfc3339_opts(chrono::SecondsFormat::Secs, false);
    let workloads: Vec<String> = tx
        .prepare_cached(
            "SELECT id FROM workloads WHERE finished_at IS NOT NULL AND finished_at < ?1 \
             ORDER BY finished_at LIMIT ?2",
        )?
        .query_map(params![finished_before, batch as i64], |r| r.get(0))?
        .collect::<Result<_>>()?;
    for id in &workloads {
        exec(
            &tx,
            "DELETE FROM decisions WHERE task_id IN (SELECT task_id FROM attempts \
             WHERE workload = ?1)",
            params![id],
        )?;
        exec(&tx, "DELETE FROM attempts WHERE workload = ?1", params![id])?;
        exec(&tx, "DELETE FROM tasks WHERE workload = ?1", params![id])?;
        exec(&tx, "DELETE FROM workloads WHERE id = ?1", params![id])?;
    }
    // Oldest first, so the rows scanned past are the few about workloads still kept.
    let decisions = exec(
        &tx,
        "DELETE FROM decisions WHERE id IN (SELECT id FROM decisions WHERE workload IS NULL \
         AND at_ms < ?1 ORDER BY id LIMIT ?2)",
        params![before.timestamp_millis(), batch as i64],
    )?;
    tx.commit()?;
    Ok(Pruned {
        workloads: workloads.len(),
        decisions,
    })
}

/// `GET /kpis`'s workloads by state, of one team or (`NULL`) all.
pub const WORKLOADS_BY_STATE: &str = "SELECT state, SUM(count) FROM workload_counts \
     WHERE (?1 IS NULL OR team = ?1) AND count > 0 GROUP BY state";

/// How many changes the log keeps (older ones are trimmed; a client resuming from before the
/// oldest is told to reload).
pub const CHANGES_KEPT: i64 = 100_000;

type Result<T> = allot_store::rusqlite::Result<T>;

/// A task's prediction, by its attempt's id.
const SET_PREDICTED: &str = "UPDATE tasks SET predicted_ms = ?2 WHERE task_id = ?1";

/// Why a waiting task waits and its ETA, by its attempt's id.
const SET_WAITING: &str =
    "UPDATE tasks SET reason = ?2, eta_ms = ?3 WHERE task_id = ?1 AND state = 'waiting'";

/// Runs one statement through the connection's statement cache: a projection applies the same
/// few statements to every delivery, and parsing each one again was a tenth of the gateway's
/// time at fleet scale.
fn exec(tx: &Connection, sql: &str, params: impl allot_store::rusqlite::Params) -> Result<usize> {
    tx.prepare_cached(sql)?.execute(params)
}

/// Appends a change to the log.
fn change(
    tx: &Connection,
    d: &Delivery,
    kind: &str,
    team: Option<&str>,
    data: Value,
) -> Result<()> {
    exec(
        tx,
        "INSERT INTO changes (at, kind, team, data) VALUES (?1, ?2, ?3, ?4)",
        params![d.published.to_rfc3339(), kind, team, data.to_string()],
    )?;
    let id = tx.last_insert_rowid();
    if id % 1_000 == 0 {
        exec(
            tx,
            "DELETE FROM changes WHERE id <= ?1",
            [id - CHANGES_KEPT],
        )?;
    }
    Ok(())
}

/// WORKLOADS: workloads and their tasks' lifecycle.
pub fn apply_workloads(tx: &Connection, d: &Delivery) -> Result<()> {
    let now = d.published.to_rfc3339();
    match &d.event.data {
        AnyEvent::Workload(WorkloadEvent::Submitted(s)) => {
            let spec = &s.spec;
            let inserted = exec(
                tx,
                "INSERT OR IGNORE INTO workloads (id, seq, team, name, project, submitter, \
                 submitted_at, state, spec) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', ?8)",
                params![
                    s.workload_id,
                    d.stream_sequence as i64,
                    spec.metadata.team,
                    spec.metadata.name,
                    spec.metadata.project,
                    s.submitter,
                    now,
                    serde_json::to_string(spec).unwrap_or_default(),
                ],
            )?;
            if inserted == 0 {
                return Ok(());
            }
            for (i, t) in spec.spec.tasks.iter().enumerate() {
                exec(
                    tx,
                    "INSERT OR IGNORE INTO tasks (workload, name, team, position, after, gpus, \
                     state, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', ?7)",
                    params![
                        s.workload_id,
                        t.name,
                        spec.metadata.team,
                        i as i64,
                        serde_json::to_string(&t.after).unwrap_or_default(),
                        serde_json::to_value(&t.resources.gpus)
                            .ok()
                            .filter(|v| !v.is_null())
                            .map(|v| v.to_string()),
                        now,
                    ],
                )?;
            }
            change(
                tx,
                d,
                "workload",
                Some(&spec.metadata.team),
                json!({"workload": s.workload_id, "state": "running", "name": spec.metadata.name,
                       "submitter": s.submitter}),
            )
        }
        AnyEvent::Workload(WorkloadEvent::Aborted(a)) => change(
            tx,
            d,
            "abort_requested",
            Some(&a.team),
            json!({"workload": a.workload_id, "task": a.task, "by": a.by, "reason": a.reason}),
        ),
        AnyEvent::Workload(WorkloadEvent::AbortAnswered(a)) => change(
            tx,
            d,
            "abort_answered",
            Some(&a.team),
            serde_json::to_value(a).unwrap_or_default(),
        ),
        AnyEvent::Workload(WorkloadEvent::Finished(f)) => {
            let state = match f.outcome {
                allot_events::workload::WorkloadOutcome::Succeeded => "succeeded",
                allot_events::workload::WorkloadOutcome::Failed => "failed",
                allot_events::workload::WorkloadOutcome::Aborted => "aborted",
            };
            exec(
                tx,
                "UPDATE workloads SET state = ?2, reason = ?3, finished_at = ?4 WHERE id = ?1",
                params![f.workload_id, state, f.reason, now],
            )?;
            change(
                tx,
                d,
                "workload",
                Some(&f.team),
                json!({"workload": f.workload_id, "state": state, "reason": f.reason}),
            )
        }
        AnyEvent::Task(e) => apply_task(tx, d, e, &now),
        _ => Ok(()),
    }
}

fn apply_task(tx: &Connection, d: &Delivery, e: &TaskEvent, now: &str) -> Result<()> {
    let (task_id, state, node, reason): (u64, &str, Option<&str>, Option<String>) = match e {
        TaskEvent::Ready(r) => {
            exec(
                tx,
                "INSERT OR IGNORE INTO attempts (task_id, workload, name, team, attempt) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    r.task.id.0 as i64,
                    r.workload,
                    r.name,
                    r.task.team,
                    r.run.attempt as i64
                ],
            )?;
            exec(
                tx,
                "UPDATE tasks SET state = 'waiting', attempt = ?3, task_id = ?4, pool = ?5, \
                 node = NULL, reason = NULL, eta_ms = NULL, updated_at = ?6 \
                 WHERE workload = ?1 AND name = ?2",
                params![
                    r.workload,
                    r.name,
                    r.run.attempt as i64,
                    r.task.id.0 as i64,
                    r.pool,
                    now
                ],
            )?;
            (r.task.id.0, "waiting", None, None)
        }
        TaskEvent::Started(s) => {
            // The newest run so far (or the same one again), or a late start of an older one
            // (or of an attempt never seen): nothing to show then.
            let newest = exec(
                tx,
                "UPDATE attempts SET lease = ?2 \
                 WHERE task_id = ?1 AND (lease IS NULL OR lease <= ?2)",
                params![s.task.0 as i64, s.lease.0 as i64],
            )?;
            if newest == 0 {
                return Ok(());
            }
            (s.task.0, "running", Some(s.node.as_str()), None)
        }
        TaskEvent::Completed(c) => {
            if superseded(tx, c.task.0, Some(c.lease.0))? {
                return Ok(());
            }
            (c.task.0, "succeeded", Some(c.node.as_str()), None)
        }
        TaskEvent::Failed(f) => {
            if superseded(tx, f.task.0, Some(f.lease.0))? {
                return Ok(());
            }
            (
                f.task.0,
                "failed",
                Some(f.node.as_str()),
                Some(f.reason.clone()),
            )
        }
        TaskEvent::Cancelled(c) => (c.task.0, "cancelled", None, Some(c.reason.clone())),
        TaskEvent::Stopped(s) => {
            if superseded(tx, s.task.0, s.lease.map(|l| l.0))? {
                return Ok(());
            }
            let state = match s.cause {
                StopCause::Preempted => "preempted",
                StopCause::Cancelled => "cancelled",
            };
            (s.task.0, state, Some(s.node.as_str()), None)
        }
        TaskEvent::Predicted(p) => {
            exec(
                tx,
                SET_PREDICTED,
                params![p.task.0 as i64, p.duration_ms as i64],
            )?;
            return Ok(());
        }
        TaskEvent::Preload(_) | TaskEvent::Checkpointed(_) => return Ok(()),
    };
    let Some((workload, name, team)) = attempt(tx, task_id)? else {
        return Ok(());
    };
    // A late event about an earlier attempt does not overwrite the current one's state.
    let updated = exec(
        tx,
        "UPDATE tasks SET state = ?3, node = COALESCE(?4, node), reason = ?5, updated_at = ?6 \
         WHERE workload = ?1 AND name = ?2 AND task_id = ?7",
        params![workload, name, state, node, reason, now, task_id as i64],
    )?;
    if updated == 0 {
        return Ok(());
    }
    change(
        tx,
        d,
        "task",
        Some(&team),
        json!({"workload": workload, "task": name, "task_id": task_id, "state": state,
               "node": node, "reason": reason}),
    )
}

/// Whether a report about run `lease` of attempt `task_id` is about a run superseded since
/// (a newer one started): late news that must not overwrite the newer run's state. A report
/// that names no lease (from an executor older than the field) is taken as it comes.
fn superseded(tx: &Connection, task_id: u64, lease: Option<u64>) -> Result<bool> {
    let Some(lease) = lease else {
        return Ok(false);
    };
    let newest: Option<i64> = tx
        .prepare_cached("SELECT lease FROM attempts WHERE task_id = ?1")?
        .query_row([task_id as i64], |r| r.get(0))
        .optional()?
        .flatten();
    Ok(newest.is_some_and(|newest| newest != lease as i64))
}

/// The workload, name and team of attempt `task_id`, if its `TaskReady` was seen.
pub fn attempt(tx: &Connection, task_id: u64) -> Result<Option<(String, String, String)>> {
    // Asked for every decision and every task report: the statement is parsed once.
    tx.prepare_cached("SELECT workload, name, team FROM attempts WHERE task_id = ?1")?
        .query_row([task_id as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()
}

/// DECISIONS: every input about a task and every decision, per task and team.
pub fn apply_decisions(tx: &Connection, d: &Delivery) -> Result<()> {
    let AnyEvent::Alloc(AllocEvent::Applied(a)) = &d.event.data else {
        return Ok(());
    };
    for (kind, task, detail) in facts(a) {
        let who = match task {
            Some(t) => attempt(tx, t)?,
            None => None,
        };
        let team = who
            .as_ref()
            .map(|w| w.2.clone())
            .or_else(|| match &a.entry.input {
                Input::TaskSubmitted { task: spec, .. } if Some(spec.id.0) == task => {
                    Some(spec.team.clone())
                }
                _ => None,
            });
        exec(
            tx,
            "INSERT INTO decisions (stream_seq, pool, entry, at_ms, kind, task_id, team, \
             workload, name, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                d.stream_sequence as i64,
                a.pool,
                a.entry.seq as i64,
                a.entry.input.at().unwrap_or(0) as i64,
                kind,
                task.map(|t| t as i64),
                team,
                who.as_ref().map(|w| &w.0),
                who.as_ref().map(|w| &w.1),
                detail.to_string(),
            ],
        )?;
        if kind == "waiting"
            && let Some(t) = task
        {
            exec(
                tx,
                SET_WAITING,
                params![
                    t as i64,
                    detail["reason"].as_str(),
                    detail["eta_ms"].as_i64()
                ],
            )?;
        }
        if kind != "waiting" || a.entry.decisions.len() < 64 {
            change(
                tx,
                d,
                "decision",
                team.as_deref(),
                json!({"pool": a.pool, "entry": a.entry.seq, "kind": kind, "task_id": task,
                       "workload": who.as_ref().map(|w| &w.0), "task": who.as_ref().map(|w| &w.1),
                       "detail": detail}),
            )?;
        }
    }
    Ok(())
}

/// A run's end as a decision's detail: `{"run": {"outcome": "completed", "lease": 7}}`, or `{}`.
fn ended(run: &Option<RunEnd>) -> Value {
    run.as_ref()
        .map_or_else(|| json!({}), |run| json!({ "run": run }))
}

/// What one journal entry says, task by task: `(kind, task, detail)`.
pub fn facts(a: &Applied) -> Vec<(&'static str, Option<u64>, Value)> {
    let mut out = Vec::new();
    let e = &a.entry;
    match &e.input {
        Input::TaskSubmitted { task, .. } => out.push((
            "submitted",
            Some(task.id.0),
            json!({"priority": task.priority, "gpus": task.gpus, "gpu_milli": task.gpu_milli,
                   "models": task.gpu_models, "predicted_ms": task.predicted_duration}),
        )),
        // How the run ended, with its lease, where the journal says.
        Input::TaskFinished { task, run, .. } => out.push(("finished", Some(task.0), ended(run))),
        Input::TaskRequeued { task, .. } => out.push(("requeued", Some(task.0), json!({}))),
        Input::TaskWithdrawn { task, run, .. } => {
            out.push(("withdrawn", Some(task.0), ended(run)));
        }
        Input::TaskPredicted { task, duration, .. } => {
            out.push(("predicted", Some(task.0), json!({"predicted_ms": duration})));
        }
        _ => {}
    }
    if let Some(why) = &e.rejected {
        out.push(("rejected", None, json!({"reason": why})));
    }
    for decision in &e.decisions {
        match decision {
            Decision::Granted {
                task,
                lease,
                reason,
                ..
            } => {
                let nodes: Vec<Value> = a
                    .dispatch
                    .iter()
                    .filter(|d| d.task == *task)
                    .flat_map(|d| d.nodes.iter())
                    .map(|g| json!({"node": g.node, "gpus": g.gpus, "model": g.gpu_model}))
                    .collect();
                out.push((
                    "granted",
                    Some(task.0),
                    json!({"lease": lease.0, "reason": reason, "nodes": nodes}),
                ));
            }
            Decision::Waiting {
                task,
                reason,
                eta,
                at_risk,
                ..
            } => out.push((
                "waiting",
                Some(task.0),
                json!({"reason": reason.to_string(), "eta_ms": eta, "at_risk": at_risk}),
            )),
            Decision::Preempted {
                task,
                lease,
                for_task,
                ..
            } => out.push((
                "preempted",
                Some(task.0),
                json!({"lease": lease.0, "for_task": for_task.map(|t| t.0)}),
            )),
            Decision::Released { task, lease, .. } => {
                out.push(("released", Some(task.0), json!({"lease": lease.0})));
            }
            Decision::Withdrawn { task, reason, .. } => {
                out.push(("withdrawn", Some(task.0), json!({"reason": reason})));
            }
            Decision::Reserved { task, until, .. } => {
                out.push(("reserved", Some(task.0), json!({"until_ms": until})));
            }
        }
    }
    out
}

/// FLEET: nodes as registered, and their heartbeats.
pub fn apply_fleet(tx: &Connection, d: &Delivery) -> Result<()> {
    let now = d.published.to_rfc3339();
    match &d.event.data {
        AnyEvent::Node(NodeEvent::Registered(r)) => {
            exec(
                tx,
                "INSERT INTO nodes (name, pool, hostname, rack, cpu_milli, memory_mib, gpu_source, \
                 registered_at, last_heartbeat) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8) \
                 ON CONFLICT (name) DO UPDATE SET pool = ?2, hostname = ?3, rack = ?4, \
                 cpu_milli = ?5, memory_mib = ?6, gpu_source = ?7, registered_at = ?8, \
                 last_heartbeat = ?8, reachable = 1",
                params![
                    r.node,
                    r.pool,
                    r.hostname,
                    r.rack,
                    r.cpu_milli as i64,
                    r.memory_mib as i64,
                    serde_json::to_value(r.gpu_source)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    now
                ],
            )?;
            exec(
                tx,
                "UPDATE fleet_version SET version = version + 1 WHERE id = 1",
                [],
            )?;
            for g in &r.gpus {
                exec(
                    tx,
                    "INSERT INTO gpus (node, idx, uuid, model, memory_mib) VALUES (?1, ?2, ?3, ?4, ?5) \
                     ON CONFLICT (node, idx) DO UPDATE SET uuid = ?3, model = ?4, memory_mib = ?5",
                    params![
                        r.node,
                        g.index as i64,
                        g.uuid,
                        g.model,
                        g.memory_total_mib as i64
                    ],
                )?;
            }
            change(
                tx,
                d,
                "node",
                None,
                json!({"node": r.node, "event": "registered", "gpus": r.gpus.len()}),
            )
        }
        AnyEvent::Node(NodeEvent::HeartbeatSent(h)) => {
            exec(
                tx,
                "UPDATE nodes SET last_heartbeat = ?2 WHERE name = ?1",
                params![h.node, now],
            )?;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// INVENTORY: reachability and GPU health.
pub fn apply_inventory(tx: &Connection, d: &Delivery) -> Result<()> {
    match &d.event.data {
        AnyEvent::Inventory(InventoryEvent::NodeUnreachable(u)) => {
            exec(
                tx,
                "UPDATE nodes SET reachable = 0 WHERE name = ?1",
                [&u.node],
            )?;
            change(
                tx,
                d,
                "node",
                None,
                json!({"node": u.node, "event": "unreachable"}),
            )
        }
        AnyEvent::Inventory(InventoryEvent::NodeRecovered(r)) => {
            exec(
                tx,
                "UPDATE nodes SET reachable = 1 WHERE name = ?1",
                [&r.node],
            )?;
            change(
                tx,
                d,
                "node",
                None,
                json!({"node": r.node, "event": "recovered"}),
            )
        }
        AnyEvent::Inventory(InventoryEvent::GpuHealthChanged(g)) => {
            let health = serde_json::to_value(g.to)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            exec(
                tx,
                "UPDATE gpus SET health = ?3 WHERE node = ?1 AND idx = ?2",
                params![g.node, g.index as i64, health],
            )?;
            change(
                tx,
                d,
                "node",
                None,
                json!({"node": g.node, "event": "gpu_health", "gpu": g.index, "health": health,
                       "reason": g.reason}),
            )
        }
        _ => Ok(()),
    }
}

/// REMEDIATION: holds on nodes, GPUs out of service.
pub fn apply_remediation(tx: &Connection, d: &Delivery) -> Result<()> {
    use allot_events::remediation::Action;
    match &d.event.data {
        AnyEvent::Remediation(RemediationEvent::ActionTaken(a)) => {
            let node_state = match a.action {
                Action::SoftCordon => Some("soft-cordoned"),
                Action::Cordon => Some("cordoned"),
                Action::Drain => Some("drained"),
                Action::ReturnToService => Some("ready"),
                _ => None,
            };
            if a.downgraded.is_none()
                && let Some(state) = node_state
            {
                exec(
                    tx,
                    "UPDATE nodes SET state = ?2, state_reason = ?3 WHERE name = ?1",
                    params![a.node, state, a.reason],
                )?;
            }
            if let Some(gpu) = a.gpu {
                let in_service = match a.action {
                    Action::GpuOutOfService => Some(0),
                    Action::GpuReturnToService => Some(1),
                    _ => None,
                };
                if let Some(v) = in_service {
                    exec(
                        tx,
                        "UPDATE gpus SET in_service = ?3 WHERE node = ?1 AND idx = ?2",
                        params![a.node, gpu as i64, v],
                    )?;
                }
            }
            change(
                tx,
                d,
                "remediation",
                None,
                json!({"node": a.node, "gpu": a.gpu, "action": a.action.as_str(), "rule": a.rule,
                       "reason": a.reason}),
            )
        }
        AnyEvent::Remediation(RemediationEvent::OperatorCordon(c)) => {
            let hold = c.cordoned.then(|| c.reason.clone());
            exec(
                tx,
                "UPDATE nodes SET operator_hold = ?2 WHERE name = ?1",
                params![c.node, hold],
            )?;
            change(
                tx,
                d,
                "node",
                None,
                json!({"node": c.node, "event": if c.cordoned {"cordoned"} else {"uncordoned"},
                       "reason": c.reason, "by": c.by}),
            )
        }
        _ => Ok(()),
    }
}

/// COSTS: every cost event once; budgets as last announced.
pub fn apply_costs(tx: &Connection, d: &Delivery) -> Result<()> {
    let at = d.published.to_rfc3339();
    match &d.event.data {
        AnyEvent::Cost(CostEvent::Accrued(c)) => {
            let inserted = exec(
                tx,
                "INSERT OR IGNORE INTO costs (event_id, team, workload, task_name, pool, from_ms, \
                 to_ms, currency, amount, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    d.event.id.to_string(),
                    c.team,
                    c.workload,
                    c.task_name,
                    c.pool,
                    c.from_ms as i64,
                    c.to_ms as i64,
                    c.currency,
                    c.amount,
                    at
                ],
            )?;
            if inserted == 0 {
                return Ok(());
            }
            exec(
                tx,
                "INSERT INTO cost_totals (team, currency, workload, amount) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (team, currency, workload) DO UPDATE SET
                    amount = amount + excluded.amount",
                params![c.team, c.currency, c.workload, c.amount],
            )?;
            change(
                tx,
                d,
                "cost",
                Some(&c.team),
                json!({"team": c.team, "workload": c.workload, "task": c.task_name,
                       "amount_micros": c.amount, "currency": c.currency}),
            )
        }
        AnyEvent::Cost(CostEvent::BudgetCrossed(b)) => {
            let level = match b.level {
                BudgetLevel::Warning => "warning",
                BudgetLevel::Exceeded => "exceeded",
                BudgetLevel::Within => "within",
            };
            exec(
                tx,
                "INSERT INTO budgets (team, period, level, spent, budget, currency, at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (team, period) DO UPDATE \
                 SET level = ?3, spent = ?4, budget = ?5, currency = ?6, at = ?7",
                params![b.team, b.period, level, b.spent, b.budget, b.currency, at],
            )?;
            change(
                tx,
                d,
                "budget",
                Some(&b.team),
                json!({"team": b.team, "period": b.period, "level": level, "spent_micros": b.spent,
                       "budget_micros": b.budget, "currency": b.currency}),
            )
        }
        _ => Ok(()),
    }
}

/// ACCESS: tokens issued and revoked.
pub fn apply_access(tx: &Connection, d: &Delivery) -> Result<()> {
    match &d.event.data {
        AnyEvent::Access(AccessEvent::TokenIssued(t)) => {
            exec(
                tx,
                "INSERT OR IGNORE INTO tokens (token_id, sha256, team, role, issued_by, description, \
                 expires, issued_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    t.token_id,
                    t.sha256,
                    t.team,
                    t.role.as_str(),
                    t.by,
                    t.description,
                    t.expires.map(|e| e.to_rfc3339()),
                    d.published.to_rfc3339()
                ],
            )?;
            Ok(())
        }
        AnyEvent::Access(AccessEvent::TokenRevoked(t)) => {
            exec(
                tx,
                "UPDATE tokens SET revoked_at = ?2 WHERE token_id = ?1 AND team = ?3",
                params![t.token_id, d.published.to_rfc3339(), t.team],
            )?;
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A `gateway.db` of the version that projected telemetry opens under this one: its GPUs
    /// are kept, their readings' columns dropped (the readings live in memory now).
    #[test]
    fn a_database_with_projected_readings_opens_and_keeps_its_gpus() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.db");
        let old = allot_store::open(&path, &MIGRATIONS[..1]).unwrap();
        old.execute(
            "INSERT INTO gpus (node, idx, uuid, model, memory_mib, utilization, sampled_at) \
             VALUES ('n1', 0, 'GPU-1', 'H100', 81559, 97, '2026-11-25T00:00:00Z')",
            [],
        )
        .unwrap();
        drop(old);
        let now = allot_store::open(&path, MIGRATIONS).unwrap();
        let kept: (String, i64) = now
            .query_row("SELECT uuid, memory_mib FROM gpus", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!(kept, ("GPU-1".to_owned(), 81559));
        let columns: Vec<String> = now
            .prepare("SELECT name FROM pragma_table_info('gpus')")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<std::result::Result<_, _>>()
            .unwrap();
        assert!(!columns.iter().any(|c| c == "utilization"), "{columns:?}");
    }

    /// The counts `GET /kpis` reads are the workloads counted, team by team and state by
    /// state, after any mix of submissions, ends (some repeated) and a database opened with
    /// workloads already in it.
    #[test]
    fn workload_counts_follow_every_submission_and_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.db");
        let insert = |c: &Connection, i: u32, team: &str| {
            c.execute(
                "INSERT INTO workloads (id, seq, team, name, submitter, submitted_at, state, \
                 spec) VALUES (?1, ?2, ?3, 'w', 'ci', 't', 'running', '{}')",
                params![format!("w{i}"), i, team],
            )
            .unwrap();
        };
        let end = |c: &Connection, i: u32, state: &str| {
            c.execute(
                "UPDATE workloads SET state = ?2 WHERE id = ?1",
                params![format!("w{i}"), state],
            )
            .unwrap();
        };
        // Workloads stored before the counts existed are counted when the table is made.
        let counts = MIGRATIONS
            .iter()
            .position(|m| m.contains("CREATE TABLE workload_counts"))
            .unwrap();
        let old = allot_store::open(&path, &MIGRATIONS[..counts]).unwrap();
        for i in 0..5 {
            insert(&old, i, "vision");
        }
        end(&old, 0, "failed");
        drop(old);
        let c = allot_store::open(&path, MIGRATIONS).unwrap();
        let states = ["succeeded", "failed", "aborted", "running"];
        for i in 5..200 {
            insert(&c, i, ["vision", "nlp", "speech"][i as usize % 3]);
            // Ends, some of them told twice, some of earlier workloads.
            let ended = (i * 7) % i.max(1);
            end(&c, ended, states[(i % 4) as usize]);
            end(&c, ended, states[(i % 4) as usize]);
        }
        c.execute("DELETE FROM workloads WHERE id = 'w3'", [])
            .unwrap();
        for team in [None, Some("vision"), Some("nlp"), Some("ghost")] {
            let read = |sql: &str| -> BTreeMap<String, i64> {
                c.prepare(sql)
                    .unwrap()
                    .query_map(params![team], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap()
                    .collect::<std::result::Result<_, _>>()
                    .unwrap()
            };
            let counted = read(
                "SELECT state, COUNT(*) FROM workloads WHERE (?1 IS NULL OR team = ?1) \
                 GROUP BY state",
            );
            assert_eq!(read(WORKLOADS_BY_STATE), counted, "team {team:?}");
        }
    }

    /// A moved task's old run stops and fails (killed at the end of its grace period) after
    /// the new run started elsewhere: those late reports name the old lease and leave the
    /// task running where it runs now; the new run's own end is shown.
    #[test]
    fn late_reports_of_a_superseded_run_leave_the_new_run_shown() {
        use allot_events::task::{
            RunSpec, StopCause, TaskCompleted, TaskFailed, TaskReady, TaskStarted, TaskStopped,
        };
        use allot_sched::{LeaseId, TaskId, TaskSpec};
        let c = allot_store::open_in_memory(MIGRATIONS).unwrap();
        let checked = allot_workload::check(
            "apiVersion: allot/v1\nkind: Workload\nmetadata: {name: job, team: vision}\n\
             spec:\n  tasks:\n    - {name: train, command: [\"true\"], resources: {gpus: 1}}\n",
            allot_workload::Format::Yaml,
            Default::default(),
        )
        .unwrap();
        let key = allot_workload::submit::idempotency_key(&checked.workload, None);
        let s = allot_workload::submit::submission(
            checked.workload,
            key,
            None,
            "ci".into(),
            "/test",
            Utc::now(),
        );
        let mut seq = 0;
        let mut apply = |event: AnyEvent| {
            seq += 1;
            let d = Delivery::first(seq, allot_events::Envelope::new("/test", event), Utc::now());
            apply_workloads(&c, &d).unwrap();
        };
        let AnyEvent::Workload(WorkloadEvent::Submitted(sub)) = s.envelope.data.clone() else {
            unreachable!()
        };
        let workload = sub.workload_id.clone();
        apply(WorkloadEvent::Submitted(sub).into());
        apply(
            TaskEvent::Ready(TaskReady {
                pool: "default".into(),
                workload: workload.clone(),
                name: "train".into(),
                task: TaskSpec::new(100, "vision", 1),
                run: RunSpec::default(),
            })
            .into(),
        );
        let started = |lease: u64, node: &str| -> AnyEvent {
            TaskEvent::Started(TaskStarted {
                pool: "default".into(),
                task: TaskId(100),
                node: node.into(),
                lease: LeaseId(lease),
                workload: workload.clone(),
                name: "train".into(),
                how: "simulated".into(),
                log: None,
            })
            .into()
        };
        apply(started(1, "n1"));
        apply(started(2, "n2"));
        apply(
            TaskEvent::Stopped(TaskStopped {
                pool: "default".into(),
                task: TaskId(100),
                node: "n1".into(),
                cause: StopCause::Preempted,
                checkpointed: false,
                killed: true,
                ran_ms: 4_000,
                lease: Some(LeaseId(1)),
            })
            .into(),
        );
        apply(
            TaskEvent::Failed(TaskFailed {
                pool: "default".into(),
                task: TaskId(100),
                node: "n1".into(),
                lease: LeaseId(1),
                reason: "killed by signal 9".into(),
            })
            .into(),
        );
        // A start of the old run delivered late changes nothing either.
        apply(started(1, "n1"));
        let shown = |c: &Connection| -> (String, String) {
            c.query_row(
                "SELECT state, node FROM tasks WHERE name = 'train'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap()
        };
        assert_eq!(shown(&c), ("running".to_owned(), "n2".to_owned()));
        apply(
            TaskEvent::Completed(TaskCompleted {
                pool: "default".into(),
                task: TaskId(100),
                node: "n2".into(),
                lease: LeaseId(2),
            })
            .into(),
        );
        assert_eq!(shown(&c), ("succeeded".to_owned(), "n2".to_owned()));
    }

    /// Retention takes out what finished before the cut-off — the workload, its tasks, its
    /// attempts, the decisions about them — and the decisions about no workload made before
    /// it; a workload still running, or finished since, keeps all of it, and so do costs.
    #[test]
    fn prune_takes_out_what_finished_before_the_cut_off_and_nothing_else() {
        let mut c = allot_store::open_in_memory(MIGRATIONS).unwrap();
        let day = |d: u32| -> DateTime<Utc> {
            format!("2026-10-{d:02}T12:00:00.5+00:00").parse().unwrap()
        };
        // Workload i has one task whose attempts are 10i and 10i + 1; each attempt has two
        // decisions, and each day one decision is about a node.
        let workload = |c: &Connection, i: i64, finished: Option<u32>| {
            let state = if finished.is_some() {
                "succeeded"
            } else {
                "running"
            };
            c.execute(
                "INSERT INTO workloads (id, seq, team, name, submitter, submitted_at, state, \
                 finished_at, spec) VALUES (?1, ?2, 'vision', 'w', 'ci', 't', ?3, ?4, '{}')",
                params![
                    format!("w{i}"),
                    i,
                    state,
                    finished.map(|d| day(d).to_rfc3339())
                ],
            )
            .unwrap();
            c.execute(
                "INSERT INTO tasks (workload, name, team, position, after, state, task_id, \
                 updated_at) VALUES (?1, 'train', 'vision', 0, '[]', ?2, ?3, 't')",
                params![format!("w{i}"), state, 10 * i + 1],
            )
            .unwrap();
            for attempt in [10 * i, 10 * i + 1] {
                c.execute(
                    "INSERT INTO attempts (task_id, workload, name, team, attempt) \
                     VALUES (?1, ?2, 'train', 'vision', ?3)",
                    params![attempt, format!("w{i}"), attempt % 10],
                )
                .unwrap();
                for kind in ["submitted", "granted"] {
                    c.execute(
                        "INSERT INTO decisions (stream_seq, pool, entry, at_ms, kind, task_id, \
                         team, workload, name, detail) VALUES (1, 'p', 1, 0, ?1, ?2, \
                         'vision', ?3, 'train', '{}')",
                        params![kind, attempt, format!("w{i}")],
                    )
                    .unwrap();
                }
            }
            c.execute(
                "INSERT INTO costs (event_id, team, workload, task_name, pool, from_ms, to_ms, \
                 currency, amount, at) VALUES (?1, 'vision', ?1, 'train', 'p', 0, 1, 'EUR', 7, 't')",
                params![format!("w{i}")],
            )
            .unwrap();
        };
        for d in 1..=20 {
            workload(&c, i64::from(d), Some(d));
            c.execute(
                "INSERT INTO decisions (stream_seq, pool, entry, at_ms, kind, detail) \
                 VALUES (1, 'p', 1, ?1, 'node_added', '{}')",
                params![day(d).timestamp_millis()],
            )
            .unwrap();
        }
        workload(&c, 21, None);
        let count =
            |c: &Connection, sql: &str| -> i64 { c.query_row(sql, [], |r| r.get(0)).unwrap() };
        // Before the 10th, in batches of 4: the 1st to the 9th.
        let mut pruned = Vec::new();
        loop {
            let p = prune(&mut c, day(10), 4).unwrap();
            if p == Pruned::default() {
                break;
            }
            pruned.push(p);
        }
        assert_eq!(
            pruned
                .iter()
                .map(|p| (p.workloads, p.decisions))
                .collect::<Vec<_>>(),
            [(4, 4), (4, 4), (1, 1)]
        );
        let kept: Vec<String> = c
            .prepare("SELECT id FROM workloads ORDER BY seq")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(kept, (10..=21).map(|i| format!("w{i}")).collect::<Vec<_>>());
        assert_eq!(count(&c, "SELECT COUNT(*) FROM tasks"), 12);
        assert_eq!(count(&c, "SELECT COUNT(*) FROM attempts"), 24);
        assert_eq!(
            count(
                &c,
                "SELECT COUNT(*) FROM decisions WHERE workload IS NOT NULL"
            ),
            48
        );
        assert_eq!(
            count(
                &c,
                "SELECT COUNT(*) FROM decisions WHERE workload IS NOT NULL \
                       AND workload NOT IN (SELECT id FROM workloads)"
            ),
            0
        );
        assert_eq!(
            count(
                &c,
                "SELECT MIN(at_ms) FROM decisions WHERE workload IS NULL"
            ),
            day(10).timestamp_millis()
        );
        assert_eq!(count(&c, "SELECT COUNT(*) FROM costs"), 21);
        let succeeded = count(
            &c,
            "SELECT SUM(count) FROM workload_counts WHERE state = 'succeeded'",
        );
        assert_eq!(succeeded, 11);
        // Finding what to take out reads an index, not every workload.
        let plan: Vec<String> = c
            .prepare(
                "EXPLAIN QUERY PLAN SELECT id FROM workloads WHERE finished_at IS NOT NULL \
                 AND finished_at < ?1 ORDER BY finished_at LIMIT ?2",
            )
            .unwrap()
            .query_map(params!["x", 1], |r| r.get(3))
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        assert!(
            plan.iter().any(|s| s.contains("workloads_finished")),
            "{plan:?}"
        );
    }

    /// Every prediction and every waiting decision updates one task by its attempt's id: the
    /// update must find it through an index, not read every task ever submitted (at fleet
    /// scale that made the gateway slower the longer it ran).
    #[test]
    fn updates_by_attempt_id_find_the_task_through_an_index() {
        let conn = allot_store::open_in_memory(MIGRATIONS).unwrap();
        for sql in [SET_PREDICTED, SET_WAITING] {
            let mut explain = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let parameters =
                allot_store::rusqlite::params_from_iter(1..=explain.parameter_count() as i64);
            let plan: Vec<String> = explain
                .query_map(parameters, |r| r.get(3))
                .unwrap()
                .collect::<std::result::Result<_, _>>()
                .unwrap();
            assert!(
                plan.iter().all(|step| !step.starts_with("SCAN")),
                "{sql}: {plan:?}"
            );
            assert!(
                plan.iter()
                    .any(|step| step.contains("USING INDEX tasks_task_id")),
                "{sql}: {plan:?}"
            );
        }
    }
}
