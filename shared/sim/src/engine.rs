//! The discrete-event engine: replays a trace through allot-sched.
//!
//! At each event time, in this order (DESIGN.md's reference semantics): finished jobs are
//! released, arrivals are submitted, then one scheduling pass runs. Time-weighted KPIs are
//! accumulated over the interval until the next event.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use allot_sched::{Decision, Input, NodeSpec, Policy, Scheduler, TaskId, TaskSpec};

use crate::kpi::{self, Accumulators, JobOutcome, Kpis};
use crate::trace::{Millis, Trace};

/// Costs the simulator charges for preemption (printed with every result).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimConfig {
    /// Run time between two checkpoints: a preempted job loses the work since its last one.
    pub checkpoint_every: Millis,
    /// Time a restarted job spends before it makes progress again.
    pub restart_overhead: Millis,
    /// Record allocation and queue length at most this often, for plots (0: never).
    pub sample_every: Millis,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            checkpoint_every: 15 * 60 * 1000,
            restart_overhead: 60 * 1000,
            sample_every: 0,
        }
    }
}

/// One point of the allocation / queue timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When.
    pub at: Millis,
    /// Milli-GPU allocated.
    pub allocated_milli: u64,
    /// Tasks waiting.
    pub queued: usize,
}

/// The result of one policy on one trace.
#[derive(Debug, Clone)]
pub struct SimResult {
    /// Policy name.
    pub policy: String,
    /// Its parameters.
    pub parameters: String,
    /// KPIs.
    pub kpis: Kpis,
    /// Per-job outcomes, by trace id.
    pub outcomes: Vec<JobOutcome>,
    /// Allocation and queue length over time (when sampling was asked for).
    pub timeline: Vec<Sample>,
    /// Wall-clock time the simulation took.
    pub wall: Duration,
}

/// Why a simulation could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// The scheduler refused an input (a job no node can hold, …).
    #[error("job {job}: {source}")]
    Rejected {
        /// Trace position.
        job: u32,
        /// The scheduler's reason.
        #[source]
        source: allot_sched::ApplyError,
    },
    /// Jobs were still waiting when nothing else could happen.
    #[error("{0} jobs never started (the policy left them waiting with the cluster idle)")]
    Stuck(usize),
}

/// Replays `trace` on `nodes` under `policy`.
pub fn run(
    trace: &Trace,
    nodes: &[NodeSpec],
    policy: Box<dyn Policy>,
    nominal: &BTreeMap<String, u32>,
    config: &SimConfig,
) -> Result<SimResult, SimError> {
    let started = Instant::now();
    let name = policy.name().to_owned();
    let parameters = policy.parameters();
    let oracle = policy.uses_oracle();
    let mut scheduler = Scheduler::new(policy);
    for node in nodes {
        scheduler
            .apply(Input::NodeAdded(node.clone()))
            .map_err(|source| SimError::Rejected { job: 0, source })?;
    }

    let jobs = &trace.jobs;
    let mut next_arrival = 0usize;
    let mut ends: BinaryHeap<Reverse<(Millis, u64)>> = BinaryHeap::new();
    let mut running: HashMap<u64, (Millis, u128)> = HashMap::new();
    let mut outcomes: Vec<Option<JobOutcome>> = vec![None; jobs.len()];
    let by_task: HashMap<u64, usize> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (u64::from(j.id), i))
        .collect();
    let mut acc = Accumulators::default();
    let mut timeline = Vec::new();
    let mut last_sample: Option<Millis> = None;
    let mut decisions = Vec::new();
    let mut prev: Option<(Millis, u64, bool, bool)> = None;

    loop {
        let arrival = jobs.get(next_arrival).map(|j| j.submit);
        let end = ends.peek().map(|Reverse((t, _))| *t);
        let now = match (arrival, end) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(e)) => e,
            (Some(a), Some(e)) => a.min(e),
        };
        // Accumulate the interval that just ended.
        if let Some((since, allocated, waiting, fits)) = prev {
            let dt = u128::from(now - since);
            acc.allocated += u128::from(allocated) * dt;
            acc.capacity += u128::from(scheduler.cluster().capacity_milli()) * dt;
            let idle = allocated < scheduler.cluster().capacity_milli();
            if idle && waiting {
                acc.wasted += dt;
                if fits {
                    acc.wasted_fit += dt;
                }
            }
        }
        // 1. release what finished
        while let Some(Reverse((t, task))) = ends.peek().copied()
            && t == now
        {
            ends.pop();
            decisions.clear();
            scheduler
                .apply_into(
                    Input::TaskFinished {
                        task: TaskId(task),
                        at: now,
                    },
                    &mut decisions,
                )
                .map_err(|source| SimError::Rejected {
                    job: task as u32,
                    source,
                })?;
            if let Some((start, gpu_ms)) = running.remove(&task) {
                let job = &jobs[by_task[&task]];
                outcomes[by_task[&task]] = Some(JobOutcome {
                    id: job.id,
                    team: job.team.clone(),
                    submit: job.submit,
                    first_start: start,
                    finish: now,
                    gpu_ms,
                });
            }
        }
        // 2. submit arrivals
        while let Some(job) = jobs.get(next_arrival)
            && job.submit == now
        {
            let spec = TaskSpec {
                id: TaskId(u64::from(job.id)),
                team: job.team.clone(),
                priority: job.priority,
                gpus: job.gpus,
                gpu_milli: job.gpu_milli,
                gpu_models: job.gpu_models.clone(),
                cpu_milli: job.cpu_milli,
                memory_mib: job.memory_mib,
                oracle_duration: oracle.then_some(job.duration),
            };
            scheduler
                .apply(Input::TaskSubmitted {
                    task: spec,
                    at: now,
                })
                .map_err(|source| SimError::Rejected {
                    job: job.id,
                    source,
                })?;
            next_arrival += 1;
        }
        // 3. one pass
        decisions.clear();
        scheduler
            .apply_into(Input::Schedule { at: now }, &mut decisions)
            .map_err(|source| SimError::Rejected { job: 0, source })?;
        for decision in &decisions {
            if let Decision::Granted {
                task, placement, ..
            } = decision
            {
                let job = &jobs[by_task[&task.0]];
                let gpu_ms = u128::from(placement.gpu_milli()) * u128::from(job.duration) / 1000;
                running.insert(task.0, (now, gpu_ms));
                ends.push(Reverse((now + job.duration, task.0)));
            }
        }
        let waiting = scheduler.pending() > 0;
        let fits = waiting && scheduler.some_pending_fits();
        let allocated = scheduler.cluster().allocated_milli();
        prev = Some((now, allocated, waiting, fits));
        if config.sample_every > 0 && last_sample.is_none_or(|t| now >= t + config.sample_every) {
            timeline.push(Sample {
                at: now,
                allocated_milli: allocated,
                queued: scheduler.pending(),
            });
            last_sample = Some(now);
        }
    }
    if scheduler.pending() > 0 {
        return Err(SimError::Stuck(scheduler.pending()));
    }
    let outcomes: Vec<JobOutcome> = outcomes.into_iter().flatten().collect();
    let kpis = kpi::compute(&outcomes, &acc, nominal);
    Ok(SimResult {
        policy: name,
        parameters,
        kpis,
        outcomes,
        timeline,
        wall: started.elapsed(),
    })
}
