//! Fidelity: on `philly-640`, `fifo` and `sjf-oracle` reproduce DESIGN.md's reference values
//! within 1% — the evidence that the simulator and the scheduling core mean what the
//! published schedulers mean.

use std::path::PathBuf;

use allot_sim::{SimConfig, scenario};

fn traces() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    if dir.join("philly/jobs.csv").is_file() {
        Some(dir)
    } else {
        eprintln!("skipped: {} is absent", dir.display());
        None
    }
}

fn within_one_percent(got: f64, want: f64) -> bool {
    (got - want).abs() <= want * 0.01
}

#[test]
fn fifo_and_sjf_oracle_match_the_reference_on_philly_640() {
    let Some(traces) = traces() else { return };
    let scenario = scenario::philly_640(&traces).unwrap();
    assert_eq!(scenario.trace.jobs.len(), 68_503);
    for (policy, want_jct, want_queue) in [
        ("fifo", 29_932.0, Some(18_452.0)),
        ("sjf-oracle", 13_203.0, None),
    ] {
        let result = allot_sim::run(
            &scenario.trace,
            &scenario.nodes,
            allot_sched::policy::by_name(policy).unwrap(),
            &scenario.nominal,
            &SimConfig::default(),
        )
        .unwrap();
        let k = &result.kpis;
        assert_eq!(k.jobs, 68_503, "{policy}");
        assert!(
            within_one_percent(k.avg_jct_s, want_jct),
            "{policy}: avg JCT {} vs {want_jct}",
            k.avg_jct_s
        );
        if let Some(want_queue) = want_queue {
            assert!(
                within_one_percent(k.avg_queue_s, want_queue),
                "{policy}: avg queue {} vs {want_queue}",
                k.avg_queue_s
            );
        }
        assert_eq!(k.preemptions, 0, "{policy} never preempts");
        assert!(k.gpu_allocation_ratio > 0.0 && k.gpu_allocation_ratio <= 1.0);
        assert!(k.wastage_ratio_fit <= k.wastage_ratio);
    }
}
