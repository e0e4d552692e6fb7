use std::time::Duration;

use super::super::Percentiles;
use super::super::process::{cpu_ticks, status_kib};
use super::{FAULT_LASTS, QUIET_START, breaker_cap, schedule};

#[test]
fn the_issues_fleet_gets_its_forty_faults_within_the_circuit_breaker() {
    for (name, nodes, want_cap) in [
        ("the issue's 2,000 nodes: 200 per window", 2_000, 200),
        ("200 nodes: 20", 200, 20),
        ("a tiny fleet may still lose one node", 5, 1),
    ] {
        assert_eq!(breaker_cap(nodes), want_cap, "{name}");
    }
    let faults = schedule(2_000, 8, Duration::from_secs(300), 40, 1).expect("fits");
    assert_eq!(faults.len(), 40);
    assert!(faults.len() <= breaker_cap(2_000));
}

#[test]
fn a_seed_names_the_same_faults_every_time_and_another_seed_others() {
    let run = |seed| schedule(2_000, 8, Duration::from_secs(300), 40, seed).expect("fits");
    assert_eq!(run(1), run(1), "same seed, same faults");
    assert_ne!(run(1), run(2), "another seed, other faults");
}

#[test]
fn faults_fall_on_distinct_nodes_two_distinct_gpus_and_inside_the_run() {
    let duration = Duration::from_secs(60);
    for seed in 0..50 {
        let faults = schedule(200, 8, duration, 20, seed).expect("fits");
        let mut nodes: Vec<usize> = faults.iter().map(|f| f.node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        assert_eq!(nodes.len(), 20, "seed {seed}: one fault per node");
        for f in &faults {
            assert!(f.node < 200, "seed {seed}: {f:?}");
            assert!(
                f.gpus[0] != f.gpus[1] && f.gpus.iter().all(|g| *g < 8),
                "seed {seed}: {f:?}"
            );
            assert!(
                f.at >= QUIET_START && f.at + FAULT_LASTS <= duration,
                "seed {seed}: {f:?} must start after the quiet start and end within the run"
            );
        }
        assert!(
            faults.windows(2).all(|w| w[0].at <= w[1].at),
            "in order of time"
        );
    }
}

#[test]
fn a_schedule_that_cannot_be_kept_is_refused() {
    for (name, nodes, gpus, duration_s, count) in [
        ("a run too short for one fault", 100, 8, 40, 1),
        ("more faults than nodes", 3, 8, 300, 4),
        ("one GPU cannot make two hot", 10, 1, 300, 1),
    ] {
        assert!(
            schedule(nodes, gpus, Duration::from_secs(duration_s), count, 1).is_err(),
            "{name}"
        );
    }
}

#[test]
fn spreads_are_nearest_rank_values_of_the_samples() {
    for (name, samples, want) in [
        ("one sample is every percentile", vec![4.0], (4.0, 4.0, 4.0)),
        (
            "a hundred samples: p99 is the 99th smallest",
            (1..=100).rev().map(f64::from).collect(),
            (50.0, 99.0, 100.0),
        ),
        (
            "ten samples: p99 rounds up to the largest",
            (1..=10).map(f64::from).collect(),
            (5.0, 10.0, 10.0),
        ),
    ] {
        let s = Percentiles::of(samples);
        assert_eq!((s.p50, s.p99, s.max), want, "{name}");
    }
    assert!(
        Percentiles::of(Vec::new()).p99.is_nan(),
        "no samples: no numbers"
    );
}

#[test]
fn proc_figures_are_read_past_an_awkward_command_name() {
    // utime 1234 and stime 56 ticks; the name holds a space and a parenthesis.
    let stat = "4242 (allot (run) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 9 0";
    assert_eq!(cpu_ticks(stat), Some(1_290));
    assert_eq!(cpu_ticks("garbage"), None);
    let status = "Name:\tallot\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
    assert_eq!(status_kib(status, "VmHWM"), Some(204_800));
    assert_eq!(status_kib(status, "VmRSS"), Some(102_400));
    assert_eq!(status_kib(status, "VmSwap"), None);
}
