//! Bus errors, classified by who is at fault: the caller's input (never retried), a conflict
//! (retry after re-reading), or infrastructure (retry later).

use async_nats::jetstream::context::PublishErrorKind;

/// Why a publish did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// No stream captures the subject: a deployment error, not a transient one.
    #[error("no stream captures subject {subject}")]
    NoStream {
        /// The subject published to.
        subject: String,
    },
    /// The expected-last-sequence check failed: someone else wrote first (e.g. a deposed
    /// leader's write). Re-read and decide again.
    #[error("conflict publishing to {subject}: the expected last sequence did not match")]
    Conflict {
        /// The subject published to.
        subject: String,
    },
    /// The message exceeds the server's max payload.
    #[error("message for {subject} is too large for the server")]
    TooLarge {
        /// The subject published to.
        subject: String,
    },
    /// No PubAck arrived in time; the event may or may not be stored. Publishing it again
    /// with the same id is safe (de-duplication).
    #[error("no acknowledgement for {subject} within {timeout_ms} ms")]
    Timeout {
        /// The subject published to.
        subject: String,
        /// The timeout that expired.
        timeout_ms: u64,
    },
    /// A message could not be handed to the connection (it is closed, or its buffer full).
    #[error("sending to {subject}: {why}")]
    Send {
        /// The subject published to.
        subject: String,
        /// The client's error.
        why: String,
    },
    /// The connection or server failed.
    #[error("publishing to {subject}: {source}")]
    Nats {
        /// The subject published to.
        subject: String,
        /// The client's error.
        #[source]
        source: async_nats::jetstream::context::PublishError,
    },
}

impl PublishError {
    pub(crate) fn from_nats(
        subject: &str,
        timeout: std::time::Duration,
        source: async_nats::jetstream::context::PublishError,
    ) -> Self {
        let subject = subject.to_owned();
        match source.kind() {
            PublishErrorKind::StreamNotFound => Self::NoStream { subject },
            PublishErrorKind::WrongLastSequence | PublishErrorKind::WrongLastMessageId => {
                Self::Conflict { subject }
            }
            PublishErrorKind::MaxPayloadExceeded => Self::TooLarge { subject },
            PublishErrorKind::TimedOut => Self::Timeout {
                subject,
                timeout_ms: timeout.as_millis() as u64,
            },
            PublishErrorKind::BrokenPipe
            | PublishErrorKind::MaxAckPending
            | PublishErrorKind::Other => Self::Nats { subject, source },
        }
    }

    /// Whether publishing the same event again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Timeout { .. } | Self::Nats { .. } | Self::Send { .. }
        )
    }

    /// Whether the failure may pass within seconds: a retryable one, or no stream answering —
    /// a deployment error when it lasts, but also what every publish is told while a
    /// clustered stream elects a new leader.
    pub fn may_pass(&self) -> bool {
        self.is_retryable() || matches!(self, Self::NoStream { .. })
    }
}

/// Infrastructure failures outside publishing.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// Connecting to NATS failed for good (bad URL, bad credentials).
    #[error("connecting to NATS at {url}: {source}")]
    Connect {
        /// The server URL(s).
        url: String,
        /// The client's error.
        #[source]
        source: async_nats::ConnectError,
    },
    /// Shutdown was requested before a connection could be made.
    #[error("shut down before NATS at {url} became reachable")]
    ShutdownBeforeConnect {
        /// The server URL(s).
        url: String,
    },
    /// A JetStream API call failed (stream or consumer management).
    #[error("JetStream {operation} for {name}: {message}")]
    JetStream {
        /// What was being done (`creating stream` …).
        operation: &'static str,
        /// The stream or consumer.
        name: String,
        /// The client's description.
        message: String,
    },
    /// Publishing failed.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// A consumer's handler failed fatally: the service must stop.
    #[error("consumer {consumer}: {message}")]
    Handler {
        /// The durable consumer.
        consumer: String,
        /// The handler's error.
        message: String,
    },
}

impl BusError {
    pub(crate) fn jetstream(
        operation: &'static str,
        name: &str,
        error: impl std::fmt::Display,
    ) -> Self {
        Self::JetStream {
            operation,
            name: name.to_owned(),
            message: error.to_string(),
        }
    }
}
