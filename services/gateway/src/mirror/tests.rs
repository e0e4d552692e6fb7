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
    let decisions = reference.apply(input.clone()).unwrap();
    mirror.apply(&AllocEvent::Applied(Applied {
        pool: "default".into(),
        source: None,
        entry: Entry {
            seq,
            input,
            decisions,
            rejected: None,
        },
        launch,
        dispatch: vec![],
    }));
}

#[test]
fn kpis_start_at_the_journals_first_entry_and_integrate_each_minute() {
    let mut mirror = Mirror::default();
    mirror.apply(&AllocEvent::LeaderElected(LeaderElected {
        pool: "default".into(),
        leader: "a".into(),
        policy: "fifo".into(),
        format: allot_sched::journal::FORMAT.into(),
        entries: 0,
    }));
    let mut reference = Scheduler::new(allot_sched::policy::by_name("fifo").unwrap());
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
