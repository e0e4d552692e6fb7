//! The GPU packing experiment of the FGD paper (Weng et al., "Beware of Fragmentation",
//! ATC'23) on the openb trace — scenario `openb-packing` — driven through the real
//! [`Scheduler`], so the policies measured are the ones the allocator runs.
//!
//! One run, for one policy and one seed:
//!
//! 1. **cluster** — every node of the node list, in file order (`nodes_all.csv`: 1,523 nodes,
//!    310 of them CPU-only; the reference artifact uses the 1,213 GPU nodes alone, which gives
//!    the same results here: both policies send CPU-only pods where no GPU is left to strand).
//! 2. **arrivals** — the trace's pods in trace order (`creation_time`, ties in file order), then
//!    pods re-sampled uniformly, with replacement, from the trace (a [`SmallRng`] seeded with the
//!    seed) until the next one drawn would take the GPU demand past `arrival` × the cluster's GPU
//!    capacity (milli-GPU) — the reference simulator's `tuneUpPods`. Were the trace alone above
//!    the target, randomly drawn pods would be dropped instead (`tuneDownPods`). The published
//!    results were measured with the trace's pods shuffled first ([`Order::Shuffled`]); trace
//!    order, as traces/README.md describes the experiment, is the default.
//! 3. **scheduling** — at each arrival the pod is submitted and one pass runs. Nothing departs:
//!    a pod that does not fit when it arrives never will, and stays pending (the policies let it
//!    wait without blocking the pods behind it). Some 2,600 pods end up pending; the scheduler
//!    skips the placement search for request shapes that found no room since capacity was last
//!    freed, so retrying them costs a set lookup.
//! 4. **metric** — once everything has arrived, the GPU allocation ratio = allocated milli-GPU
//!    / capacity; mean and sample standard deviation over the seeds.
//!
//! Each pod needs its CPU, memory, GPU count or fraction and an accepted GPU model on one node.
//! **CPU-only pods** (13% of the trace) are ordinary pods, as in the reference simulator
//! (hkust-adsl/kubernetes-scheduler-simulator, `pkg/simulator/simulator.go`): they arrive, are
//! re-sampled with their trace frequency, the policy places them, and they hold CPU and memory
//! on their node — on a GPU node they can strand its GPUs. They ask for no GPU, so they neither
//! count in the allocation ratio nor move the top-up towards its target.

use std::path::Path;
use std::time::{Duration, Instant};

use allot_sched::{ApplyError, Decision, Input, NodeSpec, Scheduler};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::load::openb;
use crate::trace::{LoadError, TraceJob};

/// GPU allocation ratios published for this experiment (mean of 10 seeds; traces/README.md),
/// measured with the trace's pods in random order ([`Order::Shuffled`]).
pub const PUBLISHED: &[(&str, f64)] = &[("random", 0.8747), ("bestfit", 0.9308), ("fgd", 0.9539)];

/// The published GPU allocation ratio of `policy`, where there is one.
pub fn published(policy: &str) -> Option<f64> {
    PUBLISHED
        .iter()
        .find(|(name, _)| *name == policy)
        .map(|(_, ratio)| *ratio)
}

/// The experiment's default arrival volume: 130% of the cluster's GPU capacity.
pub const DEFAULT_ARRIVAL: f64 = 1.3;

/// The order in which the trace's pods arrive (re-sampled pods always come after them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// By creation time, ties in file order, as traces/README.md describes the experiment.
    #[default]
    Trace,
    /// A random permutation drawn with the run's seed, before the top-up: the FGD artifact's
    /// `--shuffle-pod=true`, which its published results were measured with
    /// (`experiments/run_scripts/generate_run_scripts.py` in the reference repository).
    Shuffled,
}

/// One seed's run.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedRun {
    /// The seed of the re-sampling.
    pub seed: u64,
    /// Pods that arrived.
    pub pods: usize,
    /// Pods placed.
    pub placed: usize,
    /// Milli-GPU allocated once everything had arrived.
    pub allocated_milli: u64,
    /// The cluster's GPU capacity, milli-GPU.
    pub capacity_milli: u64,
    /// `allocated_milli / capacity_milli`.
    pub gpu_allocation_ratio: f64,
}

impl SeedRun {
    /// GPU capacity left unallocated, in GPUs.
    pub fn unallocated_gpus(&self) -> f64 {
        (self.capacity_milli - self.allocated_milli) as f64 / 1000.0
    }
}

/// One policy's result over all seeds.
#[derive(Debug, Clone)]
pub struct PackingResult {
    /// Policy name.
    pub policy: String,
    /// Its parameters (as it reported them at the end of the first seed).
    pub parameters: String,
    /// Arrival volume, as a fraction of GPU capacity.
    pub arrival: f64,
    /// The order the trace's pods arrived in.
    pub order: Order,
    /// Pods in the trace (before topping up).
    pub trace_pods: usize,
    /// Nodes in the cluster.
    pub nodes: usize,
    /// The runs, by seed (0, 1, …).
    pub runs: Vec<SeedRun>,
    /// Mean GPU allocation ratio.
    pub mean: f64,
    /// Sample standard deviation of the ratio (0 for one seed).
    pub stddev: f64,
    /// Mean GPU capacity left unallocated, in GPUs.
    pub unallocated_gpus: f64,
    /// Wall-clock time of all seeds (run in parallel on the available cores).
    pub wall: Duration,
}

/// Why the experiment could not run.
#[derive(Debug, thiserror::Error)]
pub enum PackingError {
    /// The trace or node list is unreadable or malformed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// No policy has this name.
    #[error("unknown policy {0:?}; known: {known}", known = allot_sched::policy::NAMES.join(", "))]
    UnknownPolicy(String),
    /// The arrival volume is not a positive number.
    #[error("the arrival volume must be a positive fraction of GPU capacity, not {0}")]
    BadArrival(f64),
    /// Zero seeds.
    #[error("at least one seed is needed")]
    NoSeeds,
    /// The trace has no pods or the node list no GPUs.
    #[error("nothing to pack: {0}")]
    Empty(&'static str),
    /// The scheduler refused a pod for a reason other than never fitting.
    #[error("pod {pod} (arrival {arrival}): {source}")]
    Rejected {
        /// Its name in the trace.
        pod: String,
        /// Its position among the arrivals.
        arrival: usize,
        /// The scheduler's reason.
        #[source]
        source: ApplyError,
    },
}

/// Runs the experiment for `policy` on the pods of `pods` and the nodes of `nodes` (openb
/// format), with seeds `0..seeds` and `arrival` × GPU capacity of arrivals, in trace order.
pub fn run(
    pods: &Path,
    nodes: &Path,
    policy: &str,
    seeds: u32,
    arrival: f64,
) -> Result<PackingResult, PackingError> {
    run_in_order(pods, nodes, policy, seeds, arrival, Order::Trace)
}

/// [`run`] with the trace's pods arriving in `order`.
pub fn run_in_order(
    pods: &Path,
    nodes: &Path,
    policy: &str,
    seeds: u32,
    arrival: f64,
    order: Order,
) -> Result<PackingResult, PackingError> {
    let started = Instant::now();
    if allot_sched::policy::by_name(policy).is_none() {
        return Err(PackingError::UnknownPolicy(policy.to_owned()));
    }
    if !(arrival.is_finite() && arrival > 0.0) {
        return Err(PackingError::BadArrival(arrival));
    }
    if seeds == 0 {
        return Err(PackingError::NoSeeds);
    }
    let trace = openb::load(pods, nodes)?;
    if trace.jobs.is_empty() {
        return Err(PackingError::Empty("the trace has no pods"));
    }
    let nodes: Vec<NodeSpec> = trace
        .nodes
        .iter()
        .map(|n| NodeSpec {
            name: n.name.clone(),
            gpus: n.gpus,
            gpu_model: n.model.clone(),
            cpu_milli: n.cpu_milli,
            memory_mib: n.memory_mib,
            ..NodeSpec::default()
        })
        .collect();
    if nodes.iter().all(|n| n.gpus == 0) {
        return Err(PackingError::Empty("the node list has no GPUs"));
    }

    // Seeds are independent: run them on all cores, each thread taking every n-th seed.
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(seeds as usize);
    let outcomes: Vec<Result<(SeedRun, String), PackingError>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|first| {
                let (jobs, nodes) = (&trace.jobs, &nodes);
                scope.spawn(move || {
                    (first..seeds as usize)
                        .step_by(threads)
                        .map(|seed| run_seed(jobs, nodes, policy, seed as u64, arrival, order))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut by_worker: Vec<std::vec::IntoIter<_>> = workers
            .into_iter()
            .map(|w| w.join().expect("a packing run panicked").into_iter())
            .collect();
        // Back in seed order: seed s ran on worker s % threads.
        (0..seeds as usize)
            .filter_map(|seed| by_worker[seed % threads].next())
            .collect()
    });
    let mut runs = Vec::with_capacity(outcomes.len());
    let mut parameters = String::new();
    for outcome in outcomes {
        let (run, params) = outcome?;
        if runs.is_empty() {
            parameters = params;
        }
        runs.push(run);
    }
    let ratios: Vec<f64> = runs.iter().map(|r| r.gpu_allocation_ratio).collect();
    let (mean, stddev) = mean_and_stddev(&ratios);
    let unallocated_gpus =
        runs.iter().map(SeedRun::unallocated_gpus).sum::<f64>() / runs.len() as f64;
    Ok(PackingResult {
        policy: policy.to_owned(),
        parameters,
        arrival,
        order,
        trace_pods: trace.jobs.len(),
        nodes: nodes.len(),
        runs,
        mean,
        stddev,
        unallocated_gpus,
        wall: started.elapsed(),
    })
}

/// One seed: the arrivals, submitted and scheduled one at a time; returns the run and the
/// policy's parameters at the end.
fn run_seed(
    jobs: &[TraceJob],
    nodes: &[NodeSpec],
    policy: &str,
    seed: u64,
    arrival: f64,
    order: Order,
) -> Result<(SeedRun, String), PackingError> {
    let policy = allot_sched::policy::by_name(policy)
        .ok_or_else(|| PackingError::UnknownPolicy(policy.to_owned()))?;
    let mut scheduler = Scheduler::new(policy);
    for node in nodes {
        // Adding a node cannot fail.
        let _ = scheduler.apply(Input::NodeAdded(node.clone()));
    }
    let capacity_milli = scheduler.cluster().capacity_milli();
    let arrivals = arrivals(jobs, capacity_milli, arrival, seed, order);
    let mut decisions = Vec::new();
    let mut placed = 0;
    let mut at = 0;
    for (i, job) in arrivals.iter().enumerate() {
        let task = job.task_spec(i as u64, false);
        // Pods arrive in the order drawn, so time never goes back: a re-sampled (or shuffled)
        // pod takes the latest arrival time so far, not its original's, since the queue orders
        // by submit time.
        at = at.max(job.submit);
        match scheduler.apply(Input::TaskSubmitted { task, at }) {
            Ok(_) => {}
            // Asks for a model or a GPU count the cluster does not have: never placed.
            Err(ApplyError::Unplaceable { .. }) => continue,
            Err(source) => {
                return Err(PackingError::Rejected {
                    pod: job.name.clone(),
                    arrival: i,
                    source,
                });
            }
        }
        decisions.clear();
        scheduler
            .apply_into(Input::Schedule { at }, &mut decisions)
            .map_err(|source| PackingError::Rejected {
                pod: job.name.clone(),
                arrival: i,
                source,
            })?;
        placed += decisions
            .iter()
            .filter(|d| matches!(d, Decision::Granted { .. }))
            .count();
    }
    let allocated_milli = scheduler.cluster().allocated_milli();
    let run = SeedRun {
        seed,
        pods: arrivals.len(),
        placed,
        allocated_milli,
        capacity_milli,
        gpu_allocation_ratio: allocated_milli as f64 / capacity_milli as f64,
    };
    Ok((run, scheduler.policy().parameters()))
}

/// The pods that arrive in one run, in arrival order: the trace in `order`, topped up — or
/// thinned out — to `arrival` × `capacity_milli` of GPU demand, drawing from a generator seeded
/// by `seed`.
pub fn arrivals(
    jobs: &[TraceJob],
    capacity_milli: u64,
    arrival: f64,
    seed: u64,
    order: Order,
) -> Vec<&TraceJob> {
    let target = (arrival * capacity_milli as f64) as u64;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out: Vec<&TraceJob> = jobs.iter().collect();
    if order == Order::Shuffled {
        out.shuffle(&mut rng);
    }
    let mut total: u64 = out.iter().map(|j| demand(j)).sum();
    if total > target {
        while total > target && !out.is_empty() {
            let dropped = out.remove(rng.random_range(0..out.len()));
            total -= demand(dropped);
        }
        return out;
    }
    // Only pods with GPU demand move the total; without any, there is nothing to top up to.
    if jobs.iter().all(|j| demand(j) == 0) {
        return out;
    }
    loop {
        let job = &jobs[rng.random_range(0..jobs.len())];
        if total + demand(job) > target {
            return out;
        }
        total += demand(job);
        out.push(job);
    }
}

/// A pod's GPU demand, milli-GPU.
fn demand(job: &TraceJob) -> u64 {
    u64::from(job.gpus) * u64::from(job.gpu_milli)
}

/// Mean and sample standard deviation (0 for fewer than two values).
fn mean_and_stddev(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, variance.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_standard_deviation() {
        assert_eq!(mean_and_stddev(&[0.5]), (0.5, 0.0));
        let (mean, sd) = mean_and_stddev(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(mean, 2.5);
        assert!((sd - (5.0f64 / 3.0).sqrt()).abs() < 1e-12, "{sd}");
    }
}
