//! The executor against a real nats-server and a real SQLite store: how a run ended reaches the
//! WORKLOADS stream exactly once, even when the server is down as the run ends and the executor
//! is then stopped, gracefully or abruptly.
//!
//! Each executor runs on a runtime of its own, so a test can drop it the way SIGKILL would: its
//! tasks vanish at whatever await they were at, and only what is in SQLite survives.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use allot_bus::async_nats::{self, jetstream};
use allot_bus::streams::names;
use allot_bus::{ConnectConfig, Publisher};
use allot_collector::executor::state::State;
use allot_collector::executor::{self, ExecutorError};
use allot_collector::{ExecutorConfig, ProcessRuns, Runs, SimulatedRuns};
use allot_events::alloc::{Applied, Dispatch, Launch, NodeGrant};
use allot_events::task::RunSpec;
use allot_events::{AllocEvent, AnyEvent, TaskEvent, decode};
use allot_sched::journal::Entry;
use allot_sched::{Decision, Input, LeaseId, TaskId};
use allot_testkit::NatsServer;
use allot_testkit::streams::read_all;
use anyhow::{Context as _, bail};
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const NODE: &str = "n1";
const POOL: &str = "train";
/// How long a test waits for something it expects.
const PATIENCE: Duration = Duration::from_secs(20);
/// How long a stopped executor may take to return (its grace period is 2 s for simulated runs
/// and the process grace plus 2 s for processes).
const STOP_WITHIN: Duration = Duration::from_secs(10);

/// An executor on a runtime of its own.
struct Node {
    runtime: Option<Runtime>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), ExecutorError>>,
}

impl Node {
    /// Starts the executor of [`NODE`] with its database at `db`.
    fn start(url: &str, db: &Path, runs: Runs) -> anyhow::Result<Node> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let (stop, stopped) = watch::channel(false);
        let connect = ConnectConfig::new(url, "allot-executor-test");
        let config = ExecutorConfig {
            runs,
            state: Some(db.to_path_buf()),
            shared_checkpoints: None,
        };
        let task = runtime.spawn(async move {
            let client = allot_bus::connect(&connect, std::future::pending())
                .await
                .expect("the server is up");
            executor::run(
                client,
                NODE.into(),
                POOL.into(),
                config,
                None,
                Default::default(),
                stopped,
            )
            .await
        });
        Ok(Node {
            runtime: Some(runtime),
            stop,
            task,
        })
    }

    /// Stops it gracefully; fails if it takes longer than [`STOP_WITHIN`] or returns an error.
    async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        let stopped = tokio::time::timeout(STOP_WITHIN, &mut self.task)
            .await
            .context("the executor did not stop within its grace period")?;
        stopped??;
        Ok(())
    }

    /// Drops it without a word, as SIGKILL would.
    fn crash(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn share(node: &str, gpu: u32) -> NodeGrant {
    NodeGrant {
        node: node.into(),
        gpu_model: "H100".into(),
        gpus: vec![(gpu, 1000)],
        mig: None,
        cpu_milli: 1000,
        memory_mib: 1024,
    }
}

/// A grant of task `task` under lease `lease` on GPU `gpu` of [`NODE`].
fn grant(task: u64, lease: u64, gpu: u32, run: RunSpec) -> Dispatch {
    Dispatch {
        task: TaskId(task),
        lease: LeaseId(lease),
        launch: Launch {
            workload: "train-eval-1".into(),
            name: format!("t{task}"),
            team: String::new(),
            run,
        },
        nodes: vec![share(NODE, gpu)],
    }
}

/// The same grant on another node.
fn grant_elsewhere(task: u64, lease: u64, node: &str) -> Dispatch {
    Dispatch {
        nodes: vec![share(node, 0)],
        ..grant(task, lease, 0, RunSpec::default())
    }
}

/// Publishes a pool journal entry granting `dispatch`, as the allocator would.
async fn publish_grants(
    client: &async_nats::Client,
    dispatch: Vec<Dispatch>,
) -> anyhow::Result<()> {
    publish_entry(client, vec![], dispatch).await
}

/// Publishes a pool journal entry preempting task `task` under lease `lease`.
async fn publish_preemption(
    client: &async_nats::Client,
    task: u64,
    lease: u64,
) -> anyhow::Result<()> {
    let preempted = Decision::Preempted {
        task: TaskId(task),
        lease: LeaseId(lease),
        at: 2,
        for_task: None,
        lost: 0,
        reason: "room for a higher priority".into(),
    };
    publish_entry(client, vec![preempted], vec![]).await
}

/// Publishes a pool journal entry, as the allocator would.
async fn publish_entry(
    client: &async_nats::Client,
    decisions: Vec<Decision>,
    dispatch: Vec<Dispatch>,
) -> anyhow::Result<()> {
    let applied = Applied {
        pool: POOL.into(),
        source: None,
        entry: Entry {
            seq: 1,
            input: Input::Schedule { at: 1 },
            decisions,
            rejected: None,
        },
        launch: None,
        dispatch,
    };
    Publisher::new(client.clone(), "/allot/allocator/test")
        .publish(AllocEvent::Applied(applied))
        .await?;
    Ok(())
}

async fn connect(server: &NatsServer) -> anyhow::Result<async_nats::Client> {
    let client = async_nats::connect(server.url()).await?;
    allot_bus::ensure_streams(&jetstream::new(client.clone()), &allot_bus::catalog(1)).await?;
    Ok(client)
}

/// Every task event in WORKLOADS, in order.
async fn task_events(client: &async_nats::Client) -> anyhow::Result<Vec<TaskEvent>> {
    let mut out = Vec::new();
    for message in read_all(client, names::WORKLOADS).await {
        if let AnyEvent::Task(event) = decode(&message.payload)?.data {
            out.push(event);
        }
    }
    Ok(out)
}

/// `started 7`, `completed 7`, `failed 7: why`: how a task event reads in an assertion.
fn describe(event: &TaskEvent) -> Option<String> {
    Some(match event {
        TaskEvent::Started(e) => format!("started {}", e.task.0),
        TaskEvent::Completed(e) => format!("completed {}", e.task.0),
        TaskEvent::Failed(e) => format!("failed {}: {}", e.task.0, e.reason),
        TaskEvent::Stopped(e) => format!("stopped {}", e.task.0),
        _ => return None,
    })
}

/// The ends (completed, failed, stopped) of tasks in WORKLOADS, in order.
async fn ends(client: &async_nats::Client) -> anyhow::Result<Vec<String>> {
    Ok(task_events(client)
        .await?
        .iter()
        .filter_map(describe)
        .filter(|e| !e.starts_with("started"))
        .collect())
}

/// Waits until WORKLOADS holds `started <task>` for every task of `tasks`.
async fn wait_started(client: &async_nats::Client, tasks: &[u64]) -> anyhow::Result<()> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let seen: Vec<String> = task_events(client)
            .await?
            .iter()
            .filter_map(describe)
            .collect();
        if tasks.iter().all(|t| seen.contains(&format!("started {t}"))) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("waited {PATIENCE:?} for tasks {tasks:?} to start; WORKLOADS has {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until a run has created `path`, which it does when it has done `what`.
async fn wait_for_file(path: &Path, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + PATIENCE;
    while !path.exists() {
        if Instant::now() > deadline {
            bail!("waited {PATIENCE:?} for {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Ok(())
}

/// The leases the executor has on record and whether each has its end recorded.
fn on_record(db: &Path) -> anyhow::Result<Vec<(u64, bool)>> {
    Ok(State::open(Some(db))?
        .runs()?
        .iter()
        .map(|r| (r.dispatch.lease.0, r.outcome.is_some()))
        .collect())
}

/// Waits until `done` holds for what the executor has on record; `false` after [`PATIENCE`].
async fn wait_on_record(db: &Path, done: impl Fn(&[(u64, bool)]) -> bool) -> anyhow::Result<bool> {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if done(&on_record(db)?) {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Ok(false)
}

/// Waits until the executor has forgotten every run (all ends acknowledged), then returns the
/// ends in WORKLOADS: nothing is published after that, so they are the final count.
async fn final_ends(client: &async_nats::Client, db: &Path) -> anyhow::Result<Vec<String>> {
    let forgotten = wait_on_record(db, <[_]>::is_empty).await?;
    let ends = ends(client).await?;
    if !forgotten {
        bail!(
            "the executor still has {:?} on record after {PATIENCE:?}; WORKLOADS has {ends:?}",
            on_record(db)?
        );
    }
    Ok(ends)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_that_could_not_be_published_survives_a_stop() -> anyhow::Result<()> {
    let mut server = NatsServer::start();
    let client = connect(&server).await?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("executor.db");
    let sim = Runs::Simulated(SimulatedRuns {
        speedup: 1.0,
        default_duration: Duration::from_secs(1),
    });

    let node = Node::start(&server.url(), &db, sim.clone())?;
    // Three seconds: long enough to stop the server before it completes.
    let run = RunSpec {
        duration_ms: Some(3_000),
        ..RunSpec::default()
    };
    publish_grants(&client, vec![grant(7, 70, 0, run)]).await?;
    wait_started(&client, &[7]).await?;

    server.kill();
    let ended = wait_on_record(&db, |runs| runs == [(70, true)]).await?;
    assert!(
        ended,
        "the run's end should be on record while the server is down; have {:?}",
        on_record(&db)?
    );
    node.stop().await?;
    assert_eq!(
        on_record(&db)?,
        vec![(70, true)],
        "a graceful stop must leave an unacknowledged end on record"
    );

    server.restart();
    let client = connect(&server).await?;
    let node = Node::start(&server.url(), &db, sim)?;
    let ends = final_ends(&client, &db).await?;
    node.stop().await?;
    assert_eq!(ends, vec!["completed 7"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_that_ended_before_an_abrupt_stop_are_reported_as_they_ended_once()
-> anyhow::Result<()> {
    let mut server = NatsServer::start();
    let client = connect(&server).await?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("executor.db");
    let processes = Runs::Process(ProcessRuns {
        log_dir: dir.path().join("logs"),
        checkpoint_dir: dir.path().join("checkpoints"),
        grace: Duration::from_secs(1),
    });
    // Both runs exit 0 once the test creates the gate, which it does while the server is down.
    let gate: PathBuf = dir.path().join("gate");
    let wait_for_gate = RunSpec {
        attempt: 1,
        command: vec![
            "sh".into(),
            "-c".into(),
            format!("while [ ! -e '{}' ]; do sleep 0.05; done", gate.display()),
        ],
        ..RunSpec::default()
    };

    let node = Node::start(&server.url(), &db, processes.clone())?;
    publish_grants(
        &client,
        vec![
            grant(7, 70, 0, wait_for_gate.clone()),
            grant(8, 80, 1, wait_for_gate),
        ],
    )
    .await?;
    wait_started(&client, &[7, 8]).await?;

    server.kill();
    std::fs::write(&gate, "")?;
    // Both runs have exited and their ends are being published in vain; give the executor
    // (a bounded) time to record them, then drop it mid-publish. Without their ends on record,
    // a restarted executor can only report the runs as lost.
    wait_on_record(&db, |runs| {
        runs.len() == 2 && runs.iter().all(|(_, ended)| *ended)
    })
    .await?;
    node.crash();

    server.restart();
    let client = connect(&server).await?;
    let node = Node::start(&server.url(), &db, processes)?;
    let mut ends = final_ends(&client, &db).await?;
    node.stop().await?;
    ends.sort();
    assert_eq!(ends, vec!["completed 7", "completed 8"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_ends_while_the_executor_stops_is_reported_before_it_returns()
-> anyhow::Result<()> {
    let server = NatsServer::start();
    let client = connect(&server).await?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("executor.db");
    let processes = Runs::Process(ProcessRuns {
        log_dir: dir.path().join("logs"),
        checkpoint_dir: dir.path().join("checkpoints"),
        grace: Duration::from_secs(3),
    });
    // Preempted, it takes a second to exit: it ends while the executor is stopping. It says
    // when its trap is set: a run reported started may not have set it yet, and a TERM before
    // then ends it at once.
    let trapping = dir.path().join("trapping");
    let termed = dir.path().join("termed");
    let slow_to_stop = RunSpec {
        attempt: 1,
        command: vec![
            "sh".into(),
            "-c".into(),
            format!(
                "trap 'touch \"{}\"; sleep 1; exit 0' TERM; touch \"{}\"; while :; do sleep 0.05; done",
                termed.display(),
                trapping.display()
            ),
        ],
        ..RunSpec::default()
    };

    let node = Node::start(&server.url(), &db, processes.clone())?;
    publish_grants(&client, vec![grant(7, 70, 0, slow_to_stop)]).await?;
    wait_started(&client, &[7]).await?;
    wait_for_file(&trapping, "the run to set its trap").await?;
    publish_preemption(&client, 7, 70).await?;
    wait_for_file(&termed, "the run to be told to stop").await?;
    node.stop().await?;
    assert_eq!(ends(&client).await?, vec!["stopped 7"]);
    assert_eq!(on_record(&db)?, vec![], "an acknowledged end is forgotten");

    // A later start has nothing left to say about it.
    let node = Node::start(&server.url(), &db, processes)?;
    let ends = final_ends(&client, &db).await?;
    node.stop().await?;
    assert_eq!(ends, vec!["stopped 7"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_made_while_the_executor_was_down_is_run_when_it_is_back() -> anyhow::Result<()> {
    let server = NatsServer::start();
    let client = connect(&server).await?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("executor.db");
    let sim = Runs::Simulated(SimulatedRuns::default());

    // It has only read an entry about another node when it stops.
    let node = Node::start(&server.url(), &db, sim.clone())?;
    publish_grants(&client, vec![grant_elsewhere(1, 10, "n2")]).await?;
    let deadline = Instant::now() + PATIENCE;
    while State::open(Some(&db))?.position()?.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    node.stop().await?;

    publish_grants(&client, vec![grant(7, 70, 0, RunSpec::default())]).await?;
    // Longer than the few seconds before its own start an executor without a position reads.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let node = Node::start(&server.url(), &db, sim)?;
    let started = wait_started(&client, &[7]).await;
    node.stop().await?;
    started
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_run_resumed_after_a_crash_is_started_and_ended_once() -> anyhow::Result<()> {
    let server = NatsServer::start();
    let client = connect(&server).await?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("executor.db");
    let sim = Runs::Simulated(SimulatedRuns {
        speedup: 1.0,
        default_duration: Duration::from_secs(1),
    });
    let run = RunSpec {
        duration_ms: Some(2_000),
        ..RunSpec::default()
    };
    let node = Node::start(&server.url(), &db, sim.clone())?;
    publish_grants(&client, vec![grant(7, 70, 0, run)]).await?;
    wait_started(&client, &[7]).await?;
    // SIGKILLed mid-run: the next executor resumes the run from what is on record.
    node.crash();
    let node = Node::start(&server.url(), &db, sim)?;
    final_ends(&client, &db).await?;
    node.stop().await?;
    let events: Vec<String> = task_events(&client)
        .await?
        .iter()
        .filter_map(describe)
        .collect();
    assert_eq!(
        events,
        ["started 7", "completed 7"],
        "a resumed run is the same run: one start, one end"
    );
    Ok(())
}
