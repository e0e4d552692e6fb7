//! [`Projection`]: a consumer handler that applies deliveries to SQLite exactly once.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use allot_bus::consumer::{Delivery, Handler, HandlerError, Outcome};
use rusqlite::Connection;

/// A connection that several projections of one service write through, one transaction at a
/// time (see [`Projection::sharing`]).
pub type SharedConnection = Arc<Mutex<Connection>>;

/// A consumer's handler for a projection that only writes tables: each delivery after the
/// stored position goes to `apply`, the whole batch and the new position commit in one
/// transaction ([`crate::apply_batch`]), and the consumer resumes right after the position
/// stored last. Database errors are transient (the runner retries the batch); every
/// delivery is handled — `apply` skips what it does not project.
///
/// Several projections of one database may share a connection ([`Projection::sharing`]). In
/// WAL mode a commit through one connection empties the page cache of every other connection
/// to the same file, so projections that each hold their own read the same pages from disk
/// again after each other's commits; through one connection they keep one cache, and take
/// turns (a transaction at a time) instead of waiting for each other's write lock.
pub struct Projection<F> {
    conn: SharedConnection,
    consumer: String,
    /// Whose database, for error messages ("billing", "predictor" …).
    owner: &'static str,
    apply: F,
}

impl<F> Projection<F>
where
    F: FnMut(&Connection, &Delivery) -> rusqlite::Result<()> + Send,
{
    /// A projection of `owner`'s, recording its position as `consumer` in `conn`.
    pub fn new(
        conn: Connection,
        consumer: impl Into<String>,
        owner: &'static str,
        apply: F,
    ) -> Self {
        Self::sharing(Arc::new(Mutex::new(conn)), consumer, owner, apply)
    }

    /// A projection like [`Projection::new`]'s that writes through `conn`, which other
    /// projections of the same database share. Each records its own position.
    pub fn sharing(
        conn: SharedConnection,
        consumer: impl Into<String>,
        owner: &'static str,
        apply: F,
    ) -> Self {
        Self {
            conn,
            consumer: consumer.into(),
            owner,
            apply,
        }
    }

    /// Its database, while no other projection sharing it writes.
    pub fn conn(&self) -> MutexGuard<'_, Connection> {
        lock(&self.conn)
    }

    /// The name its position is recorded under (the durable consumer's name).
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    fn db(&self, e: rusqlite::Error) -> HandlerError {
        HandlerError::transient(format!("{} database: {e}", self.owner))
    }
}

impl<F> std::fmt::Debug for Projection<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Projection")
            .field("consumer", &self.consumer)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl<F> Handler for Projection<F>
where
    F: FnMut(&Connection, &Delivery) -> rusqlite::Result<()> + Send,
{
    fn resume_after(&mut self) -> Result<Option<u64>, HandlerError> {
        let position = crate::position(&self.conn(), &self.consumer).map_err(|e| self.db(e))?;
        Ok(Some(position.unwrap_or(0)))
    }

    async fn handle(&mut self, batch: &[Delivery]) -> Result<Vec<Outcome>, HandlerError> {
        let items: Vec<(u64, &Delivery)> = batch.iter().map(|d| (d.stream_sequence, d)).collect();
        let apply = &mut self.apply;
        // Held for the transaction only, never across an await.
        let mut conn = lock(&self.conn);
        let applied = crate::apply_batch(&mut conn, &self.consumer, &items, |tx, fresh| {
            fresh.iter().try_for_each(|d| apply(tx, d))
        });
        drop(conn);
        applied.map_err(|e| self.db(e))?;
        Ok(vec![Outcome::Handled; batch.len()])
    }
}

/// The connection, even if a projection sharing it panicked mid-transaction: its transaction
/// was rolled back when dropped, so the connection is as good as before.
fn lock(conn: &SharedConnection) -> MutexGuard<'_, Connection> {
    conn.lock().unwrap_or_else(PoisonError::into_inner)
}
