//! What a run is told and what it reports, whichever way it runs.

use allot_events::alloc::{Dispatch, NodeGrant};
use allot_events::task::StopCause;
use allot_sched::LeaseId;
use tokio::sync::mpsc;

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// The node it runs on.
    pub node: String,
    /// The grant.
    pub dispatch: Dispatch,
    /// This node's share of it.
    pub share: NodeGrant,
    /// This node's rank among the grant's nodes.
    pub rank: usize,
    /// Work done before this run (a simulated task's last checkpoint), ms of task time.
    pub progress_ms: u64,
}

impl RunContext {
    #[cfg(test)]
    pub(crate) fn for_test(run: allot_events::task::RunSpec, progress_ms: u64) -> RunContext {
        let share = NodeGrant {
            node: "n1".into(),
            gpu_model: "H100".into(),
            gpus: vec![(2, 1000), (3, 1000)],
            mig: None,
            cpu_milli: 1000,
            memory_mib: 1024,
        };
        RunContext {
            node: "n1".into(),
            dispatch: Dispatch {
                task: allot_sched::TaskId(7),
                lease: LeaseId(3),
                launch: allot_events::alloc::Launch {
                    workload: "train-eval-1".into(),
                    name: "train".into(),
                    team: String::new(),
                    run,
                },
                nodes: vec![share.clone()],
            },
            share,
            rank: 0,
            progress_ms,
        }
    }
}

/// Why a run is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The allocator took its resources back.
    Cause(StopCause),
    /// The executor is shutting down: stop it, report nothing (the run stays on record, and
    /// the next start of the executor settles it).
    Shutdown,
}

/// Something a run reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// It started.
    Started {
        /// `simulated (60x)`, `process 4242`.
        how: String,
        /// Its log file.
        log: Option<String>,
        /// Its process group.
        pid: Option<u32>,
    },
    /// It checkpointed.
    Checkpointed {
        /// Work done so far, ms of task time (simulated runs).
        progress_ms: Option<u64>,
    },
    /// It ended.
    Ended(End),
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// It exited successfully.
    Completed,
    /// It failed (exit status, signal, could not start, ran too long).
    Failed(String),
    /// It was stopped.
    Stopped {
        /// Why.
        cause: StopCause,
        /// It checkpointed before exiting.
        checkpointed: bool,
        /// It did not exit within the grace period and was killed.
        killed: bool,
        /// Work kept, ms of task time (simulated runs).
        progress_ms: Option<u64>,
    },
    /// Stopped for the executor's shutdown: nothing to report; the run stays on record and
    /// the next start of the executor settles it.
    Abandoned {
        /// Work kept, ms of task time (simulated runs that checkpoint on SIGTERM).
        progress_ms: Option<u64>,
    },
}

/// Where a run sends its reports: the executor's loop, tagged with the run's lease.
#[derive(Debug, Clone)]
pub struct Reporter {
    lease: LeaseId,
    tx: mpsc::UnboundedSender<(LeaseId, Report)>,
}

impl Reporter {
    /// A reporter for the run under `lease`.
    pub fn new(lease: LeaseId, tx: mpsc::UnboundedSender<(LeaseId, Report)>) -> Reporter {
        Reporter { lease, tx }
    }

    /// Sends `report` (dropped if the executor is gone).
    pub fn send(&self, report: Report) {
        let _ = self.tx.send((self.lease, report));
    }

    #[cfg(test)]
    pub(crate) fn for_test() -> (Reporter, TestReports) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Reporter::new(LeaseId(3), tx), TestReports(rx))
    }
}

/// The reports a test run sent.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct TestReports(mpsc::UnboundedReceiver<(LeaseId, Report)>);

#[cfg(test)]
impl TestReports {
    pub(crate) fn try_recv(&mut self) -> Result<Report, mpsc::error::TryRecvError> {
        self.0.try_recv().map(|(_, r)| r)
    }

    pub(crate) async fn recv(&mut self) -> Option<Report> {
        self.0.recv().await.map(|(_, r)| r)
    }
}
