use super::*;

/// A sample as collectors published it before the health signals (XIDs per sample, slowdown
/// temperature, throttle reasons, row remapping, NVLink errors) were added.
const BEFORE_HEALTH_SIGNALS: &str = r#"{
    "index": 0, "uuid": "GPU-3f2a", "utilization_pct": 87,
    "memory_used_mib": 40000, "memory_total_mib": 81559,
    "temperature_c": 64, "power_mw": 512000, "power_limit_mw": 700000,
    "ecc_corrected": 0, "ecc_uncorrected": 0, "xid_errors": 1, "last_xid": 79
}"#;

#[test]
fn a_sample_from_before_the_health_signals_still_decodes_with_them_absent() {
    let sample: GpuSample = serde_json::from_str(BEFORE_HEALTH_SIGNALS).unwrap();
    assert_eq!(sample.last_xid, Some(79));
    assert_eq!(sample.xids, Vec::<u64>::new());
    assert_eq!(sample.slowdown_temperature_c, None);
    assert_eq!(sample.throttle_reasons, Vec::<String>::new());
    assert_eq!(sample.rows_remapped_uncorrectable, None);
    assert_eq!(sample.row_remap_failed, None);
    assert_eq!(sample.nvlink_errors, None);
}

#[test]
fn absent_health_signals_are_left_out_and_present_ones_round_trip() {
    let old: GpuSample = serde_json::from_str(BEFORE_HEALTH_SIGNALS).unwrap();
    let written = serde_json::to_value(&old).unwrap();
    for key in [
        "xids",
        "slowdown_temperature_c",
        "throttle_reasons",
        "rows_remapped_uncorrectable",
        "row_remap_failed",
        "nvlink_errors",
    ] {
        assert!(written.get(key).is_none(), "{key} written: {written}");
    }

    let full = GpuSample {
        xids: vec![48, 79],
        slowdown_temperature_c: Some(87),
        throttle_reasons: vec!["hw_thermal_slowdown".into()],
        rows_remapped_uncorrectable: Some(3),
        row_remap_failed: Some(true),
        nvlink_errors: Some(12),
        ..old
    };
    let json = serde_json::to_string(&full).unwrap();
    assert_eq!(serde_json::from_str::<GpuSample>(&json).unwrap(), full);
}
