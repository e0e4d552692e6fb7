use std::time::Duration;

use allot_events::telemetry::GpuSample;

use super::*;
use crate::sim::{SimSpec, SimulatedSource};
use crate::source::GpuSource;

fn injection(kind: InjectKind, node: &str, at_s: u64) -> Injection {
    Injection {
        kind,
        node: node.to_owned(),
        at: Duration::from_secs(at_s),
    }
}

/// A simulated node of `gpus` × `model`, seed 7.
fn sim(name: &str, gpus: u32, model: GpuModel) -> SimulatedSource {
    SimulatedSource::new(
        name,
        SimSpec {
            gpus,
            model,
            seed: 7,
            ..SimSpec::default()
        },
    )
}

/// Nodes `node-1` … `node-N`, all of `model`.
fn cluster(nodes: u32, model: GpuModel) -> BTreeMap<String, GpuModel> {
    (1..=nodes).map(|i| (format!("node-{i}"), model)).collect()
}

#[test]
fn injections_parse_as_kind_node_and_time_after_the_start() {
    for (given, want) in [
        (
            "overheat:node-1@30s",
            injection(InjectKind::Overheat, "node-1", 30),
        ),
        ("spike:node-2@0s", injection(InjectKind::Spike, "node-2", 0)),
        (
            "xid79:node-3@2m",
            injection(InjectKind::Xid(79), "node-3", 120),
        ),
        (
            "XID13:node-1@1m 30s",
            injection(InjectKind::Xid(13), "node-1", 90),
        ),
        ("ecc:node-1@5s", injection(InjectKind::Ecc, "node-1", 5)),
        (
            " power:node-1@5s ",
            injection(InjectKind::Power, "node-1", 5),
        ),
        (
            "partition:node-4@1h",
            injection(InjectKind::Partition, "node-4", 3600),
        ),
        ("idle:node-1@10s", injection(InjectKind::Idle, "node-1", 10)),
        (
            "rowremap:node-1@10s",
            injection(InjectKind::RowRemap, "node-1", 10),
        ),
        (
            "nvlink:node-1@10s",
            injection(InjectKind::NvLink, "node-1", 10),
        ),
    ] {
        let parsed = given.parse::<Injection>();
        assert_eq!(parsed.as_ref(), Ok(&want), "{given:?}");
        assert_eq!(
            want.to_string().parse::<Injection>(),
            Ok(want.clone()),
            "{given:?} written back as {want} parses again"
        );
    }
    assert_eq!(
        injection(InjectKind::Xid(48), "node-2", 90).to_string(),
        "xid48:node-2@1m 30s"
    );
}

#[test]
fn a_bad_injection_names_everything_wrong_with_it() {
    struct Case {
        given: &'static str,
        want_problems: Vec<InjectionProblem>,
        want_in_message: &'static [&'static str],
    }
    for case in [
        Case {
            given: "overheat",
            want_problems: vec![InjectionProblem::MissingColon],
            want_in_message: &["\"overheat\"", "no ':'", "KIND:NODE@TIME"],
        },
        Case {
            given: "overheat:node-1",
            want_problems: vec![InjectionProblem::MissingAt],
            want_in_message: &["\"overheat:node-1\"", "no '@'", "KIND:NODE@TIME"],
        },
        Case {
            given: "overheet:node-1@30s",
            want_problems: vec![InjectionProblem::UnknownKind {
                kind: "overheet".into(),
            }],
            want_in_message: &[
                "unknown kind \"overheet\"",
                "overheat, spike, xid<N> (e.g. xid79), ecc, power, partition, idle, rowremap, \
                 nvlink",
            ],
        },
        Case {
            given: "xid:node-1@30s",
            want_problems: vec![InjectionProblem::BadXid { kind: "xid".into() }],
            want_in_message: &["\"xid\" is not an XID", "e.g. xid79"],
        },
        Case {
            given: "xid-5:node-1@30s",
            want_problems: vec![InjectionProblem::BadXid {
                kind: "xid-5".into(),
            }],
            want_in_message: &["\"xid-5\" is not an XID"],
        },
        Case {
            given: "ecc:@30s",
            want_problems: vec![InjectionProblem::MissingNode],
            want_in_message: &["no node between ':' and '@'"],
        },
        Case {
            given: "ecc:node-1@soon",
            want_problems: vec![InjectionProblem::BadTime {
                time: "soon".into(),
                reason: humantime::parse_duration("soon").unwrap_err().to_string(),
            }],
            want_in_message: &["bad time \"soon\"", "e.g. 0s, 30s, 2m"],
        },
        Case {
            given: "fire:@later",
            want_problems: vec![
                InjectionProblem::UnknownKind {
                    kind: "fire".into(),
                },
                InjectionProblem::MissingNode,
                InjectionProblem::BadTime {
                    time: "later".into(),
                    reason: humantime::parse_duration("later").unwrap_err().to_string(),
                },
            ],
            want_in_message: &["\"fire\"", "no node", "bad time \"later\""],
        },
    ] {
        let error = case.given.parse::<Injection>().unwrap_err();
        assert_eq!(error.given, case.given);
        assert_eq!(error.problems, case.want_problems, "{:?}", case.given);
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("injection {:?}: ", case.given)),
            "{message}"
        );
        for want in case.want_in_message {
            assert!(message.contains(want), "{:?}: {message}", case.given);
        }
    }
}

#[test]
fn a_schedule_is_checked_against_the_cluster_with_every_problem_at_once() {
    let mut nodes = cluster(2, GpuModel::H100);
    nodes.insert("node-3".into(), GpuModel::L4);
    nodes.insert("node-4".into(), GpuModel::T4);
    let schedule = [
        injection(InjectKind::Overheat, "node-1", 10),
        injection(InjectKind::Xid(79), "node-9", 20),
        injection(InjectKind::NvLink, "node-3", 30),
        injection(InjectKind::RowRemap, "node-4", 40),
        injection(InjectKind::RowRemap, "node-3", 40),
        injection(InjectKind::Partition, "gpu-1", 50),
    ];
    let error = check(&schedule, &nodes).unwrap_err();
    let messages: Vec<String> = error.0.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "injection \"xid79:node-9@20s\": no simulated node \"node-9\" (the nodes are node-1, \
             node-2, node-3, node-4)",
            "injection \"nvlink:node-3@30s\": node-3's L4 GPUs have no NVLink",
            "injection \"rowremap:node-4@40s\": node-4's T4 GPUs have no row remapping",
            "injection \"partition:gpu-1@50s\": no simulated node \"gpu-1\" (the nodes are node-1, \
             node-2, node-3, node-4)",
        ]
    );
    assert_eq!(check(&schedule[..1], &nodes), Ok(()));
    assert_eq!(check(&[], &BTreeMap::new()), Ok(()));
}

#[test]
fn a_large_cluster_is_named_in_short() {
    let error = check(
        &[injection(InjectKind::Ecc, "node-0", 0)],
        &cluster(2000, GpuModel::H100),
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("(the nodes are node-1, node-10, …, node-999 (2000 nodes))"),
        "{error}"
    );
    let none = check(&[injection(InjectKind::Ecc, "node-1", 0)], &BTreeMap::new()).unwrap_err();
    assert!(none.to_string().contains("(the nodes are none)"), "{none}");
}

#[test]
fn each_kind_does_to_the_node_what_it_says() {
    struct Case {
        kind: InjectKind,
        /// The node's next two samples (GPU 0 and 1 of 2; both busy with a run).
        want: fn(&[GpuSample], &[GpuSample]),
        want_partitioned: bool,
    }
    for case in [
        Case {
            kind: InjectKind::Overheat,
            want: |next, after| {
                for s in next.iter().chain(after) {
                    assert!(s.temperature_c > s.slowdown_temperature_c, "{s:?}");
                }
            },
            want_partitioned: false,
        },
        Case {
            kind: InjectKind::Spike,
            want: |next, after| {
                assert!(next[0].temperature_c > next[0].slowdown_temperature_c);
                assert!(next[1].temperature_c < next[1].slowdown_temperature_c);
                assert!(after[0].temperature_c < after[0].slowdown_temperature_c);
            },
            want_partitioned: false,
        },
        Case {
            kind: InjectKind::Xid(79),
            want: |next, after| {
                assert_eq!(
                    (next[0].xids.as_slice(), next[0].last_xid),
                    (&[79][..], Some(79))
                );
                assert!(after[0].xids.is_empty() && next[1].xids.is_empty());
            },
            want_partitioned: false,
        },
        Case {
            kind: InjectKind::Ecc,
            want: |next, after| {
                assert_eq!(next[0].ecc_uncorrected, Some(1));
                assert_eq!(after[0].ecc_uncorrected, Some(1), "the count stays");
                assert_eq!(next[1].ecc_uncorrected, Some(0));
            },
            want_partitioned: false,
        },
        Case {
            kind: InjectKind::Power,
            want: |next, after| {
                for s in [&next[0], &after[0]] {
                    assert!(s.power_mw > s.power_limit_mw, "{s:?}");
                }
                assert!(next[1].power_mw <= next[1].power_limit_mw);
            },
            want_partitioned: false,
        },
        Case {
            kind: InjectKind::RowRemap,
            want: |next, after| {
                assert_eq!(next[0].row_remap_failed, Some(true));
                assert_eq!(after[0].row_remap_failed, Some(true));
                assert_eq!(next[1].row_remap_failed, Some(false));
            },
            want_partitioned: false,
        },
        Case {
            kind: InjectKind::NvLink,
            want: |next, _| {
                assert_eq!(next[0].nvlink_errors, Some(NVLINK_ERROR_BURST));
                assert_eq!(next[1].nvlink_errors, Some(0));
            },
            want_partitioned: false,
        },
        Case {
            kind: InjectKind::Idle,
            want: |next, after| {
                for s in next.iter().chain(after) {
                    assert_eq!(s.utilization_pct, Some(0), "{s:?}");
                    assert!(s.memory_used_mib > 0, "the runs still hold memory: {s:?}");
                }
            },
            want_partitioned: false,
        },
        Case {
            kind: InjectKind::Partition,
            want: |next, _| {
                assert!(next.iter().all(|s| s.utilization_pct.unwrap() > 80));
            },
            want_partitioned: true,
        },
    ] {
        let mut source = sim("node-1", 2, GpuModel::H100);
        let load = source.load();
        load.occupy(&BTreeMap::from([(0, 1000), (1, 1000)]));
        apply(case.kind, &load);
        let next = source.sample().unwrap();
        let after = source.sample().unwrap();
        (case.want)(&next, &after);
        assert_eq!(
            load.is_partitioned(),
            case.want_partitioned,
            "{}",
            case.kind
        );
    }
}

#[test]
fn an_injector_refuses_a_schedule_naming_nodes_it_was_not_given() {
    let nodes = BTreeMap::from([("node-1".to_owned(), sim("node-1", 1, GpuModel::T4).load())]);
    let error = Injector::new(
        vec![
            injection(InjectKind::Ecc, "node-2", 0),
            injection(InjectKind::NvLink, "node-1", 0),
        ],
        nodes,
    )
    .unwrap_err();
    assert_eq!(error.0.len(), 2, "{error}");
}

#[tokio::test]
async fn an_injector_applies_each_injection_at_its_time_and_none_after_shutdown() {
    let (mut one, mut two) = (
        sim("node-1", 1, GpuModel::H100),
        sim("node-2", 1, GpuModel::H100),
    );
    let nodes = BTreeMap::from([
        ("node-1".to_owned(), one.load()),
        ("node-2".to_owned(), two.load()),
    ]);
    let schedule = vec![
        // Given out of order: applied by time.
        Injection {
            kind: InjectKind::Partition,
            node: "node-2".into(),
            at: Duration::from_secs(3600),
        },
        Injection {
            kind: InjectKind::Xid(48),
            node: "node-1".into(),
            at: Duration::from_millis(300),
        },
        injection(InjectKind::Ecc, "node-2", 0),
    ];
    let injector = Injector::new(schedule, nodes).unwrap();
    let start = Instant::now();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(injector.run(start, async {
        let _ = stopped.await;
    }));

    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        two.sample().unwrap()[0].ecc_uncorrected,
        Some(1),
        "due at once"
    );
    assert_eq!(one.sample().unwrap()[0].xid_errors, Some(0), "not due yet");
    tokio::time::sleep_until(start + Duration::from_millis(500)).await;
    assert_eq!(one.sample().unwrap()[0].xids, [48], "due at 300 ms");

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(1), running)
        .await
        .expect("the injector returns at shutdown, with injections still pending")
        .unwrap();
    assert!(!two.load().is_partitioned(), "not due before shutdown");
}
