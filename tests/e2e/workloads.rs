//! `allot workloads` and `allot workload ID` as a user runs them: two workloads submitted, one
//! finished and one running, listed, filtered by state, and shown with the nodes and GPUs
//! their tasks ran on; then the planner stopped, and said so.

use std::process::Output;
use std::time::Duration;

use allot_events::query::planner::{WorkloadDetail, WorkloadList, WorkloadState};

use crate::cluster::{Cluster, PATIENCE};
use crate::support::{allot, wait_for};

/// CPU preparation, then two GPUs.
const PIPELINE: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: pipeline, team: vision}
spec:
  tasks:
    - name: prep
      resources: {cpu: "1"}
      command: [sh, -c, "echo prepared"]
    - name: train
      resources: {gpus: 2, cpu: "1"}
      command: [sh, -c, "sleep 0.2"]
      after: [prep]
"#;

/// One GPU, far longer than the test.
const SERVING: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: serving, team: nlp}
spec:
  tasks:
    - name: serve
      resources: {gpus: 1}
      command: [sh, -c, "sleep 600"]
"#;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `allot <args> --nats URL`.
fn run(cluster: &Cluster, args: &[&str]) -> Output {
    allot(cluster.dir.path())
        .args(args)
        .args(["--nats", &cluster.server.url()])
        .output()
        .unwrap()
}

/// Runs `allot <args> --nats URL --output json` and reads its answer.
fn json<T: serde::de::DeserializeOwned>(cluster: &Cluster, args: &[&str]) -> T {
    let out = run(cluster, &[args, &["--output", "json"]].concat());
    assert!(
        out.status.success(),
        "allot {args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn ids(list: &WorkloadList) -> Vec<&str> {
    list.workloads.iter().map(|w| w.id.as_str()).collect()
}

#[test]
fn workloads_are_listed_filtered_by_state_and_shown_with_the_nodes_their_tasks_ran_on() {
    let mut cluster = Cluster::start(&[("n1", 4)]);
    let pipeline = cluster.submit("pipeline", PIPELINE);
    let serving = cluster.submit("serving", SERVING);
    cluster.finished(&pipeline);
    wait_for(PATIENCE, || {
        let list: WorkloadList = json(&cluster, &["workloads", "--state", "running"]);
        (list.workloads.first()?.tasks.running == 1).then_some(())
    })
    .unwrap_or_else(|| panic!("serving never ran; logs:\n{}", cluster.logs()));

    // Newest first; each state filter finds its own.
    let all: WorkloadList = json(&cluster, &["workloads"]);
    assert_eq!(ids(&all), [&serving, &pipeline]);
    assert_eq!(
        all.workloads.iter().map(|w| w.state).collect::<Vec<_>>(),
        [WorkloadState::Running, WorkloadState::Succeeded]
    );
    assert_eq!(all.workloads[1].submitter, "ci@test");
    for (state, want) in [
        ("running", vec![&serving]),
        ("succeeded", vec![&pipeline]),
        ("failed", vec![]),
    ] {
        let list: WorkloadList = json(&cluster, &["workloads", "--state", state]);
        assert_eq!(ids(&list), want, "--state {state}");
    }
    let vision: WorkloadList = json(&cluster, &["workloads", "--team", "vision"]);
    assert_eq!(ids(&vision), [&pipeline]);
    let newest: WorkloadList = json(&cluster, &["workloads", "--since", "10m", "--limit", "1"]);
    assert_eq!(ids(&newest), [&serving]);
    assert!(newest.next_cursor.is_some());

    let table = run(&cluster, &["workloads"]);
    assert!(table.status.success(), "{}", text(&table.stderr));
    let table = text(&table.stdout);
    let row = |id: &str| {
        table
            .lines()
            .find(|l| l.trim_start().starts_with(id))
            .unwrap_or_else(|| panic!("no row for {id}:\n{table}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        row(&pipeline)[1..4],
        ["vision", "succeeded", "2/2"],
        "{table}"
    );
    assert_eq!(row(&serving)[1..4], ["nlp", "running", "0/1"], "{table}");
    assert!(
        table.contains(" ago "),
        "submission times read as ages:\n{table}"
    );

    // One workload: its tasks in order, on the node and GPUs they were granted.
    let detail: WorkloadDetail = json(&cluster, &["workload", &pipeline]);
    let tasks: Vec<(&str, &str, Vec<&str>, usize)> = detail
        .tasks
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.state.as_str(),
                t.nodes.iter().map(|n| n.node.as_str()).collect(),
                t.nodes.iter().map(|n| n.gpus.len()).sum(),
            )
        })
        .collect();
    assert_eq!(
        tasks,
        [
            ("prep", "succeeded", vec!["n1"], 0),
            ("train", "succeeded", vec!["n1"], 2)
        ]
    );
    assert!(
        detail
            .tasks
            .iter()
            .all(|t| t.ended_at >= t.started_at && t.ended_at.is_some())
    );
    let shown = run(&cluster, &["workload", &serving]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    let shown = text(&shown.stdout);
    let serve = shown
        .lines()
        .find(|l| l.trim_start().starts_with("serve "))
        .unwrap_or_else(|| panic!("no row for serve:\n{shown}"));
    assert_eq!(
        serve.split_whitespace().take(4).collect::<Vec<_>>(),
        ["serve", "running", "1/1", "n1"],
        "{shown}"
    );
    assert!(serve.contains("so far"), "{shown}");

    // Mistakes: an unknown id is exit 1, a bad flag exit 2.
    let unknown = run(&cluster, &["workload", "nothing-0000000000"]);
    assert_eq!(unknown.status.code(), Some(1), "{}", text(&unknown.stderr));
    assert!(
        text(&unknown.stderr).contains("no workload nothing-0000000000"),
        "{}",
        text(&unknown.stderr)
    );
    for bad in [
        &["workloads", "--state", "sleeping"][..],
        &["workloads", "--since", "yesterday"],
        &["workloads", "--limit", "0"],
        &["workloads", "--output", "xml"],
    ] {
        let out = run(&cluster, bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
    }

    // Without a planner, it says so.
    cluster.kill("planner");
    let out = wait_for(Duration::from_secs(10), || {
        let out = run(&cluster, &["workloads"]);
        (!out.status.success()).then_some(out)
    })
    .expect("listing fails once the planner is gone");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("is it running?"),
        "{}",
        text(&out.stderr)
    );
}
