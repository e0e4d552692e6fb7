use super::*;

/// A simulated node with `gpus` GPUs of `model`, idle, seed 7.
fn node(name: &str, gpus: u32, model: GpuModel) -> SimulatedSource {
    SimulatedSource::new(
        name,
        SimSpec {
            gpus,
            model,
            seed: 7,
            ..SimSpec::default()
        },
    )
}

fn sample_of(source: &mut SimulatedSource, index: usize) -> GpuSample {
    source.sample().unwrap().swap_remove(index)
}

#[test]
fn model_names_parse_case_and_separator_insensitively() {
    for (given, want) in [
        ("h100", Ok(GpuModel::H100)),
        ("H100-80GB", Ok(GpuModel::H100)),
        ("A100-40GB", Ok(GpuModel::A100Sxm40)),
        ("a100_80gb", Ok(GpuModel::A100Sxm80)),
        ("v100", Ok(GpuModel::V100)),
        ("V100-32GB", Ok(GpuModel::V100)),
        (" l4 ", Ok(GpuModel::L4)),
        ("t4 16gb", Ok(GpuModel::T4)),
        ("A10", Ok(GpuModel::A10)),
        ("a100", Err(())),
        ("H200", Err(())),
        ("", Err(())),
    ] {
        assert_eq!(given.parse::<GpuModel>().map_err(|_| ()), want, "{given:?}");
    }
}

#[test]
fn an_unknown_model_error_names_the_input_and_lists_every_known_model() {
    let message = "H200".parse::<GpuModel>().unwrap_err().to_string();
    assert!(message.contains("\"H200\""), "{message}");
    for model in GpuModel::ALL {
        assert!(message.contains(model.name()), "{message} lacks {model}");
    }
}

#[test]
fn every_model_round_trips_through_its_name() {
    for model in GpuModel::ALL {
        assert_eq!(model.name().parse::<GpuModel>(), Ok(model));
        assert!(model.idle_w() < model.tdp_w(), "{model}");
    }
}

#[test]
fn the_model_table_carries_the_real_parts_figures() {
    for (model, want_mib, want_tdp_w, want_nvlink, want_remaps_rows) in [
        (GpuModel::H100, 81_559, 700.0, true, true),
        (GpuModel::A100Sxm80, 81_920, 400.0, true, true),
        (GpuModel::A100Sxm40, 40_960, 400.0, true, true),
        (GpuModel::V100, 32_768, 300.0, true, false),
        (GpuModel::L4, 23_034, 72.0, false, true),
        (GpuModel::T4, 15_360, 70.0, false, false),
        (GpuModel::A10, 23_028, 150.0, false, true),
    ] {
        assert_eq!(model.memory_mib(), want_mib, "{model}");
        assert_eq!(model.tdp_w(), want_tdp_w, "{model}");
        assert_eq!(model.has_nvlink(), want_nvlink, "{model}");
        assert_eq!(model.remaps_rows(), want_remaps_rows, "{model}");
        // A GPU at full load (85 °C) must not read as throttling; an overheating one must.
        let slowdown = model.slowdown_temperature_c();
        assert!((86..OVERHEAT_C).contains(&slowdown), "{model}: {slowdown}");
    }
}

#[test]
fn nvlink_models_form_one_all_to_all_domain_and_pcie_models_have_none() {
    for (model, want_peers_of_1) in [
        (GpuModel::H100, vec![0, 2, 3]),
        (GpuModel::A100Sxm40, vec![0, 2, 3]),
        (GpuModel::V100, vec![0, 2, 3]),
        (GpuModel::L4, vec![]),
        (GpuModel::T4, vec![]),
        (GpuModel::A10, vec![]),
    ] {
        let inventory = node("n1", 4, model).describe().unwrap();
        assert_eq!(inventory.gpus[1].nvlink_peers, want_peers_of_1, "{model}");
    }
}

#[test]
fn description_reports_the_spec_and_stable_distinct_uuids() {
    let inventory = node("node-7", 4, GpuModel::H100).describe().unwrap();
    assert_eq!(inventory.gpus.len(), 4);
    assert_eq!(
        inventory.host,
        Some(HostCapacity {
            cpu_milli: SimSpec::default().cpu_milli,
            memory_mib: SimSpec::default().memory_mib,
        })
    );
    let mut uuids: Vec<_> = inventory.gpus.iter().map(|g| g.uuid.clone()).collect();
    for gpu in &inventory.gpus {
        assert_eq!(gpu.model, "H100");
        assert_eq!(gpu.memory_total_mib, 81_559);
        assert_eq!(gpu.power_limit_mw, Some(700_000));
        assert!(
            gpu.uuid.starts_with("GPU-") && gpu.uuid.len() == 40,
            "{}",
            gpu.uuid
        );
    }
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), 4, "uuids must be distinct: {uuids:?}");

    let again = node("node-7", 4, GpuModel::H100).describe().unwrap();
    assert_eq!(again.gpus, inventory.gpus, "a restart must keep the uuids");
    let other = node("node-8", 4, GpuModel::H100).describe().unwrap();
    assert_ne!(other.gpus[0].uuid, inventory.gpus[0].uuid);
}

#[test]
fn utilization_power_and_temperature_rise_with_load() {
    for model in [GpuModel::H100, GpuModel::T4] {
        let mut source = node("n1", 1, model);
        let load = source.load();
        let mut previous: Option<GpuSample> = None;
        for (util, memory) in [(0, 0), (30, 10_000), (60, 12_000), (100, 14_000)] {
            load.set_load(0, util, memory).unwrap();
            let sample = sample_of(&mut source, 0);
            assert!(
                sample.utilization_pct.unwrap().abs_diff(util) <= 2,
                "{model}: want ~{util}%, got {sample:?}"
            );
            let temperature = sample.temperature_c.unwrap();
            assert!((35..=85).contains(&temperature), "{model}: {sample:?}");
            if let Some(previous) = previous {
                assert!(
                    sample.utilization_pct.unwrap() > previous.utilization_pct.unwrap(),
                    "{model}"
                );
                assert!(sample.power_mw > previous.power_mw, "{model}");
                assert!(sample.temperature_c > previous.temperature_c, "{model}");
                assert!(
                    sample.memory_used_mib > memory,
                    "a busy GPU holds context memory"
                );
            }
            previous = Some(sample);
        }
        let full = previous.unwrap();
        assert!(
            full.power_mw.unwrap() <= full.power_limit_mw.unwrap(),
            "{model}"
        );
    }
}

#[test]
fn an_idle_gpu_reads_idle_power_and_no_memory() {
    let mut source = node("n1", 2, GpuModel::H100);
    let sample = sample_of(&mut source, 1);
    assert_eq!(sample.utilization_pct, Some(0));
    assert_eq!(sample.memory_used_mib, 0);
    assert_eq!(sample.power_mw, Some(70_000));
    assert_eq!(sample.temperature_c, Some(36));
}

#[test]
fn clearing_a_load_returns_the_gpu_to_idle() {
    let mut source = node("n1", 1, GpuModel::A10);
    let load = source.load();
    load.set_load(0, 80, 20_000).unwrap();
    assert!(sample_of(&mut source, 0).utilization_pct.unwrap() >= 78);
    load.clear(0).unwrap();
    let sample = sample_of(&mut source, 0);
    assert_eq!(
        (sample.utilization_pct, sample.memory_used_mib),
        (Some(0), 0)
    );
}

#[test]
fn background_load_wanders_around_its_mean_on_idle_gpus() {
    let mut source = SimulatedSource::new(
        "n1",
        SimSpec {
            gpus: 2,
            background_load: 0.3,
            ..SimSpec::default()
        },
    );
    let utils: Vec<u8> = (0..200)
        .map(|_| source.sample().unwrap()[0].utilization_pct.unwrap())
        .collect();
    let mean = utils.iter().map(|&u| f64::from(u)).sum::<f64>() / utils.len() as f64;
    assert!((20.0..=40.0).contains(&mean), "mean {mean}: {utils:?}");
    assert!(
        utils.windows(2).any(|w| w[0] != w[1]),
        "background load must vary"
    );
}

#[test]
fn injected_faults_show_in_the_samples_until_cleared() {
    struct Case {
        name: &'static str,
        faults: &'static [SimFault],
        want_ecc_uncorrected: u64,
        want_xid_errors: u64,
        want_last_xid: Option<u64>,
        want_hot: bool,
    }
    for case in [
        Case {
            name: "no fault",
            faults: &[],
            want_ecc_uncorrected: 0,
            want_xid_errors: 0,
            want_last_xid: None,
            want_hot: false,
        },
        Case {
            name: "two uncorrected ECC errors",
            faults: &[SimFault::EccUncorrected, SimFault::EccUncorrected],
            want_ecc_uncorrected: 2,
            want_xid_errors: 0,
            want_last_xid: None,
            want_hot: false,
        },
        Case {
            name: "XID 48 then XID 79",
            faults: &[SimFault::Xid(48), SimFault::Xid(79)],
            want_ecc_uncorrected: 0,
            want_xid_errors: 2,
            want_last_xid: Some(79),
            want_hot: false,
        },
        Case {
            name: "overheating",
            faults: &[SimFault::Overheat],
            want_ecc_uncorrected: 0,
            want_xid_errors: 0,
            want_last_xid: None,
            want_hot: true,
        },
    ] {
        let mut source = node("n1", 2, GpuModel::H100);
        let load = source.load();
        for &fault in case.faults {
            load.inject_fault(1, fault).unwrap();
        }
        let samples = source.sample().unwrap();
        let (healthy, faulty) = (&samples[0], &samples[1]);
        assert_eq!(
            faulty.ecc_uncorrected,
            Some(case.want_ecc_uncorrected),
            "{}",
            case.name
        );
        assert_eq!(
            faulty.xid_errors,
            Some(case.want_xid_errors),
            "{}",
            case.name
        );
        assert_eq!(faulty.last_xid, case.want_last_xid, "{}", case.name);
        assert_eq!(
            faulty.temperature_c.unwrap() >= 95,
            case.want_hot,
            "{}",
            case.name
        );
        assert_eq!(
            healthy.ecc_uncorrected,
            Some(0),
            "{}: GPU 0 untouched",
            case.name
        );
        assert_eq!(
            healthy.xid_errors,
            Some(0),
            "{}: GPU 0 untouched",
            case.name
        );
        assert!(healthy.temperature_c.unwrap() < 95, "{}", case.name);

        load.clear_faults(1).unwrap();
        let repaired = source.sample().unwrap().swap_remove(1);
        assert_eq!(repaired.ecc_uncorrected, Some(0), "{}", case.name);
        assert!(repaired.temperature_c.unwrap() < 95, "{}", case.name);
        assert_eq!(
            repaired.xid_errors,
            Some(case.want_xid_errors),
            "{}: XIDs count since the collector started",
            case.name
        );
    }
}

#[test]
fn the_load_handle_rejects_gpus_the_node_does_not_have() {
    let source = node("n1", 2, GpuModel::L4);
    let load = source.load();
    let want = UnknownGpu { index: 2, gpus: 2 };
    assert_eq!(load.set_load(2, 50, 1), Err(want.clone()));
    assert_eq!(load.clear(2), Err(want.clone()));
    assert_eq!(load.inject_fault(2, SimFault::Overheat), Err(want.clone()));
    assert_eq!(load.clear_faults(2), Err(want));
    assert_eq!(load.set_load(1, 50, 1), Ok(()));
}

#[test]
fn the_same_seed_gives_the_same_samples_and_another_seed_does_not() {
    let run = |seed: u64| {
        let mut source = SimulatedSource::new(
            "n1",
            SimSpec {
                gpus: 4,
                background_load: 0.5,
                seed,
                ..SimSpec::default()
            },
        );
        let load = source.load();
        load.set_load(2, 70, 30_000).unwrap();
        (0..20)
            .map(|_| source.sample().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
}

#[test]
fn out_of_range_background_load_is_clamped() {
    for (given, want) in [(-1.0, 0.0), (2.0, 1.0), (f64::NAN, 0.0), (0.25, 0.25)] {
        let source = SimulatedSource::new(
            "n1",
            SimSpec {
                background_load: given,
                ..SimSpec::default()
            },
        );
        assert_eq!(source.spec().background_load, want, "{given}");
    }
}

#[test]
fn granted_shares_load_their_gpus_in_proportion_and_the_rest_go_idle() {
    let mut source = node("n1", 3, GpuModel::H100);
    let load = source
        .sim_load()
        .expect("a simulated node has a load handle");
    load.occupy(&std::collections::BTreeMap::from([(0, 1000), (2, 250)]));
    let samples = source.sample().unwrap();
    let whole = &samples[0];
    assert!(whole.utilization_pct.unwrap() >= 90, "{whole:?}");
    let total = GpuModel::H100.memory_mib();
    assert!(
        (total * 79 / 100..=total * 82 / 100).contains(&whole.memory_used_mib),
        "{whole:?}"
    );
    let quarter = &samples[2];
    let pct = quarter.utilization_pct.unwrap();
    assert!((20..=27).contains(&pct), "{quarter:?}");
    assert_eq!(samples[1].utilization_pct, Some(0));
    // The runs ended: every GPU idle again.
    load.occupy(&std::collections::BTreeMap::new());
    assert!(
        source
            .sample()
            .unwrap()
            .iter()
            .all(|s| s.utilization_pct == Some(0) && s.memory_used_mib == 0)
    );
}

#[test]
fn a_healthy_node_reports_the_health_signals_its_model_has() {
    struct Case {
        model: GpuModel,
        gpus: u32,
        want_slowdown_c: u32,
        want_row_remapping: Option<(u64, bool)>,
        want_nvlink_errors: Option<u64>,
    }
    for case in [
        Case {
            model: GpuModel::H100,
            gpus: 4,
            want_slowdown_c: 87,
            want_row_remapping: Some((0, false)),
            want_nvlink_errors: Some(0),
        },
        Case {
            model: GpuModel::H100,
            gpus: 1,
            want_slowdown_c: 87,
            want_row_remapping: Some((0, false)),
            // A lone GPU has no NVLink peer, so no active link.
            want_nvlink_errors: None,
        },
        Case {
            model: GpuModel::V100,
            gpus: 4,
            want_slowdown_c: 87,
            want_row_remapping: None,
            want_nvlink_errors: Some(0),
        },
        Case {
            model: GpuModel::L4,
            gpus: 2,
            want_slowdown_c: 92,
            want_row_remapping: Some((0, false)),
            want_nvlink_errors: None,
        },
        Case {
            model: GpuModel::T4,
            gpus: 2,
            want_slowdown_c: 93,
            want_row_remapping: None,
            want_nvlink_errors: None,
        },
    ] {
        let name = format!("{} × {}", case.gpus, case.model);
        let mut source = node("n1", case.gpus, case.model);
        source.load().set_load(0, 100, 1_000).unwrap();
        for sample in source.sample().unwrap() {
            assert_eq!(
                sample.slowdown_temperature_c,
                Some(case.want_slowdown_c),
                "{name}"
            );
            assert!(
                sample.temperature_c.unwrap() < case.want_slowdown_c,
                "{name}: even a busy GPU keeps a thermal margin: {sample:?}"
            );
            assert_eq!(sample.throttle_reasons, Vec::<String>::new(), "{name}");
            assert_eq!(sample.xids, Vec::<u64>::new(), "{name}");
            assert_eq!(
                sample
                    .rows_remapped_uncorrectable
                    .zip(sample.row_remap_failed),
                case.want_row_remapping,
                "{name}"
            );
            assert_eq!(sample.nvlink_errors, case.want_nvlink_errors, "{name}");
        }
    }
}

#[test]
fn each_fault_shows_in_the_health_signals_for_as_long_as_it_lasts() {
    struct Case {
        name: &'static str,
        fault: SimFault,
        /// The faulty GPU's next sample, then the one after.
        want: fn(&GpuSample, &GpuSample),
    }
    let hot = |s: &GpuSample| {
        s.temperature_c.unwrap() > s.slowdown_temperature_c.unwrap()
            && s.throttle_reasons == ["hw_thermal_slowdown"]
    };
    for case in [
        Case {
            name: "overheating lasts, and reads above the slowdown temperature",
            fault: SimFault::Overheat,
            want: |next, after| {
                for s in [next, after] {
                    assert!(s.temperature_c.unwrap() > s.slowdown_temperature_c.unwrap());
                    assert_eq!(s.throttle_reasons, ["hw_thermal_slowdown"]);
                }
            },
        },
        Case {
            name: "a spike is one hot sample",
            fault: SimFault::Spike,
            want: |next, after| {
                assert!(next.temperature_c.unwrap() > next.slowdown_temperature_c.unwrap());
                assert_eq!(next.throttle_reasons, ["hw_thermal_slowdown"]);
                assert!(after.temperature_c.unwrap() < after.slowdown_temperature_c.unwrap());
                assert!(after.throttle_reasons.is_empty(), "{after:?}");
            },
        },
        Case {
            name: "an XID is listed once and counted for good",
            fault: SimFault::Xid(79),
            want: |next, after| {
                assert_eq!(
                    (next.xids.as_slice(), next.xid_errors, next.last_xid),
                    ([79].as_slice(), Some(1), Some(79))
                );
                assert_eq!(
                    (after.xids.as_slice(), after.xid_errors, after.last_xid),
                    ([].as_slice(), Some(1), Some(79))
                );
            },
        },
        Case {
            name: "power over the limit lasts, capped by software, without heat",
            fault: SimFault::PowerOverLimit,
            want: |next, after| {
                for s in [next, after] {
                    assert!(s.power_mw.unwrap() > s.power_limit_mw.unwrap(), "{s:?}");
                    assert_eq!(s.throttle_reasons, ["sw_power_cap"]);
                    assert!(s.temperature_c.unwrap() < s.slowdown_temperature_c.unwrap());
                }
            },
        },
        Case {
            name: "a row remapping failure lasts",
            fault: SimFault::RowRemapFailure,
            want: |next, after| {
                for s in [next, after] {
                    assert_eq!(
                        (s.rows_remapped_uncorrectable, s.row_remap_failed),
                        (Some(1), Some(true))
                    );
                }
            },
        },
        Case {
            name: "NVLink errors are counted for good",
            fault: SimFault::NvLinkErrors(100),
            want: |next, after| {
                assert_eq!(next.nvlink_errors, Some(100));
                assert_eq!(after.nvlink_errors, Some(100));
            },
        },
        Case {
            name: "an uncorrected ECC error is counted for good",
            fault: SimFault::EccUncorrected,
            want: |next, after| {
                assert_eq!(next.ecc_uncorrected, Some(1));
                assert_eq!(after.ecc_uncorrected, Some(1));
            },
        },
    ] {
        let mut source = node("n1", 2, GpuModel::H100);
        source.load().inject_fault(1, case.fault).unwrap();
        let next = source.sample().unwrap();
        let after = source.sample().unwrap();
        (case.want)(&next[1], &after[1]);
        for healthy in [&next[0], &after[0]] {
            assert!(!hot(healthy), "{}: GPU 0 untouched: {healthy:?}", case.name);
            assert!(healthy.throttle_reasons.is_empty(), "{}", case.name);
            assert!(healthy.xids.is_empty(), "{}", case.name);
            assert_eq!(healthy.row_remap_failed, Some(false), "{}", case.name);
            assert_eq!(healthy.nvlink_errors, Some(0), "{}", case.name);
            assert!(healthy.power_mw <= healthy.power_limit_mw, "{}", case.name);
        }
    }
}

#[test]
fn a_stalled_node_reads_idle_on_the_gpus_its_runs_hold_and_keeps_their_memory() {
    let mut source = node("n1", 3, GpuModel::H100);
    let load = source.load();
    load.occupy(&std::collections::BTreeMap::from([(0, 1000), (1, 500)]));
    let busy = source.sample().unwrap();
    assert!(busy[0].utilization_pct.unwrap() >= 90, "{:?}", busy[0]);

    load.stall();
    for _ in 0..2 {
        let stalled = source.sample().unwrap();
        for index in [0, 1] {
            assert_eq!(stalled[index].utilization_pct, Some(0), "GPU {index}");
            assert_eq!(
                stalled[index].memory_used_mib, busy[index].memory_used_mib,
                "GPU {index}: a hung run still holds its memory"
            );
            assert_eq!(stalled[index].power_mw, Some(70_000), "GPU {index}");
        }
        assert_eq!(stalled[2].memory_used_mib, 0, "the free GPU stays free");
    }
    // Runs that start later on the stalled node do no work either.
    load.occupy(&std::collections::BTreeMap::from([(2, 1000)]));
    assert_eq!(source.sample().unwrap()[2].utilization_pct, Some(0));
}

#[test]
fn a_partition_is_a_flag_the_collector_reads_and_leaves_the_samples_alone() {
    let mut source = node("n1", 2, GpuModel::H100);
    let load = source.load();
    let before = node("n1", 2, GpuModel::H100).sample().unwrap();
    assert!(!load.is_partitioned());
    load.partition();
    assert!(load.is_partitioned());
    assert!(
        source.sim_load().unwrap().is_partitioned(),
        "every handle of the node sees it"
    );
    assert_eq!(source.sample().unwrap(), before);
}
