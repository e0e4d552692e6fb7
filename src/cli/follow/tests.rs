use allot_events::TaskEvent;
use allot_events::alloc::{Dispatch, Launch, NodeGrant};
use allot_events::task::task_id;
use allot_events::task::{
    RunSpec, StopCause, TaskCancelled, TaskCompleted, TaskFailed, TaskReady, TaskStarted,
    TaskStopped,
};
use allot_events::workload::{WorkloadAborted, WorkloadFinished, WorkloadOutcome};
use allot_sched::{Decision, LeaseId, Placement, TaskSpec, WaitReason};

use super::*;

const ID: &str = "flaky-00000000aa";

/// A CPU step retried once, and a 2-GPU step after it.
const SPEC: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: flaky, team: vision}
spec:
  tasks:
    - name: prep
      resources: {cpu: "1"}
      command: [python, prep.py]
      retry: {maxAttempts: 2, backoff: 10ms}
    - name: train
      resources: {gpus: 2}
      command: [python, train.py]
      after: [prep]
"#;

fn progress() -> Progress {
    let checked = allot_workload::check(SPEC, allot_workload::Format::Yaml, Default::default())
        .expect("a valid spec");
    Progress::new(ID, &checked.workload, 1_000_000)
}

fn id(name: &str, attempt: u32) -> TaskId {
    task_id(ID, name, attempt)
}

fn ready(name: &str, attempt: u32) -> Observed {
    ready_of(ID, name, attempt)
}

fn ready_of(workload: &str, name: &str, attempt: u32) -> Observed {
    let gpus = if name == "train" { 2 } else { 0 };
    let mut task = TaskSpec::new(0, "vision", gpus);
    task.id = task_id(workload, name, attempt);
    Observed::Task(TaskEvent::Ready(TaskReady {
        pool: "default".into(),
        workload: workload.into(),
        name: name.into(),
        task,
        run: RunSpec {
            attempt,
            ..RunSpec::default()
        },
    }))
}

fn granted(name: &str, attempt: u32, gpus: &[u32]) -> Observed {
    let task = id(name, attempt);
    Observed::Journal {
        decisions: vec![Decision::Granted {
            task,
            lease: LeaseId(7),
            placement: Placement::default(),
            at: 0,
            reason: "fits".into(),
        }],
        dispatch: vec![Dispatch {
            task,
            lease: LeaseId(7),
            launch: Launch {
                workload: ID.into(),
                name: name.into(),
                team: String::new(),
                run: RunSpec::default(),
            },
            nodes: vec![NodeGrant {
                node: "n1".into(),
                gpu_model: "H100".into(),
                gpus: gpus.iter().map(|g| (*g, 1000)).collect(),
                mig: None,
                cpu_milli: 1000,
                memory_mib: 0,
            }],
        }],
    }
}

fn waiting(name: &str, free_gpus: u64, eta_in: Option<u64>) -> Observed {
    Observed::Journal {
        decisions: vec![Decision::Waiting {
            task: id(name, 1),
            reason: WaitReason::NoCapacity { gpus: 2, free_gpus },
            eta: eta_in.map(|ms| 5_000 + ms),
            at_risk: false,
            at: 5_000,
        }],
        dispatch: Vec::new(),
    }
}

/// A waiting decision that flags the task at risk of missing its deadline.
fn at_risk(name: &str, eta_in: u64) -> Observed {
    let mut observed = waiting(name, 0, Some(eta_in));
    if let Observed::Journal { decisions, .. } = &mut observed
        && let Some(Decision::Waiting { at_risk, .. }) = decisions.first_mut()
    {
        *at_risk = true;
    }
    observed
}

fn preempted(name: &str, for_task: &str, lost: u64) -> Observed {
    Observed::Journal {
        decisions: vec![Decision::Preempted {
            task: id(name, 1),
            lease: LeaseId(7),
            at: 0,
            for_task: Some(id(for_task, 1)),
            lost,
            reason: "higher priority".into(),
        }],
        dispatch: Vec::new(),
    }
}

fn completed(name: &str, attempt: u32) -> Observed {
    Observed::Task(TaskEvent::Completed(TaskCompleted {
        pool: "default".into(),
        task: id(name, attempt),
        node: "n1".into(),
        lease: LeaseId(1),
    }))
}

fn failed(name: &str, attempt: u32) -> Observed {
    Observed::Task(TaskEvent::Failed(TaskFailed {
        pool: "default".into(),
        task: id(name, attempt),
        node: "n1".into(),
        lease: LeaseId(1),
        reason: "exit status 1".into(),
    }))
}

fn started(name: &str) -> Observed {
    Observed::Task(TaskEvent::Started(TaskStarted {
        pool: "default".into(),
        task: id(name, 1),
        node: "n1".into(),
        lease: LeaseId(7),
        workload: ID.into(),
        name: name.into(),
        how: "simulated".into(),
        log: None,
    }))
}

fn stopped(name: &str) -> Observed {
    Observed::Task(TaskEvent::Stopped(TaskStopped {
        pool: "default".into(),
        task: id(name, 1),
        node: "n1".into(),
        cause: StopCause::Preempted,
        checkpointed: true,
        killed: false,
        ran_ms: 1_500,
        lease: Some(LeaseId(7)),
    }))
}

fn cancelled(name: &str) -> Observed {
    Observed::Task(TaskEvent::Cancelled(TaskCancelled {
        pool: "default".into(),
        task: id(name, 1),
        workload: ID.into(),
        name: name.into(),
        reason: "aborted by alice: wrong data".into(),
    }))
}

fn aborted() -> Observed {
    Observed::Aborted(WorkloadAborted {
        workload_id: ID.into(),
        team: "vision".into(),
        task: None,
        reason: "wrong data".into(),
        by: "alice".into(),
    })
}

fn finished(outcome: WorkloadOutcome, reason: Option<&str>) -> Observed {
    Observed::Finished(WorkloadFinished {
        workload_id: ID.into(),
        team: "vision".into(),
        outcome,
        reason: reason.map(Into::into),
    })
}

/// `task state detail` (the timestamp aside).
/// `task state detail`, with the attempt's id (tested on its own) left out of the detail.
fn brief(line: &Line) -> String {
    let detail = match &line.task_id {
        Some(id) => line
            .detail
            .strip_prefix(&format!("{id}: "))
            .unwrap_or(&line.detail),
        None => &line.detail,
    };
    format!(
        "{} {} {}",
        line.task.as_deref().unwrap_or("*"),
        line.state,
        detail
    )
    .trim_end()
    .to_owned()
}

/// The summary's rows as `name:state:attempts/max:detail`.
fn rows(summary: &Summary) -> Vec<String> {
    summary
        .tasks
        .iter()
        .map(|t| {
            let (name, state, detail) = (&t.name, t.state, &t.detail);
            format!("{name}:{state}:{}/{}:{detail}", t.attempts, t.max_attempts)
        })
        .collect()
}

struct Case {
    name: &'static str,
    events: Vec<Observed>,
    want_lines: &'static [&'static str],
    want_ending: Ending,
    /// `name:state:attempts:detail` per task.
    want_tasks: &'static [&'static str],
}

#[test]
fn events_become_ci_log_lines_in_causal_order_and_a_summary() {
    use WorkloadOutcome::*;
    let cases = [
        Case {
            name: "a run started again under its lease after an executor restart says resumed",
            events: vec![
                ready("prep", 1),
                granted("prep", 1, &[]),
                started("prep"),
                started("prep"),
                completed("prep", 1),
                ready("train", 1),
                granted("train", 1, &[0, 1]),
                completed("train", 1),
                finished(Succeeded, None),
            ],
            want_lines: &[
                "prep ready no GPU; pool default",
                "prep granted n1 (no GPU)",
                "prep started on n1 (simulated)",
                "prep resumed on n1 (simulated), the same run (lease 7) after its executor restarted",
                "prep completed on n1",
                "train ready 2 GPUs; pool default",
                "train granted n1 GPUs 0,1",
                "train completed on n1",
                "* succeeded",
            ],
            want_ending: Ending::Succeeded,
            want_tasks: &[
                "prep:succeeded:1/2:ran on n1",
                "train:succeeded:1/1:ran on n1",
            ],
        },
        Case {
            name: "a task flagged at risk of missing its deadline says so",
            events: vec![
                ready("train", 1),
                waiting("train", 0, Some(4_200)),
                at_risk("train", 4_200),
                granted("train", 1, &[0, 1]),
                completed("train", 1),
                finished(Succeeded, None),
            ],
            want_lines: &[
                "train ready 2 GPUs; pool default",
                "train waiting needs 2 GPUs placed together; 0 GPUs are free but no placement fits; expected to start in 4.200s",
                "train waiting needs 2 GPUs placed together; 0 GPUs are free but no placement fits; expected to start in 4.200s; AT RISK of missing its deadline",
                "train granted n1 GPUs 0,1",
                "train completed on n1",
                "* succeeded",
            ],
            want_ending: Ending::Succeeded,
            want_tasks: &["prep:succeeded:0/2:", "train:succeeded:1/1:ran on n1"],
        },
        Case {
            name: "a pipeline that succeeds prints each stage once, in order",
            events: vec![
                ready("prep", 1),
                granted("prep", 1, &[]),
                started("prep"),
                completed("prep", 1),
                ready("train", 1),
                waiting("train", 1, Some(4_200)),
                waiting("train", 1, Some(4_200)),
                waiting("train", 0, None),
                granted("train", 1, &[0, 1]),
                completed("train", 1),
                finished(Succeeded, None),
            ],
            want_lines: &[
                "prep ready no GPU; pool default",
                "prep granted n1 (no GPU)",
                "prep started on n1 (simulated)",
                "prep completed on n1",
                "train ready 2 GPUs; pool default",
                "train waiting needs 2 GPUs placed together; 1 GPUs are free but no placement fits; expected to start in 4.200s",
                "train waiting needs 2 GPUs placed together; 0 GPUs are free but no placement fits; no start time estimate",
                "train granted n1 GPUs 0,1",
                "train completed on n1",
                "* succeeded",
            ],
            want_ending: Ending::Succeeded,
            want_tasks: &[
                "prep:succeeded:1/2:ran on n1",
                "train:succeeded:1/1:ran on n1",
            ],
        },
        Case {
            name: "a grant read before its ready waits for it",
            events: vec![granted("prep", 1, &[]), ready("prep", 1)],
            want_lines: &[
                "prep ready no GPU; pool default",
                "prep granted n1 (no GPU)",
            ],
            want_ending: Ending::TimedOut,
            want_tasks: &["prep:running:1/2:", "train:waiting:0/1:"],
        },
        Case {
            name: "a report read before its grant waits for it, and what follows it on its stream too",
            events: vec![
                ready("prep", 1),
                failed("prep", 1),
                ready("prep", 2),
                granted("prep", 1, &[]),
                granted("prep", 2, &[]),
                completed("prep", 2),
            ],
            want_lines: &[
                "prep ready no GPU; pool default",
                "prep granted n1 (no GPU)",
                "prep failed exit status 1 on n1 (attempt 1 of 2; a retry follows)",
                "prep retried attempt 2 of 2: no GPU; pool default",
                "prep granted n1 (no GPU)",
                "prep completed on n1",
            ],
            want_ending: Ending::TimedOut,
            want_tasks: &["prep:succeeded:2/2:ran on n1", "train:waiting:0/1:"],
        },
        Case {
            name: "a failing task is retried, fails for good, and the summary names it and why",
            events: vec![
                ready("prep", 1),
                granted("prep", 1, &[]),
                failed("prep", 1),
                ready("prep", 2),
                granted("prep", 2, &[]),
                failed("prep", 2),
                finished(
                    Failed,
                    Some("task prep failed after 2 attempts: exit status 1"),
                ),
            ],
            want_lines: &[
                "prep ready no GPU; pool default",
                "prep granted n1 (no GPU)",
                "prep failed exit status 1 on n1 (attempt 1 of 2; a retry follows)",
                "prep retried attempt 2 of 2: no GPU; pool default",
                "prep granted n1 (no GPU)",
                "prep failed exit status 1 on n1 (attempt 2 of 2; no attempts left)",
                "* failed task prep failed after 2 attempts: exit status 1",
            ],
            want_ending: Ending::Failed,
            want_tasks: &[
                "prep:failed:2/2:exit status 1",
                "train:not run:0/1:its dependencies never succeeded",
            ],
        },
        Case {
            name: "a preemption names the task it made room for and the work lost",
            events: vec![
                ready("train", 1),
                granted("train", 1, &[0, 1]),
                started("train"),
                ready("prep", 1),
                preempted("train", "prep", 12_300),
                stopped("train"),
                granted("prep", 1, &[]),
            ],
            want_lines: &[
                "train ready 2 GPUs; pool default",
                "train granted n1 GPUs 0,1",
                "train started on n1 (simulated)",
                "prep ready no GPU; pool default",
                "train preempted for prep (attempt 1); 12.300s of work lost; higher priority",
                "train stopped on n1 (preempted) after 1.500s, checkpointed",
                "prep granted n1 (no GPU)",
            ],
            want_ending: Ending::TimedOut,
            want_tasks: &["prep:running:1/2:", "train:queued:1/1:"],
        },
        Case {
            name: "an abort cancels the running task and the summary says so",
            events: vec![
                ready("prep", 1),
                granted("prep", 1, &[]),
                aborted(),
                cancelled("prep"),
                finished(Aborted, Some("aborted by alice: wrong data")),
            ],
            want_lines: &[
                "prep ready no GPU; pool default",
                "prep granted n1 (no GPU)",
                "* aborted the workload, by alice: wrong data",
                "prep cancelled aborted by alice: wrong data",
                "* aborted aborted by alice: wrong data",
            ],
            want_ending: Ending::Aborted,
            want_tasks: &[
                "prep:cancelled:1/2:aborted by alice: wrong data",
                "train:not run:0/1:its dependencies never succeeded",
            ],
        },
        Case {
            name: "the finish releases what still waits for a cause never seen",
            events: vec![
                ready("prep", 1),
                completed("prep", 1),
                finished(Succeeded, None),
            ],
            want_lines: &[
                "prep ready no GPU; pool default",
                "prep completed on n1",
                "* succeeded",
            ],
            want_ending: Ending::Succeeded,
            want_tasks: &["prep:succeeded:1/2:ran on n1", "train:succeeded:0/1:"],
        },
        Case {
            name: "other workloads' events and anything after the finish are ignored",
            events: vec![
                ready_of("other-0000000001", "prep", 1),
                Observed::Task(TaskEvent::Completed(TaskCompleted {
                    pool: "default".into(),
                    task: task_id("other-0000000001", "prep", 1),
                    node: "n1".into(),
                    lease: LeaseId(1),
                })),
                finished(Failed, Some("task prep failed")),
                ready("train", 1),
            ],
            want_lines: &["* failed task prep failed"],
            want_ending: Ending::Failed,
            want_tasks: &[
                "prep:not run:0/2:its dependencies never succeeded",
                "train:not run:0/1:its dependencies never succeeded",
            ],
        },
    ];
    for case in cases {
        let mut p = progress();
        let mut lines = Vec::new();
        for (i, event) in case.events.into_iter().enumerate() {
            lines.extend(p.observe(1_000_000 + 100 * i as i64, event));
        }
        let got: Vec<String> = lines.iter().map(brief).collect();
        assert_eq!(got, case.want_lines, "{}: lines", case.name);
        let summary = p.summary();
        assert_eq!(summary.ending, case.want_ending, "{}: ending", case.name);
        let tasks = rows(&summary);
        assert_eq!(tasks, case.want_tasks, "{}: tasks", case.name);
    }
}

#[test]
fn lines_and_the_summary_render_for_a_ci_log() {
    let mut p = progress();
    let mut lines = p.observe(1_000_250, ready("prep", 1));
    lines.extend(p.observe(1_012_345, granted("prep", 1, &[])));
    let rendered: Vec<String> = lines.iter().map(|l| l.render(p.width())).collect();
    // The ready line names the attempt's id, the one `allot explain` and the journal use.
    let prep1 = id("prep", 1);
    assert_eq!(
        rendered,
        [
            format!("[+    0.250] prep        ready        {prep1}: no GPU; pool default"),
            "[+   12.345] prep        granted      n1 (no GPU)".to_owned(),
        ]
    );
    p.observe(1_013_000, failed("prep", 1));
    p.observe(1_013_100, ready("prep", 2));
    p.observe(1_013_200, granted("prep", 2, &[]));
    p.observe(1_014_000, failed("prep", 2));
    p.observe(
        1_020_000,
        finished(
            WorkloadOutcome::Failed,
            Some("task prep failed after 2 attempts: exit status 1"),
        ),
    );
    // The summary names the latest attempt's id; a task never run has none.
    let prep2 = id("prep", 2).to_string();
    let w = prep2.len();
    assert_eq!(
        p.summary().render(),
        format!(
            "workload flaky-00000000aa failed after 20.000s: task prep failed after 2 attempts: exit status 1\n\
             \x20 TASK   {:<w$}  STATE      ATTEMPTS DETAIL\n\
             \x20 prep   {prep2}  failed     2/2      exit status 1\n\
             \x20 train  {:<w$}  not run    0/1      its dependencies never succeeded\n",
            "ID", "-"
        )
    );
    let json = serde_json::to_value(&lines[1]).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"t_ms": 12345, "task": "prep", "attempt": 1, "task_id": prep1.to_string(), "state": "granted", "detail": "n1 (no GPU)"})
    );
}

/// The planner's answer about [`SPEC`]'s workload, `secs` after its submission, with `prep` and
/// `train` as given: (state, attempt, node).
fn answer(
    secs: i64,
    workload: WorkloadState,
    prep: (&str, u32, Option<&str>),
    train: (&str, u32, Option<&str>),
) -> WorkloadDetail {
    use allot_events::query::planner::{GpuShare, TaskCounts, TaskNode, WorkloadSummary};
    let submitted = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let task =
        |name: &str, (state, attempt, node): (&str, u32, Option<&str>), gpus: u32| TaskDetail {
            name: name.into(),
            state: state.into(),
            attempt,
            max_attempts: if name == "prep" { 2 } else { 1 },
            nodes: node
                .map(|n| TaskNode {
                    node: n.into(),
                    gpus: (0..gpus)
                        .map(|index| GpuShare { index, milli: 1000 })
                        .collect(),
                })
                .into_iter()
                .collect(),
            started_at: node.map(|_| submitted),
            ended_at: None,
            reason: (state == "failed").then(|| "exit status 1".to_owned()),
        };
    WorkloadDetail {
        at: submitted + chrono::Duration::seconds(secs),
        workload: WorkloadSummary {
            id: ID.into(),
            team: "vision".into(),
            submitter: "ci".into(),
            run_id: None,
            submitted_at: Some(submitted),
            state: workload,
            reason: (workload == WorkloadState::Failed).then(|| "task prep failed".to_owned()),
            tasks: TaskCounts::default(),
        },
        tasks: vec![task("prep", prep, 0), task("train", train, 2)],
    }
}

#[test]
fn a_team_user_follows_each_tasks_state_as_the_planners_answers_show_it() {
    let checked = allot_workload::check(SPEC, allot_workload::Format::Yaml, Default::default())
        .expect("a valid spec");
    let mut polled = Polled::new(ID, &checked.workload);
    let brief = |lines: Vec<Line>| lines.iter().map(brief).collect::<Vec<_>>();
    let running = WorkloadState::Running;
    let waiting = ("waiting", 1, None);
    // Nothing to say while it waits for the allocator's first answer.
    assert!(brief(polled.observe(&answer(0, running, waiting, waiting))).is_empty());
    let first = answer(1, running, ("running", 1, Some("n1")), waiting);
    assert_eq!(
        brief(polled.observe(&first)),
        ["prep running on n1 (no GPU)"]
    );
    // The same answer again says nothing new.
    assert!(polled.observe(&first).is_empty());
    let retry = answer(2, running, ("ready", 2, None), waiting);
    let lines = polled.observe(&retry);
    assert_eq!(lines[0].task_id, Some(id("prep", 2).to_string()));
    assert_eq!(brief(lines), ["prep retried attempt 2 of 2"]);
    let failed = answer(3, WorkloadState::Failed, ("failed", 2, Some("n1")), waiting);
    assert_eq!(
        brief(polled.observe(&failed)),
        ["prep failed exit status 1", "* failed task prep failed"]
    );
    let summary = Polled::summary(&failed);
    assert_eq!(summary.ending, Ending::Failed);
    assert_eq!(summary.elapsed_ms, 3_000);
    assert_eq!(
        rows(&summary),
        [
            "prep:failed:2/2:exit status 1",
            "train:not run:0/1:its dependencies never succeeded"
        ]
    );
    // A grant on two GPUs is told as the event log tells it.
    let train = answer(
        4,
        running,
        ("succeeded", 1, Some("n1")),
        ("running", 1, Some("n2")),
    );
    assert!(brief(polled.observe(&train)).contains(&"train running on n2 GPUs 0,1".to_owned()),);
    assert_eq!(Polled::summary(&train).ending, Ending::TimedOut);
}
