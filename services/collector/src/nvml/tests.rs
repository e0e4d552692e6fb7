use std::sync::{Arc, Mutex};

use super::*;

const GIB: u64 = 1024 * 1024 * 1024;

/// One fake GPU, built with `gpu("…")` and the methods below.
#[derive(Debug, Clone)]
struct FakeGpu {
    uuid: String,
    bus_id: String,
    /// Far ends of the active NVLinks (PCI bus ids).
    links_to: Vec<String>,
    not_supported: Vec<&'static str>,
    /// Readings the driver has no call for (too old).
    not_in_driver: Vec<&'static str>,
    lost: bool,
    counts_xids: bool,
    throttle_reasons: ThrottleReasons,
    row_remapping: RowRemapping,
    /// Each active link's CRC flit, CRC data, replay and recovery error counters.
    nvlink_counters: [u64; 4],
}

/// The names under which the fake answers each NVLink error counter.
const NVLINK_COUNTERS: [&str; 4] = [
    "nvlink_crc_flit",
    "nvlink_crc_data",
    "nvlink_replay",
    "nvlink_recovery",
];

fn gpu(bus_id: &str) -> FakeGpu {
    FakeGpu {
        uuid: format!("GPU-{bus_id}"),
        bus_id: bus_id.to_owned(),
        links_to: Vec::new(),
        not_supported: Vec::new(),
        not_in_driver: Vec::new(),
        lost: false,
        counts_xids: true,
        throttle_reasons: ThrottleReasons::GPU_IDLE,
        row_remapping: RowRemapping {
            uncorrectable_rows: 0,
            failure_occurred: false,
        },
        nvlink_counters: [0; 4],
    }
}

impl FakeGpu {
    fn links_to(mut self, remotes: &[&str]) -> Self {
        self.links_to = remotes.iter().map(|s| (*s).to_owned()).collect();
        self
    }
    /// The named readings answer `NotSupported`.
    fn lacks(mut self, readings: &[&'static str]) -> Self {
        self.not_supported = readings.to_vec();
        self
    }
    /// Every reading answers `GpuLost`.
    fn lost(mut self) -> Self {
        self.lost = true;
        self
    }
    /// The named readings are calls the driver does not have.
    fn old_driver_lacks(mut self, readings: &[&'static str]) -> Self {
        self.not_in_driver = readings.to_vec();
        self
    }
    fn without_xid_events(mut self) -> Self {
        self.counts_xids = false;
        self
    }
    fn throttled(mut self, reasons: ThrottleReasons) -> Self {
        self.throttle_reasons = reasons;
        self
    }
    fn remapped(mut self, uncorrectable_rows: u64, failure_occurred: bool) -> Self {
        self.row_remapping = RowRemapping {
            uncorrectable_rows,
            failure_occurred,
        };
        self
    }
    /// Every active link reports these CRC flit, CRC data, replay and recovery errors.
    fn nvlink_counters(mut self, counters: [u64; 4]) -> Self {
        self.nvlink_counters = counters;
        self
    }

    fn read<T>(&self, what: &str, value: T) -> Reading<T> {
        if self.lost {
            Err(NvmlError::GpuLost)
        } else if self.not_supported.contains(&what) {
            Err(NvmlError::NotSupported)
        } else if self.not_in_driver.contains(&what) {
            Err(NvmlError::FailedToLoadSymbol(format!(
                "nvmlDeviceGet_{what}"
            )))
        } else {
            Ok(value)
        }
    }
}

/// An NVML whose GPUs and pending XID events the test controls.
#[derive(Debug, Clone, Default)]
struct FakeNvml {
    gpus: Vec<FakeGpu>,
    xid_events: Arc<Mutex<Vec<XidEvent>>>,
}

impl FakeNvml {
    fn with(gpus: Vec<FakeGpu>) -> Self {
        Self {
            gpus,
            ..Self::default()
        }
    }
    fn push_xid(&self, index: u32, xid: Option<u64>) {
        self.xid_events
            .lock()
            .unwrap()
            .push(XidEvent { index, xid });
    }
    fn gpu(&self, index: u32) -> Reading<&FakeGpu> {
        self.gpus.get(index as usize).ok_or(NvmlError::InvalidArg)
    }
}

impl NvmlApi for FakeNvml {
    fn driver_version(&self) -> Reading<String> {
        Ok("550.54.15".to_owned())
    }
    fn device_count(&self) -> Reading<u32> {
        Ok(self.gpus.len() as u32)
    }
    fn device_facts(&self, index: u32) -> Reading<DeviceFacts> {
        let g = self.gpu(index)?;
        Ok(DeviceFacts {
            name: g.read("name", "NVIDIA H100 80GB HBM3".to_owned()),
            uuid: g.read("uuid", g.uuid.clone()),
            pci_bus_id: g.read("pci", g.bus_id.clone()),
            memory_total_bytes: g.read("memory", 80 * GIB),
            power_limit_mw: g.read("power_limit", 700_000),
            nvlinks: g
                .links_to
                .iter()
                .enumerate()
                .map(|(link, remote)| NvLinkReading {
                    link: link as u32,
                    remote_pci_bus_id: g.read("nvlink_remote", remote.clone()),
                })
                .collect(),
        })
    }
    fn device_readings(&self, index: u32) -> Reading<DeviceReadings> {
        let g = self.gpu(index)?;
        Ok(DeviceReadings {
            uuid: g.read("uuid", g.uuid.clone()),
            memory: g.read(
                "memory",
                MemoryReading {
                    total_bytes: 80 * GIB,
                    used_bytes: 10 * GIB,
                },
            ),
            utilization_gpu_pct: g.read("utilization", 87),
            temperature_c: g.read("temperature", 64),
            power_mw: g.read("power", 512_345),
            power_limit_mw: g.read("power_limit", 700_000),
            ecc_corrected: g.read("ecc", 3),
            ecc_uncorrected: g.read("ecc", 0),
            slowdown_temperature_c: g.read("slowdown", 87),
            throttle_reasons: g.read("throttle", g.throttle_reasons),
            row_remapping: g.read("row_remapping", g.row_remapping),
            nvlink_error_counters: g
                .links_to
                .iter()
                .flat_map(|_| {
                    NVLINK_COUNTERS
                        .iter()
                        .zip(g.nvlink_counters)
                        .map(|(what, count)| g.read(what, count))
                })
                .collect(),
        })
    }
    fn counts_xids(&self, index: u32) -> bool {
        self.gpu(index).is_ok_and(|g| g.counts_xids)
    }
    fn take_xid_events(&mut self) -> Vec<XidEvent> {
        std::mem::take(&mut *self.xid_events.lock().unwrap())
    }
}

fn source(fake: &FakeNvml) -> NvmlSource {
    NvmlSource::with_api(Box::new(fake.clone()))
}

#[test]
fn a_fully_supported_gpu_maps_every_reading() {
    let fake = FakeNvml::with(vec![
        gpu("00000000:18:00.0")
            .links_to(&["0:c0:0.0", "0:c1:0.0"])
            .nvlink_counters([1, 2, 3, 4])
            .throttled(ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_THERMAL_SLOWDOWN)
            .remapped(2, false),
    ]);
    fake.push_xid(0, Some(48));
    let mut source = source(&fake);
    let inventory = source.describe().unwrap();
    assert_eq!(inventory.driver_version.as_deref(), Some("550.54.15"));
    assert_eq!(
        inventory.host, None,
        "NVML nodes report the host's own capacity"
    );
    assert_eq!(
        inventory.gpus,
        vec![GpuInfo {
            index: 0,
            uuid: "GPU-00000000:18:00.0".to_owned(),
            model: "NVIDIA H100 80GB HBM3".to_owned(),
            memory_total_mib: 81_920,
            power_limit_mw: Some(700_000),
            nvlink_peers: vec![],
        }]
    );
    assert_eq!(
        source.sample().unwrap(),
        vec![GpuSample {
            index: 0,
            uuid: "GPU-00000000:18:00.0".to_owned(),
            utilization_pct: Some(87),
            memory_used_mib: 10_240,
            memory_total_mib: 81_920,
            temperature_c: Some(64),
            power_mw: Some(512_345),
            power_limit_mw: Some(700_000),
            ecc_corrected: Some(3),
            ecc_uncorrected: Some(0),
            xid_errors: Some(1),
            last_xid: Some(48),
            xids: vec![48],
            slowdown_temperature_c: Some(87),
            throttle_reasons: vec!["sw_power_cap".to_owned(), "hw_thermal_slowdown".to_owned()],
            rows_remapped_uncorrectable: Some(2),
            row_remap_failed: Some(false),
            nvlink_errors: Some(2 * (1 + 2 + 3 + 4)),
        }]
    );
}

#[test]
fn readings_a_gpu_does_not_support_are_absent_not_zero() {
    struct Case {
        name: &'static str,
        lacks: &'static [&'static str],
        check: fn(&GpuSample),
    }
    for case in [
        Case {
            name: "no temperature thresholds",
            lacks: &["slowdown"],
            check: |s| assert_eq!(s.slowdown_temperature_c, None),
        },
        Case {
            name: "no clocks event reasons",
            lacks: &["throttle"],
            check: |s| assert_eq!(s.throttle_reasons, Vec::<String>::new()),
        },
        Case {
            name: "no row remapping (before Ampere)",
            lacks: &["row_remapping"],
            check: |s| {
                assert_eq!(
                    (s.rows_remapped_uncorrectable, s.row_remap_failed),
                    (None, None)
                );
            },
        },
        Case {
            name: "NVLinks without error counters",
            lacks: &NVLINK_COUNTERS,
            check: |s| assert_eq!(s.nvlink_errors, None),
        },
        Case {
            name: "no ECC (consumer board or ECC off)",
            lacks: &["ecc"],
            check: |s| assert_eq!((s.ecc_corrected, s.ecc_uncorrected), (None, None)),
        },
        Case {
            name: "no power sensor",
            lacks: &["power", "power_limit"],
            check: |s| assert_eq!((s.power_mw, s.power_limit_mw), (None, None)),
        },
        Case {
            name: "no temperature",
            lacks: &["temperature"],
            check: |s| assert_eq!(s.temperature_c, None),
        },
        Case {
            name: "no utilization (MIG mode)",
            lacks: &["utilization"],
            check: |s| assert_eq!(s.utilization_pct, None),
        },
    ] {
        let throttled = ThrottleReasons::SW_POWER_CAP;
        let full = gpu("0:1:0.0")
            .links_to(&["0:c0:0.0"])
            .nvlink_counters([1, 1, 1, 1])
            .throttled(throttled);
        for (how, gpu) in [
            ("not supported", full.clone().lacks(case.lacks)),
            (
                "not in the driver",
                full.clone().old_driver_lacks(case.lacks),
            ),
        ] {
            let fake = FakeNvml::with(vec![gpu]);
            let samples = source(&fake)
                .sample()
                .unwrap_or_else(|e| panic!("{} ({how}): {e}", case.name));
            (case.check)(&samples[0]);
            assert_eq!(samples[0].memory_used_mib, 10_240, "{}", case.name);
        }
    }
}

#[test]
fn throttle_reasons_are_named_and_resting_or_operator_set_clocks_are_not_reasons() {
    for (given, want) in [
        (ThrottleReasons::empty(), vec![]),
        (ThrottleReasons::NONE, vec![]),
        (ThrottleReasons::GPU_IDLE, vec![]),
        (ThrottleReasons::APPLICATIONS_CLOCKS_SETTING, vec![]),
        (ThrottleReasons::SW_POWER_CAP, vec!["sw_power_cap"]),
        (ThrottleReasons::HW_SLOWDOWN, vec!["hw_slowdown"]),
        (
            ThrottleReasons::HW_THERMAL_SLOWDOWN,
            vec!["hw_thermal_slowdown"],
        ),
        (
            ThrottleReasons::SW_THERMAL_SLOWDOWN,
            vec!["sw_thermal_slowdown"],
        ),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            vec!["hw_power_brake"],
        ),
        (ThrottleReasons::SYNC_BOOST, vec!["sync_boost"]),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            vec!["display_clock_setting"],
        ),
        (
            ThrottleReasons::GPU_IDLE
                | ThrottleReasons::HW_SLOWDOWN
                | ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            vec!["hw_slowdown", "hw_power_brake"],
        ),
    ] {
        let fake = FakeNvml::with(vec![gpu("0:1:0.0").throttled(given)]);
        let sample = source(&fake).sample().unwrap().swap_remove(0);
        assert_eq!(sample.throttle_reasons, want, "{given:?}");
    }
}

#[test]
fn a_failed_row_remapping_is_reported_with_the_remapped_rows() {
    let fake = FakeNvml::with(vec![gpu("0:1:0.0").remapped(7, true), gpu("0:2:0.0")]);
    let samples = source(&fake).sample().unwrap();
    assert_eq!(
        (
            samples[0].rows_remapped_uncorrectable,
            samples[0].row_remap_failed
        ),
        (Some(7), Some(true))
    );
    assert_eq!(
        (
            samples[1].rows_remapped_uncorrectable,
            samples[1].row_remap_failed
        ),
        (Some(0), Some(false)),
        "a GPU that remaps rows and has none remapped reports zero, not nothing"
    );
}

#[test]
fn nvlink_errors_sum_every_supported_counter_of_every_active_link() {
    struct Case {
        name: &'static str,
        gpu: FakeGpu,
        want_nvlink_errors: Option<u64>,
    }
    for case in [
        Case {
            name: "no NVLink (PCIe only)",
            gpu: gpu("0:1:0.0").nvlink_counters([5, 5, 5, 5]),
            want_nvlink_errors: None,
        },
        Case {
            name: "clean links count zero, not nothing",
            gpu: gpu("0:1:0.0").links_to(&["0:c0:0.0", "0:c1:0.0"]),
            want_nvlink_errors: Some(0),
        },
        Case {
            name: "three links, every counter",
            gpu: gpu("0:1:0.0")
                .links_to(&["0:c0:0.0", "0:c1:0.0", "0:c2:0.0"])
                .nvlink_counters([10, 1, 2, 0]),
            want_nvlink_errors: Some(3 * 13),
        },
        Case {
            name: "CRC data not kept (Hopper): the others still count",
            gpu: gpu("0:1:0.0")
                .links_to(&["0:c0:0.0", "0:c1:0.0"])
                .nvlink_counters([10, 1000, 2, 1])
                .lacks(&["nvlink_crc_data"]),
            want_nvlink_errors: Some(2 * 13),
        },
    ] {
        let fake = FakeNvml::with(vec![case.gpu]);
        let sample = source(&fake).sample().unwrap().swap_remove(0);
        assert_eq!(
            sample.nvlink_errors, case.want_nvlink_errors,
            "{}",
            case.name
        );
    }
}

#[test]
fn a_gpu_without_a_power_limit_still_registers() {
    let fake = FakeNvml::with(vec![gpu("0:1:0.0").lacks(&["power_limit"])]);
    let inventory = source(&fake).describe().unwrap();
    assert_eq!(inventory.gpus[0].power_limit_mw, None);
}

#[test]
fn a_lost_gpu_fails_the_sample_naming_the_gpu_and_the_reading() {
    let fake = FakeNvml::with(vec![gpu("0:1:0.0"), gpu("0:2:0.0").lost()]);
    let mut source = source(&fake);
    let error = source.sample().unwrap_err();
    assert!(
        matches!(
            error,
            SourceError::Gpu {
                index: 1,
                source: NvmlError::GpuLost,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("GPU 1"), "{error}");
    assert!(source.describe().is_err(), "a lost GPU cannot be described");
}

#[test]
fn missing_required_facts_are_errors_not_blanks() {
    let fake = FakeNvml::with(vec![gpu("0:1:0.0").lacks(&["uuid"])]);
    let error = source(&fake).describe().unwrap_err();
    assert!(error.to_string().contains("uuid of GPU 0"), "{error}");
}

#[test]
fn nvlink_peers_resolve_to_local_indices_by_pci_bus_id() {
    struct Case {
        name: &'static str,
        gpus: Vec<FakeGpu>,
        want_peers: Vec<Vec<u32>>,
    }
    for case in [
        Case {
            name: "PCIe only",
            gpus: vec![gpu("0:1a:0.0"), gpu("0:1b:0.0")],
            want_peers: vec![vec![], vec![]],
        },
        Case {
            name: "an NVLink bridge between two GPUs, bus ids spelled differently",
            gpus: vec![
                gpu("00000000:1A:00.0").links_to(&["0000:1b:00.0", "0000:1b:00.0"]),
                gpu("00000000:1B:00.0").links_to(&["0000:1a:00.0"]),
                gpu("00000000:1C:00.0"),
            ],
            want_peers: vec![vec![1], vec![0], vec![]],
        },
        Case {
            name: "a link reported by one side only still pairs both",
            gpus: vec![gpu("0:1:0.0").links_to(&["0:2:0.0"]), gpu("0:2:0.0")],
            want_peers: vec![vec![1], vec![0]],
        },
        Case {
            name: "hybrid cube-mesh: direct links only, not their closure",
            gpus: vec![
                gpu("0:1:0.0").links_to(&["0:2:0.0"]),
                gpu("0:2:0.0").links_to(&["0:1:0.0", "0:3:0.0"]),
                gpu("0:3:0.0").links_to(&["0:2:0.0"]),
            ],
            want_peers: vec![vec![1], vec![0, 2], vec![1]],
        },
        Case {
            name: "NVSwitch: GPUs linked to the same switch are all peers",
            gpus: vec![
                gpu("0:1:0.0").links_to(&["0:c0:0.0", "0:c1:0.0"]),
                gpu("0:2:0.0").links_to(&["0:c0:0.0", "0:c1:0.0"]),
                gpu("0:3:0.0").links_to(&["0:c1:0.0"]),
                gpu("0:4:0.0"),
            ],
            want_peers: vec![vec![1, 2], vec![0, 2], vec![0, 1], vec![]],
        },
        Case {
            name: "a link whose far end NVML cannot read is ignored",
            gpus: vec![
                gpu("0:1:0.0")
                    .links_to(&["0:2:0.0"])
                    .lacks(&["nvlink_remote"]),
                gpu("0:2:0.0"),
            ],
            want_peers: vec![vec![], vec![]],
        },
        Case {
            name: "a loopback link is not a peer",
            gpus: vec![gpu("0:1:0.0").links_to(&["0:1:0.0"])],
            want_peers: vec![vec![]],
        },
    ] {
        let fake = FakeNvml::with(case.gpus);
        let inventory = source(&fake).describe().unwrap();
        let peers: Vec<Vec<u32>> = inventory.gpus.into_iter().map(|g| g.nvlink_peers).collect();
        assert_eq!(peers, case.want_peers, "{}", case.name);
    }
}

#[test]
fn xid_events_are_counted_per_gpu_since_the_collector_started() {
    let fake = FakeNvml::with(vec![
        gpu("0:1:0.0"),
        gpu("0:2:0.0"),
        gpu("0:3:0.0").without_xid_events(),
    ]);
    let mut source = source(&fake);
    let xids = |samples: &[GpuSample]| -> Vec<(Option<u64>, Option<u64>)> {
        samples.iter().map(|s| (s.xid_errors, s.last_xid)).collect()
    };
    let new_xids = |samples: &[GpuSample]| -> Vec<Vec<u64>> {
        samples.iter().map(|s| s.xids.clone()).collect()
    };

    assert_eq!(
        xids(&source.sample().unwrap()),
        [(Some(0), None), (Some(0), None), (None, None)],
        "no events yet; GPU 2 cannot report XIDs at all"
    );

    fake.push_xid(1, Some(48));
    fake.push_xid(1, Some(79));
    let samples = source.sample().unwrap();
    assert_eq!(
        xids(&samples),
        [(Some(0), None), (Some(2), Some(79)), (None, None)]
    );
    assert_eq!(
        new_xids(&samples),
        [vec![], vec![48, 79], vec![]],
        "the codes that arrived since the last sample, in order"
    );

    fake.push_xid(1, None);
    fake.push_xid(9, Some(13));
    let samples = source.sample().unwrap();
    assert_eq!(
        xids(&samples),
        [(Some(0), None), (Some(3), Some(79)), (None, None)],
        "an unknown code keeps the last known one; events from unknown GPUs are dropped"
    );
    assert_eq!(
        new_xids(&samples),
        [Vec::<u64>::new(), vec![], vec![]],
        "codes already reported are not repeated, and an unknown code is counted, not listed"
    );
}

#[test]
fn pci_bus_ids_compare_by_value_not_spelling() {
    for (a, b, want_same) in [
        ("00000000:1A:00.0", "0000:1a:00.0", true),
        ("0:1a:0.0", "00000000:1A:00.0", true),
        ("00000000:1A:00.0", "00000000:1B:00.0", false),
        ("not-a-bus-id", "NOT-A-BUS-ID", true),
    ] {
        assert_eq!(
            normalize_bus_id(a) == normalize_bus_id(b),
            want_same,
            "{a} vs {b}"
        );
    }
}

#[test]
fn a_missing_driver_library_is_reported_as_unavailable() {
    // No NVIDIA driver on this machine; on a GPU node this test checks nothing.
    if let Err(e) = NvmlSource::init() {
        assert!(matches!(e, SourceError::NvmlUnavailable { .. }), "{e:?}");
        assert!(
            !e.to_string().contains("a libloading error occurred"),
            "{e}"
        );
    }
}
