//! The planner service: runs each workload's DAG — hands tasks to the allocator as their
//! dependencies succeed, retries failed runs, cancels what an abort or a final failure leaves
//! behind, and announces when a workload is finished.
//!
//! # Layout
//!
//! - [`plan`]: a submission → the workload's state. The spec is validated again with
//!   `allot-workload` — a raw submission can come from any NATS client, so it gets every check
//!   `allot submit` makes: the teams file, node capacity (against the nodes registered in the
//!   pool, once none has registered for [`Config::capacity_settle`]), and an id derived from
//!   its team and key (`allot_workload::submit::workload_id`; a
//!   known id with another spec is refused too). What fails is dead-lettered with every problem.
//!   Each task becomes an [`allot_sched::TaskSpec`]:
//!   team, priority from the class, resources, gang `<workload>/<gang>` of all its members, DAG
//!   facts (dependents, critical-path rank, from the petgraph DAG), predicted duration from
//!   `durationEstimate`, checkpoint interval, max runtime. Task ids and event ids are derived,
//!   never random, so replaying after a crash names the same things.
//! - [`machine`]: the DAG state machine, pure: task states `waiting → ready → running →
//!   succeeded | failed | cancelled`, and the [`machine::Effect`]s of each transition (task
//!   ready, task cancelled, workload finished).
//! - [`store`]: the SQLite tables (workloads, tasks, attempts and where each ran, outbox,
//!   nodes).
//! - `consume`: the consumers' handler — finds the workload a message is about, runs its
//!   transition, and commits the state, the effects (into the outbox) and the stream position
//!   in one transaction (`allot_store::apply`), so nothing is applied twice.
//! - `relay`: publishes the outbox, each event when due (a retry waits out its backoff).
//! - [`query`]: the `allot-planner` NATS micro-service answering `allot workloads` and
//!   `allot workload ID` from the database: workloads newest first with filters, one with its
//!   tasks and where their runs were granted (recorded from the journal's grants).
//!
//! # What it consumes and publishes
//!
//! | consumes | to learn |
//! |---|---|
//! | WORKLOADS `allot.workload.submitted.>` | new workloads (a known id is a no-op) |
//! | WORKLOADS `allot.workload.aborted.>` | aborts of a workload, or of one task and what follows it |
//! | WORKLOADS `allot.task.predicted.*` | the predictor's run-time estimates, which time running tasks' successors' preloads, and its right-sizing advice per task key, which the attempts of tasks that opt in (`resources.rightSize`) start with |
//! | DECISIONS `allot.alloc.*.journal` | grants (ready → running), preemptions (running → ready) and the ends of runs (completed or failed, with their lease) |
//! | FLEET `allot.node.registered.>` | the nodes of its pool, to check what a submission asks against them |
//!
//! It publishes `TaskReady` (pool from [`Config::pool`]) for each task whose dependencies all
//! succeeded, `TaskCancelled` for each run it gives up while it holds resources, and
//! `WorkloadFinished` (succeeded, failed or aborted) once per workload. Every event's id and
//! `Nats-Msg-Id` is a UUIDv5 of what it says (`ready/<task id>/<attempt>`,
//! `cancelled/<task id>/<lease>`, `finished/<workload>`).
//!
//! # Attempts, retries and cancellation
//!
//! The scheduler refuses a task id it has seen, so **every attempt has its own id**:
//! [`plan::task_id`]`(workload, task, attempt)`. A failed run with attempts left is published
//! again as attempt n+1 once `backoff × 2^(n-1)` has passed since the failure (the time the
//! allocator journalled it); a gang member's failure retries its whole gang (the other
//! members' runs are cancelled) as gang `<workload>/<gang>#<n+1>`. After the last attempt the
//! task fails, every task not done is cancelled, and the workload finishes as failed.
//!
//! **A run's end comes from the journal.** Executors report runs' ends on WORKLOADS, but a
//! report can be stale: a run stopped as it ended, whose task was granted again since. The
//! allocator refuses such a report and journals the others with how the run ended
//! (`Input::TaskFinished`, or `Input::TaskWithdrawn` for a run that ended as it was being
//! stopped, each with its `RunEnd`), so the planner acts on a run's end only as the journal
//! records it: it never believes a report the allocator refused, whichever of its consumers is
//! ahead. (A journal entry from an allocator older than this, without the run's end, ends
//! nothing here: upgrade the allocator before the planner.)
//!
//! An abort cancels the workload's tasks (or one task, its dependents and their gang mates)
//! that are not done. A running or ready (queued in the allocator) one gets a
//! `TaskCancelled`, which the allocator turns into `Input::TaskWithdrawn`: a queued run leaves
//! the queue at once, a running one's lease is released and its executor stops it. A ready run
//! whose `TaskReady` is still in the outbox (a retry's backoff) is withdrawn from the outbox
//! instead. A grant that raced the cancellation is cancelled when it appears in the journal:
//! the planner cancels every grant of a run it no longer wants.
//!
//! # Not done yet
//!
//! - Deadlines are validated but not passed to the scheduler (`TaskSpec` has no deadline).
//! - A preload already published for a task that is cancelled while still waiting is not
//!   withdrawn; its hold lapses on its own (`allot_sched::scheduler::PRELOAD_GRACE` after its time).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::Notify;

use allot_bus::consumer::{ConsumerRunner, ConsumerSpec};
use allot_bus::streams::names;
use allot_bus::{BusError, ConnectConfig, Publisher};
use allot_runtime::Service;
use allot_workload::TeamsConfig;

mod consume;
pub mod machine;
pub mod plan;
pub mod query;
mod relay;
pub mod store;

pub use consume::Planner;

/// The planner's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// NATS URL(s).
    pub nats_url: String,
    /// Folder for `planner.db`.
    pub data_dir: PathBuf,
    /// The pool tasks are handed to (one allocator leads each pool).
    pub pool: String,
    /// The teams file submissions are checked against; `None`: teams are not checked and the
    /// default priority classes apply.
    pub teams: Option<TeamsConfig>,
    /// Prefix of the durable consumers' names (`<prefix>-workloads`, `<prefix>-decisions`),
    /// also the keys of their positions.
    pub consumer_prefix: String,
    /// How long the server waits for an acknowledgement before redelivering.
    pub ack_wait: Duration,
    /// Look-ahead: a waiting task is preloaded (`TaskPreload`: the allocator holds room for
    /// it) this long before its running predecessors are expected to end; `None`: no
    /// look-ahead. Only predecessors with a duration estimate count.
    pub preload_window: Option<Duration>,
    /// A submission's requests are checked against the registered nodes only once no node
    /// has registered for this long before it (the fleet may still be forming; default 30 s).
    pub capacity_settle: Duration,
}

impl Config {
    /// Defaults: pool `default`, no teams file, consumers `planner-*`, 30 s ack wait, a 60 s
    /// look-ahead.
    pub fn new(nats_url: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            nats_url: nats_url.into(),
            data_dir: data_dir.into(),
            pool: "default".into(),
            teams: None,
            consumer_prefix: "planner".into(),
            ack_wait: Duration::from_secs(30),
            preload_window: Some(Duration::from_secs(60)),
            capacity_settle: Duration::from_millis(consume::DEFAULT_SETTLE_MS),
        }
    }

    /// The database file.
    pub fn db_path(&self) -> PathBuf {
        self.data_dir.join("planner.db")
    }
}

/// Why the planner stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// NATS or JetStream failed.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The database could not be opened.
    #[error(transparent)]
    Store(#[from] allot_store::StoreError),
    /// The pool name cannot be a subject token.
    #[error(transparent)]
    Pool(#[from] allot_events::subject::InvalidToken),
    /// The query endpoint could not be started.
    #[error("starting the query service: {0}")]
    Query(String),
    /// One of its tasks failed or panicked: the task's name and why.
    #[error("{0}")]
    Stopped(Box<allot_runtime::Stopped<Error>>),
}

/// Runs the planner until `shutdown` completes or one of its tasks fails: three durable
/// consumers, the outbox relay and the query endpoint, each with its own SQLite connection.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    allot_events::subject::validate_token("pool", &config.pool)?;
    let mut service = Service::new("planner", shutdown);
    let client = allot_bus::connect(
        &ConnectConfig::new(&config.nats_url, "allot-planner"),
        service.stopping(),
    )
    .await?;
    service.drain_on_stop(client.clone());
    let shutdown = service.stopping();
    let open = || allot_store::open(&config.db_path(), store::MIGRATIONS);
    let wake = Arc::new(Notify::new());
    tracing::info!(db = %config.db_path().display(), pool = %config.pool, "planner started");

    let consumer = |stream: &str, suffix: &str, filter: &[&str]| {
        let durable = format!("{}-{suffix}", config.consumer_prefix);
        let spec = ConsumerSpec {
            filter_subjects: filter.iter().map(|s| (*s).to_owned()).collect(),
            ack_wait: config.ack_wait,
            ..ConsumerSpec::new(stream, durable.clone())
        };
        let handler = Planner::new(
            open()?,
            durable,
            config.pool.clone(),
            config.teams.clone(),
            config
                .preload_window
                .map(|w| w.as_millis() as allot_sched::Time),
            wake.clone(),
        )
        .with_settle(config.capacity_settle.as_millis() as allot_sched::Time);
        Ok::<_, Error>(
            ConsumerRunner::new(client.clone(), spec, handler)
                .with_gate(service.gate(format!("consumer {stream}"))),
        )
    };
    let workloads = consumer(
        names::WORKLOADS,
        "workloads",
        &[
            "allot.workload.submitted.>",
            "allot.workload.aborted.>",
            // `allot.task.predicted.<pool>`: the predictor's estimates time the look-ahead.
            "allot.task.predicted.*",
        ],
    )?;
    let decisions = consumer(names::DECISIONS, "decisions", &["allot.alloc.*.journal"])?;
    let fleet = consumer(names::FLEET, "fleet", &["allot.node.registered.>"])?;
    let relay = relay::Relay {
        conn: open()?,
        publisher: Publisher::new(client.clone(), consume::SOURCE),
        wake,
    };

    for (stream, consumer) in [
        (names::WORKLOADS, workloads),
        (names::DECISIONS, decisions),
        (names::FLEET, fleet),
    ] {
        service.spawn(
            format!("consumer {stream}"),
            consumer
                .run(shutdown.clone())
                .map(|r| r.map(drop).map_err(Error::from)),
        );
    }
    service.spawn("relay", relay.run(shutdown.clone()).map(Ok));
    let query = query::Endpoint {
        client: client.clone(),
        conn: open()?,
    };
    service.spawn("query", query.run(shutdown.clone()));
    service.run().await.map_err(|s| Error::Stopped(Box::new(s)))
}
