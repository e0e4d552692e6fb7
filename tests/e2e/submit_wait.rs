//! `allot submit --wait` and `--follow` as a CI job runs them: the binary against a real
//! nats-server, with the allocator and the planner running in this process and a stand-in
//! executor that runs every grant it reads in the journal (the collector's executor is not
//! there yet) — it reports the run started, then completed or failed.

use std::process::Output;

use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::pull::OrderedConfig};
use futures::StreamExt;

use allot_bus::{Publisher, catalog, ensure_streams};
use allot_events::task::{TaskCompleted, TaskFailed, TaskStarted};
use allot_events::{AllocEvent, AnyEvent, NodeEvent, TaskEvent, decode};
use allot_testkit::{NatsServer, node};

use crate::support::allot;

const POOL: &str = "default";

/// CPU preprocessing → a gang of two 2-GPU trainers → a 1-GPU evaluation.
const PIPELINE: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: train-eval, team: vision}
spec:
  tasks:
    - name: preprocess
      resources: {cpu: "4", memory: 8Gi}
      command: [python, prep.py]
    - name: train-0
      resources: {gpus: 2, cpu: "4"}
      command: [torchrun, train.py]
      after: [preprocess]
      gang: train
    - name: train-1
      resources: {gpus: 2, cpu: "4"}
      command: [torchrun, train.py]
      after: [preprocess]
      gang: train
    - name: eval
      resources: {gpus: 1}
      command: [python, eval.py]
      after: [train-0, train-1]
"#;

/// A step that keeps failing, retried once, and a GPU step after it.
const FLAKY: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: flaky, team: vision}
spec:
  tasks:
    - name: prep
      resources: {cpu: "1"}
      command: [python, prep.py]
      retry: {maxAttempts: 2, backoff: 10ms}
    - name: train
      resources: {gpus: 1}
      command: [python, train.py]
      after: [prep]
"#;

/// What the stand-in executor does with a granted run, by task name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Complete,
    Fail,
    /// Keep running for ever.
    Hold,
}

/// nats-server, one 4-GPU node, the allocator, the planner and a stand-in executor.
struct Cluster {
    server: NatsServer,
    _data: tempfile::TempDir,
    dir: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
}

impl Cluster {
    fn start(run: fn(&str) -> Run) -> Cluster {
        let server = NatsServer::start();
        let url = server.url();
        let data = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (js, publisher) = rt.block_on(async {
            let client = async_nats::connect(&url).await.unwrap();
            let js = jetstream::new(client.clone());
            ensure_streams(&js, &catalog(1)).await.unwrap();
            let publisher = Publisher::new(client, "/test/executor");
            let n1 = node("n1").gpus(4).pool(POOL).registered();
            publisher.publish(NodeEvent::Registered(n1)).await.unwrap();
            (js, publisher)
        });
        let allocator = allot_allocator::Config {
            policy: "fifo".into(),
            instance: "a".into(),
            ..allot_allocator::Config::new(&url, POOL)
        };
        rt.spawn(async move {
            allot_allocator::run(allocator, std::future::pending())
                .await
                .unwrap();
        });
        let planner = allot_planner::Config::new(&url, data.path());
        rt.spawn(async move {
            allot_planner::run(planner, std::future::pending())
                .await
                .unwrap();
        });
        rt.spawn(executor(js, publisher, run));
        Cluster {
            server,
            _data: data,
            dir: tempfile::tempdir().unwrap(),
            _rt: rt,
        }
    }

    /// `allot submit SPEC --run-id RUN ARGS…`.
    fn submit(&self, spec: &str, run_id: &str, args: &[&str]) -> Output {
        let file = self.dir.path().join("spec.yaml");
        std::fs::write(&file, spec).unwrap();
        allot(self.dir.path())
            .arg("submit")
            .arg(&file)
            .args(["--run-id", run_id, "--nats", &self.server.url()])
            .args(["--submitter", "ci@test"])
            .args(args)
            .output()
            .unwrap()
    }
}

/// Reads the journal as it grows and runs every grant it finds, as an executor on `n1` would.
async fn executor(js: jetstream::Context, publisher: Publisher, run: fn(&str) -> Run) {
    let stream = js.get_stream("DECISIONS").await.unwrap();
    let mut journal = stream
        .create_consumer(OrderedConfig {
            filter_subject: allot_events::subject::alloc_journal(POOL),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .unwrap()
        .messages()
        .await
        .unwrap();
    while let Some(Ok(message)) = journal.next().await {
        let Ok(envelope) = decode(&message.payload) else {
            continue;
        };
        let AnyEvent::Alloc(AllocEvent::Applied(applied)) = envelope.data else {
            continue;
        };
        for grant in applied.dispatch {
            let node = grant.nodes[0].node.clone();
            publisher
                .publish(TaskEvent::Started(TaskStarted {
                    pool: POOL.into(),
                    task: grant.task,
                    node: node.clone(),
                    lease: grant.lease,
                    workload: grant.launch.workload.clone(),
                    name: grant.launch.name.clone(),
                    how: "stand-in".into(),
                    log: None,
                }))
                .await
                .unwrap();
            let end = match run(&grant.launch.name) {
                Run::Complete => TaskEvent::Completed(TaskCompleted {
                    pool: POOL.into(),
                    task: grant.task,
                    node,
                }),
                Run::Fail => TaskEvent::Failed(TaskFailed {
                    pool: POOL.into(),
                    task: grant.task,
                    node,
                    reason: "exit status 1".into(),
                }),
                Run::Hold => continue,
            };
            publisher.publish(end).await.unwrap();
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The `state` column of a `--follow` line about `task` (`[+   0.012] task  state  …`).
fn position(log: &str, task: &str, state: &str) -> usize {
    log.lines()
        .position(|l| {
            let mut words = l
                .split_once(']')
                .map_or("", |(_, rest)| rest)
                .split_whitespace();
            words.next() == Some(task) && words.next() == Some(state)
        })
        .unwrap_or_else(|| panic!("no line `{task} {state}` in:\n{log}"))
}

/// A guard against a hung test; no assertion depends on it.
const GUARD: &str = "120s";

#[test]
fn follow_prints_each_stage_in_order_and_wait_exits_0_once_the_pipeline_succeeded() {
    let cluster = Cluster::start(|_| Run::Complete);
    let out = cluster.submit(PIPELINE, "ci-1", &["--follow", "--timeout", GUARD]);
    let log = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{log}\n{}", text(&out.stderr));
    let id = log.lines().next().unwrap().to_owned();
    assert!(id.starts_with("train-eval-"), "{log}");

    // Stage by stage: nothing of training before preprocessing completed, nothing of
    // evaluation before both trainers completed.
    for (before, after) in [
        (("preprocess", "ready"), ("preprocess", "granted")),
        (("preprocess", "granted"), ("preprocess", "started")),
        (("preprocess", "started"), ("preprocess", "completed")),
        (("preprocess", "completed"), ("train-0", "ready")),
        (("preprocess", "completed"), ("train-0", "granted")),
        (("preprocess", "completed"), ("train-1", "granted")),
        (("train-0", "completed"), ("eval", "granted")),
        (("train-1", "completed"), ("eval", "granted")),
        (("eval", "completed"), ("(workload)", "succeeded")),
    ] {
        assert!(
            position(&log, before.0, before.1) < position(&log, after.0, after.1),
            "{before:?} before {after:?}:\n{log}"
        );
    }
    let train_grant = &log
        .lines()
        .nth(position(&log, "train-0", "granted"))
        .unwrap();
    assert!(
        train_grant.ends_with("granted      n1 GPUs 0,1")
            || train_grant.ends_with("granted      n1 GPUs 2,3"),
        "{log}"
    );
    assert!(
        log.contains(&format!("workload {id} succeeded after ")),
        "the summary:\n{log}"
    );
    for task in ["preprocess", "train-0", "train-1", "eval"] {
        assert!(
            log.lines()
                .any(|l| l.split_whitespace().take(3).eq([task, "succeeded", "1/1"])),
            "{task} in the summary:\n{log}"
        );
    }

    // The CI job retried: the same submission is followed to the end it already had.
    let again = cluster.submit(PIPELINE, "ci-1", &["--wait", "--timeout", GUARD]);
    let out_again = text(&again.stdout);
    assert_eq!(
        again.status.code(),
        Some(0),
        "{out_again}\n{}",
        text(&again.stderr)
    );
    assert!(text(&again.stderr).contains("already submitted"));
    assert!(
        out_again.starts_with(&format!("{id}\nworkload {id} succeeded after ")),
        "--wait prints the id and the summary only:\n{out_again}"
    );
}

#[test]
fn wait_exits_3_and_names_the_failing_task_when_the_pipeline_fails() {
    let cluster = Cluster::start(|name| match name {
        "prep" => Run::Fail,
        _ => Run::Complete,
    });
    let out = cluster.submit(FLAKY, "ci-7", &["--wait", "--timeout", GUARD]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let id = stdout.lines().next().unwrap();
    assert!(
        stdout.contains(&format!("workload {id} failed after ",))
            && stdout.contains(": task prep failed after 2 attempts: exit status 1\n"),
        "{stdout}"
    );
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        rows.contains(&vec!["prep", "failed", "2/2", "exit", "status", "1"]),
        "{stdout}"
    );
    assert!(
        rows.iter().any(|r| r[..]
            == [
                "train",
                "not",
                "run",
                "0/1",
                "its",
                "dependencies",
                "never",
                "succeeded"
            ]),
        "{stdout}"
    );

    // The same, followed as JSON lines: every line parses; the retry and the end are there.
    let json = cluster.submit(FLAKY, "ci-7", &["--follow", "--output", "json"]);
    assert_eq!(json.status.code(), Some(3), "{}", text(&json.stderr));
    let lines: Vec<serde_json::Value> = text(&json.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines[0]["duplicate"], true);
    let states: Vec<(String, String)> = lines
        .iter()
        .filter_map(|l| {
            Some((
                l["task"].as_str()?.to_owned(),
                l["state"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let prep: Vec<&str> = states
        .iter()
        .filter(|(t, _)| t == "prep")
        .map(|(_, s)| s.as_str())
        .collect();
    assert_eq!(
        prep,
        [
            "ready", "granted", "started", "failed", "retried", "granted", "started", "failed"
        ]
    );
    let summary = &lines.last().unwrap()["summary"];
    assert_eq!(summary["ending"], "failed");
    assert_eq!(summary["tasks"][0]["state"], "failed");
}

#[test]
fn wait_gives_up_with_exit_5_when_the_timeout_runs_out_first() {
    let cluster = Cluster::start(|_| Run::Hold);
    let out = cluster.submit(FLAKY, "ci-9", &["--wait", "--timeout", "1s"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(5),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("is still running (timed out waiting)"),
        "{stdout}"
    );
}
