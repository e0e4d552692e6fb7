//! Gangs, topology, MIG, GPU memory, victims, usage limits, requeues, wait reasons, DAG
//! weight and fair share — each mechanism as a short script of inputs and the decisions a user
//! would see.

use super::*;
use crate::model::DagFacts;

const MIN: u64 = 60_000;
const HOUR: u64 = 3_600_000;

impl TaskBuilder {
    fn gang(mut self, name: &str, size: u32) -> Self {
        self.0 = self.0.in_gang(name, size);
        self
    }
    fn priority(mut self, priority: i32) -> Self {
        self.0.priority = priority;
        self
    }
    fn checkpoints(mut self, every: u64) -> Self {
        self.0.checkpoint_every = Some(every);
        self
    }
    fn limit(mut self, max_runtime: u64) -> Self {
        self.0.max_runtime = Some(max_runtime);
        self
    }
    fn predicted(mut self, ms: u64) -> Self {
        self.0.predicted_duration = Some(ms);
        self
    }
    fn dependents(mut self, n: u32) -> Self {
        self.0.dag = DagFacts {
            dependents: n,
            critical_path_rank: n + 1,
        };
        self
    }
}

impl NodeBuilder {
    fn topology(mut self, rack: &str, domain: &str) -> Self {
        self.0 = self.0.in_topology(rack, domain);
        self
    }
}

struct Case {
    name: &'static str,
    policy: &'static str,
    nodes: Vec<NodeBuilder>,
    inputs: Vec<Input>,
    want: Vec<&'static str>,
}

fn check(cases: Vec<Case>) {
    for case in cases {
        let got = script(case.policy, case.nodes, case.inputs);
        assert_eq!(got, case.want, "{} ({})", case.name, case.policy);
    }
}

#[test]
fn gangs_start_whole_close_together_and_leave_whole() {
    check(vec![
        Case {
            name: "a gang waits for its last member, then starts on one node",
            policy: "fifo",
            nodes: vec![node("n1"), node("n2")],
            inputs: vec![
                submit(task(1).gpus(2).gang("g", 3), 0),
                submit(task(2).gpus(2).gang("g", 3), 0),
                pass(0),
                submit(task(3).gpus(2).gang("g", 3), 1),
                pass(1),
            ],
            want: vec!["grant 1@n1", "grant 2@n1", "grant 3@n1"],
        },
        Case {
            name: "all or nothing: 2 + 2 free GPUs do not hold two 4-GPU members",
            policy: "fifo",
            nodes: vec![node("n1"), node("n2")],
            inputs: vec![
                submit(task(90).gpus(6), 0),
                submit(task(91).gpus(6), 0),
                pass(0),
                submit(task(1).gpus(4).gang("g", 2), 1),
                submit(task(2).gpus(4).gang("g", 2), 1),
                pass(1),
                finish(90, 2),
                pass(2),
            ],
            want: vec![
                "grant 90@n1",
                "grant 91@n2",
                "release 90",
                "grant 1@n1",
                "grant 2@n1",
            ],
        },
        Case {
            name: "a gang is preempted whole",
            policy: "kueue",
            nodes: vec![node("n1")],
            inputs: vec![
                submit(task(1).gpus(4).gang("g", 2), 0),
                submit(task(2).gpus(4).gang("g", 2), 0),
                pass(0),
                submit(task(3).gpus(2).priority(5), 1),
                pass(1),
            ],
            want: vec![
                "grant 1@n1",
                "grant 2@n1",
                "preempt 1 for 3",
                "preempt 2 for 3",
                "grant 3@n1",
            ],
        },
        Case {
            name: "a task larger than a node takes nodes of one NVLink domain",
            policy: "fifo",
            nodes: vec![
                node("n1").topology("r1", "d1"),
                node("n2").topology("r1", "d2"),
                node("n3").topology("r1", "d1"),
                node("n4").topology("r1", "d2"),
            ],
            inputs: vec![submit(task(1).gpus(16), 0), pass(0)],
            want: vec!["grant 1@n1+n3"],
        },
        Case {
            name: "a gang spread over nodes stays in one rack",
            policy: "fifo",
            nodes: vec![
                node("n1").topology("r1", "d1"),
                node("n2").topology("r2", "d2"),
                node("n3").topology("r1", "d3"),
            ],
            inputs: vec![
                submit(task(1).gpus(8).gang("g", 2), 0),
                submit(task(2).gpus(8).gang("g", 2), 0),
                pass(0),
            ],
            want: vec!["grant 1@n1", "grant 2@n3"],
        },
    ]);
}

#[test]
fn victims_are_those_that_lose_the_least_work() {
    // Two low-priority tasks checkpoint every 15 min; one started at 0, one at 10 min. At
    // 20 min a high-priority task needs one node: the first loses 5 min, the second 10.
    let inputs = |checkpoint_report: Option<u64>| {
        let mut v = vec![
            submit(task(1).gpus(8).checkpoints(15 * MIN), 0),
            pass(0),
            submit(task(2).gpus(8).checkpoints(15 * MIN), 10 * MIN),
            pass(10 * MIN),
        ];
        if let Some(at) = checkpoint_report {
            v.push(Input::TaskCheckpointed {
                task: TaskId(2),
                at,
            });
        }
        v.push(submit(task(3).gpus(8).priority(5), 20 * MIN));
        v.push(pass(20 * MIN));
        v
    };
    let nodes = || vec![node("n1"), node("n2")];
    check(vec![
        Case {
            name: "allot preempts the task that loses least",
            policy: "allot",
            nodes: nodes(),
            inputs: inputs(None),
            want: vec!["grant 1@n1", "grant 2@n2", "preempt 1 for 3", "grant 3@n1"],
        },
        Case {
            name: "a reported checkpoint changes who loses least",
            policy: "allot",
            nodes: nodes(),
            inputs: inputs(Some(19 * MIN)),
            want: vec!["grant 1@n1", "grant 2@n2", "preempt 2 for 3", "grant 3@n2"],
        },
        Case {
            name: "kueue takes the worst key (the newest) whatever it loses",
            policy: "kueue",
            nodes: nodes(),
            inputs: inputs(None),
            want: vec!["grant 1@n1", "grant 2@n2", "preempt 2 for 3", "grant 3@n2"],
        },
    ]);
}

#[test]
fn a_task_past_its_usage_limit_yields_to_any_waiting_task() {
    let inputs = |at| {
        vec![
            submit(task(1).gpus(8).limit(HOUR), 0),
            pass(0),
            submit(task(2).gpus(8), at),
            pass(at),
        ]
    };
    check(vec![
        Case {
            name: "within its limit it keeps running",
            policy: "kueue",
            nodes: vec![node("n1")],
            inputs: inputs(30 * MIN),
            want: vec!["grant 1@n1"],
        },
        Case {
            name: "past it, an equal-priority task preempts it",
            policy: "kueue",
            nodes: vec![node("n1")],
            inputs: inputs(2 * HOUR),
            want: vec!["grant 1@n1", "preempt 1 for 2", "grant 2@n1"],
        },
    ]);
}

fn withdraw(id: u64, at: u64) -> Input {
    Input::TaskWithdrawn {
        task: TaskId(id),
        reason: "workload aborted".into(),
        at,
        run: None,
    }
}

#[test]
fn a_withdrawn_task_leaves_the_queue_at_once_and_never_runs() {
    check(vec![
        Case {
            name: "a queued task leaves, and the next in line takes the room it waited for",
            policy: "fifo",
            nodes: vec![node("n1")],
            inputs: vec![
                submit(task(1).gpus(8), 0),
                submit(task(2).gpus(8), 0),
                submit(task(3).gpus(8), 0),
                pass(0),
                withdraw(2, 5),
                finish(1, 10),
                pass(10),
            ],
            want: vec!["grant 1@n1", "withdraw 2", "release 1", "grant 3@n1"],
        },
        Case {
            name: "a withdrawn high-priority task preempts nothing",
            policy: "kueue",
            nodes: vec![node("n1")],
            inputs: vec![
                submit(task(1).gpus(8), 0),
                pass(0),
                submit(task(2).gpus(8).priority(5), 1),
                withdraw(2, 2),
                pass(3),
            ],
            want: vec!["grant 1@n1", "withdraw 2"],
        },
        Case {
            name: "a queued gang leaves whole when one member is withdrawn",
            policy: "fifo",
            nodes: vec![node("n1")],
            inputs: vec![
                submit(task(9).gpus(8), 0),
                pass(0),
                submit(task(1).gpus(4).gang("g", 2), 1),
                submit(task(2).gpus(4).gang("g", 2), 1),
                withdraw(2, 2),
                finish(9, 3),
                pass(3),
            ],
            want: vec!["grant 9@n1", "withdraw 1", "withdraw 2", "release 9"],
        },
        Case {
            name: "an incomplete gang's members leave too; a later member starts nothing",
            policy: "fifo",
            nodes: vec![node("n1")],
            inputs: vec![
                submit(task(1).gpus(4).gang("g", 2), 0),
                withdraw(1, 1),
                submit(task(2).gpus(4).gang("g", 2), 2),
                pass(2),
            ],
            want: vec!["withdraw 1"],
        },
        Case {
            name: "a running task is released like a finished one",
            policy: "fifo",
            nodes: vec![node("n1")],
            inputs: vec![
                submit(task(1).gpus(8), 0),
                submit(task(2).gpus(8), 0),
                pass(0),
                withdraw(1, 5),
                pass(5),
            ],
            want: vec!["grant 1@n1", "release 1", "grant 2@n1"],
        },
    ]);
}

#[test]
fn a_withdrawn_preload_gives_up_its_hold_and_a_withdrawn_run_teaches_no_estimate() {
    let mut s = scheduler(crate::policy::by_name("allot").unwrap(), vec![node("n1")]);
    s.apply(Input::TaskPreloaded {
        task: task(1).gpus(8).0,
        expected_at: HOUR,
        at: 0,
    })
    .unwrap();
    s.apply(submit(task(2).gpus(4), 1)).unwrap();
    let held = s.apply(pass(1)).unwrap();
    assert!(
        held.iter()
            .any(|d| matches!(d, Decision::Reserved { task, .. } if task.0 == 1))
            && !held.iter().any(|d| matches!(d, Decision::Granted { .. })),
        "the preload holds the node: {held:?}"
    );
    let gone = s.apply(withdraw(1, 2)).unwrap();
    assert!(
        matches!(&gone[..], [Decision::Withdrawn { task, .. }] if task.0 == 1),
        "{gone:?}"
    );
    assert!(!s.holds(TaskId(1)));
    let granted = s.apply(pass(2)).unwrap();
    assert!(
        granted
            .iter()
            .any(|d| matches!(d, Decision::Granted { task, .. } if task.0 == 2)),
        "the hold is gone, so the waiting task starts: {granted:?}"
    );

    // Task 2 is cut short after a minute: the estimator must not learn "a minute".
    s.apply(withdraw(2, MIN)).unwrap();
    assert!(
        !s.estimator().learned(&task(3).gpus(4).0),
        "a withdrawn run is no observation of how long such tasks take"
    );
    assert_eq!(
        s.apply(withdraw(2, MIN + 1)),
        Err(ApplyError::UnknownTask(TaskId(2))),
        "withdrawing twice is an error the journal records"
    );
}

#[test]
fn a_requeued_gang_member_takes_its_gang_back_to_the_queue() {
    check(vec![Case {
        name: "drained node",
        policy: "fifo",
        nodes: vec![node("n1")],
        inputs: vec![
            submit(task(1).gpus(4).gang("g", 2), 0),
            submit(task(2).gpus(4).gang("g", 2), 0),
            pass(0),
            Input::TaskRequeued {
                task: TaskId(2),
                reason: "node n1 drained".into(),
                at: 5,
            },
            pass(6),
        ],
        want: vec![
            "grant 1@n1",
            "grant 2@n1",
            "preempt 1 for 0",
            "preempt 2 for 0",
            "grant 1@n1",
            "grant 2@n1",
        ],
    }]);
}

#[test]
fn mig_instances_and_gpu_memory_are_resources_of_their_own() {
    let mut mig = node("m1").gpus(0);
    mig.0.mig.insert("1g.10gb".into(), 2);
    let mut s = scheduler(crate::policy::by_name("fifo").unwrap(), vec![mig]);
    for id in 1..=3 {
        s.apply(Input::TaskSubmitted {
            task: TaskSpec::mig(id, "team-a", "1g.10gb"),
            at: 0,
        })
        .unwrap();
    }
    let decisions = s.apply(Input::Schedule { at: 0 }).unwrap();
    let grants = granted(&s, decisions);
    assert_eq!(grants.len(), 2, "two instances, two grants: {grants:?}");
    assert!(
        matches!(
            s.apply(Input::TaskSubmitted {
                task: TaskSpec::mig(9, "team-a", "7g.80gb"),
                at: 0
            }),
            Err(ApplyError::Unplaceable { .. })
        ),
        "no node offers 7g.80gb"
    );

    // Two GPUs of 40 GiB: 30 GiB on GPU 0 leaves it 10 GiB, so a 20 GiB fraction goes to GPU 1
    // although GPU 0 has the compute share free.
    let mut n = node("n1").gpus(2);
    n.0.gpu_memory_mib = 40_960;
    let mut s = scheduler(crate::policy::by_name("fifo").unwrap(), vec![n]);
    let mut first = task(1).milli(500);
    first.0.gpu_memory_mib = 30_000;
    let mut second = task(2).milli(300);
    second.0.gpu_memory_mib = 20_000;
    for t in [first, second] {
        s.apply(Input::TaskSubmitted { task: t.0, at: 0 }).unwrap();
    }
    let gpus: Vec<u32> = s
        .apply(Input::Schedule { at: 0 })
        .unwrap()
        .into_iter()
        .filter_map(|d| match d {
            Decision::Granted { placement, .. } => Some(placement.shares[0].gpus[0].0),
            _ => None,
        })
        .collect();
    assert_eq!(gpus, [0, 1]);
}

#[test]
fn a_waiting_task_is_told_why_and_when_it_should_start() {
    let mut s = scheduler(Box::new(Fifo), vec![node("n1")]);
    run_pass(&mut s, vec![task(1).gpus(8).predicted(HOUR)]);
    s.apply(Input::TaskSubmitted {
        task: task(2).gpus(8).0,
        at: 10 * MIN,
    })
    .unwrap();
    let d = s.apply(Input::Schedule { at: 10 * MIN }).unwrap();
    assert!(
        matches!(
            &d[..],
            [Decision::Waiting {
                task: TaskId(2),
                reason: WaitReason::NoCapacity { gpus: 8, .. },
                eta: Some(HOUR),
                ..
            }]
        ),
        "{d:?}"
    );
    let w = s.waiting(TaskId(2), 10 * MIN).expect("pending");
    assert_eq!(w.eta, Some(HOUR));

    // Over quota: the reason names the team and the limit; no ETA until the quota changes.
    let mut s = scheduler(crate::policy::by_name("kueue").unwrap(), vec![node("n1")]);
    s.apply(Input::TeamQuota {
        team: "team-a".into(),
        quota: crate::quota::Quota {
            borrowing_limit_milli: Some(0),
            ..crate::quota::Quota::gpus(4_000)
        },
    })
    .unwrap();
    s.apply(Input::TaskSubmitted {
        task: task(1).gpus(6).0,
        at: 0,
    })
    .unwrap();
    let d = s.apply(Input::Schedule { at: 0 }).unwrap();
    match &d[..] {
        [
            Decision::Waiting {
                reason: WaitReason::Quota { why },
                eta: None,
                ..
            },
        ] => assert!(
            why.contains("team-a") && why.contains("borrowing limit"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }

    // A gang member alone says what it waits for.
    let mut s = scheduler(Box::new(Fifo), vec![node("n1")]);
    s.apply(Input::TaskSubmitted {
        task: task(1).gang("g", 3).0,
        at: 0,
    })
    .unwrap();
    assert_eq!(
        s.waiting(TaskId(1), 0).map(|w| w.reason.to_string()),
        Some("gang g has 1 of its 3 members".into())
    );
}

#[test]
fn a_waiting_tasks_eta_moves_when_the_queue_ahead_of_it_changes() {
    // sjf-oracle on one 8-GPU node: estimates are the true durations, and a shorter task
    // that arrives later goes ahead.
    let mut s = scheduler(Box::new(SjfOracle), vec![node("n1")]);
    let waits_for_2 = |d: &[Decision]| {
        d.iter()
            .filter_map(|d| match d {
                Decision::Waiting {
                    task: TaskId(2),
                    eta,
                    ..
                } => Some(*eta),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let at = |s: &mut Scheduler, input: Option<Input>, now: u64| {
        if let Some(input) = input {
            s.apply(input).unwrap();
        }
        s.apply(Input::Schedule { at: now }).unwrap()
    };
    at(&mut s, Some(submit(task(1).gpus(8).lasts(HOUR), 0)), 0);
    let d = at(
        &mut s,
        Some(submit(task(2).gpus(8).lasts(2 * HOUR), 10 * MIN)),
        10 * MIN,
    );
    assert_eq!(
        waits_for_2(&d),
        [Some(HOUR)],
        "behind task 1, due to end at 60 min"
    );
    assert_eq!(s.waiting(TaskId(2), 10 * MIN).unwrap().eta, Some(HOUR));

    // A 30 min task arrives and goes ahead: task 2 now starts after it, at 90 min. The
    // decision log says nothing new about task 2; asking does.
    let d = at(
        &mut s,
        Some(submit(task(3).gpus(8).lasts(30 * MIN), 20 * MIN)),
        20 * MIN,
    );
    assert!(waits_for_2(&d).is_empty(), "{d:?}");
    let w = s.waiting(TaskId(2), 20 * MIN).unwrap();
    assert_eq!(w.reason, WaitReason::BehindHead { head: TaskId(3) });
    assert_eq!(w.eta, Some(90 * MIN));

    // Task 1 ends 20 min early and task 3 starts: task 2 moves up to 70 min.
    let d = at(&mut s, Some(finish(1, 40 * MIN)), 40 * MIN);
    assert!(
        waits_for_2(&d).is_empty(),
        "still no capacity: no new decision"
    );
    assert_eq!(s.waiting(TaskId(2), 40 * MIN).unwrap().eta, Some(70 * MIN));

    // Task 3 outlives its 30 min: at 80 min it has run 40, and is expected to take as long
    // again — not to end at once, which would promise task 2 the next millisecond.
    assert_eq!(s.waiting(TaskId(2), 80 * MIN).unwrap().eta, Some(120 * MIN));
}

#[test]
fn among_equals_allot_starts_the_task_that_unblocks_most() {
    check(vec![
        Case {
            name: "same estimate, the one with dependents first",
            policy: "allot",
            nodes: vec![node("n1")],
            inputs: vec![
                submit(task(1).gpus(8).predicted(HOUR), 0),
                submit(task(2).gpus(8).predicted(HOUR).dependents(3), 0),
                pass(0),
            ],
            want: vec!["grant 2@n1"],
        },
        Case {
            name: "priority still comes first",
            policy: "allot",
            nodes: vec![node("n1")],
            inputs: vec![
                submit(task(1).gpus(8).predicted(HOUR).priority(1), 0),
                submit(task(2).gpus(8).predicted(HOUR).dependents(3), 0),
                pass(0),
            ],
            want: vec!["grant 1@n1"],
        },
    ]);
}

#[test]
fn allot_evens_out_borrowed_capacity_between_teams() {
    // Three teams of 8 GPUs on 3 nodes; team-c is idle and lends its 8. team-a runs long tasks
    // on 12 (borrowing 4) or 16 (borrowing 8); team-b, at its nominal 8, wants 4 more for a
    // short task.
    let inputs = |a_tasks: u64| {
        let mut v = vec![quota("team-a", 8), quota("team-b", 8), quota("team-c", 8)];
        for i in 0..a_tasks {
            v.push(submit(
                team(task(10 + i).gpus(4).predicted(10 * HOUR), "team-a"),
                0,
            ));
        }
        v.push(submit(
            team(task(20).gpus(8).predicted(10 * HOUR), "team-b"),
            0,
        ));
        v.push(pass(0));
        v.push(submit(team(task(30).gpus(4).predicted(MIN), "team-b"), 1));
        v.push(pass(1));
        v
    };
    let nodes = || vec![node("n1"), node("n2"), node("n3")];
    let mut fair = script("allot", nodes(), inputs(4));
    fair.retain(|d| !d.starts_with("grant 1") && !d.starts_with("grant 20"));
    assert_eq!(
        fair,
        ["preempt 13 for 30", "grant 30@n2"],
        "a borrows 8, b would borrow 4: b may take 4 back"
    );
    let mut unfair = script("allot", nodes(), inputs(3));
    unfair.retain(|d| !d.starts_with("grant 1") && !d.starts_with("grant 20"));
    assert_eq!(
        unfair,
        ["grant 30@n2"],
        "a borrows 4 and 4 GPUs are free: no preemption needed"
    );
}

#[test]
fn a_task_that_accepts_several_models_goes_to_the_cheapest_that_fits() {
    let priced = |name: &str, model: &str, cost: u64| {
        let mut n = node(name).model(model);
        n.0.gpu_cost = cost;
        n
    };
    let nodes = || vec![priced("h1", "H100", 4), priced("l1", "L40S", 1)];
    check(vec![
        Case {
            name: "the cheap tier first, then the next one up",
            policy: "fifo",
            nodes: nodes(),
            inputs: vec![
                submit(task(1).gpus(8), 0),
                submit(task(2).gpus(4), 0),
                submit(task(3).milli(500), 0),
                pass(0),
            ],
            want: vec!["grant 1@l1", "grant 2@h1", "grant 3@h1"],
        },
        Case {
            name: "a task pinned to the expensive model still gets it",
            policy: "fifo",
            nodes: nodes(),
            inputs: vec![submit(task(1).gpus(2).models(&["H100"]), 0), pass(0)],
            want: vec!["grant 1@h1"],
        },
        Case {
            name: "fractions too",
            policy: "fifo",
            nodes: nodes(),
            inputs: vec![submit(task(1).milli(300), 0), pass(0)],
            want: vec!["grant 1@l1"],
        },
    ]);
}

fn predict(id: u64, duration: u64, at: u64) -> Input {
    Input::TaskPredicted {
        task: TaskId(id),
        duration,
        at,
    }
}

#[test]
fn a_prediction_that_arrives_later_moves_a_queued_task() {
    let queued = |inputs: Vec<Input>| {
        let mut all = vec![
            submit(task(1).gpus(8).predicted(HOUR), 0),
            pass(0),
            submit(task(2).gpus(8).predicted(10 * HOUR), 1),
            submit(task(3).gpus(8).predicted(5 * HOUR), 2),
            pass(2),
        ];
        all.extend(inputs);
        all.extend([finish(1, 3 * MIN), pass(3 * MIN)]);
        script("allot", vec![node("n1")], all)
    };
    // Shortest predicted first: 3 before 2.
    assert_eq!(queued(vec![]), ["grant 1@n1", "release 1", "grant 3@n1"]);
    // Task 2 is predicted again, shorter: it takes its new place in line.
    assert_eq!(
        queued(vec![predict(2, 10 * MIN, 2 * MIN)]),
        ["grant 1@n1", "release 1", "grant 2@n1"]
    );
    // A prediction for a task the scheduler does not hold is refused, named.
    let mut s = scheduler(crate::policy::by_name("allot").unwrap(), vec![node("n1")]);
    assert_eq!(
        s.apply(predict(7, MIN, 0)).unwrap_err(),
        ApplyError::UnknownTask(TaskId(7))
    );
}

mod holds;

#[test]
fn a_search_counts_its_victims_in_whole_gpus_before_it_may_place() {
    // One GPU: task 1 holds half of it (low priority), task 2 a quarter (high priority, no
    // victim). A gang of two quarter-GPU tasks would fit in the quarter left and task 1's
    // half, but a preemption needs the victims' whole GPUs (a fraction counts as one) plus
    // the whole GPUs free to cover the gang's two: 1 + 0 < 2, so nothing is preempted —
    // although the victim lists (tasks 1 and 2: two GPUs) would seem to allow it.
    let inputs = vec![
        submit(task(1).gpus(1).milli(500), 0),
        submit(task(2).gpus(1).milli(250).priority(9), 0),
        pass(0),
        submit(task(3).gpus(1).milli(250).priority(5).gang("g", 2), MIN),
        submit(task(4).gpus(1).milli(250).priority(5).gang("g", 2), MIN),
        pass(MIN),
    ];
    check(vec![Case {
        name: "a gang of fractions preempts only if whole GPUs cover it",
        policy: "kueue",
        nodes: vec![node("n1").gpus(1)],
        inputs,
        want: vec!["grant 2@n1", "grant 1@n1"],
    }]);
}
