//! The planner's tables: workloads, their tasks, the ids of every attempt, the outbox of
//! events to publish, and the nodes of its pool (for the capacity check).
//!
//! A consumer loads a [`Workload`], runs one transition, and saves the state and the
//! transition's events (the outbox) in the transaction that also records its stream position
//! (`allot_store::apply`), so state, position and what must be published commit together. The
//! relay (the crate's `relay` module) publishes the outbox afterwards and deletes what the server
//! acknowledged; since each event's `Nats-Msg-Id` is derived from what it says, publishing one
//! again after a crash is harmless.

use std::sync::Arc;

use allot_events::node::NodeRegistered;
use allot_events::query::planner::TaskNode;
use allot_events::task::RunSpec;
use allot_events::workload::WorkloadSubmitted;
use allot_sched::{LeaseId, TaskId, TaskSpec, Time};
use allot_store::rusqlite::{self, Connection, OptionalExtension, params};
use allot_workload::{ClusterShape, NodeShape};

use crate::machine::{Task, TaskStatus, Workload, WorkloadStatus};

/// The planner's schema, in order. Never edit a shipped migration: add one.
pub const MIGRATIONS: &[&str] = &[
    "
CREATE TABLE workloads (
    id       TEXT PRIMARY KEY,
    team     TEXT NOT NULL,
    pool     TEXT NOT NULL,
    status   TEXT NOT NULL,            -- running | succeeded | failed | aborted
    reason   TEXT,
    spec     TEXT NOT NULL,            -- the WorkloadSubmitted event as received (JSON)
    received INTEGER NOT NULL          -- its WORKLOADS stream sequence
) STRICT;

CREATE TABLE tasks (
    workload     TEXT NOT NULL REFERENCES workloads (id),
    name         TEXT NOT NULL,
    position     INTEGER NOT NULL,     -- order in the spec
    after        TEXT NOT NULL,        -- JSON array of task names
    gang         TEXT,
    status       TEXT NOT NULL,        -- waiting | ready | running | succeeded | failed | cancelled
    attempt      INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    backoff_ms   INTEGER NOT NULL,
    template     TEXT NOT NULL,        -- TaskSpec JSON of the current attempt, id aside
    reason       TEXT,
    PRIMARY KEY (workload, name)
) STRICT;

-- Every attempt's scheduler id, to map task events and decisions back to tasks.
CREATE TABLE attempts (
    task_id  INTEGER PRIMARY KEY,      -- TaskId (53 bits, fits)
    workload TEXT NOT NULL,
    name     TEXT NOT NULL,
    attempt  INTEGER NOT NULL,
    ended    INTEGER NOT NULL DEFAULT 0 -- its completion or failure was seen
) STRICT;

-- Events to publish, in order, each not before its time (a retry's backoff).
CREATE TABLE outbox (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    not_before_ms INTEGER NOT NULL,
    subject       TEXT NOT NULL,
    msg_id        TEXT NOT NULL,
    payload       BLOB NOT NULL
) STRICT;
CREATE INDEX outbox_due ON outbox (not_before_ms, id);
",
    "
-- How executors run each task (RunSpec JSON, attempt aside), and when its current run was
-- granted (for the look-ahead).
ALTER TABLE tasks ADD COLUMN run TEXT NOT NULL DEFAULT '{}';
ALTER TABLE tasks ADD COLUMN started_ms INTEGER;
",
    "
-- The nodes registered in the planner's pool (NodeRegistered JSON, the latest per node): what
-- a submission's requests are checked against, as `allot submit` checks them.
CREATE TABLE nodes (
    name          TEXT PRIMARY KEY,
    registered    TEXT NOT NULL,
    registered_ms INTEGER NOT NULL      -- when (the registration's stream timestamp)
) STRICT;
",
    "
-- What `allot workloads` and `allot workload ID` show: who submitted each workload and when
-- (the bus's time of its submission; unknown for those stored before), and where and when
-- each attempt last ran, from the grants, preemptions and releases in the journal.
ALTER TABLE workloads ADD COLUMN submitter TEXT NOT NULL DEFAULT '';
ALTER TABLE workloads ADD COLUMN run_id TEXT;
ALTER TABLE workloads ADD COLUMN submitted_ms INTEGER;
UPDATE workloads SET submitter = coalesce(json_extract(spec, '$.submitter'), ''),
                     run_id = json_extract(spec, '$.run_id');
CREATE INDEX workloads_newest ON workloads (received);
CREATE INDEX workloads_of_team ON workloads (team, received);

ALTER TABLE attempts ADD COLUMN nodes TEXT;          -- JSON [TaskNode] of its latest grant
ALTER TABLE attempts ADD COLUMN granted_ms INTEGER;
ALTER TABLE attempts ADD COLUMN ended_ms INTEGER;    -- completed, failed, preempted or released
CREATE INDEX attempts_of_task ON attempts (workload, name, attempt);
",
    "
-- The predictor's estimate of the current attempt's run time, ms (TaskPredicted): what the
-- look-ahead times a running task's successors by.
ALTER TABLE tasks ADD COLUMN predicted_ms INTEGER;
",
    "
-- Right-sizing: whether a task's spec opts in (resources.rightSize), and the predictor's
-- latest advice per task key (<team>/<workload name>/<task name>; Recommendation JSON), which
-- an opted-in task's next attempts start with.
ALTER TABLE tasks ADD COLUMN right_size INTEGER NOT NULL DEFAULT 0;
CREATE TABLE right_sizing (
    task_key TEXT PRIMARY KEY,
    advice   TEXT NOT NULL
) STRICT;
",
    "
-- The fleet's version: one more with every node registration, so that a shape of the nodes
-- kept in memory is known to be current without reading every node again.
CREATE TABLE fleet (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
) STRICT;
INSERT INTO fleet (id, version) VALUES (1, 0);
",
    "
-- A preload overtaken by its task's readiness is withdrawn by its message id; a workload's
-- tasks are read in the spec's order on every event about it.
CREATE INDEX outbox_msg_id ON outbox (msg_id);
CREATE INDEX tasks_by_position ON tasks (workload, position);
",
    "
-- The latest lease granted to each attempt: a run's end reported under an earlier lease is
-- one the allocator refused (the task was granted again after that run was stopped).
ALTER TABLE attempts ADD COLUMN lease INTEGER;
",
];

/// Records node `r` (its latest registration replaces an earlier one).
pub fn register_node(
    conn: &Connection,
    r: &NodeRegistered,
    at_ms: Time,
) -> Result<(), rusqlite::Error> {
    let json = serde_json::to_string(r).expect("an event serializes");
    conn.execute(
        "INSERT INTO nodes (name, registered, registered_ms) VALUES (?1, ?2, ?3)
         ON CONFLICT (name) DO UPDATE SET
            registered = excluded.registered, registered_ms = excluded.registered_ms",
        params![r.node, json, at_ms as i64],
    )?;
    conn.execute("UPDATE fleet SET version = version + 1 WHERE id = 1", [])?;
    Ok(())
}

/// The registered nodes as last read: their shapes and the newest registration's time, at the
/// fleet's version. Each consumer keeps its own; [`cluster`] reads the nodes again only when
/// the version moved, so a submission costs one row, not the whole fleet (at 2,000 nodes,
/// parsing every registration was most of a submission's cost).
#[derive(Debug, Default)]
pub struct FleetCache(Option<(i64, Option<i64>, Option<Arc<ClusterShape>>)>);

/// The shapes of the registered nodes, to check a submission made at `at_ms` against; `None`
/// while none has registered, or while the fleet is still forming — a node registered within
/// `settle_ms` before the submission, so more may be on their way (the planner reads
/// registrations and submissions from two streams, in no fixed relative order). Then capacity
/// is not checked, as `allot submit` does not check it against an empty inventory, and the
/// allocator parks what no node can hold.
///
/// `cache` keeps what was read for the next call.
pub fn cluster(
    conn: &Connection,
    at_ms: Time,
    settle_ms: Time,
    cache: &mut FleetCache,
) -> Result<Option<Arc<ClusterShape>>, StoreError> {
    let version: i64 =
        conn.query_row("SELECT version FROM fleet WHERE id = 1", [], |r| r.get(0))?;
    if cache.0.as_ref().is_none_or(|(v, _, _)| *v != version) {
        let newest: Option<i64> =
            conn.query_row("SELECT max(registered_ms) FROM nodes", [], |r| r.get(0))?;
        let mut stmt = conn.prepare("SELECT name, registered FROM nodes ORDER BY name")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut cluster = ClusterShape::default();
        for row in rows {
            let (name, json) = row?;
            let r: NodeRegistered = serde_json::from_str(&json)
                .map_err(|e| StoreError::Corrupt(format!("node {name}: {e}")))?;
            cluster.add(NodeShape::from(&r));
        }
        let shape = (!cluster.nodes.is_empty()).then(|| Arc::new(cluster));
        cache.0 = Some((version, newest, shape));
    }
    let Some((_, newest, shape)) = &cache.0 else {
        unreachable!("filled above")
    };
    match *newest {
        None => Ok(None),
        Some(newest) if (newest.max(0) as Time).saturating_add(settle_ms) > at_ms => Ok(None),
        Some(_) => Ok(shape.clone()),
    }
}

/// Why the state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// A row holds what this build cannot read (written by a newer one, or edited).
    #[error("planner database: {0}")]
    Corrupt(String),
}

/// The submission event (JSON, as received) of workload `id`, if it is known.
pub fn known(conn: &Connection, id: &str) -> Result<Option<String>, rusqlite::Error> {
    conn.query_row("SELECT spec FROM workloads WHERE id = ?1", [id], |r| {
        r.get(0)
    })
    .optional()
}

/// Stores a new workload, with its submission, the stream sequence and the time (ms since the
/// epoch) the bus stored it.
pub fn insert(
    conn: &Connection,
    workload: &Workload,
    submission: &WorkloadSubmitted,
    seq: u64,
    at: Time,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO workloads (id, team, pool, status, reason, spec, received, submitter,
                               run_id, submitted_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            workload.id,
            workload.team,
            workload.pool,
            workload.status.as_str(),
            workload.reason,
            json(submission),
            seq as i64,
            submission.submitter,
            submission.run_id,
            at as i64,
        ],
    )?;
    save(conn, workload)
}

/// Writes `workload`'s state over what is stored, and records the ids of its current attempts.
pub fn save(conn: &Connection, workload: &Workload) -> Result<(), StoreError> {
    write(conn, workload, None)
}

/// [`save`] of what changed since `workload` was loaded as `before`: a transition touches a
/// task or two, and a workload may have thousands.
pub fn save_changes(
    conn: &Connection,
    before: &Workload,
    workload: &Workload,
) -> Result<(), StoreError> {
    write(conn, workload, Some(before))
}

fn write(
    conn: &Connection,
    workload: &Workload,
    before: Option<&Workload>,
) -> Result<(), StoreError> {
    if before.is_none_or(|b| b.status != workload.status || b.reason != workload.reason) {
        conn.execute(
            "UPDATE workloads SET status = ?2, reason = ?3 WHERE id = ?1",
            params![workload.id, workload.status.as_str(), workload.reason],
        )?;
    }
    let mut task = conn.prepare_cached(
        "INSERT INTO tasks (workload, name, position, after, gang, status, attempt, max_attempts,
                            backoff_ms, template, run, reason, started_ms, predicted_ms,
                            right_size)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)
         ON CONFLICT (workload, name) DO UPDATE SET
            status = excluded.status, attempt = excluded.attempt,
            template = excluded.template, reason = excluded.reason,
            started_ms = excluded.started_ms, predicted_ms = excluded.predicted_ms",
    )?;
    let mut attempt = conn.prepare_cached(
        "INSERT INTO attempts (task_id, workload, name, attempt) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (task_id) DO NOTHING",
    )?;
    for (position, t) in workload.tasks.iter().enumerate() {
        if before.is_some_and(|b| b.tasks.get(position) == Some(t)) {
            continue;
        }
        task.execute(params![
            workload.id,
            t.name,
            position as i64,
            json(&t.after),
            t.gang,
            t.status.as_str(),
            t.attempt,
            t.max_attempts,
            t.backoff as i64,
            json(&t.template),
            json(&t.run),
            t.reason,
            t.started.map(|s| s as i64),
            t.predicted.map(|p| p as i64),
            t.right_size,
        ])?;
        let id = crate::plan::task_id(&workload.id, &t.name, t.attempt);
        attempt.execute(params![id.0 as i64, workload.id, t.name, t.attempt])?;
    }
    Ok(())
}

/// Our own plain data as JSON (names, a `TaskSpec`), which cannot fail to serialize.
fn json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).expect("plain data serializes")
}

/// Keeps `advice` as the latest right-sizing advice for `task_key`.
pub fn save_advice(
    conn: &Connection,
    task_key: &str,
    advice: &allot_events::task::Recommendation,
) -> Result<(), rusqlite::Error> {
    conn.execute(
        "INSERT INTO right_sizing (task_key, advice) VALUES (?1, ?2)
         ON CONFLICT (task_key) DO UPDATE SET advice = excluded.advice",
        params![task_key, json(advice)],
    )?;
    Ok(())
}

/// The latest right-sizing advice for `task_key`, if any.
pub fn advice(
    conn: &Connection,
    task_key: &str,
) -> Result<Option<allot_events::task::Recommendation>, StoreError> {
    let text: Option<String> = conn
        .query_row(
            "SELECT advice FROM right_sizing WHERE task_key = ?1",
            [task_key],
            |r| r.get(0),
        )
        .optional()?;
    text.map(|t| {
        serde_json::from_str(&t)
            .map_err(|e| StoreError::Corrupt(format!("right-sizing advice for {task_key}: {e}")))
    })
    .transpose()
}

/// Loads workload `id`, if known.
pub fn load(conn: &Connection, id: &str) -> Result<Option<Workload>, StoreError> {
    let row = conn
        .query_row(
            "SELECT team, pool, status, reason FROM workloads WHERE id = ?1",
            [id],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, Option<String>>(3)?,
                ))
            },
        )
        .optional()?;
    let Some((team, pool, status, reason)) = row else {
        return Ok(None);
    };
    let corrupt = |what: String| StoreError::Corrupt(format!("workload {id}: {what}"));
    let status =
        WorkloadStatus::parse(&status).ok_or_else(|| corrupt(format!("status {status:?}")))?;
    let mut stmt = conn.prepare_cached(
        "SELECT name, after, gang, status, attempt, max_attempts, backoff_ms, template, run,
                reason, started_ms, predicted_ms, right_size
         FROM tasks WHERE workload = ?1 ORDER BY position",
    )?;
    let rows = stmt.query_map([id], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Option<String>>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, u32>(4)?,
            r.get::<_, u32>(5)?,
            r.get::<_, i64>(6)?,
            r.get::<_, String>(7)?,
            r.get::<_, String>(8)?,
            r.get::<_, Option<String>>(9)?,
            r.get::<_, Option<i64>>(10)?,
            r.get::<_, Option<i64>>(11)?,
            r.get::<_, bool>(12)?,
        ))
    })?;
    let mut tasks = Vec::new();
    for row in rows {
        let (
            name,
            after,
            gang,
            status,
            attempt,
            max_attempts,
            backoff,
            template,
            run,
            reason,
            started,
            predicted,
            right_size,
        ) = row?;
        let after: Vec<String> =
            serde_json::from_str(&after).map_err(|e| corrupt(format!("{name}.after: {e}")))?;
        let template: TaskSpec = serde_json::from_str(&template)
            .map_err(|e| corrupt(format!("{name}.template: {e}")))?;
        let run: RunSpec =
            serde_json::from_str(&run).map_err(|e| corrupt(format!("{name}.run: {e}")))?;
        let status = TaskStatus::parse(&status)
            .ok_or_else(|| corrupt(format!("{name}.status {status:?}")))?;
        tasks.push(Task {
            name,
            after,
            gang,
            status,
            attempt,
            max_attempts,
            backoff: backoff as Time,
            template,
            run,
            reason,
            started: started.map(|s| s as Time),
            predicted: predicted.map(|p| p as Time),
            right_size,
        });
    }
    Ok(Some(Workload {
        id: id.to_owned(),
        team,
        pool,
        status,
        reason,
        tasks,
    }))
}

/// One attempt of a task, as [`attempt`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The workload.
    pub workload: String,
    /// The task's name.
    pub name: String,
    /// Which attempt.
    pub attempt: u32,
    /// Its completion or failure was seen.
    pub ended: bool,
    /// The latest lease it was granted, if the planner has read its grant.
    pub lease: Option<LeaseId>,
}

/// The attempt whose scheduler id is `id`, if it is one of the planner's.
pub fn attempt(conn: &Connection, id: TaskId) -> Result<Option<Attempt>, rusqlite::Error> {
    conn.query_row(
        "SELECT workload, name, attempt, ended, lease FROM attempts WHERE task_id = ?1",
        [id.0 as i64],
        |r| {
            Ok(Attempt {
                workload: r.get(0)?,
                name: r.get(1)?,
                attempt: r.get(2)?,
                ended: r.get(3)?,
                lease: r.get::<_, Option<i64>>(4)?.map(|l| LeaseId(l as u64)),
            })
        },
    )
    .optional()
}

/// Records that attempt `id` ended (completed or failed) at `at` (ms since the epoch).
pub fn ended(conn: &Connection, id: TaskId, at: Time) -> Result<(), rusqlite::Error> {
    conn.execute(
        "UPDATE attempts SET ended = 1, ended_ms = coalesce(ended_ms, ?2) WHERE task_id = ?1",
        params![id.0 as i64, at as i64],
    )?;
    Ok(())
}

/// Records that attempt `id` was granted `lease` at `at` on `nodes`: its run, until it stops
/// (a no-op for an id that is not the planner's).
pub fn run_granted(
    conn: &Connection,
    id: TaskId,
    lease: LeaseId,
    nodes: &[TaskNode],
    at: Time,
) -> Result<(), rusqlite::Error> {
    conn.execute(
        "UPDATE attempts SET nodes = ?2, granted_ms = ?3, ended_ms = NULL, lease = ?4
         WHERE task_id = ?1",
        params![id.0 as i64, json(&nodes), at as i64, lease.0 as i64],
    )?;
    Ok(())
}

/// Records that attempt `id`'s run stopped at `at` (preempted or released), unless its end
/// is known already.
pub fn run_stopped(conn: &Connection, id: TaskId, at: Time) -> Result<(), rusqlite::Error> {
    conn.execute(
        "UPDATE attempts SET ended_ms = coalesce(ended_ms, ?2)
         WHERE task_id = ?1 AND granted_ms IS NOT NULL",
        params![id.0 as i64, at as i64],
    )?;
    Ok(())
}

/// An event waiting in the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Its row.
    pub id: i64,
    /// Subject to publish on.
    pub subject: String,
    /// `Nats-Msg-Id`.
    pub msg_id: String,
    /// The CloudEvent.
    pub payload: Vec<u8>,
}

/// Adds an event to the outbox, to be published not before `not_before` (ms since the epoch).
pub fn enqueue(
    conn: &Connection,
    not_before: Time,
    subject: &str,
    msg_id: &str,
    payload: &[u8],
) -> Result<(), rusqlite::Error> {
    conn.execute(
        "INSERT INTO outbox (not_before_ms, subject, msg_id, payload) VALUES (?1, ?2, ?3, ?4)",
        params![not_before as i64, subject, msg_id, payload],
    )?;
    Ok(())
}

/// Withdraws a queued event not yet published (a preload overtaken by its task's readiness);
/// whether there was one.
pub fn withdraw(conn: &Connection, msg_id: &str) -> Result<bool, rusqlite::Error> {
    Ok(conn.execute("DELETE FROM outbox WHERE msg_id = ?1", [msg_id])? > 0)
}

/// Up to `limit` events due at `now`, oldest first, and when the next one not yet due is.
pub fn due(
    conn: &Connection,
    now: Time,
    limit: usize,
) -> Result<(Vec<Outgoing>, Option<Time>), rusqlite::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, subject, msg_id, payload FROM outbox WHERE not_before_ms <= ?1
         ORDER BY not_before_ms, id LIMIT ?2",
    )?;
    let due = stmt
        .query_map(params![now as i64, limit as i64], |r| {
            Ok(Outgoing {
                id: r.get(0)?,
                subject: r.get(1)?,
                msg_id: r.get(2)?,
                payload: r.get(3)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let next = conn
        .query_row(
            "SELECT MIN(not_before_ms) FROM outbox WHERE not_before_ms > ?1",
            [now as i64],
            |r| r.get::<_, Option<i64>>(0),
        )?
        .map(|t| t as Time);
    Ok((due, next))
}

/// Removes published events from the outbox, in one transaction.
pub fn sent(conn: &mut Connection, ids: &[i64]) -> Result<(), rusqlite::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    {
        let mut delete = tx.prepare_cached("DELETE FROM outbox WHERE id = ?1")?;
        for id in ids {
            delete.execute([id])?;
        }
    }
    tx.commit()
}

/// A workload's tasks as `(name, status, attempt)`, in the spec's order (for tests and status
/// queries).
pub fn task_statuses(
    conn: &Connection,
    workload: &str,
) -> Result<Vec<(String, String, u32)>, rusqlite::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT name, status, attempt FROM tasks WHERE workload = ?1 ORDER BY position",
    )?;
    stmt.query_map([workload], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Registrations and submissions come from two streams in no fixed order: a submission
    /// made while nodes are still registering is not refused for want of the ones to come.
    #[test]
    fn capacity_is_checked_only_against_a_fleet_that_has_settled() {
        let conn = allot_store::open_in_memory(MIGRATIONS).unwrap();
        let cache = &mut FleetCache::default();
        let mut cluster = |at| cluster(&conn, at, 30_000, cache).unwrap();
        assert_eq!(cluster(100_000), None, "no nodes yet");
        let n1 = allot_testkit::node("n1").gpus(2).registered();
        register_node(&conn, &n1, 50_000).unwrap();
        // 20 s after the last registration: more may come.
        assert_eq!(cluster(70_000), None);
        // 30 s after: the fleet is what it is.
        let settled = cluster(80_000).expect("checked");
        assert_eq!(settled.nodes.len(), 1);
        assert_eq!(settled.nodes[0].gpus, 2);
        // Another node joins: the clock starts again, and the shape read before is stale.
        let n2 = allot_testkit::node("n2").gpus(8).registered();
        register_node(&conn, &n2, 90_000).unwrap();
        assert_eq!(cluster(100_000), None);
        let both = cluster(120_000).expect("checked");
        assert_eq!(both.nodes.iter().map(|n| n.count).sum::<u32>(), 2);
    }

    /// A database written before the workload queries keeps its workloads, and learns who
    /// submitted them and under which run id from the submissions it stored.
    #[test]
    fn an_older_database_is_migrated_with_its_submitters_and_run_ids() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("planner.db");
        {
            // As the build before the queries left it: the first two migrations.
            let old = allot_store::open(&path, &MIGRATIONS[..2]).unwrap();
            old.execute(
                "INSERT INTO workloads (id, team, pool, status, reason, spec, received)
                 VALUES ('w-1', 'vision', 'default', 'running', NULL, ?1, 7)",
                [r#"{"workload_id":"w-1","idempotency_key":"k","run_id":"ci-9","submitter":"ci@build"}"#],
            )
            .unwrap();
        }
        let conn = allot_store::open(&path, MIGRATIONS).unwrap();
        let (submitter, run_id, submitted): (String, Option<String>, Option<i64>) = conn
            .query_row(
                "SELECT submitter, run_id, submitted_ms FROM workloads WHERE id = 'w-1'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(submitter, "ci@build");
        assert_eq!(run_id.as_deref(), Some("ci-9"));
        assert_eq!(submitted, None, "unknown for workloads stored before");
    }
}
