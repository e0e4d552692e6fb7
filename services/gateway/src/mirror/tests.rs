use allot_events::alloc::{Applied, Launch, LeaderElected};
use allot_events::task::RunSpec;
use allot_sched::journal::Entry;
use allot_sched::{Input, NodeSpec, TaskSpec};

use super::*;

/// A live journal's clock: milliseconds since the epoch (2026-11-24 00:00 UTC).
const T0: Time = 1_795_478_400_000;
const MINUTE: Time = 60_000;

/// Applies `input` to the pool as the allocator would, journalling what the scheduler decides.
fn apply(mirror: &mut Mirror, reference: &mut Scheduler, seq: u64, input: Input) {
    let launch = match &input {
        Input::TaskSubmitted { task, .. } => Some(Launch {
            workload: "w".into(),
            name: format!("t{}", task.id.0),
            team: task.team.clone(),
            run: RunSpec::default(),
        }),
        _ => None,
    };
    // A refused input is journalled with why, as the allocator does.
    let (decisions, rejected) = match reference.apply(input.clone()) {
        Ok(decisions) => (decisions, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    mirror.apply(&AllocEvent::Applied(Applied {
        pool: "default".into(),
        source: None,
        entry: Entry {
            seq,
            input,
            decisions,
            rejected,
        },
        launch,
        dispatch: vec![],
    }));
}

/// A mirror that has seen pool `default`'s leader (policy `fifo`) elected, and the scheduler
/// that plays its allocator.
fn fifo_pool() -> (Mirror, Scheduler) {
    let mut mirror = Mirror::default();
    mirror.apply(&AllocEvent::LeaderElected(LeaderElected {
        pool: "default".into(),
        leader: "a".into(),
        policy: "fifo".into(),
        format: allot_sched::journal::FORMAT.into(),
        entries: 0,
    }));
    (
        mirror,
        Scheduler::new(allot_sched::policy::by_name("fifo").unwrap()),
    )
}

#[test]
fn kpis_start_at_the_journals_first_entry_and_integrate_each_minute() {
    let (mut mirror, mut reference) = fifo_pool();
    apply(
        &mut mirror,
        &mut reference,
        1,
        Input::NodeAdded(NodeSpec::new("n1", 4, "H100")),
    );
    // Half the GPUs busy from the first minute's start, then a 4-GPU task waits behind.
    apply(
        &mut mirror,
        &mut reference,
        2,
        Input::TaskSubmitted {
            task: TaskSpec::new(1, "vision", 2),
            at: T0,
        },
    );
    apply(&mut mirror, &mut reference, 3, Input::Schedule { at: T0 });
    apply(
        &mut mirror,
        &mut reference,
        4,
        Input::TaskSubmitted {
            task: TaskSpec::new(2, "nlp", 4),
            at: T0 + MINUTE,
        },
    );
    apply(
        &mut mirror,
        &mut reference,
        5,
        Input::Schedule {
            at: T0 + 3 * MINUTE,
        },
    );

    // Minutes from the first entry's, not from the epoch: three of them closed.
    let kpis = mirror.kpis();
    assert_eq!(kpis.len(), 3, "{kpis:?}");
    assert_eq!(kpis[0].at.timestamp_millis() as Time, T0);
    for k in &kpis {
        assert!((k.allocation_ratio - 0.5).abs() < 1e-9, "{k:?}");
        // The waiting task needs 4 GPUs and 2 are free: nothing idle would have fitted.
        assert_eq!(k.wastage_ratio, 0.0, "{k:?}");
    }
    let queue = mirror.queue_at_last();
    assert_eq!(queue.len(), 1);
    assert_eq!((queue[0].task_id, queue[0].position), (2, 1));
    assert_eq!(queue[0].task.as_deref(), Some("t2"));
}

/// A task that left the scheduler (finished, withdrawn, refused as it was submitted) is shown
/// nowhere again, so the mirror forgets its names: a gateway that ran for months kept every
/// task's before. Those still queued or running keep theirs.
#[test]
fn the_names_of_tasks_gone_from_the_scheduler_are_forgotten() {
    let (mut mirror, mut reference) = fifo_pool();
    let mut seq = 0;
    let mut step = |mirror: &mut Mirror, input: Input| {
        seq += 1;
        apply(mirror, &mut reference, seq, input);
    };
    step(
        &mut mirror,
        Input::NodeAdded(NodeSpec::new("n1", 4, "H100")),
    );
    let submit = |id: u64, gpus: u32| Input::TaskSubmitted {
        task: TaskSpec::new(id, "vision", gpus),
        at: T0,
    };
    // 1 and 2 run; 3 waits behind them; 4 waits and is withdrawn; 5 asks for more GPUs than
    // any node has and is refused.
    step(&mut mirror, submit(1, 2));
    step(&mut mirror, submit(2, 2));
    step(&mut mirror, Input::Schedule { at: T0 });
    step(&mut mirror, submit(3, 4));
    step(&mut mirror, submit(4, 4));
    step(&mut mirror, submit(5, 16));
    step(&mut mirror, Input::Schedule { at: T0 + 1 });
    step(
        &mut mirror,
        Input::TaskWithdrawn {
            task: TaskId(4),
            reason: "aborted".into(),
            at: T0 + 2,
            run: None,
        },
    );
    step(
        &mut mirror,
        Input::TaskFinished {
            task: TaskId(1),
            at: T0 + 3,
            run: None,
        },
    );

    let pool = &mirror.pools["default"];
    let mut named: Vec<u64> = pool.names.keys().map(|t| t.0).collect();
    named.sort_unstable();
    let mut submitted: Vec<u64> = pool.submitted.keys().map(|t| t.0).collect();
    submitted.sort_unstable();
    assert_eq!(named, [2, 3], "names kept");
    assert_eq!(submitted, [2, 3], "submission times kept");
    // What is shown still has its names.
    let running: Vec<u64> = pool.running.keys().map(|t| t.0).collect();
    assert_eq!(running, [2]);
    let queue = mirror.queue_at_last();
    assert_eq!(queue.len(), 1);
    assert_eq!(
        (queue[0].task_id, queue[0].task.as_deref()),
        (3, Some("t3"))
    );
}
