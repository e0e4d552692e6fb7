//! Which bus events become which scheduler inputs, for one pool.
//!
//! | event | input |
//! |---|---|
//! | node registered (its pool, first time) | node added |
//! | node unreachable / recovered (known node) | node not schedulable / schedulable |
//! | task ready (its pool) | task submitted |
//! | task preload (its pool) | task preloaded: room is held for it until it is ready |
//! | task checkpointed | task checkpointed |
//! | task predicted (a task the scheduler holds) | task predicted: its estimate from now on |
//! | task completed / failed (under the task's running lease: the leader refuses any other) | task finished, with how its run ended (or, for a run that ended as it was being stopped, task withdrawn with it) |
//! | task cancelled (a task the scheduler holds, or parked) | task withdrawn: queued, it leaves the queue; running, its lease is released |
//! | budget exceeded / within again (billing, any pool) | team budget: its new work below the floor waits, or is flagged |
//! | remediation: soft-cordon, cordon / drain / return to service (any node: one not yet joined joins held) | node held by remediation / held and drained / let go |
//! | remediation: GPU out of service / returned (known node) | GPU out of service (its tasks requeued) / in service |
//! | remediation: idle reclaim (a running task of the pool) | task requeued |
//! | operator cordon / uncordon (any node) | node held by the operator (drained with `--drain`) / let go |
//!
//! A cancellation (the planner gave the task up: its workload was aborted or failed) withdraws
//! the task: a queued one (its gang whole) leaves the queue at once, so it never takes GPUs or
//! preempts anything; a preloaded one's hold ends; a running one's lease is released. One for
//! a task the scheduler no longer holds (already released, or a late duplicate) becomes
//! nothing, so the journal does not fill with refusals.
//!
//! Everything else concerns other services and becomes nothing. A node that registers again
//! (its collector restarted) is already known and changes nothing; one that changes shape
//! must leave the pool and join again (not supported yet: the first registration stands).

use allot_events::cost::BudgetLevel;
use allot_events::node::NodeRegistered;
use allot_events::remediation::{Action, ActionTaken};
use allot_events::{
    AnyEvent, CostEvent, EventKind, InventoryEvent, NodeEvent, RemediationEvent, TaskEvent,
};
use std::collections::BTreeMap;

use allot_sched::{Holder, Input, LeaseId, NodeSpec, RunEnd, Scheduler, TaskId, TaskSpec, Time};

/// The input `event` means for `pool`'s scheduler at `at`, if any; `parked` are the tasks
/// waiting outside the scheduler for the pool to grow (a cancellation withdraws them too).
pub fn input(
    pool: &str,
    scheduler: &Scheduler,
    parked: &BTreeMap<TaskId, TaskSpec>,
    event: &AnyEvent,
    at: Time,
) -> Option<Input> {
    let known = |node: &str| scheduler.cluster().find(node).is_some();
    match event {
        AnyEvent::Node(NodeEvent::Registered(r)) if r.pool == pool && !known(&r.node) => {
            Some(Input::NodeAdded(node_spec(r)))
        }
        AnyEvent::Inventory(InventoryEvent::NodeUnreachable(n)) if known(&n.node) => {
            Some(Input::NodeSchedulable {
                node: n.node.clone(),
                schedulable: false,
            })
        }
        AnyEvent::Inventory(InventoryEvent::NodeRecovered(n)) if known(&n.node) => {
            Some(Input::NodeSchedulable {
                node: n.node.clone(),
                schedulable: true,
            })
        }
        AnyEvent::Task(TaskEvent::Ready(t)) if t.pool == pool => Some(Input::TaskSubmitted {
            task: t.task.clone(),
            at,
        }),
        AnyEvent::Cost(CostEvent::BudgetCrossed(b)) => match b.level {
            BudgetLevel::Warning => None,
            BudgetLevel::Exceeded => Some(Input::TeamBudget {
                team: b.team.clone(),
                exceeded: true,
                block_below: b.block_below,
            }),
            BudgetLevel::Within => Some(Input::TeamBudget {
                team: b.team.clone(),
                exceeded: false,
                block_below: b.block_below,
            }),
        },
        AnyEvent::Task(TaskEvent::Preload(t)) if t.pool == pool => Some(Input::TaskPreloaded {
            task: t.task.clone(),
            expected_at: t.expected_at,
            at,
        }),
        AnyEvent::Task(TaskEvent::Checkpointed(t)) if t.pool == pool => {
            Some(Input::TaskCheckpointed { task: t.task, at })
        }
        AnyEvent::Task(TaskEvent::Completed(t)) if t.pool == pool => Some(ended(
            scheduler,
            t.task,
            RunEnd::Completed { lease: t.lease },
            &t.node,
            at,
        )),
        AnyEvent::Task(TaskEvent::Failed(t)) if t.pool == pool => Some(ended(
            scheduler,
            t.task,
            RunEnd::Failed {
                lease: t.lease,
                reason: t.reason.clone(),
            },
            &t.node,
            at,
        )),
        // The predictor publishes only after it read the task's announcement in the same
        // stream, so the scheduler holds the task unless it has already ended: then the
        // prediction changes nothing and is not journalled.
        AnyEvent::Task(TaskEvent::Predicted(p)) if p.pool == pool && scheduler.holds(p.task) => {
            Some(Input::TaskPredicted {
                task: p.task,
                duration: p.duration_ms,
                at,
            })
        }
        // A node may be held before it joins (an operator cordons it ahead of its first
        // registration): it then joins held.
        AnyEvent::Remediation(RemediationEvent::ActionTaken(a)) => {
            remediation(scheduler, a, known(&a.node), at)
        }
        AnyEvent::Remediation(RemediationEvent::OperatorCordon(c)) => Some(Input::NodeHeld {
            node: c.node.clone(),
            by: Holder::Operator,
            held: c.cordoned,
            drain: c.drain && c.cordoned,
            reason: format!(
                "{} by {}: {}",
                if c.cordoned { "cordoned" } else { "uncordoned" },
                c.by,
                c.reason
            ),
            at,
        }),
        AnyEvent::Task(TaskEvent::Cancelled(t))
            if t.pool == pool && (scheduler.holds(t.task) || parked.contains_key(&t.task)) =>
        {
            Some(Input::TaskWithdrawn {
                task: t.task,
                reason: t.reason.clone(),
                at,
                run: None,
            })
        }
        _ => None,
    }
}

/// The input a remediation action means, if any: alerts and requests to an actuator change
/// nothing here.
fn remediation(scheduler: &Scheduler, a: &ActionTaken, known: bool, at: Time) -> Option<Input> {
    let reason = format!("remediation rule {}: {}", a.rule, a.reason);
    let held = |held: bool, drain: bool| Input::NodeHeld {
        node: a.node.clone(),
        by: Holder::Remediation,
        held,
        drain,
        reason: reason.clone(),
        at,
    };
    let gpu = |in_service: bool| {
        a.gpu.filter(|_| known).map(|gpu| Input::GpuService {
            node: a.node.clone(),
            gpu,
            in_service,
            reason: reason.clone(),
            at,
        })
    };
    match a.action {
        Action::SoftCordon | Action::Cordon => Some(held(true, false)),
        Action::Drain => Some(held(true, true)),
        Action::ReturnToService => Some(held(false, false)),
        Action::GpuOutOfService => gpu(false),
        Action::GpuReturnToService => gpu(true),
        Action::IdleReclaim => a
            .tasks
            .iter()
            .find_map(|t| scheduler.task_of_lease(t.lease))
            .map(|task| Input::TaskRequeued { task, reason, at }),
        Action::Alert | Action::ResetRequest | Action::RebootRequest => None,
    }
}

/// Why an event must not be believed because of where it was published, if it must not: a
/// remediation event about one node published under another's subject.
pub fn misaddressed(subject: &str, event: &AnyEvent) -> Option<String> {
    let AnyEvent::Remediation(r) = event else {
        return None;
    };
    let expected = r.nats_subject();
    (subject != expected).then(|| {
        format!(
            "a remediation event about node {} arrived on {subject}, not {expected}",
            r.entity()
        )
    })
}

/// Whether a report of lease `lease` on `node` is about the task's run that was stopped (and
/// the task waits to run again): an end that came just as the run was being stopped.
pub fn ends_stopped_run(scheduler: &Scheduler, task: TaskId, lease: LeaseId, node: &str) -> bool {
    scheduler.running_lease(task).is_none()
        && scheduler.stopped_run(task).is_some_and(|(stopped, nodes)| {
            stopped == lease
                && nodes
                    .iter()
                    .any(|i| scheduler.cluster().node(*i).spec.name == node)
        })
}

/// The input a run's end on `node` means: the task finished — or, when it
/// [`ends_stopped_run`], the waiting task is withdrawn: its work is done (or its failure is the
/// planner's to retry as a new attempt), so it must not run twice. Either carries the run's
/// end, which the planner takes from the journal.
fn ended(scheduler: &Scheduler, task: TaskId, run: RunEnd, node: &str, at: Time) -> Input {
    let lease = run.lease();
    if ends_stopped_run(scheduler, task, lease, node) {
        return Input::TaskWithdrawn {
            task,
            reason: format!(
                "its run under lease {} {} as it was being stopped: no second run",
                lease.0,
                run.outcome()
            ),
            at,
            run: Some(run),
        };
    }
    Input::TaskFinished {
        task,
        at,
        run: Some(run),
    }
}

/// The scheduler's view of a registered node: its GPUs (one model: the first GPU's; the
/// smallest memory of any), CPU, memory and rack. GPUs are one NVLink domain per node until
/// collectors report larger domains.
pub fn node_spec(r: &NodeRegistered) -> NodeSpec {
    NodeSpec {
        name: r.node.clone(),
        gpus: r.gpus.len() as u32,
        gpu_model: r.gpus.first().map(|g| g.model.clone()).unwrap_or_default(),
        gpu_memory_mib: r.gpus.iter().map(|g| g.memory_total_mib).min().unwrap_or(0),
        cpu_milli: r.cpu_milli,
        memory_mib: r.memory_mib,
        rack: r.rack.clone().unwrap_or_default(),
        ..NodeSpec::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_events::task::{TaskCancelled, TaskCompleted, TaskReady};
    use allot_testkit::node;

    #[test]
    fn events_of_the_pool_become_inputs_and_the_rest_nothing() {
        let mut s = Scheduler::new(allot_sched::policy::by_name("fifo").unwrap());
        let mut parked = BTreeMap::new();
        let n1 = node("n1").gpus(4).model("A100").pool("p").registered();
        let other = node("n2").gpus(4).pool("q").registered();
        let added = input(
            "p",
            &s,
            &parked,
            &NodeEvent::Registered(n1.clone()).into(),
            5,
        );
        assert!(
            matches!(&added, Some(Input::NodeAdded(spec)) if spec.gpus == 4 && spec.gpu_model == "A100"),
            "{added:?}"
        );
        s.apply(added.unwrap()).unwrap();
        struct Case {
            name: &'static str,
            event: AnyEvent,
            want: Option<Input>,
        }
        let ready = TaskReady {
            pool: "p".into(),
            workload: "w".into(),
            name: "train".into(),
            task: TaskSpec::new(7, "vision", 2),
            run: Default::default(),
        };
        let cancelled = TaskEvent::Cancelled(TaskCancelled {
            pool: "p".into(),
            task: TaskId(7),
            workload: "w".into(),
            name: "train".into(),
            reason: "aborted by alice: wrong data".into(),
        });
        let cases = [
            Case {
                name: "a node registering again changes nothing",
                event: NodeEvent::Registered(n1).into(),
                want: None,
            },
            Case {
                name: "another pool's node is not ours",
                event: NodeEvent::Registered(other).into(),
                want: None,
            },
            Case {
                name: "a ready task is submitted at the allocator's time",
                event: TaskEvent::Ready(ready.clone()).into(),
                want: Some(Input::TaskSubmitted {
                    task: ready.task.clone(),
                    at: 5,
                }),
            },
            Case {
                name: "another pool's task is not ours",
                event: TaskEvent::Ready(TaskReady {
                    pool: "q".into(),
                    ..ready.clone()
                })
                .into(),
                want: None,
            },
            Case {
                name: "a completion finishes the task",
                event: TaskEvent::Completed(TaskCompleted {
                    pool: "p".into(),
                    task: TaskId(7),
                    node: "n1".into(),
                    lease: allot_sched::LeaseId(1),
                })
                .into(),
                want: Some(Input::TaskFinished {
                    task: TaskId(7),
                    at: 5,
                    run: Some(RunEnd::Completed {
                        lease: allot_sched::LeaseId(1),
                    }),
                }),
            },
            Case {
                name: "a cancellation of a task the scheduler does not hold is nothing",
                event: cancelled.clone().into(),
                want: None,
            },
            Case {
                name: "another pool's cancellation is not ours",
                event: TaskEvent::Cancelled(TaskCancelled {
                    pool: "q".into(),
                    task: TaskId(7),
                    workload: "w".into(),
                    name: "train".into(),
                    reason: "aborted".into(),
                })
                .into(),
                want: None,
            },
        ];
        for case in cases {
            assert_eq!(
                input("p", &s, &parked, &case.event, 5),
                case.want,
                "{}",
                case.name
            );
        }
        let withdrawn = Some(Input::TaskWithdrawn {
            task: TaskId(7),
            reason: "aborted by alice: wrong data".into(),
            at: 6,
            run: None,
        });
        parked.insert(TaskId(7), ready.task.clone());
        assert_eq!(
            input("p", &s, &parked, &cancelled.clone().into(), 6),
            withdrawn,
            "a cancellation of a parked task withdraws it (journalled, so it stays unparked)"
        );
        parked.clear();
        s.apply(Input::TaskSubmitted {
            task: ready.task.clone(),
            at: 5,
        })
        .unwrap();
        assert_eq!(
            input("p", &s, &parked, &cancelled.into(), 6),
            withdrawn,
            "a cancellation of a queued task withdraws it"
        );
    }

    /// A run preempted in the same moment it completed (or failed): its end is journalled as
    /// the withdrawal of the task now waiting to run again, so it never runs twice; an end that
    /// names another lease is still a plain finish (which the leader refuses).
    #[test]
    fn the_end_of_a_run_stopped_as_it_ended_withdraws_the_task_waiting_to_rerun() {
        let mut s = Scheduler::new(allot_sched::policy::by_name("allot").unwrap());
        let n1 = node("n1").gpus(1).pool("p").registered();
        s.apply(Input::NodeAdded(node_spec(&n1))).unwrap();
        let low = TaskSpec::new(1, "nlp", 1);
        let high = TaskSpec {
            priority: 100,
            ..TaskSpec::new(2, "vision", 1)
        };
        s.apply(Input::TaskSubmitted { task: low, at: 0 }).unwrap();
        let granted = s.apply(Input::Schedule { at: 0 }).unwrap();
        let lease = granted
            .iter()
            .find_map(|d| match d {
                allot_sched::Decision::Granted { lease, .. } => Some(*lease),
                _ => None,
            })
            .expect("task 1 granted");
        s.apply(Input::TaskSubmitted { task: high, at: 10 })
            .unwrap();
        let decisions = s.apply(Input::Schedule { at: 10 }).unwrap();
        assert!(
            decisions
                .iter()
                .any(|d| matches!(d, allot_sched::Decision::Preempted { task, .. } if task.0 == 1)),
            "{decisions:?}"
        );
        assert_eq!(s.stopped_run(TaskId(1)).map(|(l, _)| l), Some(lease));

        let completed = |lease: LeaseId| -> AnyEvent {
            TaskEvent::Completed(TaskCompleted {
                pool: "p".into(),
                task: TaskId(1),
                node: "n1".into(),
                lease,
            })
            .into()
        };
        let parked = BTreeMap::new();
        let got = input("p", &s, &parked, &completed(lease), 20);
        assert!(
            matches!(&got, Some(Input::TaskWithdrawn { task, reason, run: Some(run), .. })
                if task.0 == 1 && reason.contains("completed as it was being stopped")
                    && *run == RunEnd::Completed { lease }),
            "{got:?}"
        );
        let stale = input("p", &s, &parked, &completed(LeaseId(lease.0 + 99)), 20);
        assert!(
            matches!(stale, Some(Input::TaskFinished { .. })),
            "{stale:?}"
        );
        // Withdrawn, it never runs again.
        s.apply(got.unwrap()).unwrap();
        assert!(!s.holds(TaskId(1)));
    }
}
