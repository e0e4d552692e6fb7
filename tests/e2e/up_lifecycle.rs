//! `allot up` against the hostile ways it gets run: twice in one folder, SIGKILLed and started
//! again, its nats-server killed under it.

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use crate::support::{allot, free_port, log_of, spawn_logged, terminate, wait_exit, wait_for};

/// `allot up` on `dir/.allot` with two nodes and a fresh port.
fn up_command(dir: &Path) -> Command {
    let mut cmd = allot(dir);
    cmd.args(["up", "--sim-nodes", "2", "--sim-speedup", "3600"])
        .args(["--heartbeat-interval", "200ms"])
        .args(["--nats-port", &free_port().to_string()]);
    cmd
}

/// [`up_command`] started, logging to `dir/<name>.log`.
fn up(dir: &Path, name: &str) -> Child {
    spawn_logged(up_command(dir), dir, name)
}

/// Waits until `allot status` in `dir` answers, i.e. the instance there is up.
fn wait_until_up(dir: &Path, name: &str) {
    wait_for(Duration::from_secs(60), || {
        let out = allot(dir).args(["status", "--json"]).output().unwrap();
        out.status.success().then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "allot status never answered; {name}:\n{}",
            log_of(dir, name)
        )
    });
}

/// The pid of the live nats-server child of process `parent`, if it has one.
fn nats_server_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // pid (comm) state ppid …; a reaped-but-unwaited child is state Z.
            let (comm, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            let mut fields = rest.split(' ');
            let state = fields.next()?;
            let ppid: u32 = fields.next()?.parse().ok()?;
            (ppid == parent && comm == "nats-server" && state != "Z").then_some(pid)
        })
}

fn sigkill(pid: u32) {
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn stop(mut child: Child, dir: &Path, name: &str) {
    terminate(&child);
    let exit = wait_exit(&mut child, Duration::from_secs(30));
    assert!(
        exit.is_some_and(|s| s.success()),
        "{name} did not stop cleanly ({exit:?}):\n{}",
        log_of(dir, name)
    );
}

/// Starts a second `allot up` in `dir` and checks it is refused at once, naming `holder`.
fn assert_refused(dir: &Path, holder: u32) {
    let mut second = up(dir, "second");
    let exit = wait_exit(&mut second, Duration::from_secs(10)).unwrap_or_else(|| {
        let _ = second.kill();
        panic!(
            "a second allot up in the same folder kept running:\n{}",
            log_of(dir, "second")
        )
    });
    assert_eq!(exit.code(), Some(1), "{}", log_of(dir, "second"));
    let err = log_of(dir, "second");
    assert!(
        err.contains(&format!("another allot up (pid {holder},")) && err.contains("--data-dir"),
        "the refusal names the running instance:\n{err}"
    );
}

#[test]
fn a_second_allot_up_in_the_same_folder_is_refused_and_the_first_keeps_running() {
    let dir = tempfile::tempdir().unwrap();
    let first = up(dir.path(), "first");
    wait_until_up(dir.path(), "first");
    let url = std::fs::read_to_string(dir.path().join(".allot/nats.url")).unwrap();

    assert_refused(dir.path(), first.id());

    assert_eq!(
        std::fs::read_to_string(dir.path().join(".allot/nats.url")).ok(),
        Some(url),
        "the first instance's nats.url is left alone"
    );
    let status = allot(dir.path()).arg("status").output().unwrap();
    assert!(
        status.status.success(),
        "the first still answers: {}\n{}",
        String::from_utf8_lossy(&status.stderr),
        log_of(dir.path(), "first")
    );
    stop(first, dir.path(), "first");
}

#[test]
fn a_crashed_allot_up_can_be_restarted_in_the_same_folder() {
    let dir = tempfile::tempdir().unwrap();
    let mut crashed = up(dir.path(), "crashed");
    wait_until_up(dir.path(), "crashed");
    let url_file = dir.path().join(".allot/nats.url");
    let crashed_url = std::fs::read_to_string(&url_file).unwrap();
    sigkill(crashed.id());
    crashed.wait().unwrap();

    let again = up(dir.path(), "again");
    wait_for(Duration::from_secs(60), || {
        let url = std::fs::read_to_string(&url_file).ok()?;
        (url != crashed_url).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the restart never came up:\n{}",
            log_of(dir.path(), "again")
        )
    });
    wait_until_up(dir.path(), "again");
    // The folder now belongs to the new instance, not to the dead one.
    assert_refused(dir.path(), again.id());
    stop(again, dir.path(), "again");
}

/// Submits `examples/train-eval.yaml` in `dir` under `run_id` and waits until it succeeds.
fn run_workload(dir: &Path, run_id: &str) {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let out = allot(dir)
        .arg("submit")
        .arg(examples.join("train-eval.yaml"))
        .arg("--teams")
        .arg(examples.join("teams.yaml"))
        .args(["--run-id", run_id, "--wait", "--timeout", "180s"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "workload {run_id}:\n{}\n{}\nallot up:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        log_of(dir, "up")
    );
}

#[test]
fn nats_server_killed_under_allot_up_is_restarted_and_workloads_still_complete() {
    let dir = tempfile::tempdir().unwrap();
    let running = up(dir.path(), "up");
    wait_until_up(dir.path(), "up");
    // Every service past its start-up, as when a server dies under a running Allot.
    run_workload(dir.path(), "before");
    let killed = nats_server_of(running.id()).expect("allot up runs a nats-server");
    sigkill(killed);

    wait_for(Duration::from_secs(30), || {
        nats_server_of(running.id()).filter(|&pid| pid != killed)
    })
    .unwrap_or_else(|| {
        panic!(
            "nats-server was not restarted:\n{}",
            log_of(dir.path(), "up")
        )
    });
    wait_until_up(dir.path(), "up");
    run_workload(dir.path(), "after");
    stop(running, dir.path(), "up");
}

#[test]
fn allot_up_stops_and_names_nats_server_when_it_may_not_restart_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = up_command(dir.path());
    cmd.env("ALLOT_NATS_RESTARTS", "0");
    let mut running = spawn_logged(cmd, dir.path(), "up");
    wait_until_up(dir.path(), "up");
    sigkill(nats_server_of(running.id()).expect("allot up runs a nats-server"));

    let exit = wait_exit(&mut running, Duration::from_secs(60)).unwrap_or_else(|| {
        let _ = running.kill();
        panic!(
            "allot up kept running without its nats-server:\n{}",
            log_of(dir.path(), "up")
        )
    });
    assert!(!exit.success(), "{}", log_of(dir.path(), "up"));
    let log = log_of(dir.path(), "up");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("allot: nats-server failed") && last.contains("SIGKILL"),
        "the last line names what failed and how:\n{log}"
    );
    assert!(
        !dir.path().join(".allot/nats.url").exists(),
        "the URL of the dead server is removed"
    );
}

#[test]
fn a_service_that_fails_stops_allot_up_and_the_exit_names_it() {
    let dir = tempfile::tempdir().unwrap();
    // The inventory's database folder is a file: the inventory cannot start.
    std::fs::create_dir(dir.path().join(".allot")).unwrap();
    std::fs::write(dir.path().join(".allot/inventory"), "not a folder").unwrap();
    let mut running = up(dir.path(), "up");

    let exit = wait_exit(&mut running, Duration::from_secs(60)).unwrap_or_else(|| {
        let _ = running.kill();
        panic!(
            "allot up kept running without its inventory:\n{}",
            log_of(dir.path(), "up")
        )
    });
    assert!(!exit.success(), "{}", log_of(dir.path(), "up"));
    let log = log_of(dir.path(), "up");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("allot: inventory failed"),
        "the last line names the service that failed:\n{log}"
    );
}
