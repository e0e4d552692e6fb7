//! Process runs: the task's `command` runs on this host, in a process group of its own, with
//! the granted GPUs made visible and its output in a log file.
//!
//! # What a task sees
//!
//! | variable | value |
//! |---|---|
//! | `CUDA_VISIBLE_DEVICES`, `NVIDIA_VISIBLE_DEVICES` | the granted GPUs' indices (`2,3`); empty for a CPU task |
//! | `CUDA_DEVICE_ORDER` | `PCI_BUS_ID`, so CUDA numbers GPUs as NVML (and Allot) does |
//! | `ALLOT_GPU_MILLI` | the share of each granted GPU, in thousandths (`250` for a quarter) |
//! | `ALLOT_WORKLOAD`, `ALLOT_TASK`, `ALLOT_ATTEMPT` | which task and attempt this is |
//! | `ALLOT_TASK_ID`, `ALLOT_LEASE` | the scheduler's ids, for logs |
//! | `ALLOT_NODE_RANK`, `ALLOT_NODES` | this node's rank and every node of the grant, for tasks spanning nodes |
//! | `ALLOT_CHECKPOINT_DIR` | a folder kept across preemptions and attempts of the task |
//! | `ALLOT_CHECKPOINT_FILE` | touch it after writing a checkpoint: the executor reports it |
//! | `ALLOT_RESUMED` | `1` when a checkpoint was reported before this run |
//!
//! # Stopping
//!
//! A preempted or cancelled run gets SIGTERM (the whole process group), then SIGKILL if it has
//! not exited after the grace period. It counts as checkpointed when it touched its checkpoint
//! file after the SIGTERM. A run past its max runtime is stopped the same way and fails.
//!
//! The `image` of a task is not used: this executor runs commands on the host.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, SystemTime};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::run::{End, Report, Reporter, RunContext, Stop};

/// How often the checkpoint file is looked at.
const CHECKPOINT_POLL: Duration = Duration::from_millis(250);

/// Where process runs keep their files, and how they are stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRuns {
    /// Log files: `<dir>/<workload>/<task>.<attempt>.<lease>[.rank<r>].log`.
    pub log_dir: PathBuf,
    /// Checkpoint folders: `<dir>/<workload>/<task>/`.
    pub checkpoint_dir: PathBuf,
    /// Time between SIGTERM and SIGKILL.
    pub grace: Duration,
}

/// A path component from a name that is already a subject token (`a-z`, digits, `-`, `_` …);
/// anything else is replaced, so no name can escape its folder.
fn component(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The last time `path` was modified, if it exists.
fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// `exit status 3`, `killed by signal 9`.
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

/// Sends `signal` to the process group led by `pid` (gone already: nothing to do).
pub fn signal_group(pid: u32, signal: Signal) {
    let _ = killpg(Pid::from_raw(pid as i32), signal);
}

impl ProcessRuns {
    /// The log file of `ctx`.
    fn log_path(&self, ctx: &RunContext) -> PathBuf {
        let launch = &ctx.dispatch.launch;
        let rank = if ctx.dispatch.nodes.len() > 1 {
            format!(".rank{}", ctx.rank)
        } else {
            String::new()
        };
        self.log_dir.join(component(&launch.workload)).join(format!(
            "{}.{}.{}{rank}.log",
            component(&launch.name),
            launch.run.attempt,
            ctx.dispatch.lease.0
        ))
    }

    fn command(
        &self,
        ctx: &RunContext,
        log: &Path,
        checkpoint_dir: &Path,
    ) -> std::io::Result<Command> {
        let launch = &ctx.dispatch.launch;
        let Some((program, args)) = launch.run.command.split_first() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the task has no command",
            ));
        };
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::create_dir_all(checkpoint_dir)?;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let gpus: Vec<String> = ctx.share.gpus.iter().map(|(g, _)| g.to_string()).collect();
        let milli: Vec<String> = ctx.share.gpus.iter().map(|(_, m)| m.to_string()).collect();
        let nodes: Vec<&str> = ctx.dispatch.nodes.iter().map(|n| n.node.as_str()).collect();
        let marker = checkpoint_dir.join("checkpointed");
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("CUDA_VISIBLE_DEVICES", gpus.join(","))
            .env("NVIDIA_VISIBLE_DEVICES", gpus.join(","))
            .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            .env("ALLOT_GPU_MILLI", milli.join(","))
            .env("ALLOT_WORKLOAD", &launch.workload)
            .env("ALLOT_TASK", &launch.name)
            .env("ALLOT_ATTEMPT", launch.run.attempt.to_string())
            .env("ALLOT_TASK_ID", ctx.dispatch.task.0.to_string())
            .env("ALLOT_LEASE", ctx.dispatch.lease.0.to_string())
            .env("ALLOT_NODE_RANK", ctx.rank.to_string())
            .env("ALLOT_NODES", nodes.join(","))
            .env("ALLOT_CHECKPOINT_DIR", checkpoint_dir)
            .env("ALLOT_CHECKPOINT_FILE", &marker)
            .env("ALLOT_RESUMED", if marker.exists() { "1" } else { "0" })
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .process_group(0)
            .kill_on_drop(false);
        Ok(cmd)
    }

    /// SIGTERM to the group, then SIGKILL after the grace period; whether it had to be killed.
    async fn terminate(&self, child: &mut Child, pid: u32) -> bool {
        signal_group(pid, Signal::SIGTERM);
        if tokio::time::timeout(self.grace, child.wait()).await.is_ok() {
            return false;
        }
        signal_group(pid, Signal::SIGKILL);
        let _ = child.wait().await;
        true
    }

    /// Runs `ctx` until it exits, is stopped, or exceeds its max runtime.
    pub async fn run(&self, ctx: RunContext, mut stop: oneshot::Receiver<Stop>, report: Reporter) {
        let launch = &ctx.dispatch.launch;
        let log = self.log_path(&ctx);
        let checkpoint_dir = self
            .checkpoint_dir
            .join(component(&launch.workload))
            .join(component(&launch.name));
        let marker = checkpoint_dir.join("checkpointed");
        let spawned = self
            .command(&ctx, &log, &checkpoint_dir)
            .and_then(|mut c| c.spawn());
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let program = launch.run.command.first().map_or("", String::as_str);
                report.send(Report::Ended(End::Failed(format!(
                    "could not start {program:?}: {e}"
                ))));
                return;
            }
        };
        let pid = child.id().unwrap_or_default();
        report.send(Report::Started {
            how: format!("process {pid}"),
            log: Some(log.display().to_string()),
            pid: Some(pid),
        });
        let started = Instant::now();
        let limit = launch
            .run
            .max_runtime_ms
            .map(|ms| started + Duration::from_millis(ms));
        let mut seen = modified(&marker);
        let mut poll = tokio::time::interval(CHECKPOINT_POLL);
        let end = loop {
            let limit_due = async {
                match limit {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                status = child.wait() => {
                    break match status {
                        Ok(s) if s.success() => End::Completed,
                        Ok(s) => End::Failed(describe(s)),
                        Err(e) => End::Failed(format!("waiting for the process failed: {e}")),
                    };
                }
                _ = poll.tick() => {
                    let now = modified(&marker);
                    if now.is_some() && now != seen {
                        seen = now;
                        report.send(Report::Checkpointed { progress_ms: None });
                    }
                }
                () = limit_due => {
                    self.terminate(&mut child, pid).await;
                    break End::Failed(format!(
                        "ran longer than its max runtime of {}",
                        humantime::format_duration(Duration::from_millis(
                            launch.run.max_runtime_ms.unwrap_or_default()
                        ))
                    ));
                }
                stop = &mut stop => {
                    // Compared by value, not against the clock: file times come from a coarse
                    // kernel clock that can lag the wall clock by a tick.
                    let before = modified(&marker);
                    let killed = self.terminate(&mut child, pid).await;
                    break match stop {
                        Ok(Stop::Cause(cause)) => End::Stopped {
                            cause,
                            checkpointed: modified(&marker).is_some_and(|m| Some(m) != before),
                            killed,
                            progress_ms: None,
                        },
                        Ok(Stop::Shutdown) | Err(_) => End::Abandoned { progress_ms: None },
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

    fn runs(dir: &Path, grace: Duration) -> ProcessRuns {
        ProcessRuns {
            log_dir: dir.join("logs"),
            checkpoint_dir: dir.join("checkpoints"),
            grace,
        }
    }

    fn sh(script: &str) -> RunSpec {
        RunSpec {
            attempt: 1,
            command: vec!["sh".into(), "-c".into(), script.into()],
            ..RunSpec::default()
        }
    }

    /// Runs `run`, sending `stop` once it has started (if any); every report.
    async fn go(runs: ProcessRuns, run: RunSpec, stop: Option<Stop>) -> Vec<Report> {
        let (report, mut reports) = Reporter::for_test();
        let (tx, rx) = oneshot::channel();
        let task =
            tokio::spawn(async move { runs.run(RunContext::for_test(run, 0), rx, report).await });
        let mut out = Vec::new();
        let mut tx = Some(tx);
        while let Some(r) = reports.recv().await {
            let log = match &r {
                Report::Started { log, .. } => log.clone(),
                _ => None,
            };
            let ended = matches!(r, Report::Ended(_));
            out.push(r);
            if let Some(log) = log
                && let Some(s) = stop
                && let Some(tx) = tx.take()
            {
                // A script that is to be stopped logs `trapped` once its trap is set: a signal
                // before then would end it at once, whatever its trap says.
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                while !std::fs::read_to_string(&log).is_ok_and(|t| t.contains("trapped")) {
                    assert!(std::time::Instant::now() < deadline, "no trap set in 20 s");
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                let _ = tx.send(s);
            }
            if ended {
                break;
            }
        }
        task.await.unwrap();
        out
    }

    fn end(reports: &[Report]) -> &End {
        match reports.last() {
            Some(Report::Ended(e)) => e,
            other => panic!("no end: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_process_sees_its_gpus_and_ids_and_writes_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let reports = go(
            runs(dir.path(), Duration::from_secs(5)),
            sh("echo gpus=$CUDA_VISIBLE_DEVICES milli=$ALLOT_GPU_MILLI task=$ALLOT_TASK attempt=$ALLOT_ATTEMPT rank=$ALLOT_NODE_RANK"),
            None,
        )
        .await;
        assert_eq!(end(&reports), &End::Completed);
        let Report::Started { log: Some(log), .. } = &reports[0] else {
            panic!("{reports:?}")
        };
        assert!(log.ends_with("logs/train-eval-1/train.1.3.log"), "{log}");
        let text = std::fs::read_to_string(log).unwrap();
        assert_eq!(
            text.trim(),
            "gpus=2,3 milli=1000,1000 task=train attempt=1 rank=0"
        );
    }

    #[tokio::test]
    async fn exits_and_start_errors_become_failures_with_the_reason() {
        struct Case {
            name: &'static str,
            run: RunSpec,
            want: &'static str,
        }
        let cases = [
            Case {
                name: "a non-zero exit",
                run: sh("echo broken >&2; exit 3"),
                want: "exit status 3",
            },
            Case {
                name: "a signal",
                run: sh("kill -9 $$"),
                want: "killed by signal 9",
            },
            Case {
                name: "a program that does not exist",
                run: RunSpec {
                    command: vec!["/nonexistent/train".into()],
                    ..RunSpec::default()
                },
                want: "could not start \"/nonexistent/train\"",
            },
            Case {
                name: "a run past its max runtime",
                run: RunSpec {
                    max_runtime_ms: Some(200),
                    ..sh("sleep 30")
                },
                want: "ran longer than its max runtime of 200ms",
            },
        ];
        for case in cases {
            let dir = tempfile::tempdir().unwrap();
            let reports = go(runs(dir.path(), Duration::from_secs(5)), case.run, None).await;
            match end(&reports) {
                End::Failed(why) => assert!(why.contains(case.want), "{}: {why}", case.name),
                other => panic!("{}: {other:?}", case.name),
            }
        }
    }

    #[tokio::test]
    async fn a_preempted_process_gets_sigterm_then_sigkill_after_the_grace() {
        struct Case {
            name: &'static str,
            script: &'static str,
            want_killed: bool,
            want_checkpointed: bool,
        }
        let cases = [
            Case {
                name: "checkpoints on SIGTERM and exits",
                script: "trap 'touch \"$ALLOT_CHECKPOINT_FILE\"; exit 0' TERM; echo trapped; while :; do sleep 0.05; done",
                want_killed: false,
                want_checkpointed: true,
            },
            Case {
                name: "exits on SIGTERM without a checkpoint",
                script: "trap 'exit 0' TERM; echo trapped; while :; do sleep 0.05; done",
                want_killed: false,
                want_checkpointed: false,
            },
            Case {
                name: "ignores SIGTERM: killed after the grace",
                script: "trap '' TERM; echo trapped; while :; do sleep 0.05; done",
                want_killed: true,
                want_checkpointed: false,
            },
        ];
        for case in cases {
            let dir = tempfile::tempdir().unwrap();
            let reports = go(
                runs(dir.path(), Duration::from_millis(500)),
                sh(case.script),
                Some(Stop::Cause(StopCause::Preempted)),
            )
            .await;
            assert_eq!(
                end(&reports),
                &End::Stopped {
                    cause: StopCause::Preempted,
                    checkpointed: case.want_checkpointed,
                    killed: case.want_killed,
                    progress_ms: None,
                },
                "{}",
                case.name
            );
        }
    }

    #[tokio::test]
    async fn touching_the_checkpoint_file_reports_a_checkpoint_and_the_next_run_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let reports = go(
            runs(dir.path(), Duration::from_secs(5)),
            sh("echo resumed=$ALLOT_RESUMED; sleep 0.1; touch \"$ALLOT_CHECKPOINT_FILE\"; sleep 0.6"),
            None,
        )
        .await;
        assert!(
            reports.contains(&Report::Checkpointed { progress_ms: None }),
            "{reports:?}"
        );
        let again = go(
            runs(dir.path(), Duration::from_secs(5)),
            sh("echo resumed=$ALLOT_RESUMED"),
            None,
        )
        .await;
        let Report::Started { log: Some(log), .. } = &again[0] else {
            panic!("{again:?}")
        };
        let text = std::fs::read_to_string(log).unwrap();
        assert!(text.ends_with("resumed=1\n"), "{text}");
    }
}
