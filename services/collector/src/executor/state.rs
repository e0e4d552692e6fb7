//! The executor's state in SQLite: the runs it started and has not yet reported the end of, how
//! far each simulated task got (its last checkpoint), and how far it read the journal.
//!
//! A run's end is written here, in one transaction with what it does to the task's progress,
//! before it is published, and the run is deleted only once JetStream acknowledged the end: an
//! executor that stops or crashes in between publishes the same event again after its restart,
//! in the order the ends were recorded, under the same event id, and JetStream drops the copy.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use allot_events::alloc::{Dispatch, NodeGrant};
use allot_sched::{LeaseId, TaskId};
use allot_store::rusqlite::{Connection, OptionalExtension, params};
use allot_store::{StoreError, rusqlite};

/// The schema; never edit a shipped script, add one.
const MIGRATIONS: &[&str] = &[
    "
CREATE TABLE runs (
    lease      INTEGER PRIMARY KEY,
    task       INTEGER NOT NULL,
    dispatch   TEXT NOT NULL,          -- the grant (Dispatch JSON)
    share      TEXT NOT NULL,          -- this node's share (NodeGrant JSON)
    rank       INTEGER NOT NULL,
    started_ms INTEGER NOT NULL,       -- wall clock, ms since the epoch
    pid        INTEGER,                -- the process group leader, for process runs
    outcome    TEXT                    -- the end event (AnyEvent JSON) once known, until published
) STRICT;

-- Work done by a simulated task at its last checkpoint, ms of run time.
CREATE TABLE progress (
    task    INTEGER PRIMARY KEY,
    done_ms INTEGER NOT NULL
) STRICT;
",
    "
-- The order in which outcomes were recorded, so they are published again in that order.
ALTER TABLE runs ADD COLUMN ended INTEGER;
",
    "
-- The next outcome's number is one more than the highest, found without reading every run.
CREATE INDEX runs_ended ON runs (ended);
",
];

/// The consumer name positions are recorded under.
const CONSUMER: &str = "journal";

/// What a run's end does to its task's progress (simulated runs resume from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Leave it as it is.
    Keep,
    /// The run kept this much work, ms of task time.
    Set(u64),
    /// The task is done: nothing to resume.
    Forget,
}

/// A run as stored.
#[derive(Debug, Clone)]
pub struct StoredRun {
    /// The grant.
    pub dispatch: Dispatch,
    /// This node's share.
    pub share: NodeGrant,
    /// This node's rank among the grant's nodes.
    pub rank: usize,
    /// When it started, ms since the epoch.
    pub started_ms: u64,
    /// Its process group, for process runs.
    pub pid: Option<u32>,
    /// Its end event, if known and not yet published.
    pub outcome: Option<String>,
}

/// The executor's database.
#[derive(Debug)]
pub struct State {
    // A mutex so the executor (which awaits publishes while holding `&State`) stays `Sync`;
    // only its loop uses it, so it is never contended.
    conn: Mutex<Connection>,
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("plain data serializes")
}

impl State {
    /// Opens (or creates) the database at `path`; `None`: in memory, for an executor that keeps
    /// nothing across restarts.
    pub fn open(path: Option<&Path>) -> Result<State, StoreError> {
        let conn = match path {
            Some(p) => allot_store::open(p, MIGRATIONS)?,
            None => allot_store::open_in_memory(MIGRATIONS)?,
        };
        Ok(State {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding it left nothing half-written: SQLite rolled back.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The journal position read up to, if any.
    pub fn position(&self) -> Result<Option<u64>, StoreError> {
        Ok(allot_store::position(&self.conn(), CONSUMER)?)
    }

    /// Records that the journal was read up to `seq`.
    pub fn set_position(&self, seq: u64) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        allot_store::record_position(&tx, CONSUMER, seq)?;
        tx.commit()?;
        Ok(())
    }

    /// Records runs started by the journal message at `seq`, and the position, in one
    /// transaction.
    pub fn started(&self, seq: u64, runs: &[StoredRun]) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for run in runs {
            tx.execute(
                "INSERT OR IGNORE INTO runs (lease, task, dispatch, share, rank, started_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    run.dispatch.lease.0 as i64,
                    run.dispatch.task.0 as i64,
                    json(&run.dispatch),
                    json(&run.share),
                    run.rank as i64,
                    run.started_ms as i64,
                ],
            )?;
        }
        allot_store::record_position(&tx, CONSUMER, seq)?;
        tx.commit()?;
        Ok(())
    }

    /// Records the process group of a run.
    pub fn set_pid(&self, lease: LeaseId, pid: u32) -> Result<(), StoreError> {
        self.conn().execute(
            "UPDATE runs SET pid = ?2 WHERE lease = ?1",
            params![lease.0 as i64, i64::from(pid)],
        )?;
        Ok(())
    }

    /// Records the end of the run under `lease` of `task`, in one transaction with its
    /// `progress`: its end event (`outcome`), kept until [`State::forget`] after the event was
    /// acknowledged, or, with nothing to report, the run is forgotten at once.
    pub fn ended(
        &self,
        lease: LeaseId,
        task: TaskId,
        progress: Progress,
        outcome: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        match progress {
            Progress::Keep => {}
            Progress::Set(done_ms) => set_progress(&tx, task, done_ms)?,
            Progress::Forget => {
                tx.execute("DELETE FROM progress WHERE task = ?1", [task.0 as i64])?;
            }
        }
        match outcome {
            Some(event) => tx.execute(
                "UPDATE runs SET outcome = ?2,
                     ended = (SELECT COALESCE(MAX(ended), 0) + 1 FROM runs)
                 WHERE lease = ?1",
                params![lease.0 as i64, event],
            )?,
            None => tx.execute("DELETE FROM runs WHERE lease = ?1", [lease.0 as i64])?,
        };
        tx.commit()?;
        Ok(())
    }

    /// Forgets a run whose end was acknowledged (or that needs no report).
    pub fn forget(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.conn()
            .execute("DELETE FROM runs WHERE lease = ?1", [lease.0 as i64])?;
        Ok(())
    }

    /// Every stored run: first those whose end awaits its acknowledgement, in the order the
    /// ends were recorded, then those in progress, by lease.
    pub fn runs(&self) -> Result<Vec<StoredRun>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT dispatch, share, rank, started_ms, pid, outcome FROM runs
             ORDER BY ended IS NULL, ended, lease",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, Option<i64>>(4)?,
                r.get::<_, Option<String>>(5)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (dispatch, share, rank, started_ms, pid, outcome) = row?;
            let corrupt = |e: serde_json::Error| {
                StoreError::Sqlite(rusqlite::Error::FromSqlConversionFailure(
                    0,
                    rusqlite::types::Type::Text,
                    Box::new(e),
                ))
            };
            out.push(StoredRun {
                dispatch: serde_json::from_str(&dispatch).map_err(corrupt)?,
                share: serde_json::from_str(&share).map_err(corrupt)?,
                rank: rank as usize,
                started_ms: started_ms as u64,
                pid: pid.map(|p| p as u32),
                outcome,
            });
        }
        Ok(out)
    }

    /// Work a simulated task had done at its last checkpoint, ms.
    pub fn progress(&self, task: TaskId) -> Result<u64, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT done_ms FROM progress WHERE task = ?1",
                [task.0 as i64],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
            .map_or(0, |d| d as u64))
    }

    /// Records a simulated task's checkpoint.
    pub fn set_progress(&self, task: TaskId, done_ms: u64) -> Result<(), StoreError> {
        set_progress(&self.conn(), task, done_ms)?;
        Ok(())
    }
}

fn set_progress(conn: &Connection, task: TaskId, done_ms: u64) -> Result<(), rusqlite::Error> {
    conn.execute(
        "INSERT INTO progress (task, done_ms) VALUES (?1, ?2)
         ON CONFLICT (task) DO UPDATE SET done_ms = excluded.done_ms",
        params![task.0 as i64, done_ms as i64],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_events::alloc::Launch;

    fn run(lease: u64) -> StoredRun {
        let share = NodeGrant {
            node: "n1".into(),
            gpu_model: "H100".into(),
            gpus: vec![(1, 1000)],
            mig: None,
            cpu_milli: 0,
            memory_mib: 0,
        };
        StoredRun {
            dispatch: Dispatch {
                task: TaskId(lease + 100),
                lease: LeaseId(lease),
                launch: Launch {
                    workload: "w".into(),
                    name: "t".into(),
                    team: String::new(),
                    run: Default::default(),
                },
                nodes: vec![share.clone()],
            },
            share,
            rank: 0,
            started_ms: 5,
            pid: None,
            outcome: None,
        }
    }

    #[test]
    fn runs_survive_a_reopen_with_their_position_pid_and_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("executor.db");
        {
            let s = State::open(Some(&path)).unwrap();
            assert_eq!(s.position().unwrap(), None);
            s.started(7, &[run(1), run(2)]).unwrap();
            s.set_pid(LeaseId(1), 4242).unwrap();
            s.ended(LeaseId(2), TaskId(102), Progress::Keep, Some("{}"))
                .unwrap();
            s.set_progress(TaskId(101), 900).unwrap();
            // A redelivered start is recorded once.
            s.started(7, &[run(1)]).unwrap();
        }
        let s = State::open(Some(&path)).unwrap();
        assert_eq!(s.position().unwrap(), Some(7));
        let runs = s.runs().unwrap();
        assert_eq!(runs.len(), 2);
        // The end awaiting its acknowledgement comes first.
        assert_eq!(runs[0].dispatch.lease, LeaseId(2));
        assert_eq!(runs[0].outcome.as_deref(), Some("{}"));
        assert_eq!(runs[1].pid, Some(4242));
        assert_eq!(s.progress(TaskId(101)).unwrap(), 900);
        assert_eq!(s.progress(TaskId(102)).unwrap(), 0);
        s.forget(LeaseId(1)).unwrap();
        assert_eq!(s.runs().unwrap().len(), 1);
    }

    #[test]
    fn ends_come_back_in_the_order_they_were_recorded_until_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("executor.db");
        {
            let s = State::open(Some(&path)).unwrap();
            s.started(3, &[run(1), run(2), run(3), run(4)]).unwrap();
            s.set_progress(TaskId(103), 500).unwrap();
            s.ended(LeaseId(3), TaskId(103), Progress::Forget, Some("end of 3"))
                .unwrap();
            s.ended(
                LeaseId(1),
                TaskId(101),
                Progress::Set(700),
                Some("end of 1"),
            )
            .unwrap();
            // Nothing to report (a rank other than 0 completed): forgotten at once.
            s.ended(LeaseId(4), TaskId(104), Progress::Keep, None)
                .unwrap();
        }
        let s = State::open(Some(&path)).unwrap();
        let order: Vec<(u64, Option<String>)> = s
            .runs()
            .unwrap()
            .into_iter()
            .map(|r| (r.dispatch.lease.0, r.outcome))
            .collect();
        assert_eq!(
            order,
            vec![
                (3, Some("end of 3".into())),
                (1, Some("end of 1".into())),
                (2, None),
            ]
        );
        assert_eq!(s.progress(TaskId(103)).unwrap(), 0);
        assert_eq!(s.progress(TaskId(101)).unwrap(), 700);
        s.forget(LeaseId(3)).unwrap();
        s.started(4, &[run(5)]).unwrap();
        s.ended(LeaseId(5), TaskId(105), Progress::Keep, Some("end of 5"))
            .unwrap();
        let order: Vec<u64> = s
            .runs()
            .unwrap()
            .iter()
            .map(|r| r.dispatch.lease.0)
            .collect();
        assert_eq!(order, vec![1, 5, 2]);
    }
}
