//! The gateway's API through its router (`oneshot`), over read models built by the real
//! projections and a real nats-server to publish to: who may see and do what (every role ×
//! own team / another team × endpoint), errors as RFC 9457 problems, the OpenAPI document, and
//! submissions that publish exactly what `allot submit` would.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use chrono::Utc;
use serde_json::{Value, json};
use tower::ServiceExt;

use allot_bus::consumer::Delivery;
use allot_bus::{catalog, ensure_streams};
use allot_events::access::TokenRole;
use allot_events::alloc::{Applied, Dispatch, Launch, LeaderElected};
use allot_events::cost::CostAccrued;
use allot_events::task::{RunSpec, TaskReady};
use allot_events::{
    AccessEvent, AllocEvent, AnyEvent, CostEvent, Envelope, NodeEvent, TaskEvent, WorkloadEvent,
};
use allot_gateway::api::Bus;
use allot_gateway::mirror::Mirror;
use allot_gateway::token::{Known, sha256_hex};
use allot_gateway::{AppState, app, db::Db, model};
use allot_sched::journal::Entry;
use allot_sched::{Decision, Input, LeaseId, NodeSpec, Scheduler, TaskId, TaskSpec, WaitReason};
use allot_testkit::NatsServer;

fn spec(name: &str, team: &str) -> String {
    format!(
        "apiVersion: allot/v1\nkind: Workload\nmetadata: {{name: {name}, team: {team}}}\n\
         spec:\n  tasks:\n    - {{name: train, command: [\"true\"], resources: {{gpus: 1}}}}\n"
    )
}

struct Seeded {
    _dir: tempfile::TempDir,
    /// The read model's file.
    db: std::path::PathBuf,
    _nats: NatsServer,
    state: AppState,
    client: async_nats::Client,
    /// Workload id per team.
    workloads: Vec<(String, String)>,
}

fn delivery(seq: u64, event: impl Into<AnyEvent>) -> Delivery {
    Delivery::first(seq, Envelope::new("/test", event), Utc::now())
}

/// Two teams' workloads, one waiting task each with its journal entries and a cost, and a
/// token per role for team `vision`.
async fn seeded() -> Seeded {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    ensure_streams(&js, &catalog(1)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.db");
    let conn = allot_store::open(&path, model::MIGRATIONS).unwrap();
    let mut workloads = Vec::new();
    for (i, team) in ["vision", "nlp"].iter().enumerate() {
        let checked = allot_workload::check(
            &spec(&format!("job-{team}"), team),
            allot_workload::Format::Yaml,
            Default::default(),
        )
        .unwrap();
        let key = allot_workload::submit::idempotency_key(&checked.workload, None);
        let s = allot_workload::submit::submission(
            checked.workload,
            key,
            None,
            "ci".into(),
            "/test",
            Utc::now(),
        );
        let AnyEvent::Workload(WorkloadEvent::Submitted(sub)) = s.envelope.data.clone() else {
            unreachable!()
        };
        let id = sub.workload_id.clone();
        let seq = i as u64 * 10;
        model::apply_workloads(&conn, &delivery(seq + 1, WorkloadEvent::Submitted(sub))).unwrap();
        let task = TaskSpec::new(100 + i as u64, *team, 1);
        let ready = TaskReady {
            pool: "default".into(),
            workload: id.clone(),
            name: "train".into(),
            task: task.clone(),
            run: RunSpec::default(),
        };
        model::apply_workloads(&conn, &delivery(seq + 2, TaskEvent::Ready(ready))).unwrap();
        let applied = Applied {
            pool: "default".into(),
            source: None,
            entry: Entry {
                seq: i as u64 + 1,
                input: Input::TaskSubmitted { task, at: 1_000 },
                decisions: vec![Decision::Waiting {
                    task: TaskId(100 + i as u64),
                    reason: WaitReason::NoCapacity {
                        gpus: 1,
                        free_gpus: 0,
                    },
                    eta: None,
                    at_risk: false,
                    at: 1_000,
                }],
                rejected: None,
            },
            launch: Some(Launch {
                workload: id.clone(),
                name: "train".into(),
                team: team.to_string(),
                run: RunSpec::default(),
            }),
            dispatch: vec![],
        };
        model::apply_decisions(&conn, &delivery(seq + 3, AllocEvent::Applied(applied))).unwrap();
        let cost = CostAccrued {
            team: team.to_string(),
            workload: id.clone(),
            task_name: "train".into(),
            task: TaskId(100 + i as u64),
            pool: "default".into(),
            lease: LeaseId(1 + i as u64),
            from_ms: 0,
            to_ms: 60_000,
            last: true,
            currency: "EUR".into(),
            lines: vec![],
            amount: 1_250_000 * (i as i64 + 1),
            idle: None,
        };
        model::apply_costs(&conn, &delivery(seq + 4, CostEvent::Accrued(cost))).unwrap();
        workloads.push((team.to_string(), id));
    }
    // Two 1-GPU nodes, each running one team's task (200: vision, 201: nlp); the tasks above
    // (100, 101) wait behind them.
    for (i, node) in ["node-1", "node-2"].into_iter().enumerate() {
        let registered = serde_json::from_value(json!({"node": node, "hostname": node,
            "pool": "default", "cpu_milli": 64_000, "memory_mib": 262_144,
            "gpu_source": "simulated", "gpus": [{"index": 0, "uuid": format!("GPU-{node}"),
            "model": "H100", "memory_total_mib": 81_559}]}))
        .unwrap();
        model::apply_fleet(
            &conn,
            &delivery(100 + i as u64, NodeEvent::Registered(registered)),
        )
        .unwrap();
    }
    drop(conn);
    let mut mirror = Mirror::default();
    mirror.apply(&AllocEvent::LeaderElected(LeaderElected {
        pool: "default".into(),
        leader: "test".into(),
        policy: "fifo".into(),
        format: allot_sched::journal::FORMAT.into(),
        entries: 0,
    }));
    let mut reference = Scheduler::new(allot_sched::policy::by_name("fifo").unwrap());
    let mut launches = std::collections::HashMap::new();
    let mut inputs = vec![
        Input::NodeAdded(NodeSpec::new("node-1", 1, "H100")),
        Input::NodeAdded(NodeSpec::new("node-2", 1, "H100")),
    ];
    for (id, team, workload) in [
        (200, "vision", "run-vision".to_owned()),
        (201, "nlp", "run-nlp".to_owned()),
        (100, "vision", workloads[0].1.clone()),
        (101, "nlp", workloads[1].1.clone()),
    ] {
        let launch = Launch {
            workload,
            name: "train".into(),
            team: team.into(),
            run: RunSpec::default(),
        };
        launches.insert(TaskId(id), launch);
        inputs.push(Input::TaskSubmitted {
            task: TaskSpec::new(id, team, 1),
            at: 1_000 + id,
        });
        if id == 201 {
            inputs.push(Input::Schedule { at: 1_500 });
        }
    }
    inputs.push(Input::Schedule { at: 2_000 });
    for (seq, input) in inputs.into_iter().enumerate() {
        let launch = match &input {
            Input::TaskSubmitted { task, .. } => launches.get(&task.id).cloned(),
            _ => None,
        };
        let decisions = reference.apply(input.clone()).unwrap();
        let dispatch =
            Dispatch::for_grants(&decisions, reference.cluster(), |t| launches[&t].clone());
        mirror.apply(&AllocEvent::Applied(Applied {
            pool: "default".into(),
            source: None,
            entry: Entry {
                seq: seq as u64 + 1,
                input,
                decisions,
                rejected: None,
            },
            launch,
            dispatch,
        }));
    }
    let state = AppState::new(
        Arc::new(Db::new(path)),
        Arc::new(Mutex::new(mirror)),
        Some(Bus::new(client.clone())),
        None,
    );
    for role in TokenRole::ALL {
        state.add_token(
            sha256_hex(&token(role)),
            Known {
                token_id: format!("t-{role}"),
                team: "vision".into(),
                role,
                expires: None,
                revoked: false,
            },
        );
    }
    state.refresh().await.unwrap();
    Seeded {
        db: dir.path().join("gateway.db"),
        _dir: dir,
        _nats: nats,
        state,
        client,
        workloads,
    }
}

fn token(role: TokenRole) -> String {
    format!("allot_test-{role}")
}

async fn call(
    state: &AppState,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<(&str, String)>,
) -> (StatusCode, String, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = match body {
        Some((ty, b)) => req.header(header::CONTENT_TYPE, ty).body(Body::from(b)),
        None => req.body(Body::empty()),
    }
    .unwrap();
    let resp = app(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let ty = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24)
        .await
        .unwrap();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, ty, value)
}

#[tokio::test]
async fn every_role_sees_and_does_what_it_may_on_its_own_team_and_another() {
    let s = seeded().await;
    let own = &s.workloads[0].1;
    let other = &s.workloads[1].1;
    use TokenRole::*;
    // (role, own-team status, other-team status) per endpoint.
    type Want = [(TokenRole, u16, u16); 4];
    /// Content type, own team's body, other team's body.
    type Bodies<'a> = Option<(&'a str, String, String)>;
    type Case<'a> = (&'a str, &'a str, String, String, Bodies<'a>, Want);
    let cases: Vec<Case> = vec![
        (
            "read a workload",
            "GET",
            format!("/api/v1/workloads/{own}"),
            format!("/api/v1/workloads/{other}"),
            None,
            [
                (Admin, 200, 200),
                (Operator, 200, 200),
                (Member, 200, 404),
                (Viewer, 200, 404),
            ],
        ),
        (
            "explain a task",
            "GET",
            "/api/v1/tasks/100/explain".into(),
            "/api/v1/tasks/task-101/explain".into(),
            None,
            [
                (Admin, 200, 200),
                (Operator, 200, 200),
                (Member, 200, 404),
                (Viewer, 200, 404),
            ],
        ),
        (
            "abort a workload",
            "POST",
            format!("/api/v1/workloads/{own}/abort"),
            format!("/api/v1/workloads/{other}/abort"),
            Some((
                "application/json",
                json!({"reason": "test"}).to_string(),
                json!({"reason": "test"}).to_string(),
            )),
            [
                (Admin, 202, 202),
                (Operator, 202, 202),
                (Member, 202, 404),
                (Viewer, 403, 404),
            ],
        ),
        (
            "submit a workload",
            "POST",
            "/api/v1/workloads".into(),
            "/api/v1/workloads".into(),
            Some((
                "application/yaml",
                spec("fresh", "vision"),
                spec("fresh", "nlp"),
            )),
            [
                (Admin, 201, 201),
                (Operator, 403, 403),
                (Member, 201, 403),
                (Viewer, 403, 403),
            ],
        ),
        (
            "issue a token",
            "POST",
            "/api/v1/tokens".into(),
            "/api/v1/tokens".into(),
            Some((
                "application/json",
                json!({"team": "vision", "role": "viewer"}).to_string(),
                json!({"team": "nlp", "role": "member"}).to_string(),
            )),
            [
                (Admin, 201, 201),
                (Operator, 403, 403),
                (Member, 403, 403),
                (Viewer, 403, 403),
            ],
        ),
    ];
    for (name, method, own_uri, other_uri, body, want) in &cases {
        for (role, want_own, want_other) in want {
            for (which, uri, want, b) in [
                (
                    "own",
                    own_uri,
                    want_own,
                    body.as_ref().map(|b| (b.0, b.1.clone())),
                ),
                (
                    "other",
                    other_uri,
                    want_other,
                    body.as_ref().map(|b| (b.0, b.2.clone())),
                ),
            ] {
                // A fresh submission per try: the second identical one is a duplicate (200).
                let b = b.map(|(ty, text)| {
                    (
                        ty,
                        text.replace("name: fresh", &format!("name: fresh-{role}-{which}")),
                    )
                });
                let (status, ty, problem) =
                    call(&s.state, method, uri, Some(&token(*role)), b).await;
                assert_eq!(
                    status.as_u16(),
                    *want,
                    "{name}, {role} of vision, {which} team's: {problem}"
                );
                if status.is_client_error() {
                    assert_eq!(ty, "application/problem+json", "{name}: {problem}");
                    assert_eq!(problem["status"], *want, "{problem}");
                }
            }
        }
    }
    // Nobody without a token, or with a made-up one.
    for uri in [
        "/api/v1/workloads",
        "/api/v1/queue",
        "/api/v1/nodes",
        "/api/v1/costs",
    ] {
        let (status, ty, _) = call(&s.state, "GET", uri, None, None).await;
        assert_eq!(
            (status.as_u16(), ty.as_str()),
            (401, "application/problem+json"),
            "{uri}"
        );
        let (status, _, _) = call(&s.state, "GET", uri, Some("allot_forged"), None).await;
        assert_eq!(status.as_u16(), 401, "{uri}");
    }
}

#[tokio::test]
async fn listings_show_a_member_only_its_team_and_operators_every_team() {
    let s = seeded().await;
    let teams = |v: &Value, key: &str| -> Vec<String> {
        let mut t: Vec<String> = v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["team"].as_str().unwrap().to_owned())
            .collect();
        t.sort();
        t.dedup();
        t
    };
    // Each filter narrows a listing, alone or with a team's.
    let admin = token(TokenRole::Admin);
    for (uri, want) in [
        ("/api/v1/decisions?task=101", vec![101]),
        ("/api/v1/decisions?task=101&team=nlp", vec![101]),
        ("/api/v1/decisions?task=101&team=vision", vec![]),
        ("/api/v1/decisions?team=vision", vec![100]),
        ("/api/v1/decisions", vec![101, 100]),
    ] {
        let (status, _, v) = call(&s.state, "GET", uri, Some(&admin), None).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {v}");
        let mut tasks: Vec<i64> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["task_id"].as_i64().unwrap())
            .collect();
        tasks.dedup();
        assert_eq!(tasks, want, "{uri}: {v}");
    }
    for (uri, want) in [
        ("/api/v1/workloads?state=running&team=nlp", vec!["nlp"]),
        ("/api/v1/workloads?state=running", vec!["nlp", "vision"]),
        ("/api/v1/workloads?state=succeeded", vec![]),
    ] {
        let (status, _, v) = call(&s.state, "GET", uri, Some(&admin), None).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {v}");
        assert_eq!(teams(&v, "items"), want, "{uri}: {v}");
    }
    for (role, want) in [
        (TokenRole::Member, vec!["vision"]),
        (TokenRole::Viewer, vec!["vision"]),
        (TokenRole::Operator, vec!["nlp", "vision"]),
        (TokenRole::Admin, vec!["nlp", "vision"]),
    ] {
        let t = token(role);
        for (uri, key) in [
            ("/api/v1/workloads", "items"),
            ("/api/v1/decisions", "items"),
            ("/api/v1/costs", "teams"),
            ("/api/v1/queue", "items"),
        ] {
            let (status, _, v) = call(&s.state, "GET", uri, Some(&t), None).await;
            assert_eq!(status, StatusCode::OK, "{uri}: {v}");
            assert_eq!(teams(&v, key), want, "{role} {uri}: {v}");
        }
        // Asking for another team changes nothing for those who see only their own.
        let (_, _, v) = call(
            &s.state,
            "GET",
            "/api/v1/workloads?team=nlp",
            Some(&t),
            None,
        )
        .await;
        let want_asked = if role == TokenRole::Member || role == TokenRole::Viewer {
            vec!["vision"]
        } else {
            vec!["nlp"]
        };
        assert_eq!(teams(&v, "items"), want_asked, "{role}");
        // On the map, another team's work is capacity in use, without its names.
        let (status, _, v) = call(&s.state, "GET", "/api/v1/nodes", Some(&t), None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["total"], 2, "{v}");
        let held: Vec<(Value, Value, u64)> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|n| n["gpus"].as_array().unwrap().clone())
            .flat_map(|g| g["allocations"].as_array().unwrap().clone())
            .map(|a| {
                (
                    a["team"].clone(),
                    a["workload"].clone(),
                    a["milli"].as_u64().unwrap(),
                )
            })
            .collect();
        let mut shown: Vec<String> = held
            .iter()
            .map(|(team, workload, _)| {
                format!(
                    "{}/{}",
                    team.as_str().unwrap_or("-"),
                    workload.as_str().unwrap_or("-")
                )
            })
            .collect();
        shown.sort();
        let want_shown = if role == TokenRole::Member || role == TokenRole::Viewer {
            vec!["-/-", "vision/run-vision"]
        } else {
            vec!["nlp/run-nlp", "vision/run-vision"]
        };
        assert_eq!(shown, want_shown, "{role}: {v}");
        assert!(held.iter().all(|(_, _, milli)| *milli == 1000), "{v}");
    }
    // Costs are the sum of the events, to the micro-unit.
    let nlp_costs = || async {
        let admin = token(TokenRole::Admin);
        call(
            &s.state,
            "GET",
            "/api/v1/costs?team=nlp",
            Some(&admin),
            None,
        )
        .await
        .2
    };
    let v = nlp_costs().await;
    assert_eq!(v["teams"][0]["amount_micros"], 2_500_000, "{v}");
    // Another workload's cost, stored twice (a redelivery): counted once, beside the first.
    let conn = allot_store::open(&s.db, model::MIGRATIONS).unwrap();
    let later = CostAccrued {
        team: "nlp".into(),
        workload: "later".into(),
        task_name: "eval".into(),
        task: TaskId(300),
        pool: "default".into(),
        lease: LeaseId(30),
        from_ms: 0,
        to_ms: 60_000,
        last: true,
        currency: "EUR".into(),
        lines: vec![],
        amount: 333,
        idle: None,
    };
    let once = delivery(900, CostEvent::Accrued(later));
    model::apply_costs(&conn, &once).unwrap();
    let mut again = once.clone();
    again.stream_sequence = 901;
    model::apply_costs(&conn, &again).unwrap();
    drop(conn);
    let v = nlp_costs().await;
    assert_eq!(v["teams"][0]["amount_micros"], 2_500_000 + 333, "{v}");
    assert_eq!(v["teams"][0]["workloads"]["later"], 333, "{v}");
}

#[tokio::test]
async fn errors_are_problems_and_the_openapi_document_covers_every_route() {
    let s = seeded().await;
    let admin = token(TokenRole::Admin);
    let (status, ty, p) = call(
        &s.state,
        "GET",
        "/api/v1/workloads?cursor=zz",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(
        (status.as_u16(), ty.as_str()),
        (400, "application/problem+json")
    );
    assert!(p["detail"].as_str().unwrap().contains("cursor"), "{p}");
    let (status, ty, _) = call(&s.state, "GET", "/api/v1/nope", Some(&admin), None).await;
    assert_eq!(
        (status.as_u16(), ty.as_str()),
        (404, "application/problem+json")
    );
    let (status, _, p) = call(
        &s.state,
        "POST",
        "/api/v1/workloads/x/abort",
        Some(&admin),
        Some(("application/json", "{not json".into())),
    )
    .await;
    assert_eq!(status.as_u16(), 400, "{p}");
    // An abort of a task the workload does not have is refused, not published.
    let own = &s.workloads[0].1;
    let (status, _, p) = call(
        &s.state,
        "POST",
        &format!("/api/v1/workloads/{own}/abort"),
        Some(&admin),
        Some((
            "application/json",
            json!({"reason": "test", "task": "nope"}).to_string(),
        )),
    )
    .await;
    assert_eq!(status.as_u16(), 404, "{p}");
    assert!(
        p["detail"].as_str().unwrap().contains("no task \"nope\""),
        "{p}"
    );
    // Out of the documented range: refused, not clamped or wrapped.
    for (path, word) in [
        ("/api/v1/queue?limit=0", "limit"),
        ("/api/v1/workloads?limit=1001", "limit"),
        ("/api/v1/decisions?task=9223372036854775808", "task"),
    ] {
        let (status, _, p) = call(&s.state, "GET", path, Some(&admin), None).await;
        assert_eq!(status.as_u16(), 400, "{path}: {p}");
        assert!(p["detail"].as_str().unwrap().contains(word), "{path}: {p}");
    }

    let (status, _, doc) = call(&s.state, "GET", "/api/v1/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{doc}");
    let paths: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for p in [
        "/api/v1/workloads",
        "/api/v1/workloads/{id}",
        "/api/v1/workloads/{id}/abort",
        "/api/v1/tasks/{id}/explain",
        "/api/v1/queue",
        "/api/v1/nodes",
        "/api/v1/decisions",
        "/api/v1/costs",
        "/api/v1/budgets",
        "/api/v1/kpis",
        "/api/v1/tokens",
        "/api/v1/events",
        "/api/v1/lookback",
    ] {
        assert!(paths.contains(&p), "{p} missing from {paths:?}");
    }
    // Every operation documents its errors as problem documents, 401 included, and its query
    // parameters as query parameters.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            assert!(responses.contains_key("401"), "{method} {path}");
            for (status, r) in responses {
                if status.starts_with('4') || status.starts_with('5') {
                    let content = r["content"].as_object().unwrap();
                    assert!(
                        content.contains_key("application/problem+json"),
                        "{method} {path} {status}: {r}"
                    );
                }
            }
            for param in op["parameters"].as_array().into_iter().flatten() {
                let name = param["name"].as_str().unwrap();
                let wanted = match name {
                    "id" => "path",
                    "Last-Event-ID" => "header",
                    _ => "query",
                };
                assert_eq!(param["in"], wanted, "{method} {path} {name}");
            }
        }
    }
}

#[tokio::test]
async fn a_submission_is_checked_then_published_once_naming_the_caller() {
    let s = seeded().await;
    let member = token(TokenRole::Member);
    let bad = "apiVersion: allot/v1\nkind: Workload\nmetadata: {name: x, team: vision}\n\
               spec:\n  tasks:\n    - {name: a, command: [\"true\"], after: [ghost], colour: red}\n";
    let (status, ty, p) = call(
        &s.state,
        "POST",
        "/api/v1/workloads",
        Some(&member),
        Some(("application/yaml", bad.into())),
    )
    .await;
    assert_eq!(
        (status.as_u16(), ty.as_str()),
        (422, "application/problem+json"),
        "{p}"
    );
    let paths: Vec<&str> = p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(
        paths.iter().any(|p| p.contains("colour")),
        "every problem listed: {p}"
    );

    let body = Some(("application/yaml", spec("nightly", "vision")));
    let (status, _, first) = call(
        &s.state,
        "POST",
        "/api/v1/workloads?run_id=ci-7",
        Some(&member),
        body.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, _, again) = call(
        &s.state,
        "POST",
        "/api/v1/workloads?run_id=ci-7",
        Some(&member),
        body,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["workload_id"], first["workload_id"]);
    // What WORKLOADS holds: one submission, the same id `allot submit` derives, naming the token.
    let stored = allot_testkit::streams::read_all(&s.client, "WORKLOADS").await;
    let subs: Vec<_> = stored
        .iter()
        .filter_map(|m| match allot_events::decode(&m.payload).unwrap().data {
            AnyEvent::Workload(WorkloadEvent::Submitted(w)) => Some(w),
            _ => None,
        })
        .collect();
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0].workload_id, first["workload_id"].as_str().unwrap());
    assert_eq!(subs[0].run_id.as_deref(), Some("ci-7"));
    assert!(
        subs[0].submitter.contains("t-member") && subs[0].submitter.contains("vision"),
        "{}",
        subs[0].submitter
    );
}

/// A submission is checked against the fleet as it is when it arrives: a task bigger than
/// every node is refused, and accepted once a node that can hold it has registered. (The fleet's
/// shape is kept between submissions and read again only when a node registers; a heartbeat
/// leaves it be.)
#[tokio::test]
async fn a_submission_is_checked_against_the_fleet_as_it_is_when_it_arrives() {
    let s = seeded().await;
    let member = token(TokenRole::Member);
    let big = "apiVersion: allot/v1\nkind: Workload\nmetadata: {name: big, team: vision}\n\
               spec:\n  tasks:\n    - {name: train, command: [\"true\"], resources: {gpus: 4}}\n";
    let submit = || {
        call(
            &s.state,
            "POST",
            "/api/v1/workloads",
            Some(&member),
            Some(("application/yaml", big.into())),
        )
    };
    let (status, _, p) = submit().await;
    assert_eq!(status.as_u16(), 422, "{p}");
    assert!(
        p.to_string().contains("no node could ever run this task"),
        "{p}"
    );
    let conn = allot_store::open(&s.db, model::MIGRATIONS).unwrap();
    let version = model::fleet_version(&conn).unwrap();
    let beat = serde_json::from_value(json!({"node": "node-1", "seq": 1, "uptime_s": 5})).unwrap();
    model::apply_fleet(&conn, &delivery(300, NodeEvent::HeartbeatSent(beat))).unwrap();
    assert_eq!(
        model::fleet_version(&conn).unwrap(),
        version,
        "a heartbeat is no change of shape"
    );
    let gpus: Vec<serde_json::Value> = (0..4)
        .map(|i| json!({"index": i, "uuid": format!("GPU-big-{i}"), "model": "H100", "memory_total_mib": 81_559}))
        .collect();
    let registered = serde_json::from_value(json!({"node": "node-big", "hostname": "node-big",
        "pool": "default", "cpu_milli": 64_000, "memory_mib": 262_144,
        "gpu_source": "simulated", "gpus": gpus}))
    .unwrap();
    model::apply_fleet(&conn, &delivery(301, NodeEvent::Registered(registered))).unwrap();
    assert!(model::fleet_version(&conn).unwrap() > version);
    let (status, _, p) = submit().await;
    assert_eq!(status, StatusCode::CREATED, "{p}");
}

#[tokio::test]
async fn admins_list_and_revoke_tokens_and_a_revoked_token_is_refused_at_once() {
    let s = seeded().await;
    let admin = token(TokenRole::Admin);
    // A member's token of team vision, as the ACCESS projection stores it.
    let secret = allot_gateway::token::generate();
    let issued = allot_gateway::token::issued(
        &secret,
        "vision",
        TokenRole::Member,
        "ops",
        "ci runner",
        None,
    );
    let conn = allot_store::open(&s.db, model::MIGRATIONS).unwrap();
    model::apply_access(
        &conn,
        &delivery(500, AccessEvent::TokenIssued(issued.clone())),
    )
    .unwrap();
    drop(conn);
    s.state.reload_tokens(None).await.unwrap();
    let (status, _, _) = call(&s.state, "GET", "/api/v1/workloads", Some(&secret), None).await;
    assert_eq!(status, StatusCode::OK);

    // Admins list tokens, never their secrets or hashes; nobody else may.
    let (status, _, list) = call(&s.state, "GET", "/api/v1/tokens", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let row = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["token_id"] == issued.token_id.as_str())
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(
        (
            row["team"].as_str(),
            row["role"].as_str(),
            row["description"].as_str()
        ),
        (Some("vision"), Some("member"), Some("ci runner"))
    );
    assert!(row["revoked_at"].is_null(), "{row}");
    let text = list.to_string();
    assert!(
        !text.contains(&secret) && !text.contains(&issued.sha256),
        "{text}"
    );
    let uri = format!("/api/v1/tokens/{}", issued.token_id);
    for role in [TokenRole::Operator, TokenRole::Member, TokenRole::Viewer] {
        let (status, _, _) =
            call(&s.state, "GET", "/api/v1/tokens", Some(&token(role)), None).await;
        assert_eq!(status.as_u16(), 403, "{role} lists");
        let (status, _, _) = call(&s.state, "DELETE", &uri, Some(&token(role)), None).await;
        assert_eq!(status.as_u16(), 403, "{role} revokes");
    }

    // Revoked: an event naming who did it, and refused by this gateway at once.
    let mut events = s.client.subscribe("allot.access.>").await.unwrap();
    let (status, _, p) = call(&s.state, "DELETE", &uri, Some(&admin), None).await;
    assert_eq!(status.as_u16(), 204, "{p}");
    let msg = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        futures::StreamExt::next(&mut events),
    )
    .await
    .expect("the revocation was published")
    .unwrap();
    assert_eq!(msg.subject.as_str(), "allot.access.token_revoked.vision");
    let event: Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(
        event["data"]["token_id"],
        issued.token_id.as_str(),
        "{event}"
    );
    assert!(
        event["data"]["by"].as_str().unwrap().contains("t-admin"),
        "{event}"
    );
    let (status, _, _) = call(&s.state, "GET", "/api/v1/workloads", Some(&secret), None).await;
    assert_eq!(status.as_u16(), 401);
    let (status, _, _) = call(&s.state, "DELETE", &uri, Some(&admin), None).await;
    assert_eq!(status.as_u16(), 409);
    let (status, _, _) = call(
        &s.state,
        "DELETE",
        "/api/v1/tokens/nope",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status.as_u16(), 404);
}

/// The nodes view is built when read, with no timer behind it: a node registered since the
/// last build shows up once a reader finds the view more than a second old, without anyone
/// calling for a rebuild; until then readers are answered at once from the view they have.
#[tokio::test]
async fn the_nodes_view_is_rebuilt_when_read_and_shows_a_node_registered_since() {
    let s = seeded().await;
    let admin = token(TokenRole::Admin);
    let (status, _, before) = call(&s.state, "GET", "/api/v1/nodes", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(before["total"], 2, "{before}");

    let conn = allot_store::open(&s.db, model::MIGRATIONS).unwrap();
    let registered = serde_json::from_value(json!({"node": "node-3", "hostname": "node-3",
        "pool": "default", "cpu_milli": 64_000, "memory_mib": 262_144,
        "gpu_source": "simulated", "gpus": [{"index": 0, "uuid": "GPU-node-3",
        "model": "H100", "memory_total_mib": 81_559}]}))
    .unwrap();
    model::apply_fleet(&conn, &delivery(300, NodeEvent::Registered(registered))).unwrap();
    drop(conn);

    // Within a second of its build the view is served as it is.
    let (_, _, young) = call(&s.state, "GET", "/api/v1/nodes", Some(&admin), None).await;
    if young["as_of"] == before["as_of"] {
        assert_eq!(young["total"], 2, "{young}");
    }
    // Later, a read starts a rebuild (answered from the old view meanwhile) and a read after
    // it sees the new node: bounded to 50 reads, 100 ms apart.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let mut seen = None;
    for _ in 0..50 {
        let (_, _, page) = call(&s.state, "GET", "/api/v1/nodes", Some(&admin), None).await;
        if page["total"] == 3 {
            seen = Some(page);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let page = seen.expect("the node registered since shows up once the view is read");
    assert_ne!(page["as_of"], before["as_of"], "{page}");
    assert!(
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["name"] == "node-3"),
        "{page}"
    );
}
