//! Remediation's SQLite tables: what it knows — one row for the pool (`state`), one per node
//! (`node`) and one per grant idle reclaim watches (`idle_grant`) — and the outbox of actions to
//! publish. A commit writes only the rows its batch changed ([`save`]), the actions it decided
//! and the stream position it follows from, in one transaction, so an action is never decided
//! twice and never lost: the relay publishes the outbox afterwards, under the message id
//! stored with each action, and deletes an action only once the server acknowledged it.
//!
//! Versions before 2026-11-26 kept everything in the `state` row, rewritten whole on every
//! commit; such a row is read once ([`Loaded::Whole`]) and the first commit after it stores
//! every node in its own row.

use allot_store::rusqlite::{self, Connection, OptionalExtension, params};

use crate::watch::{Changes, NodeRecord, Pool, State, Stored};

/// Remediation's migrations, after the store's own.
pub const MIGRATIONS: &[&str] = &[
    "
CREATE TABLE state (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    json TEXT NOT NULL
);
CREATE TABLE outbox (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    subject TEXT NOT NULL,
    msg_id  TEXT NOT NULL UNIQUE,
    payload BLOB NOT NULL
);
",
    "
CREATE TABLE node (
    name TEXT PRIMARY KEY,
    json TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE idle_grant (
    lease INTEGER PRIMARY KEY,
    json  TEXT NOT NULL
);
",
];

/// Why the store could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// SQLite failed.
    #[error(transparent)]
    Sql(#[from] rusqlite::Error),
    /// The stored state is not what this build writes.
    #[error("the stored remediation state cannot be read: {0}")]
    State(#[from] serde_json::Error),
}

/// What was stored.
#[derive(Debug, Clone)]
pub enum Loaded {
    /// Row by row, as this version stores it.
    Rows(Stored),
    /// Whole, in one row, as versions before 2026-11-26 stored it.
    Whole(Box<State>),
}

/// What was stored, if anything.
pub fn load(conn: &Connection) -> Result<Option<Loaded>, Error> {
    let json: Option<String> = conn
        .query_row("SELECT json FROM state WHERE id = 1", [], |r| r.get(0))
        .optional()?;
    let Some(json) = json else {
        return Ok(None);
    };
    let pool: Pool = match serde_json::from_str(&json) {
        Ok(pool) => pool,
        Err(e) => {
            return match serde_json::from_str::<State>(&json) {
                Ok(whole) => Ok(Some(Loaded::Whole(Box::new(whole)))),
                Err(_) => Err(e.into()),
            };
        }
    };
    let mut nodes = Vec::new();
    let mut stmt = conn.prepare("SELECT name, json FROM node ORDER BY name")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let record: NodeRecord = serde_json::from_str(&row.get::<_, String>(1)?)?;
        nodes.push((row.get(0)?, record));
    }
    let mut grants = Vec::new();
    let mut stmt = conn.prepare("SELECT lease, json FROM idle_grant ORDER BY lease")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        grants.push((
            row.get::<_, i64>(0)? as u64,
            serde_json::from_str(&row.get::<_, String>(1)?)?,
        ));
    }
    Ok(Some(Loaded::Rows(Stored {
        pool,
        nodes,
        grants,
    })))
}

/// Stores what changed (inside the caller's transaction): each changed node's record and
/// grant, and the pool's row unless it is `last_pool`, the JSON the last commit stored
/// (updated here).
pub fn save(
    conn: &Connection,
    changes: &Changes,
    last_pool: &mut Option<String>,
) -> Result<(), Error> {
    for (node, record) in &changes.nodes {
        put(
            conn,
            (
                "INSERT INTO node (name, json) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET json = excluded.json",
                "DELETE FROM node WHERE name = ?1",
            ),
            node,
            record.as_ref(),
        )?;
    }
    for (lease, grant) in &changes.grants {
        put(
            conn,
            (
                "INSERT INTO idle_grant (lease, json) VALUES (?1, ?2)
                 ON CONFLICT (lease) DO UPDATE SET json = excluded.json",
                "DELETE FROM idle_grant WHERE lease = ?1",
            ),
            &(*lease as i64),
            grant.as_ref(),
        )?;
    }
    let pool = serde_json::to_string(&changes.pool)?;
    if last_pool.as_deref() != Some(pool.as_str()) {
        conn.prepare_cached(
            "INSERT INTO state (id, json) VALUES (1, ?1)
             ON CONFLICT (id) DO UPDATE SET json = excluded.json",
        )?
        .execute([&pool])?;
        *last_pool = Some(pool);
    }
    Ok(())
}

/// Writes `value` as `key`'s row, as JSON, or deletes the row for `None`
/// ([`allot_store::put_row`]).
fn put(
    conn: &Connection,
    statements: (&str, &str),
    key: &dyn rusqlite::ToSql,
    value: Option<&impl serde::Serialize>,
) -> Result<(), Error> {
    let json = value.map(serde_json::to_string).transpose()?;
    allot_store::put_row(
        conn,
        statements,
        &[key],
        json.as_ref().map(|json| json as &dyn rusqlite::ToSql),
    )?;
    Ok(())
}

/// An action waiting to be published.
#[derive(Debug, Clone)]
pub struct Queued {
    /// Row id.
    pub id: i64,
    /// Subject.
    pub subject: String,
    /// `Nats-Msg-Id` (the envelope's id).
    pub msg_id: String,
    /// The envelope, JSON.
    pub payload: Vec<u8>,
}

/// Queues an event (inside the caller's transaction).
pub fn enqueue(
    conn: &Connection,
    subject: &str,
    msg_id: &str,
    payload: &[u8],
) -> Result<(), Error> {
    conn.execute(
        "INSERT INTO outbox (subject, msg_id, payload) VALUES (?1, ?2, ?3)",
        params![subject, msg_id, payload],
    )?;
    Ok(())
}

/// Up to `limit` queued events, oldest first.
pub fn queued(conn: &Connection, limit: usize) -> Result<Vec<Queued>, Error> {
    let mut stmt = conn
        .prepare_cached("SELECT id, subject, msg_id, payload FROM outbox ORDER BY id LIMIT ?1")?;
    let rows = stmt.query_map([limit as i64], |r| {
        Ok(Queued {
            id: r.get(0)?,
            subject: r.get(1)?,
            msg_id: r.get(2)?,
            payload: r.get(3)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Forgets a published event.
pub fn sent(conn: &Connection, id: i64) -> Result<(), Error> {
    conn.execute("DELETE FROM outbox WHERE id = ?1", [id])?;
    Ok(())
}
