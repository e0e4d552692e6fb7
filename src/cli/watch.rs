//! `allot submit --wait` / `--follow` on the bus: two ordered consumers feed the workload's
//! events to [`follow::Progress`](super::follow::Progress) until the planner finishes it (or
//! `--timeout` runs out).
//!
//! Nothing published between the submission and the consumers' creation can be missed:
//!
//! - WORKLOADS is read from the submission's own stream sequence (the PubAck's; for a
//!   duplicate the server answers with the original's, so a retried CI job follows the
//!   workload it already started, however far along it is), filtered to the team's
//!   `allot.workload.{aborted,finished}.<team>` and every `allot.task.>`;
//! - the pool's journal (`allot.alloc.<pool>.journal` in DECISIONS) is read from the
//!   submission's server timestamp, once the first `TaskReady` names the pool (no decision
//!   about a task precedes its `TaskReady`, which follows the submission).
//!
//! When `WorkloadFinished` arrives, the journal is read up to its last entry at that moment
//! before the finish is passed on, so the log shows every decision about the workload.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::pull::OrderedConfig};
use futures::stream::{BoxStream, SelectAll};
use futures::{StreamExt, TryStreamExt};

use allot_bus::streams::names;
use allot_events::workload::Workload;
use allot_events::{TaskEvent, subject};

use allot_events::query::planner as contract;

use super::follow::{Ending, Line, Observed, Polled, Progress, Summary};

/// How `--follow` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Output {
    /// A CI log: `[+  12.345s] task  state  detail`, then a summary table.
    #[default]
    Text,
    /// One JSON object per line; the summary last, as `{"summary": …}`.
    Json,
}

/// What to watch, and how.
#[derive(Debug, Clone)]
pub struct Watch {
    /// The workload id.
    pub workload_id: String,
    /// Its spec (task names, retry limits).
    pub spec: Workload,
    /// The submission's sequence in WORKLOADS.
    pub sequence: u64,
    /// Print each event as it happens (`--follow`), not only the summary.
    pub follow: bool,
    /// Text or JSON lines.
    pub output: Output,
    /// Give up waiting after this long.
    pub timeout: Option<Duration>,
}

/// How long without any event about the workload before saying the planner may be missing.
const QUIET_HINT: Duration = Duration::from_secs(10);
/// How long to wait for the journal to deliver the entries it held when the workload finished.
const JOURNAL_CATCH_UP: Duration = Duration::from_secs(5);
/// Start the journal this much before the submission's timestamp: in a cluster, streams are
/// led by different servers whose clocks may differ a little. Earlier entries are skipped.
const CLOCK_MARGIN: Duration = Duration::from_secs(1);

type Journals = SelectAll<BoxStream<'static, (String, anyhow::Result<jetstream::Message>)>>;

/// Follows the workload until it finishes or the timeout runs out; prints as asked; returns
/// the summary.
pub async fn watch(client: &async_nats::Client, w: Watch) -> anyhow::Result<Summary> {
    let js = jetstream::new(client.clone());
    let workloads = js
        .get_stream(names::WORKLOADS)
        .await
        .context("opening the WORKLOADS stream")?;
    let stored = workloads
        .get_raw_message(w.sequence)
        .await
        .with_context(|| format!("reading the submission back (WORKLOADS #{})", w.sequence))?;
    let submitted_ns = stored.time.unix_timestamp_nanos();
    let mut progress = Progress::new(&w.workload_id, &w.spec, (submitted_ns / 1_000_000) as i64);
    let print = |lines: Vec<Line>, progress: &Progress| {
        if w.follow {
            for line in lines {
                match w.output {
                    Output::Text => println!("{}", line.render(progress.width())),
                    Output::Json => {
                        println!("{}", serde_json::to_string(&line).unwrap_or_default())
                    }
                }
            }
        }
    };

    let team = &w.spec.metadata.team;
    let mut events = workloads
        .create_consumer(OrderedConfig {
            filter_subjects: vec![
                subject::workload_aborted(team),
                subject::workload_finished(team),
                subject::TASK_ALL.to_owned(),
            ],
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: w.sequence,
            },
            ..Default::default()
        })
        .await
        .context("following WORKLOADS")?
        .messages()
        .await
        .context("following WORKLOADS")?;
    let decisions = js
        .get_stream(names::DECISIONS)
        .await
        .context("opening the DECISIONS stream")?;
    let journal_from =
        async_nats::datetime::from_nanos(submitted_ns - CLOCK_MARGIN.as_nanos() as i128)
            .map_err(|e| anyhow::anyhow!("the submission's timestamp: {e}"))?;
    let mut journals = Journals::new();
    // Pools followed, with the last journal sequence read from each.
    let mut pools: BTreeMap<String, u64> = BTreeMap::new();

    let deadline = w.timeout.map(|t| tokio::time::Instant::now() + t);
    let timed_out = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(timed_out);
    let quiet = tokio::time::sleep(QUIET_HINT);
    tokio::pin!(quiet);
    let mut hinted = false;

    while !progress.is_finished() {
        tokio::select! {
            message = events.next() => {
                let message = message
                    .context("the WORKLOADS consumer ended")?
                    .context("following WORKLOADS")?;
                let (at_ms, observed) = match read(&message) {
                    Some(read) => read,
                    None => continue,
                };
                match &observed {
                    Observed::Task(TaskEvent::Ready(r))
                        if r.workload == w.workload_id && !pools.contains_key(&r.pool) =>
                    {
                        journals.push(journal(&decisions, &r.pool, journal_from).await?);
                        pools.insert(r.pool.clone(), 0);
                    }
                    Observed::Finished(f) if f.workload_id == w.workload_id => {
                        catch_up(&decisions, &mut journals, &mut pools, &mut progress, &print)
                            .await?;
                    }
                    _ => {}
                }
                let lines = progress.observe(at_ms, observed);
                print(lines, &progress);
            }
            Some((pool, message)) = journals.next(), if !journals.is_empty() => {
                let message = message?;
                if let Some((at_ms, observed)) = read(&message) {
                    let lines = progress.observe(at_ms, observed);
                    print(lines, &progress);
                }
                if let Ok(info) = message.info() {
                    pools.insert(pool, info.stream_sequence);
                }
            }
            () = &mut quiet, if !hinted => {
                hinted = true;
                if !progress.seen_anything() {
                    eprintln!(
                        "{}: nothing from the planner after {}s — is it running (`allot up`, or \
                         `allot run planner`)? Still waiting.",
                        w.workload_id,
                        QUIET_HINT.as_secs()
                    );
                }
            }
            () = &mut timed_out => break,
        }
    }

    let mut summary = progress.summary();
    if summary.ending == Ending::TimedOut {
        summary.waited_ms = w.timeout.map(|t| t.as_millis() as i64);
    }
    print_summary(&summary, w.output)?;
    Ok(summary)
}

/// How often a team's user asks the planner how the workload stands.
const POLL_EVERY: Duration = Duration::from_secs(1);

/// `--wait` / `--follow` for a team's user, whom the server lets read no stream: asks the
/// planner about the workload every [`POLL_EVERY`] (on the team's own query subject) and
/// prints what changed, until it has ended or the timeout runs out. See
/// [`Polled`](super::follow::Polled) for what this cannot see.
pub(super) async fn poll(
    client: &async_nats::Client,
    team: &str,
    w: Watch,
) -> anyhow::Result<Summary> {
    let subject = contract::workload_subject(Some(team));
    let query = contract::WorkloadQuery {
        id: w.workload_id.clone(),
    };
    let mut polled = Polled::new(&w.workload_id, &w.spec);
    let started = tokio::time::Instant::now();
    let deadline = w.timeout.map(|t| started + t);
    let mut hinted = false;
    let mut last = None;
    loop {
        match super::workloads::ask::<contract::WorkloadDetail>(client, &subject, &query).await? {
            Ok(detail) => {
                if w.follow {
                    for line in polled.observe(&detail) {
                        match w.output {
                            Output::Text => println!("{}", line.render(polled.width())),
                            Output::Json => {
                                println!("{}", serde_json::to_string(&line).unwrap_or_default())
                            }
                        }
                    }
                }
                let done = detail.workload.state != contract::WorkloadState::Running;
                last = Some(detail);
                if done {
                    break;
                }
            }
            // Not stored by the planner yet.
            Err(refused) if refused.code == contract::NOT_FOUND => {
                if !hinted && started.elapsed() >= QUIET_HINT {
                    hinted = true;
                    eprintln!(
                        "{}: the planner has not stored it after {}s — is it running? Still \
                         waiting.",
                        w.workload_id,
                        QUIET_HINT.as_secs()
                    );
                }
            }
            Err(refused) => {
                anyhow::bail!("the planner refused to show {}: {refused}", w.workload_id)
            }
        }
        let next = tokio::time::Instant::now() + POLL_EVERY;
        if deadline.is_some_and(|d| next > d) {
            break;
        }
        tokio::time::sleep_until(next).await;
    }
    let mut summary = match &last {
        Some(detail) => Polled::summary(detail),
        None => Summary {
            workload: w.workload_id.clone(),
            ending: Ending::TimedOut,
            reason: Some("the planner never showed it".into()),
            elapsed_ms: 0,
            waited_ms: None,
            tasks: Vec::new(),
        },
    };
    if summary.ending == Ending::TimedOut {
        summary.waited_ms = w.timeout.map(|t| t.as_millis() as i64);
    }
    print_summary(&summary, w.output)?;
    Ok(summary)
}

/// Prints the summary as text, or as one `{"summary": …}` JSON line.
fn print_summary(summary: &Summary, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Text => print!("{}", summary.render()),
        Output::Json => println!(
            "{}",
            serde_json::json!({ "summary": serde_json::to_value(summary)? })
        ),
    }
    Ok(())
}

/// The exit code for how the wait ended (see the module docs of `workload`).
pub fn exit_code(ending: Ending) -> u8 {
    match ending {
        Ending::Succeeded => 0,
        Ending::Failed => super::workload::WORKLOAD_FAILED,
        Ending::Aborted => super::workload::WORKLOAD_ABORTED,
        Ending::TimedOut => super::workload::TIMED_OUT,
    }
}

/// A message's server timestamp (ms since the epoch) and the event in it, if it is one
/// `--follow` cares about (anything undecodable is someone else's problem: skipped).
fn read(message: &jetstream::Message) -> Option<(i64, Observed)> {
    let at_ms = message
        .info()
        .ok()
        .map(|i| (i.published.unix_timestamp_nanos() / 1_000_000) as i64)?;
    let envelope = allot_events::decode(&message.payload).ok()?;
    Some((at_ms, Observed::from_event(envelope.data)?))
}

/// An ordered consumer on `pool`'s journal from `from`.
async fn journal(
    decisions: &jetstream::stream::Stream,
    pool: &str,
    from: async_nats::datetime::DateTime,
) -> anyhow::Result<BoxStream<'static, (String, anyhow::Result<jetstream::Message>)>> {
    let messages = decisions
        .create_consumer(OrderedConfig {
            filter_subject: subject::alloc_journal(pool),
            deliver_policy: DeliverPolicy::ByStartTime { start_time: from },
            ..Default::default()
        })
        .await
        .with_context(|| format!("following the journal of pool {pool}"))?
        .messages()
        .await
        .with_context(|| format!("following the journal of pool {pool}"))?;
    let pool = pool.to_owned();
    Ok(messages
        .map_err(anyhow::Error::from)
        .map(move |m| (pool.clone(), m))
        .boxed())
}

/// Reads every followed journal up to the entry that was last when this was called.
async fn catch_up(
    decisions: &jetstream::stream::Stream,
    journals: &mut Journals,
    pools: &mut BTreeMap<String, u64>,
    progress: &mut Progress,
    print: &impl Fn(Vec<Line>, &Progress),
) -> anyhow::Result<()> {
    let mut want = BTreeMap::new();
    for pool in pools.keys() {
        if let Ok(last) = decisions
            .get_last_raw_message_by_subject(&subject::alloc_journal(pool))
            .await
        {
            want.insert(pool.clone(), last.sequence);
        }
    }
    let behind = |pools: &BTreeMap<String, u64>| {
        want.iter()
            .any(|(pool, last)| pools.get(pool).copied().unwrap_or(0) < *last)
    };
    let caught_up = async {
        while behind(pools) {
            let Some((pool, message)) = journals.next().await else {
                break;
            };
            let message = message?;
            if let Some((at_ms, observed)) = read(&message) {
                let lines = progress.observe(at_ms, observed);
                print(lines, progress);
            }
            if let Ok(info) = message.info() {
                pools.insert(pool, info.stream_sequence);
            }
        }
        anyhow::Ok(())
    };
    match tokio::time::timeout(JOURNAL_CATCH_UP, caught_up).await {
        Ok(result) => result,
        // The summary is what matters now; a slow journal only costs log lines.
        Err(_) => Ok(()),
    }
}
