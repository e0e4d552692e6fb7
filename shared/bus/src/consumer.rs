//! The consumer runner: a durable pull consumer driving a [`Handler`], in stream order.
//!
//! Guarantees, in the order a reader needs them:
//! 1. Messages reach the handler in stream order, in batches of whatever is ready (up to
//!    [`ConsumerSpec::batch`]); a message is acknowledged only after the handler returned.
//!    Consumers acknowledge all (`AckPolicy::All`): a batch's effects are kept together, so
//!    one acknowledgement of its last message settles the whole batch — one message back to
//!    the server per batch instead of one per message. A batch may also hold a copy of a
//!    message earlier in it, redelivered after the ack wait (a process paused past its ack
//!    wait reads the original and the copy once it resumes): a handler that keeps a position
//!    skips anything at or below the highest sequence it has seen, in the batch as well
//!    (`allot_store::apply_batch` does; the two-gateway e2e test found the one that did not).
//! 2. A message that cannot be decoded, or that the handler rejects, is published to the
//!    dead-letter stream with the reason and its origin (subject, stream, sequence, consumer,
//!    deliveries) in headers, and only then acknowledged: it never blocks the stream and is
//!    never silently dropped.
//! 3. A handler error has a kind ([`HandlerErrorKind`]). A *transient* one (a busy database, a
//!    full disk, the bus away) is retried in place with backoff for as long as it takes —
//!    keeping the batch's messages from being redelivered meanwhile, and stopping (without
//!    acknowledging) on shutdown — so later messages never overtake it and an infrastructure
//!    episode dead-letters nothing. A *fatal* one stops the runner with an error, leaving the
//!    batch unacknowledged, so the service stops and its orchestrator restarts it. Only a
//!    message that is malformed or that the handler rejects ([`Outcome::Rejected`]) is ever
//!    dead-lettered: how often a message was delivered says nothing about whether it is bad
//!    (a paused or starved process sees redeliveries too), so it is not a reason.
//! 4. A handler that stores its applied position with its state ([`Handler::resume_after`])
//!    decides where the consumer starts: the durable consumer is recreated right after that
//!    position on start-up. Without this, a restarted instance would receive never-delivered
//!    messages before the redeliveries of those it was handling when it died, apply the newer
//!    ones first, and then skip the older ones as already applied — losing them. (The e2e test
//!    that SIGKILLs the inventory mid-stream found exactly that.) The same can happen while it
//!    runs: deliveries the server made that never arrived — a pull answered into a connection
//!    that died with its server, or by a consumer leader that died — come again only after the
//!    ack wait, behind newer ones. The runner sees the gap in the consumer's delivery sequence
//!    and recreates the consumer at the handler's position. (The fault matrix,
//!    `tests/e2e/faults.rs`, found it: billing lost a lease's costs, and the archiver's chain
//!    stopped at the gap.)
//! 5. JetStream unavailable — no server answering, a stream or consumer leader being elected
//!    after a server of a cluster died — is waited out: opening (or reopening) the consumer and
//!    pulling are tried again with backoff until it answers or shutdown comes. Only a refusal
//!    another attempt cannot change (a configuration the server rejects) stops the runner.
//! 6. On shutdown the runner stops pulling, finishes the batch in hand, and returns.
//!
//! Every runner counts what it applied and dead-lettered and how far it lags ([`metrics`]),
//! and, given a [`Gate`] ([`ConsumerRunner::with_gate`]), opens it once its durable consumer
//! exists, so its service reports ready only then.
//!
//! What the handler receives is its [`Content`]: by default the decoded [`Envelope`]; a consumer
//! that copies a stream (the audit archiver) takes [`Raw`] instead — the payload and headers
//! exactly as stored — so that no message is dead-lettered for being undecodable here.

use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use async_nats::jetstream::{
    self, ErrorCode,
    consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull},
    context::GetStreamErrorKind,
    message::PublishMessage,
    stream::{ConsumerError, ConsumerErrorKind},
};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::{FutureExt, StreamExt};

use allot_events::{Envelope, decode, subject};
use allot_runtime::Gate;

pub mod metrics;
pub use metrics::ConsumerMetrics;

use crate::connect::backoff;
use crate::error::BusError;
use crate::headers;
use crate::publish::Publisher;

/// The longest a long-lived ordered consumer's pull request may wait (its `max_expires`), which
/// also sets its idle heartbeat to half of it. An ordered consumer is an ephemeral, single-copy
/// consumer on one server; when that server dies, async-nats notices only from missed heartbeats
/// (two in a row before it recreates the consumer). At the library's defaults (30 s pulls, 15 s
/// heartbeats) a reader stalled for 30–60 s after the loss of one server of a cluster — the
/// allocator took in nothing and executors started nothing meanwhile (the fault matrix,
/// `tests/e2e/faults.rs`, measured it). At 5 s it recreates the consumer within seconds, for one
/// idle pull request every 5 s.
pub const ORDERED_MAX_EXPIRES: Duration = Duration::from_secs(5);

/// Which messages a runner consumes and how patiently.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// The stream to consume.
    pub stream: String,
    /// Durable consumer name; also the key of the consumer's applied position.
    pub durable: String,
    /// Subjects to receive (empty: all of the stream's).
    pub filter_subjects: Vec<String>,
    /// Most messages handed to the handler at once.
    pub batch: usize,
    /// How long the server waits for an acknowledgement before redelivering.
    pub ack_wait: Duration,
    /// Longest wait between two attempts at a batch that failed transiently.
    pub max_backoff: Duration,
    /// How long to wait for more messages once one has arrived, to hand the handler a larger
    /// batch. Zero hands over only what is already there. A projection that commits per batch
    /// trades this much latency for far fewer commits under load.
    pub linger: Duration,
}

impl ConsumerSpec {
    /// A spec with defaults: batches of 256, 30 s ack wait, 5 s backoff cap, no linger.
    pub fn new(stream: impl Into<String>, durable: impl Into<String>) -> Self {
        Self {
            stream: stream.into(),
            durable: durable.into(),
            filter_subjects: Vec::new(),
            batch: 256,
            ack_wait: Duration::from_secs(30),
            max_backoff: Duration::from_secs(5),
            linger: Duration::ZERO,
        }
    }

    /// The spec for a stream of many small events applied one transaction per batch
    /// (telemetry: a sample per node per second): batches of up to 1,024 gathered for up to
    /// 20 ms, so commits stay few and a batch may hold several samples of one GPU. An event
    /// is applied at most 20 ms later than it would be alone.
    pub fn in_bulk(self) -> Self {
        Self {
            batch: 1024,
            linger: Duration::from_millis(20),
            ..self
        }
    }

    /// [`Self::in_bulk`] for a consumer whose events only add up (telemetry summed into
    /// usage: billing's, the predictor's): gathered for up to 250 ms, since a quarter of a
    /// second late changes no total, and committing four times a second instead of fifty
    /// leaves the database's write lock and pages to its other consumers.
    pub fn summing(self) -> Self {
        Self {
            linger: Duration::from_millis(250),
            ..self.in_bulk()
        }
    }

    fn config(&self, resume_after: Option<u64>) -> pull::Config {
        pull::Config {
            durable_name: Some(self.durable.clone()),
            description: Some(format!("allot consumer {}", self.durable)),
            filter_subjects: self.filter_subjects.clone(),
            deliver_policy: match resume_after {
                None => DeliverPolicy::All,
                Some(seq) => DeliverPolicy::ByStartSequence {
                    start_sequence: seq + 1,
                },
            },
            // Settled in stream order, so acknowledging a message may settle all before it.
            ack_policy: AckPolicy::All,
            ack_wait: self.ack_wait,
            // Never give up on a message server-side: one the server stopped delivering would
            // sit unacknowledged for ever. Bad messages are dead-lettered by the runner.
            max_deliver: -1,
            max_ack_pending: (self.batch * 8) as i64,
            ..pull::Config::default()
        }
    }
}

/// What a runner hands its handler as a message's content.
pub trait Content: Clone + Send + Sync + Sized + 'static {
    /// Reads the content of a pulled message, or says why it cannot be read (the message is
    /// then dead-lettered with that reason).
    fn read(message: &async_nats::Message) -> Result<Self, String>;
}

impl Content for Envelope {
    /// The subject is what the server checked the publisher's right to (see [`crate::users`]),
    /// so an event whose content names another subject — a collector's completion of another
    /// node's task, a team's submission for another team — is not believed.
    fn read(message: &async_nats::Message) -> Result<Self, String> {
        let envelope = decode(&message.payload).map_err(|e| format!("undecodable: {e}"))?;
        let claimed = envelope.nats_subject();
        if claimed != message.subject.as_str() {
            return Err(format!(
                "published on {} but it is an event of {claimed}: its publisher may not speak \
                 for what it claims",
                message.subject
            ));
        }
        Ok(envelope)
    }
}

/// When the stream stored a message (the server's clock), from its JetStream metadata.
pub fn stored_at(info: &jetstream::message::Info<'_>) -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(info.published.unix_timestamp_nanos() as i64)
}

/// A message exactly as the stream stores it, undecoded.
///
/// For consumers that keep a copy of a stream (the audit archiver): such a copy must hold every
/// message, including one that no decoder in this build understands.
#[derive(Debug, Clone)]
pub struct Raw {
    /// The payload bytes as published.
    pub payload: Bytes,
    /// The headers as stored (`Nats-Msg-Id`, `Nats-Expected-*` …), if any.
    pub headers: Option<async_nats::HeaderMap>,
}

impl Content for Raw {
    fn read(message: &async_nats::Message) -> Result<Self, String> {
        Ok(Raw {
            payload: message.payload.clone(),
            headers: message.headers.clone(),
        })
    }
}

/// One message handed to a [`Handler`], with its content read as `E`.
#[derive(Debug, Clone)]
pub struct Delivery<E = Envelope> {
    /// Sequence in the stream: the key for exactly-once application.
    pub stream_sequence: u64,
    /// Subject it was published on.
    pub subject: String,
    /// When the server stored it (one clock for every producer).
    pub published: DateTime<Utc>,
    /// How many times it has been delivered, this one included.
    pub deliveries: u32,
    /// The event (for a [`Raw`] consumer, the message as stored).
    pub event: E,
}

impl Delivery {
    /// `event` delivered for the first time from stream position `stream_sequence`, stored at
    /// `published`: how tests and benchmarks hand a handler a message without a server.
    pub fn first(stream_sequence: u64, event: Envelope, published: DateTime<Utc>) -> Self {
        Delivery {
            stream_sequence,
            subject: event.nats_subject(),
            published,
            deliveries: 1,
            event,
        }
    }
}

/// What the handler made of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied (or recognised as already applied): acknowledge.
    Handled,
    /// Can never be applied (invalid for this consumer): dead-letter with this reason.
    Rejected(String),
}

/// Why a handler could not handle a batch, and so what the runner does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerErrorKind {
    /// Infrastructure trouble that may pass (database busy, disk full, bus away): the batch is
    /// retried in place, with backoff, for as long as it takes. Never dead-lettered.
    Transient,
    /// The service cannot go on (its state is inconsistent, it lost its role): the runner
    /// stops without acknowledging the batch and returns the error.
    Fatal,
}

/// A batch could not be handled. (A single bad message is not an error: the handler returns
/// [`Outcome::Rejected`] for it.)
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    kind: HandlerErrorKind,
    message: String,
}

impl HandlerError {
    /// Trouble that may pass: retry the batch.
    pub fn transient(message: impl std::fmt::Display) -> Self {
        Self {
            kind: HandlerErrorKind::Transient,
            message: message.to_string(),
        }
    }

    /// The service must stop.
    pub fn fatal(message: impl std::fmt::Display) -> Self {
        Self {
            kind: HandlerErrorKind::Fatal,
            message: message.to_string(),
        }
    }

    /// What the runner does about it.
    pub fn kind(&self) -> HandlerErrorKind {
        self.kind
    }
}

/// Applies a consumer's messages, whose content it reads as `E`.
pub trait Handler<E = Envelope>: Send {
    /// The last stream sequence this handler has applied, if it keeps one (a projection that
    /// stores its position with its state). The runner then starts the consumer right after
    /// it, so the handler's own record — not the server's acknowledgement state — decides
    /// where to resume: after a crash, messages that were delivered but never acknowledged
    /// come again in stream order instead of after newer ones. `None` resumes from the
    /// durable consumer's acknowledgements, and keeps the durable consumer as it is: one an
    /// older build created acknowledging each message (`AckPolicy::Explicit`) cannot be
    /// changed to acknowledge all and must be deleted first. (Every service's handler keeps a
    /// position, so its consumer is recreated at start.)
    fn resume_after(&mut self) -> Result<Option<u64>, HandlerError> {
        Ok(None)
    }

    /// Handles `batch` in order and returns one outcome per message, or an error if nothing
    /// from the batch was kept and it should be retried.
    fn handle(
        &mut self,
        batch: &[Delivery<E>],
    ) -> impl Future<Output = Result<Vec<Outcome>, HandlerError>> + Send;
}

/// Drives a [`Handler`] from a durable pull consumer. See the module docs for the guarantees.
#[derive(Debug)]
pub struct ConsumerRunner<H, E = Envelope> {
    js: jetstream::Context,
    settler: Settler,
    handler: H,
    /// The batch a fatal handler error left unsettled, negatively acknowledged only once the
    /// pull that brought it is gone (see [`Self::run`]).
    unsettled: Vec<jetstream::Message>,
    /// Opened once the durable consumer exists.
    gate: Option<Gate>,
    content: PhantomData<fn() -> E>,
}

/// Acknowledges and dead-letters; kept apart from the handler so the runner never needs the
/// handler to be `Sync`.
#[derive(Debug)]
struct Settler {
    spec: ConsumerSpec,
    dead_letters: Publisher,
    metrics: ConsumerMetrics,
}

/// A pulled message: the raw message and, if it decoded, the delivery.
struct Pulled<E> {
    message: jetstream::Message,
    delivery: Result<Delivery<E>, String>,
}

impl<E: Content, H: Handler<E>> ConsumerRunner<H, E> {
    /// A runner for `spec` on `client`, handing messages to `handler`.
    pub fn new(client: async_nats::Client, spec: ConsumerSpec, handler: H) -> Self {
        let dead_letters =
            Publisher::new(client.clone(), format!("/allot/consumer/{}", spec.durable));
        let metrics = ConsumerMetrics::new(&spec.durable);
        Self {
            js: jetstream::new(client),
            settler: Settler {
                spec,
                dead_letters,
                metrics,
            },
            handler,
            unsettled: Vec::new(),
            gate: None,
            content: PhantomData,
        }
    }

    /// Opens `gate` once the durable consumer exists: its service is not ready before.
    pub fn with_gate(mut self, gate: Gate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Creates (or updates) the durable consumer and runs until `shutdown` completes.
    /// Returns the handler, so tests can inspect it.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<H, BusError> {
        tokio::pin!(shutdown);
        let Some(resume_after) = self.position(&mut shutdown).await? else {
            return Ok(self.handler);
        };
        let Some(mut consumer) = self.open_consumer(&mut shutdown, resume_after).await? else {
            return Ok(self.handler);
        };
        // The delivery sequence the consumer gives its next message, once known: a consumer
        // created afresh at the handler's position starts at 1.
        let mut next_delivery = resume_after.map(|_| 1);
        if let Some(gate) = self.gate.take() {
            gate.open();
        }
        'pull: loop {
            let messages = match consumer
                .stream()
                .max_messages_per_batch(self.settler.spec.batch)
                .heartbeat(Duration::from_secs(5))
                .expires(Duration::from_secs(30))
                .messages()
                .await
            {
                Ok(messages) => messages,
                Err(e) => {
                    // The pull request went nowhere (no server, a consumer leader being
                    // elected): open the consumer again once JetStream answers.
                    let why = format!("pulling from the consumer failed ({e})");
                    let Some(reopened) = self.reopen(&mut shutdown, &why).await? else {
                        break 'pull;
                    };
                    (consumer, next_delivery) = reopened;
                    continue 'pull;
                }
            };
            let mut messages = Box::pin(messages);
            loop {
                let first = tokio::select! {
                    biased;
                    () = &mut shutdown => break 'pull,
                    first = messages.next() => first,
                };
                let Some(first) = first else {
                    tracing::warn!(consumer = %self.settler.spec.durable, "message stream ended; pulling again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue 'pull;
                };
                let chunk = Self::gather(&self.settler.spec, first, &mut messages.as_mut()).await;
                let mut pulled = Vec::with_capacity(chunk.len());
                for item in chunk {
                    match item {
                        Ok(message) => pulled.push(self.open(message)),
                        Err(e) => {
                            tracing::warn!(consumer = %self.settler.spec.durable, error = %e, "pulling messages failed");
                        }
                    }
                }
                // Deliveries the server made that never arrived (a pull answered into a
                // connection that died with its server, or by a consumer leader that died):
                // the server redelivers them only after the ack wait, behind newer ones, which a
                // handler keeping a position would then skip as applied — losing them. Start
                // again from the handler's position instead.
                let dseqs = pulled
                    .iter()
                    .filter_map(|p| p.message.info().ok().map(|i| i.consumer_sequence));
                if let Some((expected, got)) = skipped_delivery(&mut next_delivery, dseqs)
                    && resume_after.is_some()
                {
                    drop(messages);
                    let why = format!(
                        "deliveries were lost in flight (delivery {got} came where {expected} was due)"
                    );
                    let Some(reopened) = self.reopen(&mut shutdown, &why).await? else {
                        break 'pull;
                    };
                    (consumer, next_delivery) = reopened;
                    continue 'pull;
                }
                let Some(last) = pulled.last() else {
                    continue;
                };
                if let Ok(info) = last.message.info() {
                    self.settler.metrics.pending(info.pending);
                }
                let flow = match self.process(pulled, &mut shutdown).await {
                    Ok(flow) => flow,
                    Err(e) => {
                        // Withdraw the pull first: a batch refused while the pull is still
                        // open would be redelivered into it and be lost with it, until the
                        // ack wait. Without it, whoever consumes next gets the batch at once.
                        drop(messages);
                        for message in std::mem::take(&mut self.unsettled) {
                            let _ = message.ack_with(jetstream::AckKind::Nak(None)).await;
                        }
                        return Err(e);
                    }
                };
                if flow == Flow::Stopped {
                    break 'pull;
                }
            }
        }
        tracing::info!(consumer = %self.settler.spec.durable, "consumer stopped");
        Ok(self.handler)
    }

    /// How long to wait before retry `attempt` after `what` failed with a transient `error`,
    /// logged.
    fn retry_in(
        &self,
        attempt: u32,
        error: &dyn std::fmt::Display,
        what: &str,
    ) -> std::time::Duration {
        let wait = backoff(attempt, self.settler.spec.max_backoff);
        tracing::warn!(
            consumer = %self.settler.spec.durable,
            attempt,
            retry_in_ms = wait.as_millis() as u64,
            error = %error,
            "{what} failed; retrying"
        );
        wait
    }

    /// The durable consumer opened again (`why`, logged), at the handler's position when it
    /// keeps one, and the delivery sequence it gives next once known; `None` if `shutdown`
    /// came first.
    async fn reopen<S: Future<Output = ()>>(
        &mut self,
        shutdown: &mut std::pin::Pin<&mut S>,
        why: &str,
    ) -> Result<Option<(PullConsumer, Option<u64>)>, BusError> {
        let Some(position) = self.position(shutdown).await? else {
            return Ok(None);
        };
        tracing::warn!(
            consumer = %self.settler.spec.durable,
            resume_after = ?position,
            "{why}; opening the consumer again"
        );
        let consumer = self.open_consumer(shutdown, position).await?;
        // A consumer created afresh at the handler's position starts at delivery 1.
        Ok(consumer.map(|c| (c, position.map(|_| 1))))
    }

    /// The durable consumer, created (at `resume_after`, when the handler keeps a position) and
    /// tried again with backoff for as long as JetStream is unavailable — no server answering, a
    /// stream or consumer leader being elected, which takes seconds when a server of a cluster
    /// dies — since the service is of no use without it and the next attempt may succeed;
    /// `None` if `shutdown` came first. A refusal that another attempt cannot change (a
    /// configuration the server rejects, a stream that does not exist) is returned at once.
    async fn open_consumer<S: Future<Output = ()>>(
        &mut self,
        shutdown: &mut std::pin::Pin<&mut S>,
        resume_after: Option<u64>,
    ) -> Result<Option<PullConsumer>, BusError> {
        let mut attempt = 0;
        loop {
            let error = match create_consumer(&self.js, &self.settler.spec, resume_after).await {
                Ok(consumer) => return Ok(Some(consumer)),
                Err(Unavailable::No(error)) => return Err(error),
                Err(Unavailable::ForNow(error)) => error,
            };
            attempt += 1;
            let wait = self.retry_in(
                attempt,
                &error,
                "opening the consumer (JetStream unavailable)",
            );
            tokio::select! {
                biased;
                () = shutdown.as_mut() => return Ok(None),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// The handler's position, asked again with backoff while it fails transiently; `None` if
    /// `shutdown` came first.
    async fn position<S: Future<Output = ()>>(
        &mut self,
        shutdown: &mut std::pin::Pin<&mut S>,
    ) -> Result<Option<Option<u64>>, BusError> {
        let mut attempt = 0;
        loop {
            let error = match self.handler.resume_after() {
                Ok(position) => return Ok(Some(position)),
                Err(e) => e,
            };
            if error.kind() == HandlerErrorKind::Fatal {
                return Err(BusError::JetStream {
                    operation: "reading the applied position",
                    name: self.settler.spec.durable.clone(),
                    message: error.to_string(),
                });
            }
            attempt += 1;
            let wait = self.retry_in(attempt, &error, "reading the applied position");
            tokio::select! {
                biased;
                () = shutdown.as_mut() => return Ok(None),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Gathers a batch after its first message: whatever else is ready, and — when
    /// [`ConsumerSpec::linger`] is set — whatever arrives within that time, up to the batch size.
    async fn gather<S, T>(
        spec: &ConsumerSpec,
        first: T,
        messages: &mut std::pin::Pin<&mut S>,
    ) -> Vec<T>
    where
        S: futures::Stream<Item = T>,
    {
        let mut chunk = Vec::with_capacity(spec.batch);
        chunk.push(first);
        let deadline = tokio::time::Instant::now() + spec.linger;
        while chunk.len() < spec.batch {
            match messages.next().now_or_never() {
                Some(Some(item)) => chunk.push(item),
                Some(None) => break,
                None if spec.linger.is_zero() => break,
                None => match tokio::time::timeout_at(deadline, messages.next()).await {
                    Ok(Some(item)) => chunk.push(item),
                    Ok(None) | Err(_) => break,
                },
            }
        }
        chunk
    }

    /// Reads a message's metadata and its content.
    fn open(&self, message: jetstream::Message) -> Pulled<E> {
        let delivery = match message.info() {
            Err(e) => Err(format!("message has no JetStream metadata: {e}")),
            Ok(info) => E::read(&message).map(|event| Delivery {
                stream_sequence: info.stream_sequence,
                subject: message.subject.to_string(),
                published: stored_at(&info),
                deliveries: info.delivered.max(1) as u32,
                event,
            }),
        };
        Pulled { message, delivery }
    }

    /// Handles one pulled chunk: dead-letters what did not decode, hands the rest to the
    /// handler in order, and acknowledges everything it settled. `Stopped` if shutdown came
    /// while a batch was being retried (that batch stays unacknowledged).
    async fn process<S: Future<Output = ()>>(
        &mut self,
        pulled: Vec<Pulled<E>>,
        shutdown: &mut std::pin::Pin<&mut S>,
    ) -> Result<Flow, BusError> {
        // Split into runs of decodable messages so order is kept around dead letters.
        let mut run: Vec<Pulled<E>> = Vec::new();
        for p in pulled {
            match &p.delivery {
                Ok(_) => run.push(p),
                Err(reason) => {
                    let reason = reason.clone();
                    if self.flush_run(std::mem::take(&mut run), shutdown).await? == Flow::Stopped {
                        return Ok(Flow::Stopped);
                    }
                    self.settler.dead_letter(&p.message, &reason).await;
                }
            }
        }
        self.flush_run(run, shutdown).await
    }

    async fn flush_run<S: Future<Output = ()>>(
        &mut self,
        run: Vec<Pulled<E>>,
        shutdown: &mut std::pin::Pin<&mut S>,
    ) -> Result<Flow, BusError> {
        if run.is_empty() {
            return Ok(Flow::Continue);
        }
        // `process` puts only messages that were read into a run.
        let (run, deliveries): (Vec<jetstream::Message>, Vec<Delivery<E>>) = run
            .into_iter()
            .filter_map(|p| Some((p.message, p.delivery.ok()?)))
            .unzip();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let error = match self.handle_keeping_alive(&run, &deliveries).await {
                Ok(outcomes) if outcomes.len() == deliveries.len() => {
                    self.settler.settle(&run, outcomes).await;
                    return Ok(Flow::Continue);
                }
                Ok(outcomes) => HandlerError::fatal(format!(
                    "handler returned {} outcomes for {} messages",
                    outcomes.len(),
                    deliveries.len()
                )),
                Err(e) => e,
            };
            if error.kind() == HandlerErrorKind::Fatal {
                tracing::error!(consumer = %self.settler.spec.durable, error = %error, "handler failed; stopping");
                // Not handled: refused once the pull is withdrawn (see `run`), so whoever
                // consumes next gets the batch at once, not after the ack wait.
                self.unsettled = run;
                return Err(BusError::Handler {
                    consumer: self.settler.spec.durable.clone(),
                    message: error.to_string(),
                });
            }
            let wait = self.retry_in(attempt, &error, "handler");
            self.settler.in_progress(&run).await;
            tokio::select! {
                biased;
                () = shutdown.as_mut() => return Ok(Flow::Stopped),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Runs the handler on a batch, telling the server every third of the ack wait that the
    /// batch is still in hand, so a slow handler never sees its own batch redelivered.
    async fn handle_keeping_alive(
        &mut self,
        run: &[jetstream::Message],
        deliveries: &[Delivery<E>],
    ) -> Result<Vec<Outcome>, HandlerError> {
        let handling = self.handler.handle(deliveries);
        tokio::pin!(handling);
        let period = (self.settler.spec.ack_wait / 3).max(Duration::from_millis(100));
        let mut alive = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                result = &mut handling => return result,
                _ = alive.tick() => self.settler.in_progress(run).await,
            }
        }
    }
}

/// Whether the runner goes on after a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Stopped,
}

impl Settler {
    /// Keeps the server from redelivering messages still in hand.
    async fn in_progress(&self, run: &[jetstream::Message]) {
        for message in run {
            let _ = message.ack_with(jetstream::AckKind::Progress).await;
        }
    }

    /// Acknowledges a handled run: the consumer acknowledges all (see [`ConsumerSpec`]), so
    /// one acknowledgement of the last message settles every handled message before it. A
    /// rejected message is dead-lettered first, in order, and its own acknowledgement
    /// settles the handled ones before it.
    async fn settle(&self, run: &[jetstream::Message], outcomes: Vec<Outcome>) {
        let mut unacknowledged = None;
        for (message, outcome) in run.iter().zip(outcomes) {
            match outcome {
                Outcome::Handled => {
                    unacknowledged = Some(message);
                    self.metrics.handled(1);
                }
                Outcome::Rejected(reason) => {
                    self.dead_letter(message, &reason).await;
                    unacknowledged = None;
                }
            }
        }
        if let Some(last) = unacknowledged {
            self.ack(last).await;
        }
    }

    async fn ack(&self, message: &jetstream::Message) {
        if let Err(e) = message.ack().await {
            // The message will be redelivered; the handler's position check makes that harmless.
            tracing::warn!(consumer = %self.spec.durable, error = %e, "acknowledging failed");
        }
    }

    /// Publishes `message` to the dead-letter stream with `reason`, then acknowledges it.
    async fn dead_letter(&self, message: &jetstream::Message, reason: &str) {
        let (stream, sequence, deliveries) = match message.info() {
            Ok(i) => (i.stream.to_owned(), i.stream_sequence, i.delivered),
            Err(_) => (self.spec.stream.clone(), 0, 0),
        };
        let letter = DeadLetter {
            payload: message.payload.clone(),
            subject: &message.subject,
            stream: &stream,
            sequence,
            deliveries: deliveries.max(0) as u64,
            consumer: &self.spec.durable,
            reason,
        };
        // Keep the message ours while the dead letter is retried.
        let keep = async {
            loop {
                tokio::time::sleep(self.spec.ack_wait / 3).await;
                let _ = message.ack_with(jetstream::AckKind::Progress).await;
            }
        };
        tokio::select! {
            () = dead_letter(&self.dead_letters, letter) => {}
            () = keep => {}
        }
        self.ack(message).await;
    }
}

/// A message a consumer will not apply: where it came from and why.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// The message's payload, as stored.
    pub payload: Bytes,
    /// The subject it was published on.
    pub subject: &'a str,
    /// The stream it is in.
    pub stream: &'a str,
    /// Its sequence there.
    pub sequence: u64,
    /// How many times it was delivered.
    pub deliveries: u64,
    /// Who refuses it.
    pub consumer: &'a str,
    /// Why.
    pub reason: &'a str,
}

/// Publishes `letter` to the dead-letter stream (`allot.deadletter.<subject>`, the reason and
/// origin in headers), retrying until the server stores it: giving up would lose the message.
/// Its id is derived from the origin and the consumer, so a letter sent again is stored once.
pub async fn dead_letter(publisher: &Publisher, letter: DeadLetter<'_>) {
    tracing::warn!(
        consumer = %letter.consumer,
        subject = %letter.subject,
        stream_seq = letter.sequence,
        reason = letter.reason,
        "dead-lettering message"
    );
    let mut attempt = 0;
    loop {
        attempt += 1;
        let publish = PublishMessage::build()
            .payload(letter.payload.clone())
            .message_id(format!(
                "deadletter:{}:{}:{}",
                letter.stream, letter.sequence, letter.consumer
            ))
            .header(headers::ERROR, truncate(letter.reason, 2048))
            .header(headers::ORIGINAL_SUBJECT, letter.subject)
            .header(headers::ORIGINAL_STREAM, letter.stream)
            .header(
                headers::ORIGINAL_SEQUENCE,
                letter.sequence.to_string().as_str(),
            )
            .header(headers::CONSUMER, letter.consumer)
            .header(headers::DELIVERIES, letter.deliveries.to_string().as_str());
        let sent = publisher
            .send_raw(subject::dead_letter(letter.subject), publish)
            .await;
        let result = match sent {
            Ok(pending) => pending.wait().await.map(|_| ()),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                metrics::dead_lettered(letter.consumer);
                return;
            }
            Err(e) => {
                let wait = backoff(attempt, Duration::from_secs(5));
                tracing::error!(
                    consumer = %letter.consumer,
                    error = %e,
                    retry_in_ms = wait.as_millis() as u64,
                    "could not publish dead letter; retrying"
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// The first delivery sequence among `dseqs` that came after a gap (with the one expected), if
/// any, keeping `next` — the delivery sequence expected next, once known — up to date.
/// A delivery sequence seen again (a consumer leader that took over behind its predecessor)
/// is no gap.
fn skipped_delivery(
    next: &mut Option<u64>,
    dseqs: impl IntoIterator<Item = u64>,
) -> Option<(u64, u64)> {
    let mut skipped = None;
    for dseq in dseqs {
        if let Some(expected) = *next
            && dseq > expected
        {
            skipped.get_or_insert((expected, dseq));
        }
        *next = Some(next.unwrap_or(0).max(dseq + 1));
    }
    skipped
}

/// Why a consumer could not be opened: JetStream unavailable for now (worth another attempt),
/// or a refusal that another attempt would meet again.
enum Unavailable {
    ForNow(BusError),
    No(BusError),
}

impl Unavailable {
    /// Sorts `error` of `operation` on `name`: `transient` says whether it is worth retrying.
    fn of(
        operation: &'static str,
        name: &str,
        error: impl std::fmt::Display,
        transient: bool,
    ) -> Self {
        let error = BusError::jetstream(operation, name, error);
        if transient {
            Self::ForNow(error)
        } else {
            Self::No(error)
        }
    }
}

/// Whether a JetStream API error says the cluster cannot answer for now (no quorum, a leader
/// being elected, the peers catching up) rather than that the request is wrong.
fn unavailable_for_now(error: &async_nats::jetstream::Error) -> bool {
    error.code() == 503
        || [
            ErrorCode::CLUSTER_INCOMPLETE,
            ErrorCode::CLUSTER_NO_PEERS,
            ErrorCode::CLUSTER_NOT_AVAILABLE,
            ErrorCode::CLUSTER_NOT_LEADER,
            ErrorCode::RAFT_GENERAL,
        ]
        .contains(&error.error_code())
}

async fn create_consumer(
    js: &jetstream::Context,
    spec: &ConsumerSpec,
    resume_after: Option<u64>,
) -> Result<PullConsumer, Unavailable> {
    let stream = js.get_stream(&spec.stream).await.map_err(|e| {
        let transient = match e.kind() {
            GetStreamErrorKind::Request => true,
            GetStreamErrorKind::JetStream(ref js) => unavailable_for_now(js),
            _ => false,
        };
        Unavailable::of("opening stream", &spec.stream, e, transient)
    })?;
    let transient = |e: &ConsumerError| match e.kind() {
        ConsumerErrorKind::TimedOut | ConsumerErrorKind::Request => true,
        ConsumerErrorKind::JetStream(ref js) => unavailable_for_now(js),
        _ => false,
    };
    if let Some(seq) = resume_after {
        // A consumer's start cannot be changed in place: recreate it at the handler's position.
        match stream.delete_consumer(&spec.durable).await {
            Ok(_) => {}
            Err(e)
                if matches!(e.kind(), ConsumerErrorKind::JetStream(ref js)
                    if js.error_code() == ErrorCode::CONSUMER_NOT_FOUND) => {}
            Err(e) => {
                let transient = transient(&e);
                return Err(Unavailable::of(
                    "recreating consumer",
                    &spec.durable,
                    e,
                    transient,
                ));
            }
        }
        tracing::info!(consumer = %spec.durable, resume_after = seq, "consumer positioned after the last applied sequence");
    }
    stream
        .create_consumer(spec.config(resume_after))
        .await
        .map_err(|e| {
            let transient = transient(&e);
            Unavailable::of("creating consumer", &spec.durable, e, transient)
        })
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests;
