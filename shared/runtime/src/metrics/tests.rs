use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;

use super::*;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Consumer {
    consumer: String,
}

fn consumer(name: &str) -> Consumer {
    Consumer {
        consumer: name.into(),
    }
}

/// The sample lines of `text` for the series `name{labels}`, as numbers.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

#[test]
fn encoded_families_carry_the_prefix_their_type_and_prometheus_suffixes() {
    let handled: Family<Consumer, Counter> = register(
        "test_encoded_messages",
        "Messages handled",
        Family::default(),
    );
    let pending: Family<Consumer, Gauge> = register(
        "test_encoded_pending",
        "Messages pending",
        Family::default(),
    );
    let pass: Family<Consumer, Histogram, fn() -> Histogram> = register_with_unit(
        "test_encoded_pass_duration",
        "How long a pass took",
        Unit::Seconds,
        Family::new_with_constructor(|| Histogram::new([0.001, 0.01, 0.1])),
    );
    handled
        .get_or_create(&consumer("inventory-fleet"))
        .inc_by(3);
    pending.get_or_create(&consumer("inventory-fleet")).set(7);
    pass.get_or_create(&consumer("p")).observe(0.005);

    let text = encode();
    for line in [
        "# TYPE allot_test_encoded_messages_total counter",
        "# HELP allot_test_encoded_messages_total Messages handled.",
        "# TYPE allot_test_encoded_pending gauge",
        "# TYPE allot_test_encoded_pass_duration_seconds histogram",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    let series = |s: &str| sample(&text, s);
    assert_eq!(
        series("allot_test_encoded_messages_total{consumer=\"inventory-fleet\"}"),
        Some(3.0)
    );
    assert_eq!(
        series("allot_test_encoded_pending{consumer=\"inventory-fleet\"}"),
        Some(7.0)
    );
    assert_eq!(
        series("allot_test_encoded_pass_duration_seconds_bucket{le=\"0.01\",consumer=\"p\"}")
            .or_else(|| series(
                "allot_test_encoded_pass_duration_seconds_bucket{consumer=\"p\",le=\"0.01\"}"
            )),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series("allot_test_encoded_pass_duration_seconds_count{consumer=\"p\"}"),
        Some(1.0)
    );
}

#[test]
fn registering_a_name_again_returns_the_family_registered_first() {
    // Two services in one process (allot up, or tests) each register the consumer families;
    // the second registration must neither panic nor split the series.
    let first: Family<Consumer, Counter> =
        register("test_twice_messages", "Messages handled", Family::default());
    let second: Family<Consumer, Counter> =
        register("test_twice_messages", "Messages handled", Family::default());
    first.get_or_create(&consumer("billing")).inc();
    second
        .get_or_create(&consumer("planner-workloads"))
        .inc_by(2);
    second.get_or_create(&consumer("billing")).inc();

    let text = encode();
    let types = text
        .lines()
        .filter(|l| *l == "# TYPE allot_test_twice_messages_total counter")
        .count();
    assert_eq!(types, 1, "{text}");
    assert_eq!(
        sample(
            &text,
            "allot_test_twice_messages_total{consumer=\"billing\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            "allot_test_twice_messages_total{consumer=\"planner-workloads\"}"
        ),
        Some(2.0)
    );
}

#[test]
#[should_panic(expected = "registered twice with different types")]
fn one_name_with_two_types_is_a_bug_caught_at_registration() {
    let _: Family<Consumer, Counter> = register("test_clash", "A counter", Family::default());
    let _: Family<Consumer, Gauge> = register("test_clash", "A gauge", Family::default());
}
