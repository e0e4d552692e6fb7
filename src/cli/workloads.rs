//! `allot workloads` and `allot workload ID`: the workloads the planner knows, listed newest
//! first or one with its tasks, asked of the `allot-planner` micro-service
//! ([`allot_events::query::planner`]).
//!
//! A team's user (a URL with `team-<team>`'s credentials) asks on its team's subjects, and so
//! does anyone passing `--team`; the server lets a team ask about its own workloads only.
//!
//! | exit | meaning |
//! |---|---|
//! | 0 | answered |
//! | 1 | no such workload (or not the team's), or the planner could not be asked |
//! | 2 | bad flags |

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use clap::{Args, ValueEnum};
use comfy_table::{Table, presets::NOTHING};
use serde::Serialize;
use serde::de::DeserializeOwned;

use allot_events::query::planner::{
    self as contract, MAX_LIMIT, TaskDetail, WorkloadDetail, WorkloadList, WorkloadQuery,
    WorkloadState, WorkloadSummary, WorkloadsQuery,
};

use super::local;
use super::settings::Lookup;

/// How answers are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned tables, times relative to now.
    Table,
    /// The planner's answer as JSON (RFC 3339 times to the millisecond).
    Json,
}

/// Flags of `allot workloads`.
#[derive(Debug, Args)]
pub struct WorkloadsArgs {
    /// Only this team's (a team's user sees its own team's only).
    #[arg(long, value_parser = team)]
    pub team: Option<String>,
    /// Only workloads in this state: running, succeeded, failed or aborted.
    #[arg(long, value_parser = state)]
    pub state: Option<WorkloadState>,
    /// Only workloads submitted since: a duration ago (`2h`, `30m`, `7d`) or an RFC 3339 time.
    #[arg(long, value_parser = since)]
    pub since: Option<DateTime<Utc>>,
    /// At most this many (1 to 1000; default 50), newest first.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LIMIT)))]
    pub limit: Option<u32>,
    /// Continue a listing where the previous one stopped (it prints the cursor).
    #[arg(long)]
    pub cursor: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub output: Output,
    /// NATS URL (ALLOT_NATS_URL; default: ./.allot/nats.url, then nats://127.0.0.1:4222).
    #[arg(long)]
    pub nats: Option<String>,
    /// Folder where `allot up` keeps its state (ALLOT_DATA_DIR).
    #[arg(long)]
    pub data_dir: Option<String>,
}

/// Flags of `allot workload ID`.
#[derive(Debug, Args)]
pub struct WorkloadArgs {
    /// The workload's id (as `allot submit` and `allot workloads` print it).
    pub id: String,
    /// Ask as this team (a team's user asks as its own team).
    #[arg(long, value_parser = team)]
    pub team: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub output: Output,
    /// NATS URL (ALLOT_NATS_URL; default: ./.allot/nats.url, then nats://127.0.0.1:4222).
    #[arg(long)]
    pub nats: Option<String>,
    /// Folder where `allot up` keeps its state (ALLOT_DATA_DIR).
    #[arg(long)]
    pub data_dir: Option<String>,
}

fn team(text: &str) -> Result<String, String> {
    allot_events::subject::validate_token("team", text).map_err(|e| e.to_string())?;
    Ok(text.to_owned())
}

fn state(text: &str) -> Result<WorkloadState, String> {
    WorkloadState::parse(text).ok_or_else(|| {
        format!("{text:?} is not a state: use running, succeeded, failed or aborted")
    })
}

/// `2h` ago (humantime), or an RFC 3339 time.
fn since(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    humantime::parse_duration(text)
        .ok()
        .and_then(|d| chrono::Duration::from_std(d).ok())
        .and_then(|d| Utc::now().checked_sub_signed(d))
        .ok_or_else(|| {
            format!("{text:?} is neither a duration ago (2h, 30m, 7d) nor an RFC 3339 time")
        })
}

/// Connects to ask about `team`'s workloads (`what`, for messages): the connection and the team
/// to ask as (`--team`, else a team user's own), or the exit code of a refusal — a team's user
/// naming another team, which the server would leave unanswered, as if the planner were down.
async fn connect(
    nats: Option<&str>,
    data_dir: Option<&str>,
    team: Option<&str>,
    what: &str,
    env: Lookup<'_>,
) -> anyhow::Result<Result<(async_nats::Client, Option<String>), ExitCode>> {
    let connection = local::connect_client(
        "allot-workloads",
        nats,
        data_dir,
        env,
        "nothing was looked up",
    )
    .await?;
    if let Some(why) = team.and_then(|t| connection.refuses_team(t, what)) {
        eprintln!("allot: {why}");
        return Ok(Err(ExitCode::from(2)));
    }
    let scope = team.map(str::to_owned).or(connection.team);
    Ok(Ok((connection.client, scope)))
}

/// Lists workloads.
pub async fn workloads(args: WorkloadsArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let what = "the listing";
    let (client, scope) = match connect(
        args.nats.as_deref(),
        args.data_dir.as_deref(),
        args.team.as_deref(),
        what,
        env,
    )
    .await?
    {
        Ok(connected) => connected,
        Err(refused) => return Ok(refused),
    };
    let query = WorkloadsQuery {
        team: args.team.clone(),
        state: args.state,
        since: args.since,
        limit: args.limit,
        cursor: args.cursor.clone(),
    };
    let list: WorkloadList = match ask(
        &client,
        &contract::workloads_subject(scope.as_deref()),
        &query,
    )
    .await?
    {
        Ok(list) => list,
        Err(refused) => bail!("the planner refused the listing: {refused}"),
    };
    let mut out = std::io::stdout().lock();
    match args.output {
        Output::Json => {
            // Written as text, so a closed pipe reads as one (`| head` is not an error).
            writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
        }
        Output::Table => {
            write!(out, "{}", render_list(&list))?;
            if let Some(cursor) = &list.next_cursor {
                writeln!(out, "\nmore: add --cursor {cursor} to see the next ones")?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Shows one workload.
pub async fn workload(args: WorkloadArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let what = format!("showing {}", args.id);
    let (client, scope) = match connect(
        args.nats.as_deref(),
        args.data_dir.as_deref(),
        args.team.as_deref(),
        &what,
        env,
    )
    .await?
    {
        Ok(connected) => connected,
        Err(refused) => return Ok(refused),
    };
    let query = WorkloadQuery {
        id: args.id.clone(),
    };
    let detail: WorkloadDetail = match ask(
        &client,
        &contract::workload_subject(scope.as_deref()),
        &query,
    )
    .await?
    {
        Ok(detail) => detail,
        Err(Refused { code, .. }) if code == contract::NOT_FOUND => {
            let whose = scope.map(|t| format!(" of team {t}")).unwrap_or_default();
            eprintln!(
                "allot: no workload {}{whose} is known to the planner",
                args.id
            );
            return Ok(ExitCode::FAILURE);
        }
        Err(refused) => bail!("the planner refused to show {}: {refused}", args.id),
    };
    let mut out = std::io::stdout().lock();
    match args.output {
        Output::Json => {
            writeln!(out, "{}", serde_json::to_string_pretty(&detail)?)?;
        }
        Output::Table => write!(out, "{}", render_detail(&detail))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// A micro-service error answer.
#[derive(Debug)]
pub(super) struct Refused {
    pub(super) code: usize,
    message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

/// Asks the planner on `subject`: the answer, or its refusal; an error when nobody answers.
pub(super) async fn ask<T: DeserializeOwned>(
    client: &async_nats::Client,
    subject: &str,
    query: &impl Serialize,
) -> anyhow::Result<Result<T, Refused>> {
    let body = serde_json::to_vec(query).expect("a query serializes");
    let reply = tokio::time::timeout(
        Duration::from_secs(5),
        client.request(subject.to_owned(), body.into()),
    )
    .await
    .with_context(|| {
        format!(
            "the planner did not answer on {subject} within 5 s; is it running (`allot up`), \
                 and may this user ask there (a team's user asks about its own team only)?"
        )
    })?;
    let reply = match reply {
        Ok(reply) => reply,
        Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
            bail!(
                "the planner is not answering (no responders on {subject}); is it running? \
                     (`allot up` runs it)"
            )
        }
        Err(e) => return Err(e).context(format!("asking the planner on {subject}")),
    };
    if let Some(headers) = &reply.headers
        && let Some(error) = headers.get("Nats-Service-Error")
    {
        let code = headers
            .get("Nats-Service-Error-Code")
            .and_then(|c| c.as_str().parse().ok())
            .unwrap_or(500);
        return Ok(Err(Refused {
            code,
            message: error.to_string(),
        }));
    }
    serde_json::from_slice(&reply.payload)
        .map(Ok)
        .context("decoding the planner's answer")
}

/// The listing as a table.
pub fn render_list(list: &WorkloadList) -> String {
    if list.workloads.is_empty() {
        return "no workloads\n".into();
    }
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header([
        "ID",
        "TEAM",
        "STATE",
        "TASKS",
        "SUBMITTED",
        "SUBMITTER",
        "RUN",
        "REASON",
    ]);
    for w in &list.workloads {
        table.add_row([
            w.id.clone(),
            w.team.clone(),
            w.state.as_str().to_owned(),
            tasks(w),
            w.submitted_at
                .map(|t| ago(list.at, t))
                .unwrap_or_else(|| "-".into()),
            w.submitter.clone(),
            w.run_id.clone().unwrap_or_else(|| "-".into()),
            w.reason.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    format!("{table}\n")
}

/// `2/4 succeeded, 1 running`.
fn tasks(w: &WorkloadSummary) -> String {
    let mut text = format!("{}/{} succeeded", w.tasks.succeeded, w.tasks.total);
    if w.tasks.running > 0 {
        text.push_str(&format!(", {} running", w.tasks.running));
    }
    text
}

/// One workload and its tasks as a table.
pub fn render_detail(d: &WorkloadDetail) -> String {
    let w = &d.workload;
    let submitted = match w.submitted_at {
        Some(t) => format!(
            "{} ({})",
            t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            ago(d.at, t)
        ),
        None => "-".into(),
    };
    let mut head = Table::new();
    head.load_preset(NOTHING);
    for (key, value) in [
        ("workload", w.id.clone()),
        ("team", w.team.clone()),
        ("state", w.state.as_str().to_owned()),
        ("tasks", tasks(w)),
        ("submitted", submitted),
        ("submitter", w.submitter.clone()),
        ("run", w.run_id.clone().unwrap_or_else(|| "-".into())),
        ("reason", w.reason.clone().unwrap_or_else(|| "-".into())),
    ] {
        head.add_row([key.to_owned(), value]);
    }
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header([
        "TASK", "STATE", "ATTEMPT", "NODE", "GPUS", "STARTED", "TOOK", "REASON",
    ]);
    for t in &d.tasks {
        table.add_row([
            t.name.clone(),
            t.state.clone(),
            format!("{}/{}", t.attempt, t.max_attempts),
            nodes(t),
            gpus(t),
            t.started_at
                .map(|s| ago(d.at, s))
                .unwrap_or_else(|| "-".into()),
            match (t.started_at, t.ended_at) {
                (Some(s), Some(e)) => span(e - s),
                (Some(s), None) => format!("{} so far", span(d.at - s)),
                _ => "-".into(),
            },
            t.reason.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    format!("{head}\n\n{table}\n")
}

fn nodes(t: &TaskDetail) -> String {
    if t.nodes.is_empty() {
        return "-".into();
    }
    t.nodes
        .iter()
        .map(|n| n.node.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// `0,1` on one node, `n1:0,1 n2:0,1` on several; a share of a GPU as `0(250m)`.
fn gpus(t: &TaskDetail) -> String {
    let of = |n: &allot_events::query::planner::TaskNode| {
        n.gpus
            .iter()
            .map(|g| {
                if g.milli >= 1000 {
                    g.index.to_string()
                } else {
                    format!("{}({}m)", g.index, g.milli)
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    match t.nodes.as_slice() {
        [] => "-".into(),
        [n] if n.gpus.is_empty() => "-".into(),
        [n] => of(n),
        many => many
            .iter()
            .map(|n| format!("{}:{}", n.node, of(n)))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// `12s ago`, `3m ago`, `2h ago`, `4d ago`.
fn ago(now: DateTime<Utc>, t: DateTime<Utc>) -> String {
    format!("{} ago", span(now - t))
}

/// `850ms`, `12s`, `3m05s`, `2h10m`, `4d3h`: how every client command shows a span of time.
pub(super) fn span(d: chrono::TimeDelta) -> String {
    span_ms(d.num_milliseconds().max(0) as u64)
}

/// [`span`] of `ms` milliseconds.
pub(super) fn span_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_at_a_glance() {
        let cases = [
            (850, "850ms"),
            (12_000, "12s"),
            (185_000, "3m05s"),
            (7_800_000, "2h10m"),
            (356_400_000, "4d3h"),
            (-5, "0ms"),
        ];
        for (ms, want) in cases {
            assert_eq!(span(chrono::TimeDelta::milliseconds(ms)), want);
        }
    }

    #[test]
    fn since_takes_a_duration_ago_or_a_time_and_nothing_else() {
        let an_hour_ago = since("1h").unwrap();
        let off = (Utc::now() - chrono::Duration::hours(1) - an_hour_ago).num_seconds();
        assert!(off.abs() <= 1, "{an_hour_ago}");
        assert_eq!(
            since("2026-01-02T03:04:05Z").unwrap().to_rfc3339(),
            "2026-01-02T03:04:05+00:00"
        );
        assert!(since("yesterday").is_err());
    }
}
