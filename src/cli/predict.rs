//! `allot predict`: the run-time predictor offline.
//!
//! `allot predict eval --trace philly --split 2017-11-01` replays the Philly trace in time order,
//! trains the shipped predictor on the jobs that finished before the split, and scores every job
//! submitted after it against the baselines (each seeing only what had finished when the job was
//! submitted); `--json PATH` writes the report.
//!
//! `allot predict report` shows, per task (its identity across submissions), what the running
//! predictor learned — runs, predicted run time, peak GPU memory, mean utilization — and its
//! right-sizing advice: the cheapest GPU model and smallest share that held the task's last
//! runs, with the saving per hour against what the spec asks. It reads `predictor.db` in the
//! data folder (as `allot audit verify` reads the archive): a local report, for the machine
//! where the predictor keeps its state.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use chrono::{NaiveDate, NaiveDateTime};
use clap::{Args, Subcommand, ValueEnum};
use comfy_table::{Table, presets::NOTHING};

use allot_predict::eval::{self, EvalJob, Report};
use allot_predict::{Job, TrainParams};
use allot_predictor::report::TaskReport;
use allot_prices::PriceTable;
use allot_sim::load::philly::{self, Window};

use super::settings::Lookup;

/// `allot predict …`.
#[derive(Debug, Subcommand)]
pub enum PredictCommand {
    /// Score the predictor against the baselines on a trace, split by time.
    Eval(EvalArgs),
    /// Per task: runs, predicted run time, peak GPU memory, mean utilization, and the
    /// right-sizing advice (cheapest GPU model, smallest share, saving per hour). Reads the
    /// predictor's database in the data folder: run it where the predictor keeps its state.
    Report(ReportArgs),
}

/// How `allot predict report` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum ReportOutput {
    /// An aligned table.
    #[default]
    Table,
    /// One JSON document: `{"currency", "tasks": [...]}`, amounts in micro-units.
    Json,
}

/// `allot predict report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Folder where `allot up` keeps its state (ALLOT_DATA_DIR; default `.allot`): the report
    /// reads `<folder>/predictor/predictor.db`, or `<folder>/predictor.db` (the folder of
    /// `allot run predictor --data-dir`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The price table to compare GPU models by (ALLOT_PRICES; default: the built-in one that
    /// `allot up` bills with).
    #[arg(long)]
    pub prices: Option<PathBuf>,
    /// How to print.
    #[arg(long, value_enum, default_value_t)]
    pub output: ReportOutput,
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
    /// Leave out the jobs submitted at or after this date (UTC): a validation run that never
    /// sees the months it will be judged on (e.g. `--split 2017-10-10 --until 2017-11-01`).
    #[arg(long)]
    pub until: Option<String>,
    /// Folder with the traces (default: ../shared/traces from the project root).
    #[arg(long)]
    pub traces: Option<PathBuf>,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs `allot predict …`.
pub fn predict(cmd: PredictCommand, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    match cmd {
        PredictCommand::Eval(args) => evaluate(args),
        PredictCommand::Report(args) => report(args, env),
    }
}

/// The exit code of a report that cannot be made from what it was given (no database, a bad
/// price table).
const BAD_INPUT: u8 = 2;

fn report(args: ReportArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let dir = args
        .data_dir
        .clone()
        .or_else(|| env("ALLOT_DATA_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(".allot"));
    let Some(db) = [
        dir.join("predictor").join("predictor.db"),
        dir.join("predictor.db"),
    ]
    .into_iter()
    .find(|p| p.is_file()) else {
        eprintln!(
            "allot: --data-dir {}: no predictor.db in it or in its predictor/ folder (has the \
             predictor run there?)",
            dir.display()
        );
        return Ok(ExitCode::from(BAD_INPUT));
    };
    let prices = match args
        .prices
        .clone()
        .or_else(|| env("ALLOT_PRICES").map(PathBuf::from))
    {
        None => super::run::default_prices(),
        Some(path) => match read_prices(&path) {
            Ok(p) => p,
            Err(why) => {
                eprintln!("allot: --prices {}: {why}", path.display());
                return Ok(ExitCode::from(BAD_INPUT));
            }
        },
    };
    let conn = allot_predictor::open_read_only(&db)
        .with_context(|| format!("opening {}", db.display()))?;
    let now = chrono::Utc::now().timestamp_millis().max(0) as u64;
    let tasks = allot_predictor::report::tasks(&conn, Some(&prices), now)
        .with_context(|| format!("reading {}", db.display()))?;
    match args.output {
        ReportOutput::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "currency": prices.currency,
                "tasks": tasks,
            }))?
        ),
        ReportOutput::Table => print!("{}", render_report(&tasks, &prices.currency)),
    }
    Ok(ExitCode::SUCCESS)
}

fn read_prices(path: &Path) -> Result<PriceTable, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading it: {e}"))?;
    PriceTable::parse(&text).map_err(|e| e.to_string())
}

/// `gpus × share`: `1 × 0.25`, `4` (whole GPUs).
fn shape(gpus: u32, milli: u32) -> String {
    if milli >= 1000 {
        gpus.to_string()
    } else {
        format!("{gpus} × {}", milli as f64 / 1000.0)
    }
}

fn render_report(tasks: &[TaskReport], currency: &str) -> String {
    use allot_prices::format_money;
    if tasks.is_empty() {
        return "the predictor has seen no tasks yet\n".to_owned();
    }
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header([
        "TASK",
        "RUNS",
        "PREDICTED",
        "PEAK MEM",
        "MEAN UTIL",
        "REQUESTED",
        "RECOMMENDED",
        &format!("SAVING/H ({currency})"),
    ]);
    let mut notes = Vec::new();
    for t in tasks {
        let models = if t.requested_models.is_empty() {
            t.ran_on
                .clone()
                .map_or_else(|| "any".to_owned(), |m| format!("any (ran on {m})"))
        } else {
            t.requested_models.join("|")
        };
        let recommended = match (&t.recommendation, &t.no_recommendation) {
            (Some(r), _) => format!(
                "{} {} ({} MiB)",
                shape(r.gpus, r.gpu_milli),
                r.model,
                r.gpu_memory_mib
            ),
            (None, Some(why)) => {
                notes.push(format!("{}: no recommendation: {why}", t.task_key));
                "-".to_owned()
            }
            (None, None) => "-".to_owned(),
        };
        table.add_row([
            t.task_key.clone(),
            format!("{} ({} measured)", t.runs, t.measured_runs),
            t.predicted_ms
                .map_or_else(|| "-".to_owned(), super::workloads::span_ms),
            t.peak_memory_mib
                .map_or_else(|| "-".to_owned(), |m| format!("{m} MiB")),
            t.mean_util_pct
                .map_or_else(|| "-".to_owned(), |u| format!("{u:.0}%")),
            format!("{} {models}", shape(t.requested_gpus, t.requested_milli)),
            recommended,
            t.saving_micros_per_hour
                .map_or_else(|| "-".to_owned(), format_money),
        ]);
    }
    let mut out = format!("{table}\n");
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    out
}

fn evaluate(args: EvalArgs) -> anyhow::Result<ExitCode> {
    // Every problem with the arguments at once, before anything is loaded.
    let mut problems = Vec::new();
    if args.trace != "philly" {
        problems.push(format!(
            "--trace {:?}: only `philly` is supported",
            args.trace
        ));
    }
    let mut date = |flag: &str, value: &str| {
        let parsed = NaiveDate::parse_from_str(value, "%Y-%m-%d")
            .map(|d| d.and_hms_opt(0, 0, 0).expect("midnight exists"));
        if parsed.is_err() {
            problems.push(format!("{flag} {value:?}: write a date as 2017-11-01"));
        }
        parsed.ok()
    };
    let split = date("--split", &args.split);
    let until = args.until.as_deref().map(|u| date("--until", u));
    if let (Some(split), Some(Some(until))) = (split, until)
        && until <= split
    {
        problems.push(format!(
            "--until {}: must come after --split {}",
            until.date(),
            split.date()
        ));
    }
    let (Some(split), true) = (split, problems.is_empty()) else {
        for p in &problems {
            eprintln!("allot: {p}");
        }
        eprintln!("nothing was evaluated");
        return Ok(ExitCode::from(BAD_INPUT));
    };
    let until = until.flatten();
    let traces = args
        .traces
        .clone()
        .unwrap_or_else(|| PathBuf::from("../shared/traces"));
    let dir = traces.join("philly");
    // Submit times count from the Unix epoch, so the calendar features see real dates.
    let epoch = NaiveDateTime::default();
    let window = Window {
        from: epoch,
        to: until.map_or_else(
            || {
                NaiveDate::from_ymd_opt(9999, 12, 31)
                    .and_then(|d| d.and_hms_opt(23, 59, 59))
                    .expect("a valid date")
            },
            |u| u - chrono::TimeDelta::milliseconds(1),
        ),
    };
    // A trace that is missing or malformed is bad input too: the loader names the file, line
    // and column.
    let trace = match philly::load(
        &dir.join("jobs.csv"),
        &dir.join("vc_nodes.csv"),
        Some(window),
    ) {
        Ok(trace) => trace,
        Err(e) => {
            eprintln!("allot: the Philly trace in {}: {e}", dir.display());
            eprintln!("nothing was evaluated");
            return Ok(ExitCode::from(BAD_INPUT));
        }
    };
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
    let label = match &args.until {
        Some(until) => format!("{} (jobs submitted before {until} only)", args.split),
        None => args.split.clone(),
    };
    print!("{}", render(&report, &label));
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
