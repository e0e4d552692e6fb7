//! The inventory killed with SIGKILL in the middle of a stream and restarted ends up with the
//! same projection as an inventory that was never interrupted: nothing lost, nothing twice.

use std::path::Path;
use std::time::Duration;

use allot_bus::streams::names;
use allot_bus::{Publisher, catalog, ensure_streams};
use allot_testkit::{NatsServer, node};

use crate::support::{allot, log_of, spawn_logged, wait_for};

const NODES: u32 = 12;
const ROUNDS: u64 = 600;

/// Publishes registrations, then ROUNDS of heartbeat + telemetry per node; returns the last
/// sequences of FLEET and TELEMETRY.
async fn publish_history(url: &str) -> (u64, u64) {
    let client = async_nats::connect(url).await.unwrap();
    let publisher = Publisher::new(client, "/test/collector");
    ensure_streams(publisher.jetstream(), &catalog(1))
        .await
        .unwrap();
    let mut pending = Vec::new();
    let nodes: Vec<_> = (1..=NODES).map(|n| node(&format!("node-{n}"))).collect();
    for n in &nodes {
        pending.push(
            publisher
                .send(&publisher.envelope(n.registered()))
                .await
                .unwrap(),
        );
    }
    for round in 1..=ROUNDS {
        for (i, n) in nodes.iter().enumerate() {
            let beat = publisher.envelope(n.heartbeat(round));
            pending.push(publisher.send(&beat).await.unwrap());
            // Values change every round, so a lost or repeated sample shows in the tables.
            let sample = publisher.envelope(n.sampled(((round * 7 + i as u64 * 13) % 101) as u8));
            pending.push(publisher.send(&sample).await.unwrap());
        }
        if pending.len() > 2000 {
            for p in pending.drain(..) {
                p.wait().await.unwrap();
            }
        }
    }
    for p in pending {
        p.wait().await.unwrap();
    }
    let js = publisher.jetstream();
    let fleet = js
        .get_stream(names::FLEET)
        .await
        .unwrap()
        .cached_info()
        .state
        .last_sequence;
    let telemetry = js
        .get_stream(names::TELEMETRY)
        .await
        .unwrap()
        .cached_info()
        .state
        .last_sequence;
    (fleet, telemetry)
}

fn positions(db: &Path, prefix: &str) -> Option<(u64, u64)> {
    let conn = allot_store::rusqlite::Connection::open(db).ok()?;
    let fleet = allot_store::position(&conn, &format!("{prefix}-fleet"))
        .ok()?
        .unwrap_or(0);
    let telemetry = allot_store::position(&conn, &format!("{prefix}-telemetry"))
        .ok()?
        .unwrap_or(0);
    Some((fleet, telemetry))
}

fn dump(db: &Path) -> String {
    let conn = allot_store::open(db, allot_inventory::projection::MIGRATIONS).unwrap();
    allot_inventory::projection::dump(&conn).unwrap()
}

fn inventory(dir: &Path, url: &str, prefix: &str, name: &str) -> std::process::Child {
    let mut cmd = allot(dir);
    cmd.args([
        "run",
        "--nats",
        url,
        "inventory",
        "--consumer-prefix",
        prefix,
    ])
    .args(["--data-dir", dir.join(prefix).to_str().unwrap()])
    .args(["--ack-wait", "1s"]);
    spawn_logged(cmd, dir, name)
}

#[test]
fn inventory_killed_mid_stream_and_restarted_matches_an_uninterrupted_run() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (fleet_last, telemetry_last) = runtime.block_on(publish_history(&server.url()));
    assert_eq!(fleet_last, u64::from(NODES) * (ROUNDS + 1));
    assert_eq!(telemetry_last, u64::from(NODES) * ROUNDS);
    let caught_up = |p: (u64, u64)| p.0 >= fleet_last && p.1 >= telemetry_last;

    // The crashing inventory: killed with SIGKILL twice while applying, then left to finish.
    let crash_db = dir.path().join("crash/inventory.db");
    let mut kills = Vec::new();
    for attempt in 0..2 {
        let name = format!("crash-{attempt}");
        let mut child = inventory(dir.path(), &server.url(), "crash", &name);
        let start = positions(&crash_db, "crash").map_or(0, |p| p.0 + p.1);
        let at = wait_for(Duration::from_secs(60), || {
            positions(&crash_db, "crash").filter(|p| p.0 + p.1 > start + 500)
        })
        .unwrap_or_else(|| panic!("no progress; log:\n{}", log_of(dir.path(), &name)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills.push(positions(&crash_db, "crash").unwrap_or(at));
    }
    assert!(
        kills.iter().any(|p| !caught_up(*p)),
        "the inventory was never killed mid-stream (positions at the kills: {kills:?}); publish more history"
    );
    let mut survivor = inventory(dir.path(), &server.url(), "crash", "crash-final");
    wait_for(Duration::from_secs(120), || {
        positions(&crash_db, "crash").filter(|p| caught_up(*p))
    })
    .unwrap_or_else(|| {
        panic!(
            "did not catch up; log:\n{}",
            log_of(dir.path(), "crash-final")
        )
    });
    survivor.kill().unwrap();
    survivor.wait().unwrap();

    // The reference: one uninterrupted run over the same streams.
    let reference_db = dir.path().join("reference/inventory.db");
    let mut reference = inventory(dir.path(), &server.url(), "reference", "reference");
    wait_for(Duration::from_secs(120), || {
        positions(&reference_db, "reference").filter(|p| caught_up(*p))
    })
    .unwrap_or_else(|| {
        panic!(
            "reference did not catch up; log:\n{}",
            log_of(dir.path(), "reference")
        )
    });
    reference.kill().unwrap();
    reference.wait().unwrap();

    let crashed = dump(&crash_db);
    let uninterrupted = dump(&reference_db);
    // FLEET keeps the latest heartbeats of each node; every one kept is counted exactly once.
    let kept = ROUNDS.min(allot_bus::streams::FLEET_MSGS_PER_SUBJECT as u64);
    let want = format!("hbs={kept}");
    assert!(
        crashed
            .lines()
            .filter(|l| l.starts_with("node "))
            .all(|l| l.ends_with(&want)),
        "every heartbeat counted exactly once:\n{crashed}"
    );
    assert!(
        crashed
            .lines()
            .filter(|l| l.starts_with("gpu "))
            .all(|l| l.contains(&format!(" Integer({ROUNDS}) "))),
        "every telemetry sample counted exactly once:\n{crashed}"
    );
    assert_eq!(crashed.lines().count(), uninterrupted.lines().count());
    for (a, b) in crashed.lines().zip(uninterrupted.lines()) {
        assert_eq!(a, b, "projection differs after the crashes");
    }
}
