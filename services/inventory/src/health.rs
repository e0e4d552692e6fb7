//! GPU health from telemetry: pure rules, so they can be tested as a table and explained.

use allot_events::inventory::GpuHealth;
use allot_events::telemetry::GpuSample;

/// Temperature at or above which a GPU is degraded (NVIDIA parts throttle around here).
pub const HOT_C: u32 = 90;

/// XID codes that mean the GPU must not take work until an operator or remediation acts:
/// double-bit ECC (48), row-remapping failures (63, 64), NVLink errors (74), fallen off the bus
/// (79), ECC-unrecoverable / contained errors (92, 94, 95) and GSP errors (119, 120).
pub const FATAL_XIDS: &[u64] = &[48, 63, 64, 74, 79, 92, 94, 95, 119, 120];

/// The health a sample shows, with the reason in words an operator can act on.
pub fn judge(sample: &GpuSample) -> (GpuHealth, String) {
    if let Some(n) = sample.ecc_uncorrected.filter(|n| *n > 0) {
        return (GpuHealth::Unhealthy, format!("{n} uncorrected ECC errors"));
    }
    if let (Some(count), Some(xid)) = (sample.xid_errors, sample.last_xid)
        && count > 0
        && FATAL_XIDS.contains(&xid)
    {
        return (
            GpuHealth::Unhealthy,
            format!("fatal XID {xid} ({count} XID errors)"),
        );
    }
    if let Some(t) = sample.temperature_c.filter(|t| *t >= HOT_C) {
        return (
            GpuHealth::Degraded,
            format!("temperature {t} °C (≥ {HOT_C} °C)"),
        );
    }
    (GpuHealth::Healthy, String::new())
}

/// The stored form of a health value.
pub fn as_str(h: GpuHealth) -> &'static str {
    match h {
        GpuHealth::Healthy => "healthy",
        GpuHealth::Degraded => "degraded",
        GpuHealth::Unhealthy => "unhealthy",
    }
}

/// Parses the stored form; unknown text reads as unhealthy (fail safe).
pub fn parse(s: &str) -> GpuHealth {
    match s {
        "healthy" => GpuHealth::Healthy,
        "degraded" => GpuHealth::Degraded,
        _ => GpuHealth::Unhealthy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> GpuSample {
        GpuSample {
            index: 0,
            uuid: "GPU-0".into(),
            utilization_pct: Some(50),
            memory_used_mib: 1000,
            memory_total_mib: 80_000,
            temperature_c: Some(60),
            power_mw: Some(300_000),
            power_limit_mw: Some(700_000),
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
        }
    }

    #[test]
    fn health_follows_the_worst_symptom() {
        struct Case {
            name: &'static str,
            sample: GpuSample,
            want: GpuHealth,
            want_reason: &'static str,
        }
        let cases = [
            Case {
                name: "a normal GPU is healthy",
                sample: sample(),
                want: GpuHealth::Healthy,
                want_reason: "",
            },
            Case {
                name: "readings the device does not support are not symptoms",
                sample: GpuSample {
                    temperature_c: None,
                    ecc_uncorrected: None,
                    xid_errors: None,
                    ..sample()
                },
                want: GpuHealth::Healthy,
                want_reason: "",
            },
            Case {
                name: "hot is degraded",
                sample: GpuSample {
                    temperature_c: Some(93),
                    ..sample()
                },
                want: GpuHealth::Degraded,
                want_reason: "temperature 93 °C",
            },
            Case {
                name: "uncorrected ECC is unhealthy even when hot",
                sample: GpuSample {
                    ecc_uncorrected: Some(2),
                    temperature_c: Some(95),
                    ..sample()
                },
                want: GpuHealth::Unhealthy,
                want_reason: "2 uncorrected ECC errors",
            },
            Case {
                name: "a fatal XID is unhealthy",
                sample: GpuSample {
                    xid_errors: Some(1),
                    last_xid: Some(79),
                    ..sample()
                },
                want: GpuHealth::Unhealthy,
                want_reason: "fatal XID 79",
            },
            Case {
                name: "an application XID (13, graphics exception) is not the GPU's fault",
                sample: GpuSample {
                    xid_errors: Some(3),
                    last_xid: Some(13),
                    ..sample()
                },
                want: GpuHealth::Healthy,
                want_reason: "",
            },
        ];
        for case in cases {
            let (got, reason) = judge(&case.sample);
            assert_eq!(got, case.want, "{}", case.name);
            assert!(reason.contains(case.want_reason), "{}: {reason}", case.name);
        }
    }
}
