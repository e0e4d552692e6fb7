//! `allot bench scale`: a simulated fleet through the real services and NATS (issue 15).
//!
//! One run on one fresh nats-server (file storage, no users), every service but the collector
//! in a child process of its own (`allot run <service>`, so each one's CPU and memory are its
//! own): inventory, planner, allocator, billing, archiver, predictor, remediation and gateway
//! (`--services` picks fewer). This process plays the fleet — what `--nodes` collectors would
//! do, from one process, because thousands of collector processes do not fit on one machine:
//!
//! 1. `--nodes` nodes of 8 H100s register (`NodeRegistered`); then, until the work is done,
//!    each publishes one `GpusSampled` every `--telemetry-interval` and a heartbeat every 5 s,
//!    spread evenly over the interval as unsynchronised collectors would be, every publish's
//!    PubAck awaited in a bounded window. The publisher never slows down to suit the machine:
//!    the rate it achieved and how late it ran are reported.
//! 2. It is every node's executor: one ordered consumer reads the pool's journal; for each
//!    grant it publishes `TaskStarted` and, the task's hold later, `TaskCompleted` (a run the
//!    journal preempts first is reported `TaskStopped` instead), as the collector's simulated
//!    executor does.
//! 3. `--workloads` workloads are submitted as `allot submit` does (validated first, then
//!    `WorkloadSubmitted` with its `Nats-Msg-Id`), paced at `--rate` from four teams: every
//!    `--pipeline-every`-th is a three-step pipeline (prep → train → eval), the others one task
//!    of 1, 2, 4 or 8 GPUs; each task holds its GPUs for between half and one and a half times
//!    `--hold`. **Submit → grant** is just before the publish → the grant of the workload's
//!    first task delivered from the journal.
//! 4. Baseline in the same run, under the same load: every 50 ms a 1 KiB message through a
//!    raw stream of its own, publish → delivery to an ordered consumer — what the bus and the
//!    loaded machine add without any of Allot's work.
//!
//! Afterwards, nothing may be lost or doubled: every workload finished and succeeded; every
//! durable consumer of every service has read and acknowledged everything (no pending, no
//! unacknowledged messages); no GPU is granted twice in the journal
//! ([`gpus_granted_twice`]); every lease is billed exactly lease time × price
//! ([`allot_billing::reconcile`]). The exit status is 1 when any of these fails. Every 5 s the
//! services' CPU and memory and the consumers' backlog are sampled; the report gives each
//! service's CPU seconds, peak memory and its consumers' largest backlog.
//!
//! The scheduling core alone at 100,000 GPUs is `allot bench placement --nodes 12500 --pending
//! 100000`; docs/benchmarks.md puts both together.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer::DeliverPolicy};
use bytes::Bytes;
use clap::Args;
use futures::StreamExt;
use serde::Serialize;

use allot_bus::Publisher;
use allot_bus::async_nats::jetstream::message::PublishMessage;
use allot_bus::streams::names;
use allot_events::alloc::{Applied, gpus_granted_twice};
use allot_events::cost::CostAccrued;
use allot_events::task::{StopCause, TaskStarted, TaskStopped};
use allot_events::workload::WorkloadOutcome;
use allot_events::{
    AllocEvent, AnyEvent, CostEvent, Envelope, NodeEvent, TaskEvent, WorkloadEvent, subject,
};
use allot_sched::{Decision, Input, LeaseId};

use super::super::local;
use super::super::settings::Lookup;
use super::Percentiles;
use super::process::{self, cpu_or_nan, memory_mib, own_cpu};

#[cfg(test)]
mod tests;

const POOL: &str = "default";
/// The teams the workloads come from, in turn.
const TEAMS: [&str; 4] = ["vision", "nlp", "speech", "ranking"];
/// Every service `allot up` runs but the collector.
const SERVICES: [&str; 8] = [
    "inventory",
    "planner",
    "allocator",
    "billing",
    "archiver",
    "predictor",
    "remediation",
    "gateway",
];
/// How often the services' CPU, memory and backlog are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// The stages of submit → grant, by the server's timestamps and the allocator's clock (the
/// time it gave the task's submission input, on this machine's clock too).
const SPLIT: [&str; 5] = [
    "1 publish → submission stored",
    "2 stored → TaskReady stored (planner)",
    "3 TaskReady stored → applied (allocator reads it)",
    "4 applied → grant journalled (allocator: pass, commit)",
    "5 journalled → grant delivered",
];
/// How often the baseline's probe goes through raw JetStream.
const PROBE_EVERY: Duration = Duration::from_millis(50);
/// Heartbeats of each node, as the collector sends them by default.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
/// The price of an H100-hour in the built-in price table (examples/prices.yaml).
const H100: &str = "H100";

/// Flags of `allot bench scale`.
#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// Simulated nodes of 8 H100s.
    #[arg(long, default_value_t = 2_000)]
    pub nodes: usize,
    /// Workloads submitted.
    #[arg(long, default_value_t = 50_000)]
    pub workloads: usize,
    /// Submissions per second.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Mean time a task holds its GPUs (each holds between half and one and a half times it).
    #[arg(long, default_value = "30s", value_parser = allot_workload::quantity::duration)]
    pub hold: Duration,
    /// Time between two telemetry samples of one node.
    #[arg(long, default_value = "1s", value_parser = allot_workload::quantity::duration)]
    pub telemetry_interval: Duration,
    /// Every N-th workload is a three-step pipeline (0: none).
    #[arg(long, default_value_t = 10)]
    pub pipeline_every: usize,
    /// Workloads submitted first whose latency is not counted.
    #[arg(long, default_value_t = 100)]
    pub warmup: usize,
    /// Telemetry publishes in flight (awaiting their PubAck) at once.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// The services to run, comma-separated (default: all but the collector).
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(SERVICES))]
    pub services: Vec<String>,
    /// How long after the last submission the work may take to finish and the services to
    /// catch up before the run counts as failed.
    #[arg(long, default_value = "10m", value_parser = allot_workload::quantity::duration)]
    pub settle: Duration,
    /// Write the results as JSON here.
    #[arg(long, default_value = "docs/results/scale.json")]
    pub json: PathBuf,
    /// Also write the pool's journal here, as `allot sim --journal` writes one: `allot replay
    /// --journal PATH --verify` then runs the allocator's passes of the whole run again, on one
    /// core, with nothing else in the way.
    #[arg(long)]
    pub journal: Option<PathBuf>,
}

/// What happened to one workload, as measured.
#[derive(Debug, Default, Clone, Copy)]
struct Journey {
    /// Just before its submission's publish.
    sent: Option<Instant>,
    /// Its first task's grant delivered.
    granted: Option<Instant>,
    /// Wall clock just before the publish, the server's times of the submission stored and
    /// the first task's `TaskReady` stored, the allocator's time of applying that task's
    /// submission, and the server's time of its grant journalled, ms since the epoch.
    sent_wall_ms: f64,
    stored_ms: Option<f64>,
    ready_ms: Option<f64>,
    applied_ms: Option<f64>,
    granted_ms: Option<f64>,
    /// It finished, and whether it succeeded.
    finished: Option<bool>,
}

/// A service's figures.
#[derive(Debug, Clone, Serialize)]
struct ServiceFigures {
    cpu_s: f64,
    cpu_share: f64,
    rss_mib: f64,
    peak_rss_mib: f64,
    /// Its durable consumers' largest backlog (pending + unacknowledged) seen in a sample.
    max_backlog: u64,
}

/// The run's figures and the checks' findings.
#[derive(Debug, Clone, Serialize)]
struct Report {
    nodes: usize,
    gpus: usize,
    workloads: usize,
    tasks_granted: usize,
    rate: f64,
    achieved_rate: f64,
    /// Submit → first task's grant delivered, ms.
    submit_to_grant_ms: Percentiles,
    /// The same, split by the server's timestamps: publish → submission stored, → `TaskReady`
    /// stored (the planner), → grant journalled (the allocator), → grant delivered.
    split_ms: BTreeMap<String, Percentiles>,
    /// Baseline in the same run, under the same load: a raw JetStream publish (PubAck awaited
    /// in the background) → delivery to an ordered consumer, every 50 ms, ms.
    raw_jetstream_ms: Percentiles,
    /// Grants per second while submissions went on.
    grants_per_s: f64,
    /// Journal entries (every input the allocator applied) per second over the run.
    journal_entries_per_s: f64,
    journal_entries: usize,
    preemptions: usize,
    telemetry_sent: usize,
    telemetry_per_s: f64,
    telemetry_target_per_s: f64,
    /// How far behind its schedule the telemetry publisher ran, ms.
    telemetry_lateness_ms: Percentiles,
    heartbeats_sent: usize,
    /// Peak GPUs busy (from grants and ends in the journal).
    peak_gpus_busy: f64,
    run_s: f64,
    services: BTreeMap<String, ServiceFigures>,
    nats_cpu_s: f64,
    nats_peak_rss_mib: f64,
    bench_cpu_s: f64,
    /// Workloads that never finished, or did not succeed.
    unfinished: usize,
    failed: usize,
    /// Durable consumers with anything pending or unacknowledged at the end.
    consumers_behind: Vec<String>,
    gpus_granted_twice: Vec<String>,
    cost_problems: Vec<String>,
    leases_billed: usize,
    billed_micros: i64,
}

impl Report {
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.unfinished > 0 {
            problems.push(format!("{} workloads never finished", self.unfinished));
        }
        if self.failed > 0 {
            problems.push(format!("{} workloads did not succeed", self.failed));
        }
        problems.extend(
            self.consumers_behind
                .iter()
                .map(|c| format!("consumer behind: {c}")),
        );
        problems.extend(
            self.gpus_granted_twice
                .iter()
                .map(|g| format!("GPU granted twice: {g}")),
        );
        problems.extend(self.cost_problems.iter().map(|c| format!("cost: {c}")));
        problems
    }
}

pub(super) async fn scale(args: ScaleArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.rate > 0.0, "--rate must be above zero");
    anyhow::ensure!(args.nodes > 0, "--nodes must be at least 1");
    anyhow::ensure!(args.window > 0, "--window must be at least 1");
    let services: Vec<String> = if args.services.is_empty() {
        SERVICES.iter().map(|s| (*s).to_owned()).collect()
    } else {
        args.services.clone()
    };
    for needed in ["planner", "allocator"] {
        anyhow::ensure!(
            services.iter().any(|s| s == needed),
            "--services: the {needed} is needed for work to run"
        );
    }
    let binary = local::nats_server_binary(env)?;
    let dir = tempfile::tempdir()?;
    // A free port, never the default 4222 (another server may want it).
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port();
    let nats = local::EmbeddedNats::start(&binary, dir.path(), port, None).await?;
    let url = nats.url().to_owned();
    let result = run(&args, &services, &url, nats.pid(), dir.path()).await;
    nats.stop().await;
    let report = result?;
    print(&args, &report);
    if let Some(parent) = args.json.parent() {
        std::fs::create_dir_all(parent).ok();
    }
    std::fs::write(&args.json, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    eprintln!("wrote {}", args.json.display());
    let problems = report.problems();
    if problems.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("lost or doubled:\n  {}", problems.join("\n  "));
        Ok(ExitCode::FAILURE)
    }
}

fn print(args: &ScaleArgs, r: &Report) {
    println!(
        "scale: {} nodes × 8 GPUs, {} workloads at {:.0}/s (achieved {:.1}/s), telemetry every \
         {} ms per node, {:.0} s",
        r.nodes,
        r.workloads,
        args.rate,
        r.achieved_rate,
        args.telemetry_interval.as_millis(),
        r.run_s
    );
    let p = &r.submit_to_grant_ms;
    println!(
        "submit → grant ms: n {} p50 {:.1} p95 {:.1} p99 {:.1} p99.9 {:.1} max {:.1}; floor p99 \
         ≤ 100 ms: {}",
        p.n,
        p.p50,
        p.p95,
        p.p99,
        p.p999,
        p.max,
        if p.p99 <= 100.0 { "met" } else { "MISSED" }
    );
    for (stage, p) in &r.split_ms {
        println!(
            "  {stage}: p50 {:.1} p95 {:.1} p99 {:.1} max {:.1}",
            p.p50, p.p95, p.p99, p.max
        );
    }
    let b = &r.raw_jetstream_ms;
    println!(
        "baseline, raw JetStream publish → delivery under the same load ms: n {} p50 {:.1} p99 {:.1} max {:.1}; ratio p50 {:.1}, p99 {:.1}",
        b.n,
        b.p50,
        b.p99,
        b.max,
        p.p50 / b.p50,
        p.p99 / b.p99
    );
    println!(
        "grants/s {:.1}, journal entries/s {:.1} ({} entries), tasks granted {}, preemptions {}, \
         peak GPUs busy {:.0}",
        r.grants_per_s,
        r.journal_entries_per_s,
        r.journal_entries,
        r.tasks_granted,
        r.preemptions,
        r.peak_gpus_busy
    );
    println!(
        "telemetry {:.0} events/s of {:.0} planned ({} sent; lateness p50 {:.0} ms, p99 {:.0} \
         ms), heartbeats {}",
        r.telemetry_per_s,
        r.telemetry_target_per_s,
        r.telemetry_sent,
        r.telemetry_lateness_ms.p50,
        r.telemetry_lateness_ms.p99,
        r.heartbeats_sent
    );
    println!("| process | CPU s | CPU share | RSS MiB | peak RSS MiB | largest backlog |");
    println!("|---|---|---|---|---|---|");
    for (name, s) in &r.services {
        println!(
            "| {name} | {:.1} | {:.2} | {:.0} | {:.0} | {} |",
            s.cpu_s, s.cpu_share, s.rss_mib, s.peak_rss_mib, s.max_backlog
        );
    }
    println!(
        "| nats-server | {:.1} | {:.2} | | {:.0} | |",
        r.nats_cpu_s,
        r.nats_cpu_s / r.run_s,
        r.nats_peak_rss_mib
    );
    println!(
        "| this bench (fleet and executor) | {:.1} | {:.2} | | | |",
        r.bench_cpu_s,
        r.bench_cpu_s / r.run_s
    );
    println!(
        "workloads unfinished {}, failed {}; consumers behind {}; GPUs granted twice {}; cost \
         problems {} ({} leases billed, {} micro-units)",
        r.unfinished,
        r.failed,
        r.consumers_behind.len(),
        r.gpus_granted_twice.len(),
        r.cost_problems.len(),
        r.leases_billed,
        r.billed_micros
    );
}

/// Workload `i`'s spec and how long each of its tasks holds its GPUs.
fn workload(i: usize, args: &ScaleArgs) -> (String, Duration) {
    let team = TEAMS[i % TEAMS.len()];
    // A fixed, even spread of holds and sizes: the same run every time without an RNG.
    let spread = (i as f64 * 0.618_033_988_75).fract();
    let hold = args.hold.mul_f64(0.5 + spread);
    let gpus = match (i * 7) % 20 {
        0..12 => 1,
        12..16 => 2,
        16..19 => 4,
        _ => 8,
    };
    let estimate = format!("{}s", hold.as_secs().max(1));
    let task = |name: &str, gpus: u32, after: Option<&str>| {
        let after = after.map_or(String::new(), |a| format!(", after: [{a}]"));
        format!(
            "    - {{name: {name}, resources: {{gpus: {gpus}}}, command: [python, {name}.py], \
             durationEstimate: {estimate}{after}}}\n"
        )
    };
    let tasks = if args.pipeline_every > 0 && i % args.pipeline_every == args.pipeline_every - 1 {
        [
            task("prep", 1, None),
            task("train", gpus, Some("prep")),
            task("eval", 1, Some("train")),
        ]
        .concat()
    } else {
        task("run", gpus, None)
    };
    (
        format!(
            "apiVersion: allot/v1\nkind: Workload\nmetadata: {{name: scale-{i}, team: {team}}}\n\
             spec:\n  tasks:\n{tasks}"
        ),
        hold,
    )
}

/// The first task of a workload spec made by [`workload`].
fn first_task(name: &str) -> bool {
    name == "run" || name == "prep"
}

/// The shared state of the run: journeys by workload index, and what the executor learned.
#[derive(Debug, Default)]
struct Shared {
    journeys: Vec<Journey>,
    index: HashMap<String, usize>,
    holds: Vec<Duration>,
    /// Leases the journal ended before their hold was up (preempted, or released because
    /// the task was cancelled): their runs report nothing more.
    ended: HashSet<LeaseId>,
    grants: usize,
    grants_while_submitting: usize,
    preemptions: usize,
    entries: usize,
    busy_milli: i64,
    peak_busy_milli: i64,
    /// Open leases: their GPU share and first node.
    leases: HashMap<LeaseId, (i64, String)>,
    finished: usize,
}

async fn run(
    args: &ScaleArgs,
    services: &[String],
    url: &str,
    nats_pid: u32,
    dir: &Path,
) -> anyhow::Result<Report> {
    let (client, js, publisher) = super::connect(url).await?;

    // The submissions, validated before anything is timed.
    let mut shared = Shared::default();
    let mut submissions = Vec::with_capacity(args.workloads);
    for i in 0..args.workloads {
        let (text, hold) = workload(i, args);
        let s = super::submission(&text)?;
        shared.index.insert(s.workload_id.clone(), i);
        shared.holds.push(hold);
        submissions.push(s);
    }
    shared.journeys = vec![Journey::default(); args.workloads];
    let shared = Arc::new(Mutex::new(shared));

    // The fleet registers, all before the services start.
    let names: Arc<Vec<String>> = Arc::new(
        (0..args.nodes)
            .map(|n| format!("scale-node-{n:05}"))
            .collect(),
    );
    let mut acks = VecDeque::new();
    for name in names.iter() {
        let node = super::remediation::registration(name, 8);
        let envelope = Envelope::new(
            format!("/allot/collector/{name}"),
            NodeEvent::Registered(node),
        );
        acks.push_back(publisher.send(&envelope).await?);
        if acks.len() >= args.window
            && let Some(ack) = acks.pop_front()
        {
            ack.wait().await?;
        }
    }
    for ack in acks {
        ack.wait().await?;
    }

    // The services.
    let prices = dir.join("prices.yaml");
    std::fs::write(&prices, super::super::run::DEFAULT_PRICES)?;
    let mut children = Vec::new();
    for service in services {
        let data = dir.join(service);
        let mut flags: Vec<OsString> = vec![service.into()];
        match service.as_str() {
            "allocator" => flags.extend(["--instance".into(), "scale-a1".into()]),
            "archiver" => flags.extend(["--db".into(), data.join("archive.db").into()]),
            "billing" => flags.extend([
                "--data-dir".into(),
                data.clone().into(),
                "--prices".into(),
                prices.clone().into(),
            ]),
            "gateway" => flags.extend([
                "--data-dir".into(),
                data.clone().into(),
                "--listen".into(),
                "127.0.0.1:0".into(),
            ]),
            _ => flags.extend(["--data-dir".into(), data.clone().into()]),
        }
        children.push(process::Child::start(service, &flags, &[], url, &data)?);
    }
    let ready = super::submit::wait_until_ready(
        &js,
        args.nodes,
        Duration::from_secs(60) + Duration::from_millis(20 * args.nodes as u64),
    )
    .await;
    for child in &mut children {
        child.exited()?;
    }
    ready?;
    eprintln!(
        "services ready; {} nodes in the allocator's journal",
        args.nodes
    );
    let start = Instant::now();
    let cpu_at_start: Vec<f64> = children.iter().map(process::Child::cpu_s).collect();
    let (nats_cpu0, own_cpu0) = (cpu_or_nan(nats_pid), own_cpu());

    // The executor: every grant started, then completed after its hold.
    let entries = super::follow_journal(&js, POOL).await?;
    let submitting = Arc::new(AtomicBool::new(true));
    let executor = {
        let (shared, publisher, submitting) =
            (shared.clone(), publisher.clone(), submitting.clone());
        super::on_each(entries, move |event, message, seen| {
            if let AnyEvent::Alloc(AllocEvent::Applied(applied)) = event {
                execute(
                    &applied,
                    (seen, super::server_ms(message)),
                    &shared,
                    &publisher,
                    submitting.load(Ordering::Relaxed),
                );
            }
        })
    };
    // Workloads finishing.
    let finishing = super::follow(
        &js,
        names::WORKLOADS,
        vec!["allot.workload.finished.>".into()],
        DeliverPolicy::New,
    )
    .await?;
    let (all_finished_tx, mut all_finished) = tokio::sync::watch::channel(0usize);
    let finisher = {
        let shared = shared.clone();
        super::on_each(finishing, move |event, _, _| {
            let AnyEvent::Workload(WorkloadEvent::Finished(f)) = event else {
                return;
            };
            let mut s = shared.lock().expect("not poisoned");
            let Some(&i) = s.index.get(&f.workload_id) else {
                return;
            };
            if s.journeys[i].finished.is_none() {
                s.journeys[i].finished = Some(f.outcome == WorkloadOutcome::Succeeded);
                s.finished += 1;
                let _ = all_finished_tx.send(s.finished);
            }
        })
    };

    // The server's times of the submissions and of the first tasks' TaskReady.
    let stamps = super::follow(
        &js,
        names::WORKLOADS,
        vec![
            "allot.workload.submitted.>".into(),
            subject::task("ready", POOL),
        ],
        DeliverPolicy::New,
    )
    .await?;
    let stamper = {
        let shared = shared.clone();
        super::on_each(stamps, move |event, message, _| {
            let at = super::server_ms(message);
            let mut s = shared.lock().expect("not poisoned");
            match event {
                AnyEvent::Workload(WorkloadEvent::Submitted(w)) => {
                    if let Some(&i) = s.index.get(&w.workload_id) {
                        s.journeys[i].stored_ms = at;
                    }
                }
                AnyEvent::Task(TaskEvent::Ready(r)) if first_task(&r.name) => {
                    if let Some(&i) = s.index.get(&r.workload) {
                        s.journeys[i].ready_ms.get_or_insert(at.unwrap_or(f64::NAN));
                    }
                }
                _ => {}
            }
        })
    };

    // The fleet's telemetry and heartbeats, until the work is done.
    let stop = Arc::new(AtomicBool::new(false));
    let telemetry = tokio::spawn(telemetry(
        publisher.clone(),
        names.clone(),
        args.telemetry_interval,
        args.window,
        start,
        stop.clone(),
    ));
    let heartbeats = tokio::spawn(super::remediation::heartbeats(
        publisher.clone(),
        names.clone(),
        HEARTBEAT_EVERY,
        start,
        stop.clone(),
    ));
    let probe = tokio::spawn(probe(js.clone(), stop.clone()));
    // Samples of the services' memory and backlog.
    let backlog: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let pids: Vec<(String, u32)> = children.iter().map(|c| (c.name.clone(), c.pid)).collect();
    let sampler = {
        let (js, backlog, stop) = (js.clone(), backlog.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(SAMPLE_EVERY).await;
                if let Ok(consumers) = durable_consumers(&js).await {
                    let mut most = backlog.lock().expect("not poisoned");
                    for (name, pending) in consumers {
                        let at = most.entry(service_of(&name, &pids)).or_default();
                        *at = (*at).max(pending);
                    }
                }
            }
        })
    };

    // Submissions, paced.
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut acks = VecDeque::new();
    let submitted_from = Instant::now();
    for (i, s) in submissions.into_iter().enumerate() {
        tick.tick().await;
        let message = PublishMessage::build()
            .message_id(s.msg_id)
            .payload(Bytes::from(s.envelope.to_json()));
        {
            let mut s = shared.lock().expect("not poisoned");
            s.journeys[i].sent = Some(Instant::now());
            s.journeys[i].sent_wall_ms = super::wall_ms();
        }
        acks.push_back(
            publisher
                .send_raw(s.envelope.nats_subject(), message)
                .await?,
        );
        if acks.len() >= args.window
            && let Some(ack) = acks.pop_front()
        {
            ack.wait().await?;
        }
        if i % 5_000 == 4_999 {
            let s = shared.lock().expect("not poisoned");
            eprintln!(
                "{} submitted, {} granted, {} finished, {:.0} s",
                i + 1,
                s.grants,
                s.finished,
                start.elapsed().as_secs_f64()
            );
        }
    }
    for ack in acks {
        ack.wait().await?;
    }
    let submitting_for = submitted_from.elapsed();
    submitting.store(false, Ordering::Relaxed);
    let achieved_rate = args.workloads as f64 / submitting_for.as_secs_f64().max(1e-9);
    eprintln!("all submitted in {:.0} s", submitting_for.as_secs_f64());

    // The work finishes; the fleet stops; every service catches up.
    let deadline = Instant::now() + args.settle;
    let finished =
        tokio::time::timeout(args.settle, all_finished.wait_for(|n| *n >= args.workloads))
            .await
            .is_ok();
    if !finished {
        eprintln!(
            "not every workload finished within {} s of the last submission",
            args.settle.as_secs()
        );
    }
    let run_s = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let published = telemetry.await??;
    let (heartbeats_sent, _) = heartbeats.await??;
    let raw_jetstream_ms = probe.await??;
    sampler.abort();
    let consumers_behind = caught_up(&js, deadline).await?;
    let run_cpu: Vec<f64> = children
        .iter()
        .zip(&cpu_at_start)
        .map(|(c, at)| c.cpu_s() - at)
        .collect();
    let (nats_cpu_s, bench_cpu_s) = (cpu_or_nan(nats_pid) - nats_cpu0, own_cpu() - own_cpu0);
    let nats_peak_rss_mib = memory_mib(nats_pid).1;

    // What the streams say: the journal and the costs.
    let mut policy = None;
    let applied: Vec<Applied> = read_all(&js, names::DECISIONS, &subject::alloc_journal(POOL))
        .await?
        .into_iter()
        .filter_map(|e| match e.data {
            AnyEvent::Alloc(AllocEvent::Applied(a)) => Some(a),
            AnyEvent::Alloc(AllocEvent::LeaderElected(l)) => {
                policy.get_or_insert(l.policy);
                None
            }
            _ => None,
        })
        .collect();
    if let Some(path) = &args.journal {
        let policy = policy.context("the journal names no leader, so no policy")?;
        write_journal(path, &policy, &applied)?;
        println!(
            "journal: {} entries written to {}",
            applied.len(),
            path.display()
        );
    }
    let twice = gpus_granted_twice(&applied);
    let prices = super::super::run::default_prices();
    let h100 = prices.at(0).gpu(H100);
    let mut reconciled = Default::default();
    if services.iter().any(|s| s == "billing") {
        // Billing publishes a lease's last period once it reads the release: wait (bounded)
        // until every lease is billed.
        loop {
            let costs: Vec<(String, CostAccrued)> = read_all(&js, names::COSTS, ">")
                .await?
                .into_iter()
                .filter_map(|e| match e.data {
                    AnyEvent::Cost(CostEvent::Accrued(c)) => Some((e.id.to_string(), c)),
                    _ => None,
                })
                .collect();
            reconciled = allot_billing::reconcile::reconcile(&applied, &costs, |m| {
                if m == H100 { h100 } else { None }
            });
            if reconciled.problems.is_empty() || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    let mut figures = BTreeMap::new();
    let backlog = backlog.lock().expect("not poisoned").clone();
    for (child, cpu) in children.iter().zip(run_cpu) {
        let (rss_mib, peak_rss_mib) = child.memory_mib();
        figures.insert(
            child.name.clone(),
            ServiceFigures {
                cpu_s: cpu,
                cpu_share: cpu / run_s,
                rss_mib,
                peak_rss_mib,
                max_backlog: backlog.get(&child.name).copied().unwrap_or(0),
            },
        );
    }
    for child in &mut children {
        child.stop().await;
    }
    executor.abort();
    finisher.abort();
    stamper.abort();
    client.drain().await.ok();

    let s = shared.lock().expect("not poisoned");
    let measured = s.journeys.iter().skip(args.warmup);
    let latencies: Vec<f64> = measured
        .clone()
        .filter_map(|j| Some(j.granted?.duration_since(j.sent?).as_secs_f64() * 1e3))
        .collect();
    let mut split: [Vec<f64>; 5] = Default::default();
    for j in measured {
        let (Some(seen), Some(stored), Some(ready), Some(applied), Some(granted)) = (
            j.granted,
            j.stored_ms,
            j.ready_ms,
            j.applied_ms,
            j.granted_ms,
        ) else {
            continue;
        };
        let seen_wall_ms = j.sent_wall_ms
            + j.sent
                .map_or(0.0, |sent| seen.duration_since(sent).as_secs_f64() * 1e3);
        split[0].push(stored - j.sent_wall_ms);
        split[1].push(ready - stored);
        split[2].push(applied - ready);
        split[3].push(granted - applied);
        split[4].push(seen_wall_ms - granted);
    }
    let split_ms = SPLIT
        .iter()
        .zip(split)
        .map(|(name, ms)| ((*name).to_owned(), Percentiles::of(ms)))
        .collect();
    Ok(Report {
        nodes: args.nodes,
        gpus: args.nodes * 8,
        workloads: args.workloads,
        tasks_granted: s.grants,
        rate: args.rate,
        achieved_rate,
        submit_to_grant_ms: Percentiles::of(latencies),
        split_ms,
        raw_jetstream_ms,
        grants_per_s: s.grants_while_submitting as f64 / submitting_for.as_secs_f64().max(1e-9),
        journal_entries_per_s: s.entries as f64 / run_s,
        journal_entries: s.entries,
        preemptions: s.preemptions,
        telemetry_sent: published.sent,
        telemetry_per_s: published.sent as f64 / published.elapsed.as_secs_f64().max(1e-9),
        telemetry_target_per_s: args.nodes as f64 / args.telemetry_interval.as_secs_f64(),
        telemetry_lateness_ms: Percentiles::of(published.lateness_ms),
        heartbeats_sent,
        peak_gpus_busy: s.peak_busy_milli as f64 / 1e3,
        run_s,
        services: figures,
        nats_cpu_s,
        nats_peak_rss_mib,
        bench_cpu_s,
        unfinished: s.journeys.iter().filter(|j| j.finished.is_none()).count(),
        failed: s
            .journeys
            .iter()
            .filter(|j| j.finished == Some(false))
            .count(),
        consumers_behind,
        gpus_granted_twice: twice,
        cost_problems: reconciled.problems,
        leases_billed: reconciled.leases,
        billed_micros: reconciled.total,
    })
}

/// The executor's part for one journal entry: records grants and ends, starts each granted
/// run and completes it after its hold unless the journal ends its lease first.
fn execute(
    applied: &Applied,
    (seen, journalled): (Instant, Option<f64>),
    shared: &Arc<Mutex<Shared>>,
    publisher: &Publisher,
    submitting: bool,
) {
    let mut s = shared.lock().expect("not poisoned");
    s.entries += 1;
    if let (Input::TaskSubmitted { at, .. }, Some(launch)) = (&applied.entry.input, &applied.launch)
        && first_task(&launch.name)
        && let Some(&i) = s.index.get(&launch.workload)
    {
        s.journeys[i].applied_ms.get_or_insert(*at as f64);
    }
    for d in &applied.entry.decisions {
        match d {
            Decision::Granted { lease, .. } => {
                let Some(g) = applied.dispatch.iter().find(|g| g.lease == *lease) else {
                    continue;
                };
                let milli: i64 = g
                    .nodes
                    .iter()
                    .flat_map(|n| &n.gpus)
                    .map(|(_, m)| i64::from(*m))
                    .sum();
                let node = g.nodes.first().map_or_else(String::new, |n| n.node.clone());
                s.leases.insert(*lease, (milli, node.clone()));
                s.busy_milli += milli;
                s.peak_busy_milli = s.peak_busy_milli.max(s.busy_milli);
                let Some(&i) = s.index.get(&g.launch.workload) else {
                    continue;
                };
                s.grants += 1;
                if submitting {
                    s.grants_while_submitting += 1;
                }
                if first_task(&g.launch.name) && s.journeys[i].granted.is_none() {
                    s.journeys[i].granted = Some(seen);
                    s.journeys[i].granted_ms = journalled;
                }
                let hold = s.holds[i];
                let started = TaskStarted {
                    pool: POOL.into(),
                    task: g.task,
                    node: node.clone(),
                    lease: *lease,
                    workload: g.launch.workload.clone(),
                    name: g.launch.name.clone(),
                    how: "simulated".into(),
                    log: None,
                };
                let (shared, publisher, lease, task) =
                    (shared.clone(), publisher.clone(), *lease, g.task);
                tokio::spawn(async move {
                    if let Err(e) = publisher.publish(TaskEvent::Started(started)).await {
                        tracing::warn!(error = %e, "publishing a start failed");
                    }
                    tokio::time::sleep(hold).await;
                    if shared.lock().expect("not poisoned").ended.contains(&lease) {
                        return;
                    }
                    if let Err(e) = super::complete(&publisher, POOL, task, node, lease).await {
                        tracing::warn!(error = %e, "publishing a completion failed");
                    }
                });
            }
            Decision::Released { lease, .. } => {
                if let Some((milli, _)) = s.leases.remove(lease) {
                    s.busy_milli -= milli;
                }
                s.ended.insert(*lease);
            }
            Decision::Preempted { task, lease, .. } => {
                let Some((milli, node)) = s.leases.remove(lease) else {
                    continue;
                };
                s.busy_milli -= milli;
                s.ended.insert(*lease);
                s.preemptions += 1;
                let stopped = TaskStopped {
                    pool: POOL.into(),
                    task: *task,
                    node,
                    cause: StopCause::Preempted,
                    checkpointed: false,
                    killed: false,
                    ran_ms: 0,
                    lease: Some(*lease),
                };
                let publisher = publisher.clone();
                tokio::spawn(async move {
                    if let Err(e) = publisher.publish(TaskEvent::Stopped(stopped)).await {
                        tracing::warn!(error = %e, "publishing a stop failed");
                    }
                });
            }
            _ => {}
        }
    }
}

/// What the telemetry publisher did.
struct Published {
    sent: usize,
    elapsed: Duration,
    lateness_ms: Vec<f64>,
}

/// One `GpusSampled` per node per `interval`, spread evenly over it, until `stop`.
async fn telemetry(
    publisher: Publisher,
    names: Arc<Vec<String>>,
    interval: Duration,
    window: usize,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Published> {
    let nodes = names.len();
    let step = interval.as_secs_f64() / nodes as f64;
    let mut in_flight = VecDeque::with_capacity(window);
    let mut lateness_ms = Vec::new();
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) {
        let due = Duration::from_secs_f64(sent as f64 * step);
        if start.elapsed() < due {
            tokio::time::sleep_until((start + due).into()).await;
        }
        lateness_ms.push(start.elapsed().saturating_sub(due).as_secs_f64() * 1e3);
        let (node, tick) = (sent % nodes, (sent / nodes) as u64);
        let event = super::remediation::sample(&names[node], node, 8, tick, None);
        let envelope = Envelope::new(format!("/allot/collector/{}", names[node]), event);
        in_flight.push_back(publisher.send(&envelope).await?);
        sent += 1;
        if in_flight.len() >= window
            && let Some(ack) = in_flight.pop_front()
        {
            ack.wait().await?;
        }
    }
    for ack in in_flight {
        ack.wait().await?;
    }
    Ok(Published {
        sent,
        elapsed: start.elapsed(),
        lateness_ms,
    })
}

/// The baseline: a small message through a raw stream of its own every [`PROBE_EVERY`] until
/// `stop`, publish → delivery to an ordered consumer, ms. Submissions are about as small.
async fn probe(js: jetstream::Context, stop: Arc<AtomicBool>) -> anyhow::Result<Percentiles> {
    let mut messages = super::raw_stream(&js, "BENCH_PROBE", "bench.probe.>").await?;
    let payload = Bytes::from(vec![b'x'; 1_024]);
    let mut tick = tokio::time::interval(PROBE_EVERY);
    let mut latencies = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let sent = Instant::now();
        let ack = js.publish("bench.probe.1", payload.clone()).await?;
        let ack = tokio::spawn(ack.into_future());
        let message = tokio::time::timeout(Duration::from_secs(30), messages.next())
            .await
            .context("the probe's message was not delivered within 30 s")?
            .context("the probe's consumer ended")??;
        latencies.push(sent.elapsed().as_secs_f64() * 1e3);
        drop(message);
        ack.await??;
    }
    js.delete_stream("BENCH_PROBE").await?;
    Ok(Percentiles::of(latencies))
}

/// Every durable consumer of every stream, with its backlog (pending + unacknowledged).
async fn durable_consumers(js: &jetstream::Context) -> anyhow::Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    let mut streams = js.stream_names();
    while let Some(stream) = streams.next().await {
        let stream = stream?;
        let mut consumers = js.get_stream(&stream).await?.consumers();
        while let Some(info) = consumers.next().await {
            let info = info?;
            if info.config.durable_name.is_none() {
                continue;
            }
            out.push((
                format!("{stream}/{}", info.name),
                info.num_pending + info.num_ack_pending as u64,
            ));
        }
    }
    Ok(out)
}

/// The service a durable consumer (`STREAM/name`) belongs to: the one whose name starts it.
fn service_of(consumer: &str, services: &[(String, u32)]) -> String {
    let name = consumer.split_once('/').map_or(consumer, |(_, n)| n);
    services
        .iter()
        .find(|(s, _)| name.starts_with(s.as_str()))
        .map_or_else(|| name.to_owned(), |(s, _)| s.clone())
}

/// Waits until every durable consumer has read and acknowledged everything, or `deadline`;
/// the ones still behind then, with their backlog.
async fn caught_up(js: &jetstream::Context, deadline: Instant) -> anyhow::Result<Vec<String>> {
    loop {
        let behind: Vec<String> = durable_consumers(js)
            .await?
            .into_iter()
            .filter(|(_, backlog)| *backlog > 0)
            .map(|(name, backlog)| format!("{name}: {backlog} behind"))
            .collect();
        if behind.is_empty() || Instant::now() > deadline {
            return Ok(behind);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Every event on `filter` in `stream`, in order.
async fn read_all(
    js: &jetstream::Context,
    stream: &str,
    filter: &str,
) -> anyhow::Result<Vec<Envelope>> {
    let mut messages =
        super::follow(js, stream, vec![filter.to_owned()], DeliverPolicy::All).await?;
    let mut out = Vec::new();
    // An empty subject delivers nothing: a quiet second ends the read.
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_secs(2), messages.next()).await
    {
        let message = message?;
        let pending = message.info().map_or(0, |i| i.pending);
        out.push(
            allot_events::decode(&message.payload)
                .with_context(|| format!("an undecodable event in {stream}"))?,
        );
        if pending == 0 {
            break;
        }
    }
    Ok(out)
}

/// Writes `applied`'s entries as a journal of `policy` at `path` (a header line, then one
/// entry per line), the format `allot replay --journal` reads.
fn write_journal(path: &Path, policy: &str, applied: &[Applied]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let file = std::fs::File::create(path)
        .with_context(|| format!("creating the journal {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    serde_json::to_writer(&mut out, &allot_sched::journal::Header::new(policy))?;
    out.write_all(b"\n")?;
    for a in applied {
        serde_json::to_writer(&mut out, &a.entry)?;
        out.write_all(b"\n")?;
    }
    out.flush()
        .with_context(|| format!("writing the journal {}", path.display()))
}
