//! Billing's metrics, in the process's registry ([`allot_runtime::metrics`]):
//!
//! - `allot_cost_total{team,currency}`: the amount billed to the team, in currency units (the
//!   events' integer micro-units ÷ 10⁶, so a float), counted when a cost event is committed;
//!   `rate()` of it is the team's spending per second.
//! - `allot_budget_crossings_total{team,level}`: budget thresholds announced (`warning`,
//!   `exceeded`, `within`).
//!
//! Counters restart at zero with the process, as Prometheus expects; the events on COSTS stay
//! the record (`allot costs`).

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use allot_events::cost::{BudgetCrossed, BudgetLevel, CostAccrued};
use allot_runtime::metrics::register;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TeamCurrency {
    team: String,
    currency: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TeamLevel {
    team: String,
    level: &'static str,
}

static COST: LazyLock<Family<TeamCurrency, Counter<f64, AtomicU64>>> = LazyLock::new(|| {
    register(
        "cost",
        "Amount billed to a team, in currency units",
        Family::default(),
    )
});

static CROSSINGS: LazyLock<Family<TeamLevel, Counter>> = LazyLock::new(|| {
    register(
        "budget_crossings",
        "Budget thresholds a team crossed (warning, exceeded) or returned within",
        Family::default(),
    )
});

/// Counts the cost events and budget crossings of an entry, once committed.
pub(crate) fn billed<'a>(
    costs: impl IntoIterator<Item = &'a CostAccrued>,
    crossings: impl IntoIterator<Item = &'a BudgetCrossed>,
) {
    for c in costs {
        COST.get_or_create(&TeamCurrency {
            team: c.team.clone(),
            currency: c.currency.clone(),
        })
        .inc_by(c.amount as f64 / 1e6);
    }
    for b in crossings {
        CROSSINGS
            .get_or_create(&TeamLevel {
                team: b.team.clone(),
                level: match b.level {
                    BudgetLevel::Warning => "warning",
                    BudgetLevel::Exceeded => "exceeded",
                    BudgetLevel::Within => "within",
                },
            })
            .inc();
    }
}
