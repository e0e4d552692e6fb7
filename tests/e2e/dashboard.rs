//! The dashboard in a real browser: `allot up` with simulated load, Debian's chromium driven by
//! playwright-core (tests/browser/dashboard.mjs; both installed by scripts/install-browser.sh).
//! The page must show the GPUs and the queue, follow them live, look back to an earlier moment,
//! and show a member only its own team. Screenshots land in
//! `target/tmp/dashboard/` (printed when the test runs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::{
    allot, free_port, gateway_of, log_of, spawn_logged, terminate, wait_exit, warnings_in,
};

/// Two 4-GPU trainers of a minute each (six seconds at the test's speed-up).
fn workload(name: &str, team: &str) -> String {
    format!(
        r#"
apiVersion: allot/v1
kind: Workload
metadata: {{name: {name}, team: {team}}}
spec:
  tasks:
    - name: train-a
      resources: {{gpus: 4}}
      command: [train]
      durationEstimate: 1m
    - name: train-b
      resources: {{gpus: 4}}
      command: [train]
      durationEstimate: 1m
"#
    )
}

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

#[test]
fn the_dashboard_shows_the_cluster_live_looks_back_and_scopes_a_member() {
    let modules = browser_dir().join("node_modules/playwright-core");
    let chromium = std::env::var("ALLOT_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        modules.exists() && Path::new(&chromium).exists(),
        "the browser test needs Debian's chromium and playwright-core: run scripts/install-browser.sh \
         (./dev test does)"
    );
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).unwrap();
    eprintln!("screenshots: {}", shots.display());

    let dir = tempfile::tempdir().unwrap();
    let teams = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/teams.yaml");
    let mut up = allot(dir.path());
    up.args([
        "up",
        "--sim-nodes",
        "2",
        "--sim-gpus",
        "4",
        "--sim-speedup",
        "10",
    ])
    .args([
        "--heartbeat-interval",
        "500ms",
        "--telemetry-interval",
        "500ms",
    ])
    .arg("--teams")
    .arg(&teams)
    .args(["--nats-port", &free_port().to_string()])
    .args(["--listen", &format!("127.0.0.1:{}", free_port())]);
    let mut up = spawn_logged(up, dir.path(), "up");
    let (url, admin) = gateway_of(dir.path(), "up");

    let out = allot(dir.path())
        .args(["token", "create", "--team", "nlp", "--role", "member"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let member = String::from_utf8(out.stdout).unwrap().trim().to_owned();

    // Six workloads of two 4-GPU tasks on 8 GPUs: two run at a time, the rest wait, for a minute.
    for (i, team) in ["vision", "nlp", "vision", "nlp", "vision", "nlp"]
        .into_iter()
        .enumerate()
    {
        let spec = dir.path().join(format!("w{i}.yaml"));
        std::fs::write(&spec, workload(&format!("load-{i}"), team)).unwrap();
        let out = allot(dir.path())
            .arg("submit")
            .arg(&spec)
            .arg("--teams")
            .arg(&teams)
            .args(["--run-id", "dash"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "submit {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let run = Command::new("node")
        .arg(browser_dir().join("dashboard.mjs"))
        .current_dir(browser_dir())
        .env("ALLOT_URL", &url)
        .env("ALLOT_TOKEN", &admin)
        .env("ALLOT_MEMBER_TOKEN", &member)
        .env("ALLOT_MEMBER_TEAM", "nlp")
        .env("ALLOT_SHOTS", &shots)
        .env("ALLOT_CHROMIUM", &chromium)
        .output()
        .expect("node runs (install Node.js and npm)");
    let report = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "allot up:\n{}\n{}\nscreenshots: {}\nthe browser run failed:\n{}\n{report}",
        log_of(dir.path(), "up"),
        warnings_in(dir.path(), 10),
        shots.display(),
        String::from_utf8_lossy(&run.stderr),
    );
    let r: Value = serde_json::from_str(report.trim()).unwrap();
    let list = |v: &Value| -> Vec<String> {
        v.as_str()
            .unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };

    // The map: both nodes, every GPU.
    assert_eq!(r["nodes"], serde_json::json!(["node-1", "node-2"]), "{r}");
    assert_eq!(r["gpus"], 8, "{r}");
    // The queue says why each task waits and when it should start.
    let first = &r["first"];
    assert!(first["busy_gpus"].as_u64().unwrap() > 0, "{r}");
    for (reason, eta) in first["queue_reasons"]
        .as_array()
        .unwrap()
        .iter()
        .zip(first["queue_etas"].as_array().unwrap())
    {
        assert!(
            !reason.as_str().unwrap().is_empty(),
            "a queued task without a reason: {r}"
        );
        assert!(
            !eta.as_str().unwrap().is_empty(),
            "a queued task without an ETA: {r}"
        );
    }
    // Live: other tasks ran later and the queue moved, with no reload, through SSE.
    assert_ne!(first["running"], r["later"]["running"], "{r}");
    assert_eq!(r["reloaded"], false, "{r}");
    assert!(
        r["events"].as_u64().unwrap() > 0,
        "no SSE event reached the page: {r}\n{}",
        warnings_in(dir.path(), 10)
    );
    // Look-back: what ran at the first view's moment, not what runs now.
    assert!(
        r["lookback_mode"]
            .as_str()
            .unwrap()
            .starts_with("as it was at"),
        "{r}"
    );
    assert_eq!(r["live_only_hidden"], true, "{r}");
    let then = list(&r["lookback"]["running"]);
    let seen = list(&first["running"]);
    assert!(
        then.iter().any(|t| seen.contains(t)),
        "the look-back to {} shows {then:?} running, none of what the page showed then ({seen:?}): {r}",
        r["lookback_at"]
    );
    // And the page shows what the API says of that moment.
    assert_eq!(r["lookback"]["running"], r["lookback_api"], "{r}");
    assert_eq!(r["page_errors"], serde_json::json!([]), "{r}");
    // A member of nlp sees nlp's work only; other teams' GPUs are anonymous.
    let m = &r["member"];
    for key in [
        "workload_teams",
        "queue_teams",
        "running_teams",
        "cost_teams",
    ] {
        let teams = m[key].as_array().unwrap();
        assert!(
            teams.iter().all(|t| t == "nlp"),
            "the member's {key} shows another team: {r}"
        );
    }
    assert!(!m["workload_teams"].as_array().unwrap().is_empty(), "{r}");
    assert!(
        m["gpu_titles"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| !t.as_str().unwrap().contains("vision")),
        "the member's map names team vision: {r}"
    );
    for shot in [
        "1-live.png",
        "2-live-later.png",
        "3-lookback.png",
        "4-member.png",
    ] {
        let png = std::fs::read(shots.join(shot)).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{shot}");
    }

    terminate(&up);
    assert!(
        wait_exit(&mut up, Duration::from_secs(30)).is_some_and(|s| s.success()),
        "{}",
        log_of(dir.path(), "up")
    );
}
