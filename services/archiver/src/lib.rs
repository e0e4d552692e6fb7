//! The audit archiver: a SQLite copy of the DECISIONS stream as a hash chain, so that an
//! auditor holding only the file can tell, months later, whether any record was edited,
//! dropped or reordered, and which.
//!
//! # Layout
//!
//! - [`chain`]: the `records` table, the exact bytes each record's hash covers (documented for
//!   re-implementation), [`chain::append`] (idempotent, position in the same transaction) and
//!   [`chain::verify`], which names the first bad record.
//! - This file: the [`Archiver`] handler, a durable pull consumer on DECISIONS through
//!   [`allot_bus::ConsumerRunner`] reading messages [`Raw`] — as stored, never decoded, so an
//!   event type this build does not know is archived rather than dead-lettered — and the two
//!   ways to run it: [`run`], the long-running service, and [`catch_up`], one pass to the end
//!   of the stream (`allot audit archive`).
//!
//! # Starting it
//!
//! In-process, beside the other services: spawn
//! `allot_archiver::run(Config::new(nats_url, data_dir.join("archive/decisions.db")), shutdown)`
//! — it connects, opens (or creates) the archive, and archives every DECISIONS message until
//! `shutdown` completes. It needs the DECISIONS stream to exist (`allot_bus::ensure_streams`,
//! which `allot up` and `allot run` call first).
//!
//! One writer per archive file: two archivers on one file would each append, and the second
//! would find its messages already archived (harmless) or refuse them (a gap).

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream;
use futures::FutureExt;
use tokio::sync::watch;

use allot_bus::consumer::{ConsumerRunner, ConsumerSpec, Delivery, Handler, HandlerError, Outcome};
use allot_bus::streams::names;
use allot_bus::{BusError, ConnectConfig, Raw};
use allot_runtime::Service;
use allot_store::rusqlite::Connection;

pub mod chain;

pub use chain::{ChainBreak, Expect, Fault, Summary, verify, verify_against};

/// The archiver's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// NATS URL(s).
    pub nats_url: String,
    /// The archive file.
    pub db_path: PathBuf,
    /// Durable consumer name; also the key of the archive's applied position.
    pub durable: String,
    /// Stream to archive.
    pub stream: String,
    /// How long the server waits for an acknowledgement before redelivering.
    pub ack_wait: Duration,
}

impl Config {
    /// Defaults: DECISIONS, durable consumer `archiver`, 30 s ack wait.
    pub fn new(nats_url: impl Into<String>, db_path: impl Into<PathBuf>) -> Self {
        Self {
            nats_url: nats_url.into(),
            db_path: db_path.into(),
            durable: "archiver".into(),
            stream: names::DECISIONS.into(),
            ack_wait: Duration::from_secs(30),
        }
    }
}

/// Why the archiver stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// NATS or JetStream failed.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The archive could not be opened or read.
    #[error(transparent)]
    Store(#[from] allot_store::StoreError),
    /// The archive refused a message (the stream and the archive disagree, or a message is
    /// missing); the archive is unchanged by it.
    #[error("archiving {stream} stopped at seq {head}: {reason}")]
    Refused {
        /// The stream.
        stream: String,
        /// The archive's last sequence.
        head: u64,
        /// Why.
        reason: String,
    },
    /// One of its tasks failed or panicked: the task's name and why.
    #[error("{0}")]
    Stopped(Box<allot_runtime::Stopped<Error>>),
}

/// Opens (or creates) the archive at `path`.
pub fn open(path: &std::path::Path) -> Result<Connection, allot_store::StoreError> {
    allot_store::open(path, chain::MIGRATIONS)
}

/// Where the archive stands, as the handler reports it after every batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The archive's last sequence (0 when empty).
    pub head: u64,
    /// Records appended since the handler started.
    pub appended: u64,
    /// The first message refused, with the reason.
    pub refused: Option<String>,
}

/// Appends every delivered message to the archive, in stream order.
#[derive(Debug)]
pub struct Archiver {
    conn: Connection,
    consumer: String,
    progress: watch::Sender<Progress>,
}

impl Archiver {
    /// An archiver writing through `conn`, recording its position under `consumer`.
    pub fn new(conn: Connection, consumer: impl Into<String>) -> Result<Self, Error> {
        let head = chain::head(&conn)
            .map_err(|e| Error::Store(e.into()))?
            .map_or(0, |h| h.seq);
        let (progress, _) = watch::channel(Progress {
            head,
            ..Progress::default()
        });
        Ok(Self {
            conn,
            consumer: consumer.into(),
            progress,
        })
    }

    /// Follows the archive's progress.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }
}

/// The archive's form of a delivered message.
pub fn entry(d: &Delivery<Raw>) -> chain::Entry {
    let headers = d.event.headers.iter().flat_map(|h| {
        h.iter().flat_map(|(name, values)| {
            let name: &str = name.as_ref();
            values.iter().map(move |v| (name, v.as_str()))
        })
    });
    chain::Entry {
        seq: d.stream_sequence,
        subject: d.subject.clone(),
        headers: chain::canonical_headers(headers),
        payload: d.event.payload.to_vec(),
        published_ns: d.published.timestamp_nanos_opt().unwrap_or(i64::MAX),
    }
}

impl Handler<Raw> for Archiver {
    fn resume_after(&mut self) -> Result<Option<u64>, HandlerError> {
        let position = allot_store::position(&self.conn, &self.consumer)
            .map_err(|e| HandlerError::transient(format!("archive database: {e}")))?;
        Ok(Some(position.unwrap_or(0)))
    }

    async fn handle(&mut self, batch: &[Delivery<Raw>]) -> Result<Vec<Outcome>, HandlerError> {
        let entries: Vec<chain::Entry> = batch.iter().map(entry).collect();
        let now = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(i64::MAX);
        let results = chain::append(&mut self.conn, &self.consumer, &entries, now)
            .map_err(|e| HandlerError::transient(format!("archive database: {e}")))?;
        let mut outcomes = Vec::with_capacity(results.len());
        let mut progress = self.progress.borrow().clone();
        for (e, result) in entries.iter().zip(results) {
            outcomes.push(match result {
                Ok(chain::Appended::Added(_)) => {
                    progress.head = e.seq;
                    progress.appended += 1;
                    Outcome::Handled
                }
                Ok(chain::Appended::AlreadyArchived) => Outcome::Handled,
                Err(refused) => {
                    tracing::error!(stream_seq = e.seq, subject = %e.subject, reason = %refused, "archive refused a message");
                    progress.refused.get_or_insert_with(|| refused.to_string());
                    Outcome::Rejected(refused.to_string())
                }
            });
        }
        self.progress.send_replace(progress);
        Ok(outcomes)
    }
}

fn consumer_spec(config: &Config) -> ConsumerSpec {
    let mut spec = ConsumerSpec::new(&config.stream, &config.durable);
    spec.ack_wait = config.ack_wait;
    // One commit per batch; a few milliseconds of lingering makes the batches larger under load.
    spec.linger = Duration::from_millis(5);
    spec
}

/// Archives the stream until `shutdown` completes.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mut service = Service::new("archiver", shutdown);
    let client = allot_bus::connect(
        &ConnectConfig::new(&config.nats_url, "allot-archiver"),
        service.stopping(),
    )
    .await?;
    service.drain_on_stop(client.clone());
    let archiver = Archiver::new(open(&config.db_path)?, &config.durable)?;
    tracing::info!(db = %config.db_path.display(), stream = %config.stream, head = archiver.progress.borrow().head, "archiver started");
    service.spawn(
        format!("consumer {}", config.stream),
        ConsumerRunner::new(client.clone(), consumer_spec(&config), archiver)
            .with_gate(service.gate(format!("consumer {}", config.stream)))
            .run(service.stopping())
            .map(|r| r.map(drop).map_err(Error::from)),
    );
    service.run().await.map_err(|s| Error::Stopped(Box::new(s)))
}

/// What [`catch_up`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaughtUp {
    /// Records appended.
    pub appended: u64,
    /// The archive's last sequence afterwards.
    pub head: u64,
    /// The stream's last sequence when the pass started (the target).
    pub stream_last: u64,
}

/// Archives the stream up to the last sequence it holds now, then returns; stops early, with
/// what it did so far, when `shutdown` completes.
pub async fn catch_up(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<CaughtUp, Error> {
    let shutdown = shutdown.boxed().shared();
    let client = allot_bus::connect(
        &ConnectConfig::new(&config.nats_url, "allot-audit-archive"),
        shutdown.clone(),
    )
    .await?;
    let result = catch_up_with(&client, &config, shutdown).await;
    // A one-shot copy leaves no consumer behind on the server: the archive is its position
    // (the next catch-up resumes after its head).
    if let Ok(stream) = jetstream::new(client.clone())
        .get_stream(&config.stream)
        .await
        && let Err(e) = stream.delete_consumer(&config.durable).await
    {
        tracing::debug!(consumer = %config.durable, error = %e, "removing the catch-up consumer");
    }
    drain(client).await;
    result
}

async fn catch_up_with(
    client: &async_nats::Client,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<CaughtUp, Error> {
    let js = jetstream::new(client.clone());
    let mut stream = js
        .get_stream(&config.stream)
        .await
        .map_err(|e| jetstream_error("opening stream", &config.stream, e))?;
    let stream_last = stream
        .info()
        .await
        .map_err(|e| jetstream_error("reading stream", &config.stream, e))?
        .state
        .last_sequence;
    let archiver = Archiver::new(open(&config.db_path)?, &config.durable)?;
    let mut progress = archiver.progress();
    let start = progress.borrow().clone();
    if start.head > stream_last {
        // The archive holds records the stream does not: another server, or a recreated stream.
        return Err(Error::Refused {
            stream: config.stream.clone(),
            head: start.head,
            reason: format!(
                "the archive is ahead of the stream, which ends at seq {stream_last}: is this the server the archive was made from?"
            ),
        });
    }
    if start.head == stream_last {
        return Ok(CaughtUp {
            appended: 0,
            head: start.head,
            stream_last,
        });
    }
    let done = {
        let mut progress = progress.clone();
        async move {
            let reached = progress.wait_for(|p| p.head >= stream_last || p.refused.is_some());
            tokio::select! {
                _ = reached => {}
                () = shutdown => {}
            }
        }
    };
    ConsumerRunner::new(client.clone(), consumer_spec(config), archiver)
        .run(done)
        .await?;
    let end = progress.borrow_and_update().clone();
    if let Some(reason) = end.refused {
        return Err(Error::Refused {
            stream: config.stream.clone(),
            head: end.head,
            reason,
        });
    }
    Ok(CaughtUp {
        appended: end.appended,
        head: end.head,
        stream_last,
    })
}

fn jetstream_error(operation: &'static str, name: &str, e: impl std::fmt::Display) -> BusError {
    BusError::JetStream {
        operation,
        name: name.to_owned(),
        message: e.to_string(),
    }
}

async fn drain(client: async_nats::Client) {
    if tokio::time::timeout(Duration::from_secs(5), client.drain())
        .await
        .is_err()
    {
        tracing::warn!("draining the NATS connection timed out");
    }
}
