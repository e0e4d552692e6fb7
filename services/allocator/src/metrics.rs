//! The allocator's metrics, in the process's registry ([`allot_runtime::metrics`]). The leader
//! of a pool reports them while it leads; when its term ends they are removed, so a standby
//! (or a deposed leader) never reports a pool it does not schedule, and summing over instances
//! counts each pool once.
//!
//! | metric | what it says |
//! |---|---|
//! | `allot_allocator_leading{pool}` | 1 while this instance leads the pool |
//! | `allot_pending_tasks{pool,team}` | tasks waiting: in the scheduler's queue (a gang's members each), or parked until a node that can hold them joins |
//! | `allot_scheduling_pass_duration_seconds{pool}` | how long a scheduling pass took to decide (the scheduler's work; not the journal write) |
//! | `allot_journal_commit_entries{pool}` | entries appended by one journal commit (one atomic batch per batch of inputs) |
//! | `allot_journal_commit_duration_seconds{pool}` | how long a journal commit took, the round trip to the server included |
//! | `allot_gpus{pool}` | GPUs of the pool's schedulable nodes |
//! | `allot_gpus_allocated{pool}` | GPUs granted (fractions of a GPU count as such) |
//! | `allot_gpus_wasted{pool}` | free GPUs while some waiting task could be placed on them alone, else 0 |
//! | `allot_wastage_ratio{pool}` | 1 while some GPU capacity is free and a waiting task could be placed on the free capacity alone, else 0 (see below) |
//!
//! The Wastage Ratio is the simulator's `WR_fit` (`allot_sim::kpi`): the fraction of time
//! during which idle capacity sat next to a waiting task that fit on it. The gauge is its
//! instantaneous value after each batch and pass, so its time average over a window —
//! `avg_over_time(allot_wastage_ratio[1h])` — is the live pool's `WR_fit` over that window.
//! (Capacity left free while what waits does not fit, as under fragmentation or a gang, is not
//! counted: no pass could have used it.)

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Unit;

use allot_runtime::metrics::{register, register_with_unit};
use allot_sched::{Scheduler, TaskId, TaskSpec};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Pool {
    pool: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolTeam {
    pool: String,
    team: String,
}

type Ratio = Gauge<f64, AtomicU64>;

struct Families {
    leading: Family<Pool, Gauge>,
    pending: Family<PoolTeam, Gauge>,
    pass: Family<Pool, Histogram, fn() -> Histogram>,
    commit_entries: Family<Pool, Histogram, fn() -> Histogram>,
    commit: Family<Pool, Histogram, fn() -> Histogram>,
    gpus: Family<Pool, Ratio>,
    allocated: Family<Pool, Ratio>,
    wasted: Family<Pool, Ratio>,
    wastage: Family<Pool, Ratio>,
}

/// 100 µs to 13 s, doubling: a pass over a small pool takes well under a millisecond, one
/// over thousands of queued tasks tens of milliseconds.
fn pass_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

/// 1 to 2,048 entries, doubling.
fn entries_buckets() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 12))
}

static FAMILIES: LazyLock<Families> = LazyLock::new(|| Families {
    leading: register(
        "allocator_leading",
        "1 while this allocator leads the pool",
        Family::default(),
    ),
    pending: register(
        "pending_tasks",
        "Tasks waiting in the pool, by team (queued or parked)",
        Family::default(),
    ),
    pass: register_with_unit(
        "scheduling_pass_duration",
        "How long a scheduling pass took to decide",
        Unit::Seconds,
        Family::new_with_constructor(pass_buckets as fn() -> Histogram),
    ),
    commit_entries: register(
        "journal_commit_entries",
        "Entries appended to the journal by one commit",
        Family::new_with_constructor(entries_buckets as fn() -> Histogram),
    ),
    commit: register_with_unit(
        "journal_commit_duration",
        "How long a journal commit took, the round trip to the server included",
        Unit::Seconds,
        Family::new_with_constructor(pass_buckets as fn() -> Histogram),
    ),
    gpus: register(
        "gpus",
        "GPUs of the pool's schedulable nodes",
        Family::default(),
    ),
    allocated: register("gpus_allocated", "GPUs granted", Family::default()),
    wasted: register(
        "gpus_wasted",
        "Free GPUs while a waiting task could be placed on the free capacity alone",
        Family::default(),
    ),
    wastage: register(
        "wastage_ratio",
        "1 while free capacity sits next to a waiting task that fits on it, else 0; its time \
         average is the Wastage Ratio (WR_fit)",
        Family::default(),
    ),
});

/// One leader's series for its pool, for the length of its term (removed on drop).
#[derive(Debug)]
pub(crate) struct Term {
    pool: Pool,
    /// The teams whose pending count it reported: a team whose last task left is set to 0,
    /// not left at its last count.
    teams: BTreeSet<String>,
}

impl Term {
    /// Starts reporting `pool`.
    pub(crate) fn lead(pool: &str) -> Self {
        let pool = Pool {
            pool: pool.to_owned(),
        };
        FAMILIES.leading.get_or_create(&pool).set(1);
        Self {
            pool,
            teams: BTreeSet::new(),
        }
    }

    /// Records the state of the pool's scheduler, with the tasks parked outside it.
    pub(crate) fn observe(&mut self, scheduler: &Scheduler, parked: &BTreeMap<TaskId, TaskSpec>) {
        let mut pending: BTreeMap<&str, i64> = self.teams.iter().map(|t| (t.as_str(), 0)).collect();
        for spec in scheduler.pending_specs().chain(parked.values()) {
            *pending.entry(spec.team.as_str()).or_default() += 1;
        }
        for (team, count) in &pending {
            FAMILIES.pending.get_or_create(&self.team(team)).set(*count);
        }
        self.teams = pending.keys().map(|t| (*t).to_owned()).collect();

        let cluster = scheduler.cluster();
        let gpus = |milli: u64| milli as f64 / 1000.0;
        let free = cluster.free_milli();
        let wasting = free > 0 && scheduler.pending() > 0 && scheduler.some_pending_fits();
        FAMILIES
            .gpus
            .get_or_create(&self.pool)
            .set(gpus(cluster.capacity_milli()));
        FAMILIES
            .allocated
            .get_or_create(&self.pool)
            .set(gpus(cluster.allocated_milli()));
        FAMILIES
            .wasted
            .get_or_create(&self.pool)
            .set(if wasting { gpus(free) } else { 0.0 });
        FAMILIES
            .wastage
            .get_or_create(&self.pool)
            .set(if wasting { 1.0 } else { 0.0 });
    }

    fn team(&self, team: &str) -> PoolTeam {
        PoolTeam {
            pool: self.pool.pool.clone(),
            team: team.to_owned(),
        }
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        let f = &*FAMILIES;
        for team in &self.teams {
            f.pending.remove(&self.team(team));
        }
        f.leading.remove(&self.pool);
        f.pass.remove(&self.pool);
        f.commit_entries.remove(&self.pool);
        f.commit.remove(&self.pool);
        f.gpus.remove(&self.pool);
        f.allocated.remove(&self.pool);
        f.wasted.remove(&self.pool);
        f.wastage.remove(&self.pool);
    }
}

/// A pass of `pool`'s scheduler took `took`.
pub(crate) fn pass_took(pool: &str, took: Duration) {
    FAMILIES
        .pass
        .get_or_create(&Pool {
            pool: pool.to_owned(),
        })
        .observe(took.as_secs_f64());
}

/// A journal commit of `pool` appended `entries` entries in `took`.
pub(crate) fn committed(pool: &str, entries: usize, took: Duration) {
    let pool = Pool {
        pool: pool.to_owned(),
    };
    FAMILIES
        .commit_entries
        .get_or_create(&pool)
        .observe(entries as f64);
    FAMILIES
        .commit
        .get_or_create(&pool)
        .observe(took.as_secs_f64());
}
