//! Chargeback end to end: a cluster of `allot run` processes runs a preempted batch job, the
//! critical job that preempted it and a fractional-GPU job; `allot run billing` prices the
//! journal, and `allot costs` reports totals equal, to the micro-unit, to lease time × price
//! computed independently from the journal, and equal to the sum of the cost events.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_events::alloc::Applied;
use allot_events::workload::WorkloadOutcome;
use allot_events::{AnyEvent, CostEvent};
use allot_sched::{Decision, LeaseId};

use crate::cluster::{Cluster, PATIENCE, PREEMPTIBLE_BATCH};
use crate::support::{allot, wait_for};

/// examples/prices.yaml: an H100-hour, in micro-units.
const H100_HOUR: i128 = 2_900_000;

/// Lease time × price for every lease in the journal, per team: each lease's GPU milli × ms ×
/// price ÷ (1000 × 3,600,000), rounded down once.
fn expected(journal: &[Applied], teams: &BTreeMap<String, String>) -> BTreeMap<String, i64> {
    let mut open: BTreeMap<LeaseId, (u64, u64, String)> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for a in journal {
        for d in &a.entry.decisions {
            match d {
                Decision::Granted { lease, at, .. } => {
                    let g = a.dispatch.iter().find(|g| g.lease == *lease).unwrap();
                    assert!(
                        g.nodes
                            .iter()
                            .all(|n| n.gpu_model == "H100" && n.cpu_milli == 0)
                    );
                    let milli = g
                        .nodes
                        .iter()
                        .flat_map(|n| &n.gpus)
                        .map(|(_, m)| u64::from(*m))
                        .sum();
                    open.insert(*lease, (*at, milli, teams[&g.launch.workload].clone()));
                }
                Decision::Released { lease, at, .. } | Decision::Preempted { lease, at, .. } => {
                    let (from, milli, team) = open.remove(lease).unwrap();
                    let amount =
                        i128::from(milli) * i128::from(at - from) * H100_HOUR / 3_600_000_000;
                    *out.entry(team).or_default() += amount as i64;
                }
                _ => {}
            }
        }
    }
    out
}

fn costs_json(cluster: &Cluster, args: &[&str]) -> serde_json::Value {
    let out = allot(cluster.dir.path())
        .args(["costs", "--format", "json", "--nats", &cluster.server.url()])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn costs_of_a_run_equal_lease_time_times_price_to_the_micro_unit() {
    let mut cluster = Cluster::start(&[("n1", 4)]);
    cluster.billing();
    let batch = cluster.submit("batch", PREEMPTIBLE_BATCH);
    cluster.started(&batch, "sweep", 1);
    std::thread::sleep(Duration::from_millis(700));
    let urgent = cluster.submit(
        "urgent",
        r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: urgent, team: vision, priorityClass: critical}
spec:
  tasks:
    - name: fix
      resources: {gpus: 4}
      command: [sh, -c, "sleep 1.2"]
"#,
    );
    let small = cluster.submit(
        "small",
        r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: probe, team: vision}
spec:
  tasks:
    - name: probe
      resources: {gpuFraction: "0.25"}
      command: [sh, -c, "sleep 0.8"]
"#,
    );
    for id in [&batch, &urgent, &small] {
        assert_eq!(cluster.finished(id).outcome, WorkloadOutcome::Succeeded);
    }
    let journal = cluster.journal();
    assert!(
        journal
            .iter()
            .flat_map(|a| &a.entry.decisions)
            .any(|d| matches!(d, Decision::Preempted { .. })),
        "the batch job was preempted"
    );
    let teams = BTreeMap::from([
        (batch.clone(), "nlp".to_owned()),
        (urgent.clone(), "vision".to_owned()),
        (small.clone(), "vision".to_owned()),
    ]);
    let want = expected(&journal, &teams);
    let want_total: i64 = want.values().sum();
    assert!(want_total > 0);

    // Billing catches up with the journal; then the report is exact.
    let report = wait_for(PATIENCE, || {
        let r = costs_json(&cluster, &["--by", "team"]);
        (r["total_micros"].as_i64() == Some(want_total)).then_some(r)
    })
    .unwrap_or_else(|| {
        panic!(
            "costs never reached {want_total}: {}\n{}",
            costs_json(&cluster, &["--by", "team"]),
            cluster.logs()
        )
    });
    let rows: BTreeMap<String, i64> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["amount_micros"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows, want);
    assert_eq!(report["currency"], "EUR");

    // The report's total is the sum of the events, whatever the grouping or filter.
    let events: i64 = cluster
        .events("COSTS")
        .into_iter()
        .filter_map(|e| match e {
            AnyEvent::Cost(CostEvent::Accrued(c)) => Some(c.amount),
            _ => None,
        })
        .sum();
    assert_eq!(events, want_total);
    let by_model = costs_json(&cluster, &["--by", "gpu-model"]);
    assert_eq!(by_model["total_micros"].as_i64(), Some(want_total));
    assert_eq!(by_model["rows"][0]["key"], "gpu:H100");
    let nlp = costs_json(&cluster, &["--team", "nlp", "--by", "workload"]);
    assert_eq!(nlp["total_micros"].as_i64(), Some(want["nlp"]));
    assert_eq!(nlp["rows"][0]["key"], format!("nlp/{batch}"));
}
