//! Remediation live: an operator's cordon keeps work off a node until it is lifted, and a node
//! that stops heartbeating (its collector SIGSTOPped) has its tasks requeued and run elsewhere,
//! and takes no work again until it has been healthy for the rule's time — all through the
//! real services on a real nats-server, each action an event `allot remediation log` shows.

use std::time::{Duration, Instant};

use allot_events::{AnyEvent, RemediationEvent, TaskEvent};
use allot_sched::Decision;

use crate::cluster::Cluster;
use crate::support::{allot, wait_for};

/// One GPU for `estimate`, checkpointing every `every`.
fn spec(name: &str, estimate: &str) -> String {
    format!(
        "apiVersion: allot/v1\nkind: Workload\nmetadata: {{name: {name}, team: vision}}\nspec:\n  \
         tasks:\n    - {{name: run, command: [run], resources: {{gpus: 1}}, durationEstimate: \
         {estimate}, checkpoint: {{supported: true, interval: 1m}}}}\n"
    )
}

/// The node each grant in the journal went to, in order: (workload, node).
fn grants(cluster: &Cluster) -> Vec<(String, String)> {
    let mut names = std::collections::BTreeMap::new();
    for e in cluster.workloads() {
        if let AnyEvent::Task(TaskEvent::Ready(r)) = e {
            names.insert(r.task.id, r.workload.clone());
        }
    }
    let mut out = Vec::new();
    for a in cluster.journal() {
        for d in &a.entry.decisions {
            if let Decision::Granted { task, .. } = d {
                let node = a
                    .dispatch
                    .iter()
                    .find(|x| x.task == *task)
                    .and_then(|x| x.nodes.first())
                    .map(|s| s.node.clone())
                    .unwrap_or_default();
                out.push((names.get(task).cloned().unwrap_or_default(), node));
            }
        }
    }
    out
}

/// A cluster of `n1` and `n2` (one GPU each) whose heartbeat-lost rule waits `silence` and
/// returns a node after `clear_after`, and the way to start its remediation service (again).
fn silent_node_cluster(silence: &str, clear_after: &str) -> (Cluster, impl Fn(&mut Cluster)) {
    let cluster = Cluster::start_simulated(&[("n1", 1), ("n2", 1)], 5);
    let rules = cluster.path("rules.yaml");
    std::fs::write(
        &rules,
        format!(
            "rules:\n  - {{name: heartbeat-lost, signal: heartbeat-lost, for: {silence}, \
             clearAfter: {clear_after}, action: drain}}\n"
        ),
    )
    .unwrap();
    let data = cluster.path("remediation");
    let start = move |cluster: &mut Cluster| {
        cluster.spawn(
            "remediation",
            &[
                "remediation",
                "--data-dir",
                data.to_str().unwrap(),
                "--rules",
                rules.to_str().unwrap(),
            ],
        );
    };
    (cluster, start)
}

/// Sends SIG`name` to process `pid`.
fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}");
}

fn run_cli(cluster: &Cluster, args: &[&str]) -> std::process::Output {
    allot(cluster.dir.path())
        .args(args)
        .args(["--nats", &cluster.server.url()])
        .output()
        .unwrap()
}

#[test]
fn an_operators_cordon_keeps_new_work_off_a_node_until_it_is_lifted() {
    let mut cluster = Cluster::start_simulated(&[("n1", 1), ("n2", 1)], 5);
    let inventory = cluster.path("inventory");
    cluster.spawn(
        "inventory",
        &["inventory", "--data-dir", inventory.to_str().unwrap()],
    );
    wait_for(Duration::from_secs(30), || {
        let out = run_cli(&cluster, &["status", "--json"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (text.contains("\"n1\"") && text.contains("\"n2\"")).then_some(())
    })
    .unwrap_or_else(|| panic!("the inventory never knew both nodes\n{}", cluster.logs()));
    // A typo is refused, naming what the inventory knows; nothing is published.
    let out = run_cli(&cluster, &["cordon", "n3", "--reason", "fan swap"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(
        why.contains("knows no node \"n3\"") && why.contains("n1, n2"),
        "{why}"
    );
    let out = run_cli(&cluster, &["cordon", "n1", "--reason", "fan swap"]);
    assert!(out.status.success(), "{out:?}");
    // Both nodes are free; the cordoned one gets nothing.
    let first = cluster.submit("first", &spec("first", "600s"));
    let second = cluster.submit("second", &spec("second", "600s"));
    cluster.started(&first, "run", 1);
    let status = wait_for(Duration::from_secs(30), || {
        let out = run_cli(&cluster, &["status", "--json"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("fan swap").then_some(text)
    })
    .unwrap_or_else(|| panic!("allot status never showed the cordon\n{}", cluster.logs()));
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let n1 = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "n1")
        .unwrap();
    assert_eq!(n1["state"], "cordoned", "{n1}");
    std::thread::sleep(Duration::from_secs(3));
    let before: Vec<(String, String)> = grants(&cluster);
    assert_eq!(
        before.len(),
        1,
        "one task waits for the cordoned node: {before:?}"
    );
    assert_eq!(before[0].1, "n2");

    let out = run_cli(&cluster, &["uncordon", "n1"]);
    assert!(out.status.success(), "{out:?}");
    let after = wait_for(Duration::from_secs(30), || {
        let g = grants(&cluster);
        (g.len() == 2).then_some(g)
    })
    .unwrap_or_else(|| panic!("uncordoned, n1 took no work\n{}", cluster.logs()));
    assert_eq!(after[1].1, "n1", "{after:?}");
    let _ = second;

    let log = run_cli(&cluster, &["remediation", "log"]);
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(
        log.contains("operator cordon") && log.contains("fan swap"),
        "{log}"
    );
    assert!(log.contains("operator uncordon"), "{log}");
    cluster.assert_replay_verifies();
}

#[test]
fn a_node_that_stops_heartbeating_has_its_task_moved_and_gets_work_only_after_a_healthy_spell() {
    let (mut cluster, start) = silent_node_cluster("4s", "15s");
    start(&mut cluster);
    // Long enough to outlive the test; n1 takes it (lowest index first).
    let long = cluster.submit("long", &spec("long", "3000s"));
    cluster.started(&long, "run", 1);
    let first = grants(&cluster);
    assert_eq!(first.len(), 1);
    let (stopped, other) = if first[0].1 == "n1" {
        ("n1", "n2")
    } else {
        ("n2", "n1")
    };
    let pid = cluster.pid(&format!("collector-{stopped}"));
    signal(pid, "STOP");
    let stopped_at = Instant::now();
    let moved = wait_for(Duration::from_secs(60), || {
        let g = grants(&cluster);
        (g.len() >= 2).then_some(g)
    });
    signal(pid, "CONT");
    let moved =
        moved.unwrap_or_else(|| panic!("the silent node's task was not moved\n{}", cluster.logs()));
    assert_eq!(moved[1], (long.clone(), other.to_owned()), "{moved:?}");

    // The drain is remediation's, naming its rule, and the run was stopped as preempted.
    let actions: Vec<_> = cluster
        .events("REMEDIATION")
        .into_iter()
        .filter_map(|e| match e {
            AnyEvent::Remediation(RemediationEvent::ActionTaken(a)) => Some(a),
            _ => None,
        })
        .collect();
    let drain = actions
        .iter()
        .find(|a| a.node == stopped && a.rule == "heartbeat-lost")
        .unwrap_or_else(|| panic!("no drain of {stopped}: {actions:?}"));
    assert_eq!(drain.action.as_str(), "drain");
    let preempted = cluster.journal().into_iter().any(|a| {
        a.entry.decisions.iter().any(|d| {
            matches!(d, Decision::Preempted { reason, for_task: None, .. }
                if reason.contains("heartbeat-lost"))
        })
    });
    assert!(preempted, "the journal names the rule that moved the task");
    let explained = run_cli(&cluster, &["explain", &long, "run"]);
    let explained = String::from_utf8_lossy(&explained.stdout);
    assert!(
        explained.contains("preempted: remediation rule heartbeat-lost"),
        "allot explain says why it moved:\n{explained}"
    );

    // Beating again, the node takes no work until fifteen healthy seconds have passed.
    // Longer than what `long` has left: it never preempts it by gain.
    let waiting = cluster.submit("waiting", &spec("waiting", "6000s"));
    let returned = wait_for(Duration::from_secs(60), || {
        cluster
            .events("REMEDIATION")
            .into_iter()
            .any(|e| {
                matches!(e, AnyEvent::Remediation(RemediationEvent::ActionTaken(a))
                    if a.node == stopped && a.action.as_str() == "return_to_service")
            })
            .then(Instant::now)
    })
    .unwrap_or_else(|| panic!("{stopped} never returned to service\n{}", cluster.logs()));
    assert!(
        returned.duration_since(stopped_at) >= Duration::from_secs(15),
        "returned {:?} after the stop",
        returned.duration_since(stopped_at)
    );
    let granted = wait_for(Duration::from_secs(30), || {
        grants(&cluster).into_iter().find(|(w, _)| *w == waiting)
    })
    .unwrap_or_else(|| panic!("nothing granted after the return\n{}", cluster.logs()));
    assert_eq!(granted.1, stopped);
    // Nothing ran twice at once: the old run on the stopped node ended as preempted.
    cluster.assert_replay_verifies();
}

/// A running `allot up`, killed if the test fails before stopping it (its nats-server dies
/// with it).
struct Up(std::process::Child);

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `allot <args>` in `dir` (the running `allot up`'s folder); its output.
fn in_dir(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    allot(dir).args(args).output().unwrap()
}

#[test]
fn an_overheating_node_is_drained_its_task_resumes_elsewhere_from_its_checkpoint_and_finishes() {
    use crate::support::{free_port, log_of, spawn_logged, terminate, wait_exit};
    let dir = tempfile::tempdir().unwrap();
    let mut up = allot(dir.path());
    // Telemetry every 5 s (the default): the drain must come within two of them.
    up.args([
        "up",
        "--sim-nodes",
        "2",
        "--sim-gpus",
        "2",
        "--sim-speedup",
        "120",
    ])
    .args(["--inject", "overheat:node-1@15s"])
    .args(["--nats-port", &free_port().to_string()]);
    let mut up = Up(spawn_logged(up, dir.path(), "up"));
    let fail = |what: &str| -> ! { panic!("{what}\nallot up log:\n{}", log_of(dir.path(), "up")) };
    wait_for(Duration::from_secs(60), || {
        let out = in_dir(dir.path(), &["status", "--json"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && text.matches("\"ready\"").count() == 2).then_some(())
    })
    .unwrap_or_else(|| fail("two ready nodes never showed"));
    // node-2 is kept free until the task runs on node-1, so the fault meets it there.
    let out = in_dir(dir.path(), &["cordon", "node-2", "--reason", "kept free"]);
    assert!(out.status.success(), "{out:?}");
    let spec = dir.path().join("train.yaml");
    // 120 min of work at 120× is 60 s of wall time, checkpointing every 5 min (2.5 s).
    std::fs::write(
        &spec,
        "apiVersion: allot/v1\nkind: Workload\nmetadata: {name: train, team: vision}\nspec:\n  \
         tasks:\n    - {name: train, command: [train], resources: {gpus: 2}, durationEstimate: \
         120m, checkpoint: {supported: true, interval: 5m}}\n",
    )
    .unwrap();
    let out = in_dir(dir.path(), &["submit", spec.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let workload = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    wait_for(Duration::from_secs(30), || {
        let out = in_dir(dir.path(), &["workload", &workload, "--output", "json"]);
        String::from_utf8_lossy(&out.stdout)
            .contains("node-1")
            .then_some(())
    })
    .unwrap_or_else(|| fail("the task never ran on node-1"));
    let out = in_dir(dir.path(), &["uncordon", "node-2"]);
    assert!(out.status.success(), "{out:?}");

    // The fault comes; the workload still completes, on node-2.
    let out = in_dir(
        dir.path(),
        &[
            "submit",
            spec.to_str().unwrap(),
            "--follow",
            "--output",
            "json",
            "--timeout",
            "150s",
        ],
    );
    assert!(
        out.status.success(),
        "the workload did not succeed: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        log_of(dir.path(), "up")
    );

    // The run on node-1 was stopped and saved its state (SIGTERM, within its grace).
    let steps = String::from_utf8_lossy(&out.stdout);
    assert!(
        steps.lines().any(|l| l.contains("\"stopped\"")
            && l.contains("on node-1 (preempted)")
            && l.contains("checkpointed")),
        "{steps}"
    );
    // It resumed from its checkpoint: the run on node-2 lasted well under the whole task's
    // 60 s of wall time (it did 15 s or more of it on node-1 first).
    let lines: Vec<serde_json::Value> = steps
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let at = |state: &str| {
        lines
            .iter()
            .filter(|l| {
                l["state"] == state && l["detail"].as_str().is_some_and(|d| d.contains("node-2"))
            })
            .map(|l| l["t_ms"].as_i64().unwrap())
            .next_back()
            .unwrap_or_else(|| panic!("no {state} on node-2 in:\n{steps}"))
    };
    let second_run_ms = at("completed") - at("started");
    assert!(
        second_run_ms < 50_000,
        "the run on node-2 took {second_run_ms} ms: it started over\n{steps}"
    );
    let log = in_dir(dir.path(), &["remediation", "log", "--json"]);
    let actions: Vec<serde_json::Value> = String::from_utf8_lossy(&log.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let drain = actions
        .iter()
        .find(|a| a["node"] == "node-1" && a["action"] == "drain")
        .unwrap_or_else(|| fail(&format!("no drain of node-1: {actions:?}")));
    assert_eq!(drain["rule"], "overheat");
    assert_eq!(drain["tasks"][0]["task"], "train", "{drain}");
    // From the first hot reading to the one that fired: within two telemetry intervals.
    let time =
        |v: &serde_json::Value| chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap()).unwrap();
    let held_down = time(&drain["evidence"][0]["at"]) - time(&drain["since"]);
    assert!(
        held_down <= chrono::Duration::seconds(10),
        "fired {held_down} after the first hot reading"
    );
    let explained = in_dir(dir.path(), &["explain", &workload, "train"]);
    let explained = String::from_utf8_lossy(&explained.stdout);
    assert!(
        explained.contains("preempted: remediation rule overheat"),
        "{explained}"
    );
    let granted: Vec<&str> = explained
        .lines()
        .filter(|l| l.contains(" granted"))
        .collect();
    assert_eq!(granted.len(), 2, "{explained}");
    assert!(
        granted[0].contains("node-1") && granted[1].contains("node-2"),
        "{explained}"
    );
    let status = in_dir(dir.path(), &["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["nodes"][0]["state"], "drained", "{status}");
    let verify = in_dir(dir.path(), &["replay", "--verify"]);
    assert!(verify.status.success(), "{verify:?}");
    terminate(&up.0);
    wait_exit(&mut up.0, Duration::from_secs(30)).expect("allot up stops");
}

#[test]
fn spikes_application_xids_and_operators_nodes_get_no_node_action_a_reset_xid_takes_one_gpu_and_the_breaker_holds()
 {
    use crate::support::{free_port, log_of, spawn_logged, terminate, wait_exit};
    let dir = tempfile::tempdir().unwrap();
    let mut up = allot(dir.path());
    // Ten nodes: the breaker lets remediation take one of them out per ten minutes.
    up.args(["up", "--sim-nodes", "10", "--sim-gpus", "2"])
        .args(["--telemetry-interval", "1s", "--heartbeat-interval", "1s"])
        .args(["--inject", "spike:node-1@5s", "--inject", "xid13:node-2@5s"])
        .args([
            "--inject",
            "xid95:node-3@5s",
            "--inject",
            "xid79:node-4@15s",
        ])
        .args([
            "--inject",
            "overheat:node-5@15s",
            "--inject",
            "overheat:node-6@15s",
        ])
        .args(["--inject", "overheat:node-7@15s"])
        .args(["--nats-port", &free_port().to_string()]);
    let mut up = Up(spawn_logged(up, dir.path(), "up"));
    let fail = |what: &str| -> ! { panic!("{what}\nallot up log:\n{}", log_of(dir.path(), "up")) };
    wait_for(Duration::from_secs(60), || {
        in_dir(dir.path(), &["cordon", "node-4", "--reason", "maintenance"])
            .status
            .success()
            .then_some(())
    })
    .unwrap_or_else(|| fail("could not cordon node-4"));
    let actions = |node: &str| -> Vec<(String, Option<u64>, String)> {
        let log = in_dir(
            dir.path(),
            &["remediation", "log", "--json", "--node", node],
        );
        String::from_utf8_lossy(&log.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|a| a["type"] == "io.allot.remediation.v1.action_taken")
            .map(|a| {
                (
                    a["action"].as_str().unwrap().to_owned(),
                    a["gpu"].as_u64(),
                    a["downgraded"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    // The overheats fire last (15 s, then their hold-down): once all three are decided, the
    // earlier faults have long been weighed.
    wait_for(Duration::from_secs(90), || {
        let decided = ["node-5", "node-6", "node-7"]
            .iter()
            .filter(|n| {
                actions(n)
                    .iter()
                    .any(|(a, gpu, _)| gpu.is_none() && (a == "drain" || a == "alert"))
            })
            .count();
        (decided == 3).then_some(())
    })
    .unwrap_or_else(|| fail("the three overheats were never decided"));

    assert!(
        actions("node-1").is_empty(),
        "a spike: {:?}",
        actions("node-1")
    );
    let app = actions("node-2");
    assert!(
        !app.is_empty() && app.iter().all(|(a, _, _)| a == "alert"),
        "an application XID alerts only: {app:?}"
    );
    let reset = actions("node-3");
    assert_eq!(
        reset
            .iter()
            .map(|(a, g, _)| (a.as_str(), *g))
            .collect::<Vec<_>>(),
        [("gpu_out_of_service", Some(0)), ("reset_request", Some(0))],
        "a reset-class XID takes that GPU only"
    );
    let operators = actions("node-4");
    assert!(
        !operators.is_empty()
            && operators
                .iter()
                .all(|(a, _, why)| a == "alert" && why.contains("operator")),
        "an operator's node only hears alerts: {operators:?}"
    );
    let drained = ["node-5", "node-6", "node-7"]
        .iter()
        .filter(|n| {
            actions(n)
                .iter()
                .any(|(a, g, _)| a == "drain" && g.is_none())
        })
        .count();
    let held_back = ["node-5", "node-6", "node-7"]
        .iter()
        .filter(|n| {
            actions(n)
                .iter()
                .any(|(a, g, why)| a == "alert" && g.is_none() && why.contains("circuit breaker"))
        })
        .count();
    assert_eq!((drained, held_back), (1, 2), "the breaker holds");

    let status = in_dir(dir.path(), &["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let node = |name: &str| {
        status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        node("node-3")["state"],
        "ready",
        "one GPU out is not the node"
    );
    assert!(
        node("node-3")["gpus"][0]["out_of_service"].is_string(),
        "{}",
        node("node-3")
    );
    assert_eq!(node("node-4")["state"], "cordoned");
    assert!(
        node("node-4")["reason"]
            .as_str()
            .unwrap()
            .contains("maintenance")
    );
    terminate(&up.0);
    wait_exit(&mut up.0, Duration::from_secs(30)).expect("allot up stops");
}

#[test]
fn idle_reclaim_warns_then_frees_an_idle_grant_and_leaves_an_opted_out_a_busy_and_a_warming_one() {
    use crate::support::{free_port, log_of, spawn_logged, terminate, wait_exit};
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "rules: []\nidle: {below: 1%, window: 6s, warmUp: 30s, notice: 3s}\n",
    )
    .unwrap();
    let mut up = allot(dir.path());
    up.args(["up", "--sim-nodes", "2", "--sim-gpus", "3"])
        .args(["--telemetry-interval", "1s", "--heartbeat-interval", "1s"])
        .args(["--health-rules", rules.to_str().unwrap()])
        .args(["--inject", "idle:node-1@10s"])
        .args(["--nats-port", &free_port().to_string()]);
    let mut up = Up(spawn_logged(up, dir.path(), "up"));
    let fail = |what: &str| -> ! { panic!("{what}\nallot up log:\n{}", log_of(dir.path(), "up")) };
    let cli = |args: &[&str]| {
        let out = in_dir(dir.path(), args);
        assert!(out.status.success(), "allot {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wait_for(Duration::from_secs(60), || {
        in_dir(dir.path(), &["cordon", "node-2", "--reason", "placing"])
            .status
            .success()
            .then_some(())
    })
    .unwrap_or_else(|| fail("could not cordon node-2"));
    let submit = |name: &str, opt_out: bool| {
        let spec = dir.path().join(format!("{name}.yaml"));
        let idle = if opt_out { ", idleReclaim: false" } else { "" };
        std::fs::write(
            &spec,
            format!(
                "apiVersion: allot/v1\nkind: Workload\nmetadata: {{name: {name}, team: vision}}\n\
                 spec:\n  tasks:\n    - {{name: run, command: [run], resources: {{gpus: 1}}, \
                 durationEstimate: 120m{idle}}}\n"
            ),
        )
        .unwrap();
        cli(&["submit", spec.to_str().unwrap()]).trim().to_owned()
    };
    let on = |workload: &str, node: &str| {
        wait_for(Duration::from_secs(30), || {
            // Until the planner has read the submission, it does not know the workload.
            let out = in_dir(dir.path(), &["workload", workload, "--output", "json"]);
            String::from_utf8_lossy(&out.stdout)
                .contains(node)
                .then_some(())
        })
        .unwrap_or_else(|| fail(&format!("{workload} never ran on {node}")));
    };
    // Idle-prone and opted-out work on node-1, busy work on node-2.
    let notebook = submit("notebook", false);
    let debug = submit("debug", true);
    on(&notebook, "node-1");
    on(&debug, "node-1");
    cli(&["uncordon", "node-2"]);
    cli(&["cordon", "node-1", "--reason", "placing"]);
    let busy = submit("busy", false);
    on(&busy, "node-2");
    // Once node-1 has gone idle, one more task starts there: idle from its first second, but
    // still warming up (30 s) when the first is reclaimed.
    wait_for(Duration::from_secs(60), || {
        log_of(dir.path(), "up")
            .contains("fault injected")
            .then_some(())
    })
    .unwrap_or_else(|| fail("the idle fault was never injected"));
    cli(&["uncordon", "node-1"]);
    cli(&["cordon", "node-2", "--reason", "placing"]);
    let late = submit("late", false);
    on(&late, "node-1");
    cli(&["uncordon", "node-2"]);

    let reclaimed = wait_for(Duration::from_secs(60), || {
        let log = cli(&["remediation", "log", "--json"]);
        let actions: Vec<serde_json::Value> = log
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|a: &serde_json::Value| a["rule"] == "idle-reclaim")
            .collect();
        actions
            .iter()
            .any(|a| a["action"] == "idle_reclaim")
            .then_some(actions)
    })
    .unwrap_or_else(|| fail("nothing was reclaimed"));
    let of = |a: &serde_json::Value| a["tasks"][0]["workload"].as_str().unwrap().to_owned();
    let kinds: Vec<(String, String)> = reclaimed
        .iter()
        .map(|a| (a["action"].as_str().unwrap().to_owned(), of(a)))
        .collect();
    assert_eq!(
        kinds,
        [
            ("alert".to_owned(), notebook.clone()),
            ("idle_reclaim".to_owned(), notebook.clone())
        ],
        "the idle grant is told, then reclaimed; the opted-out, busy and warming ones are not"
    );
    assert_eq!(
        reclaimed[0]["team"], "vision",
        "the notice goes to the team"
    );
    let explained = cli(&["explain", &notebook, "run"]);
    assert!(
        explained.contains("preempted: remediation rule idle-reclaim"),
        "{explained}"
    );
    let _ = (debug, busy, late);
    terminate(&up.0);
    wait_exit(&mut up.0, Duration::from_secs(30)).expect("allot up stops");
}

#[test]
fn remediation_sigkilled_mid_breach_and_after_acting_decides_exactly_once() {
    let (mut cluster, start) = silent_node_cluster("6s", "1h");
    start(&mut cluster);
    let drains = |cluster: &Cluster| {
        cluster
            .events("REMEDIATION")
            .into_iter()
            .filter(|e| {
                matches!(e, AnyEvent::Remediation(RemediationEvent::ActionTaken(a))
                    if a.node == "n1" && a.action.as_str() == "drain")
            })
            .count()
    };
    // Let it learn both nodes' heartbeats, then silence n1.
    std::thread::sleep(Duration::from_secs(3));
    let pid = cluster.pid("collector-n1");
    signal(pid, "STOP");
    // Killed while n1's silence is being held down, and started again: the silence it
    // stored still counts, and the drain comes once.
    std::thread::sleep(Duration::from_secs(3));
    cluster.kill("remediation");
    start(&mut cluster);
    let first = wait_for(Duration::from_secs(60), || {
        let n = drains(&cluster);
        (n > 0).then_some(n)
    });
    // Killed again after acting, and started again: nothing is decided twice.
    cluster.kill("remediation");
    start(&mut cluster);
    std::thread::sleep(Duration::from_secs(8));
    let after = drains(&cluster);
    signal(pid, "CONT");
    let first = first.unwrap_or_else(|| panic!("n1 was never drained\n{}", cluster.logs()));
    assert_eq!((first, after), (1, 1), "one drain, stored once");
}
