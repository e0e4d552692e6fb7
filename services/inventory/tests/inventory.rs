//! The inventory against a real nats-server: it answers status queries, applies each event
//! once, and announces unreachable nodes and GPU health changes exactly once.

use std::time::Duration;

use allot_bus::streams::names;
use allot_bus::{Publisher, catalog, ensure_streams};
use allot_events::inventory::{GpuHealth, InventoryEvent};
use allot_events::telemetry::GpusSampled;
use allot_events::{AnyEvent, decode};
use allot_inventory::{ClusterStatus, Config, query};
use allot_testkit::fixtures::NodeFixture;
use allot_testkit::streams::read_all;
use allot_testkit::{NatsServer, node};

struct Harness {
    _server: NatsServer,
    _dir: tempfile::TempDir,
    client: async_nats::Client,
    publisher: Publisher,
    db: std::path::PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), allot_inventory::Error>>>,
}

impl Harness {
    async fn start(tune: impl FnOnce(&mut Config)) -> Self {
        let server = NatsServer::start();
        let dir = tempfile::tempdir().unwrap();
        let client = async_nats::connect(server.url()).await.unwrap();
        let publisher = Publisher::new(client.clone(), "/test/collector");
        ensure_streams(publisher.jetstream(), &catalog(1))
            .await
            .unwrap();
        let mut config = Config::new(server.url(), dir.path());
        config.check_interval = Duration::from_millis(50);
        tune(&mut config);
        let db = config.db_path();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(allot_inventory::run(config, async {
            let _ = stopped.await;
        }));
        Self {
            _server: server,
            _dir: dir,
            client,
            publisher,
            db,
            stop: Some(stop),
            task: Some(task),
        }
    }

    async fn status(&self) -> ClusterStatus {
        let reply = self
            .client
            .request(query::STATUS_SUBJECT, bytes::Bytes::new())
            .await
            .unwrap();
        serde_json::from_slice(&reply.payload).unwrap()
    }

    /// Polls the status until `ok` holds.
    async fn wait_status(&self, what: &str, ok: impl Fn(&ClusterStatus) -> bool) -> ClusterStatus {
        for _ in 0..200 {
            if let Ok(Ok(reply)) = tokio::time::timeout(
                Duration::from_millis(500),
                self.client
                    .request(query::STATUS_SUBJECT, bytes::Bytes::new()),
            )
            .await
            {
                let status: ClusterStatus = serde_json::from_slice(&reply.payload).unwrap();
                if ok(&status) {
                    return status;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "timed out waiting until {what}; last status: {:?}",
            self.status().await
        );
    }

    async fn inventory_events(&self) -> Vec<InventoryEvent> {
        read_all(&self.client, names::INVENTORY)
            .await
            .into_iter()
            .map(|m| match decode(&m.payload).unwrap().data {
                AnyEvent::Inventory(e) => e,
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    async fn stop(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        let result = tokio::time::timeout(Duration::from_secs(10), self.task.take().unwrap())
            .await
            .expect("the inventory stops within 10 s")
            .unwrap();
        result.unwrap();
    }
}

/// A sample of every GPU of `node` at 70 %, with `ecc_uncorrected` errors on GPU 0.
fn sample_with_ecc(node: &NodeFixture, ecc_uncorrected: u64) -> GpusSampled {
    let mut sample = node.sampled(70);
    sample.samples[0].ecc_uncorrected = Some(ecc_uncorrected);
    sample
}

#[tokio::test]
async fn registered_nodes_and_their_telemetry_show_up_in_status() {
    let h = Harness::start(|_| {}).await;
    h.publisher
        .publish(node("node-1").gpus(4).model("A100").registered())
        .await
        .unwrap();
    h.publisher
        .publish(node("node-2").gpus(2).model("A100").registered())
        .await
        .unwrap();
    h.publisher
        .publish(node("node-1").gpus(4).sampled(70))
        .await
        .unwrap();
    let status = h
        .wait_status("two nodes with telemetry", |s| {
            s.nodes.len() == 2
                && s.nodes[0]
                    .gpus
                    .iter()
                    .all(|g| g.utilization_pct == Some(70))
        })
        .await;
    assert_eq!(status.gpu_count(), 6);
    assert_eq!(status.nodes[0].name, "node-1");
    assert_eq!(status.nodes[0].state, "ready");
    assert_eq!(status.nodes[0].gpus[0].model.as_deref(), Some("A100"));
    h.stop().await;
}

#[tokio::test]
async fn an_event_published_twice_is_applied_once() {
    let h = Harness::start(|_| {}).await;
    let beat = h.publisher.envelope(node("node-1").heartbeat(1));
    h.publisher.publish_envelope(&beat).await.unwrap();
    h.publisher.publish_envelope(&beat).await.unwrap();
    let marker = h.publisher.envelope(node("node-2").heartbeat(1));
    h.publisher.publish_envelope(&marker).await.unwrap();
    h.wait_status("both nodes seen", |s| s.nodes.len() == 2)
        .await;
    let conn = allot_store::open(&h.db, allot_inventory::projection::MIGRATIONS).unwrap();
    let heartbeats: i64 = conn
        .query_row(
            "SELECT heartbeats FROM nodes WHERE name = 'node-1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(heartbeats, 1);
    h.stop().await;
}

#[tokio::test]
async fn a_silent_node_is_announced_unreachable_once_and_recovered_when_it_returns() {
    let h = Harness::start(|c| {
        c.liveness.heartbeat_interval = Duration::from_millis(100);
        c.liveness.missed_heartbeats = 3;
    })
    .await;
    h.publisher
        .publish(node("node-1").gpus(1).registered())
        .await
        .unwrap();
    h.publisher
        .publish(node("node-1").heartbeat(1))
        .await
        .unwrap();
    h.wait_status("node-1 unreachable", |s| {
        s.nodes.first().is_some_and(|n| n.state == "unreachable")
    })
    .await;
    // Give the reporter several more ticks: it must not announce it again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.publisher
        .publish(node("node-1").heartbeat(2))
        .await
        .unwrap();
    h.wait_status("node-1 back", |s| {
        s.nodes.first().is_some_and(|n| n.state == "ready")
    })
    .await;

    let events = h.inventory_events().await;
    let kinds: Vec<&str> = events.iter().map(|e| e.name()).collect();
    assert_eq!(kinds, vec!["node_unreachable", "node_recovered"]);
    match &events[0] {
        InventoryEvent::NodeUnreachable(e) => {
            assert_eq!(e.node, "node-1");
            assert!(e.missed_heartbeats >= 3, "{e:?}");
        }
        other => panic!("{other:?}"),
    }
    h.stop().await;
}

#[tokio::test]
async fn a_gpu_with_uncorrected_ecc_errors_is_announced_unhealthy_once() {
    let h = Harness::start(|_| {}).await;
    h.publisher
        .publish(node("node-1").gpus(2).registered())
        .await
        .unwrap();
    for _ in 0..3 {
        h.publisher
            .publish(sample_with_ecc(&node("node-1").gpus(2), 4))
            .await
            .unwrap();
    }
    h.wait_status("GPU 0 unhealthy", |s| {
        s.nodes
            .first()
            .is_some_and(|n| n.gpus[0].health == "unhealthy")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let events = h.inventory_events().await;
    assert_eq!(events.len(), 1, "{events:?}");
    match &events[0] {
        InventoryEvent::GpuHealthChanged(e) => {
            assert_eq!(
                (e.index, e.from, e.to),
                (0, GpuHealth::Healthy, GpuHealth::Unhealthy)
            );
            assert_eq!(e.reason, "4 uncorrected ECC errors");
        }
        other => panic!("{other:?}"),
    }
    h.stop().await;
}
