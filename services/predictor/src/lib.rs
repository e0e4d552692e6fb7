//! The predictor: learns how long tasks run from the ones that finished, and publishes a
//! prediction for every task as soon as the planner announces it (`allot.task.predicted.<pool>`).
//!
//! # What it believes, and when
//!
//! One durable consumer reads the task lifecycle (`allot.task.>` in WORKLOADS):
//!
//! | event | what the predictor does |
//! |---|---|
//! | ready / preload (the first of them for an attempt) | predicts its run time from what finished before, publishes `TaskPredicted` |
//! | started | the run's clock starts (the server's time of the event) |
//! | stopped (preempted, cancelled) | the run's time is added to the attempt's |
//! | completed / failed | the attempt ran its runs' total: one more training sample |
//! | cancelled | it will not finish: no sample |
//!
//! A failed run counts like a completed one: what the scheduler weighs is how long a task
//! holds its GPUs, and the retry (a new attempt of the same task) is predicted from it. The
//! outcome and the reason are kept beside the run time.
//!
//! # Exactly once
//!
//! Every attempt is a row of `predictor.db` — its features known at submission (team, the
//! task's identity across runs, GPUs, declared estimate), the prediction as published, its run
//! time and outcome once it ends — written in the same transaction as the consumer's stream
//! position. A prediction is published (and its acknowledgement awaited) before that
//! transaction, under an id derived from the attempt: a crash in between publishes it again
//! under the same id, which JetStream drops within WORKLOADS' duplicate window. The model
//! lives in memory and is rebuilt at start from the stored history, replayed in time order:
//! the same history, the same model. Versions are stored, so a rebuilt model gets the next one.
//!
//! # Retraining
//!
//! [`allot_predict::Predictor`] retrains when enough new history arrived (the first
//! `min_samples`, then a tenth more than the last model saw), and this service also retrains
//! on a schedule ([`Config::retrain_every`]) whenever anything was learned since. Until a model
//! exists each prediction names the fallback it used: the declared estimate, the team's
//! statistics, everyone's, or nothing at all (`default`).
//!
//! # What tasks use of their GPUs, and right-sizing
//!
//! Two more consumers ([`usage`]) keep the fleet's GPUs (FLEET registrations) and what GPU
//! telemetry (TELEMETRY) saw of each run: peak GPU memory, mean utilization, samples — split
//! by share where runs share a GPU. With a price table ([`Config::prices`]) every prediction
//! also carries a right-sizing recommendation (`TaskPredicted::right_size`): the cheapest GPU
//! model of the task's pool and the smallest share of it that held the task's last finished
//! runs ([`allot_predict::rightsize`]). `allot predict report` shows them per task, `allot
//! explain` per attempt; the planner applies one only to a task whose spec opts in.
//!
//! # Who it is believed by
//!
//! Only the `predictor` user may publish on `allot.task.predicted.*` (the server enforces it),
//! and the consumers check that an event's content matches its subject. The allocator journals
//! a prediction before its scheduler weighs the task by it, so `allot replay --verify` reads
//! predictions and never runs a model.
//!
//! `metrics` counts the predictions published by pool and basis (`allot_predictions_total`).

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::FutureExt;
use uuid::Uuid;

use allot_bus::consumer::{ConsumerRunner, ConsumerSpec, Delivery, Handler, HandlerError, Outcome};
use allot_bus::streams::names;
use allot_bus::{BusError, ConnectConfig, Publisher};
use allot_events::task::TaskPredicted;
use allot_events::{AnyEvent, Envelope, TaskEvent, subject};
use allot_predict::rightsize::Request;
use allot_predict::{Job, Prediction, Predictor, TrainParams};
use allot_prices::PriceTable;
use allot_runtime::Service;
use allot_sched::{LeaseId, TaskId, TaskSpec};
use allot_store::Projection;
use allot_store::rusqlite::{Connection, OptionalExtension, Transaction, params};

mod metrics;
pub mod report;
pub mod usage;

/// The `source` of the predictor's events.
pub const SOURCE: &str = "/allot/predictor";
/// The namespace of prediction event ids (UUIDv5 of `predicted/<task id>`).
pub const EVENT_ID_NAMESPACE: Uuid = Uuid::from_u128(0x4f1b_9e27_c3d8_4a65_b0f2_7d19_e8a3_5c60);

/// How many finished runs a restart reads back: as many as the predictor keeps.
const REBUILD_RUNS: i64 = 50_000;

const MIGRATIONS: &[&str] = &[
    "
-- Every attempt announced (ready or preloaded): what was known at submission, the prediction
-- published for it, and its run time once it ended.
CREATE TABLE tasks (
    task          INTEGER PRIMARY KEY,
    pool          TEXT NOT NULL,
    workload      TEXT NOT NULL,
    name          TEXT NOT NULL,
    attempt       INTEGER,           -- unknown while only preloaded
    team          TEXT NOT NULL,
    identity      TEXT NOT NULL,     -- <team>/<workload name>/<task name>
    gpus          INTEGER NOT NULL,
    gpu_milli     INTEGER NOT NULL,
    declared_ms   INTEGER,           -- the spec's durationEstimate
    submit_ms     INTEGER NOT NULL,
    prediction    TEXT NOT NULL,     -- the TaskPredicted published (JSON)
    run_since_ms  INTEGER,           -- the current run's start
    ran_ms        INTEGER NOT NULL DEFAULT 0,  -- earlier runs of the attempt (preempted)
    outcome       TEXT,              -- completed, failed, cancelled
    reason        TEXT,
    finished_ms   INTEGER
) STRICT;
CREATE INDEX tasks_finished ON tasks (finished_ms);

-- Every model trained: its version, when, and on how many runs.
CREATE TABLE models (
    version       INTEGER PRIMARY KEY,
    trained_at_ms INTEGER NOT NULL,
    trained_on    INTEGER NOT NULL
) STRICT;
",
    "
-- What each attempt asked for beyond GPUs (right-sizing compares against it).
ALTER TABLE tasks ADD COLUMN gpu_models TEXT NOT NULL DEFAULT '[]';  -- JSON array
ALTER TABLE tasks ADD COLUMN mig_profile TEXT;
-- Right-sizing and the report read a task key's attempts.
CREATE INDEX tasks_identity ON tasks (identity, finished_ms);

-- Each run of an attempt (TaskStarted): the lease and node its telemetry names.
CREATE TABLE runs (
    task   INTEGER NOT NULL,
    lease  INTEGER NOT NULL,
    node   TEXT NOT NULL,
    PRIMARY KEY (task, lease)
) STRICT;

-- The fleet's GPUs (the FLEET consumer, from registrations).
CREATE TABLE gpus (
    node              TEXT NOT NULL,
    gpu               INTEGER NOT NULL,
    pool              TEXT NOT NULL,
    model             TEXT NOT NULL,
    memory_total_mib  INTEGER NOT NULL,
    PRIMARY KEY (node, gpu)
) STRICT;

-- What telemetry charged to each run on each GPU (the TELEMETRY consumer); by what the
-- samples name, joined to attempts through runs when read.
CREATE TABLE usage (
    workload          TEXT NOT NULL,
    name              TEXT NOT NULL,
    lease             INTEGER NOT NULL,
    node              TEXT NOT NULL,
    gpu               INTEGER NOT NULL,
    samples           INTEGER NOT NULL,
    peak_memory_mib   INTEGER NOT NULL,  -- its share of the GPU's used memory, at most
    util_samples      INTEGER NOT NULL,  -- samples with a utilization reading
    util_sum          REAL NOT NULL,     -- its share of the GPU's utilization, summed (%)
    memory_total_mib  INTEGER NOT NULL,
    PRIMARY KEY (workload, name, lease, node, gpu)
) STRICT;
",
    "
-- Right-sizing prices a pool's GPU models for every task announced: each model's largest
-- memory, read from this index a model at a time (usage::offers) instead of every GPU.
CREATE INDEX gpus_pool_model ON gpus (pool, model, memory_total_mib);
",
];

/// The predictor's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// NATS URL(s).
    pub nats_url: String,
    /// Folder for `predictor.db`.
    pub data_dir: PathBuf,
    /// The durable consumer's name (also its position's key).
    pub consumer: String,
    /// Retrain at least this often while new runs keep finishing.
    pub retrain_every: Duration,
    /// How the model learns.
    pub params: TrainParams,
    /// The price table right-sizing compares GPU models by; `None`: no recommendations.
    pub prices: Option<PriceTable>,
}

impl Config {
    /// Defaults: consumer `predictor`, retrained at least every 10 minutes.
    pub fn new(nats_url: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            nats_url: nats_url.into(),
            data_dir: data_dir.into(),
            consumer: "predictor".into(),
            retrain_every: Duration::from_secs(600),
            params: TrainParams::default(),
            prices: None,
        }
    }

    /// The database file.
    pub fn db_path(&self) -> PathBuf {
        self.data_dir.join("predictor.db")
    }
}

/// Why the predictor stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bus failed.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The database failed.
    #[error("predictor database: {0}")]
    Store(#[from] allot_store::StoreError),
    /// The stored history could not be read back.
    #[error("predictor database: {0}")]
    Sqlite(#[from] allot_store::rusqlite::Error),
    /// One of its tasks failed or panicked: the task's name and why.
    #[error("{0}")]
    Stopped(Box<allot_runtime::Stopped<Error>>),
}

/// The event id of the prediction for `task`.
pub fn event_id(task: TaskId) -> Uuid {
    Uuid::new_v5(
        &EVENT_ID_NAMESPACE,
        format!("predicted/{}", task.0).as_bytes(),
    )
}

/// The task's identity across runs ([`allot_events::task::task_key`]): the same task of the
/// same workload submitted again by the same team.
pub fn identity(team: &str, workload: &str, name: &str) -> String {
    allot_events::task::task_key(team, workload, name)
}

/// Runs the predictor until `shutdown`.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mut service = Service::new("predictor", shutdown);
    let client = allot_bus::connect(
        &ConnectConfig::new(&config.nats_url, "allot-predictor"),
        service.stopping(),
    )
    .await?;
    service.drain_on_stop(client.clone());
    let conn = open(&config)?;
    let handler = Predicting::rebuild(
        conn,
        config.consumer.clone(),
        Publisher::new(client.clone(), SOURCE),
        config.params,
        config.retrain_every,
        config.prices.clone(),
    )?;
    let spec = ConsumerSpec {
        filter_subjects: vec![subject::TASK_ALL.into()],
        ..ConsumerSpec::new(names::WORKLOADS, config.consumer.clone())
    };
    service.spawn(
        format!("consumer {}", names::WORKLOADS),
        ConsumerRunner::new(client.clone(), spec, handler)
            .with_gate(service.gate(format!("consumer {}", names::WORKLOADS)))
            .run(service.stopping())
            .map(|r| r.map(drop).map_err(Error::from)),
    );
    // GPU use: each consumer with its own connection and position.
    let fleet = Projection::new(
        open(&config)?,
        format!("{}-fleet", config.consumer),
        "predictor",
        usage::apply_registration,
    );
    let fleet_spec = ConsumerSpec {
        filter_subjects: vec![subject::node_registered("*")],
        ..ConsumerSpec::new(names::FLEET, fleet.consumer())
    };
    service.spawn(
        format!("consumer {}", names::FLEET),
        ConsumerRunner::new(client.clone(), fleet_spec, fleet)
            .with_gate(service.gate(format!("consumer {}", names::FLEET)))
            .run(service.stopping())
            .map(|r| r.map(drop).map_err(Error::from)),
    );
    let telemetry = Projection::new(
        open(&config)?,
        format!("{}-telemetry", config.consumer),
        "predictor",
        usage::apply_sample,
    );
    // Samples only add up here (each run's peak memory and utilization).
    let telemetry_spec = ConsumerSpec::new(names::TELEMETRY, telemetry.consumer()).summing();
    service.spawn(
        format!("consumer {}", names::TELEMETRY),
        ConsumerRunner::new(client.clone(), telemetry_spec, telemetry)
            .with_gate(service.gate(format!("consumer {}", names::TELEMETRY)))
            .run(service.stopping())
            .map(|r| r.map(drop).map_err(Error::from)),
    );
    service.run().await.map_err(|s| Error::Stopped(Box::new(s)))
}

/// Opens (and migrates) `predictor.db`.
fn open(config: &Config) -> Result<Connection, Error> {
    Ok(allot_store::open(&config.db_path(), MIGRATIONS)?)
}

/// Opens an existing `predictor.db` read-only, for reports.
pub fn open_read_only(path: &std::path::Path) -> Result<Connection, allot_store::rusqlite::Error> {
    Connection::open_with_flags(
        path,
        allot_store::rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
            | allot_store::rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
}

/// The consumer's handler: the database and the model built from it.
struct Predicting {
    conn: Connection,
    consumer: String,
    publisher: Publisher,
    predictor: Predictor,
    retrain_every: Duration,
    trained: Instant,
    prices: Option<PriceTable>,
}

/// An attempt as the planner announced it (ready or preloaded).
struct Announced<'a> {
    pool: &'a str,
    workload: &'a str,
    name: &'a str,
    /// Which attempt (a preload does not say; its ready will).
    attempt: Option<u32>,
    spec: &'a TaskSpec,
    /// The spec's `durationEstimate`, ms.
    declared_ms: Option<u64>,
}

/// One attempt as stored.
struct Stored {
    task: u64,
    job: Job,
    ran_ms: Option<u64>,
    finished_ms: Option<u64>,
}

impl Predicting {
    /// The handler, its model rebuilt from the stored history: submissions and finishes
    /// replayed in time order, then one training.
    fn rebuild(
        conn: Connection,
        consumer: String,
        publisher: Publisher,
        params: TrainParams,
        retrain_every: Duration,
        prices: Option<PriceTable>,
    ) -> Result<Self, Error> {
        let mut predictor = Predictor::new(params);
        let rows: Vec<Stored> = conn
            .prepare(
                "SELECT task, team, identity, gpus, gpu_milli, submit_ms, declared_ms,
                        CASE WHEN outcome IN ('completed', 'failed') THEN ran_ms END, finished_ms
                 FROM tasks
                 WHERE outcome IS NULL OR task IN (
                     SELECT task FROM tasks WHERE outcome IN ('completed', 'failed')
                     ORDER BY finished_ms DESC LIMIT ?1)
                 ORDER BY submit_ms, task",
            )?
            .query_map([REBUILD_RUNS], |r| {
                Ok(Stored {
                    task: r.get::<_, i64>(0)? as u64,
                    job: Job {
                        team: r.get(1)?,
                        identity: Some(r.get(2)?),
                        gpus: r.get(3)?,
                        gpu_milli: r.get(4)?,
                        submit_ms: r.get::<_, i64>(5)? as u64,
                        declared_ms: r.get::<_, Option<i64>>(6)?.map(|v| v as u64),
                    },
                    ran_ms: r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
                    finished_ms: r.get::<_, Option<i64>>(8)?.map(|v| v as u64),
                })
            })?
            .collect::<Result<_, _>>()?;
        // Submissions in order, each finish placed at its time among them.
        let mut finishes: Vec<&Stored> = rows.iter().filter(|s| s.ran_ms.is_some()).collect();
        finishes.sort_by_key(|s| (s.finished_ms, s.task));
        let mut next = finishes.iter().peekable();
        for s in &rows {
            while let Some(f) = next.next_if(|f| f.finished_ms.unwrap_or(0) <= s.job.submit_ms) {
                predictor.finished(f.task, &f.job, f.ran_ms.unwrap_or(0));
            }
            predictor.submitted(s.task, &s.job);
        }
        for f in next {
            predictor.finished(f.task, &f.job, f.ran_ms.unwrap_or(0));
        }
        let last: Option<i64> = conn
            .query_row("SELECT max(version) FROM models", [], |r| r.get(0))
            .optional()?
            .flatten();
        predictor.continue_versions(last.unwrap_or(0) as u64);
        let mut handler = Self {
            conn,
            consumer,
            publisher,
            predictor,
            retrain_every,
            trained: Instant::now(),
            prices,
        };
        handler.retrain(now_ms())?;
        tracing::info!(
            runs = finishes.len(),
            model = ?handler.predictor.model().map(|m| m.version),
            "predictor started"
        );
        Ok(handler)
    }

    /// Trains a model on the history so far, if there is enough of it, and records it.
    fn retrain(&mut self, at_ms: u64) -> Result<(), allot_store::rusqlite::Error> {
        self.trained = Instant::now();
        let Some(version) = self.predictor.retrain() else {
            return Ok(());
        };
        let on = self.predictor.model().map_or(0, |m| m.trained_on);
        self.conn.execute(
            "INSERT OR REPLACE INTO models (version, trained_at_ms, trained_on)
                 VALUES (?1, ?2, ?3)",
            params![version as i64, at_ms as i64, on as i64],
        )?;
        tracing::info!(version, trained_on = on, "model trained");
        Ok(())
    }

    /// Predicts a newly announced attempt and publishes the prediction; `None` if it was
    /// predicted before (a preload, then its ready; a redelivery).
    async fn announced(&mut self, d: &Delivery, a: Announced<'_>) -> Result<(), HandlerError> {
        let known: bool = self
            .conn
            .query_row(
                "SELECT 1 FROM tasks WHERE task = ?1",
                [a.spec.id.0 as i64],
                |_| Ok(true),
            )
            .optional()
            .map_err(db)?
            .is_some();
        if known {
            // Preloaded first: the ready says which attempt it is.
            let tx = self.conn.transaction().map_err(db)?;
            if let Some(attempt) = a.attempt {
                tx.execute(
                    "UPDATE tasks SET attempt = ?2 WHERE task = ?1",
                    params![a.spec.id.0 as i64, attempt],
                )
                .map_err(db)?;
            }
            allot_store::record_position(&tx, &self.consumer, d.stream_sequence).map_err(db)?;
            return tx.commit().map_err(db);
        }
        let Announced {
            pool,
            workload,
            name,
            attempt,
            spec,
            declared_ms,
        } = a;
        let job = Job {
            team: spec.team.clone(),
            identity: Some(identity(&spec.team, workload, name)),
            gpus: spec.gpus,
            gpu_milli: spec.gpu_milli,
            submit_ms: published_ms(d),
            declared_ms,
        };
        let prediction = self.predictor.predict(&job);
        let mut event = predicted(pool, workload, name, spec.id, prediction);
        if let (Some(prices), Some(identity)) = (&self.prices, &job.identity) {
            let request = Request {
                gpus: spec.gpus,
                gpu_milli: spec.gpu_milli,
                mig_profile: spec.mig_profile.clone(),
            };
            let advice =
                usage::recommend(&self.conn, identity, pool, &request, prices, job.submit_ms)
                    .map_err(db)?;
            match advice {
                Ok(r) => event.right_size = Some(r),
                Err(why) => {
                    tracing::debug!(task = %spec.id, identity, %why, "no right-sizing");
                }
            }
        }
        let mut envelope = Envelope::new(SOURCE, TaskEvent::Predicted(event.clone()));
        envelope.id = event_id(spec.id);
        envelope.team = Some(spec.team.clone());
        self.publisher
            .publish_envelope(&envelope)
            .await
            .map_err(|e| HandlerError::transient(format!("publishing a prediction: {e}")))?;
        metrics::published(&event.pool, event.basis);
        let text = serde_json::to_string(&event).expect("a prediction serializes");
        let tx = self.conn.transaction().map_err(db)?;
        tx.execute(
            "INSERT INTO tasks (task, pool, workload, name, attempt, team, identity, gpus,
                 gpu_milli, declared_ms, submit_ms, prediction, gpu_models, mig_profile)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
            params![
                spec.id.0 as i64,
                pool,
                workload,
                name,
                attempt,
                job.team,
                job.identity,
                job.gpus,
                job.gpu_milli,
                job.declared_ms.map(|v| v as i64),
                job.submit_ms as i64,
                text,
                serde_json::to_string(&spec.gpu_models).expect("a list of names serializes"),
                spec.mig_profile
            ],
        )
        .map_err(db)?;
        allot_store::record_position(&tx, &self.consumer, d.stream_sequence).map_err(db)?;
        tx.commit().map_err(db)?;
        // The model learns of it only once it is stored: a retried batch cannot count it twice.
        self.predictor.submitted(spec.id.0, &job);
        tracing::debug!(task = %spec.id, workload, name, point_ms = prediction.point_ms, basis = prediction.basis.as_str(), "predicted");
        Ok(())
    }

    /// Records that `seq` was applied, with nothing else to change.
    fn applied(&mut self, seq: u64) -> Result<(), HandlerError> {
        let tx = self.conn.transaction().map_err(db)?;
        allot_store::record_position(&tx, &self.consumer, seq).map_err(db)?;
        tx.commit().map_err(db)
    }

    /// Applies a run's event to its attempt's row (`change` in the transaction that records
    /// the position); the finished run it returns, if any, is learned after the commit.
    fn on_run(
        &mut self,
        seq: u64,
        change: impl FnOnce(&Transaction<'_>) -> Result<Option<(u64, Job, u64)>, HandlerError>,
    ) -> Result<(), HandlerError> {
        let tx = self.conn.transaction().map_err(db)?;
        let finished = change(&tx)?;
        allot_store::record_position(&tx, &self.consumer, seq).map_err(db)?;
        tx.commit().map_err(db)?;
        if let Some((task, job, ran)) = finished {
            self.predictor.finished(task, &job, ran);
        }
        Ok(())
    }
}

impl Handler for Predicting {
    fn resume_after(&mut self) -> Result<Option<u64>, HandlerError> {
        let position = allot_store::position(&self.conn, &self.consumer).map_err(db)?;
        Ok(Some(position.unwrap_or(0)))
    }

    async fn handle(&mut self, batch: &[Delivery]) -> Result<Vec<Outcome>, HandlerError> {
        let mut done = allot_store::position(&self.conn, &self.consumer)
            .map_err(db)?
            .unwrap_or(0);
        let mut outcomes = Vec::with_capacity(batch.len());
        for d in batch {
            outcomes.push(Outcome::Handled);
            // At or below the position, or a redelivered copy of one earlier in the batch (a
            // process paused past its ack wait reads both): applied already.
            if d.stream_sequence <= done {
                continue;
            }
            done = d.stream_sequence;
            let at = published_ms(d);
            let seq = d.stream_sequence;
            let AnyEvent::Task(event) = &d.event.data else {
                self.applied(seq)?;
                continue;
            };
            match event {
                TaskEvent::Ready(r) => {
                    let declared = r.run.duration_ms;
                    let attempt = r.run.attempt.max(1);
                    let a = Announced {
                        pool: &r.pool,
                        workload: &r.workload,
                        name: &r.name,
                        attempt: Some(attempt),
                        spec: &r.task,
                        declared_ms: declared,
                    };
                    self.announced(d, a).await?;
                }
                TaskEvent::Preload(p) => {
                    // The planner's spec carries the declared estimate as its prediction.
                    let declared = p.task.predicted_duration;
                    let a = Announced {
                        pool: &p.pool,
                        workload: &p.workload,
                        name: &p.name,
                        attempt: None,
                        spec: &p.task,
                        declared_ms: declared,
                    };
                    self.announced(d, a).await?;
                }
                TaskEvent::Started(s) => self.on_run(seq, |tx| {
                    tx.execute(
                        "UPDATE tasks SET run_since_ms = coalesce(run_since_ms, ?2)
                         WHERE task = ?1 AND outcome IS NULL",
                        params![s.task.0 as i64, at as i64],
                    )
                    .map_err(db)?;
                    // Telemetry names the run by its lease and node.
                    tx.execute(
                        "INSERT OR IGNORE INTO runs (task, lease, node) VALUES (?1, ?2, ?3)",
                        params![s.task.0 as i64, s.lease.0 as i64, s.node],
                    )
                    .map_err(db)?;
                    Ok(None)
                })?,
                TaskEvent::Stopped(s) => self.on_run(seq, |tx| {
                    // A stopped run that was superseded already (a move's old run, stopping
                    // while the new one started) adds its time without ending the new run.
                    let sql = if superseded(tx, s.task, s.lease)? {
                        "UPDATE tasks SET ran_ms = ran_ms + ?2
                         WHERE task = ?1 AND outcome IS NULL"
                    } else {
                        "UPDATE tasks SET ran_ms = ran_ms + ?2, run_since_ms = NULL
                         WHERE task = ?1 AND outcome IS NULL AND run_since_ms IS NOT NULL"
                    };
                    tx.execute(sql, params![s.task.0 as i64, s.ran_ms as i64])
                        .map_err(db)?;
                    Ok(None)
                })?,
                TaskEvent::Completed(c) => {
                    self.on_run(seq, |tx| ended(tx, c.task, c.lease, "completed", None, at))?;
                }
                TaskEvent::Failed(f) => {
                    let reason = Some(f.reason.as_str());
                    self.on_run(seq, |tx| ended(tx, f.task, f.lease, "failed", reason, at))?;
                }
                TaskEvent::Cancelled(c) => {
                    let task = c.task;
                    self.on_run(seq, |tx| {
                        tx.execute(
                            "UPDATE tasks SET outcome = 'cancelled', reason = ?2, finished_ms = ?3
                             WHERE task = ?1 AND outcome IS NULL",
                            params![task.0 as i64, c.reason, at as i64],
                        )
                        .map_err(db)?;
                        Ok(None)
                    })?;
                    self.predictor.withdrawn(task.0);
                }
                TaskEvent::Checkpointed(_) | TaskEvent::Predicted(_) => self.applied(seq)?,
            }
        }
        let now = batch.last().map_or_else(now_ms, published_ms);
        if self.predictor.retrain_due()
            || (self.predictor.fresh() > 0 && self.trained.elapsed() >= self.retrain_every)
        {
            self.retrain(now).map_err(db)?;
        }
        Ok(outcomes)
    }
}

/// Ends attempt `task`'s row (`how`: completed, failed) at `at` with the report of run
/// `lease`; the run to learn from, if its run was seen starting.
///
/// A report of a [`superseded`] run is ignored: the attempt goes on.
fn ended(
    tx: &Transaction<'_>,
    task: TaskId,
    lease: LeaseId,
    how: &str,
    reason: Option<&str>,
    at: u64,
) -> Result<Option<(u64, Job, u64)>, HandlerError> {
    if superseded(tx, task, Some(lease))? {
        return Ok(None);
    }
    let row = tx
        .query_row(
            "SELECT team, identity, gpus, gpu_milli, submit_ms, declared_ms, ran_ms, run_since_ms
             FROM tasks WHERE task = ?1 AND outcome IS NULL",
            [task.0 as i64],
            |r| {
                Ok((
                    Job {
                        team: r.get(0)?,
                        identity: Some(r.get(1)?),
                        gpus: r.get(2)?,
                        gpu_milli: r.get(3)?,
                        submit_ms: r.get::<_, i64>(4)? as u64,
                        declared_ms: r.get::<_, Option<i64>>(5)?.map(|v| v as u64),
                    },
                    r.get::<_, i64>(6)? as u64,
                    r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
                ))
            },
        )
        .optional()
        .map_err(db)?;
    // Unknown (announced before the predictor's history began), or already ended.
    let Some((job, earlier, since)) = row else {
        return Ok(None);
    };
    // A run never seen starting (its start predates the history) teaches nothing.
    let ran = since.map(|since| earlier + at.saturating_sub(since));
    tx.execute(
        "UPDATE tasks SET outcome = ?2, reason = ?3, finished_ms = ?4, ran_ms = ?5,
             run_since_ms = NULL
         WHERE task = ?1",
        params![
            task.0 as i64,
            how,
            reason,
            at as i64,
            ran.unwrap_or(earlier) as i64
        ],
    )
    .map_err(db)?;
    Ok(ran.map(|ran| (task.0, job, ran)))
}

/// Whether a report about run `lease` of `task` is late news of a run superseded since: a
/// newer run (leases only grow) was seen starting — as a moved task's old run reports its stop
/// and end within its grace period, after the new run began. The allocator, which journals
/// only the running lease's end, ignores such reports too. A report naming no lease (from an
/// executor older than the field) is taken as it comes.
fn superseded(
    tx: &Transaction<'_>,
    task: TaskId,
    lease: Option<LeaseId>,
) -> Result<bool, HandlerError> {
    let Some(lease) = lease else {
        return Ok(false);
    };
    // Asked for every completion, failure and stop: the statement is parsed once.
    let newest: Option<i64> = tx
        .prepare_cached("SELECT max(lease) FROM runs WHERE task = ?1")
        .and_then(|mut s| s.query_row([task.0 as i64], |r| r.get(0)))
        .map_err(db)?;
    Ok(newest.is_some_and(|newest| newest != lease.0 as i64))
}

/// The event for `task`'s `prediction`.
fn predicted(
    pool: &str,
    workload: &str,
    name: &str,
    task: TaskId,
    prediction: Prediction,
) -> TaskPredicted {
    TaskPredicted {
        pool: pool.to_owned(),
        task,
        workload: workload.to_owned(),
        name: name.to_owned(),
        duration_ms: prediction.point_ms,
        p10_ms: prediction.p10_ms,
        p90_ms: prediction.p90_ms,
        model_version: prediction.model_version,
        basis: prediction.basis,
        right_size: None,
    }
}

/// When the server stored the message: one clock for every producer.
fn published_ms(d: &Delivery) -> u64 {
    d.published.timestamp_millis().max(0) as u64
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn db(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::transient(format!("predictor database: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_is_the_same_task_across_submissions_of_its_workload() {
        assert_eq!(
            identity("vision", "train-eval-3f9a2c71d0", "train"),
            "vision/train-eval/train"
        );
        // Not a derived id: the whole of it.
        assert_eq!(identity("nlp", "sweep-xyz", "eval"), "nlp/sweep-xyz/eval");
    }
}
