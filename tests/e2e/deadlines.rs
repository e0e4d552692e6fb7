//! Deadlines live: a task that would miss its deadline waiting its turn is flagged at risk —
//! in `allot queue` and in the journal's waiting decision — and starts ahead of shorter work of
//! its priority, without preempting what runs (waiting for it still keeps the deadline).

use std::collections::BTreeMap;
use std::time::Duration;

use allot_events::{AnyEvent, TaskEvent};
use allot_sched::Decision;

use crate::cluster::Cluster;
use crate::support::{allot, wait_for};

/// One GPU's worth, for `estimate` (`deadline` after submission, if any).
fn spec(name: &str, estimate: &str, deadline: Option<&str>) -> String {
    let deadline = deadline.map_or_else(String::new, |d| format!(", deadline: {d}"));
    format!(
        "apiVersion: allot/v1\nkind: Workload\nmetadata: {{name: {name}, team: vision}}\nspec:\n  \
         tasks:\n    - {{name: run, command: [run], resources: {{gpus: 1}}, durationEstimate: \
         {estimate}{deadline}}}\n"
    )
}

#[test]
fn work_that_would_miss_its_deadline_is_flagged_at_risk_and_starts_ahead_of_shorter_work() {
    // Runs last a fifth of their estimate; the scheduler plans by the estimates.
    let cluster = Cluster::start_simulated(&[("n1", 1)], 5);
    let hold = cluster.submit("hold", &spec("hold", "100s", None));
    cluster.started(&hold, "run", 1);
    // Shortest first, `due` (90 s) would start after `quick` (60 s), once `hold` ends about
    // 100 s from now: at about 160 s, done at 250 — past its deadline at 220 s. First in line
    // it starts at about 100 and is done at 190: at risk, not urgent, so `hold` runs on (and
    // neither is short enough against it to preempt it by gain).
    let quick = cluster.submit("quick", &spec("quick", "60s", None));
    let due = cluster.submit("due", &spec("due", "90s", Some("220s")));

    let last = std::cell::RefCell::new(String::new());
    let rows = wait_for(Duration::from_secs(60), || {
        let out = allot(cluster.dir.path())
            .args(["queue", "--output", "json", "--nats"])
            .arg(cluster.server.url())
            .output()
            .unwrap();
        let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        *last.borrow_mut() = String::from_utf8_lossy(&out.stdout).into_owned();
        let flagged = rows.iter().any(|r| r["at_risk"] == true);
        (out.status.success() && rows.len() == 2 && flagged).then_some(rows)
    })
    .unwrap_or_else(|| {
        panic!(
            "allot queue did not show both waiting, one at risk; last:\n{}\n{}",
            last.borrow(),
            cluster.logs()
        )
    });
    let row = |w: &str| {
        rows.iter()
            .find(|r| r["workload"] == w)
            .unwrap_or_else(|| panic!("{w} in {rows:?}"))
    };
    assert_eq!(row(&due)["at_risk"], true, "{rows:?}");
    assert!(row(&due)["deadline_ms"].as_u64().is_some(), "{rows:?}");
    assert_eq!(row(&quick)["at_risk"], false, "{rows:?}");
    assert_eq!(row(&due)["position"], 1, "at risk goes first: {rows:?}");

    for w in [&hold, &quick, &due] {
        cluster.finished(w);
    }
    let mut ids = BTreeMap::new();
    for e in cluster.workloads() {
        if let AnyEvent::Task(TaskEvent::Ready(r)) = e {
            ids.insert(r.task.id, r.workload.clone());
        }
    }
    let mut granted = Vec::new();
    let mut flagged = Vec::new();
    for a in cluster.journal() {
        for d in &a.entry.decisions {
            match d {
                Decision::Granted { task, .. } => granted.push(ids[task].clone()),
                Decision::Waiting {
                    task,
                    at_risk: true,
                    ..
                } => flagged.push(ids[task].clone()),
                Decision::Preempted { task, .. } => panic!("{} was preempted", ids[task]),
                _ => {}
            }
        }
    }
    flagged.dedup();
    assert_eq!(
        flagged,
        [due.as_str()],
        "waiting decisions flag it, and it alone"
    );
    assert_eq!(granted, [hold, due, quick]);
    cluster.assert_replay_verifies();
}
