//! GPU telemetry samples, published by collectors at a fixed interval.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::envelope::EventKind;
use crate::subject;

domain_events! {
    /// Telemetry a collector sampled from its GPUs.
    pub enum TelemetryEvent in "telemetry" {
        /// One sample of every GPU on a node.
        GpusSampled(GpusSampled) = "gpus_sampled",
    }
}

impl EventKind for TelemetryEvent {
    fn event_type(&self) -> String {
        TelemetryEvent::event_type(self)
    }
    fn nats_subject(&self) -> String {
        match self {
            Self::GpusSampled(e) => subject::telemetry(&e.node),
        }
    }
    fn entity(&self) -> String {
        match self {
            Self::GpusSampled(e) => e.node.clone(),
        }
    }
    /// A sample is sent once: a collector whose publish fails drops it, and the next tick's
    /// sample supersedes it. With no repeat to recognise, the stream keeps no id per sample
    /// (at a 1 s interval, 2,000 nodes would keep 240,000 ids in a two-minute window).
    fn deduplicated(&self) -> bool {
        false
    }
}

/// Every GPU on `node` was sampled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GpusSampled {
    /// Node name.
    pub node: String,
    /// One sample per GPU, by index.
    pub samples: Vec<GpuSample>,
    /// What holds the node's GPUs as its executor runs them when sampled: one entry per run
    /// and GPU (a fractional GPU may have several). Absent: nothing runs, or no executor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<GpuHeld>,
}

/// A run holding (a share of) one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuHeld {
    /// The GPU's index on the node.
    pub index: u32,
    /// The lease the run holds it under.
    pub lease: allot_sched::LeaseId,
    /// The workload the run belongs to.
    pub workload: String,
    /// The task's name in the workload.
    pub task: String,
    /// The team it runs for (empty when the grant did not say).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub team: String,
    /// How much of the GPU, milli-GPU (1000: all of it).
    pub milli: u32,
    /// Its spec opted out of idle reclaim (`idleReclaim: false`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_idle_reclaim: bool,
}

/// One GPU's readings. Readings a device does not support are absent rather than zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuSample {
    /// Index on the node.
    pub index: u32,
    /// GPU id (`GPU-…`).
    pub uuid: String,
    /// Percent of time a kernel was running over the last sample period (0-100); absent when
    /// the device cannot say (MIG mode, for one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_pct: Option<u8>,
    /// Framebuffer memory in use, MiB.
    pub memory_used_mib: u64,
    /// Framebuffer memory in total, MiB.
    pub memory_total_mib: u64,
    /// Core temperature in °C.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<u32>,
    /// Power draw in milliwatts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_mw: Option<u64>,
    /// Enforced power limit in milliwatts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_mw: Option<u64>,
    /// Volatile (since driver load) corrected ECC errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_corrected: Option<u64>,
    /// Volatile uncorrected ECC errors; any increase means the GPU's memory is suspect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_uncorrected: Option<u64>,
    /// XID errors observed since the collector started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid_errors: Option<u64>,
    /// The most recent XID error code, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_xid: Option<u64>,
    /// The XID error codes that occurred on this GPU since the previous sample, oldest first
    /// (one entry per event; an event whose code NVML did not know is counted in `xid_errors`
    /// but not listed). Absent: none, or the GPU cannot report XIDs (see `xid_errors`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xids: Vec<u64>,
    /// The temperature, °C, at which the GPU starts to slow itself down (NVML's `Slowdown`
    /// temperature threshold). Thermal margin is this minus `temperature_c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowdown_temperature_c: Option<u32>,
    /// Why the GPU's clocks are held down right now (NVML's clocks event reasons), by name:
    /// `sw_power_cap`, `hw_slowdown`, `hw_thermal_slowdown`, `sw_thermal_slowdown`,
    /// `hw_power_brake`, `sync_boost`, `display_clock_setting`. An idle GPU and clocks an
    /// operator set are not reasons to worry and are not listed. Absent: running at full
    /// clocks, or the GPU cannot say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle_reasons: Vec<String>,
    /// Memory rows remapped because of uncorrectable errors since the GPU was made (the count
    /// persists across reboots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_remapped_uncorrectable: Option<u64>,
    /// A row remapping failed: the GPU ran out of spare rows and its memory can no longer be
    /// repaired in the field. Absent on GPUs without row remapping (before Ampere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_remap_failed: Option<bool>,
    /// NVLink errors since the driver loaded, summed over the GPU's active links and over the
    /// counters NVML keeps for each (CRC flit, CRC data, replay, recovery). Absent: no active
    /// NVLink, or no counter the GPU supports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_errors: Option<u64>,
}

#[cfg(test)]
mod tests;
