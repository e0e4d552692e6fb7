//! How fast `allot audit verify` walks an archive, against two baselines measured in the same
//! run over the same 100,000 records:
//!
//! - `sha256 only`: SHA-256 over exactly the bytes verification hashes, already in memory —
//!   the floor set by hashing alone;
//! - `sqlite scan`: the same query over the same file, reading every column, hashing nothing —
//!   the floor set by reading the records.
//!
//! Run with `cargo bench -p allot-archiver --bench verify`. The archive is a file in WAL mode,
//! as the archiver writes it, read warm from the page cache.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sha2::{Digest, Sha256};

use allot_archiver::chain::{self, Entry};
use allot_store::rusqlite::{Connection, types::ValueRef};

const RECORDS: u64 = 100_000;
const BATCH: u64 = 1_000;

/// A decision about the size of the allocator's (a granted task with its placement and reason).
fn decision(seq: u64) -> Entry {
    let payload = format!(
        r#"{{"specversion":"1.0","id":"0191d3a4-7b2c-7e3f-9a10-{seq:012}","source":"/allot/allocator/pool-a","type":"io.allot.alloc.v1.granted","time":"2026-01-01T00:00:00.{:09}Z","datacontenttype":"application/json","data":{{"task":"wl-{}/train-{}","pool":"pool-a","node":"node-{}","gpus":[0,1,2,3],"lease":{seq},"reason":"priority high, quota team-{} within nominal, best fit on node-{} (4 of 8 free)"}}}}"#,
        seq % 1_000_000_000,
        seq / 7,
        seq % 13,
        seq % 80,
        seq % 11,
        seq % 80
    );
    Entry {
        seq,
        subject: format!("allot.alloc.pool-a.granted.{}", seq % 80),
        headers: chain::canonical_headers([("Nats-Msg-Id", format!("decision-{seq}").as_str())]),
        payload: payload.into_bytes(),
        published_ns: 1_767_225_600_000_000_000 + seq as i64 * 1_000_000,
    }
}

fn build(path: &std::path::Path) -> Connection {
    let mut conn = allot_archiver::open(path).unwrap();
    for start in (1..=RECORDS).step_by(BATCH as usize) {
        let entries: Vec<Entry> = (start..start + BATCH).map(decision).collect();
        chain::append(&mut conn, "bench", &entries, 1_767_225_600_000_000_000).unwrap();
    }
    conn
}

/// The exact bytes `record_hash` feeds SHA-256 for each record, read back from the archive.
fn encodings(conn: &Connection) -> Vec<Vec<u8>> {
    let lp = |out: &mut Vec<u8>, b: &[u8]| {
        out.extend_from_slice(&(b.len() as u64).to_be_bytes());
        out.extend_from_slice(b);
    };
    let mut stmt = conn
        .prepare(
            "SELECT seq, subject, headers, payload, published_ns, archived_ns, prev_hash
             FROM records ORDER BY position",
        )
        .unwrap();
    stmt.query_map([], |r| {
        let mut out = Vec::new();
        lp(&mut out, chain::FORMAT.as_bytes());
        out.extend_from_slice(&r.get::<_, Vec<u8>>(6)?);
        out.extend_from_slice(&(r.get::<_, i64>(0)? as u64).to_be_bytes());
        out.extend_from_slice(&r.get::<_, i64>(4)?.to_be_bytes());
        out.extend_from_slice(&r.get::<_, i64>(5)?.to_be_bytes());
        lp(&mut out, r.get::<_, String>(1)?.as_bytes());
        lp(&mut out, r.get::<_, String>(2)?.as_bytes());
        lp(&mut out, &r.get::<_, Vec<u8>>(3)?);
        Ok(out)
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

fn scan(conn: &Connection) -> usize {
    let mut stmt = conn
        .prepare_cached(
            "SELECT position, seq, subject, headers, payload, published_ns, archived_ns,
                    prev_hash, hash
             FROM records ORDER BY position",
        )
        .unwrap();
    let mut rows = stmt.query([]).unwrap();
    let mut total = 0;
    while let Some(row) = rows.next().unwrap() {
        for i in 0..9 {
            total += match row.get_ref(i).unwrap() {
                ValueRef::Text(b) | ValueRef::Blob(b) => b.len(),
                ValueRef::Integer(v) => v as usize & 1,
                _ => 0,
            };
        }
    }
    total
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let conn = build(&dir.path().join("decisions.db"));
    let encoded = encodings(&conn);
    let bytes: usize = encoded.iter().map(Vec::len).sum();
    eprintln!(
        "archive: {RECORDS} records, {} bytes hashed per verify ({} per record)",
        bytes,
        bytes / RECORDS as usize
    );
    // The baselines must cover the same work, or the ratio means nothing.
    let summary = chain::verify(&conn).unwrap();
    assert_eq!(summary.records, RECORDS);
    let last: [u8; 32] = Sha256::digest(encoded.last().unwrap()).into();
    assert_eq!(
        last, summary.head,
        "the baseline hashes the bytes verify hashes"
    );

    let mut group = c.benchmark_group("audit verify");
    group
        .throughput(Throughput::Elements(RECORDS))
        .sample_size(10)
        .measurement_time(Duration::from_secs(15));
    group.bench_function("chain::verify", |b| {
        b.iter(|| black_box(chain::verify(&conn).unwrap()))
    });
    group.bench_function("sha256 only", |b| {
        b.iter(|| {
            let mut last = [0u8; 32];
            for e in &encoded {
                last = Sha256::digest(black_box(e)).into();
            }
            black_box(last)
        })
    });
    group.bench_function("sqlite scan", |b| b.iter(|| black_box(scan(&conn))));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
