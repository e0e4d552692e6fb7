//! Reconciling a pool's journal with the cost events billing published: the check an auditor,
//! the fault matrix (tests/e2e/faults.rs) and `allot bench scale` make that no cost was lost or
//! billed twice.
//!
//! Every lease the journal granted must be billed in periods that follow on from its grant to
//! its end (a release or a preemption), the last one flagged, adding up to its lease time ×
//! price: milli-GPU × ms × the model's GPU-hour price ÷ 3.6 × 10⁹, rounded down once, as the
//! [`ledger`](crate::ledger) bills. No event may charge a lease the journal never granted.
//! Events are counted once per id, as `allot costs` does, so a re-published event is not a
//! double charge. The check prices GPU time only, at one price per model: a lease that holds
//! CPU or memory, or a model without a price, is reported rather than guessed at.

use std::collections::{BTreeMap, BTreeSet};

use allot_events::alloc::Applied;
use allot_events::cost::CostAccrued;
use allot_sched::{Decision, LeaseId};

/// What [`reconcile`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Every lease whose events do not match it, or event that matches no lease, in words.
    pub problems: Vec<String>,
    /// Leases checked (granted and ended).
    pub leases: usize,
    /// What the ended leases cost by lease time × price, micro-units.
    pub total: i64,
}

/// Checks `journal` (one pool's entries, in order) against `costs` (event id, event) with
/// `gpu_hour` giving a GPU model's price per hour in micro-units.
pub fn reconcile(
    journal: &[Applied],
    costs: &[(String, CostAccrued)],
    gpu_hour: impl Fn(&str) -> Option<i64>,
) -> Reconciled {
    let mut problems = Vec::new();
    // lease → (grant time, price of its GPUs per hour × milli-GPU, end time)
    let mut leases: BTreeMap<LeaseId, (u64, i128, Option<u64>)> = BTreeMap::new();
    for a in journal {
        for d in &a.entry.decisions {
            match d {
                Decision::Granted { lease, at, .. } => {
                    let Some(g) = a.dispatch.iter().find(|g| g.lease == *lease) else {
                        continue;
                    };
                    let mut rate = 0i128;
                    for n in &g.nodes {
                        if n.cpu_milli != 0 || n.memory_mib != 0 {
                            problems.push(format!(
                                "lease {lease:?} holds CPU or memory on {}, which this check \
                                 does not price",
                                n.node
                            ));
                        }
                        let Some(price) = gpu_hour(&n.gpu_model) else {
                            problems.push(format!(
                                "lease {lease:?}: no price for GPU model {:?}",
                                n.gpu_model
                            ));
                            continue;
                        };
                        let milli: u64 = n.gpus.iter().map(|(_, m)| u64::from(*m)).sum();
                        rate += i128::from(milli) * i128::from(price);
                    }
                    leases.insert(*lease, (*at, rate, None));
                }
                Decision::Released { lease, at, .. } | Decision::Preempted { lease, at, .. } => {
                    if let Some(l) = leases.get_mut(lease) {
                        l.2 = Some(*at);
                    }
                }
                _ => {}
            }
        }
    }
    let mut seen = BTreeSet::new();
    let mut charged: BTreeMap<LeaseId, Vec<&CostAccrued>> = BTreeMap::new();
    for (id, c) in costs {
        if seen.insert(id) {
            charged.entry(c.lease).or_default().push(c);
        }
    }
    let mut total = 0;
    let mut checked = 0;
    for (lease, (from, rate, to)) in &leases {
        let Some(to) = to else {
            problems.push(format!("lease {lease:?} never ended"));
            continue;
        };
        checked += 1;
        let want = (rate * i128::from(to - from) / 3_600_000_000) as i64;
        total += want;
        let mut periods = charged.remove(lease).unwrap_or_default();
        periods.sort_by_key(|c| (c.from_ms, c.to_ms));
        let got: i64 = periods.iter().map(|c| c.amount).sum();
        let follow_on = periods.first().map(|c| c.from_ms) == Some(*from)
            && periods.last().map(|c| (c.to_ms, c.last)) == Some((*to, true))
            && periods
                .windows(2)
                .all(|w| w[0].to_ms == w[1].from_ms && !w[0].last);
        if !follow_on || got != want {
            let bounds: Vec<(u64, u64, bool)> = periods
                .iter()
                .map(|c| (c.from_ms, c.to_ms, c.last))
                .collect();
            problems.push(format!(
                "lease {lease:?} (from {from} to {to}): charged {got} in periods {bounds:?}, \
                 lease time × price is {want}"
            ));
        }
    }
    for (lease, periods) in charged {
        problems.push(format!(
            "lease {lease:?} is not in the journal but was charged {periods:?}"
        ));
    }
    Reconciled {
        problems,
        leases: checked,
        total,
    }
}
