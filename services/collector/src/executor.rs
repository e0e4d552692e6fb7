//! The executor: runs on every node what the allocator granted it, and reports each run's life.
//!
//! It reads the pool's journal (`allot.alloc.<pool>.journal`), where every grant carries a
//! [`Dispatch`](allot_events::alloc::Dispatch): the task's command and the nodes and GPUs it
//! was given. For every grant with a share on this node it starts a run; for every preemption
//! or release of a run still here it stops it. Runs are [`simulated`] (the simulated cluster of
//! `allot up`) or real [`process`]es. It publishes, on `allot.task.<event>.<pool>.<node>`:
//!
//! | when | event |
//! |---|---|
//! | a run started | `TaskStarted` (how, and its log file) |
//! | it touched its checkpoint file / a simulated checkpoint fell due | `TaskCheckpointed` |
//! | it exited 0 | `TaskCompleted` (rank 0 of a task spanning nodes) |
//! | it exited otherwise, could not start, or ran past its max runtime | `TaskFailed` (any rank) |
//! | it was preempted or cancelled and stopped | `TaskStopped` (checkpointed? killed?) |
//!
//! A grant whose GPUs are still held by a run that is stopping here (the scheduler counts a
//! preempted run's GPUs free at once; the process has its grace period to exit) is deferred
//! until that run has exited, so two runs never share a device.
//!
//! # Exactly once
//!
//! The runs it started and the journal position are in SQLite ([`state`]), committed together:
//! redelivered journal entries start nothing twice. A run's start and end events carry ids
//! derived from the node and the lease, so one published again after a restart is stored once. The executor never forgets a run until
//! JetStream acknowledged its end: the end is recorded the moment the run reports it, under an
//! event id derived from the node and the lease, and handed to the outbox, which publishes the
//! executor's events in the order they were made, retrying with backoff for as long as it takes,
//! and deletes the run only after the acknowledgement. A shutdown gives the outbox what is left
//! of its grace period and then leaves the unacknowledged ends on record; so does a crash. When
//! the executor starts, runs left on record are settled: unacknowledged ends are published again
//! in the order they were recorded (JetStream drops a copy it already stored by its id); a
//! simulated run resumes from its last checkpoint; a process run (whose process cannot be
//! re-attached) is killed if it still exists and reported failed, so the planner retries it.
//!
//! # Layout
//!
//! - [`orders`]: which journal entries start or stop what on this node (pure).
//! - [`run`]: what a run is told and reports. [`simulated`] and [`process`]: the two ways to run.
//! - [`state`]: the SQLite store.

pub mod orders;
pub mod process;
pub mod run;
pub mod simulated;
pub mod state;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, consumer::DeliverPolicy};
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;
use uuid::Uuid;

use allot_bus::Publisher;
use allot_bus::streams::names;
use allot_events::task::{TaskCheckpointed, TaskCompleted, TaskFailed, TaskStarted, TaskStopped};
use allot_events::telemetry::GpuHeld;
use allot_events::{AllocEvent, AnyEvent, Envelope, TaskEvent, decode, subject};
use allot_sched::{LeaseId, TaskId};
use allot_store::StoreError;

use crate::sim::SimLoad;

use orders::Order;
use run::{End, Report, Reporter, RunContext, Stop};
use state::{Progress, State, StoredRun};

pub use process::ProcessRuns;
pub use simulated::SimulatedRuns;

/// The namespace of the ids of a run's start and end events (UUIDv5 of `<node>/<lease>/started`
/// and `<node>/<lease>/end`).
const END_ID_NAMESPACE: Uuid = Uuid::from_u128(0x6b1f_0c2e_7d34_4a85_9e60_d2a7_3c18_f4b9);

/// The id of a run's `what` event (`started`, `end`): the same whichever executor publishes it,
/// so JetStream keeps one copy however often a restart publishes it again.
fn event_id(node: &str, lease: LeaseId, what: &str) -> Uuid {
    Uuid::new_v5(
        &END_ID_NAMESPACE,
        format!("{node}/{}/{what}", lease.0).as_bytes(),
    )
}
/// How long shutdown waits for runs to stop and their ends to be acknowledged before leaving
/// them to the next start.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Longest wait between two attempts to publish an event or open the journal.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Journal messages read without anything to record before the position is recorded anyway.
const POSITION_EVERY: u64 = 256;

/// How the executor runs tasks.
#[derive(Debug, Clone, PartialEq)]
pub enum Runs {
    /// Nothing runs: the node only reports (a node whose tasks another system starts).
    Off,
    /// Runs are simulated.
    Simulated(SimulatedRuns),
    /// Runs are processes on this host.
    Process(ProcessRuns),
}

/// The executor's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutorConfig {
    /// How tasks run.
    pub runs: Runs,
    /// Its SQLite database; `None`: in memory (nothing survives a restart).
    pub state: Option<PathBuf>,
    /// A folder the simulated runs of every node share, as real runs share checkpoint
    /// storage: a simulated task's progress is written there as well at each checkpoint, so
    /// it resumes from its last checkpoint on whichever node it runs next. `None`: progress is
    /// kept per node (on another node a task starts over).
    pub shared_checkpoints: Option<PathBuf>,
}

impl Default for ExecutorConfig {
    /// Off.
    fn default() -> Self {
        Self {
            runs: Runs::Off,
            state: None,
            shared_checkpoints: None,
        }
    }
}

impl ExecutorConfig {
    /// How long the executor may take to stop: its runs' grace period, then the outbox's.
    pub fn stop_grace(&self) -> Duration {
        match &self.runs {
            Runs::Process(p) => p.grace + SHUTDOWN_GRACE,
            _ => SHUTDOWN_GRACE,
        }
    }
}

/// Why the executor stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// Its database failed.
    #[error("executor state: {0}")]
    Store(#[from] StoreError),
}

/// A run in progress.
#[derive(Debug)]
struct Running {
    stored: StoredRun,
    /// The way to stop it; taken when it is told to stop.
    stop: Option<oneshot::Sender<Stop>>,
    /// Not started yet: GPUs of its share are still held by a run that is stopping.
    deferred: bool,
}

impl Running {
    /// Told to stop, and not ended yet: it still holds its GPUs.
    fn stopping(&self) -> bool {
        !self.deferred && self.stop.is_none()
    }
}

/// An event for the outbox.
#[derive(Debug)]
struct Outgoing {
    envelope: Envelope,
    /// The run this event ends: forgotten once the event is acknowledged.
    ends: Option<LeaseId>,
}

/// The executor of one node.
struct Executor {
    node: String,
    pool: String,
    runs: Runs,
    publisher: Publisher,
    state: Arc<State>,
    running: BTreeMap<LeaseId, Running>,
    tx: mpsc::UnboundedSender<(LeaseId, Report)>,
    outbox: mpsc::UnboundedSender<Outgoing>,
    /// A simulated node's load, which follows the runs on it.
    load: Option<SimLoad>,
    /// The runs on each GPU, for the telemetry.
    holdings: Holdings,
    /// Simulated progress shared by every node ([`ExecutorConfig::shared_checkpoints`]).
    shared: Option<PathBuf>,
}

/// Which runs hold which GPUs of the node, shared by the executor (which writes it as runs
/// start and end) and the telemetry (which reports it with every sample).
pub type Holdings = Arc<std::sync::Mutex<Vec<GpuHeld>>>;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs the executor of `node` until `stop` turns true.
pub async fn run(
    client: async_nats::Client,
    node: String,
    pool: String,
    config: ExecutorConfig,
    load: Option<SimLoad>,
    holdings: Holdings,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ExecutorError> {
    if config.runs == Runs::Off {
        return Ok(());
    }
    let began = SystemTime::now();
    let state = Arc::new(State::open(config.state.as_deref())?);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let publisher = Publisher::new(client.clone(), format!("/allot/executor/{node}"));
    let (outbox, queue) = mpsc::unbounded_channel();
    let outbox_task = tokio::spawn(
        Outbox {
            publisher: publisher.clone(),
            state: Arc::clone(&state),
        }
        .run(queue)
        .in_current_span(),
    );
    let mut ex = Executor {
        node,
        pool,
        runs: config.runs,
        publisher,
        state,
        running: BTreeMap::new(),
        tx,
        outbox,
        load,
        holdings,
        shared: config.shared_checkpoints,
    };
    let served = ex.serve(client, began, &mut stop, &mut rx).await;
    // Also after a failure: runs are stopped and ends already recorded get their chance.
    ex.shutdown(&mut rx, outbox_task).await;
    served
}

/// Opens an ordered consumer on the pool's journal, retrying until the stream exists; `None`
/// if stopped first.
async fn open_journal(
    js: &jetstream::Context,
    pool: &str,
    deliver: DeliverPolicy,
    stop: &mut watch::Receiver<bool>,
) -> Option<jetstream::consumer::pull::Ordered> {
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let opened = async {
            js.get_stream(names::DECISIONS)
                .await
                .map_err(|e| e.to_string())?
                .create_consumer(jetstream::consumer::pull::OrderedConfig {
                    filter_subject: subject::alloc_journal(pool),
                    deliver_policy: deliver,
                    max_expires: allot_bus::consumer::ORDERED_MAX_EXPIRES,
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?
                .messages()
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        match opened {
            Ok(messages) => return Some(messages),
            Err(why) => {
                let wait = allot_bus::connect::backoff(attempt, MAX_BACKOFF);
                tracing::warn!(attempt, error = %why, "opening the journal failed; retrying");
                tokio::select! {
                    _ = stop.changed() => return None,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

impl Executor {
    /// Settles the runs left on record, then carries out the journal until `stop` turns true.
    async fn serve(
        &mut self,
        client: async_nats::Client,
        began: SystemTime,
        stop: &mut watch::Receiver<bool>,
        rx: &mut mpsc::UnboundedReceiver<(LeaseId, Report)>,
    ) -> Result<(), ExecutorError> {
        self.settle_left_runs()?;
        let js = jetstream::new(client);
        // Without a recorded position, read from a little before this start: no grant for this
        // node can precede its registration, which follows.
        let position = self.state.position()?;
        let deliver = match position {
            Some(seq) => DeliverPolicy::ByStartSequence {
                start_sequence: seq + 1,
            },
            None => DeliverPolicy::ByStartTime {
                start_time: (began - Duration::from_secs(5)).into(),
            },
        };
        let Some(mut messages) = open_journal(&js, &self.pool, deliver, stop).await else {
            return Ok(());
        };
        tracing::info!(runs = ?self.runs, "executor reading the journal");
        let mut unrecorded = 0u64;
        // Until a position is on record, a restart reads from its own start and would miss the
        // grants made while it was down: the first entry read is recorded at once.
        let mut positioned = position.is_some();
        // The last entry read, to read on from after a broken read.
        let mut last = position;
        let mut reconnects = allot_bus::connect::Reconnects::new(&js.client());
        loop {
            self.show_holdings();
            let message = tokio::select! {
                biased;
                _ = stop.changed() => return Ok(()),
                Some((lease, report)) = rx.recv() => {
                    self.report(lease, report)?;
                    continue;
                }
                () = reconnects.next() => Err("reconnected to NATS".to_owned()),
                message = messages.next() => match message {
                    None => return Ok(()),
                    Some(m) => m.map_err(|e| e.to_string()),
                },
            };
            let message = match message {
                Ok(m) => m,
                Err(why) => {
                    // An ordered read whose server died may not deliver again for a minute, or
                    // ever: open a new one after the last entry read.
                    tracing::warn!(reason = %why, after = ?last, "opening the journal again");
                    let deliver = last.map_or(deliver, |seq| DeliverPolicy::ByStartSequence {
                        start_sequence: seq + 1,
                    });
                    let Some(reopened) = open_journal(&js, &self.pool, deliver, stop).await else {
                        return Ok(());
                    };
                    messages = reopened;
                    continue;
                }
            };
            let Ok(info) = message.info() else { continue };
            let seq = info.stream_sequence;
            last = Some(seq);
            let applied = match decode(&message.payload) {
                Ok(envelope) => match envelope.data {
                    AnyEvent::Alloc(AllocEvent::Applied(a)) => a,
                    _ => continue,
                },
                Err(e) => {
                    tracing::warn!(sequence = seq, error = %e, "unreadable journal entry skipped");
                    continue;
                }
            };
            let orders = orders::orders(&self.node, &applied, &self.running);
            if orders.is_empty() {
                unrecorded += 1;
                if unrecorded >= POSITION_EVERY || !positioned {
                    self.state.set_position(seq)?;
                    unrecorded = 0;
                }
            } else {
                self.obey(seq, orders)?;
                unrecorded = 0;
            }
            positioned = true;
        }
    }

    /// Settles the runs a previous executor left on record (see the module docs).
    fn settle_left_runs(&mut self) -> Result<(), ExecutorError> {
        for stored in self.state.runs()? {
            let lease = stored.dispatch.lease;
            if let Some(outcome) = &stored.outcome {
                match decode(outcome.as_bytes()) {
                    Ok(envelope) => {
                        tracing::info!(lease = lease.0, event = %envelope.ty, "publishing an end not acknowledged before the restart");
                        self.send(envelope, Some(lease));
                    }
                    Err(e) => {
                        // It can never be published; keeping it would only repeat this error.
                        tracing::error!(lease = lease.0, error = %e, "a recorded end is unreadable; dropped");
                        self.state.forget(lease)?;
                    }
                }
                continue;
            }
            match &self.runs {
                Runs::Simulated(_) => {
                    tracing::info!(lease = lease.0, task = %stored.dispatch.task, "resuming a simulated run");
                    self.spawn(stored)?;
                }
                _ => {
                    if let Some(pid) = stored.pid {
                        process::signal_group(pid, nix::sys::signal::Signal::SIGKILL);
                    }
                    let event = TaskEvent::Failed(TaskFailed {
                        pool: self.pool.clone(),
                        task: stored.dispatch.task,
                        node: self.node.clone(),
                        lease,
                        reason: "the executor restarted while it ran; the run was lost".into(),
                    });
                    let task = stored.dispatch.task;
                    self.end(lease, task, Progress::Keep, Some(event.into()))?;
                }
            }
        }
        Ok(())
    }

    /// Carries out what the journal message at `seq` ordered.
    fn obey(&mut self, seq: u64, orders: Vec<Order>) -> Result<(), ExecutorError> {
        let mut started = Vec::new();
        for order in orders {
            match order {
                Order::Stop { lease, cause } => {
                    if self.running.get(&lease).is_some_and(|r| r.deferred) {
                        // Never started: nothing to stop, nothing to report.
                        tracing::info!(lease = lease.0, ?cause, "a deferred run was withdrawn");
                        self.running.remove(&lease);
                        self.state.forget(lease)?;
                    } else if let Some(stop) =
                        self.running.get_mut(&lease).and_then(|r| r.stop.take())
                    {
                        tracing::info!(lease = lease.0, ?cause, "stopping a run");
                        let _ = stop.send(Stop::Cause(cause));
                    }
                }
                Order::Start {
                    dispatch,
                    share,
                    rank,
                } => started.push(StoredRun {
                    dispatch,
                    share,
                    rank,
                    started_ms: now_ms(),
                    pid: None,
                    outcome: None,
                }),
            }
        }
        self.state.started(seq, &started)?;
        for stored in started {
            if self.held_by_stopping_runs(&stored) {
                // The scheduler counts a preempted run's GPUs free at once; the device is free
                // only when the run has exited (within its grace period). Start after it.
                tracing::info!(
                    lease = stored.dispatch.lease.0,
                    "deferring a run until the runs stopping on its GPUs have exited"
                );
                self.running.insert(
                    stored.dispatch.lease,
                    Running {
                        stored,
                        stop: None,
                        deferred: true,
                    },
                );
                continue;
            }
            self.start(stored)?;
        }
        Ok(())
    }

    /// Tells the telemetry which runs hold which GPUs and, on a simulated node, makes each
    /// GPU's load follow them (deferred runs hold nothing yet).
    fn show_holdings(&self) {
        let mut held = Vec::new();
        let mut granted: BTreeMap<u32, u32> = BTreeMap::new();
        for run in self.running.values().filter(|r| !r.deferred) {
            let d = &run.stored.dispatch;
            for (gpu, milli) in &run.stored.share.gpus {
                *granted.entry(*gpu).or_default() += milli;
                held.push(GpuHeld {
                    index: *gpu,
                    lease: d.lease,
                    workload: d.launch.workload.clone(),
                    task: d.launch.name.clone(),
                    team: d.launch.team.clone(),
                    milli: *milli,
                    no_idle_reclaim: d.launch.run.no_idle_reclaim,
                });
            }
        }
        held.sort_by_key(|h| (h.index, h.lease));
        *self.holdings.lock().unwrap_or_else(|e| e.into_inner()) = held;
        if let Some(load) = &self.load {
            load.occupy(&granted);
        }
    }

    /// Whether a GPU of `run`'s share is still held by a run that is stopping.
    fn held_by_stopping_runs(&self, run: &StoredRun) -> bool {
        self.running.values().filter(|r| r.stopping()).any(|r| {
            r.stored
                .share
                .gpus
                .iter()
                .any(|(g, _)| run.share.gpus.iter().any(|(h, _)| g == h))
        })
    }

    /// Starts the deferred runs whose GPUs no stopping run holds any more.
    fn start_deferred(&mut self) -> Result<(), ExecutorError> {
        let ready: Vec<LeaseId> = self
            .running
            .iter()
            .filter(|(_, r)| r.deferred && !self.held_by_stopping_runs(&r.stored))
            .map(|(lease, _)| *lease)
            .collect();
        for lease in ready {
            if let Some(run) = self.running.remove(&lease) {
                self.start(run.stored)?;
            }
        }
        Ok(())
    }

    fn start(&mut self, stored: StoredRun) -> Result<(), ExecutorError> {
        tracing::info!(
            task = %stored.dispatch.task,
            name = %stored.dispatch.launch.name,
            workload = %stored.dispatch.launch.workload,
            lease = stored.dispatch.lease.0,
            "starting a run"
        );
        self.spawn(stored)
    }

    /// Starts a run.
    fn spawn(&mut self, stored: StoredRun) -> Result<(), ExecutorError> {
        let lease = stored.dispatch.lease;
        let ctx = RunContext {
            node: self.node.clone(),
            dispatch: stored.dispatch.clone(),
            share: stored.share.clone(),
            rank: stored.rank,
            progress_ms: self
                .state
                .progress(stored.dispatch.task)?
                .max(self.shared_progress(stored.dispatch.task)),
        };
        let (stop_tx, stop_rx) = oneshot::channel();
        let reporter = Reporter::new(lease, self.tx.clone());
        match &self.runs {
            Runs::Simulated(sim) => {
                let sim = *sim;
                tokio::spawn(async move { sim.run(ctx, stop_rx, reporter).await });
            }
            Runs::Process(p) => {
                let p = p.clone();
                tokio::spawn(async move { p.run(ctx, stop_rx, reporter).await });
            }
            Runs::Off => return Ok(()),
        }
        self.running.insert(
            lease,
            Running {
                stored,
                stop: Some(stop_tx),
                deferred: false,
            },
        );
        Ok(())
    }

    /// Acts on a run's report.
    fn report(&mut self, lease: LeaseId, report: Report) -> Result<(), ExecutorError> {
        let Some(run) = self.running.get(&lease) else {
            return Ok(());
        };
        let stored = run.stored.clone();
        let d = &stored.dispatch;
        let (task, rank) = (d.task, stored.rank);
        match report {
            Report::Started { how, log, pid } => {
                if let Some(pid) = pid {
                    self.state.set_pid(lease, pid)?;
                }
                let event = TaskEvent::Started(TaskStarted {
                    pool: self.pool.clone(),
                    task,
                    node: self.node.clone(),
                    lease,
                    workload: d.launch.workload.clone(),
                    name: d.launch.name.clone(),
                    how,
                    log,
                });
                // A simulated run resumed after a restart reports its start again: under an id
                // stable across restarts, the stream stores it once (a SIGKILLed collector's
                // runs were each started twice before).
                let mut envelope = self.publisher.envelope(event);
                envelope.id = event_id(&self.node, lease, "started");
                self.send(envelope, None);
            }
            Report::Checkpointed { progress_ms } => {
                if let Some(done) = progress_ms {
                    self.state.set_progress(task, done)?;
                    self.share_progress(task, done);
                }
                if rank == 0 {
                    let event = TaskEvent::Checkpointed(TaskCheckpointed {
                        pool: self.pool.clone(),
                        task,
                        node: self.node.clone(),
                        lease,
                    });
                    self.send(self.publisher.envelope(event), None);
                }
            }
            Report::Ended(end) => {
                let ran_ms = now_ms().saturating_sub(stored.started_ms);
                let (progress, event) = match end {
                    End::Abandoned { progress_ms } => {
                        // Stopped for shutdown: it stays on record, to resume from here.
                        if let Some(done) = progress_ms {
                            self.state.set_progress(task, done)?;
                        }
                        self.running.remove(&lease);
                        return self.start_deferred();
                    }
                    End::Completed => (
                        Progress::Forget,
                        (rank == 0).then(|| {
                            TaskEvent::Completed(TaskCompleted {
                                pool: self.pool.clone(),
                                task,
                                node: self.node.clone(),
                                lease,
                            })
                        }),
                    ),
                    End::Failed(reason) => (
                        Progress::Keep,
                        Some(TaskEvent::Failed(TaskFailed {
                            pool: self.pool.clone(),
                            task,
                            node: self.node.clone(),
                            lease,
                            reason,
                        })),
                    ),
                    End::Stopped {
                        cause,
                        checkpointed,
                        killed,
                        progress_ms,
                    } => {
                        if let Some(done) = progress_ms {
                            self.share_progress(task, done);
                        }
                        let progress = progress_ms.map_or(Progress::Keep, Progress::Set);
                        let event = (rank == 0).then(|| {
                            TaskEvent::Stopped(TaskStopped {
                                pool: self.pool.clone(),
                                task,
                                node: self.node.clone(),
                                cause,
                                checkpointed,
                                killed,
                                ran_ms,
                                lease: Some(lease),
                            })
                        });
                        (progress, event)
                    }
                };
                self.end(lease, task, progress, event.map(Into::into))?;
            }
        }
        Ok(())
    }

    /// Records the end of the run under `lease` of `task` and hands its event (if any) to the
    /// outbox, which forgets the run once the event is acknowledged; frees its GPUs.
    /// A simulated task's progress as the shared checkpoint folder has it (0: none).
    fn shared_progress(&self, task: TaskId) -> u64 {
        let Some(dir) = &self.shared else { return 0 };
        std::fs::read_to_string(dir.join(format!("{}.progress", task.0)))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Writes a simulated task's progress to the shared checkpoint folder (whole or not at
    /// all: a temporary file renamed over the old one).
    fn share_progress(&self, task: TaskId, done_ms: u64) {
        let Some(dir) = &self.shared else { return };
        let file = dir.join(format!("{}.progress", task.0));
        let tmp = dir.join(format!("{}.progress.{}", task.0, self.node));
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&tmp, done_ms.to_string()))
            .and_then(|()| std::fs::rename(&tmp, &file));
        if let Err(e) = written {
            tracing::warn!(task = %task, error = %e, "writing shared simulated progress failed");
        }
    }

    fn end(
        &mut self,
        lease: LeaseId,
        task: allot_sched::TaskId,
        progress: Progress,
        event: Option<AnyEvent>,
    ) -> Result<(), ExecutorError> {
        let envelope = event.map(|event| {
            // Under an id of its own, stable across restarts: published twice, stored once.
            let mut envelope = self.publisher.envelope(event);
            envelope.id = event_id(&self.node, lease, "end");
            envelope
        });
        let outcome = envelope
            .as_ref()
            .map(|e| String::from_utf8_lossy(&e.to_json()).into_owned());
        self.state
            .ended(lease, task, progress, outcome.as_deref())?;
        if let Some(envelope) = envelope {
            self.send(envelope, Some(lease));
        }
        self.running.remove(&lease);
        self.start_deferred()
    }

    /// Hands `envelope` to the outbox; `ends`: the run it ends, on record until it is
    /// acknowledged.
    fn send(&self, envelope: Envelope, ends: Option<LeaseId>) {
        // The outbox outlives every send (shutdown closes it last); were it gone, an end would
        // still be on record for the next start.
        let _ = self.outbox.send(Outgoing { envelope, ends });
    }

    /// Stops every run for shutdown, records how the runs ended, and gives the outbox until
    /// the end of the grace period; whatever is not acknowledged by then stays on record.
    async fn shutdown(
        mut self,
        rx: &mut mpsc::UnboundedReceiver<(LeaseId, Report)>,
        mut outbox: JoinHandle<()>,
    ) {
        // Deferred runs never started: they stay on record for the next start to settle.
        self.running.retain(|_, r| !r.deferred);
        for run in self.running.values_mut() {
            if let Some(stop) = run.stop.take() {
                let _ = stop.send(Stop::Shutdown);
            }
        }
        let grace = match &self.runs {
            Runs::Process(p) => p.grace + SHUTDOWN_GRACE,
            _ => SHUTDOWN_GRACE,
        };
        let deadline = tokio::time::Instant::now() + grace;
        // A run may have ended (completed, failed, stopped by an earlier order) just before or
        // while it was told to stop: its end is recorded like any other.
        while !self.running.is_empty() {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((lease, report))) => {
                    if let Err(e) = self.report(lease, report) {
                        tracing::error!(lease = lease.0, error = %e, "recording a report at shutdown failed");
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        if !self.running.is_empty() {
            tracing::warn!(runs = self.running.len(), "runs still stopping at shutdown");
        }
        // Closing the queue lets the outbox finish once it has published what is in it.
        drop(self.outbox);
        if tokio::time::timeout_at(deadline, &mut outbox)
            .await
            .is_err()
        {
            outbox.abort();
            let _ = outbox.await;
            let ends = self.state.runs().map_or(0, |runs| {
                runs.iter().filter(|r| r.outcome.is_some()).count()
            });
            tracing::warn!(
                ends,
                "ends not acknowledged at shutdown stay on record; the next start publishes them"
            );
        }
    }
}

/// Publishes the executor's events in the order they were made, each until JetStream
/// acknowledges it, and forgets a run once its end is acknowledged.
struct Outbox {
    publisher: Publisher,
    state: Arc<State>,
}

impl Outbox {
    /// Runs until the queue is closed and empty (or the task is aborted at shutdown: an end
    /// it was publishing stays on record).
    async fn run(self, mut queue: mpsc::UnboundedReceiver<Outgoing>) {
        while let Some(out) = queue.recv().await {
            self.publish(&out.envelope).await;
            if let Some(lease) = out.ends
                && let Err(e) = self.state.forget(lease)
            {
                // Left on record, it is published again at the next start and JetStream
                // drops the copy.
                tracing::error!(lease = lease.0, error = %e, "forgetting an acknowledged end failed");
            }
        }
    }

    /// Publishes `envelope`, retrying with backoff for as long as it takes.
    async fn publish(&self, envelope: &Envelope) {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match self.publisher.publish_envelope(envelope).await {
                Ok(_) => {
                    if attempt > 1 {
                        tracing::info!(attempts = attempt, event = %envelope.ty, "published after failures");
                    }
                    return;
                }
                Err(e) => {
                    let wait = allot_bus::connect::backoff(attempt, MAX_BACKOFF);
                    if attempt == 1 {
                        tracing::warn!(error = %e, event = %envelope.ty, "publishing failed; retrying until it is acknowledged");
                    } else {
                        tracing::debug!(attempt, error = %e, event = %envelope.ty, "publishing failed again");
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}
