use super::*;
use crate::cluster::NodeShare;
use crate::model::NodeSpec;

/// A journal written in short: one string per entry, its decisions separated by `;`.
///
/// - `node NAME GPUS`: the entry adds a node (index: nodes added before it);
/// - `grant T L N/G[=M] ...`: task T is granted lease L on GPU G of node N, M milli-GPU of it
///   (1000 if left out);
/// - `release T L`, `preempt T L`, `withdraw T`, `reserve T N/G`, `wait T`.
fn journal(entries: &[&str]) -> Vec<Entry> {
    entries
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let seq = i as u64 + 1;
            if let Some(node) = text.strip_prefix("node ") {
                let (name, gpus) = node.split_once(' ').expect("node NAME GPUS");
                return Entry {
                    seq,
                    input: Input::NodeAdded(NodeSpec::new(name, gpus.parse().unwrap(), "H100")),
                    decisions: Vec::new(),
                    rejected: None,
                };
            }
            Entry {
                seq,
                input: Input::Schedule { at: seq },
                decisions: text.split(';').map(|d| decision(d.trim(), seq)).collect(),
                rejected: None,
            }
        })
        .collect()
}

fn decision(text: &str, at: u64) -> Decision {
    let words: Vec<&str> = text.split_whitespace().collect();
    let id = |i: usize| words[i].parse::<u64>().expect("a number");
    match words[0] {
        "grant" => Decision::Granted {
            task: TaskId(id(1)),
            lease: LeaseId(id(2)),
            placement: placement(&words[3..]),
            at,
            reason: String::new(),
        },
        "release" => Decision::Released {
            task: TaskId(id(1)),
            lease: LeaseId(id(2)),
            at,
        },
        "preempt" => Decision::Preempted {
            task: TaskId(id(1)),
            lease: LeaseId(id(2)),
            at,
            for_task: None,
            lost: 0,
            reason: String::new(),
        },
        "withdraw" => Decision::Withdrawn {
            task: TaskId(id(1)),
            reason: String::new(),
            at,
        },
        "reserve" => Decision::Reserved {
            task: TaskId(id(1)),
            placement: placement(&words[2..]),
            until: at,
            at,
        },
        "wait" => Decision::Waiting {
            task: TaskId(id(1)),
            reason: crate::WaitReason::BehindHead { head: TaskId(0) },
            eta: None,
            at_risk: false,
            at,
        },
        other => panic!("unknown decision {other:?}"),
    }
}

/// `N/G[=M]` GPUs, one share per node in order of appearance.
fn placement(gpus: &[&str]) -> Placement {
    let mut shares: Vec<NodeShare> = Vec::new();
    for gpu in gpus {
        let (node, rest) = gpu.split_once('/').expect("N/G");
        let (gpu, milli) = rest.split_once('=').unwrap_or((rest, "1000"));
        let node = NodeIdx(node.parse().unwrap());
        let taken = (gpu.parse().unwrap(), milli.parse().unwrap());
        match shares.iter_mut().find(|s| s.node == node) {
            Some(share) => share.gpus.push(taken),
            None => shares.push(NodeShare {
                node,
                gpus: vec![taken],
                ..NodeShare::default()
            }),
        }
    }
    Placement { shares }
}

#[test]
fn journals_are_checked_entry_by_entry() {
    struct Case {
        name: &'static str,
        journal: &'static [&'static str],
        /// What the violation must say (`[]`: the journal keeps every invariant).
        want: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "a clean journal of grants, fractions, a preemption and releases passes",
            journal: &[
                "node n1 4",
                "node n2 2",
                "grant 1 1 0/0 0/1",
                "grant 2 2 0/2=500; grant 3 3 0/2=500; wait 4",
                "preempt 1 1; grant 4 4 0/0 0/1 1/0",
                "release 2 2; release 3 3; grant 1 5 0/2",
                "release 4 4; release 1 5; withdraw 6",
            ],
            want: &[],
        },
        Case {
            name: "a task granted again after its preemption is not granted twice",
            journal: &["node n1 1", "grant 1 1 0/0", "preempt 1 1", "grant 1 2 0/0"],
            want: &[],
        },
        Case {
            name: "room reserved for a pass is no lease",
            journal: &["node n1 1", "reserve 2 0/0; grant 1 1 0/0"],
            want: &[],
        },
        Case {
            name: "a whole GPU granted to two tasks",
            journal: &["node n1 4", "grant 1 1 0/0 0/1", "grant 2 2 0/1"],
            want: &[
                "entry 3:",
                "GPU 1 of node #0 (n1) held twice",
                "task-2 is granted lease 2",
                "lease 1 (task-1, 1000 milli-GPU)",
            ],
        },
        Case {
            name: "fractions of one GPU adding up to more than a GPU",
            journal: &[
                "node n1 2",
                "grant 1 1 0/1=600",
                "grant 2 2 0/1=300",
                "grant 3 3 0/1=200",
            ],
            want: &[
                "entry 4:",
                "GPU 1 of node #0 (n1) held twice",
                "task-3 is granted lease 3 with 200 milli-GPU",
                "lease 1 (task-1, 600 milli-GPU), lease 2 (task-2, 300 milli-GPU)",
                "900 of its 1000",
            ],
        },
        Case {
            name: "a whole GPU granted where a fraction runs",
            journal: &["node n1 1", "grant 1 1 0/0=100", "grant 2 2 0/0"],
            want: &[
                "entry 3:",
                "GPU 0 of node #0",
                "lease 1 (task-1, 100 milli-GPU)",
            ],
        },
        Case {
            name: "a fraction granted on a GPU held whole, within one entry",
            journal: &["node n1 1", "grant 1 1 0/0; grant 2 2 0/0=250"],
            want: &[
                "entry 2:",
                "task-2 is granted lease 2 with 250",
                "lease 1 (task-1",
            ],
        },
        Case {
            name: "one placement naming the same GPU twice",
            journal: &["node n1 4", "grant 1 1 0/3 0/3"],
            want: &[
                "entry 2:",
                "GPU 3 of node #0",
                "lease 1 (task-1, 1000 milli-GPU)",
            ],
        },
        Case {
            name: "a GPU the node does not have",
            journal: &["node n1 2", "grant 1 1 0/2"],
            want: &[
                "entry 2:",
                "task-1 is granted lease 1 on GPU 2 of node #0 (n1)",
            ],
        },
        Case {
            name: "a node never added",
            journal: &["node n1 2", "grant 1 1 1/0"],
            want: &["entry 2:", "GPU 0 of node #1, which has no such GPU"],
        },
        Case {
            name: "a task granted while it holds a lease",
            journal: &["node n1 4", "grant 1 1 0/0", "grant 1 2 0/1"],
            want: &[
                "entry 3:",
                "task-1 granted twice: lease 2 while it still holds lease 1 (granted at entry 2",
            ],
        },
        Case {
            name: "a grant duplicated in the same entry is a double grant",
            journal: &["node n1 4", "grant 1 1 0/0; grant 1 1 0/0"],
            want: &[
                "entry 2:",
                "task-1 granted twice: lease 1 while it still holds lease 1",
            ],
        },
        Case {
            name: "a lease id granted again after it ended",
            journal: &["node n1 4", "grant 1 1 0/0", "release 1 1", "grant 2 1 0/1"],
            want: &[
                "entry 4:",
                "lease 1 granted twice: to task-2, and first at entry 2",
            ],
        },
        Case {
            name: "a release of a lease never granted",
            journal: &["node n1 4", "grant 1 1 0/0", "release 2 7"],
            want: &[
                "entry 3:",
                "lease 7 of task-2 released, but it was never granted",
            ],
        },
        Case {
            name: "a preemption of a lease never granted",
            journal: &["node n1 4", "preempt 3 3"],
            want: &[
                "entry 2:",
                "lease 3 of task-3 preempted, but it was never granted",
            ],
        },
        Case {
            name: "a lease released twice",
            journal: &["node n1 4", "grant 1 1 0/0", "release 1 1", "release 1 1"],
            want: &[
                "entry 4:",
                "lease 1 of task-1 released, but it already ended at entry 3",
            ],
        },
        Case {
            name: "a lease preempted after its release",
            journal: &["node n1 4", "grant 1 1 0/0", "release 1 1; preempt 1 1"],
            want: &[
                "entry 3:",
                "lease 1 of task-1 preempted, but it already ended at entry 3",
            ],
        },
        Case {
            name: "a lease ended as another task's",
            journal: &["node n1 4", "grant 1 1 0/0", "release 2 1"],
            want: &[
                "entry 3:",
                "lease 1 released as task-2's, but it was granted to task-1",
            ],
        },
        Case {
            name: "a running task withdrawn without its release",
            journal: &["node n1 4", "grant 1 1 0/0", "withdraw 1"],
            want: &["entry 3:", "task-1 withdrawn while it holds lease 1"],
        },
        Case {
            name: "a GPU is free again once its lease ends",
            journal: &[
                "node n1 1",
                "grant 1 1 0/0",
                "release 1 1; grant 2 2 0/0",
                "preempt 2 2; grant 3 3 0/0=500; grant 4 4 0/0=500",
            ],
            want: &[],
        },
    ];
    for case in cases {
        let got = check(&journal(case.journal));
        match (got, case.want) {
            (Ok(()), []) => {}
            (Ok(()), want) => panic!("{}: passed, want a violation saying {want:?}", case.name),
            (Err(violation), []) => panic!("{}: want a pass, got {violation}", case.name),
            (Err(violation), want) => {
                let message = violation.to_string();
                for part in want {
                    assert!(
                        message.contains(part),
                        "{}: {message:?} lacks {part:?}",
                        case.name
                    );
                }
            }
        }
    }
}

#[test]
fn a_rejected_node_addition_adds_no_node() {
    let mut entries = journal(&["node n1 4", "grant 1 1 0/0"]);
    entries[0].rejected = Some("refused".into());
    let violation = check(&entries).unwrap_err();
    assert!(
        matches!(violation.broken, Broken::NoSuchGpu { .. }),
        "{violation}"
    );
}
