//! Allot's event contracts: everything that crosses the bus is defined here.
//!
//! # Layout
//!
//! - [`envelope`]: the CloudEvents 1.0 structured-JSON envelope ([`Envelope`]) with Allot's
//!   extensions (`team`, `traceparent`), and [`decode`], which turns bytes from the wire into a
//!   typed event or a typed [`DecodeError`] — never a panic.
//! - [`node`], [`telemetry`], [`inventory`]: one module per domain, each with a past-tense event
//!   enum (`NodeEvent::Registered`, …) and the payload structs it carries.
//! - [`workload`]: the workload spec a team submits (`apiVersion: allot/v1`, `kind: Workload`:
//!   tasks, resources, dependencies, gangs, retries, checkpoints), kept as written, and the
//!   `WorkloadEvent`s about it (submitted, aborted). Parsing and validation are `allot-workload`'s.
//! - [`cost`]: billing's cost and budget events, in integer micro-units.
//! - [`access`]: API tokens issued and revoked (the gateway's bearer tokens, kept hashed).
//! - [`remediation`]: remediation's actions (each naming its rule, readings and tasks) and
//!   operators' cordons.
//! - [`subject`]: subject builders (`allot.<domain>.<event>.<key…>`) and validation of the
//!   tokens (node names, teams) that go into them.
//! - [`schema`]: JSON Schema generation for every event type and for the workload spec;
//!   `schemas/` at the workspace root holds the committed output and a test fails when it is stale.
//!
//! Event types are `io.allot.<domain>.v<major>.<event>`. A reader accepts its own major version
//! and upcasts older ones; a newer major version is reported as
//! [`DecodeError::UnsupportedVersion`] so the message can be dead-lettered rather than misread.

#[macro_use]
mod macros;

pub mod access;
pub mod alloc;
pub mod cost;
pub mod envelope;
pub mod inventory;
pub mod node;
pub mod query;
pub mod remediation;
pub mod schema;
pub mod subject;
pub mod task;
pub mod telemetry;
pub mod workload;

pub use access::AccessEvent;
pub use alloc::AllocEvent;
pub use cost::CostEvent;
pub use envelope::{AnyEvent, DecodeError, Envelope, EventKind, decode};
pub use inventory::InventoryEvent;
pub use node::NodeEvent;
pub use remediation::RemediationEvent;
pub use task::TaskEvent;
pub use telemetry::TelemetryEvent;
pub use workload::WorkloadEvent;

/// The prefix of every Allot event type (`io.allot.<domain>.v<major>.<event>`).
pub const TYPE_PREFIX: &str = "io.allot.";
