//! Budgets: each team's spending per period against its limit (money or GPU-hours, from the
//! teams file), and the thresholds it crosses — 80% (warning) and 100% (exceeded) — announced
//! once per period; `within` is announced when a team that ended a period over budget starts
//! a new one.

use std::collections::BTreeMap;

use chrono::DateTime;

use allot_events::cost::{BudgetLevel, CostAccrued};
use allot_workload::TeamsConfig;
use allot_workload::teams::BudgetPeriod;

use crate::prices::parse_money;

/// Milli-GPU × ms in a GPU-hour.
const GPU_HOUR: i128 = 1000 * 3_600_000;

/// What a budget limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Money per period, micro-units.
    Money(i64),
    /// GPU use per period, milli-GPU × ms.
    GpuUse(i128),
}

/// One team's budget, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The period it renews on.
    pub period: BudgetPeriod,
    /// The limit.
    pub limit: Limit,
    /// The priority floor while exceeded (`None`: allow and flag).
    pub block_below: Option<i32>,
}

/// Every team's budget.
pub type Budgets = BTreeMap<String, Budget>;

/// The budgets of a (checked) teams file.
pub fn from_teams(teams: &TeamsConfig) -> Budgets {
    teams
        .teams
        .iter()
        .filter_map(|t| {
            let b = t.budget.as_ref()?;
            let limit = match (&b.amount, b.gpu_hours) {
                (Some(a), _) => Limit::Money(parse_money(a).ok()?),
                (None, Some(h)) => Limit::GpuUse(i128::from(h) * GPU_HOUR),
                (None, None) => return None,
            };
            let block_below = b
                .block_below
                .as_deref()
                .and_then(|c| teams.priority(Some(c)));
            Some((
                t.name.clone(),
                Budget {
                    period: b.period,
                    limit,
                    block_below,
                },
            ))
        })
        .collect()
}

/// The period `t_ms` falls in: `2026-11` or `2026-11-22`.
pub fn period_of(period: BudgetPeriod, t_ms: u64) -> String {
    let t = DateTime::from_timestamp_millis(t_ms as i64).unwrap_or_default();
    match period {
        BudgetPeriod::Month => t.format("%Y-%m").to_string(),
        BudgetPeriod::Day => t.format("%Y-%m-%d").to_string(),
    }
}

/// A team's spending in one period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spend {
    /// Money, micro-units.
    pub micros: i64,
    /// GPU use, milli-GPU × ms.
    pub gpu_use: i128,
    /// The highest threshold announced: 0 none, 1 warning, 2 exceeded.
    pub level: u8,
}

impl Spend {
    /// Adds one cost event.
    pub fn add(&mut self, e: &CostAccrued) {
        self.micros += e.amount;
        let ms = i128::from(e.to_ms - e.from_ms);
        self.gpu_use += e
            .lines
            .iter()
            .filter(|l| l.resource.starts_with("gpu:"))
            .map(|l| i128::from(l.quantity) * ms)
            .sum::<i128>();
    }

    /// The thresholds reached under `limit` and not yet announced, in order; records them.
    pub fn crossed(&mut self, limit: Limit) -> Vec<BudgetLevel> {
        let (spent, cap) = match limit {
            Limit::Money(cap) => (i128::from(self.micros), i128::from(cap)),
            Limit::GpuUse(cap) => (self.gpu_use, cap),
        };
        let reached = if spent >= cap {
            2
        } else if spent * 10 >= cap * 8 {
            1
        } else {
            0
        };
        let mut out = Vec::new();
        for level in self.level + 1..=reached {
            out.push(if level == 1 {
                BudgetLevel::Warning
            } else {
                BudgetLevel::Exceeded
            });
        }
        self.level = self.level.max(reached);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_events::cost::CostLine;
    use allot_sched::{LeaseId, TaskId};

    fn cost(amount: i64, gpu_milli: u64, ms: u64) -> CostAccrued {
        CostAccrued {
            team: "vision".into(),
            workload: "w".into(),
            task_name: "t".into(),
            task: TaskId(1),
            pool: "p".into(),
            lease: LeaseId(1),
            from_ms: 0,
            to_ms: ms,
            last: false,
            currency: "EUR".into(),
            lines: vec![CostLine {
                resource: "gpu:H100".into(),
                quantity: gpu_milli,
                unit: "milli-GPU".into(),
                unit_price: 0,
                amount,
                unpriced: false,
            }],
            amount,
            idle: None,
        }
    }

    #[test]
    fn thresholds_are_announced_once_each_in_order_when_reached() {
        struct Case {
            name: &'static str,
            limit: Limit,
            costs: Vec<CostAccrued>,
            want: Vec<Vec<BudgetLevel>>,
        }
        use BudgetLevel::{Exceeded, Warning};
        let cases = [
            Case {
                name: "money: 79% nothing, 80% warning, 100% exceeded, then nothing more",
                limit: Limit::Money(100),
                costs: vec![cost(79, 0, 1), cost(1, 0, 1), cost(20, 0, 1), cost(5, 0, 1)],
                want: vec![vec![], vec![Warning], vec![Exceeded], vec![]],
            },
            Case {
                name: "a jump past both thresholds announces both",
                limit: Limit::Money(100),
                costs: vec![cost(150, 0, 1)],
                want: vec![vec![Warning, Exceeded]],
            },
            Case {
                name: "GPU-hours: a whole GPU for 48 of 60 minutes is 80% of one GPU-hour",
                limit: Limit::GpuUse(GPU_HOUR),
                costs: vec![cost(0, 1000, 48 * 60_000), cost(0, 500, 24 * 60_000)],
                want: vec![vec![Warning], vec![Exceeded]],
            },
        ];
        for case in cases {
            let mut spend = Spend::default();
            let got: Vec<Vec<BudgetLevel>> = case
                .costs
                .iter()
                .map(|c| {
                    spend.add(c);
                    spend.crossed(case.limit)
                })
                .collect();
            assert_eq!(got, case.want, "{}", case.name);
        }
    }

    #[test]
    fn periods_are_calendar_months_or_days_in_utc() {
        // 2026-11-30T23:59:59.999Z and the next millisecond.
        let t = 1_796_083_199_999;
        assert_eq!(period_of(BudgetPeriod::Month, t), "2026-11");
        assert_eq!(period_of(BudgetPeriod::Month, t + 1), "2026-12");
        assert_eq!(period_of(BudgetPeriod::Day, t), "2026-11-30");
    }

    #[test]
    fn budgets_come_from_the_teams_file_with_their_class_resolved() {
        let teams = TeamsConfig::from_yaml(
            "teams:\n  - {name: vision, budget: {amount: \"12.50\", blockBelow: standard}}\n  - {name: nlp, budget: {gpuHours: 2, period: day}}\n  - {name: ops}\n",
        )
        .unwrap();
        let b = from_teams(&teams);
        assert_eq!(b.len(), 2);
        assert_eq!(b["vision"].limit, Limit::Money(12_500_000));
        assert_eq!(b["vision"].block_below, Some(100));
        assert_eq!(b["nlp"].limit, Limit::GpuUse(2 * GPU_HOUR));
        assert_eq!(
            (b["nlp"].period, b["nlp"].block_below),
            (BudgetPeriod::Day, None)
        );
    }
}
