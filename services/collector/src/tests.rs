use super::*;

#[test]
fn every_config_problem_is_reported_at_once() {
    struct Case {
        name: &'static str,
        change: fn(&mut Config),
        want_problems: usize,
        want_in_message: &'static [&'static str],
    }
    for case in [
        Case {
            name: "the defaults are valid",
            change: |_| {},
            want_problems: 0,
            want_in_message: &[],
        },
        Case {
            name: "a node name with a dot",
            change: |c| c.node = "bad.name".to_owned(),
            want_problems: 1,
            want_in_message: &["node name \"bad.name\""],
        },
        Case {
            name: "a wildcard pool, an empty node and a zero heartbeat",
            change: |c| {
                c.node = String::new();
                c.pool = "gpu>".to_owned();
                c.heartbeat_interval = Duration::ZERO;
            },
            want_problems: 3,
            want_in_message: &["node name \"\"", "pool \"gpu>\"", "heartbeat interval"],
        },
        Case {
            name: "a zero telemetry interval",
            change: |c| c.telemetry_interval = Duration::ZERO,
            want_problems: 1,
            want_in_message: &["telemetry interval must be longer than zero"],
        },
    ] {
        let mut config = Config::new("nats://127.0.0.1:4222", "node-1");
        (case.change)(&mut config);
        match config.validate() {
            Ok(()) => assert_eq!(case.want_problems, 0, "{}", case.name),
            Err(InvalidConfig(problems)) => {
                assert_eq!(
                    problems.len(),
                    case.want_problems,
                    "{}: {problems:?}",
                    case.name
                );
                let message = InvalidConfig(problems).to_string();
                for want in case.want_in_message {
                    assert!(message.contains(want), "{}: {message}", case.name);
                }
            }
        }
    }
}

#[test]
fn the_defaults_are_the_documented_ones() {
    let config = Config::new("nats://127.0.0.1:4222", "node-1");
    assert_eq!(config.pool, "default");
    assert_eq!(config.rack, None);
    assert_eq!(config.source, SourceChoice::Auto);
    assert_eq!(config.heartbeat_interval, Duration::from_secs(5));
    assert_eq!(config.telemetry_interval, Duration::from_secs(10));
    assert!(!config.hostname.is_empty());
}
