//! `allot sim`: replays a trace through allot-sched under several policies in one process and
//! prints one comparison table.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use comfy_table::{Table, presets::NOTHING};

use allot_sched::NodeSpec;
use allot_sim::scenario::{self, Scenario};
use allot_sim::{SimConfig, SimResult};

/// Flags of `allot sim`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// A named scenario (philly-640).
    #[arg(long, conflicts_with = "trace")]
    pub scenario: Option<String>,
    /// A trace instead of a scenario: `generic:PATH` (CSV with submit_time,duration,num_gpus…).
    #[arg(long)]
    pub trace: Option<String>,
    /// The cluster for --trace: `NODESxGPUS[:MODEL]`, e.g. `80x8:A100`.
    #[arg(long, requires = "trace")]
    pub cluster: Option<String>,
    /// Policies to compare, comma-separated.
    #[arg(long, default_value = "fifo,sjf-oracle")]
    pub policies: String,
    /// Folder with the traces (default: ../shared/traces from the project root).
    #[arg(long)]
    pub traces: Option<PathBuf>,
    /// Run time between checkpoints: a preempted job loses the work since its last one.
    #[arg(long, default_value = "15m")]
    pub checkpoint_every: humantime::Duration,
    /// Time a restarted job needs before it makes progress again.
    #[arg(long, default_value = "60s")]
    pub restart_overhead: humantime::Duration,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write SVG charts here: JCT CDF per policy, GPUs allocated and queue length over time.
    #[arg(long)]
    pub plots: Option<PathBuf>,
}

/// Runs `allot sim`.
pub fn sim(args: SimArgs) -> anyhow::Result<ExitCode> {
    let policies: Vec<&str> = args
        .policies
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let unknown: Vec<&&str> = policies
        .iter()
        .filter(|p| allot_sched::policy::by_name(p).is_none())
        .collect();
    if !unknown.is_empty() || policies.is_empty() {
        bail!(
            "unknown policies {unknown:?}; known: {}",
            allot_sched::policy::NAMES.join(", ")
        );
    }
    let scenario = load(&args)?;
    let config = SimConfig {
        checkpoint_every: millis(args.checkpoint_every.into()),
        restart_overhead: millis(args.restart_overhead.into()),
        // One point per simulated hour is plenty for a two-month trace.
        sample_every: if args.plots.is_some() { 3_600_000 } else { 0 },
    };
    eprintln!(
        "{}: {} jobs on {} nodes ({} GPUs); checkpoint every {}, restart overhead {}",
        scenario.name,
        scenario.trace.jobs.len(),
        scenario.nodes.len(),
        scenario
            .nodes
            .iter()
            .map(|n| u64::from(n.gpus))
            .sum::<u64>(),
        args.checkpoint_every,
        args.restart_overhead,
    );
    let mut results = Vec::new();
    for name in &policies {
        let policy = allot_sched::policy::by_name(name).context("known policy")?;
        let result = allot_sim::run(
            &scenario.trace,
            &scenario.nodes,
            policy,
            &scenario.nominal,
            &config,
        )
        .with_context(|| format!("simulating {name}"))?;
        eprintln!("  {name}: {:.1} s", result.wall.as_secs_f64());
        results.push(result);
    }
    let mut out = std::io::stdout().lock();
    write!(out, "{}", render(&results))?;
    if let Some(dir) = &args.plots {
        let written = super::plots::write(dir, &scenario.name, &results)?;
        for path in written {
            eprintln!("wrote {}", path.display());
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(
            path,
            serde_json::to_vec_pretty(&to_json(&scenario.name, &results))?,
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn traces_dir(args: &SimArgs) -> PathBuf {
    args.traces
        .clone()
        .unwrap_or_else(|| PathBuf::from("../shared/traces"))
}

fn load(args: &SimArgs) -> anyhow::Result<Scenario> {
    if let Some(name) = &args.scenario {
        let traces = traces_dir(args);
        return match scenario::by_name(name, &traces) {
            None => bail!(
                "unknown scenario {name:?}; known: {}",
                scenario::NAMES.join(", ")
            ),
            Some(result) => {
                result.with_context(|| format!("loading {name} from {}", traces.display()))
            }
        };
    }
    let Some(trace) = &args.trace else {
        bail!(
            "say what to simulate: --scenario NAME, or --trace generic:PATH --cluster NODESxGPUS[:MODEL]"
        );
    };
    let Some(path) = trace.strip_prefix("generic:") else {
        bail!("--trace {trace:?}: use generic:PATH");
    };
    let Some(cluster) = &args.cluster else {
        bail!("--trace needs --cluster NODESxGPUS[:MODEL]");
    };
    let nodes = parse_cluster(cluster)?;
    let trace = allot_sim::load::generic::load(std::path::Path::new(path))?;
    let mut nominal = BTreeMap::new();
    for job in &trace.jobs {
        nominal.entry(job.team.clone()).or_insert(1);
    }
    Ok(Scenario {
        name: format!("generic:{path}"),
        trace,
        nodes,
        nominal,
    })
}

/// `80x8` or `80x8:A100`.
fn parse_cluster(spec: &str) -> anyhow::Result<Vec<NodeSpec>> {
    let (shape, model) = spec.split_once(':').unwrap_or((spec, "gpu"));
    let parsed = shape
        .split_once('x')
        .and_then(|(n, g)| Some((n.parse::<u32>().ok()?, g.parse::<u32>().ok()?)));
    match parsed {
        Some((nodes, gpus)) if nodes > 0 && gpus > 0 => Ok((1..=nodes)
            .map(|i| NodeSpec::new(format!("node-{i}"), gpus, model))
            .collect()),
        _ => bail!("--cluster {spec:?}: use NODESxGPUS[:MODEL], e.g. 80x8:A100"),
    }
}

fn render(results: &[SimResult]) -> String {
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header([
        "POLICY",
        "JOBS",
        "AVG JCT",
        "P50 JCT",
        "P95 JCT",
        "P99 JCT",
        "AVG QUEUE",
        "MAKESPAN",
        "GPU ALLOC",
        "WR",
        "WR_FIT",
        "JAIN",
        "PREEMPT",
        "LOST GPU-H",
        "SIM S",
    ]);
    for r in results {
        let k = &r.kpis;
        table.add_row([
            r.policy.clone(),
            k.jobs.to_string(),
            format!("{:.0} s", k.avg_jct_s),
            format!("{:.0} s", k.p50_jct_s),
            format!("{:.0} s", k.p95_jct_s),
            format!("{:.0} s", k.p99_jct_s),
            format!("{:.0} s", k.avg_queue_s),
            format!("{:.1} d", k.makespan_s / 86_400.0),
            format!("{:.1}%", k.gpu_allocation_ratio * 100.0),
            format!("{:.1}%", k.wastage_ratio * 100.0),
            format!("{:.1}%", k.wastage_ratio_fit * 100.0),
            format!("{:.3}", k.jain_fairness),
            k.preemptions.to_string(),
            format!("{:.0}", k.gpu_hours_lost),
            format!("{:.2}", r.wall.as_secs_f64()),
        ]);
    }
    let mut out = format!("{table}\n\n");
    for r in results {
        out.push_str(&format!("{}: {}\n", r.policy, r.parameters));
    }
    out
}

fn to_json(scenario: &str, results: &[SimResult]) -> serde_json::Value {
    let policies: serde_json::Map<String, serde_json::Value> = results
        .iter()
        .map(|r| {
            let k = &r.kpis;
            (
                r.policy.clone(),
                serde_json::json!({
                    "jobs": k.jobs,
                    "avg_jct_s": k.avg_jct_s,
                    "p50_jct_s": k.p50_jct_s,
                    "p95_jct_s": k.p95_jct_s,
                    "p99_jct_s": k.p99_jct_s,
                    "avg_queue_s": k.avg_queue_s,
                    "makespan_s": k.makespan_s,
                    "gpu_allocation_ratio": k.gpu_allocation_ratio,
                    "wastage_ratio": k.wastage_ratio,
                    "wastage_ratio_fit": k.wastage_ratio_fit,
                    "jain_fairness": k.jain_fairness,
                    "preemptions": k.preemptions,
                    "gpu_hours_lost": k.gpu_hours_lost,
                    "sim_wall_s": r.wall.as_secs_f64(),
                }),
            )
        })
        .collect();
    serde_json::json!({ "scenario": scenario, "policies": policies })
}
