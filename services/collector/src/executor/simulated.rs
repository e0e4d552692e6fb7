//! Simulated runs: a task "runs" for its duration estimate, divided by a speed-up factor, and
//! checkpoints on schedule. Nothing is executed. This is what the simulated cluster of
//! `allot up` uses, so pipelines submitted to it progress, get preempted and finish.
//!
//! Time inside a simulated run is task time: a speed-up of 60 runs a `45m` estimate in 45 s of
//! wall time, and checkpoints every `10m` become every 10 s. A preempted task resumes from its
//! last checkpoint (or from where it stopped, when it checkpoints on SIGTERM) if it runs on this
//! node again, or on any node sharing checkpoint storage with this one
//! ([`crate::ExecutorConfig::shared_checkpoints`]; `allot up`'s nodes do); otherwise it starts
//! over on another node.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::run::{End, Report, Reporter, RunContext, Stop};

/// How simulated runs behave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimulatedRuns {
    /// Task time per wall time (`60`: a minute of task time per second).
    pub speedup: f64,
    /// Task time of a task without a duration estimate.
    pub default_duration: Duration,
}

impl Default for SimulatedRuns {
    /// A speed-up of 60, and 5 minutes for tasks without an estimate.
    fn default() -> Self {
        Self {
            speedup: 60.0,
            default_duration: Duration::from_secs(300),
        }
    }
}

impl SimulatedRuns {
    /// Wall time for `task_ms` of task time.
    fn wall(&self, task_ms: u64) -> Duration {
        Duration::from_secs_f64(task_ms as f64 / 1000.0 / self.speedup.max(f64::MIN_POSITIVE))
    }

    /// Task time for `wall` of wall time, ms.
    fn task_ms(&self, wall: Duration) -> u64 {
        (wall.as_secs_f64() * 1000.0 * self.speedup) as u64
    }

    /// Runs `ctx` until it completes, is stopped, or exceeds its max runtime.
    pub async fn run(&self, ctx: RunContext, mut stop: oneshot::Receiver<Stop>, report: Reporter) {
        let run = &ctx.dispatch.launch.run;
        let total = run
            .duration_ms
            .unwrap_or(self.default_duration.as_millis() as u64);
        let before = ctx.progress_ms.min(total);
        report.send(Report::Started {
            how: format!("simulated ({}x)", self.speedup),
            log: None,
            pid: None,
        });
        let started = Instant::now();
        let done_at = started + self.wall(total - before);
        let limit = run.max_runtime_ms.map(|ms| started + self.wall(ms));
        let mut saved = before;
        let every = run.checkpoint_every_ms.map(|ms| self.wall(ms.max(1)));
        let mut next_checkpoint = every.map(|e| started + e);
        let end = loop {
            let checkpoint_due = async {
                match next_checkpoint {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let limit_due = async {
                match limit {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(done_at) => break End::Completed,
                () = checkpoint_due => {
                    saved = before + self.task_ms(started.elapsed());
                    next_checkpoint = every.map(|e| Instant::now() + e);
                    report.send(Report::Checkpointed { progress_ms: Some(saved) });
                }
                () = limit_due => {
                    break End::Failed(format!(
                        "ran longer than its max runtime of {}",
                        humantime::format_duration(Duration::from_millis(
                            run.max_runtime_ms.unwrap_or_default()
                        ))
                    ));
                }
                stop = &mut stop => {
                    // A task that checkpoints saves its state on SIGTERM, whoever sends it.
                    let progress = if run.checkpoint {
                        before + self.task_ms(started.elapsed())
                    } else {
                        saved
                    };
                    break match stop {
                        Ok(Stop::Cause(cause)) => End::Stopped {
                            cause,
                            checkpointed: run.checkpoint,
                            killed: false,
                            progress_ms: Some(progress),
                        },
                        Ok(Stop::Shutdown) | Err(_) => End::Abandoned {
                            progress_ms: Some(progress),
                        },
                    };
                }
            }
        };
        report.send(Report::Ended(end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_events::task::{RunSpec, StopCause};

    fn ctx(run: RunSpec, progress_ms: u64) -> RunContext {
        RunContext::for_test(run, progress_ms)
    }

    async fn outcome(
        sim: SimulatedRuns,
        ctx: RunContext,
        stop_after: Option<Duration>,
    ) -> Vec<Report> {
        outcome_of(sim, ctx, stop_after, Stop::Cause(StopCause::Preempted)).await
    }

    async fn outcome_of(
        sim: SimulatedRuns,
        ctx: RunContext,
        stop_after: Option<Duration>,
        how: Stop,
    ) -> Vec<Report> {
        let (report, mut reports) = Reporter::for_test();
        let (tx, rx) = oneshot::channel();
        let run = tokio::spawn(async move { sim.run(ctx, rx, report).await });
        if let Some(after) = stop_after {
            tokio::time::sleep(after).await;
            let _ = tx.send(how);
        } else {
            std::mem::forget(tx);
        }
        run.await.unwrap();
        let mut out = Vec::new();
        while let Ok(r) = reports.try_recv() {
            out.push(r);
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_lasts_its_estimate_over_the_speedup_and_checkpoints_on_schedule() {
        let sim = SimulatedRuns {
            speedup: 60.0,
            default_duration: Duration::from_secs(60),
        };
        let run = RunSpec {
            duration_ms: Some(600_000),
            checkpoint: true,
            checkpoint_every_ms: Some(240_000),
            ..RunSpec::default()
        };
        let start = Instant::now();
        let reports = outcome(sim, ctx(run, 0), None).await;
        // 10 minutes of task time at 60x: 10 s.
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        let checkpoints: Vec<_> = reports
            .iter()
            .filter_map(|r| match r {
                Report::Checkpointed { progress_ms } => *progress_ms,
                _ => None,
            })
            .collect();
        assert_eq!(checkpoints, vec![240_000, 480_000]);
        assert!(matches!(
            reports.last(),
            Some(Report::Ended(End::Completed))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_run_keeps_its_progress_only_if_it_checkpoints() {
        struct Case {
            name: &'static str,
            checkpoint: bool,
            every: Option<u64>,
            before: u64,
            want_progress: u64,
        }
        let cases = [
            Case {
                name: "checkpoints on SIGTERM: keeps all it did",
                checkpoint: true,
                every: None,
                before: 0,
                want_progress: 180_000,
            },
            Case {
                name: "no checkpoints: loses everything",
                checkpoint: false,
                every: None,
                before: 0,
                want_progress: 0,
            },
            Case {
                name: "resumed from a checkpoint, stopped before the next: back to it",
                checkpoint: false,
                every: Some(600_000),
                before: 60_000,
                want_progress: 60_000,
            },
        ];
        for case in cases {
            let sim = SimulatedRuns {
                speedup: 60.0,
                default_duration: Duration::from_secs(60),
            };
            let run = RunSpec {
                duration_ms: Some(3_600_000),
                checkpoint: case.checkpoint,
                checkpoint_every_ms: case.every,
                ..RunSpec::default()
            };
            let reports = outcome(sim, ctx(run, case.before), Some(Duration::from_secs(3))).await;
            match reports.last() {
                Some(Report::Ended(End::Stopped {
                    cause: StopCause::Preempted,
                    progress_ms,
                    checkpointed,
                    ..
                })) => {
                    assert_eq!(*progress_ms, Some(case.want_progress), "{}", case.name);
                    assert_eq!(*checkpointed, case.checkpoint, "{}", case.name);
                }
                other => panic!("{}: {other:?}", case.name),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_stopped_for_shutdown_keeps_what_a_preempted_one_would() {
        // The executor's next start resumes it from there.
        for (checkpoint, want_progress) in [(true, 180_000), (false, 60_000)] {
            let sim = SimulatedRuns::default();
            let run = RunSpec {
                duration_ms: Some(3_600_000),
                checkpoint,
                ..RunSpec::default()
            };
            let reports = outcome_of(
                sim,
                ctx(run, 60_000),
                Some(Duration::from_secs(2)),
                Stop::Shutdown,
            )
            .await;
            assert_eq!(
                reports.last(),
                Some(&Report::Ended(End::Abandoned {
                    progress_ms: Some(want_progress)
                })),
                "checkpoints on SIGTERM: {checkpoint}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_past_its_max_runtime_fails() {
        let sim = SimulatedRuns::default();
        let run = RunSpec {
            duration_ms: Some(7_200_000),
            max_runtime_ms: Some(3_600_000),
            ..RunSpec::default()
        };
        let reports = outcome(sim, ctx(run, 0), None).await;
        assert!(
            matches!(reports.last(), Some(Report::Ended(End::Failed(why))) if why.contains("max runtime of 1h")),
            "{reports:?}"
        );
    }
}
