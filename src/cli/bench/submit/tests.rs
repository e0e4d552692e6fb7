use super::Percentiles;

#[test]
fn percentiles_are_nearest_rank_values_of_the_samples() {
    for (name, samples, want_p50, want_p99, want_max) in [
        ("one sample is every percentile", vec![4.0], 4.0, 4.0, 4.0),
        (
            "a hundred samples: p99 is the 99th smallest",
            (1..=100).rev().map(f64::from).collect(),
            50.0,
            99.0,
            100.0,
        ),
        (
            "ten samples: p99 rounds up to the largest",
            (1..=10).map(f64::from).collect(),
            5.0,
            10.0,
            10.0,
        ),
    ] {
        let p = Percentiles::of(samples);
        assert_eq!(
            (p.p50, p.p99, p.max),
            (want_p50, want_p99, want_max),
            "{name}"
        );
    }
    assert!(
        Percentiles::of(Vec::new()).p99.is_nan(),
        "no samples: no numbers"
    );
}
