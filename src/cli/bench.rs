//! `allot bench …`: benchmarks of the live path against a real nats-server, and of the
//! scheduling core.
//!
//! `allot bench telemetry` measures sustained telemetry ingest through the real path —
//! envelopes published with `Nats-Msg-Id` and awaited acks, consumed by the inventory's
//! durable consumer, decoded, applied to SQLite with the stream position in the same
//! transaction, and acknowledged — and, in the same run on the same server, raw async-nats
//! JetStream publish + consume of the same payloads (pull consumer, explicit acks, no
//! decoding, no storage). The ratio is what Allot's guarantees cost; each path's CPU per
//! event, the bench process's and nats-server's, says where it goes.
//!
//! `allot bench submit` measures submit → first grant latency through the planner and the
//! allocator, against a raw JetStream publish → consume round trip on the same server (see
//! [`submit`]).
//!
//! `allot bench gateway` measures the gateway's busiest reads under load (see [`gateway`]).
//!
//! `allot bench placement` measures the scheduling core's placement pass for every policy in
//! one process, no server involved (see [`placement`]).
//!
//! `allot bench remediation` measures fault detection → action latency of the remediation
//! service (a child process) under a simulated fleet's telemetry and heartbeats, with injected
//! overheat faults, against the bus's own stored → delivered latency on the same server, and
//! the service's CPU, memory and consumer lag (see [`remediation`]).

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::{self, consumer::pull, stream};
use bytes::Bytes;
use clap::{Args, Subcommand};
use futures::StreamExt;

use allot_bus::Publisher;
use allot_events::Envelope;
use allot_events::telemetry::{GpuSample, GpusSampled};

use super::local;
use super::settings::Lookup;

mod gateway;
mod placement;
mod process;
mod remediation;
mod scale;
mod submit;

/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Telemetry ingest: collector → JetStream → inventory SQLite, against raw JetStream.
    Telemetry(TelemetryArgs),
    /// Submit → first grant latency through the planner and the allocator, against raw
    /// JetStream publish → consume.
    Submit(submit::SubmitArgs),
    /// Fault detection → remediation action latency under a simulated fleet's telemetry, with
    /// the service's CPU, memory and lag, against the bus's own delivery latency.
    Remediation(remediation::RemediationArgs),
    /// Requests/s and latency of the gateway's `GET /api/v1/queue` and `/api/v1/nodes` with a
    /// large cluster and queue in the system, against `GET /healthz` on the same server.
    Gateway(gateway::GatewayArgs),
    /// The scheduling core's placement pass (1,250 nodes × 8 GPUs, 10,000 pending) for every
    /// policy in one process; no server needed.
    Placement(placement::PlacementArgs),
    /// A simulated fleet (2,000 nodes × 8 GPUs, 1 Hz telemetry) and 50,000 workloads through
    /// every service and NATS: submit → grant latency, decisions/s, telemetry events/s, each
    /// service's CPU and memory, and nothing lost or doubled.
    Scale(scale::ScaleArgs),
}

/// Latency percentiles, ms (nearest rank), shared by the benchmarks.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Percentiles {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// The percentiles of `ms` (NaN everywhere when empty).
    pub fn of(mut ms: Vec<f64>) -> Percentiles {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| {
            if ms.is_empty() {
                return f64::NAN;
            }
            let i = ((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1;
            ms[i]
        };
        Percentiles {
            n: ms.len(),
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            p999: at(0.999),
            max: at(1.0),
        }
    }
}

/// Flags of `allot bench telemetry`.
#[derive(Debug, Args)]
pub struct TelemetryArgs {
    /// Events per run.
    #[arg(long, default_value_t = 50_000)]
    pub events: usize,
    /// Simulated nodes the events come from (8 GPUs each).
    #[arg(long, default_value_t = 100)]
    pub nodes: usize,
    /// Publishes in flight (awaiting their PubAck) at once, for both paths.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// Rounds; each runs both paths on a fresh server, alternating which goes first.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// Runs a benchmark.
pub async fn bench(cmd: BenchCommand, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Telemetry(args) => telemetry(args, env).await,
        BenchCommand::Submit(args) => submit::submit(args, env).await,
        BenchCommand::Remediation(args) => remediation::remediation(args, env).await,
        BenchCommand::Gateway(args) => gateway::gateway(args).await,
        BenchCommand::Placement(args) => placement::placement(args),
        BenchCommand::Scale(args) => scale::scale(args, env).await,
    }
}

async fn telemetry(args: TelemetryArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let binary = local::nats_server_binary(env)?;
    let payloads = payloads(args.events, args.nodes);
    let bytes_per_event =
        payloads.iter().map(|e| e.to_json().len()).sum::<usize>() / payloads.len();
    eprintln!(
        "telemetry ingest: {} events/run ({} nodes × 8 GPUs, {bytes_per_event} B/event), window {}, {} rounds",
        args.events, args.nodes, args.window, args.rounds
    );
    let mut raw = Vec::new();
    let mut allot = Vec::new();
    let (mut raw_cpu, mut allot_cpu) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let dir = tempfile::tempdir()?;
        let nats = local::EmbeddedNats::start(&binary, dir.path(), pick_free_port()?, None).await?;
        let url = nats.url().to_owned();
        let server = nats.pid();
        let result = async {
            let raw_first = round % 2 == 0;
            let mut r = (0.0, Cpu::default());
            let mut a = (0.0, Cpu::default());
            for raw_now in [raw_first, !raw_first] {
                if raw_now {
                    r = raw_path(&url, server, &payloads, args.window).await?;
                } else {
                    a = allot_path(&url, server, dir.path(), &payloads, args.window).await?;
                }
            }
            anyhow::Ok((r, a))
        }
        .await;
        nats.stop().await;
        let ((r, r_cpu), (a, a_cpu)) = result?;
        eprintln!(
            "round {}: raw {:>9.0} events/s   allot {:>9.0} events/s   ratio {:.2}   \
             CPU µs/event client+server: raw {:.1}+{:.1}, allot {:.1}+{:.1}",
            round + 1,
            r,
            a,
            a / r,
            r_cpu.client_us,
            r_cpu.server_us,
            a_cpu.client_us,
            a_cpu.server_us,
        );
        raw.push(r);
        allot.push(a);
        raw_cpu.push(r_cpu);
        allot_cpu.push(a_cpu);
    }
    let (raw_median, allot_median) = (median(&mut raw), median(&mut allot));
    let ratio = allot_median / raw_median;
    println!("| path | events/s (median of {}) |", args.rounds);
    println!("|---|---|");
    println!("| raw async-nats JetStream publish + pull consume | {raw_median:.0} |");
    println!("| allot: publisher → TELEMETRY → inventory → SQLite | {allot_median:.0} |");
    println!("| ratio allot / raw | {ratio:.2} |");
    if let Some(path) = args.json {
        let json = serde_json::json!({
            "benchmark": "telemetry",
            "events": args.events,
            "nodes": args.nodes,
            "window": args.window,
            "bytes_per_event": bytes_per_event,
            "raw_events_per_s": raw,
            "allot_events_per_s": allot,
            "raw_median": raw_median,
            "allot_median": allot_median,
            "ratio": ratio,
            "raw_cpu_us_per_event": raw_cpu,
            "allot_cpu_us_per_event": allot_cpu,
        });
        std::fs::write(&path, serde_json::to_vec_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// CPU one path spent per event: the bench process's (publisher and consumer) and
/// nats-server's, µs.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
struct Cpu {
    client_us: f64,
    server_us: f64,
}

/// CPU seconds so far of this process and of nats-server (`server`).
fn cpu_now(server: u32) -> (f64, f64) {
    (process::own_cpu(), process::cpu_or_nan(server))
}

impl Cpu {
    /// What was spent per event of `events` since `before` (a [`cpu_now`]).
    fn per_event(before: (f64, f64), server: u32, events: usize) -> Cpu {
        let after = cpu_now(server);
        Cpu {
            client_us: (after.0 - before.0) * 1e6 / events as f64,
            server_us: (after.1 - before.1) * 1e6 / events as f64,
        }
    }
}

/// One telemetry event per node per tick, like the collectors send.
fn payloads(events: usize, nodes: usize) -> Vec<Envelope> {
    (0..events)
        .map(|i| {
            let node = format!("node-{}", i % nodes.max(1) + 1);
            let tick = (i / nodes.max(1)) as u64;
            let samples = (0..8u32)
                .map(|g| GpuSample {
                    index: g,
                    uuid: format!("GPU-{node}-{g}"),
                    utilization_pct: Some(((tick * 7 + u64::from(g) * 13) % 101) as u8),
                    memory_used_mib: 1_000 + tick % 70_000,
                    memory_total_mib: 81_559,
                    temperature_c: Some(40 + (tick % 40) as u32),
                    power_mw: Some(150_000 + tick % 500_000),
                    power_limit_mw: Some(700_000),
                    ecc_corrected: Some(0),
                    ecc_uncorrected: Some(0),
                    xid_errors: Some(0),
                    last_xid: None,
                    xids: Vec::new(),
                    slowdown_temperature_c: None,
                    throttle_reasons: Vec::new(),
                    rows_remapped_uncorrectable: None,
                    row_remap_failed: None,
                    nvlink_errors: None,
                })
                .collect();
            Envelope::new(
                format!("/allot/collector/{node}"),
                GpusSampled {
                    node,
                    samples,
                    held: Vec::new(),
                },
            )
        })
        .collect()
}

/// Raw async-nats: publish with a bounded window of awaited acks; a pull consumer acks each.
async fn raw_path(
    url: &str,
    server: u32,
    payloads: &[Envelope],
    window: usize,
) -> anyhow::Result<(f64, Cpu)> {
    let client = async_nats::connect(url).await?;
    let js = jetstream::new(client.clone());
    let stream = js
        .create_stream(stream::Config {
            name: "BENCH_RAW".into(),
            subjects: vec!["bench.raw.>".into()],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("bench".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            max_ack_pending: 2048,
            ..Default::default()
        })
        .await?;
    let wire: Vec<(String, Bytes)> = payloads
        .iter()
        .map(|e| {
            (
                format!("bench.raw.{}", e.subject.as_deref().unwrap_or("x")),
                Bytes::from(e.to_json()),
            )
        })
        .collect();
    let total = wire.len();
    let cpu = cpu_now(server);
    let start = Instant::now();
    let consume = tokio::spawn(async move {
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(256)
            .messages()
            .await?;
        let mut seen = 0;
        while seen < total {
            let message = messages
                .next()
                .await
                .context("consumer ended")?
                .map_err(|e| anyhow::anyhow!(e))?;
            message.ack().await.map_err(|e| anyhow::anyhow!(e))?;
            seen += 1;
        }
        anyhow::Ok(())
    });
    let mut in_flight = VecDeque::with_capacity(window);
    for (subject, payload) in wire {
        if in_flight.len() >= window
            && let Some(ack) = in_flight.pop_front()
        {
            let ack: jetstream::context::PublishAckFuture = ack;
            ack.await?;
        }
        in_flight.push_back(js.publish(subject, payload).await?);
    }
    for ack in in_flight {
        ack.await?;
    }
    let published_after = start.elapsed();
    consume.await??;
    let elapsed = start.elapsed();
    let cpu = Cpu::per_event(cpu, server, total);
    tracing::debug!(
        published_ms = published_after.as_millis() as u64,
        consumed_ms = elapsed.as_millis() as u64,
        "raw path"
    );
    client.drain().await.ok();
    Ok((total as f64 / elapsed.as_secs_f64(), cpu))
}

/// Allot: the bus publisher into TELEMETRY; the inventory service applies to SQLite.
async fn allot_path(
    url: &str,
    server: u32,
    dir: &std::path::Path,
    payloads: &[Envelope],
    window: usize,
) -> anyhow::Result<(f64, Cpu)> {
    let client = async_nats::connect(url).await?;
    let publisher = Publisher::new(client.clone(), "/allot/bench");
    allot_bus::ensure_streams(publisher.jetstream(), &allot_bus::catalog(1)).await?;
    let mut config = allot_inventory::Config::new(url, dir.join("inventory"));
    config.consumer_prefix = "bench".into();
    let db = config.db_path();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let inventory = tokio::spawn(allot_inventory::run(config, async {
        let _ = stopped.await;
    }));
    // Wait until the inventory has created its consumers, so both paths start consuming live.
    let js = publisher.jetstream().clone();
    for _ in 0..200 {
        let ready = match js.get_stream(allot_bus::streams::names::TELEMETRY).await {
            Ok(s) => s.consumer_info("bench-telemetry").await.is_ok(),
            Err(_) => false,
        };
        if ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let total = payloads.len() as u64;
    let cpu = cpu_now(server);
    let start = Instant::now();
    let mut in_flight = VecDeque::with_capacity(window);
    let mut last_seq = 0;
    for envelope in payloads {
        if in_flight.len() >= window
            && let Some(ack) = in_flight.pop_front()
        {
            let ack: allot_bus::PendingAck = ack;
            last_seq = ack.wait().await?.sequence;
        }
        in_flight.push_back(publisher.send(envelope).await?);
    }
    for ack in in_flight {
        last_seq = ack.wait().await?.sequence;
    }
    let published_after = start.elapsed();
    // Applied = the position recorded in SQLite with the state.
    let conn = allot_store::rusqlite::Connection::open(&db)?;
    loop {
        let position = allot_store::position(&conn, "bench-telemetry")?.unwrap_or(0);
        if position >= last_seq {
            break;
        }
        if start.elapsed() > Duration::from_secs(600) {
            anyhow::bail!(
                "the inventory applied only {position} of {last_seq} events in 10 minutes"
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = start.elapsed();
    let cpu = Cpu::per_event(cpu, server, payloads.len());
    tracing::debug!(
        published_ms = published_after.as_millis() as u64,
        applied_ms = elapsed.as_millis() as u64,
        "allot path"
    );
    let _ = stop.send(());
    inventory.await??;
    client.drain().await.ok();
    Ok((total as f64 / elapsed.as_secs_f64(), cpu))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn pick_free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

/// The server's timestamp of a stored message, ms since the epoch.
fn server_ms(message: &jetstream::Message) -> Option<f64> {
    message
        .info()
        .ok()
        .map(|i| i.published.unix_timestamp_nanos() as f64 / 1e6)
}

/// The wall clock, ms since the epoch (one clock with the server's on loopback).
fn wall_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Connects to `url` and creates Allot's streams: the client, its JetStream context and a
/// publisher whose events come from `/allot/bench`.
async fn connect(url: &str) -> anyhow::Result<(async_nats::Client, jetstream::Context, Publisher)> {
    let client = async_nats::connect(url).await?;
    let js = jetstream::new(client.clone());
    allot_bus::ensure_streams(&js, &allot_bus::catalog(1)).await?;
    let publisher = Publisher::new(client.clone(), "/allot/bench");
    Ok((client, js, publisher))
}

/// The messages of `stream` on `filters` (every subject when empty), in order, through an
/// ordered consumer starting at `from` (`New`: what is stored from now on).
async fn follow(
    js: &jetstream::Context,
    stream: &str,
    filters: Vec<String>,
    from: jetstream::consumer::DeliverPolicy,
) -> anyhow::Result<pull::Ordered> {
    Ok(js
        .get_stream(stream)
        .await?
        .create_consumer(pull::OrderedConfig {
            filter_subjects: filters,
            deliver_policy: from,
            ..Default::default()
        })
        .await?
        .messages()
        .await?)
}

/// Every journal entry of `pool` from now on, as the executors read them.
async fn follow_journal(js: &jetstream::Context, pool: &str) -> anyhow::Result<pull::Ordered> {
    follow(
        js,
        allot_bus::streams::names::DECISIONS,
        vec![allot_events::subject::alloc_journal(pool)],
        jetstream::consumer::DeliverPolicy::New,
    )
    .await
}

/// Reports, as the executor of `node`, that `task`'s run under `lease` in `pool` completed.
async fn complete(
    publisher: &allot_bus::Publisher,
    pool: &str,
    task: allot_sched::TaskId,
    node: String,
    lease: allot_sched::LeaseId,
) -> Result<(), allot_bus::PublishError> {
    let done = allot_events::task::TaskCompleted {
        pool: pool.into(),
        task,
        node,
        lease,
    };
    publisher
        .publish(allot_events::TaskEvent::Completed(done))
        .await
        .map(drop)
}

/// Spawns a task that calls `f` with every decodable event of `messages`, the message it came
/// in (for the server's timestamp) and when it was delivered, until the consumer ends or fails.
fn on_each(
    mut messages: pull::Ordered,
    mut f: impl FnMut(allot_events::AnyEvent, &jetstream::Message, Instant) + Send + 'static,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    tokio::spawn(async move {
        while let Some(message) = messages.next().await {
            let message = message?;
            let seen = Instant::now();
            if let Ok(envelope) = allot_events::decode(&message.payload) {
                f(envelope.data, &message, seen);
            }
        }
        Ok(())
    })
}

/// A raw JetStream baseline's own file stream `name` on `subjects`, and what is stored in it
/// from now on.
async fn raw_stream(
    js: &jetstream::Context,
    name: &str,
    subjects: &str,
) -> anyhow::Result<pull::Ordered> {
    js.create_stream(jetstream::stream::Config {
        name: name.into(),
        subjects: vec![subjects.into()],
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await?;
    follow(
        js,
        name,
        Vec::new(),
        jetstream::consumer::DeliverPolicy::New,
    )
    .await
}

/// The submission of workload spec `text` (YAML), checked as `allot submit` checks it, from
/// `/allot/bench`.
fn submission(text: &str) -> anyhow::Result<allot_workload::submit::Submission> {
    let checked = allot_workload::check(
        text,
        allot_workload::Format::Yaml,
        allot_workload::Context::default(),
    )
    .map_err(|p| anyhow::anyhow!("bench spec rejected: {p:?}\n{text}"))?;
    let key = allot_workload::submit::idempotency_key(&checked.workload, None);
    Ok(allot_workload::submit::submission(
        checked.workload,
        key,
        None,
        "bench".into(),
        "/allot/bench",
        chrono::Utc::now(),
    ))
}
