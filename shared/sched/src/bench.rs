//! The placement benchmark's cluster and queue, shared by `cargo bench -p allot-sched --bench
//! placement` (criterion) and `allot bench placement` (every policy in one process, JSON out):
//! 1,250 nodes × 8 GPUs (three GPU models), about two thirds of the GPUs busy with running
//! tasks of mixed sizes, and 10,000 pending tasks of mixed shapes (1, 2, 4, 8 GPUs and
//! fractions) from three teams with quotas in one cohort. Deterministic: the same scheduler
//! state on every run.
//!
//! [`prepared`] builds it: nodes and team quotas join, a first pass fills the cluster to ~90 %
//! with running tasks, those shorter than half an hour finish when their durations say (the
//! holes departures leave, and what the history estimator learns from), then pending tasks
//! arrive until 10,000 wait. [`pass`] is the measured `Schedule` pass.
//!
//! [`prepared_at`] builds the same mix at another [`Size`] (`allot bench placement --nodes
//! --pending`: the core at 100,000 GPUs for `allot bench scale`'s findings).

use crate::policy;
use crate::quota::Quota;
use crate::{Decision, Input, NodeSpec, Scheduler, TaskId, TaskSpec, Time};

/// Nodes in the cluster.
pub const NODES: usize = 1_250;
/// GPUs per node.
pub const GPUS_PER_NODE: u32 = 8;
/// Tasks waiting when the measured pass runs.
pub const PENDING: u64 = 10_000;

/// How large the prepared cluster and queue are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// Nodes of [`GPUS_PER_NODE`] GPUs.
    pub nodes: usize,
    /// Tasks waiting when the measured pass runs.
    pub pending: u64,
}

impl Default for Size {
    /// The criterion bench's size: [`NODES`] nodes, [`PENDING`] pending.
    fn default() -> Size {
        Size {
            nodes: NODES,
            pending: PENDING,
        }
    }
}
/// Share of GPU capacity the first tasks ask for; those shorter than [`NOW`] finish before the
/// measured pass.
const FILL: f64 = 0.9;
const MINUTE: Time = 60_000;
/// When the pending tasks arrive and the measured pass runs.
const NOW: Time = 30 * MINUTE;

/// GPU models, with the share of nodes that have each.
const MODELS: [(&str, usize); 3] = [("H100", 50), ("A100", 30), ("L40S", 20)];
/// Teams, with their nominal quota as a share of all GPUs (one cohort, unlimited borrowing).
const TEAMS: [(&str, u64); 3] = [("vision", 40), ("nlp", 35), ("speech", 25)];

/// splitmix64: the workload is the same on every run without a dependency for it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn node(i: usize) -> NodeSpec {
    let mut at = i % 100;
    let model = MODELS
        .iter()
        .find(|(_, share)| {
            let here = at < *share;
            at = at.saturating_sub(*share);
            here
        })
        .map_or("H100", |(m, _)| m);
    NodeSpec::new(format!("node-{i:04}"), GPUS_PER_NODE, model)
}

/// A task of a typical mix: a quarter fractions, then 1, 2, 4 and 8 GPUs, one in ten pinned to
/// a model, teams and priorities at random; 30 % last 5 to 30 minutes, the rest up to 4 hours.
fn task(id: u64, rng: &mut Rng) -> TaskSpec {
    let (team, _) = TEAMS[rng.below(TEAMS.len() as u64) as usize];
    let mut t = TaskSpec::new(id, team, 1);
    match rng.below(100) {
        0..25 => t.gpu_milli = 100 + 50 * rng.below(17) as u32,
        25..55 => {}
        55..75 => t.gpus = 2,
        75..90 => t.gpus = 4,
        _ => t.gpus = 8,
    }
    if rng.below(10) == 0 {
        let (model, _) = MODELS[rng.below(MODELS.len() as u64) as usize];
        t.gpu_models = vec![model.to_owned()];
    }
    t.priority = rng.below(3) as i32;
    let minutes = if rng.below(100) < 30 {
        5 + rng.below(25)
    } else {
        30 + rng.below(211)
    };
    t.oracle_duration = Some(minutes * MINUTE);
    t
}

fn apply(s: &mut Scheduler, input: Input) -> Vec<Decision> {
    s.apply(input).expect("the bench's inputs are valid")
}

/// A scheduler under `policy` (one of [`policy::NAMES`]) on the prepared cluster with the
/// 10,000 tasks pending, ready for the pass.
pub fn prepared(policy: &str) -> Scheduler {
    prepared_at(policy, Size::default())
}

/// [`prepared`] at another size: the same mix of nodes, quotas and tasks, scaled.
pub fn prepared_at(policy: &str, size: Size) -> Scheduler {
    let mut s = Scheduler::new(policy::by_name(policy).expect("a policy of NAMES"));
    for i in 0..size.nodes {
        apply(&mut s, Input::NodeAdded(node(i)));
    }
    let capacity = size.nodes as u64 * u64::from(GPUS_PER_NODE) * 1_000;
    for (team, share) in TEAMS {
        let quota = Quota::gpus(capacity * share / 100);
        apply(
            &mut s,
            Input::TeamQuota {
                team: team.to_owned(),
                quota,
            },
        );
    }

    let mut rng = Rng(0x5eed_a110);
    let mut id = 0;
    let mut asked = 0;
    let mut durations = Vec::new();
    while (asked as f64) < capacity as f64 * FILL {
        let t = task(id, &mut rng);
        asked += t.gpu_demand_milli();
        durations.push(t.oracle_duration.unwrap_or(NOW));
        id += 1;
        apply(&mut s, Input::TaskSubmitted { task: t, at: 0 });
    }
    // What does not fit (a few tasks under some placements) simply stays pending.
    let mut departing: Vec<(Time, TaskId)> = apply(&mut s, Input::Schedule { at: 0 })
        .into_iter()
        .filter_map(|d| match d {
            Decision::Granted { task, .. } => Some(task),
            _ => None,
        })
        .filter_map(|task| {
            let ran = durations[task.0 as usize];
            (ran < NOW).then_some((ran, task))
        })
        .collect();
    departing.sort_unstable();
    for (at, task) in departing {
        apply(
            &mut s,
            Input::TaskFinished {
                task,
                at,
                run: None,
            },
        );
    }

    while (s.pending() as u64) < size.pending {
        let t = task(id, &mut rng);
        id += 1;
        apply(&mut s, Input::TaskSubmitted { task: t, at: NOW });
    }
    s
}

/// The measured pass: one `Schedule` at the moment the pending tasks arrived.
pub fn pass(s: &mut Scheduler) -> Vec<Decision> {
    apply(s, Input::Schedule { at: NOW })
}
