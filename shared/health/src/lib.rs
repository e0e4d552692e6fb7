//! Allot's GPU health rules, pure: what telemetry and heartbeats said goes in ([`Reading`]),
//! what remediation should do comes out ([`Verdict`]). No clock, no I/O: every reading carries
//! its time, so the same readings always give the same verdicts (the remediation service
//! journals them; tests script them).
//!
//! - [`rules`]: the rules — which signal, what threshold, how long a breach must hold before
//!   it fires (hold-down) and how long health must hold before it clears — from a YAML file,
//!   every problem reported at once; [`RuleSet::default`] is the set Allot ships.
//! - [`engine`]: per rule, node and GPU, the state machine healthy → breaching → firing →
//!   recovering → healthy; GPU-level breaches of one rule on several GPUs of a node at once
//!   escalate to the node (burst grouping); nodes an operator cordoned are left alone (their
//!   verdicts become alerts).
//! - [`breaker`]: how much of a pool remediation may take out of service in a window; past
//!   it, actions become alerts (NVSentinel's users' top complaint is mass cordons).
//! - [`idle`]: idle reclaim — a grant under a utilization threshold for a whole window, past
//!   its warm-up and not opted out, is reclaimed once.
//! - [`xid`]: XIDs by meaning — each driver error code's resolution bucket in NVIDIA's Xid
//!   Catalog, and what remediation does about it: an application fault alerts the task's team
//!   and touches nothing, a reset-the-GPU code takes that one GPU out and asks for a reset,
//!   79 (fallen off the bus) drains the node and asks for a reboot, an unknown code only
//!   alerts. The engine acts on an XID at once (an event, not a level) and returns what it
//!   took after a spell with no further XID.

pub mod breaker;
pub mod engine;
pub mod idle;
pub mod rules;
pub mod xid;

pub use breaker::Breaker;
pub use engine::{Audience, Change, Engine, NodeHealth, Request, Snapshot, Verdict};
pub use idle::{Grant, Idle, IdlePolicy, IdleWatch, Reclaim};
pub use rules::{Action, Rule, RuleKind, RuleSet, XidPolicy};
pub use xid::{Remedy, XidClass};

/// Milliseconds on the caller's clock.
pub type Millis = u64;

/// What one GPU (or a node, for heartbeats) reported at one moment — or, for an XID, what
/// happened to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// The node.
    pub node: String,
    /// The GPU's index on it; `None` for node-wide signals (heartbeats). An XID names its GPU.
    pub gpu: Option<u32>,
    /// When.
    pub at: Millis,
    /// What.
    pub signal: Signal,
}

/// A health signal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Signal {
    /// Temperature against the model's slowdown threshold, °C.
    Temperature {
        /// Now.
        celsius: f64,
        /// Where the GPU starts to slow itself down.
        slowdown_celsius: f64,
    },
    /// Power draw against the enforced limit, W.
    Power {
        /// Now.
        watts: f64,
        /// The limit.
        limit_watts: f64,
    },
    /// GPU memory in use against its size, MiB.
    Memory {
        /// In use.
        used_mib: f64,
        /// Size.
        total_mib: f64,
    },
    /// Uncorrectable ECC errors since the driver loaded.
    EccUncorrectable(u64),
    /// Rows that could not be remapped (the GPU has run out of spare rows).
    RowRemapFailures(u64),
    /// NVLink errors since the driver loaded (CRC, replay, recovery).
    NvlinkErrors(u64),
    /// The node's collector is alive.
    Heartbeat,
    /// The driver logged this XID on the reading's GPU: one event, acted on at once (see
    /// [`xid`]).
    Xid(u64),
}

#[cfg(test)]
mod tests;
