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

/// `json`'s attributes in the order Allot writes them (`type` before `data`), where
/// `serde_json::Value` would sort them (`data` first).
fn in_wire_order(json: &serde_json::Value) -> Vec<u8> {
    const ORDER: [&str; 10] = [
        "specversion",
        "id",
        "source",
        "type",
        "time",
        "subject",
        "datacontenttype",
        "team",
        "traceparent",
        "data",
    ];
    let object = json.as_object().expect("an object");
    let mut keys: Vec<&String> = object.keys().collect();
    keys.sort_by_key(|k| ORDER.iter().position(|o| o == k).unwrap_or(usize::MAX));
    let fields: Vec<String> = keys
        .iter()
        .map(|k| format!("{}:{}", serde_json::json!(k), object[k.as_str()]))
        .collect();
    format!("{{{}}}", fields.join(",")).into_bytes()
}

/// Whether `bytes` are read in one pass (see [`decode`]).
fn one_pass(bytes: &[u8]) -> bool {
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    serde::Deserializer::deserialize_map(&mut reader, OnePass).is_ok()
}

#[test]
fn an_event_is_read_in_one_pass_as_written_and_the_same_with_its_data_first() {
    let sampled = Envelope::new(
        "/allot/collector/node-1",
        crate::telemetry::GpusSampled {
            node: "node-1".into(),
            samples: vec![crate::telemetry::GpuSample {
                index: 0,
                uuid: "GPU-0".into(),
                utilization_pct: Some(93),
                memory_used_mib: 70_000,
                memory_total_mib: 81_559,
                temperature_c: Some(71),
                power_mw: None,
                power_limit_mw: None,
                ecc_corrected: Some(0),
                ecc_uncorrected: Some(0),
                xid_errors: Some(1),
                last_xid: Some(79),
                xids: vec![79],
                slowdown_temperature_c: None,
                throttle_reasons: vec!["sw_power_cap".into()],
                rows_remapped_uncorrectable: None,
                row_remap_failed: None,
                nvlink_errors: None,
            }],
            held: Vec::new(),
        },
    );
    let mut with_subject = heartbeat();
    with_subject.subject = Some("node-1".into());
    with_subject.traceparent =
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
    for event in [heartbeat(), sampled, with_subject] {
        let wire = event.to_json();
        assert!(one_pass(&wire), "{} as written", event.ty);
        assert_eq!(decode(&wire).unwrap(), event);
        let data_first =
            serde_json::to_vec(&serde_json::from_slice::<serde_json::Value>(&wire).unwrap())
                .unwrap();
        assert!(
            !one_pass(&data_first),
            "{}: data first takes the other path",
            event.ty
        );
        assert_eq!(decode(&data_first).unwrap(), event);
    }
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
            name: "a valid event but for a byte that is not UTF-8 inside a string",
            bytes: {
                let json = heartbeat().to_json();
                let at = json
                    .windows(6)
                    .position(|w| w == b"node-1")
                    .expect("the node's name");
                let mut bytes = json;
                bytes[at + 4] = 0xff;
                bytes
            },
            want: |e| matches!(e, DecodeError::Malformed(_)),
            want_message: "invalid unicode",
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
        // The same input with `type` before `data`, as Allot writes events: read in one pass
        // until something is wrong, and then judged exactly as in the order above.
        let reordered = serde_json::from_slice::<serde_json::Value>(&case.bytes)
            .ok()
            .map(|json| in_wire_order(&json));
        for bytes in std::iter::once(&case.bytes).chain(reordered.as_ref()) {
            let err = decode(bytes).expect_err(case.name);
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
}

#[test]
fn an_attribute_given_twice_is_refused_in_either_order() {
    let json: serde_json::Value = serde_json::from_slice(&heartbeat().to_json()).unwrap();
    let wire = String::from_utf8(in_wire_order(&json)).unwrap();
    for attribute in ["type", "source", "data"] {
        let field = format!("{}:{}", serde_json::json!(attribute), json[attribute]);
        // Given again first, and given again last.
        for twice in [
            format!("{{{field},{}", &wire[1..]),
            format!("{},{field}}}", &wire[..wire.len() - 1]),
        ] {
            let err = decode(twice.as_bytes()).expect_err(attribute);
            assert!(
                matches!(err, DecodeError::Malformed(_))
                    && err.to_string().contains("duplicate field"),
                "{attribute}: {err}"
            );
        }
    }
}
