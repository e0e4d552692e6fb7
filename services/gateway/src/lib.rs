//! The gateway: Allot's face. Read models of every stream, a REST API under `/api/v1` with
//! per-team RBAC, the live change log as Server-Sent Events, the dashboard, and the probes.
//!
//! # Layout
//!
//! - [`model`]: the read models — one projection per stream into `gateway.db`, each applied
//!   exactly once (rows and stream position in one transaction), each appending what changed
//!   to the change log.
//! - [`mirror`]: every pool's scheduler rebuilt in memory from the allocators' journals: the
//!   queue with reasons and ETAs, what runs where, KPIs per minute, and looking back.
//! - [`samples`]: every node's latest GPU readings, in memory, from TELEMETRY while views are
//!   read.
//! - [`token`]: bearer tokens (random, stored and published as SHA-256 only) and what each
//!   role may do.
//! - [`api`]: the router ([`api::app`]), the handlers and the generated OpenAPI document.
//! - [`sse`]: `GET /api/v1/events`, resumable with `Last-Event-ID`.
//! - [`problem`]: every error as an RFC 9457 problem.
//! - [`dashboard`]: the page, built into the binary.
//! - [`db`]: pooled read-only connections for the handlers.
//! - This file: the service — its configuration and [`run`].
//!
//! The gateway publishes only what its callers do: `WorkloadSubmitted` and `WorkloadAborted`
//! (naming the caller's token), and `TokenIssued`. The bus lets its user publish nothing else.

pub mod api;
pub mod dashboard;
pub mod db;
pub mod mirror;
pub mod model;
pub mod problem;
pub mod samples;
pub mod sse;
pub mod token;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;

use allot_bus::consumer::{ConsumerRunner, ConsumerSpec, Delivery};
use allot_bus::streams::names;
use allot_bus::{BusError, ConnectConfig};
use allot_events::access::TokenRole;
use allot_runtime::Service;
use allot_store::rusqlite::Connection;
use allot_workload::TeamsConfig;

pub use api::{AppState, app};

/// The team the bootstrap admin token (`admin.token`) acts for.
pub const PLATFORM_TEAM: &str = "platform";

/// The gateway's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// NATS URL(s).
    pub nats_url: String,
    /// Folder for `gateway.db`.
    pub data_dir: PathBuf,
    /// Where to listen (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// The bootstrap admin token's file: read, or created (mode 0600) with a new token.
    pub admin_token_file: Option<PathBuf>,
    /// The teams file, for checking submissions as `allot submit` does.
    pub teams: Option<TeamsConfig>,
    /// The durable consumers' name prefix.
    pub consumer: String,
    /// Told the address once the server listens.
    pub bound: Option<tokio::sync::mpsc::UnboundedSender<SocketAddr>>,
    /// Listen on any free port when `listen`'s is taken.
    pub listen_fallback: bool,
    /// Where to write the gateway's URL once it listens (removed when it stops).
    pub url_file: Option<PathBuf>,
    /// How long JetStream waits for a projection's acknowledgement before redelivering (30 s).
    pub ack_wait: Duration,
    /// How long a finished workload stays in the read models ([`RETAIN`] by default; `None`:
    /// for ever). See [`model::prune`].
    pub retain: Option<Duration>,
}

/// How long a finished workload stays in the read models by default: 30 days.
pub const RETAIN: Duration = Duration::from_secs(30 * 24 * 3600);

/// How often retention looks for what to take out, and how much it takes out per transaction
/// (at most [`PRUNE_BATCHES`] of them per look, so the projections never wait long).
const PRUNE_EVERY: Duration = Duration::from_secs(60);
const PRUNE_BATCH: usize = 500;
const PRUNE_BATCHES: usize = 20;

/// Every [`PRUNE_EVERY`], takes out of the read models on `conn` what finished longer than
/// `retain` ago ([`model::prune`]), in transactions of [`PRUNE_BATCH`]; runs until dropped.
async fn keep_for(conn: allot_store::rusqlite::Connection, retain: Duration) {
    let conn = Arc::new(Mutex::new(conn));
    let mut tick = tokio::time::interval(PRUNE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // A retention longer than time goes back keeps everything.
        let Some(before) = chrono::TimeDelta::from_std(retain)
            .ok()
            .and_then(|d| chrono::Utc::now().checked_sub_signed(d))
        else {
            continue;
        };
        let conn = conn.clone();
        let pruned = tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().expect("retention's connection");
            let mut total = model::Pruned::default();
            for _ in 0..PRUNE_BATCHES {
                let p = model::prune(&mut conn, before, PRUNE_BATCH)?;
                total.workloads += p.workloads;
                total.decisions += p.decisions;
                if p.workloads < PRUNE_BATCH && p.decisions < PRUNE_BATCH {
                    break;
                }
            }
            Ok::<_, allot_store::rusqlite::Error>(total)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
        match pruned {
            Ok(p) if p != model::Pruned::default() => tracing::info!(
                workloads = p.workloads,
                decisions = p.decisions,
                finished_before = %before,
                "retention took out what finished before the cut-off"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention failed; trying again later"),
        }
    }
}

impl Config {
    /// Defaults: consumers `gateway-*`, no bootstrap token, no teams file.
    pub fn new(
        nats_url: impl Into<String>,
        data_dir: impl Into<PathBuf>,
        listen: SocketAddr,
    ) -> Self {
        Self {
            nats_url: nats_url.into(),
            data_dir: data_dir.into(),
            listen,
            admin_token_file: None,
            teams: None,
            consumer: "gateway".into(),
            bound: None,
            listen_fallback: false,
            url_file: None,
            retain: Some(RETAIN),
            ack_wait: Duration::from_secs(30),
        }
    }

    /// The database file.
    pub fn db_path(&self) -> PathBuf {
        self.data_dir.join("gateway.db")
    }
}

/// Why the gateway stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bus failed.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The database failed.
    #[error("gateway database: {0}")]
    Store(#[from] allot_store::StoreError),
    /// The listener or the token file.
    #[error("{0}")]
    Io(String),
    /// One of its tasks failed or panicked: the task's name and why.
    #[error("{0}")]
    Stopped(Box<allot_runtime::Stopped<Error>>),
}

/// Reads the token in `path`, or writes a new one there (mode 0600) if there is none.
pub fn admin_token(path: &Path) -> Result<String, Error> {
    let io = |e: std::io::Error| Error::Io(format!("{}: {e}", path.display()));
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    // Written whole, owner-only and synced, then renamed into place: never a half-written or
    // world-readable token.
    let token = token::generate();
    allot_runtime::files::write_whole(path, format!("{token}\n").as_bytes(), 0o600).map_err(io)?;
    Ok(token)
}

type ApplyFn = fn(&Connection, &Delivery) -> allot_store::rusqlite::Result<()>;

/// The projections: stream, filter, how to apply, linger (ms).
///
/// The read models trail their streams by up to their linger, so that under load each commits
/// a few times a second instead of every few milliseconds. Their commits are what the gateway
/// costs at fleet scale: each writes again every page it touched. They all write through one
/// connection ([`allot_store::Projection::sharing`]), so that one projection's commit does not
/// make the others read their pages afresh, as it would through connections of their own.
/// Tokens are projected at once: a token issued is used right away.
const PROJECTIONS: &[(&str, &[&str], ApplyFn, u64)] = &[
    (names::WORKLOADS, &[], model::apply_workloads, 200),
    (
        names::DECISIONS,
        &["allot.alloc.*.journal"],
        model::apply_decisions,
        200,
    ),
    (names::FLEET, &[], model::apply_fleet, 500),
    (names::INVENTORY, &[], model::apply_inventory, 200),
    (names::REMEDIATION, &[], model::apply_remediation, 200),
    (names::COSTS, &[], model::apply_costs, 200),
    (names::ACCESS, &[], model::apply_access, 0),
];

/// The page cache of the projections' connection, KiB.
const PROJECTION_CACHE_KIB: i64 = 16 * 1024;

/// Runs the gateway until `shutdown`.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mut service = Service::new("gateway", shutdown);
    let client = allot_bus::connect(
        &ConnectConfig::new(&config.nats_url, "allot-gateway"),
        service.stopping(),
    )
    .await?;
    service.drain_on_stop(client.clone());
    let db_path = config.db_path();
    let writer = allot_store::open(&db_path, model::MIGRATIONS)?;
    // The seven projections' statements, and room for their hot pages (SQLite's default
    // cache is 2 MiB).
    writer.set_prepared_statement_cache_capacity(128);
    writer
        .pragma_update(None, "cache_size", -PROJECTION_CACHE_KIB)
        .map_err(allot_store::StoreError::from)?;
    let writer: allot_store::SharedConnection = Arc::new(Mutex::new(writer));

    for (stream, filters, apply, linger) in PROJECTIONS {
        let consumer = format!("{}-{}", config.consumer, stream.to_lowercase());
        let projection =
            allot_store::Projection::sharing(writer.clone(), consumer.clone(), "gateway", *apply);
        let spec = ConsumerSpec {
            filter_subjects: filters.iter().map(|s| (*s).to_owned()).collect(),
            linger: Duration::from_millis(*linger),
            ack_wait: config.ack_wait,
            ..ConsumerSpec::new(*stream, consumer)
        };
        service.spawn(
            format!("consumer {stream}"),
            ConsumerRunner::new(client.clone(), spec, projection)
                .with_gate(service.gate(format!("consumer {stream}")))
                .run(service.stopping())
                .map(|r| r.map(drop).map_err(Error::from)),
        );
    }

    if let Some(retain) = config.retain {
        let conn = allot_store::open(&db_path, model::MIGRATIONS)?;
        let stopping = service.stopping();
        service.spawn("retention", async move {
            tokio::select! {
                () = keep_for(conn, retain) => Ok(()),
                () = stopping => Ok(()),
            }
        });
    }

    let bus = api::Bus::new(client.clone());
    let mirror = Arc::new(Mutex::new(mirror::Mirror::default()));
    // Not ready until the journals as they were at the start are applied: before, the queue
    // it would show is an old one.
    let caught_up = service.gate("journal mirror");
    {
        let js = bus.js.clone();
        let mirror = mirror.clone();
        let stopping = service.stopping();
        service.spawn("journal mirror", async move {
            tokio::select! {
                () = mirror::follow(js, mirror, caught_up) => Ok(()),
                () = stopping => Ok(()),
            }
        });
    }

    let state = AppState::new(
        Arc::new(db::Db::new(db_path.clone())),
        mirror,
        Some(bus),
        config.teams.clone(),
    );
    {
        let js = allot_bus::async_nats::jetstream::new(client.clone());
        // Before the samples were kept in memory they were projected by a durable consumer,
        // which a gateway of this version leaves behind: removed, or the server would keep
        // every sample for it.
        let old = format!("{}-{}", config.consumer, names::TELEMETRY.to_lowercase());
        if js
            .delete_consumer_from_stream(&old, names::TELEMETRY)
            .await
            .is_ok()
        {
            tracing::info!(consumer = %old, "removed the durable TELEMETRY consumer of an earlier version");
        }
        let (samples, demand) = (state.samples(), state.sample_demand());
        let stopping = service.stopping();
        service.spawn("telemetry samples", async move {
            tokio::select! {
                () = samples::follow(js, samples, demand) => Ok(()),
                () = stopping => Ok(()),
            }
        });
    }
    if let Some(path) = &config.admin_token_file {
        let t = admin_token(path)?;
        let sha = token::sha256_hex(&t);
        state.add_token(
            sha.clone(),
            token::Known {
                token_id: token::token_id(&sha),
                team: PLATFORM_TEAM.to_owned(),
                role: TokenRole::Admin,
                expires: None,
                revoked: false,
            },
        );
    }

    {
        let state = state.clone();
        let stopping = service.stopping();
        // The live views (queue, nodes) are rebuilt when read (`AppState::snapshot`); tokens
        // issued or revoked through another gateway are picked up here.
        service.spawn("tokens", async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let reload = async {
                loop {
                    tick.tick().await;
                    if let Err(e) = state.reload_tokens(None).await {
                        tracing::warn!(error = %e, "reloading the tokens");
                    }
                }
            };
            tokio::select! {
                () = reload => Ok(()),
                () = stopping => Ok(()),
            }
        });
    }

    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) if config.listen_fallback && e.kind() == std::io::ErrorKind::AddrInUse => {
            let any = SocketAddr::new(config.listen.ip(), 0);
            tokio::net::TcpListener::bind(any)
                .await
                .map_err(|e| Error::Io(format!("listening on {any}: {e}")))?
        }
        Err(e) => return Err(Error::Io(format!("listening on {}: {e}", config.listen))),
    };
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Io(format!("listening on {}: {e}", config.listen)))?;
    tracing::info!(url = %format!("http://{addr}/"), db = %db_path.display(), "gateway listening");
    if let Some(tx) = &config.bound {
        let _ = tx.send(addr);
    }
    if let Some(path) = &config.url_file {
        allot_runtime::files::write_whole(path, format!("http://{addr}/\n").as_bytes(), 0o644)
            .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        if let Some(token) = &config.admin_token_file {
            eprintln!(
                "allot: dashboard and API at http://{addr}/ (admin token in {})",
                token.display()
            );
        }
    }
    let stopping = service.stopping();
    let router = app(state);
    service.spawn("http", async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(stopping)
            .await
            .map_err(|e| Error::Io(format!("serving HTTP: {e}")))
    });
    service.run().await.map_err(|s| Error::Stopped(Box::new(s)))
}
