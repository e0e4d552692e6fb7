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
//!   on copies of the pools' ledgers, publishes them, each under an id derived from (pool,
//!   lease, period start), and only then commits the ledgers and the consumer's position in
//!   one SQLite transaction. A crash in between re-publishes the same events under the same ids:
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
use allot_sched::Decision;
use allot_store::rusqlite::{Connection, OptionalExtension, params};

pub use ledger::PoolLedger;

use budget::{Limit, Spend};
pub use prices::{InvalidPrices, PriceTable};

/// The `source` of billing's events.
pub const SOURCE: &str = "/allot/billing";
/// The namespace of cost event ids (UUIDv5 of `<pool>/<lease>/<period start>`).
pub const EVENT_ID_NAMESPACE: Uuid = Uuid::from_u128(0x9d3a_5c1e_84f2_4b07_a6e9_1f0c_72d4_b853);

const MIGRATIONS: &[&str] = &["
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
"];

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
    ledgers: HashMap<String, PoolLedger>,
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
    fn ledger(&mut self, pool: &str) -> Result<PoolLedger, HandlerError> {
        if let Some(l) = self.ledgers.get(pool) {
            return Ok(l.clone());
        }
        let stored: Option<String> = self
            .conn
            .query_row("SELECT ledger FROM ledgers WHERE pool = ?1", [pool], |r| {
                r.get(0)
            })
            .optional()
            .map_err(|e| HandlerError::transient(format!("billing database: {e}")))?;
        match stored {
            Some(text) => serde_json::from_str(&text).map_err(|e| {
                HandlerError::transient(format!("billing database: ledger of {pool}: {e}"))
            }),
            None => Ok(PoolLedger::default()),
        }
    }
}

impl Handler for Billing {
    fn resume_after(&mut self) -> Result<Option<u64>, HandlerError> {
        let position = allot_store::position(&self.conn, &self.consumer)
            .map_err(|e| HandlerError::transient(format!("billing database: {e}")))?;
        Ok(Some(position.unwrap_or(0)))
    }

    /// A batch is billed as one: every entry's cost events are computed in order on copies of
    /// the pools' ledgers, all of them published, and only then the ledgers, the spending, the
    /// GPUs held and the position committed in one transaction. A crash in between bills the
    /// whole batch again from the ledgers as they were, under the same event ids. Committing
    /// once per batch instead of once per entry matters at scale: a pool's ledger holds every
    /// open lease, and writing it after each entry made billing fall behind a 2,000-node fleet
    /// (`allot bench scale`, docs/benchmarks.md).
    async fn handle(&mut self, batch: &[Delivery]) -> Result<Vec<Outcome>, HandlerError> {
        let Some(last) = batch.last() else {
            return Ok(Vec::new());
        };
        let mut ledgers: HashMap<String, PoolLedger> = HashMap::new();
        let mut events: Vec<CostAccrued> = Vec::new();
        let mut applied_in_order = Vec::new();
        for d in batch {
            // Leader elections: nothing to bill.
            let AnyEvent::Alloc(AllocEvent::Applied(applied)) = &d.event.data else {
                continue;
            };
            let pool = applied.pool.clone();
            let ledger = match ledgers.entry(pool.clone()) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => v.insert(self.ledger(&pool)?),
            };
            let mut costs = ledger.apply(&pool, applied, &self.prices, self.interval_ms);
            for e in costs.iter_mut().filter(|e| e.last) {
                if let Some(idle) = &mut e.idle {
                    // The samples counted while the lease was held; a lease granted in this
                    // batch has none yet.
                    let (samples, idle_samples): (i64, i64) = self
                        .conn
                        .query_row(
                            "SELECT coalesce(sum(samples), 0), coalesce(sum(idle_samples), 0)
                             FROM holdings WHERE pool = ?1 AND lease = ?2",
                            params![pool, e.lease.0 as i64],
                            |r| Ok((r.get(0)?, r.get(1)?)),
                        )
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
        for (pool, ledger) in &ledgers {
            let text = serde_json::to_string(ledger).expect("a ledger serializes");
            tx.execute(
                "INSERT INTO ledgers (pool, ledger) VALUES (?1, ?2)
                 ON CONFLICT (pool) DO UPDATE SET ledger = excluded.ledger",
                params![pool, text],
            )
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
        metrics::billed(&events, budgets.events.iter().map(|(_, b)| b));
        self.ledgers.extend(ledgers);
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
