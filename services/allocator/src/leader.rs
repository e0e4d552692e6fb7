//! The leader's loop. Durable consumers (nodes, inventory, the pool's tasks) hand their
//! batches to one channel, so the scheduler sees one total order; each message is journalled
//! before it is acknowledged, and a pass runs after every batch that changed something and
//! every `pass_interval` while tasks wait.
//!
//! A pass that decides nothing is not journalled: it leaves the scheduler's observable state
//! as it was (queue keys are recomputed at the next pass anyway), so a replay that skips it
//! recomputes the same decisions.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use allot_bus::consumer::{ConsumerRunner, ConsumerSpec, Delivery, Handler, HandlerError, Outcome};
use allot_bus::streams::{self, names};
use allot_bus::{ConnectConfig, Publisher};
use allot_events::alloc::{Launch, Source};
use allot_events::{AnyEvent, TaskEvent};
use allot_sched::{Input, Scheduler, TaskId, TaskSpec, Time};

use crate::journal::{self, Journal, JournalError, Rebuilt};
use crate::lease::{self, Lease};
use crate::{AllocatorError, Config, inputs};

type Stop = Shared<BoxFuture<'static, ()>>;

/// Stands by and leads, in turn, until `shutdown`.
pub(crate) async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), AllocatorError> {
    // The caller's future need not be 'static: it is polled here, and a 'static signal is
    // what the consumers and the loop share.
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let stop: Stop = async move {
        let _ = stop_rx.await;
    }
    .boxed()
    .shared();
    let work = async {
        let client = allot_bus::connect(
            &ConnectConfig::new(&config.nats_url, &config.instance),
            stop.clone(),
        )
        .await?;
        let js = async_nats::jetstream::new(client.clone());
        streams::ensure_streams(&js, &streams::catalog(1)).await?;
        let store = lease::bucket(&js, config.lease_ttl).await?;
        loop {
            if stop.peek().is_some() {
                return Ok(());
            }
            let Some(lease) = Lease::acquire(&store, &config.pool, &config.instance).await else {
                tokio::select! {
                    () = tokio::time::sleep(config.lease_ttl / 4) => continue,
                    () = stop.clone() => return Ok(()),
                }
            };
            info!(pool = %config.pool, instance = %config.instance, "leading");
            match lead(&config, &client, lease, stop.clone()).await {
                Ok(()) => return Ok(()),
                Err(AllocatorError::Journal(e @ JournalError::Deposed { .. })) => {
                    warn!(pool = %config.pool, "{e}; standing by");
                }
                Err(e) => return Err(e),
            }
        }
    };
    tokio::pin!(work);
    tokio::pin!(shutdown);
    let mut stop_tx = Some(stop_tx);
    loop {
        tokio::select! {
            result = &mut work => return result,
            () = &mut shutdown, if stop_tx.is_some() => {
                if let Some(tx) = stop_tx.take() {
                    let _ = tx.send(());
                }
            }
        }
    }
}

/// One batch from a consumer, waiting for the leader's outcomes.
struct Batch {
    stream: &'static str,
    deliveries: Vec<Delivery>,
    reply: oneshot::Sender<Result<Vec<Outcome>, String>>,
}

/// Hands a consumer's batches to the leader and waits for them to be journalled.
struct Forward {
    stream: &'static str,
    after: u64,
    tx: mpsc::Sender<Batch>,
}

impl Handler for Forward {
    fn resume_after(&mut self) -> Result<Option<u64>, HandlerError> {
        Ok(Some(self.after))
    }

    async fn handle(&mut self, batch: &[Delivery]) -> Result<Vec<Outcome>, HandlerError> {
        let (reply, outcome) = oneshot::channel();
        let stopped = || HandlerError("the allocator is no longer leading".into());
        self.tx
            .send(Batch {
                stream: self.stream,
                deliveries: batch.to_vec(),
                reply,
            })
            .await
            .map_err(|_| stopped())?;
        outcome.await.map_err(|_| stopped())?.map_err(HandlerError)
    }
}

/// What the leader keeps between batches.
struct Leading<'a> {
    config: &'a Config,
    journal: Journal,
    scheduler: Scheduler,
    positions: HashMap<String, u64>,
    last_at: Time,
    parked: BTreeMap<TaskId, TaskSpec>,
}

impl Leading<'_> {
    /// The time of the next input: the wall clock, never earlier than an input already
    /// journalled.
    fn now(&mut self) -> Time {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as Time);
        self.last_at = self.last_at.max(wall);
        self.last_at
    }

    async fn handle(&mut self, batch: &Batch) -> Result<Vec<Outcome>, JournalError> {
        let mut outcomes = Vec::with_capacity(batch.deliveries.len());
        let mut changed = false;
        for d in &batch.deliveries {
            let done = self.positions.get(batch.stream).copied().unwrap_or(0);
            if d.stream_sequence > done {
                let at = self.now();
                if let Some(input) = inputs::input(
                    &self.config.pool,
                    &self.scheduler,
                    &self.parked,
                    &d.event.data,
                    at,
                ) {
                    let source = Source {
                        stream: batch.stream.to_owned(),
                        sequence: d.stream_sequence,
                    };
                    let grows = matches!(
                        input,
                        Input::NodeAdded(_)
                            | Input::NodeSchedulable {
                                schedulable: true,
                                ..
                            }
                    );
                    let launch = match &d.event.data {
                        AnyEvent::Task(TaskEvent::Ready(t)) => Some(Launch {
                            workload: t.workload.clone(),
                            name: t.name.clone(),
                            run: t.run.clone(),
                        }),
                        _ => None,
                    };
                    let (entry, error) = self
                        .journal
                        .apply(&mut self.scheduler, input, Some(source), launch)
                        .await?;
                    journal::track_parked(&mut self.parked, &entry.input, error.as_ref());
                    if grows {
                        self.unpark().await?;
                    }
                    changed = true;
                }
                self.positions
                    .insert(batch.stream.to_owned(), d.stream_sequence);
            }
            outcomes.push(Outcome::Handled);
        }
        if changed {
            self.pass().await?;
        }
        Ok(outcomes)
    }

    /// Submits parked tasks again now that the pool has grown; those that still cannot fit
    /// stay parked.
    async fn unpark(&mut self) -> Result<(), JournalError> {
        let parked = std::mem::take(&mut self.parked);
        for task in parked.into_values() {
            let at = self.now();
            let input = Input::TaskSubmitted { task, at };
            let (entry, error) = self
                .journal
                .apply(&mut self.scheduler, input, None, None)
                .await?;
            journal::track_parked(&mut self.parked, &entry.input, error.as_ref());
        }
        Ok(())
    }

    async fn pass(&mut self) -> Result<(), JournalError> {
        let at = self.now();
        self.journal.pass(&mut self.scheduler, at).await
    }
}

/// Leads until the lease is lost, the journal says another leads, or `stop`.
async fn lead(
    config: &Config,
    client: &async_nats::Client,
    mut lease: Lease,
    stop: Stop,
) -> Result<(), AllocatorError> {
    let publisher = Publisher::new(
        client.clone(),
        format!("/allot/allocator/{}", config.instance),
    );
    let (mut journal, rebuilt) = Journal::open(publisher, &config.pool, &config.policy).await?;
    let Rebuilt {
        mut scheduler,
        positions,
        last_at,
        parked,
    } = rebuilt;
    journal.elected(&config.instance, &config.policy).await?;
    for (team, quota) in &config.quotas {
        if scheduler.quotas().quota(team) != *quota {
            let input = Input::TeamQuota {
                team: team.clone(),
                quota: *quota,
            };
            journal.apply(&mut scheduler, input, None, None).await?;
        }
    }
    let mut leading = Leading {
        config,
        journal,
        scheduler,
        positions,
        last_at,
        parked,
    };
    info!(
        pool = %config.pool,
        entries = leading.journal.entries(),
        "journal replayed; consuming"
    );

    let (tx, mut rx) = mpsc::channel::<Batch>(8);
    let (kill, killed) = oneshot::channel::<()>();
    let killed = async move {
        let _ = killed.await;
    }
    .boxed()
    .shared();
    let pool = &config.pool;
    let sources: [(&'static str, Vec<String>); 4] = [
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
    ];
    let mut runners = Vec::new();
    for (stream, filter) in sources {
        let spec = ConsumerSpec {
            filter_subjects: filter,
            ack_wait: Duration::from_secs(30),
            ..ConsumerSpec::new(
                stream,
                format!(
                    "{}-{pool}-{}",
                    config.consumer_prefix,
                    stream.to_lowercase()
                ),
            )
        };
        let handler = Forward {
            stream,
            after: leading.positions.get(stream).copied().unwrap_or(0),
            tx: tx.clone(),
        };
        let runner = ConsumerRunner::new(client.clone(), spec, handler);
        runners.push(tokio::spawn(runner.run(killed.clone())));
    }
    drop(tx);

    let mut renew = tokio::time::interval(config.lease_ttl / 3);
    renew.tick().await;
    let mut passes = tokio::time::interval(config.pass_interval);
    passes.tick().await;
    let result: Result<(), AllocatorError> = loop {
        tokio::select! {
            () = stop.clone() => break Ok(()),
            _ = renew.tick() => {
                if !lease.renew().await {
                    break Err(JournalError::Deposed { pool: pool.clone() }.into());
                }
            }
            _ = passes.tick() => {
                if leading.scheduler.pending() > 0
                    && let Err(e) = leading.pass().await
                {
                    break Err(e.into());
                }
            }
            batch = rx.recv() => {
                let Some(batch) = batch else {
                    break Ok(());
                };
                match leading.handle(&batch).await {
                    Ok(outcomes) => {
                        let _ = batch.reply.send(Ok(outcomes));
                    }
                    Err(e) => {
                        let _ = batch.reply.send(Err(e.to_string()));
                        break Err(e.into());
                    }
                }
            }
        }
    };
    let _ = kill.send(());
    for runner in runners {
        let _ = tokio::time::timeout(Duration::from_secs(5), runner).await;
    }
    if result.is_ok() {
        lease.release().await;
    }
    result
}
