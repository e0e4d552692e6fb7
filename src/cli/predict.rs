//! `allot predict`: the run-time predictor offline.
//!
//! `allot predict eval --trace philly --split 2017-11-01` replays the Philly trace in time order,
//! trains the shipped predictor on the jobs that finished before the split, and scores every job
//! submitted after it against the baselines (each seeing only what had finished when the job was
//! submitted); `--json PATH` writes the report.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use chrono::{NaiveDate, NaiveDateTime};
use clap::{Args, Subcommand};

use allot_predict::eval::{self, EvalJob, Report};
use allot_predict::{Job, TrainParams};
use allot_sim::load::philly::{self, Window};

/// `allot predict …`.
#[derive(Debug, Subcommand)]
pub enum PredictCommand {
    /// Score the predictor against the baselines on a trace, split by time.
    Eval(EvalArgs),
}

/// `allot predict eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The trace: `philly` (the only one with enough history).
    #[arg(long, default_value = "philly")]
    pub trace: String,
    /// Jobs submitted before this date (UTC) train; those at or after it are scored.
    #[arg(long, default_value = "2017-11-01")]
    pub split: String,
    /// Folder with the traces (default: ../shared/traces from the project root).
    #[arg(long)]
    pub traces: Option<PathBuf>,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs `allot predict …`.
pub fn predict(cmd: PredictCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PredictCommand::Eval(args) => evaluate(args),
    }
}

fn evaluate(args: EvalArgs) -> anyhow::Result<ExitCode> {
    if args.trace != "philly" {
        bail!("--trace {}: only `philly` is supported", args.trace);
    }
    let split = NaiveDate::parse_from_str(&args.split, "%Y-%m-%d")
        .with_context(|| format!("--split {:?}: write a date as 2017-11-01", args.split))?
        .and_hms_opt(0, 0, 0)
        .expect("midnight exists");
    let traces = args
        .traces
        .clone()
        .unwrap_or_else(|| PathBuf::from("../shared/traces"));
    let dir = traces.join("philly");
    // Submit times count from the Unix epoch, so the calendar features see real dates.
    let epoch = NaiveDateTime::default();
    let window = Window {
        from: epoch,
        to: NaiveDate::from_ymd_opt(9999, 12, 31)
            .and_then(|d| d.and_hms_opt(23, 59, 59))
            .expect("a valid date"),
    };
    let trace = philly::load(
        &dir.join("jobs.csv"),
        &dir.join("vc_nodes.csv"),
        Some(window),
    )
    .with_context(|| format!("loading the Philly trace from {}", dir.display()))?;
    let jobs: Vec<EvalJob> = trace
        .jobs
        .iter()
        .map(|j| EvalJob {
            job: Job {
                team: j.team.clone(),
                identity: None,
                gpus: j.gpus,
                gpu_milli: j.gpu_milli,
                submit_ms: j.submit,
                declared_ms: None,
            },
            duration_ms: j.duration,
        })
        .collect();
    let split_ms = (split - epoch).num_milliseconds().max(0) as u64;
    let report = eval::evaluate(&jobs, split_ms, TrainParams::default());
    print!("{}", render(&report, &args.split));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn render(r: &Report, split: &str) -> String {
    let mut out = format!(
        "philly, split {split}: {} jobs before it, {} scored after it; the model learned from \
         the newest {} runs finished before the split in {:.2} s and {} times more as runs \
         finished after it; {:.1} µs per prediction\n\n",
        r.train_jobs, r.test_jobs, r.trained_on, r.train_seconds, r.retrains, r.predict_us
    );
    out.push_str(&format!(
        "{:<18} {:>7} {:>9} {:>7} {:>8} {:>9}\n",
        "PREDICTOR", "MdALE", "WITHIN2X", "P90ALE", "SPEARMAN", "COVERAGE"
    ));
    for (name, m) in &r.predictors {
        let coverage = m
            .coverage_p10_p90
            .map_or_else(|| "-".to_owned(), |c| format!("{c:.3}"));
        out.push_str(&format!(
            "{name:<18} {:>7.3} {:>9.3} {:>7.3} {:>8.3} {:>9}\n",
            m.mdale, m.within_2x, m.p90_ale, m.spearman, coverage
        ));
    }
    out
}
