//! Event fixtures from builders: a test names the node, its GPU count and model, and gets
//! realistic events with everything else filled in consistently (GPU uuids, memory, power).

use allot_events::node::{GpuInfo, GpuSourceKind, HeartbeatSent, NodeRegistered};
use allot_events::telemetry::{GpuSample, GpusSampled};

/// A node to build events for: 8 × H100 in pool `default`, unless told otherwise.
pub fn node(name: &str) -> NodeFixture {
    NodeFixture {
        name: name.to_owned(),
        gpus: 8,
        model: "H100".to_owned(),
        memory_total_mib: 81_559,
        power_limit_mw: 700_000,
        pool: "default".to_owned(),
        rack: None,
    }
}

/// The uuid the fixtures give GPU `index` of `node`.
pub fn gpu_uuid(node: &str, index: u32) -> String {
    format!("GPU-{node}-{index}")
}

/// A node under construction; see [`node`].
#[derive(Debug, Clone)]
pub struct NodeFixture {
    name: String,
    gpus: u32,
    model: String,
    memory_total_mib: u64,
    power_limit_mw: u64,
    pool: String,
    rack: Option<String>,
}

impl NodeFixture {
    /// Number of GPUs.
    pub fn gpus(mut self, gpus: u32) -> Self {
        self.gpus = gpus;
        self
    }

    /// GPU model name, with the memory and power limit of the real part when known.
    pub fn model(mut self, model: &str) -> Self {
        (self.memory_total_mib, self.power_limit_mw) = match model {
            "A100" | "A100-80GB" => (81_920, 400_000),
            "L4" => (23_034, 72_000),
            "T4" => (15_360, 70_000),
            _ => (81_559, 700_000),
        };
        self.model = model.to_owned();
        self
    }

    /// The pool.
    pub fn pool(mut self, pool: &str) -> Self {
        self.pool = pool.to_owned();
        self
    }

    /// The rack.
    pub fn rack(mut self, rack: &str) -> Self {
        self.rack = Some(rack.to_owned());
        self
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The collector's registration: 64 cores, 512 GiB, simulated GPUs.
    pub fn registered(&self) -> NodeRegistered {
        NodeRegistered {
            node: self.name.clone(),
            hostname: self.name.clone(),
            pool: self.pool.clone(),
            rack: self.rack.clone(),
            cpu_milli: 64_000,
            memory_mib: 512 * 1024,
            gpu_source: GpuSourceKind::Simulated,
            driver_version: None,
            gpus: (0..self.gpus)
                .map(|i| GpuInfo {
                    index: i,
                    uuid: gpu_uuid(&self.name, i),
                    model: self.model.clone(),
                    memory_total_mib: self.memory_total_mib,
                    power_limit_mw: Some(self.power_limit_mw),
                    nvlink_peers: vec![],
                })
                .collect(),
        }
    }

    /// Heartbeat number `seq`.
    pub fn heartbeat(&self, seq: u64) -> HeartbeatSent {
        HeartbeatSent {
            node: self.name.clone(),
            seq,
            uptime_s: seq * 5,
        }
    }

    /// A sample of every GPU at `utilization_pct`, with healthy readings that follow the load.
    pub fn sampled(&self, utilization_pct: u8) -> GpusSampled {
        let util = u64::from(utilization_pct.min(100));
        GpusSampled {
            node: self.name.clone(),
            held: Vec::new(),
            samples: (0..self.gpus)
                .map(|i| GpuSample {
                    index: i,
                    uuid: gpu_uuid(&self.name, i),
                    utilization_pct: Some(util as u8),
                    memory_used_mib: self.memory_total_mib * util / 100,
                    memory_total_mib: self.memory_total_mib,
                    temperature_c: Some(35 + (util as u32) / 2),
                    power_mw: Some(self.power_limit_mw / 10 + self.power_limit_mw * util / 125),
                    power_limit_mw: Some(self.power_limit_mw),
                    ecc_corrected: Some(0),
                    ecc_uncorrected: Some(0),
                    xid_errors: Some(0),
                    last_xid: None,
                    xids: Vec::new(),
                    slowdown_temperature_c: None,
                    throttle_reasons: Vec::new(),
                    rows_remapped_uncorrectable: None,
                    row_remap_failed: None,
                    nvlink_errors: None,
                })
                .collect(),
        }
    }
}
