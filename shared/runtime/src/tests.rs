use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

/// A task that runs until the service stops, then records that it saw the stop.
fn until_stopped(
    service: &Service<String>,
    saw: &Arc<AtomicBool>,
) -> BoxFuture<'static, Result<(), String>> {
    let stopping = service.stopping();
    let saw = Arc::clone(saw);
    async move {
        stopping.await;
        saw.store(true, Ordering::SeqCst);
        Ok(())
    }
    .boxed()
}

#[tokio::test(start_paused = true)]
async fn the_first_task_to_fail_stops_the_others_and_is_named() {
    let mut service = Service::new("planner", std::future::pending());
    let saw = Arc::new(AtomicBool::new(false));
    service.spawn("relay", until_stopped(&service, &saw));
    service.spawn("consumer WORKLOADS", async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        Err("database is locked".to_owned())
    });
    let stopped = service.run().await.expect_err("a task failed");
    assert_eq!(stopped.task(), "consumer WORKLOADS");
    assert_eq!(
        stopped.to_string(),
        "consumer WORKLOADS: database is locked"
    );
    assert!(saw.load(Ordering::SeqCst), "the relay was told to stop");
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_every_task_and_ends_well() {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let mut service = Service::new("billing", async {
        let _ = rx.await;
    });
    let saw = [
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    ];
    service.spawn("journal", until_stopped(&service, &saw[0]));
    service.spawn("telemetry", until_stopped(&service, &saw[1]));
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        let _ = tx.send(());
    });
    service.run().await.expect("asked to stop");
    assert!(saw.iter().all(|s| s.load(Ordering::SeqCst)));
}

#[tokio::test(start_paused = true)]
async fn a_task_that_ignores_the_stop_is_aborted_after_the_grace_period() {
    let mut service =
        Service::new("inventory", std::future::ready(())).with_grace(Duration::from_secs(2));
    let aborted = Arc::new(AtomicBool::new(true));
    let flag = Arc::clone(&aborted);
    service.spawn("stubborn", async move {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        flag.store(false, Ordering::SeqCst);
        Ok::<(), String>(())
    });
    let started = Instant::now();
    service.run().await.expect("asked to stop");
    assert!(aborted.load(Ordering::SeqCst), "never ran to its end");
    assert_eq!(
        started.elapsed().as_secs(),
        2,
        "stopped after the grace period"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panic_stops_the_service_and_says_which_task() {
    let mut service = Service::new("archiver", std::future::pending());
    let saw = Arc::new(AtomicBool::new(false));
    service.spawn("chain", until_stopped(&service, &saw));
    service.spawn("consumer DECISIONS", async {
        tokio::task::yield_now().await;
        panic!("index out of bounds");
    });
    let stopped = service.run().await.expect_err("a task panicked");
    assert!(
        matches!(&stopped, Stopped::Panicked { task, message }
            if task == "consumer DECISIONS" && message == "index out of bounds"),
        "{stopped:?}"
    );
    assert!(saw.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn tasks_that_all_end_well_end_the_service_well() {
    let mut service = Service::new("catch-up", std::future::pending());
    service.spawn("a", async { Ok::<(), String>(()) });
    service.spawn("b", async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(())
    });
    service.run().await.expect("nothing failed");
}
