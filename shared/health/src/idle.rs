//! Idle reclaim: a grant whose GPUs stay under a utilization threshold for a whole window is
//! reclaimed, with notice — unless its task opted out (`idleReclaim: false`) or is still warming
//! up (loading data, compiling kernels). Run:ai counts 30-second windows at 0%; Avesha EGS calls
//! it an idle timeout.

use std::collections::BTreeMap;

use crate::Millis;

/// When a grant counts as idle.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IdlePolicy {
    /// Utilization (0–1, the mean over the grant's GPUs) under which a reading is idle.
    pub below: f64,
    /// How long every reading must be idle before the grant is reclaimed, ms.
    pub window: Millis,
    /// How long after its start a grant is never reclaimed, ms.
    pub warm_up: Millis,
    /// How long before the reclaim its team is told (once), ms.
    pub notice: Millis,
}

impl Default for IdlePolicy {
    fn default() -> Self {
        Self {
            below: 0.01,
            window: 10 * 60_000,
            warm_up: 10 * 60_000,
            notice: 2 * 60_000,
        }
    }
}

/// A grant as idle reclaim sees it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Grant {
    started: Millis,
    opted_out: bool,
    /// Since when every reading has been idle (`None`: the last one was busy).
    idle_since: Option<Millis>,
    reclaimed: bool,
    /// Told of the coming reclaim in this idle spell.
    #[serde(default)]
    noticed: bool,
}

/// Watches grants, by lease.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct IdleWatch {
    policy: IdlePolicy,
    grants: BTreeMap<u64, Grant>,
}

/// What idle reclaim decided about a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Tell its team: reclaimed at `at + notice` unless it gets busy.
    Notice(Reclaim),
    /// Reclaim it.
    Reclaim(Reclaim),
}

/// A grant to reclaim (or to warn): its lease, and since when it has been idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reclaim {
    /// The lease.
    pub lease: u64,
    /// Idle since.
    pub idle_since: Millis,
    /// Decided at.
    pub at: Millis,
}

impl IdleWatch {
    /// A watch under `policy`.
    pub fn new(policy: IdlePolicy) -> Self {
        Self {
            policy,
            grants: BTreeMap::new(),
        }
    }

    /// Lease `lease` was granted at `started`; `opted_out`: its task said `idleReclaim: false`.
    pub fn granted(&mut self, lease: u64, started: Millis, opted_out: bool) {
        self.grants.insert(
            lease,
            Grant {
                started,
                opted_out,
                idle_since: None,
                reclaimed: false,
                noticed: false,
            },
        );
    }

    /// Lease `lease` ended: forget it.
    pub fn released(&mut self, lease: u64) {
        self.grants.remove(&lease);
    }

    /// The grant's GPUs were `utilization` busy at `at`; the notice (once per idle spell,
    /// `notice` before the window ends) or the reclaim (once) it decides.
    pub fn observe(&mut self, lease: u64, utilization: f64, at: Millis) -> Option<Idle> {
        let policy = self.policy;
        let grant = self.grants.get_mut(&lease)?;
        if utilization >= policy.below {
            grant.idle_since = None;
            grant.noticed = false;
            return None;
        }
        let since = *grant.idle_since.get_or_insert(at);
        let idle_for = at.saturating_sub(since);
        // Reclaim no sooner than warm-up + notice after the start, so the notice always comes.
        let warm = at.saturating_sub(grant.started) < policy.warm_up;
        if grant.opted_out || grant.reclaimed || warm {
            return None;
        }
        let decided = Reclaim {
            lease,
            idle_since: since,
            at,
        };
        if !grant.noticed && idle_for + policy.notice >= policy.window {
            grant.noticed = true;
            if policy.notice > 0 {
                return Some(Idle::Notice(decided));
            }
        }
        if idle_for < policy.window || !grant.noticed {
            return None;
        }
        grant.reclaimed = true;
        Some(Idle::Reclaim(decided))
    }

    /// Whether it watches lease `lease`.
    pub fn watches(&self, lease: u64) -> bool {
        self.grants.contains_key(&lease)
    }

    /// Its policy.
    pub fn policy(&self) -> IdlePolicy {
        self.policy
    }

    /// Takes over the grants `other` watched (a restart under a new policy).
    pub fn adopt(&mut self, other: IdleWatch) {
        self.grants = other.grants;
    }

    /// What it knows of lease `lease`'s grant, to store (`None`: not watched).
    pub fn grant(&self, lease: u64) -> Option<Grant> {
        self.grants.get(&lease).copied()
    }

    /// Takes over a stored grant (a restart).
    pub fn restore_grant(&mut self, lease: u64, grant: Grant) {
        self.grants.insert(lease, grant);
    }

    /// The leases it watches, in order.
    pub fn leases(&self) -> impl Iterator<Item = u64> + '_ {
        self.grants.keys().copied()
    }
}
