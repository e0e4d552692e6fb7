//! What one journal entry asks of this node's executor: pure, so every rule is tested without
//! NATS, processes or clocks.
//!
//! | in the entry | this node | order |
//! |---|---|---|
//! | a dispatch with a share on this node, lease not running here | rank = position of this node in the dispatch | start |
//! | a dispatch of a lease already running here (a redelivered entry) | — | nothing |
//! | preempted, lease running here | — | stop (preempted) |
//! | released, lease running here | — | stop (cancelled): the task ended elsewhere or was given up |
//! | anything else | — | nothing |
//!
//! A task that spans several nodes runs one process per node; rank 0 (the first node of the
//! grant) reports its completion, and any rank reports a failure.

use std::collections::BTreeMap;

use allot_events::alloc::{Applied, Dispatch, NodeGrant};
use allot_events::task::StopCause;
use allot_sched::{Decision, LeaseId};

/// One thing for the executor to do.
// Orders are made and carried out one journal entry at a time: boxing the big variant would
// buy nothing but an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Order {
    /// Start a run of this grant as rank `rank` of its nodes.
    Start {
        /// The grant.
        dispatch: Dispatch,
        /// This node's share.
        share: NodeGrant,
        /// Position of this node among the grant's nodes (0 reports completion).
        rank: usize,
    },
    /// Stop the run under this lease.
    Stop {
        /// The run's lease.
        lease: LeaseId,
        /// Why.
        cause: StopCause,
    },
}

/// The orders `applied` gives `node`, whose running leases are `running`.
pub fn orders<T>(node: &str, applied: &Applied, running: &BTreeMap<LeaseId, T>) -> Vec<Order> {
    let mut out = Vec::new();
    for decision in &applied.entry.decisions {
        let (lease, cause) = match decision {
            Decision::Preempted { lease, .. } => (*lease, StopCause::Preempted),
            Decision::Released { lease, .. } => (*lease, StopCause::Cancelled),
            _ => continue,
        };
        if running.contains_key(&lease) {
            out.push(Order::Stop { lease, cause });
        }
    }
    for dispatch in &applied.dispatch {
        if running.contains_key(&dispatch.lease) {
            continue;
        }
        if let Some((rank, share)) = dispatch
            .nodes
            .iter()
            .enumerate()
            .find(|(_, share)| share.node == node)
        {
            out.push(Order::Start {
                dispatch: dispatch.clone(),
                share: share.clone(),
                rank,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_events::alloc::Launch;
    use allot_sched::journal::Entry;
    use allot_sched::{Input, TaskId};

    fn share(node: &str) -> NodeGrant {
        NodeGrant {
            node: node.into(),
            gpu_model: "H100".into(),
            gpus: vec![(0, 1000)],
            mig: None,
            cpu_milli: 1000,
            memory_mib: 1024,
        }
    }

    fn dispatch(task: u64, lease: u64, nodes: &[&str]) -> Dispatch {
        Dispatch {
            task: TaskId(task),
            lease: LeaseId(lease),
            launch: Launch {
                workload: "w".into(),
                name: format!("t{task}"),
                team: String::new(),
                run: Default::default(),
            },
            nodes: nodes.iter().map(|n| share(n)).collect(),
        }
    }

    fn applied(decisions: Vec<Decision>, dispatch: Vec<Dispatch>) -> Applied {
        Applied {
            pool: "p".into(),
            source: None,
            entry: Entry {
                seq: 1,
                input: Input::Schedule { at: 1 },
                decisions,
                rejected: None,
            },
            launch: None,
            dispatch,
        }
    }

    #[test]
    fn entries_become_the_orders_of_this_node() {
        struct Case {
            name: &'static str,
            applied: Applied,
            running: &'static [u64],
            want: Vec<Order>,
        }
        let preempted = |lease| Decision::Preempted {
            task: TaskId(9),
            lease: LeaseId(lease),
            at: 1,
            for_task: None,
            lost: 0,
            reason: "r".into(),
        };
        let released = |lease| Decision::Released {
            task: TaskId(9),
            lease: LeaseId(lease),
            at: 1,
        };
        let cases = [
            Case {
                name: "a grant on this node starts as rank 0",
                applied: applied(vec![], vec![dispatch(1, 1, &["n1"])]),
                running: &[],
                want: vec![Order::Start {
                    dispatch: dispatch(1, 1, &["n1"]),
                    share: share("n1"),
                    rank: 0,
                }],
            },
            Case {
                name: "a grant elsewhere is not ours",
                applied: applied(vec![], vec![dispatch(1, 1, &["n2"])]),
                running: &[],
                want: vec![],
            },
            Case {
                name: "a task spanning nodes runs here as the rank of this node",
                applied: applied(vec![], vec![dispatch(1, 1, &["n2", "n1"])]),
                running: &[],
                want: vec![Order::Start {
                    dispatch: dispatch(1, 1, &["n2", "n1"]),
                    share: share("n1"),
                    rank: 1,
                }],
            },
            Case {
                name: "a redelivered grant of a running lease starts nothing",
                applied: applied(vec![], vec![dispatch(1, 1, &["n1"])]),
                running: &[1],
                want: vec![],
            },
            Case {
                name: "preempting a run here stops it, before the grant it made room for",
                applied: applied(vec![preempted(3)], vec![dispatch(1, 4, &["n1"])]),
                running: &[3],
                want: vec![
                    Order::Stop {
                        lease: LeaseId(3),
                        cause: StopCause::Preempted,
                    },
                    Order::Start {
                        dispatch: dispatch(1, 4, &["n1"]),
                        share: share("n1"),
                        rank: 0,
                    },
                ],
            },
            Case {
                name: "a release of a run still here is a cancellation",
                applied: applied(vec![released(3)], vec![]),
                running: &[3],
                want: vec![Order::Stop {
                    lease: LeaseId(3),
                    cause: StopCause::Cancelled,
                }],
            },
            Case {
                name: "decisions about leases not running here change nothing",
                applied: applied(vec![preempted(5), released(6)], vec![]),
                running: &[3],
                want: vec![],
            },
        ];
        for case in cases {
            let running: BTreeMap<LeaseId, ()> =
                case.running.iter().map(|l| (LeaseId(*l), ())).collect();
            assert_eq!(
                orders("n1", &case.applied, &running),
                case.want,
                "{}",
                case.name
            );
        }
    }
}
