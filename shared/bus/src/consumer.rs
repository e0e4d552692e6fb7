//! The consumer runner: a durable pull consumer driving a [`Handler`], in stream order.
//!
//! Guarantees, in the order a reader needs them:
//! 1. Messages reach the handler in stream order, in batches of whatever is ready (up to
//!    [`ConsumerSpec::batch`]); a message is acknowledged only after the handler returned.
//! 2. A message that cannot be decoded, or that the handler rejects, is published to the
//!    dead-letter stream with the reason and its origin (subject, stream, sequence, consumer,
//!    deliveries) in headers, and only then acknowledged: it never blocks the stream and is
//!    never silently dropped.
//! 3. A handler failure that may pass (a busy database, a full disk) is retried in place with
//!    backoff, so later messages never overtake it. After [`ConsumerSpec::max_deliveries`]
//!    attempts the batch is split and each message retried alone; one that still fails is
//!    dead-lettered. A message the server has already delivered that many times without an
//!    acknowledgement (the process kept dying on it) is dead-lettered on sight.
//! 4. A handler that stores its applied position with its state ([`Handler::resume_after`])
//!    decides where the consumer starts: the durable consumer is recreated right after that
//!    position on start-up. Without this, a restarted instance would receive never-delivered
//!    messages before the redeliveries of those it was handling when it died, apply the newer
//!    ones first, and then skip the older ones as already applied — losing them. (The e2e test
//!    that SIGKILLs the inventory mid-stream found exactly that.)
//! 5. On shutdown the runner stops pulling, finishes the batch in hand, and returns.
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
    message::PublishMessage,
    stream::ConsumerErrorKind,
};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::{FutureExt, StreamExt};

use allot_events::{Envelope, decode, subject};

use crate::connect::backoff;
use crate::error::BusError;
use crate::headers;
use crate::publish::Publisher;

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
    /// Attempts (local retries and server redeliveries) before a message is dead-lettered.
    pub max_deliveries: u32,
    /// Longest wait between two attempts.
    pub max_backoff: Duration,
    /// How long to wait for more messages once one has arrived, to hand the handler a larger
    /// batch. Zero hands over only what is already there. A projection that commits per batch
    /// trades this much latency for far fewer commits under load.
    pub linger: Duration,
}

impl ConsumerSpec {
    /// A spec with defaults: batches of 256, 30 s ack wait, 5 attempts, 5 s backoff cap, no
    /// linger.
    pub fn new(stream: impl Into<String>, durable: impl Into<String>) -> Self {
        Self {
            stream: stream.into(),
            durable: durable.into(),
            filter_subjects: Vec::new(),
            batch: 256,
            ack_wait: Duration::from_secs(30),
            max_deliveries: 5,
            max_backoff: Duration::from_secs(5),
            linger: Duration::ZERO,
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
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            // Redelivery is bounded by the runner, which dead-letters rather than letting the
            // server stop delivering a message that then sits unacknowledged forever.
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

/// What the handler made of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied (or recognised as already applied): acknowledge.
    Handled,
    /// Can never be applied (invalid for this consumer): dead-letter with this reason.
    Rejected(String),
}

/// A batch could not be handled now (infrastructure trouble); it will be retried.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(pub String);

/// Applies a consumer's messages, whose content it reads as `E`.
pub trait Handler<E = Envelope>: Send {
    /// The last stream sequence this handler has applied, if it keeps one (a projection that
    /// stores its position with its state). The runner then starts the consumer right after
    /// it, so the handler's own record — not the server's acknowledgement state — decides
    /// where to resume: after a crash, messages that were delivered but never acknowledged
    /// come again in stream order instead of after newer ones. `None` resumes from the
    /// durable consumer's acknowledgements.
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
    content: PhantomData<fn() -> E>,
}

/// Acknowledges and dead-letters; kept apart from the handler so the runner never needs the
/// handler to be `Sync`.
#[derive(Debug)]
struct Settler {
    spec: ConsumerSpec,
    dead_letters: Publisher,
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
        Self {
            js: jetstream::new(client),
            settler: Settler { spec, dead_letters },
            handler,
            content: PhantomData,
        }
    }

    /// Creates (or updates) the durable consumer and runs until `shutdown` completes.
    /// Returns the handler, so tests can inspect it.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<H, BusError> {
        tokio::pin!(shutdown);
        let resume_after = self
            .handler
            .resume_after()
            .map_err(|e| BusError::JetStream {
                operation: "reading the applied position",
                name: self.settler.spec.durable.clone(),
                message: e.0,
            })?;
        let consumer = create_consumer(&self.js, &self.settler.spec, resume_after).await?;
        'pull: loop {
            let messages = consumer
                .stream()
                .max_messages_per_batch(self.settler.spec.batch)
                .heartbeat(Duration::from_secs(5))
                .expires(Duration::from_secs(30))
                .messages()
                .await
                .map_err(|e| {
                    BusError::jetstream("pulling from consumer", &self.settler.spec.durable, e)
                })?;
            tokio::pin!(messages);
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
                let chunk = Self::gather(&self.settler.spec, first, &mut messages).await;
                let mut pulled = Vec::with_capacity(chunk.len());
                for item in chunk {
                    match item {
                        Ok(message) => pulled.push(self.open(message)),
                        Err(e) => {
                            tracing::warn!(consumer = %self.settler.spec.durable, error = %e, "pulling messages failed");
                        }
                    }
                }
                if !pulled.is_empty() {
                    self.process(pulled).await;
                }
            }
        }
        tracing::info!(consumer = %self.settler.spec.durable, "consumer stopped");
        Ok(self.handler)
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
            Ok(info) => {
                let deliveries = info.delivered.max(1) as u32;
                let stream_sequence = info.stream_sequence;
                let published =
                    DateTime::from_timestamp_nanos(info.published.unix_timestamp_nanos() as i64);
                if deliveries > self.settler.spec.max_deliveries {
                    Err(format!(
                        "delivered {deliveries} times without being acknowledged (limit {})",
                        self.settler.spec.max_deliveries
                    ))
                } else {
                    E::read(&message).map(|event| Delivery {
                        stream_sequence,
                        subject: message.subject.to_string(),
                        published,
                        deliveries,
                        event,
                    })
                }
            }
        };
        Pulled { message, delivery }
    }

    /// Handles one pulled chunk: dead-letters what did not decode, hands the rest to the
    /// handler in order, and acknowledges everything it settled.
    async fn process(&mut self, pulled: Vec<Pulled<E>>) {
        // Split into runs of decodable messages so order is kept around dead letters.
        let mut run: Vec<Pulled<E>> = Vec::new();
        for p in pulled {
            match &p.delivery {
                Ok(_) => run.push(p),
                Err(reason) => {
                    let reason = reason.clone();
                    self.flush_run(std::mem::take(&mut run)).await;
                    self.settler.dead_letter(&p.message, &reason).await;
                }
            }
        }
        self.flush_run(run).await;
    }

    async fn flush_run(&mut self, run: Vec<Pulled<E>>) {
        if run.is_empty() {
            return;
        }
        let deliveries: Vec<Delivery<E>> = run
            .iter()
            .filter_map(|p| p.delivery.as_ref().ok().cloned())
            .collect();
        match self.handle_with_retries(&run, &deliveries).await {
            Ok(outcomes) => self.settler.settle(&run, outcomes).await,
            Err(_) if run.len() > 1 => {
                // Find the message that keeps failing: retry each alone.
                for (p, d) in run.iter().zip(&deliveries) {
                    let single = std::slice::from_ref(p);
                    match self
                        .handle_with_retries(single, std::slice::from_ref(d))
                        .await
                    {
                        Ok(outcomes) => self.settler.settle(single, outcomes).await,
                        Err(e) => {
                            self.settler
                                .dead_letter(
                                    &p.message,
                                    &give_up(self.settler.spec.max_deliveries, &e),
                                )
                                .await
                        }
                    }
                }
            }
            Err(e) => {
                let reason = give_up(self.settler.spec.max_deliveries, &e);
                self.settler.dead_letter(&run[0].message, &reason).await;
            }
        }
    }

    async fn handle_with_retries(
        &mut self,
        run: &[Pulled<E>],
        deliveries: &[Delivery<E>],
    ) -> Result<Vec<Outcome>, HandlerError> {
        let first = deliveries.iter().map(|d| d.deliveries).min().unwrap_or(1);
        let mut attempt = first;
        loop {
            match self.handler.handle(deliveries).await {
                Ok(outcomes) if outcomes.len() == deliveries.len() => return Ok(outcomes),
                Ok(outcomes) => {
                    return Err(HandlerError(format!(
                        "handler returned {} outcomes for {} messages",
                        outcomes.len(),
                        deliveries.len()
                    )));
                }
                Err(e) if attempt >= self.settler.spec.max_deliveries => return Err(e),
                Err(e) => {
                    let wait = backoff(attempt, self.settler.spec.max_backoff);
                    tracing::warn!(
                        consumer = %self.settler.spec.durable,
                        attempt,
                        retry_in_ms = wait.as_millis() as u64,
                        error = %e,
                        "handler failed; retrying"
                    );
                    for p in run {
                        // Keep the server from redelivering while we retry in place.
                        let _ = p.message.ack_with(jetstream::AckKind::Progress).await;
                    }
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
            }
        }
    }
}

impl Settler {
    async fn settle<E>(&self, run: &[Pulled<E>], outcomes: Vec<Outcome>) {
        for (p, outcome) in run.iter().zip(outcomes) {
            match outcome {
                Outcome::Handled => self.ack(&p.message).await,
                Outcome::Rejected(reason) => self.dead_letter(&p.message, &reason).await,
            }
        }
    }

    async fn ack(&self, message: &jetstream::Message) {
        if let Err(e) = message.ack().await {
            // The message will be redelivered; the handler's position check makes that harmless.
            tracing::warn!(consumer = %self.spec.durable, error = %e, "acknowledging failed");
        }
    }

    /// Publishes `message` to the dead-letter stream with `reason`, then acknowledges it.
    /// Retries the dead-letter publish until it succeeds: acknowledging without it would lose
    /// the message.
    async fn dead_letter(&self, message: &jetstream::Message, reason: &str) {
        let (stream, seq, deliveries) = match message.info() {
            Ok(i) => (i.stream.to_owned(), i.stream_sequence, i.delivered),
            Err(_) => (self.spec.stream.clone(), 0, 0),
        };
        tracing::warn!(
            consumer = %self.spec.durable,
            subject = %message.subject,
            stream_seq = seq,
            reason,
            "dead-lettering message"
        );
        let mut attempt = 0;
        loop {
            attempt += 1;
            let publish = PublishMessage::build()
                .payload(message.payload.clone())
                .message_id(format!("deadletter:{stream}:{seq}:{}", self.spec.durable))
                .header(headers::ERROR, truncate(reason, 2048))
                .header(headers::ORIGINAL_SUBJECT, message.subject.as_str())
                .header(headers::ORIGINAL_STREAM, stream.as_str())
                .header(headers::ORIGINAL_SEQUENCE, seq.to_string().as_str())
                .header(headers::CONSUMER, self.spec.durable.as_str())
                .header(headers::DELIVERIES, deliveries.to_string().as_str());
            let sent = self
                .dead_letters
                .send_raw(subject::dead_letter(&message.subject), publish)
                .await;
            let result = match sent {
                Ok(pending) => pending.wait().await.map(|_| ()),
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => break,
                Err(e) => {
                    let wait = backoff(attempt, self.spec.max_backoff);
                    tracing::error!(
                        consumer = %self.spec.durable,
                        error = %e,
                        retry_in_ms = wait.as_millis() as u64,
                        "could not publish dead letter; retrying"
                    );
                    let _ = message.ack_with(jetstream::AckKind::Progress).await;
                    tokio::time::sleep(wait).await;
                }
            }
        }
        self.ack(message).await;
    }
}

async fn create_consumer(
    js: &jetstream::Context,
    spec: &ConsumerSpec,
    resume_after: Option<u64>,
) -> Result<PullConsumer, BusError> {
    let stream = js
        .get_stream(&spec.stream)
        .await
        .map_err(|e| BusError::jetstream("opening stream", &spec.stream, e))?;
    if let Some(seq) = resume_after {
        // A consumer's start cannot be changed in place: recreate it at the handler's position.
        match stream.delete_consumer(&spec.durable).await {
            Ok(_) => {}
            Err(e)
                if matches!(e.kind(), ConsumerErrorKind::JetStream(ref js)
                    if js.error_code() == ErrorCode::CONSUMER_NOT_FOUND) => {}
            Err(e) => return Err(BusError::jetstream("recreating consumer", &spec.durable, e)),
        }
        tracing::info!(consumer = %spec.durable, resume_after = seq, "consumer positioned after the last applied sequence");
    }
    stream
        .create_consumer(spec.config(resume_after))
        .await
        .map_err(|e| BusError::jetstream("creating consumer", &spec.durable, e))
}

fn give_up(attempts: u32, error: &HandlerError) -> String {
    format!("handler failed {attempts} times: {error}")
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
