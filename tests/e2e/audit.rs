//! `allot audit archive` copies the decision log into the hash-chained archive;
//! `allot audit verify` passes on it, and after one byte of one payload is edited it fails
//! and names that record.

use std::path::Path;
use std::process::Output;

use async_nats::HeaderMap;
use async_nats::jetstream;

use allot_bus::{catalog, ensure_streams};
use allot_store::rusqlite::Connection;
use allot_testkit::NatsServer;

use crate::support::allot;

const SUBJECT: &str = "allot.alloc.test.log";
const MESSAGES: u64 = 12;

async fn publish_decisions(url: &str) {
    let client = async_nats::connect(url).await.unwrap();
    let js = jetstream::new(client);
    ensure_streams(&js, &catalog(1)).await.unwrap();
    for i in 1..=MESSAGES {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("decision-{i}").as_str());
        let payload = format!(r#"{{"decision":{i},"task":"train-{i}","gpus":4}}"#);
        js.publish_with_headers(SUBJECT, headers, payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

fn run(cwd: &Path, args: &[&str]) -> (bool, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = allot(cwd).args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    (status.success(), text)
}

/// The value after `label` on the line that starts with it.
fn field<'a>(output: &'a str, label: &str) -> &'a str {
    output
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} in:\n{output}"))
        .trim()
}

#[test]
fn editing_one_byte_of_the_archive_makes_verify_fail_and_name_the_record() {
    let server = NatsServer::start();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(publish_decisions(&server.url()));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("decisions.db");
    let db_arg = db.to_str().unwrap();

    let (ok, out) = run(
        dir.path(),
        &["audit", "archive", "--nats", &server.url(), "--db", db_arg],
    );
    assert!(ok, "archive failed:\n{out}");
    assert!(
        out.contains(&format!("archived {MESSAGES} new records")),
        "{out}"
    );
    // A one-shot copy leaves no consumer behind on the audited stream.
    let consumers = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = async_nats::connect(server.url()).await.unwrap();
        let mut stream = async_nats::jetstream::new(client)
            .get_stream("DECISIONS")
            .await
            .unwrap();
        stream.info().await.unwrap().state.consumer_count
    });
    assert_eq!(consumers, 0, "allot audit archive left a consumer");

    let (ok, out) = run(dir.path(), &["audit", "verify", "--db", db_arg]);
    assert!(ok, "an untouched archive verifies:\n{out}");
    assert_eq!(field(&out, "records"), MESSAGES.to_string(), "{out}");
    assert_eq!(field(&out, "sequences"), format!("1..={MESSAGES}"), "{out}");
    let head = field(&out, "head").to_owned();

    // The auditor pins the head they were given; a later pass that archives nothing keeps it.
    let (ok, out) = run(
        dir.path(),
        &["audit", "archive", "--nats", &server.url(), "--db", db_arg],
    );
    assert!(ok && out.contains("archived 0 new records"), "{out}");
    let pin = ["--expect-head", &head, "--expect-count", "12"];
    let (ok, out) = run(
        dir.path(),
        &[&["audit", "verify", "--db", db_arg][..], &pin[..]].concat(),
    );
    assert!(ok, "the pinned head is still there:\n{out}");

    // One byte of seq 7's payload, edited the way anyone with the file could: plain SQL.
    {
        let conn = Connection::open(&db).unwrap();
        let changed = conn
            .execute(
                "UPDATE records SET payload = CAST(replace(CAST(payload AS TEXT), '\"gpus\":4', '\"gpus\":8') AS BLOB)
                 WHERE seq = 7",
                [],
            )
            .unwrap();
        assert_eq!(changed, 1);
    }
    let (ok, out) = run(dir.path(), &["audit", "verify", "--db", db_arg]);
    assert!(!ok, "verify must fail after an edit:\n{out}");
    assert!(out.contains("chain BROKEN"), "{out}");
    assert!(
        out.contains(&format!(
            "record seq 7 (position 7, subject {SUBJECT}): edited"
        )),
        "the edited record is named:\n{out}"
    );
    assert!(out.contains("expected") && out.contains("found"), "{out}");
}

#[test]
fn a_cut_tail_passes_the_chain_but_fails_against_the_pinned_head() {
    let server = NatsServer::start();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(publish_decisions(&server.url()));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("decisions.db");
    let db_arg = db.to_str().unwrap();
    let (ok, out) = run(
        dir.path(),
        &["audit", "archive", "--nats", &server.url(), "--db", db_arg],
    );
    assert!(ok, "{out}");
    let (_, out) = run(dir.path(), &["audit", "verify", "--db", db_arg]);
    let head = field(&out, "head").to_owned();

    Connection::open(&db)
        .unwrap()
        .execute("DELETE FROM records WHERE seq > 10", [])
        .unwrap();
    let (ok, out) = run(dir.path(), &["audit", "verify", "--db", db_arg]);
    assert!(ok, "a shorter chain is still a valid chain:\n{out}");
    let (ok, out) = run(
        dir.path(),
        &["audit", "verify", "--db", db_arg, "--expect-head", &head],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("record seq 10"),
        "names the last record left:\n{out}"
    );
    assert!(out.contains("pinned head is not in the chain"), "{out}");
}
