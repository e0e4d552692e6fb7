use super::*;
use crate::node::HeartbeatSent;

fn heartbeat() -> Envelope {
    Envelope::new(
        "/allot/collector/node-1",
        HeartbeatSent {
            node: "node-1".into(),
            seq: 7,
            uptime_s: 35,
        },
    )
}

/// The same event with one top-level attribute replaced.
fn with(attr: &str, value: serde_json::Value) -> Vec<u8> {
    let mut json: serde_json::Value = serde_json::from_slice(&heartbeat().to_json()).unwrap();
    json[attr] = value;
    serde_json::to_vec(&json).unwrap()
}

#[test]
fn an_event_survives_the_wire_unchanged() {
    let event = heartbeat();
    let decoded = decode(&event.to_json()).unwrap();
    assert_eq!(decoded, event);
    assert_eq!(decoded.ty, "io.allot.node.v1.heartbeat_sent");
    assert_eq!(decoded.nats_subject(), "allot.node.heartbeat.node-1");
    assert_eq!(decoded.id.get_version_num(), 7, "ids are UUIDv7");
}

#[test]
fn events_created_later_sort_after_earlier_ones_by_id() {
    let first = heartbeat();
    let second = heartbeat();
    assert!(first.id < second.id);
}

#[test]
fn bad_input_decodes_to_a_typed_error_naming_the_problem() {
    struct Case {
        name: &'static str,
        bytes: Vec<u8>,
        want: fn(&DecodeError) -> bool,
        want_message: &'static str,
    }
    let cases = [
        Case {
            name: "not JSON at all",
            bytes: b"\x00\xffnot json".to_vec(),
            want: |e| matches!(e, DecodeError::Malformed(_)),
            want_message: "malformed CloudEvent",
        },
        Case {
            name: "truncated JSON",
            bytes: heartbeat().to_json()[..20].to_vec(),
            want: |e| matches!(e, DecodeError::Malformed(_)),
            want_message: "malformed CloudEvent",
        },
        Case {
            name: "JSON without the envelope's required attributes",
            bytes: br#"{"hello":"world"}"#.to_vec(),
            want: |e| matches!(e, DecodeError::Malformed(_)),
            want_message: "missing field",
        },
        Case {
            name: "a type from someone else's namespace",
            bytes: with("type", "com.example.thing.v1.happened".into()),
            want: |e| matches!(e, DecodeError::UnknownType(t) if t == "com.example.thing.v1.happened"),
            want_message: "unknown event type",
        },
        Case {
            name: "an Allot domain this build does not know",
            bytes: with("type", "io.allot.teleport.v1.beamed".into()),
            want: |e| matches!(e, DecodeError::UnknownType(_)),
            want_message: "io.allot.teleport.v1.beamed",
        },
        Case {
            name: "a known domain, unknown event",
            bytes: with("type", "io.allot.node.v1.exploded".into()),
            want: |e| matches!(e, DecodeError::UnknownType(_)),
            want_message: "io.allot.node.v1.exploded",
        },
        Case {
            name: "a newer major version",
            bytes: with("type", "io.allot.node.v2.heartbeat_sent".into()),
            want: |e| {
                matches!(
                    e,
                    DecodeError::UnsupportedVersion {
                        found: 2,
                        supported: 1,
                        ..
                    }
                )
            },
            want_message: "version v2",
        },
        Case {
            name: "another CloudEvents spec version",
            bytes: with("specversion", "0.3".into()),
            want: |e| matches!(e, DecodeError::SpecVersion(v) if v == "0.3"),
            want_message: "specversion",
        },
        Case {
            name: "data that does not match the type's schema",
            bytes: with(
                "data",
                serde_json::json!({"node": "node-1", "seq": "seven"}),
            ),
            want: |e| matches!(e, DecodeError::InvalidData { .. }),
            want_message: "invalid data for io.allot.node.v1.heartbeat_sent",
        },
        Case {
            name: "data with a field the schema does not have",
            bytes: with(
                "data",
                serde_json::json!({"node": "node-1", "seq": 1, "uptime_s": 1, "extra": true}),
            ),
            want: |e| matches!(e, DecodeError::InvalidData { .. }),
            want_message: "unknown field `extra`",
        },
    ];
    for case in cases {
        let err = decode(&case.bytes).expect_err(case.name);
        assert!((case.want)(&err), "{}: got {err:?}", case.name);
        assert!(
            err.to_string().contains(case.want_message),
            "{}: message {:?} should contain {:?}",
            case.name,
            err.to_string(),
            case.want_message
        );
    }
}
