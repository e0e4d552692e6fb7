//! The inventory service: a durable, restart-safe view of the cluster's nodes and GPUs.
//!
//! # Layout
//!
//! - [`projection`]: the SQLite tables and how each collector event (node registered,
//!   heartbeat, GPU samples) changes them. Applied through [`allot_store::apply_batch`], so the
//!   stream position commits with the state and nothing is applied twice.
//! - [`health`]: the pure rules that turn a telemetry sample into a GPU health and a reason.
//! - [`reporter`]: publishes the inventory's conclusions (node unreachable / recovered, GPU
//!   health changed) once each.
//! - [`query`]: the `allot-inventory` NATS micro-service answering `allot status`.
//!
//! [`run`] wires them together: three durable consumers (FLEET, TELEMETRY, and REMEDIATION for
//! operators' cordons and remediation's actions, which `allot status` shows), the reporter and
//! the query endpoint, each with its own SQLite connection (WAL lets them read side by side).

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use allot_runtime::Service;
use futures::{FutureExt, StreamExt};

use allot_bus::consumer::{ConsumerRunner, ConsumerSpec, Delivery, Handler, HandlerError, Outcome};
use allot_bus::streams::names;
use allot_bus::{BusError, ConnectConfig, Publisher};
use allot_store::rusqlite::Connection;

pub mod health;
pub mod projection;
pub mod query;
pub mod reporter;

pub use query::{ClusterStatus, GpuStatus, NodeStatus};
pub use reporter::Liveness;

/// The inventory's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// NATS URL(s).
    pub nats_url: String,
    /// Folder for `inventory.db`.
    pub data_dir: PathBuf,
    /// Prefix of the durable consumer names (`<prefix>-fleet`, `<prefix>-telemetry`); also the
    /// keys of their applied positions.
    pub consumer_prefix: String,
    /// When a node counts as unreachable.
    pub liveness: Liveness,
    /// How often the reporter looks for changes to publish.
    pub check_interval: Duration,
    /// How long the server waits for an acknowledgement before redelivering.
    pub ack_wait: Duration,
}

impl Config {
    /// Defaults: consumers `inventory-*`, 5 s heartbeats, 3 missed = unreachable, 1 s checks,
    /// 30 s ack wait.
    pub fn new(nats_url: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            nats_url: nats_url.into(),
            data_dir: data_dir.into(),
            consumer_prefix: "inventory".into(),
            liveness: Liveness {
                heartbeat_interval: Duration::from_secs(5),
                missed_heartbeats: 3,
            },
            check_interval: Duration::from_secs(1),
            ack_wait: Duration::from_secs(30),
        }
    }

    /// The database file.
    pub fn db_path(&self) -> PathBuf {
        self.data_dir.join("inventory.db")
    }
}

/// Why the inventory stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// NATS or JetStream failed.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The database could not be opened.
    #[error(transparent)]
    Store(#[from] allot_store::StoreError),
    /// The query endpoint could not be started.
    #[error("starting the query service: {0}")]
    Service(String),
    /// One of its tasks failed or panicked: the task's name and why.
    #[error("{0}")]
    Stopped(Box<allot_runtime::Stopped<Error>>),
}

/// Runs the inventory until `shutdown` completes.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mut service = Service::new("inventory", shutdown);
    let client = allot_bus::connect(
        &ConnectConfig::new(&config.nats_url, "allot-inventory"),
        service.stopping(),
    )
    .await?;
    service.drain_on_stop(client.clone());
    let shutdown = service.stopping();
    let open = || allot_store::open(&config.db_path(), projection::MIGRATIONS);
    let fleet_conn = open()?;
    let telemetry_conn = open()?;
    let remediation_conn = open()?;
    let reporter_conn = open()?;
    let query_conn = open()?;
    tracing::info!(db = %config.db_path().display(), "inventory started");

    let consumer = |stream: &str, suffix: &str| {
        let mut spec = ConsumerSpec::new(stream, format!("{}-{suffix}", config.consumer_prefix));
        spec.ack_wait = config.ack_wait;
        // Commits dominate the cost of applying events one by one; a few milliseconds of
        // lingering turns a stream of tiny transactions into a few large ones under load.
        spec.linger = Duration::from_millis(5);
        spec
    };
    // Telemetry is the bulk of it, and a batch writes each GPU's row once, with its latest
    // sample: the more samples a batch holds, the fewer rows per sample.
    let telemetry_spec = consumer(names::TELEMETRY, "telemetry").in_bulk();
    let fleet = ConsumerRunner::new(
        client.clone(),
        consumer(names::FLEET, "fleet"),
        Projector::new(fleet_conn, format!("{}-fleet", config.consumer_prefix)),
    )
    .with_gate(service.gate(format!("consumer {}", names::FLEET)));
    let telemetry = ConsumerRunner::new(
        client.clone(),
        telemetry_spec,
        Projector::new(
            telemetry_conn,
            format!("{}-telemetry", config.consumer_prefix),
        ),
    )
    .with_gate(service.gate(format!("consumer {}", names::TELEMETRY)));
    let holds = ConsumerRunner::new(
        client.clone(),
        consumer(names::REMEDIATION, "remediation"),
        Projector::new(
            remediation_conn,
            format!("{}-remediation", config.consumer_prefix),
        ),
    )
    .with_gate(service.gate(format!("consumer {}", names::REMEDIATION)));
    let reporter = reporter::Reporter {
        conn: reporter_conn,
        publisher: Publisher::new(client.clone(), "/allot/inventory"),
        liveness: config.liveness,
        tick: config.check_interval,
        quiet: reporter::Quiet::default(),
    };

    let query = query_service(client.clone(), query_conn, shutdown.clone());
    service.spawn(
        format!("consumer {}", names::FLEET),
        fleet
            .run(shutdown.clone())
            .map(|r| r.map(drop).map_err(Error::from)),
    );
    service.spawn(
        format!("consumer {}", names::TELEMETRY),
        telemetry
            .run(shutdown.clone())
            .map(|r| r.map(drop).map_err(Error::from)),
    );
    service.spawn(
        format!("consumer {}", names::REMEDIATION),
        holds
            .run(shutdown.clone())
            .map(|r| r.map(drop).map_err(Error::from)),
    );
    service.spawn("reporter", reporter.run(shutdown.clone()).map(Ok));
    service.spawn("query", query);
    service.run().await.map_err(|s| Error::Stopped(Box::new(s)))
}

/// Serves [`query::STATUS_SUBJECT`] until shutdown.
async fn query_service(
    client: async_nats::Client,
    conn: Connection,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    use async_nats::service::ServiceExt;
    let service = client
        .service_builder()
        .description("Allot inventory: nodes, GPUs, health and capacity")
        .start(query::SERVICE_NAME, env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| Error::Service(e.to_string()))?;
    let mut status = service
        .endpoint(query::STATUS_SUBJECT)
        .await
        .map_err(|e| Error::Service(e.to_string()))?;
    tokio::pin!(shutdown);
    loop {
        let request = tokio::select! {
            () = &mut shutdown => break,
            request = status.next() => request,
        };
        let Some(request) = request else { break };
        let reply = query::status(&conn, chrono::Utc::now())
            .map(|s| serde_json::to_vec(&s).unwrap_or_default().into())
            .map_err(|e| async_nats::service::error::Error {
                status: format!("inventory database error: {e}"),
                code: 500,
            });
        if let Err(e) = request.respond(reply).await {
            tracing::warn!(error = %e, "answering a status query failed");
        }
    }
    let _ = service.stop().await;
    Ok(())
}

/// Applies deliveries to the projection, exactly once per stream sequence.
#[derive(Debug)]
pub struct Projector {
    conn: Connection,
    consumer: String,
}

impl Projector {
    /// A projector writing through `conn`, recording positions under `consumer`.
    pub fn new(conn: Connection, consumer: String) -> Self {
        Self { conn, consumer }
    }
}

impl Handler for Projector {
    fn resume_after(&mut self) -> Result<Option<u64>, HandlerError> {
        let position = allot_store::position(&self.conn, &self.consumer)
            .map_err(|e| HandlerError::transient(format!("inventory database: {e}")))?;
        Ok(Some(position.unwrap_or(0)))
    }

    async fn handle(&mut self, batch: &[Delivery]) -> Result<Vec<Outcome>, HandlerError> {
        // Invalid events are settled first (dead-lettered with the reason); the rest are
        // applied together, in order, with the position, in one transaction.
        let outcomes: Vec<Outcome> = batch
            .iter()
            .map(|d| match projection::check(d) {
                Ok(()) => Outcome::Handled,
                Err(e) => Outcome::Rejected(e.to_string()),
            })
            .collect();
        let items: Vec<(u64, &Delivery)> = batch
            .iter()
            .zip(&outcomes)
            .map(|(d, o)| (d.stream_sequence, (*o == Outcome::Handled).then_some(d)))
            .filter_map(|(seq, d)| d.map(|d| (seq, d)))
            .collect();
        allot_store::apply_batch(&mut self.conn, &self.consumer, &items, |c, fresh| {
            let fresh: Vec<&Delivery> = fresh.iter().map(|d| **d).collect();
            projection::apply_all(c, &fresh)
        })
        .map_err(|e| HandlerError::transient(format!("inventory database: {e}")))?;
        Ok(outcomes)
    }
}
