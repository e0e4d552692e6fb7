//! A simulated node: M GPUs of one real model whose telemetry follows the load a caller sets
//! through [`SimLoad`], with faults that can be injected.
//!
//! Readings are derived from load the way real GPUs roughly behave: power rises linearly from
//! idle to the model's TDP with utilization, temperature rises with power from a 30 °C
//! ambient, and a loaded GPU holds a few hundred MiB of CUDA context on top of its
//! allocations. Noise comes from a seeded generator, so the same seed, node and load give the
//! same samples. The health signals NVML gives are simulated too: the model's slowdown
//! temperature, throttle reasons that follow heat and power, row remapping on the models that
//! have it, NVLink error counters on the models with NVLink, and each XID listed once.
//!
//! [`inject`] applies a schedule of faults (`allot up --inject KIND:NODE@TIME`) to simulated
//! nodes through their [`SimLoad`] handles.

pub mod inject;

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};

use allot_events::node::{GpuInfo, GpuSourceKind};
use allot_events::telemetry::GpuSample;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::host::HostCapacity;
use crate::source::{GpuInventory, GpuSource, SourceError};

/// A GPU model the simulator knows, with the figures NVML reports for the real part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuModel {
    /// NVIDIA H100 80GB HBM3 (SXM5): 81,559 MiB, 700 W.
    H100,
    /// NVIDIA A100-SXM4-80GB: 81,920 MiB, 400 W.
    A100Sxm80,
    /// NVIDIA A100-SXM4-40GB: 40,960 MiB, 400 W.
    A100Sxm40,
    /// Tesla V100-SXM2-32GB: 32,768 MiB, 300 W.
    V100,
    /// NVIDIA L4: 23,034 MiB, 72 W, no NVLink.
    L4,
    /// Tesla T4: 15,360 MiB, 70 W, no NVLink.
    T4,
    /// NVIDIA A10: 23,028 MiB, 150 W, no NVLink.
    A10,
}

/// One row of the model table.
#[derive(Debug)]
struct ModelSpec {
    model: GpuModel,
    /// The name reported as `GpuInfo::model`, and the canonical spelling for parsing.
    name: &'static str,
    /// Other accepted spellings (compared after normalising case and separators).
    aliases: &'static [&'static str],
    memory_mib: u64,
    tdp_w: f64,
    idle_w: f64,
    nvlink: bool,
    /// NVML's `Slowdown` temperature threshold, °C (about what the real part reports).
    slowdown_c: u32,
    /// Whether the part remaps rows on memory errors (Ampere and later) rather than retiring
    /// pages.
    remaps_rows: bool,
}

const MODELS: &[ModelSpec] = &[
    ModelSpec {
        model: GpuModel::H100,
        name: "H100",
        aliases: &["H100-80GB", "H100-SXM", "H100-SXM5-80GB"],
        memory_mib: 81_559,
        tdp_w: 700.0,
        idle_w: 70.0,
        nvlink: true,
        slowdown_c: 87,
        remaps_rows: true,
    },
    ModelSpec {
        model: GpuModel::A100Sxm80,
        name: "A100-80GB",
        aliases: &["A100-SXM4-80GB", "A100-SXM-80GB"],
        memory_mib: 81_920,
        tdp_w: 400.0,
        idle_w: 60.0,
        nvlink: true,
        slowdown_c: 89,
        remaps_rows: true,
    },
    ModelSpec {
        model: GpuModel::A100Sxm40,
        name: "A100-40GB",
        aliases: &["A100-SXM4-40GB", "A100-SXM-40GB"],
        memory_mib: 40_960,
        tdp_w: 400.0,
        idle_w: 55.0,
        nvlink: true,
        slowdown_c: 89,
        remaps_rows: true,
    },
    ModelSpec {
        model: GpuModel::V100,
        name: "V100",
        aliases: &["V100-32GB", "V100-SXM2-32GB"],
        memory_mib: 32_768,
        tdp_w: 300.0,
        idle_w: 40.0,
        nvlink: true,
        slowdown_c: 87,
        remaps_rows: false,
    },
    ModelSpec {
        model: GpuModel::L4,
        name: "L4",
        aliases: &["L4-24GB"],
        memory_mib: 23_034,
        tdp_w: 72.0,
        idle_w: 16.0,
        nvlink: false,
        slowdown_c: 92,
        remaps_rows: true,
    },
    ModelSpec {
        model: GpuModel::T4,
        name: "T4",
        aliases: &["T4-16GB"],
        memory_mib: 15_360,
        tdp_w: 70.0,
        idle_w: 10.0,
        nvlink: false,
        slowdown_c: 93,
        remaps_rows: false,
    },
    ModelSpec {
        model: GpuModel::A10,
        name: "A10",
        aliases: &["A10-24GB"],
        memory_mib: 23_028,
        tdp_w: 150.0,
        idle_w: 25.0,
        nvlink: false,
        slowdown_c: 93,
        remaps_rows: true,
    },
];

impl GpuModel {
    /// Every model the simulator knows, in table order.
    pub const ALL: [GpuModel; 7] = [
        Self::H100,
        Self::A100Sxm80,
        Self::A100Sxm40,
        Self::V100,
        Self::L4,
        Self::T4,
        Self::A10,
    ];

    fn spec(self) -> &'static ModelSpec {
        MODELS
            .iter()
            .find(|s| s.model == self)
            .expect("every GpuModel has a row in MODELS")
    }

    /// The model name reported in `GpuInfo::model` (`H100`, `A100-40GB` …).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Framebuffer memory, MiB.
    pub fn memory_mib(self) -> u64 {
        self.spec().memory_mib
    }

    /// Board power limit (TDP), watts.
    pub fn tdp_w(self) -> f64 {
        self.spec().tdp_w
    }

    /// Power drawn when idle, watts.
    pub fn idle_w(self) -> f64 {
        self.spec().idle_w
    }

    /// Whether the model's SXM boards sit in an all-to-all NVLink domain.
    pub fn has_nvlink(self) -> bool {
        self.spec().nvlink
    }

    /// The temperature at which the GPU starts to slow itself down, °C.
    pub fn slowdown_temperature_c(self) -> u32 {
        self.spec().slowdown_c
    }

    /// Whether the model remaps memory rows (and so reports remapped rows and failures).
    pub fn remaps_rows(self) -> bool {
        self.spec().remaps_rows
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A GPU model name the simulator does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown GPU model {given:?}; known models (case-insensitive): {}",
    known_models()
)]
pub struct UnknownGpuModel {
    /// The rejected name.
    pub given: String,
}

fn known_models() -> String {
    MODELS.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
}

impl FromStr for GpuModel {
    type Err = UnknownGpuModel;

    /// Parses `h100`, `A100-40GB`, `a100_80gb`, `t4 16gb` …: case and the choice of `-`, `_`
    /// or space as separator do not matter.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted: String = s
            .trim()
            .chars()
            .map(|c| match c {
                '_' | ' ' => '-',
                c => c.to_ascii_uppercase(),
            })
            .collect();
        MODELS
            .iter()
            .find(|spec| spec.name == wanted || spec.aliases.contains(&wanted.as_str()))
            .map(|spec| spec.model)
            .ok_or_else(|| UnknownGpuModel {
                given: s.to_owned(),
            })
    }
}

/// What a simulated node looks like.
#[derive(Debug, Clone, PartialEq)]
pub struct SimSpec {
    /// Number of GPUs.
    pub gpus: u32,
    /// Their model (one model per node).
    pub model: GpuModel,
    /// Allocatable CPU in millicores.
    pub cpu_milli: u64,
    /// Allocatable memory in MiB.
    pub memory_mib: u64,
    /// Utilization (0..=1) that idle GPUs wander around, standing for work outside Allot's
    /// control; 0 keeps idle GPUs at exactly 0 %. Values outside 0..=1 are clamped.
    pub background_load: f64,
    /// Seed of the noise; with the same node name and load, the same seed gives the same samples.
    pub seed: u64,
}

impl Default for SimSpec {
    /// An 8 × H100 node with 64 cores and 512 GiB of memory, idle, seed 0.
    fn default() -> Self {
        Self {
            gpus: 8,
            model: GpuModel::H100,
            cpu_milli: 64_000,
            memory_mib: 512 * 1024,
            background_load: 0.0,
            seed: 0,
        }
    }
}

/// A fault the simulator can inject into one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimFault {
    /// One more volatile uncorrected ECC error.
    EccUncorrected,
    /// One XID error with this code (e.g. 79: GPU has fallen off the bus), counted from then on
    /// and listed in the next sample only.
    Xid(u64),
    /// The GPU runs at 97 °C or hotter — above its slowdown temperature, so it reports
    /// `hw_thermal_slowdown` — until its faults are cleared.
    Overheat,
    /// The next sample only reads as [`SimFault::Overheat`] does; the one after is normal.
    Spike,
    /// The GPU draws 15% above its power limit (and reports `sw_power_cap`) until its faults
    /// are cleared.
    PowerOverLimit,
    /// A row remapping failed: the GPU is out of spare rows, for good (a reset does not fix it).
    RowRemapFailure,
    /// This many more NVLink errors (ignored by models without NVLink).
    NvLinkErrors(u64),
}

/// A GPU index beyond the simulated node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU {index} does not exist on this simulated node ({gpus} GPUs)")]
pub struct UnknownGpu {
    /// The index asked for.
    pub index: u32,
    /// How many GPUs the node has.
    pub gpus: u32,
}

/// What runs on one simulated GPU, and what went wrong with it.
#[derive(Debug, Clone, Default, PartialEq)]
struct GpuState {
    /// Target utilization (0..=100) and allocated memory of the work placed on the GPU.
    load: Option<(u8, u64)>,
    ecc_uncorrected: u64,
    xid_errors: u64,
    last_xid: Option<u64>,
    /// XIDs not yet reported in a sample.
    new_xids: Vec<u64>,
    overheating: bool,
    /// The next sample reads hot, once.
    spike: bool,
    over_power_limit: bool,
    rows_remapped_uncorrectable: u64,
    row_remap_failed: bool,
    nvlink_errors: u64,
}

/// A simulated node's GPUs, and what went wrong with the node as a whole.
#[derive(Debug, Clone, Default, PartialEq)]
struct NodeState {
    gpus: Vec<GpuState>,
    /// The node is cut off: its collector publishes no more heartbeats or telemetry.
    partitioned: bool,
    /// The work on the node stopped using its GPUs: loaded GPUs read 0% busy.
    stalled: bool,
}

/// A handle that drives a simulated node's load and faults. Clones share the node.
#[derive(Debug, Clone)]
pub struct SimLoad {
    state: Arc<Mutex<NodeState>>,
    model: GpuModel,
}

/// Utilization of a GPU whose whole share is granted, percent (work is never quite 100%).
const BUSY_PCT: u64 = 95;
/// Memory a granted share holds, percent of its part of the GPU's memory.
const BUSY_MEMORY_PCT: u64 = 80;

impl SimLoad {
    fn new(gpus: u32, model: GpuModel) -> Self {
        Self {
            state: Arc::new(Mutex::new(NodeState {
                gpus: vec![GpuState::default(); gpus as usize],
                ..NodeState::default()
            })),
            model,
        }
    }

    /// The model of the node's GPUs.
    pub fn model(&self) -> GpuModel {
        self.model
    }

    /// How many GPUs the node has.
    pub fn gpus(&self) -> u32 {
        self.lock().gpus.len() as u32
    }

    /// Makes the node's load follow the work granted on it: each GPU in `granted` (index →
    /// milli-GPU held by the runs on it) is busy in proportion to its share — a whole GPU 95%
    /// busy with 80% of its memory held — and every other GPU is idle. The executor calls it
    /// as runs start and end, so simulated telemetry (and billing's idle cost) means something.
    pub fn occupy(&self, granted: &std::collections::BTreeMap<u32, u32>) {
        let memory_mib = self.model.memory_mib();
        let mut node = self.lock();
        for (index, gpu) in node.gpus.iter_mut().enumerate() {
            gpu.load = granted.get(&(index as u32)).map(|&milli| {
                let milli = u64::from(milli.min(1000));
                let pct = (milli * BUSY_PCT / 1000) as u8;
                let memory = memory_mib * milli / 1000 * BUSY_MEMORY_PCT / 100;
                (pct, memory)
            });
        }
    }

    fn lock(&self) -> MutexGuard<'_, NodeState> {
        // The state is plain data that every writer leaves consistent, so a panic elsewhere
        // while holding the lock does not make it unusable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_gpu(&self, index: u32, f: impl FnOnce(&mut GpuState)) -> Result<(), UnknownGpu> {
        let mut node = self.lock();
        let count = node.gpus.len() as u32;
        let gpu = node
            .gpus
            .get_mut(index as usize)
            .ok_or(UnknownGpu { index, gpus: count })?;
        f(gpu);
        Ok(())
    }

    /// Runs work on GPU `index` that keeps it `utilization_pct` busy (clamped to 100) and
    /// holds `memory_used_mib` of its memory.
    pub fn set_load(
        &self,
        index: u32,
        utilization_pct: u8,
        memory_used_mib: u64,
    ) -> Result<(), UnknownGpu> {
        self.with_gpu(index, |gpu| {
            gpu.load = Some((utilization_pct.min(100), memory_used_mib));
        })
    }

    /// Removes the work from GPU `index`; it goes back to idle (or background) readings.
    pub fn clear(&self, index: u32) -> Result<(), UnknownGpu> {
        self.with_gpu(index, |gpu| gpu.load = None)
    }

    /// Injects `fault` into GPU `index`; it shows in the following samples.
    pub fn inject_fault(&self, index: u32, fault: SimFault) -> Result<(), UnknownGpu> {
        self.with_gpu(index, |gpu| match fault {
            SimFault::EccUncorrected => gpu.ecc_uncorrected += 1,
            SimFault::Xid(code) => {
                gpu.xid_errors += 1;
                gpu.last_xid = Some(code);
                gpu.new_xids.push(code);
            }
            SimFault::Overheat => gpu.overheating = true,
            SimFault::Spike => gpu.spike = true,
            SimFault::PowerOverLimit => gpu.over_power_limit = true,
            SimFault::RowRemapFailure => {
                gpu.rows_remapped_uncorrectable += 1;
                gpu.row_remap_failed = true;
            }
            SimFault::NvLinkErrors(count) => {
                gpu.nvlink_errors = gpu.nvlink_errors.saturating_add(count);
            }
        })
    }

    /// Repairs GPU `index` as a GPU reset would: it stops overheating and drawing too much
    /// power, and its volatile ECC counter returns to 0. XID history stays, because the
    /// collector counts XIDs since it started, not since the last reset; so do remapped rows
    /// (kept on the board) and NVLink errors (counted since the driver loaded).
    pub fn clear_faults(&self, index: u32) -> Result<(), UnknownGpu> {
        self.with_gpu(index, |gpu| {
            gpu.overheating = false;
            gpu.spike = false;
            gpu.over_power_limit = false;
            gpu.ecc_uncorrected = 0;
        })
    }

    /// Cuts the node off the network, for good: its collector publishes no more heartbeats
    /// or telemetry, while its executor goes on running what it runs.
    pub fn partition(&self) {
        self.lock().partitioned = true;
    }

    /// Whether [`SimLoad::partition`] cut the node off.
    pub fn is_partitioned(&self) -> bool {
        self.lock().partitioned
    }

    /// The work on the node stops using its GPUs, for good, as a hung job would: the GPUs that
    /// runs hold read 0% busy and idle power, and keep their memory.
    pub fn stall(&self) {
        self.lock().stalled = true;
    }

    /// The state to sample: one-shot faults (a spike, new XIDs) are handed over once.
    fn take_snapshot(&self) -> NodeState {
        let mut node = self.lock();
        let snapshot = node.clone();
        for gpu in &mut node.gpus {
            gpu.spike = false;
            gpu.new_xids.clear();
        }
        snapshot
    }
}

/// Ambient temperature of a simulated GPU at zero power, °C.
const AMBIENT_C: f64 = 30.0;
/// Temperature rise at full board power, °C (so readings run from ~35 to ~85 °C).
const RISE_AT_TDP_C: f64 = 55.0;
/// The temperature an overheating GPU reports at least, °C: above every model's slowdown.
const OVERHEAT_C: u32 = 97;
/// Power an over-limit GPU draws, as a multiple of its limit.
const OVER_LIMIT_POWER: f64 = 1.15;
/// CUDA context memory a busy GPU holds on top of its allocations, MiB.
const CONTEXT_MIB: u64 = 400;
/// Largest step of the background random walk per sample, percentage points.
const BACKGROUND_STEP_PCT: f64 = 5.0;
/// Noise on the utilization of loaded GPUs, ± percentage points.
const LOAD_NOISE_PCT: f64 = 2.0;

/// A [`GpuSource`] that simulates a node described by a [`SimSpec`].
#[derive(Debug)]
pub struct SimulatedSource {
    node: String,
    spec: SimSpec,
    load: SimLoad,
    rng: SmallRng,
    /// Current value of each GPU's background-load random walk, percent.
    background_pct: Vec<f64>,
}

impl SimulatedSource {
    /// A simulated node named `node` (the name makes its GPU UUIDs and noise its own).
    pub fn new(node: &str, mut spec: SimSpec) -> Self {
        spec.background_load = if spec.background_load.is_nan() {
            0.0
        } else {
            spec.background_load.clamp(0.0, 1.0)
        };
        let rng = SmallRng::seed_from_u64(spec.seed ^ fnv1a(node.as_bytes()));
        Self {
            node: node.to_owned(),
            background_pct: vec![spec.background_load * 100.0; spec.gpus as usize],
            load: SimLoad::new(spec.gpus, spec.model),
            spec,
            rng,
        }
    }

    /// The handle that sets this node's load and faults.
    pub fn load(&self) -> SimLoad {
        self.load.clone()
    }

    /// The spec this node simulates.
    pub fn spec(&self) -> &SimSpec {
        &self.spec
    }

    fn nvlink_peers(&self, index: u32) -> Vec<u32> {
        if !self.spec.model.has_nvlink() {
            return Vec::new();
        }
        (0..self.spec.gpus).filter(|&peer| peer != index).collect()
    }

    /// Next utilization (percent) of an idle GPU `index`: 0, or a step of a random walk that
    /// is pulled back towards the background load.
    fn background_step(&mut self, index: usize) -> f64 {
        let mean = self.spec.background_load * 100.0;
        let step = self
            .rng
            .random_range(-BACKGROUND_STEP_PCT..=BACKGROUND_STEP_PCT);
        if mean == 0.0 {
            return 0.0;
        }
        let current = self.background_pct[index];
        let next = (current + step + 0.2 * (mean - current)).clamp(0.0, 100.0);
        self.background_pct[index] = next;
        next
    }
}

/// The UUID a simulated GPU reports: `GPU-` and a UUID-shaped hash of the node name and index,
/// so it is the same on every restart and distinct across nodes.
pub fn simulated_uuid(node: &str, index: u32) -> String {
    let key = format!("allot-sim/{node}/{index}");
    let hi = fnv1a(key.as_bytes());
    let lo = fnv1a(format!("{key}/lo").as_bytes());
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// FNV-1a, 64-bit: a hash that stays the same across Rust releases (unlike `DefaultHasher`).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl GpuSource for SimulatedSource {
    fn kind(&self) -> GpuSourceKind {
        GpuSourceKind::Simulated
    }

    fn sim_load(&self) -> Option<SimLoad> {
        Some(self.load())
    }

    fn describe(&mut self) -> Result<GpuInventory, SourceError> {
        let model = self.spec.model;
        let gpus = (0..self.spec.gpus)
            .map(|index| GpuInfo {
                index,
                uuid: simulated_uuid(&self.node, index),
                model: model.name().to_owned(),
                memory_total_mib: model.memory_mib(),
                power_limit_mw: Some((model.tdp_w() * 1000.0) as u64),
                nvlink_peers: self.nvlink_peers(index),
            })
            .collect();
        Ok(GpuInventory {
            driver_version: None,
            gpus,
            host: Some(HostCapacity {
                cpu_milli: self.spec.cpu_milli,
                memory_mib: self.spec.memory_mib,
            }),
        })
    }

    fn sample(&mut self) -> Result<Vec<GpuSample>, SourceError> {
        let model = self.spec.model;
        let (tdp_w, idle_w, total_mib) = (model.tdp_w(), model.idle_w(), model.memory_mib());
        let slowdown_c = model.slowdown_temperature_c();
        let node = self.load.take_snapshot();
        let mut samples = Vec::with_capacity(node.gpus.len());
        for (i, state) in node.gpus.into_iter().enumerate() {
            // Draw the same amount of randomness for every GPU in every sample, so one GPU's
            // load does not shift the noise the others see.
            let noise = self.rng.random_range(-LOAD_NOISE_PCT..=LOAD_NOISE_PCT);
            let background = self.background_step(i);
            let (util_pct, allocated_mib, holds_context) = match state.load {
                // A stalled run still holds its memory and CUDA context.
                Some((_, memory)) if node.stalled => (0.0, memory, true),
                Some((0, memory)) => (0.0, memory, false),
                Some((util, memory)) => ((f64::from(util) + noise).clamp(1.0, 100.0), memory, true),
                None => (background, 0, false),
            };
            let util_pct = util_pct.round();
            let memory_used_mib = if holds_context || util_pct > 0.0 {
                allocated_mib + CONTEXT_MIB
            } else {
                allocated_mib
            }
            .min(total_mib);
            let power_w = idle_w + (tdp_w - idle_w) * util_pct / 100.0;
            // Heat follows the work, not a faulty power reading, so a power fault does not
            // also look like a thermal one.
            let mut temperature_c = (AMBIENT_C + RISE_AT_TDP_C * power_w / tdp_w).round() as u32;
            if state.overheating || state.spike {
                temperature_c = temperature_c.max(OVERHEAT_C);
            }
            let power_w = if state.over_power_limit {
                tdp_w * OVER_LIMIT_POWER
            } else {
                power_w
            };
            let mut throttle_reasons = Vec::new();
            if state.over_power_limit {
                throttle_reasons.push("sw_power_cap".to_owned());
            }
            if temperature_c >= slowdown_c {
                throttle_reasons.push("hw_thermal_slowdown".to_owned());
            }
            let index = i as u32;
            let has_nvlink = !self.nvlink_peers(index).is_empty();
            samples.push(GpuSample {
                index,
                uuid: simulated_uuid(&self.node, index),
                utilization_pct: Some(util_pct as u8),
                memory_used_mib,
                memory_total_mib: total_mib,
                temperature_c: Some(temperature_c),
                power_mw: Some((power_w * 1000.0).round() as u64),
                power_limit_mw: Some((tdp_w * 1000.0) as u64),
                ecc_corrected: Some(0),
                ecc_uncorrected: Some(state.ecc_uncorrected),
                xid_errors: Some(state.xid_errors),
                last_xid: state.last_xid,
                xids: state.new_xids,
                slowdown_temperature_c: Some(slowdown_c),
                throttle_reasons,
                rows_remapped_uncorrectable: model
                    .remaps_rows()
                    .then_some(state.rows_remapped_uncorrectable),
                row_remap_failed: model.remaps_rows().then_some(state.row_remap_failed),
                nvlink_errors: has_nvlink.then_some(state.nvlink_errors),
            });
        }
        Ok(samples)
    }
}

#[cfg(test)]
mod tests;
