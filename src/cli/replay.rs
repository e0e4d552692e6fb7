//! `allot replay` and `allot explain`: audit the allocator's journal.
//!
//! `replay --verify` rebuilds the scheduler from the journal's first entry and recomputes
//! every decision; on the first difference it prints the logged and the recomputed outcome
//! and exits non-zero. Each logged entry is first checked against the journal invariants (no
//! GPU held twice, no task granted twice, every lease ended once): the first one broken is
//! reported by entry, task, lease and GPU, also with exit 1. `explain` prints one task's
//! history from the journal, with reasons.
//!
//! Journals come from the DECISIONS stream (`--nats URL --pool P`: what the allocator wrote)
//! or from a file (`--journal PATH`: what `allot sim --journal` writes, one JSON line per
//! entry after a header line).

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;

use allot_sched::journal::{self, Entry, Header, VerifyError};
use allot_sched::{Decision, Input, TaskId, Time};

use super::local;
use super::settings::Lookup;

/// Where a journal is read from (one of the two).
#[derive(Debug, Args)]
pub struct JournalSource {
    /// The journal: a JSON-lines file as `allot sim --journal` writes it.
    #[arg(long, conflicts_with_all = ["pool", "nats", "data_dir"])]
    pub journal: Option<PathBuf>,
    /// The pool whose journal to read from the DECISIONS stream (default: `default`, the pool
    /// of `allot up`).
    #[arg(long)]
    pub pool: Option<String>,
    /// NATS URL (ALLOT_NATS_URL; default: the Allot running in this folder).
    #[arg(long)]
    pub nats: Option<String>,
    /// Folder where `allot up` keeps its state (ALLOT_DATA_DIR).
    #[arg(long)]
    pub data_dir: Option<String>,
}

impl JournalSource {
    /// The journal's header and entries: the file, or the pool's journal on the instance
    /// [`local::instance_url`] finds.
    async fn open(&self, env: Lookup<'_>) -> anyhow::Result<(Header, Entries)> {
        if let Some(path) = &self.journal {
            return open(path);
        }
        let pool = self.pool.as_deref().unwrap_or(DEFAULT_POOL);
        from_events(pool, self.events(env).await?)
    }

    /// The pool's journal as the allocator published it, from the instance
    /// [`local::instance_url`] finds.
    async fn events(&self, env: Lookup<'_>) -> anyhow::Result<Vec<allot_events::AllocEvent>> {
        let pool = self.pool.as_deref().unwrap_or(DEFAULT_POOL);
        let (url, origin) =
            local::instance_url(self.nats.as_deref(), self.data_dir.as_deref(), env)?;
        let client = local::connect_url("allot-replay", &url, &origin).await?;
        let js = async_nats::jetstream::new(client);
        let events = allot_allocator::journal::read(&js, pool)
            .await
            .with_context(|| format!("reading the journal of pool {pool}"))?;
        Ok(events.into_iter().map(|(_, event)| event).collect())
    }
}

impl JournalSource {
    /// The predictor's right-sizing advice for the pool's tasks, by attempt, from their
    /// `TaskPredicted` events in WORKLOADS; none for a journal file.
    async fn right_sizing(
        &self,
        env: Lookup<'_>,
    ) -> anyhow::Result<BTreeMap<TaskId, allot_predict::rightsize::Recommendation>> {
        if self.journal.is_some() {
            return Ok(BTreeMap::new());
        }
        let pool = self.pool.as_deref().unwrap_or(DEFAULT_POOL);
        let (url, origin) =
            local::instance_url(self.nats.as_deref(), self.data_dir.as_deref(), env)?;
        let client = local::connect_url("allot-explain", &url, &origin).await?;
        let js = async_nats::jetstream::new(client);
        let filter = allot_events::subject::task("predicted", pool);
        let mut out = BTreeMap::new();
        for m in super::costs::read(&js, allot_bus::streams::names::WORKLOADS, &filter).await? {
            if let Ok(envelope) = allot_events::decode(&m.payload)
                && let allot_events::AnyEvent::Task(allot_events::TaskEvent::Predicted(p)) =
                    envelope.data
                && let Some(r) = p.right_size
            {
                out.insert(p.task, r);
            }
        }
        Ok(out)
    }

    /// The entries with, for a journal read from the stream, the launch each submission was
    /// journalled with (its workload and task name); a file has no launches.
    async fn open_named(
        &self,
        env: Lookup<'_>,
    ) -> anyhow::Result<Vec<(Entry, Option<allot_events::alloc::Launch>)>> {
        Ok(self.open_with_launches(env).await?.1)
    }

    /// The journal's policy and [`Self::open_named`]'s entries.
    pub(super) async fn open_with_launches(
        &self,
        env: Lookup<'_>,
    ) -> anyhow::Result<(String, Vec<(Entry, Option<allot_events::alloc::Launch>)>)> {
        if let Some(path) = &self.journal {
            let (header, entries) = open(path)?;
            let entries = entries
                .map(|e| e.map(|e| (e, None)))
                .collect::<Result<_, _>>()?;
            return Ok((header.policy, entries));
        }
        let pool = self.pool.as_deref().unwrap_or(DEFAULT_POOL);
        let mut policy = None;
        let mut entries = Vec::new();
        for event in self.events(env).await? {
            match event {
                allot_events::AllocEvent::Applied(a) => entries.push((a.entry, a.launch)),
                allot_events::AllocEvent::LeaderElected(e) => policy = policy.or(Some(e.policy)),
            }
        }
        let Some(policy) = policy else {
            bail!("pool {pool} has no journal on this server");
        };
        Ok((policy, entries))
    }
}

/// The pool `allot up` runs.
const DEFAULT_POOL: &str = "default";

/// Flags of `allot replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Where the journal is.
    #[command(flatten)]
    pub source: JournalSource,
    /// Recompute every decision and check the journal invariants; stop at the first
    /// difference or broken invariant (exit 1).
    #[arg(long)]
    pub verify: bool,
    /// Compare only entries at or after this time (ms on the journal's clock); the state is
    /// still rebuilt from the first entry.
    #[arg(long)]
    pub from: Option<Time>,
    /// Stop after this time (ms on the journal's clock).
    #[arg(long)]
    pub to: Option<Time>,
}

/// Flags of `allot explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// A workload id as `allot submit` printed it (`train-eval-3f9a2c71d0`), or a task id
    /// (`42`, `task-42`).
    pub target: String,
    /// With a workload: the task to explain, by its name in the spec (default: every task of
    /// the workload).
    pub task: Option<String>,
    /// Where the journal is.
    #[command(flatten)]
    pub source: JournalSource,
}

/// The most attempts `allot explain WORKLOAD TASK` looks for.
const MAX_ATTEMPTS: u32 = 100;

/// Runs `allot replay`.
pub async fn replay(args: ReplayArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    if !args.verify {
        bail!("nothing to do: add --verify to recompute and compare every decision");
    }
    let (header, entries) = args.source.open(env).await?;
    let started = Instant::now();
    let mut bad_line: Option<anyhow::Error> = None;
    let entries = entries.map_while(|e| match e {
        Ok(entry) => Some(entry),
        Err(err) => {
            bad_line = Some(err);
            None
        }
    });
    let outcome = journal::verify(&header, entries, args.from, args.to);
    if let Some(err) = bad_line {
        return Err(err);
    }
    let elapsed = started.elapsed().as_secs_f64();
    match outcome {
        Ok(summary) => {
            println!(
                "verified: {} entries applied, {} compared, {} decisions recomputed identically \
                 and no invariant broken (no GPU held twice, no task granted twice, every lease \
                 ended once) in {elapsed:.2} s ({:.0} decisions/s, policy {})",
                summary.entries,
                summary.verified,
                summary.decisions,
                summary.decisions as f64 / elapsed.max(1e-9),
                header.policy
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(VerifyError::Mismatch(m)) => {
            println!(
                "MISMATCH at entry {}: {}",
                m.logged.seq,
                journal::describe(&m.logged.input)
            );
            println!("logged:     {}", outcome_line(&m.logged));
            println!("recomputed: {}", outcome_line(&m.recomputed));
            Ok(ExitCode::FAILURE)
        }
        Err(VerifyError::Invariant(b)) => {
            println!(
                "INVARIANT BROKEN at entry {}: {}",
                b.logged.seq,
                journal::describe(&b.logged.input)
            );
            println!("{}", b.violation.broken);
            println!("logged:     {}", outcome_line(&b.logged));
            match &b.recomputed {
                Some(recomputed) => println!("recomputed: {}", outcome_line(recomputed)),
                None => println!(
                    "recomputed: identical — the scheduler itself decides this (a scheduler bug, \
                     not an edited journal)"
                ),
            }
            Ok(ExitCode::FAILURE)
        }
        Err(e) => {
            println!("cannot verify: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Runs `allot explain`.
pub async fn explain(args: ExplainArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let journal = args.source.open_named(env).await?;
    // Task ids and names, from the launches the allocator journalled with each submission.
    let mut names: Vec<(TaskId, String, String)> = Vec::new();
    for (entry, launch) in &journal {
        if let (Input::TaskSubmitted { task, .. }, Some(l)) = (&entry.input, launch) {
            names.push((task.id, l.workload.clone(), l.name.clone()));
        }
    }
    let by_id = args
        .target
        .trim_start_matches("task-")
        .parse::<u64>()
        .ok()
        .filter(|_| args.task.is_none());
    let tasks: Vec<(TaskId, String)> = match (by_id, &args.task) {
        (Some(id), _) => {
            let task = TaskId(id);
            let label = names
                .iter()
                .find(|(t, _, _)| *t == task)
                .map_or_else(|| task.to_string(), |(_, w, n)| format!("{w}/{n} ({task})"));
            let appears = journal
                .iter()
                .any(|(e, _)| !history(e, task, &[]).is_empty());
            if appears {
                vec![(task, label)]
            } else {
                Vec::new()
            }
        }
        (None, Some(name)) => (1..=MAX_ATTEMPTS)
            .map(|attempt| {
                let id = allot_events::task::task_id(&args.target, name, attempt);
                (
                    id,
                    format!("{}/{name} attempt {attempt} ({id})", args.target),
                )
            })
            .filter(|(id, _)| {
                journal
                    .iter()
                    .any(|(e, _)| !history(e, *id, &[]).is_empty())
            })
            .collect(),
        (None, None) => names
            .iter()
            .filter(|(_, w, _)| *w == args.target)
            .map(|(id, w, n)| (*id, format!("{w}/{n} ({id})")))
            .collect(),
    };
    if tasks.is_empty() {
        match &args.task {
            Some(name) => println!(
                "task {name} of workload {} does not appear in the journal",
                args.target
            ),
            None => println!("{} does not appear in the journal", args.target),
        }
        return Ok(ExitCode::FAILURE);
    }
    let advice = args.source.right_sizing(env).await?;
    for (task, label) in &tasks {
        println!("{label}:");
        if let Some(r) = advice.get(task) {
            println!("  {}", right_sizing(r));
        }
        // Node indices as the journal numbers them: in the order the nodes were added.
        let mut nodes: Vec<String> = Vec::new();
        for (entry, _) in &journal {
            if let Input::NodeAdded(spec) = &entry.input {
                nodes.push(spec.name.clone());
            }
            for line in history(entry, *task, &nodes) {
                println!("  {line}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The predictor's right-sizing advice, in one line.
fn right_sizing(r: &allot_predict::rightsize::Recommendation) -> String {
    use allot_prices::format_money;
    let share = if r.gpu_milli >= 1000 {
        format!("{} whole {}", r.gpus, r.model)
    } else {
        format!("{} of one {}", r.gpu_milli as f64 / 1000.0, r.model)
    };
    let saving = match r.saving_micros_per_hour() {
        Some(s) => format!(
            ", {}/h against {}/h as requested",
            format_money(r.micros_per_hour),
            format_money(r.micros_per_hour + s)
        ),
        None => format!(", {}/h", format_money(r.micros_per_hour)),
    };
    format!(
        "right-sizing: {share} with {} MiB of GPU memory held its last {} runs{saving} \
         (applied only when the spec sets resources.rightSize: true)",
        r.gpu_memory_mib, r.runs
    )
}

/// A journal time: a wall-clock instant (ms since the epoch, the allocator's clock) as UTC,
/// or — for a simulated journal, whose clock starts at 0 — the offset from its start.
fn when(ms: Time) -> String {
    // Anything after 2001 is a wall clock; a trace spans far less.
    if ms >= 1_000_000_000_000
        && let Some(t) = chrono::DateTime::from_timestamp_millis(ms as i64)
    {
        return t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string();
    }
    let secs = ms / 1000;
    format!(
        "+{}h{:02}m{:02}.{:03}s",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        ms % 1000
    )
}

/// Node `idx` by name, when the journal added it.
fn node_name(nodes: &[String], idx: usize) -> String {
    nodes
        .get(idx)
        .cloned()
        .unwrap_or_else(|| format!("node #{idx}"))
}

/// What `entry` says about `task`, one line per fact.
fn history(entry: &Entry, task: TaskId, nodes: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let seq = entry.seq;
    match &entry.input {
        Input::TaskSubmitted { task: spec, at } if spec.id == task => {
            let gpus = if spec.gpu_milli < 1000 && spec.gpus == 1 {
                format!("{} milli-GPU", spec.gpu_milli)
            } else {
                format!("{} GPU(s)", spec.gpus)
            };
            out.push(format!(
                "#{seq} {} submitted by team {}, priority {}, {gpus}",
                when(*at),
                spec.team,
                spec.priority
            ));
        }
        Input::TaskPreloaded {
            task: spec,
            expected_at,
            at,
        } if spec.id == task => {
            out.push(format!(
                "#{seq} {} preloaded: expected ready at {}",
                when(*at),
                when(*expected_at)
            ));
        }
        Input::TaskFinished { task: t, at, run } if *t == task => match run {
            Some(run) => out.push(format!(
                "#{seq} {} finished: {}",
                when(*at),
                journal::run_end(run)
            )),
            None => out.push(format!("#{seq} {} finished", when(*at))),
        },
        Input::TaskPredicted {
            task: t,
            duration,
            at,
        } if *t == task => {
            out.push(format!(
                "#{seq} {} predicted to run {} in all (the scheduler's estimate from now on)",
                when(*at),
                super::workloads::span_ms(*duration)
            ));
        }
        Input::TaskRequeued {
            task: t,
            at,
            reason,
        } if *t == task => {
            out.push(format!("#{seq} {} requeued: {reason}", when(*at)));
        }
        _ => {}
    }
    if let Some(why) = &entry.rejected
        && mentions(&entry.input, task)
    {
        out.push(format!("#{seq} rejected: {why}"));
    }
    for d in &entry.decisions {
        match d {
            Decision::Granted {
                task: t,
                lease,
                placement,
                at,
                reason,
            } if *t == task => {
                let nodes: Vec<String> = placement
                    .shares
                    .iter()
                    .map(|s| {
                        let gpus: Vec<String> = s.gpus.iter().map(|(g, _)| g.to_string()).collect();
                        format!(
                            "{} GPUs [{}]",
                            node_name(nodes, s.node.0 as usize),
                            gpus.join(",")
                        )
                    })
                    .collect();
                out.push(format!(
                    "#{seq} {} granted lease {} on {}: {reason}",
                    when(*at),
                    lease.0,
                    nodes.join(" + ")
                ));
            }
            Decision::Waiting {
                task: t,
                reason,
                eta,
                at_risk,
                at,
            } if *t == task => {
                let eta = eta.map_or_else(|| "unknown".to_owned(), when);
                let risk = if *at_risk {
                    "; AT RISK of missing its deadline waiting its turn: moved ahead of equal \
                     priorities, earliest deadline first"
                } else {
                    ""
                };
                out.push(format!(
                    "#{seq} {} waiting: {reason} (expected start {eta}){risk}",
                    when(*at)
                ));
            }
            Decision::Preempted {
                task: t,
                at,
                for_task,
                reason,
                ..
            } if *t == task => {
                let for_task = for_task.map_or_else(String::new, |f| format!(" for {f}"));
                out.push(format!(
                    "#{seq} {} preempted{for_task}: {reason}",
                    when(*at)
                ));
            }
            Decision::Preempted {
                task: victim,
                at,
                for_task: Some(f),
                ..
            } if *f == task => {
                out.push(format!(
                    "#{seq} {} preempted {victim} to make room",
                    when(*at)
                ));
            }
            Decision::Released { task: t, lease, at } if *t == task => {
                out.push(format!("#{seq} {} released lease {}", when(*at), lease.0));
            }
            Decision::Withdrawn {
                task: t,
                reason,
                at,
            } if *t == task => {
                out.push(format!(
                    "#{seq} {} withdrawn from the queue: {reason}",
                    when(*at)
                ));
            }
            Decision::Reserved {
                task: t,
                placement,
                until,
                at,
            } if *t == task => {
                let nodes: Vec<String> = placement
                    .shares
                    .iter()
                    .map(|s| node_name(nodes, s.node.0 as usize))
                    .collect();
                out.push(format!(
                    "#{seq} {} room held on {} until {} (expected soon)",
                    when(*at),
                    nodes.join(" + "),
                    when(*until)
                ));
            }
            _ => {}
        }
    }
    out
}

fn mentions(input: &Input, task: TaskId) -> bool {
    match input {
        Input::TaskSubmitted { task: spec, .. } | Input::TaskPreloaded { task: spec, .. } => {
            spec.id == task
        }
        Input::TaskFinished { task: t, .. }
        | Input::TaskCheckpointed { task: t, .. }
        | Input::TaskRequeued { task: t, .. }
        | Input::TaskWithdrawn { task: t, .. }
        | Input::TaskPredicted { task: t, .. } => *t == task,
        _ => false,
    }
}

fn outcome_line(entry: &Entry) -> String {
    if let Some(why) = &entry.rejected {
        return format!("rejected: {why}");
    }
    serde_json::to_string(&entry.decisions).unwrap_or_else(|e| format!("<unprintable: {e}>"))
}

type Entries = Box<dyn Iterator<Item = anyhow::Result<Entry>>>;

/// The header and entries of a pool's journal events: the policy from its elections, the
/// entries in order.
fn from_events(
    pool: &str,
    events: Vec<allot_events::AllocEvent>,
) -> anyhow::Result<(Header, Entries)> {
    let mut policy = None;
    let mut entries = Vec::new();
    for event in events {
        match event {
            allot_events::AllocEvent::LeaderElected(e) => policy = policy.or(Some(e.policy)),
            allot_events::AllocEvent::Applied(a) => entries.push(Ok(a.entry)),
        }
    }
    let Some(policy) = policy else {
        bail!("pool {pool} has no journal on this server");
    };
    Ok((Header::new(&policy), Box::new(entries.into_iter())))
}

/// Opens a journal file: its header and an iterator over its entries (an unreadable line is
/// an error naming the file and line).
fn open(path: &Path) -> anyhow::Result<(Header, Entries)> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("opening the journal {}", path.display()))?;
    let mut lines = std::io::BufReader::new(file).lines();
    let first = lines
        .next()
        .with_context(|| format!("{}: empty file, expected a journal header", path.display()))?
        .with_context(|| format!("reading {}", path.display()))?;
    let header: Header = serde_json::from_str(&first)
        .with_context(|| format!("{}:1: not a journal header", path.display()))?;
    let shown = path.display().to_string();
    // Parsed on a thread of its own, ahead of the replay: parsing is about a tenth of the
    // work, and a second core does it meanwhile. Handed over in batches (one hand-over per
    // entry would cost more than the parsing); the thread stops at the first bad line, or once
    // the replay stops reading.
    let (parsed, batches) = std::sync::mpsc::sync_channel::<Vec<anyhow::Result<Entry>>>(4);
    std::thread::Builder::new()
        .name("journal-reader".into())
        .spawn(move || {
            let mut batch = Vec::with_capacity(PARSED_BATCH);
            for (i, line) in lines.enumerate() {
                let entry = line
                    .with_context(|| format!("reading {shown}"))
                    .and_then(|line| {
                        serde_json::from_str::<Entry>(&line)
                            .with_context(|| format!("{shown}:{}: not a journal entry", i + 2))
                    });
                let bad = entry.is_err();
                batch.push(entry);
                if bad || batch.len() == PARSED_BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(PARSED_BATCH));
                    if parsed.send(full).is_err() || bad {
                        return;
                    }
                }
            }
            let _ = parsed.send(batch);
        })
        .context("starting the journal reader")?;
    Ok((header, Box::new(batches.into_iter().flatten())))
}

/// How many entries the reader parses before handing them to the replay (up to four batches
/// ahead of it).
const PARSED_BATCH: usize = 1024;

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A journal file of `n` entries (schedule passes), with `bad` written in place of entry
    /// `at` if given.
    fn journal(n: u64, bad: Option<(u64, &str)>) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "{}",
            serde_json::to_string(&Header::new("allot")).unwrap()
        )
        .unwrap();
        for seq in 1..=n {
            let line = match bad {
                Some((at, bad)) if at == seq => bad.to_owned(),
                _ => serde_json::to_string(&Entry {
                    seq,
                    input: Input::Schedule { at: seq },
                    decisions: Vec::new(),
                    rejected: None,
                })
                .unwrap(),
            };
            writeln!(file, "{line}").unwrap();
        }
        file
    }

    #[test]
    fn entries_come_in_order_across_the_readers_batches() {
        let n = 3 * PARSED_BATCH as u64 + 5;
        let file = journal(n, None);
        let (header, entries) = open(file.path()).unwrap();
        assert_eq!(header.policy, "allot");
        let seqs: Vec<u64> = entries.map(|e| e.unwrap().seq).collect();
        assert_eq!(seqs, (1..=n).collect::<Vec<_>>());
    }

    #[test]
    fn a_bad_line_ends_the_entries_with_an_error_naming_file_and_line() {
        let at = PARSED_BATCH as u64 + 7;
        let file = journal(2 * PARSED_BATCH as u64, Some((at, "{not json")));
        let (_, entries) = open(file.path()).unwrap();
        let all: Vec<anyhow::Result<Entry>> = entries.collect();
        assert_eq!(all.len() as u64, at, "entries after the bad line were read");
        assert!(all[..all.len() - 1].iter().all(Result::is_ok));
        let err = format!("{:#}", all.last().unwrap().as_ref().unwrap_err());
        // Line 1 is the header.
        let place = format!("{}:{}: not a journal entry", file.path().display(), at + 1);
        assert!(err.contains(&place), "{err}");
    }
}
