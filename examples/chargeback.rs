//! A team's chargeback subscriber, with the credentials `allot nats-config` gave the team:
//! totals per workload of the team's cost events, as they arrive, with budget warnings.
//!
//! ```sh
//! cargo run --example chargeback -- nats-config/team-vision.credentials.json          # whole history
//! cargo run --example chargeback -- nats-config/team-vision.credentials.json --live   # from now on
//! ```
//!
//! The whole history comes from the team's own stream (`COSTS_<team>`, in its own account)
//! through a durable consumer, so a restarted subscriber resumes where it stopped; `--live`
//! subscribes to `allot.cost.<team>.>` instead. Amounts are integer micro-units: they are
//! added as integers and only formatted for printing. An event delivered twice is counted once
//! (its CloudEvent id is stable).

use std::collections::{BTreeMap, HashSet};

use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures::StreamExt;

use allot_bus::accounts::Credentials;
use allot_events::{AnyEvent, CostEvent, decode};

/// Totals per workload, each event once.
#[derive(Default)]
struct Ledger {
    seen: HashSet<String>,
    totals: BTreeMap<String, i64>,
}

impl Ledger {
    /// Takes one message's payload; prints what it says.
    fn take(&mut self, payload: &[u8]) {
        let Ok(envelope) = decode(payload) else {
            eprintln!("skipped a message that is not an Allot event");
            return;
        };
        if !self.seen.insert(envelope.id.to_string()) {
            return;
        }
        match envelope.data {
            AnyEvent::Cost(CostEvent::Accrued(c)) => {
                let total = self.totals.entry(c.workload.clone()).or_default();
                *total += c.amount;
                println!(
                    "{:<32} {:<16} {} {:>12} (total {} {})",
                    c.workload,
                    c.task_name,
                    if c.last { "final " } else { "period" },
                    money(c.amount),
                    money(*total),
                    c.currency
                );
            }
            AnyEvent::Cost(CostEvent::BudgetCrossed(b)) => println!(
                "BUDGET {:?} for {} in {}: {} of {} {}",
                b.level,
                b.team,
                b.period,
                money(b.spent),
                money(b.budget),
                b.currency
            ),
            _ => {}
        }
    }
}

/// Micro-units as a decimal amount, without floating point.
fn money(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let m = micros.unsigned_abs();
    format!("{sign}{}.{:06}", m / 1_000_000, m % 1_000_000)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: chargeback TEAM-CREDENTIALS.json [--live]");
        std::process::exit(2);
    };
    let live = args.any(|a| a == "--live");
    let credentials: Credentials = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let client = credentials
        .connect_options()
        .name("chargeback")
        .connect(credentials.url.as_str())
        .await?;
    let mut ledger = Ledger::default();
    if live {
        let subjects = credentials
            .live_subjects
            .clone()
            .ok_or("these are not a team's credentials (no live subjects)")?;
        let mut subscription = client.subscribe(subjects).await?;
        while let Some(message) = subscription.next().await {
            ledger.take(&message.payload);
        }
        return Ok(());
    }
    let stream = credentials
        .stream
        .clone()
        .ok_or("these are not a team's credentials (no stream)")?;
    let consumer = jetstream::new(client)
        .get_stream(&stream)
        .await?
        .get_or_create_consumer(
            "chargeback",
            pull::Config {
                durable_name: Some("chargeback".into()),
                ..Default::default()
            },
        )
        .await?;
    let mut messages = consumer.messages().await?;
    while let Some(message) = messages.next().await {
        let message = message?;
        ledger.take(&message.payload);
        message
            .ack_with(AckKind::Ack)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
