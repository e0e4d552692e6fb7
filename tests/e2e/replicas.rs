//! On a 3-node JetStream cluster, services started with the single-server default never
//! lower the streams' replicas.

use std::time::Duration;

use allot_testkit::NatsCluster;

use crate::support::{allot, spawn_logged, wait_for};

#[test]
fn replicas_stay_three_after_every_service_starts() {
    let cluster = NatsCluster::start(3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let js = rt.block_on(async {
        let client = async_nats::connect(cluster.url_list()).await.unwrap();
        let js = async_nats::jetstream::new(client);
        // A peer may still be joining the cluster: retry placement for a while.
        let mut tries = 0;
        while let Err(e) = allot_bus::ensure_streams(&js, &allot_bus::catalog(3)).await {
            tries += 1;
            assert!(tries < 60, "streams with 3 replicas: {e}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        js
    });
    let replicas = || {
        rt.block_on(async {
            let mut out = Vec::new();
            for spec in allot_bus::catalog(3) {
                let mut stream = js.get_stream(spec.name).await.unwrap();
                out.push((spec.name, stream.info().await.unwrap().config.num_replicas));
            }
            out
        })
    };

    // Every service, as an operator would start it on the cluster, without saying replicas.
    let dir = tempfile::tempdir().unwrap();
    let mut procs = Vec::new();
    for (name, args) in [
        ("inventory", vec!["inventory", "--data-dir", "inventory"]),
        ("planner", vec!["planner", "--data-dir", "planner"]),
        ("allocator", vec!["allocator", "--instance", "a1"]),
        ("billing", vec!["billing", "--data-dir", "billing"]),
        ("archiver", vec!["archiver", "--db", "archive.db"]),
        (
            "collector",
            vec![
                "collector",
                "--node",
                "n1",
                "--gpu-source",
                "sim",
                "--data-dir",
                "n1",
            ],
        ),
    ] {
        let mut cmd = allot(dir.path());
        cmd.env("ALLOT_NATS_URL", cluster.urls())
            .arg("run")
            .args(&args);
        procs.push(spawn_logged(cmd, dir.path(), name));
    }
    // Each has started once the collector's node reached the allocator's journal (the
    // inventory, planner, billing and archiver check their streams before they consume).
    let started = wait_for(Duration::from_secs(60), || {
        let log = crate::support::log_of(dir.path(), "allocator");
        log.contains("journal replayed").then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    for p in &mut procs {
        let _ = p.kill();
        let _ = p.wait();
    }
    assert!(started.is_some(), "the allocator led");
    for (stream, n) in replicas() {
        assert_eq!(
            n, 3,
            "stream {stream} has {n} replicas after the services started"
        );
    }
}
