//! The planner against a real nats-server, with the allocator running in-process and a fake
//! executor that reads grants from the journal and reports each run's end: pipelines run
//! stage by stage, failures are retried and then fail the workload, an abort releases GPUs,
//! and a submission seen twice is planned once.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy};
use futures::StreamExt;

use allot_allocator::journal;
use allot_events::remediation::OperatorCordon;
use allot_events::task::{TaskCompleted, TaskFailed};
use allot_events::workload::{Workload, WorkloadAborted, WorkloadOutcome};
use allot_events::{AllocEvent, AnyEvent, RemediationEvent, TaskEvent, WorkloadEvent, decode};
use allot_planner::plan::task_id;
use allot_sched::journal::Entry;
use allot_sched::{Decision, Input, LeaseId, TaskId};
use allot_testkit::NatsServer;
use allot_workload::{Context, Format};

use common::{POOL, Stack};

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
      durationEstimate: 10m
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

/// What the fake executor does with a run it was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Complete,
    Fail,
    /// Keep running (until cancelled).
    Hold,
}

fn workload(text: &str) -> Workload {
    allot_workload::check(text, Format::Yaml, Context::default())
        .expect("a valid spec")
        .workload
}

/// A running cluster: nats-server, one 4-GPU node in the pool, the allocator and the planner.
struct Harness {
    _server: NatsServer,
    stack: Stack,
}

impl Harness {
    fn start() -> Harness {
        let server = NatsServer::start();
        let url = server.url();
        // Capacity is checked as soon as a node has registered: this cluster is formed.
        let stack = Stack::start(|_| url.clone(), Duration::ZERO);
        Harness {
            _server: server,
            stack,
        }
    }

    /// Submits `workload` as `allot submit` would; returns its id.
    fn submit(&self, workload: Workload) -> String {
        self.stack.submit(workload, None)
    }

    /// Runs a fake executor: every new grant of the workload's tasks is handled by `run`
    /// (task name, attempt); completions and failures are published as a node would.
    fn executor(
        &self,
        workload: &str,
        names: &[&str],
        run: impl Fn(&str, u32) -> Run + Send + 'static,
    ) {
        let ids: BTreeMap<TaskId, (String, u32)> = names
            .iter()
            .flat_map(|n| (1..=5).map(move |a| (task_id(workload, n, a), ((*n).to_owned(), a))))
            .collect();
        let (js, publisher) = (self.stack.js.clone(), self.stack.publisher.clone());
        self.stack.rt.spawn(async move {
            let mut seen = BTreeSet::new();
            loop {
                let journal = entries(&js).await;
                for (task, _) in grants(&journal) {
                    let lease = lease_of(&journal, task);
                    let Some((name, attempt)) = ids.get(&task) else {
                        continue;
                    };
                    if !seen.insert(task) {
                        continue;
                    }
                    let event = match run(name, *attempt) {
                        Run::Complete => TaskEvent::Completed(TaskCompleted {
                            pool: POOL.into(),
                            task,
                            node: "n1".into(),
                            lease,
                        }),
                        Run::Fail => TaskEvent::Failed(TaskFailed {
                            pool: POOL.into(),
                            task,
                            node: "n1".into(),
                            lease,
                            reason: "exit status 1".into(),
                        }),
                        Run::Hold => continue,
                    };
                    publisher.publish(event).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }

    /// Every event on `filter` in the WORKLOADS stream.
    fn workload_stream(&self, filter: &str) -> Vec<AnyEvent> {
        self.stack
            .rt
            .block_on(read(&self.stack.js, "WORKLOADS", filter))
    }

    /// Waits (up to 30 s) for the workload's `WorkloadFinished` and returns its outcome.
    fn finished(&self, workload: &str) -> Option<WorkloadOutcome> {
        self.until(|h| {
            h.workload_stream("allot.workload.finished.>")
                .into_iter()
                .find_map(|e| match e {
                    AnyEvent::Workload(WorkloadEvent::Finished(f)) if f.workload_id == workload => {
                        Some(f.outcome)
                    }
                    _ => None,
                })
        })
    }

    /// The journal's entries.
    fn journal(&self) -> Vec<Entry> {
        self.stack.rt.block_on(entries(&self.stack.js))
    }

    /// The planner's view of a workload's tasks: `name:status#attempt`.
    fn tasks(&self, workload: &str) -> String {
        let conn = allot_store::rusqlite::Connection::open(&self.stack.db).unwrap();
        allot_planner::store::task_statuses(&conn, workload)
            .unwrap()
            .into_iter()
            .map(|(n, s, a)| format!("{n}:{s}#{a}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Polls `check` until it gives something, for up to 30 s.
    fn until<T>(&self, check: impl Fn(&Harness) -> Option<T>) -> Option<T> {
        common::until(|| check(self))
    }
}

async fn entries(js: &jetstream::Context) -> Vec<Entry> {
    journal::read(js, POOL)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|(_, e)| match e {
            AllocEvent::Applied(a) => Some(a.entry),
            AllocEvent::LeaderElected(_) => None,
        })
        .collect()
}

/// The lease of `task`'s latest grant (what its executor's reports name).
fn lease_of(entries: &[Entry], task: TaskId) -> LeaseId {
    entries
        .iter()
        .flat_map(|e| &e.decisions)
        .filter_map(|d| match d {
            Decision::Granted { task: t, lease, .. } if *t == task => Some(*lease),
            _ => None,
        })
        .next_back()
        .expect("the task was granted")
}

/// Grants in journal order, with whether each holds GPUs.
fn grants(entries: &[Entry]) -> Vec<(TaskId, bool)> {
    entries
        .iter()
        .flat_map(|e| &e.decisions)
        .filter_map(|d| match d {
            Decision::Granted {
                task, placement, ..
            } => Some((*task, placement.shares.iter().any(|s| !s.gpus.is_empty()))),
            _ => None,
        })
        .collect()
}

/// Position in the journal of each (decision kind, task) that happened.
fn timeline(entries: &[Entry]) -> Vec<(&'static str, TaskId)> {
    entries
        .iter()
        .flat_map(|e| &e.decisions)
        .filter_map(|d| match d {
            Decision::Granted { task, .. } => Some(("granted", *task)),
            Decision::Released { task, .. } => Some(("released", *task)),
            Decision::Preempted { task, .. } => Some(("preempted", *task)),
            Decision::Withdrawn { task, .. } => Some(("withdrawn", *task)),
            Decision::Waiting { .. } | Decision::Reserved { .. } => None,
        })
        .collect()
}

/// Every message on `filter` in `stream`, as stored.
async fn read_raw(js: &jetstream::Context, stream: &str, filter: &str) -> Vec<jetstream::Message> {
    let mut stream = js.get_stream(stream).await.unwrap();
    if stream.info().await.unwrap().state.messages == 0 {
        return Vec::new();
    }
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: filter.into(),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut out = Vec::new();
    // The ordered consumer has no end: what is stored arrives at once, then nothing.
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(200), messages.next()).await
    {
        out.push(m.unwrap());
    }
    out
}

async fn read(js: &jetstream::Context, stream: &str, filter: &str) -> Vec<AnyEvent> {
    read_raw(js, stream, filter)
        .await
        .into_iter()
        .map(|m| decode(&m.payload).unwrap().data)
        .collect()
}

fn ready_names(h: &Harness, workload: &str) -> Vec<(String, TaskId)> {
    h.workload_stream("allot.task.ready.>")
        .into_iter()
        .filter_map(|e| match e {
            AnyEvent::Task(TaskEvent::Ready(r)) if r.workload == workload => {
                Some((r.name, r.task.id))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_pipeline_runs_stage_by_stage_and_holds_no_gpu_while_only_its_cpu_stage_runs() {
    let h = Harness::start();
    let id = h.submit(workload(PIPELINE));
    let names = ["preprocess", "train-0", "train-1", "eval"];
    h.executor(&id, &names, |_, _| Run::Complete);

    assert_eq!(h.finished(&id), Some(WorkloadOutcome::Succeeded));
    assert_eq!(
        h.tasks(&id),
        "preprocess:succeeded#1 train-0:succeeded#1 train-1:succeeded#1 eval:succeeded#1"
    );
    let t = |name: &str| task_id(&id, name, 1);
    let journal = h.journal();
    let line = timeline(&journal);
    let at = |kind: &str, name: &str| {
        line.iter()
            .position(|(k, task)| *k == kind && *task == t(name))
            .unwrap_or_else(|| panic!("no {kind} for {name}: {line:?}"))
    };
    // Stages in order: each starts only after what it waits for was released.
    assert!(at("released", "preprocess") < at("granted", "train-0"));
    assert!(at("released", "preprocess") < at("granted", "train-1"));
    assert!(at("released", "train-0") < at("granted", "eval"));
    assert!(at("released", "train-1") < at("granted", "eval"));
    // No GPU granted to the workload before its CPU stage was done.
    let ours: BTreeSet<TaskId> = names.iter().map(|n| t(n)).collect();
    let prep_done = at("released", "preprocess");
    let early_gpu: Vec<_> = line[..prep_done]
        .iter()
        .filter(|(k, task)| *k == "granted" && ours.contains(task))
        .filter(|(_, task)| grants(&journal).iter().any(|(g, gpus)| g == task && *gpus))
        .collect();
    assert!(
        early_gpu.is_empty(),
        "GPUs granted during preprocessing: {early_gpu:?}"
    );
    // The allocator saw the DAG's facts: preprocess leads the longest chain.
    let specs: BTreeMap<TaskId, allot_sched::TaskSpec> = journal
        .iter()
        .filter_map(|e| match &e.input {
            Input::TaskSubmitted { task, .. } => Some((task.id, task.clone())),
            _ => None,
        })
        .collect();
    let prep = &specs[&t("preprocess")];
    assert_eq!(
        (prep.gpus, prep.dag.dependents, prep.dag.critical_path_rank),
        (0, 3, 3)
    );
    let gang = specs[&t("train-0")].gang.clone().unwrap();
    assert_eq!((gang.name, gang.size), (format!("{id}/train"), 2));
    // Preprocessing was expected to take 10 minutes, so the trainers' preloads were queued
    // for 9 minutes after its grant; it ended at once, so they were withdrawn, never sent.
    let conn = allot_store::rusqlite::Connection::open(&h.stack.db).unwrap();
    let queued: i64 = conn
        .query_row("SELECT count(*) FROM outbox", [], |r| r.get(0))
        .unwrap();
    assert_eq!(queued, 0, "events still queued after the workload finished");
    assert!(h.workload_stream("allot.task.preload.>").is_empty());
}

#[test]
fn a_failing_task_is_retried_then_fails_the_workload_and_cancels_what_follows() {
    let h = Harness::start();
    let id = h.submit(workload(FLAKY));
    h.executor(&id, &["prep", "train"], |name, _| match name {
        "prep" => Run::Fail,
        _ => Run::Complete,
    });

    assert_eq!(h.finished(&id), Some(WorkloadOutcome::Failed));
    assert_eq!(h.tasks(&id), "prep:failed#2 train:cancelled#1");
    let granted: Vec<TaskId> = grants(&h.journal()).into_iter().map(|(t, _)| t).collect();
    assert_eq!(
        granted,
        [task_id(&id, "prep", 1), task_id(&id, "prep", 2)],
        "two attempts of prep ran, each under its own id; train never did"
    );
    let ready: Vec<String> = ready_names(&h, &id).into_iter().map(|(n, _)| n).collect();
    assert_eq!(ready, ["prep", "prep"]);
}

#[test]
fn an_abort_during_training_releases_the_gpus_and_cancels_evaluation() {
    let h = Harness::start();
    let id = h.submit(workload(PIPELINE));
    let names = ["preprocess", "train-0", "train-1", "eval"];
    h.executor(&id, &names, |name, _| match name {
        "preprocess" => Run::Complete,
        _ => Run::Hold,
    });
    let training = [task_id(&id, "train-0", 1), task_id(&id, "train-1", 1)];
    let both_granted = h.until(|h| {
        let granted: BTreeSet<TaskId> = grants(&h.journal()).into_iter().map(|(t, _)| t).collect();
        training.iter().all(|t| granted.contains(t)).then_some(())
    });
    assert!(both_granted.is_some(), "training started");
    // The planner must have read the grants too before the abort means "running": wait for it.
    h.until(|h| h.tasks(&id).contains("train-1:running").then_some(()));

    h.stack.rt.block_on(async {
        h.stack
            .publisher
            .publish(WorkloadAborted {
                workload_id: id.clone(),
                team: "vision".into(),
                task: None,
                reason: "wrong learning rate".into(),
                by: "alice".into(),
            })
            .await
            .unwrap()
    });

    assert_eq!(h.finished(&id), Some(WorkloadOutcome::Aborted));
    let released = h.until(|h| {
        let line = timeline(&h.journal());
        training
            .iter()
            .all(|t| line.contains(&("released", *t)))
            .then_some(line)
    });
    assert!(released.is_some(), "both trainers' GPUs were released");
    assert_eq!(
        h.tasks(&id),
        "preprocess:succeeded#1 train-0:cancelled#1 train-1:cancelled#1 eval:cancelled#1"
    );
    let granted: Vec<TaskId> = grants(&h.journal()).into_iter().map(|(t, _)| t).collect();
    assert!(
        !granted.contains(&task_id(&id, "eval", 1)),
        "eval never ran"
    );
    let cancelled: BTreeSet<TaskId> = h
        .workload_stream("allot.task.cancelled.>")
        .into_iter()
        .filter_map(|e| match e {
            AnyEvent::Task(TaskEvent::Cancelled(c)) => Some(c.task),
            _ => None,
        })
        .collect();
    assert_eq!(cancelled, BTreeSet::from(training));
}

/// A one-task workload that takes the whole 4-GPU node.
fn whole_node(name: &str) -> Workload {
    workload(&format!(
        r#"
apiVersion: allot/v1
kind: Workload
metadata: {{name: {name}, team: vision}}
spec:
  tasks:
    - name: train
      resources: {{gpus: 4}}
      command: [torchrun, train.py]
"#
    ))
}

#[test]
fn an_aborted_workload_waiting_in_the_queue_leaves_it_and_is_never_granted() {
    let h = Harness::start();
    let running = h.submit(whole_node("running"));
    h.executor(&running, &["train"], |_, _| Run::Hold);
    let hog = task_id(&running, "train", 1);
    let granted = h.until(|h| {
        grants(&h.journal())
            .iter()
            .any(|(t, _)| *t == hog)
            .then_some(())
    });
    assert!(granted.is_some(), "the first workload holds the node");

    // Two more wait behind it, in this order; the first of them is aborted while it waits.
    let aborted = h.submit(whole_node("aborted"));
    let next = h.submit(whole_node("next"));
    let (queued, after) = (task_id(&aborted, "train", 1), task_id(&next, "train", 1));
    let both_queued = h.until(|h| {
        let submitted: BTreeSet<TaskId> = h
            .journal()
            .iter()
            .filter_map(|e| match &e.input {
                Input::TaskSubmitted { task, .. } => Some(task.id),
                _ => None,
            })
            .collect();
        (submitted.contains(&queued) && submitted.contains(&after)).then_some(())
    });
    assert!(both_queued.is_some(), "both wait in the allocator's queue");
    h.stack.rt.block_on(async {
        h.stack
            .publisher
            .publish(WorkloadAborted {
                workload_id: aborted.clone(),
                team: "vision".into(),
                task: None,
                reason: "superseded".into(),
                by: "alice".into(),
            })
            .await
            .unwrap()
    });
    assert_eq!(h.finished(&aborted), Some(WorkloadOutcome::Aborted));
    let withdrawn = h.until(|h| {
        timeline(&h.journal())
            .contains(&("withdrawn", queued))
            .then_some(())
    });
    assert!(
        withdrawn.is_some(),
        "the allocator took the aborted task out of its queue"
    );

    // The node frees: the next in line gets it; the aborted task never holds a GPU.
    h.report(hog, lease_of(&h.journal(), hog), true);
    let line = h.until(|h| {
        let line = timeline(&h.journal());
        line.contains(&("granted", after)).then_some(line)
    });
    let line = line.expect("the workload behind the aborted one started");
    assert!(
        !line.contains(&("granted", queued)),
        "the aborted task was granted: {line:?}"
    );
}

#[test]
fn a_submission_seen_twice_is_planned_once_and_an_invalid_one_is_dead_lettered() {
    let h = Harness::start();
    let spec = workload(FLAKY);
    let id = h.submit(spec.clone());
    // The same submission under another message id (past the duplicate window, or from a
    // client that does not set one): the server stores it, the planner knows the workload.
    let again = h.submit_with_fresh_id(spec);
    assert_eq!(again, id);
    h.executor(&id, &["prep", "train"], |_, _| Run::Complete);
    assert_eq!(h.finished(&id), Some(WorkloadOutcome::Succeeded));
    let ready: Vec<String> = ready_names(&h, &id).into_iter().map(|(n, _)| n).collect();
    assert_eq!(ready, ["prep", "train"], "each task handed over once");

    // A raw submission with a cycle never reaches the allocator; its dead letter says why.
    let mut cyclic = workload(FLAKY);
    cyclic.metadata.name = "cyclic".into();
    cyclic.spec.tasks[0].after = vec!["train".into()];
    let bad = h.submit(cyclic);
    let letter = h.until(|h| h.stack.rt.block_on(dead_letter_reason(&h.stack.js)));
    let letter = letter.expect("a dead letter");
    assert!(
        letter.contains("cycle") && letter.contains(&bad),
        "{letter}"
    );
    assert!(ready_names(&h, &bad).is_empty());
}

impl Harness {
    fn submit_with_fresh_id(&self, workload: Workload) -> String {
        let key = allot_workload::submit::idempotency_key(&workload, None);
        let mut submission = allot_workload::submit::submission(
            workload,
            key,
            None,
            "ci@test".into(),
            "/test",
            chrono::Utc::now(),
        );
        submission.envelope.id = uuid::Uuid::now_v7();
        self.stack.rt.block_on(async {
            let published = self
                .stack
                .publisher
                .publish_envelope(&submission.envelope)
                .await
                .unwrap();
            assert!(!published.duplicate, "stored again");
        });
        submission.workload_id
    }
}

/// The reason of the first dead-lettered submission, if there is one.
async fn dead_letter_reason(js: &jetstream::Context) -> Option<String> {
    let letters = read_raw(
        js,
        "DEADLETTER",
        "allot.deadletter.allot.workload.submitted.>",
    )
    .await;
    let headers = letters.first()?.headers.clone()?;
    headers
        .get(allot_bus::headers::ERROR)
        .map(|v| v.to_string())
}

/// Every dead-lettered submission's reason, in order.
async fn dead_letter_reasons(js: &jetstream::Context) -> Vec<String> {
    read_raw(
        js,
        "DEADLETTER",
        "allot.deadletter.allot.workload.submitted.>",
    )
    .await
    .iter()
    .filter_map(|m| m.headers.as_ref()?.get(allot_bus::headers::ERROR))
    .map(|v| v.to_string())
    .collect()
}

/// A raw client publishes what it likes; the planner checks it as `allot submit` would: what
/// the registered nodes can never hold, an id chosen by hand, and a key reused for another spec
/// are dead-lettered with the reason, and none of them reaches the allocator.
#[test]
fn raw_submissions_get_the_checks_allot_submit_makes() {
    let h = Harness::start();
    // The planner has seen the pool's 4-GPU node.
    h.until(|h| {
        let conn = allot_store::rusqlite::Connection::open(&h.stack.db).ok()?;
        let fleet = &mut allot_planner::store::FleetCache::default();
        allot_planner::store::cluster(&conn, u64::MAX, 0, fleet).ok()?
    })
    .expect("the node registered with the planner");

    let mut huge = workload(FLAKY);
    huge.metadata.name = "huge".into();
    huge.spec.tasks[1].resources.gpus = Some(allot_events::workload::Quantity("10000".into()));
    let huge = h.submit(huge);

    // The id of a submission that has not been made yet, taken by hand.
    let victim = workload(FLAKY);
    let key = allot_workload::submit::idempotency_key(&victim, Some("run-7"));
    let victims_id = allot_workload::submit::workload_id(&victim, &key);
    let mut squatter = workload(FLAKY);
    squatter.spec.tasks[0].command = vec!["curl".into(), "evil.example".into()];
    let mut squat = allot_workload::submit::submission(
        squatter.clone(),
        "my-own-key".into(),
        None,
        "mallory".into(),
        "/raw",
        chrono::Utc::now(),
    );
    let AnyEvent::Workload(WorkloadEvent::Submitted(s)) = &mut squat.envelope.data else {
        unreachable!("a submission");
    };
    s.workload_id = victims_id.clone();
    h.stack
        .rt
        .block_on(h.stack.publisher.publish_envelope(&squat.envelope))
        .unwrap();

    // The victim's key reused for other content (by a teammate: the server lets only the team
    // submit under it) takes the id first ...
    let reused = allot_workload::submit::submission(
        squatter,
        key.clone(),
        Some("run-7".into()),
        "mallory".into(),
        "/raw",
        chrono::Utc::now(),
    );
    assert_eq!(reused.workload_id, victims_id);
    h.stack
        .rt
        .block_on(h.stack.publisher.publish_envelope(&reused.envelope))
        .unwrap();
    let letters = h
        .until(|h| {
            let all = h.stack.rt.block_on(dead_letter_reasons(&h.stack.js));
            (all.len() >= 2).then_some(all)
        })
        .expect("dead letters");
    assert!(
        letters[0].contains(&huge) && letters[0].contains("10000"),
        "{letters:?}"
    );
    assert!(
        letters[1].contains(&victims_id) && letters[1].contains("not derived"),
        "{letters:?}"
    );
    // ... so the victim's own submission is refused loudly, not taken for a duplicate of it.
    let victims = allot_workload::submit::submission(
        victim,
        key,
        Some("run-7".into()),
        "ci@test".into(),
        "/test",
        chrono::Utc::now(),
    );
    h.stack
        .rt
        .block_on(h.stack.publisher.publish_envelope(&victims.envelope))
        .unwrap();
    let letters = h
        .until(|h| {
            let all = h.stack.rt.block_on(dead_letter_reasons(&h.stack.js));
            (all.len() >= 3).then_some(all)
        })
        .expect("a third dead letter");
    assert!(letters[2].contains("different spec"), "{letters:?}");
    assert!(ready_names(&h, &huge).is_empty());
}

/// One GPU asked for, opting in to right-sizing; retried once.
const SIZED: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: infer, team: vision}
spec:
  tasks:
    - name: infer
      resources: {gpus: 1, rightSize: true}
      command: [python, infer.py]
      retry: {maxAttempts: 2, backoff: 10ms}
"#;

/// The specs of the workload's `TaskReady` events, in order.
fn ready_specs(h: &Harness, workload: &str) -> Vec<allot_sched::TaskSpec> {
    h.workload_stream("allot.task.ready.>")
        .into_iter()
        .filter_map(|e| match e {
            AnyEvent::Task(TaskEvent::Ready(r)) if r.workload == workload => Some(r.task),
            _ => None,
        })
        .collect()
}

#[test]
fn right_sizing_advice_is_applied_to_later_attempts_of_opted_in_tasks_only() {
    use allot_events::task::{Recommendation, TaskPredicted};

    let h = Harness::start();
    let first = h.stack.submit(workload(SIZED), Some("run-1"));
    assert!(
        h.until(|h| (!ready_specs(h, &first).is_empty()).then_some(()))
            .is_some()
    );
    // The predictor advises a quarter of an H100 with 20,000 MiB for the first attempt.
    let advice = Recommendation {
        model: "H100".into(),
        gpus: 1,
        gpu_milli: 250,
        gpu_memory_mib: 20_000,
        runs: 3,
        micros_per_hour: 725_000,
        requested_micros_per_hour: Some(2_900_000),
    };
    let predicted = TaskPredicted {
        pool: POOL.into(),
        task: task_id(&first, "infer", 1),
        workload: first.clone(),
        name: "infer".into(),
        duration_ms: 60_000,
        p10_ms: 30_000,
        p90_ms: 90_000,
        model_version: None,
        basis: allot_predict::Basis::Identity,
        right_size: Some(advice.clone()),
    };
    h.stack.rt.block_on(async {
        h.stack
            .publisher
            .publish(TaskEvent::Predicted(predicted))
            .await
            .unwrap()
    });
    let conn = allot_store::rusqlite::Connection::open(&h.stack.db).unwrap();
    assert!(
        h.until(|_| allot_planner::store::advice(&conn, "vision/infer/infer").unwrap())
            .is_some(),
        "the planner kept the advice"
    );
    // The running attempt keeps what it asked for; its retry starts with the advice.
    h.executor(&first, &["infer"], |_, attempt| match attempt {
        1 => Run::Fail,
        _ => Run::Complete,
    });
    assert_eq!(h.finished(&first), Some(WorkloadOutcome::Succeeded));
    let shape =
        |s: &allot_sched::TaskSpec| (s.gpus, s.gpu_milli, s.gpu_models.clone(), s.gpu_memory_mib);
    let sized = (1, 250, vec!["H100".to_owned()], 20_000);
    let asked = (1, 1000, Vec::new(), 0);
    let specs: Vec<_> = ready_specs(&h, &first).iter().map(shape).collect();
    assert_eq!(specs, [asked.clone(), sized.clone()]);

    // A later submission that opts in starts right-sized; one that does not, as written.
    let second = h.stack.submit(workload(SIZED), Some("run-2"));
    let plain = h.stack.submit(
        workload(&SIZED.replace(", rightSize: true", "")),
        Some("run-3"),
    );
    for (id, want) in [(&second, sized), (&plain, asked)] {
        let spec = h
            .until(|h| ready_specs(h, id).first().map(shape))
            .unwrap_or_else(|| panic!("{id} was not made ready"));
        assert_eq!(spec, want, "{id}");
    }
}

impl Harness {
    /// Publishes what an executor on `n1` reports of the run of `task` under `lease`:
    /// completed, or failed.
    fn report(&self, task: TaskId, lease: LeaseId, completed: bool) {
        let (pool, node) = (POOL.into(), "n1".into());
        let event = if completed {
            TaskEvent::Completed(TaskCompleted {
                pool,
                task,
                node,
                lease,
            })
        } else {
            TaskEvent::Failed(TaskFailed {
                pool,
                task,
                node,
                lease,
                reason: "exit status 1".into(),
            })
        };
        self.stack
            .rt
            .block_on(async { self.stack.publisher.publish(event).await.unwrap() });
    }

    /// An operator cordons `n1` and drains it (`held`), or lets it go.
    fn cordon(&self, held: bool) {
        let event = RemediationEvent::OperatorCordon(OperatorCordon {
            node: "n1".into(),
            cordoned: held,
            drain: held,
            reason: "test".into(),
            by: "alice".into(),
        });
        self.stack
            .rt
            .block_on(async { self.stack.publisher.publish(event).await.unwrap() });
    }

    /// Submits a whole-node workload named `name`, waits for its grant, then drains `n1`
    /// (left cordoned) and waits for the preemption: its id, its task and the lease it ran
    /// under.
    fn granted_then_drained(&self, name: &str) -> (String, TaskId, LeaseId) {
        let id = self.submit(whole_node(name));
        let task = task_id(&id, "train", 1);
        self.wait_journal("granted", task, 1);
        let lease = lease_of(&self.journal(), task);
        self.cordon(true);
        self.wait_journal("preempted", task, 1);
        (id, task, lease)
    }

    /// Waits until the journal holds `(what, task)` `times` times.
    fn wait_journal(&self, what: &str, task: TaskId, times: usize) {
        let seen = self.until(|h| {
            let n = timeline(&h.journal())
                .iter()
                .filter(|(w, t)| *w == what && *t == task)
                .count();
            (n >= times).then_some(())
        });
        assert!(seen.is_some(), "{task} not {what} {times} times");
    }

    /// The latest lease the planner has read a grant of for attempt `task`.
    fn planner_lease(&self, task: TaskId) -> Option<i64> {
        let conn = allot_store::rusqlite::Connection::open(&self.stack.db).unwrap();
        conn.query_row(
            "SELECT lease FROM attempts WHERE task_id = ?1",
            [task.0 as i64],
            |r| r.get(0),
        )
        .unwrap()
    }
}

#[test]
fn a_run_that_ends_as_it_is_stopped_counts_once_and_one_granted_again_since_counts_not() {
    let h = Harness::start();

    // Drained off the only node, a run completes before the task is granted again: the
    // allocator withdraws the waiting task (no second run), and the planner takes that
    // completion as the task's.
    let (first, task, l1) = h.granted_then_drained("first");
    h.report(task, l1, true);
    assert_eq!(h.finished(&first), Some(WorkloadOutcome::Succeeded));
    h.wait_journal("withdrawn", task, 1);
    h.cordon(false);

    // Drained, then granted again: a failure reported under the first lease is of a run that
    // was superseded (the allocator refuses it), so the planner neither fails the task (it
    // has one attempt) nor runs it a second time; the run under the new lease decides.
    let (second, task, l1) = h.granted_then_drained("second");
    h.cordon(false);
    h.wait_journal("granted", task, 2);
    let l2 = lease_of(&h.journal(), task);
    assert!(l2 > l1);
    let read = h.until(|h| (h.planner_lease(task) == Some(l2.0 as i64)).then_some(()));
    assert!(read.is_some(), "the planner read the second grant");
    h.report(task, l1, false);
    h.report(task, l2, true);
    assert_eq!(h.finished(&second), Some(WorkloadOutcome::Succeeded));
    assert_eq!(h.tasks(&second), "train:succeeded#1");
    let attempts: Vec<_> = ready_names(&h, &second);
    assert_eq!(
        attempts,
        vec![("train".to_owned(), task)],
        "one attempt only"
    );
}
