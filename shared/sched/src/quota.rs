//! Team quotas in one cohort (Kueue's ClusterQueues sharing a cohort): each team has a nominal
//! quota and may borrow what others leave unused, up to an optional borrowing limit. Usage
//! is kept current by the scheduler on every grant, release and preemption, and counts what
//! tasks request (as Kueue does) — not the whole nodes a large task may occupy.

use std::collections::HashMap;

use crate::model::TaskSpec;

/// A team's quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quota {
    /// Nominal quota, milli-GPU.
    pub nominal_milli: u64,
    /// How much more than nominal it may borrow from the cohort, milli-GPU (`None`: no limit).
    pub borrowing_limit_milli: Option<u64>,
}

/// Quotas and usage of every team.
#[derive(Debug, Clone, Default)]
pub struct Quotas {
    quotas: HashMap<String, Quota>,
    usage: HashMap<String, u64>,
    cohort_nominal: u64,
    cohort_usage: u64,
}

impl Quotas {
    /// Sets a team's quota.
    pub fn set(&mut self, team: &str, quota: Quota) {
        let old = self
            .quotas
            .insert(team.to_owned(), quota)
            .unwrap_or_default();
        self.cohort_nominal = self.cohort_nominal - old.nominal_milli + quota.nominal_milli;
    }

    /// Whether any team has a quota.
    pub fn is_empty(&self) -> bool {
        self.quotas.is_empty()
    }

    /// A team's quota (zero if it has none).
    pub fn quota(&self, team: &str) -> Quota {
        self.quotas.get(team).copied().unwrap_or_default()
    }

    /// Milli-GPU a team holds now.
    pub fn usage(&self, team: &str) -> u64 {
        self.usage.get(team).copied().unwrap_or(0)
    }

    /// Sum of nominal quotas.
    pub fn cohort_nominal(&self) -> u64 {
        self.cohort_nominal
    }

    /// Milli-GPU held by all teams.
    pub fn cohort_usage(&self) -> u64 {
        self.cohort_usage
    }

    /// Whether `task` fits its team's unused nominal quota.
    pub fn within_nominal(&self, task: &TaskSpec) -> bool {
        self.usage(&task.team) + task.gpu_demand_milli() <= self.quota(&task.team).nominal_milli
    }

    /// Whether a team holds more than its nominal quota.
    pub fn borrowing(&self, team: &str) -> bool {
        self.usage(team) > self.quota(team).nominal_milli
    }

    /// Whether `task` may be admitted: within its team's nominal quota, or borrowing from the
    /// cohort's unused quota within the team's borrowing limit.
    pub fn admits(&self, task: &TaskSpec) -> bool {
        let demand = task.gpu_demand_milli();
        if self.within_nominal(task) {
            return true;
        }
        let quota = self.quota(&task.team);
        let within_limit = quota
            .borrowing_limit_milli
            .is_none_or(|limit| self.usage(&task.team) + demand <= quota.nominal_milli + limit);
        within_limit && self.cohort_usage + demand <= self.cohort_nominal
    }

    pub(crate) fn charge(&mut self, team: &str, milli: u64) {
        *self.usage.entry(team.to_owned()).or_default() += milli;
        self.cohort_usage += milli;
    }

    pub(crate) fn refund(&mut self, team: &str, milli: u64) {
        if let Some(u) = self.usage.get_mut(team) {
            *u = u.saturating_sub(milli);
        }
        self.cohort_usage = self.cohort_usage.saturating_sub(milli);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas() -> Quotas {
        let mut q = Quotas::default();
        q.set(
            "a",
            Quota {
                nominal_milli: 4_000,
                borrowing_limit_milli: None,
            },
        );
        q.set(
            "b",
            Quota {
                nominal_milli: 4_000,
                borrowing_limit_milli: Some(2_000),
            },
        );
        q
    }

    #[test]
    fn admission_follows_nominal_then_cohort_borrowing_within_limits() {
        struct Case {
            name: &'static str,
            usage: &'static [(&'static str, u64)],
            task: TaskSpec,
            want: bool,
        }
        let cases = [
            Case {
                name: "within nominal",
                usage: &[],
                task: TaskSpec::new(1, "a", 4),
                want: true,
            },
            Case {
                name: "borrows what b leaves unused",
                usage: &[("a", 4_000)],
                task: TaskSpec::new(2, "a", 4),
                want: true,
            },
            Case {
                name: "cannot borrow what b uses",
                usage: &[("a", 4_000), ("b", 2_000)],
                task: TaskSpec::new(3, "a", 4),
                want: false,
            },
            Case {
                name: "b's borrowing limit holds",
                usage: &[("b", 4_000)],
                task: TaskSpec::new(4, "b", 3),
                want: false,
            },
            Case {
                name: "b borrows within its limit",
                usage: &[("b", 4_000)],
                task: TaskSpec::new(5, "b", 2),
                want: true,
            },
        ];
        for case in cases {
            let mut q = quotas();
            for (team, milli) in case.usage {
                q.charge(team, *milli);
            }
            assert_eq!(q.admits(&case.task), case.want, "{}", case.name);
        }
    }
}
