use super::{gpu_models, millis_from_seconds};

#[test]
fn seconds_become_rounded_milliseconds() {
    struct Case {
        name: &'static str,
        seconds: f64,
        want: Result<u64, ()>,
    }
    let cases = [
        Case {
            name: "whole seconds as Philly writes them",
            seconds: 66.0,
            want: Ok(66_000),
        },
        Case {
            name: "a fraction is kept to the millisecond",
            seconds: 1.2345,
            want: Ok(1_235),
        },
        Case {
            name: "half a millisecond rounds up",
            seconds: 0.0005,
            want: Ok(1),
        },
        Case {
            name: "zero",
            seconds: 0.0,
            want: Ok(0),
        },
        Case {
            name: "negative zero is zero",
            seconds: -0.0,
            want: Ok(0),
        },
        Case {
            name: "negative",
            seconds: -1.0,
            want: Err(()),
        },
        Case {
            name: "not a number",
            seconds: f64::NAN,
            want: Err(()),
        },
        Case {
            name: "infinite",
            seconds: f64::INFINITY,
            want: Err(()),
        },
        Case {
            name: "beyond u64 milliseconds",
            seconds: 1e17,
            want: Err(()),
        },
    ];
    for case in cases {
        let got = millis_from_seconds(case.seconds).map_err(|_| ());
        assert_eq!(got, case.want, "{}", case.name);
    }
}

#[test]
fn gpu_model_lists_split_on_bars_and_nan_means_any() {
    let cases: [(&str, &[&str]); 5] = [
        ("", &[]),
        ("nan", &[]),
        ("T4", &["T4"]),
        ("V100M16|V100M32", &["V100M16", "V100M32"]),
        (" A10 | | T4 ", &["A10", "T4"]),
    ];
    for (field, want) in cases {
        assert_eq!(gpu_models(field), want, "{field:?}");
    }
}
