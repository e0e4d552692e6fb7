//! `allot queue [--team T]`: every waiting task of a pool in the order the scheduler would start
//! them, with why it waits and when it is expected to start.
//!
//! The answer is rebuilt from the pool's journal, the same way `allot replay` rebuilds the
//! scheduler: every journalled input applied in order (the predictions among them), then each
//! pending task asked [`allot_sched::Scheduler::waiting`] at the current time. So the queue shown
//! is the allocator's own, with nothing estimated twice: the ETA assumes running tasks end when
//! their estimates (the predictor's, once one was journalled) say, and holds room for work ahead.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use comfy_table::{Table, presets::NOTHING};
use serde::Serialize;

use allot_sched::{Input, Scheduler, TaskId, Time};

use super::replay::JournalSource;
use super::settings::Lookup;
use super::workloads::span_ms;

/// Flags of `allot queue`.
#[derive(Debug, Args)]
pub struct QueueArgs {
    /// Only this team's tasks (positions stay those in the whole queue).
    #[arg(long)]
    pub team: Option<String>,
    /// table (default) or json (one object per line).
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Where the journal is.
    #[command(flatten)]
    pub source: JournalSource,
}

/// How `allot queue` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns.
    Table,
    /// One JSON object per waiting task.
    Json,
}

/// One waiting task as `allot queue` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Waiting {
    /// Its place in the pool's queue, from 1.
    pub position: usize,
    /// The task (attempt) id.
    pub task_id: TaskId,
    /// Its workload and name in it, when the journal says (a journal from `allot sim` does not).
    pub workload: Option<String>,
    /// Its name in the workload.
    pub name: Option<String>,
    /// Its team.
    pub team: String,
    /// Its priority.
    pub priority: i32,
    /// GPUs asked for.
    pub gpus: u32,
    /// Milli-GPU per GPU.
    pub gpu_milli: u32,
    /// When it was submitted (ms on the journal's clock).
    pub submitted_ms: Option<Time>,
    /// Why it waits.
    pub reason: String,
    /// When it is expected to start (ms on the journal's clock); `None`: not before something
    /// else changes (a quota, a budget, a node).
    pub eta_ms: Option<Time>,
    /// The estimate of its run time the scheduler holds (a prediction once journalled).
    pub predicted_ms: Option<Time>,
    /// Its deadline (ms on the journal's clock), if its spec gives one.
    pub deadline_ms: Option<Time>,
    /// Whether it is expected to miss its deadline: its ETA plus its expected run time passes
    /// it (or no start can be foreseen).
    pub at_risk: bool,
}

/// Runs `allot queue`.
pub async fn queue(args: QueueArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let (policy, journal) = args.source.open_with_launches(env).await?;
    let live = args.source.journal.is_none();
    let mut scheduler = Scheduler::new(
        allot_sched::policy::by_name(&policy)
            .with_context(|| format!("the journal's policy {policy:?} is unknown"))?,
    );
    let mut names = BTreeMap::new();
    let mut submitted = BTreeMap::new();
    let mut last = 0;
    for (entry, launch) in journal {
        if let Input::TaskSubmitted { task, at } = &entry.input {
            submitted.insert(task.id, *at);
            if let Some(l) = launch {
                names.insert(task.id, (l.workload, l.name));
            }
        }
        last = entry.input.at().unwrap_or(last).max(last);
        // Rejected inputs changed nothing when they were logged, and change nothing here.
        let _ = scheduler.apply(entry.input);
    }
    // A live pool's queue is asked about now; a file's at its last entry.
    let now = if live {
        (chrono::Utc::now().timestamp_millis().max(0) as Time).max(last)
    } else {
        last
    };
    let rows = rows(&scheduler, now, &names, &submitted, args.team.as_deref());
    match args.output {
        Output::Json => {
            for row in &rows {
                println!("{}", serde_json::to_string(row)?);
            }
        }
        Output::Table => print!("{}", table(&rows, now)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The waiting tasks in queue order (of `team` only, when given).
pub fn rows(
    scheduler: &Scheduler,
    now: Time,
    names: &BTreeMap<TaskId, (String, String)>,
    submitted: &BTreeMap<TaskId, Time>,
    team: Option<&str>,
) -> Vec<Waiting> {
    let mut out = Vec::new();
    for (position, spec, w) in scheduler.queue(now) {
        if team.is_some_and(|t| t != spec.team) {
            continue;
        }
        let (workload, name) = names
            .get(&spec.id)
            .cloned()
            .map_or((None, None), |(w, n)| (Some(w), Some(n)));
        out.push(Waiting {
            position,
            task_id: spec.id,
            workload,
            name,
            team: spec.team.clone(),
            priority: spec.priority,
            gpus: spec.gpus,
            gpu_milli: spec.gpu_milli,
            submitted_ms: submitted.get(&spec.id).copied(),
            reason: w.reason.to_string(),
            eta_ms: w.eta,
            predicted_ms: spec.predicted_duration,
            deadline_ms: spec.deadline,
            at_risk: w.at_risk,
        });
    }
    out
}

/// The rows as aligned columns, times relative to `now`.
pub fn table(rows: &[Waiting], now: Time) -> String {
    if rows.is_empty() {
        return "no task is waiting\n".to_owned();
    }
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header([
        "POS", "TASK", "TEAM", "PRIO", "GPUS", "WAITING", "ETA", "DEADLINE", "REASON",
    ]);
    for r in rows {
        let task = match (&r.workload, &r.name) {
            (Some(w), Some(n)) => format!("{w}/{n}"),
            _ => r.task_id.to_string(),
        };
        let gpus = if r.gpus == 1 && r.gpu_milli < 1000 {
            format!("{}m", r.gpu_milli)
        } else {
            r.gpus.to_string()
        };
        let eta = match r.eta_ms {
            Some(eta) if eta <= now => "now".to_owned(),
            Some(eta) => format!("in {}", span_ms(eta - now)),
            None => "unknown".to_owned(),
        };
        let deadline = match r.deadline_ms {
            None => "-".to_owned(),
            Some(d) => {
                let when = if d <= now {
                    format!("{} ago", span_ms(now - d))
                } else {
                    format!("in {}", span_ms(d - now))
                };
                if r.at_risk {
                    format!("{when} AT RISK")
                } else {
                    when
                }
            }
        };
        table.add_row([
            r.position.to_string(),
            task,
            r.team.clone(),
            r.priority.to_string(),
            gpus,
            r.submitted_ms
                .map_or_else(|| "-".to_owned(), |s| span_ms(now.saturating_sub(s))),
            eta,
            deadline,
            r.reason.clone(),
        ]);
    }
    format!("{table}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_sched::{NodeSpec, TaskSpec};

    fn scheduler() -> Scheduler {
        let mut s = Scheduler::new(allot_sched::policy::by_name("fifo").unwrap());
        s.apply(Input::NodeAdded(NodeSpec::new("n1", 8, "H100")))
            .unwrap();
        s
    }

    fn submit(s: &mut Scheduler, id: u64, team: &str, gpus: u32, predicted: u64, at: Time) {
        let mut t = TaskSpec::new(id, team, gpus);
        t.predicted_duration = Some(predicted);
        s.apply(Input::TaskSubmitted { task: t, at }).unwrap();
    }

    #[test]
    fn the_queue_shows_position_reason_and_an_eta_that_moves_with_the_queue() {
        let mut s = scheduler();
        submit(&mut s, 1, "vision", 8, 3_600_000, 0);
        s.apply(Input::Schedule { at: 0 }).unwrap();
        submit(&mut s, 2, "nlp", 8, 600_000, 1_000);
        submit(&mut s, 3, "vision", 4, 600_000, 2_000);
        s.apply(Input::Schedule { at: 2_000 }).unwrap();
        let names = BTreeMap::new();
        let submitted = BTreeMap::from([(TaskId(2), 1_000), (TaskId(3), 2_000)]);
        let rows = rows(&s, 60_000, &names, &submitted, None);
        let got: Vec<(usize, u64, Option<Time>)> = rows
            .iter()
            .map(|r| (r.position, r.task_id.0, r.eta_ms))
            .collect();
        // Task 2 starts when task 1's hour ends; task 3 (fifo: behind it) after task 2.
        assert_eq!(got[0], (1, 2, Some(3_600_000)));
        assert_eq!(got[1].0, 2);
        assert!(rows[0].reason.contains("GPU"), "{}", rows[0].reason);

        // Task 1 is predicted shorter: the ETA behind it moves up.
        s.apply(Input::TaskPredicted {
            task: TaskId(1),
            duration: 1_800_000,
            at: 60_000,
        })
        .unwrap();
        let rows2 = super::rows(&s, 60_000, &names, &submitted, None);
        assert_eq!(rows2[0].eta_ms, Some(1_800_000));

        // One team's view keeps the whole queue's positions.
        let vision = super::rows(&s, 60_000, &names, &submitted, Some("vision"));
        assert_eq!(vision.len(), 1);
        assert_eq!(vision[0].position, 2);
        let text = table(&rows2, 60_000);
        assert!(text.trim_start().starts_with("POS"), "{text}");
        assert!(text.contains("in 29m"), "{text}");
    }
}
