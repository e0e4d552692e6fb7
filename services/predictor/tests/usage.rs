//! What the predictor learns of GPU use, against a real nats-server: telemetry samples charged
//! to the runs holding each GPU, stored once across restarts; the GPUs of the fleet; and, with
//! a price table, a right-sizing recommendation in the prediction of a task whose last runs
//! were measured.

use std::time::Duration;

use allot_bus::{Publisher, catalog, ensure_streams};
use allot_events::task::{RunSpec, TaskCompleted, TaskPredicted, TaskReady, TaskStarted};
use allot_events::telemetry::GpuHeld;
use allot_events::{AnyEvent, NodeEvent, TaskEvent, TelemetryEvent, decode};
use allot_predictor::Config;
use allot_sched::{LeaseId, TaskId, TaskSpec};
use allot_testkit::{NatsServer, node};

const POOL: &str = "default";

fn workload(i: u64) -> String {
    format!("train-{i:010}")
}

fn ready(i: u64) -> TaskEvent {
    TaskEvent::Ready(TaskReady {
        pool: POOL.into(),
        workload: workload(i),
        name: "train".into(),
        task: TaskSpec::new(i, "vision", 1),
        run: RunSpec {
            attempt: 1,
            duration_ms: Some(60_000),
            ..RunSpec::default()
        },
    })
}

fn started(i: u64) -> TaskEvent {
    TaskEvent::Started(TaskStarted {
        pool: POOL.into(),
        task: TaskId(i),
        node: "gpu-1".into(),
        lease: LeaseId(i),
        workload: workload(i),
        name: "train".into(),
        how: "simulated".into(),
        log: None,
    })
}

fn completed(i: u64) -> TaskEvent {
    TaskEvent::Completed(TaskCompleted {
        pool: POOL.into(),
        task: TaskId(i),
        node: "gpu-1".into(),
        lease: LeaseId(i),
    })
}

/// A sample of `gpu-1`'s one H100 at `util`% (and that share of its memory used), held whole
/// by run `i`.
fn sampled(i: u64, util: u8) -> TelemetryEvent {
    let mut s = node("gpu-1").gpus(1).model("H100").sampled(util);
    s.held = vec![GpuHeld {
        index: 0,
        lease: LeaseId(i),
        workload: workload(i),
        task: "train".into(),
        team: "vision".into(),
        milli: 1000,
        no_idle_reclaim: false,
    }];
    TelemetryEvent::GpusSampled(s)
}

/// Runs the predictor (with the example price table) until its three consumers have applied
/// everything in their streams, then stops it.
async fn predict(url: &str, dir: &std::path::Path, client: &async_nats::Client) {
    let mut config = Config::new(url, dir);
    config.prices = Some(
        allot_prices::PriceTable::parse(include_str!("../../../examples/prices.yaml")).unwrap(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let predictor = tokio::spawn(allot_predictor::run(config, async {
        let _ = stopped.await;
    }));
    let db = dir.join("predictor.db");
    for (stream, consumer) in [
        ("FLEET", "predictor-fleet"),
        ("TELEMETRY", "predictor-telemetry"),
        ("WORKLOADS", "predictor"),
    ] {
        allot_testkit::streams::wait_until_applied(client, stream, Duration::from_secs(30), || {
            allot_store::rusqlite::Connection::open(&db)
                .ok()
                .and_then(|c| allot_store::position(&c, consumer).ok().flatten())
        })
        .await;
    }
    let _ = stop.send(());
    predictor.await.unwrap().unwrap();
}

async fn predictions(client: &async_nats::Client) -> Vec<TaskPredicted> {
    allot_testkit::streams::read_all(client, "WORKLOADS")
        .await
        .into_iter()
        .filter_map(|m| match decode(&m.payload).unwrap().data {
            AnyEvent::Task(TaskEvent::Predicted(p)) => Some(p),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measured_runs_are_counted_once_and_right_size_the_next_prediction() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    ensure_streams(&async_nats::jetstream::new(client.clone()), &catalog(1))
        .await
        .unwrap();
    let planner = Publisher::new(client.clone(), "/allot/planner");
    let collector = Publisher::new(client.clone(), "/allot/collector/gpu-1");
    let dir = tempfile::tempdir().unwrap();

    // The pool: an H100 node and an L4 node.
    for n in [
        node("gpu-1").gpus(1).model("H100"),
        node("gpu-2").gpus(1).model("L4"),
    ] {
        collector
            .publish(NodeEvent::Registered(n.registered()))
            .await
            .unwrap();
    }
    // Three submissions of the same task, each asking for a whole H100 and using at most a
    // fifth of it (two samples each: 10% and 20%).
    for i in 1..=3 {
        planner.publish(ready(i)).await.unwrap();
        collector.publish(started(i)).await.unwrap();
        collector.publish(sampled(i, 10)).await.unwrap();
        collector.publish(sampled(i, 20)).await.unwrap();
        collector.publish(completed(i)).await.unwrap();
    }
    predict(&server.url(), dir.path(), &client).await;
    // A restart applies nothing twice.
    predict(&server.url(), dir.path(), &client).await;

    let db = allot_predictor::open_read_only(&dir.path().join("predictor.db")).unwrap();
    for i in 1..=3 {
        let u = allot_predictor::usage::attempt_usage(&db, i)
            .unwrap()
            .unwrap_or_else(|| panic!("attempt {i} has no usage"));
        assert_eq!(u.samples, 2, "attempt {i}: {u:?}");
        // 20% of the fixture's 81,559 MiB H100.
        assert_eq!(u.peak_memory_mib, 81_559 * 20 / 100, "attempt {i}");
        assert_eq!(u.mean_util_pct, Some(15.0), "attempt {i}");
        assert_eq!(u.model.as_deref(), Some("H100"));
        assert_eq!(u.memory_total_mib, 81_559);
    }
    // Too few measured runs before the third finished: no advice yet.
    assert!(
        predictions(&client)
            .await
            .iter()
            .all(|p| p.right_size.is_none())
    );

    // The fourth submission is predicted with a recommendation: 16,311 MiB + 10% fits an L4
    // (23,034 MiB) in 7/8 of it, cheaper than a quarter of an H100.
    planner.publish(ready(4)).await.unwrap();
    predict(&server.url(), dir.path(), &client).await;
    let all = predictions(&client).await;
    assert_eq!(all.len(), 4, "one prediction per task");
    let r = all[3]
        .right_size
        .as_ref()
        .expect("the fourth prediction right-sizes");
    assert_eq!((r.model.as_str(), r.gpus, r.gpu_milli), ("L4", 1, 875));
    assert_eq!(r.runs, 3);
    assert_eq!(r.gpu_memory_mib, 16_311 + 1_632);
    assert_eq!(r.micros_per_hour, 481_250);
    assert_eq!(r.requested_micros_per_hour, Some(2_900_000));

    let report = allot_predictor::report::tasks(
        &db,
        Some(
            &allot_prices::PriceTable::parse(include_str!("../../../examples/prices.yaml"))
                .unwrap(),
        ),
        0,
    )
    .unwrap();
    assert_eq!(report.len(), 1);
    assert_eq!(report[0].task_key, "vision/train/train");
    assert_eq!((report[0].runs, report[0].measured_runs), (3, 3));
    assert_eq!(report[0].saving_micros_per_hour, Some(2_900_000 - 481_250));
}
