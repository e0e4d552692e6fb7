//! `allot bench remediation`: how fast the remediation service acts on a fault in a large
//! fleet, and what watching that fleet costs it (issue 13).
//!
//! One run on one fresh nats-server (file storage, no users), with the remediation service in
//! a child process (`allot run remediation`, so its CPU and memory are its own):
//!
//! 1. `--nodes` simulated nodes register (`NodeRegistered`), then for `--duration` each sends
//!    one `GpusSampled` of `--gpus` cool GPUs every `--interval` and a heartbeat every
//!    `--heartbeat-interval`, both spread evenly over their interval as unsynchronised
//!    collectors would be; every event is a fresh envelope published through JetStream with
//!    its PubAck awaited in a bounded window. The publisher never slows down to suit the
//!    machine: the rate it achieved and how late it ran behind its schedule are reported.
//! 2. `--faults` overheat faults at seeded random times (none in the first 20 s) on distinct
//!    nodes: from then on two of the node's GPUs read 89 °C (1 °C under the 90 °C slowdown the
//!    service assumes when a sample names none, so within the rule's 3 °C margin) for 30 s.
//!    Each must bring a `drain` from the `overheat` rule. Their number is capped at what the
//!    circuit breaker lets through (a tenth of the nodes per ten minutes), so every fault can
//!    be acted on.
//! 3. An ordered consumer on REMEDIATION reads the actions. Per fault: **detection → action**
//!    = the action's stored time − the stored time of the reading that made the rule fire
//!    (`evidence[0].at`), both the server's clock; and **first hot reading → action**, which
//!    includes the rule's 5 s hold-down. A fault with no drain within 60 s of its first hot
//!    reading is missed.
//! 4. Baseline in the same run: an ordered consumer on TELEMETRY, stored → delivered for every
//!    sample — what the bus itself adds. Every 5 s: the service's consumer lag (`num_pending`
//!    of `remediation-telemetry` and `remediation-fleet`), and the CPU of the service, the
//!    nats-server and this process.
//! 5. Afterwards, what one commit of the service's state costs at the size it ended at
//!    (cloning the rules' state, JSON, the SQLite write), on the stored state itself.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::pull::OrderedConfig};
use clap::Args;
use futures::StreamExt;
use serde::Serialize;

use allot_bus::streams::names;
use allot_bus::{PendingAck, Publisher};
use allot_events::node::{GpuInfo, GpuSourceKind, HeartbeatSent, NodeRegistered};
use allot_events::remediation::Action;
use allot_events::telemetry::{GpuSample, GpusSampled};
use allot_events::{AnyEvent, Envelope, NodeEvent, RemediationEvent, subject};
use allot_remediation::store::Loaded;
use allot_remediation::{BreakerPolicy, Watch};

use super::super::local;
use super::super::settings::Lookup;
use super::process::{self, cpu_or_nan, own_cpu, status_kib, written_bytes};
use super::{Percentiles, server_ms, wall_ms};

#[cfg(test)]
mod tests;

/// The slowdown temperature every simulated GPU reports, °C.
const SLOWDOWN_C: u32 = allot_remediation::watch::DEFAULT_SLOWDOWN_C;
/// What a hot GPU reads, °C: 1 °C under its slowdown temperature, inside the overheat rule's
/// 3 °C margin.
const HOT_C: u32 = SLOWDOWN_C - 1;
/// GPUs that overheat in a fault: the overheat rule drains the node from two.
const HOT_GPUS: usize = 2;
/// How long a fault lasts.
const FAULT_LASTS: Duration = Duration::from_secs(30);
/// No fault starts before this, so registrations and the first readings have settled.
const QUIET_START: Duration = Duration::from_secs(20);
/// A fault with no drain this long after its first hot reading is missed.
const DETECT_WITHIN: Duration = Duration::from_secs(60);
/// How often the service's CPU and its consumers' lag are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// The overheat rule's name in the built-in rules.
const RULE: &str = "overheat";
/// Consumer durables of the service (its default prefix).
const TELEMETRY_DURABLE: &str = "remediation-telemetry";
const FLEET_DURABLE: &str = "remediation-fleet";

/// Flags of `allot bench remediation`.
#[derive(Debug, Args)]
pub struct RemediationArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 2_000)]
    pub nodes: usize,
    /// GPUs per node (at least two: a fault heats two).
    #[arg(long, default_value_t = 8)]
    pub gpus: u32,
    /// How long the fleet publishes telemetry.
    #[arg(long, default_value = "5m", value_parser = allot_workload::quantity::duration)]
    pub duration: Duration,
    /// Time between two telemetry samples of one node.
    #[arg(long, default_value = "1s", value_parser = allot_workload::quantity::duration)]
    pub interval: Duration,
    /// Time between two heartbeats of one node.
    #[arg(long, default_value = "5s", value_parser = allot_workload::quantity::duration)]
    pub heartbeat_interval: Duration,
    /// Overheat faults injected (at most what the circuit breaker lets through: a tenth of
    /// the nodes).
    #[arg(long, default_value_t = 40)]
    pub faults: usize,
    /// Seed of the faults' times, nodes and GPUs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Telemetry publishes in flight (awaiting their PubAck) at once.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// Write the results as JSON here.
    #[arg(long, default_value = "docs/results/remediation.json")]
    pub json: PathBuf,
}

/// One injected fault: from `at` (since the start of the load) for [`FAULT_LASTS`], GPUs
/// `gpus` of node `node` (an index) read [`HOT_C`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The node's index.
    pub node: usize,
    /// The GPUs that overheat.
    pub gpus: [u32; HOT_GPUS],
    /// When it starts, since the load started.
    pub at: Duration,
}

/// The most nodes the circuit breaker lets remediation take out of a fleet of `nodes` within
/// its window (the service's default policy).
pub fn breaker_cap(nodes: usize) -> usize {
    let policy = BreakerPolicy::default();
    ((nodes as f64 * policy.share).floor() as usize).max(1)
}

/// `count` faults on distinct nodes, starting uniformly between [`QUIET_START`] and
/// `duration − FAULT_LASTS`, in order of time; the same seed gives the same faults.
pub fn schedule(
    nodes: usize,
    gpus: u32,
    duration: Duration,
    count: usize,
    seed: u64,
) -> Result<Vec<Fault>, String> {
    if gpus < HOT_GPUS as u32 {
        return Err(format!("--gpus {gpus}: a fault heats {HOT_GPUS} GPUs"));
    }
    if count > nodes {
        return Err(format!(
            "{count} faults need as many nodes; there are {nodes}"
        ));
    }
    let Some(span) = duration.checked_sub(QUIET_START + FAULT_LASTS) else {
        return Err(format!(
            "--duration {} s leaves no time for a fault (none in the first {} s, each lasts {} s)",
            duration.as_secs(),
            QUIET_START.as_secs(),
            FAULT_LASTS.as_secs()
        ));
    };
    let mut rng = SplitMix64(seed);
    // A partial Fisher–Yates shuffle: the first `count` of a random order of the nodes.
    let mut order: Vec<usize> = (0..nodes).collect();
    let mut faults = Vec::with_capacity(count);
    for i in 0..count {
        let j = i + rng.below(nodes - i);
        order.swap(i, j);
        let first = rng.below(gpus as usize) as u32;
        let second = (first + 1 + rng.below(gpus as usize - 1) as u32) % gpus;
        let at = QUIET_START + span.mul_f64(rng.unit());
        // Whole milliseconds, so the schedule prints and compares exactly.
        let at = Duration::from_millis(at.as_millis() as u64);
        faults.push(Fault {
            node: order[i],
            gpus: [first, second],
            at,
        });
    }
    faults.sort_by_key(|f| (f.at, f.node));
    Ok(faults)
}

/// SplitMix64 (Steele, Lea and Flood): a small, seedable generator whose sequence never
/// changes with a dependency's version, so a seed names the same faults for ever.
#[derive(Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub(super) async fn remediation(
    args: RemediationArgs,
    env: Lookup<'_>,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.nodes > 0, "--nodes must be at least 1");
    anyhow::ensure!(args.window > 0, "--window must be at least 1");
    let cap = breaker_cap(args.nodes);
    let count = if args.faults > cap {
        eprintln!(
            "--faults {} is more than the circuit breaker lets through for {} nodes ({cap} per \
             10 min): injecting {cap}",
            args.faults, args.nodes
        );
        cap
    } else {
        args.faults
    };
    let faults = schedule(args.nodes, args.gpus, args.duration, count, args.seed)
        .map_err(anyhow::Error::msg)?;
    let binary = local::nats_server_binary(env)?;
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port();
    let nats = local::EmbeddedNats::start(&binary, &dir.path().join("server"), port, None).await?;
    let url = nats.url().to_owned();
    let result = run(&args, &faults, &url, nats.pid(), dir.path()).await;
    nats.stop().await;
    let report = result?;
    print(&args, &report);
    let json = report.json(&args);
    if let Some(parent) = args.json.parent() {
        std::fs::create_dir_all(parent).ok();
    }
    std::fs::write(&args.json, serde_json::to_vec_pretty(&json)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    eprintln!("wrote {}", args.json.display());
    Ok(if report.missed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Everything one run measured.
#[derive(Debug)]
struct Report {
    faults: usize,
    detected: usize,
    missed: usize,
    latency: Percentiles,
    hot_to_action: Percentiles,
    baseline: Percentiles,
    lateness: Percentiles,
    telemetry_sent: usize,
    telemetry_for: Duration,
    heartbeats_per_s: f64,
    cpu: CpuShares,
    rss_mib: f64,
    peak_rss_mib: f64,
    lag_at_end: BTreeMap<&'static str, u64>,
    lag_max: BTreeMap<&'static str, u64>,
    samples: Vec<Sample>,
    actions: BTreeMap<String, usize>,
    unexpected: usize,
    commit: Option<CommitCost>,
    written_mib: f64,
    batches: BTreeMap<&'static str, Batches>,
}

/// CPU used over the load, % of one core.
#[derive(Debug, Clone, Copy, Serialize)]
struct CpuShares {
    remediation: f64,
    nats_server: f64,
    bench: f64,
    remediation_peak_5s: f64,
}

/// One look at the service every [`SAMPLE_EVERY`].
#[derive(Debug, Clone, Serialize)]
struct Sample {
    t_s: f64,
    remediation_cpu_pct: f64,
    nats_server_cpu_pct: f64,
    bench_cpu_pct: f64,
    remediation_rss_mib: f64,
    telemetry_pending: u64,
    fleet_pending: u64,
}

/// What one commit of the service's state costs at its final size, measured on the stored
/// state: the same steps `Core::commit` and its callers take per batch.
#[derive(Debug, Clone, Serialize)]
struct CommitCost {
    /// The whole state as stored (the pool's row and every node's and grant's), JSON bytes.
    state_json_bytes: usize,
    /// What the batch changed, JSON bytes (what a commit writes).
    changed_json_bytes: usize,
    /// Collecting the records the batch changed (`Watch::take_changes`).
    changes_ms: f64,
    json_ms: f64,
    sqlite_ms: f64,
    wal_bytes_per_commit: f64,
}

/// An action as read back from REMEDIATION.
#[derive(Debug, Clone)]
struct Seen {
    node: String,
    action: Action,
    rule: String,
    stored_ms: f64,
    evidence_ms: Option<f64>,
}

impl Report {
    fn json(&self, args: &RemediationArgs) -> serde_json::Value {
        let target = args.nodes as f64 / args.interval.as_secs_f64();
        serde_json::json!({
            "benchmark": "remediation",
            "nodes": args.nodes,
            "gpus": args.gpus,
            "duration_s": args.duration.as_secs_f64(),
            "interval_s": args.interval.as_secs_f64(),
            "heartbeat_interval_s": args.heartbeat_interval.as_secs_f64(),
            "seed": args.seed,
            "telemetry_events_per_s_target": target,
            "telemetry_events_per_s_achieved": self.telemetry_sent as f64
                / self.telemetry_for.as_secs_f64().max(1e-9),
            "telemetry_events_sent": self.telemetry_sent,
            "telemetry_publish_s": self.telemetry_for.as_secs_f64(),
            "publish_lateness_ms": self.lateness,
            "heartbeats_per_s_achieved": self.heartbeats_per_s,
            "faults": self.faults,
            "detected": self.detected,
            "missed": self.missed,
            "latency_ms": self.latency,
            "hot_to_action_ms": self.hot_to_action,
            "baseline_delivery_ms": self.baseline,
            "remediation_cpu_pct": self.cpu.remediation,
            "remediation_cpu_pct_peak_5s": self.cpu.remediation_peak_5s,
            "nats_server_cpu_pct": self.cpu.nats_server,
            "bench_cpu_pct": self.cpu.bench,
            "remediation_rss_mib": self.rss_mib,
            "remediation_peak_rss_mib": self.peak_rss_mib,
            "remediation_written_mib": self.written_mib,
            "lag_at_end": self.lag_at_end,
            "lag_max": self.lag_max,
            "actions": self.actions,
            "unexpected_actions": self.unexpected,
            "commit_cost": self.commit,
            "batches": self.batches,
            "samples": self.samples,
        })
    }
}

fn print(args: &RemediationArgs, r: &Report) {
    let target = args.nodes as f64 / args.interval.as_secs_f64();
    let achieved = r.telemetry_sent as f64 / r.telemetry_for.as_secs_f64().max(1e-9);
    println!(
        "remediation: {} nodes × {} GPUs, telemetry every {} ms, heartbeats every {} ms, {} s, \
         {} overheat faults (seed {})",
        args.nodes,
        args.gpus,
        args.interval.as_millis(),
        args.heartbeat_interval.as_millis(),
        args.duration.as_secs(),
        r.faults,
        args.seed
    );
    println!("| measure | n | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    let row = |name: &str, s: &Percentiles| {
        println!(
            "| {name} | {} | {:.1} | {:.1} | {:.1} |",
            s.n, s.p50, s.p99, s.max
        );
    };
    row(
        "detection → action stored (firing reading stored → drain stored)",
        &r.latency,
    );
    row(
        "first hot reading stored → drain stored (includes the 5 s hold-down)",
        &r.hot_to_action,
    );
    row(
        "baseline: TELEMETRY stored → delivered (ordered consumer)",
        &r.baseline,
    );
    row("publisher behind its schedule", &r.lateness);
    println!();
    println!("| figure | value |");
    println!("|---|---|");
    println!("| telemetry events/s, target | {target:.0} |");
    println!(
        "| telemetry events/s, achieved | {achieved:.0} ({} events in {:.1} s) |",
        r.telemetry_sent,
        r.telemetry_for.as_secs_f64()
    );
    println!("| heartbeats/s, achieved | {:.0} |", r.heartbeats_per_s);
    println!(
        "| faults detected / injected | {} / {} (missed {}) |",
        r.detected, r.faults, r.missed
    );
    println!(
        "| remediation CPU, % of one core (peak 5 s) | {:.1} ({:.1}) |",
        r.cpu.remediation, r.cpu.remediation_peak_5s
    );
    println!(
        "| nats-server / bench CPU, % of one core | {:.1} / {:.1} |",
        r.cpu.nats_server, r.cpu.bench
    );
    println!(
        "| remediation RSS at end / peak, MiB | {:.1} / {:.1} |",
        r.rss_mib, r.peak_rss_mib
    );
    println!("| remediation wrote, MiB | {:.1} |", r.written_mib);
    for (durable, b) in &r.batches {
        println!(
            "| {durable}: batches (commits) /s, size mean / p50 / p99 / max | {:.0}, {:.1} / {:.0} \
             / {:.0} / {:.0} |",
            b.per_s, b.mean_size, b.size_p50, b.size_p99, b.size_max
        );
    }
    println!(
        "| consumer lag at end (telemetry, fleet) | {}, {} |",
        r.lag_at_end[TELEMETRY_DURABLE], r.lag_at_end[FLEET_DURABLE]
    );
    println!(
        "| consumer lag, most seen (telemetry, fleet) | {}, {} |",
        r.lag_max[TELEMETRY_DURABLE], r.lag_max[FLEET_DURABLE]
    );
    if let Some(c) = &r.commit {
        println!(
            "| one commit at the final state ({} B of JSON stored, {} B changed): changes / \
             JSON / SQLite | {:.3} / {:.3} / {:.3} ms ({:.0} B to the WAL) |",
            c.state_json_bytes,
            c.changed_json_bytes,
            c.changes_ms,
            c.json_ms,
            c.sqlite_ms,
            c.wal_bytes_per_commit
        );
    }
    let actions: Vec<String> = r.actions.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!("| actions | {} |", actions.join(", "));
    if r.unexpected > 0 {
        println!(
            "| actions not caused by a fault | {} (see `actions`) |",
            r.unexpected
        );
    }
    if achieved < target * 0.99 {
        println!(
            "the publisher could not sustain the target rate on this machine: {achieved:.0} of \
             {target:.0} events/s"
        );
    }
    println!(
        "floor p99 ≤ 1 s (detection → action): {}",
        if r.latency.p99 <= 1000.0 && r.missed == 0 {
            "met"
        } else {
            "MISSED"
        }
    );
}

async fn run(
    args: &RemediationArgs,
    faults: &[Fault],
    url: &str,
    nats_pid: u32,
    dir: &Path,
) -> anyhow::Result<Report> {
    let (client, js, publisher) = super::connect(url).await?;
    let names: Arc<Vec<String>> = Arc::new((1..=args.nodes).map(|i| format!("node-{i}")).collect());

    // The actions, from the start of REMEDIATION.
    let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
    let mut actions = super::follow(
        &js,
        names::REMEDIATION,
        vec![subject::remediation("action_taken", ">")],
        DeliverPolicy::All,
    )
    .await?;
    let watcher = {
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Some(message) = actions.next().await {
                let message = message?;
                let Some(stored_ms) = server_ms(&message) else {
                    continue;
                };
                let Ok(envelope) = allot_events::decode(&message.payload) else {
                    continue;
                };
                let AnyEvent::Remediation(RemediationEvent::ActionTaken(a)) = envelope.data else {
                    continue;
                };
                seen.lock().expect("not poisoned").push(Seen {
                    evidence_ms: a.evidence.first().map(|e| e.at.timestamp_millis() as f64),
                    node: a.node,
                    action: a.action,
                    rule: a.rule,
                    stored_ms,
                });
            }
            anyhow::Ok(())
        })
    };

    let mut service = Service::start(url, &dir.join("remediation")).await?;
    let result = measure(
        args, faults, &js, &publisher, &names, &seen, &service, url, nats_pid,
    )
    .await;
    let (rss_mib, peak_rss_mib) = service.memory_mib();
    service.stop().await;
    watcher.abort();
    client.drain().await.ok();
    let mut report = result?;
    report.rss_mib = rss_mib;
    report.peak_rss_mib = peak_rss_mib;
    report.commit = match commit_cost(&service.db, &dir.join("probe"), &names, args.gpus) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("measuring a commit of the stored state failed: {e:#}");
            None
        }
    };
    Ok(report)
}

/// The remediation service in a child process.
#[derive(Debug)]
struct Service {
    process: process::Child,
    pid: u32,
    db: PathBuf,
}

impl Service {
    /// Starts `allot run remediation` on `url` with its data under `data_dir`, and waits until
    /// its consumers exist.
    async fn start(url: &str, data_dir: &Path) -> anyhow::Result<Service> {
        let mut process = process::Child::start(
            "remediation",
            &["remediation".into(), "--data-dir".into(), data_dir.into()],
            &[],
            url,
            data_dir,
        )?;
        let client = async_nats::connect(url).await?;
        let js = jetstream::new(client);
        for _ in 0..300 {
            process.exited()?;
            let mut ready = true;
            for (stream, durable) in [
                (names::TELEMETRY, TELEMETRY_DURABLE),
                (names::FLEET, FLEET_DURABLE),
            ] {
                ready &= match js.get_stream(stream).await {
                    Ok(s) => s.consumer_info(durable).await.is_ok(),
                    Err(_) => false,
                };
            }
            if ready {
                return Ok(Service {
                    pid: process.pid,
                    process,
                    db: data_dir.join("remediation.db"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!("the remediation service's consumers did not appear within 30 s")
    }

    /// CPU seconds used so far.
    fn cpu_s(&self) -> f64 {
        self.process.cpu_s()
    }

    /// Resident memory now and at its peak, MiB.
    fn memory_mib(&self) -> (f64, f64) {
        self.process.memory_mib()
    }

    /// Stops it as its orchestrator would (SIGTERM, SIGKILL after 10 s).
    async fn stop(&mut self) {
        self.process.stop().await;
    }
}

/// Registers the fleet, then publishes its telemetry and heartbeats, watching the service.
#[allow(clippy::too_many_arguments)]
async fn measure(
    args: &RemediationArgs,
    faults: &[Fault],
    js: &jetstream::Context,
    publisher: &Publisher,
    names: &Arc<Vec<String>>,
    seen: &Arc<Mutex<Vec<Seen>>>,
    service: &Service,
    url: &str,
    nats_pid: u32,
) -> anyhow::Result<Report> {
    // Registrations, all processed before the clock starts (the breaker's cap follows them).
    let mut in_flight = VecDeque::new();
    for name in names.iter() {
        let envelope = Envelope::new(
            format!("/allot/collector/{name}"),
            NodeEvent::Registered(registration(name, args.gpus)),
        );
        in_flight.push_back(publisher.send(&envelope).await?);
        if in_flight.len() >= args.window
            && let Some(ack) = in_flight.pop_front()
        {
            ack.wait().await?;
        }
    }
    for ack in in_flight {
        ack.wait().await?;
    }
    let telemetry = js.get_stream(names::TELEMETRY).await?;
    let fleet = js.get_stream(names::FLEET).await?;
    let lag = |info: &jetstream::consumer::Info| info.num_pending + info.num_ack_pending as u64;
    for i in 0.. {
        if lag(&fleet.consumer_info(FLEET_DURABLE).await?) == 0 {
            break;
        }
        anyhow::ensure!(
            i < 600,
            "the service did not take the registrations within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "{} nodes registered; publishing for {} s",
        args.nodes,
        args.duration.as_secs()
    );

    // The baseline: every telemetry message, stored → delivered to a plain ordered consumer.
    let stop_baseline = Arc::new(AtomicBool::new(false));
    let mut stored = telemetry
        .create_consumer(OrderedConfig {
            deliver_policy: DeliverPolicy::New,
            ..Default::default()
        })
        .await?
        .messages()
        .await?;
    let baseline = {
        let stop = stop_baseline.clone();
        tokio::spawn(async move {
            let mut ms = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let next = tokio::time::timeout(Duration::from_millis(200), stored.next()).await;
                let Ok(Some(message)) = next else { continue };
                let message = message?;
                if let Some(at) = server_ms(&message) {
                    ms.push(wall_ms() - at);
                }
            }
            anyhow::Ok(ms)
        })
    };

    let (stop_batches, batches_stopped) = tokio::sync::oneshot::channel();
    let batches = watch_batches(url.to_owned(), batches_stopped);
    let start = Instant::now();
    let cpu_at_start = [service.cpu_s(), cpu_or_nan(nats_pid), own_cpu()];
    let written_at_start = written_bytes(service.pid);

    // Every 5 s: CPU and lag.
    let stop_monitor = Arc::new(AtomicBool::new(false));
    let monitor = {
        let stop = stop_monitor.clone();
        let (telemetry, fleet) = (telemetry.clone(), fleet.clone());
        let service_pid = service.pid;
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut last = (
                Instant::now(),
                [cpu_or_nan(service_pid), cpu_or_nan(nats_pid), own_cpu()],
            );
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + SAMPLE_EVERY, SAMPLE_EVERY);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let now = (
                    Instant::now(),
                    [cpu_or_nan(service_pid), cpu_or_nan(nats_pid), own_cpu()],
                );
                let wall = now.0.duration_since(last.0).as_secs_f64();
                let pct = |i: usize| (now.1[i] - last.1[i]) / wall * 100.0;
                let pending = |info: Result<jetstream::consumer::Info, _>| {
                    info.map(|i| lag(&i)).unwrap_or(u64::MAX)
                };
                let status = std::fs::read_to_string(format!("/proc/{service_pid}/status"))
                    .unwrap_or_default();
                samples.push(Sample {
                    t_s: now.0.duration_since(start).as_secs_f64(),
                    remediation_cpu_pct: pct(0),
                    nats_server_cpu_pct: pct(1),
                    bench_cpu_pct: pct(2),
                    remediation_rss_mib: status_kib(&status, "VmRSS")
                        .map_or(f64::NAN, |k| k as f64 / 1024.0),
                    telemetry_pending: pending(telemetry.consumer_info(TELEMETRY_DURABLE).await),
                    fleet_pending: pending(fleet.consumer_info(FLEET_DURABLE).await),
                });
                last = now;
            }
            samples
        })
    };

    // Heartbeats until told to stop (past the telemetry, while late drains are awaited).
    let stop_heartbeats = Arc::new(AtomicBool::new(false));
    let heartbeats = tokio::spawn(heartbeats(
        publisher.clone(),
        names.clone(),
        args.heartbeat_interval,
        start,
        stop_heartbeats.clone(),
    ));

    let published = telemetry_load(args, faults, publisher, names, start).await?;
    let load_for = start.elapsed();
    let cpu_at_end = [service.cpu_s(), cpu_or_nan(nats_pid), own_cpu()];
    let written_at_end = written_bytes(service.pid);
    let _ = stop_batches.send(());
    let batches = batches
        .join()
        .map_err(|_| anyhow::anyhow!("the batch watcher panicked"))??;
    let batches = [TELEMETRY_DURABLE, FLEET_DURABLE]
        .into_iter()
        .map(|d| {
            (
                d,
                Batches::of(batches.get(d).map_or(&[][..], |v| v), load_for),
            )
        })
        .collect();
    stop_baseline.store(true, Ordering::Relaxed);
    let mut lag_at_end = BTreeMap::new();
    lag_at_end.insert(
        TELEMETRY_DURABLE,
        lag(&telemetry.consumer_info(TELEMETRY_DURABLE).await?),
    );
    lag_at_end.insert(
        FLEET_DURABLE,
        lag(&fleet.consumer_info(FLEET_DURABLE).await?),
    );
    eprintln!(
        "telemetry done after {:.1} s; lag {:?}; waiting for the drains",
        load_for.as_secs_f64(),
        lag_at_end
    );

    // Late drains: up to DETECT_WITHIN after the last fault's first hot reading.
    let fault_nodes: HashMap<&str, usize> = faults
        .iter()
        .enumerate()
        .map(|(i, f)| (names[f.node].as_str(), i))
        .collect();
    let deadline = published
        .first_hot
        .iter()
        .flatten()
        .map(|(_, sent)| *sent + DETECT_WITHIN)
        .max()
        .unwrap_or_else(Instant::now);
    loop {
        let drained = seen
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|s| s.action == Action::Drain && s.rule == RULE)
            .filter(|s| fault_nodes.contains_key(s.node.as_str()))
            .count();
        if drained >= faults.len() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_heartbeats.store(true, Ordering::Relaxed);
    stop_monitor.store(true, Ordering::Relaxed);
    let (heartbeats_sent, heartbeats_for) = heartbeats.await??;
    let baseline = baseline.await??;
    let samples = monitor.await?;

    // The first hot readings' stored times.
    let mut first_hot_ms = vec![None; faults.len()];
    for (i, hot) in published.first_hot.iter().enumerate() {
        if let Some((seq, _)) = hot {
            let message = telemetry.get_raw_message(*seq).await?;
            first_hot_ms[i] = Some(message.time.unix_timestamp_nanos() as f64 / 1e6);
        }
    }
    let seen = seen.lock().expect("not poisoned").clone();
    let mut latency = Vec::new();
    let mut hot_to_action = Vec::new();
    let mut detected = 0;
    for (i, fault) in faults.iter().enumerate() {
        let drain = seen
            .iter()
            .find(|s| s.action == Action::Drain && s.rule == RULE && s.node == names[fault.node]);
        let (Some(drain), Some(hot)) = (drain, first_hot_ms[i]) else {
            continue;
        };
        if drain.stored_ms - hot > DETECT_WITHIN.as_secs_f64() * 1000.0 {
            continue;
        }
        detected += 1;
        hot_to_action.push(drain.stored_ms - hot);
        if let Some(at) = drain.evidence_ms {
            latency.push(drain.stored_ms - at);
        }
    }
    let mut actions = BTreeMap::new();
    let mut unexpected = 0;
    for s in &seen {
        *actions
            .entry(format!("{}/{}", s.rule, s.action.as_str()))
            .or_insert(0) += 1;
        if !(s.rule == RULE && fault_nodes.contains_key(s.node.as_str())) {
            unexpected += 1;
        }
    }
    let wall = load_for.as_secs_f64();
    let share = |i: usize| (cpu_at_end[i] - cpu_at_start[i]) / wall * 100.0;
    let lag_max = [TELEMETRY_DURABLE, FLEET_DURABLE]
        .into_iter()
        .map(|d| {
            let most = samples
                .iter()
                .map(|s| {
                    if d == TELEMETRY_DURABLE {
                        s.telemetry_pending
                    } else {
                        s.fleet_pending
                    }
                })
                .max()
                .unwrap_or(0)
                .max(lag_at_end[d]);
            (d, most)
        })
        .collect();
    Ok(Report {
        faults: faults.len(),
        detected,
        missed: faults.len() - detected,
        latency: Percentiles::of(latency),
        hot_to_action: Percentiles::of(hot_to_action),
        baseline: Percentiles::of(baseline),
        lateness: Percentiles::of(published.lateness_ms),
        telemetry_sent: published.sent,
        telemetry_for: published.elapsed,
        heartbeats_per_s: heartbeats_sent as f64 / heartbeats_for.as_secs_f64().max(1e-9),
        cpu: CpuShares {
            remediation: share(0),
            nats_server: share(1),
            bench: share(2),
            remediation_peak_5s: samples
                .iter()
                .map(|s| s.remediation_cpu_pct)
                .fold(0.0, f64::max),
        },
        rss_mib: f64::NAN,
        peak_rss_mib: f64::NAN,
        lag_at_end,
        lag_max,
        samples,
        actions,
        unexpected,
        commit: None,
        written_mib: (written_at_end - written_at_start) as f64 / (1024.0 * 1024.0),
        batches,
    })
}

/// What the telemetry publisher did.
#[derive(Debug)]
struct Published {
    sent: usize,
    elapsed: Duration,
    lateness_ms: Vec<f64>,
    /// Per fault, the stream sequence of its first hot reading and when it was sent.
    first_hot: Vec<Option<(u64, Instant)>>,
}

/// One sample per node per interval for the duration, node `i` of `n` at `i / n` of each
/// interval; never slowed down: when behind its schedule it publishes as fast as acks allow.
async fn telemetry_load(
    args: &RemediationArgs,
    faults: &[Fault],
    publisher: &Publisher,
    names: &[String],
    start: Instant,
) -> anyhow::Result<Published> {
    let nodes = names.len();
    let ticks = (args.duration.as_secs_f64() / args.interval.as_secs_f64()).floor() as usize;
    let total = ticks * nodes;
    let step = args.interval.as_secs_f64() / nodes as f64;
    let mut fault_of = vec![None; nodes];
    for (i, f) in faults.iter().enumerate() {
        fault_of[f.node] = Some(i);
    }
    let mut first_hot = vec![None; faults.len()];
    let mut lateness_ms = Vec::with_capacity(total);
    let mut in_flight: VecDeque<(PendingAck, Option<usize>, Instant)> =
        VecDeque::with_capacity(args.window);
    let mut tagged = vec![false; faults.len()];
    for j in 0..total {
        let (tick, node) = (j / nodes, j % nodes);
        let due = Duration::from_secs_f64(j as f64 * step);
        if start.elapsed() < due {
            tokio::time::sleep_until((start + due).into()).await;
        }
        lateness_ms.push(start.elapsed().saturating_sub(due).as_secs_f64() * 1000.0);
        let hot = fault_of[node]
            .map(|f| (f, &faults[f]))
            .filter(|(_, f)| f.at <= due && due < f.at + FAULT_LASTS);
        let event = sample(
            &names[node],
            node,
            args.gpus,
            tick as u64,
            hot.map(|(_, f)| f),
        );
        let envelope = Envelope::new(format!("/allot/collector/{}", names[node]), event);
        let sent = Instant::now();
        let ack = publisher.send(&envelope).await?;
        // Only the first hot reading of each fault is tagged.
        let tag = hot.map(|(f, _)| f).filter(|f| !tagged[*f]);
        if let Some(f) = tag {
            tagged[f] = true;
        }
        in_flight.push_back((ack, tag, sent));
        if in_flight.len() >= args.window
            && let Some(oldest) = in_flight.pop_front()
        {
            settle(oldest, &mut first_hot).await?;
        }
    }
    for oldest in in_flight {
        settle(oldest, &mut first_hot).await?;
    }
    Ok(Published {
        sent: total,
        elapsed: start.elapsed(),
        lateness_ms,
        first_hot,
    })
}

/// Awaits one telemetry PubAck; a fault's first hot reading keeps its stream sequence.
async fn settle(
    (ack, fault, sent): (PendingAck, Option<usize>, Instant),
    first_hot: &mut [Option<(u64, Instant)>],
) -> anyhow::Result<()> {
    let published = ack.wait().await?;
    if let Some(f) = fault {
        first_hot[f].get_or_insert((published.sequence, sent));
    }
    Ok(())
}

/// One heartbeat per node per interval, spread evenly over it, until `stop`; how many were
/// sent, and over how long.
pub(super) async fn heartbeats(
    publisher: Publisher,
    names: Arc<Vec<String>>,
    interval: Duration,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<(usize, Duration)> {
    let nodes = names.len();
    let step = interval.as_secs_f64() / nodes as f64;
    let mut in_flight = VecDeque::with_capacity(64);
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) {
        let due = Duration::from_secs_f64(sent as f64 * step);
        if start.elapsed() < due {
            tokio::time::sleep_until((start + due).into()).await;
        }
        let node = &names[sent % nodes];
        let heartbeat = HeartbeatSent {
            node: node.clone(),
            seq: (sent / nodes) as u64 + 1,
            uptime_s: due.as_secs(),
        };
        let envelope = Envelope::new(
            format!("/allot/collector/{node}"),
            NodeEvent::HeartbeatSent(heartbeat),
        );
        in_flight.push_back(publisher.send(&envelope).await?);
        sent += 1;
        if in_flight.len() >= 64
            && let Some(ack) = in_flight.pop_front()
        {
            let ack: PendingAck = ack;
            ack.wait().await?;
        }
    }
    for ack in in_flight {
        ack.wait().await?;
    }
    Ok((sent, start.elapsed()))
}

/// Node `name`'s samples at `tick`: cool, busy GPUs, or two overheating ones during `fault`.
pub(super) fn sample(
    name: &str,
    node: usize,
    gpus: u32,
    tick: u64,
    fault: Option<&Fault>,
) -> GpusSampled {
    let samples = (0..gpus)
        .map(|g| {
            let mix = node as u64 * 31 + u64::from(g) * 17 + tick * 7;
            let hot = fault.is_some_and(|f| f.gpus.contains(&g));
            GpuSample {
                index: g,
                uuid: format!("GPU-{name}-{g}"),
                utilization_pct: Some(60 + (mix % 41) as u8),
                memory_used_mib: 30_000 + (mix * 997) % 40_000,
                memory_total_mib: 81_559,
                temperature_c: Some(if hot { HOT_C } else { 55 + (mix % 11) as u32 }),
                power_mw: Some(350_000 + (mix * 7_919) % 250_000),
                power_limit_mw: Some(700_000),
                ecc_corrected: Some(0),
                ecc_uncorrected: Some(0),
                xid_errors: Some(0),
                last_xid: None,
                xids: Vec::new(),
                slowdown_temperature_c: Some(SLOWDOWN_C),
                throttle_reasons: Vec::new(),
                rows_remapped_uncorrectable: Some(0),
                row_remap_failed: Some(false),
                nvlink_errors: Some(0),
            }
        })
        .collect();
    GpusSampled {
        node: name.to_owned(),
        samples,
        held: Vec::new(),
    }
}

/// A simulated node of pool `default`: `gpus` × H100 80 GB, 64 cores, 512 GiB.
pub(super) fn registration(name: &str, gpus: u32) -> NodeRegistered {
    NodeRegistered {
        node: name.into(),
        hostname: name.into(),
        pool: "default".into(),
        rack: None,
        cpu_milli: 64_000,
        memory_mib: 512 * 1024,
        gpu_source: GpuSourceKind::Simulated,
        driver_version: None,
        gpus: (0..gpus)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{name}-{i}"),
                model: "H100".into(),
                memory_total_mib: 81_559,
                power_limit_mw: Some(700_000),
                nvlink_peers: Vec::new(),
            })
            .collect(),
    }
}

/// The batches one of the service's consumers handled during the load: how many, and their
/// sizes.
#[derive(Debug, Clone, Default, Serialize)]
struct Batches {
    count: usize,
    per_s: f64,
    mean_size: f64,
    size_p50: f64,
    size_p99: f64,
    size_max: f64,
}

/// Acknowledgements closer together than this belong to one batch. The runner acknowledges a
/// batch's messages one after the other once its commit is done, and gathers the next batch
/// for at least its 5 ms linger, so bursts are well apart.
const SAME_BATCH: Duration = Duration::from_micros(2_500);

/// Watches the service's acknowledgements (`$JS.ACK.<stream>.<durable>.…`, which any client
/// may subscribe to) on a thread and connection of its own, so its clock is not held up by
/// the publisher; each burst is one batch, one commit of the service's whole state. Stops
/// when `stop` fires, with the sizes of the batches per durable.
fn watch_batches(
    url: String,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> std::thread::JoinHandle<anyhow::Result<BTreeMap<&'static str, Vec<usize>>>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let client = async_nats::connect(&url).await?;
            let durables = [TELEMETRY_DURABLE, FLEET_DURABLE];
            // Servers name the stream and the durable at different tokens depending on the
            // version (with or without the domain and account): match the durable's token.
            let mut acks = client.subscribe("$JS.ACK.>").await?;
            let mut sizes: BTreeMap<&'static str, Vec<usize>> = BTreeMap::new();
            let mut open: HashMap<&'static str, (Instant, usize)> = HashMap::new();
            tokio::pin!(stop);
            loop {
                let message = tokio::select! {
                    _ = &mut stop => break,
                    m = acks.next() => match m {
                        Some(m) => m,
                        None => break,
                    },
                };
                // An acknowledgement is an empty message or `+ACK` (not `+WPI`, `-NAK` …).
                if !(message.payload.is_empty() || message.payload.starts_with(b"+ACK")) {
                    continue;
                }
                let now = Instant::now();
                let Some(durable) = durables
                    .into_iter()
                    .find(|d| message.subject.split('.').any(|token| token == *d))
                else {
                    continue;
                };
                match open.get_mut(durable) {
                    Some((last, n)) if now.duration_since(*last) < SAME_BATCH => {
                        *last = now;
                        *n += 1;
                    }
                    burst => {
                        if let Some((_, n)) = burst {
                            sizes.entry(durable).or_default().push(*n);
                        }
                        open.insert(durable, (now, 1));
                    }
                }
            }
            for (durable, (_, n)) in open {
                sizes.entry(durable).or_default().push(n);
            }
            anyhow::Ok(sizes)
        })
    })
}

impl Batches {
    fn of(sizes: &[usize], over: Duration) -> Batches {
        let spread = Percentiles::of(sizes.iter().map(|&n| n as f64).collect());
        Batches {
            count: sizes.len(),
            per_s: sizes.len() as f64 / over.as_secs_f64().max(1e-9),
            mean_size: sizes.iter().sum::<usize>() as f64 / sizes.len().max(1) as f64,
            size_p50: spread.p50,
            size_p99: spread.p99,
            size_max: spread.max,
        }
    }
}

/// What one of the service's commits costs at the state it stored last, replayed the way
/// `Feed::handle` and `Core::commit` do it — weigh the batch (here one heartbeat and one cool
/// sample, not timed), collect what it changed (`Watch::take_changes`), JSON, and the SQLite
/// transaction — on a scratch database opened as the service opens its own.
fn commit_cost(
    db: &Path,
    scratch: &Path,
    names: &[String],
    gpus: u32,
) -> anyhow::Result<CommitCost> {
    const ROUNDS: u32 = 200;
    let conn = allot_store::rusqlite::Connection::open(db)?;
    let mut watch = match allot_remediation::store::load(&conn)?.context("no state was stored")? {
        Loaded::Rows(stored) => Watch::restore(
            allot_health::RuleSet::default(),
            BreakerPolicy::default(),
            stored,
        ),
        Loaded::Whole(state) => Watch::restore_whole(
            allot_health::RuleSet::default(),
            BreakerPolicy::default(),
            *state,
        ),
    };
    let state_json_bytes = serde_json::to_string(&watch.stored())?.len();
    let mut probe = allot_store::open(
        &scratch.join("probe.db"),
        allot_remediation::store::MIGRATIONS,
    )?;
    // Every commit's frames stay in the WAL, to be counted.
    probe.pragma_update(None, "wal_autocheckpoint", 0)?;
    let wal = || std::fs::metadata(scratch.join("probe.db-wal")).map_or(0, |m| m.len());
    let now = allot_remediation::watch::millis(chrono::Utc::now());
    let mut spent = [Duration::ZERO; 3];
    let mut changed_bytes = 0;
    let mut wal_before = 0;
    let mut last_pool = None;
    // Round 0 writes every node into the fresh database, and is not counted.
    for round in 0..=ROUNDS {
        let i = round as usize % names.len();
        let at = now + u64::from(round) * 5;
        if round == 0 {
            watch.mark_all_changed();
            let tx = probe.transaction()?;
            allot_remediation::store::save(&tx, &watch.take_changes(), &mut last_pool)?;
            tx.commit()?;
            wal_before = wal();
            continue;
        }
        watch.heartbeat(&names[i], at);
        watch.sampled(&sample(&names[i], i, gpus, u64::from(round), None), at);
        let started = Instant::now();
        let changes = watch.take_changes();
        let collected = started.elapsed();
        let started = Instant::now();
        for (_, record) in &changes.nodes {
            changed_bytes += std::hint::black_box(serde_json::to_string(record)?).len();
        }
        let encoded = started.elapsed();
        let started = Instant::now();
        let tx = probe
            .transaction_with_behavior(allot_store::rusqlite::TransactionBehavior::Immediate)?;
        allot_remediation::store::save(&tx, &changes, &mut last_pool)?;
        tx.commit()?;
        // `save` makes the JSON again: take it out to leave the SQLite write alone.
        let stored = started.elapsed().saturating_sub(encoded);
        for (total, d) in spent.iter_mut().zip([collected, encoded, stored]) {
            *total += d;
        }
    }
    let per = |d: Duration| d.as_secs_f64() * 1000.0 / f64::from(ROUNDS);
    Ok(CommitCost {
        state_json_bytes,
        changed_json_bytes: changed_bytes / ROUNDS as usize,
        changes_ms: per(spent[0]),
        json_ms: per(spent[1]),
        sqlite_ms: per(spent[2]),
        wal_bytes_per_commit: wal().saturating_sub(wal_before) as f64 / f64::from(ROUNDS),
    })
}
