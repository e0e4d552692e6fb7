//! The fault matrix (docs/faults.md): real `allot` processes on loopback, workloads submitted
//! all along, and one fault after another — a NATS server SIGKILLed under its streams, the
//! allocator leader SIGKILLed or paused past its lease, services paused past their ack wait,
//! every service SIGKILLed and started again in turn, `allot up` itself SIGKILLed and started
//! again in the same folder. Afterwards a user finds every workload finished, each task run to
//! completion once, no GPU held by two leases at once, every lease billed exactly lease time ×
//! price, and `allot replay --verify` and `allot audit verify` pass.
//!
//! Every wait is bounded; each test prints the figures docs/faults.md records.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use allot_bus::streams::names;
use allot_events::alloc::{Applied, Dispatch, Launch, NodeGrant, gpus_granted_twice};
use allot_events::cost::CostAccrued;
use allot_events::task::{RunSpec, TaskCompleted, TaskStarted};
use allot_events::workload::WorkloadOutcome;
use allot_events::{
    AllocEvent, AnyEvent, CostEvent, Envelope, InventoryEvent, RemediationEvent, TaskEvent,
    WorkloadEvent,
};
use allot_sched::journal::Entry;
use allot_sched::{Decision, Input, LeaseId, Placement, TaskId};
use allot_testkit::NatsCluster;

use crate::cluster::{Cluster, Nats};
use crate::support::{
    allot, api_get, free_port, log_of, spawn_logged, terminate, wait_exit, wait_for,
};

/// Task time per wall time: workload `i`'s tasks last 0.5–1 s.
const SPEEDUP: u32 = 60;
/// The tasks of every workload.
const TASKS: [&str; 3] = ["prep", "train", "probe"];
/// examples/prices.yaml: an H100-hour, in micro-units (the simulated GPUs are H100s).
const H100_HOUR: i64 = 2_900_000;
/// How soon the standby must lead after the leader dies (the allocators' lease TTL is 2 s).
const TAKEOVER: Duration = Duration::from_secs(5);
/// How often a workload is submitted while the faults happen, and at most how many: each is
/// 2.75 GPU-seconds of work, so they keep about half of the 12 GPUs busy and a backlog left by a
/// fault drains again.
const SUBMIT_EVERY: Duration = Duration::from_millis(500);
const MAX_WORKLOADS: usize = 400;
/// Held by each scenario for its whole run: each starts a NATS cluster and a dozen processes,
/// and two at once on a small machine starve each other past the timing bounds they check.
static ONE_SCENARIO_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The scenario lock (a scenario that failed does not poison it for the others).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_SCENARIO_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How long the cluster may take to work again after a fault.
const RECOVERY: Duration = Duration::from_secs(60);

/// Workload `i`: prep (1 GPU), then train (2 GPUs) and a half-GPU probe side by side.
fn workload(i: usize) -> String {
    let team = ["vision", "nlp"][i % 2];
    format!(
        r#"
apiVersion: allot/v1
kind: Workload
metadata: {{name: job-{i}, team: {team}}}
spec:
  tasks:
    - {{name: prep, resources: {{gpus: 1}}, command: [prep], durationEstimate: 30s}}
    - {{name: train, resources: {{gpus: 2}}, command: [train], after: [prep], durationEstimate: 1m}}
    - {{name: probe, resources: {{gpuFraction: "0.5"}}, command: [probe], after: [prep], durationEstimate: 30s}}
"#
    )
}

// ---------------------------------------------------------------------------------------------
// Continuous submissions

/// Submits workload after workload in the background, as CI jobs would, until stopped or `max`
/// are in: `allot submit --run-id job-<i>`. A submission the CLI reports as failed ("it may not
/// have been submitted": the bus was away) is submitted again under the same run id, which the
/// stream deduplicates — what a CI job's retry does; those retries are counted.
struct Submitter {
    /// The most it submits.
    max: usize,
    stop: Arc<AtomicBool>,
    ids: Arc<Mutex<Vec<String>>>,
    handle: Option<JoinHandle<Result<usize, String>>>,
}

impl Submitter {
    /// Starts submitting from `dir` to `nats`, a workload every [`SUBMIT_EVERY`], at most
    /// [`MAX_WORKLOADS`].
    fn start(dir: &Path, nats: String) -> Submitter {
        let (every, max) = (SUBMIT_EVERY, MAX_WORKLOADS);
        let stop = Arc::new(AtomicBool::new(false));
        let ids = Arc::new(Mutex::new(Vec::new()));
        let specs = dir.join("specs");
        std::fs::create_dir_all(&specs).unwrap();
        let (dir, thread_stop, thread_ids) = (dir.to_owned(), stop.clone(), ids.clone());
        let handle = std::thread::spawn(move || {
            let mut retries = 0;
            for i in 0..max {
                if thread_stop.load(Ordering::Relaxed) {
                    break;
                }
                let file = specs.join(format!("job-{i}.yaml"));
                std::fs::write(&file, workload(i)).unwrap();
                let id = submit(&dir, &nats, &file, &format!("job-{i}"), &mut retries)?;
                thread_ids.lock().unwrap().push(id);
                std::thread::sleep(every);
            }
            Ok(retries)
        });
        Submitter {
            max,
            stop,
            ids,
            handle: Some(handle),
        }
    }

    /// How many workloads are in so far.
    fn count(&self) -> usize {
        self.ids.lock().unwrap().len()
    }

    /// The `n`th workload's id, once it is in.
    fn id(&self, n: usize) -> Option<String> {
        self.ids.lock().unwrap().get(n).cloned()
    }

    /// Stops submitting; every workload submitted, and how many submissions were retried.
    fn finish(mut self) -> (Vec<String>, usize) {
        self.stop.store(true, Ordering::Relaxed);
        let retries = self
            .handle
            .take()
            .unwrap()
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("{e}"));
        (self.ids.lock().unwrap().clone(), retries)
    }
}

impl Drop for Submitter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `allot submit FILE --run-id RUN`, tried again for up to 60 s while it fails; the workload id.
fn submit(
    dir: &Path,
    nats: &str,
    file: &Path,
    run: &str,
    retries: &mut usize,
) -> Result<String, String> {
    let start = Instant::now();
    loop {
        let out = allot(dir)
            .arg("submit")
            .arg(file)
            .args(["--run-id", run, "--submitter", "ci@test", "--nats", nats])
            .output()
            .unwrap();
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned());
        }
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("{run} was never submitted: {err}"));
        }
        *retries += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
}

// ---------------------------------------------------------------------------------------------
// Reading what a run left

/// Where a test reads the streams: a [`Cluster`]'s, or an `allot up`'s as its admin.
trait Streams {
    /// Events of `stream` on subjects matching `filter` after sequence `after`.
    fn envelopes_after(&self, stream: &str, filter: &str, after: u64) -> Vec<(u64, Envelope)>;
    /// The stream's last sequence.
    fn last_sequence(&self, stream: &str) -> u64;

    /// Every event of `stream` on subjects matching `filter`.
    fn events_on(&self, stream: &str, filter: &str) -> Vec<AnyEvent> {
        self.envelopes_after(stream, filter, 0)
            .into_iter()
            .map(|(_, e)| e.data)
            .collect()
    }

    /// The pool's journal entries.
    fn journal(&self) -> Vec<Applied> {
        self.events_on(names::DECISIONS, "allot.alloc.default.journal")
            .into_iter()
            .filter_map(|e| match e {
                AnyEvent::Alloc(AllocEvent::Applied(a)) => Some(a),
                _ => None,
            })
            .collect()
    }

    /// The ids of the workloads that finished, and how.
    fn finished(&self) -> BTreeMap<String, WorkloadOutcome> {
        self.events_on(names::WORKLOADS, "allot.workload.finished.>")
            .into_iter()
            .filter_map(|e| match e {
                AnyEvent::Workload(WorkloadEvent::Finished(f)) => Some((f.workload_id, f.outcome)),
                _ => None,
            })
            .collect()
    }

    /// Every cost event, with its event id.
    fn costs(&self) -> Vec<(String, CostAccrued)> {
        self.envelopes_after(names::COSTS, "", 0)
            .into_iter()
            .filter_map(|(_, e)| match e.data {
                AnyEvent::Cost(CostEvent::Accrued(c)) => Some((e.id.to_string(), c)),
                _ => None,
            })
            .collect()
    }
}

impl Streams for Cluster {
    fn envelopes_after(&self, stream: &str, filter: &str, after: u64) -> Vec<(u64, Envelope)> {
        Cluster::envelopes_after(self, stream, filter, after)
    }
    fn last_sequence(&self, stream: &str) -> u64 {
        Cluster::last_sequence(self, stream)
    }
}

/// Waits until the workload submitted next has finished — the cluster works again after a
/// fault — and returns how long that took.
fn wait_progress(
    streams: &dyn Streams,
    submitter: &Submitter,
    what: &str,
    logs: &dyn Fn() -> String,
) -> Duration {
    let start = Instant::now();
    let next = submitter.count();
    assert!(
        next < submitter.max,
        "the submitter has submitted all its {} workloads already; give it more",
        submitter.max
    );
    wait_for(RECOVERY, || {
        let id = submitter.id(next)?;
        std::thread::sleep(Duration::from_millis(250));
        streams.finished().contains_key(&id).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "after {what}, no new workload finished within {RECOVERY:?} ({} submitted)\n{}",
            submitter.count(),
            logs()
        )
    });
    start.elapsed()
}

/// Prints how long a workload submitted now takes to finish with no fault: the figure each
/// row's recovery time compares with (a submission interval plus the workload's own 1.5 s).
fn baseline(streams: &dyn Streams, submitter: &Submitter, logs: &dyn Fn() -> String) {
    let took = wait_progress(streams, submitter, "nothing", logs);
    println!("no fault: a workload submitted now finished {took:?} later");
}

// ---------------------------------------------------------------------------------------------
// What a user would notice

/// What a run did, for the matrix.
#[derive(Debug, Default)]
struct Figures {
    tasks: usize,
    grants: usize,
    preemptions: usize,
    late_completions: usize,
    failures: usize,
    billed_micros: i64,
    /// Nodes the inventory declared unreachable (each `NodeUnreachable`).
    nodes_unreachable: usize,
    /// Remediation's actions (cordons, drains …).
    remediation_actions: usize,
}

/// How each task of `workloads` ran, against the journal and the executors' reports: every
/// lease ends once; each task (workload and name) completes exactly once, under a lease granted
/// once and started once; earlier leases of it ended by preemption (a legitimate second grant)
/// and each started at most once. A run that finished as it was preempted reports a completion
/// under its preempted lease: when the task was granted again by then, the allocator refuses it
/// (only counted, as late); when the task was still waiting, the allocator withdraws it ("no
/// second run") and that completion is the task's one. Returns the problems and the figures.
fn run_problems(
    journal: &[Applied],
    task_events: &[AnyEvent],
    workloads: &[String],
) -> (Vec<String>, Figures) {
    let mut problems = Vec::new();
    let mut figures = Figures::default();
    let mut task_of: BTreeMap<TaskId, (String, String)> = BTreeMap::new();
    let mut lease_task: BTreeMap<LeaseId, TaskId> = BTreeMap::new();
    let mut ended: BTreeMap<LeaseId, Vec<&'static str>> = BTreeMap::new();
    // Each task's latest lease, and whether it was withdrawn after that lease was granted.
    let mut latest: BTreeMap<TaskId, (LeaseId, bool)> = BTreeMap::new();
    for a in journal {
        for g in &a.dispatch {
            task_of.insert(g.task, (g.launch.workload.clone(), g.launch.name.clone()));
            if lease_task.insert(g.lease, g.task).is_some() {
                problems.push(format!("lease {:?} dispatched twice", g.lease));
            }
            latest.insert(g.task, (g.lease, false));
            figures.grants += 1;
        }
        for d in &a.entry.decisions {
            match d {
                Decision::Withdrawn { task, .. } => {
                    if let Some((_, withdrawn)) = latest.get_mut(task) {
                        *withdrawn = true;
                    }
                }
                Decision::Released { lease, .. } => {
                    ended.entry(*lease).or_default().push("released")
                }
                Decision::Preempted { lease, .. } => {
                    figures.preemptions += 1;
                    ended.entry(*lease).or_default().push("preempted");
                }
                _ => {}
            }
        }
    }
    for (lease, task) in &lease_task {
        match ended.get(lease).map(Vec::as_slice) {
            Some([_]) => {}
            None => problems.push(format!(
                "lease {lease:?} of {task} ({:?}) never ended",
                task_of[task]
            )),
            Some(ends) => problems.push(format!("lease {lease:?} of {task} ended {ends:?}")),
        }
    }
    let mut starts: BTreeMap<LeaseId, usize> = BTreeMap::new();
    let mut completed: BTreeMap<(String, String), Vec<(TaskId, LeaseId)>> = BTreeMap::new();
    for e in task_events {
        match e {
            AnyEvent::Task(TaskEvent::Started(s)) => *starts.entry(s.lease).or_default() += 1,
            // A run that finished just as it was preempted, once the task was granted again:
            // the allocator refuses its completion — a legitimate race, counted apart.
            AnyEvent::Task(TaskEvent::Completed(c))
                if ended.get(&c.lease).map(Vec::as_slice) == Some(&["preempted"][..])
                    && !stopped_as_it_ended(&latest, c.task, c.lease) =>
            {
                figures.late_completions += 1;
            }
            AnyEvent::Task(TaskEvent::Completed(c)) => match task_of.get(&c.task) {
                Some(key) => completed
                    .entry(key.clone())
                    .or_default()
                    .push((c.task, c.lease)),
                None => problems.push(format!("{} completed but was never granted", c.task)),
            },
            AnyEvent::Task(TaskEvent::Failed(_)) => figures.failures += 1,
            _ => {}
        }
    }
    for (lease, n) in &starts {
        if *n > 1 {
            problems.push(format!(
                "lease {lease:?} ({:?}) started {n} times",
                lease_task.get(lease).map(|t| &task_of[t])
            ));
        }
    }
    for workload in workloads {
        for name in TASKS {
            figures.tasks += 1;
            let key = (workload.clone(), name.to_owned());
            match completed.get(&key).map(Vec::as_slice) {
                Some([(task, lease)]) => {
                    let how = ended.get(lease).map(Vec::as_slice);
                    let withdrawn = how == Some(&["preempted"][..])
                        && stopped_as_it_ended(&latest, *task, *lease);
                    if how != Some(&["released"][..]) && !withdrawn {
                        problems.push(format!("{workload}/{name} completed under lease {lease:?} of {task}, which did not end released"));
                    }
                    if starts.get(lease) != Some(&1) {
                        problems.push(format!(
                            "{workload}/{name}'s completed lease {lease:?} started {:?} times",
                            starts.get(lease)
                        ));
                    }
                }
                None => problems.push(format!("{workload}/{name} never completed")),
                Some(runs) => problems.push(format!(
                    "{workload}/{name} completed {} times: {runs:?}",
                    runs.len()
                )),
            }
        }
    }
    (problems, figures)
}

/// Whether `lease` is `task`'s latest and the task was withdrawn after it was granted: the run
/// under it finished as it was being stopped, before any second grant, so the allocator took
/// that completion as the task's and withdrew the waiting task (no second run).
fn stopped_as_it_ended(
    latest: &BTreeMap<TaskId, (LeaseId, bool)>,
    task: TaskId,
    lease: LeaseId,
) -> bool {
    latest.get(&task) == Some(&(lease, true))
}

/// Every lease in the journal against the cost events (`allot_billing::reconcile`, at the H100
/// price the simulated GPUs have): the problems and the total.
fn cost_problems(journal: &[Applied], costs: &[(String, CostAccrued)]) -> (Vec<String>, i64) {
    let r = allot_billing::reconcile::reconcile(journal, costs, |model| {
        (model == "H100").then_some(H100_HOUR)
    });
    (r.problems, r.total)
}

/// Checks everything a user would notice after the faults, waiting (bounded) for the cluster
/// to finish the work and billing to catch up; panics with every problem found.
fn assert_nothing_lost_or_doubled(
    streams: &dyn Streams,
    ids: &[String],
    logs: &dyn Fn() -> String,
) -> Figures {
    let finished = wait_for(Duration::from_secs(120), || {
        std::thread::sleep(Duration::from_millis(500));
        let finished = streams.finished();
        ids.iter()
            .all(|id| finished.contains_key(id))
            .then_some(finished)
    })
    .unwrap_or_else(|| {
        let finished = streams.finished();
        let left: Vec<_> = ids
            .iter()
            .filter(|id| !finished.contains_key(*id))
            .collect();
        panic!(
            "{} of {} workloads never finished: {left:?}\n{}",
            left.len(),
            ids.len(),
            logs()
        )
    });
    let failed: Vec<_> = ids
        .iter()
        .filter(|id| finished[*id] != WorkloadOutcome::Succeeded)
        .map(|id| (id, &finished[id]))
        .collect();
    assert!(
        failed.is_empty(),
        "workloads that did not succeed: {failed:?}"
    );

    // A workload's end and its last lease's release are decided by different services: wait
    // (bounded) for the journal to release what the executors reported ended.
    let mut last = (Vec::new(), Vec::new());
    let checked = wait_for(Duration::from_secs(60), || {
        let journal = streams.journal();
        let twice = gpus_granted_twice(&journal);
        let (problems, figures) = run_problems(
            &journal,
            &streams.events_on(names::WORKLOADS, "allot.task.>"),
            ids,
        );
        if twice.is_empty() && problems.is_empty() {
            return Some((journal, figures));
        }
        last = (twice, problems);
        std::thread::sleep(Duration::from_millis(500));
        None
    });
    let Some((journal, mut figures)) = checked else {
        let (twice, problems) = last;
        assert!(
            twice.is_empty(),
            "GPUs granted twice:\n{}",
            twice.join("\n")
        );
        panic!("tasks lost or run twice:\n{}", problems.join("\n"));
    };

    // Billing catches up with the journal; then every lease is billed exactly.
    let mut last = Vec::new();
    let billed = wait_for(Duration::from_secs(60), || {
        std::thread::sleep(Duration::from_millis(500));
        let (problems, total) = cost_problems(&journal, &streams.costs());
        last = problems;
        last.is_empty().then_some(total)
    });
    let Some(billed) = billed else {
        panic!("costs lost or doubled:\n{}\n{}", last.join("\n"), logs());
    };
    figures.billed_micros = billed;
    figures.nodes_unreachable = streams
        .events_on(names::INVENTORY, "")
        .iter()
        .filter(|e| matches!(e, AnyEvent::Inventory(InventoryEvent::NodeUnreachable(_))))
        .count();
    figures.remediation_actions = streams
        .events_on(names::REMEDIATION, "")
        .iter()
        .filter(|e| matches!(e, AnyEvent::Remediation(RemediationEvent::ActionTaken(_))))
        .count();
    figures
}

/// `allot costs --format json` run in `dir` against `nats` reports `want` in all.
fn assert_costs_report(dir: &Path, nats: Option<&str>, want: i64) {
    let mut cmd = allot(dir);
    cmd.args(["costs", "--format", "json"]);
    if let Some(nats) = nats {
        cmd.args(["--nats", nats]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["total_micros"].as_i64(),
        Some(want),
        "allot costs: {report}"
    );
}

/// Waits until the archive at `db` holds the whole DECISIONS stream, then checks
/// `allot audit verify` passes on it; the records verified.
fn assert_audit_verifies(streams: &dyn Streams, dir: &Path, db: &Path) -> u64 {
    let want = streams.last_sequence(names::DECISIONS);
    let mut out = String::new();
    let verified = wait_for(Duration::from_secs(60), || {
        std::thread::sleep(Duration::from_millis(500));
        let o = allot(dir)
            .args(["audit", "verify", "--db"])
            .arg(db)
            .output()
            .unwrap();
        out = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let records: u64 = out
            .lines()
            .find_map(|l| l.trim().strip_prefix("records"))?
            .trim()
            .parse()
            .ok()?;
        assert!(o.status.success(), "allot audit verify failed:\n{out}");
        (records >= want).then_some(records)
    });
    verified
        .unwrap_or_else(|| panic!("the archive never reached DECISIONS' {want} records:\n{out}"))
}

// ---------------------------------------------------------------------------------------------
// The checks themselves, on hand-made journals: each fires on what it is there to catch.

fn launch(workload: &str, name: &str) -> Launch {
    Launch {
        workload: workload.into(),
        name: name.into(),
        team: "nlp".into(),
        run: RunSpec::default(),
    }
}

fn entry(seq: u64, decisions: Vec<Decision>, dispatch: Vec<Dispatch>) -> Applied {
    Applied {
        pool: "default".into(),
        source: None,
        entry: Entry {
            seq,
            input: Input::TaskFinished {
                task: TaskId(0),
                at: 0,
                run: None,
            },
            decisions,
            rejected: None,
        },
        launch: None,
        dispatch,
    }
}

/// Task `task` (prep) of workload `w` granted lease `lease` of `gpus` (index, milli) on node
/// `n1` at `at`.
fn grant(seq: u64, w: &str, task: u64, lease: u64, gpus: &[(u32, u32)], at: u64) -> Applied {
    grant_task(seq, (w, "prep"), task, lease, gpus, at)
}

/// [`grant`] of the task named `name` of workload `w`.
fn grant_task(
    seq: u64,
    (w, name): (&str, &str),
    task: u64,
    lease: u64,
    gpus: &[(u32, u32)],
    at: u64,
) -> Applied {
    let (task, lease) = (TaskId(task), LeaseId(lease));
    entry(
        seq,
        vec![Decision::Granted {
            task,
            lease,
            placement: Placement::default(),
            at,
            reason: String::new(),
        }],
        vec![Dispatch {
            task,
            lease,
            launch: launch(w, name),
            nodes: vec![NodeGrant {
                node: "n1".into(),
                gpu_model: "H100".into(),
                gpus: gpus.to_vec(),
                mig: None,
                cpu_milli: 0,
                memory_mib: 0,
            }],
        }],
    )
}

fn release(seq: u64, task: u64, lease: u64, at: u64) -> Applied {
    entry(
        seq,
        vec![Decision::Released {
            task: TaskId(task),
            lease: LeaseId(lease),
            at,
        }],
        Vec::new(),
    )
}

fn preempt(seq: u64, task: u64, lease: u64, at: u64) -> Applied {
    entry(
        seq,
        vec![Decision::Preempted {
            task: TaskId(task),
            lease: LeaseId(lease),
            at,
            for_task: None,
            lost: 0,
            reason: String::new(),
        }],
        Vec::new(),
    )
}

fn withdraw(seq: u64, task: u64, at: u64) -> Applied {
    entry(
        seq,
        vec![Decision::Withdrawn {
            task: TaskId(task),
            reason: String::new(),
            at,
        }],
        Vec::new(),
    )
}

/// The executor's report that the run of `task` under `lease` started.
fn started(w: &str, name: &str, task: u64, lease: u64) -> AnyEvent {
    AnyEvent::Task(TaskEvent::Started(TaskStarted {
        pool: "default".into(),
        task: TaskId(task),
        node: "n1".into(),
        lease: LeaseId(lease),
        workload: w.into(),
        name: name.into(),
        how: "simulated".into(),
        log: None,
    }))
}

/// The executor's report that the run of `task` under `lease` completed.
fn completed(task: u64, lease: u64) -> AnyEvent {
    AnyEvent::Task(TaskEvent::Completed(TaskCompleted {
        pool: "default".into(),
        task: TaskId(task),
        node: "n1".into(),
        lease: LeaseId(lease),
    }))
}

fn cost(lease: u64, from_ms: u64, to_ms: u64, last: bool, amount: i64) -> CostAccrued {
    CostAccrued {
        team: "nlp".into(),
        workload: "w".into(),
        task_name: "prep".into(),
        task: TaskId(1),
        pool: "default".into(),
        lease: LeaseId(lease),
        from_ms,
        to_ms,
        last,
        currency: "EUR".into(),
        lines: Vec::new(),
        amount,
        idle: None,
    }
}

#[test]
fn the_fault_checks_catch_a_gpu_granted_twice_and_a_cost_lost_or_doubled() {
    struct Case {
        name: &'static str,
        journal: Vec<Applied>,
        want_gpu_problems: usize,
    }
    let cases = [
        Case {
            name: "one GPU, one lease after the other",
            journal: vec![
                grant(1, "a", 1, 1, &[(0, 1000)], 0),
                release(2, 1, 1, 10),
                grant(3, "b", 2, 2, &[(0, 1000)], 10),
            ],
            want_gpu_problems: 0,
        },
        Case {
            name: "two halves of one GPU",
            journal: vec![
                grant(1, "a", 1, 1, &[(0, 500)], 0),
                grant(2, "b", 2, 2, &[(0, 500)], 1),
            ],
            want_gpu_problems: 0,
        },
        Case {
            name: "a whole GPU granted while another lease holds it",
            journal: vec![
                grant(1, "a", 1, 1, &[(0, 1000), (1, 1000)], 0),
                grant(2, "b", 2, 2, &[(1, 1000)], 5),
            ],
            want_gpu_problems: 1,
        },
        Case {
            name: "a half granted beside a whole",
            journal: vec![
                grant(1, "a", 1, 1, &[(3, 1000)], 0),
                grant(2, "b", 2, 2, &[(3, 500)], 5),
            ],
            want_gpu_problems: 1,
        },
        Case {
            name: "a lease ended twice",
            journal: vec![
                grant(1, "a", 1, 1, &[(0, 1000)], 0),
                release(2, 1, 1, 10),
                release(3, 1, 1, 11),
            ],
            want_gpu_problems: 1,
        },
    ];
    for case in cases {
        let problems = gpus_granted_twice(&case.journal);
        assert_eq!(
            problems.len(),
            case.want_gpu_problems,
            "{}: {problems:?}",
            case.name
        );
    }

    // One H100 for 1.8 s: 1000 × 1800 × 2,900,000 ÷ 3.6 × 10⁹ = 1450 micro-units, billed in two
    // one-second periods.
    let journal = [
        grant(1, "a", 1, 1, &[(0, 1000)], 1_000_200),
        release(2, 1, 1, 1_002_000),
    ];
    let id = |i: u32| format!("event-{i}");
    let exact = vec![
        (id(1), cost(1, 1_000_200, 1_001_000, false, 644)),
        (id(2), cost(1, 1_001_000, 1_002_000, true, 806)),
    ];
    struct CostCase {
        name: &'static str,
        costs: Vec<(String, CostAccrued)>,
        want_problem: bool,
    }
    let mut redelivered = exact.clone();
    redelivered.push(exact[1].clone());
    let cases = [
        CostCase {
            name: "billed exactly",
            costs: exact.clone(),
            want_problem: false,
        },
        CostCase {
            name: "the same event twice (one id) counts once",
            costs: redelivered,
            want_problem: false,
        },
        CostCase {
            name: "the last period lost",
            costs: exact[..1].to_vec(),
            want_problem: true,
        },
        CostCase {
            name: "a period billed twice under two ids",
            costs: vec![
                exact[0].clone(),
                (id(3), exact[0].1.clone()),
                exact[1].clone(),
            ],
            want_problem: true,
        },
        CostCase {
            name: "a cent too much",
            costs: vec![
                exact[0].clone(),
                (id(2), cost(1, 1_001_000, 1_002_000, true, 807)),
            ],
            want_problem: true,
        },
        CostCase {
            name: "a lease the journal never granted",
            costs: [exact.clone(), vec![(id(4), cost(9, 0, 1, true, 1))]].concat(),
            want_problem: true,
        },
    ];
    for case in cases {
        let (problems, total) = cost_problems(&journal, &case.costs);
        assert_eq!(total, 1450, "{}", case.name);
        assert_eq!(
            !problems.is_empty(),
            case.want_problem,
            "{}: {problems:?}",
            case.name
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The matrix

/// Three simulated nodes of 4 H100s on `nats`, and every service the rows need: the planner
/// (ack wait 1 s), allocators a1 and a2 (lease TTL 2 s), the inventory (ack wait 1 s,
/// heartbeats every second), billing (one-second periods) and the archiver.
fn fleet(nats: Nats) -> Cluster {
    let mut cluster =
        Cluster::start_simulated_on(nats, &[("n1", 4), ("n2", 4), ("n3", 4)], SPEEDUP);
    // Restarted at once with a short ack wait, so a pause of a few seconds outlasts it.
    cluster.kill("planner");
    cluster.planner_with(&["--ack-wait", "1s"]);
    cluster.allocator("a2");
    let inventory = cluster.path("inventory");
    cluster.spawn(
        "inventory",
        &[
            "inventory",
            "--data-dir",
            inventory.to_str().unwrap(),
            "--ack-wait",
            "1s",
            "--heartbeat-interval",
            "1s",
        ],
    );
    cluster.billing();
    cluster.archiver();
    cluster
}

/// The checks every row ends with, on `cluster` after `submitter` has submitted its last
/// workload; prints the figures and returns them.
fn finish(cluster: &Cluster, submitter: Submitter, test: &str) -> Figures {
    let (ids, retries) = submitter.finish();
    let figures = assert_nothing_lost_or_doubled(cluster, &ids, &|| cluster.logs());
    cluster.assert_replay_verifies();
    assert_costs_report(
        cluster.dir.path(),
        Some(&cluster.server.url()),
        figures.billed_micros,
    );
    let records = assert_audit_verifies(cluster, cluster.dir.path(), &cluster.path("archive.db"));
    println!(
        "{test}: {} workloads, {figures:?}, {retries} submissions retried by the client, \
         {records} records archived and verified",
        ids.len()
    );
    figures
}

/// The first `LeaderElected` in the pool's journal after sequence `after`, if one comes within
/// `limit`: who, and how long after `since` it was stamped.
fn next_leader(
    cluster: &Cluster,
    after: u64,
    since: chrono::DateTime<chrono::Utc>,
    limit: Duration,
) -> Option<(String, Duration)> {
    wait_for(limit, || {
        std::thread::sleep(Duration::from_millis(150));
        cluster
            .envelopes_after(names::DECISIONS, "allot.alloc.default.journal", after)
            .into_iter()
            .find_map(|(_, e)| match e.data {
                AnyEvent::Alloc(AllocEvent::LeaderElected(l)) => {
                    Some((l.leader, (e.time - since).to_std().unwrap_or_default()))
                }
                _ => None,
            })
    })
}

/// The allocator leading the pool now.
fn leader(cluster: &Cluster) -> String {
    cluster.leaders().pop().expect("an allocator leads")
}

#[test]
fn a_nats_server_killed_under_the_streams_loses_and_doubles_nothing() {
    let _one = one_at_a_time();
    let mut cluster = fleet(Nats::Cluster(NatsCluster::start(3)));
    let submitter = Submitter::start(cluster.dir.path(), cluster.server.url());
    wait_progress(&cluster, &submitter, "the start", &|| cluster.logs());
    baseline(&cluster, &submitter, &|| cluster.logs());

    // The server leading the journal, then the one holding the allocators' lease bucket (after
    // the first came back): each SIGKILLed, and started again once the cluster works without it.
    for stream in [names::DECISIONS, "KV_allot-leases"] {
        let leader = cluster
            .stream_leader(stream)
            .unwrap_or_else(|| panic!("{stream} has a leader"));
        let led: Vec<&str> = [
            names::WORKLOADS,
            names::DECISIONS,
            names::COSTS,
            "KV_allot-leases",
        ]
        .into_iter()
        .filter(|s| cluster.stream_leader(s).as_deref() == Some(leader.as_str()))
        .collect();
        let node = cluster
            .server
            .cluster_mut()
            .nodes
            .iter()
            .position(|n| n.server_name() == leader)
            .unwrap();
        let killed = Instant::now();
        cluster.server.cluster_mut().kill_node(node);
        let elected = wait_for(Duration::from_secs(30), || {
            std::thread::sleep(Duration::from_millis(100));
            cluster.stream_leader(stream).filter(|l| *l != leader)
        })
        .unwrap_or_else(|| {
            panic!(
                "{stream} has no leader 30 s after its server {leader} died\n{}",
                cluster.logs()
            )
        });
        let elected_after = killed.elapsed();
        let progress = wait_progress(
            &cluster,
            &submitter,
            &format!("{leader} was killed"),
            &|| cluster.logs(),
        );
        println!(
            "SIGKILL {leader} (leading {led:?}): {stream} led by {elected} after {elected_after:?}; \
             a workload submitted after the kill finished {progress:?} later"
        );
        cluster.server.cluster_mut().restart_node(node);
        wait_progress(
            &cluster,
            &submitter,
            &format!("{leader} came back"),
            &|| cluster.logs(),
        );
    }
    finish(&cluster, submitter, "nats server faults");
}

#[test]
fn the_allocator_leader_killed_or_paused_and_services_paused_past_their_ack_wait_lose_nothing() {
    let _one = one_at_a_time();
    let mut cluster = fleet(Nats::Cluster(NatsCluster::start(3)));
    let submitter = Submitter::start(cluster.dir.path(), cluster.server.url());
    wait_progress(&cluster, &submitter, "the start", &|| cluster.logs());
    baseline(&cluster, &submitter, &|| cluster.logs());

    // SIGKILL the leader: the standby leads within TAKEOVER.
    let old = leader(&cluster);
    let after = cluster.last_sequence(names::DECISIONS);
    let at = chrono::Utc::now();
    cluster.kill(&format!("allocator-{old}"));
    let (new, took) = next_leader(&cluster, after, at, TAKEOVER).unwrap_or_else(|| {
        panic!(
            "no standby led within {TAKEOVER:?} of {old}'s death\n{}",
            cluster.logs()
        )
    });
    assert_ne!(new, old);
    println!("SIGKILL allocator leader {old}: {new} led {took:?} later");
    cluster.restart(&format!("allocator-{old}"));
    wait_progress(&cluster, &submitter, "the leader was killed", &|| {
        cluster.logs()
    });

    // SIGSTOP the leader past its 2 s lease: the standby leads; the old one, resumed, finds
    // itself deposed and stands by (its late writes are refused by the journal).
    let old = leader(&cluster);
    let after = cluster.last_sequence(names::DECISIONS);
    let at = chrono::Utc::now();
    cluster.signal(&format!("allocator-{old}"), "STOP");
    let took = next_leader(&cluster, after, at, TAKEOVER);
    std::thread::sleep(Duration::from_secs(1));
    cluster.signal(&format!("allocator-{old}"), "CONT");
    let (new, took) = took.unwrap_or_else(|| {
        panic!(
            "no standby led within {TAKEOVER:?} of pausing {old}\n{}",
            cluster.logs()
        )
    });
    assert_ne!(new, old);
    println!("SIGSTOP allocator leader {old} past its lease: {new} led {took:?} later");
    wait_progress(&cluster, &submitter, "the leader was paused", &|| {
        cluster.logs()
    });

    // SIGSTOP services: the planner and the inventory past their 1 s ack wait (the inventory
    // also past three missed heartbeats), billing and the archiver within their 30 s one.
    for (service, pause) in [
        ("planner", 4),
        ("inventory", 5),
        ("billing", 4),
        ("archiver", 4),
    ] {
        cluster.signal(service, "STOP");
        std::thread::sleep(Duration::from_secs(pause));
        cluster.signal(service, "CONT");
        let progress = wait_progress(
            &cluster,
            &submitter,
            &format!("{service} was paused"),
            &|| cluster.logs(),
        );
        println!(
            "SIGSTOP {service} for {pause} s: a workload submitted after the pause finished {progress:?} later"
        );
    }

    // The standby paused and the leader killed: nobody leads — the takeover check fires — until
    // the standby resumes.
    let old = leader(&cluster);
    let standby = if old == "a1" { "a2" } else { "a1" };
    cluster.signal(&format!("allocator-{standby}"), "STOP");
    let after = cluster.last_sequence(names::DECISIONS);
    cluster.kill(&format!("allocator-{old}"));
    let none = next_leader(&cluster, after, chrono::Utc::now(), TAKEOVER);
    let resumed = chrono::Utc::now();
    cluster.signal(&format!("allocator-{standby}"), "CONT");
    assert_eq!(
        none, None,
        "a leader was elected while the only standby was paused"
    );
    let (new, took) = next_leader(&cluster, after, resumed, TAKEOVER).unwrap_or_else(|| {
        panic!(
            "{standby}, resumed, did not lead within {TAKEOVER:?}\n{}",
            cluster.logs()
        )
    });
    assert_eq!(new, standby);
    println!(
        "SIGKILL leader {old} with standby {standby} paused: no leader for {TAKEOVER:?}; {standby} led {took:?} after SIGCONT"
    );
    cluster.restart(&format!("allocator-{old}"));
    let figures = finish(&cluster, submitter, "allocator and pauses");
    // No node stopped heartbeating: the inventory, paused past three missed heartbeats, must
    // not call the fleet unreachable when it wakes.
    assert_eq!(
        figures.nodes_unreachable,
        0,
        "nodes declared unreachable though none was\n{}",
        cluster.logs()
    );
}

/// `GET path` of the gateway at `addr` with `token`, as JSON, if it answered 200.
fn api_json(addr: &str, token: &str, path: &str) -> Option<serde_json::Value> {
    let (status, body) = api_get(addr, token, path)?;
    (status == 200).then_some(())?;
    serde_json::from_str(&body).ok()
}

/// What the gateway's API shows: every workload of `ids` succeeded with its three tasks, and the
/// costs add up to `billed`; waits (bounded) for it to catch up.
fn assert_gateway_shows(addr: &str, token: &str, ids: &[String], billed: i64) {
    let mut last = String::new();
    let shown = wait_for(Duration::from_secs(60), || {
        std::thread::sleep(Duration::from_millis(500));
        let mut states = BTreeMap::new();
        let mut cursor = String::new();
        loop {
            let page = api_json(addr, token, &format!("/api/v1/workloads?limit=100{cursor}"))?;
            for w in page["items"].as_array()? {
                let tasks = w["tasks"].to_string();
                states.insert(
                    w["id"].as_str()?.to_owned(),
                    format!("{} {tasks}", w["state"].as_str()?),
                );
            }
            match page["next_cursor"].as_str() {
                Some(next) => cursor = format!("&cursor={next}"),
                None => break,
            }
        }
        let costs = api_json(addr, token, "/api/v1/costs")?;
        let total: i64 = costs["teams"]
            .as_array()?
            .iter()
            .filter_map(|t| t["amount_micros"].as_i64())
            .sum();
        let want = r#"succeeded {"succeeded":3}"#;
        let wrong: Vec<_> = ids
            .iter()
            .filter(|id| states.get(*id).map(String::as_str) != Some(want))
            .collect();
        last = format!(
            "{} workloads not shown as succeeded with 3 tasks (e.g. {:?}); costs {total}, billed {billed}",
            wrong.len(),
            wrong.first().map(|id| (id, states.get(*id)))
        );
        (wrong.is_empty() && total == billed).then_some(())
    });
    assert!(shown.is_some(), "the gateway's API: {last}");
}

#[test]
fn every_service_killed_and_restarted_in_turn_loses_and_doubles_nothing() {
    let _one = one_at_a_time();
    let mut cluster = fleet(Nats::Cluster(NatsCluster::start(3)));
    cluster.predictor();
    let remediation = cluster.path("remediation");
    cluster.spawn(
        "remediation",
        &["remediation", "--data-dir", remediation.to_str().unwrap()],
    );
    let gateway = cluster.path("gateway");
    let token_file = cluster.path("admin.token");
    let addr = format!("127.0.0.1:{}", free_port());
    cluster.spawn(
        "gateway",
        &[
            "gateway",
            "--data-dir",
            gateway.to_str().unwrap(),
            "--listen",
            &addr,
            "--admin-token-file",
            token_file.to_str().unwrap(),
        ],
    );
    let submitter = Submitter::start(cluster.dir.path(), cluster.server.url());
    wait_progress(&cluster, &submitter, "the start", &|| cluster.logs());
    baseline(&cluster, &submitter, &|| cluster.logs());

    let leader = leader(&cluster);
    let standby = if leader == "a1" { "a2" } else { "a1" };
    let services = [
        "inventory".to_owned(),
        "planner".to_owned(),
        format!("allocator-{leader}"),
        format!("allocator-{standby}"),
        "billing".to_owned(),
        "archiver".to_owned(),
        "predictor".to_owned(),
        "remediation".to_owned(),
        "gateway".to_owned(),
        "collector-n1".to_owned(),
        "collector-n2".to_owned(),
        "collector-n3".to_owned(),
    ];
    for service in &services {
        let after = cluster.last_sequence(names::DECISIONS);
        let at = chrono::Utc::now();
        cluster.kill(service);
        // A leader's death hands the pool to the standby within TAKEOVER.
        let takeover = match service.strip_prefix("allocator-") {
            Some(killed) => {
                let (new, took) = next_leader(&cluster, after, at, TAKEOVER).unwrap_or_else(|| {
                    panic!(
                        "no standby led within {TAKEOVER:?} of {killed}'s death\n{}",
                        cluster.logs()
                    )
                });
                assert_ne!(new, killed);
                format!("; {new} led {took:?} later")
            }
            None => {
                std::thread::sleep(Duration::from_secs(1));
                String::new()
            }
        };
        cluster.restart(service);
        let progress = wait_progress(
            &cluster,
            &submitter,
            &format!("{service} was killed"),
            &|| cluster.logs(),
        );
        println!(
            "SIGKILL {service}, restarted{takeover}: a workload submitted after the restart finished {progress:?} later"
        );
    }

    let (ids, retries) = submitter.finish();
    let figures = assert_nothing_lost_or_doubled(&cluster, &ids, &|| cluster.logs());
    cluster.assert_replay_verifies();
    assert_costs_report(
        cluster.dir.path(),
        Some(&cluster.server.url()),
        figures.billed_micros,
    );
    let records = assert_audit_verifies(&cluster, cluster.dir.path(), &cluster.path("archive.db"));
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert_gateway_shows(&addr, token.trim(), &ids, figures.billed_micros);
    println!(
        "every service in turn: {} workloads, {figures:?}, {retries} submissions retried by the \
         client, {records} records archived and verified",
        ids.len()
    );
}

/// The streams of an `allot up`, read as its admin (the folder's credentials).
struct UpStreams {
    rt: tokio::runtime::Runtime,
    client: async_nats::Client,
}

impl UpStreams {
    fn connect(dir: &Path) -> (UpStreams, String) {
        let creds = dir.join(".allot/auth/admin.credentials.json");
        let creds: allot_bus::Credentials =
            serde_json::from_str(&std::fs::read_to_string(creds).unwrap()).unwrap();
        // The test's own reader must not be what is slow to recover: its client reconnects in
        // the background (a worker thread) every 100 ms, not after the library's growing
        // backoff, which delayed seeing the restarted instance's progress by about 10 s.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let client = rt
            .block_on(
                creds
                    .connect_options()
                    .reconnect_delay_callback(|_| Duration::from_millis(100))
                    .connect(creds.url.as_str()),
            )
            .unwrap();
        let url = allot_bus::users::url_with_credentials(&creds.url, &creds.user, &creds.password);
        (UpStreams { rt, client }, url)
    }
}

impl Streams for UpStreams {
    fn envelopes_after(&self, stream: &str, filter: &str, after: u64) -> Vec<(u64, Envelope)> {
        crate::cluster::read_envelopes(&self.rt, &self.client, stream, filter, after)
    }
    fn last_sequence(&self, stream: &str) -> u64 {
        crate::cluster::last_sequence(&self.rt, &self.client, stream)
    }
}

#[test]
fn allot_up_killed_mid_run_and_restarted_in_the_same_folder_loses_and_doubles_nothing() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // The same ports both times, so clients find the restarted instance where the first was.
    let nats_port = free_port().to_string();
    let gateway = format!("127.0.0.1:{}", free_port());
    let up = |name: &str| {
        let mut cmd = allot(dir);
        cmd.args(["up", "--sim-nodes", "3", "--sim-gpus", "4"])
            .args(["--sim-speedup", &SPEEDUP.to_string()])
            .args(["--heartbeat-interval", "500ms", "--nats-port", &nats_port])
            .args(["--listen", &gateway]);
        spawn_logged(cmd, dir, name)
    };
    let logs = || {
        format!(
            "first:\n{}\nagain:\n{}",
            log_of(dir, "up-first"),
            log_of(dir, "up-again")
        )
    };
    let mut first = up("up-first");
    crate::support::gateway_of(dir, "up-first");
    let (streams, url) = UpStreams::connect(dir);
    let submitter = Submitter::start(dir, url);
    wait_progress(&streams, &submitter, "the start", &logs);
    baseline(&streams, &submitter, &logs);
    std::thread::sleep(Duration::from_secs(2));

    // SIGKILL: no goodbye from any service; its nats-server dies with it (PR_SET_PDEATHSIG).
    let submitted = submitter.count();
    first.kill().unwrap();
    first.wait().unwrap();
    let port: u16 = nats_port.parse().unwrap();
    wait_for(Duration::from_secs(30), || {
        std::net::TcpListener::bind(("127.0.0.1", port))
            .ok()
            .map(drop)
    })
    .unwrap_or_else(|| {
        panic!(
            "the killed instance's nats-server kept its port\n{}",
            logs()
        )
    });
    std::thread::sleep(Duration::from_secs(1));
    let restarted = Instant::now();
    let mut again = up("up-again");
    let progress = wait_progress(&streams, &submitter, "allot up was restarted", &logs);
    println!(
        "SIGKILL allot up after {submitted} submissions, restarted in the same folder: a workload \
         submitted after the restart finished {progress:?} later ({:?} after the restart)",
        restarted.elapsed()
    );

    let (ids, retries) = submitter.finish();
    let figures = assert_nothing_lost_or_doubled(&streams, &ids, &logs);
    let out = allot(dir)
        .args(["replay", "--verify", "--pool", "default"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "replay --verify failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_costs_report(dir, None, figures.billed_micros);
    let records = assert_audit_verifies(&streams, dir, &dir.join(".allot/archive.db"));
    let token = std::fs::read_to_string(dir.join(".allot/admin.token")).unwrap();
    assert_gateway_shows(&gateway, token.trim(), &ids, figures.billed_micros);
    println!(
        "allot up restarted: {} workloads, {figures:?}, {retries} submissions retried by the \
         client, {records} records archived and verified",
        ids.len()
    );
    terminate(&again);
    let exit = wait_exit(&mut again, Duration::from_secs(30));
    assert!(
        exit.is_some_and(|s| s.success()),
        "allot up did not stop cleanly: {exit:?}\n{}",
        logs()
    );
}

#[test]
fn the_run_check_catches_a_task_lost_started_twice_or_completed_twice() {
    // Workload w's three tasks (1 prep, 2 train, 3 probe), each granted, run and released once.
    let journal = |extra: Vec<Applied>| {
        let mut j = Vec::new();
        for (i, name) in TASKS.iter().enumerate() {
            let id = i as u64 + 1;
            j.push(grant_task(
                2 * id,
                ("w", name),
                id,
                id,
                &[(i as u32, 1000)],
                0,
            ));
        }
        j.extend(extra);
        j
    };
    let released = |ids: &[u64]| -> Vec<Applied> {
        ids.iter().map(|&id| release(10 + id, id, id, 5)).collect()
    };
    let runs = |ids: &[u64]| -> Vec<AnyEvent> {
        ids.iter()
            .flat_map(|&id| {
                [
                    started("w", TASKS[id as usize - 1], id, id),
                    completed(id, id),
                ]
            })
            .collect()
    };
    struct Case {
        name: &'static str,
        journal: Vec<Applied>,
        events: Vec<AnyEvent>,
        want_problems: usize,
        want_late: usize,
    }
    let cases = [
        Case {
            name: "each task granted, started and completed once",
            journal: journal(released(&[1, 2, 3])),
            events: runs(&[1, 2, 3]),
            want_problems: 0,
            want_late: 0,
        },
        Case {
            name: "a task that never completed",
            journal: journal(released(&[1, 2])),
            events: runs(&[1, 2]),
            // Its lease never ended, and it never completed.
            want_problems: 2,
            want_late: 0,
        },
        Case {
            name: "a run started twice",
            journal: journal(released(&[1, 2, 3])),
            events: [runs(&[1, 2, 3]), vec![started("w", "train", 2, 2)]].concat(),
            // The lease started twice, and so did the completed run.
            want_problems: 2,
            want_late: 0,
        },
        Case {
            name: "a task completed twice",
            journal: journal(released(&[1, 2, 3])),
            events: [runs(&[1, 2, 3]), vec![completed(2, 2)]].concat(),
            want_problems: 1,
            want_late: 0,
        },
        Case {
            name: "a run that completed as it was preempted, and ran again",
            journal: journal(
                [
                    released(&[1, 3]),
                    vec![
                        preempt(20, 2, 2, 3),
                        grant_task(21, ("w", "train"), 2, 4, &[(1, 1000)], 3),
                        release(22, 2, 4, 6),
                    ],
                ]
                .concat(),
            ),
            events: [
                runs(&[1, 2, 3]),
                vec![started("w", "train", 2, 4), completed(2, 4)],
            ]
            .concat(),
            want_problems: 0,
            want_late: 1,
        },
        Case {
            name: "a run that completed as it was preempted, its waiting task withdrawn",
            journal: journal(
                [
                    released(&[1, 3]),
                    vec![preempt(20, 2, 2, 3), withdraw(21, 2, 4)],
                ]
                .concat(),
            ),
            events: runs(&[1, 2, 3]),
            want_problems: 0,
            want_late: 0,
        },
        Case {
            name: "a run that completed as it was preempted, and nothing ran it again",
            journal: journal([released(&[1, 3]), vec![preempt(20, 2, 2, 3)]].concat()),
            events: runs(&[1, 2, 3]),
            // Its completion was refused, and the task never ran again.
            want_problems: 1,
            want_late: 1,
        },
    ];
    for case in cases {
        let (problems, figures) = run_problems(&case.journal, &case.events, &["w".to_owned()]);
        assert_eq!(
            problems.len(),
            case.want_problems,
            "{}: {problems:?}",
            case.name
        );
        assert_eq!(figures.late_completions, case.want_late, "{}", case.name);
    }
}
