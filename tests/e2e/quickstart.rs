//! The README's quick start as a newcomer runs it: `allot up`, then every example workload
//! submitted as it is, with `--wait`; each runs to success on the simulated cluster, and the
//! journal and the archive verify with no flags from the same folder.

use std::path::Path;
use std::time::Duration;

use crate::support::{allot, free_port, log_of, spawn_logged, terminate, wait_exit, wait_for};

#[test]
fn every_example_workload_runs_to_success_on_allot_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = allot(dir.path());
    // 3600x: the examples' hours of estimated work take seconds.
    up.args(["up", "--sim-speedup", "3600"])
        .args(["--nats-port", &free_port().to_string()]);
    let mut up = spawn_logged(up, dir.path(), "up");
    wait_for(Duration::from_secs(60), || {
        dir.path().join(".allot/nats.url").exists().then_some(())
    })
    .expect("allot up wrote its URL");

    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    for example in ["train-eval.yaml", "fractional.yaml"] {
        let out = allot(dir.path())
            .arg("submit")
            .arg(examples.join(example))
            .args(["--teams"])
            .arg(examples.join("teams.yaml"))
            .args(["--run-id", "quickstart", "--wait", "--timeout", "180s"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{example}:\n{}\n{}\nallot up:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            log_of(dir.path(), "up")
        );
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(printed.contains("succeeded after"), "{example}: {printed}");
    }
    // An auditor in the same folder needs no flags: the local instance's pool and archive.
    let out = allot(dir.path())
        .args(["replay", "--verify"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "replay --verify:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let archived = wait_for(Duration::from_secs(30), || {
        let out = allot(dir.path())
            .args(["audit", "verify"])
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && printed.contains("chain intact")).then_some(printed)
    });
    assert!(archived.is_some(), "audit verify never passed");
    terminate(&up);
    assert!(
        wait_exit(&mut up, Duration::from_secs(30)).is_some_and(|s| s.success()),
        "{}",
        log_of(dir.path(), "up")
    );
}
