//! Schemathesis (installed by scripts/install-schemathesis.sh) against the live OpenAPI document
//! of an `allot up`: every check on every operation (tests/api/schemathesis.toml says which it
//! skips where and why) — no 5xx, every status, content type, header and body as documented,
//! invalid input rejected and valid input accepted — with an admin's token and a real running
//! workload to reach past the 404s.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::{
    allot, free_port, gateway_of, log_of, spawn_logged, terminate, wait_exit, wait_for,
};

/// A two-hour trainer (it runs for the whole test) and an evaluation after it.
const WORKLOAD: &str = r#"{"apiVersion": "allot/v1", "kind": "Workload",
  "metadata": {"name": "fuzzed", "team": "vision"},
  "spec": {"tasks": [
    {"name": "train", "resources": {"gpus": 1}, "command": ["train"], "durationEstimate": "2h"},
    {"name": "eval", "resources": {"gpus": 1}, "command": ["eval"], "after": ["train"],
     "durationEstimate": "10m"}]}}"#;

fn curl(args: &[&str]) -> Option<Value> {
    let out = Command::new("curl")
        .args(["-fsS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl runs");
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// `POST url` with a JSON `body` as the bearer of `auth` (`Authorization: …`).
fn post_json(auth: &str, url: &str, body: &str) -> Option<Value> {
    curl(&[
        "-X",
        "POST",
        "-H",
        auth,
        "-H",
        "Content-Type: application/json",
        "--data",
        body,
        url,
    ])
}

#[test]
fn schemathesis_finds_nothing_wrong_with_the_live_api() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let st = root.join(".tools/bin/st");
    assert!(
        st.exists(),
        "Schemathesis is missing: run scripts/install-schemathesis.sh (./dev test does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut up = allot(dir.path());
    up.args(["up", "--sim-nodes", "2", "--sim-gpus", "4"])
        .arg("--teams")
        .arg(root.join("examples/teams.yaml"))
        .args(["--nats-port", &free_port().to_string()])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())]);
    let mut up = spawn_logged(up, dir.path(), "up");
    let (url, token) = gateway_of(dir.path(), "up");
    let auth = format!("Authorization: Bearer {}", token);

    let submitted = post_json(
        &auth,
        &format!("{url}/api/v1/workloads?run_id=fuzz"),
        WORKLOAD,
    )
    .expect("the workload was accepted");
    let workload = submitted["workload_id"].as_str().unwrap().to_owned();
    let task = wait_for(Duration::from_secs(60), || {
        let detail = curl(&["-H", &auth, &format!("{url}/api/v1/workloads/{workload}")])?;
        detail["dag"]
            .as_array()?
            .iter()
            .find(|t| t["name"] == "train" && t["state"] == "running")?["task_id"]
            .as_u64()
    })
    .unwrap_or_else(|| {
        panic!(
            "the trainer never ran; allot up:\n{}",
            log_of(dir.path(), "up")
        )
    });

    let issued = post_json(
        &auth,
        &format!("{url}/api/v1/tokens"),
        r#"{"team": "nlp", "role": "viewer", "description": "to be revoked"}"#,
    )
    .expect("a token was issued");
    let token_id = issued["token_id"].as_str().unwrap().to_owned();

    let out = Command::new(&st)
        .arg("--config-file")
        .arg(root.join("tests/api/schemathesis.toml"))
        .args(["run", &format!("{url}/api/v1/openapi.json")])
        .args(["--no-color", "--wait-for-schema", "30"])
        .env("ALLOT_TOKEN", &token)
        .env("ALLOT_WORKLOAD_ID", &workload)
        .env("ALLOT_TASK_ID", task.to_string())
        .env("ALLOT_TOKEN_ID", &token_id)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "Schemathesis found problems:\n{report}\n{}\nallot up:\n{}",
        String::from_utf8_lossy(&out.stderr),
        log_of(dir.path(), "up")
    );
    // It reached every operation, the four that need real objects included.
    assert!(report.contains("Tested: 16"), "{report}");
    assert!(!report.contains("Missing test data"), "{report}");

    terminate(&up);
    assert!(
        wait_exit(&mut up, Duration::from_secs(30)).is_some_and(|s| s.success()),
        "{}",
        log_of(dir.path(), "up")
    );
}
