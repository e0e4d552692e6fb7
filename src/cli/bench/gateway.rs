//! `allot bench gateway`: requests per second and latency of the gateway's busiest reads,
//! `GET /api/v1/queue` and `GET /api/v1/nodes`, over loopback HTTP with a cluster of
//! `--nodes` × `--gpus` and `--tasks` tasks in the system, as an admin (every team) and as a
//! member (one team, the others' work anonymised); against `GET /healthz` on the same server in
//! the same run, the cheapest request the server answers (the ratio is what the views cost).
//!
//! The gateway is the real one (`allot_gateway::app`): its read model in SQLite, its mirror of
//! the allocator's journal rebuilt the way the gateway rebuilds it (every input through the
//! `allot` policy's scheduler), and its views refreshed every second while the load runs, as in
//! production. The load: `--connections` keep-alive HTTP/1.1 connections (hyper's client), each
//! sending its next request when the last answer has been read, for `--duration` per endpoint;
//! client and server share this process and its cores.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use allot_bus::consumer::Delivery;
use allot_events::access::TokenRole;
use allot_events::alloc::{Applied, Dispatch, Launch, LeaderElected};
use allot_events::task::RunSpec;
use allot_events::{AllocEvent, AnyEvent, Envelope};
use allot_gateway::mirror::Mirror;
use allot_gateway::token::{Known, sha256_hex};
use allot_gateway::{AppState, db::Db, model};
use allot_sched::journal::Entry;
use allot_sched::{Input, NodeSpec, Scheduler, TaskId, TaskSpec};

use super::Percentiles;

/// Flags of `allot bench gateway`.
#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// Nodes in the system.
    #[arg(long, default_value_t = 1_000)]
    pub nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    pub gpus: u32,
    /// Tasks in the system (those that fit run, the rest wait).
    #[arg(long, default_value_t = 10_000)]
    pub tasks: usize,
    /// Keep-alive connections sending requests at once.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// How long each endpoint is loaded (after a one-second warm-up).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One endpoint's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EndpointResult {
    /// What was asked, and by whom.
    pub name: String,
    /// The request's path and query.
    pub path: String,
    /// Answered requests per second.
    pub requests_per_s: f64,
    /// Request → whole answer read, ms.
    pub latency_ms: Percentiles,
    /// Bytes of one answer's body (the last one).
    pub body_bytes: usize,
    /// Requests per second relative to `GET /healthz` in the same run.
    pub vs_healthz: f64,
}

/// Teams the tasks belong to; the member is of the first.
const TEAMS: [&str; 8] = [
    "vision", "nlp", "speech", "ranking", "robotics", "research", "ads", "search",
];

pub async fn gateway(args: GatewayArgs) -> anyhow::Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let started = Instant::now();
    let state = system(&args, dir.path()).await?;
    let built = started.elapsed();
    let refresh = {
        let t = Instant::now();
        state.refresh().await.map_err(anyhow::Error::msg)?;
        t.elapsed()
    };
    // The views are rebuilt every second while the load runs, as the gateway does.
    let refresher = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                if let Err(e) = state.refresh().await {
                    eprintln!("allot bench gateway: refreshing the views: {e}");
                }
            }
        })
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server =
        tokio::spawn(async move { axum::serve(listener, allot_gateway::app(state.clone())).await });
    eprintln!(
        "allot bench gateway: {} nodes × {} GPUs, {} tasks (set up in {:.1} s; one view refresh \
         {:.0} ms); {} connections, {} s per endpoint, on http://{addr}",
        args.nodes,
        args.gpus,
        args.tasks,
        built.as_secs_f64(),
        refresh.as_secs_f64() * 1e3,
        args.connections,
        args.duration.as_secs_f64(),
    );

    let admin = token(TokenRole::Admin);
    let member = token(TokenRole::Member);
    let endpoints: [(&str, &str, Option<&str>); 5] = [
        ("healthz (baseline)", "/healthz", None),
        ("queue, admin", "/api/v1/queue", Some(&admin)),
        ("queue, member", "/api/v1/queue", Some(&member)),
        ("nodes, admin", "/api/v1/nodes", Some(&admin)),
        ("nodes, member", "/api/v1/nodes", Some(&member)),
    ];
    let mut results: Vec<EndpointResult> = Vec::new();
    for (name, path, bearer) in endpoints {
        let (rps, latency, body_bytes) = load(addr, path, bearer, &args).await?;
        let baseline = results.first().map_or(rps, |b| b.requests_per_s);
        results.push(EndpointResult {
            name: name.to_owned(),
            path: path.to_owned(),
            requests_per_s: rps,
            latency_ms: latency,
            body_bytes,
            vs_healthz: rps / baseline,
        });
    }
    refresher.abort();
    server.abort();
    let _ = refresher.await;
    let _ = server.await;

    println!(
        "{:<20} {:>10} {:>9} {:>9} {:>9} {:>10} {:>8}",
        "endpoint", "req/s", "p50 ms", "p99 ms", "max ms", "body B", "÷healthz"
    );
    for r in &results {
        println!(
            "{:<20} {:>10.0} {:>9.2} {:>9.2} {:>9.2} {:>10} {:>8.2}",
            r.name,
            r.requests_per_s,
            r.latency_ms.p50,
            r.latency_ms.p99,
            r.latency_ms.max,
            r.body_bytes,
            r.vs_healthz
        );
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "nodes": args.nodes,
            "gpus_per_node": args.gpus,
            "tasks": args.tasks,
            "connections": args.connections,
            "duration_s": args.duration.as_secs_f64(),
            "view_refresh_ms": refresh.as_secs_f64() * 1e3,
            "endpoints": results,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn token(role: TokenRole) -> String {
    format!("allot_bench_{role}")
}

fn delivery(seq: u64, event: impl Into<AnyEvent>) -> Delivery {
    Delivery::first(seq, Envelope::new("/bench", event), Utc::now())
}

/// The gateway's state with the cluster and the tasks in it: nodes registered and sampled in
/// the read model, and the allocator's journal (nodes, submissions, a scheduling pass) applied
/// to the mirror with the decisions the `allot` policy makes.
async fn system(args: &GatewayArgs, dir: &std::path::Path) -> anyhow::Result<AppState> {
    let path = dir.join("gateway.db");
    let conn = allot_store::open(&path, model::MIGRATIONS)?;
    let mut seq = 0;
    // Each node's latest sample, as the gateway keeps it (in memory).
    let mut sampled_now = Vec::new();
    let models = [
        "NVIDIA H100 80GB HBM3",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA L4",
    ];
    for n in 0..args.nodes {
        let node = format!("node-{:04}", n + 1);
        let model = models[n % models.len()];
        let gpus: Vec<_> = (0..args.gpus)
            .map(|i| {
                serde_json::json!({"index": i, "uuid": format!("GPU-{n}-{i}"), "model": model,
                    "memory_total_mib": 81_559})
            })
            .collect();
        let registered: allot_events::node::NodeRegistered = serde_json::from_value(
            serde_json::json!({"node": node, "hostname": node, "pool": "default",
                "cpu_milli": 128_000, "memory_mib": 1_048_576, "gpu_source": "simulated",
                "gpus": gpus}),
        )?;
        seq += 1;
        let tx = conn.unchecked_transaction()?;
        model::apply_fleet(
            &tx,
            &delivery(seq, allot_events::NodeEvent::Registered(registered)),
        )?;
        let samples: Vec<_> = (0..args.gpus)
            .map(|i| {
                serde_json::json!({"index": i, "uuid": format!("GPU-{n}-{i}"),
                    "utilization_pct": (n as u32 * 7 + i * 13) % 100, "memory_used_mib": 40_000,
                    "memory_total_mib": 81_559, "temperature_c": 55 + (n as u32 + i) % 30,
                    "power_mw": 350_000})
            })
            .collect();
        let sampled: allot_events::telemetry::GpusSampled =
            serde_json::from_value(serde_json::json!({"node": node, "samples": samples}))?;
        sampled_now.push(sampled);
        tx.commit()?;
    }
    drop(conn);

    let policy = "allot";
    let mut mirror = Mirror::default();
    mirror.apply(&AllocEvent::LeaderElected(LeaderElected {
        pool: "default".into(),
        leader: "bench".into(),
        policy: policy.into(),
        format: allot_sched::journal::FORMAT.into(),
        entries: 0,
    }));
    let mut scheduler = Scheduler::new(allot_sched::policy::by_name(policy).expect("a policy"));
    let mut journal = 0;
    let mut launches: HashMap<TaskId, Launch> = HashMap::new();
    let mut apply = |mirror: &mut Mirror, input: Input, launch: Option<Launch>| {
        journal += 1;
        if let (Input::TaskSubmitted { task, .. }, Some(l)) = (&input, &launch) {
            launches.insert(task.id, l.clone());
        }
        let decisions = scheduler
            .apply(input.clone())
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        // What runs where, as the allocator journals it for the executors.
        let dispatch = Dispatch::for_grants(&decisions, scheduler.cluster(), |task| {
            launches[&task].clone()
        });
        mirror.apply(&AllocEvent::Applied(Applied {
            pool: "default".into(),
            source: None,
            entry: Entry {
                seq: journal,
                input,
                decisions,
                rejected: None,
            },
            launch,
            dispatch,
        }));
        anyhow::Ok(())
    };
    for n in 0..args.nodes {
        let model = ["H100", "A100", "L4"][n % 3];
        apply(
            &mut mirror,
            Input::NodeAdded(NodeSpec::new(
                format!("node-{:04}", n + 1),
                args.gpus,
                model,
            )),
            None,
        )?;
    }
    let now = Utc::now().timestamp_millis() as allot_sched::Time;
    // Sizes as in a shared training cluster: mostly 1 GPU, some 2, 4 and 8; an hour or so each.
    let sizes = [1, 1, 1, 1, 2, 2, 4, 8];
    for t in 0..args.tasks {
        let team = TEAMS[t % TEAMS.len()];
        let mut task = TaskSpec::new(t as u64 + 1, team, sizes[(t / 3) % sizes.len()]);
        task.predicted_duration = Some(((t % 17) as u64 + 1) * 600_000);
        let launch = Launch {
            workload: format!("{team}-{:05}", t / 4),
            name: format!("train-{}", t % 4),
            team: team.to_owned(),
            run: RunSpec::default(),
        };
        let at = now - (args.tasks - t) as allot_sched::Time * 100;
        apply(&mut mirror, Input::TaskSubmitted { task, at }, Some(launch))?;
    }
    apply(&mut mirror, Input::Schedule { at: now }, None)?;
    for (pool, capacity, allocated, waiting) in mirror.usage() {
        eprintln!(
            "allot bench gateway: pool {pool}: {:.0} of {:.0} GPUs allocated, {waiting} tasks pending",
            allocated as f64 / 1000.0,
            capacity as f64 / 1000.0
        );
    }

    let state = AppState::new(
        Arc::new(Db::new(path)),
        Arc::new(Mutex::new(mirror)),
        None,
        None,
    );
    {
        let samples = state.samples();
        let mut samples = samples.lock().expect("samples lock");
        for sampled in sampled_now {
            samples.apply(sampled, Utc::now());
        }
    }
    for role in [TokenRole::Admin, TokenRole::Member] {
        state.add_token(
            sha256_hex(&token(role)),
            Known {
                token_id: format!("bench-{role}"),
                team: TEAMS[0].into(),
                role,
                expires: None,
                revoked: false,
            },
        );
    }
    Ok(state)
}

/// Loads `path` from `--connections` connections for a second of warm-up, then `--duration`:
/// answered requests per second, their latencies and one answer's size.
async fn load(
    addr: std::net::SocketAddr,
    path: &str,
    bearer: Option<&str>,
    args: &GatewayArgs,
) -> anyhow::Result<(f64, Percentiles, usize)> {
    let warm_up = Instant::now() + Duration::from_secs(1);
    let end = warm_up + args.duration;
    let mut clients = Vec::new();
    for _ in 0..args.connections {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let uri: hyper::Uri = format!("http://{addr}{path}").parse()?;
        let auth = bearer.map(|t| format!("Bearer {t}"));
        clients.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut size = 0;
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                let mut request = hyper::Request::get(uri.clone()).header("host", "bench");
                if let Some(auth) = &auth {
                    request = request.header("authorization", auth);
                }
                sender.ready().await?;
                let response = sender.send_request(request.body(Empty::new())?).await?;
                let status = response.status();
                let body = response.into_body().collect().await?.to_bytes();
                anyhow::ensure!(
                    status.is_success(),
                    "{status}: {}",
                    String::from_utf8_lossy(&body)
                );
                if now >= warm_up {
                    latencies.push(now.elapsed().as_secs_f64() * 1e3);
                }
                size = body.len();
            }
            anyhow::Ok((latencies, size))
        }));
    }
    let mut all = Vec::new();
    let mut size = 0;
    for client in clients {
        let (latencies, s) = client.await??;
        all.extend(latencies);
        size = s;
    }
    let rps = all.len() as f64 / args.duration.as_secs_f64();
    Ok((rps, Percentiles::of(all), size))
}
