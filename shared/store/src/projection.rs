//! [`Projection`]: a consumer handler that applies deliveries to SQLite exactly once.

use allot_bus::consumer::{Delivery, Handler, HandlerError, Outcome};
use rusqlite::Connection;

/// A consumer's handler for a projection that only writes tables: each delivery after the
/// stored position goes to `apply`, the whole batch and the new position commit in one
/// transaction ([`crate::apply_batch`]), and the consumer resumes right after the position
/// stored last. Database errors are transient (the runner retries the batch); every
/// delivery is handled — `apply` skips what it does not project.
pub struct Projection<F> {
    conn: Connection,
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
        Self {
            conn,
            consumer: consumer.into(),
            owner,
            apply,
        }
    }

    /// Its database.
    pub fn conn(&self) -> &Connection {
        &self.conn
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
        let position = crate::position(&self.conn, &self.consumer).map_err(|e| self.db(e))?;
        Ok(Some(position.unwrap_or(0)))
    }

    async fn handle(&mut self, batch: &[Delivery]) -> Result<Vec<Outcome>, HandlerError> {
        let items: Vec<(u64, &Delivery)> = batch.iter().map(|d| (d.stream_sequence, d)).collect();
        let apply = &mut self.apply;
        let applied = crate::apply_batch(&mut self.conn, &self.consumer, &items, |tx, fresh| {
            fresh.iter().try_for_each(|d| apply(tx, d))
        });
        applied.map_err(|e| self.db(e))?;
        Ok(vec![Outcome::Handled; batch.len()])
    }
}
