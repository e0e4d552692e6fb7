//! The ops endpoints of a real service: the inventory against a real nats-server, with
//! `allot_runtime::ops` serving on 127.0.0.1:0 as `allot run` serves it. Liveness from the
//! start, readiness once its consumers exist, and `/metrics` in the Prometheus text format
//! counting what its consumers apply and dead-letter.
//!
//! A test binary of its own: readiness and the metrics registry are the process's.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use allot_bus::{Publisher, catalog, ensure_streams};
use allot_inventory::Config;
use allot_testkit::{NatsServer, node};

/// `GET path` on `addr`: the status code, the content type and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: ops\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type: "))
        .unwrap_or_default()
        .to_owned();
    (status, content_type, body.to_owned())
}

/// Parses `text` as the Prometheus text format (0.0.4): every line a `# HELP`, a `# TYPE`
/// before its family's samples, or a sample `name{label="value",…} number` of a declared
/// family. Returns each sample's value by its series (`name{labels}` as written).
fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let mut types: BTreeMap<&str, &str> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let valid_name = |n: &str| {
        !n.is_empty()
            && !n.starts_with(|c: char| c.is_ascii_digit())
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, _) = rest.split_once(' ').expect("HELP name text");
            assert!(valid_name(name), "bad name in {line:?}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name type");
            assert!(valid_name(name), "bad name in {line:?}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "bad type in {line:?}"
            );
            assert!(types.insert(name, kind).is_none(), "{name} typed twice");
            continue;
        }
        assert!(!line.starts_with('#'), "unknown comment {line:?}");
        let (series, value) = line.rsplit_once(' ').expect("a sample: series value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|e| panic!("{line:?}: {e}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.strip_suffix('}').expect("labels close")),
            None => (series, ""),
        };
        assert!(valid_name(name), "bad name in {line:?}");
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            let (key, quoted) = pair.split_once('=').expect("label=\"value\"");
            assert!(valid_name(key), "bad label name in {line:?}");
            assert!(
                quoted.len() >= 2 && quoted.starts_with('"') && quoted.ends_with('"'),
                "unquoted label value in {line:?}"
            );
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(f) == Some(&"histogram"))
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "{name} sampled before its TYPE");
        samples.insert(series.to_owned(), value);
    }
    samples
}

/// Scrapes `/metrics` until `series` reads `want` (or 30 s pass).
async fn until_metric(addr: std::net::SocketAddr, series: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, _, body) = get(addr, "/metrics").await;
        let got = parse_prometheus(&body).get(series).copied();
        if got == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series}: want {want}, got {got:?}\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_and_metrics_of_a_running_inventory() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let client = async_nats::connect(server.url()).await.unwrap();
    let publisher = Publisher::new(client.clone(), "/test/collector");
    ensure_streams(publisher.jetstream(), &catalog(1))
        .await
        .unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ops = listener.local_addr().unwrap();
    tokio::spawn(allot_runtime::ops::serve(listener, std::future::pending()));

    // Alive at once; not ready while no service runs.
    assert_eq!(get(ops, "/healthz").await.0, 200);
    let (status, _, body) = get(ops, "/readyz").await;
    assert_eq!((status, body.as_str()), (503, "no service is running\n"));

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let inventory = tokio::spawn(allot_inventory::run(
        Config::new(server.url(), dir.path()),
        async {
            let _ = stopped.await;
        },
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, body) = get(ops, "/readyz").await;
        if status == 200 {
            assert_eq!(body, "inventory ready\n");
            break;
        }
        assert_eq!(status, 503, "{body}");
        // Before its task first runs, the inventory is not even listed.
        assert!(
            body.starts_with("inventory starting") || body == "no service is running\n",
            "{body}"
        );
        assert!(Instant::now() < deadline, "never ready: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (status, content_type, body) = get(ops, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let metrics = parse_prometheus(&body);
    let handled = r#"allot_consumer_messages_total{consumer="inventory-fleet"}"#;
    let dead = r#"allot_dead_letters_total{consumer="inventory-fleet"}"#;
    let lag = r#"allot_consumer_pending_messages{consumer="inventory-fleet"}"#;
    assert_eq!(metrics.get(handled), Some(&0.0), "{body}");
    assert_eq!(metrics.get(dead), Some(&0.0), "{body}");
    assert_eq!(metrics.get(lag), Some(&0.0), "{body}");

    // Two registrations are applied and counted.
    for n in ["node-1", "node-2"] {
        publisher
            .publish(node(n).gpus(4).registered())
            .await
            .unwrap();
    }
    until_metric(ops, handled, 2.0).await;

    // A message that is no event is dead-lettered, and counted as such, not as handled.
    publisher
        .jetstream()
        .publish("allot.node.registered.node-3", "not an event".into())
        .await
        .unwrap()
        .await
        .unwrap();
    until_metric(ops, dead, 1.0).await;
    let (_, _, body) = get(ops, "/metrics").await;
    let metrics = parse_prometheus(&body);
    assert_eq!(metrics.get(handled), Some(&2.0), "{body}");
    assert_eq!(metrics.get(lag), Some(&0.0), "caught up: {body}");

    // Stopped, it is no longer ready (and no longer listed).
    stop.send(()).unwrap();
    inventory.await.unwrap().unwrap();
    let (status, _, body) = get(ops, "/readyz").await;
    assert_eq!((status, body.as_str()), (503, "no service is running\n"));
    assert_eq!(get(ops, "/healthz").await.0, 200);
}
