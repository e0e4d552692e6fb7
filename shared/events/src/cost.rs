//! What each team's work cost: billing's events, on `allot.cost.<team>.<workload>` (one subject
//! per workload, so a team reads all of its own with `allot.cost.<team>.>` and nothing else).
//!
//! Money is integer **micro-units** of the price table's currency (1 EUR = 1,000,000), never
//! floating point. A lease is billed in periods aligned to the billing interval; each
//! period's amount is the difference of the lease's cumulative cost, rounded down, at the
//! period's two ends, so the periods of a lease always add up exactly to its whole cost.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use allot_sched::{LeaseId, TaskId};

use crate::envelope::EventKind;
use crate::subject;

domain_events! {
    /// Costs.
    pub enum CostEvent in "cost" {
        /// One lease's cost over one period (or up to its end).
        Accrued(CostAccrued) = "accrued",
        /// A team's spending crossed a budget threshold.
        BudgetCrossed(BudgetCrossed) = "budget_crossed",
    }
}

/// The token under a team's cost subjects that carries its budget events
/// (`allot.cost.<team>._budget`): no workload id can take it (ids end in a hash).
pub const BUDGET_TOKEN: &str = "_budget";

impl EventKind for CostEvent {
    fn event_type(&self) -> String {
        CostEvent::event_type(self)
    }
    fn nats_subject(&self) -> String {
        match self {
            Self::Accrued(e) => subject::cost(&e.team, &e.workload),
            Self::BudgetCrossed(e) => subject::cost(&e.team, BUDGET_TOKEN),
        }
    }
    /// The workload (or the team, for budget events).
    fn entity(&self) -> String {
        match self {
            Self::Accrued(e) => e.workload.clone(),
            Self::BudgetCrossed(e) => e.team.clone(),
        }
    }
    fn team(&self) -> Option<&str> {
        match self {
            Self::Accrued(e) => Some(&e.team),
            Self::BudgetCrossed(e) => Some(&e.team),
        }
    }
}

/// What one resource of a lease cost over a period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CostLine {
    /// `gpu:H100`, `mig:1g.10gb`, `cpu`, `memory`.
    pub resource: String,
    /// How much of it the lease held: milli-GPU, MIG instances × 1000, CPU millicores, or MiB.
    pub quantity: u64,
    /// The unit `quantity` counts (`milli-GPU`, `milli-instance`, `millicore`, `MiB`).
    pub unit: String,
    /// Price per hour of one whole unit (a GPU, an instance, a core, a GiB), micro-units; 0 when
    /// the price table has none for it (then `unpriced` is set).
    pub unit_price: i64,
    /// The amount for the period, micro-units.
    pub amount: i64,
    /// The price table had no price for this resource.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unpriced: bool,
}

/// One lease's cost over one period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CostAccrued {
    /// The team charged.
    pub team: String,
    /// The workload.
    pub workload: String,
    /// The task's name in it.
    pub task_name: String,
    /// The task (its attempt).
    pub task: TaskId,
    /// The pool.
    pub pool: String,
    /// The lease.
    pub lease: LeaseId,
    /// Period start, ms since the epoch (the grant, or a period boundary).
    pub from_ms: u64,
    /// Period end, ms since the epoch (a period boundary, or the lease's end).
    pub to_ms: u64,
    /// The lease ended with this period (released, preempted).
    pub last: bool,
    /// Currency of every amount (ISO 4217).
    pub currency: String,
    /// Per resource.
    pub lines: Vec<CostLine>,
    /// The sum of the lines, micro-units.
    pub amount: i64,
    /// On a lease's last period, when it held GPUs: how much of its GPU time telemetry showed
    /// unused, reported beside the amount (not deducted from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleCost>,
}

/// The idle share of a lease's GPU cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdleCost {
    /// GPU samples taken while the lease held the GPU (one per GPU per telemetry sample).
    pub samples: u64,
    /// Of those, samples at 0% utilization.
    pub idle_samples: u64,
    /// The lease's whole GPU cost, micro-units.
    pub gpu_amount: i64,
    /// `gpu_amount × idle_samples ÷ samples`, rounded down; 0 without samples.
    pub amount: i64,
}

/// Which threshold a team's spending crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetLevel {
    /// 80% of the budget spent.
    Warning,
    /// All of it.
    Exceeded,
    /// Within budget again: a new period began after one that ended over budget.
    Within,
}

/// A team's spending in a budget period crossed a threshold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetCrossed {
    /// The team.
    pub team: String,
    /// The budget period (`2026-11`).
    pub period: String,
    /// Which threshold.
    pub level: BudgetLevel,
    /// Spent so far in the period, micro-units.
    pub spent: i64,
    /// The budget, micro-units.
    pub budget: i64,
    /// Currency.
    pub currency: String,
    /// What the allocator does while the team is over budget: start nothing below this
    /// priority (`None`: allow and flag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_below: Option<i32>,
}
