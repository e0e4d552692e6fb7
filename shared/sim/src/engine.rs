//! The discrete-event engine: replays a trace through allot-sched.
//!
//! At each event time, in this order (DESIGN.md's reference semantics): finished jobs are
//! released, arrivals are submitted, then one scheduling pass runs. Time-weighted KPIs are
//! accumulated over the interval until the next event.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use allot_sched::{Decision, Input, NodeSpec, Policy, Scheduler, TaskId};

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

/// A job's progress across its runs.
#[derive(Debug, Clone)]
struct Run {
    /// Work left, ms (restart overhead not included).
    remaining: Millis,
    /// Bumped at each preemption, to skip the stale end of the run that was cut short.
    generation: u32,
    first_start: Option<Millis>,
    /// The current run: when it started and the milli-GPU it holds.
    started: Option<(Millis, u64)>,
    /// Restart overhead of the current run, ms.
    overhead: Millis,
    /// Milli-GPU × ms / 1000 of finished runs.
    gpu_ms: u128,
}

impl Run {
    fn new(duration: Millis) -> Self {
        Self {
            remaining: duration,
            generation: 0,
            first_start: None,
            started: None,
            overhead: 0,
            gpu_ms: 0,
        }
    }

    /// The current run is cut at `now`: progress up to the last checkpoint is kept, the rest
    /// (and the restart overhead) is lost.
    fn preempted(&mut self, now: Millis, config: &SimConfig, acc: &mut Accumulators) {
        let Some((start, milli)) = self.started.take() else {
            return;
        };
        let ran = now - start;
        let useful = ran.saturating_sub(self.overhead).min(self.remaining);
        let kept = useful
            .checked_div(config.checkpoint_every)
            .map_or(useful, |checkpoints| checkpoints * config.checkpoint_every);
        self.remaining -= kept;
        self.generation += 1;
        self.gpu_ms += u128::from(milli) * u128::from(ran) / 1000;
        acc.preemptions += 1;
        acc.lost += u128::from(milli) * u128::from(ran - kept);
    }
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
    // Nominal quotas scaled to the cluster: only their proportions come from the scenario.
    let capacity = u128::from(scheduler.cluster().capacity_milli());
    let total: u128 = nominal.values().map(|v| u128::from(*v)).sum();
    for (team, share) in nominal {
        let nominal_milli = (capacity * u128::from(*share))
            .checked_div(total)
            .unwrap_or(0) as u64;
        scheduler
            .apply(Input::TeamQuota {
                team: team.clone(),
                quota: allot_sched::quota::Quota::gpus(nominal_milli),
            })
            .map_err(|source| SimError::Rejected { job: 0, source })?;
    }

    let jobs = &trace.jobs;
    let mut next_arrival = 0usize;
    // (end, run generation, task): a preempted run's end is stale and skipped.
    let mut ends: BinaryHeap<Reverse<(Millis, u32, u64)>> = BinaryHeap::new();
    let mut runs: HashMap<u64, Run> = HashMap::new();
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
        let end = ends.peek().map(|Reverse((t, _, _))| *t);
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
            let idle = scheduler.cluster().free_milli() > 0;
            if idle && waiting {
                acc.wasted += dt;
                if fits {
                    acc.wasted_fit += dt;
                }
            }
        }
        // 1. release what finished
        while let Some(Reverse((t, generation, task))) = ends.peek().copied()
            && t == now
        {
            ends.pop();
            let current = runs
                .get(&task)
                .is_some_and(|r| r.generation == generation && r.started.is_some());
            if !current {
                continue;
            }
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
            if let Some(run) = runs.remove(&task) {
                let job = &jobs[by_task[&task]];
                let (start, milli) = run.started.unwrap_or((now, 0));
                outcomes[by_task[&task]] = Some(JobOutcome {
                    id: job.id,
                    team: job.team.clone(),
                    submit: job.submit,
                    first_start: run.first_start.unwrap_or(start),
                    finish: now,
                    gpu_ms: run.gpu_ms + u128::from(milli) * u128::from(now - start) / 1000,
                });
            }
        }
        // 2. submit arrivals
        while let Some(job) = jobs.get(next_arrival)
            && job.submit == now
        {
            let spec = job.task_spec(u64::from(job.id), oracle);
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
            match decision {
                Decision::Granted {
                    task, placement, ..
                } => {
                    let job = &jobs[by_task[&task.0]];
                    let run = runs.entry(task.0).or_insert_with(|| Run::new(job.duration));
                    let overhead = if run.first_start.is_some() {
                        config.restart_overhead
                    } else {
                        0
                    };
                    run.first_start.get_or_insert(now);
                    run.started = Some((now, placement.gpu_milli()));
                    run.overhead = overhead;
                    ends.push(Reverse((
                        now + overhead + run.remaining,
                        run.generation,
                        task.0,
                    )));
                }
                Decision::Preempted { task, .. } => {
                    if let Some(run) = runs.get_mut(&task.0) {
                        run.preempted(now, config, &mut acc);
                    }
                }
                Decision::Waiting { .. } | Decision::Released { .. } => {}
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
