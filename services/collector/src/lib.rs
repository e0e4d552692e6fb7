//! The collector: Allot's agent on every GPU node. It describes the node once
//! (`NodeRegistered`), then reports that it is alive (`HeartbeatSent`) and what its GPUs are
//! doing (`GpusSampled`) at fixed intervals, each publish acknowledged by JetStream.
//!
//! # Layout
//!
//! - [`source`]: the one [`GpuSource`] trait every GPU source implements, and
//!   [`select_source`], which turns the operator's [`SourceChoice`] (`auto`, `nvml`,
//!   `simulated`) into a source and a sentence saying which one and why.
//! - [`nvml`]: real GPUs through NVML. The library calls sit behind a small internal trait so
//!   that the mapping to events — unsupported readings are absent, NVLink peers are resolved
//!   to local indices by PCI bus id, XIDs are counted from NVML events — is tested without a GPU.
//! - [`sim`]: a simulated node of M GPUs of one real model, whose telemetry follows the load
//!   and faults set through its [`SimLoad`] handle (so `allot up` can drive it), with seeded
//!   noise and UUIDs stable across restarts; [`sim::inject`] applies a schedule of faults
//!   ([`Injection`]s, `KIND:NODE@TIME`) to simulated nodes, including a network partition
//!   that this file's loop honours by publishing nothing more.
//! - [`host`]: the machine itself: host name, CPU count and memory, reported for NVML nodes.
//! - This file: the service. [`Config`], [`Error`], [`run`] and [`run_with_source`]: connect
//!   to NATS, register the node (retrying until it is stored), then heartbeat and sample until
//!   shutdown, and drain the connection.
//!
//! The collector does not create streams; whoever sets the system up runs
//! `allot_bus::ensure_streams(…, &allot_bus::catalog(…))` first. Until the streams exist the
//! registration is retried with backoff.

pub mod executor;
pub mod host;
pub mod nvml;
pub mod sim;
pub mod source;

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use allot_bus::{BusError, ConnectConfig, PublishError, Publisher};
use allot_events::node::{HeartbeatSent, NodeRegistered};
use allot_events::subject::{InvalidToken, validate_token};
use allot_events::telemetry::GpusSampled;
use futures::FutureExt;
use tokio::time::MissedTickBehavior;
use tracing::Instrument;

use allot_runtime::{Service, Stopping};

pub use executor::{ExecutorConfig, ProcessRuns, Runs, SimulatedRuns};
pub use host::HostCapacity;
pub use nvml::NvmlSource;
pub use sim::inject::{InjectKind, Injection, Injector};
pub use sim::{GpuModel, SimFault, SimLoad, SimSpec, SimulatedSource};
pub use source::{GpuInventory, GpuSource, SourceChoice, SourceError, select_source};

/// How long shutdown waits for the NATS connection to drain.
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// Longest wait between two registration attempts.
const REGISTER_MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Everything the collector needs to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// NATS URL(s), comma-separated.
    pub nats_url: String,
    /// Node name, unique in the cluster; becomes a subject token.
    pub node: String,
    /// The GPU pool the node belongs to; becomes a subject token.
    pub pool: String,
    /// Rack (or other failure/topology domain), when known.
    pub rack: Option<String>,
    /// The host name reported at registration.
    pub hostname: String,
    /// Where GPU facts come from.
    pub source: SourceChoice,
    /// The node to simulate when the simulator is used.
    pub sim: SimSpec,
    /// Time between heartbeats.
    pub heartbeat_interval: Duration,
    /// Time between telemetry samples.
    pub telemetry_interval: Duration,
    /// Whether and how the node runs the tasks granted to it.
    pub executor: ExecutorConfig,
}

impl Config {
    /// A config for node `node` talking to `nats_url`, with the defaults: pool `default`, no
    /// rack, this machine's host name, `auto` source, the default simulated node, a heartbeat
    /// every 5 s, a sample every 10 s, and no executor.
    pub fn new(nats_url: impl Into<String>, node: impl Into<String>) -> Self {
        Self {
            nats_url: nats_url.into(),
            node: node.into(),
            pool: "default".to_owned(),
            rack: None,
            hostname: host::hostname(),
            source: SourceChoice::Auto,
            sim: SimSpec::default(),
            heartbeat_interval: Duration::from_secs(5),
            telemetry_interval: Duration::from_secs(10),
            executor: ExecutorConfig::default(),
        }
    }

    /// Every problem with this config at once, so the operator fixes them in one go.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let mut problems = Vec::new();
        if let Err(e) = validate_token("node name", &self.node) {
            problems.push(ConfigProblem::Name(e));
        }
        if let Err(e) = validate_token("pool", &self.pool) {
            problems.push(ConfigProblem::Name(e));
        }
        for (what, interval) in [
            ("heartbeat interval", self.heartbeat_interval),
            ("telemetry interval", self.telemetry_interval),
        ] {
            if interval.is_zero() {
                problems.push(ConfigProblem::ZeroInterval { what });
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(InvalidConfig(problems))
        }
    }
}

/// One thing wrong with a [`Config`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    /// A name that would break the subjects it goes into.
    #[error(transparent)]
    Name(#[from] InvalidToken),
    /// An interval of zero would make the collector spin.
    #[error("the {what} must be longer than zero")]
    ZeroInterval {
        /// Which interval.
        what: &'static str,
    },
}

/// Everything wrong with a [`Config`] (never empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidConfig(pub Vec<ConfigProblem>);

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid collector configuration: ")?;
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for InvalidConfig {}

/// Why the collector stopped other than by a requested shutdown.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The operator's configuration is invalid; nothing was started or published.
    #[error(transparent)]
    InvalidConfig(#[from] InvalidConfig),
    /// The GPU source could not be opened or could not describe the node.
    #[error("GPU source: {0}")]
    Source(#[from] SourceError),
    /// NATS failed in a way retrying cannot fix (a malformed URL, rejected credentials).
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The executor could not go on (its outbox database failed).
    #[error("executor: {0}")]
    Executor(#[from] executor::ExecutorError),
    /// One of its tasks failed or panicked: the task's name and why.
    #[error("{0}")]
    Stopped(Box<allot_runtime::Stopped<Error>>),
}

/// Runs the collector until `shutdown` completes, with the GPU source `config.source` selects.
///
/// Returns `Ok(())` after a requested shutdown, once the NATS connection has drained (or 5 s
/// have passed).
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    config.validate()?;
    let (source, why) = select_source(config.source, &config.node, &config.sim)?;
    tracing::info!(node = %config.node, gpu_source = ?source.kind(), "{why}");
    run_with_source(config, source, shutdown).await
}

/// Like [`run`], with a source the caller opened: tests, and `allot up`, which keeps the
/// [`SimLoad`] handle of each simulated node it starts. `config.source` and `config.sim` are
/// not used.
pub async fn run_with_source(
    config: Config,
    source: Box<dyn GpuSource>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    config.validate()?;
    let span = tracing::info_span!("collector", node = %config.node);
    serve(config, source, shutdown).instrument(span).await
}

async fn serve(
    config: Config,
    source: Box<dyn GpuSource>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let started = Instant::now();
    let kind = source.kind();
    let (source, inventory) = on_blocking_thread(source, |s| s.describe()).await;
    let inventory = inventory?;
    let capacity = inventory.host.unwrap_or_else(host::local_capacity);
    let registration = NodeRegistered {
        node: config.node.clone(),
        hostname: config.hostname.clone(),
        pool: config.pool.clone(),
        rack: config.rack.clone(),
        cpu_milli: capacity.cpu_milli,
        memory_mib: capacity.memory_mib,
        gpu_source: kind,
        driver_version: inventory.driver_version,
        gpus: inventory.gpus,
    };

    // The executor stops its runs within their grace period, then the connection drains.
    let mut service =
        Service::new("collector", shutdown).with_grace(config.executor.stop_grace() + DRAIN_GRACE);
    let connect = ConnectConfig::new(
        config.nats_url.clone(),
        format!("allot-collector-{}", config.node),
    );
    let client = match allot_bus::connect(&connect, service.stopping()).await {
        Ok(client) => client,
        Err(BusError::ShutdownBeforeConnect { .. }) => {
            tracing::info!("shut down before NATS became reachable");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    service.drain_on_stop(client.clone());
    let publisher = Publisher::new(client.clone(), format!("/allot/collector/{}", config.node));
    let load = source.sim_load();
    let partition = load.clone();
    let holdings = executor::Holdings::default();
    let (stop_executor, executor_stopped) = tokio::sync::watch::channel(false);
    let stopping = service.stopping();
    let executor_holdings = holdings.clone();
    service.spawn(
        "executor",
        async move {
            executor::run(
                client,
                config.node.clone(),
                config.pool.clone(),
                config.executor.clone(),
                load,
                executor_holdings,
                executor_stopped,
            )
            .await
        }
        .map(|r| r.map_err(Error::from)),
    );
    tokio::spawn(async move {
        stopping.await;
        let _ = stop_executor.send(true);
    });
    service.spawn(
        "reporter",
        Collector {
            publisher,
            source,
            registration,
            heartbeat_interval: config.heartbeat_interval,
            telemetry_interval: config.telemetry_interval,
            started,
            holdings,
            partition,
            shutdown: service.stopping(),
        }
        .run()
        .map(Ok),
    );
    service.run().await.map_err(|s| Error::Stopped(Box::new(s)))
}

/// The collector's main loop: register, then heartbeat and sample until shutdown.
struct Collector {
    publisher: Publisher,
    source: Box<dyn GpuSource>,
    registration: NodeRegistered,
    heartbeat_interval: Duration,
    telemetry_interval: Duration,
    started: Instant,
    /// What the executor runs on each GPU, reported with every sample.
    holdings: executor::Holdings,
    /// A simulated node's handle, through which it can be cut off the network (`None` for
    /// real GPUs).
    partition: Option<sim::SimLoad>,
    shutdown: Stopping,
}

impl fmt::Debug for Collector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Collector")
            .field("node", &self.registration.node)
            .field("source", &self.source.kind())
            .finish_non_exhaustive()
    }
}

impl Collector {
    /// Returns when shutdown is requested; publish and sample failures are logged and retried
    /// on the next tick, never fatal.
    async fn run(mut self) {
        if !self.register().await {
            return;
        }
        let mut heartbeat = tokio::time::interval(self.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut telemetry = tokio::time::interval(self.telemetry_interval);
        telemetry.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut seq = 0u64;
        let mut heartbeat_failures = Failures::new("heartbeat");
        let mut telemetry_failures = Failures::new("telemetry");
        let node = self.registration.node.clone();
        let mut source = Some(self.source);
        let mut silent = false;

        loop {
            // A tick that started is finished (its publish is bounded by the ack timeout)
            // before shutdown is noticed: stop taking work, finish what is in flight.
            tokio::select! {
                biased;
                () = &mut self.shutdown => break,
                _ = heartbeat.tick() => {
                    if cut_off(self.partition.as_ref(), &mut silent) {
                        continue;
                    }
                    seq += 1;
                    let event = HeartbeatSent {
                        node: node.clone(),
                        seq,
                        uptime_s: self.started.elapsed().as_secs(),
                    };
                    heartbeat_failures.record(self.publisher.publish(event).await);
                }
                _ = telemetry.tick() => {
                    if cut_off(self.partition.as_ref(), &mut silent) {
                        continue;
                    }
                    let Some(taken) = source.take() else { break };
                    let (back, samples) = on_blocking_thread(taken, |s| s.sample()).await;
                    source = Some(back);
                    match samples {
                        Ok(samples) => {
                            let held = self
                                .holdings
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .clone();
                            let event = GpusSampled { node: node.clone(), samples, held };
                            // Sent once: a failed sample is dropped and the next supersedes
                            // it, which is why samples carry no `Nats-Msg-Id`.
                            telemetry_failures.record(self.publisher.publish(event).await);
                        }
                        Err(e) => telemetry_failures.sample_failed(&e),
                    }
                }
            }
        }
    }

    /// Publishes the registration until it is acknowledged (`true`) or shutdown is requested
    /// (`false`).
    async fn register(&mut self) -> bool {
        // One envelope for every attempt: if an attempt was stored but its ack was lost, the
        // retry carries the same id and JetStream drops it as a duplicate.
        let envelope = self.publisher.envelope(self.registration.clone());
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let result = tokio::select! {
                biased;
                () = &mut self.shutdown => return false,
                result = self.publisher.publish_envelope(&envelope) => result,
            };
            let error = match result {
                Ok(published) => {
                    tracing::info!(
                        gpus = self.registration.gpus.len(),
                        stream = %published.stream,
                        sequence = published.sequence,
                        "node registered"
                    );
                    return true;
                }
                Err(e) => e,
            };
            let wait = allot_bus::connect::backoff(attempt, REGISTER_MAX_BACKOFF);
            tracing::warn!(
                attempt,
                retry_in_ms = wait.as_millis() as u64,
                error = %error,
                "registering the node failed; retrying"
            );
            tokio::select! {
                biased;
                () = &mut self.shutdown => return false,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// Whether a simulated partition cut the node off, so that it must publish nothing (its
/// executor goes on running what it runs). Says so once, when it sets `silent`.
fn cut_off(partition: Option<&sim::SimLoad>, silent: &mut bool) -> bool {
    if !*silent && partition.is_some_and(sim::SimLoad::is_partitioned) {
        *silent = true;
        tracing::info!("the simulated node is cut off: no more heartbeats or telemetry from it");
    }
    *silent
}

/// Runs `f` on the source on a blocking thread (NVML calls block, sometimes for seconds on a
/// sick GPU) and hands the source back with the result.
async fn on_blocking_thread<T: Send + 'static>(
    mut source: Box<dyn GpuSource>,
    f: impl FnOnce(&mut dyn GpuSource) -> T + Send + 'static,
) -> (Box<dyn GpuSource>, T) {
    let task = tokio::task::spawn_blocking(move || {
        let out = f(source.as_mut());
        (source, out)
    });
    match task.await {
        Ok(done) => done,
        // A panic in a source is a bug: let it surface where the collector runs. (A blocking
        // task is only cancelled when the runtime shuts down, which drops this future first.)
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// A run of failures of one kind of publish: the first failure is logged as a warning, the
/// rest of the run at debug, and the recovery once — so a NATS outage makes two lines, not
/// one per tick.
#[derive(Debug)]
struct Failures {
    what: &'static str,
    run: u64,
}

impl Failures {
    fn new(what: &'static str) -> Self {
        Self { what, run: 0 }
    }

    fn record<T>(&mut self, result: Result<T, PublishError>) {
        match result {
            Ok(_) => self.succeeded(),
            Err(e) => self.failed(&e, "publishing failed; trying again next tick"),
        }
    }

    fn sample_failed(&mut self, error: &SourceError) {
        self.failed(error, "sampling the GPUs failed; trying again next tick");
    }

    fn failed(&mut self, error: &dyn std::error::Error, message: &str) {
        self.run += 1;
        if self.run == 1 {
            tracing::warn!(what = self.what, error = %error, "{message}");
        } else {
            tracing::debug!(what = self.what, failures = self.run, error = %error, "{message}");
        }
    }

    fn succeeded(&mut self) {
        if self.run > 0 {
            tracing::info!(
                what = self.what,
                failures = self.run,
                "{} works again after failures",
                self.what
            );
            self.run = 0;
        }
    }
}

#[cfg(test)]
mod tests;
