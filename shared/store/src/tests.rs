use super::*;

const COUNTER: &str = "CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL) STRICT;
                       INSERT INTO counter VALUES (1, 0);";

fn count(conn: &Connection) -> i64 {
    conn.query_row("SELECT n FROM counter WHERE id = 1", [], |r| r.get(0))
        .unwrap()
}

fn bump(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.execute("UPDATE counter SET n = n + 1 WHERE id = 1", [])?;
    Ok(())
}

#[derive(Debug)]
struct Rejected;
impl From<rusqlite::Error> for Rejected {
    fn from(_: rusqlite::Error) -> Self {
        Rejected
    }
}

#[test]
fn a_redelivered_sequence_is_not_applied_twice() {
    let mut conn = open_in_memory(&[COUNTER]).unwrap();
    assert_eq!(apply(&mut conn, "c", 1, bump).unwrap(), Applied::Applied);
    assert_eq!(apply(&mut conn, "c", 2, bump).unwrap(), Applied::Applied);
    assert_eq!(
        apply(&mut conn, "c", 2, bump).unwrap(),
        Applied::AlreadyApplied { position: 2 }
    );
    assert_eq!(
        apply(&mut conn, "c", 1, bump).unwrap(),
        Applied::AlreadyApplied { position: 2 }
    );
    assert_eq!(count(&conn), 2);
    assert_eq!(position(&conn, "c").unwrap(), Some(2));
}

#[test]
fn positions_are_kept_per_consumer() {
    let mut conn = open_in_memory(&[COUNTER]).unwrap();
    apply(&mut conn, "nodes", 5, bump).unwrap();
    assert_eq!(
        apply(&mut conn, "telemetry", 1, bump).unwrap(),
        Applied::Applied
    );
    assert_eq!(position(&conn, "nodes").unwrap(), Some(5));
    assert_eq!(position(&conn, "telemetry").unwrap(), Some(1));
    assert_eq!(position(&conn, "other").unwrap(), None);
}

#[test]
fn a_failed_change_keeps_neither_the_state_nor_the_position() {
    let mut conn = open_in_memory(&[COUNTER]).unwrap();
    apply(&mut conn, "c", 1, bump).unwrap();
    let result = apply(
        &mut conn,
        "c",
        2,
        |c: &Connection| -> Result<(), Rejected> {
            bump(c)?;
            Err(Rejected)
        },
    );
    assert!(result.is_err());
    assert_eq!(count(&conn), 1, "the half-made change was rolled back");
    assert_eq!(position(&conn, "c").unwrap(), Some(1));
    assert_eq!(apply(&mut conn, "c", 2, bump).unwrap(), Applied::Applied);
}

#[test]
fn a_batch_hands_over_only_what_was_not_applied_and_records_its_highest_sequence() {
    let mut conn = open_in_memory(&[COUNTER]).unwrap();
    apply(&mut conn, "c", 2, bump).unwrap();
    let items = [(1, 10), (2, 20), (3, 30), (5, 50)];
    let mut handed = Vec::new();
    let outcome = apply_batch(&mut conn, "c", &items, |c, fresh: &[&i32]| {
        handed = fresh.iter().map(|v| **v).collect();
        bump(c)
    })
    .unwrap();
    assert_eq!(handed, vec![30, 50]);
    assert_eq!(
        outcome,
        BatchApplied {
            applied: 2,
            skipped: 2
        }
    );
    assert_eq!(count(&conn), 2);
    assert_eq!(position(&conn, "c").unwrap(), Some(5));

    let again = apply_batch(&mut conn, "c", &items, |c, _: &[&i32]| bump(c)).unwrap();
    assert_eq!(
        again,
        BatchApplied {
            applied: 0,
            skipped: 4
        },
        "a redelivered batch changes nothing"
    );
    assert_eq!(count(&conn), 2);
}

/// A process paused past its ack wait reads, once it resumes, what it had pulled and the
/// server's redeliveries of it, in one batch: each event is applied once, in stream order.
#[test]
fn copies_redelivered_into_the_same_batch_are_applied_once() {
    let mut conn = open_in_memory(&[COUNTER]).unwrap();
    apply(&mut conn, "c", 2, bump).unwrap();
    let items = [
        (2, 20),
        (3, 30),
        (4, 40),
        (3, 30),
        (4, 40),
        (5, 50),
        (4, 40),
    ];
    let mut handed = Vec::new();
    let outcome = apply_batch(&mut conn, "c", &items, |c, fresh: &[&i32]| {
        handed = fresh.iter().map(|v| **v).collect();
        bump(c)
    })
    .unwrap();
    assert_eq!(handed, vec![30, 40, 50]);
    assert_eq!(
        outcome,
        BatchApplied {
            applied: 3,
            skipped: 4
        }
    );
    assert_eq!(position(&conn, "c").unwrap(), Some(5));
}

#[test]
fn a_failed_batch_keeps_neither_its_changes_nor_its_position() {
    let mut conn = open_in_memory(&[COUNTER]).unwrap();
    let items = [(1, ()), (2, ())];
    let result = apply_batch(
        &mut conn,
        "c",
        &items,
        |c, _: &[&()]| -> Result<(), Rejected> {
            bump(c)?;
            Err(Rejected)
        },
    );
    assert!(result.is_err());
    assert_eq!(count(&conn), 0);
    assert_eq!(position(&conn, "c").unwrap(), None);
}

#[test]
fn state_and_position_survive_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/state.db");
    {
        let mut conn = open(&path, &[COUNTER]).unwrap();
        apply(&mut conn, "c", 7, bump).unwrap();
    }
    let conn = open(&path, &[COUNTER]).unwrap();
    assert_eq!(count(&conn), 1, "migrations are not re-run on reopen");
    assert_eq!(position(&conn, "c").unwrap(), Some(7));
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn applying_while_another_connection_writes_waits_for_the_lock_instead_of_failing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut conn = open(&path, &[COUNTER]).unwrap();
    let other = {
        let path = path.clone();
        std::thread::spawn(move || {
            let conn = open(&path, &[COUNTER]).unwrap();
            for _ in 0..2_000 {
                conn.execute("INSERT OR REPLACE INTO counter VALUES (2, 0)", [])
                    .unwrap();
            }
        })
    };
    for seq in 1..=2_000u64 {
        let items = [(seq, ())];
        apply_batch(&mut conn, "c", &items, |c, _: &[&()]| bump(c))
            .unwrap_or_else(|e| panic!("batch {seq} failed: {e}"));
    }
    other.join().unwrap();
    assert_eq!(count(&conn), 2_000);
}

#[test]
fn a_writer_waiting_for_the_lock_tries_again_within_a_millisecond_for_five_seconds() {
    let sleeps: Vec<_> = (0..).map_while(crate::lock_poll).collect();
    let longest = sleeps.iter().max().unwrap();
    let total: std::time::Duration = sleeps.iter().sum();
    // SQLite's busy timeout sleeps up to 100 ms between tries: a writer could wake that long
    // after the lock was free.
    assert!(
        *longest <= std::time::Duration::from_millis(1),
        "{longest:?}"
    );
    assert!(
        total >= crate::LOCK_WAIT
            && total <= crate::LOCK_WAIT + std::time::Duration::from_millis(1),
        "{total:?}"
    );
    assert_eq!(sleeps[0], std::time::Duration::from_micros(50));
}

#[test]
fn a_keyed_row_is_written_over_and_deleted_by_its_whole_key() {
    let conn = open_in_memory(&[
        "CREATE TABLE lease (pool TEXT NOT NULL, lease INTEGER NOT NULL, json TEXT NOT NULL,
                             PRIMARY KEY (pool, lease)) STRICT;",
    ])
    .unwrap();
    let statements = (
        "INSERT INTO lease (pool, lease, json) VALUES (?1, ?2, ?3)
         ON CONFLICT (pool, lease) DO UPDATE SET json = excluded.json",
        "DELETE FROM lease WHERE pool = ?1 AND lease = ?2",
    );
    let rows = |conn: &Connection| -> Vec<(String, i64, String)> {
        let mut stmt = conn
            .prepare("SELECT pool, lease, json FROM lease ORDER BY pool, lease")
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    for (pool, lease, json) in [("a", 1, "{}"), ("b", 1, "{}"), ("a", 1, "[]")] {
        put_row(&conn, statements, &[&pool, &lease], Some(&json)).unwrap();
    }
    put_row(&conn, statements, &[&"b", &1], None).unwrap();
    assert_eq!(rows(&conn), [("a".to_owned(), 1, "[]".to_owned())]);
}

/// A heartbeat of `node` delivered from stream position `seq`.
fn heartbeat(seq: u64, node: &str) -> allot_bus::consumer::Delivery {
    use allot_events::node::{HeartbeatSent, NodeEvent};
    let event = NodeEvent::HeartbeatSent(HeartbeatSent {
        node: node.into(),
        seq,
        uptime_s: seq,
    });
    allot_bus::consumer::Delivery::first(
        seq,
        allot_events::Envelope::new("/allot/collector/test", event),
        chrono::Utc::now(),
    )
}

/// Projections that write through one connection (the gateway's) each resume from their own
/// position, skip their own redeliveries, and a batch of one that fails takes back its own
/// changes only — the other's commits stay, on disk.
#[tokio::test]
async fn projections_sharing_a_connection_keep_their_own_positions_and_batches() {
    use allot_bus::consumer::{Handler, Outcome};
    use allot_events::{AnyEvent, NodeEvent};

    const SEEN: &str = "CREATE TABLE seen (consumer TEXT NOT NULL, node TEXT NOT NULL) STRICT;";
    fn record(
        consumer: &'static str,
    ) -> impl FnMut(&Connection, &allot_bus::consumer::Delivery) -> rusqlite::Result<()> {
        move |tx, d| {
            let AnyEvent::Node(NodeEvent::HeartbeatSent(h)) = &d.event.data else {
                unreachable!("only heartbeats are delivered here");
            };
            if h.node == "bad" {
                return Err(rusqlite::Error::InvalidQuery);
            }
            tx.execute(
                "INSERT INTO seen (consumer, node) VALUES (?1, ?2)",
                rusqlite::params![consumer, h.node],
            )?;
            Ok(())
        }
    }
    let seen = |conn: &Connection, consumer: &str| -> Vec<String> {
        conn.prepare("SELECT node FROM seen WHERE consumer = ?1 ORDER BY rowid")
            .unwrap()
            .query_map([consumer], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let conn: SharedConnection =
        std::sync::Arc::new(std::sync::Mutex::new(open(&path, &[SEEN]).unwrap()));
    let mut a = Projection::sharing(conn.clone(), "a", "test", record("a"));
    let mut b = Projection::sharing(conn.clone(), "b", "test", record("b"));
    assert_eq!(a.resume_after().unwrap(), Some(0));

    let first = [heartbeat(1, "n1"), heartbeat(2, "n2")];
    assert_eq!(a.handle(&first).await.unwrap(), vec![Outcome::Handled; 2]);
    assert_eq!(
        b.resume_after().unwrap(),
        Some(0),
        "a's position is not b's"
    );
    b.handle(&first[..1]).await.unwrap();
    // b's next batch fails half-way: its first delivery is taken back with it, a's stay.
    assert!(
        b.handle(&[heartbeat(2, "n2"), heartbeat(3, "bad")])
            .await
            .is_err()
    );
    // a's redelivered batch and one more: only the new one is applied.
    let again = [heartbeat(1, "n1"), heartbeat(2, "n2"), heartbeat(3, "n3")];
    a.handle(&again).await.unwrap();
    drop((a, b));
    drop(conn);

    let reopened = open(&path, &[SEEN]).unwrap();
    assert_eq!(seen(&reopened, "a"), ["n1", "n2", "n3"]);
    assert_eq!(seen(&reopened, "b"), ["n1"]);
    assert_eq!(position(&reopened, "a").unwrap(), Some(3));
    assert_eq!(position(&reopened, "b").unwrap(), Some(1));
}
