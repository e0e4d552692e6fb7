//! Publishing CloudEvents to JetStream with de-duplication and an awaited acknowledgement,
//! one at a time or as one atomic batch.

use std::time::Duration;

use async_nats::header;
use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use bytes::Bytes;

use allot_events::{AnyEvent, Envelope, EventKind};

use crate::error::PublishError;

/// What the server said about a stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The stream that stored it.
    pub stream: String,
    /// Its sequence in that stream.
    pub sequence: u64,
    /// The server had already stored an event with this id (within the duplicate window) and
    /// did not store it again.
    pub duplicate: bool,
}

/// What [`Publisher::publish_patiently`] stored, and how many attempts it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patient {
    /// The stored message.
    pub published: Published,
    /// Attempts made, the successful one included.
    pub attempts: u32,
}

/// Publishes Allot events. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct Publisher {
    js: jetstream::Context,
    source: String,
    ack_timeout: Duration,
}

/// A sent event whose acknowledgement has not been awaited yet (for pipelined publishing).
#[derive(Debug)]
pub struct PendingAck {
    subject: String,
    timeout: Duration,
    ack: PublishAckFuture,
}

impl PendingAck {
    /// Waits for the server's acknowledgement.
    pub async fn wait(self) -> Result<Published, PublishError> {
        let ack = self
            .ack
            .await
            .map_err(|e| PublishError::from_nats(&self.subject, self.timeout, e))?;
        Ok(Published {
            stream: ack.stream,
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }
}

impl Publisher {
    /// A publisher on `client` whose events say they come from `source`
    /// (e.g. `/allot/collector/node-1`); acknowledgements are awaited for 5 s.
    pub fn new(client: async_nats::Client, source: impl Into<String>) -> Self {
        let ack_timeout = Duration::from_secs(5);
        let js = jetstream::ContextBuilder::new()
            .timeout(ack_timeout)
            .ack_timeout(ack_timeout)
            .build(client);
        Self {
            js,
            source: source.into(),
            ack_timeout,
        }
    }

    /// The JetStream context, for stream management.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// The `source` this publisher stamps on new events.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Wraps `event` in a new envelope from this publisher's source.
    pub fn envelope(&self, event: impl Into<AnyEvent>) -> Envelope {
        Envelope::new(self.source.clone(), event)
    }

    /// Publishes `event` in a new envelope and waits for the acknowledgement.
    pub async fn publish(&self, event: impl Into<AnyEvent>) -> Result<Published, PublishError> {
        self.publish_envelope(&self.envelope(event)).await
    }

    /// Publishes an existing envelope (its id is the de-duplication key) and waits for the
    /// acknowledgement. Publishing the same envelope again is safe — but for a telemetry
    /// sample, which is stored again ([`EventKind::deduplicated`]): a sample is sent once.
    pub async fn publish_envelope(&self, envelope: &Envelope) -> Result<Published, PublishError> {
        self.send(envelope).await?.wait().await
    }

    /// Sends an envelope without waiting for its acknowledgement, so many can be in flight;
    /// the caller must [`PendingAck::wait`] on each before treating it as published.
    pub async fn send(&self, envelope: &Envelope) -> Result<PendingAck, PublishError> {
        self.send_raw(envelope.nats_subject(), message(envelope))
            .await
    }

    /// [`Publisher::publish_patiently`] for an envelope (its id is the de-duplication key).
    pub async fn publish_envelope_patiently(
        &self,
        envelope: &Envelope,
        patience: Duration,
    ) -> Result<Patient, PublishError> {
        self.publish_patiently(&envelope.nats_subject(), with_id(envelope), patience)
            .await
    }

    /// Sends a pre-built message (used for dead letters and raw tooling).
    pub async fn send_raw(
        &self,
        subject: String,
        message: PublishMessage,
    ) -> Result<PendingAck, PublishError> {
        let ack = self
            .js
            .send_publish(subject.clone(), message)
            .await
            .map_err(|e| PublishError::from_nats(&subject, self.ack_timeout, e))?;
        Ok(PendingAck {
            subject,
            timeout: self.ack_timeout,
            ack,
        })
    }

    /// Publishes `message` and waits for its acknowledgement, sending it again while the
    /// failure may pass — no acknowledgement in time, no stream answering (what a clustered
    /// stream says while it elects a leader), the connection down — until `patience` has run
    /// out: for a command a person or a CI job runs once, where a service would simply retry
    /// later. Every attempt is the same message, so it must carry a `Nats-Msg-Id`: the stream
    /// stores it once however many attempts reached it (within its duplicate window), and
    /// answers a later one as a duplicate. Waits 250 ms after the first failure, doubling to
    /// 2 s. A zero `patience` makes one attempt. Returns the stored message and how many
    /// attempts it took, or the last failure.
    pub async fn publish_patiently(
        &self,
        subject: &str,
        message: PublishMessage,
        patience: Duration,
    ) -> Result<Patient, PublishError> {
        debug_assert!(
            message
                .clone()
                .outbound_message(subject.to_owned())
                .headers
                .is_some_and(|h| h.get(header::NATS_MESSAGE_ID).is_some()),
            "a message sent more than once needs a Nats-Msg-Id"
        );
        let give_up = tokio::time::Instant::now() + patience;
        let mut pause = Duration::from_millis(250);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let sent = async {
                self.send_raw(subject.to_owned(), message.clone())
                    .await?
                    .wait()
                    .await
            };
            match sent.await {
                Ok(published) => {
                    return Ok(Patient {
                        published,
                        attempts,
                    });
                }
                Err(e) if e.may_pass() && tokio::time::Instant::now() + pause <= give_up => {
                    if attempts == 1 {
                        tracing::warn!(error = %e, ?patience, "not stored; sending it again until it is");
                    } else {
                        tracing::debug!(error = %e, attempts, retry_in = ?pause, "sending it again");
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Stores `messages` on `subject` as one atomic batch (ADR-50; the stream must allow
    /// atomic publishing): all of them, consecutively, or none. Expectations (such as
    /// `Nats-Expected-Last-Subject-Sequence`) on the first message are checked at the commit,
    /// against the stream as it was before the batch, so nothing can land between the batch's
    /// messages. One round trip however many messages: all but the last are sent without
    /// asking for a reply; the last commits the batch and brings its acknowledgement, whose
    /// sequence is the last message's. At most [`ATOMIC_BATCH_MAX`] messages. (Synadia's
    /// `jetstream-extra` crate does this too, but pins an older async-nats: a second NATS
    /// client in the build for three headers and a request.)
    pub async fn publish_atomic(
        &self,
        subject: &str,
        messages: Vec<PublishMessage>,
    ) -> Result<Published, PublishError> {
        assert!(
            (1..=ATOMIC_BATCH_MAX).contains(&messages.len()),
            "an atomic batch holds 1 to {ATOMIC_BATCH_MAX} messages, not {}",
            messages.len()
        );
        if messages.len() == 1 {
            let message = messages.into_iter().next().expect("one message");
            return self
                .send_raw(subject.to_owned(), message)
                .await?
                .wait()
                .await;
        }
        let id = uuid::Uuid::now_v7().simple().to_string();
        let last = messages.len();
        let client = self.js.client();
        for (i, message) in messages.into_iter().enumerate() {
            let message = message
                .header(header::NATS_BATCH_ID, id.as_str())
                .header(header::NATS_BATCH_SEQUENCE, (i + 1).to_string());
            if i + 1 == last {
                let commit =
                    message.header(header::NATS_BATCH_COMMIT, header::NATS_BATCH_COMMIT_FINAL);
                return self
                    .send_raw(subject.to_owned(), commit)
                    .await?
                    .wait()
                    .await;
            }
            let outbound = message.outbound_message(subject.to_owned());
            client
                .publish_with_headers(
                    outbound.subject,
                    outbound.headers.unwrap_or_default(),
                    outbound.payload,
                )
                .await
                .map_err(|e| PublishError::Send {
                    subject: subject.to_owned(),
                    why: e.to_string(),
                })?;
        }
        unreachable!("the last message commits the batch")
    }
}

/// An envelope as a message: its JSON, with its id as `Nats-Msg-Id` if its kind is
/// de-duplicated ([`EventKind::deduplicated`]: all but telemetry samples, which are sent once).
fn message(envelope: &Envelope) -> PublishMessage {
    if envelope.data.deduplicated() {
        with_id(envelope)
    } else {
        PublishMessage::build().payload(Bytes::from(envelope.to_json()))
    }
}

/// An envelope as a message with its id as `Nats-Msg-Id`, whatever its kind: for a message
/// that may be sent more than once.
fn with_id(envelope: &Envelope) -> PublishMessage {
    PublishMessage::build()
        .message_id(envelope.id.to_string())
        .payload(Bytes::from(envelope.to_json()))
}

/// Most messages in one atomic batch (the server's limit).
pub const ATOMIC_BATCH_MAX: usize = 1000;
