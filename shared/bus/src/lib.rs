//! Allot's JetStream plumbing, shared by every service.
//!
//! # Layout
//!
//! - [`connect`]: connecting to NATS with a clear log line and capped exponential backoff while
//!   the server is unreachable, and reconnect logging afterwards.
//! - [`streams`]: the declarative stream catalogue ([`StreamSpec`], [`catalog`]) and
//!   [`ensure_streams`], which creates or updates streams idempotently at start-up.
//! - [`publish`]: [`Publisher`], which publishes CloudEvents with `Nats-Msg-Id` = event id (but
//!   telemetry samples, which are sent once) and awaits the PubAck within a timeout. A publish
//!   that was not acknowledged did not happen.
//! - [`consumer`]: [`ConsumerRunner`], which drives a [`Handler`] from a durable pull consumer
//!   with explicit acks, retries with backoff, and dead-letters what cannot be handled —
//!   undecodable messages and permanent handler failures — with the reason attached; each
//!   runner counts what it applied, dead-lettered and has yet to receive (`consumer::metrics`).
//! - [`accounts`]: per-team isolation — the nats-server accounts configuration (a PLATFORM
//!   account and one account per team that can read only its own cost events, live and through
//!   its own stream) and [`ensure_team_streams`], which creates those team streams.
//! - [`users`]: who may speak — one NATS user per role (`admin`, each service, a collector per
//!   node, a team per team), each publishing only its own subjects, rendered as the
//!   `authorization` block `allot up` gives its nats-server.
//! - [`error`]: [`BusError`] and [`PublishError`], classified by who is at fault.

pub mod accounts;
pub mod connect;
pub mod consumer;
pub mod error;
pub mod publish;
pub mod streams;
pub mod users;

pub use accounts::{Accounts, Credentials, ensure_team_streams};
pub use connect::{ConnectConfig, connect, server_list};
pub use consumer::{
    ConsumerRunner, ConsumerSpec, Content, Delivery, Handler, HandlerError, HandlerErrorKind,
    Outcome, Raw,
};
pub use error::{BusError, PublishError};
pub use publish::{ATOMIC_BATCH_MAX, Patient, PendingAck, Published, Publisher};
pub use streams::{StreamSpec, catalog, ensure_streams};
pub use users::{Role, Users};

pub use async_nats;

/// Headers Allot puts on dead letters.
pub mod headers {
    /// Why the message was dead-lettered.
    pub const ERROR: &str = "Allot-Error";
    /// The subject the message was originally published on.
    pub const ORIGINAL_SUBJECT: &str = "Allot-Original-Subject";
    /// The stream the message came from.
    pub const ORIGINAL_STREAM: &str = "Allot-Original-Stream";
    /// Its sequence in that stream.
    pub const ORIGINAL_SEQUENCE: &str = "Allot-Original-Sequence";
    /// The durable consumer that gave up on it.
    pub const CONSUMER: &str = "Allot-Consumer";
    /// How many times it was delivered.
    pub const DELIVERIES: &str = "Allot-Deliveries";
}
