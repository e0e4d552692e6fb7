//! `allot bench submit`: submit → first grant latency through the real services.
//!
//! One run on one fresh nats-server (file storage), with the allocator (default policy) and the
//! planner in this process and a simulated pool of `--nodes` × 8 GPUs registered through
//! `NodeRegistered` events, as collectors do:
//!
//! 1. **baseline**: raw async-nats JetStream — `--workloads` messages of the same size as a
//!    submission, paced at `--rate`, each published (awaiting its PubAck) to a plain stream and
//!    read back by an ordered consumer; latency = publish → delivery.
//! 2. **allot**: `--workloads` one-task, 1-GPU workloads, validated beforehand and published as
//!    `allot submit` does (`WorkloadSubmitted`, `Nats-Msg-Id` from the idempotency key), paced at
//!    `--rate` by a tokio interval; latency = just before the publish → the moment the task's
//!    `Granted` decision is delivered from the pool's journal (one ordered consumer on
//!    DECISIONS). Each granted run is completed (`TaskCompleted`) after `--hold`, so capacity
//!    frees as it would; the pool is sized so the held runs never fill it, so the latency is
//!    the path's, not a queue's.
//!
//! The allot latency is split with the server's timestamps of the stored messages (one clock
//! on loopback): publish → submission stored, → `TaskReady` stored (the planner), → grant
//! journalled (the allocator), → grant delivered to the watcher. The first `--warmup`
//! workloads are submitted and granted but not counted.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer::DeliverPolicy};
use bytes::Bytes;
use clap::Args;
use futures::StreamExt;

use allot_bus::async_nats::jetstream::message::PublishMessage;
use allot_bus::streams::names;
use allot_events::{AllocEvent, AnyEvent, NodeEvent, TaskEvent, WorkloadEvent, subject};
use allot_sched::{Decision, TaskId};

use super::super::local;
use super::super::settings::Lookup;
use super::{Percentiles, server_ms, wall_ms};

#[cfg(test)]
mod tests;

const POOL: &str = "default";

/// Flags of `allot bench submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// Workloads measured (each one task of 1 GPU).
    #[arg(long, default_value_t = 2_000)]
    pub workloads: usize,
    /// Submissions per second.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Workloads submitted first and not counted.
    #[arg(long, default_value_t = 50)]
    pub warmup: usize,
    /// How long each granted run lasts before it is reported completed.
    #[arg(long, default_value = "200ms", value_parser = allot_workload::quantity::duration)]
    pub hold: Duration,
    /// Simulated nodes of 8 GPUs (enough that runs held for `--hold` never fill them).
    #[arg(long, default_value_t = 16)]
    pub nodes: usize,
    /// The allocator's pass interval (passes also run after every event that changes
    /// something).
    #[arg(long, default_value = "5s", value_parser = allot_workload::quantity::duration)]
    pub pass_interval: Duration,
    /// Write the results as JSON here.
    #[arg(long, default_value = "docs/results/submit-latency.json")]
    pub json: PathBuf,
}

/// What a workload's journey was, as measured.
#[derive(Debug, Default, Clone, Copy)]
struct Journey {
    /// Local instant just before the publish.
    sent: Option<Instant>,
    /// Wall clock just before the publish, ms since the epoch.
    sent_wall_ms: f64,
    /// Server timestamps, ms since the epoch.
    stored_ms: Option<f64>,
    ready_ms: Option<f64>,
    granted_ms: Option<f64>,
    /// Local instant the grant was delivered.
    seen: Option<Instant>,
    /// Wall clock the grant was delivered, ms since the epoch.
    seen_wall_ms: f64,
}

pub(super) async fn submit(args: SubmitArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.rate > 0.0, "--rate must be above zero");
    let binary = local::nats_server_binary(env)?;
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port();
    let nats = local::EmbeddedNats::start(&binary, dir.path(), port, None).await?;
    let url = nats.url().to_owned();
    let result = run(&args, &url, dir.path()).await;
    nats.stop().await;
    let report = result?;

    let b = &report.baseline;
    let a = &report.allot;
    println!(
        "submit → first grant, {} workloads at {:.0}/s (achieved {:.1}/s), pool {} × 8 GPUs, \
         runs held {} ms",
        a.n,
        args.rate,
        report.achieved_rate,
        args.nodes,
        args.hold.as_millis()
    );
    println!("| path | n | p50 ms | p95 ms | p99 ms | p99.9 ms | max ms |");
    println!("|---|---|---|---|---|---|---|");
    let row = |name: &str, p: &Percentiles| {
        println!(
            "| {name} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            p.n, p.p50, p.p95, p.p99, p.p999, p.max
        );
    };
    row("raw JetStream publish → consume", b);
    row("allot submit → grant delivered", a);
    for (name, p) in &report.split {
        row(&format!("  {name}"), p);
    }
    println!(
        "ratio p50 allot / raw {:.1}, p99 {:.1}; floor p99 ≤ 50 ms: {}",
        a.p50 / b.p50,
        a.p99 / b.p99,
        if a.p99 <= 50.0 { "met" } else { "MISSED" }
    );
    if report.missing > 0 {
        println!("{} workloads were never granted", report.missing);
    }
    let json = serde_json::json!({
        "benchmark": "submit-latency",
        "workloads": args.workloads,
        "warmup": args.warmup,
        "rate": args.rate,
        "achieved_rate": report.achieved_rate,
        "nodes": args.nodes,
        "gpus_per_node": 8,
        "hold_ms": args.hold.as_millis() as u64,
        "pass_interval_ms": args.pass_interval.as_millis() as u64,
        "baseline_ms": b,
        "allot_ms": a,
        "split_ms": report.split.iter().cloned().collect::<HashMap<_, _>>(),
        "missing": report.missing,
    });
    if let Some(parent) = args.json.parent() {
        std::fs::create_dir_all(parent).ok();
    }
    std::fs::write(&args.json, serde_json::to_vec_pretty(&json)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    eprintln!("wrote {}", args.json.display());
    Ok(if report.missing == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

struct Report {
    baseline: Percentiles,
    allot: Percentiles,
    split: Vec<(String, Percentiles)>,
    achieved_rate: f64,
    missing: usize,
}

async fn run(args: &SubmitArgs, url: &str, dir: &std::path::Path) -> anyhow::Result<Report> {
    let (client, js, publisher) = super::connect(url).await?;

    // The submissions, validated before anything is timed.
    let total = args.warmup + args.workloads;
    let submissions: Vec<_> = (0..total)
        .map(|i| {
            let text = format!(
                "apiVersion: allot/v1\nkind: Workload\nmetadata: {{name: bench-{i}, team: bench}}\n\
                 spec:\n  tasks:\n    - name: run\n      resources: {{gpus: 1}}\n      \
                 command: [python, train.py]\n"
            );
            super::submission(&text)
        })
        .collect::<anyhow::Result<_>>()?;
    let payload_size = submissions[0].envelope.to_json().len();

    let baseline = baseline(&js, args, payload_size).await?;
    eprintln!(
        "baseline: p50 {:.2} ms, p99 {:.2} ms",
        baseline.p50, baseline.p99
    );

    // The pool, the allocator and the planner.
    for n in 0..args.nodes {
        let node = super::remediation::registration(&format!("bench-node-{n}"), 8);
        publisher.publish(NodeEvent::Registered(node)).await?;
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = futures::FutureExt::shared(Box::pin(async move {
        let _ = stopped.await;
    })
        as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>);
    let allocator = allot_allocator::Config {
        instance: "bench".into(),
        pass_interval: args.pass_interval,
        ..allot_allocator::Config::new(url, POOL)
    };
    let allocator = tokio::spawn(allot_allocator::run(allocator, stopped.clone()));
    let planner = allot_planner::Config::new(url, dir.join("planner"));
    std::fs::create_dir_all(&planner.data_dir)?;
    let planner = tokio::spawn(allot_planner::run(planner, stopped.clone()));
    wait_until_ready(&js, args.nodes, Duration::from_secs(20)).await?;

    // Task id → index; one record per workload.
    let ids: HashMap<TaskId, usize> = submissions
        .iter()
        .enumerate()
        .map(|(i, s)| (allot_events::task::task_id(&s.workload_id, "run", 1), i))
        .collect();
    let workload_index: HashMap<String, usize> = submissions
        .iter()
        .enumerate()
        .map(|(i, s)| (s.workload_id.clone(), i))
        .collect();
    let journeys = Arc::new(Mutex::new(vec![Journey::default(); total]));
    let (all_granted_tx, mut all_granted) = tokio::sync::watch::channel(0usize);

    // The watcher of grants (and the stand-in executor that completes them).
    let grants = super::follow_journal(&js, POOL).await?;
    let watcher = {
        let journeys = journeys.clone();
        let publisher = publisher.clone();
        let hold = args.hold;
        let mut granted = 0usize;
        super::on_each(grants, move |event, message, seen| {
            let seen_wall_ms = wall_ms();
            let AnyEvent::Alloc(AllocEvent::Applied(applied)) = event else {
                return;
            };
            let stored_ms = server_ms(message);
            for d in &applied.entry.decisions {
                let Decision::Granted { task, lease, .. } = d else {
                    continue;
                };
                let Some(&i) = ids.get(task) else { continue };
                {
                    let mut j = journeys.lock().expect("not poisoned");
                    if j[i].seen.is_some() {
                        continue;
                    }
                    j[i].seen = Some(seen);
                    j[i].seen_wall_ms = seen_wall_ms;
                    j[i].granted_ms = stored_ms;
                }
                granted += 1;
                let _ = all_granted_tx.send(granted);
                // The completion names the node the grant put it on, as an executor's
                // does: the allocator refuses a report from any other node.
                let node = applied
                    .dispatch
                    .iter()
                    .find(|g| g.lease == *lease)
                    .and_then(|g| g.nodes.first())
                    .map_or_else(String::new, |n| n.node.clone());
                let (publisher, task, lease) = (publisher.clone(), *task, *lease);
                tokio::spawn(async move {
                    tokio::time::sleep(hold).await;
                    if let Err(e) = super::complete(&publisher, POOL, task, node, lease).await {
                        // After the run, the client is closed under the completions still waiting: expected.
                        tracing::debug!(error = %e, "completing a bench task failed");
                    }
                });
            }
        })
    };
    // Server timestamps of the submissions and the planner's TaskReady.
    let stamps = super::follow(
        &js,
        names::WORKLOADS,
        vec![
            subject::workload_submitted("bench"),
            subject::task("ready", POOL),
        ],
        DeliverPolicy::New,
    )
    .await?;
    let stamper = {
        let journeys = journeys.clone();
        super::on_each(stamps, move |event, message, _| {
            let at = server_ms(message);
            let mut j = journeys.lock().expect("not poisoned");
            match event {
                AnyEvent::Workload(WorkloadEvent::Submitted(s)) => {
                    if let Some(&i) = workload_index.get(&s.workload_id) {
                        j[i].stored_ms = at;
                    }
                }
                AnyEvent::Task(TaskEvent::Ready(r)) => {
                    if let Some(&i) = workload_index.get(&r.workload) {
                        j[i].ready_ms = at;
                    }
                }
                _ => {}
            }
        })
    };

    // Submissions, paced.
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut acks = Vec::with_capacity(total);
    let mut measured_from = None;
    for (i, s) in submissions.into_iter().enumerate() {
        tick.tick().await;
        if i == args.warmup {
            measured_from = Some(Instant::now());
        }
        let message = PublishMessage::build()
            .message_id(s.msg_id)
            .payload(Bytes::from(s.envelope.to_json()));
        {
            let mut j = journeys.lock().expect("not poisoned");
            j[i].sent = Some(Instant::now());
            j[i].sent_wall_ms = wall_ms();
        }
        let pending = publisher
            .send_raw(s.envelope.nats_subject(), message)
            .await?;
        acks.push(tokio::spawn(pending.wait()));
    }
    let sent_for = measured_from.map_or(Duration::ZERO, |t| t.elapsed());
    for ack in acks {
        ack.await??;
    }
    let achieved_rate = args.workloads as f64 / sent_for.as_secs_f64().max(1e-9);
    let everything = tokio::time::timeout(
        Duration::from_secs(60),
        all_granted.wait_for(|n| *n >= total),
    )
    .await;
    if everything.is_err() {
        eprintln!("not every workload was granted within 60 s of the last submission");
    }

    let _ = stop.send(());
    watcher.abort();
    stamper.abort();
    let _ = tokio::time::timeout(Duration::from_secs(10), allocator).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), planner).await;
    client.drain().await.ok();

    let journeys = journeys.lock().expect("not poisoned").clone();
    let measured = &journeys[args.warmup..];
    let missing = measured.iter().filter(|j| j.seen.is_none()).count();
    let mut total_ms = Vec::new();
    let mut split: [Vec<f64>; 4] = Default::default();
    for j in measured {
        let (Some(sent), Some(seen)) = (j.sent, j.seen) else {
            continue;
        };
        total_ms.push(seen.duration_since(sent).as_secs_f64() * 1000.0);
        if let (Some(stored), Some(ready), Some(granted)) = (j.stored_ms, j.ready_ms, j.granted_ms)
        {
            split[0].push(stored - j.sent_wall_ms);
            split[1].push(ready - stored);
            split[2].push(granted - ready);
            split[3].push(j.seen_wall_ms - granted);
        }
    }
    let names = [
        "publish → submission stored",
        "stored → TaskReady stored (planner)",
        "TaskReady → grant journalled (allocator)",
        "journalled → grant delivered",
    ];
    Ok(Report {
        baseline,
        allot: Percentiles::of(total_ms),
        split: names
            .iter()
            .zip(split)
            .map(|(n, v)| ((*n).to_owned(), Percentiles::of(v)))
            .collect(),
        achieved_rate,
        missing,
    })
}

/// Raw JetStream on the same server: paced publishes (awaiting each PubAck in the background)
/// of payloads of the submissions' size, read back by an ordered consumer.
async fn baseline(
    js: &jetstream::Context,
    args: &SubmitArgs,
    payload_size: usize,
) -> anyhow::Result<Percentiles> {
    let mut messages = super::raw_stream(js, "BENCH_RAW", "bench.raw.>").await?;
    let total = args.warmup + args.workloads;
    let sent = Arc::new(Mutex::new(vec![None::<Instant>; total]));
    let reader = {
        let sent = sent.clone();
        tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(total);
            while latencies.len() < total {
                let message = messages.next().await.context("consumer ended")??;
                let seen = Instant::now();
                let i: usize = message
                    .subject
                    .rsplit('.')
                    .next()
                    .and_then(|i| i.parse().ok())
                    .context("bench subject")?;
                let at = sent.lock().expect("not poisoned")[i];
                if let Some(at) = at {
                    latencies.push((i, seen.duration_since(at).as_secs_f64() * 1000.0));
                }
            }
            anyhow::Ok(latencies)
        })
    };
    let payload = Bytes::from(vec![b'x'; payload_size]);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut acks = Vec::with_capacity(total);
    for i in 0..total {
        tick.tick().await;
        sent.lock().expect("not poisoned")[i] = Some(Instant::now());
        let ack = js
            .publish(format!("bench.raw.{i}"), payload.clone())
            .await?;
        acks.push(tokio::spawn(ack.into_future()));
    }
    for ack in acks {
        ack.await??;
    }
    let latencies = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .context("the baseline's consumer fell behind by a minute")???;
    js.delete_stream("BENCH_RAW").await?;
    Ok(Percentiles::of(
        latencies
            .into_iter()
            .filter(|(i, _)| *i >= args.warmup)
            .map(|(_, ms)| ms)
            .collect(),
    ))
}

/// Waits (at most `within`) until the allocator leads with every node in its journal, and the
/// planner's consumers exist.
pub(super) async fn wait_until_ready(
    js: &jetstream::Context,
    nodes: usize,
    within: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed() < within {
        let journal = match js.get_stream(names::DECISIONS).await {
            Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
            Err(_) => 0,
        };
        let planner = match js.get_stream(names::WORKLOADS).await {
            Ok(s) => s.consumer_info("planner-workloads").await.is_ok(),
            Err(_) => false,
        };
        // LeaderElected, then one entry per node added.
        if journal > nodes as u64 && planner {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!(
        "the allocator and the planner did not start within {} s",
        within.as_secs()
    )
}
