//! The ledger: open leases per pool, priced as the journal's clock moves. Pure: journal
//! entries in, cost events out, so every rule is tested without NATS and a replay of a journal
//! gives the same events.
//!
//! # Rules
//!
//! - A lease opens at its `Granted` decision (time `at`) with what its dispatch says it holds on
//!   each node: milli-GPU per GPU model, MIG instances, CPU millicores, memory. The team is the
//!   one its task was submitted under (the journal's `TaskSubmitted` input).
//! - It closes at its `Released` or `Preempted` decision: a preempted task is billed for what it
//!   held until then; its next grant is a new lease.
//! - Periods are aligned to the billing interval (multiples of it since the epoch) and also
//!   split at every price change, so one price applies to each. A period is billed once the
//!   journal's clock has passed its end (any entry of the pool carries the time), and the
//!   lease's last period at its close.
//! - Amounts: for each resource line, `cumulative(t) = ⌊Σ quantity × ms × price-per-hour ÷
//!   (1000 × 3,600,000)⌋` (÷ 1024 instead of 1000 for memory in MiB), summed exactly in 128-bit
//!   integers over the price segments since the grant; a period's amount is `cumulative(end) −
//!   cumulative(start)`. Rounding down happens once per lease, not per period: the periods of a
//!   lease add up exactly to its whole cost, whatever the interval.
//! - Entries are applied once: each pool remembers the last journal entry it applied (`seq`),
//!   so a journal message delivered twice, or replayed, bills nothing twice.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use allot_events::alloc::{Applied, Dispatch};
use allot_events::cost::{CostAccrued, CostLine, IdleCost};
use allot_sched::{Decision, Input, LeaseId, TaskId};

use crate::prices::{PriceTable, Prices};

/// The team (or workload) of a lease whose task the journal does not attribute (a task
/// submitted without a launch, by a test or a raw client).
pub const UNATTRIBUTED: &str = "unattributed";

const HOUR_MS: i128 = 3_600_000;

/// What a lease holds of one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resource {
    /// Milli-GPU of a GPU model.
    Gpu(String),
    /// Instances (× 1000) of a MIG profile.
    Mig(String),
    /// CPU millicores.
    Cpu,
    /// Memory, MiB.
    Memory,
}

impl Resource {
    fn key(&self) -> String {
        match self {
            Self::Gpu(m) => format!("gpu:{m}"),
            Self::Mig(p) => format!("mig:{p}"),
            Self::Cpu => "cpu".into(),
            Self::Memory => "memory".into(),
        }
    }

    fn unit(&self) -> &'static str {
        match self {
            Self::Gpu(_) => "milli-GPU",
            Self::Mig(_) => "milli-instance",
            Self::Cpu => "millicore",
            Self::Memory => "MiB",
        }
    }

    /// Units of `quantity` per whole priced unit.
    fn per_unit(&self) -> i128 {
        match self {
            Self::Memory => 1024,
            _ => 1000,
        }
    }

    /// Price per hour of a whole unit, if the table has one.
    fn price(&self, p: &Prices) -> Option<i64> {
        match self {
            Self::Gpu(m) => p.gpu(m),
            Self::Mig(profile) => p.mig_hour.get(profile).copied(),
            Self::Cpu => Some(p.cpu_core_hour),
            Self::Memory => Some(p.memory_gib_hour),
        }
    }
}

/// A lease being billed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenLease {
    /// Its task.
    pub task: TaskId,
    /// Team charged.
    pub team: String,
    /// Workload.
    pub workload: String,
    /// The task's name.
    pub task_name: String,
    /// Granted at, ms.
    pub granted_ms: u64,
    /// Billed up to, ms.
    pub billed_ms: u64,
    /// What it holds.
    pub holds: Vec<(Resource, u64)>,
}

/// One pool's ledger. Stored by key with the consumer's position: what an entry changed is
/// kept ([`PoolLedger::take_changes`]) so that a commit writes those tasks' and leases' rows,
/// not the whole ledger.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PoolLedger {
    /// The last journal entry applied.
    pub last_entry: u64,
    /// The team of every task submitted and not yet released.
    pub teams: BTreeMap<TaskId, String>,
    /// Open leases.
    pub leases: BTreeMap<LeaseId, OpenLease>,
    /// Tasks whose team was set or forgotten since the last [`PoolLedger::take_changes`].
    #[serde(skip)]
    changed_tasks: BTreeSet<TaskId>,
    /// Leases opened, billed or closed since then.
    #[serde(skip)]
    changed_leases: BTreeSet<LeaseId>,
    /// No open lease has a period ending before this (`None`: not known; computed by the next
    /// entry's sweep over the open leases, so that entries between two period ends do not read
    /// every open lease).
    #[serde(skip)]
    due: Option<u64>,
}

impl PartialEq for PoolLedger {
    /// What is stored: not what changed since the last commit, nor the sweep's bound.
    fn eq(&self, other: &Self) -> bool {
        self.last_entry == other.last_entry
            && self.teams == other.teams
            && self.leases == other.leases
    }
}

impl Eq for PoolLedger {}

/// What entries changed in a ledger, to store: each changed task's team and lease (`None`:
/// forget it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerChanges {
    /// The last journal entry applied.
    pub last_entry: u64,
    /// Tasks, with their team.
    pub teams: Vec<(TaskId, Option<String>)>,
    /// Leases, as they are now.
    pub leases: Vec<(LeaseId, Option<OpenLease>)>,
}

/// What a lease holds, merged over its nodes.
fn holds(d: &Dispatch) -> Vec<(Resource, u64)> {
    let mut out: Vec<(Resource, u64)> = Vec::new();
    let mut add = |r: Resource, q: u64| {
        if q == 0 {
            return;
        }
        match out.iter_mut().find(|(have, _)| *have == r) {
            Some((_, total)) => *total += q,
            None => out.push((r, q)),
        }
    };
    for n in &d.nodes {
        let milli: u64 = n.gpus.iter().map(|(_, m)| u64::from(*m)).sum();
        add(Resource::Gpu(n.gpu_model.clone()), milli);
        if let Some(profile) = &n.mig {
            add(Resource::Mig(profile.clone()), 1000);
        }
        add(Resource::Cpu, n.cpu_milli);
        add(Resource::Memory, n.memory_mib);
    }
    out
}

impl PoolLedger {
    /// A ledger as stored: its last entry, the tasks' teams and the open leases.
    pub fn restore(
        last_entry: u64,
        teams: BTreeMap<TaskId, String>,
        leases: BTreeMap<LeaseId, OpenLease>,
    ) -> Self {
        Self {
            last_entry,
            teams,
            leases,
            ..Self::default()
        }
    }

    /// What changed since the last call, forgotten as it is returned: the caller stores it.
    pub fn take_changes(&mut self) -> LedgerChanges {
        let teams = std::mem::take(&mut self.changed_tasks);
        let leases = std::mem::take(&mut self.changed_leases);
        LedgerChanges {
            last_entry: self.last_entry,
            teams: teams
                .into_iter()
                .map(|t| (t, self.teams.get(&t).cloned()))
                .collect(),
            leases: leases
                .into_iter()
                .map(|l| (l, self.leases.get(&l).cloned()))
                .collect(),
        }
    }

    /// Counts everything as changed: the next [`PoolLedger::take_changes`] returns every task
    /// and lease (to store the whole ledger, as one stored whole by an earlier version).
    pub fn mark_all_changed(&mut self) {
        self.changed_tasks = self.teams.keys().copied().collect();
        self.changed_leases = self.leases.keys().copied().collect();
    }

    /// Applies one journal entry of `pool`; the cost events it closes, in order.
    pub fn apply(
        &mut self,
        pool: &str,
        applied: &Applied,
        prices: &PriceTable,
        interval_ms: u64,
    ) -> Vec<CostAccrued> {
        let entry = &applied.entry;
        if entry.seq <= self.last_entry {
            return Vec::new();
        }
        self.last_entry = entry.seq;
        if let (Input::TaskSubmitted { task, .. }, None) = (&entry.input, &entry.rejected) {
            self.teams.insert(task.id, task.team.clone());
            self.changed_tasks.insert(task.id);
        }
        let mut out = Vec::new();
        let mut clock = entry.input.at().unwrap_or(0);
        for d in &entry.decisions {
            match d {
                Decision::Granted {
                    task, lease, at, ..
                } => {
                    clock = clock.max(*at);
                    let dispatch = applied.dispatch.iter().find(|g| g.lease == *lease);
                    let workload = dispatch
                        .map(|g| g.launch.workload.clone())
                        .filter(|w| !w.is_empty())
                        .unwrap_or_else(|| UNATTRIBUTED.into());
                    self.changed_leases.insert(*lease);
                    let due = next_boundary(*at, interval_ms, prices);
                    self.due = self.due.map(|d| d.min(due));
                    self.leases.insert(
                        *lease,
                        OpenLease {
                            task: *task,
                            team: self
                                .teams
                                .get(task)
                                .cloned()
                                .unwrap_or_else(|| UNATTRIBUTED.into()),
                            workload,
                            task_name: dispatch
                                .map_or_else(|| task.to_string(), |g| g.launch.name.clone()),
                            granted_ms: *at,
                            billed_ms: *at,
                            holds: dispatch.map(holds).unwrap_or_default(),
                        },
                    );
                }
                Decision::Released { task, lease, at }
                | Decision::Preempted {
                    task, lease, at, ..
                } => {
                    clock = clock.max(*at);
                    if let Some(mut open) = self.leases.remove(lease) {
                        self.changed_leases.insert(*lease);
                        out.extend(accrue(
                            pool,
                            *lease,
                            &mut open,
                            *at,
                            true,
                            prices,
                            interval_ms,
                        ));
                    }
                    if matches!(d, Decision::Released { .. }) && self.teams.remove(task).is_some() {
                        self.changed_tasks.insert(*task);
                    }
                }
                Decision::Withdrawn { task, at, .. } => {
                    // Withdrawn while queued: it holds no lease and will not run again.
                    clock = clock.max(*at);
                    if self.teams.remove(task).is_some() {
                        self.changed_tasks.insert(*task);
                    }
                }
                Decision::Waiting { at, .. } | Decision::Reserved { at, .. } => {
                    clock = clock.max(*at);
                }
            }
        }
        // A sweep over the open leases only once a period may have ended.
        if clock > 0 && self.due.is_none_or(|due| clock >= due) {
            let mut due = u64::MAX;
            for (lease, open) in &mut self.leases {
                let billed = accrue(pool, *lease, open, clock, false, prices, interval_ms);
                if !billed.is_empty() {
                    self.changed_leases.insert(*lease);
                    out.extend(billed);
                }
                due = due.min(next_boundary(open.billed_ms, interval_ms, prices));
            }
            self.due = Some(due);
        }
        out
    }
}

/// The numerator of a resource's cumulative cost from `from` to `to`: Σ quantity × ms × price
/// over the price segments in between.
fn numerator(r: &Resource, quantity: u64, from: u64, to: u64, prices: &PriceTable) -> i128 {
    let mut total = 0i128;
    let mut t = from;
    while t < to {
        let end = prices.next_change(t).map_or(to, |c| c.min(to));
        let price = r.price(prices.at(t)).unwrap_or(0);
        total += i128::from(quantity) * i128::from(end - t) * i128::from(price);
        t = end;
    }
    total
}

/// The lease's cumulative amount for resource `r` from its grant to `t`, micro-units.
fn cumulative(open: &OpenLease, r: &Resource, quantity: u64, t: u64, prices: &PriceTable) -> i64 {
    let n = numerator(r, quantity, open.granted_ms, t, prices);
    (n / (r.per_unit() * HOUR_MS)) as i64
}

/// The next period boundary after `t`: the next multiple of the interval, or an earlier price
/// change.
fn next_boundary(t: u64, interval_ms: u64, prices: &PriceTable) -> u64 {
    let aligned = (t / interval_ms + 1) * interval_ms;
    prices.next_change(t).map_or(aligned, |c| c.min(aligned))
}

/// Bills `open` up to `until`: every complete period, and with `last` the rest up to the end.
fn accrue(
    pool: &str,
    lease: LeaseId,
    open: &mut OpenLease,
    until: u64,
    last: bool,
    prices: &PriceTable,
    interval_ms: u64,
) -> Vec<CostAccrued> {
    let mut periods = Vec::new();
    let mut from = open.billed_ms;
    loop {
        let end = next_boundary(from, interval_ms, prices);
        if end > until {
            break;
        }
        periods.push((from, end));
        from = end;
    }
    if last && (from < until || periods.is_empty()) {
        periods.push((from, until.max(from)));
    }
    if periods.is_empty() {
        return Vec::new();
    }
    let count = periods.len();
    // The lease's whole GPU cost, for the idle share its last period reports.
    let gpu_amount: i64 = open
        .holds
        .iter()
        .filter(|(r, _)| matches!(r, Resource::Gpu(_) | Resource::Mig(_)))
        .map(|(r, q)| cumulative(open, r, *q, until, prices))
        .sum();
    let holds_gpus = open
        .holds
        .iter()
        .any(|(r, _)| matches!(r, Resource::Gpu(_) | Resource::Mig(_)));
    let mut out = Vec::with_capacity(count);
    for (i, (from, to)) in periods.into_iter().enumerate() {
        let in_force = prices.at(from);
        let lines: Vec<CostLine> = open
            .holds
            .iter()
            .map(|(r, q)| {
                let price = r.price(in_force);
                CostLine {
                    resource: r.key(),
                    quantity: *q,
                    unit: r.unit().into(),
                    unit_price: price.unwrap_or(0),
                    amount: cumulative(open, r, *q, to, prices)
                        - cumulative(open, r, *q, from, prices),
                    unpriced: price.is_none(),
                }
            })
            .collect();
        out.push(CostAccrued {
            team: open.team.clone(),
            workload: open.workload.clone(),
            task_name: open.task_name.clone(),
            task: open.task,
            pool: pool.into(),
            lease,
            from_ms: from,
            to_ms: to,
            last: last && i + 1 == count,
            currency: prices.currency.clone(),
            amount: lines.iter().map(|l| l.amount).sum(),
            lines,
            idle: (last && i + 1 == count && holds_gpus).then_some(IdleCost {
                samples: 0,
                idle_samples: 0,
                gpu_amount,
                amount: 0,
            }),
        });
        open.billed_ms = to;
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
