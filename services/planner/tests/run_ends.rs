//! The planner takes a run's end from the allocator's journal, never from the executor's
//! report: a report of a run that was stopped and granted again since (which the allocator
//! refuses) ends nothing, even when the planner reads it before the grant that superseded the
//! run. Its two consumers (WORKLOADS, DECISIONS) are driven through the planner's handler in
//! exactly that order, on a real SQLite database, with journal entries the scheduler itself
//! produced; no server is needed to choose the order.

use std::sync::Arc;

use chrono::Utc;
use tokio::sync::Notify;

use allot_bus::consumer::{Delivery, Handler};
use allot_events::alloc::Applied;
use allot_events::task::TaskFailed;
use allot_events::workload::WorkloadOutcome;
use allot_events::{AllocEvent, AnyEvent, Envelope, TaskEvent, WorkloadEvent};
use allot_planner::Planner;
use allot_planner::machine::WorkloadStatus;
use allot_planner::store;
use allot_sched::journal;
use allot_sched::{Decision, Input, LeaseId, NodeSpec, RunEnd, Scheduler, TaskId, TaskSpec};
use allot_workload::{Context, Format};

const POOL: &str = "p";

/// One GPU step that is not retried: a failure taken as its run's would fail the workload.
const ONE_STEP: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: one-step, team: vision}
spec:
  tasks:
    - name: train
      resources: {gpus: 1}
      command: [python, train.py]
"#;

/// The planner's two consumers of runs' news, each with its own position, on one database.
struct Consumers {
    db: std::path::PathBuf,
    workloads: Planner,
    decisions: Planner,
    /// Stream sequences handed out so far, per consumer.
    seq: (u64, u64),
}

impl Consumers {
    fn new(dir: &std::path::Path) -> Self {
        let db = dir.join("planner.db");
        let open = || allot_store::open(&db, store::MIGRATIONS).unwrap();
        let wake = Arc::new(Notify::new());
        let planner = |consumer: &str| {
            Planner::new(
                open(),
                consumer.into(),
                POOL.into(),
                None,
                None,
                wake.clone(),
            )
        };
        Consumers {
            workloads: planner("planner-workloads"),
            decisions: planner("planner-decisions"),
            db: db.clone(),
            seq: (0, 0),
        }
    }

    async fn workloads(&mut self, event: Envelope) {
        self.seq.0 += 1;
        let d = Delivery::first(self.seq.0, event, Utc::now());
        self.workloads.handle(&[d]).await.unwrap();
    }

    async fn journal(&mut self, entry: journal::Entry) {
        self.seq.1 += 1;
        let applied = Applied {
            pool: POOL.into(),
            source: None,
            entry,
            launch: None,
            dispatch: vec![],
        };
        let event = Envelope::at("/allot/allocator", AllocEvent::Applied(applied), Utc::now());
        let d = Delivery::first(self.seq.1, event, Utc::now());
        self.decisions.handle(&[d]).await.unwrap();
    }

    fn conn(&self) -> allot_store::rusqlite::Connection {
        allot_store::rusqlite::Connection::open(&self.db).unwrap()
    }

    /// What the planner has queued to publish.
    fn outbox(&self) -> Vec<AnyEvent> {
        store::due(&self.conn(), u64::MAX / 2, 1000)
            .unwrap()
            .0
            .iter()
            .map(|o| allot_events::decode(&o.payload).unwrap().data)
            .collect()
    }
}

/// The allocator's side: a scheduler whose every input becomes a journal entry.
struct Allocator {
    scheduler: Scheduler,
    seq: u64,
}

impl Allocator {
    fn apply(&mut self, input: Input) -> journal::Entry {
        self.seq += 1;
        journal::apply(&mut self.scheduler, self.seq, input)
    }

    fn grant(&mut self, at: u64) -> (journal::Entry, LeaseId) {
        let entry = self.apply(Input::Schedule { at });
        let lease = entry
            .decisions
            .iter()
            .find_map(|d| match d {
                Decision::Granted { lease, .. } => Some(*lease),
                _ => None,
            })
            .expect("granted");
        (entry, lease)
    }
}

#[tokio::test]
async fn a_stale_failure_read_before_the_grant_that_superseded_its_run_ends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut planner = Consumers::new(dir.path());
    let mut allocator = Allocator {
        scheduler: Scheduler::new(allot_sched::policy::by_name("fifo").unwrap()),
        seq: 0,
    };

    let workload = allot_workload::check(ONE_STEP, Format::Yaml, Context::default())
        .unwrap()
        .workload;
    let key = allot_workload::submit::idempotency_key(&workload, None);
    let submission = allot_workload::submit::submission(
        workload,
        key,
        None,
        "ci@test".into(),
        "/test",
        Utc::now(),
    );
    let id = submission.workload_id.clone();
    planner.workloads(submission.envelope).await;
    let ready: TaskSpec = planner
        .outbox()
        .into_iter()
        .find_map(|e| match e {
            AnyEvent::Task(TaskEvent::Ready(r)) => Some(r.task),
            _ => None,
        })
        .expect("the step is ready");
    let task: TaskId = ready.id;

    // Granted, stopped (its GPU reclaimed), granted again: leases one and two.
    allocator.apply(Input::NodeAdded(NodeSpec::new("n1", 1, "H100")));
    allocator.apply(Input::TaskSubmitted { task: ready, at: 1 });
    let (first, one) = allocator.grant(1);
    planner.journal(first).await;
    let stopped = allocator.apply(Input::TaskRequeued {
        task,
        reason: "idle".into(),
        at: 2,
    });
    planner.journal(stopped).await;
    let (second, two) = allocator.grant(3);
    assert!(two > one);

    // The first run's failure, as its executor reported it: the allocator refused it (the task
    // runs under lease two), but the planner reads it before the second grant.
    planner
        .workloads(Envelope::at(
            "/allot/executor/n1",
            TaskEvent::Failed(TaskFailed {
                pool: POOL.into(),
                task,
                node: "n1".into(),
                lease: one,
                reason: "exit status 1".into(),
            }),
            Utc::now(),
        ))
        .await;
    planner.journal(second).await;
    let running = store::task_statuses(&planner.conn(), &id).unwrap();
    assert_eq!(
        running,
        vec![("train".to_owned(), "running".to_owned(), 1)],
        "the stale failure ended nothing"
    );

    // The second run completes: the journal says so, and the workload succeeds.
    let done = allocator.apply(Input::TaskFinished {
        task,
        at: 4,
        run: Some(RunEnd::Completed { lease: two }),
    });
    planner.journal(done).await;
    let w = store::load(&planner.conn(), &id).unwrap().unwrap();
    assert_eq!(
        w.status,
        WorkloadStatus::Finished(WorkloadOutcome::Succeeded)
    );
    let finished: Vec<WorkloadOutcome> = planner
        .outbox()
        .into_iter()
        .filter_map(|e| match e {
            AnyEvent::Workload(WorkloadEvent::Finished(f)) => Some(f.outcome),
            _ => None,
        })
        .collect();
    assert_eq!(finished, vec![WorkloadOutcome::Succeeded]);
}
