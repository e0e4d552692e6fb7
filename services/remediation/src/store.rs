//! Remediation's SQLite tables: its [`State`] (one row) and the outbox of actions to publish.
//! Both change in the transaction that records the stream position they follow from, so an
//! action is never decided twice and never lost: the relay publishes the outbox afterwards,
//! under the message id stored with each action, and deletes an action only once the server
//! acknowledged it.

use allot_store::rusqlite::{self, Connection, OptionalExtension, params};

use crate::watch::State;

/// Remediation's migrations, after the store's own.
pub const MIGRATIONS: &[&str] = &["
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
"];

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

/// The stored state, if any.
pub fn load(conn: &Connection) -> Result<Option<State>, Error> {
    let json: Option<String> = conn
        .query_row("SELECT json FROM state WHERE id = 1", [], |r| r.get(0))
        .optional()?;
    Ok(json.map(|j| serde_json::from_str(&j)).transpose()?)
}

/// Stores `state` (inside the caller's transaction).
pub fn save(conn: &Connection, state: &State) -> Result<(), Error> {
    let json = serde_json::to_string(state)?;
    conn.execute(
        "INSERT INTO state (id, json) VALUES (1, ?1)
         ON CONFLICT (id) DO UPDATE SET json = excluded.json",
        [json],
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
