//! `allot up` then `allot status`, as a user does it in a fresh folder.

use std::time::Duration;

use allot_inventory::ClusterStatus;

use crate::support::{
    allot, free_port, log_of, processes_mentioning, spawn_logged, terminate, wait_exit, wait_for,
};

#[test]
fn allot_up_then_status_shows_the_simulated_nodes_and_sigterm_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = allot(dir.path());
    up.args([
        "up",
        "--sim-nodes",
        "3",
        "--sim-gpus",
        "4",
        "--sim-models",
        "H100,L4",
    ])
    .args([
        "--heartbeat-interval",
        "200ms",
        "--telemetry-interval",
        "200ms",
    ])
    .args(["--nats-port", &free_port().to_string()]);
    let mut up = spawn_logged(up, dir.path(), "up");

    // `allot status` in the same folder finds the running instance without flags.
    let status = wait_for(Duration::from_secs(60), || {
        let out = allot(dir.path())
            .args(["status", "--json"])
            .output()
            .unwrap();
        if !out.status.success() {
            return None;
        }
        let status: ClusterStatus = serde_json::from_slice(&out.stdout).ok()?;
        let complete = status.nodes.len() == 3
            && status
                .nodes
                .iter()
                .all(|n| n.gpus.len() == 4 && n.gpus.iter().all(|g| g.utilization_pct.is_some()));
        complete.then_some(status)
    })
    .unwrap_or_else(|| {
        panic!(
            "status never showed 3 nodes; allot up log:\n{}",
            log_of(dir.path(), "up")
        )
    });

    let names: Vec<&str> = status.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node-1", "node-2", "node-3"]);
    let models: Vec<&str> = status
        .nodes
        .iter()
        .map(|n| n.gpus[0].model.as_deref().unwrap())
        .collect();
    assert!(
        models[0].contains("H100") && models[1].contains("L4") && models[2].contains("H100"),
        "{models:?}"
    );
    assert!(
        status
            .nodes
            .iter()
            .all(|n| n.state == "ready" && n.gpu_source == "simulated")
    );

    let table = allot(dir.path()).arg("status").output().unwrap();
    assert!(table.status.success());
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.starts_with("3 nodes, 12 GPUs (12 healthy)"),
        "{table}"
    );
    for node in ["node-1", "node-2", "node-3"] {
        assert!(table.contains(node), "{table}");
    }
    assert!(
        table.contains("HEALTHY") && table.contains("UTIL"),
        "{table}"
    );

    terminate(&up);
    let exit = wait_exit(&mut up, Duration::from_secs(30)).unwrap_or_else(|| {
        panic!(
            "allot up did not stop on SIGTERM; log:\n{}",
            log_of(dir.path(), "up")
        )
    });
    assert!(
        exit.success(),
        "exit {exit:?}; log:\n{}",
        log_of(dir.path(), "up")
    );
    let store = dir.path().join(".allot").to_string_lossy().into_owned();
    let left = wait_for(Duration::from_secs(5), || {
        processes_mentioning(&store).is_empty().then_some(())
    });
    assert!(
        left.is_some(),
        "processes left behind: {:?}",
        processes_mentioning(&store)
    );
    assert!(
        !dir.path().join(".allot/nats.url").exists(),
        "the URL of a stopped server is removed"
    );
}

#[test]
fn status_without_a_running_allot_says_how_to_start_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = allot(dir.path())
        .args([
            "status",
            "--nats",
            &format!("nats://127.0.0.1:{}", free_port()),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is `allot up` running"), "{err}");
}

/// A named data folder without a running Allot is an error naming it, never a silent fall-back
/// to whatever listens on the default port; without one named, the fall-back is announced.
#[test]
fn client_commands_never_fall_back_silently_to_another_instance() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("no-allot-here");
    std::fs::create_dir(&elsewhere).unwrap();
    for (flag, via_env) in [(true, false), (false, true)] {
        let mut cmd = allot(dir.path());
        cmd.arg("status").env_remove("ALLOT_NATS_URL");
        if flag {
            cmd.arg("--data-dir").arg(&elsewhere);
        }
        if via_env {
            cmd.env("ALLOT_DATA_DIR", &elsewhere);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("no Allot is running in") && err.contains("no-allot-here"),
            "{err}"
        );
        assert!(!err.contains("4222"), "tried the default port: {err}");
    }
    let out = allot(dir.path())
        .arg("status")
        .env_remove("ALLOT_NATS_URL")
        .env_remove("ALLOT_DATA_DIR")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no Allot in this folder") && err.contains("nats://127.0.0.1:4222"),
        "{err}"
    );
}

/// Logs written anywhere but a terminal are plain text, and client commands print their
/// answer, not INFO lines.
#[test]
fn client_commands_are_quiet_and_logs_off_a_terminal_have_no_colour() {
    let dir = tempfile::tempdir().unwrap();
    let server = allot_testkit::NatsServer::start();
    // A one-shot client command that connects (and fails: this server has no streams).
    let out = allot(dir.path())
        .env_remove("ALLOT_LOG")
        .args(["audit", "archive", "--nats", &server.url(), "--db"])
        .arg(dir.path().join("archive.db"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stream not found"), "{err}");
    assert!(!err.contains("INFO"), "{err}");
    // Asked for, logs come — without escape codes, since stderr is a pipe.
    let out = allot(dir.path())
        .args(["--log", "trace", "status", "--nats"])
        .arg(format!("nats://127.0.0.1:{}", free_port()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TRACE") || err.contains("DEBUG"), "{err}");
    assert!(!err.contains('\u{1b}'), "colour codes in {err:?}");
}

#[test]
fn invalid_configuration_is_reported_all_at_once_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let out = allot(dir.path())
        .args(["up", "--sim-gpus", "99", "--heartbeat-interval", "often"])
        .env("ALLOT_SIM_MODELS", "H100,QuantumGPU")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("3 problems"), "{err}");
    for want in ["--sim-gpus", "--heartbeat-interval=\"often\"", "QuantumGPU"] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
    assert!(!dir.path().join(".allot").exists(), "nothing was started");
}

/// While a granted task runs on a simulated node, `allot status` shows its GPUs busy and
/// holding memory, and idle again once it ended: the simulated load follows the work.
#[test]
fn status_shows_the_load_of_a_running_task_and_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("busy.yaml");
    std::fs::write(
        &spec,
        "apiVersion: allot/v1\nkind: Workload\nmetadata: {name: busy, team: vision}\nspec:\n  \
         tasks:\n    - {name: train, resources: {gpus: 2}, command: [python, train.py], \
         durationEstimate: 8m}\n",
    )
    .unwrap();
    let mut up = allot(dir.path());
    // 60x: eight estimated minutes run eight seconds.
    up.args([
        "up",
        "--sim-nodes",
        "1",
        "--sim-gpus",
        "4",
        "--sim-speedup",
        "60",
    ])
    .args(["--telemetry-interval", "200ms"])
    .args(["--nats-port", &free_port().to_string()]);
    let mut up = spawn_logged(up, dir.path(), "up");
    wait_for(Duration::from_secs(60), || {
        dir.path().join(".allot/nats.url").exists().then_some(())
    })
    .expect("allot up wrote its URL");
    let status = || -> Option<ClusterStatus> {
        let out = allot(dir.path())
            .args(["status", "--json"])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).ok()
    };
    let busy = |s: &ClusterStatus| {
        s.nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .filter(|g| g.utilization_pct.unwrap_or(0) >= 50 && g.memory_used_mib.unwrap_or(0) > 0)
            .count()
    };
    let submitted = allot(dir.path()).arg("submit").arg(&spec).output().unwrap();
    assert!(
        submitted.status.success(),
        "{}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let during = wait_for(Duration::from_secs(30), || {
        status().filter(|s| busy(s) == 2)
    });
    let during = during.unwrap_or_else(|| {
        panic!(
            "two GPUs never showed the task's load: {:?}\n{}",
            status(),
            log_of(dir.path(), "up")
        )
    });
    // And what holds them: the workload and task, by name.
    let holders: Vec<String> = during
        .nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .flat_map(|g| &g.held_by)
        .map(|h| format!("{}/{} {}", h.workload, h.task, h.team))
        .collect();
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(
        holders
            .iter()
            .all(|h| h.starts_with("busy-") && h.ends_with("/train vision")),
        "{holders:?}"
    );
    let table = allot(dir.path()).arg("status").output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("HELD BY") && table.contains("team vision"),
        "{table}"
    );
    // `allot status --json | head -c0`: the reader is gone before the answer comes; that is
    // no error worth a word.
    let mut piped = allot(dir.path())
        .args(["status", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(piped.stdout.take());
    let out = piped.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("Broken pipe"),
        "{err}"
    );
    let after = wait_for(Duration::from_secs(60), || {
        status().filter(|s| busy(s) == 0)
    });
    assert!(
        after.is_some(),
        "the GPUs stayed busy after the task: {:?}",
        status()
    );
    terminate(&up);
    assert!(wait_exit(&mut up, Duration::from_secs(30)).is_some());
}
