//! The gateway as a service, on a real listener and a real nats-server: what the collectors
//! publish reaches `GET /api/v1/nodes`, and the event stream, cut mid-way and resumed with
//! `Last-Event-ID`, delivers every change exactly once; and retention takes out what finished
//! before its cut-off when the gateway runs.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use allot_bus::{Publisher, catalog, ensure_streams};
use allot_events::NodeEvent;
use allot_testkit::{NatsServer, node};

/// One HTTP/1.1 exchange; the response's status, and its body de-chunked, read until `done`
/// says enough or the server closes.
async fn http(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, String)],
    mut done: impl FnMut(&str) -> bool,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some((status, body)) = response(&raw)
            && done(&body)
        {
            return (status, body);
        }
        assert!(
            Instant::now() < deadline,
            "no answer in time: {}",
            String::from_utf8_lossy(&raw)
        );
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf)).await {
            Ok(Ok(0)) => return response(&raw).expect("a whole response head"),
            Ok(Ok(n)) => raw.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => panic!("reading: {e}"),
            Err(_) => {}
        }
    }
}

/// The status and the body received so far (de-chunked), once the head is complete.
fn response(raw: &[u8]) -> Option<(u16, String)> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Some((status, body))
}

/// The chunks received so far, joined (a chunk still arriving is left out).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn ids(sse: &str) -> Vec<u64> {
    sse.lines()
        .filter_map(|l| l.strip_prefix("id: ").or_else(|| l.strip_prefix("id:")))
        .map(|v| v.trim().parse().unwrap())
        .collect()
}

#[tokio::test]
async fn nodes_reach_the_api_and_the_event_stream_resumes_without_loss_or_repeat() {
    let (nats, client) = nats_with_streams().await;
    let dir = tempfile::tempdir().unwrap();
    let (addr, token, stop, service) = gateway(&nats.url(), dir.path()).await;
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(dir.path().join("admin.token"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let auth = [("Authorization", format!("Bearer {token}"))];

    let publisher = Publisher::new(client.clone(), "/test");
    for i in 1..=6 {
        let n = node(&format!("n{i}")).gpus(4);
        publisher
            .publish(NodeEvent::Registered(n.registered()))
            .await
            .unwrap();
    }
    // The nodes appear in the API once projected (views are rebuilt every second).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = http(addr, "/api/v1/nodes?limit=4", &auth, |_| false).await;
        assert_eq!(status, 200, "{body}");
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        if page["total"] == 6 {
            // Pages of four: nodes 1-4, then 5-6 and no further page.
            let nodes = page["items"].as_array().unwrap();
            assert_eq!(nodes.len(), 4, "{page}");
            assert_eq!(nodes[0]["gpus"].as_array().unwrap().len(), 4, "{page}");
            let next = page["next_cursor"].as_str().unwrap();
            let (_, body) = http(
                addr,
                &format!("/api/v1/nodes?limit=4&cursor={next}"),
                &auth,
                |_| false,
            )
            .await;
            let rest: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(rest["items"].as_array().unwrap().len(), 2, "{rest}");
            assert!(rest["next_cursor"].is_null(), "{rest}");
            let mut names: Vec<&str> = nodes
                .iter()
                .chain(rest["items"].as_array().unwrap())
                .map(|n| n["name"].as_str().unwrap())
                .collect();
            names.dedup();
            assert_eq!(names.len(), 6, "{names:?}");
            break;
        }
        assert!(Instant::now() < deadline, "nodes never appeared: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, _) = http(addr, "/api/v1/nodes", &[], |_| false).await;
    assert_eq!(status, 401);

    // Read three changes, drop the connection, resume after the third.
    let (status, first) = http(addr, "/api/v1/events?after=0", &auth, |b| ids(b).len() >= 3).await;
    assert_eq!(status, 200);
    let first: Vec<u64> = ids(&first).into_iter().take(3).collect();
    for i in 7..=9 {
        let n = node(&format!("n{i}")).gpus(2);
        publisher
            .publish(NodeEvent::Registered(n.registered()))
            .await
            .unwrap();
    }
    let resume = [auth[0].clone(), ("Last-Event-ID", first[2].to_string())];
    let (_, rest) = http(addr, "/api/v1/events", &resume, |b| ids(b).len() >= 6).await;
    let rest = ids(&rest);
    let mut all = first.clone();
    all.extend(&rest[..6]);
    assert_eq!(
        all,
        (1..=9).collect::<Vec<u64>>(),
        "first {first:?}, then {rest:?}"
    );
    // And the changes are about the nodes, in the order they registered.
    let (_, whole) = http(addr, "/api/v1/events?after=0", &auth, |b| ids(b).len() >= 9).await;
    for i in 1..=9 {
        assert!(whole.contains(&format!("\"node\":\"n{i}\"")), "{whole}");
    }
    // The probes.
    assert_eq!(http(addr, "/healthz", &[], |_| false).await.0, 200);
    assert_eq!(http(addr, "/readyz", &[], |_| false).await.0, 200);
    let (status, page) = http(addr, "/", &[], |_| false).await;
    assert_eq!(status, 200);
    assert!(page.contains("/assets/app.js"), "{page}");

    let _ = stop.send(());
    service.await.unwrap().unwrap();
}

/// A nats-server with Allot's streams, and a client of it.
async fn nats_with_streams() -> (NatsServer, async_nats::Client) {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    ensure_streams(&async_nats::jetstream::new(client.clone()), &catalog(1))
        .await
        .unwrap();
    (nats, client)
}

/// Starts a gateway over `dir` on `nats`: its address, its admin token, and how to stop it.
async fn gateway(
    nats: &str,
    dir: &std::path::Path,
) -> (
    SocketAddr,
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), allot_gateway::Error>>,
) {
    let mut config = allot_gateway::Config::new(nats, dir, ([127, 0, 0, 1], 0).into());
    let token_file = dir.join("admin.token");
    config.admin_token_file = Some(token_file.clone());
    let (tx, mut bound) = tokio::sync::mpsc::unbounded_channel();
    config.bound = Some(tx);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn(allot_gateway::run(config, async {
        let _ = stopped.await;
    }));
    let addr = bound.recv().await.expect("the gateway listens");
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();
    (addr, token, stop, service)
}

/// Each GPU's utilization in `GET /api/v1/nodes`, per node, once every node in `want` shows a
/// reading (or 20 s pass).
async fn utilization(
    addr: SocketAddr,
    token: &str,
    want: &[&str],
) -> std::collections::BTreeMap<String, Vec<Option<u64>>> {
    let auth = [("Authorization", format!("Bearer {token}"))];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = http(addr, "/api/v1/nodes", &auth, |_| false).await;
        assert_eq!(status, 200, "{body}");
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        let got: std::collections::BTreeMap<String, Vec<Option<u64>>> = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                let gpus = n["gpus"].as_array().unwrap();
                let pct = gpus.iter().map(|g| g["utilization_pct"].as_u64()).collect();
                (n["name"].as_str().unwrap().to_owned(), pct)
            })
            .collect();
        let shown = want
            .iter()
            .all(|n| got.get(*n).is_some_and(|g| g.iter().all(Option::is_some)));
        if shown || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The gateway keeps each node's latest GPU readings in memory, not in its database: a new
/// sample replaces the last, a sample on another node's subject is not believed, and a
/// restarted gateway shows the latest readings again (it reads each node's last sample).
#[tokio::test]
async fn the_latest_gpu_readings_reach_the_api_and_survive_a_restart() {
    let (nats, client) = nats_with_streams().await;
    let js = async_nats::jetstream::new(client.clone());
    let dir = tempfile::tempdir().unwrap();
    let publisher = Publisher::new(client.clone(), "/test");
    let (n1, n2) = (node("n1").gpus(2), node("n2").gpus(2));
    for n in [&n1, &n2] {
        publisher
            .publish(NodeEvent::Registered(n.registered()))
            .await
            .unwrap();
    }
    for pct in [10, 20, 30] {
        publisher
            .publish(allot_events::TelemetryEvent::GpusSampled(n1.sampled(pct)))
            .await
            .unwrap();
    }
    let (addr, token, stop, service) = gateway(&nats.url(), dir.path()).await;
    let got = utilization(addr, &token, &["n1"]).await;
    assert_eq!(
        got["n1"],
        [Some(30), Some(30)],
        "the latest sample: {got:?}"
    );
    assert_eq!(got["n2"], [None, None], "n2 sent none: {got:?}");

    // n1's collector speaking for n2: not believed. Then n1's own next sample: once it shows,
    // the forged one before it has been read.
    let forged = publisher.envelope(allot_events::TelemetryEvent::GpusSampled(n2.sampled(99)));
    js.publish(
        allot_events::subject::telemetry("n1"),
        forged.to_json().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    publisher
        .publish(allot_events::TelemetryEvent::GpusSampled(n1.sampled(50)))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = utilization(addr, &token, &["n1"]).await;
    while got["n1"] != [Some(50), Some(50)] && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        got = utilization(addr, &token, &["n1"]).await;
    }
    assert_eq!(
        got["n1"],
        [Some(50), Some(50)],
        "a new sample, followed: {got:?}"
    );
    assert_eq!(
        got["n2"],
        [None, None],
        "the forged sample was not taken: {got:?}"
    );

    publisher
        .publish(allot_events::TelemetryEvent::GpusSampled(n2.sampled(40)))
        .await
        .unwrap();
    let got = utilization(addr, &token, &["n1", "n2"]).await;
    assert_eq!(got["n2"], [Some(40), Some(40)], "{got:?}");
    let _ = stop.send(());
    service.await.unwrap().unwrap();

    let (addr, token, stop, service) = gateway(&nats.url(), dir.path()).await;
    let got = utilization(addr, &token, &["n1", "n2"]).await;
    assert_eq!(
        (&got["n1"], &got["n2"]),
        (&vec![Some(50), Some(50)], &vec![Some(40), Some(40)]),
        "restarted, it reads each node's last sample again: {got:?}"
    );
    let _ = stop.send(());
    service.await.unwrap().unwrap();
}

/// A workload that finished longer ago than the retention is gone from the API when the
/// gateway starts (retention runs at once, then every minute); one still running, and one
/// finished since, are still there, and `/kpis` counts what is left.
#[tokio::test]
async fn workloads_finished_before_the_retention_are_taken_out_and_the_rest_kept() {
    use allot_bus::consumer::Delivery;
    use allot_events::workload::{WorkloadFinished, WorkloadOutcome};
    use allot_events::{AnyEvent, Envelope, WorkloadEvent};
    use allot_gateway::model;

    let (nats, _client) = nats_with_streams().await;
    let dir = tempfile::tempdir().unwrap();
    let conn = allot_store::open(&dir.path().join("gateway.db"), model::MIGRATIONS).unwrap();
    let long_ago = chrono::Utc::now() - chrono::Duration::days(40);
    let mut seq = 0;
    let mut deliver = |event: AnyEvent, at| {
        seq += 1;
        let d = Delivery::first(seq, Envelope::new("/test", event), at);
        model::apply_workloads(&conn, &d).unwrap();
    };
    let mut ids = Vec::new();
    for (name, finished) in [
        ("old", Some(long_ago)),
        ("running", None),
        ("new", Some(chrono::Utc::now())),
    ] {
        let spec = format!(
            "apiVersion: allot/v1\nkind: Workload\nmetadata: {{name: {name}, team: vision}}\n\
             spec:\n  tasks:\n    - {{name: train, command: [\"true\"], resources: {{gpus: 1}}}}\n"
        );
        let checked =
            allot_workload::check(&spec, allot_workload::Format::Yaml, Default::default()).unwrap();
        let key = allot_workload::submit::idempotency_key(&checked.workload, None);
        let submission = allot_workload::submit::submission(
            checked.workload,
            key,
            None,
            "ci".into(),
            "/test",
            long_ago,
        );
        let AnyEvent::Workload(WorkloadEvent::Submitted(s)) = submission.envelope.data else {
            unreachable!()
        };
        ids.push(s.workload_id.clone());
        deliver(WorkloadEvent::Submitted(s.clone()).into(), long_ago);
        if let Some(at) = finished {
            let end = WorkloadFinished {
                workload_id: s.workload_id,
                team: "vision".into(),
                outcome: WorkloadOutcome::Succeeded,
                reason: None,
            };
            deliver(WorkloadEvent::Finished(end).into(), at);
        }
    }
    drop(conn);

    let (addr, token, stop, service) = gateway(&nats.url(), dir.path()).await;
    let auth = [("Authorization", format!("Bearer {token}"))];
    let status = |id: String| {
        let auth = auth.clone();
        async move {
            http(addr, &format!("/api/v1/workloads/{id}"), &auth, |_| false)
                .await
                .0
        }
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while status(ids[0].clone()).await != 404 {
        assert!(
            Instant::now() < deadline,
            "the old workload was never taken out"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        status(ids[1].clone()).await,
        200,
        "the running workload is kept"
    );
    assert_eq!(
        status(ids[2].clone()).await,
        200,
        "the one finished today is kept"
    );
    let (_, kpis) = http(addr, "/api/v1/kpis", &auth, |_| false).await;
    let kpis: serde_json::Value = serde_json::from_str(&kpis).unwrap();
    assert_eq!(
        kpis["workloads"],
        serde_json::json!({"running": 1, "succeeded": 1}),
        "{kpis}"
    );
    let _ = stop.send(());
    service.await.unwrap().unwrap();
}
