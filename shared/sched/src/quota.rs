//! Team quotas in one cohort (Kueue's ClusterQueues sharing a cohort). One scheduler schedules
//! one pool, so these are the teams' quotas in that pool.
//!
//! Each team has a nominal quota of GPUs (milli-GPU) and, optionally, of CPU and memory. What a
//! team leaves unused may be borrowed by the others:
//! - **lending limit**: how much of its nominal quota a team lends; the rest is guaranteed to
//!   it (unlimited: all of it is lendable);
//! - **borrowing limit**: how far above its nominal quota a team may go (unlimited by default);
//! - the cohort's **lendable pool** is the sum of what teams lend; usage above a team's
//!   guaranteed part draws on it, and nobody borrows once it is used up.
//!
//! **Fair share of borrowed capacity** is dominant-resource style (Ghodsi et al., NSDI'11, as
//! Kueue's fair sharing applies it to cohorts): a team's share is the largest, over the
//! resources it has quota for, of what it borrows divided by the lendable pool of that
//! resource. [`Quotas::fairer`] says whether moving capacity from one team to another makes
//! the shares more even; the `allot` policy preempts on it.
//!
//! Usage is kept current by the scheduler on every grant, release and preemption, and counts
//! what tasks request (as Kueue does) — not the whole nodes a large task may occupy.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use crate::model::TaskSpec;

/// The resources quotas cover, as indices into [`Amounts`].
pub const GPU: usize = 0;
/// CPU, millicores.
pub const CPU: usize = 1;
/// Memory, MiB.
pub const MEMORY: usize = 2;
const RESOURCES: [&str; 3] = ["GPU", "CPU", "memory"];

/// An amount of each resource: milli-GPU, CPU millicores, memory MiB.
pub type Amounts = [u64; 3];

/// What a task asks of the quota.
pub fn demand(task: &TaskSpec) -> Amounts {
    [task.gpu_demand_milli(), task.cpu_milli, task.memory_mib]
}

/// A team's quota of one resource.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub struct Limit {
    /// Nominal quota.
    pub nominal: u64,
    /// How much more than nominal it may borrow (`None`: no limit).
    pub borrowing_limit: Option<u64>,
    /// How much of its nominal quota others may borrow (`None`: all of it).
    pub lending_limit: Option<u64>,
}

impl Limit {
    /// What is guaranteed to the team alone.
    fn guaranteed(&self) -> u64 {
        self.nominal - self.lendable()
    }
    /// What it lends to the cohort.
    fn lendable(&self) -> u64 {
        self.lending_limit
            .map_or(self.nominal, |l| l.min(self.nominal))
    }
}

/// A team's quota.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(default)]
pub struct Quota {
    /// Nominal quota, milli-GPU.
    pub nominal_milli: u64,
    /// How much more than nominal it may borrow from the cohort, milli-GPU (`None`: no limit).
    pub borrowing_limit_milli: Option<u64>,
    /// How much of its nominal GPU quota others may borrow, milli-GPU (`None`: all of it).
    pub lending_limit_milli: Option<u64>,
    /// CPU quota, millicores (`None`: CPU is not under quota for this team).
    pub cpu: Option<Limit>,
    /// Memory quota, MiB (`None`: memory is not under quota for this team).
    pub memory: Option<Limit>,
}

impl Quota {
    /// A nominal quota of `milli` milli-GPU, everything else unlimited.
    pub fn gpus(milli: u64) -> Self {
        Self {
            nominal_milli: milli,
            ..Self::default()
        }
    }

    fn limits(&self) -> [Option<Limit>; 3] {
        [
            Some(Limit {
                nominal: self.nominal_milli,
                borrowing_limit: self.borrowing_limit_milli,
                lending_limit: self.lending_limit_milli,
            }),
            self.cpu,
            self.memory,
        ]
    }
}

/// Quotas and usage of every team.
#[derive(Debug, Clone, Default)]
pub struct Quotas {
    /// Where each team's entry is in `teams`. Shared between copies: a preemption search
    /// weighs its victims against a copy of the quotas as they were, and a copy should cost
    /// no more than the entries.
    index: Arc<HashMap<String, usize>>,
    /// Each team's quota (if it has one) and usage, in one entry: preemption searches ask
    /// about both for every victim they weigh.
    teams: Vec<TeamQuota>,
    /// How many teams have a quota.
    with_quota: usize,
    /// Sum of what teams lend, per resource.
    pool: Amounts,
    /// Usage above teams' guaranteed parts, per resource.
    pool_used: Amounts,
    cohort_nominal: u64,
    cohort_usage: u64,
}

/// A team's quota, if it has one, and what it holds.
#[derive(Debug, Clone, Copy, Default)]
struct TeamQuota {
    limits: Option<[Option<Limit>; 3]>,
    usage: Amounts,
}

impl TeamQuota {
    /// Its limits: without a quota, a nominal GPU quota of zero and nothing else.
    fn limits(&self) -> [Option<Limit>; 3] {
        self.limits.unwrap_or([Some(Limit::default()), None, None])
    }
}

impl Quotas {
    /// Sets a team's quota.
    pub fn set(&mut self, team: &str, quota: Quota) {
        let (old, usage) = self.state(team);
        for r in 0..3 {
            if let Some(limit) = old[r] {
                self.pool[r] -= limit.lendable();
                self.pool_used[r] -= usage[r].saturating_sub(limit.guaranteed());
            }
        }
        self.cohort_nominal -= old[GPU].map_or(0, |l| l.nominal);
        let new = quota.limits();
        for r in 0..3 {
            if let Some(limit) = new[r] {
                self.pool[r] += limit.lendable();
                self.pool_used[r] += usage[r].saturating_sub(limit.guaranteed());
            }
        }
        self.cohort_nominal += quota.nominal_milli;
        let at = self.slot(team);
        let entry = &mut self.teams[at];
        if entry.limits.replace(new).is_none() {
            self.with_quota += 1;
        }
    }

    /// Whether any team has a quota.
    pub fn is_empty(&self) -> bool {
        self.with_quota == 0
    }

    /// A team's GPU quota (zero if it has none).
    pub fn quota(&self, team: &str) -> Quota {
        let Some(limits) = self.get(team).and_then(|t| t.limits.as_ref()) else {
            return Quota::default();
        };
        let gpu = limits[GPU].unwrap_or_default();
        Quota {
            nominal_milli: gpu.nominal,
            borrowing_limit_milli: gpu.borrowing_limit,
            lending_limit_milli: gpu.lending_limit,
            cpu: limits[CPU],
            memory: limits[MEMORY],
        }
    }

    /// Milli-GPU a team holds now.
    pub fn usage(&self, team: &str) -> u64 {
        self.usage_of(team)[GPU]
    }

    fn usage_of(&self, team: &str) -> Amounts {
        self.get(team).map(|t| t.usage).unwrap_or_default()
    }

    /// A team's limits (see [`TeamQuota::limits`]) and usage, in one look-up.
    fn state(&self, team: &str) -> ([Option<Limit>; 3], Amounts) {
        let t = self.get(team).copied().unwrap_or_default();
        (t.limits(), t.usage)
    }

    /// Sum of nominal GPU quotas.
    pub fn cohort_nominal(&self) -> u64 {
        self.cohort_nominal
    }

    /// Milli-GPU held by all teams.
    pub fn cohort_usage(&self) -> u64 {
        self.cohort_usage
    }

    /// Whether `demand` more fits the team's unused nominal quota, for every resource under
    /// quota.
    pub fn within_nominal(&self, team: &str, demand: Amounts) -> bool {
        let (limits, usage) = self.state(team);
        limits
            .iter()
            .enumerate()
            .all(|(r, l)| l.is_none_or(|l| usage[r] + demand[r] <= l.nominal))
    }

    /// Whether a team holds more than its nominal quota of some resource.
    pub fn borrowing(&self, team: &str) -> bool {
        let (limits, usage) = self.state(team);
        limits
            .iter()
            .enumerate()
            .any(|(r, l)| l.is_some_and(|l| usage[r] > l.nominal))
    }

    /// Whether `demand` more may be admitted for `team`: for every resource under quota, within
    /// the team's nominal quota, or borrowing from the cohort's lendable pool within the
    /// team's borrowing limit.
    pub fn admits(&self, team: &str, demand: Amounts) -> bool {
        self.refused(team, demand).is_none()
    }

    /// Why `demand` more may not be admitted for `team`, if it may not.
    pub fn refusal(&self, team: &str, demand: Amounts) -> Option<String> {
        Some(match self.refused(team, demand)? {
            Refused::OverBorrowing { r, after, limit } => format!(
                "team {team} would hold {after} of {} (nominal {}, borrowing limit {})",
                RESOURCES[r],
                limit.nominal,
                limit.borrowing_limit.unwrap_or_default()
            ),
            Refused::CohortShort { r, limit } => {
                let name = RESOURCES[r];
                format!(
                    "team {team} is at its nominal {name} quota ({}) and the cohort has only {} \
                     of {name} left to lend",
                    limit.nominal,
                    self.pool[r].saturating_sub(self.pool_used[r])
                )
            }
        })
    }

    /// The check behind [`Quotas::admits`] and [`Quotas::refusal`], with the figures the
    /// message needs: the scheduler asks it for every waiting unit on every pass, and only
    /// a refusal that is reported is worth a string.
    fn refused(&self, team: &str, demand: Amounts) -> Option<Refused> {
        let (limits, usage) = self.state(team);
        for (r, limit) in limits.iter().enumerate() {
            let Some(limit) = limit else { continue };
            let after = usage[r] + demand[r];
            if after <= limit.nominal {
                continue;
            }
            if let Some(borrow) = limit.borrowing_limit
                && after > limit.nominal + borrow
            {
                return Some(Refused::OverBorrowing {
                    r,
                    after,
                    limit: *limit,
                });
            }
            let g = limit.guaranteed();
            let more = after.saturating_sub(g) - usage[r].saturating_sub(g);
            if self.pool_used[r] + more > self.pool[r] {
                return Some(Refused::CohortShort { r, limit: *limit });
            }
        }
        None
    }

    /// What a team borrows above its nominal quota, per resource.
    pub fn borrowed(&self, team: &str) -> Amounts {
        let (limits, usage) = self.state(team);
        let mut out = [0; 3];
        for (r, limit) in limits.iter().enumerate() {
            if let Some(limit) = limit {
                out[r] = usage[r].saturating_sub(limit.nominal);
            }
        }
        out
    }

    /// The team's dominant share of borrowed capacity if its usage changed by `plus` and
    /// `minus`, as a fraction `(borrowed, pool)` of the resource where it is largest.
    fn share(&self, team: &str, plus: Amounts, minus: Amounts) -> (u64, u64) {
        let (limits, usage) = self.state(team);
        let mut best = (0, 1);
        for (r, limit) in limits.iter().enumerate() {
            let (Some(limit), true) = (limit, self.pool[r] > 0) else {
                continue;
            };
            let after = (usage[r] + plus[r]).saturating_sub(minus[r]);
            let share = (after.saturating_sub(limit.nominal), self.pool[r]);
            if u128::from(share.0) * u128::from(best.1) > u128::from(best.0) * u128::from(share.1) {
                best = share;
            }
        }
        best
    }

    /// Whether taking `victim_demand` from team `victim` to give `demand` to team `taker`
    /// evens out their shares of borrowed capacity: the taker's share afterwards is at most
    /// the victim's afterwards (Kueue's `LessThanOrEqualToFinalShare`). It never holds both
    /// ways, so fair-share preemptions cannot cycle.
    pub fn fairer(
        &self,
        taker: &str,
        demand: Amounts,
        victim: &str,
        victim_demand: Amounts,
    ) -> bool {
        if taker == victim {
            return false;
        }
        let t = self.share(taker, demand, [0; 3]);
        let v = self.share(victim, [0; 3], victim_demand);
        // The victim must borrow after losing the task, or there is nothing unfair to even out.
        v.0 > 0 && u128::from(t.0) * u128::from(v.1) <= u128::from(v.0) * u128::from(t.1)
    }

    pub(crate) fn charge(&mut self, team: &str, amounts: Amounts) {
        let at = self.slot(team);
        self.charge_at(at, amounts);
    }

    pub(crate) fn refund(&mut self, team: &str, amounts: Amounts) {
        let at = self.slot(team);
        self.refund_at(at, amounts);
    }

    /// [`Self::charge`] the team whose entry is at `at` ([`Self::slot`]).
    pub(crate) fn charge_at(&mut self, at: usize, amounts: Amounts) {
        self.adjust(at, |u, r| u[r] += amounts[r]);
        self.cohort_usage += amounts[GPU];
    }

    /// [`Self::refund`] the team whose entry is at `at` ([`Self::slot`]).
    pub(crate) fn refund_at(&mut self, at: usize, amounts: Amounts) {
        self.adjust(at, |u, r| u[r] = u[r].saturating_sub(amounts[r]));
        self.cohort_usage = self.cohort_usage.saturating_sub(amounts[GPU]);
    }

    fn get(&self, team: &str) -> Option<&TeamQuota> {
        self.index.get(team).map(|at| &self.teams[*at])
    }

    /// Where a team's entry is, made (empty) if it has none. Entries are only ever added, so
    /// the answer holds for these quotas and their copies.
    pub(crate) fn slot(&mut self, team: &str) -> usize {
        // One look-up for a team seen before (every refund and charge but a team's first).
        match self.index.get(team) {
            Some(at) => *at,
            None => {
                let at = self.teams.len();
                Arc::make_mut(&mut self.index).insert(team.to_owned(), at);
                self.teams.push(TeamQuota::default());
                at
            }
        }
    }

    fn adjust(&mut self, at: usize, change: impl Fn(&mut Amounts, usize)) {
        let entry = &mut self.teams[at];
        let limits = entry.limits();
        let usage = &mut entry.usage;
        for r in 0..3 {
            let guaranteed = limits[r].map(|l| l.guaranteed());
            if let Some(g) = guaranteed {
                self.pool_used[r] -= usage[r].saturating_sub(g);
            }
            change(usage, r);
            if let Some(g) = guaranteed {
                self.pool_used[r] += usage[r].saturating_sub(g);
            }
        }
    }
}

/// Why a demand is refused (see [`Quotas::refusal`]), for resource `r`.
#[derive(Debug, Clone, Copy)]
enum Refused {
    /// The team would hold `after`, past its nominal quota plus its borrowing limit.
    OverBorrowing { r: usize, after: u64, limit: Limit },
    /// The team is past its nominal quota and the cohort has too little left to lend.
    CohortShort { r: usize, limit: Limit },
}

#[cfg(test)]
mod tests;
