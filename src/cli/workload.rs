//! `allot validate` and `allot submit`: check a workload spec, then publish it, once, for CI.
//!
//! `allot submit --wait` then follows the workload until the planner finishes it and prints a
//! summary (each task's final state, attempts and failure reason); `--follow` also prints each
//! step as it happens (ready, waiting with reason and ETA, granted with nodes and GPUs, started,
//! checkpointed, preempted, stopped, completed, failed, cancelled, retried), as text for a CI
//! log or, with `--output json`, one JSON object per line. See [`super::watch`] and
//! [`super::follow`].
//!
//! Exit codes:
//!
//! | code | meaning |
//! |---|---|
//! | 0 | valid and submitted; with `--wait`/`--follow`: the workload succeeded |
//! | 1 | anything else went wrong (files, NATS); the workload's fate is unknown |
//! | 2 | the spec was rejected (every problem is printed; nothing is published) |
//! | 3 | `--wait`: the workload failed (a task failed on its last attempt) |
//! | 4 | `--wait`: the workload was aborted |
//! | 5 | `--wait`: `--timeout` ran out first (the workload goes on) |

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use allot_bus::async_nats::jetstream::message::PublishMessage;
use allot_bus::{Patient, Publisher};
use allot_events::query::ClusterStatus;
use allot_workload::limits::{self, SpecSize};
use allot_workload::submit::{self, Submission};
use allot_workload::validate::Checked;
use allot_workload::{ClusterShape, Context, Format, NodeShape, SpecProblem, TeamsConfig};

use super::local;
use super::settings::Lookup;
use super::watch::{self, Output, Watch};

/// The exit code of a rejected spec.
pub const REJECTED: u8 = 2;
/// `--wait`: the workload failed.
pub const WORKLOAD_FAILED: u8 = 3;
/// `--wait`: the workload was aborted.
pub const WORKLOAD_ABORTED: u8 = 4;
/// `--wait`: `--timeout` ran out before the workload finished.
pub const TIMED_OUT: u8 = 5;

/// How long `submit` (`--retry-for`'s default) and `abort` keep sending while NATS does not
/// store what they publish: longer than a clustered stream takes to elect a new leader after
/// losing a server (4–7 s measured in docs/faults.md), short enough for a person waiting.
pub const RETRY_FOR: Duration = Duration::from_secs(30);

/// Flags of `allot validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The workload spec: YAML, or JSON for a `.json` file; `-` reads standard input.
    pub file: PathBuf,
    /// Teams file (ALLOT_TEAMS_FILE; default `./teams.yaml` when it exists).
    #[arg(long)]
    pub teams: Option<PathBuf>,
    /// Check requests against this cluster: NODESxGPUS[:MODEL][,…], e.g. `4x8:H100,2x4:L4`.
    #[arg(long)]
    pub cluster: Option<String>,
}

/// Flags of `allot submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The workload spec: YAML, or JSON for a `.json` file; `-` reads standard input.
    pub file: PathBuf,
    /// The CI run (or attempt) submitting it (ALLOT_RUN_ID): the same spec and run id are one
    /// submission, however often they are sent.
    #[arg(long)]
    pub run_id: Option<String>,
    /// Use this idempotency key instead of the hash of the spec and the run id.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Who submits, for the record (ALLOT_SUBMITTER; default `$USER@<hostname>`).
    #[arg(long)]
    pub submitter: Option<String>,
    /// Teams file (ALLOT_TEAMS_FILE; default `./teams.yaml` when it exists).
    #[arg(long)]
    pub teams: Option<PathBuf>,
    /// NATS URL (ALLOT_NATS_URL; default: ./.allot/nats.url, then nats://127.0.0.1:4222).
    #[arg(long)]
    pub nats: Option<String>,
    /// Folder where `allot up` keeps its state (ALLOT_DATA_DIR).
    #[arg(long)]
    pub data_dir: Option<String>,
    /// Wait until the workload finishes; exit 0 only if it succeeded (3 failed, 4 aborted,
    /// 5 timed out) and print a summary of its tasks.
    #[arg(long)]
    pub wait: bool,
    /// Print each step of the workload as it happens, then the summary (implies --wait).
    #[arg(long)]
    pub follow: bool,
    /// Stop waiting after this long (`30m`, `2h`) and exit 5; the workload goes on (implies
    /// --wait).
    #[arg(long, value_parser = allot_workload::quantity::duration)]
    pub timeout: Option<Duration>,
    /// How --wait and --follow print: `text` (a CI log) or `json` (one object per line).
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
    /// Keep sending the submission for this long (default `30s`) while NATS does not store
    /// it — no acknowledgement, a stream electing a leader, the connection down — then exit 1;
    /// every attempt carries the same id, so the stream stores it once.
    #[arg(long, value_parser = allot_workload::quantity::duration)]
    pub retry_for: Option<Duration>,
}

/// `allot validate FILE`: every problem, or a one-line summary.
pub fn validate(args: ValidateArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let (text, format) = match read_spec(&args.file)? {
        Ok(read) => read,
        Err(problem) => return Ok(rejected(&args.file, &[problem])),
    };
    let (teams, teams_note) = load_teams(args.teams.as_deref(), env)?;
    let cluster = args.cluster.as_deref().map(offline_cluster).transpose()?;
    let cluster_note = match &cluster {
        Some(c) => format!("cluster {}", c.describe()),
        None => "node capacity not checked (no --cluster)".to_owned(),
    };
    let ctx = Context {
        teams: teams.as_ref(),
        cluster: cluster.as_ref(),
    };
    match allot_workload::check(&text, format, ctx) {
        Ok(checked) => {
            println!(
                "{}: valid — {}; checked against {teams_note}, {cluster_note}",
                args.file.display(),
                summary(&checked, teams.as_ref())
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(problems) => Ok(rejected(&args.file, &problems)),
    }
}

/// `allot submit FILE`: validates (against the live inventory when it answers), publishes
/// `WorkloadSubmitted` with `Nats-Msg-Id` = a hash of team, idempotency key and spec, awaits the
/// PubAck, and prints the workload id on standard output.
pub async fn submit(args: SubmitArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let wait = args.wait || args.follow || args.timeout.is_some();
    // Before connecting: a spec that is not text, or too large, is refused whatever the bus.
    let (text, format) = match read_spec(&args.file)? {
        Ok(read) => read,
        Err(problem) => return Ok(rejected(&args.file, &[problem])),
    };
    let (teams, teams_note) = load_teams(args.teams.as_deref(), env)?;
    let run_id = args.run_id.clone().or_else(|| env("ALLOT_RUN_ID"));

    let connection = local::connect_client(
        "allot-submit",
        args.nats.as_deref(),
        args.data_dir.as_deref(),
        env,
        "nothing was submitted",
    )
    .await?;
    let client = connection.client.clone();

    let (cluster, cluster_note) = match live_cluster(&client).await {
        Ok(c) if c.nodes.is_empty() => (
            None,
            "the inventory knows no nodes yet, so node capacity was not checked (static checks \
             only)"
                .to_owned(),
        ),
        Ok(c) => {
            let note = format!("the live inventory ({})", c.describe());
            (Some(c), note)
        }
        Err(why) => (
            None,
            format!("{why}, so node capacity was not checked (static checks only)"),
        ),
    };
    let ctx = Context {
        teams: teams.as_ref(),
        cluster: cluster.as_ref(),
    };
    let checked = match allot_workload::check(&text, format, ctx) {
        Ok(checked) => checked,
        Err(problems) => {
            eprintln!("checked against {teams_note}, {cluster_note}");
            return Ok(rejected(&args.file, &problems));
        }
    };
    let team = &checked.workload.metadata.team;
    if let Some(why) = connection.refuses_team(team, &args.file.display().to_string()) {
        eprintln!("allot: {why}; nothing was submitted");
        return Ok(ExitCode::from(2));
    }
    let summary = summary(&checked, teams.as_ref());
    let key = args
        .idempotency_key
        .clone()
        .unwrap_or_else(|| submit::idempotency_key(&checked.workload, run_id.as_deref()));
    let submitter = args
        .submitter
        .clone()
        .or_else(|| env("ALLOT_SUBMITTER"))
        .unwrap_or_else(|| default_submitter(env));
    let Submission {
        envelope,
        msg_id,
        workload_id,
    } = submit::submission(
        checked.workload.clone(),
        key,
        run_id,
        submitter,
        "/allot/cli",
        chrono::Utc::now(),
    );

    let publisher = Publisher::new(client.clone(), "/allot/cli");
    let message = PublishMessage::build()
        .message_id(msg_id)
        .payload(bytes::Bytes::from(envelope.to_json()));
    let subject = envelope.nats_subject();
    let started = std::time::Instant::now();
    let Patient {
        published,
        attempts,
    } = publisher
        .publish_patiently(&subject, message, args.retry_for.unwrap_or(RETRY_FOR))
        .await
        .with_context(|| {
            format!(
                "publishing {workload_id} (tried for {:.1} s); it may not have been submitted — \
                 running the same command again is safe: the same spec and run id are stored once",
                started.elapsed().as_secs_f64()
            )
        })?;
    let after = if attempts > 1 {
        format!(
            " (attempt {attempts}, {:.1} s after the first)",
            started.elapsed().as_secs_f64()
        )
    } else {
        String::new()
    };
    if published.duplicate && attempts > 1 {
        eprintln!(
            "{workload_id}: submitted{after} — an earlier attempt, or an earlier submission of the \
             same spec and run id, was stored first: {} sequence {}; nothing new was stored",
            published.stream, published.sequence
        );
    } else if published.duplicate {
        eprintln!(
            "{workload_id}: already submitted (same spec and run id; {} kept the first, sequence \
             {}); nothing new was stored",
            published.stream, published.sequence
        );
    } else {
        eprintln!(
            "{workload_id}: submitted{after} — {summary}; checked against {teams_note}, \
             {cluster_note}; {subject} stored as {} sequence {}",
            published.stream, published.sequence
        );
    }
    if !wait {
        client.drain().await.ok();
        println!("{workload_id}");
        return Ok(ExitCode::SUCCESS);
    }
    match args.output {
        Output::Text => println!("{workload_id}"),
        Output::Json => println!(
            "{}",
            serde_json::json!({
                "workload": workload_id,
                "state": "submitted",
                "duplicate": published.duplicate,
                "sequence": published.sequence,
            })
        ),
    }
    let watched = Watch {
        workload_id,
        spec: checked.workload,
        sequence: published.sequence,
        follow: args.follow,
        output: args.output,
        timeout: args.timeout,
    };
    let summary = match connection.team.clone() {
        // A team's user may read no stream (they hold every team's events): it asks the
        // planner instead, as `allot workload` does.
        Some(team) => {
            if args.follow {
                eprintln!(
                    "following through the planner's answers, as team-{team} (it may read no \
                     stream): each task's state as it changes, asked every second"
                );
            }
            watch::poll(&client, &team, watched).await?
        }
        None => watch::watch(&client, watched).await?,
    };
    client.drain().await.ok();
    Ok(ExitCode::from(watch::exit_code(summary.ending)))
}

/// A spec as read: its text and format, or why it cannot be one (too large, not UTF-8).
type SpecText = Result<(String, Format), SpecProblem>;

/// The spec's text and format (`-` reads standard input, as YAML unless it starts with `{`).
///
/// At most one byte more than [`limits::MAX_SPEC_BYTES`] is read, so `allot validate - <
/// /dev/zero` stops at once with the size problem instead of filling memory.
fn read_spec(path: &Path) -> anyhow::Result<SpecText> {
    let bound = limits::MAX_SPEC_BYTES as u64 + 1;
    let mut bytes = Vec::new();
    if path == Path::new("-") {
        std::io::stdin()
            .lock()
            .take(bound)
            .read_to_end(&mut bytes)
            .context("reading the spec from standard input")?;
        if bytes.len() > limits::MAX_SPEC_BYTES {
            return Ok(Err(limits::too_large(SpecSize::MoreThan(
                limits::MAX_SPEC_BYTES as u64,
            ))));
        }
        let text = match limits::text(bytes) {
            Ok(text) => text,
            Err(problem) => return Ok(Err(problem)),
        };
        let format = if text.trim_start().starts_with('{') {
            Format::Json
        } else {
            Format::Yaml
        };
        return Ok(Ok((text, format)));
    }
    let reading = || format!("reading the workload spec {}", path.display());
    let file = std::fs::File::open(path).with_context(reading)?;
    file.take(bound)
        .read_to_end(&mut bytes)
        .with_context(reading)?;
    if bytes.len() > limits::MAX_SPEC_BYTES {
        // A regular file's size is known; a pipe or device is only known to be too large.
        let size = std::fs::metadata(path)
            .ok()
            .filter(|m| m.is_file() && m.len() > limits::MAX_SPEC_BYTES as u64)
            .map_or(SpecSize::MoreThan(limits::MAX_SPEC_BYTES as u64), |m| {
                SpecSize::Bytes(m.len())
            });
        return Ok(Err(limits::too_large(size)));
    }
    Ok(limits::text(bytes).map(|text| (text, Format::from_path(path))))
}

/// The teams file from `--teams`, `ALLOT_TEAMS_FILE` or `./teams.yaml`, and how to say what was
/// checked.
fn load_teams(
    flag: Option<&Path>,
    env: Lookup<'_>,
) -> anyhow::Result<(Option<TeamsConfig>, String)> {
    let path = flag
        .map(Path::to_path_buf)
        .or_else(|| env("ALLOT_TEAMS_FILE").map(PathBuf::from))
        .or_else(|| Some(PathBuf::from("teams.yaml")).filter(|p| p.is_file()));
    let Some(path) = path else {
        return Ok((
            None,
            "no teams file (teams not checked, default priority classes)".to_owned(),
        ));
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the teams file {}", path.display()))?;
    let teams = TeamsConfig::from_yaml(&text).with_context(|| path.display().to_string())?;
    Ok((Some(teams), path.display().to_string()))
}

/// `--cluster 4x8:H100`: GPU memory from the models the simulator knows.
fn offline_cluster(spec: &str) -> anyhow::Result<ClusterShape> {
    let mut cluster = ClusterShape::parse(spec)?;
    for node in &mut cluster.nodes {
        if let Ok(model) = node.gpu_model.parse::<allot_collector::GpuModel>() {
            node.gpu_memory_mib = model.memory_mib();
        }
    }
    Ok(cluster)
}

/// The cluster as the inventory sees it, or why it could not be asked.
async fn live_cluster(client: &async_nats::Client) -> Result<ClusterShape, String> {
    super::status::ask(client, Duration::from_secs(3))
        .await
        .map(|status| cluster_of(&status))
        .map_err(|e| format!("{e:#}"))
}

/// Node shapes from the inventory's status: every GPU counts, healthy or not (health changes;
/// this asks what could *ever* run).
pub fn cluster_of(status: &ClusterStatus) -> ClusterShape {
    let mut cluster = ClusterShape::default();
    for node in &status.nodes {
        cluster.add(NodeShape {
            count: 1,
            gpus: node.gpus.len() as u32,
            gpu_model: node
                .gpus
                .iter()
                .find_map(|g| g.model.clone())
                .unwrap_or_default(),
            gpu_memory_mib: node
                .gpus
                .iter()
                .filter_map(|g| g.memory_total_mib)
                .min()
                .unwrap_or(0),
            cpu_milli: node.cpu_milli,
            memory_mib: node.memory_mib,
            mig: None,
        });
    }
    cluster
}

/// `train-eval (team vision, priority standard = 100): 6 tasks (5 with GPUs), 1 gang, longest
/// chain 3`.
fn summary(checked: &Checked, teams: Option<&TeamsConfig>) -> String {
    let w = &checked.workload;
    let defaults = TeamsConfig::default();
    let class = w
        .metadata
        .priority_class
        .clone()
        .unwrap_or_else(|| teams.unwrap_or(&defaults).default_priority_class.clone());
    let tasks = w.spec.tasks.len();
    let gpu_tasks = checked.requests.values().filter(|r| r.gpus > 0).count();
    let gangs: std::collections::BTreeSet<&str> = w
        .spec
        .tasks
        .iter()
        .filter_map(|t| t.gang.as_deref())
        .collect();
    let depth = checked
        .dag
        .values()
        .map(|f| f.critical_path_rank)
        .max()
        .unwrap_or(0);
    format!(
        "{} (team {}, priority {class} = {}): {tasks} task{} ({gpu_tasks} with GPUs), {} gang{}, \
         longest chain {depth}",
        w.metadata.name,
        w.metadata.team,
        checked.priority,
        if tasks == 1 { "" } else { "s" },
        gangs.len(),
        if gangs.len() == 1 { "" } else { "s" },
    )
}

/// Prints every problem and returns the rejected exit code.
fn rejected(file: &Path, problems: &[SpecProblem]) -> ExitCode {
    let mut err = std::io::stderr().lock();
    let n = problems.len();
    let _ = writeln!(
        err,
        "{}: rejected, {n} problem{}; nothing was submitted:",
        file.display(),
        if n == 1 { "" } else { "s" }
    );
    for p in problems {
        let _ = writeln!(err, "  - {p}");
    }
    ExitCode::from(REJECTED)
}

fn default_submitter(env: Lookup<'_>) -> String {
    let user = env("USER").unwrap_or_else(|| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into());
    format!("{user}@{host}")
}
