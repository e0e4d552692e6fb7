//! The live path under stress: thousands of tasks, a starved machine, an allocator paused past
//! its lease while another stands by. Whatever happens, every task of the workload runs, each
//! is granted once and started once, and the journal replays and verifies.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use allot_events::workload::WorkloadOutcome;
use allot_events::{AnyEvent, TaskEvent};

use crate::cluster::Cluster;
use crate::support::{signal, wait_for};

/// A workload of `n` short CPU-only tasks with no dependencies: each takes a core for 3 s of
/// task time (5 ms at the speed-up used here), so thousands of them are in flight at once.
fn wide_workload(name: &str, n: usize) -> String {
    let mut spec = format!(
        "apiVersion: allot/v1\nkind: Workload\nmetadata: {{name: {name}, team: nlp}}\nspec:\n  tasks:\n"
    );
    for i in 0..n {
        spec += &format!(
            "    - {{name: t{i:05}, resources: {{cpu: \"1\"}}, durationEstimate: 3s, command: [\"true\"]}}\n"
        );
    }
    spec
}

/// Busy loops on every core while it lives: the services must compete for CPU.
struct CpuHogs(Vec<Child>);

impl CpuHogs {
    fn start() -> CpuHogs {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        CpuHogs(
            (0..cores + 1)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdout(Stdio::null())
                        .spawn()
                        .unwrap()
                })
                .collect(),
        )
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How often each task of `workload` was granted, and how often it started, by task name.
fn grants_and_starts(
    cluster: &Cluster,
    workload: &str,
) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let mut grants = BTreeMap::new();
    for applied in cluster.journal() {
        for d in applied.dispatch {
            if d.launch.workload == workload {
                *grants.entry(d.launch.name).or_default() += 1;
            }
        }
    }
    let mut starts = BTreeMap::new();
    for e in cluster.workloads() {
        if let AnyEvent::Task(TaskEvent::Started(s)) = e
            && s.workload == workload
        {
            *starts.entry(s.name).or_default() += 1;
        }
    }
    (grants, starts)
}

/// Every task granted exactly once and started exactly once.
fn assert_each_task_once(cluster: &Cluster, workload: &str, n: usize) {
    let (grants, starts) = grants_and_starts(cluster, workload);
    let twice: Vec<_> = grants.iter().filter(|(_, c)| **c != 1).collect();
    assert!(twice.is_empty(), "granted other than once: {twice:?}");
    assert_eq!(grants.len(), n, "every task was granted");
    let twice: Vec<_> = starts.iter().filter(|(_, c)| **c != 1).collect();
    assert!(twice.is_empty(), "started other than once: {twice:?}");
    assert_eq!(starts.len(), n, "every task started");
}

#[test]
fn a_wide_workload_on_a_starved_machine_runs_every_task_once() {
    const TASKS: usize = 2000;
    let cluster = Cluster::start_simulated(&[("n1", 8), ("n2", 8), ("n3", 8), ("n4", 8)], 600);
    let _hogs = CpuHogs::start();
    let workload = cluster.submit("wide", &wide_workload("wide", TASKS));
    let finished = wait_for(Duration::from_secs(600), || {
        cluster.finished_within(&workload, Duration::from_secs(5))
    })
    .unwrap_or_else(|| panic!("{workload} did not finish\n{}", cluster.logs()));
    assert_eq!(finished.outcome, WorkloadOutcome::Succeeded, "{finished:?}");
    assert_each_task_once(&cluster, &workload, TASKS);
    assert_eq!(
        cluster.leaders(),
        ["a1"],
        "the only allocator never deposed itself"
    );
    cluster.assert_replay_verifies();
}

#[test]
fn allocators_paused_past_their_lease_lose_and_duplicate_nothing() {
    const TASKS: usize = 1000;
    let mut cluster = Cluster::start_simulated(&[("n1", 8), ("n2", 8)], 300);
    cluster.allocator("a2");
    // With predictions, as `allot up` runs: the policy must not trade one short task for
    // another (it once preempted tasks for gains of under a second, and they ran twice).
    cluster.predictor();
    let workload = cluster.submit("paused", &wide_workload("paused", TASKS));
    let granted = |c: &Cluster| grants_and_starts(c, &workload).0.len();

    // Pause the leader mid-run, past its 2 s lease: the standby takes over. Then let it go on
    // (it finds itself deposed and stands by), and pause the new leader the same way.
    for at in [TASKS / 4, TASKS / 2] {
        wait_for(Duration::from_secs(300), || {
            (granted(&cluster) >= at).then_some(())
        })
        .unwrap_or_else(|| panic!("{at} grants did not happen\n{}", cluster.logs()));
        let leader = cluster.leaders().pop().expect("someone leads");
        let pid = cluster.pid(&format!("allocator-{leader}"));
        signal(pid, "STOP");
        std::thread::sleep(Duration::from_secs(5));
        signal(pid, "CONT");
    }

    let finished = wait_for(Duration::from_secs(600), || {
        cluster.finished_within(&workload, Duration::from_secs(5))
    })
    .unwrap_or_else(|| panic!("{workload} did not finish\n{}", cluster.logs()));
    assert_eq!(finished.outcome, WorkloadOutcome::Succeeded, "{finished:?}");
    assert_each_task_once(&cluster, &workload, TASKS);
    let leaders = cluster.leaders();
    assert!(
        leaders.len() >= 3 && ["a1", "a2"].iter().all(|a| leaders.iter().any(|l| l == a)),
        "each pause handed the lead to the standby: {leaders:?}"
    );
    cluster.assert_replay_verifies();
}
