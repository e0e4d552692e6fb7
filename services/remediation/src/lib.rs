//! The remediation service: watches every node's telemetry and heartbeats through the health
//! rules ([`allot_health`]) and publishes what it does about them, each action an event
//! (`allot.remediation.action_taken.<node>`) naming its rule, the readings behind it and the
//! runs it affects.
//!
//! # What it reads, and what comes of it
//!
//! | stream | events | what remediation does |
//! |---|---|---|
//! | FLEET | node registered | counts the node (the circuit breaker's pool) |
//! | FLEET | heartbeat | the node is alive; silence past a rule's hold-down fires it |
//! | TELEMETRY | GPU samples | readings for every rule (temperature against the slowdown threshold, power, memory, ECC …); what holds each GPU |
//! | REMEDIATION | operator cordon / uncordon | leaves that node alone while cordoned |
//!
//! The allocator journals the actions that change capacity (soft-cordon, cordon, drain, GPU
//! out of service and their returns to service) as scheduler inputs; alerts and requests to an
//! actuator (reset a GPU, reboot a node) are for people and other tools. A node an operator
//! cordoned is never acted on, and remediation never lifts an operator's cordon.
//!
//! # Exactly once
//!
//! What the rules know ([`watch`]: a record per node, a row per grant watched) and the actions
//! they decided are written with the consumer's stream position in one SQLite transaction
//! ([`store`]) — only the records a batch changed, so a commit costs what the batch did, not the
//! size of the fleet; a redelivered batch is skipped by its position, so no reading is weighed
//! twice. The relay publishes the outbox
//! afterwards under each action's stored id (JetStream drops a second copy within the
//! REMEDIATION stream's duplicate window) and forgets an action only once it is acknowledged.
//! A ticker lets time pass (lost heartbeats, healthy spells) under the same rule.
//!
//! # Who it believes
//!
//! The server lets only a node's own collector publish its heartbeats and telemetry and only
//! `admin` publish an operator's cordon; every consumer here also checks that an event's node
//! is the one its subject names, and dead-letters it otherwise.
//!
//! `metrics` counts the actions decided, by action (`allot_remediation_actions_total`).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use futures::FutureExt;
use tokio::sync::{Mutex, Notify};

use allot_bus::consumer::{ConsumerRunner, ConsumerSpec, Delivery, Handler, HandlerError, Outcome};
use allot_bus::streams::names;
use allot_bus::{BusError, ConnectConfig, Publisher};
use allot_events::remediation::ActionTaken;
use allot_events::{
    AnyEvent, Envelope, EventKind, NodeEvent, RemediationEvent, TelemetryEvent, subject,
};
use allot_health::{Millis, RuleSet};
use allot_runtime::Service;
use allot_store::rusqlite::{Connection, TransactionBehavior};

mod metrics;
pub mod store;
pub mod watch;

pub use watch::{BreakerPolicy, Watch};

/// How long a consumer waits for more of a batch before it applies and commits it.
const LINGER: Duration = Duration::from_millis(50);

/// The `source` of remediation's events.
pub const SOURCE: &str = "/allot/remediation";

/// Remediation's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// NATS URL(s).
    pub nats_url: String,
    /// Folder for `remediation.db`.
    pub data_dir: PathBuf,
    /// Prefix of the durable consumer names (`<prefix>-fleet`, `<prefix>-telemetry`,
    /// `<prefix>-operators`); also the keys of their applied positions.
    pub consumer_prefix: String,
    /// The health rules.
    pub rules: RuleSet,
    /// How much of the fleet it may take out within a window.
    pub breaker: BreakerPolicy,
    /// How often time is let pass with no reading (lost heartbeats, healthy spells).
    pub tick: Duration,
    /// How long the server waits for an acknowledgement before redelivering.
    pub ack_wait: Duration,
}

impl Config {
    /// Defaults: the built-in rules, a tenth of the fleet per ten minutes, 1 s ticks.
    pub fn new(nats_url: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            nats_url: nats_url.into(),
            data_dir: data_dir.into(),
            consumer_prefix: "remediation".into(),
            rules: RuleSet::default(),
            breaker: BreakerPolicy::default(),
            tick: Duration::from_secs(1),
            ack_wait: Duration::from_secs(30),
        }
    }

    /// The database file.
    pub fn db_path(&self) -> PathBuf {
        self.data_dir.join("remediation.db")
    }
}

/// Why remediation stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// NATS or JetStream failed.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The database could not be opened.
    #[error(transparent)]
    Store(#[from] allot_store::StoreError),
    /// The database could not be read.
    #[error(transparent)]
    State(#[from] store::Error),
    /// One of its tasks failed or panicked: the task's name and why.
    #[error("{0}")]
    Stopped(Box<allot_runtime::Stopped<Error>>),
}

/// The rules' state and the connection it is stored through, shared by the consumers and
/// the ticker (one writer at a time).
struct Core {
    conn: Connection,
    watch: Watch,
    rules: RuleSet,
    breaker: BreakerPolicy,
    /// The pool's row as the last commit stored it (`None`: not known, written next time).
    last_pool: Option<String>,
    /// A commit failed and the watch could not be read back yet.
    stale: bool,
}

impl Core {
    /// A core over `conn`, with the watch as the last commit stored it.
    fn open(conn: Connection, rules: RuleSet, breaker: BreakerPolicy) -> Result<Self, Error> {
        let watch = restore(&rules, breaker, store::load(&conn)?);
        Ok(Self {
            conn,
            watch,
            rules,
            breaker,
            last_pool: None,
            stale: false,
        })
    }

    /// Commits what the watch changed with the `actions` it decided (and the consumer's new
    /// position). The watch is changed in place, not copied per batch: if the commit fails, it
    /// is read back as the last commit left it, and the batch is retried.
    fn commit(
        &mut self,
        actions: &[ActionTaken],
        position: Option<(&str, u64)>,
    ) -> Result<(), store::Error> {
        let result = self.write(actions, position);
        if result.is_err()
            && let Err(e) = self.reload()
        {
            tracing::warn!(error = %e, "reading remediation's state back failed");
        }
        result
    }

    fn write(
        &mut self,
        actions: &[ActionTaken],
        position: Option<(&str, u64)>,
    ) -> Result<(), store::Error> {
        let changes = self.watch.take_changes();
        if changes.is_empty()
            && actions.is_empty()
            && position.is_none()
            && self.last_pool.is_some()
        {
            // A tick that changed nothing of a node: only the pool's row could differ.
            let pool = serde_json::to_string(&changes.pool)?;
            if self.last_pool.as_deref() == Some(pool.as_str()) {
                return Ok(());
            }
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        store::save(&tx, &changes, &mut self.last_pool)?;
        for action in actions {
            let envelope = Envelope::new(SOURCE, RemediationEvent::ActionTaken(action.clone()));
            store::enqueue(
                &tx,
                &envelope.nats_subject(),
                &envelope.id.to_string(),
                &envelope.to_json(),
            )?;
        }
        if let Some((consumer, seq)) = position {
            allot_store::record_position(&tx, consumer, seq)?;
        }
        tx.commit()?;
        metrics::decided(actions);
        Ok(())
    }

    /// The watch as the last commit stored it. Until that has been read, the watch is stale:
    /// nothing is weighed or committed ([`Core::ready`]), because it holds what a failed commit
    /// did not store and no longer knows what changed.
    fn reload(&mut self) -> Result<(), store::Error> {
        // What the last commit stored is not known now: the next one writes the pool's row.
        self.last_pool = None;
        match store::load(&self.conn) {
            Ok(loaded) => {
                self.watch = restore(&self.rules, self.breaker, loaded);
                self.stale = false;
                Ok(())
            }
            Err(e) => {
                self.stale = true;
                Err(e)
            }
        }
    }

    /// Reads the watch back if a failed commit left it stale; an error: try again later.
    fn ready(&mut self) -> Result<(), store::Error> {
        if self.stale { self.reload() } else { Ok(()) }
    }
}

/// The watch that `loaded` describes (a fresh one for nothing).
fn restore(rules: &RuleSet, breaker: BreakerPolicy, loaded: Option<store::Loaded>) -> Watch {
    match loaded {
        Some(store::Loaded::Rows(stored)) => Watch::restore(rules.clone(), breaker, stored),
        Some(store::Loaded::Whole(state)) => Watch::restore_whole(rules.clone(), breaker, *state),
        None => Watch::new(rules.clone(), breaker),
    }
}

/// Runs remediation until `shutdown` completes.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mut service = Service::new("remediation", shutdown);
    let client = allot_bus::connect(
        &ConnectConfig::new(&config.nats_url, "allot-remediation"),
        service.stopping(),
    )
    .await?;
    service.drain_on_stop(client.clone());
    let shutdown = service.stopping();
    let open = || allot_store::open(&config.db_path(), store::MIGRATIONS);
    let conn = open()?;
    let relay_conn = open()?;
    let core = Core::open(conn, config.rules.clone(), config.breaker)?;
    tracing::info!(
        db = %config.db_path().display(),
        rules = config.rules.rules.len(),
        held = core.watch.held().len(),
        "remediation started"
    );
    let core = Arc::new(Mutex::new(core));
    let wake = Arc::new(Notify::new());

    let feeds = [
        (names::FLEET, "fleet", Vec::new()),
        (names::TELEMETRY, "telemetry", Vec::new()),
        (
            names::REMEDIATION,
            "operators",
            vec![subject::remediation("operator_cordon", "*")],
        ),
    ];
    for (stream, suffix, filter) in feeds {
        let durable = format!("{}-{suffix}", config.consumer_prefix);
        let mut spec = ConsumerSpec::new(stream, durable.clone());
        spec.ack_wait = config.ack_wait;
        spec.filter_subjects = filter;
        // Each commit rewrites every database page its batch's rows touched: lingering up to
        // 50 ms for more of a batch keeps commits few under a fleet's telemetry
        // (docs/benchmarks.md), at tens of milliseconds on a detection that a hold-down
        // measures in seconds.
        spec.linger = LINGER;
        let runner = ConsumerRunner::new(
            client.clone(),
            spec,
            Feed {
                core: core.clone(),
                consumer: durable,
                wake: wake.clone(),
            },
        )
        .with_gate(service.gate(format!("consumer {stream}")));
        service.spawn(
            format!("consumer {stream}"),
            runner
                .run(shutdown.clone())
                .map(|r| r.map(drop).map_err(Error::from)),
        );
    }
    let ticker = Ticker {
        core,
        every: config.tick,
        wake: wake.clone(),
    };
    service.spawn("ticker", ticker.run(shutdown.clone()));
    let relay = Relay {
        conn: relay_conn,
        publisher: Publisher::new(client.clone(), SOURCE),
        wake,
    };
    service.spawn("relay", relay.run(shutdown.clone()).map(Ok));
    service.run().await.map_err(|s| Error::Stopped(Box::new(s)))
}

/// One consumer's deliveries, weighed by the shared watch.
struct Feed {
    core: Arc<Mutex<Core>>,
    consumer: String,
    wake: Arc<Notify>,
}

impl Handler for Feed {
    fn resume_after(&mut self) -> Result<Option<u64>, HandlerError> {
        let core = self.core.try_lock().map_err(|_| {
            HandlerError::transient("remediation state busy at start; retrying".to_owned())
        })?;
        let position = allot_store::position(&core.conn, &self.consumer).map_err(db)?;
        Ok(Some(position.unwrap_or(0)))
    }

    async fn handle(&mut self, batch: &[Delivery]) -> Result<Vec<Outcome>, HandlerError> {
        let mut core = self.core.lock().await;
        core.ready().map_err(db)?;
        let done = allot_store::position(&core.conn, &self.consumer)
            .map_err(db)?
            .unwrap_or(0);
        let mut actions = Vec::new();
        let mut outcomes = Vec::with_capacity(batch.len());
        // At or below the position, or a redelivered copy of one earlier in the batch (a
        // process paused past its ack wait reads both): applied already.
        let mut seen = done;
        for d in batch {
            if d.stream_sequence <= seen {
                outcomes.push(Outcome::Handled);
                continue;
            }
            seen = d.stream_sequence;
            match weigh(&mut core.watch, d) {
                Ok(decided) => {
                    actions.extend(decided);
                    outcomes.push(Outcome::Handled);
                }
                Err(why) => outcomes.push(Outcome::Rejected(why)),
            }
        }
        let Some(last) = batch.iter().map(|d| d.stream_sequence).max() else {
            return Ok(outcomes);
        };
        if last <= done {
            return Ok(outcomes);
        }
        core.commit(&actions, Some((&self.consumer, last)))
            .map_err(|e| HandlerError::transient(format!("remediation database: {e}")))?;
        for a in &actions {
            tracing::info!(
                node = %a.node, gpu = ?a.gpu, action = a.action.as_str(), rule = %a.rule,
                "{}", a.reason
            );
        }
        if !actions.is_empty() {
            self.wake.notify_one();
        }
        Ok(outcomes)
    }
}

/// What one delivery means to `watch`: the actions it decided, or why it must not be believed.
fn weigh(watch: &mut Watch, d: &Delivery) -> Result<Vec<ActionTaken>, String> {
    let at = watch::millis(d.published);
    let event = &d.event.data;
    if let AnyEvent::Node(_) | AnyEvent::Telemetry(_) | AnyEvent::Remediation(_) = event {
        let expected = event.nats_subject();
        if d.subject != expected {
            return Err(format!(
                "an event about node {} arrived on {}, not {expected}",
                event.entity(),
                d.subject
            ));
        }
    }
    Ok(match event {
        AnyEvent::Node(NodeEvent::Registered(r)) => {
            watch.registered(&r.node);
            Vec::new()
        }
        AnyEvent::Node(NodeEvent::HeartbeatSent(h)) => watch.heartbeat(&h.node, at),
        AnyEvent::Telemetry(TelemetryEvent::GpusSampled(s)) => watch.sampled(s, at),
        AnyEvent::Remediation(RemediationEvent::OperatorCordon(c)) => {
            watch.operator(&c.node, c.cordoned);
            Vec::new()
        }
        _ => Vec::new(),
    })
}

fn db(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::transient(format!("remediation database: {e}"))
}

/// Lets time pass when no reading comes: a silent node loses its heartbeat, a healthy spell
/// ends.
struct Ticker {
    core: Arc<Mutex<Core>>,
    every: Duration,
    wake: Arc<Notify>,
}

impl Ticker {
    async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        tokio::pin!(shutdown);
        let mut interval = tokio::time::interval(self.every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                _ = interval.tick() => {}
            }
            let mut core = self.core.lock().await;
            if let Err(e) = core.ready() {
                tracing::warn!(error = %e, "reading remediation's state back failed; retrying");
                continue;
            }
            let actions = core.watch.tick(now_ms());
            if let Err(e) = core.commit(&actions, None) {
                tracing::warn!(error = %e, "storing remediation's state failed; retrying");
                continue;
            }
            if !actions.is_empty() {
                for a in &actions {
                    tracing::info!(
                        node = %a.node, action = a.action.as_str(), rule = %a.rule,
                        "{}", a.reason
                    );
                }
                self.wake.notify_one();
            }
        }
    }
}

/// Publishes the outbox in order, each action under its stored id, forgetting it once
/// acknowledged.
struct Relay {
    conn: Connection,
    publisher: Publisher,
    wake: Arc<Notify>,
}

impl Relay {
    async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut failing = false;
        loop {
            let more = match self.flush().await {
                Ok(more) => {
                    failing = false;
                    more
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "publishing remediation's actions failed; retrying");
                    }
                    failing = true;
                    false
                }
            };
            if more {
                continue;
            }
            let wait = if failing { RETRY } else { IDLE };
            tokio::select! {
                () = &mut shutdown => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Publishes one batch; whether more may be waiting.
    async fn flush(&mut self) -> Result<bool, String> {
        let queued = store::queued(&self.conn, 64).map_err(|e| e.to_string())?;
        let full = queued.len() == 64;
        let mut pending = Vec::with_capacity(queued.len());
        for q in queued {
            let message = PublishMessage::build()
                .message_id(q.msg_id)
                .payload(Bytes::from(q.payload));
            let ack = self
                .publisher
                .send_raw(q.subject, message)
                .await
                .map_err(|e| e.to_string())?;
            pending.push((q.id, ack));
        }
        for (id, ack) in pending {
            ack.wait().await.map_err(|e| e.to_string())?;
            store::sent(&self.conn, id).map_err(|e| e.to_string())?;
        }
        Ok(full)
    }
}

/// Longest sleep with nothing queued (commits wake the relay).
const IDLE: Duration = Duration::from_secs(1);
/// Wait after a failed publish before trying again.
const RETRY: Duration = Duration::from_secs(1);

fn now_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}
