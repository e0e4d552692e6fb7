//! The allocator's metrics against a real nats-server: while it leads, `/metrics` (the
//! process's registry) shows its pool as the scheduler sees it — tasks waiting per team, GPUs
//! and GPUs allocated, wastage, its journal commits — and once it stops leading, nothing of the
//! pool.
//!
//! A test binary of its own: the registry is the process's, shared by every test in it.

use std::time::{Duration, Instant};

use allot_allocator::Config;
use allot_bus::{Publisher, catalog, ensure_streams};
use allot_events::task::TaskReady;
use allot_events::{NodeEvent, TaskEvent};
use allot_sched::TaskSpec;
use allot_testkit::{NatsServer, node};

const POOL: &str = "metered";

fn ready(id: u64, team: &str, gpus: u32) -> TaskEvent {
    TaskEvent::Ready(TaskReady {
        pool: POOL.into(),
        workload: "w".into(),
        name: format!("t{id}"),
        task: TaskSpec::new(id, team, gpus),
        run: Default::default(),
    })
}

/// The value of the series `series` (name and labels, as encoded) on the process's
/// `/metrics`, if it is there.
fn sample(series: &str) -> Option<f64> {
    allot_runtime::metrics::encode()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Waits up to 30 s for every `(series, value)` of `want` to read as given.
async fn until(want: &[(&str, Option<f64>)]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got: Vec<(&str, Option<f64>)> = want.iter().map(|(s, _)| (*s, sample(s))).collect();
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "want {want:?}\ngot  {got:?}\n{}",
            allot_runtime::metrics::encode()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_tasks_per_team_and_wasted_gpus_show_what_waits_while_it_leads() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    ensure_streams(&async_nats::jetstream::new(client.clone()), &catalog(1))
        .await
        .unwrap();
    let publisher = Publisher::new(client.clone(), "/test");
    publisher
        .publish(NodeEvent::Registered(
            node("n1").gpus(8).pool(POOL).registered(),
        ))
        .await
        .unwrap();
    // FIFO blocks at its head: task 2 (all 8 GPUs) waits for task 1, and everything behind
    // it waits too — task 3 although one GPU would hold it.
    publisher.publish(ready(1, "vision", 4)).await.unwrap();
    publisher.publish(ready(2, "vision", 8)).await.unwrap();
    publisher.publish(ready(3, "nlp", 1)).await.unwrap();
    publisher.publish(ready(4, "nlp", 2)).await.unwrap();

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = Config {
        policy: "fifo".into(),
        instance: "metered-a".into(),
        lease_ttl: Duration::from_secs(2),
        pass_interval: Duration::from_millis(100),
        ..Config::new(server.url(), POOL)
    };
    let allocator = tokio::spawn(allot_allocator::run(config, async {
        let _ = stopped.await;
    }));

    let vision = r#"allot_pending_tasks{pool="metered",team="vision"}"#;
    let nlp = r#"allot_pending_tasks{pool="metered",team="nlp"}"#;
    let gpus = r#"allot_gpus{pool="metered"}"#;
    let allocated = r#"allot_gpus_allocated{pool="metered"}"#;
    let wasted = r#"allot_gpus_wasted{pool="metered"}"#;
    let wastage = r#"allot_wastage_ratio{pool="metered"}"#;
    let leading = r#"allot_allocator_leading{pool="metered"}"#;
    until(&[
        (vision, Some(1.0)),
        (nlp, Some(2.0)),
        (gpus, Some(8.0)),
        (allocated, Some(4.0)),
        (wasted, Some(4.0)),
        (wastage, Some(1.0)),
        (leading, Some(1.0)),
    ])
    .await;
    assert!(
        sample(r#"allot_scheduling_pass_duration_seconds_count{pool="metered"}"#)
            .is_some_and(|n| n >= 1.0),
        "{}",
        allot_runtime::metrics::encode()
    );
    // Every message in the journal was appended by a commit the histogram counted: the
    // election, the node, the four tasks and the pass that granted task 1.
    let journalled = allot_allocator::journal::read(&async_nats::jetstream::new(client), POOL)
        .await
        .unwrap()
        .len();
    assert!(journalled >= 7, "{journalled} journal messages");
    assert_eq!(
        sample(r#"allot_journal_commit_entries_sum{pool="metered"}"#),
        Some(journalled as f64),
        "{}",
        allot_runtime::metrics::encode()
    );
    assert!(
        sample(r#"allot_journal_commit_duration_seconds_count{pool="metered"}"#)
            .is_some_and(|n| n >= 1.0)
    );

    // A term's series go with it: a stopped (or deposed) leader reports no pool.
    stop.send(()).unwrap();
    allocator.await.unwrap().unwrap();
    until(&[
        (vision, None),
        (nlp, None),
        (gpus, None),
        (allocated, None),
        (wastage, None),
        (leading, None),
    ])
    .await;
}
