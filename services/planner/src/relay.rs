//! The outbox relay: publishes what the consumers queued, in order, each event once it is due,
//! and forgets it only when the server has acknowledged it.
//!
//! A crash between the acknowledgement and the delete publishes the event again on restart;
//! its `Nats-Msg-Id` is derived from what it says (see [`crate::plan::event_id`]), so the
//! stream stores it once (within the WORKLOADS duplicate window).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use tokio::sync::Notify;
use tracing::warn;

use allot_bus::Publisher;
use allot_sched::Time;
use allot_store::rusqlite::Connection;

use crate::store;

/// Longest sleep with nothing due (a safety net: commits wake the relay).
const IDLE: Duration = Duration::from_secs(1);
/// Wait after a failed publish before trying again.
const RETRY: Duration = Duration::from_secs(1);

/// Publishes the outbox.
#[derive(Debug)]
pub struct Relay {
    /// Its own connection to the planner's database.
    pub conn: Connection,
    /// Publishes with acknowledgements.
    pub publisher: Publisher,
    /// Notified after each commit that queued events.
    pub wake: Arc<Notify>,
}

impl Relay {
    /// Publishes until `shutdown` completes.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut failing = false;
        loop {
            let wait = match self.flush().await {
                Ok(wait) => {
                    failing = false;
                    wait
                }
                Err(e) => {
                    if !failing {
                        warn!(error = %e, "publishing the planner's events failed; retrying");
                    }
                    failing = true;
                    Some(RETRY)
                }
            };
            let Some(wait) = wait else { continue };
            tokio::select! {
                () = &mut shutdown => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Publishes a batch of due events; returns how long to wait before looking again, or
    /// `None` if more may be due at once.
    async fn flush(&mut self) -> Result<Option<Duration>, String> {
        let now = now();
        let (due, next) = store::due(&self.conn, now, 64).map_err(|e| e.to_string())?;
        if due.is_empty() {
            let wait = next.map_or(IDLE, |t| Duration::from_millis(t.saturating_sub(now)));
            return Ok(Some(wait.min(IDLE)));
        }
        // Pipelined: send the batch, then await the acknowledgements in order. After a failure
        // a later event may be stored before an earlier one's second try, which is fine: each
        // event names one attempt of one task, and none depends on another being stored first.
        let mut pending = Vec::with_capacity(due.len());
        for event in due {
            let message = PublishMessage::build()
                .message_id(event.msg_id.clone())
                .payload(Bytes::from(event.payload));
            let ack = self
                .publisher
                .send_raw(event.subject, message)
                .await
                .map_err(|e| e.to_string())?;
            pending.push((event.id, ack));
        }
        // What the server stored leaves the outbox in one transaction: one turn at the write
        // lock per batch, not one per event.
        let mut stored = Vec::with_capacity(pending.len());
        let mut failed = None;
        for (id, ack) in pending {
            match ack.wait().await {
                Ok(_) => stored.push(id),
                Err(e) => {
                    failed = Some(e.to_string());
                    break;
                }
            }
        }
        store::sent(&mut self.conn, &stored).map_err(|e| e.to_string())?;
        failed.map_or(Ok(None), Err)
    }
}

/// Milliseconds since the epoch: when an event is due is wall-clock time, as the server's
/// timestamps it is computed from are.
fn now() -> Time {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Time)
}
