//! `allot bench placement`: the scheduling core's placement throughput for every policy in one
//! process — the pass of `cargo bench -p allot-sched --bench placement` ([`allot_sched::bench`]:
//! 1,250 nodes × 8 GPUs, ~62 % busy, 10,000 pending tasks), each policy on the same state.
//!
//! Each policy's pass runs `--runs` times on a freshly prepared scheduler (a pass changes it);
//! the median is reported, in wall time and in the thread's CPU time (less sensitive to other
//! work on a shared machine). Decisions per second counts the pass's grants, as the criterion
//! bench does. `--nodes` and `--pending` scale the same mix (the core at 100,000 GPUs:
//! `--nodes 12500 --pending 100000`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;

use allot_sched::Decision;
use allot_sched::policy::NAMES;

/// Flags of `allot bench placement`.
#[derive(Debug, Args)]
pub struct PlacementArgs {
    /// Policies to measure, comma-separated (default: every policy that schedules live).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Passes per policy; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Nodes of 8 GPUs (12,500 for the core at 100,000 GPUs).
    #[arg(long, default_value_t = allot_sched::bench::NODES)]
    pub nodes: usize,
    /// Tasks waiting when the measured pass runs.
    #[arg(long, default_value_t = allot_sched::bench::PENDING)]
    pub pending: u64,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One policy's figures.
#[derive(Debug, serde::Serialize)]
struct PolicyResult {
    /// Grants per second of the median pass (wall time).
    decisions_per_s: f64,
    /// Median pass, wall time, ms.
    pass_ms: f64,
    /// Median pass, the thread's CPU time, ms.
    pass_cpu_ms: f64,
    /// Grants per second of CPU time.
    decisions_per_cpu_s: f64,
    /// Grants in the pass.
    grants: usize,
    /// Preemptions in the pass.
    preemptions: usize,
    /// Tasks still pending after it.
    pending_after: usize,
    /// Passes measured.
    runs: usize,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    scenario: String,
    policies: BTreeMap<String, PolicyResult>,
}

/// The default policies: the baselines and ours (the oracles need true durations).
const DEFAULT: [&str; 5] = ["fifo", "kueue", "allot", "bestfit", "fgd"];

pub fn placement(args: PlacementArgs) -> anyhow::Result<ExitCode> {
    let policies: Vec<String> = if args.policies.is_empty() {
        DEFAULT.iter().map(|p| (*p).to_owned()).collect()
    } else {
        args.policies.clone()
    };
    let unknown: Vec<&str> = policies
        .iter()
        .map(String::as_str)
        .filter(|p| !NAMES.contains(p))
        .collect();
    if !unknown.is_empty() {
        bail!(
            "--policies: unknown {} (known: {})",
            unknown.join(", "),
            NAMES.join(", ")
        );
    }
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if args.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let size = allot_sched::bench::Size {
        nodes: args.nodes,
        pending: args.pending,
    };
    let scenario = format!(
        "{} nodes × {} GPUs, {} pending",
        size.nodes,
        allot_sched::bench::GPUS_PER_NODE,
        size.pending
    );
    eprintln!("placement: {scenario}; {} passes per policy", args.runs);
    println!(
        "{:<10} {:>10} {:>10} {:>12} {:>8} {:>8}",
        "POLICY", "PASS MS", "CPU MS", "DECISIONS/S", "GRANTS", "PREEMPT"
    );
    let mut results = BTreeMap::new();
    for policy in &policies {
        let mut walls = Vec::new();
        let mut cpus = Vec::new();
        let mut outcome = None;
        for _ in 0..args.runs {
            let mut s = allot_sched::bench::prepared_at(policy, size);
            let (cpu0, wall0) = (thread_cpu_ms(), Instant::now());
            let decisions = allot_sched::bench::pass(&mut s);
            walls.push(wall0.elapsed().as_secs_f64() * 1e3);
            cpus.push(thread_cpu_ms() - cpu0);
            let count = |f: fn(&Decision) -> bool| decisions.iter().filter(|d| f(d)).count();
            let this = (
                count(|d| matches!(d, Decision::Granted { .. })),
                count(|d| matches!(d, Decision::Preempted { .. })),
                s.pending(),
            );
            // The pass is deterministic: every run must decide the same.
            if outcome.is_some_and(|o| o != this) {
                bail!("{policy}: two passes on the same state decided differently");
            }
            outcome = Some(this);
        }
        let (grants, preemptions, pending_after) = outcome.expect("at least one run");
        let (pass_ms, pass_cpu_ms) = (median(walls), median(cpus));
        let result = PolicyResult {
            decisions_per_s: grants as f64 / (pass_ms / 1e3),
            pass_ms,
            pass_cpu_ms,
            decisions_per_cpu_s: grants as f64 / (pass_cpu_ms / 1e3),
            grants,
            preemptions,
            pending_after,
            runs: args.runs,
        };
        println!(
            "{:<10} {:>10.1} {:>10.1} {:>12.0} {:>8} {:>8}",
            policy, result.pass_ms, result.pass_cpu_ms, result.decisions_per_s, grants, preemptions
        );
        results.insert(policy.clone(), result);
    }
    if let Some(path) = &args.json {
        let report = Report {
            scenario,
            policies: results,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// CPU time this thread has used, ms (0 where the clock is unavailable).
fn thread_cpu_ms() -> f64 {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(0.0, |t| t.tv_sec() as f64 * 1e3 + t.tv_nsec() as f64 / 1e6)
}
