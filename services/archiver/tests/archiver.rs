//! The archiver against a real nats-server: every DECISIONS message lands in the chain, in
//! order, byte for byte — decodable or not — and restarts neither duplicate nor skip.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream;

use allot_archiver::{Config, catch_up, chain, open, run, verify};
use allot_bus::{catalog, ensure_streams};
use allot_testkit::NatsServer;

const SUBJECT: &str = "allot.alloc.test.log";

async fn setup(server: &NatsServer) -> jetstream::Context {
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client);
    ensure_streams(&js, &catalog(1)).await.unwrap();
    js
}

/// Publishes decisions `from..=to`, each acknowledged by the stream before the next.
async fn publish(js: &jetstream::Context, from: u64, to: u64) {
    for i in from..=to {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("decision-{i}").as_str());
        // Not a CloudEvent, and one of them not even UTF-8: the archive keeps them all.
        let payload = if i == 3 {
            vec![0xff, 0x00, 0xfe]
        } else {
            format!(r#"{{"decision":{i}}}"#).into_bytes()
        };
        js.publish_with_headers(SUBJECT, headers, payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

fn payload_of(conn: &allot_store::rusqlite::Connection, seq: u64) -> Vec<u8> {
    conn.query_row(
        "SELECT payload FROM records WHERE seq = ?1",
        [seq as i64],
        |r| r.get(0),
    )
    .unwrap()
}

#[tokio::test]
async fn catching_up_archives_every_message_in_order_and_a_second_pass_adds_nothing() {
    let server = NatsServer::start();
    let js = setup(&server).await;
    publish(&js, 1, 20).await;
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(server.url(), config_path(&dir));

    let first = catch_up(config.clone(), std::future::pending())
        .await
        .unwrap();
    assert_eq!(
        (first.appended, first.head, first.stream_last),
        (20, 20, 20)
    );

    let conn = open(&config.db_path).unwrap();
    let summary = verify(&conn).unwrap();
    assert_eq!(summary.records, 20);
    assert_eq!((summary.first_seq, summary.last_seq), (Some(1), Some(20)));
    assert_eq!(payload_of(&conn, 3), vec![0xff, 0x00, 0xfe]);
    assert_eq!(payload_of(&conn, 7), br#"{"decision":7}"#);
    let headers: String = conn
        .query_row("SELECT headers FROM records WHERE seq = 7", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(headers, r#"[["Nats-Msg-Id","decision-7"]]"#);

    let second = catch_up(config.clone(), std::future::pending())
        .await
        .unwrap();
    assert_eq!(second.appended, 0);
    assert_eq!(verify(&conn).unwrap().head, summary.head, "nothing changed");

    publish(&js, 21, 25).await;
    let third = catch_up(config, std::future::pending()).await.unwrap();
    assert_eq!((third.appended, third.head), (5, 25));
    let grown = verify(&conn).unwrap();
    assert_eq!(grown.records, 25);
    let pinned = allot_archiver::verify_against(
        &conn,
        &allot_archiver::Expect {
            head: Some(summary.head),
            count: Some(20),
        },
    )
    .unwrap();
    assert_eq!(
        pinned.pinned,
        Some((20, 20)),
        "the old head is still in the chain"
    );

    // Pointed at another server, whose DECISIONS holds less than the archive, it refuses.
    let other = NatsServer::start();
    setup(&other).await;
    let db_path = config_path(&dir);
    let refused = catch_up(Config::new(other.url(), db_path), std::future::pending()).await;
    assert!(
        matches!(
            refused,
            Err(allot_archiver::Error::Refused { head: 25, .. })
        ),
        "{refused:?}"
    );
    assert_eq!(
        verify(&conn).unwrap().records,
        25,
        "the archive is untouched"
    );
}

fn config_path(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("archive/decisions.db")
}

#[tokio::test]
async fn the_running_archiver_follows_the_stream_and_resumes_where_it_stopped() {
    let server = NatsServer::start();
    let js = setup(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(server.url(), dir.path().join("decisions.db"));
    let conn = open(&config.db_path).unwrap();
    let head = || chain::head(&conn).unwrap().map_or(0, |h| h.seq);

    for (round, (from, to)) in [(1, 10), (11, 30)].into_iter().enumerate() {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let archiver = tokio::spawn(run(config.clone(), async {
            let _ = stopped.await;
        }));
        publish(&js, from, to).await;
        let mut waited = 0;
        while head() < to {
            waited += 1;
            assert!(
                waited < 600,
                "round {round}: the archiver reached seq {} of {to}",
                head()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.send(()).unwrap();
        archiver.await.unwrap().unwrap();
    }
    let summary = verify(&conn).unwrap();
    assert_eq!(summary.records, 30);
    assert_eq!(allot_store::position(&conn, "archiver").unwrap(), Some(30));
}
