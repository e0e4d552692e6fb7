//! The discrete-event engine: replays a trace through allot-sched.
//!
//! At each event time, in this order (DESIGN.md's reference semantics): finished jobs are
//! released, arrivals are submitted, then one scheduling pass runs. Time-weighted KPIs are
//! accumulated over the interval until the next event.
//!
//! With a [`Dag`] (scenario `pipelines`), a job that waits for others is submitted only once the
//! last of them has finished — at that finish time, in step 2 of the same event, so a stage
//! holds nothing between its predecessor's end and its own submission — and carries its
//! [`DagFacts`](allot_sched::DagFacts) to the scheduler. Jobs submitted at the same time go in
//! trace order. Without a DAG every job arrives at its submit time, as before.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use allot_sched::{ApplyError, Decision, Input, NodeSpec, Policy, Scheduler, TaskId};

use crate::kpi::{self, Accumulators, Eta, JobOutcome, Kpis};
use crate::pipelines::{self, Dag, PipelineKpis, PipelineOutcome};
use crate::scenario::Scenario;
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
    /// Ask the scheduler for each job's ETA right after the pass at its submission
    /// ([`JobOutcome::eta_at_submit`](crate::kpi::JobOutcome)). Off by default: each answer
    /// replays the queue ahead of the job, which on long queues costs more than the whole
    /// simulation otherwise does.
    pub eta_at_submit: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            checkpoint_every: 15 * 60 * 1000,
            restart_overhead: 60 * 1000,
            sample_every: 0,
            eta_at_submit: false,
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
    /// Per-job outcomes, by trace id; a job's `submit` is when it was submitted to the
    /// scheduler (for a job that waited for others, when the last of them finished).
    pub outcomes: Vec<JobOutcome>,
    /// Pipeline KPIs, when the run followed a DAG.
    pub pipelines: Option<PipelineKpis>,
    /// Per-pipeline outcomes, when the run followed a DAG.
    pub pipeline_outcomes: Vec<PipelineOutcome>,
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
    /// A job's id is beyond the DAG's jobs.
    #[error("job {job} is not in the DAG, which has {jobs} jobs")]
    NotInDag {
        /// Trace id.
        job: u32,
        /// Jobs in the DAG.
        jobs: usize,
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

/// What a run tells its caller as it goes. The engine draws nothing itself: progress bars,
/// logs and test probes belong to the caller.
#[derive(Default)]
pub struct Observer<'a> {
    /// Called with how many jobs have finished so far, each time that number grows.
    pub progress: Option<&'a dyn Fn(usize)>,
    /// Called with every decision, as it is made (task ids are trace ids).
    pub decision: Option<&'a mut dyn FnMut(&Decision)>,
    /// Called with every input applied to the scheduler, its decisions and whether it was
    /// rejected: the run's journal (see `allot_sched::journal`).
    pub journal: Option<JournalSink<'a>>,
}

/// Receives every input applied, its decisions, and the error if it was rejected.
pub type JournalSink<'a> = &'a mut dyn FnMut(&Input, &[Decision], Option<&ApplyError>);

/// What the predictor knows of `job` submitted at `now` (traces name no task identity).
fn predictor_job(job: &crate::trace::TraceJob, now: Millis) -> allot_predict::Job {
    allot_predict::Job {
        team: job.team.clone(),
        identity: None,
        gpus: job.gpus,
        gpu_milli: job.gpu_milli,
        submit_ms: now,
        declared_ms: None,
    }
}

/// Applies `input`, appending its decisions to `out`, and hands it to the observer's journal.
fn step(
    scheduler: &mut Scheduler,
    input: Input,
    out: &mut Vec<Decision>,
    observer: &mut Observer<'_>,
) -> Result<(), ApplyError> {
    let Some(journal) = observer.journal.as_mut() else {
        return scheduler.apply_into(input, out);
    };
    let start = out.len();
    let logged = input.clone();
    let result = scheduler.apply_into(input, out);
    journal(&logged, &out[start..], result.as_ref().err());
    result
}

impl fmt::Debug for Observer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("progress", &self.progress.is_some())
            .field("decision", &self.decision.is_some())
            .field("journal", &self.journal.is_some())
            .finish()
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
    simulate(
        trace,
        None,
        nodes,
        policy,
        nominal,
        config,
        &mut Observer::default(),
    )
}

/// Replays `scenario` under `policy`, following its DAG if it has one, and reports to
/// `observer` as it goes.
pub fn run_scenario(
    scenario: &Scenario,
    policy: Box<dyn Policy>,
    config: &SimConfig,
    observer: &mut Observer<'_>,
) -> Result<SimResult, SimError> {
    simulate(
        &scenario.trace,
        scenario.dag.as_ref(),
        &scenario.nodes,
        policy,
        &scenario.nominal,
        config,
        observer,
    )
}

/// Where a pipeline stands, for the GPU time held while it is in CPU-only stages.
#[derive(Debug, Clone, Copy, Default)]
struct PipelineState {
    /// Jobs submitted and not finished.
    active: u32,
    /// Of those, jobs that ask for GPUs.
    active_gpu: u32,
    /// Milli-GPU its running jobs hold, by their placements.
    held: u64,
}

impl PipelineState {
    /// Milli-GPU held while every active job is CPU-only.
    fn held_in_cpu_stage(&self) -> u64 {
        if self.active > 0 && self.active_gpu == 0 {
            self.held
        } else {
            0
        }
    }
}

/// The engine's view of a DAG: what each job still waits for, and the pipelines' states.
#[derive(Debug)]
struct DagRun<'d> {
    dag: &'d Dag,
    /// Per job index: jobs it waits for that have not finished.
    waiting: Vec<usize>,
    /// Jobs whose last predecessor has finished: (when to submit them — that finish, or their
    /// own submit time if later — and job index).
    deferred: BinaryHeap<Reverse<(Millis, usize)>>,
    pipelines: Vec<PipelineState>,
    /// Sum of [`PipelineState::held_in_cpu_stage`] over pipelines.
    held_in_cpu_stages: u64,
    /// Milli-GPU × ms of it, over time.
    held_in_cpu_stages_ms: u128,
}

impl DagRun<'_> {
    /// Changes one pipeline's state, keeping the sum up to date.
    fn update(&mut self, job_id: u32, change: impl FnOnce(&mut PipelineState)) {
        let state = &mut self.pipelines[self.dag.pipeline(job_id) as usize];
        self.held_in_cpu_stages -= state.held_in_cpu_stage();
        change(state);
        self.held_in_cpu_stages += state.held_in_cpu_stage();
    }
}

/// The event loop behind [`run`] and [`run_scenario`].
fn simulate(
    trace: &Trace,
    dag: Option<&Dag>,
    nodes: &[NodeSpec],
    policy: Box<dyn Policy>,
    nominal: &BTreeMap<String, u32>,
    config: &SimConfig,
    observer: &mut Observer<'_>,
) -> Result<SimResult, SimError> {
    let started = Instant::now();
    let name = policy.name().to_owned();
    let parameters = policy.parameters();
    let oracle = policy.uses_oracle();
    // The run-time predictor, offline: each submission's prediction becomes the task's
    // `predicted_duration` (as TaskPredicted sets it live), learned only from runs that
    // finished before it, and relearned as the trace advances.
    let mut predictor = (policy.uses_predictor() && !oracle)
        .then(|| allot_predict::Predictor::new(allot_predict::TrainParams::default()));
    let mut scheduler = Scheduler::new(policy);
    for node in nodes {
        step(
            &mut scheduler,
            Input::NodeAdded(node.clone()),
            &mut Vec::new(),
            observer,
        )
        .map_err(|source| SimError::Rejected { job: 0, source })?;
    }
    // Nominal quotas scaled to the cluster: only their proportions come from the scenario.
    // Largest remainders get the milli-GPUs rounding leaves over, so the quotas add up to the
    // capacity exactly (else the last GPUs could be lent to nobody).
    let capacity = u128::from(scheduler.cluster().capacity_milli());
    let total: u128 = nominal.values().map(|v| u128::from(*v)).sum();
    let mut shares: Vec<(&String, u128, u128)> = nominal
        .iter()
        .map(|(team, share)| {
            let exact = capacity * u128::from(*share);
            let (whole, rest) = match total {
                0 => (0, 0),
                t => (exact / t, exact % t),
            };
            (team, whole, rest)
        })
        .collect();
    let left = if total == 0 {
        0
    } else {
        capacity - shares.iter().map(|(_, whole, _)| whole).sum::<u128>()
    };
    let mut by_rest: Vec<usize> = (0..shares.len()).collect();
    by_rest.sort_by_key(|i| (std::cmp::Reverse(shares[*i].2), *i));
    for i in by_rest.into_iter().take(left as usize) {
        shares[i].1 += 1;
    }
    for (team, nominal_milli, _) in shares {
        step(
            &mut scheduler,
            Input::TeamQuota {
                team: team.clone(),
                quota: allot_sched::quota::Quota::gpus(nominal_milli as u64),
            },
            &mut Vec::new(),
            observer,
        )
        .map_err(|source| SimError::Rejected { job: 0, source })?;
    }

    let jobs = &trace.jobs;
    let mut dag_run = match dag {
        None => None,
        Some(dag) => {
            if let Some(job) = jobs.iter().find(|j| j.id as usize >= dag.len()) {
                return Err(SimError::NotInDag {
                    job: job.id,
                    jobs: dag.len(),
                });
            }
            Some(DagRun {
                dag,
                waiting: jobs.iter().map(|j| dag.after(j.id).len()).collect(),
                deferred: BinaryHeap::new(),
                pipelines: vec![PipelineState::default(); dag.pipelines()],
                held_in_cpu_stages: 0,
                held_in_cpu_stages_ms: 0,
            })
        }
    };
    // Jobs that wait for nothing arrive at their submit time, in trace order; the others are
    // submitted when their last predecessor finishes (or at their submit time, if later).
    let roots: Vec<usize> = match &dag_run {
        None => (0..jobs.len()).collect(),
        Some(d) => (0..jobs.len()).filter(|i| d.waiting[*i] == 0).collect(),
    };
    let mut next_arrival = 0usize;
    let mut submitted_at: Vec<Millis> = jobs.iter().map(|j| j.submit).collect();
    // (end, run generation, task): a preempted run's end is stale and skipped.
    let mut ends: BinaryHeap<Reverse<(Millis, u32, u64)>> = BinaryHeap::new();
    let mut runs: HashMap<u64, Run> = HashMap::new();
    // The first ETA each job was given while it waited for its first run.
    let mut etas: HashMap<u64, Eta> = HashMap::new();
    // The ETA each job still waiting after its submission's pass was given then.
    let mut etas_at_submit: HashMap<u64, Eta> = HashMap::new();
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
    let mut finished = 0usize;
    // Jobs to submit at this event time, as trace indices.
    let mut arriving: Vec<usize> = Vec::new();

    loop {
        let arrival = roots.get(next_arrival).map(|i| jobs[*i].submit);
        let deferred = dag_run
            .as_ref()
            .and_then(|d| d.deferred.peek().map(|Reverse((t, _))| *t));
        let end = ends.peek().map(|Reverse((t, _, _))| *t);
        let Some(now) = [arrival, deferred, end].into_iter().flatten().min() else {
            break;
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
            if let Some(d) = &mut dag_run {
                d.held_in_cpu_stages_ms += u128::from(d.held_in_cpu_stages) * dt;
            }
        }
        // 1. release what finished
        let finished_before = finished;
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
            step(
                &mut scheduler,
                Input::TaskFinished {
                    task: TaskId(task),
                    at: now,
                    run: None,
                },
                &mut decisions,
                observer,
            )
            .map_err(|source| SimError::Rejected {
                job: task as u32,
                source,
            })?;
            if let Some(observe) = observer.decision.as_mut() {
                decisions.iter().for_each(observe);
            }
            if let Some(run) = runs.remove(&task) {
                let index = by_task[&task];
                let job = &jobs[index];
                if let Some(p) = &mut predictor {
                    p.finished(task, &predictor_job(job, submitted_at[index]), job.duration);
                    if p.retrain_due() {
                        p.retrain();
                    }
                }
                let (start, milli) = run.started.unwrap_or((now, 0));
                outcomes[index] = Some(JobOutcome {
                    id: job.id,
                    team: job.team.clone(),
                    submit: submitted_at[index],
                    first_start: run.first_start.unwrap_or(start),
                    finish: now,
                    gpu_ms: run.gpu_ms + u128::from(milli) * u128::from(now - start) / 1000,
                    eta: etas.remove(&task),
                    eta_at_submit: etas_at_submit.remove(&task),
                    deadline: job.deadline,
                });
                finished += 1;
                if let Some(d) = &mut dag_run {
                    d.update(job.id, |p| {
                        p.held -= milli;
                        p.active -= 1;
                        p.active_gpu -= u32::from(job.gpus > 0);
                    });
                    for next in d.dag.next(job.id) {
                        let n = by_task[&u64::from(*next)];
                        d.waiting[n] -= 1;
                        if d.waiting[n] == 0 {
                            d.deferred.push(Reverse((jobs[n].submit.max(now), n)));
                        }
                    }
                }
            }
        }
        if finished != finished_before
            && let Some(progress) = observer.progress
        {
            progress(finished);
        }
        // 2. submit arrivals, in trace order
        arriving.clear();
        if let Some(d) = &mut dag_run {
            while let Some(Reverse((t, n))) = d.deferred.peek().copied()
                && t == now
            {
                d.deferred.pop();
                arriving.push(n);
            }
        }
        while let Some(&i) = roots.get(next_arrival)
            && jobs[i].submit == now
        {
            arriving.push(i);
            next_arrival += 1;
        }
        if dag_run.is_some() {
            arriving.sort_unstable();
        }
        for &i in &arriving {
            let job = &jobs[i];
            let mut spec = job.task_spec(u64::from(job.id), oracle);
            // The scheduler knows the checkpoint interval, so it can spare the victims that
            // would lose the least.
            spec.checkpoint_every = Some(config.checkpoint_every).filter(|every| *every > 0);
            if let Some(d) = &mut dag_run {
                spec.dag = d.dag.facts(job.id);
                d.update(job.id, |p| {
                    p.active += 1;
                    p.active_gpu += u32::from(job.gpus > 0);
                });
            }
            submitted_at[i] = now;
            if let Some(p) = &mut predictor {
                let prediction = p.submitted(spec.id.0, &predictor_job(job, now));
                // A prediction that rests on nothing learned is no prediction: the scheduler then
                // treats the task as unknown (it preempts for no unlearned estimate).
                spec.predicted_duration = (prediction.basis != allot_predict::Basis::Default)
                    .then_some(prediction.point_ms);
            }
            step(
                &mut scheduler,
                Input::TaskSubmitted {
                    task: spec,
                    at: now,
                },
                &mut Vec::new(),
                observer,
            )
            .map_err(|source| SimError::Rejected {
                job: job.id,
                source,
            })?;
        }
        // 3. one pass
        decisions.clear();
        step(
            &mut scheduler,
            Input::Schedule { at: now },
            &mut decisions,
            observer,
        )
        .map_err(|source| SimError::Rejected { job: 0, source })?;
        for decision in &decisions {
            if let Some(observe) = observer.decision.as_mut() {
                observe(decision);
            }
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
                    let milli = placement.gpu_milli();
                    run.first_start.get_or_insert(now);
                    run.started = Some((now, milli));
                    run.overhead = overhead;
                    ends.push(Reverse((
                        now + overhead + run.remaining,
                        run.generation,
                        task.0,
                    )));
                    if let Some(d) = &mut dag_run {
                        d.update(job.id, |p| p.held += milli);
                    }
                }
                Decision::Preempted { task, .. } => {
                    if let Some(run) = runs.get_mut(&task.0) {
                        let milli = run.started.map_or(0, |(_, m)| m);
                        run.preempted(now, config, &mut acc);
                        if let Some(d) = &mut dag_run {
                            d.update(jobs[by_task[&task.0]].id, |p| p.held -= milli);
                        }
                    }
                }
                // Only the first promise counts, and only before the first run: that is the one
                // a user who just submitted acts on. A task that has run is in `runs`.
                Decision::Waiting {
                    task,
                    eta: Some(start),
                    at,
                    ..
                } if !runs.contains_key(&task.0) => {
                    etas.entry(task.0).or_insert(Eta {
                        start: *start,
                        given_at: *at,
                    });
                }
                // The simulator never withdraws a task.
                Decision::Waiting { .. }
                | Decision::Released { .. }
                | Decision::Reserved { .. }
                | Decision::Withdrawn { .. } => {}
            }
        }
        // What a user who asks right after submitting is told (a query: it decides nothing).
        for &i in arriving.iter().filter(|_| config.eta_at_submit) {
            let task = u64::from(jobs[i].id);
            if runs.contains_key(&task) {
                continue;
            }
            if let Some(start) = scheduler.waiting(TaskId(task), now).and_then(|w| w.eta) {
                etas_at_submit.insert(
                    task,
                    Eta {
                        start,
                        given_at: now,
                    },
                );
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
    let (pipeline_outcomes, pipeline_kpis) = match &dag_run {
        None => (Vec::new(), None),
        Some(d) => {
            let per = pipelines::pipeline_outcomes(d.dag, &outcomes);
            let kpis = pipelines::kpis(&per, d.held_in_cpu_stages_ms);
            (per, Some(kpis))
        }
    };
    Ok(SimResult {
        policy: name,
        parameters,
        kpis,
        outcomes,
        pipelines: pipeline_kpis,
        pipeline_outcomes,
        timeline,
        wall: started.elapsed(),
    })
}
