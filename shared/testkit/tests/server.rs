//! Integration tests against a real nats-server (run `scripts/install-nats.sh` first).

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use allot_testkit::{NatsCluster, NatsServer};
use async_nats::jetstream::{self, stream};

/// The first line a raw TCP client receives from the server.
fn greeting(port: u16) -> String {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .expect("read INFO");
    line
}

fn is_running(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn stream_config(name: &str, replicas: usize) -> stream::Config {
    stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{}.>", name.to_lowercase())],
        num_replicas: replicas,
        ..Default::default()
    }
}

/// Creates the stream, asking again until JetStream answers, for clusters: a fresh cluster on a
/// loaded machine (CI runs the suite two cores wide) may not answer a stream request within the
/// client's timeout while it settles. Asking again is safe: creating a stream that exists with
/// the same config returns it.
async fn create_stream_until_done(
    js: &jetstream::Context,
    config: stream::Config,
) -> anyhow::Result<stream::Stream> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match js.get_or_create_stream(config.clone()).await {
            Ok(stream) => return Ok(stream),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => anyhow::bail!("stream {} was never created: {err}", config.name),
        }
    }
}

/// Publishes until JetStream acks, for clusters: right after a stream is created (or while it
/// elects a new leader) the node the client is on may not yet know the stream's subjects and
/// answer "no stream found for given subject".
async fn publish_until_acked(
    js: &jetstream::Context,
    subject: &'static str,
    payload: &'static str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let acked = match js.publish(subject, payload.into()).await {
            Ok(ack) => ack.await.map(drop).map_err(anyhow::Error::from),
            Err(err) => Err(err.into()),
        };
        match acked {
            Ok(()) => return Ok(()),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => anyhow::bail!("publish to {subject} never acked: {err}"),
        }
    }
}

#[test]
fn started_server_greets_a_tcp_client_with_info_and_jetstream_enabled() {
    let server = NatsServer::start();

    let info = greeting(server.port());

    assert!(info.starts_with("INFO {"), "{info}");
    assert!(info.contains("\"jetstream\":true"), "{info}");
    assert_eq!(server.url(), format!("nats://127.0.0.1:{}", server.port()));
}

#[test]
fn extra_config_is_applied_to_the_server() {
    let server = NatsServer::start_with_config(
        "accounts { APP: { jetstream: enabled, users: [{ user: app, password: secret }] } }",
    );

    let info = greeting(server.port());

    assert!(info.contains("\"auth_required\":true"), "{info}");
}

#[tokio::test]
async fn restart_keeps_the_port_and_the_jetstream_data() -> anyhow::Result<()> {
    let mut server = NatsServer::start();
    let port = server.port();
    let old_pid = server.pid();
    {
        let js = jetstream::new(async_nats::connect(server.url()).await?);
        js.create_stream(stream_config("ORDERS", 1)).await?;
        js.publish("orders.1", "first order".into()).await?.await?;
    }

    server.restart();

    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert!(!is_running(old_pid), "the killed process must be reaped");
    let js = jetstream::new(async_nats::connect(server.url()).await?);
    let message = js.get_stream("ORDERS").await?.get_raw_message(1).await?;
    assert_eq!(message.payload, "first order");
    Ok(())
}

#[test]
fn dropping_the_server_kills_and_reaps_the_process() {
    let server = NatsServer::start();
    let pid = server.pid();
    assert!(is_running(pid));

    drop(server);

    assert!(!is_running(pid), "nats-server {pid} outlived its handle");
}

#[test]
fn stop_shuts_the_server_down_gracefully() {
    let mut server = NatsServer::start();
    let pid = server.pid();

    server.stop();

    assert!(!is_running(pid));
    let log = server.log();
    assert!(
        log.contains("Server Exiting"),
        "no clean shutdown in log:\n{log}"
    );
    assert!(TcpStream::connect(("127.0.0.1", server.port())).is_err());
}

#[test]
fn kill_stops_the_server_and_log_survives_it() {
    let mut server = NatsServer::start();
    let pid = server.pid();

    server.kill();

    assert!(!is_running(pid));
    assert!(server.log().contains("Server is ready"), "{}", server.log());
}

#[tokio::test]
async fn cluster_of_three_elects_a_meta_leader_and_hosts_an_r3_stream() -> anyhow::Result<()> {
    let cluster = NatsCluster::start(3);

    let leaders: Vec<_> = (0..3).map(|i| cluster.meta_leader(i)).collect();
    assert!(leaders[0].is_some(), "{leaders:?}");
    assert!(
        leaders.iter().all(|l| *l == leaders[0]),
        "nodes disagree: {leaders:?}"
    );
    let names: Vec<_> = cluster.nodes.iter().map(|n| n.server_name()).collect();
    assert_eq!(names, ["n1", "n2", "n3"]);

    assert_eq!(cluster.urls(), cluster.url_list().join(","));
    let js = jetstream::new(async_nats::connect(cluster.url_list()).await?);
    let mut stream = create_stream_until_done(&js, stream_config("JOBS", 3)).await?;
    publish_until_acked(&js, "jobs.1", "train").await?;

    let info = stream.info().await?;
    assert_eq!(info.config.num_replicas, 3);
    assert_eq!(info.state.messages, 1);
    let group = info.cluster.as_ref().expect("clustered stream");
    assert_eq!(group.name.as_deref(), Some("allot-test"));
    assert_eq!(group.replicas.len(), 2, "{group:?}");
    Ok(())
}

#[tokio::test]
async fn r3_stream_survives_a_node_kill_and_the_node_catches_up_after_restart() -> anyhow::Result<()>
{
    let mut cluster = NatsCluster::start(3);
    // Talk to n2 only, so the client never depends on the node we kill.
    let js = jetstream::new(async_nats::connect(cluster.nodes[1].url()).await?);
    create_stream_until_done(&js, stream_config("EVENTS", 3)).await?;
    publish_until_acked(&js, "events.1", "before").await?;

    cluster.kill_node(0);
    // Two of three nodes are a quorum, so the stream takes writes once it has a leader again.
    publish_until_acked(&js, "events.2", "during").await?;

    cluster.restart_node(0);

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // (A request may time out while the restarted node rejoins: asked again, until the
        // deadline.)
        let info = match js.get_stream("EVENTS").await {
            Ok(mut stream) => stream.info().await.cloned().map_err(anyhow::Error::from),
            Err(err) => Err(err.into()),
        };
        let last = match info {
            Ok(info) => {
                let group = info.cluster.clone().expect("clustered stream");
                let all_current =
                    group.replicas.len() == 2 && group.replicas.iter().all(|p| p.current);
                if all_current && info.state.messages == 2 {
                    break;
                }
                format!("{group:?}, {} messages", info.state.messages)
            }
            Err(err) => format!("no answer: {err}"),
        };
        anyhow::ensure!(Instant::now() < deadline, "n1 never caught up: {last}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
