//! The inventory against a real nats-server: it answers status queries, applies each event
//! once, and announces unreachable nodes and GPU health changes exactly once.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy};
use futures::StreamExt;

use allot_bus::streams::names;
use allot_bus::{Publisher, catalog, ensure_streams};
use allot_events::inventory::{GpuHealth, InventoryEvent};
use allot_events::node::{GpuInfo, GpuSourceKind, HeartbeatSent, NodeRegistered};
use allot_events::telemetry::{GpuSample, GpusSampled};
use allot_events::{AnyEvent, decode};
use allot_inventory::{ClusterStatus, Config, query};
use allot_testkit::NatsServer;

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
        let js = jetstream::new(self.client.clone());
        let stream = js.get_stream(names::INVENTORY).await.unwrap();
        let count = stream.cached_info().state.messages as usize;
        if count == 0 {
            return Vec::new();
        }
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .unwrap();
        consumer
            .messages()
            .await
            .unwrap()
            .take(count)
            .map(|m| match decode(&m.unwrap().payload).unwrap().data {
                AnyEvent::Inventory(e) => e,
                other => panic!("unexpected {other:?}"),
            })
            .collect()
            .await
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

fn registered(node: &str, gpus: u32) -> NodeRegistered {
    NodeRegistered {
        node: node.into(),
        hostname: node.into(),
        pool: "default".into(),
        rack: Some("rack-1".into()),
        cpu_milli: 32_000,
        memory_mib: 256_000,
        gpu_source: GpuSourceKind::Simulated,
        driver_version: None,
        gpus: (0..gpus)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{node}-{i}"),
                model: "A100".into(),
                memory_total_mib: 81_920,
                power_limit_mw: Some(400_000),
                nvlink_peers: vec![],
            })
            .collect(),
    }
}

fn sample(node: &str, gpus: u32, ecc_uncorrected: u64) -> GpusSampled {
    GpusSampled {
        node: node.into(),
        samples: (0..gpus)
            .map(|i| GpuSample {
                index: i,
                uuid: format!("GPU-{node}-{i}"),
                utilization_pct: Some(70),
                memory_used_mib: 20_000,
                memory_total_mib: 81_920,
                temperature_c: Some(61),
                power_mw: Some(300_000),
                power_limit_mw: Some(400_000),
                ecc_corrected: Some(0),
                ecc_uncorrected: Some(if i == 0 { ecc_uncorrected } else { 0 }),
                xid_errors: Some(0),
                last_xid: None,
            })
            .collect(),
    }
}

#[tokio::test]
async fn registered_nodes_and_their_telemetry_show_up_in_status() {
    let h = Harness::start(|_| {}).await;
    h.publisher.publish(registered("node-1", 4)).await.unwrap();
    h.publisher.publish(registered("node-2", 2)).await.unwrap();
    h.publisher.publish(sample("node-1", 4, 0)).await.unwrap();
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
    let beat = h.publisher.envelope(HeartbeatSent {
        node: "node-1".into(),
        seq: 1,
        uptime_s: 5,
    });
    h.publisher.publish_envelope(&beat).await.unwrap();
    h.publisher.publish_envelope(&beat).await.unwrap();
    let marker = h.publisher.envelope(HeartbeatSent {
        node: "node-2".into(),
        seq: 1,
        uptime_s: 5,
    });
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
    h.publisher.publish(registered("node-1", 1)).await.unwrap();
    h.publisher
        .publish(HeartbeatSent {
            node: "node-1".into(),
            seq: 1,
            uptime_s: 1,
        })
        .await
        .unwrap();
    h.wait_status("node-1 unreachable", |s| {
        s.nodes.first().is_some_and(|n| n.state == "unreachable")
    })
    .await;
    // Give the reporter several more ticks: it must not announce it again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.publisher
        .publish(HeartbeatSent {
            node: "node-1".into(),
            seq: 2,
            uptime_s: 2,
        })
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
    h.publisher.publish(registered("node-1", 2)).await.unwrap();
    for _ in 0..3 {
        h.publisher.publish(sample("node-1", 2, 4)).await.unwrap();
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
