//! `allot costs`: the chargeback report, from the COSTS stream.
//!
//! Every `CostAccrued` event is counted once (by its event id, so even a copy stored twice is
//! not), filtered by team and by period, and its amount — or, grouped by GPU model, each of its
//! lines — added in integer micro-units: the totals are exactly the sum of the events.
//! `--by project` reads each workload's project from its submission in WORKLOADS.

use std::collections::{BTreeMap, HashSet};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use async_nats::jetstream::{self, consumer::DeliverPolicy};
use chrono::{DateTime, NaiveDate, Utc};
use clap::{Args, ValueEnum};
use comfy_table::{Table, presets::NOTHING};
use futures::StreamExt;

use allot_billing::prices::format_money;
use allot_bus::streams::names;
use allot_events::cost::CostAccrued;
use allot_events::{AnyEvent, CostEvent, WorkloadEvent, decode, subject};

use super::local;
use super::settings::Lookup;

/// How rows are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum By {
    /// One row per team.
    Team,
    /// One row per workload (team/workload).
    Workload,
    /// One row per project (from the workloads' specs; `(none)` without one).
    Project,
    /// One row per resource: each GPU model, MIG profile, CPU, memory.
    GpuModel,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// An aligned table with a total.
    Table,
    /// `key,amount,currency` with a header.
    Csv,
    /// One JSON document: rows, total, currency, events counted.
    Json,
}

/// Flags of `allot costs`.
#[derive(Debug, Args)]
pub struct CostsArgs {
    /// Only this team.
    #[arg(long)]
    pub team: Option<String>,
    /// Periods ending at or after this date or time (`2026-11-01`, RFC 3339).
    #[arg(long)]
    pub from: Option<String>,
    /// Periods ending before this date or time.
    #[arg(long)]
    pub to: Option<String>,
    /// Rows per …
    #[arg(long, value_enum, default_value = "workload")]
    pub by: By,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// NATS URL (ALLOT_NATS_URL; default: ./.allot/nats.url, then nats://127.0.0.1:4222).
    #[arg(long)]
    pub nats: Option<String>,
    /// Folder where `allot up` keeps its state (ALLOT_DATA_DIR).
    #[arg(long)]
    pub data_dir: Option<String>,
}

/// A date (midnight UTC) or an RFC 3339 time, as ms since the epoch.
fn instant(flag: &str, text: &str) -> anyhow::Result<u64> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc).timestamp_millis().max(0) as u64);
    }
    let day = NaiveDate::parse_from_str(text, "%Y-%m-%d").with_context(|| {
        format!("{flag}: {text:?} is neither a date (2026-11-01) nor an RFC 3339 time")
    })?;
    Ok(day
        .and_hms_opt(0, 0, 0)
        .expect("midnight exists")
        .and_utc()
        .timestamp_millis()
        .max(0) as u64)
}

/// Every message on `filter` in `stream`, as stored.
pub(super) async fn read(
    js: &jetstream::Context,
    stream: &str,
    filter: &str,
) -> anyhow::Result<Vec<jetstream::Message>> {
    let stream = js
        .get_stream(stream)
        .await
        .with_context(|| format!("stream {stream}"))?;
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: filter.into(),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let mut out = Vec::new();
    // What is stored arrives at once; `pending` says when the last of it has.
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(2), messages.next()).await {
        let m = m?;
        let done = m.info().map(|i| i.pending == 0).unwrap_or(true);
        out.push(m);
        if done {
            break;
        }
    }
    Ok(out)
}

/// `allot costs`.
pub async fn costs(args: CostsArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let from = args
        .from
        .as_deref()
        .map(|t| instant("--from", t))
        .transpose()?;
    let to = args.to.as_deref().map(|t| instant("--to", t)).transpose()?;
    if let Some(team) = &args.team {
        subject::validate_token("team", team)?;
    }
    let connection = local::connect_client(
        "allot-costs",
        args.nats.as_deref(),
        args.data_dir.as_deref(),
        env,
        "no report was made",
    )
    .await?;
    // A team's login reads its team's own stream, `COSTS_<team>` in its account: PLATFORM's
    // COSTS does not exist there (shared/bus/src/accounts.rs).
    let (stream, team) = match &connection.team {
        Some(mine) => {
            let asked = args.team.as_deref().unwrap_or(mine);
            if let Some(why) = connection.refuses_team(asked, "the report") {
                eprintln!("allot: {why}; no report was made");
                return Ok(ExitCode::from(2));
            }
            if args.by == By::Project {
                eprintln!(
                    "allot: --by project reads the workloads' specs, which a team's login (from \
                     {}) may not read; use --by workload, or the platform's login; no report \
                     was made",
                    connection.origin
                );
                return Ok(ExitCode::from(2));
            }
            (allot_bus::accounts::team_stream(mine), Some(mine.clone()))
        }
        None => (names::COSTS.to_owned(), args.team.clone()),
    };
    let team_login = connection.team.is_some();
    let client = connection.client;
    let js = jetstream::new(client.clone());
    let filter = match &team {
        Some(team) => subject::cost_of_team(team),
        None => subject::COST_ALL.to_owned(),
    };
    let mut seen = HashSet::new();
    let mut events: Vec<CostAccrued> = Vec::new();
    let stored = read(&js, &stream, &filter)
        .await
        .with_context(|| match &team {
            Some(mine) if team_login => format!(
                "a team's login reads its costs from its own stream {stream}, which the accounts \
             of `allot nats-config` provide; `allot up`'s team logins may submit, follow and \
             abort only — ask an admin for `allot costs --team {mine}`; no report was made"
            ),
            _ => "no report was made".to_owned(),
        })?;
    for m in stored {
        let Ok(envelope) = decode(&m.payload) else {
            continue;
        };
        if let AnyEvent::Cost(CostEvent::Accrued(c)) = envelope.data
            && seen.insert(envelope.id)
            && from.is_none_or(|f| c.to_ms >= f)
            && to.is_none_or(|t| c.to_ms < t)
        {
            events.push(c);
        }
    }
    let projects: BTreeMap<String, String> = if args.by == By::Project {
        read(&js, names::WORKLOADS, "allot.workload.submitted.>")
            .await?
            .into_iter()
            .filter_map(|m| match decode(&m.payload).ok()?.data {
                AnyEvent::Workload(WorkloadEvent::Submitted(s)) => {
                    Some((s.workload_id, s.spec.metadata.project?))
                }
                _ => None,
            })
            .collect()
    } else {
        BTreeMap::new()
    };
    client.drain().await.ok();

    let currencies: HashSet<&str> = events.iter().map(|e| e.currency.as_str()).collect();
    if currencies.len() > 1 {
        bail!(
            "the cost events are in several currencies ({currencies:?}): report one period at a time"
        );
    }
    let currency = currencies.into_iter().next().unwrap_or("").to_owned();
    let mut rows: BTreeMap<String, i64> = BTreeMap::new();
    for e in &events {
        match args.by {
            By::GpuModel => {
                for line in &e.lines {
                    *rows.entry(line.resource.clone()).or_default() += line.amount;
                }
            }
            by => {
                let key = match by {
                    By::Team => e.team.clone(),
                    By::Workload => format!("{}/{}", e.team, e.workload),
                    _ => projects
                        .get(&e.workload)
                        .cloned()
                        .unwrap_or_else(|| "(none)".into()),
                };
                *rows.entry(key).or_default() += e.amount;
            }
        }
    }
    let total: i64 = events.iter().map(|e| e.amount).sum();
    print!(
        "{}",
        render(args.format, args.by, &rows, total, &currency, events.len())
    );
    Ok(ExitCode::SUCCESS)
}

fn render(
    format: Format,
    by: By,
    rows: &BTreeMap<String, i64>,
    total: i64,
    currency: &str,
    events: usize,
) -> String {
    let by_name = by
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default();
    match format {
        Format::Table => {
            let mut table = Table::new();
            table
                .load_preset(NOTHING)
                .set_header([by_name.to_uppercase(), format!("AMOUNT ({currency})")]);
            for (key, amount) in rows {
                table.add_row([key.clone(), format_money(*amount)]);
            }
            table.add_row(["TOTAL".to_owned(), format_money(total)]);
            format!("{table}\n{events} cost events\n")
        }
        Format::Csv => {
            let mut out = format!("{by_name},amount,currency\n");
            for (key, amount) in rows {
                out += &format!("{key},{},{currency}\n", format_money(*amount));
            }
            out
        }
        Format::Json => {
            let rows: Vec<serde_json::Value> = rows
                .iter()
                .map(|(k, a)| serde_json::json!({"key": k, "amount": format_money(*a), "amount_micros": a}))
                .collect();
            let doc = serde_json::json!({
                "by": by_name,
                "currency": currency,
                "rows": rows,
                "total": format_money(total),
                "total_micros": total,
                "events": events,
            });
            format!("{doc:#}\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_times_bound_the_report_and_bad_ones_are_named() {
        assert_eq!(instant("--from", "1970-01-02").unwrap(), 86_400_000);
        assert_eq!(instant("--to", "1970-01-01T00:00:01Z").unwrap(), 1_000);
        let err = instant("--from", "yesterday").unwrap_err().to_string();
        assert!(err.starts_with("--from: \"yesterday\""), "{err}");
    }

    #[test]
    fn every_format_shows_exact_decimal_amounts() {
        let rows = BTreeMap::from([
            ("nlp/a".to_owned(), 312_500),
            ("vision/b".to_owned(), 2_937_500),
        ]);
        let table = render(Format::Table, By::Workload, &rows, 3_250_000, "EUR", 3);
        assert!(
            table.contains("vision/b") && table.contains("2.9375"),
            "{table}"
        );
        assert!(table.contains("TOTAL") && table.contains("3.25"), "{table}");
        let csv = render(Format::Csv, By::Workload, &rows, 3_250_000, "EUR", 3);
        assert_eq!(
            csv,
            "workload,amount,currency\nnlp/a,0.3125,EUR\nvision/b,2.9375,EUR\n"
        );
        let json: serde_json::Value = serde_json::from_str(&render(
            Format::Json,
            By::GpuModel,
            &rows,
            3_250_000,
            "EUR",
            3,
        ))
        .unwrap();
        assert_eq!(json["total_micros"], 3_250_000);
        assert_eq!(json["by"], "gpu-model");
        assert_eq!(json["rows"][0]["amount_micros"], 312_500);
    }
}
