use allot_events::workload::WorkloadOutcome;
use allot_sched::{Gang, LeaseId, TaskSpec, Time};

use super::*;

/// A task fixture: `task("train").after("prep").gang("g").retries(3, 100)`.
struct Fixture(Task);

fn task(name: &str) -> Fixture {
    Fixture(Task {
        name: name.into(),
        after: Vec::new(),
        gang: None,
        status: TaskStatus::Waiting,
        attempt: 1,
        max_attempts: 1,
        backoff: 0,
        template: TaskSpec::new(0, "vision", 1),
        run: RunSpec::default(),
        started: None,
        predicted: None,
        reason: None,
        right_size: false,
    })
}

impl Fixture {
    fn after(mut self, dep: &str) -> Self {
        self.0.after.push(dep.into());
        self
    }
    fn gang(mut self, gang: &str, size: u32) -> Self {
        self.0.gang = Some(gang.into());
        self.0.template.gang = Some(Gang {
            name: format!("w/{gang}"),
            size,
        });
        self
    }
    fn estimate(mut self, ms: Time) -> Self {
        self.0.template.predicted_duration = Some(ms);
        self
    }
    fn retries(mut self, max_attempts: u32, backoff: Time) -> Self {
        self.0.max_attempts = max_attempts;
        self.0.backoff = backoff;
        self
    }
}

fn workload(tasks: Vec<Fixture>) -> Workload {
    Workload {
        id: "w".into(),
        team: "vision".into(),
        pool: "default".into(),
        status: WorkloadStatus::Running,
        reason: None,
        tasks: tasks.into_iter().map(|f| f.0).collect(),
    }
}

/// What happens to the workload, in order.
#[derive(Debug, Clone, Copy)]
enum Step {
    Start,
    Granted(&'static str, u32),
    Preempted(&'static str, u32),
    Completed(&'static str, u32),
    Failed(&'static str, u32, Time),
    Abort(Option<&'static str>),
}

/// Effects, briefly: `ready train#2 @1100 gang w/g#2x2`, `cancel train#1`, `finished failed`.
fn brief(w: &Workload, effect: &Effect) -> String {
    match effect {
        Effect::Ready {
            task,
            attempt,
            spec,
            not_before,
        } => {
            assert_eq!(spec.id, task_id(&w.id, task, *attempt), "the attempt's id");
            let mut s = format!("ready {task}#{attempt}");
            if *not_before > 0 {
                s.push_str(&format!(" @{not_before}"));
            }
            if let Some(g) = spec.gang.as_ref().filter(|_| *attempt > 1) {
                s.push_str(&format!(" gang {}x{}", g.name, g.size));
            }
            s
        }
        Effect::Cancel {
            task, id, lease, ..
        } => {
            let attempt = (1..10)
                .find(|a| task_id(&w.id, task, *a) == *id)
                .expect("an attempt's id");
            let mut s = format!("cancel {task}#{attempt}");
            if let Some(l) = lease {
                s.push_str(&format!(" lease {}", l.0));
            }
            s
        }
        Effect::Finished { outcome, .. } => {
            format!("finished {}", WorkloadStatus::Finished(*outcome).as_str())
        }
        Effect::Preload {
            task,
            expected_at,
            not_before,
            ..
        } => format!("preload {task} @{not_before} expected {expected_at}"),
    }
}

fn statuses(w: &Workload) -> String {
    w.tasks
        .iter()
        .map(|t| format!("{}:{}#{}", t.name, t.status.as_str(), t.attempt))
        .collect::<Vec<_>>()
        .join(" ")
}

struct Case {
    name: &'static str,
    tasks: Vec<Fixture>,
    steps: Vec<Step>,
    want_effects: Vec<&'static str>,
    want_tasks: &'static str,
    want_workload: &'static str,
}

fn pipeline() -> Vec<Fixture> {
    vec![
        task("prep"),
        task("train-0").after("prep").gang("train", 2),
        task("train-1").after("prep").gang("train", 2),
        task("eval").after("train-0").after("train-1"),
    ]
}

#[test]
fn the_dag_state_machine() {
    use Step::*;
    let cases = vec![
        Case {
            name: "a pipeline runs stage by stage and succeeds",
            tasks: pipeline(),
            steps: vec![
                Start,
                Granted("prep", 1),
                Completed("prep", 1),
                Granted("train-0", 1),
                Granted("train-1", 1),
                Completed("train-0", 1),
                Completed("train-1", 1),
                Completed("eval", 1),
            ],
            want_effects: vec![
                "ready prep#1",
                "ready train-0#1",
                "ready train-1#1",
                "ready eval#1",
                "finished succeeded",
            ],
            want_tasks: "prep:succeeded#1 train-0:succeeded#1 train-1:succeeded#1 eval:succeeded#1",
            want_workload: "succeeded",
        },
        Case {
            name: "a completion read before its grant still counts",
            tasks: vec![task("a"), task("b").after("a")],
            steps: vec![Start, Completed("a", 1), Granted("a", 1)],
            want_effects: vec!["ready a#1", "ready b#1"],
            want_tasks: "a:succeeded#1 b:ready#1",
            want_workload: "running",
        },
        Case {
            name: "a task waits for all of its dependencies",
            tasks: vec![task("a"), task("b"), task("c").after("a").after("b")],
            steps: vec![Start, Completed("a", 1)],
            want_effects: vec!["ready a#1", "ready b#1"],
            want_tasks: "a:succeeded#1 b:ready#1 c:waiting#1",
            want_workload: "running",
        },
        Case {
            name: "a failed run is retried with doubling backoff, then fails the workload and cancels what follows",
            tasks: vec![task("a").retries(3, 100), task("b").after("a")],
            steps: vec![
                Start,
                Granted("a", 1),
                Failed("a", 1, 1_000),
                Granted("a", 2),
                Failed("a", 2, 2_000),
                Failed("a", 3, 3_000),
            ],
            want_effects: vec![
                "ready a#1",
                "ready a#2 @1100",
                "ready a#3 @2200",
                "finished failed",
            ],
            want_tasks: "a:failed#3 b:cancelled#1",
            want_workload: "failed",
        },
        Case {
            name: "a failure of an earlier attempt is stale and changes nothing",
            tasks: vec![task("a").retries(2, 0)],
            steps: vec![Start, Failed("a", 1, 10), Failed("a", 1, 20)],
            want_effects: vec!["ready a#1", "ready a#2 @10"],
            want_tasks: "a:ready#2",
            want_workload: "running",
        },
        Case {
            name: "a final failure cancels the independent branch that is running",
            tasks: vec![task("a"), task("b")],
            steps: vec![Start, Granted("b", 1), Failed("a", 1, 5)],
            want_effects: vec!["ready a#1", "ready b#1", "cancel b#1", "finished failed"],
            want_tasks: "a:failed#1 b:cancelled#1",
            want_workload: "failed",
        },
        Case {
            name: "a gang member's failure retries the whole gang under a new gang name",
            tasks: vec![
                task("t0").gang("g", 2).retries(2, 50),
                task("t1").gang("g", 2).retries(2, 50),
            ],
            steps: vec![
                Start,
                Granted("t0", 1),
                Granted("t1", 1),
                Failed("t0", 1, 1_000),
            ],
            want_effects: vec![
                "ready t0#1",
                "ready t1#1",
                "ready t0#2 @1050 gang w/g#2x2",
                "cancel t1#1",
                "ready t1#2 @1050 gang w/g#2x2",
            ],
            want_tasks: "t0:ready#2 t1:ready#2",
            want_workload: "running",
        },
        Case {
            name: "a late grant of a superseded run is cancelled",
            tasks: vec![
                task("t0").gang("g", 2).retries(2, 0),
                task("t1").gang("g", 2).retries(2, 0),
            ],
            steps: vec![Start, Failed("t0", 1, 7), Granted("t1", 1)],
            want_effects: vec![
                "ready t0#1",
                "ready t1#1",
                "ready t0#2 @7 gang w/g#2x2",
                "ready t1#2 @7 gang w/g#2x2",
                "cancel t1#1 lease 9",
            ],
            want_tasks: "t0:ready#2 t1:ready#2",
            want_workload: "running",
        },
        Case {
            name: "aborting the workload cancels the running stage and what follows",
            tasks: pipeline(),
            steps: vec![
                Start,
                Completed("prep", 1),
                Granted("train-0", 1),
                Granted("train-1", 1),
                Abort(None),
            ],
            want_effects: vec![
                "ready prep#1",
                "ready train-0#1",
                "ready train-1#1",
                "cancel train-0#1",
                "cancel train-1#1",
                "finished aborted",
            ],
            want_tasks: "prep:succeeded#1 train-0:cancelled#1 train-1:cancelled#1 eval:cancelled#1",
            want_workload: "aborted",
        },
        Case {
            name: "aborting one gang member cancels its gang mate and dependents; the rest finishes as aborted",
            tasks: vec![
                task("prep"),
                task("train-0").after("prep").gang("train", 2),
                task("train-1").after("prep").gang("train", 2),
                task("eval").after("train-0"),
                task("report").after("prep"),
            ],
            steps: vec![
                Start,
                Completed("prep", 1),
                Granted("train-1", 1),
                Abort(Some("train-0")),
                Completed("report", 1),
            ],
            want_effects: vec![
                "ready prep#1",
                "ready train-0#1",
                "ready train-1#1",
                "ready report#1",
                "cancel train-0#1",
                "cancel train-1#1",
                "finished aborted",
            ],
            want_tasks: "prep:succeeded#1 train-0:cancelled#1 train-1:cancelled#1 eval:cancelled#1 report:succeeded#1",
            want_workload: "aborted",
        },
        Case {
            name: "a queued task is withdrawn, and cancelled again if its grant raced the withdrawal",
            tasks: vec![task("a")],
            steps: vec![Start, Abort(None), Granted("a", 1)],
            want_effects: vec![
                "ready a#1",
                "cancel a#1",
                "finished aborted",
                "cancel a#1 lease 9",
            ],
            want_tasks: "a:cancelled#1",
            want_workload: "aborted",
        },
        Case {
            name: "a preempted task is queued again and its completion still counts",
            tasks: vec![task("a")],
            steps: vec![
                Start,
                Granted("a", 1),
                Preempted("a", 1),
                Granted("a", 1),
                Completed("a", 1),
            ],
            want_effects: vec!["ready a#1", "finished succeeded"],
            want_tasks: "a:succeeded#1",
            want_workload: "succeeded",
        },
        Case {
            name: "nothing happens to a finished workload",
            tasks: vec![task("a")],
            steps: vec![Start, Completed("a", 1), Abort(None), Failed("a", 1, 3)],
            want_effects: vec!["ready a#1", "finished succeeded"],
            want_tasks: "a:succeeded#1",
            want_workload: "succeeded",
        },
    ];
    for case in cases {
        let mut w = workload(case.tasks);
        let mut effects = Vec::new();
        for step in case.steps {
            let out = match step {
                Start => w.start(),
                Granted(t, a) => w.granted(t, a, LeaseId(9), 1_000, None),
                Preempted(t, a) => w.preempted(t, a),
                Completed(t, a) => w.completed(t, a),
                Failed(t, a, at) => w.failed(t, a, "exit status 1", at),
                Abort(t) => w.abort(t, "alice", "wrong data").unwrap(),
            };
            effects.extend(out.iter().map(|e| brief(&w, e)));
        }
        assert_eq!(effects, case.want_effects, "{}: effects", case.name);
        assert_eq!(statuses(&w), case.want_tasks, "{}: tasks", case.name);
        assert_eq!(
            w.status.as_str(),
            case.want_workload,
            "{}: workload",
            case.name
        );
    }
}

#[test]
fn the_look_ahead_preloads_a_task_a_window_before_its_last_predecessor_should_end() {
    struct Case {
        name: &'static str,
        tasks: Vec<Fixture>,
        /// (task, granted at)
        grants: Vec<(&'static str, Time)>,
        window: Option<Time>,
        want: Vec<&'static str>,
    }
    let cases = [
        Case {
            name: "one predecessor with an estimate",
            tasks: vec![task("a").estimate(10_000), task("c").after("a")],
            grants: vec![("a", 1_000)],
            window: Some(3_000),
            want: vec!["preload c @8000 expected 11000"],
        },
        Case {
            name: "no look-ahead configured",
            tasks: vec![task("a").estimate(10_000), task("c").after("a")],
            grants: vec![("a", 1_000)],
            window: None,
            want: vec![],
        },
        Case {
            name: "a predecessor without an estimate: nothing to expect",
            tasks: vec![task("a"), task("c").after("a")],
            grants: vec![("a", 1_000)],
            window: Some(3_000),
            want: vec![],
        },
        Case {
            name: "two predecessors: only once both run, expected when the later ends",
            tasks: vec![
                task("a").estimate(10_000),
                task("b").estimate(20_000),
                task("c").after("a").after("b"),
            ],
            grants: vec![("a", 1_000), ("b", 2_000)],
            window: Some(3_000),
            want: vec!["preload c @19000 expected 22000"],
        },
        Case {
            name: "a window longer than the wait: published at once",
            tasks: vec![task("a").estimate(1_000), task("c").after("a")],
            grants: vec![("a", 1_000)],
            window: Some(60_000),
            want: vec!["preload c @0 expected 2000"],
        },
    ];
    for case in cases {
        let mut w = workload(case.tasks);
        w.start();
        let mut effects = Vec::new();
        for (t, at) in case.grants {
            let out = w.granted(t, 1, LeaseId(9), at, case.window);
            effects.extend(out.iter().map(|e| brief(&w, e)));
        }
        assert_eq!(effects, case.want, "{}", case.name);
    }
}

#[test]
fn the_predictors_estimate_times_the_look_ahead_in_place_of_the_declared_one() {
    let window = Some(3_000);
    // Granted with no estimate: nothing to expect, until the prediction comes.
    let mut w = workload(vec![task("a"), task("c").after("a")]);
    w.start();
    assert!(w.granted("a", 1, LeaseId(9), 1_000, window).is_empty());
    let out = w.predicted("a", 1, 20_000, window);
    let got: Vec<String> = out.iter().map(|e| brief(&w, e)).collect();
    assert_eq!(got, ["preload c @18000 expected 21000"]);
    // The same prediction again changes nothing; one for another attempt is not this run's.
    assert!(w.predicted("a", 1, 20_000, window).is_empty());
    assert!(w.predicted("a", 2, 5_000, window).is_empty());

    // Predicted before its grant: the grant's look-ahead uses the prediction, not the
    // declared estimate.
    let mut w = workload(vec![task("a").estimate(60_000), task("c").after("a")]);
    w.start();
    assert!(w.predicted("a", 1, 10_000, window).is_empty());
    let out = w.granted("a", 1, LeaseId(9), 1_000, window);
    let got: Vec<String> = out.iter().map(|e| brief(&w, e)).collect();
    assert_eq!(got, ["preload c @8000 expected 11000"]);
}

#[test]
fn an_abort_naming_an_unknown_task_is_refused() {
    let mut w = workload(vec![task("a")]);
    let err = w.abort(Some("b"), "alice", "oops").unwrap_err();
    assert_eq!(err.to_string(), "workload w has no task \"b\"");
}

#[test]
fn a_failure_says_which_task_failed_how_often_and_why() {
    let mut w = workload(vec![task("a").retries(2, 0)]);
    w.start();
    w.failed("a", 1, "exit status 1", 0);
    let out = w.failed("a", 2, "exit status 3", 0);
    assert_eq!(
        out.last(),
        Some(&Effect::Finished {
            outcome: WorkloadOutcome::Failed,
            reason: Some("task a failed after 2 attempts: exit status 3".into()),
        })
    );
}

#[test]
fn attempts_have_distinct_stable_ids_that_fit_in_a_double() {
    let a1 = task_id("w", "a", 1);
    assert_eq!(a1, task_id("w", "a", 1));
    assert_ne!(a1, task_id("w", "a", 2));
    assert_ne!(a1, task_id("w2", "a", 1));
    for attempt in 1..100 {
        assert!(task_id("w", "a", attempt).0 < 1 << 53);
    }
}
