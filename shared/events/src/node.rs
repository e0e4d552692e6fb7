//! Events a node's collector publishes about the node: it registered, it is alive.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::envelope::EventKind;
use crate::subject;

domain_events! {
    /// Facts a node's collector reports about the node itself.
    pub enum NodeEvent in "node" {
        /// The collector started (or reconnected) and described the node and its GPUs.
        Registered(NodeRegistered) = "registered",
        /// The collector is alive; sent every heartbeat interval.
        HeartbeatSent(HeartbeatSent) = "heartbeat_sent",
    }
}

impl EventKind for NodeEvent {
    fn event_type(&self) -> String {
        NodeEvent::event_type(self)
    }
    fn nats_subject(&self) -> String {
        match self {
            Self::Registered(e) => subject::node_registered(&e.node),
            Self::HeartbeatSent(e) => subject::node_heartbeat(&e.node),
        }
    }
    fn entity(&self) -> String {
        match self {
            Self::Registered(e) => e.node.clone(),
            Self::HeartbeatSent(e) => e.node.clone(),
        }
    }
}

/// Where a collector's GPU facts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GpuSourceKind {
    /// NVIDIA Management Library on a real GPU node.
    Nvml,
    /// The built-in simulator (laptops, CI, `allot up`).
    Simulated,
}

/// A node announced itself: its capacity and its GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeRegistered {
    /// Node name, unique in the cluster (a subject token).
    pub node: String,
    /// Host name the collector runs on.
    pub hostname: String,
    /// The GPU pool the node belongs to.
    pub pool: String,
    /// Rack (or other failure/topology domain) the node sits in, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// Allocatable CPU in millicores.
    pub cpu_milli: u64,
    /// Allocatable memory in MiB.
    pub memory_mib: u64,
    /// Where the GPU facts come from.
    pub gpu_source: GpuSourceKind,
    /// NVIDIA driver version, when the source reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// The node's GPUs, by index.
    pub gpus: Vec<GpuInfo>,
}

/// Static facts about one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuInfo {
    /// Index on the node (as `CUDA_VISIBLE_DEVICES` counts).
    pub index: u32,
    /// Globally unique GPU id (`GPU-…`).
    pub uuid: String,
    /// Marketing model name, e.g. `NVIDIA H100 80GB HBM3`, or the simulator's `H100`.
    pub model: String,
    /// Total framebuffer memory in MiB.
    pub memory_total_mib: u64,
    /// Enforced power limit in milliwatts, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_mw: Option<u64>,
    /// Indices of GPUs on the same node reachable over an active NVLink.
    #[serde(default)]
    pub nvlink_peers: Vec<u32>,
}

/// The collector on a node is alive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatSent {
    /// Node name.
    pub node: String,
    /// Heartbeat counter since the collector started (starts at 1).
    pub seq: u64,
    /// Seconds since the collector started.
    pub uptime_s: u64,
}

/// This machine's host name, or `localhost` when the kernel does not say: what a collector
/// registers as [`NodeRegistered::hostname`], and what a client command names itself by.
pub fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .map(|name| name.trim().to_owned())
        .find(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
