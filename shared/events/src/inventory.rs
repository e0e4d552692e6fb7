//! State changes the inventory derives from collector events: reachability and GPU health.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::envelope::EventKind;
use crate::subject;

domain_events! {
    /// What the inventory concluded about nodes and GPUs.
    pub enum InventoryEvent in "inventory" {
        /// A node missed enough heartbeats to be considered gone.
        NodeUnreachable(NodeUnreachable) = "node_unreachable",
        /// An unreachable node sent heartbeats again.
        NodeRecovered(NodeRecovered) = "node_recovered",
        /// A GPU's health changed (from telemetry: ECC, XID, temperature).
        GpuHealthChanged(GpuHealthChanged) = "gpu_health_changed",
    }
}

impl EventKind for InventoryEvent {
    fn event_type(&self) -> String {
        InventoryEvent::event_type(self)
    }
    fn nats_subject(&self) -> String {
        subject::inventory(self.name(), &self.entity())
    }
    fn entity(&self) -> String {
        match self {
            Self::NodeUnreachable(e) => e.node.clone(),
            Self::NodeRecovered(e) => e.node.clone(),
            Self::GpuHealthChanged(e) => e.node.clone(),
        }
    }
}

/// A node has not sent a heartbeat for too long.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeUnreachable {
    /// Node name.
    pub node: String,
    /// When its last heartbeat was stored by the bus.
    pub last_heartbeat_at: DateTime<Utc>,
    /// How many heartbeat intervals went by without one.
    pub missed_heartbeats: u32,
}

/// A node that was unreachable is sending heartbeats again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeRecovered {
    /// Node name.
    pub node: String,
    /// When its latest heartbeat was stored by the bus.
    pub last_heartbeat_at: DateTime<Utc>,
}

/// Health of a GPU as the inventory judges it from telemetry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GpuHealth {
    /// Fit for work.
    Healthy,
    /// Working but suspect (hot, corrected errors rising); placement should avoid it.
    Degraded,
    /// Not fit for work (uncorrected ECC, fatal XID).
    Unhealthy,
}

/// A GPU's health changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuHealthChanged {
    /// Node name.
    pub node: String,
    /// GPU id.
    pub gpu_uuid: String,
    /// GPU index on the node.
    pub index: u32,
    /// Health before.
    pub from: GpuHealth,
    /// Health now.
    pub to: GpuHealth,
    /// Why, in words an operator can act on.
    pub reason: String,
}
