//! `allot sim`: replays a trace through allot-sched under several policies in one process and
//! prints one comparison table (and, for `pipelines`, a second one of pipeline completion).
//! Each policy's run shows a progress bar on stderr, hidden when stderr is not a terminal or
//! with `--quiet`; the engine only reports counts, the bar is drawn here.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use comfy_table::{Table, presets::NOTHING};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use allot_sched::NodeSpec;
use allot_sim::pipelines::{self, Params};
use allot_sim::scenario::{self, PIPELINES, Scenario};
use allot_sim::{Observer, SimConfig, SimResult};

use super::settings::InvalidSettings;

/// Refuses flags that make no sense: the problem, and exit 2 (as every invalid setting).
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err(InvalidSettings(vec![format!($($arg)*)]).into())
    };
}

/// Flags of `allot sim`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// A named scenario (philly-640, pipelines, openb-packing).
    #[arg(long, conflicts_with = "trace")]
    pub scenario: Option<String>,
    /// A trace instead of a scenario: `generic:PATH` (CSV with submit_time,duration,num_gpus…).
    #[arg(long)]
    pub trace: Option<String>,
    /// The cluster for --trace or --scenario pipelines: `NODESxGPUS[:MODEL]`, e.g. `80x8:A100`
    /// (pipelines: default 32x8, with 16 cores and 128 GiB of memory per GPU).
    #[arg(long)]
    pub cluster: Option<String>,
    /// pipelines: how many preprocess → train → evaluate pipelines [default: 500].
    #[arg(long)]
    pub pipelines: Option<usize>,
    /// pipelines: seed of the generator [default: 1].
    #[arg(long)]
    pub seed: Option<u64>,
    /// pipelines: mean arrivals per hour (Poisson) [default: 3].
    #[arg(long, value_name = "PER_HOUR", allow_hyphen_values = true)]
    pub rate: Option<f64>,
    /// pipelines: share of pipelines with a deadline, 0 to 1 [default: 1/3].
    #[arg(long, value_name = "SHARE", allow_hyphen_values = true)]
    pub deadline_share: Option<f64>,
    /// pipelines: a deadline is arrival + λ × the pipeline's work, λ drawn uniformly from
    /// `LEAST..MOST` [default: 1.5..3].
    #[arg(long, value_name = "LEAST..MOST", allow_hyphen_values = true)]
    pub deadline_slack: Option<String>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
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
    /// openb-packing: seeds of the re-sampled top-up, 0..N (results are their mean).
    #[arg(long, default_value_t = 10)]
    pub seeds: u32,
    /// openb-packing: the pod list (default: TRACES/openb/pods.csv).
    #[arg(long)]
    pub pods: Option<PathBuf>,
    /// openb-packing: the node list (default: TRACES/openb/nodes_all.csv).
    #[arg(long)]
    pub nodes: Option<PathBuf>,
    /// openb-packing: GPU demand that arrives, as a multiple of the cluster's GPU capacity.
    #[arg(long, default_value_t = allot_sim::packing::DEFAULT_ARRIVAL)]
    pub arrival: f64,
    /// openb-packing: pods arrive in `trace` order (traces/README.md) or `shuffled` per seed
    /// (the FGD artifact's `--shuffle-pod=true`, which the published numbers used).
    #[arg(long, default_value = "trace", value_parser = ["trace", "shuffled"])]
    pub order: String,
    /// Write SVG charts here: JCT CDF per policy, GPUs allocated and queue length over time.
    #[arg(long)]
    pub plots: Option<PathBuf>,
    /// Also measure the ETA each job is given right after it is submitted (the JSON's
    /// `eta_at_submit`); slower: each answer replays the queue ahead of the job.
    #[arg(long)]
    pub eta_at_submit: bool,
    /// Write the run's journal here (one policy only): a header line, then one JSON line per
    /// input applied with its decisions — what `allot replay --verify` checks.
    #[arg(long)]
    pub journal: Option<PathBuf>,
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
        refuse!(
            "unknown policies {unknown:?}; known: {}",
            allot_sched::policy::NAMES.join(", ")
        );
    }
    if args.scenario.as_deref() == Some(OPENB_PACKING) {
        if args.journal.is_some() {
            refuse!(
                "--journal is not written for {OPENB_PACKING}: it runs many seeds of pods that \
                 never end, and reports allocation only; record a journal with philly-640, \
                 pipelines or --trace"
            );
        }
        return packing(&args, &policies);
    }
    if args.journal.is_some() && policies.len() != 1 {
        refuse!("--journal records one run: give exactly one policy");
    }
    let scenario = load(&args)?;
    let config = SimConfig {
        checkpoint_every: millis(args.checkpoint_every.into()),
        restart_overhead: millis(args.restart_overhead.into()),
        // One point per simulated hour is plenty for a two-month trace.
        sample_every: if args.plots.is_some() { 3_600_000 } else { 0 },
        eta_at_submit: args.eta_at_submit,
    };
    if scenario.dag.is_some() {
        eprintln!("{}", scenario.trace.source);
    }
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
        let bar = progress_bar(args.quiet, scenario.trace.jobs.len(), name);
        let tick = |done: usize| bar.set_position(done as u64);
        let mut journal = match &args.journal {
            Some(path) => Some(JournalFile::create(path, name)?),
            None => None,
        };
        let mut record = |input: &allot_sched::Input,
                          decisions: &[allot_sched::Decision],
                          rejected: Option<&allot_sched::ApplyError>| {
            if let Some(j) = journal.as_mut() {
                j.write(input, decisions, rejected);
            }
        };
        let mut observer = Observer {
            progress: Some(&tick),
            decision: None,
            journal: if args.journal.is_some() {
                Some(&mut record)
            } else {
                None
            },
        };
        let result = allot_sim::run_scenario(&scenario, policy, &config, &mut observer)
            .with_context(|| format!("simulating {name}"));
        if let Some(j) = journal.take() {
            let (path, entries) = j.finish()?;
            eprintln!("journal: {entries} entries written to {}", path.display());
        }
        bar.finish_and_clear();
        let result = result?;
        eprintln!("  {name}: {:.1} s", result.wall.as_secs_f64());
        results.push(result);
    }
    let mut out = std::io::stdout().lock();
    write!(out, "{}", render(&results))?;
    if let Some(dag) = &scenario.dag {
        write!(
            out,
            "\n{}",
            render_pipelines(
                &results,
                pipelines::gpu_hours_idle_if_held_throughout(&scenario.trace, dag)
            )
        )?;
    }
    if let Some(dir) = &args.plots {
        let written = super::plots::write(dir, &scenario.name, &results)?;
        for path in written {
            eprintln!("wrote {}", path.display());
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(
            path,
            serde_json::to_vec_pretty(&to_json(&scenario.name, &results, config.eta_at_submit))?,
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One bar per policy run, on stderr: indicatif hides it when stderr is not a terminal.
fn progress_bar(quiet: bool, jobs: usize, policy: &str) -> ProgressBar {
    let target = if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(jobs as u64), target);
    bar.set_style(
        ProgressStyle::with_template("  {prefix} [{bar:40}] {pos}/{len} jobs, {elapsed}")
            .expect("a valid progress template")
            .progress_chars("=> "),
    );
    bar.set_prefix(policy.to_owned());
    bar
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
    let is_pipelines = args.scenario.as_deref() == Some(PIPELINES);
    let pipeline_flags = args.pipelines.is_some()
        || args.seed.is_some()
        || args.rate.is_some()
        || args.deadline_share.is_some()
        || args.deadline_slack.is_some();
    if !is_pipelines && pipeline_flags {
        refuse!(
            "--pipelines, --seed, --rate, --deadline-share and --deadline-slack apply to \
             --scenario {PIPELINES} only"
        );
    }
    if is_pipelines {
        let traces = traces_dir(args);
        let params = pipeline_params(args)?;
        let (count, gpus, model) = parse_cluster(args.cluster.as_deref().unwrap_or("32x8"))?;
        let nodes = (1..=count)
            .map(|i| pipelines::node(format!("node-{i}"), gpus, model))
            .collect();
        return scenario::pipelines(&traces, &params, nodes).with_context(|| {
            format!(
                "generating {PIPELINES} from the Philly trace in {}",
                traces.display()
            )
        });
    }
    if let Some(name) = &args.scenario {
        if args.cluster.is_some() {
            refuse!("--cluster applies to --trace and --scenario {PIPELINES} only");
        }
        let traces = traces_dir(args);
        return match scenario::by_name(name, &traces) {
            None => refuse!(
                "unknown scenario {name:?}; known: {}, {PIPELINES}, {OPENB_PACKING}",
                scenario::NAMES.join(", ")
            ),
            Some(result) => {
                result.with_context(|| format!("loading {name} from {}", traces.display()))
            }
        };
    }
    let Some(trace) = &args.trace else {
        refuse!(
            "say what to simulate: --scenario NAME, or --trace generic:PATH --cluster NODESxGPUS[:MODEL]"
        );
    };
    let Some(path) = trace.strip_prefix("generic:") else {
        refuse!("--trace {trace:?}: use generic:PATH");
    };
    let Some(cluster) = &args.cluster else {
        refuse!("--trace needs --cluster NODESxGPUS[:MODEL]");
    };
    let (count, gpus, model) = parse_cluster(cluster)?;
    let nodes = (1..=count)
        .map(|i| NodeSpec::new(format!("node-{i}"), gpus, model))
        .collect();
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
        dag: None,
    })
}

/// `80x8` or `80x8:A100`: (nodes, GPUs per node, model).
fn parse_cluster(spec: &str) -> anyhow::Result<(u32, u32, &str)> {
    let (shape, model) = spec.split_once(':').unwrap_or((spec, "gpu"));
    let parsed = shape
        .split_once('x')
        .and_then(|(n, g)| Some((n.parse::<u32>().ok()?, g.parse::<u32>().ok()?)));
    match parsed {
        Some((nodes, gpus)) if nodes > 0 && gpus > 0 => Ok((nodes, gpus, model)),
        _ => refuse!("--cluster {spec:?}: use NODESxGPUS[:MODEL], e.g. 80x8:A100"),
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
        "ETA ERR",
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
            k.eta
                .median_rel_error
                .map_or("-".into(), |e| format!("{:.0}%", e * 100.0)),
            format!("{:.2}", r.wall.as_secs_f64()),
        ]);
    }
    let mut out = format!(
        "{table}\n\nETA ERR: median |promised start − start| / wait over jobs that waited over \
         {} s and were promised a start\n",
        allot_sim::kpi::ETA_MIN_WAIT / 1000
    );
    for r in results {
        out.push_str(&format!("{}: {}\n", r.policy, r.parameters));
    }
    out
}

/// Pipeline completion (first submit → last stage's finish) per policy.
fn render_pipelines(results: &[SimResult], idle_if_held: f64) -> String {
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header([
        "POLICY",
        "PIPELINES",
        "AVG COMPLETION",
        "P50 COMPLETION",
        "P95 COMPLETION",
        "DEADLINES MET",
        "GPU-H HELD IN CPU STAGES",
    ]);
    for r in results {
        let Some(p) = &r.pipelines else { continue };
        table.add_row([
            r.policy.clone(),
            p.pipelines.to_string(),
            format!("{:.0} s", p.avg_completion_s),
            format!("{:.0} s", p.p50_completion_s),
            format!("{:.0} s", p.p95_completion_s),
            p.deadlines.share().map_or_else(
                || "-".to_owned(),
                |share| {
                    format!(
                        "{} of {} ({:.1}%)",
                        p.deadlines.met,
                        p.deadlines.with,
                        share * 100.0
                    )
                },
            ),
            format!("{:.1}", p.gpu_hours_held_in_cpu_stages),
        ]);
    }
    format!(
        "{table}\n\nrun as one job each, holding their largest stage's GPUs from start to end, \
         the pipelines would leave at least {idle_if_held:.0} GPU-hours idle in their \
         preprocess and evaluate stages\n"
    )
}

/// The results as JSON; `eta_at_submit`: whether the run measured the ETAs given at
/// submission (else they are left out rather than shown as nothing measured).
fn to_json(scenario: &str, results: &[SimResult], eta_at_submit: bool) -> serde_json::Value {
    let policies: serde_json::Map<String, serde_json::Value> = results
        .iter()
        .map(|r| {
            let k = &r.kpis;
            let mut row = serde_json::json!({
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
                "eta_jobs": k.eta.jobs,
                "eta_missing": k.eta.missing,
                "eta_median_rel_error": k.eta.median_rel_error,
                "eta_within_25pct": k.eta.within_25pct,
                "deadline_jobs": k.deadlines.with,
                "deadlines_met": k.deadlines.met,
                "sim_wall_s": r.wall.as_secs_f64(),
            });
            if eta_at_submit {
                row["eta_at_submit"] = serde_json::json!({
                    "jobs": k.eta_at_submit.jobs,
                    "missing": k.eta_at_submit.missing,
                    "median_rel_error": k.eta_at_submit.median_rel_error,
                    "within_25pct": k.eta_at_submit.within_25pct,
                });
            }
            if let Some(p) = &r.pipelines {
                row["pipelines"] = serde_json::json!({
                    "pipelines": p.pipelines,
                    "avg_completion_s": p.avg_completion_s,
                    "p50_completion_s": p.p50_completion_s,
                    "p95_completion_s": p.p95_completion_s,
                    "gpu_hours_held_in_cpu_stages": p.gpu_hours_held_in_cpu_stages,
                    "deadlines": p.deadlines.with,
                    "deadlines_met": p.deadlines.met,
                    "deadlines_met_share": p.deadlines.share(),
                });
            }
            (r.policy.clone(), row)
        })
        .collect();
    serde_json::json!({ "scenario": scenario, "policies": policies })
}

/// The scenario that runs the FGD paper's GPU packing experiment rather than a replay.
const OPENB_PACKING: &str = "openb-packing";

/// The pipelines' parameters from the flags, or every problem with them at once
/// ([`InvalidSettings`]: exit 2) — before any trace is read.
fn pipeline_params(args: &SimArgs) -> anyhow::Result<Params> {
    let defaults = Params::default();
    let mut problems = Vec::new();
    let slack = match args.deadline_slack.as_deref() {
        None => defaults.deadlines.slack,
        Some(text) => {
            let parsed = text
                .split_once("..")
                .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
            parsed.unwrap_or_else(|| {
                problems.push(format!(
                    "--deadline-slack {text:?}: expected LEAST..MOST, e.g. 1.5..3"
                ));
                defaults.deadlines.slack
            })
        }
    };
    let params = Params {
        pipelines: args.pipelines.unwrap_or(defaults.pipelines),
        seed: args.seed.unwrap_or(defaults.seed),
        rate_per_hour: args.rate.unwrap_or(defaults.rate_per_hour),
        deadlines: pipelines::Deadlines {
            share: args.deadline_share.unwrap_or(defaults.deadlines.share),
            slack,
        },
        ..defaults
    };
    problems.extend(params.problems().iter().map(ToString::to_string));
    if problems.is_empty() {
        Ok(params)
    } else {
        Err(InvalidSettings(problems).into())
    }
}

/// `--scenario openb-packing`: the packing experiment ([`allot_sim::packing`]) for each policy,
/// one row each, beside the published results.
fn packing(args: &SimArgs, policies: &[&str]) -> anyhow::Result<ExitCode> {
    let openb = traces_dir(args).join("openb");
    let pods = args.pods.clone().unwrap_or_else(|| openb.join("pods.csv"));
    let nodes = args
        .nodes
        .clone()
        .unwrap_or_else(|| openb.join("nodes_all.csv"));
    eprintln!(
        "{OPENB_PACKING}: {} on {}; arrivals {:.0}% of GPU capacity in {} order, no \
         departures; {} seeds",
        pods.display(),
        nodes.display(),
        args.arrival * 100.0,
        args.order,
        args.seeds,
    );
    let mut results = Vec::new();
    for name in policies {
        let order = if args.order == "shuffled" {
            allot_sim::packing::Order::Shuffled
        } else {
            allot_sim::packing::Order::Trace
        };
        let result =
            allot_sim::packing::run_in_order(&pods, &nodes, name, args.seeds, args.arrival, order)
                .with_context(|| format!("packing with {name}"))?;
        eprintln!(
            "  {name}: {} seeds in {:.1} s",
            result.runs.len(),
            result.wall.as_secs_f64()
        );
        results.push(result);
    }
    let mut out = std::io::stdout().lock();
    write!(out, "{}", render_packing(&results))?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&packing_json(&results))?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn render_packing(results: &[allot_sim::packing::PackingResult]) -> String {
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header([
        "POLICY",
        "GPU ALLOC",
        "STDDEV",
        "UNALLOC GPUS",
        "PUBLISHED",
        "DIFF",
        "SIM S",
    ]);
    for r in results {
        let published = allot_sim::packing::published(&r.policy);
        table.add_row([
            r.policy.clone(),
            format!("{:.2}%", r.mean * 100.0),
            format!("{:.2} pt", r.stddev * 100.0),
            format!("{:.1}", r.unallocated_gpus),
            published.map_or("-".into(), |p| format!("{:.2}%", p * 100.0)),
            published.map_or("-".into(), |p| format!("{:+.2} pt", (r.mean - p) * 100.0)),
            format!("{:.2}", r.wall.as_secs_f64()),
        ]);
    }
    let mut out = format!("{table}\n\n");
    if let Some(r) = results.first()
        && let Some(run) = r.runs.first()
    {
        let pods = r.runs.iter().map(|s| s.pods).sum::<usize>() / r.runs.len();
        out.push_str(&format!(
            "{} nodes, {} GPUs; {} trace pods topped up to {} on average; published: FGD paper \
             (Weng et al., ATC'23), mean of 10 seeds, measured with the pods in random order\n",
            r.nodes,
            run.capacity_milli / 1000,
            r.trace_pods,
            pods,
        ));
    }
    for r in results {
        out.push_str(&format!("{}: {}\n", r.policy, r.parameters));
    }
    out
}

fn packing_json(results: &[allot_sim::packing::PackingResult]) -> serde_json::Value {
    let policies: serde_json::Map<String, serde_json::Value> = results
        .iter()
        .map(|r| {
            (
                r.policy.clone(),
                serde_json::json!({
                    "gpu_allocation_ratio": r.mean,
                    "stddev": r.stddev,
                    "seeds": r.runs.len(),
                    "per_seed": r.runs.iter().map(|s| s.gpu_allocation_ratio).collect::<Vec<_>>(),
                    "unallocated_gpus": r.unallocated_gpus,
                    "published": allot_sim::packing::published(&r.policy),
                    "arrival": r.arrival,
                    "sim_wall_s": r.wall.as_secs_f64(),
                }),
            )
        })
        .collect();
    serde_json::json!({ "scenario": OPENB_PACKING, "policies": policies })
}

/// A journal being written as JSON lines: the header, then one entry per input.
struct JournalFile {
    path: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
    seq: u64,
    error: Option<std::io::Error>,
}

impl JournalFile {
    fn create(path: &std::path::Path, policy: &str) -> anyhow::Result<Self> {
        use std::io::Write;
        let file = std::fs::File::create(path)
            .with_context(|| format!("creating the journal {}", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        serde_json::to_writer(&mut out, &allot_sched::journal::Header::new(policy))?;
        out.write_all(b"\n")?;
        Ok(Self {
            path: path.to_owned(),
            out,
            seq: 0,
            error: None,
        })
    }

    fn write(
        &mut self,
        input: &allot_sched::Input,
        decisions: &[allot_sched::Decision],
        rejected: Option<&allot_sched::ApplyError>,
    ) {
        use std::io::Write;
        if self.error.is_some() {
            return;
        }
        self.seq += 1;
        let entry = allot_sched::journal::Entry {
            seq: self.seq,
            input: input.clone(),
            decisions: decisions.to_vec(),
            rejected: rejected.map(ToString::to_string),
        };
        let written = serde_json::to_writer(&mut self.out, &entry)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"));
        if let Err(e) = written {
            self.error = Some(e);
        }
    }

    fn finish(mut self) -> anyhow::Result<(PathBuf, u64)> {
        use std::io::Write;
        if let Some(e) = self.error.take() {
            return Err(e).with_context(|| format!("writing {}", self.path.display()));
        }
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))?;
        Ok((self.path, self.seq))
    }
}
