//! Nodes and GPUs out of service: who holds a node, draining it, one GPU out — the inputs
//! remediation and operators send, as the decisions a user would see.

use super::*;

fn held(node: &str, by: Holder, held: bool, drain: bool, at: u64) -> Input {
    Input::NodeHeld {
        node: node.into(),
        by,
        held,
        drain,
        reason: format!("{by:?} says so"),
        at,
    }
}

fn gpu(node: &str, gpu: u32, in_service: bool, at: u64) -> Input {
    Input::GpuService {
        node: node.into(),
        gpu,
        in_service,
        reason: "xid 48".into(),
        at,
    }
}

#[test]
fn a_node_takes_new_work_only_when_no_holder_holds_it() {
    // The operator's cordon outlives remediation's return to service, and reachability is a
    // third holder of its own.
    let mut s = scheduler(crate::policy::by_name("fifo").unwrap(), vec![node("n1")]);
    let reachable = |schedulable| Input::NodeSchedulable {
        node: "n1".into(),
        schedulable,
    };
    let steps: Vec<(&str, Vec<Input>, bool)> = vec![
        (
            "operator and remediation hold it",
            vec![
                held("n1", Holder::Operator, true, false, 0),
                held("n1", Holder::Remediation, true, false, 0),
                submit(task(1).gpus(8), 0),
            ],
            false,
        ),
        (
            "remediation lets go; the operator still holds it",
            vec![held("n1", Holder::Remediation, false, false, 1)],
            false,
        ),
        (
            "unreachable, then the operator lets go",
            vec![
                reachable(false),
                held("n1", Holder::Operator, false, false, 2),
            ],
            false,
        ),
        (
            "reachable again: nobody holds it",
            vec![reachable(true)],
            true,
        ),
    ];
    for (at, (what, inputs, grants)) in steps.into_iter().enumerate() {
        for input in inputs {
            s.apply(input).unwrap();
        }
        let decisions = s.apply(pass(at as u64)).unwrap();
        assert_eq!(!granted(&s, decisions).is_empty(), grants, "{what}");
    }
}

#[test]
fn a_drain_requeues_what_runs_there_gangs_whole_and_it_resumes_elsewhere_from_its_checkpoint() {
    let mut s = scheduler(
        crate::policy::by_name("fifo").unwrap(),
        vec![node("n1"), node("n2"), node("n3"), node("n4")],
    );
    // A gang of two whole-node members lands on n1+n2; a single task on n3.
    for t in [
        task(1)
            .gpus(8)
            .gang("g", 2)
            .checkpoints(10 * MIN)
            .lasts(HOUR),
        task(2)
            .gpus(8)
            .gang("g", 2)
            .checkpoints(10 * MIN)
            .lasts(HOUR),
        task(3).gpus(8).lasts(HOUR),
    ] {
        s.apply(submit(t, 0)).unwrap();
    }
    let first = s.apply(pass(0)).unwrap();
    let mut first = granted(&s, first);
    first.sort();
    assert_eq!(
        first,
        [
            (1, vec!["n1".to_owned()]),
            (2, vec!["n2".to_owned()]),
            (3, vec!["n3".to_owned()])
        ]
    );
    s.apply(Input::TaskCheckpointed {
        task: TaskId(1),
        at: 20 * MIN,
    })
    .unwrap();
    // Draining n1 stops both gang members (one runs on n2), not task 3; the loss is what
    // followed the checkpoint.
    let drained = s
        .apply(held("n1", Holder::Remediation, true, true, 25 * MIN))
        .unwrap();
    let mut stopped: Vec<(u64, Option<u64>, Time)> = drained
        .iter()
        .filter_map(|d| match d {
            Decision::Preempted {
                task,
                for_task,
                lost,
                ..
            } => Some((task.0, for_task.map(|t| t.0), *lost)),
            _ => None,
        })
        .collect();
    stopped.sort_unstable();
    assert_eq!(stopped, [(1, None, 5 * MIN), (2, None, 5 * MIN)]);
    // The next pass places the gang whole, on n2 and n4, never on n1.
    let again = s.apply(pass(25 * MIN + 1)).unwrap();
    let mut regranted: Vec<String> = granted(&s, again)
        .into_iter()
        .flat_map(|(_, nodes)| nodes)
        .collect();
    regranted.sort();
    assert_eq!(regranted, ["n2", "n4"]);
}

#[test]
fn a_gpu_out_of_service_stops_only_its_task_and_takes_nothing_until_it_returns() {
    let got = script(
        "fifo",
        vec![node("n1").gpus(2)],
        vec![
            submit(task(1).lasts(HOUR), 0),
            submit(task(2).lasts(HOUR), 0),
            pass(0),
            // GPU 0 holds task 1 (lowest index first): only it stops, and it cannot come back
            // while GPU 0 is out.
            gpu("n1", 0, false, 1),
            pass(2),
            gpu("n1", 0, true, 3),
            pass(4),
        ],
    );
    assert_eq!(
        got,
        ["grant 1@n1", "grant 2@n1", "preempt 1 for 0", "grant 1@n1"]
    );
    let mut s = scheduler(crate::policy::by_name("fifo").unwrap(), vec![node("n1")]);
    assert_eq!(
        s.apply(gpu("n1", 8, false, 0)),
        Err(ApplyError::UnknownGpu {
            node: "n1".into(),
            gpu: 8
        })
    );
    // Capacity counts only GPUs in service.
    s.apply(gpu("n1", 3, false, 0)).unwrap();
    assert_eq!(s.cluster().capacity_milli(), 7_000);
    s.apply(held("n1", Holder::Operator, true, false, 0))
        .unwrap();
    s.apply(held("n1", Holder::Operator, false, false, 0))
        .unwrap();
    assert_eq!(s.cluster().capacity_milli(), 7_000);
}

#[test]
fn a_node_cordoned_before_it_joins_joins_cordoned() {
    let mut s = scheduler(crate::policy::by_name("fifo").unwrap(), vec![]);
    s.apply(held("n1", Holder::Operator, true, false, 0))
        .unwrap();
    s.apply(Input::NodeAdded(node("n1").0)).unwrap();
    s.apply(submit(task(1), 0)).unwrap();
    let decisions = s.apply(pass(0)).unwrap();
    assert!(granted(&s, decisions).is_empty(), "it joined held");
    s.apply(held("n1", Holder::Operator, false, false, 1))
        .unwrap();
    let decisions = s.apply(pass(1)).unwrap();
    assert_eq!(granted(&s, decisions).len(), 1);
}

#[test]
fn drained_work_goes_back_ahead_of_new_work_of_its_priority() {
    // allot orders by predicted remaining time: the newcomer (40 min) would go before the
    // drained task (50 min left), but the drained one takes the next free GPU.
    let got = script(
        "allot",
        vec![node("n1").gpus(1), node("n2").gpus(1)],
        vec![
            submit(task(1).predicted(HOUR).lasts(HOUR), 0),
            submit(task(2).predicted(HOUR).lasts(HOUR), 0),
            pass(0),
            held("n1", Holder::Remediation, true, true, 10 * MIN),
            submit(task(3).predicted(40 * MIN).lasts(40 * MIN), 10 * MIN),
            pass(10 * MIN),
            finish(2, HOUR),
            pass(HOUR),
        ],
    );
    assert_eq!(
        got,
        [
            "grant 1@n1",
            "grant 2@n2",
            "preempt 1 for 0",
            "release 2",
            "grant 1@n2"
        ]
    );
}
