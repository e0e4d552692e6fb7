//! [`NvmlApi`] over the real library. Only exercised on machines with a GPU; what it returns is
//! mapped (and tested) in the parent module.

use std::sync::OnceLock;

use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_UNC};
use nvml_wrapper::{Device, EventSet, Nvml};

use super::{
    DeviceFacts, DeviceReadings, MemoryReading, NvLinkReading, NvmlApi, Reading, RowRemapping,
    XidEvent,
};

/// NVML, initialised once for the life of the process.
///
/// Devices and event sets borrow the library handle, and the collector needs them until it
/// exits, so the handle lives in a static; that also keeps repeated initialisation (one per
/// `select_source` call) from stacking up library references.
static NVML: OnceLock<Nvml> = OnceLock::new();

fn nvml() -> Result<&'static Nvml, NvmlError> {
    if let Some(nvml) = NVML.get() {
        return Ok(nvml);
    }
    let nvml = Nvml::init()?;
    // If another thread won the race, its handle is kept and this one is shut down on drop.
    Ok(NVML.get_or_init(|| nvml))
}

/// NVLink ports NVML reports per GPU at most (`NVML_NVLINK_MAX_LINKS` in `nvml.h`).
const MAX_NVLINKS: u32 = 18;

/// Events drained per sample at most, so an XID storm cannot stall telemetry.
const MAX_EVENTS_PER_SAMPLE: usize = 1024;

/// The real NVML library.
#[derive(Debug)]
pub(crate) struct RealNvml {
    nvml: &'static Nvml,
    /// Critical-XID events of the GPUs that support them, when any do.
    xid_events: Option<EventSet<'static>>,
    /// Which GPUs (by index) are registered in `xid_events`.
    counts_xids: Vec<bool>,
}

impl RealNvml {
    /// Loads `libnvidia-ml`, initialises it and subscribes to critical XID events.
    pub(crate) fn init() -> Result<Self, NvmlError> {
        let nvml = nvml()?;
        let count = nvml.device_count()?;
        let (xid_events, counts_xids) = subscribe_to_xids(nvml, count);
        Ok(Self {
            nvml,
            xid_events,
            counts_xids,
        })
    }
}

/// Registers every GPU that supports critical-XID events in one event set.
///
/// NVML frees the whole set when a registration fails, so one failure turns XID counting off
/// for the node (samples then carry no `xid_errors`) rather than leaving a half-known state.
#[cfg(target_os = "linux")]
fn subscribe_to_xids(nvml: &'static Nvml, count: u32) -> (Option<EventSet<'static>>, Vec<bool>) {
    use nvml_wrapper::bitmasks::event::EventTypes;

    let mut registered = vec![false; count as usize];
    let mut set = match nvml.create_event_set() {
        Ok(set) => set,
        Err(e) => {
            tracing::warn!(error = %e, "cannot create an NVML event set; XID errors will not be counted");
            return (None, registered);
        }
    };
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let supported = device
            .supported_event_types()
            .is_ok_and(|types| types.contains(EventTypes::CRITICAL_XID_ERROR));
        if !supported {
            tracing::info!(
                gpu = index,
                "GPU does not report XID events; its XID errors will not be counted"
            );
            continue;
        }
        match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(same_set) => {
                set = same_set;
                registered[index as usize] = true;
            }
            Err(e) => {
                tracing::warn!(
                    gpu = index,
                    error = %e,
                    "cannot subscribe to XID events; XID errors will not be counted on this node"
                );
                return (None, vec![false; count as usize]);
            }
        }
    }
    (Some(set), registered)
}

/// NVML events exist on Linux only.
#[cfg(not(target_os = "linux"))]
fn subscribe_to_xids(_: &'static Nvml, count: u32) -> (Option<EventSet<'static>>, Vec<bool>) {
    (None, vec![false; count as usize])
}

/// The GPU's active NVLinks and what each one reaches.
///
/// `NvLink::remote_device_type` is not used to tell switches from GPUs: in nvml-wrapper 0.13
/// it writes NVML's answer into a temporary and always returns `Unknown`. The parent module
/// tells them apart by PCI bus id instead.
fn active_nvlinks(device: &Device<'_>) -> Vec<NvLinkReading> {
    (0..MAX_NVLINKS)
        .filter_map(|link| {
            let nvlink = device.link_wrapper_for(link);
            // Inactive, absent (`InvalidArg`) and unsupported (`NotSupported`) links all
            // connect nothing.
            if !matches!(nvlink.is_active(), Ok(true)) {
                return None;
            }
            Some(NvLinkReading {
                link,
                remote_pci_bus_id: nvlink.remote_pci_info().map(|pci| pci.bus_id),
            })
        })
        .collect()
}

/// The NVLink error counters NVML keeps per link.
const NVLINK_ERROR_COUNTERS: [ErrorCounter; 4] = [
    ErrorCounter::DlCrcFlit,
    ErrorCounter::DlCrcData,
    ErrorCounter::DlReplay,
    ErrorCounter::DlRecovery,
];

/// Every error counter of every active NVLink of the GPU.
fn nvlink_error_counters(device: &Device<'_>) -> Vec<Reading<u64>> {
    (0..MAX_NVLINKS)
        .map(|link| device.link_wrapper_for(link))
        .filter(|nvlink| matches!(nvlink.is_active(), Ok(true)))
        .flat_map(|nvlink| NVLINK_ERROR_COUNTERS.map(|counter| nvlink.error_counter(counter)))
        .collect()
}

/// Row remapping through NVML's field values (`nvml-wrapper` 0.13 has no safe wrapper for
/// `nvmlDeviceGetRemappedRows`; these fields are what it reads). One answer for both fields,
/// as the query they stand for gives: the first failure of either is the reading's.
fn row_remapping(device: &Device<'_>) -> Reading<RowRemapping> {
    let mut fields = device
        .field_values_for(&[
            FieldId(NVML_FI_DEV_REMAPPED_UNC),
            FieldId(NVML_FI_DEV_REMAPPED_FAILURE),
        ])?
        .into_iter();
    let mut next = || -> Reading<u64> {
        let sample: FieldValueSample = fields.next().ok_or(NvmlError::Unknown)??;
        match sample.value? {
            SampleValue::U32(v) => Ok(u64::from(v)),
            SampleValue::U64(v) => Ok(v),
            SampleValue::I64(v) => u64::try_from(v).map_err(|_| NvmlError::Unknown),
            SampleValue::F64(_) => Err(NvmlError::Unknown),
        }
    };
    let uncorrectable_rows = next()?;
    let failure_occurred = next()? != 0;
    Ok(RowRemapping {
        uncorrectable_rows,
        failure_occurred,
    })
}

impl NvmlApi for RealNvml {
    fn driver_version(&self) -> Reading<String> {
        self.nvml.sys_driver_version()
    }

    fn device_count(&self) -> Reading<u32> {
        self.nvml.device_count()
    }

    fn device_facts(&self, index: u32) -> Reading<DeviceFacts> {
        let device = self.nvml.device_by_index(index)?;
        Ok(DeviceFacts {
            name: device.name(),
            uuid: device.uuid(),
            pci_bus_id: device.pci_info().map(|pci| pci.bus_id),
            memory_total_bytes: device.memory_info().map(|m| m.total),
            power_limit_mw: device.enforced_power_limit(),
            nvlinks: active_nvlinks(&device),
        })
    }

    fn device_readings(&self, index: u32) -> Reading<DeviceReadings> {
        let device = self.nvml.device_by_index(index)?;
        Ok(DeviceReadings {
            uuid: device.uuid(),
            memory: device.memory_info().map(|m| MemoryReading {
                total_bytes: m.total,
                used_bytes: m.used,
            }),
            utilization_gpu_pct: device.utilization_rates().map(|u| u.gpu),
            temperature_c: device.temperature(TemperatureSensor::Gpu),
            power_mw: device.power_usage(),
            power_limit_mw: device.enforced_power_limit(),
            ecc_corrected: device.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile),
            ecc_uncorrected: device
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
            slowdown_temperature_c: device.temperature_threshold(TemperatureThreshold::Slowdown),
            throttle_reasons: device.current_throttle_reasons(),
            row_remapping: row_remapping(&device),
            nvlink_error_counters: nvlink_error_counters(&device),
        })
    }

    fn counts_xids(&self, index: u32) -> bool {
        self.counts_xids
            .get(index as usize)
            .copied()
            .unwrap_or(false)
    }

    fn take_xid_events(&mut self) -> Vec<XidEvent> {
        use nvml_wrapper::enums::event::XidError;

        let Some(set) = &self.xid_events else {
            return Vec::new();
        };
        let mut events = Vec::new();
        while events.len() < MAX_EVENTS_PER_SAMPLE {
            match set.wait(0) {
                Ok(data) => match data.device.index() {
                    Ok(index) => events.push(XidEvent {
                        index,
                        xid: match data.event_data {
                            Some(XidError::Value(code)) => Some(code),
                            Some(XidError::Unknown) | None => None,
                        },
                    }),
                    Err(e) => tracing::warn!(error = %e, "XID event from a GPU NVML cannot index"),
                },
                // Nothing (more) pending.
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "reading NVML events failed; trying again next sample");
                    break;
                }
            }
        }
        events
    }
}
