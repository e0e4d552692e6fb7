//! Per-service state in SQLite, checkpointed by stream sequence.
//!
//! # Layout
//!
//! - [`open`]: opens (or creates) a service's database in WAL mode with sane pragmas and runs
//!   its migrations, after the store's own (the `applied_positions` table).
//! - [`apply`] and [`apply_batch`]: the checkpointed-projection helper. A consumer's handler
//!   changes its tables inside a transaction that also records the stream sequence it applied;
//!   a sequence at or below the recorded one is skipped. A batch is applied as one change so
//!   the handler can coalesce it. Because the state and the position
//!   commit together, a crash at any instant leaves them consistent, and a redelivery after a
//!   restart is recognised and not applied twice. [`record_position`] is the same bookkeeping
//!   for a handler that runs its own transaction.
//! - [`Projection`]: a bus consumer's handler built on [`apply_batch`] for projections that
//!   only write tables — it resumes after the stored position and applies each fresh delivery
//!   with one function.
//!
//! Transactions that apply events begin `IMMEDIATE`: they take the write lock up front (waiting
//! for it, see `wait_for_lock`) instead of reading first and then failing to upgrade a stale
//! snapshot when another connection — the service's other consumer, its reporter — wrote in
//! between.
//!
//! The store assumes one writer per consumer, which is how the services use it: each consumer
//! processes its messages in stream order on one task.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior};
use rusqlite_migration::{M, Migrations};

pub use rusqlite;

mod projection;
pub use projection::{Projection, SharedConnection};

/// What can go wrong opening or writing a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused an operation (I/O, corruption, constraint, busy).
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A migration could not be applied.
    #[error("migrating {path}: {source}")]
    Migration {
        /// The database file.
        path: String,
        /// What went wrong.
        #[source]
        source: rusqlite_migration::Error,
    },
    /// The folder for the database could not be created.
    #[error("creating {path}: {source}")]
    Io {
        /// The folder.
        path: String,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
}

/// The store's own schema, applied before a service's migrations.
const STORE_MIGRATION: &str = "
CREATE TABLE applied_positions (
    consumer   TEXT PRIMARY KEY,
    stream_seq INTEGER NOT NULL
) STRICT;";

/// Opens the database at `path` (created with its folder if missing) and migrates it.
///
/// `migrations` are the service's own, in order; each is one SQL script. Never edit a script
/// that has shipped: add a new one.
pub fn open(path: &Path, migrations: &[&'static str]) -> Result<Connection, StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.display().to_string(),
            source,
        })?;
    }
    let mut conn = Connection::open(path)?;
    configure(&conn)?;
    migrate(&mut conn, migrations).map_err(|source| StoreError::Migration {
        path: path.display().to_string(),
        source,
    })?;
    Ok(conn)
}

/// Opens a private in-memory database (for unit tests) and migrates it.
pub fn open_in_memory(migrations: &[&'static str]) -> Result<Connection, StoreError> {
    let mut conn = Connection::open_in_memory()?;
    configure(&conn)?;
    migrate(&mut conn, migrations).map_err(|source| StoreError::Migration {
        path: ":memory:".into(),
        source,
    })?;
    Ok(conn)
}

fn configure(conn: &Connection) -> Result<(), rusqlite::Error> {
    // WAL lets readers (status queries, tests) run beside the writer; NORMAL sync in WAL mode
    // is durable across process crashes (only an OS crash can lose the last commits, which
    // the stream then redelivers because they were never acknowledged).
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.busy_handler(Some(wait_for_lock))?;
    // A projection's connection runs a few dozen statements over and over; rusqlite keeps 16.
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// How long a writer waits for another connection's write lock before it gives up (and the
/// consumer retries the batch): 5 s, as SQLite's busy timeout would.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest a writer sleeps between two tries for the lock.
const LOCK_POLL_MAX: std::time::Duration = std::time::Duration::from_millis(1);

/// The busy handler: waits for the write lock in sleeps of 50 µs doubling up to 1 ms
/// ([`lock_poll`]), for [`LOCK_WAIT`] in all.
///
/// A service's consumers write one database through connections of their own, so they take
/// turns at its write lock many times a second. SQLite's own busy timeout sleeps 1, 2, 5, 10
/// … up to 100 ms between tries, so a writer that found the lock taken for a millisecond
/// could sleep for tens of milliseconds after it was free: at fleet scale the planner slept
/// 100 ms three times a second on the submit → grant path.
fn wait_for_lock(tries: i32) -> bool {
    match lock_poll(u32::try_from(tries).unwrap_or(0)) {
        Some(sleep) => {
            std::thread::sleep(sleep);
            true
        }
        None => false,
    }
}

/// How long to sleep before try `tries + 1` for the write lock; `None`: give up.
fn lock_poll(tries: u32) -> Option<std::time::Duration> {
    let first = std::time::Duration::from_micros(50);
    // 50 + 100 + 200 + 400 + 800 µs, then 1 ms each.
    let slept = match tries {
        0..=5 => first * ((1 << tries) - 1),
        _ => first * 31 + LOCK_POLL_MAX * (tries - 5),
    };
    (slept < LOCK_WAIT).then(|| (first * (1 << tries.min(5))).min(LOCK_POLL_MAX))
}

fn migrate(
    conn: &mut Connection,
    migrations: &[&'static str],
) -> Result<(), rusqlite_migration::Error> {
    let all: Vec<M<'static>> = std::iter::once(STORE_MIGRATION)
        .chain(migrations.iter().copied())
        .map(M::up)
        .collect();
    Migrations::new(all).to_latest(conn)
}

/// Whether an event was applied or recognised as already applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The change was made and the position recorded.
    Applied,
    /// The sequence was at or below the recorded position; nothing changed.
    AlreadyApplied {
        /// The position recorded for the consumer.
        position: u64,
    },
}

/// The last stream sequence `consumer` applied, if it applied any.
pub fn position(conn: &Connection, consumer: &str) -> Result<Option<u64>, rusqlite::Error> {
    conn.query_row(
        "SELECT stream_seq FROM applied_positions WHERE consumer = ?1",
        [consumer],
        |row| row.get::<_, i64>(0),
    )
    .optional()
    .map(|seq| seq.map(|s| s as u64))
}

/// Records `seq` as the last stream sequence `consumer` applied, inside the caller's
/// transaction, so that it commits (or rolls back) with the change it accounts for.
///
/// For handlers that need their own transaction rather than [`apply`]'s (the audit archive
/// compares a redelivered message with what it stored before deciding it is a no-op).
pub fn record_position(
    tx: &Transaction<'_>,
    consumer: &str,
    seq: u64,
) -> Result<(), rusqlite::Error> {
    tx.execute(
        "INSERT INTO applied_positions (consumer, stream_seq) VALUES (?1, ?2)
         ON CONFLICT (consumer) DO UPDATE SET stream_seq = excluded.stream_seq",
        rusqlite::params![consumer, seq as i64],
    )?;
    Ok(())
}

/// Writes one keyed row a batch changed, inside the caller's transaction: `upsert` with the
/// `key`'s parameters followed by `value`, or, for `None` (the row's entity is gone), `delete`
/// with the key's alone. How services that store their state by key write only what changed.
pub fn put_row(
    conn: &Connection,
    (upsert, delete): (&str, &str),
    key: &[&dyn rusqlite::ToSql],
    value: Option<&dyn rusqlite::ToSql>,
) -> Result<(), rusqlite::Error> {
    match value {
        Some(value) => {
            let mut params = key.to_vec();
            params.push(value);
            conn.prepare_cached(upsert)?.execute(&*params)?
        }
        None => conn.prepare_cached(delete)?.execute(key)?,
    };
    Ok(())
}

/// Applies one event at stream sequence `seq` for `consumer`, exactly once.
///
/// `change` runs inside a transaction that also records `seq`; if it fails nothing is kept.
pub fn apply<E>(
    conn: &mut Connection,
    consumer: &str,
    seq: u64,
    change: impl FnOnce(&Connection) -> Result<(), E>,
) -> Result<Applied, E>
where
    E: From<rusqlite::Error>,
{
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if let Some(position) = position(&tx, consumer)?.filter(|p| seq <= *p) {
        return Ok(Applied::AlreadyApplied { position });
    }
    change(&tx)?;
    record_position(&tx, consumer, seq)?;
    tx.commit()?;
    Ok(Applied::Applied)
}

/// What [`apply_batch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchApplied {
    /// Items after the recorded position, handed to the change.
    pub applied: usize,
    /// Items at or below the recorded position, or at or below one earlier in the batch,
    /// skipped.
    pub skipped: usize,
}

/// Applies a batch of events in one transaction: the fast path for consumers that pull many
/// messages at once.
///
/// Items at or below the recorded position are dropped, and so is an item at or below one
/// earlier in the batch: a copy redelivered after the ack wait can arrive in the same batch as
/// the original (a process paused past its ack wait reads both once it resumes), and applying
/// it again would apply it twice, after newer ones. The rest go to `change` together, in
/// order, so it can coalesce them (write the latest value of a row once rather than once per
/// event). The position becomes the highest sequence in the batch. If `change` fails nothing
/// is kept; the consumer runner then retries, and in the end applies the items one at a time
/// to find and dead-letter the one that cannot be applied.
pub fn apply_batch<T, E>(
    conn: &mut Connection,
    consumer: &str,
    items: &[(u64, T)],
    change: impl FnOnce(&Connection, &[&T]) -> Result<(), E>,
) -> Result<BatchApplied, E>
where
    E: From<rusqlite::Error>,
{
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut highest = position(&tx, consumer)?;
    let fresh: Vec<&T> = items
        .iter()
        .filter(|(seq, _)| {
            let fresh = highest.is_none_or(|h| *seq > h);
            if fresh {
                highest = Some(*seq);
            }
            fresh
        })
        .map(|(_, item)| item)
        .collect();
    let outcome = BatchApplied {
        applied: fresh.len(),
        skipped: items.len() - fresh.len(),
    };
    if fresh.is_empty() {
        return Ok(outcome);
    }
    change(&tx, &fresh)?;
    let highest = items.iter().map(|(seq, _)| *seq).max().unwrap_or(0);
    record_position(&tx, consumer, highest)?;
    tx.commit()?;
    Ok(outcome)
}

#[cfg(test)]
mod tests;
