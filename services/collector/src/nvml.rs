//! Real GPUs, read through NVML (`nvml-wrapper`, which loads `libnvidia-ml` at run time).
//!
//! The NVML calls sit behind the small `NvmlApi` trait, implemented for the real library by
//! `real::RealNvml`; everything that turns NVML's answers into Allot's events lives here, in
//! [`NvmlSource`], and is tested against a fake:
//! - a reading the device does not support (`NotSupported`) is absent, not zero, and not an
//!   error; any other failure is an error naming the GPU and the reading;
//! - NVLink peers are resolved to local GPU indices by PCI bus id: a link to another local GPU
//!   makes the two peers, and GPUs whose links end at the same non-GPU device (an NVSwitch)
//!   are all peers of each other;
//! - XID errors are counted from NVML's critical-XID events on GPUs that support them, and are
//!   absent on GPUs that do not; each sample also lists the codes that arrived since the last;
//! - the health signals — the slowdown temperature (for the thermal margin), the clocks event
//!   (throttle) reasons by name, row remapping, and NVLink error counters summed over the
//!   active links — are read every sample, each absent where the GPU does not support it.

mod real;

use std::collections::{BTreeSet, HashMap};

use allot_events::node::{GpuInfo, GpuSourceKind};
use allot_events::telemetry::GpuSample;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::error::NvmlError;

use crate::source::{GpuInventory, GpuSource, SourceError};

/// One NVML answer: the value, or why NVML could not give it.
pub(crate) type Reading<T> = Result<T, NvmlError>;

/// The NVML calls the collector makes. Every reading is returned as NVML gave it, so that
/// mapping errors to "absent" is decided (and tested) in one place.
pub(crate) trait NvmlApi: Send + std::fmt::Debug {
    /// The system's driver version.
    fn driver_version(&self) -> Reading<String>;
    /// How many GPUs NVML sees.
    fn device_count(&self) -> Reading<u32>;
    /// Static facts of GPU `index`; fails only when the device handle cannot be had.
    fn device_facts(&self, index: u32) -> Reading<DeviceFacts>;
    /// Current readings of GPU `index`; fails only when the device handle cannot be had.
    fn device_readings(&self, index: u32) -> Reading<DeviceReadings>;
    /// Whether critical-XID events are being counted for GPU `index`.
    fn counts_xids(&self, index: u32) -> bool;
    /// The critical-XID events that arrived since the last call, oldest first.
    fn take_xid_events(&mut self) -> Vec<XidEvent>;
}

/// What [`NvmlApi::device_facts`] reads once, at registration.
#[derive(Debug)]
pub(crate) struct DeviceFacts {
    pub name: Reading<String>,
    pub uuid: Reading<String>,
    /// This GPU's PCI bus id, e.g. `00000000:18:00.0`.
    pub pci_bus_id: Reading<String>,
    pub memory_total_bytes: Reading<u64>,
    pub power_limit_mw: Reading<u32>,
    /// The GPU's active NVLinks only.
    pub nvlinks: Vec<NvLinkReading>,
}

/// One active NVLink of a GPU.
#[derive(Debug)]
pub(crate) struct NvLinkReading {
    /// The link number on the GPU (for logs).
    pub link: u32,
    /// PCI bus id of the device at the far end: another GPU, or an NVSwitch.
    pub remote_pci_bus_id: Reading<String>,
}

/// What [`NvmlApi::device_readings`] reads every telemetry tick.
#[derive(Debug)]
pub(crate) struct DeviceReadings {
    pub uuid: Reading<String>,
    pub memory: Reading<MemoryReading>,
    /// `utilization.gpu`, percent.
    pub utilization_gpu_pct: Reading<u32>,
    /// The GPU die sensor, °C.
    pub temperature_c: Reading<u32>,
    pub power_mw: Reading<u32>,
    pub power_limit_mw: Reading<u32>,
    /// Volatile (since driver load) totals.
    pub ecc_corrected: Reading<u64>,
    pub ecc_uncorrected: Reading<u64>,
    /// The `Slowdown` temperature threshold, °C.
    pub slowdown_temperature_c: Reading<u32>,
    /// The current clocks event (throttle) reasons.
    pub throttle_reasons: Reading<ThrottleReasons>,
    /// Row remapping, on GPUs that remap rows (Ampere and later).
    pub row_remapping: Reading<RowRemapping>,
    /// Every error counter of every active NVLink: one reading per link and counter.
    pub nvlink_error_counters: Vec<Reading<u64>>,
}

/// What NVML's remapped-rows query reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowRemapping {
    /// Rows remapped because of uncorrectable errors.
    pub uncorrectable_rows: u64,
    /// A remapping failed: no spare row was left.
    pub failure_occurred: bool,
}

/// Framebuffer memory, bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemoryReading {
    pub total_bytes: u64,
    pub used_bytes: u64,
}

/// One critical-XID event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct XidEvent {
    /// The GPU it happened on.
    pub index: u32,
    /// The XID code, when NVML knew it.
    pub xid: Option<u64>,
}

/// XIDs seen on one GPU since the collector started.
#[derive(Debug, Clone, Copy, Default)]
struct XidTally {
    count: u64,
    last: Option<u64>,
}

/// The clocks event reasons a sample reports, and their names. `GPU_IDLE` and the
/// applications (user-defined) clocks setting are left out: they are the GPU resting and the
/// operator's choice, not trouble.
const THROTTLE_REASONS: [(ThrottleReasons, &str); 7] = [
    (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
    (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
    (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
    (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
    (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake"),
    (ThrottleReasons::SYNC_BOOST, "sync_boost"),
    (
        ThrottleReasons::DISPLAY_CLOCK_SETTING,
        "display_clock_setting",
    ),
];

/// The names of the reasons in `reasons` that a sample reports, in [`THROTTLE_REASONS`] order.
fn throttle_reason_names(reasons: ThrottleReasons) -> Vec<String> {
    THROTTLE_REASONS
        .iter()
        .filter(|(flag, _)| reasons.contains(*flag))
        .map(|(_, name)| (*name).to_owned())
        .collect()
}

/// The sum of the NVLink error counters the GPU supports; `None` when it supports none (or has
/// no active link).
fn nvlink_errors(counters: Vec<Reading<u64>>, index: u32) -> Result<Option<u64>, SourceError> {
    let mut total: Option<u64> = None;
    for counter in counters {
        if let Some(count) = optional(counter, index, "NVLink error counters")? {
            total = Some(total.unwrap_or(0).saturating_add(count));
        }
    }
    Ok(total)
}

/// A [`GpuSource`] reading the node's real GPUs through NVML.
#[derive(Debug)]
pub struct NvmlSource {
    api: Box<dyn NvmlApi>,
    xids: Vec<XidTally>,
}

impl NvmlSource {
    /// Loads and initialises NVML; fails with [`SourceError::NvmlUnavailable`] on a machine
    /// without the NVIDIA driver.
    pub fn init() -> Result<Self, SourceError> {
        match real::RealNvml::init() {
            Ok(api) => Ok(Self::with_api(Box::new(api))),
            Err(e) => Err(SourceError::NvmlUnavailable {
                reason: match e {
                    // Say "libnvidia-ml.so: cannot open shared object file …" rather than
                    // wrapping it in nvml-wrapper's "a libloading error occurred".
                    NvmlError::LibloadingError(inner) => inner.to_string(),
                    other => other.to_string(),
                },
            }),
        }
    }

    pub(crate) fn with_api(api: Box<dyn NvmlApi>) -> Self {
        Self {
            api,
            xids: Vec::new(),
        }
    }

    fn device_count(&self) -> Result<u32, SourceError> {
        self.api.device_count().map_err(|source| SourceError::Nvml {
            query: "device count",
            source,
        })
    }

    /// Folds the XID events that arrived since the last sample into the per-GPU tallies, and
    /// returns each GPU's new codes (by index, oldest first).
    fn tally_xids(&mut self, count: u32) -> Vec<Vec<u64>> {
        if self.xids.len() < count as usize {
            self.xids.resize(count as usize, XidTally::default());
        }
        let mut new = vec![Vec::new(); self.xids.len()];
        for event in self.api.take_xid_events() {
            if let Some(tally) = self.xids.get_mut(event.index as usize) {
                tally.count += 1;
                tally.last = event.xid.or(tally.last);
                new[event.index as usize].extend(event.xid);
            }
        }
        new
    }
}

/// A reading the device may legitimately lack: `NotSupported` makes it absent, and so does a
/// driver too old to have the call at all (the symbol or the function is missing).
fn optional<T>(
    reading: Reading<T>,
    index: u32,
    query: &'static str,
) -> Result<Option<T>, SourceError> {
    match reading {
        Ok(value) => Ok(Some(value)),
        Err(
            NvmlError::NotSupported
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_),
        ) => Ok(None),
        Err(source) => Err(SourceError::Gpu {
            index,
            query,
            source,
        }),
    }
}

/// A reading every GPU has: any failure is an error.
fn required<T>(reading: Reading<T>, index: u32, query: &'static str) -> Result<T, SourceError> {
    reading.map_err(|source| SourceError::Gpu {
        index,
        query,
        source,
    })
}

fn bytes_to_mib(bytes: u64) -> u64 {
    bytes / (1024 * 1024)
}

/// A PCI bus id in one spelling (`0000:18:00.0` and `00000000:18:00.0` are the same device).
fn normalize_bus_id(bus_id: &str) -> String {
    let parse = || -> Option<String> {
        let (domain, rest) = bus_id.trim().split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.')?;
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        Some(format!(
            "{:08x}:{:02x}:{:02x}.{:x}",
            hex(domain)?,
            hex(bus)?,
            hex(device)?,
            hex(function)?
        ))
    };
    parse().unwrap_or_else(|| bus_id.trim().to_ascii_lowercase())
}

/// Each GPU's NVLink peers (local indices, ascending), from every GPU's facts (by index).
///
/// A link whose far end is another local GPU makes the two peers (in both directions, in case
/// only one side reported it). A far end that is not a local GPU is an NVSwitch: every GPU with
/// a link to the same switch is a peer of every other.
fn resolve_nvlink_peers(devices: &[DeviceFacts]) -> Vec<Vec<u32>> {
    let gpu_at: HashMap<String, u32> = devices
        .iter()
        .enumerate()
        .filter_map(|(i, d)| Some((normalize_bus_id(d.pci_bus_id.as_ref().ok()?), i as u32)))
        .collect();
    let mut peers = vec![BTreeSet::new(); devices.len()];
    let mut on_switch: HashMap<String, BTreeSet<u32>> = HashMap::new();
    for (i, device) in devices.iter().enumerate() {
        let i = i as u32;
        for link in &device.nvlinks {
            let Ok(remote) = &link.remote_pci_bus_id else {
                tracing::debug!(
                    gpu = i,
                    link = link.link,
                    "NVLink far end unknown; link ignored"
                );
                continue;
            };
            let remote = normalize_bus_id(remote);
            match gpu_at.get(&remote) {
                Some(&j) if j != i => {
                    peers[i as usize].insert(j);
                    peers[j as usize].insert(i);
                }
                Some(_) => {}
                None => {
                    on_switch.entry(remote).or_default().insert(i);
                }
            }
        }
    }
    for members in on_switch.values() {
        for &i in members {
            peers[i as usize].extend(members.iter().copied().filter(|&j| j != i));
        }
    }
    peers.into_iter().map(|p| p.into_iter().collect()).collect()
}

impl GpuSource for NvmlSource {
    fn kind(&self) -> GpuSourceKind {
        GpuSourceKind::Nvml
    }

    fn describe(&mut self) -> Result<GpuInventory, SourceError> {
        let driver_version = match self.api.driver_version() {
            Ok(version) => Some(version),
            Err(e) => {
                tracing::warn!(error = %e, "NVML did not report the driver version");
                None
            }
        };
        let count = self.device_count()?;
        let facts = (0..count)
            .map(|index| required(self.api.device_facts(index), index, "device handle"))
            .collect::<Result<Vec<_>, _>>()?;
        let peers = resolve_nvlink_peers(&facts);
        let gpus = facts
            .into_iter()
            .zip(peers)
            .enumerate()
            .map(|(i, (facts, nvlink_peers))| {
                let index = i as u32;
                Ok(GpuInfo {
                    index,
                    uuid: required(facts.uuid, index, "uuid")?,
                    model: required(facts.name, index, "name")?,
                    memory_total_mib: bytes_to_mib(required(
                        facts.memory_total_bytes,
                        index,
                        "memory size",
                    )?),
                    power_limit_mw: optional(facts.power_limit_mw, index, "power limit")?
                        .map(u64::from),
                    nvlink_peers,
                })
            })
            .collect::<Result<Vec<_>, SourceError>>()?;
        Ok(GpuInventory {
            driver_version,
            gpus,
            host: None,
        })
    }

    fn sample(&mut self) -> Result<Vec<GpuSample>, SourceError> {
        let count = self.device_count()?;
        let mut new_xids = self.tally_xids(count);
        (0..count)
            .map(|index| {
                let r = required(self.api.device_readings(index), index, "device handle")?;
                let memory = required(r.memory, index, "memory usage")?;
                let xids = self.xids[index as usize];
                let row_remapping = optional(r.row_remapping, index, "remapped rows")?;
                Ok(GpuSample {
                    index,
                    uuid: required(r.uuid, index, "uuid")?,
                    // A GPU that cannot report utilization (MIG mode, for one) reports none
                    // rather than a misleading 0 %.
                    utilization_pct: optional(r.utilization_gpu_pct, index, "utilization")?
                        .map(|pct| pct.min(100) as u8),
                    memory_used_mib: bytes_to_mib(memory.used_bytes),
                    memory_total_mib: bytes_to_mib(memory.total_bytes),
                    temperature_c: optional(r.temperature_c, index, "temperature")?,
                    power_mw: optional(r.power_mw, index, "power usage")?.map(u64::from),
                    power_limit_mw: optional(r.power_limit_mw, index, "power limit")?
                        .map(u64::from),
                    ecc_corrected: optional(r.ecc_corrected, index, "corrected ECC errors")?,
                    ecc_uncorrected: optional(r.ecc_uncorrected, index, "uncorrected ECC errors")?,
                    xid_errors: self.api.counts_xids(index).then_some(xids.count),
                    last_xid: xids.last,
                    xids: std::mem::take(&mut new_xids[index as usize]),
                    slowdown_temperature_c: optional(
                        r.slowdown_temperature_c,
                        index,
                        "slowdown temperature threshold",
                    )?,
                    throttle_reasons: optional(r.throttle_reasons, index, "throttle reasons")?
                        .map(throttle_reason_names)
                        .unwrap_or_default(),
                    rows_remapped_uncorrectable: row_remapping.map(|r| r.uncorrectable_rows),
                    row_remap_failed: row_remapping.map(|r| r.failure_occurred),
                    nvlink_errors: nvlink_errors(r.nvlink_error_counters, index)?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
