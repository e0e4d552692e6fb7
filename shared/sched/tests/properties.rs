//! Invariants of the scheduling core, for every policy in [`policy::NAMES`]: random clusters and
//! workloads are driven through a small event loop (submit, schedule, finish what ran long
//! enough), and each property is checked against the decisions alone — capacity, leases, gangs
//! and quotas are booked here independently of the scheduler's own view, then compared with it.
//!
//! A preempted task keeps the work it has done (its remaining time is what it still had to run
//! when it stopped); the scheduler requeues it itself and the loop waits for it to be granted
//! again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use allot_sched::model::WHOLE_GPU_MILLI;
use allot_sched::policy::{self, NAMES};
use allot_sched::quota::{Quota, Quotas};
use allot_sched::{
    ApplyError, Cluster, Decision, Input, LeaseId, NodeSpec, Placement, Scheduler, TaskId,
    TaskSpec, Time,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const MODELS: [&str; 3] = ["H100", "A100", "L40S"];
const TEAMS: [&str; 3] = ["a", "b", "c"];
const MINUTE: Time = 60_000;

/// 32 cases by default: each case runs every policy, so a property sees 32 × 9 runs of up to 80
/// tasks, a few seconds in debug. `PROPTEST_CASES` asks for more.
fn config() -> ProptestConfig {
    let default = ProptestConfig::default();
    let cases = if std::env::var_os("PROPTEST_CASES").is_some() {
        default.cases
    } else {
        32
    };
    ProptestConfig {
        cases,
        // Failing cases are reported, not written next to the sources.
        failure_persistence: None,
        ..default
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios

/// A cluster, the teams' quotas and a workload.
#[derive(Clone)]
struct Scenario {
    nodes: Vec<NodeSpec>,
    quotas: Vec<(String, Quota)>,
    arrivals: Vec<Arrival>,
}

/// A task and when it is submitted.
#[derive(Clone)]
struct Arrival {
    at: Time,
    task: TaskSpec,
}

impl Scenario {
    fn spec(&self, id: TaskId) -> Option<&TaskSpec> {
        self.arrivals.iter().map(|a| &a.task).find(|t| t.id == id)
    }

    /// The same scenario with only the tasks `keep` accepts.
    fn only(&self, mut keep: impl FnMut(&TaskSpec) -> bool) -> Self {
        Self {
            nodes: self.nodes.clone(),
            quotas: self.quotas.clone(),
            arrivals: self
                .arrivals
                .iter()
                .filter(|a| keep(&a.task))
                .cloned()
                .collect(),
        }
    }

    /// The quotas as the scheduler holds them, with nothing used.
    fn idle_quotas(&self) -> Quotas {
        let mut quotas = Quotas::default();
        for (team, quota) in &self.quotas {
            quotas.set(team, *quota);
        }
        quotas
    }

    /// Whether some placement of `task` exists on the empty cluster, by the placement rules
    /// (crate `placement` docs): one node of an accepted model with enough GPUs, a fraction on
    /// any accepted GPU, or — larger than every node of a model — enough whole nodes of that
    /// model's largest size.
    fn fits_empty(&self, task: &TaskSpec) -> bool {
        let accepted = || self.nodes.iter().filter(|n| task.accepts(&n.gpu_model));
        if accepted().any(|n| n.gpus >= task.gpus) {
            return true;
        }
        MODELS.iter().filter(|m| task.accepts(m)).any(|model| {
            let of_model = || self.nodes.iter().filter(|n| n.gpu_model == *model);
            let Some(size) = of_model().map(|n| n.gpus).max() else {
                return false;
            };
            let largest = of_model().filter(|n| n.gpus == size).count() as u32;
            largest >= task.gpus.div_ceil(size)
        })
    }
}

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "nodes:")?;
        for (i, n) in self.nodes.iter().enumerate() {
            writeln!(f, "  n{i}: {} x {}", n.gpus, n.gpu_model)?;
        }
        if !self.quotas.is_empty() {
            writeln!(f, "quotas (milli-GPU):")?;
            for (team, q) in &self.quotas {
                writeln!(
                    f,
                    "  {team}: nominal {}, borrowing limit {:?}",
                    q.nominal_milli, q.borrowing_limit_milli
                )?;
            }
        }
        writeln!(f, "tasks:")?;
        for a in &self.arrivals {
            let t = &a.task;
            let shape = if t.gpu_milli < WHOLE_GPU_MILLI {
                format!("{} milli-GPU", t.gpu_milli)
            } else {
                format!("{} GPUs", t.gpus)
            };
            writeln!(
                f,
                "  {} at {} min: team {} prio {} {shape} {:?} for {} min",
                t.id,
                a.at / MINUTE,
                t.team,
                t.priority,
                t.gpu_models,
                t.oracle_duration.unwrap_or(0) / MINUTE
            )?;
        }
        Ok(())
    }
}

fn node(i: usize, gpus: u32, model: &str) -> NodeSpec {
    NodeSpec::new(format!("n{i}"), gpus, model)
}

/// What a task asks for: whole GPUs, or a share of one.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Whole(u32),
    Fraction(u32),
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        3 => (1u32..=4).prop_map(Shape::Whole),
        1 => (1u32..=16).prop_map(Shape::Whole),
        // Multiples of 50 so that shares often add up to exactly one GPU.
        2 => (2u32..=18).prop_map(|k| Shape::Fraction(k * 50)),
    ]
}

fn task(
    id: usize,
    shape: Shape,
    model: Option<usize>,
    team: usize,
    priority: i32,
    minutes: u64,
) -> TaskSpec {
    let mut t = TaskSpec::new(id as u64, TEAMS[team], 1);
    match shape {
        Shape::Whole(gpus) => t.gpus = gpus,
        Shape::Fraction(milli) => t.gpu_milli = milli,
    }
    t.gpu_models = model.map(|m| MODELS[m].to_owned()).into_iter().collect();
    t.priority = priority;
    t.oracle_duration = Some(minutes * MINUTE);
    t
}

fn scenario() -> impl Strategy<Value = Scenario> {
    let nodes = (1..=MODELS.len())
        .prop_flat_map(|models| prop::collection::vec((1u32..=8, 0..models), 1..=12));
    let quota = (
        0u64..=48,
        prop::option::of(0u64..=16),
        prop::option::of(0u64..=48),
    )
        .prop_map(|(nominal, borrow, lend)| Quota {
            borrowing_limit_milli: borrow.map(|l| l * 500),
            lending_limit_milli: lend.map(|l| l * 500),
            ..Quota::gpus(nominal * 500)
        });
    let quotas = prop::option::weighted(
        0.5,
        prop::collection::vec(prop::option::of(quota), TEAMS.len()),
    );
    let arrival = (
        0u64..=40,
        shape(),
        prop::option::weighted(0.25, 0..MODELS.len()),
        0..TEAMS.len(),
        0i32..=2,
        1u64..=120,
    );
    let arrivals = prop::collection::vec(arrival, 1..=80);
    (nodes, quotas, arrivals).prop_map(|(nodes, quotas, arrivals)| Scenario {
        nodes: nodes
            .into_iter()
            .enumerate()
            .map(|(i, (gpus, m))| node(i, gpus, MODELS[m]))
            .collect(),
        quotas: quotas
            .into_iter()
            .flatten()
            .zip(TEAMS)
            .filter_map(|(q, team)| q.map(|q| (team.to_owned(), q)))
            .collect(),
        arrivals: arrivals
            .into_iter()
            .enumerate()
            .map(
                |(id, (at, shape, model, team, priority, minutes))| Arrival {
                    at: at * MINUTE,
                    task: task(id, shape, model, team, priority, minutes),
                },
            )
            .collect(),
    })
}

// ---------------------------------------------------------------------------------------------
// The event loop

/// One input the loop applied, what it returned, and the scheduler's books right after.
#[derive(Debug)]
struct Step {
    input: Input,
    result: Result<Vec<Decision>, ApplyError>,
    books: Books,
}

/// The scheduler's own view after a step, compared with what its decisions imply.
#[derive(Debug, PartialEq, Eq)]
struct Books {
    /// Free milli-GPU, by node and GPU.
    gpu_free: Vec<Vec<u32>>,
    /// Milli-GPU used, by team.
    usage: BTreeMap<&'static str, u64>,
    cohort_usage: u64,
}

/// Everything one run of the loop saw.
#[derive(Debug)]
struct Run {
    policy: &'static str,
    steps: Vec<Step>,
    /// Teams' quotas as the scheduler reports them after setup.
    quota: BTreeMap<&'static str, Quota>,
    cohort_nominal: u64,
    rejected: BTreeSet<TaskId>,
    finished: BTreeSet<TaskId>,
}

impl Run {
    fn apply(&mut self, scheduler: &mut Scheduler, input: Input) -> Vec<Decision> {
        let result = scheduler.apply(input.clone());
        let quotas = scheduler.quotas();
        let books = Books {
            gpu_free: scheduler
                .cluster()
                .nodes()
                .iter()
                .map(|n| n.gpu_free.clone())
                .collect(),
            usage: TEAMS.iter().map(|t| (*t, quotas.usage(t))).collect(),
            cohort_usage: quotas.cohort_usage(),
        };
        let decisions = result.clone().unwrap_or_default();
        self.steps.push(Step {
            input,
            result,
            books,
        });
        decisions
    }

    /// Every decision, with the index of the step that made it.
    fn decisions(&self) -> impl Iterator<Item = (usize, &Decision)> {
        self.steps.iter().enumerate().flat_map(|(i, s)| {
            s.result
                .as_ref()
                .map(|d| d.as_slice())
                .unwrap_or_default()
                .iter()
                .map(move |d| (i, d))
        })
    }
}

/// Runs `scenario` under `policy` until nothing is left to happen.
fn drive(policy: &'static str, scenario: &Scenario) -> Run {
    let mut scheduler = Scheduler::new(policy::by_name(policy).expect("a policy of NAMES"));
    let mut run = Run {
        policy,
        steps: Vec::new(),
        quota: BTreeMap::new(),
        cohort_nominal: 0,
        rejected: BTreeSet::new(),
        finished: BTreeSet::new(),
    };
    for node in &scenario.nodes {
        run.apply(&mut scheduler, Input::NodeAdded(node.clone()));
    }
    for (team, quota) in &scenario.quotas {
        let input = Input::TeamQuota {
            team: team.clone(),
            quota: *quota,
        };
        run.apply(&mut scheduler, input);
    }
    run.quota = TEAMS
        .iter()
        .map(|t| (*t, scheduler.quotas().quota(t)))
        .collect();
    run.cohort_nominal = scheduler.quotas().cohort_nominal();

    let mut arrivals: BTreeMap<Time, Vec<&TaskSpec>> = BTreeMap::new();
    for a in &scenario.arrivals {
        arrivals.entry(a.at).or_default().push(&a.task);
    }
    // Work left per task, and when each running task last started.
    let mut left: HashMap<TaskId, Time> = scenario
        .arrivals
        .iter()
        .map(|a| (a.task.id, a.task.oracle_duration.unwrap_or(MINUTE)))
        .collect();
    let mut running: BTreeMap<TaskId, Time> = BTreeMap::new();
    let follow = |decisions: &[Decision],
                  now: Time,
                  running: &mut BTreeMap<TaskId, Time>,
                  left: &mut HashMap<TaskId, Time>,
                  finished: &mut BTreeSet<TaskId>| {
        for d in decisions {
            match d {
                Decision::Granted { task, .. } => {
                    running.insert(*task, now);
                }
                Decision::Preempted { task, .. } => {
                    if let Some(since) = running.remove(task) {
                        let l = left.entry(*task).or_default();
                        *l = l.saturating_sub(now - since);
                    }
                }
                Decision::Released { task, .. } => {
                    running.remove(task);
                    finished.insert(*task);
                }
                Decision::Waiting { .. } => {}
            }
        }
    };

    // Every turn finishes or submits at least one task, so the loop ends; the bound only
    // guards against a scheduler that grants what is already running.
    for _ in 0..4 * scenario.arrivals.len() + 4 {
        let next_finish = running.iter().map(|(id, since)| since + left[id]).min();
        let next_arrival = arrivals.keys().next().copied();
        let Some(now) = next_finish.into_iter().chain(next_arrival).min() else {
            break;
        };
        let done: Vec<TaskId> = running
            .iter()
            .filter(|(id, since)| **since + left[*id] == now)
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            let decisions = run.apply(&mut scheduler, Input::TaskFinished { task: id, at: now });
            follow(&decisions, now, &mut running, &mut left, &mut run.finished);
            // A finish the scheduler refused must not come back every turn.
            running.remove(&id);
        }
        for task in arrivals.remove(&now).unwrap_or_default() {
            let input = Input::TaskSubmitted {
                task: task.clone(),
                at: now,
            };
            run.apply(&mut scheduler, input);
            if let Some(Err(ApplyError::Unplaceable { .. })) = run.steps.last().map(|s| &s.result) {
                run.rejected.insert(task.id);
            }
        }
        let decisions = run.apply(&mut scheduler, Input::Schedule { at: now });
        follow(&decisions, now, &mut running, &mut left, &mut run.finished);
    }
    run
}

fn each_policy(
    scenario: &Scenario,
    check: impl Fn(&Scenario, &Run) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    for name in NAMES {
        check(scenario, &drive(name, scenario))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Checks

/// The spec of a task the run granted.
fn submitted<'a>(
    scenario: &'a Scenario,
    run: &Run,
    task: TaskId,
) -> Result<&'a TaskSpec, TestCaseError> {
    scenario.spec(task).ok_or_else(|| {
        TestCaseError::fail(format!(
            "{}: {task} was granted, never submitted",
            run.policy
        ))
    })
}

/// Books milli-GPU per GPU from the decisions; each GPU holds at most one GPU's worth, and the
/// scheduler's free capacity after every step is what its decisions leave.
fn gpus_hold_at_most_their_capacity(scenario: &Scenario, run: &Run) -> Result<(), TestCaseError> {
    let policy = run.policy;
    let mut used: Vec<Vec<u32>> = scenario
        .nodes
        .iter()
        .map(|n| vec![0; n.gpus as usize])
        .collect();
    let mut leases: HashMap<LeaseId, &Placement> = HashMap::new();
    for (i, step) in run.steps.iter().enumerate() {
        for d in step
            .result
            .as_ref()
            .map(|d| d.as_slice())
            .unwrap_or_default()
        {
            match d {
                Decision::Granted {
                    task,
                    lease,
                    placement,
                    ..
                } => {
                    for share in &placement.shares {
                        for (gpu, milli) in &share.gpus {
                            let slot = used
                                .get_mut(share.node.0 as usize)
                                .and_then(|n| n.get_mut(*gpu as usize));
                            prop_assert!(
                                slot.is_some(),
                                "{policy}: {task} was granted GPU {gpu} of node {}, which does not \
                                 exist",
                                share.node.0
                            );
                            if let Some(slot) = slot {
                                *slot += milli;
                                prop_assert!(
                                    *slot <= WHOLE_GPU_MILLI,
                                    "{policy}: step {i}: granting {task} puts {} milli-GPU on GPU \
                                     {gpu} of n{}",
                                    *slot,
                                    share.node.0
                                );
                            }
                        }
                    }
                    leases.insert(*lease, placement);
                }
                Decision::Preempted { lease, .. } | Decision::Released { lease, .. } => {
                    for share in leases.remove(lease).map(|p| &p.shares[..]).unwrap_or(&[]) {
                        for (gpu, milli) in &share.gpus {
                            let slot = &mut used[share.node.0 as usize][*gpu as usize];
                            *slot = slot.saturating_sub(*milli);
                        }
                    }
                }
                Decision::Waiting { .. } => {}
            }
        }
        // Nodes join one step at a time: compare those that have.
        let want: Vec<Vec<u32>> = used[..step.books.gpu_free.len()]
            .iter()
            .map(|n| {
                n.iter()
                    .map(|u| WHOLE_GPU_MILLI.saturating_sub(*u))
                    .collect()
            })
            .collect();
        prop_assert_eq!(
            &step.books.gpu_free,
            &want,
            "{}: after step {} ({:?}) the scheduler's free GPUs disagree with its decisions",
            policy,
            i,
            &step.input
        );
    }
    Ok(())
}

/// Leases open and close in order: a grant only for a task not running, a preemption or release
/// only of a running task's current lease; submissions and finishes are answered as they should.
fn leases_open_and_close_in_order(scenario: &Scenario, run: &Run) -> Result<(), TestCaseError> {
    let policy = run.policy;
    let mut running: HashMap<TaskId, LeaseId> = HashMap::new();
    let mut leases: BTreeSet<LeaseId> = BTreeSet::new();
    for (i, step) in run.steps.iter().enumerate() {
        match (&step.input, &step.result) {
            (Input::TaskSubmitted { task, .. }, Err(ApplyError::Unplaceable { task: id, .. })) => {
                prop_assert_eq!(task.id, *id);
            }
            (Input::TaskFinished { task, .. }, Ok(d)) => {
                let released: Vec<TaskId> = d
                    .iter()
                    .filter_map(|d| match d {
                        Decision::Released { task, .. } => Some(*task),
                        _ => None,
                    })
                    .collect();
                prop_assert_eq!(
                    &released,
                    &vec![*task],
                    "{}: finishing {} released something else",
                    policy,
                    task
                );
            }
            (_, Err(e)) => {
                prop_assert!(false, "{policy}: step {i} ({:?}) failed: {e}", step.input);
            }
            _ => {}
        }
        for d in step
            .result
            .as_ref()
            .map(|d| d.as_slice())
            .unwrap_or_default()
        {
            match d {
                Decision::Granted { task, lease, .. } => {
                    prop_assert!(
                        !running.contains_key(task),
                        "{policy}: step {i}: {task} granted while running"
                    );
                    prop_assert!(
                        leases.insert(*lease),
                        "{policy}: step {i}: lease {lease:?} granted twice"
                    );
                    prop_assert!(
                        scenario.spec(*task).is_some(),
                        "{policy}: {task} was never submitted"
                    );
                    running.insert(*task, *lease);
                }
                Decision::Preempted { task, lease, .. }
                | Decision::Released { task, lease, .. } => {
                    prop_assert_eq!(
                        running.remove(task),
                        Some(*lease),
                        "{}: step {}: {:?} of a task not running on that lease",
                        policy,
                        i,
                        d
                    );
                }
                Decision::Waiting { task, .. } => {
                    prop_assert!(
                        !running.contains_key(task),
                        "{policy}: step {i}: {task} told to wait while running"
                    );
                }
            }
        }
    }
    Ok(())
}

/// Every grant is the whole request and nothing else: exactly the whole GPUs asked for on one
/// node, or whole nodes of one size when larger than a node (as few as hold it), or exactly the
/// fraction on one GPU; never part of a gang.
fn gangs_are_granted_whole(scenario: &Scenario, run: &Run) -> Result<(), TestCaseError> {
    let policy = run.policy;
    for (i, d) in run.decisions() {
        let Decision::Granted {
            task, placement, ..
        } = d
        else {
            continue;
        };
        let spec = submitted(scenario, run, *task)?;
        let slots: Vec<(u32, u32, u32)> = placement
            .shares
            .iter()
            .flat_map(|s| s.gpus.iter().map(move |(g, m)| (s.node.0, *g, *m)))
            .collect();
        let distinct: BTreeSet<(u32, u32)> = slots.iter().map(|(n, g, _)| (*n, *g)).collect();
        prop_assert_eq!(
            distinct.len(),
            slots.len(),
            "{}: step {}: {} holds a GPU twice: {:?}",
            policy,
            i,
            task,
            placement
        );
        let nodes: BTreeSet<u32> = placement.shares.iter().map(|s| s.node.0).collect();
        prop_assert_eq!(
            nodes.len(),
            placement.shares.len(),
            "{}: a node twice",
            policy
        );
        if spec.gpu_milli < WHOLE_GPU_MILLI {
            prop_assert_eq!(
                &slots[..],
                &[(slots[0].0, slots[0].1, spec.gpu_milli)][..],
                "{}: step {}: fraction {} got {:?}",
                policy,
                i,
                task,
                placement
            );
            continue;
        }
        prop_assert!(
            slots.iter().all(|(_, _, m)| *m == WHOLE_GPU_MILLI),
            "{policy}: step {i}: whole-GPU {task} got part of a GPU: {placement:?}"
        );
        if let [_] = placement.shares[..] {
            prop_assert_eq!(
                slots.len(),
                spec.gpus as usize,
                "{}: step {}: {} asked for {} GPUs and got {:?}",
                policy,
                i,
                task,
                spec.gpus,
                placement
            );
            continue;
        }
        let size = scenario.nodes[placement.shares[0].node.0 as usize].gpus;
        for share in &placement.shares {
            let gpus = scenario.nodes[share.node.0 as usize].gpus;
            let whole: Vec<u32> = share.gpus.iter().map(|(g, _)| *g).collect();
            prop_assert!(
                gpus == size && whole == (0..size).collect::<Vec<_>>(),
                "{policy}: step {i}: {task} spans nodes but does not take whole nodes of one size: \
                 {placement:?}"
            );
        }
        prop_assert!(
            spec.gpus > size
                && placement.shares.len() as u32 == spec.gpus.div_ceil(size)
                && slots.len() as u32 >= spec.gpus,
            "{policy}: step {i}: {task} asked for {} GPUs and got {} nodes of {size}",
            spec.gpus,
            placement.shares.len()
        );
    }
    Ok(())
}

/// Every share is on a node whose GPU model the task accepts.
fn tasks_run_on_models_they_accept(scenario: &Scenario, run: &Run) -> Result<(), TestCaseError> {
    for (i, d) in run.decisions() {
        if let Decision::Granted {
            task, placement, ..
        } = d
        {
            let spec = submitted(scenario, run, *task)?;
            for share in &placement.shares {
                let model = &scenario.nodes[share.node.0 as usize].gpu_model;
                prop_assert!(
                    spec.accepts(model),
                    "{}: step {i}: {task} accepts {:?} and was placed on {model}",
                    run.policy,
                    spec.gpu_models
                );
            }
        }
    }
    Ok(())
}

/// Books team and cohort usage from the decisions; the scheduler's accessors agree after every
/// step.
fn quota_usage_follows_decisions(scenario: &Scenario, run: &Run) -> Result<(), TestCaseError> {
    quotas_hold(scenario, run, false)
}

/// As [`quota_usage_follows_decisions`], and under `kueue` with quotas every grant leaves its
/// team within nominal quota, or borrowing within the cohort's nominal and the team's borrowing
/// limit.
fn kueue_admits_within_quota(scenario: &Scenario, run: &Run) -> Result<(), TestCaseError> {
    quotas_hold(
        scenario,
        run,
        run.policy == "kueue" && !scenario.quotas.is_empty(),
    )
}

fn quotas_hold(scenario: &Scenario, run: &Run, enforced: bool) -> Result<(), TestCaseError> {
    let policy = run.policy;
    let mut usage: BTreeMap<&'static str, u64> = TEAMS.iter().map(|t| (*t, 0)).collect();
    let mut cohort = 0u64;
    let mut leases: HashMap<LeaseId, (&'static str, u64)> = HashMap::new();
    let team_of = |id: TaskId| {
        let team = &submitted(scenario, run, id)?.team;
        TEAMS
            .into_iter()
            .find(|t| t == team)
            .ok_or_else(|| TestCaseError::fail(format!("{id} of unknown team {team}")))
    };
    for (i, step) in run.steps.iter().enumerate() {
        for d in step
            .result
            .as_ref()
            .map(|d| d.as_slice())
            .unwrap_or_default()
        {
            match d {
                Decision::Granted { task, lease, .. } => {
                    let team = team_of(*task)?;
                    // Quotas count what a task requests (as Kueue does), not the whole nodes a
                    // task larger than a node occupies.
                    let milli = submitted(scenario, run, *task)?.gpu_demand_milli();
                    *usage.entry(team).or_default() += milli;
                    cohort += milli;
                    leases.insert(*lease, (team, milli));
                    if !enforced {
                        continue;
                    }
                    let used = usage[team];
                    let quota = run.quota[team];
                    let within_nominal = used <= quota.nominal_milli;
                    let borrowing = cohort <= run.cohort_nominal
                        && quota
                            .borrowing_limit_milli
                            .is_none_or(|l| used <= quota.nominal_milli + l);
                    prop_assert!(
                        within_nominal || borrowing,
                        "{policy}: step {i}: granting {task} ({milli} milli-GPU) leaves team \
                         {team} at {used} of nominal {} (limit {:?}) and the cohort at {cohort} of \
                         {}; usage now {usage:?}",
                        quota.nominal_milli,
                        quota.borrowing_limit_milli,
                        run.cohort_nominal
                    );
                }
                Decision::Preempted { lease, .. } | Decision::Released { lease, .. } => {
                    if let Some((team, milli)) = leases.remove(lease) {
                        let u = usage.entry(team).or_default();
                        *u = u.saturating_sub(milli);
                        cohort = cohort.saturating_sub(milli);
                    }
                }
                Decision::Waiting { .. } => {}
            }
        }
        prop_assert_eq!(
            (&step.books.usage, step.books.cohort_usage),
            (&usage, cohort),
            "{}: after step {} ({:?}) the scheduler's quota usage disagrees with its decisions",
            policy,
            i,
            &step.input
        );
    }
    Ok(())
}

/// No two tasks preempt each other at the same instant, a task never preempts itself, and every
/// preemption makes room for a task granted in that same pass.
fn preemption_never_cycles(_scenario: &Scenario, run: &Run) -> Result<(), TestCaseError> {
    let policy = run.policy;
    let mut by_time: BTreeMap<Time, BTreeSet<(TaskId, TaskId)>> = BTreeMap::new();
    for (i, step) in run.steps.iter().enumerate() {
        let decisions = step
            .result
            .as_ref()
            .map(|d| d.as_slice())
            .unwrap_or_default();
        let granted: BTreeSet<TaskId> = decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Granted { task, .. } => Some(*task),
                _ => None,
            })
            .collect();
        for d in decisions {
            if let Decision::Preempted {
                task, at, for_task, ..
            } = d
            {
                let Some(for_task) = for_task else {
                    continue;
                };
                prop_assert_ne!(task, for_task, "{}: step {}: self-preemption", policy, i);
                prop_assert!(
                    granted.contains(for_task),
                    "{policy}: step {i}: {task} preempted for {for_task}, which did not start"
                );
                by_time.entry(*at).or_default().insert((*task, *for_task));
            }
        }
    }
    for (at, pairs) in &by_time {
        for (victim, preemptor) in pairs {
            prop_assert!(
                !pairs.contains(&(*preemptor, *victim)),
                "{policy}: at {at} {preemptor} preempted {victim} and {victim} preempted {preemptor}"
            );
        }
    }
    Ok(())
}

/// Replaying a run's inputs into a fresh scheduler gives the same answer to every input.
fn same_inputs_same_decisions(_scenario: &Scenario, run: &Run) -> Result<(), TestCaseError> {
    let mut fresh = Scheduler::new(policy::by_name(run.policy).expect("a policy of NAMES"));
    for (i, step) in run.steps.iter().enumerate() {
        let again = fresh.apply(step.input.clone());
        prop_assert_eq!(
            &again,
            &step.result,
            "{}: step {} ({:?}) decided differently on the same inputs",
            run.policy,
            i,
            &step.input
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(config())]

    #[test]
    fn no_gpu_is_ever_granted_beyond_its_capacity(scenario in scenario()) {
        each_policy(&scenario, gpus_hold_at_most_their_capacity)?;
    }

    #[test]
    fn a_task_is_granted_only_when_not_running_and_stopped_only_while_running(
        scenario in scenario()
    ) {
        each_policy(&scenario, leases_open_and_close_in_order)?;
    }

    #[test]
    fn gangs_are_all_or_nothing(scenario in scenario()) {
        each_policy(&scenario, gangs_are_granted_whole)?;
    }

    #[test]
    fn tasks_restricted_to_a_gpu_model_run_only_on_it(scenario in scenario()) {
        each_policy(&scenario, tasks_run_on_models_they_accept)?;
    }

    /// Known failure (minimal case found): nodes of 7, 4, 6, 4 and 5 H100; team b has a
    /// nominal quota of 1 GPU (the cohort's only quota); team c (no quota) runs a 100 milli-GPU
    /// task from minute 4, and at minute 5 submits a 1-GPU task of higher priority. It is not
    /// admitted (the cohort would go to 1,100 of 1,000), so `Scheduler::preempt_for` releases
    /// c's own lower-priority task as a victim: with it refunded, admission passes and best fit
    /// picks an idle 4-GPU node. The victim's node is not used, so it is kept running (no
    /// `Preempted` decision) and charged back — after admission was checked without it. The
    /// grant leaves c at 1,100 milli-GPU against nominal 0 and the cohort at 1,100 of 1,000.
    #[test]
    fn kueue_grants_stay_within_nominal_quota_or_borrow_within_the_cohort(
        scenario in scenario()
    ) {
        kueue_admits_within_quota(&scenario, &drive("kueue", &scenario))?;
    }

    #[test]
    fn quota_usage_follows_grants_and_releases_for_every_policy(scenario in scenario()) {
        each_policy(&scenario, quota_usage_follows_decisions)?;
    }

    #[test]
    fn no_two_tasks_preempt_each_other_in_the_same_instant(scenario in scenario()) {
        each_policy(&scenario, preemption_never_cycles)?;
    }

    #[test]
    fn identical_inputs_give_identical_decisions(scenario in scenario()) {
        each_policy(&scenario, same_inputs_same_decisions)?;
    }

    /// The scheduler refuses at submission exactly the tasks no placement could ever hold (the
    /// contract of `ApplyError::Unplaceable`): a task it accepts but can never place is never
    /// told so, and under a head-of-line policy it stops the queue for good.
    #[test]
    fn the_scheduler_refuses_exactly_the_tasks_the_empty_cluster_cannot_hold(
        scenario in scenario()
    ) {
        let mut scheduler = Scheduler::new(policy::by_name("fifo").expect("fifo"));
        for node in &scenario.nodes {
            scheduler.apply(Input::NodeAdded(node.clone())).expect("a node joins");
        }
        for a in &scenario.arrivals {
            let accepted = scheduler
                .apply(Input::TaskSubmitted { task: a.task.clone(), at: a.at })
                .is_ok();
            prop_assert_eq!(
                accepted,
                scenario.fits_empty(&a.task),
                "{} ({} GPUs x {} milli, models {:?}) accepted={}",
                a.task.id,
                a.task.gpus,
                a.task.gpu_milli,
                &a.task.gpu_models,
                accepted
            );
        }
    }

    /// Every task that some placement can hold and that the policy's quotas admit on an idle
    /// cluster eventually finishes, under every policy. Tasks no placement could ever hold are
    /// left out: the scheduler may accept them (see the property above), and under the
    /// head-of-line policies (`fifo`, `sjf-oracle`) one of them at the head starves everything
    /// behind it. So are tasks larger than the quota `kueue` would ever admit.
    #[test]
    fn every_task_that_can_ever_run_eventually_finishes(scenario in scenario()) {
        for name in NAMES {
            let policy = policy::by_name(name).expect("a policy of NAMES");
            let idle = scenario.idle_quotas();
            let mut empty = Cluster::new();
            for node in &scenario.nodes {
                empty.add_node(node.clone());
            }
            for a in &scenario.arrivals {
                prop_assert_eq!(
                    scenario.fits_empty(&a.task),
                    policy.place(&empty, &a.task).is_some(),
                    "{}: the placement rules and {} disagree on whether {} fits the empty cluster",
                    name,
                    name,
                    a.task.id
                );
            }
            let runnable =
                scenario.only(|t| scenario.fits_empty(t) && policy.admits(&t.team, allot_sched::quota::demand(t), &idle));
            let run = drive(name, &runnable);
            let all: BTreeSet<TaskId> = runnable.arrivals.iter().map(|a| a.task.id).collect();
            prop_assert!(run.rejected.is_empty(), "{name}: rejected {:?}", run.rejected);
            let starved: Vec<&TaskId> = all.difference(&run.finished).collect();
            prop_assert!(starved.is_empty(), "{name}: never finished: {starved:?}");
        }
    }
}
