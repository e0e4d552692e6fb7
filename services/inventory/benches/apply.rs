//! What applying telemetry costs per event: decoding, and SQLite commits at different batch
//! sizes (why the inventory's consumers linger for a few milliseconds to batch).
//!
//! `cargo bench -p allot-inventory --bench apply`

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

use allot_bus::Delivery;
use allot_events::{Envelope, decode};
use allot_testkit::node;

const EVENTS: usize = 2_048;

/// 100 nodes × 8 GPUs, one sample per node per tick, as the collectors send them.
fn wire() -> Vec<Vec<u8>> {
    let nodes: Vec<_> = (1..=100).map(|n| node(&format!("node-{n}"))).collect();
    (0..EVENTS)
        .map(|i| {
            let n = &nodes[i % nodes.len()];
            let util = ((i / nodes.len()) * 7 % 101) as u8;
            Envelope::new(format!("/allot/collector/{}", n.name()), n.sampled(util)).to_json()
        })
        .collect()
}

fn deliveries(wire: &[Vec<u8>]) -> Vec<Delivery> {
    wire.iter()
        .enumerate()
        .map(|(i, bytes)| Delivery {
            stream_sequence: i as u64 + 1,
            subject: "allot.telemetry.x".into(),
            published: chrono::Utc::now(),
            deliveries: 1,
            event: decode(bytes).expect("valid event"),
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let wire = wire();
    let mut group = c.benchmark_group("telemetry");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.sample_size(10);
    group.bench_function("decode", |b| b.iter(|| deliveries(&wire)));
    // What the collector's publisher does per sample before it sends: the event to JSON.
    let events: Vec<Envelope> = deliveries(&wire).into_iter().map(|d| d.event).collect();
    group.bench_function("encode", |b| {
        b.iter(|| events.iter().map(|e| e.to_json().len()).sum::<usize>())
    });

    let deliveries = deliveries(&wire);
    for batch in [1usize, 16, 256, 1024] {
        group.bench_with_input(
            BenchmarkId::new("apply_batch", batch),
            &batch,
            |b, &batch| {
                b.iter_batched(
                    || {
                        let dir = tempfile::tempdir().expect("temp dir");
                        let conn = allot_store::open(
                            &dir.path().join("inventory.db"),
                            allot_inventory::projection::MIGRATIONS,
                        )
                        .expect("database");
                        (dir, conn)
                    },
                    |(_dir, mut conn)| {
                        for chunk in deliveries.chunks(batch) {
                            let items: Vec<(u64, &Delivery)> =
                                chunk.iter().map(|d| (d.stream_sequence, d)).collect();
                            allot_store::apply_batch(&mut conn, "bench", &items, |c, fresh| {
                                let fresh: Vec<&Delivery> = fresh.iter().map(|d| **d).collect();
                                allot_inventory::projection::apply_all(c, &fresh)
                            })
                            .expect("applied");
                        }
                    },
                    criterion::BatchSize::PerIteration,
                );
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
