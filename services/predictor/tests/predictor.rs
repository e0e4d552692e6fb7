//! The predictor against a real nats-server: each announced task gets one prediction, naming
//! its fallback on a cold start; finished runs (preempted runs included) teach the next
//! prediction of the same task; a restart rebuilds what was learned from SQLite; an
//! announcement delivered twice is predicted once; a late report of a superseded run is
//! not taken for the attempt's end.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_bus::{Publisher, catalog, ensure_streams};
use allot_events::task::{
    RunSpec, StopCause, TaskCompleted, TaskFailed, TaskPredicted, TaskReady, TaskStarted,
    TaskStopped,
};
use allot_events::{AnyEvent, TaskEvent, decode};
use allot_predict::Basis;
use allot_predictor::Config;
use allot_sched::{LeaseId, TaskId, TaskSpec};
use allot_testkit::NatsServer;

const POOL: &str = "default";

async fn bus() -> (NatsServer, async_nats::Client) {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    ensure_streams(&async_nats::jetstream::new(client.clone()), &catalog(1))
        .await
        .unwrap();
    (server, client)
}

/// A bus, publishers as the planner and node-1's executor, and a folder for the predictor.
async fn setup() -> (
    NatsServer,
    async_nats::Client,
    Publisher,
    Publisher,
    tempfile::TempDir,
) {
    let (server, client) = bus().await;
    let planner = Publisher::new(client.clone(), "/allot/planner");
    let executor = Publisher::new(client.clone(), "/allot/collector/node-1");
    (
        server,
        client,
        planner,
        executor,
        tempfile::tempdir().unwrap(),
    )
}

fn ready(id: u64, team: &str, workload: &str, gpus: u32, declared_ms: Option<u64>) -> TaskEvent {
    TaskEvent::Ready(TaskReady {
        pool: POOL.into(),
        workload: workload.into(),
        name: "train".into(),
        task: TaskSpec::new(id, team, gpus),
        run: RunSpec {
            attempt: 1,
            duration_ms: declared_ms,
            ..RunSpec::default()
        },
    })
}

fn started(id: u64, lease: u64) -> TaskEvent {
    TaskEvent::Started(TaskStarted {
        pool: POOL.into(),
        task: TaskId(id),
        node: "node-1".into(),
        lease: LeaseId(lease),
        workload: String::new(),
        name: "train".into(),
        how: "simulated".into(),
        log: None,
    })
}

fn completed(id: u64, lease: u64) -> TaskEvent {
    TaskEvent::Completed(TaskCompleted {
        pool: POOL.into(),
        task: TaskId(id),
        node: "node-1".into(),
        lease: LeaseId(lease),
    })
}

fn failed(id: u64, lease: u64) -> TaskEvent {
    TaskEvent::Failed(TaskFailed {
        pool: POOL.into(),
        task: TaskId(id),
        node: "node-1".into(),
        lease: LeaseId(lease),
        reason: "exit code 137".into(),
    })
}

fn preempted(id: u64, lease: u64, ran_ms: u64) -> TaskEvent {
    TaskEvent::Stopped(TaskStopped {
        pool: POOL.into(),
        task: TaskId(id),
        node: "node-1".into(),
        cause: StopCause::Preempted,
        checkpointed: false,
        killed: false,
        ran_ms,
        lease: Some(LeaseId(lease)),
    })
}

/// Every prediction stored in WORKLOADS, with its event id.
async fn predictions(client: &async_nats::Client) -> Vec<(String, TaskPredicted)> {
    allot_testkit::streams::read_all(client, "WORKLOADS")
        .await
        .into_iter()
        .filter_map(|m| {
            let envelope = decode(&m.payload).unwrap();
            match envelope.data {
                AnyEvent::Task(TaskEvent::Predicted(p)) => Some((envelope.id.to_string(), p)),
                _ => None,
            }
        })
        .collect()
}

/// Runs the predictor until it has applied everything in WORKLOADS up to now (or 30 s pass),
/// then stops it.
async fn predict(url: &str, dir: &std::path::Path, client: &async_nats::Client) {
    let config = Config::new(url, dir);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let predictor = tokio::spawn(allot_predictor::run(config, async {
        let _ = stopped.await;
    }));
    // Its own predictions land in the stream too; they are applied (as nothing) as well.
    let db = dir.join("predictor.db");
    allot_testkit::streams::wait_until_applied(
        client,
        "WORKLOADS",
        Duration::from_secs(30),
        || {
            allot_store::rusqlite::Connection::open(&db)
                .ok()
                .and_then(|c| allot_store::position(&c, "predictor").ok().flatten())
        },
    )
    .await;
    let _ = stop.send(());
    predictor.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predictions_fall_back_by_name_learn_from_finished_runs_and_survive_a_restart() {
    let (server, client, planner, executor, dir) = setup().await;

    // Nothing finished yet: the declared estimate, then nothing at all.
    planner
        .publish(ready(1, "vision", "train-0123456789", 1, Some(60_000)))
        .await
        .unwrap();
    planner
        .publish(ready(2, "vision", "train-abcdef0123", 1, None))
        .await
        .unwrap();
    predict(&server.url(), dir.path(), &client).await;
    let first = predictions(&client).await;
    let by_task: BTreeMap<u64, &TaskPredicted> = first.iter().map(|(_, p)| (p.task.0, p)).collect();
    assert_eq!(by_task[&1].basis, Basis::Declared);
    assert_eq!(by_task[&1].duration_ms, 60_000);
    assert!(by_task[&1].p10_ms < 60_000 && by_task[&1].p90_ms > 60_000);
    assert_eq!(by_task[&2].basis, Basis::Default);
    assert_eq!(by_task[&1].model_version, None, "no model on a cold start");

    // Task 1 runs about 300 ms; task 2 is preempted after 4 s (as its executor reports), then
    // runs about 300 ms more: 4.3 s in all.
    executor.publish(started(1, 1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    executor.publish(completed(1, 1)).await.unwrap();
    executor.publish(started(2, 2)).await.unwrap();
    executor.publish(preempted(2, 2, 4_000)).await.unwrap();
    executor.publish(started(2, 3)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    executor.publish(completed(2, 3)).await.unwrap();
    predict(&server.url(), dir.path(), &client).await;

    // A restarted predictor (the model rebuilt from predictor.db) predicts the same task of a
    // third submission from its two runs, and strangers from everyone's; task 1 announced
    // again (a re-sent ready) is not predicted twice.
    planner
        .publish(ready(3, "vision", "train-0000000003", 1, Some(60_000)))
        .await
        .unwrap();
    planner
        .publish(ready(4, "vision", "sweep-0000000004", 2, Some(90_000)))
        .await
        .unwrap();
    planner
        .publish(ready(5, "nlp", "eval-0000000005", 1, None))
        .await
        .unwrap();
    planner
        .publish(ready(1, "vision", "train-0123456789", 1, Some(60_000)))
        .await
        .unwrap();
    predict(&server.url(), dir.path(), &client).await;
    let all = predictions(&client).await;
    let tasks: Vec<u64> = all.iter().map(|(_, p)| p.task.0).collect();
    assert_eq!(tasks, [1, 2, 3, 4, 5], "one prediction per task");
    for (id, p) in &all {
        assert_eq!(*id, allot_predictor::event_id(p.task).to_string());
    }
    let p3 = &all[2].1;
    assert_eq!(p3.basis, Basis::Identity, "{p3:?}");
    // The median of ~300 ms and ~4,300 ms.
    assert!(
        (2_300..4_000).contains(&p3.duration_ms),
        "task 3 predicted from its two runs: {p3:?}"
    );
    // Another size of the team: its declared estimate; another team: everyone's runs.
    assert_eq!(all[3].1.basis, Basis::Declared);
    assert_eq!(all[3].1.duration_ms, 90_000);
    assert_eq!(all[4].1.basis, Basis::Global);
    assert!((2_300..4_000).contains(&all[4].1.duration_ms));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_report_of_a_superseded_run_neither_ends_the_attempt_nor_teaches_its_length() {
    let (server, client, planner, executor, dir) = setup().await;
    planner
        .publish(ready(1, "vision", "train-0123456789", 1, Some(60_000)))
        .await
        .unwrap();

    // The task is moved: lease 2 starts on another node while lease 1 is still being stopped
    // (its grace period), so lease 1's stop (after 4 s) and its failure (killed) arrive after
    // lease 2's start. Lease 2 then completes.
    executor.publish(started(1, 1)).await.unwrap();
    executor.publish(started(1, 2)).await.unwrap();
    executor.publish(preempted(1, 1, 4_000)).await.unwrap();
    executor.publish(failed(1, 1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    executor.publish(completed(1, 2)).await.unwrap();
    predict(&server.url(), dir.path(), &client).await;

    let db = allot_store::rusqlite::Connection::open(dir.path().join("predictor.db")).unwrap();
    let (outcome, ran_ms): (String, i64) = db
        .query_row(
            "SELECT outcome, ran_ms FROM tasks WHERE task = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        outcome, "completed",
        "the attempt ended with lease 2's report"
    );
    assert!(
        (4_300..10_000).contains(&ran_ms),
        "both runs counted, the second until its completion: {ran_ms} ms"
    );
}
