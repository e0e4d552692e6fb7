//! The leader's loop: a standby takes the pool's lease, rebuilds the scheduler from the
//! journal, and leads until it stops, loses the lease, or finds another allocator's entry in
//! the journal.
//!
//! # Reading the inputs
//!
//! Each input stream (nodes, inventory, the pool's tasks, budgets) is read by an *ordered*
//! consumer starting right after the last message the journal says was applied. Nothing is
//! acknowledged: the journal is the one record of what was applied, so there is no second
//! record (a durable consumer's acknowledgements) that could run ahead of it. That second record
//! is how an earlier design lost work: a message acknowledged but never journalled, or
//! redelivered after newer ones and then skipped as already applied. An ordered consumer
//! delivers each stream strictly in order, once, and is simply dropped when leadership ends;
//! the next leader starts again from the journal.
//!
//! The readers feed one channel, so the scheduler sees one total order. The leader takes what
//! has arrived (up to [`BATCH`] messages), turns each message into at most one input applied
//! in that order, runs a pass if anything changed, and commits the batch's entries and the
//! pass to the journal as one atomic, fenced append (see [`crate::journal`]) before it looks
//! at the next message: one round trip per batch, however busy the pool. A pass also runs
//! every `pass_interval` while tasks wait. A pass that decides nothing is not journalled: it
//! leaves the scheduler's observable state as it was, so a replay that skips it recomputes the
//! same decisions.
//!
//! A new term decides nothing until every reader has delivered what its stream held when the
//! reader opened it (or [`CATCH_UP_LIMIT`] has passed): otherwise the streams' backlogs race,
//! and a task read before the cordon, drain or failure of a node published ahead of it would
//! be placed on that node. Inputs are applied and journalled as they come meanwhile; the first
//! pass runs once the last reader has caught up.
//!
//! # Keeping the lease
//!
//! A [`Keeper`] task renews the lease every third of its TTL, on its own, so a long batch
//! never starves it. Before every journal write the leader checks that the lease is held for
//! a while yet; a leader that lost it — or doubts it, because renewals went unanswered or the
//! process was paused past the TTL — stops its readers first, then stands by and competes for
//! the lease again. Correctness never rests on the lease alone: a journal write from a leader
//! whose lease lapsed is still refused by the server if anyone else wrote meanwhile.
//!
//! # What is believed
//!
//! A report of a task's end or checkpoint must name the lease the task holds now and a node
//! that lease is on; anything else (a stale report from before a preemption, or a forged one)
//! is refused to the dead-letter stream with the reason, and changes nothing.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, consumer::DeliverPolicy};
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{Instrument, error, info, info_span, warn};

use allot_bus::consumer::DeadLetter;
use allot_bus::streams::names;
use allot_bus::{ConnectConfig, Publisher};
use allot_events::alloc::{Launch, Source};
use allot_events::{AnyEvent, Envelope, TaskEvent, decode};
use allot_runtime::Service;
use allot_sched::{Input, Scheduler, TaskId, TaskSpec, Time};

use crate::journal::{self, Journal, JournalError, Rebuilt};
use crate::lease::{self, Lease, Renewal};
use crate::{AllocatorError, Config, inputs, metrics};

type Stop = allot_runtime::Stopping;

/// Most messages handled between two passes.
const BATCH: usize = 256;

/// How long a new term waits for its readers to catch up before it decides regardless (a
/// stream that cannot be opened must not stop the pool for good).
const CATCH_UP_LIMIT: Duration = Duration::from_secs(15);

/// Stands by and leads, in turn, until `shutdown`.
pub(crate) async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), AllocatorError> {
    let mut service = Service::new("allocator", shutdown);
    let stop = service.stopping();
    let connect = ConnectConfig::new(&config.nats_url, &config.instance);
    let client = allot_bus::connect(&connect, stop.clone()).await?;
    // Whatever was published is acknowledged already; draining flushes the rest of the
    // connection's traffic and closes it cleanly.
    service.drain_on_stop(client.clone());
    service.spawn(
        format!("leader of pool {}", config.pool),
        lead_or_stand_by(config, client, stop),
    );
    service
        .run()
        .await
        .map_err(|s| AllocatorError::Stopped(Box::new(s)))
}

/// Stands by until it holds the pool's lease, leads until it loses it, and stands by again,
/// until `stop`.
async fn lead_or_stand_by(
    config: Config,
    client: async_nats::Client,
    stop: Stop,
) -> Result<(), AllocatorError> {
    let js = jetstream::new(client.clone());
    // The bucket may be out of reach for a while (a server of the cluster just died, its
    // streams electing leaders): a standby that gave up here would not be there to take over.
    let mut attempt = 0;
    let store = loop {
        // Each attempt bounded by the TTL: a standby stuck on an unanswered request would not
        // be there to take over.
        let opened = tokio::time::timeout(
            config.lease_ttl,
            lease::bucket(&js, config.lease_ttl, config.replicas),
        )
        .await
        .unwrap_or_else(|_| Err(lease::LeaseError::timed_out(config.lease_ttl)));
        match opened {
            Ok(store) => break store,
            Err(e) => {
                attempt += 1;
                let wait = allot_bus::connect::backoff(attempt, config.lease_ttl);
                warn!(
                    pool = %config.pool,
                    error = %e,
                    attempt,
                    retry_in_ms = wait.as_millis() as u64,
                    "opening the lease bucket failed; retrying"
                );
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = stop.clone() => return Ok(()),
                }
            }
        }
    };
    info!(pool = %config.pool, instance = %config.instance, "lease bucket open; standing by");
    loop {
        if stop.peek().is_some() {
            return Ok(());
        }
        let attempt = tokio::time::timeout(config.lease_ttl, async {
            let taken = Lease::acquire(&store, &config.pool, &config.instance).await?;
            if taken.is_some() || !config.sole_instance {
                return Ok(taken);
            }
            let taken = Lease::take_over_own(&store, &config.pool, &config.instance).await?;
            if taken.is_some() {
                info!(
                    pool = %config.pool,
                    instance = %config.instance,
                    "the lease was still held under this instance's name by a process that is \
                     gone; taken over without waiting for it to expire"
                );
            }
            Ok(taken)
        })
        .await
        .unwrap_or_else(|_| Err(lease::LeaseError::timed_out(config.lease_ttl)));
        let lease = match attempt {
            Ok(lease) => lease,
            Err(e) => {
                warn!(pool = %config.pool, error = %e, "taking the lease failed; retrying");
                None
            }
        };
        let Some(lease) = lease else {
            tokio::select! {
                () = tokio::time::sleep(config.lease_ttl / 4) => continue,
                () = stop.clone() => return Ok(()),
            }
        };
        info!(pool = %config.pool, instance = %config.instance, "leading");
        match lead(&config, &client, lease, stop.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_deposition() => {
                warn!(pool = %config.pool, instance = %config.instance, "{e}; standing by");
            }
            Err(AllocatorError::Journal(e @ JournalError::Bus { .. })) => {
                // The journal could not be read or written (the server restarting,
                // say): nothing unjournalled was taken in, so stand by and lead again.
                warn!(pool = %config.pool, error = %e, "the journal is out of reach; standing by");
                tokio::select! {
                    () = tokio::time::sleep(config.lease_ttl / 4) => {}
                    () = stop.clone() => return Ok(()),
                }
            }
            Err(AllocatorError::Journal(e)) => {
                // This build cannot continue this journal. Allocating on regardless
                // would break the audit trail; stopping the process would stop every
                // other service with it. So this pool stops allocating, loudly.
                loop {
                    error!(
                        pool = %config.pool,
                        alarm = true,
                        "ALARM: pool {} is not allocating: {e}. Run `allot replay --verify \
                         --pool {}` to see the first entry in question, then see \
                         docs/operations.md, \"The allocator refuses its journal\"",
                        config.pool,
                        config.pool
                    );
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(60)) => {}
                        () = stop.clone() => return Ok(()),
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Leads one term: until `stop`, a deposition, or a failure. Always hands the lease back if
/// it still holds it, so a standby (or this instance, again) need not wait for it to expire.
async fn lead(
    config: &Config,
    client: &async_nats::Client,
    lease: Lease,
    stop: Stop,
) -> Result<(), AllocatorError> {
    let keeper = Keeper::spawn(lease, config.lease_ttl, &config.pool);
    let result = term(config, client, &keeper, stop).await;
    if let Some(lease) = keeper.stop().await {
        lease.release().await;
    }
    result
}

/// What a reader passes to the leader, in its stream's order.
// Nearly every read is an arrival, which went through the channel by value before: boxing it
// would add an allocation per message to spare the few catch-up marks some bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Read {
    Arrival(Arrival),
    /// Everything the stream held when the reader first opened it has been passed on.
    CaughtUp(&'static str),
}

/// One message from an input stream.
#[derive(Debug)]
struct Arrival {
    stream: &'static str,
    sequence: u64,
    subject: String,
    payload: bytes::Bytes,
    event: Envelope,
}

async fn term(
    config: &Config,
    client: &async_nats::Client,
    keeper: &Keeper,
    stop: Stop,
) -> Result<(), AllocatorError> {
    let publisher = Publisher::new(
        client.clone(),
        format!("/allot/allocator/{}", config.instance),
    );
    let (mut journal, rebuilt) =
        Journal::open(publisher.clone(), &config.pool, &config.policy).await?;
    let Rebuilt {
        mut scheduler,
        positions,
        last_at,
        parked,
    } = rebuilt;
    keeper.check()?;
    journal.elected(&config.instance, &config.policy).await?;
    for (team, quota) in &config.quotas {
        if scheduler.quotas().quota(team) != *quota {
            let input = Input::TeamQuota {
                team: team.clone(),
                quota: *quota,
            };
            journal.apply(&mut scheduler, input, None, None);
        }
    }
    keeper.check()?;
    journal.commit().await?;
    let mut leading = Leading {
        config,
        keeper,
        journal,
        dead_letters: publisher,
        scheduler,
        positions,
        last_at,
        parked,
        metrics: metrics::Term::lead(&config.pool),
        catching_up: true,
        changed: false,
    };
    leading.observe();
    info!(
        pool = %config.pool,
        entries = leading.journal.entries(),
        "journal replayed; reading inputs"
    );

    let (tx, mut rx) = mpsc::channel::<Read>(4 * BATCH);
    let mut readers = JoinSet::new();
    let js = jetstream::new(client.clone());
    let sources = sources(&config.pool);
    let mut behind: Vec<&'static str> = sources.iter().map(|(stream, _)| *stream).collect();
    for (stream, filter_subjects) in sources {
        let reader = Reader {
            js: js.clone(),
            stream,
            filter_subjects,
            after: leading.positions.get(stream).copied().unwrap_or(0),
            tx: tx.clone(),
            caught_up: false,
            dead_letters: leading.dead_letters.clone(),
            name: format!("allocator-{}", config.pool),
        };
        readers.spawn(reader.run().instrument(info_span!("reader", stream)));
    }
    drop(tx);

    let mut passes = tokio::time::interval(config.pass_interval);
    passes.tick().await;
    let catch_up = tokio::time::sleep(CATCH_UP_LIMIT);
    tokio::pin!(catch_up);
    let result: Result<(), AllocatorError> = loop {
        tokio::select! {
            biased;
            () = stop.clone() => break Ok(()),
            lost = keeper.lost() => break Err(lost),
            () = &mut catch_up, if leading.catching_up => {
                warn!(
                    pool = %config.pool,
                    behind = %behind.join(", "),
                    "the input streams were not read up to their ends within {} s; deciding \
                     regardless",
                    CATCH_UP_LIMIT.as_secs()
                );
                if let Err(e) = leading.caught_up().await {
                    break Err(e);
                }
            }
            _ = passes.tick(), if !leading.catching_up => {
                if leading.scheduler.pending() > 0 {
                    if let Err(e) = leading.pass().await {
                        break Err(e);
                    }
                    leading.observe();
                }
            }
            read = rx.recv() => {
                let Some(first) = read else {
                    break Err(AllocatorError::Readers);
                };
                let mut reads = vec![first];
                while reads.len() < BATCH {
                    match rx.try_recv() {
                        Ok(a) => reads.push(a),
                        Err(_) => break,
                    }
                }
                let mut batch = Vec::with_capacity(reads.len());
                for read in reads {
                    match read {
                        Read::Arrival(arrival) => batch.push(arrival),
                        Read::CaughtUp(stream) => behind.retain(|s| *s != stream),
                    }
                }
                if let Err(e) = leading.handle(batch).await {
                    break Err(e);
                }
                if leading.catching_up && behind.is_empty() {
                    info!(pool = %config.pool, "the input streams are read up to their ends; deciding");
                    if let Err(e) = leading.caught_up().await {
                        break Err(e);
                    }
                }
                leading.observe();
            }
        }
    };
    // Stop reading before anything else: nothing more is taken in by this term.
    readers.abort_all();
    while readers.join_next().await.is_some() {}
    result
}

/// The input streams of `pool`'s allocator and the subjects read from each.
fn sources(pool: &str) -> [(&'static str, Vec<String>); 5] {
    [
        (names::FLEET, vec!["allot.node.registered.>".into()]),
        (names::INVENTORY, Vec::new()),
        (names::WORKLOADS, allot_events::subject::task_of_pool(pool)),
        (
            names::COSTS,
            vec![allot_events::subject::cost(
                "*",
                allot_events::cost::BUDGET_TOKEN,
            )],
        ),
        (names::REMEDIATION, Vec::new()),
    ]
}

/// Reads one input stream in order from a position, into the leader's channel.
struct Reader {
    js: jetstream::Context,
    stream: &'static str,
    filter_subjects: Vec<String>,
    /// The last message already read (or journalled, at the start).
    after: u64,
    tx: mpsc::Sender<Read>,
    /// Whether [`Read::CaughtUp`] was sent.
    caught_up: bool,
    dead_letters: Publisher,
    name: String,
}

impl Reader {
    /// Reads until the leader stops listening (or the task is aborted); a broken consumer is
    /// opened again after the last message read, so nothing is skipped or read twice.
    async fn run(mut self) {
        let mut attempt = 0u32;
        let mut reconnects = allot_bus::connect::Reconnects::new(&self.js.client());
        loop {
            attempt += 1;
            let messages = match self.open().await {
                Ok((messages, 0)) => {
                    if !self.reached_the_end().await {
                        return;
                    }
                    messages
                }
                Ok((messages, _)) => messages,
                Err(why) => {
                    let wait = allot_bus::connect::backoff(attempt, Duration::from_secs(5));
                    warn!(error = %why, retry_in_ms = wait.as_millis() as u64, "opening the input stream failed");
                    tokio::time::sleep(wait).await;
                    continue;
                }
            };
            tokio::pin!(messages);
            loop {
                let message = tokio::select! {
                    message = messages.next() => message,
                    () = reconnects.next() => {
                        info!(after = self.after, "reconnected to NATS; opening the input stream again");
                        break;
                    }
                };
                let Some(message) = message else { break };
                let message = match message {
                    Ok(m) => m,
                    Err(e) => {
                        warn!(error = %e, after = self.after, "reading the input stream failed; reopening");
                        break;
                    }
                };
                attempt = 0;
                let Ok(info) = message.info() else {
                    continue;
                };
                let (sequence, last) = (info.stream_sequence, info.pending == 0);
                if sequence <= self.after {
                    if last && !self.reached_the_end().await {
                        return;
                    }
                    continue;
                }
                match decode(&message.payload) {
                    Ok(event) => {
                        let arrival = Arrival {
                            stream: self.stream,
                            sequence,
                            subject: message.subject.to_string(),
                            payload: message.payload.clone(),
                            event,
                        };
                        if self.tx.send(Read::Arrival(arrival)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let letter = DeadLetter {
                            payload: message.payload.clone(),
                            subject: &message.subject,
                            stream: self.stream,
                            sequence,
                            deliveries: 1,
                            consumer: &self.name,
                            reason: &format!("undecodable: {e}"),
                        };
                        allot_bus::consumer::dead_letter(&self.dead_letters, letter).await;
                    }
                }
                self.after = sequence;
                if last && !self.reached_the_end().await {
                    return;
                }
            }
        }
    }

    /// Tells the leader, once, that this stream has been passed on up to where it ended when
    /// first opened; false when the leader no longer listens.
    async fn reached_the_end(&mut self) -> bool {
        if std::mem::replace(&mut self.caught_up, true) {
            return true;
        }
        self.tx.send(Read::CaughtUp(self.stream)).await.is_ok()
    }

    /// The stream's messages after [`Reader::after`], and how many of them it holds now.
    async fn open(&self) -> Result<(jetstream::consumer::pull::Ordered, u64), String> {
        let stream = self
            .js
            .get_stream(self.stream)
            .await
            .map_err(|e| e.to_string())?;
        let deliver_policy = match self.after {
            0 => DeliverPolicy::All,
            after => DeliverPolicy::ByStartSequence {
                start_sequence: after + 1,
            },
        };
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                filter_subjects: self.filter_subjects.clone(),
                deliver_policy,
                max_expires: allot_bus::consumer::ORDERED_MAX_EXPIRES,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        let pending = consumer.cached_info().num_pending;
        let messages = consumer.messages().await.map_err(|e| e.to_string())?;
        Ok((messages, pending))
    }
}

/// What the leader keeps between batches.
struct Leading<'a> {
    config: &'a Config,
    keeper: &'a Keeper,
    journal: Journal,
    dead_letters: Publisher,
    scheduler: Scheduler,
    positions: HashMap<String, u64>,
    last_at: Time,
    parked: BTreeMap<TaskId, TaskSpec>,
    /// The pool's series, reported for this term.
    metrics: metrics::Term,
    /// Whether the term's readers are still catching up: no pass runs meanwhile.
    catching_up: bool,
    /// Whether an input changed the scheduler while catching up.
    changed: bool,
}

impl Leading<'_> {
    /// Reports the pool as it now is.
    fn observe(&mut self) {
        self.metrics.observe(&self.scheduler, &self.parked);
    }

    /// The time of the next input: the wall clock, never earlier than an input already
    /// journalled.
    fn now(&mut self) -> Time {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as Time);
        self.last_at = self.last_at.max(wall);
        self.last_at
    }

    async fn handle(&mut self, batch: Vec<Arrival>) -> Result<(), AllocatorError> {
        let mut changed = false;
        for arrival in batch {
            let done = self.positions.get(arrival.stream).copied().unwrap_or(0);
            if arrival.sequence <= done {
                continue;
            }
            if let Some(why) = self
                .refuse(&arrival.event.data)
                .or_else(|| inputs::misaddressed(&arrival.subject, &arrival.event.data))
            {
                self.dead_letter(&arrival, &why).await;
            } else {
                changed |= self.apply(&arrival);
            }
            self.positions
                .insert(arrival.stream.to_owned(), arrival.sequence);
        }
        if changed && self.catching_up {
            self.changed = true;
        } else if changed {
            let at = self.now();
            self.journal.pass(&mut self.scheduler, at);
        }
        self.commit().await
    }

    /// Ends the catch-up: the first pass runs if anything arrived meanwhile (or anything
    /// waits).
    async fn caught_up(&mut self) -> Result<(), AllocatorError> {
        self.catching_up = false;
        if std::mem::take(&mut self.changed) || self.scheduler.pending() > 0 {
            self.pass().await?;
        }
        Ok(())
    }

    /// Applies and stages the input `arrival` means, if any; whether it changed anything.
    fn apply(&mut self, arrival: &Arrival) -> bool {
        let at = self.now();
        let data = &arrival.event.data;
        let Some(input) = inputs::input(&self.config.pool, &self.scheduler, &self.parked, data, at)
        else {
            return false;
        };
        let source = Source {
            stream: arrival.stream.to_owned(),
            sequence: arrival.sequence,
        };
        let grows = matches!(
            input,
            Input::NodeAdded(_)
                | Input::NodeSchedulable {
                    schedulable: true,
                    ..
                }
        );
        let launch = match data {
            AnyEvent::Task(TaskEvent::Ready(t)) => Some(Launch {
                workload: t.workload.clone(),
                name: t.name.clone(),
                team: t.task.team.clone(),
                run: t.run.clone(),
            }),
            _ => None,
        };
        let (entry, error) = self
            .journal
            .apply(&mut self.scheduler, input, Some(source), launch);
        journal::track_parked(&mut self.parked, &entry.input, error.as_ref());
        if grows {
            self.unpark();
        }
        true
    }

    /// Why a task report must not be believed, if it must not: it names a lease the task does
    /// not hold, or a node that lease is not on.
    fn refuse(&self, event: &AnyEvent) -> Option<String> {
        let (what, task, lease, node, ends_run) = match event {
            AnyEvent::Task(TaskEvent::Completed(t)) => {
                ("completion", t.task, t.lease, &t.node, true)
            }
            AnyEvent::Task(TaskEvent::Failed(t)) => ("failure", t.task, t.lease, &t.node, true),
            AnyEvent::Task(TaskEvent::Checkpointed(t)) => {
                ("checkpoint", t.task, t.lease, &t.node, false)
            }
            _ => return None,
        };
        let cluster = self.scheduler.cluster();
        match self.scheduler.running_lease(task) {
            // The run ended just as it was stopped: its end is news (the task needs no second
            // run), if it names that run's lease and node.
            None if ends_run && inputs::ends_stopped_run(&self.scheduler, task, lease, node) => {
                None
            }
            None => Some(format!(
                "{what} of task {task} under lease {} on {node}: the task holds no lease",
                lease.0
            )),
            Some((held, _)) if held != lease => Some(format!(
                "{what} of task {task} under lease {} on {node}: the task holds lease {}",
                lease.0, held.0
            )),
            Some((_, placement))
                if !placement
                    .shares
                    .iter()
                    .any(|s| cluster.node(s.node).spec.name == *node) =>
            {
                Some(format!(
                    "{what} of task {task} under lease {} on {node}: that lease is not on {node}",
                    lease.0
                ))
            }
            Some(_) => None,
        }
    }

    /// Refuses `arrival` to the dead-letter stream. (Takes `&mut self`: a `&Leading` held
    /// across an await would need the scheduler to be `Sync`.)
    async fn dead_letter(&mut self, arrival: &Arrival, why: &str) {
        warn!(subject = %arrival.subject, stream_seq = arrival.sequence, reason = why, "refusing a task report");
        let letter = DeadLetter {
            payload: arrival.payload.clone(),
            subject: &arrival.subject,
            stream: arrival.stream,
            sequence: arrival.sequence,
            deliveries: 1,
            consumer: &format!("allocator-{}", self.config.pool),
            reason: why,
        };
        allot_bus::consumer::dead_letter(&self.dead_letters, letter).await;
    }

    /// Submits parked tasks again now that the pool has grown; those that still cannot fit
    /// stay parked.
    fn unpark(&mut self) {
        let parked = std::mem::take(&mut self.parked);
        for task in parked.into_values() {
            let at = self.now();
            let input = Input::TaskSubmitted { task, at };
            let (entry, error) = self.journal.apply(&mut self.scheduler, input, None, None);
            journal::track_parked(&mut self.parked, &entry.input, error.as_ref());
        }
    }

    /// Runs a pass and commits it.
    async fn pass(&mut self) -> Result<(), AllocatorError> {
        let at = self.now();
        self.journal.pass(&mut self.scheduler, at);
        self.commit().await
    }

    /// Commits what is staged, if the lease is surely still held.
    async fn commit(&mut self) -> Result<(), AllocatorError> {
        self.keeper.check()?;
        Ok(self.journal.commit().await?)
    }
}

/// What the leader knows of its lease.
#[derive(Debug, Clone)]
enum Standing {
    /// Last confirmed as ours by a write sent at `renewed`: nobody else can take it before
    /// the TTL has passed since.
    Held { renewed: Instant },
    /// Lost, and how.
    Lost(String),
}

/// Renews the lease on its own task, so that a long batch never starves the renewals, and
/// tells the leader how it stands.
struct Keeper {
    pool: String,
    ttl: Duration,
    standing: watch::Receiver<Standing>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Option<Lease>>,
}

impl Keeper {
    fn spawn(mut lease: Lease, ttl: Duration, pool: &str) -> Keeper {
        // Counted from before the write that took the lease: the server's clock started no
        // earlier.
        let (tx, standing) = watch::channel(Standing::Held {
            renewed: Instant::now(),
        });
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(
            async move {
                let mut last = Instant::now();
                let mut next = last + ttl / 3;
                loop {
                    tokio::select! {
                        _ = &mut stopped => return Some(lease),
                        () = tokio::time::sleep_until(next) => {}
                    }
                    let sent = Instant::now();
                    match lease.renew().await {
                        Renewal::Renewed => {
                            last = sent;
                            next = sent + ttl / 3;
                            let _ = tx.send(Standing::Held { renewed: sent });
                        }
                        Renewal::Lost(now) => {
                            let _ = tx.send(Standing::Lost(format!(
                                "the lease was not renewed for {:.1} s (TTL {:.1} s) and was lost: {now}",
                                last.elapsed().as_secs_f64(),
                                ttl.as_secs_f64()
                            )));
                            return None;
                        }
                        Renewal::Unsure(why) => {
                            warn!(error = %why, "renewing the lease failed; retrying");
                            next = Instant::now() + ttl / 10;
                        }
                    }
                }
            }
            .instrument(info_span!("lease", pool)),
        );
        Keeper {
            pool: pool.to_owned(),
            ttl,
            standing,
            stop: Some(stop),
            task,
        }
    }

    /// Until when the lease is surely ours if it was last confirmed at `renewed`: a tenth of
    /// the TTL is kept in hand for a journal write in flight.
    fn until(&self, renewed: Instant) -> Instant {
        renewed + self.ttl - self.ttl / 10
    }

    /// Whether the lease is surely still held; if not, why, as the deposition to report.
    fn check(&self) -> Result<(), AllocatorError> {
        match &*self.standing.borrow() {
            Standing::Held { renewed } if Instant::now() < self.until(*renewed) => Ok(()),
            Standing::Held { renewed } => Err(self.doubt(*renewed)),
            Standing::Lost(why) => Err(AllocatorError::LeaseLost {
                pool: self.pool.clone(),
                why: why.clone(),
            }),
        }
    }

    fn doubt(&self, renewed: Instant) -> AllocatorError {
        AllocatorError::LeaseLost {
            pool: self.pool.clone(),
            why: format!(
                "no renewal of the lease was confirmed for {:.1} s (TTL {:.1} s): the process \
                 was paused or starved, or the server did not answer, so another allocator may \
                 lead",
                renewed.elapsed().as_secs_f64(),
                self.ttl.as_secs_f64()
            ),
        }
    }

    /// Resolves when the lease is lost or in doubt, with the deposition to report.
    async fn lost(&self) -> AllocatorError {
        let mut standing = self.standing.clone();
        loop {
            let now = standing.borrow_and_update().clone();
            match now {
                Standing::Lost(_) => return self.check().unwrap_err(),
                Standing::Held { renewed } => {
                    tokio::select! {
                        changed = standing.changed() => {
                            if changed.is_err() {
                                // The keeper ended without a loss: it was stopped.
                                return self.check().err().unwrap_or_else(|| self.doubt(renewed));
                            }
                        }
                        () = tokio::time::sleep_until(self.until(renewed)) => return self.doubt(renewed),
                    }
                }
            }
        }
    }

    /// Stops renewing; the lease, if still held.
    async fn stop(mut self) -> Option<Lease> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(lease) => lease,
            Err(e) => {
                error!(error = %e, "the lease keeper failed");
                None
            }
        }
    }
}
