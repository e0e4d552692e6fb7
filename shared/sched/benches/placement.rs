//! Placement throughput of one scheduling pass at the scale ([`allot_sched::bench`]:
//! 1,250 nodes × 8 GPUs, ~62 % busy, 10,000 pending tasks). Throughput is counted in grants:
//! the elements of one measured pass are the `Granted` decisions it makes. `allot bench
//! placement --json PATH` runs the same pass for every policy in one process.
//!
//! The scheduler is not `Clone`, so every iteration rebuilds it outside the measurement.

use std::hint::black_box;
use std::time::Duration;

use allot_sched::Decision;
use allot_sched::bench::{pass, prepared};
use allot_sched::policy::NAMES;
use criterion::{BatchSize, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};

/// The policies measured: the reference, Kueue, ours, and the packing baselines if present.
const POLICIES: [&str; 5] = ["fifo", "kueue", "allot", "bestfit", "fgd"];

fn placement(c: &mut Criterion) {
    let mut group = c.benchmark_group("schedule_pass_1250x8_10k_pending");
    // Each iteration rebuilds the scheduler (hundreds of ms): few, flat samples.
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for name in POLICIES.iter().filter(|p| NAMES.contains(p)) {
        // The pass is deterministic: count its grants once, outside the measurement.
        let mut s = prepared(name);
        let busy = s.cluster().allocated_milli() as f64 / s.cluster().capacity_milli() as f64;
        let decisions = pass(&mut s);
        let count = |f: fn(&Decision) -> bool| decisions.iter().filter(|d| f(d)).count();
        let granted = count(|d| matches!(d, Decision::Granted { .. }));
        eprintln!(
            "{name}: {:.1} % of GPUs busy before the pass; it grants {granted}, preempts {}, \
             leaves {} pending and {:.1} % busy",
            busy * 100.0,
            count(|d| matches!(d, Decision::Preempted { .. })),
            s.pending(),
            s.cluster().allocated_milli() as f64 / s.cluster().capacity_milli() as f64 * 100.0
        );
        group.throughput(Throughput::Elements(granted as u64));
        group.bench_function(*name, |b| {
            b.iter_batched(
                || prepared(name),
                |mut s| black_box(pass(&mut s)),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, placement);
criterion_main!(benches);
