use super::*;
use crate::policy::{Fifo, SjfOracle};

fn node(name: &str) -> NodeBuilder {
    NodeBuilder(NodeSpec::new(name, 8, "H100"))
}

struct NodeBuilder(NodeSpec);
impl NodeBuilder {
    fn gpus(mut self, gpus: u32) -> Self {
        self.0.gpus = gpus;
        self
    }
    fn model(mut self, model: &str) -> Self {
        self.0.gpu_model = model.into();
        self
    }
}

fn task(id: u64) -> TaskBuilder {
    TaskBuilder(TaskSpec::new(id, "team-a", 1))
}

struct TaskBuilder(TaskSpec);
impl TaskBuilder {
    fn gpus(mut self, gpus: u32) -> Self {
        self.0.gpus = gpus;
        self
    }
    fn milli(mut self, milli: u32) -> Self {
        self.0.gpu_milli = milli;
        self
    }
    fn lasts(mut self, ms: u64) -> Self {
        self.0.oracle_duration = Some(ms);
        self
    }
    fn models(mut self, models: &[&str]) -> Self {
        self.0.gpu_models = models.iter().map(|m| (*m).to_owned()).collect();
        self
    }
}

fn scheduler(policy: Box<dyn Policy>, nodes: Vec<NodeBuilder>) -> Scheduler {
    let mut s = Scheduler::new(policy);
    for n in nodes {
        s.apply(Input::NodeAdded(n.0)).unwrap();
    }
    s
}

/// Submits tasks at time 0 and runs one pass; returns (task, node names) of the grants.
fn run_pass(s: &mut Scheduler, tasks: Vec<TaskBuilder>) -> Vec<(u64, Vec<String>)> {
    for t in tasks {
        s.apply(Input::TaskSubmitted { task: t.0, at: 0 }).unwrap();
    }
    let decisions = s.apply(Input::Schedule { at: 0 }).unwrap();
    granted(s, decisions)
}

fn granted(s: &Scheduler, decisions: Vec<Decision>) -> Vec<(u64, Vec<String>)> {
    decisions
        .into_iter()
        .filter_map(|d| match d {
            Decision::Granted {
                task, placement, ..
            } => Some((
                task.0,
                placement
                    .shares
                    .iter()
                    .map(|sh| s.cluster().node(sh.node).spec.name.clone())
                    .collect(),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn placement_and_order_table() {
    struct Case {
        name: &'static str,
        policy: Box<dyn Policy>,
        nodes: Vec<NodeBuilder>,
        /// Tasks already running (granted in a first pass).
        running: Vec<TaskBuilder>,
        tasks: Vec<TaskBuilder>,
        want: Vec<(u64, Vec<&'static str>)>,
    }
    let cases = vec![
        Case {
            name: "best fit puts a task on the fullest node that still fits",
            policy: Box::new(Fifo),
            nodes: vec![node("n1"), node("n2"), node("n3")],
            running: vec![task(1).gpus(6), task(2).gpus(3)],
            tasks: vec![task(3).gpus(2)],
            want: vec![(3, vec!["n1"])],
        },
        Case {
            name: "ties go to the lowest index",
            policy: Box::new(Fifo),
            nodes: vec![node("n1"), node("n2")],
            running: vec![],
            tasks: vec![task(1).gpus(4)],
            want: vec![(1, vec!["n1"])],
        },
        Case {
            name: "a task larger than a node takes whole idle nodes, lowest first",
            policy: Box::new(Fifo),
            nodes: vec![node("n1"), node("n2"), node("n3")],
            running: vec![task(1).gpus(1)],
            tasks: vec![task(2).gpus(16)],
            want: vec![(2, vec!["n2", "n3"])],
        },
        Case {
            name: "fifo stops at the first task that does not fit",
            policy: Box::new(Fifo),
            nodes: vec![node("n1")],
            running: vec![task(1).gpus(4)],
            tasks: vec![task(2).gpus(8), task(3).gpus(1)],
            want: vec![],
        },
        Case {
            name: "sjf-oracle starts the shortest first",
            policy: Box::new(SjfOracle),
            nodes: vec![node("n1")],
            running: vec![],
            tasks: vec![task(1).gpus(8).lasts(500), task(2).gpus(8).lasts(100)],
            want: vec![(2, vec!["n1"])],
        },
        Case {
            name: "a task only runs on a GPU model it accepts",
            policy: Box::new(Fifo),
            nodes: vec![node("n1").model("T4"), node("n2").model("A100")],
            running: vec![],
            tasks: vec![task(1).gpus(2).models(&["A100"])],
            want: vec![(1, vec!["n2"])],
        },
        Case {
            name: "fractions share a GPU, tightest fit first",
            policy: Box::new(Fifo),
            nodes: vec![node("n1").gpus(2)],
            running: vec![task(1).milli(700)],
            tasks: vec![task(2).milli(300), task(3).milli(500)],
            want: vec![(2, vec!["n1"]), (3, vec!["n1"])],
        },
    ];
    for case in cases {
        let mut s = scheduler(case.policy, case.nodes);
        run_pass(&mut s, case.running);
        let got = run_pass(&mut s, case.tasks);
        let want: Vec<(u64, Vec<String>)> = case
            .want
            .into_iter()
            .map(|(t, n)| (t, n.into_iter().map(String::from).collect()))
            .collect();
        assert_eq!(got, want, "{}", case.name);
    }
}

#[test]
fn a_finished_task_frees_its_gpus_for_the_blocked_head() {
    let mut s = scheduler(Box::new(Fifo), vec![node("n1")]);
    run_pass(&mut s, vec![task(1).gpus(8)]);
    let waiting = run_pass(&mut s, vec![task(2).gpus(4)]);
    assert!(waiting.is_empty());
    let released = s
        .apply(Input::TaskFinished {
            task: TaskId(1),
            at: 10,
            run: None,
        })
        .unwrap();
    assert!(matches!(
        released[..],
        [Decision::Released {
            task: TaskId(1),
            ..
        }]
    ));
    let decisions = s.apply(Input::Schedule { at: 10 }).unwrap();
    assert_eq!(granted(&s, decisions), vec![(2, vec!["n1".to_owned()])]);
}

#[test]
fn a_blocked_head_is_told_why_once_until_the_reason_changes() {
    let mut s = scheduler(Box::new(Fifo), vec![node("n1")]);
    run_pass(&mut s, vec![task(1).gpus(6)]);
    s.apply(Input::TaskSubmitted {
        task: task(2).gpus(4).0,
        at: 1,
    })
    .unwrap();
    let first = s.apply(Input::Schedule { at: 1 }).unwrap();
    assert!(
        matches!(
            &first[..],
            [Decision::Waiting {
                task: TaskId(2),
                reason: WaitReason::NoCapacity {
                    gpus: 4,
                    free_gpus: 2
                },
                ..
            }]
        ),
        "{first:?}"
    );
    assert!(
        s.apply(Input::Schedule { at: 2 }).unwrap().is_empty(),
        "same reason, no repeat"
    );
}

#[test]
fn bad_inputs_are_typed_errors() {
    let mut s = scheduler(Box::new(Fifo), vec![node("n1")]);
    s.apply(Input::TaskSubmitted {
        task: task(1).0,
        at: 0,
    })
    .unwrap();
    assert_eq!(
        s.apply(Input::TaskSubmitted {
            task: task(1).0,
            at: 0
        }),
        Err(ApplyError::DuplicateTask(TaskId(1)))
    );
    assert_eq!(
        s.apply(Input::TaskFinished {
            task: TaskId(1),
            at: 0,
            run: None,
        }),
        Err(ApplyError::NotRunning(TaskId(1)))
    );
    let too_big = s.apply(Input::TaskSubmitted {
        task: task(2).gpus(9).0,
        at: 0,
    });
    assert!(
        matches!(too_big, Err(ApplyError::Unplaceable { .. })),
        "{too_big:?}"
    );
    let wrong_model = s.apply(Input::TaskSubmitted {
        task: task(3).models(&["TPU"]).0,
        at: 0,
    });
    assert!(
        matches!(wrong_model, Err(ApplyError::Unplaceable { .. })),
        "{wrong_model:?}"
    );
}

#[test]
fn a_run_end_must_name_the_run_it_ends() {
    let mut s = scheduler(Box::new(Fifo), vec![node("n1")]);
    let lease_of = |decisions: &[Decision], id: u64| {
        decisions.iter().find_map(|d| match d {
            Decision::Granted { task, lease, .. } if *task == TaskId(id) => Some(*lease),
            _ => None,
        })
    };
    let requeue = |id: u64, at: u64| Input::TaskRequeued {
        task: TaskId(id),
        reason: "idle".into(),
        at,
    };
    assert_eq!(
        run_pass(&mut s, vec![task(1).gpus(4), task(2).gpus(4)]).len(),
        2
    );
    let one = s.running_lease(TaskId(1)).unwrap().0;
    let two = s.running_lease(TaskId(2)).unwrap().0;
    s.apply(requeue(1, 2)).unwrap();

    // Stopped, task 1 has no running lease; its stopped run is `one`, not `two`.
    let refused = |s: &mut Scheduler, input: Input, lease: LeaseId| {
        assert_eq!(
            s.apply(input),
            Err(ApplyError::NoSuchRun {
                task: TaskId(1),
                lease
            })
        );
    };
    refused(
        &mut s,
        Input::TaskWithdrawn {
            task: TaskId(1),
            reason: "its run ended".into(),
            at: 3,
            run: Some(RunEnd::Completed { lease: two }),
        },
        two,
    );
    let again = s.apply(pass(4)).unwrap();
    let three = lease_of(&again, 1).expect("task 1 runs again");
    refused(
        &mut s,
        Input::TaskFinished {
            task: TaskId(1),
            at: 5,
            run: Some(RunEnd::Failed {
                lease: one,
                reason: "exit code 1".into(),
            }),
        },
        one,
    );
    assert_eq!(s.running_lease(TaskId(1)).map(|(l, _)| l), Some(three));
    let released = s
        .apply(Input::TaskFinished {
            task: TaskId(1),
            at: 6,
            run: Some(RunEnd::Completed { lease: three }),
        })
        .unwrap();
    assert!(matches!(
        released[..],
        [Decision::Released {
            task: TaskId(1),
            ..
        }]
    ));

    // Stopped, task 2 waits to run again; its stopped run ended, so it is withdrawn.
    s.apply(requeue(2, 6)).unwrap();
    let withdrawn = s
        .apply(Input::TaskWithdrawn {
            task: TaskId(2),
            reason: "its run ended as it was stopped".into(),
            at: 6,
            run: Some(RunEnd::Completed { lease: two }),
        })
        .unwrap();
    assert!(
        matches!(
            withdrawn[..],
            [Decision::Withdrawn {
                task: TaskId(2),
                ..
            }]
        ),
        "{withdrawn:?}"
    );
    assert!(!s.holds(TaskId(2)));
}

/// Applies `inputs` in order and returns every decision, rendered short for comparison:
/// `grant 2@n1`, `preempt 1 for 2`, `release 1`.
fn script(policy: &str, nodes: Vec<NodeBuilder>, inputs: Vec<Input>) -> Vec<String> {
    let mut s = scheduler(crate::policy::by_name(policy).unwrap(), nodes);
    let mut log = Vec::new();
    for input in inputs {
        for d in s.apply(input).unwrap() {
            match d {
                Decision::Granted {
                    task, placement, ..
                } => {
                    let nodes: Vec<String> = placement
                        .shares
                        .iter()
                        .map(|sh| s.cluster().node(sh.node).spec.name.clone())
                        .collect();
                    log.push(format!("grant {}@{}", task.0, nodes.join("+")));
                }
                Decision::Preempted { task, for_task, .. } => log.push(format!(
                    "preempt {} for {}",
                    task.0,
                    for_task.map_or(0, |t| t.0)
                )),
                Decision::Released { task, .. } => log.push(format!("release {}", task.0)),
                Decision::Reserved { task, .. } => log.push(format!("reserve {}", task.0)),
                Decision::Withdrawn { task, .. } => log.push(format!("withdraw {}", task.0)),
                Decision::Waiting { .. } => {}
            }
        }
    }
    log
}

fn submit(t: TaskBuilder, at: u64) -> Input {
    Input::TaskSubmitted { task: t.0, at }
}

fn pass(at: u64) -> Input {
    Input::Schedule { at }
}

fn finish(id: u64, at: u64) -> Input {
    Input::TaskFinished {
        task: TaskId(id),
        at,
        run: None,
    }
}

fn quota(team: &str, gpus: u64) -> Input {
    Input::TeamQuota {
        team: team.into(),
        quota: crate::quota::Quota::gpus(gpus * 1000),
    }
}

fn team(mut t: TaskBuilder, name: &str) -> TaskBuilder {
    t.0.team = name.into();
    t
}

#[test]
fn preemption_and_backfill_table() {
    struct Case {
        name: &'static str,
        policy: &'static str,
        inputs: Vec<Input>,
        want: Vec<&'static str>,
    }
    let hour = 3_600_000;
    let cases = vec![
        Case {
            name: "srtf-oracle preempts the task with more remaining time",
            policy: "srtf-oracle",
            inputs: vec![
                submit(task(1).gpus(8).lasts(10 * hour), 0),
                pass(0),
                submit(task(2).gpus(8).lasts(hour), 60_000),
                pass(60_000),
            ],
            want: vec!["grant 1@n1", "preempt 1 for 2", "grant 2@n1"],
        },
        Case {
            name: "srtf-oracle leaves a task with less remaining alone",
            policy: "srtf-oracle",
            inputs: vec![
                submit(task(1).gpus(8).lasts(hour), 0),
                pass(0),
                submit(task(2).gpus(8).lasts(10 * hour), 1),
                pass(1),
            ],
            want: vec!["grant 1@n1"],
        },
        Case {
            name: "tiresias demotes a task past 3,600 GPU·s and a newcomer preempts it",
            policy: "tiresias",
            inputs: vec![
                submit(task(1).gpus(8), 0),
                pass(0),
                submit(task(2).gpus(8), 500_000),
                pass(500_000),
            ],
            want: vec!["grant 1@n1", "preempt 1 for 2", "grant 2@n1"],
        },
        Case {
            name: "tiresias does not preempt within the first queue",
            policy: "tiresias",
            inputs: vec![
                submit(task(1).gpus(8), 0),
                pass(0),
                submit(task(2).gpus(8), 100_000),
                pass(100_000),
            ],
            want: vec!["grant 1@n1"],
        },
        Case {
            name: "kueue: a team under its nominal quota reclaims GPUs a borrower holds",
            policy: "kueue",
            inputs: vec![
                quota("a", 4),
                quota("b", 4),
                submit(team(task(1).gpus(8), "b"), 0),
                pass(0),
                submit(team(task(2).gpus(4), "a"), 1),
                pass(1),
            ],
            want: vec!["grant 1@n1", "preempt 1 for 2", "grant 2@n1"],
        },
        Case {
            name: "kueue: a borrower cannot preempt a team within its quota",
            policy: "kueue",
            inputs: vec![
                quota("a", 4),
                quota("b", 4),
                submit(team(task(1).gpus(4), "a"), 0),
                pass(0),
                submit(team(task(2).gpus(8), "b"), 1),
                pass(1),
            ],
            want: vec!["grant 1@n1"],
        },
        Case {
            name: "fifo-backfill starts a short task that ends before the head's reservation",
            policy: "fifo-backfill",
            inputs: vec![
                // Teach the history estimator: team-a tasks last about a minute.
                submit(task(90).gpus(1), 0),
                submit(task(91).gpus(1), 0),
                submit(task(92).gpus(1), 0),
                pass(0),
                finish(90, 60_000),
                finish(91, 60_000),
                finish(92, 60_000),
                submit(task(1).gpus(4), 60_000),
                submit(task(2).gpus(8), 60_000),
                submit(task(3).gpus(1), 60_000),
                pass(60_000),
            ],
            want: vec![
                "grant 90@n1",
                "grant 91@n1",
                "grant 92@n1",
                "release 90",
                "release 91",
                "release 92",
                "grant 1@n1",
                "grant 3@n1",
            ],
        },
        Case {
            name: "fifo-backfill holds back a task that would still run when the head is due",
            policy: "fifo-backfill",
            inputs: vec![
                // Teach the history estimator: team-a tasks last about a minute.
                submit(task(90).gpus(1), 0),
                submit(task(91).gpus(1), 0),
                submit(task(92).gpus(1), 0),
                pass(0),
                finish(90, 60_000),
                finish(91, 60_000),
                finish(92, 60_000),
                submit(task(1).gpus(4), 60_000),
                pass(60_000),
                submit(task(2).gpus(8), 70_000),
                submit(task(3).gpus(1), 70_000),
                pass(70_000),
            ],
            want: vec![
                "grant 90@n1",
                "grant 91@n1",
                "grant 92@n1",
                "release 90",
                "release 91",
                "release 92",
                "grant 1@n1",
            ],
        },
    ];
    for case in cases {
        let got = script(case.policy, vec![node("n1")], case.inputs);
        assert_eq!(got, case.want, "{}", case.name);
    }
}

#[test]
fn allot_preempts_only_when_the_gain_is_worth_the_lost_work() {
    // Estimates come from history: team-a 8-GPU tasks have lasted 1 h.
    let hour = 3_600_000;
    let mut inputs = Vec::new();
    for i in 0..3 {
        inputs.push(submit(task(90 + i).gpus(8), i * hour));
        inputs.push(pass(i * hour));
        inputs.push(finish(90 + i, (i + 1) * hour));
    }
    let t = 3 * hour;
    // Task 1 has run 65 min of an expected hour: as long again is expected of it, under twice
    // a newcomer's hour, so the newcomer must not preempt it. At 2 h 1 min it counts as long
    // and is preempted: it checkpoints every 10 min, so that costs a restart and a minute of
    // work (and the newcomer has waited 56 min, short of the starvation guard's hour).
    let mut one = task(1).gpus(8);
    one.0.checkpoint_every = Some(10 * 60_000);
    inputs.extend([
        submit(one, t),
        pass(t),
        submit(task(2).gpus(8), t + 65 * 60_000),
        pass(t + 65 * 60_000),
        pass(t + 2 * hour + 60_000),
    ]);
    let got = script("allot", vec![node("n1")], inputs);
    let tail: Vec<&str> = got.iter().map(String::as_str).skip(6).collect();
    assert_eq!(
        tail,
        ["grant 1@n1", "preempt 1 for 2", "grant 2@n1"],
        "{got:?}"
    );
}

#[test]
fn allot_does_not_trade_short_tasks_for_a_gain_smaller_than_a_restart() {
    // Team-a's 8-GPU tasks have lasted 1 s. Task 1 has run 3 s, past its estimate, so it
    // counts as long (3 s more); task 2 is expected to take 1 s. Three times shorter, but
    // swapping them would save 2 s at the price of a restart: task 1 keeps running.
    let second = 1_000;
    let mut inputs = Vec::new();
    for i in 0..3 {
        inputs.push(submit(task(90 + i).gpus(8), i * second));
        inputs.push(pass(i * second));
        inputs.push(finish(90 + i, (i + 1) * second));
    }
    let t = 3 * second;
    inputs.extend([
        submit(task(1).gpus(8), t),
        pass(t),
        submit(task(2).gpus(8), t + 3 * second),
        pass(t + 3 * second),
        pass(t + 4 * second),
    ]);
    let got = script("allot", vec![node("n1")], inputs);
    let tail: Vec<&str> = got.iter().map(String::as_str).skip(6).collect();
    assert_eq!(tail, ["grant 1@n1"], "{got:?}");
}

#[test]
fn allot_moves_small_tasks_to_start_one_that_fragmentation_alone_blocks() {
    // Two nodes of 4 GPUs; 1-GPU tasks have lasted 10 h. Eight of them fill the cluster; two
    // finish on each node a minute later: 4 GPUs are free, 2 on each node, and a 4-GPU task
    // would wait about 10 h. Moving the two left on one node (a minute of work each, plus a
    // restart) lets it start now, and they restart at once on the other node.
    let hour = 3_600_000;
    let minute = 60_000;
    let mut inputs = vec![submit(task(90).gpus(1), 0), pass(0), finish(90, 10 * hour)];
    let t = 10 * hour;
    for id in 1..=8 {
        inputs.push(submit(task(id).gpus(1), t));
    }
    inputs.push(pass(t));
    let got = script(
        "allot",
        vec![node("n1").gpus(4), node("n2").gpus(4)],
        inputs.clone(),
    );
    let on = |n: &str| -> Vec<u64> {
        got.iter()
            .filter_map(|g| g.strip_prefix("grant ")?.strip_suffix(&format!("@{n}")))
            .filter_map(|id| id.parse().ok())
            .filter(|id| *id != 90)
            .collect()
    };
    let (n1, n2) = (on("n1"), on("n2"));
    assert_eq!((n1.len(), n2.len()), (4, 4), "{got:?}");
    for id in [n1[0], n1[1], n2[0], n2[1]] {
        inputs.push(finish(id, t + minute));
    }
    inputs.extend([submit(task(9).gpus(4), t + minute), pass(t + minute)]);
    let got = script(
        "allot",
        vec![node("n1").gpus(4), node("n2").gpus(4)],
        inputs,
    );
    // The last five decisions: two preempted, the 4-GPU task granted where they were, and
    // both granted again on the other node, in whatever order the pass took them.
    let mut moved: Vec<String> = got.iter().skip(got.len() - 5).cloned().collect();
    let (from, to, left) = if moved.contains(&"grant 9@n1".to_string()) {
        ("n1", "n2", &n1)
    } else {
        ("n2", "n1", &n2)
    };
    moved.sort();
    let mut want = vec![
        format!("preempt {} for 9", left[2]),
        format!("preempt {} for 9", left[3]),
        format!("grant 9@{from}"),
        format!("grant {}@{to}", left[2]),
        format!("grant {}@{to}", left[3]),
    ];
    want.sort();
    assert_eq!(moved, want, "{got:?}");
}

#[test]
fn allot_moves_small_tasks_only_when_the_wait_would_cost_more_than_the_move() {
    // As above, but the first 1-GPU task lasted `lasts`, and the four that finish a minute in
    // lasted a minute: the four left are expected to last (`lasts` + 4 min) ÷ 5 in all. Moving
    // two of them (a minute of work each, plus a 60 s restart: 2 GPUs × 120 s) costs what the
    // 4-GPU task waiting 60 s would: the move is made only if they are expected to end more
    // than a minute after it arrives, by a millisecond or more (`lasts` = 6 min + 5 ms).
    let minute = 60_000;
    let nodes = || vec![node("n1").gpus(4), node("n2").gpus(4)];
    let moved = |lasts: u64| -> bool {
        let mut inputs = vec![submit(task(90).gpus(1), 0), pass(0), finish(90, lasts)];
        for id in 1..=8 {
            inputs.push(submit(task(id).gpus(1), lasts));
        }
        inputs.push(pass(lasts));
        let got = script("allot", nodes(), inputs.clone());
        for n in ["n1", "n2"] {
            let first_two = got
                .iter()
                .filter_map(|g| g.strip_prefix("grant ")?.strip_suffix(&format!("@{n}")))
                .filter_map(|id| id.parse().ok())
                .filter(|id| *id != 90)
                .take(2);
            inputs.extend(first_two.map(|id| finish(id, lasts + minute)));
        }
        inputs.extend([
            submit(task(9).gpus(4), lasts + minute),
            pass(lasts + minute),
        ]);
        let got = script("allot", nodes(), inputs);
        got.iter().any(|d| d.starts_with("preempt"))
    };
    assert!(moved(600 * minute));
    assert!(moved(6 * minute + 5));
    assert!(!moved(6 * minute));
    assert!(!moved(5 * minute));
}

/// When task 1 — a job predicted (rightly) to last 10 hours — first starts on a one-node
/// cluster where a 30-minute job arrives every 20 minutes for 8 hours, under `policy`; and
/// whether it was preempted after that.
fn long_task_among_short_ones(policy: crate::policy::allot::Allot) -> (Option<u64>, bool) {
    // (Without preemption in between, a 10-hour run started within the 8 hours ends.)
    let minute = 60_000;
    let hour = 60 * minute;
    let mut s = scheduler(Box::new(policy), vec![node("n1")]);
    // The predictor's word, for each task as it is submitted.
    let predicted = |id: u64, lasts: u64| {
        let mut t = task(id).gpus(8);
        t.0.predicted_duration = Some(lasts);
        t
    };
    let t0 = hour;
    let mut ends: Vec<(u64, u64)> = Vec::new();
    let (mut started, mut preempted) = (None, false);
    let mut next = 100;
    for step in 0..=(8 * 60 / 10) {
        let now = t0 + step * 10 * minute;
        let mut inputs = Vec::new();
        ends.retain(|(id, end)| {
            let due = *end <= now;
            if due {
                inputs.push(finish(*id, *end));
            }
            !due
        });
        if step % 2 == 0 {
            inputs.push(submit(predicted(next, 30 * minute), now));
            next += 1;
        }
        if step == 0 {
            inputs.push(submit(predicted(1, 10 * hour), now));
        }
        inputs.push(pass(now));
        for input in inputs {
            for d in s.apply(input).unwrap() {
                match d {
                    Decision::Granted { task, at, .. } => {
                        let lasts = if task.0 == 1 { 10 * hour } else { 30 * minute };
                        ends.push((task.0, at + lasts));
                        if task.0 == 1 {
                            started.get_or_insert(at);
                        }
                    }
                    Decision::Preempted { task, .. } => {
                        preempted |= task.0 == 1;
                        ends.retain(|(id, _)| *id != task.0);
                    }
                    _ => {}
                }
            }
        }
    }
    (started.map(|at| at - t0), preempted)
}

#[test]
fn allot_starts_a_long_task_within_the_starvation_bound_and_lets_that_run_finish() {
    let hour = 3_600_000;
    // Without the guard, shorter work passes the long task for as long as it keeps coming.
    let mut unguarded = crate::policy::allot::Allot::default();
    unguarded.starve_after = u64::MAX;
    assert_eq!(long_task_among_short_ones(unguarded).0, None);
    // With it, the long task goes first after an hour and starts when the running short task
    // ends (within 30 minutes more); the run it starts is not preempted for shorter work.
    let (started, preempted) = long_task_among_short_ones(Default::default());
    let started = started.expect("the long task started");
    assert!(
        (hour..=hour + hour / 2).contains(&started),
        "started after {started} ms"
    );
    assert!(
        !preempted,
        "the run the guard started was preempted for shorter work"
    );
}

#[test]
fn allot_never_preempts_on_an_estimate_it_has_not_learned() {
    // Nothing has finished: every estimate is the default hour. Task 1 has run 3 h, so by its
    // attained time it looks long, but no comparison can show that preempting it pays.
    let hour = 3_600_000;
    let inputs = vec![
        submit(task(1).gpus(8), 0),
        pass(0),
        submit(task(2).gpus(8), 3 * hour),
        pass(3 * hour),
        pass(4 * hour),
    ];
    let got = script("allot", vec![node("n1")], inputs);
    assert_eq!(got, ["grant 1@n1"], "{got:?}");
}

#[test]
fn nothing_new_lands_on_a_cordoned_node_until_it_returns_to_service() {
    let cordon = |schedulable| Input::NodeSchedulable {
        node: "n1".into(),
        schedulable,
    };
    let got = script(
        "fifo",
        vec![node("n1"), node("n2")],
        vec![
            cordon(false),
            submit(task(1).gpus(8), 0),
            submit(task(2).gpus(8), 0),
            pass(0),
            cordon(true),
            pass(1),
        ],
    );
    assert_eq!(got, ["grant 1@n2", "grant 2@n1"]);
    let mut s = scheduler(Box::new(crate::policy::Fifo), vec![node("n1")]);
    assert_eq!(
        s.apply(Input::NodeSchedulable {
            node: "n9".into(),
            schedulable: false
        }),
        Err(ApplyError::UnknownNode("n9".into()))
    );
}

/// A small deterministic generator, for scenarios run twice to compare decisions.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

mod deadlines;
mod mechanisms;
mod moving;
mod sorting_out;

#[test]
fn a_preloaded_task_keeps_later_work_off_the_room_it_will_need_until_it_arrives_or_lapses() {
    struct Case {
        name: &'static str,
        /// When the pass that might start the 4-GPU latecomer runs.
        pass_at: Time,
        /// Whether the preloaded task is submitted before that pass.
        arrives: bool,
        want_latecomer_started: bool,
        want_preloaded_started: bool,
    }
    let expected_at = 60_000;
    let cases = [
        Case {
            name: "held: the latecomer waits, and the expected task starts on arrival",
            pass_at: 1_000,
            arrives: true,
            want_latecomer_started: false,
            want_preloaded_started: true,
        },
        Case {
            name: "held while the task is still expected",
            pass_at: expected_at + PRELOAD_GRACE,
            arrives: false,
            want_latecomer_started: false,
            want_preloaded_started: false,
        },
        Case {
            name: "lapsed: past its grace the room is free again",
            pass_at: expected_at + PRELOAD_GRACE + 1,
            arrives: false,
            want_latecomer_started: true,
            want_preloaded_started: false,
        },
    ];
    for case in cases {
        // One 8-GPU node; the preloaded task needs 6 GPUs, the latecomer 4.
        let mut s = scheduler(Box::new(Fifo), vec![node("n1")]);
        let reserved = s
            .apply(Input::TaskPreloaded {
                task: task(1).gpus(6).0,
                expected_at,
                at: 0,
            })
            .and_then(|_| s.apply(Input::Schedule { at: 0 }))
            .unwrap();
        assert!(
            matches!(&reserved[..], [Decision::Reserved { task: TaskId(1), until, .. }] if *until == expected_at + PRELOAD_GRACE),
            "{}: {reserved:?}",
            case.name
        );
        s.apply(Input::TaskSubmitted {
            task: task(2).gpus(4).0,
            at: case.pass_at,
        })
        .unwrap();
        let decisions = s.apply(Input::Schedule { at: case.pass_at }).unwrap();
        let mut started: Vec<u64> = granted(&s, decisions).into_iter().map(|g| g.0).collect();
        if case.arrives {
            s.apply(Input::TaskSubmitted {
                task: task(1).gpus(6).0,
                at: case.pass_at + 1,
            })
            .unwrap();
            let decisions = s
                .apply(Input::Schedule {
                    at: case.pass_at + 1,
                })
                .unwrap();
            started.extend(granted(&s, decisions).into_iter().map(|g| g.0));
        }
        assert_eq!(
            started.contains(&2),
            case.want_latecomer_started,
            "{}: {started:?}",
            case.name
        );
        assert_eq!(
            started.contains(&1),
            case.want_preloaded_started,
            "{}: {started:?}",
            case.name
        );
        // A hold is never an allocation: outside a pass all 8 GPUs are accounted to grants.
        let granted_milli: u64 = started
            .iter()
            .map(|t| if *t == 1 { 6_000 } else { 4_000 })
            .sum();
        assert_eq!(
            s.cluster().allocated_milli(),
            granted_milli,
            "{}",
            case.name
        );
    }
}

#[test]
fn a_preload_of_a_task_already_submitted_is_refused() {
    let mut s = scheduler(Box::new(Fifo), vec![node("n1")]);
    s.apply(Input::TaskSubmitted {
        task: task(1).0,
        at: 0,
    })
    .unwrap();
    let err = s
        .apply(Input::TaskPreloaded {
            task: task(1).0,
            expected_at: 10,
            at: 0,
        })
        .unwrap_err();
    assert_eq!(err, ApplyError::DuplicateTask(TaskId(1)));
}

#[test]
fn a_team_over_budget_starts_nothing_below_its_floor_or_is_flagged() {
    struct Case {
        name: &'static str,
        budget: Option<Input>,
        want_started: &'static [u64],
        want_flagged: bool,
    }
    let over = |block_below| {
        Some(Input::TeamBudget {
            team: "team-a".into(),
            exceeded: true,
            block_below,
        })
    };
    let cases = [
        Case {
            name: "within budget: both start",
            budget: None,
            want_started: &[1, 2],
            want_flagged: false,
        },
        Case {
            name: "over budget, floor 100: only the critical task starts",
            budget: over(Some(100)),
            want_started: &[2],
            want_flagged: true,
        },
        Case {
            name: "over budget, allow and flag: both start, flagged",
            budget: over(None),
            want_started: &[1, 2],
            want_flagged: true,
        },
        Case {
            name: "back within budget: no restriction",
            budget: Some(Input::TeamBudget {
                team: "team-a".into(),
                exceeded: false,
                block_below: Some(100),
            }),
            want_started: &[1, 2],
            want_flagged: false,
        },
    ];
    for (case, policy) in cases.iter().flat_map(|c| ["kueue", "fifo"].map(|p| (c, p))) {
        let mut s = scheduler(crate::policy::by_name(policy).unwrap(), vec![node("n1")]);
        if let Some(budget) = case.budget.clone() {
            s.apply(budget).unwrap();
        }
        let mut batch = task(1).0;
        batch.priority = 0;
        let mut critical = task(2).0;
        critical.priority = 1000;
        for t in [batch, critical] {
            s.apply(Input::TaskSubmitted { task: t, at: 0 }).unwrap();
        }
        let decisions = s.apply(Input::Schedule { at: 0 }).unwrap();
        let flagged = decisions.iter().any(|d| {
            matches!(d, Decision::Granted { reason, .. } if reason.contains("over budget (flagged)"))
        });
        let mut started: Vec<u64> = granted(&s, decisions).into_iter().map(|g| g.0).collect();
        started.sort_unstable();
        assert_eq!(started, case.want_started, "{}", case.name);
        assert_eq!(flagged, case.want_flagged, "{}", case.name);
        if !started.contains(&1) {
            let waiting = s.waiting(TaskId(1), 0).unwrap();
            assert_eq!(
                waiting.reason,
                WaitReason::Budget {
                    team: "team-a".into(),
                    floor: 100
                },
                "{}",
                case.name
            );
        }
    }
}

/// The queue's ETAs come from one simulation of the whole queue; where nothing behind a task can
/// start before it (every unit the same size), they are the ETAs each task's own simulation
/// gives — under every policy, with gangs, and with several teams.
#[test]
fn the_queues_etas_are_each_tasks_own_when_nothing_can_overtake() {
    const MIN: Time = 60_000;
    for policy in ["fifo", "kueue", "allot", "tiresias"] {
        let mut s = scheduler(
            crate::policy::by_name(policy).unwrap(),
            vec![node("n1").gpus(4), node("n2").gpus(4)],
        );
        for id in 1..=24u64 {
            let mut t = task(id).gpus(2).lasts((id % 5 + 1) * 10 * MIN).0;
            t.team = ["team-a", "team-b", "team-c"][id as usize % 3].into();
            s.apply(Input::TaskSubmitted { task: t, at: 0 }).unwrap();
        }
        s.apply(Input::Schedule { at: 0 }).unwrap();
        let now = 5 * MIN;
        let queue: Vec<_> = s.queue(now).collect();
        assert!(queue.len() >= 16, "{policy}: {}", queue.len());
        let mut last = 0;
        for (position, spec, w) in &queue {
            let own = s.waiting(spec.id, now).unwrap();
            assert_eq!(w.eta, own.eta, "{policy}: task {} at {position}", spec.id.0);
            assert_eq!(w.reason, own.reason, "{policy}");
            let eta = w.eta.expect("every task has an ETA");
            assert!(eta >= now, "{policy}");
            last = last.max(eta);
        }
        assert!(last > now, "{policy}: someone waits past now");
    }
}
