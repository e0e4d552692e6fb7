//! Billing: prices every lease in the allocators' journals and publishes what each team's
//! workloads cost, on `allot.cost.<team>.<workload>` (the COSTS stream), in integer micro-units.
//!
//! # Layout
//!
//! - [`prices`] (the crate `allot-prices`, shared with the predictor): the price table (per GPU
//!   model, MIG profile, CPU core and GiB of memory, per hour; effective dates; one currency),
//!   read exactly into micro-units, every problem of a file reported at once.
//! - [`ledger`]: the pure rules — leases open at grants and close at releases and
//!   preemptions, periods aligned to the interval and split at price changes, amounts rounded
//!   down once per lease so periods add up exactly.
//! - This file: the service. One durable consumer reads every pool's journal
//!   (`allot.alloc.*.journal` in DECISIONS). For each batch of entries it computes the events
//!   on the pools' ledgers, publishes them, each under an id derived from (pool, lease, period
//!   start), and only then commits what the batch changed of the ledgers (their rows by task
//!   and lease) and the consumer's position in one SQLite transaction; if anything fails on
//!   the way, the ledgers are read back as the last commit left them. A crash in between
//!   re-publishes the same events under the same ids:
//!   JetStream drops them within COSTS' one-hour duplicate window, and `allot costs` counts an
//!   event id once in any case. A journal entry delivered twice bills nothing twice (each
//!   pool's ledger remembers the last entry it applied).
//! - Idle cost: a second consumer reads GPU telemetry (TELEMETRY) and counts, for every GPU an
//!   open lease holds, the samples taken while it did and those at 0% utilization. A lease's
//!   last cost event reports the idle share of its GPU cost beside its amount (`idle`).
//!   Telemetry and the journal are separate streams: samples read after the lease's close are
//!   not counted, so the share is a measurement, not an invoice line.
//! - [`reconcile`]: the journal against the cost events — every lease billed exactly lease
//!   time × price, none twice — for audits, the fault matrix and `allot bench scale`.
//! - `metrics`: what billing counts for Prometheus — the amount billed per team and currency
//!   (`allot_cost_total`), budget thresholds crossed.

pub mod budget;
pub mod ledger;
mod metrics;
pub mod reconcile;
/// The price table lives in `allot-prices` (the predictor right-sizes with it too); this path
/// stays for billing's callers.
pub use allot_prices as prices;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use futures::FutureExt;
use uuid::Uuid;

use allot_bus::consumer::{ConsumerRunner, ConsumerSpec, Delivery, Handler, HandlerError, Outcome};
use allot_bus::streams::names;
use allot_bus::{BusError, ConnectConfig, Publisher};
use allot_events::cost::{BudgetCrossed, BudgetLevel, CostAccrued};
use allot_events::{AllocEvent, AnyEvent, CostEvent, Envelope, TelemetryEvent};
use allot_runtime::Service;
use allot_sched::{Decision, LeaseId, TaskId};
use allot_store::rusqlite::{Connection, OptionalExtension, ToSql, params};

pub use ledger::PoolLedger;

use budget::{Limit, Spend};
pub use prices::{InvalidPrices, PriceTable};

/// The `source` of billing's events.
pub const SOURCE: &str = "/allot/billing";
/// The namespace of cost event ids (UUIDv5 of `<pool>/<lease>/<period start>`).
pub const EVENT_ID_NAMESPACE: Uuid = Uuid::from_u128(0x9d3a_5c1e_84f2_4b07_a6e9_1f0c_72d4_b853);

const MIGRATIONS: &[&str] = &[
    "
-- Each pool's ledger (JSON): open leases, tasks' teams, the last journal entry applied.
CREATE TABLE ledgers (
    pool   TEXT PRIMARY KEY,
    ledger TEXT NOT NULL
) STRICT;

-- Each budgeted team's spending per budget period, and the threshold last announced.
CREATE TABLE spend (
    team    TEXT NOT NULL,
    period  TEXT NOT NULL,            -- 2026-11 or 2026-11-22
    micros  INTEGER NOT NULL,
    gpu_use TEXT NOT NULL,            -- milli-GPU x ms (a decimal integer: may exceed 64 bits)
    level   INTEGER NOT NULL,         -- 0 none, 1 warning, 2 exceeded
    PRIMARY KEY (team, period)
) STRICT;

-- The GPUs open leases hold, and what telemetry said of each while they did.
CREATE TABLE holdings (
    node         TEXT NOT NULL,
    gpu          INTEGER NOT NULL,
    pool         TEXT NOT NULL,
    lease        INTEGER NOT NULL,
    samples      INTEGER NOT NULL DEFAULT 0,
    idle_samples INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (pool, lease, node, gpu)
) STRICT;
CREATE INDEX holdings_gpu ON holdings (node, gpu);
",
    "
-- Each pool's ledger by key, so that a commit writes what its batch changed, not every open
-- lease: the last journal entry applied, the team of every task submitted and not yet
-- released, and every open lease (JSON). A pool's ledger stored whole in `ledgers` by an
-- earlier version is read once and moved here by the next commit.
CREATE TABLE ledger_head (
    pool       TEXT PRIMARY KEY,
    last_entry INTEGER NOT NULL
) STRICT;
CREATE TABLE ledger_team (
    pool TEXT NOT NULL,
    task INTEGER NOT NULL,
    team TEXT NOT NULL,
    PRIMARY KEY (pool, task)
) STRICT;
CREATE TABLE ledger_lease (
    pool  TEXT NOT NULL,
    lease INTEGER NOT NULL,
    json  TEXT NOT NULL,
    PRIMARY KEY (pool, lease)
) STRICT;
",
];

/// Billing's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// NATS URL(s).
    pub nats_url: String,
    /// Folder for `billing.db`.
    pub data_dir: PathBuf,
    /// The prices.
    pub prices: PriceTable,
    /// Billing period: leases are billed per period aligned to it, and at their end.
    pub interval: Duration,
    /// The durable consumer's name (also its position's key).
    pub consumer: String,
    /// Each team's budget (from the teams file).
    pub budgets: budget::Budgets,
}

impl Config {
    /// Defaults: a 60 s interval, consumer `billing`.
    pub fn new(
        nats_url: impl Into<String>,
        data_dir: impl Into<PathBuf>,
        prices: PriceTable,
    ) -> Self {
        Self {
            nats_url: nats_url.into(),
            data_dir: data_dir.into(),
            prices,
            interval: Duration::from_secs(60),
            consumer: "billing".into(),
            budgets: budget::Budgets::new(),
        }
    }

    /// The database file.
    pub fn db_path(&self) -> PathBuf {
        self.data_dir.join("billing.db")
    }
}

/// Why billing stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bus failed.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The database failed.
    #[error("billing database: {0}")]
    Store(#[from] allot_store::StoreError),
    /// One of its tasks failed or panicked: the task's name and why.
    #[error("{0}")]
    Stopped(Box<allot_runtime::Stopped<Error>>),
}

/// The event id of the cost of `pool`'s lease `lease` from `from_ms`.
pub fn event_id(e: &CostAccrued) -> Uuid {
    Uuid::new_v5(
        &EVENT_ID_NAMESPACE,
        format!("{}/{}/{}", e.pool, e.lease.0, e.from_ms).as_bytes(),
    )
}

/// Runs billing until `shutdown`.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mut service = Service::new("billing", shutdown);
    let client = allot_bus::connect(
        &ConnectConfig::new(&config.nats_url, "allot-billing"),
        service.stopping(),
    )
    .await?;
    service.drain_on_stop(client.clone());
    let conn = allot_store::open(&config.db_path(), MIGRATIONS)?;
    tracing::info!(db = %config.db_path().display(), currency = %config.prices.currency, "billing started");
    let spec = ConsumerSpec {
        filter_subjects: vec!["allot.alloc.*.journal".into()],
        ..ConsumerSpec::new(names::DECISIONS, config.consumer.clone())
    };
    let handler = Billing {
        conn,
        consumer: config.consumer.clone(),
        publisher: Publisher::new(client.clone(), SOURCE),
        prices: config.prices.clone(),
        interval_ms: config.interval.as_millis().max(1) as u64,
        ledgers: HashMap::new(),
        whole: Vec::new(),
        budgets: config.budgets.clone(),
    };
    let telemetry = allot_store::Projection::new(
        allot_store::open(&config.db_path(), MIGRATIONS)?,
        format!("{}-telemetry", config.consumer),
        "billing",
        apply_sample,
    );
    // Samples only add up here (how busy each lease's GPUs were).
    let telemetry_spec = ConsumerSpec::new(names::TELEMETRY, telemetry.consumer()).summing();
    service.spawn(
        format!("consumer {}", names::TELEMETRY),
        ConsumerRunner::new(client.clone(), telemetry_spec, telemetry)
            .with_gate(service.gate(format!("consumer {}", names::TELEMETRY)))
            .run(service.stopping())
            .map(|r| r.map(drop).map_err(Error::from)),
    );
    service.spawn(
        format!("consumer {}", names::DECISIONS),
        ConsumerRunner::new(client.clone(), spec, handler)
            .with_gate(service.gate(format!("consumer {}", names::DECISIONS)))
            .run(service.stopping())
            .map(|r| r.map(drop).map_err(Error::from)),
    );
    service.run().await.map_err(|s| Error::Stopped(Box::new(s)))
}

/// The handler of the journal consumer.
struct Billing {
    conn: Connection,
    consumer: String,
    publisher: Publisher,
    prices: PriceTable,
    interval_ms: u64,
    /// Each pool's ledger as the last commit left it, plus what the batch being billed did.
    ledgers: HashMap<String, PoolLedger>,
    /// Pools whose ledger was read from `ledgers` (stored whole by an earlier version): the
    /// next commit deletes that row.
    whole: Vec<String>,
    budgets: budget::Budgets,
}

/// The events and spending changes a batch of cost events makes to the budgets.
#[derive(Debug, Default)]
struct BudgetChanges {
    /// Each with the index of the cost event that caused it (published right after it).
    events: Vec<(usize, BudgetCrossed)>,
    spend: BTreeMap<(String, String), Spend>,
}

impl Billing {
    /// Spending of `team` in `period` as stored.
    fn spend(&self, team: &str, period: &str) -> Result<Option<Spend>, HandlerError> {
        self.conn
            .query_row(
                "SELECT micros, gpu_use, level FROM spend WHERE team = ?1 AND period = ?2",
                [team, period],
                |r| {
                    Ok(Spend {
                        micros: r.get(0)?,
                        gpu_use: r.get::<_, String>(1)?.parse().unwrap_or(0),
                        level: r.get(2)?,
                    })
                },
            )
            .optional()
            .map_err(db)
    }

    /// The threshold the team last announced in its latest period before `period`.
    fn previous_level(&self, team: &str, period: &str) -> Result<u8, HandlerError> {
        Ok(self
            .conn
            .query_row(
                "SELECT level FROM spend WHERE team = ?1 AND period < ?2 ORDER BY period DESC LIMIT 1",
                [team, period],
                |r| r.get::<_, u8>(0),
            )
            .optional()
            .map_err(db)?
            .unwrap_or(0))
    }

    /// What `costs` do to the budgets.
    fn budget_changes(&self, costs: &[CostAccrued]) -> Result<BudgetChanges, HandlerError> {
        let mut out = BudgetChanges::default();
        for (i, c) in costs.iter().enumerate() {
            let Some(b) = self.budgets.get(&c.team) else {
                continue;
            };
            let period = budget::period_of(b.period, c.to_ms);
            let key = (c.team.clone(), period.clone());
            let spend = match out.spend.get(&key) {
                Some(s) => *s,
                None => match self.spend(&c.team, &period)? {
                    Some(s) => s,
                    None => {
                        if self.previous_level(&c.team, &period)? >= 2 {
                            let within = BudgetLevel::Within;
                            let e = self.crossing(c, b, &period, within, Spend::default());
                            out.events.push((i, e));
                        }
                        Spend::default()
                    }
                },
            };
            let mut spend = spend;
            spend.add(c);
            for level in spend.crossed(b.limit) {
                out.events
                    .push((i, self.crossing(c, b, &period, level, spend)));
            }
            out.spend.insert(key, spend);
        }
        Ok(out)
    }

    fn crossing(
        &self,
        c: &CostAccrued,
        b: &budget::Budget,
        period: &str,
        level: BudgetLevel,
        spend: Spend,
    ) -> BudgetCrossed {
        let (spent, budget) = match b.limit {
            Limit::Money(cap) => (spend.micros, cap),
            // GPU budgets are reported in milli-GPU-hours.
            Limit::GpuUse(cap) => ((spend.gpu_use / 3_600_000) as i64, (cap / 3_600_000) as i64),
        };
        BudgetCrossed {
            team: c.team.clone(),
            period: period.to_owned(),
            level,
            spent,
            budget,
            currency: match b.limit {
                Limit::Money(_) => c.currency.clone(),
                Limit::GpuUse(_) => "milli-GPU-hours".into(),
            },
            block_below: b.block_below,
        }
    }
    /// Reads `pool`'s ledger from the database unless it is in memory.
    fn ledger(&mut self, pool: &str) -> Result<(), HandlerError> {
        if !self.ledgers.contains_key(pool) {
            let ledger = match load_ledger(&self.conn, pool).map_err(db)? {
                Some(ledger) => ledger,
                None => match load_whole_ledger(&self.conn, pool)? {
                    Some(mut ledger) => {
                        ledger.mark_all_changed();
                        self.whole.push(pool.to_owned());
                        ledger
                    }
                    None => PoolLedger::default(),
                },
            };
            self.ledgers.insert(pool.to_owned(), ledger);
        }
        Ok(())
    }
}

/// `pool`'s ledger as stored by key, if it was.
fn load_ledger(conn: &Connection, pool: &str) -> allot_store::rusqlite::Result<Option<PoolLedger>> {
    let Some(last_entry) = conn
        .query_row(
            "SELECT last_entry FROM ledger_head WHERE pool = ?1",
            [pool],
            |r| r.get::<_, i64>(0),
        )
        .optional()?
    else {
        return Ok(None);
    };
    let mut teams = BTreeMap::new();
    let mut stmt = conn.prepare("SELECT task, team FROM ledger_team WHERE pool = ?1")?;
    let mut rows = stmt.query([pool])?;
    while let Some(row) = rows.next()? {
        teams.insert(TaskId(row.get::<_, i64>(0)? as u64), row.get(1)?);
    }
    let mut leases = BTreeMap::new();
    let mut stmt = conn.prepare("SELECT lease, json FROM ledger_lease WHERE pool = ?1")?;
    let mut rows = stmt.query([pool])?;
    while let Some(row) = rows.next()? {
        let json: String = row.get(1)?;
        let open = serde_json::from_str(&json).map_err(|e| {
            allot_store::rusqlite::Error::FromSqlConversionFailure(
                1,
                allot_store::rusqlite::types::Type::Text,
                Box::new(e),
            )
        })?;
        leases.insert(LeaseId(row.get::<_, i64>(0)? as u64), open);
    }
    Ok(Some(PoolLedger::restore(last_entry as u64, teams, leases)))
}

/// `pool`'s ledger as an earlier version stored it, whole in one row, if it did.
fn load_whole_ledger(conn: &Connection, pool: &str) -> Result<Option<PoolLedger>, HandlerError> {
    let stored: Option<String> = conn
        .query_row("SELECT ledger FROM ledgers WHERE pool = ?1", [pool], |r| {
            r.get(0)
        })
        .optional()
        .map_err(db)?;
    stored
        .map(|text| {
            serde_json::from_str(&text).map_err(|e| {
                HandlerError::transient(format!("billing database: ledger of {pool}: {e}"))
            })
        })
        .transpose()
}

/// Stores what a batch changed of `pool`'s ledger (inside the caller's transaction).
fn store_ledger(
    tx: &Connection,
    pool: &str,
    changes: &ledger::LedgerChanges,
) -> allot_store::rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO ledger_head (pool, last_entry) VALUES (?1, ?2)
         ON CONFLICT (pool) DO UPDATE SET last_entry = excluded.last_entry",
    )?
    .execute(params![pool, changes.last_entry as i64])?;
    for (task, team) in &changes.teams {
        allot_store::put_row(
            tx,
            (
                "INSERT INTO ledger_team (pool, task, team) VALUES (?1, ?2, ?3)
                 ON CONFLICT (pool, task) DO UPDATE SET team = excluded.team",
                "DELETE FROM ledger_team WHERE pool = ?1 AND task = ?2",
            ),
            &[&pool, &(task.0 as i64)],
            team.as_ref().map(|team| team as &dyn ToSql),
        )?;
    }
    for (lease, open) in &changes.leases {
        let json = open
            .as_ref()
            .map(|open| serde_json::to_string(open).expect("a lease serializes"));
        allot_store::put_row(
            tx,
            (
                "INSERT INTO ledger_lease (pool, lease, json) VALUES (?1, ?2, ?3)
                 ON CONFLICT (pool, lease) DO UPDATE SET json = excluded.json",
                "DELETE FROM ledger_lease WHERE pool = ?1 AND lease = ?2",
            ),
            &[&pool, &(lease.0 as i64)],
            json.as_ref().map(|json| json as &dyn ToSql),
        )?;
    }
    Ok(())
}

impl Handler for Billing {
    fn resume_after(&mut self) -> Result<Option<u64>, HandlerError> {
        let position = allot_store::position(&self.conn, &self.consumer)
            .map_err(|e| HandlerError::transient(format!("billing database: {e}")))?;
        Ok(Some(position.unwrap_or(0)))
    }

    /// A batch is billed as one: every entry's cost events are computed in order on the pools'
    /// ledgers, all of them published, and only then what the batch changed of the ledgers
    /// (the rows of the tasks and leases it touched), the spending, the GPUs held and the
    /// position committed in one transaction. If anything fails on the way, the ledgers it
    /// touched are forgotten and read back as the last commit stored them, so the retry, or a
    /// crash's redelivery, bills the whole batch again under the same event ids. Committing once
    /// per batch, and only what it changed, matters at scale: a pool's ledger holds every open
    /// lease (thousands at 2,000 nodes), and writing it after each entry made billing fall
    /// behind a 2,000-node fleet (`allot bench scale`, docs/benchmarks.md).
    async fn handle(&mut self, batch: &[Delivery]) -> Result<Vec<Outcome>, HandlerError> {
        let mut touched: Vec<String> = Vec::new();
        let result = self.bill(batch, &mut touched).await;
        if result.is_err() {
            for pool in &touched {
                self.ledgers.remove(pool);
            }
            self.whole.retain(|p| !touched.contains(p));
        }
        result
    }
}

impl Billing {
    /// [`Handler::handle`]'s work; `touched`: the pools whose ledgers it changed.
    async fn bill(
        &mut self,
        batch: &[Delivery],
        touched: &mut Vec<String>,
    ) -> Result<Vec<Outcome>, HandlerError> {
        let Some(last) = batch.last() else {
            return Ok(Vec::new());
        };
        let mut events: Vec<CostAccrued> = Vec::new();
        let mut applied_in_order = Vec::new();
        for d in batch {
            // Leader elections: nothing to bill.
            let AnyEvent::Alloc(AllocEvent::Applied(applied)) = &d.event.data else {
                continue;
            };
            let pool = applied.pool.as_str();
            if !touched.iter().any(|p| p == pool) {
                touched.push(pool.to_owned());
            }
            self.ledger(pool)?;
            let ledger = self.ledgers.get_mut(pool).expect("read above");
            let mut costs = ledger.apply(pool, applied, &self.prices, self.interval_ms);
            for e in costs.iter_mut().filter(|e| e.last) {
                if let Some(idle) = &mut e.idle {
                    // The samples counted while the lease was held; a lease granted in this
                    // batch has none yet.
                    let (samples, idle_samples): (i64, i64) = self
                        .conn
                        .prepare_cached(
                            "SELECT coalesce(sum(samples), 0), coalesce(sum(idle_samples), 0)
                             FROM holdings WHERE pool = ?1 AND lease = ?2",
                        )
                        .and_then(|mut stmt| {
                            stmt.query_row(params![pool, e.lease.0 as i64], |r| {
                                Ok((r.get(0)?, r.get(1)?))
                            })
                        })
                        .map_err(db)?;
                    idle.samples = samples as u64;
                    idle.idle_samples = idle_samples as u64;
                    if samples > 0 {
                        idle.amount = (i128::from(idle.gpu_amount) * i128::from(idle_samples)
                            / i128::from(samples)) as i64;
                    }
                }
            }
            events.extend(costs);
            applied_in_order.push(applied);
        }
        let budgets = self.budget_changes(&events)?;
        let mut envelopes = Vec::with_capacity(events.len() + budgets.events.len());
        for (i, e) in events.iter().enumerate() {
            let mut envelope = Envelope::at(
                SOURCE,
                CostEvent::Accrued(e.clone()),
                chrono::DateTime::from_timestamp_millis(e.to_ms as i64).unwrap_or_default(),
            );
            envelope.id = event_id(e);
            envelopes.push(envelope);
            // A threshold is announced right after the cost that crossed it.
            for (_, b) in budgets.events.iter().filter(|(at, _)| *at == i) {
                let mut envelope = Envelope::new(SOURCE, CostEvent::BudgetCrossed(b.clone()));
                envelope.id = Uuid::new_v5(
                    &EVENT_ID_NAMESPACE,
                    format!("budget/{}/{}/{:?}", b.team, b.period, b.level).as_bytes(),
                );
                tracing::info!(team = %b.team, period = %b.period, level = ?b.level, "budget threshold");
                envelopes.push(envelope);
            }
        }
        let mut pending = Vec::with_capacity(envelopes.len());
        for envelope in &envelopes {
            pending.push(
                self.publisher.send(envelope).await.map_err(|e| {
                    HandlerError::transient(format!("publishing a cost event: {e}"))
                })?,
            );
        }
        for p in pending {
            p.wait()
                .await
                .map_err(|e| HandlerError::transient(format!("publishing a cost event: {e}")))?;
        }
        let tx = self.conn.transaction().map_err(db)?;
        for pool in touched.iter() {
            let changes = self
                .ledgers
                .get_mut(pool)
                .expect("a touched ledger is in memory")
                .take_changes();
            store_ledger(&tx, pool, &changes).map_err(db)?;
        }
        for pool in &self.whole {
            tx.execute("DELETE FROM ledgers WHERE pool = ?1", [pool])
                .map_err(db)?;
        }
        for ((team, period), s) in &budgets.spend {
            tx.execute(
                "INSERT INTO spend (team, period, micros, gpu_use, level) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (team, period) DO UPDATE SET micros = excluded.micros,
                    gpu_use = excluded.gpu_use, level = excluded.level",
                params![team, period, s.micros, s.gpu_use.to_string(), s.level],
            )
            .map_err(db)?;
        }
        for applied in applied_in_order {
            holdings(&tx, &applied.pool, applied).map_err(db)?;
        }
        allot_store::record_position(&tx, &self.consumer, last.stream_sequence).map_err(db)?;
        tx.commit().map_err(db)?;
        self.whole.clear();
        metrics::billed(&events, budgets.events.iter().map(|(_, b)| b));
        Ok(vec![Outcome::Handled; batch.len()])
    }
}

/// Records the GPUs `applied` grants and forgets those of the leases it ends.
fn holdings(
    tx: &allot_store::rusqlite::Transaction<'_>,
    pool: &str,
    applied: &allot_events::alloc::Applied,
) -> Result<(), allot_store::rusqlite::Error> {
    for d in &applied.entry.decisions {
        match d {
            Decision::Released { lease, .. } | Decision::Preempted { lease, .. } => {
                tx.execute(
                    "DELETE FROM holdings WHERE pool = ?1 AND lease = ?2",
                    params![pool, lease.0 as i64],
                )?;
            }
            Decision::Granted { lease, .. } => {
                for g in applied.dispatch.iter().filter(|g| g.lease == *lease) {
                    for n in &g.nodes {
                        for (gpu, _) in &n.gpus {
                            tx.execute(
                                "INSERT OR IGNORE INTO holdings (node, gpu, pool, lease)
                                 VALUES (?1, ?2, ?3, ?4)",
                                params![n.node, gpu, pool, lease.0 as i64],
                            )?;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Counts a GPU sample against the lease holding the GPU (the telemetry consumer's
/// projection; other events are skipped).
fn apply_sample(tx: &Connection, d: &Delivery) -> allot_store::rusqlite::Result<()> {
    let AnyEvent::Telemetry(TelemetryEvent::GpusSampled(s)) = &d.event.data else {
        return Ok(());
    };
    for g in &s.samples {
        let Some(util) = g.utilization_pct else {
            continue;
        };
        tx.prepare_cached(
            "UPDATE holdings SET samples = samples + 1,
                idle_samples = idle_samples + ?3
             WHERE node = ?1 AND gpu = ?2",
        )?
        .execute(params![s.node, g.index, i64::from(util == 0)])?;
    }
    Ok(())
}

fn db(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::transient(format!("billing database: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::tests::{Journal, MINUTE, POOL, prices};

    #[test]
    fn a_ledger_stored_whole_by_an_earlier_version_is_stored_again_by_key_and_read_back_the_same() {
        let p = prices();
        let mut j = Journal(0);
        let mut ledger = PoolLedger::default();
        for task in 1..=3 {
            ledger.apply(POOL, &j.submitted(task, "vision", task * 1_000), &p, MINUTE);
        }
        for task in 1..=2 {
            ledger.apply(POOL, &j.granted(task, task, 1000, false, 4_000), &p, MINUTE);
        }
        let conn = allot_store::open_in_memory(MIGRATIONS).unwrap();
        conn.execute(
            "INSERT INTO ledgers (pool, ledger) VALUES (?1, ?2)",
            params![POOL, serde_json::to_string(&ledger).unwrap()],
        )
        .unwrap();

        assert!(load_ledger(&conn, POOL).unwrap().is_none());
        let mut whole = load_whole_ledger(&conn, POOL).unwrap().unwrap();
        assert_eq!(whole, ledger);
        whole.mark_all_changed();
        store_ledger(&conn, POOL, &whole.take_changes()).unwrap();
        let by_key = load_ledger(&conn, POOL).unwrap().unwrap();
        assert_eq!(by_key, ledger);

        // A release: its lease's row and its task's row go; the rest stay.
        let mut live = by_key;
        let costs = live.apply(POOL, &j.released(1, 1, 90_000), &p, MINUTE);
        assert!(costs.iter().any(|c| c.last && c.lease == LeaseId(1)));
        store_ledger(&conn, POOL, &live.take_changes()).unwrap();
        let read = load_ledger(&conn, POOL).unwrap().unwrap();
        assert_eq!(read, live);
        assert_eq!(
            read.leases.keys().copied().collect::<Vec<_>>(),
            [LeaseId(2)]
        );
        assert!(!read.teams.contains_key(&TaskId(1)));
    }
}
