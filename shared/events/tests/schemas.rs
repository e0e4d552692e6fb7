//! The committed JSON Schemas are the contract: they must match the Rust types, and every event
//! type's sample must validate against its schema with an independent validator.

use std::collections::BTreeSet;
use std::path::PathBuf;

use allot_events::alloc::{Applied, Dispatch, Launch, LeaderElected, NodeGrant, Source};
use allot_events::cost::{BudgetCrossed, BudgetLevel, CostAccrued, CostLine, IdleCost};
use allot_events::inventory::{GpuHealth, GpuHealthChanged, NodeRecovered, NodeUnreachable};
use allot_events::node::{GpuInfo, GpuSourceKind, HeartbeatSent, NodeRegistered};
use allot_events::remediation::{
    Action as RemediationAction, ActionTaken, Affected, Evidence, OperatorCordon,
};
use allot_events::task::{
    RunSpec, StopCause, TaskCancelled, TaskCheckpointed, TaskCompleted, TaskFailed, TaskPredicted,
    TaskPreload, TaskReady, TaskStarted, TaskStopped,
};
use allot_events::telemetry::{GpuHeld, GpuSample, GpusSampled};
use allot_events::workload::{
    AbortOutcome, ApiVersion, Checkpoint, Kind, Metadata, Quantity, Resources, Retry, Task,
    Workload, WorkloadAbortAnswered, WorkloadAborted, WorkloadFinished, WorkloadOutcome,
    WorkloadSpec, WorkloadSubmitted,
};
use allot_events::{AnyEvent, Envelope, schema};
use allot_sched::{DagFacts, LeaseId, TaskId, TaskSpec};

fn schema_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(schema::DIR)
}

/// A two-task workload: a CPU step, then a GPU step that checkpoints.
fn workload() -> Workload {
    let task = |name: &str| Task {
        name: name.into(),
        resources: Resources::default(),
        command: vec!["python".into(), format!("{name}.py")],
        image: None,
        after: Vec::new(),
        gang: None,
        duration_estimate: None,
        deadline: None,
        max_runtime: None,
        retry: None,
        checkpoint: None,
        idle_reclaim: None,
    };
    let prep = Task {
        resources: Resources {
            cpu: Some(Quantity::from("4")),
            memory: Some(Quantity::from("16Gi")),
            ..Resources::default()
        },
        ..task("prep")
    };
    let train = Task {
        resources: Resources {
            gpus: Some(Quantity::from("1")),
            gpu_memory: Some(Quantity::from("40Gi")),
            gpu_models: vec!["H100".into()],
            ..Resources::default()
        },
        image: Some("ghcr.io/acme/train:1.4".into()),
        after: vec!["prep".into()],
        duration_estimate: Some("2h".into()),
        deadline: Some("8h".into()),
        max_runtime: Some("6h".into()),
        retry: Some(Retry {
            max_attempts: 3,
            backoff: Some("30s".into()),
        }),
        checkpoint: Some(Checkpoint {
            supported: true,
            interval: Some("15m".into()),
        }),
        ..task("train")
    };
    Workload {
        api_version: ApiVersion::V1,
        kind: Kind::Workload,
        metadata: Metadata {
            name: "train-eval".into(),
            team: "vision".into(),
            project: Some("detector".into()),
            priority_class: Some("standard".into()),
            labels: [("ci".to_owned(), "true".to_owned())].into(),
        },
        spec: WorkloadSpec {
            tasks: vec![prep, train],
        },
    }
}

/// One realistic sample of every event type.
fn samples() -> Vec<AnyEvent> {
    let at = "2026-11-22T10:00:00Z".parse().unwrap();
    vec![
        NodeRegistered {
            node: "node-1".into(),
            hostname: "gpu-host-01".into(),
            pool: "default".into(),
            rack: Some("rack-a".into()),
            cpu_milli: 96_000,
            memory_mib: 1_048_576,
            gpu_source: GpuSourceKind::Simulated,
            driver_version: Some("550.54.15".into()),
            gpus: vec![GpuInfo {
                index: 0,
                uuid: "GPU-3f2a".into(),
                model: "H100".into(),
                memory_total_mib: 81_559,
                power_limit_mw: Some(700_000),
                nvlink_peers: vec![1, 2, 3],
            }],
        }
        .into(),
        HeartbeatSent {
            node: "node-1".into(),
            seq: 3,
            uptime_s: 15,
        }
        .into(),
        GpusSampled {
            node: "node-1".into(),
            held: vec![GpuHeld {
                index: 0,
                lease: LeaseId(5),
                workload: "train-eval-3f9a2c71d0".into(),
                task: "train".into(),
                team: "vision".into(),
                milli: 1000,
                no_idle_reclaim: true,
            }],
            samples: vec![GpuSample {
                index: 0,
                uuid: "GPU-3f2a".into(),
                utilization_pct: Some(87),
                memory_used_mib: 40_000,
                memory_total_mib: 81_559,
                temperature_c: Some(64),
                power_mw: Some(512_000),
                power_limit_mw: Some(700_000),
                ecc_corrected: Some(0),
                ecc_uncorrected: None,
                xid_errors: Some(2),
                last_xid: Some(79),
                xids: vec![48, 79],
                slowdown_temperature_c: Some(87),
                throttle_reasons: vec!["sw_power_cap".into()],
                rows_remapped_uncorrectable: Some(1),
                row_remap_failed: Some(false),
                nvlink_errors: Some(0),
            }],
        }
        .into(),
        NodeUnreachable {
            node: "node-1".into(),
            last_heartbeat_at: at,
            missed_heartbeats: 3,
        }
        .into(),
        NodeRecovered {
            node: "node-1".into(),
            last_heartbeat_at: at,
        }
        .into(),
        GpuHealthChanged {
            node: "node-1".into(),
            gpu_uuid: "GPU-3f2a".into(),
            index: 0,
            from: GpuHealth::Healthy,
            to: GpuHealth::Unhealthy,
            reason: "uncorrected ECC errors rose from 0 to 2".into(),
        }
        .into(),
        WorkloadSubmitted {
            workload_id: "train-eval-3f9a2c71d0".into(),
            idempotency_key: "3f9a2c71d0e4".into(),
            run_id: Some("ci-1842".into()),
            submitter: "ci@build-7".into(),
            spec: workload(),
        }
        .into(),
        WorkloadAborted {
            workload_id: "train-eval-3f9a2c71d0".into(),
            team: "vision".into(),
            task: Some("train".into()),
            reason: "wrong learning rate".into(),
            by: "alice".into(),
        }
        .into(),
        WorkloadFinished {
            workload_id: "train-eval-3f9a2c71d0".into(),
            team: "vision".into(),
            outcome: WorkloadOutcome::Failed,
            reason: Some("task train failed after 3 attempts: exit status 3".into()),
        }
        .into(),
        WorkloadAbortAnswered {
            abort: "0192f0c4-0000-7000-8000-00000000000f".into(),
            workload_id: "train-eval-3f9a2c71d0".into(),
            team: "vision".into(),
            task: Some("train".into()),
            outcome: AbortOutcome::Refused,
            detail: "workload train-eval-3f9a2c71d0 has no task train".into(),
        }
        .into(),
        TaskReady {
            pool: "default".into(),
            workload: "train-eval-3f9a2c71d0".into(),
            name: "train".into(),
            task: train_task(),
            run: run_spec(),
        }
        .into(),
        TaskPreload {
            pool: "default".into(),
            workload: "train-eval-3f9a2c71d0".into(),
            name: "train".into(),
            task: train_task(),
            expected_at: 1_795_000_000_000,
        }
        .into(),
        TaskStarted {
            pool: "default".into(),
            task: TaskId(7),
            node: "node-1".into(),
            lease: LeaseId(5),
            workload: "train-eval-3f9a2c71d0".into(),
            name: "train".into(),
            how: "process 4242".into(),
            log: Some("/var/lib/allot/logs/train-eval-3f9a2c71d0/train-1.log".into()),
        }
        .into(),
        TaskStopped {
            pool: "default".into(),
            task: TaskId(7),
            node: "node-1".into(),
            cause: StopCause::Preempted,
            checkpointed: true,
            killed: false,
            ran_ms: 1_800_000,
            lease: Some(LeaseId(5)),
        }
        .into(),
        TaskCheckpointed {
            pool: "default".into(),
            task: TaskId(7),
            node: "node-1".into(),
            lease: LeaseId(3),
        }
        .into(),
        TaskCompleted {
            pool: "default".into(),
            task: TaskId(7),
            node: "node-1".into(),
            lease: LeaseId(3),
        }
        .into(),
        TaskFailed {
            pool: "default".into(),
            task: TaskId(7),
            node: "node-1".into(),
            lease: LeaseId(3),
            reason: "exit status 3".into(),
        }
        .into(),
        TaskCancelled {
            pool: "default".into(),
            task: TaskId(8),
            workload: "train-eval-3f9a2c71d0".into(),
            name: "eval".into(),
            reason: "aborted by alice: wrong learning rate".into(),
        }
        .into(),
        TaskPredicted {
            pool: "default".into(),
            task: TaskId(7),
            workload: "train-eval-3f9a2c71d0".into(),
            name: "train".into(),
            duration_ms: 1_800_000,
            p10_ms: 900_000,
            p90_ms: 5_400_000,
            model_version: Some(3),
            basis: allot_predict::Basis::TeamGpus,
            right_size: Some(allot_predict::rightsize::Recommendation {
                model: "L4".into(),
                gpus: 1,
                gpu_milli: 250,
                gpu_memory_mib: 9_011,
                runs: 10,
                micros_per_hour: 137_500,
                requested_micros_per_hour: Some(2_900_000),
            }),
        }
        .into(),
        CostAccrued {
            team: "vision".into(),
            workload: "train-eval-3f9a2c71d0".into(),
            task_name: "train".into(),
            task: TaskId(7),
            pool: "default".into(),
            lease: LeaseId(5),
            from_ms: 1_795_000_000_000,
            to_ms: 1_795_000_060_000,
            last: false,
            currency: "EUR".into(),
            lines: vec![CostLine {
                resource: "gpu:H100".into(),
                quantity: 2000,
                unit: "milli-GPU".into(),
                unit_price: 2_500_000,
                amount: 83_333,
                unpriced: false,
            }],
            amount: 83_333,
            idle: Some(IdleCost {
                samples: 12,
                idle_samples: 3,
                gpu_amount: 333_332,
                amount: 83_333,
            }),
        }
        .into(),
        BudgetCrossed {
            team: "vision".into(),
            period: "2026-11".into(),
            level: BudgetLevel::Warning,
            spent: 8_000_000_000,
            budget: 10_000_000_000,
            currency: "EUR".into(),
            block_below: Some(100),
        }
        .into(),
        ActionTaken {
            node: "gpu-node-3".into(),
            gpu: None,
            action: RemediationAction::Drain,
            rule: "overheat".into(),
            reason: "2 GPUs within 3 °C of slowdown for 10 s".into(),
            evidence: vec![Evidence {
                signal: "thermal_margin_c".into(),
                gpu: Some(0),
                value: 1.0,
                threshold: Some(3.0),
                at,
            }],
            since: at,
            tasks: vec![Affected {
                lease: allot_sched::LeaseId(12),
                workload: "train-0123456789".into(),
                task: "train".into(),
                team: "vision".into(),
            }],
            team: None,
            downgraded: None,
        }
        .into(),
        OperatorCordon {
            node: "gpu-node-3".into(),
            cordoned: true,
            drain: false,
            reason: "fan replacement".into(),
            by: "admin".into(),
        }
        .into(),
        allot_events::access::TokenIssued {
            token_id: "9815b06ea193".into(),
            sha256: "9815b06ea193".repeat(5) + "abcd",
            team: "vision".into(),
            role: allot_events::access::TokenRole::Member,
            by: "admin".into(),
            description: "CI of the detector repo".into(),
            expires: Some(chrono::Utc::now()),
        }
        .into(),
        allot_events::access::TokenRevoked {
            token_id: "9815b06ea193".into(),
            team: "vision".into(),
            by: "admin".into(),
        }
        .into(),
        LeaderElected {
            pool: "default".into(),
            leader: "allocator-0192".into(),
            policy: "allot".into(),
            format: allot_sched::journal::FORMAT.into(),
            entries: 42,
        }
        .into(),
        Applied {
            pool: "default".into(),
            source: Some(Source {
                stream: "WORKLOADS".into(),
                sequence: 9,
            }),
            entry: journal_entry(),
            launch: None,
            dispatch: vec![Dispatch {
                task: TaskId(7),
                lease: LeaseId(5),
                launch: Launch {
                    workload: "train-eval-3f9a2c71d0".into(),
                    name: "train".into(),
                    team: "vision".into(),
                    run: run_spec(),
                },
                nodes: vec![NodeGrant {
                    node: "node-1".into(),
                    gpu_model: "H100".into(),
                    gpus: vec![(0, 1000), (1, 1000)],
                    mig: None,
                    cpu_milli: 16_000,
                    memory_mib: 65_536,
                }],
            }],
        }
        .into(),
    ]
}

/// A 4-GPU gang member with every optional field set.
fn train_task() -> TaskSpec {
    let mut t = TaskSpec::new(7, "vision", 4).in_gang("train", 2);
    t.priority = 100;
    t.gpu_models = vec!["H100".into()];
    t.cpu_milli = 16_000;
    t.memory_mib = 65_536;
    t.gpu_memory_mib = 40_960;
    t.dag = DagFacts {
        dependents: 1,
        critical_path_rank: 2,
    };
    t.predicted_duration = Some(7_200_000);
    t.checkpoint_every = Some(900_000);
    t.max_runtime = Some(21_600_000);
    t
}

/// How the training step runs.
fn run_spec() -> RunSpec {
    RunSpec {
        attempt: 1,
        command: vec!["torchrun".into(), "train.py".into()],
        image: Some("registry.example.com/vision/train:1.4".into()),
        duration_ms: Some(7_200_000),
        checkpoint: true,
        checkpoint_every_ms: Some(900_000),
        max_runtime_ms: Some(21_600_000),
        no_idle_reclaim: true,
    }
}

/// A pass that granted, preempted and made one wait.
fn journal_entry() -> allot_sched::journal::Entry {
    use allot_sched::cluster::{NodeShare, Placement};
    use allot_sched::{Decision, Input, LeaseId, NodeIdx, WaitReason};
    allot_sched::journal::Entry {
        seq: 12,
        input: Input::Schedule { at: 1_000 },
        decisions: vec![
            Decision::Preempted {
                task: TaskId(3),
                lease: LeaseId(2),
                at: 1_000,
                for_task: Some(TaskId(7)),
                lost: 60_000,
                reason: "allot: task-7 has priority 100 over 0".into(),
            },
            Decision::Granted {
                task: TaskId(7),
                lease: LeaseId(5),
                placement: Placement {
                    shares: vec![NodeShare {
                        node: NodeIdx(0),
                        gpus: vec![(0, 1000), (1, 1000)],
                        gpu_memory_mib: 81_559,
                        mig: None,
                        cpu_milli: 16_000,
                        memory_mib: 65_536,
                    }],
                },
                at: 1_000,
                reason: "allot: first in the queue's order that fits".into(),
            },
            Decision::Waiting {
                task: TaskId(8),
                reason: WaitReason::Quota {
                    why: "team vision is at its nominal GPU quota".into(),
                },
                eta: None,
                at_risk: false,
                at: 1_000,
            },
        ],
        rejected: None,
    }
}

#[test]
fn committed_schemas_match_the_rust_types() {
    let dir = schema_dir();
    if std::env::var_os("ALLOT_UPDATE_SCHEMAS").is_some() {
        schema::write_all(&dir).unwrap();
    }
    let generated = schema::all();
    let mut stale = Vec::new();
    for (ty, schema) in &generated {
        let path = dir.join(schema::file_name(ty));
        match std::fs::read_to_string(&path) {
            Ok(committed) if committed == schema::render(schema) => {}
            Ok(_) => stale.push(format!("{} differs from the Rust type", path.display())),
            Err(_) => stale.push(format!("{} is missing", path.display())),
        }
    }
    let expected: BTreeSet<String> = generated
        .iter()
        .map(|(t, _)| schema::file_name(t))
        .collect();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if !expected.contains(&name) {
            stale.push(format!("{name} has no event type any more"));
        }
    }
    assert!(
        stale.is_empty(),
        "schemas/ is stale; regenerate with `cargo run -- schemas`:\n  {}",
        stale.join("\n  ")
    );
}

#[test]
fn the_committed_workload_spec_schema_matches_the_rust_types_and_accepts_a_sample() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(schema::WORKLOAD_SPEC_FILE);
    let generated = schema::workload_spec();
    if std::env::var_os("ALLOT_UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, schema::render(&generated)).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == schema::render(&generated),
        "{} is stale; regenerate with `cargo run -- schemas`",
        path.display()
    );

    let validator = jsonschema::validator_for(&generated).unwrap();
    let mut instance = serde_json::to_value(workload()).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&instance)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    instance["spec"]["tasks"][1]["resources"]["gpu"] = 4.into();
    assert!(
        !validator.is_valid(&instance),
        "unknown fields are rejected"
    );
}

#[test]
fn every_event_type_has_a_sample_that_validates_against_its_committed_schema() {
    let samples = samples();
    let sampled: BTreeSet<String> = samples.iter().map(event_type).collect();
    let all: BTreeSet<String> = schema::all().into_iter().map(|(t, _)| t).collect();
    assert_eq!(sampled, all, "every event type needs a sample here");

    for event in samples {
        let envelope = Envelope::new("/allot/test", event);
        let path = schema_dir().join(schema::file_name(&envelope.ty));
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let instance: serde_json::Value = serde_json::from_slice(&envelope.to_json()).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", envelope.ty);
        assert_eq!(
            allot_events::decode(&envelope.to_json()).unwrap(),
            envelope,
            "{} reads back as written",
            envelope.ty
        );
    }
}

#[test]
fn a_schema_rejects_an_event_of_another_type_or_with_a_broken_payload() {
    let envelope = Envelope::new(
        "/allot/test",
        HeartbeatSent {
            node: "node-1".into(),
            seq: 1,
            uptime_s: 1,
        },
    );
    let schema_of = |ty: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(schema_dir().join(schema::file_name(ty))).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let mut instance: serde_json::Value = serde_json::from_slice(&envelope.to_json()).unwrap();

    let registered = jsonschema::validator_for(&schema_of("io.allot.node.v1.registered")).unwrap();
    assert!(!registered.is_valid(&instance), "type is pinned per schema");

    let heartbeat =
        jsonschema::validator_for(&schema_of("io.allot.node.v1.heartbeat_sent")).unwrap();
    assert!(heartbeat.is_valid(&instance));
    instance["data"]["seq"] = "one".into();
    assert!(!heartbeat.is_valid(&instance), "payload fields are typed");
}

fn event_type(event: &AnyEvent) -> String {
    use allot_events::EventKind;
    event.event_type()
}
