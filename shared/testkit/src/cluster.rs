//! [`NatsCluster`]: a JetStream cluster of real `nats-server` processes for failover tests.

use std::thread;
use std::time::{Duration, Instant};

use crate::binary::nats_server_binary;
use crate::net;
use crate::server::{ClusterConfig, Config, NatsServer, NotReady, PORT_ATTEMPTS};

/// The `cluster.name` every test cluster uses.
pub const CLUSTER_NAME: &str = "allot-test";

/// How long a cluster may take to start and elect a JetStream meta leader, and how long a
/// restarted node may take to catch up with it.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The JetStream settings of `infra/nats/nats-*.conf`, so failover tests run on the documented
/// durability (`sync_interval: always`: fsync before every acknowledgement; see
/// `infra/nats/DURABILITY.md`). nats-server keeps only the last `jetstream` block of a file, so
/// this one replaces the generated block whole: its relative `store_dir` is the same directory,
/// since each node runs in its temporary directory.
const DURABLE_JETSTREAM: &str = "jetstream {
  store_dir: \"jetstream\"
  sync_interval: always
  max_memory_store: 256MB
  max_file_store: 2GB
}";

/// A JetStream cluster of real `nats-server` processes on random loopback ports.
///
/// Node `i` is named `n{i+1}`, has its own store, and routes to every other node. The cluster is
/// handed out only once every node is healthy and a JetStream meta leader is elected, so an R3
/// stream can be created straight away. Dropping it kills every node.
#[derive(Debug)]
pub struct NatsCluster {
    /// The nodes, `n1` first. Each is a full [`NatsServer`] handle (URL, log, pid, ...).
    pub nodes: Vec<NatsServer>,
}

impl NatsCluster {
    /// Starts a cluster of `size` nodes and waits (up to 30 s) until every node is healthy and
    /// a JetStream meta leader is elected.
    ///
    /// # Panics
    ///
    /// If `size` is 0, if no `nats-server` binary is found, or if the cluster does not come up
    /// in time (with each node's log).
    pub fn start(size: usize) -> NatsCluster {
        assert!(size > 0, "a cluster needs at least one node");
        let binary = nats_server_binary().unwrap_or_else(|missing| panic!("{missing}"));
        for attempt in 1..=PORT_ATTEMPTS {
            let ports = net::free_ports(size * 3);
            let (client_ports, rest) = ports.split_at(size);
            let (route_ports, monitor_ports) = rest.split_at(size);
            let mut nodes: Vec<NatsServer> = (0..size)
                .map(|i| {
                    NatsServer::prepare(
                        binary.clone(),
                        Config {
                            server_name: format!("n{}", i + 1),
                            port: client_ports[i],
                            monitor_port: monitor_ports[i],
                            store_dir: Default::default(),
                            cluster: Some(ClusterConfig {
                                name: CLUSTER_NAME.to_owned(),
                                port: route_ports[i],
                                routes: route_ports.to_vec(),
                            }),
                            extra: DURABLE_JETSTREAM.to_owned(),
                        },
                    )
                })
                .collect();
            for node in &mut nodes {
                node.spawn();
            }

            let deadline = Instant::now() + CLUSTER_TIMEOUT;
            let mut port_taken = false;
            for node in &mut nodes {
                match node.wait_ready(deadline) {
                    Ok(()) => {}
                    Err(NotReady::PortInUse) if attempt < PORT_ATTEMPTS => {
                        port_taken = true;
                        break;
                    }
                    Err(not_ready) => panic!("{}", node.failure(&not_ready)),
                }
            }
            if port_taken {
                tracing::debug!(attempt, "a nats cluster port was taken, retrying");
                continue; // dropping `nodes` kills them
            }

            let cluster = NatsCluster { nodes };
            for i in 0..size {
                cluster.wait_until_current(i, deadline);
            }
            return cluster;
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Comma-separated client URLs of every node, the form `nats --server` and a service's
    /// NATS URL setting take.
    ///
    /// `async_nats::connect` parses a string as one address and does not split at commas; give
    /// it [`NatsCluster::url_list`] instead.
    pub fn urls(&self) -> String {
        self.url_list().join(",")
    }

    /// The client URL of every node, `n1` first; `async_nats::connect(cluster.url_list())`
    /// connects to whichever node is up and fails over between them.
    pub fn url_list(&self) -> Vec<String> {
        self.nodes.iter().map(NatsServer::url).collect()
    }

    /// Kills node `i` with SIGKILL.
    pub fn kill_node(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Restarts node `i` on its old ports and store, and waits (up to 30 s) until it is healthy
    /// and follows the JetStream meta leader again.
    pub fn restart_node(&mut self, i: usize) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        self.nodes[i].restart();
        self.wait_until_current(i, deadline);
    }

    /// The name of the JetStream meta leader as node `i` sees it, if it knows one.
    pub fn meta_leader(&self, i: usize) -> Option<String> {
        let (status, body) = net::http_get(self.nodes[i].monitor_port(), "/jsz").ok()?;
        if status != 200 {
            return None;
        }
        let jsz: serde_json::Value = serde_json::from_str(&body).ok()?;
        jsz.pointer("/meta_cluster/leader")
            .and_then(serde_json::Value::as_str)
            .filter(|leader| !leader.is_empty())
            .map(str::to_owned)
    }

    /// Waits until node `i` reports healthy (`/healthz`, which in a cluster also means it is
    /// current with the meta leader) and names a meta leader; panics with its log at `deadline`.
    fn wait_until_current(&self, i: usize, deadline: Instant) {
        let node = &self.nodes[i];
        loop {
            let health = net::http_get(node.monitor_port(), "/healthz");
            let healthy = matches!(&health, Ok((200, _)));
            if healthy && self.meta_leader(i).is_some() {
                return;
            }
            if Instant::now() >= deadline {
                let last = match health {
                    Ok((status, body)) => format!("/healthz said {status} {body}"),
                    Err(err) => format!("/healthz failed: {err}"),
                };
                panic!(
                    "{}",
                    node.failure(&format!(
                        "no JetStream meta leader within {CLUSTER_TIMEOUT:?} ({last})"
                    ))
                );
            }
            thread::sleep(POLL_INTERVAL);
        }
    }
}
