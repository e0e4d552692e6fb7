//! `allot bench scale` on a small fleet: every service as its own process, a simulated fleet's
//! telemetry, and workloads through to their end, with the bench's own checks that nothing
//! was lost or doubled — what docs/benchmarks.md's scale figures rest on. The journal it writes
//! replays: every decision the live allocator made is recomputed identically.

use crate::support::allot;

#[test]
fn the_scale_bench_runs_every_workload_once_through_every_service_and_bills_every_lease() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("scale.json");
    let journal = dir.path().join("journal.jsonl");
    let (workloads, pipeline_every, nodes) = (150, 10, 16);
    let out = allot(dir.path())
        .args([
            "bench", "scale", "--rate", "30", "--hold", "1s", "--warmup", "10",
        ])
        .args(["--settle", "120s", "--json"])
        .arg(&json)
        .arg("--journal")
        .arg(&journal)
        .args(["--nodes", &nodes.to_string()])
        .args(["--workloads", &workloads.to_string()])
        .args(["--pipeline-every", &pipeline_every.to_string()])
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for check in ["consumers_behind", "gpus_granted_twice", "cost_problems"] {
        assert_eq!(report[check], serde_json::json!([]), "{check}: {text}");
    }
    assert_eq!(report["unfinished"], 0, "{text}");
    assert_eq!(report["failed"], 0, "{text}");
    // Every task granted once: one per workload and two more per pipeline, none preempted
    // (the fleet has room for all of them), and each lease billed.
    let tasks = workloads + 2 * (workloads / pipeline_every);
    assert_eq!(report["tasks_granted"], tasks, "{text}");
    assert_eq!(report["preemptions"], 0, "{text}");
    assert_eq!(report["leases_billed"], tasks, "{text}");
    assert_eq!(report["submit_to_grant_ms"]["n"], workloads - 10, "{text}");
    assert!(
        report["telemetry_sent"].as_u64().unwrap() >= nodes,
        "at least one round of telemetry: {text}"
    );
    let replay = allot(dir.path())
        .args(["replay", "--verify", "--journal"])
        .arg(&journal)
        .output()
        .unwrap();
    let replayed = String::from_utf8_lossy(&replay.stdout);
    assert!(
        replay.status.success(),
        "{replayed}\n{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    // The fleet's nodes, each task's submission and end, and the passes that granted them.
    let entries: usize = replayed
        .split_whitespace()
        .skip_while(|w| *w != "verified:")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("entries applied: {replayed}"));
    assert!(entries > nodes as usize + 2 * tasks, "{replayed}");
    let services = report["services"].as_object().unwrap();
    assert_eq!(services.len(), 8, "{text}");
    for (name, figures) in services {
        assert!(
            figures["peak_rss_mib"].as_f64().unwrap() > 1.0,
            "{name}'s memory was read: {text}"
        );
    }
}
