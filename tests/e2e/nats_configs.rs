//! The NATS configurations in `infra/nats/` are the ones the durability notes
//! (`infra/nats/DURABILITY.md`) promise: every one parses, with and without the accounts of
//! `allot nats-config`, and the committed 3-node cluster — started the way
//! `run-local-cluster.sh` starts it, on free ports — elects a meta leader, fsyncs every write,
//! refuses anonymous clients, and keeps WORKLOADS, DECISIONS and COSTS on all three nodes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use allot_testkit::NatsCluster;
use serde_json::Value;

use crate::support::{allot, wait_for};

/// The ports of the committed cluster: clients, routes, monitoring (n1, n2, n3 each).
const CLIENT_PORTS: [u16; 3] = [4222, 4223, 4224];
const ROUTE_PORTS: [u16; 3] = [6222, 6223, 6224];
const MONITOR_PORTS: [u16; 3] = [8222, 8223, 8224];

/// The durable streams, each with a subject it captures.
const DURABLE: [(&str, &str); 3] = [
    ("WORKLOADS", "allot.workload.submitted.vision"),
    ("DECISIONS", "allot.alloc.default.journal"),
    ("COSTS", "allot.cost.vision.w1"),
];

#[test]
fn every_committed_config_parses_alone_and_with_generated_accounts() {
    let configs = committed_configs();
    let names: Vec<String> = configs.iter().map(|c| file_name(c)).collect();
    for want in ["dev.conf", "nats-1.conf", "nats-2.conf", "nats-3.conf"] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    generate_accounts(dir.path(), "nats://127.0.0.1:4222");
    for config in &configs {
        let checked = check(config);
        assert!(
            checked.status.success(),
            "nats-server -t {}: {}",
            config.display(),
            String::from_utf8_lossy(&checked.stderr)
        );
        // As run-local-cluster.sh starts it with accounts: a copy, and a file including both
        // (nats-server resolves includes relative to the including file, never absolute).
        let name = file_name(config);
        std::fs::copy(config, dir.path().join(&name)).unwrap();
        let wrapper = dir.path().join(format!("with-accounts-{name}"));
        std::fs::write(
            &wrapper,
            format!("include \"{name}\"\ninclude \"auth/accounts.conf\"\n"),
        )
        .unwrap();
        let checked = check(&wrapper);
        assert!(
            checked.status.success(),
            "{name} with accounts.conf: {}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }
}

#[test]
fn committed_cluster_fsyncs_every_write_and_keeps_durable_streams_on_three_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path());

    let leaders: Vec<String> = cluster.monitor.iter().map(|&p| meta_leader(p)).collect();
    for (i, &port) in cluster.monitor.iter().enumerate() {
        let varz = get_json(port, "/varz");
        assert_eq!(varz["server_name"], format!("n{}", i + 1));
        assert_eq!(
            varz["jetstream"]["config"]["sync_always"],
            true,
            "n{} fsyncs before every acknowledgement: {}",
            i + 1,
            varz["jetstream"]["config"]
        );
        assert_eq!(varz["max_payload"], 1024 * 1024);
        assert_eq!(get_json(port, "/jsz")["meta_cluster"]["cluster_size"], 3);
    }
    assert!(
        leaders.iter().all(|l| l == &leaders[0]),
        "every node names one meta leader: {leaders:?}"
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let anonymous = rt.block_on(async_nats::connect(cluster.urls.clone()));
    assert!(
        anonymous.is_err(),
        "with accounts.conf included, an anonymous client is refused"
    );

    // The operator's step: the catalogue and the team streams, on three replicas.
    let credentials = dir.path().join("auth/platform.credentials.json");
    let mut ensured = None;
    for _ in 0..3 {
        let out = allot(dir.path())
            .args(["nats-config", "--teams"])
            .arg(teams_file())
            .args(["--ensure-streams", "--replicas", "3", "--credentials"])
            .arg(&credentials)
            .output()
            .unwrap();
        if out.status.success() {
            ensured = Some(out);
            break;
        }
        eprintln!(
            "nats-config --ensure-streams (retrying): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let ensured = String::from_utf8_lossy(&ensured.expect("streams ensured").stdout).into_owned();
    for stream in [
        "WORKLOADS",
        "DECISIONS",
        "COSTS",
        "COSTS_vision",
        "COSTS_nlp",
    ] {
        assert!(ensured.contains(&format!("{stream}: ")), "{ensured}");
    }

    let creds: allot_bus::Credentials =
        serde_json::from_str(&std::fs::read_to_string(&credentials).unwrap()).unwrap();
    rt.block_on(async {
        let client = creds
            .connect_options()
            .connect(allot_bus::server_list(&creds.url))
            .await
            .expect("the platform user logs in");
        let js = async_nats::jetstream::new(client);
        for (stream, subject) in DURABLE {
            let mut handle = js.get_stream(stream).await.unwrap();
            let config = &handle.info().await.unwrap().config;
            assert_eq!(config.num_replicas, 3, "{stream}");
            assert!(config.deny_delete, "{stream} denies deletes");
            let ack = js
                .publish(subject, "nats-configs test".into())
                .await
                .unwrap()
                .await
                .unwrap_or_else(|e| panic!("{stream} acknowledges a publish: {e}"));
            assert_eq!(ack.stream, stream);
        }
    });

    // Acknowledged means a majority has it; in a healthy cluster all three soon do. Each node's
    // /jsz reports its own copy, so this reads the message off every node's store.
    let stored = wait_for(Duration::from_secs(30), || {
        let all = cluster.monitor.iter().all(|&port| {
            let copies = local_streams(port);
            DURABLE
                .iter()
                .all(|&(stream, _)| copies.contains(&("PLATFORM", stream, 1)))
                && copies.contains(&("TEAM_vision", "COSTS_vision", 1))
        });
        all.then_some(())
    });
    assert!(
        stored.is_some(),
        "each durable stream's message (and the team's sourced copy) on every node: {:?}",
        cluster
            .monitor
            .iter()
            .map(|&p| local_streams(p))
            .collect::<Vec<_>>()
    );
}

#[test]
fn testkit_clusters_run_on_the_documented_fsync_setting() {
    let cluster = NatsCluster::start(3);
    for node in &cluster.nodes {
        let varz = get_json(node.monitor_port(), "/varz");
        assert_eq!(
            varz["jetstream"]["config"]["sync_always"],
            true,
            "{} fsyncs before every acknowledgement",
            node.server_name()
        );
        // The replacing jetstream block keeps the store where the handle says it is.
        assert!(
            node.store_dir().join("jetstream").is_dir(),
            "{}'s store in {}",
            node.server_name(),
            node.store_dir().display()
        );
    }
}

/// The committed `infra/nats/*.conf`, sorted.
fn committed_configs() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("infra/nats");
    let mut configs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "conf"))
        .collect();
    configs.sort();
    configs
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

fn teams_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/teams.yaml")
}

fn nats_server() -> PathBuf {
    allot_testkit::nats_server_binary().unwrap_or_else(|missing| panic!("{missing}"))
}

/// `nats-server -c config -t`.
fn check(config: &Path) -> Output {
    Command::new(nats_server())
        .arg("-c")
        .arg(config)
        .arg("-t")
        .output()
        .unwrap()
}

/// `allot nats-config --teams examples/teams.yaml --out <dir>/auth --url <url>`.
fn generate_accounts(dir: &Path, url: &str) {
    let out = allot(dir)
        .args(["nats-config", "--teams"])
        .arg(teams_file())
        .args(["--out", "auth", "--url", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "allot nats-config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The committed 3-node cluster with the generated accounts, laid out and started as
/// `run-local-cluster.sh` does (each node from `data/nX.conf`, which includes `../nats-X.conf`
/// and `../auth/accounts.conf`, in a folder of its own as working directory), but on free
/// ports. Dropping it kills every node.
struct LocalCluster {
    nodes: Vec<Child>,
    /// Monitoring ports, n1 first.
    monitor: Vec<u16>,
    /// Client URLs, n1 first.
    urls: Vec<String>,
}

impl LocalCluster {
    fn start(dir: &Path) -> LocalCluster {
        for attempt in 1..=5 {
            let ports = free_ports(9);
            let (client, rest) = ports.split_at(3);
            let (route, monitor) = rest.split_at(3);
            let urls: Vec<String> = client
                .iter()
                .map(|p| format!("nats://127.0.0.1:{p}"))
                .collect();
            generate_accounts(dir, &urls.join(","));
            let mut cluster = LocalCluster {
                nodes: Vec::new(),
                monitor: monitor.to_vec(),
                urls,
            };
            for i in 0..3 {
                let home = dir.join(format!("node-{}", i + 1));
                let _ = std::fs::remove_dir_all(&home);
                std::fs::create_dir_all(home.join("data")).unwrap();
                std::fs::create_dir_all(home.join("auth")).unwrap();
                std::fs::copy(
                    dir.join("auth/accounts.conf"),
                    home.join("auth/accounts.conf"),
                )
                .unwrap();
                let name = format!("nats-{}.conf", i + 1);
                let committed = std::fs::read_to_string(
                    Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("infra/nats")
                        .join(&name),
                )
                .unwrap();
                let moved = [
                    (&CLIENT_PORTS, client),
                    (&ROUTE_PORTS, route),
                    (&MONITOR_PORTS, monitor),
                ]
                .iter()
                .flat_map(|(from, to)| from.iter().copied().zip(to.iter().copied()))
                .fold(committed, |text, (from, to)| {
                    text.replace(&format!("127.0.0.1:{from}"), &format!("127.0.0.1:{to}"))
                });
                for old in CLIENT_PORTS
                    .iter()
                    .chain(&ROUTE_PORTS)
                    .chain(&MONITOR_PORTS)
                {
                    // A whole port: a free port such as 42221 is not 4222 left behind.
                    let needle = format!(":{old}");
                    let left = moved.match_indices(&needle).any(|(at, _)| {
                        !moved[at + needle.len()..].starts_with(|c: char| c.is_ascii_digit())
                    });
                    assert!(
                        !left,
                        "{name}: port {old} left after moving every committed port"
                    );
                }
                std::fs::write(home.join(&name), moved).unwrap();
                let wrapper = format!("data/n{}.conf", i + 1);
                std::fs::write(
                    home.join(&wrapper),
                    format!("include \"../{name}\"\ninclude \"../auth/accounts.conf\"\n"),
                )
                .unwrap();
                let log = std::fs::File::create(home.join("data/server.log")).unwrap();
                cluster.nodes.push(
                    Command::new(nats_server())
                        .arg("-c")
                        .arg(&wrapper)
                        .current_dir(&home)
                        .stdin(Stdio::null())
                        .stdout(log.try_clone().unwrap())
                        .stderr(log)
                        .spawn()
                        .unwrap(),
                );
            }
            let up = wait_for(Duration::from_secs(30), || {
                if cluster.exited() {
                    return Some(false);
                }
                let ready = cluster.monitor.iter().all(|&port| {
                    matches!(http_get(port, "/healthz"), Some((200, _)))
                        && !meta_leader(port).is_empty()
                });
                ready.then_some(true)
            });
            let logs = (1..=3)
                .map(|i| {
                    let log = dir.join(format!("node-{i}/data/server.log"));
                    format!(
                        "n{i}:\n{}",
                        std::fs::read_to_string(log).unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            match up {
                Some(true) => return cluster,
                Some(false) if attempt < 5 && logs.contains("address already in use") => {
                    continue; // another process took a port; dropping `cluster` kills the rest
                }
                _ => panic!(
                    "the committed cluster did not come up healthy with a meta leader:\n{logs}"
                ),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Whether any node has exited.
    fn exited(&mut self) -> bool {
        self.nodes
            .iter_mut()
            .any(|n| matches!(n.try_wait(), Ok(Some(_))))
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
    }
}

/// `count` distinct loopback ports that were free a moment ago (never the committed ones:
/// tests run in parallel, and a developer's cluster may hold those).
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// `GET path` on a monitoring port: status and body, or `None` if it does not answer.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

fn get_json(port: u16, path: &str) -> Value {
    let (status, body) = http_get(port, path).unwrap_or_else(|| panic!("GET :{port}{path}"));
    assert_eq!(status, 200, "GET :{port}{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// The JetStream meta leader a node names (empty if none yet).
fn meta_leader(port: u16) -> String {
    http_get(port, "/jsz")
        .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
        .and_then(|jsz| jsz["meta_cluster"]["leader"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// (account, stream, messages) of every stream copy a node holds, with its replicas checked:
/// only copies of streams configured for three replicas are listed.
fn local_streams(port: u16) -> Vec<(&'static str, &'static str, u64)> {
    let Some((200, body)) = http_get(port, "/jsz?accounts=true&streams=true&config=true") else {
        return Vec::new();
    };
    let jsz: Value = serde_json::from_str(&body).unwrap_or_default();
    let known = |name: &str| -> Option<&'static str> {
        [
            "PLATFORM",
            "TEAM_vision",
            "WORKLOADS",
            "DECISIONS",
            "COSTS",
            "COSTS_vision",
        ]
        .into_iter()
        .find(|k| *k == name)
    };
    let mut out = Vec::new();
    for account in jsz["account_details"].as_array().into_iter().flatten() {
        let Some(account_name) = account["name"].as_str().and_then(known) else {
            continue;
        };
        for stream in account["stream_detail"].as_array().into_iter().flatten() {
            let Some(name) = stream["name"].as_str().and_then(known) else {
                continue;
            };
            if stream["config"]["num_replicas"] == 3 {
                let messages = stream["state"]["messages"].as_u64().unwrap_or(0);
                out.push((account_name, name, messages));
            }
        }
    }
    out
}
