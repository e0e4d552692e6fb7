//! One prediction (features from the recency history, then the model) and one training, on a
//! generated history of 20,000 finished runs: `cargo bench -p allot-predict`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};

use allot_predict::{Job, Predictor, TrainParams};

/// A predictor that has seen `n` runs of 8 teams × 4 sizes finish, and trained on them.
fn trained(n: u64) -> (Predictor, Job) {
    let mut p = Predictor::new(TrainParams::default());
    let job = |i: u64| Job {
        team: format!("team-{}", i % 8),
        identity: None,
        gpus: 1 << (i % 4),
        gpu_milli: 1000,
        submit_ms: i * 60_000,
        declared_ms: None,
    };
    for i in 0..n {
        p.submitted(i, &job(i));
        if i >= 10 {
            // Runs of 10 minutes to 3 hours, by team and size, finishing in submission order.
            p.finished(
                i - 10,
                &job(i - 10),
                600_000 * (1 + (i % 8) * (1 + i % 4) / 2),
            );
        }
    }
    p.retrain();
    (p, job(n))
}

fn bench(c: &mut Criterion) {
    let (predictor, next) = trained(20_000);
    c.bench_function("predict one task (features + model)", |b| {
        b.iter(|| black_box(predictor.predict(black_box(&next))))
    });
    let mut group = c.benchmark_group("train");
    group.sample_size(10);
    group.bench_function("train on 20,000 finished runs", |b| {
        b.iter_batched(
            || trained(20_000).0,
            |mut p| black_box(p.retrain()),
            criterion::BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
