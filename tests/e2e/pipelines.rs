//! Pipelines end to end, every service its own `allot run` process against a real
//! nats-server: the planner, the allocator (two, where one is killed), and one collector per
//! simulated node whose executor runs each task's command as a real process. What users see:
//! stages run in order and hold GPUs only when they need them, a critical workload preempts a
//! batch one that then resumes from its checkpoint, an abort stops training and cancels
//! evaluation, and killing the allocator's leader and the planner mid-run loses nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use allot_events::alloc::Applied;
use allot_events::task::{StopCause, TaskStarted, TaskStopped};
use allot_events::workload::WorkloadOutcome;
use allot_events::{AnyEvent, TaskEvent};
use allot_sched::{Decision, LeaseId, TaskId};

use crate::cluster::{Cluster, PATIENCE, PREEMPTIBLE_BATCH};
use crate::support::{allot, wait_for};

/// Runs of `workload` whose task names start with `prefix` that started, in order.
pub fn started_runs(events: &[AnyEvent], workload: &str, prefix: &str) -> Vec<TaskStarted> {
    events
        .iter()
        .filter_map(|e| match e {
            AnyEvent::Task(TaskEvent::Started(s))
                if s.workload == workload && s.name.starts_with(prefix) =>
            {
                Some(s.clone())
            }
            _ => None,
        })
        .collect()
}

/// What a run wrote to its log.
fn log(run: &TaskStarted) -> String {
    std::fs::read_to_string(run.log.as_deref().expect("process runs have a log")).unwrap()
}

/// One journal fact about a run: which entry, what, which task and lease.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fact {
    entry: usize,
    what: &'static str,
    task: TaskId,
    lease: LeaseId,
}

/// Grants, preemptions and releases in journal order; and each task's (workload, name).
/// Each granted task's (workload, name, GPUs it was given).
type Names = BTreeMap<TaskId, (String, String, u32)>;

fn facts(journal: &[Applied]) -> (Vec<Fact>, Names) {
    let mut facts = Vec::new();
    let mut names = BTreeMap::new();
    for (i, a) in journal.iter().enumerate() {
        for d in &a.dispatch {
            let gpus = d.nodes.iter().map(|n| n.gpus.len() as u32).sum();
            names.insert(
                d.task,
                (d.launch.workload.clone(), d.launch.name.clone(), gpus),
            );
        }
        for d in &a.entry.decisions {
            let (what, task, lease) = match d {
                Decision::Granted { task, lease, .. } => ("granted", *task, *lease),
                Decision::Preempted { task, lease, .. } => ("preempted", *task, *lease),
                Decision::Released { task, lease, .. } => ("released", *task, *lease),
                Decision::Waiting { .. }
                | Decision::Reserved { .. }
                | Decision::Withdrawn { .. } => continue,
            };
            facts.push(Fact {
                entry: i,
                what,
                task,
                lease,
            });
        }
    }
    (facts, names)
}

/// No GPU is ever held by two leases at once (more than 1000 milli-GPU), replaying the
/// journal's dispatches against its preemptions and releases.
fn assert_no_gpu_granted_twice(journal: &[Applied]) {
    let mut held: BTreeMap<(String, u32), u32> = BTreeMap::new();
    let mut leases: BTreeMap<LeaseId, Vec<(String, u32, u32)>> = BTreeMap::new();
    for a in journal {
        for d in &a.entry.decisions {
            if let Decision::Preempted { lease, .. } | Decision::Released { lease, .. } = d {
                for (node, gpu, milli) in leases.remove(lease).unwrap_or_default() {
                    *held.get_mut(&(node, gpu)).unwrap() -= milli;
                }
            }
        }
        for d in &a.dispatch {
            let mut shares = Vec::new();
            for n in &d.nodes {
                for (gpu, milli) in &n.gpus {
                    let h = held.entry((n.node.clone(), *gpu)).or_default();
                    *h += milli;
                    assert!(
                        *h <= 1000,
                        "GPU {gpu} of {} granted twice (lease {:?})",
                        n.node,
                        d.lease
                    );
                    shares.push((n.node.clone(), *gpu, *milli));
                }
            }
            assert!(
                leases.insert(d.lease, shares).is_none(),
                "lease {:?} granted twice",
                d.lease
            );
        }
    }
}

const THREE_STAGES: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: stages, team: vision}
spec:
  tasks:
    - name: preprocess
      resources: {cpu: "1", memory: 1Gi}
      command: [sh, -c, "sleep 1; echo shards written"]
      durationEstimate: 1s
    - &train
      name: train-0
      resources: {gpus: 1}
      command: [sh, -c, "echo $ALLOT_TASK on GPU $CUDA_VISIBLE_DEVICES; sleep 1"]
      after: [preprocess]
      gang: train
    - {<<: *train, name: train-1}
    - {<<: *train, name: train-2}
    - {<<: *train, name: train-3}
    - name: eval
      resources: {gpus: 1}
      command: [sh, -c, "echo evaluated on GPU $CUDA_VISIBLE_DEVICES"]
      after: [train-0, train-1, train-2, train-3]
"#;

#[test]
fn a_three_stage_pipeline_runs_in_order_and_holds_no_gpu_during_its_cpu_stage() {
    let cluster = Cluster::start(&[("n1", 4), ("n2", 2)]);
    let id = cluster.submit("stages", THREE_STAGES);
    let done = cluster.finished(&id);
    assert_eq!(
        done.outcome,
        WorkloadOutcome::Succeeded,
        "{done:?}\n{}",
        cluster.logs()
    );

    // `allot explain` by the names people see: the workload, its tasks, nodes by name, times
    // as dates.
    let explain = |args: &[&str]| {
        let out = allot(cluster.dir.path())
            .arg("explain")
            .args(args)
            .args(["--nats", &cluster.server.url()])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, story) = explain(&[&id, "train-0"]);
    assert!(ok, "{story}");
    assert!(
        story.starts_with(&format!("{id}/train-0 attempt 1 (task-")),
        "{story}"
    );
    assert!(
        story.contains("granted lease") && story.contains(" on n"),
        "{story}"
    );
    assert!(!story.contains("node #"), "{story}");
    assert!(
        story.contains(" 20") && story.contains("Z "),
        "times as dates: {story}"
    );
    let (ok, all) = explain(&[&id]);
    assert!(ok, "{all}");
    for task in ["preprocess", "train-0", "train-3", "eval"] {
        assert!(
            all.contains(&format!("{id}/{task} (task-")),
            "{task}: {all}"
        );
    }
    let (ok, none) = explain(&[&id, "trian-0"]);
    assert!(!ok && none.contains("task trian-0 of workload"), "{none}");

    let journal = cluster.journal();
    let (facts, names) = facts(&journal);
    let at = |what: &str, name: &str| -> Vec<usize> {
        facts
            .iter()
            .filter(|f| f.what == what && names[&f.task].1 == name)
            .map(|f| f.entry)
            .collect()
    };
    let prep_released = at("released", "preprocess")[0];
    assert_eq!(
        names[&facts
            .iter()
            .find(|f| names[&f.task].1 == "preprocess")
            .unwrap()
            .task]
            .2,
        0,
        "preprocess holds no GPU"
    );
    // No GPU task of the workload is granted until preprocessing ended.
    let first_gpu_grant = facts
        .iter()
        .filter(|f| f.what == "granted" && names[&f.task].2 > 0)
        .map(|f| f.entry)
        .min()
        .unwrap();
    assert!(
        first_gpu_grant > prep_released,
        "a GPU was granted while only preprocessing ran"
    );
    // The gang starts together: its four members in one journal entry.
    let trains: BTreeSet<usize> = (0..4)
        .flat_map(|i| at("granted", &format!("train-{i}")))
        .collect();
    assert_eq!(
        trains.len(),
        1,
        "the gang was granted in several passes: {trains:?}"
    );
    let last_train_released = (0..4)
        .flat_map(|i| at("released", &format!("train-{i}")))
        .max()
        .unwrap();
    assert!(at("granted", "eval")[0] > last_train_released);
    assert_no_gpu_granted_twice(&journal);
    // The look-ahead: preprocessing was expected to take 1 s, so the trainers were preloaded
    // as soon as it started, and room was held for them before they were granted.
    let preloaded: BTreeSet<String> = cluster
        .workloads()
        .into_iter()
        .filter_map(|e| match e {
            AnyEvent::Task(TaskEvent::Preload(p)) if p.workload == id => Some(p.name),
            _ => None,
        })
        .collect();
    assert_eq!(preloaded.len(), 4, "{preloaded:?}");
    assert!(preloaded.iter().all(|n| n.starts_with("train-")));
    let first_hold = journal
        .iter()
        .position(|a| {
            a.entry
                .decisions
                .iter()
                .any(|d| matches!(d, Decision::Reserved { .. }))
        })
        .expect("room was held for the trainers");
    assert!(first_hold < trains.iter().copied().min().unwrap());

    // The processes ran with their GPUs, and their output is in their logs.
    let events = cluster.workloads();
    let prep = &started_runs(&events, &id, "preprocess")[0];
    assert!(log(prep).contains("shards written"), "{}", log(prep));
    let trains = started_runs(&events, &id, "train-");
    assert_eq!(trains.len(), 4);
    let gpus: BTreeSet<String> = trains
        .iter()
        .map(|r| {
            let text = log(r);
            let (_, gpu) = text.trim().rsplit_once("on GPU ").expect("the GPU line");
            assert!(
                !gpu.is_empty() && !gpu.contains(','),
                "one GPU each: {text}"
            );
            format!("{}/{gpu}", r.node)
        })
        .collect();
    assert_eq!(gpus.len(), 4, "each trainer saw its own GPU: {gpus:?}");
}

#[test]
fn a_critical_workload_preempts_a_batch_one_which_resumes_from_its_checkpoint() {
    let cluster = Cluster::start(&[("n1", 4)]);
    let batch = cluster.submit("batch", PREEMPTIBLE_BATCH);
    cluster.started(&batch, "sweep", 1);
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
      command: [sh, -c, "echo urgent fix; sleep 0.5"]
"#,
    );
    assert_eq!(
        cluster.finished(&urgent).outcome,
        WorkloadOutcome::Succeeded
    );
    assert_eq!(cluster.finished(&batch).outcome, WorkloadOutcome::Succeeded);

    let events = cluster.workloads();
    let runs = started_runs(&events, &batch, "sweep");
    assert_eq!(runs.len(), 2, "ran, was preempted, ran again: {runs:?}");
    let first = log(&runs[0]);
    assert!(
        first.contains("fresh start") && first.contains("saving"),
        "{first}"
    );
    assert!(log(&runs[1]).contains("resumed from checkpoint"));
    let stopped: Vec<&TaskStopped> = events
        .iter()
        .filter_map(|e| match e {
            AnyEvent::Task(TaskEvent::Stopped(s)) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    // The urgent task started only once the batch run had left the GPUs.
    let position = |f: &dyn Fn(&AnyEvent) -> bool| events.iter().position(f).unwrap();
    let stopped_at = position(&|e| matches!(e, AnyEvent::Task(TaskEvent::Stopped(_))));
    let urgent_started_at =
        position(&|e| matches!(e, AnyEvent::Task(TaskEvent::Started(s)) if s.workload == urgent));
    assert!(urgent_started_at > stopped_at, "two runs shared the GPUs");
    assert_eq!(stopped[0].cause, StopCause::Preempted);
    assert!(
        stopped[0].checkpointed && !stopped[0].killed,
        "{:?}",
        stopped[0]
    );

    let journal = cluster.journal();
    let (facts, names) = facts(&journal);
    let urgent_task = *names.iter().find(|(_, n)| n.0 == urgent).unwrap().0;
    let preempted = journal
        .iter()
        .flat_map(|a| &a.entry.decisions)
        .find_map(|d| match d {
            Decision::Preempted { task, for_task, .. } => Some((*task, *for_task)),
            _ => None,
        })
        .expect("a preemption");
    assert_eq!(names[&preempted.0].0, batch);
    assert_eq!(preempted.1, Some(urgent_task));
    let order: Vec<(&str, &str)> = facts
        .iter()
        .map(|f| {
            (
                f.what,
                if names[&f.task].0 == batch {
                    "batch"
                } else {
                    "urgent"
                },
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            ("granted", "batch"),
            ("preempted", "batch"),
            ("granted", "urgent"),
            ("released", "urgent"),
            ("granted", "batch"),
            ("released", "batch"),
        ]
    );
    assert_no_gpu_granted_twice(&journal);
}

#[test]
fn an_abort_during_training_stops_it_releases_its_gpus_and_cancels_evaluation() {
    let cluster = Cluster::start(&[("n1", 4)]);
    let (mut follower, id) = cluster.submit_following(
        "abort",
        r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: doomed, team: vision}
spec:
  tasks:
    - name: prep
      command: [sh, -c, "sleep 0.2"]
    - &train
      name: train-0
      resources: {gpus: 2}
      command: [sh, -c, "trap 'echo stopping; exit 143' TERM; while :; do sleep 0.1; done"]
      after: [prep]
      gang: train
    - {<<: *train, name: train-1}
    - name: eval
      resources: {gpus: 1}
      command: [sh, -c, "echo must not run"]
      after: [train-0, train-1]
"#,
    );
    let trains = cluster.started(&id, "train-", 2);
    let abort = |workload: &str, team: &str, task: Option<&str>| {
        let mut cmd = allot(cluster.dir.path());
        cmd.args(["abort", workload, "--team", team])
            .args(["--reason", "wrong learning rate"])
            .args(["--nats", &cluster.server.url(), "--by", "alice"]);
        if let Some(task) = task {
            cmd.args(["--task", task]);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Refused, each with its reason and exit 2, and the training goes on.
    let (code, err) = abort(&id, "nlp", None);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("refused") && err.contains("belongs to team vision"),
        "{err}"
    );
    let (code, err) = abort(&id, "vision", Some("trian-0"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("has no task \"trian-0\""), "{err}");
    let (code, err) = abort("nosuch-0123456789", "vision", None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unknown workload nosuch-0123456789"), "{err}");

    let (code, err) = abort(&id, "vision", None);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("carried out: cancelled") && err.contains("eval"),
        "{err}"
    );
    let done = cluster.finished(&id);
    assert_eq!(done.outcome, WorkloadOutcome::Aborted);
    let (code, err) = abort(&id, "vision", None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("has already been aborted"), "{err}");
    assert!(
        done.reason
            .as_deref()
            .unwrap_or_default()
            .contains("wrong learning rate"),
        "{done:?}"
    );
    // Both trainers were stopped by their executor and said so; their processes are gone.
    let stopped = wait_for(PATIENCE, || {
        let s: Vec<TaskStopped> = cluster
            .workloads()
            .into_iter()
            .filter_map(|e| match e {
                AnyEvent::Task(TaskEvent::Stopped(s)) => Some(s),
                _ => None,
            })
            .collect();
        (s.len() == 2).then_some(s)
    })
    .expect("both trainers reported stopped");
    assert!(
        stopped
            .iter()
            .all(|s| s.cause == StopCause::Cancelled && !s.killed),
        "{stopped:?}"
    );
    for run in &trains {
        assert!(log(run).contains("stopping"), "{}", log(run));
        let pid: u32 = run.how.trim_start_matches("process ").parse().unwrap();
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid),
            "{pid} still runs"
        );
    }
    // Their leases were released, and evaluation was never granted.
    let journal = cluster.journal();
    let (facts, names) = facts(&journal);
    for name in ["train-0", "train-1"] {
        assert!(
            facts
                .iter()
                .any(|f| f.what == "released" && names[&f.task].1 == name)
        );
    }
    assert!(!names.values().any(|n| n.1 == "eval"), "eval was granted");
    assert!(started_runs(&cluster.workloads(), &id, "eval").is_empty());
    // The CI job that submitted it with --follow saw the stages and exits "aborted" (4).
    let status = crate::support::wait_exit(&mut follower, PATIENCE).expect("submit --follow ended");
    let printed = std::fs::read_to_string(cluster.path("abort.out")).unwrap();
    assert_eq!(status.code(), Some(4), "{printed}");
    for expected in [
        "prep",
        "completed",
        "train-0",
        "started",
        "cancelled",
        "aborted",
    ] {
        assert!(
            printed.contains(expected),
            "{expected:?} missing from:\n{printed}"
        );
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.contains(") Z "))
        .unwrap_or(true)
}

#[test]
fn killing_the_allocator_leader_and_the_planner_mid_run_loses_nothing() {
    // FIFO: no preemption, so "every task started once" means what it says (under `allot` a
    // gang may be preempted for an evaluation and rightly run again; and a gang member whose
    // run completes just as it is preempted runs again — known, see docs/operations.md).
    let mut cluster = Cluster::start_with_policy(&[("n1", 4), ("n2", 4)], "fifo");
    // The standby joins once a1 leads.
    wait_for(PATIENCE, || cluster.leaders().first().cloned()).expect("a leader");
    cluster.allocator("a2");
    let spec = |i: usize| {
        format!(
            r#"
apiVersion: allot/v1
kind: Workload
metadata: {{name: run-{i}, team: vision}}
spec:
  tasks:
    - name: prep
      command: [sh, -c, "sleep 0.3"]
    - &train
      name: train-0
      resources: {{gpus: 2}}
      command: [sh, -c, "sleep 1.5"]
      after: [prep]
      gang: train
    - {{<<: *train, name: train-1}}
    - name: eval
      resources: {{gpus: 1}}
      command: [sh, -c, "sleep 0.3"]
      after: [train-0, train-1]
"#
        )
    };
    let ids: Vec<String> = (0..4)
        .map(|i| cluster.submit(&format!("run-{i}"), &spec(i)))
        .collect();
    // Mid-run: the first gang is training.
    cluster.started(&ids[0], "train-", 2);
    cluster.kill("allocator-a1");
    cluster.kill("planner");
    cluster.planner();
    for id in &ids {
        assert_eq!(
            cluster.finished(id).outcome,
            WorkloadOutcome::Succeeded,
            "{id}\n{}",
            cluster.logs()
        );
    }
    let leaders = cluster.leaders();
    assert_eq!(
        leaders.first().map(String::as_str),
        Some("a1"),
        "{leaders:?}"
    );
    assert!(
        leaders.iter().any(|l| l == "a2"),
        "the standby took over: {leaders:?}"
    );
    assert_no_gpu_granted_twice(&cluster.journal());
    // Every task ran exactly once: no attempt was started twice after the restarts.
    let events = cluster.workloads();
    for id in &ids {
        let runs = started_runs(&events, id, "");
        let names: BTreeSet<&str> = runs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(runs.len(), 4, "{id}: {runs:?}");
        assert_eq!(names.len(), 4, "{id}: {runs:?}");
    }
    cluster.assert_replay_verifies();
}
