//! Workloads whose jobs wait for one another: the [`Dag`] the engine follows, the synthetic ML
//! pipelines of scenario `pipelines` ([`generate`]), and the pipeline KPIs ([`PipelineKpis`]).
//!
//! # The synthetic pipelines
//!
//! No public GPU trace records DAG structure (traces/README.md), so pipelines are generated, with
//! durations drawn from a real trace. Each pipeline is a chain of three stages:
//!
//! 1. **preprocess** — CPU only: no GPU, [`Params::preprocess`] CPU and memory;
//! 2. **train** — one task on a gang of 2, 4 or 8 GPUs ([`Params::train_gpus`]), all placed at
//!    once or not at all (one [`TaskSpec`](allot_sched::TaskSpec) spanning its GPUs), with
//!    [`Params::per_gpu`] CPU and memory per GPU;
//! 3. **evaluate** — one GPU, with [`Params::per_gpu`] CPU and memory.
//!
//! A stage is submitted when the stage before it finishes; the engine does that from the
//! [`Dag`]. How the numbers are drawn, from one [`SmallRng`] seeded with [`Params::seed`] (so a
//! seed always gives the same pipelines on the same build), in this order for each pipeline:
//!
//! - **arrival** — a Poisson process of [`Params::rate_per_hour`]: the first pipeline arrives at
//!   0, each next one after an exponential gap of mean 1/rate;
//! - **team** — [`TeamAssignment::RoundRobin`] (pipeline *i* gets team *i* mod teams) or
//!   [`TeamAssignment::Random`] (a uniform draw);
//! - **preprocess duration** — the duration of a job drawn uniformly, with replacement, from the
//!   source trace's 1-GPU jobs;
//! - **train GPUs and duration** — one job drawn uniformly, with replacement, from the source
//!   trace's jobs whose GPU count is one of [`Params::train_gpus`]: its GPU count *and* its
//!   duration together, so the trace's correlation between size and length is kept. Jobs of
//!   other sizes (1, 12, 16, 32 … GPUs) are never drawn;
//! - **evaluate duration** — another 1-GPU job's duration, drawn like the preprocess one.
//!
//! Durations are taken as the trace has them, unscaled and unfiltered — short failed runs and
//! month-long ones included. With the Philly trace (all 82,229 jobs of the 11 VCs in
//! `vc_nodes.csv`) the train pool holds 5,323 jobs (1,818 of 2 GPUs, 1,870 of 4, 1,635 of 8;
//! mean GPU × duration ≈ 126 GPU-hours) and the 1-GPU pool 76,617 (median 1,117 s, mean
//! 8,301 s).
//!
//! The durations come from the **Microsoft Philly trace** (Jeon et al., "Analysis of Large-Scale
//! Multi-Tenant GPU Clusters for DNN Training Workloads", USENIX ATC'19; msr-fiddle/philly-traces,
//! CC-BY-4.0), as processed by the Pollux artifact (petuum/adaptdl, Apache-2.0).

use std::collections::BTreeMap;

use allot_sched::{DagFacts, Input, NodeSpec, Scheduler};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::kpi::JobOutcome;
use crate::trace::{LoadError, Millis, Trace, TraceJob, TraceTeam};

// ---------------------------------------------------------------------------------------------
// The DAG

/// Which jobs wait for which. Jobs are named by their [`TraceJob::id`], which must be below
/// [`Dag::len`]; a job is submitted once every job it waits for has finished.
///
/// A **pipeline** is a set of jobs linked by waits (a weakly connected component); a job that
/// waits for nothing and that nothing waits for is a pipeline of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dag {
    /// Per job: the jobs it waits for.
    after: Vec<Vec<u32>>,
    /// Per job: the jobs that wait for it.
    next: Vec<Vec<u32>>,
    /// Per job: what the scheduler is told of its place in its pipeline.
    facts: Vec<DagFacts>,
    /// Per job: its pipeline, numbered in order of each pipeline's lowest job id.
    pipeline: Vec<u32>,
    /// How many pipelines.
    pipelines: usize,
}

/// A [`Dag`] that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DagError {
    /// An edge names a job the DAG does not have.
    #[error("edge {before} → {after} names a job beyond the {jobs} jobs of the DAG")]
    UnknownJob {
        /// The job that runs first.
        before: u32,
        /// The job that waits.
        after: u32,
        /// Jobs in the DAG.
        jobs: usize,
    },
    /// Jobs wait for one another in a circle, so none of them could ever start.
    #[error("job {job} waits for itself, directly or through other jobs")]
    Cycle {
        /// A job on the cycle.
        job: u32,
    },
}

impl Dag {
    /// A DAG of `jobs` jobs where, for each `(before, after)` edge, job `after` waits for job
    /// `before`. Duplicate edges count once.
    pub fn new(jobs: usize, edges: &[(u32, u32)]) -> Result<Self, DagError> {
        let mut after: Vec<Vec<u32>> = vec![Vec::new(); jobs];
        let mut next: Vec<Vec<u32>> = vec![Vec::new(); jobs];
        for &(b, a) in edges {
            if b as usize >= jobs || a as usize >= jobs {
                return Err(DagError::UnknownJob {
                    before: b,
                    after: a,
                    jobs,
                });
            }
            if b == a {
                return Err(DagError::Cycle { job: a });
            }
            if !after[a as usize].contains(&b) {
                after[a as usize].push(b);
                next[b as usize].push(a);
            }
        }
        // Kahn's order: every job after all the jobs it waits for; what is left is on a cycle.
        let mut waiting: Vec<usize> = after.iter().map(Vec::len).collect();
        let mut order: Vec<u32> = (0..jobs as u32)
            .filter(|j| waiting[*j as usize] == 0)
            .collect();
        let mut at = 0;
        while let Some(&job) = order.get(at) {
            at += 1;
            for &n in &next[job as usize] {
                waiting[n as usize] -= 1;
                if waiting[n as usize] == 0 {
                    order.push(n);
                }
            }
        }
        if order.len() < jobs {
            let job = (0..jobs as u32)
                .find(|j| waiting[*j as usize] > 0)
                .unwrap_or(0);
            return Err(DagError::Cycle { job });
        }
        // Longest chain to the end, counted in jobs: from the last jobs backwards.
        let mut facts = vec![DagFacts::default(); jobs];
        for &job in order.iter().rev() {
            let below = next[job as usize]
                .iter()
                .map(|n| facts[*n as usize].critical_path_rank)
                .max()
                .unwrap_or(0);
            facts[job as usize].critical_path_rank = below + 1;
        }
        // Dependents: the jobs reachable downstream, each counted once.
        let mut seen = vec![u32::MAX; jobs];
        let mut stack = Vec::new();
        for job in 0..jobs as u32 {
            let mut count = 0;
            stack.extend_from_slice(&next[job as usize]);
            while let Some(n) = stack.pop() {
                if seen[n as usize] != job {
                    seen[n as usize] = job;
                    count += 1;
                    stack.extend_from_slice(&next[n as usize]);
                }
            }
            facts[job as usize].dependents = count;
        }
        // Pipelines: connected components, numbered by their lowest job.
        let mut pipeline = vec![u32::MAX; jobs];
        let mut pipelines = 0;
        for job in 0..jobs {
            if pipeline[job] != u32::MAX {
                continue;
            }
            let id = pipelines as u32;
            pipelines += 1;
            pipeline[job] = id;
            stack.push(job as u32);
            while let Some(j) = stack.pop() {
                for &n in after[j as usize].iter().chain(&next[j as usize]) {
                    if pipeline[n as usize] == u32::MAX {
                        pipeline[n as usize] = id;
                        stack.push(n);
                    }
                }
            }
        }
        Ok(Self {
            after,
            next,
            facts,
            pipeline,
            pipelines,
        })
    }

    /// Jobs in the DAG.
    pub fn len(&self) -> usize {
        self.after.len()
    }

    /// Whether it has no job.
    pub fn is_empty(&self) -> bool {
        self.after.is_empty()
    }

    /// The jobs `job` waits for.
    pub fn after(&self, job: u32) -> &[u32] {
        &self.after[job as usize]
    }

    /// The jobs that wait for `job`.
    pub fn next(&self, job: u32) -> &[u32] {
        &self.next[job as usize]
    }

    /// What the scheduler is told of `job`'s place in its pipeline.
    pub fn facts(&self, job: u32) -> DagFacts {
        self.facts[job as usize]
    }

    /// The pipeline `job` belongs to (0-based).
    pub fn pipeline(&self, job: u32) -> u32 {
        self.pipeline[job as usize]
    }

    /// How many pipelines.
    pub fn pipelines(&self) -> usize {
        self.pipelines
    }
}

// ---------------------------------------------------------------------------------------------
// The generator

/// How pipelines get their team.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TeamAssignment {
    /// Pipeline *i* gets team *i* mod the number of teams.
    #[default]
    RoundRobin,
    /// A uniform draw per pipeline.
    Random,
}

/// Which pipelines have a deadline, and how tight. A pipeline with one must finish within
/// `slack` × the sum of its stages' durations of its arrival — ElasticFlow's construction
/// (Gu et al., ASPLOS'23: a deadline at submission + λ × the job's run time, λ drawn per
/// job), here per pipeline, with λ ≥ 1 since stages do not speed up with more GPUs. Every
/// stage of the pipeline carries that deadline, as a user would give it in each task's spec.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deadlines {
    /// Share of pipelines that have one, in [0, 1].
    pub share: f64,
    /// The least and most λ, drawn uniformly (1 ≤ least ≤ most).
    pub slack: (f64, f64),
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            share: 1.0 / 3.0,
            slack: (1.5, 3.0),
        }
    }
}

/// Seed offset of the deadline draws: a stream of their own, so the pipelines (arrivals,
/// teams, durations) of a seed are the same with or without deadlines.
const DEADLINE_STREAM: u64 = 0x6465_6164_6c69_6e65;

/// CPU and memory a stage asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRequest {
    /// CPU, millicores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
}

impl HostRequest {
    /// This much per GPU, for `gpus` GPUs.
    pub fn times(self, gpus: u32) -> Self {
        Self {
            cpu_milli: self.cpu_milli * u64::from(gpus),
            memory_mib: self.memory_mib * u64::from(gpus),
        }
    }
}

/// What to generate. [`Params::default`] is scenario `pipelines` without its flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// How many pipelines (at least 1).
    pub pipelines: usize,
    /// Seed of the draws.
    pub seed: u64,
    /// Mean arrivals per hour (positive and finite).
    pub rate_per_hour: f64,
    /// The teams, each with an equal nominal quota (at least one).
    pub teams: Vec<String>,
    /// How pipelines get their team.
    pub assignment: TeamAssignment,
    /// GPU counts a train stage may have; jobs of these sizes are drawn from the trace (each
    /// at least 2: a gang).
    pub train_gpus: Vec<u32>,
    /// CPU and memory of the CPU-only preprocess stage (CPU must not be 0).
    pub preprocess: HostRequest,
    /// CPU and memory per GPU of the train and evaluate stages.
    pub per_gpu: HostRequest,
    /// Which pipelines have a deadline.
    pub deadlines: Deadlines,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            pipelines: 500,
            seed: 1,
            rate_per_hour: DEFAULT_RATE_PER_HOUR,
            teams: (1..=4).map(|i| format!("team-{i}")).collect(),
            assignment: TeamAssignment::RoundRobin,
            train_gpus: vec![2, 4, 8],
            preprocess: HostRequest {
                cpu_milli: 16_000,
                memory_mib: 64 * 1024,
            },
            per_gpu: HostRequest {
                cpu_milli: 4_000,
                memory_mib: 32 * 1024,
            },
            deadlines: Deadlines::default(),
        }
    }
}

/// Default arrivals per hour. Philly's train jobs average ≈ 126 GPU-hours, so 3 an hour offer
/// ≈ 380 GPUs of work while pipelines arrive — more than a 32 × 8 cluster, so queues form and
/// policies differ. At half that rate the same cluster queues almost nothing (docs/benchmarks.md).
pub const DEFAULT_RATE_PER_HOUR: f64 = 3.0;

/// CPU per GPU of the nodes [`node`] builds, millicores (a DGX A100 has 128 cores for 8 GPUs).
pub const NODE_CPU_MILLI_PER_GPU: u64 = 16_000;

/// Memory per GPU of the nodes [`node`] builds, MiB (a DGX A100 has 1 TiB for 8 GPUs).
pub const NODE_MEMORY_MIB_PER_GPU: u64 = 128 * 1024;

/// A node of `gpus` GPUs of `model` for the pipelines scenario, with CPU and memory tracked in
/// proportion to its GPUs, so that CPU-only stages take host resources like any other task.
pub fn node(name: impl Into<String>, gpus: u32, model: impl Into<String>) -> NodeSpec {
    let per = u64::from(gpus.max(1));
    NodeSpec {
        cpu_milli: per * NODE_CPU_MILLI_PER_GPU,
        memory_mib: per * NODE_MEMORY_MIB_PER_GPU,
        ..NodeSpec::new(name, gpus, model)
    }
}

/// One problem with [`Params`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamProblem {
    /// Zero pipelines asked for.
    #[error("the number of pipelines must be at least 1")]
    NoPipelines,
    /// The arrival rate is zero, negative, NaN or infinite.
    #[error("the arrival rate must be a positive, finite number of pipelines per hour, not {0}")]
    Rate(f64),
    /// No team to assign pipelines to.
    #[error("at least one team is needed")]
    NoTeams,
    /// No train size to draw.
    #[error("at least one train GPU count is needed")]
    NoTrainGpus,
    /// A train size below 2 is not a gang.
    #[error("a train stage runs on a gang of 2 or more GPUs, not {0}")]
    TrainGpus(u32),
    /// The CPU-only stage asks for no CPU.
    #[error("the CPU-only preprocess stage must ask for some CPU")]
    PreprocessCpu,
    /// The share of pipelines with a deadline is not in [0, 1].
    #[error("the share of pipelines with a deadline must be between 0 and 1, not {0}")]
    DeadlineShare(f64),
    /// The deadline slack is below 1, reversed, or not finite.
    #[error(
        "the deadline slack must be finite with 1 ≤ least ≤ most, not {0}..{1} (a pipeline \
         cannot finish sooner than its stages run)"
    )]
    DeadlineSlack(f64, f64),
}

/// Why pipelines could not be generated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PipelineError {
    /// The parameters are impossible (every problem is listed).
    #[error("impossible pipeline parameters: {}", list(.0))]
    Params(Vec<ParamProblem>),
    /// The source trace has no job of a kind durations are drawn from.
    #[error("the source trace has no {what} jobs to draw durations from")]
    NoTraceJobs {
        /// Which jobs: `1-GPU`, or the train sizes.
        what: String,
    },
    /// A stage can never be placed on the cluster, even empty.
    #[error("the {stage} stage ({gpus} GPUs) can never run on this cluster: {why}")]
    Unplaceable {
        /// `preprocess`, `train` or `evaluate`.
        stage: &'static str,
        /// Its GPUs.
        gpus: u32,
        /// The scheduler's reason.
        why: String,
    },
    /// The source trace could not be loaded.
    #[error("loading the source trace")]
    Load(#[from] LoadError),
}

fn list(problems: &[ParamProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl Params {
    /// Every problem with these parameters; empty when they are possible.
    pub fn problems(&self) -> Vec<ParamProblem> {
        let mut problems = Vec::new();
        if self.pipelines == 0 {
            problems.push(ParamProblem::NoPipelines);
        }
        if !(self.rate_per_hour.is_finite() && self.rate_per_hour > 0.0) {
            problems.push(ParamProblem::Rate(self.rate_per_hour));
        }
        if self.teams.is_empty() {
            problems.push(ParamProblem::NoTeams);
        }
        if self.train_gpus.is_empty() {
            problems.push(ParamProblem::NoTrainGpus);
        }
        for gpus in &self.train_gpus {
            if *gpus < 2 {
                problems.push(ParamProblem::TrainGpus(*gpus));
            }
        }
        if self.preprocess.cpu_milli == 0 {
            problems.push(ParamProblem::PreprocessCpu);
        }
        let Deadlines {
            share,
            slack: (least, most),
        } = self.deadlines;
        if !(0.0..=1.0).contains(&share) {
            problems.push(ParamProblem::DeadlineShare(share));
        }
        if !(least.is_finite() && most.is_finite() && 1.0 <= least && least <= most) {
            problems.push(ParamProblem::DeadlineSlack(least, most));
        }
        problems
    }

    /// Fails with [`PipelineError::Unplaceable`] if some stage these parameters can draw could
    /// never be placed on `nodes`, even with nothing running — asked of the scheduler itself,
    /// so the answer is the one the simulation would meet.
    pub fn check_fits(&self, nodes: &[NodeSpec]) -> Result<(), PipelineError> {
        let mut scheduler = Scheduler::new(Box::new(allot_sched::policy::Fifo));
        for node in nodes {
            // Adding a node cannot fail.
            let _ = scheduler.apply(Input::NodeAdded(node.clone()));
        }
        let mut stages = vec![
            ("preprocess", 0, self.preprocess),
            ("evaluate", 1, self.per_gpu.times(1)),
        ];
        stages.extend(
            self.train_gpus
                .iter()
                .map(|g| ("train", *g, self.per_gpu.times(*g))),
        );
        for (id, (stage, gpus, host)) in stages.into_iter().enumerate() {
            let job = stage_job(id as u32, stage.into(), 0, "check", gpus, 0, host);
            let task = job.task_spec(u64::from(job.id), false);
            let submitted = scheduler.apply(Input::TaskSubmitted { task, at: 0 });
            if let Err(allot_sched::ApplyError::Unplaceable { why, .. }) = submitted {
                return Err(PipelineError::Unplaceable { stage, gpus, why });
            }
        }
        Ok(())
    }
}

/// One stage as a trace job; `host` is its whole CPU and memory.
fn stage_job(
    id: u32,
    name: String,
    submit: Millis,
    team: &str,
    gpus: u32,
    duration: Millis,
    host: HostRequest,
) -> TraceJob {
    TraceJob {
        id,
        name,
        submit,
        duration,
        gpus,
        gpu_milli: if gpus == 0 { 0 } else { 1000 },
        gpu_models: Vec::new(),
        team: team.to_owned(),
        priority: 0,
        cpu_milli: host.cpu_milli,
        memory_mib: host.memory_mib,
        deadline: None,
    }
}

/// One generated pipeline: the ids of its three jobs in the generated [`Trace`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pipeline {
    /// Its team.
    pub team: String,
    /// When it arrives (its preprocess stage is submitted), ms.
    pub arrival: Millis,
    /// The CPU-only stage.
    pub preprocess: u32,
    /// The GPU gang.
    pub train: u32,
    /// The 1-GPU stage.
    pub evaluate: u32,
    /// When it should be done, ms (every stage carries it; see [`Deadlines`]).
    pub deadline: Option<Millis>,
}

/// Generated pipelines: their jobs as a trace, and the DAG that chains them.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipelines {
    /// The jobs: pipeline *i*'s stages are jobs 3*i*, 3*i* + 1, 3*i* + 2. A stage's `submit` is
    /// its pipeline's arrival, the earliest it could be submitted.
    pub trace: Trace,
    /// Each stage waits for the one before it.
    pub dag: Dag,
    /// The pipelines, in arrival order.
    pub pipelines: Vec<Pipeline>,
}

/// Generates pipelines with durations drawn from `source` (see the module docs).
pub fn generate(source: &Trace, params: &Params) -> Result<Pipelines, PipelineError> {
    let problems = params.problems();
    if !problems.is_empty() {
        return Err(PipelineError::Params(problems));
    }
    let whole = |j: &&TraceJob| j.gpu_milli == 1000;
    let single: Vec<Millis> = source
        .jobs
        .iter()
        .filter(whole)
        .filter(|j| j.gpus == 1)
        .map(|j| j.duration)
        .collect();
    let train: Vec<(u32, Millis)> = source
        .jobs
        .iter()
        .filter(whole)
        .filter(|j| params.train_gpus.contains(&j.gpus))
        .map(|j| (j.gpus, j.duration))
        .collect();
    if single.is_empty() {
        return Err(PipelineError::NoTraceJobs {
            what: "1-GPU".into(),
        });
    }
    if train.is_empty() {
        let sizes: Vec<String> = params.train_gpus.iter().map(u32::to_string).collect();
        return Err(PipelineError::NoTraceJobs {
            what: format!("{}-GPU", sizes.join("/")),
        });
    }

    let mut rng = SmallRng::seed_from_u64(params.seed);
    let mut deadline_rng = SmallRng::seed_from_u64(params.seed ^ DEADLINE_STREAM);
    let mean_gap_ms = 3_600_000.0 / params.rate_per_hour;
    let mut clock = 0.0f64;
    let mut jobs = Vec::with_capacity(params.pipelines * 3);
    let mut edges = Vec::with_capacity(params.pipelines * 2);
    let mut pipelines = Vec::with_capacity(params.pipelines);
    for i in 0..params.pipelines {
        if i > 0 {
            // Exponential gap by inversion; 1 − U is in (0, 1], so the log is finite.
            let u: f64 = rng.random();
            clock += -(1.0 - u).ln() * mean_gap_ms;
        }
        let arrival = clock.round() as Millis;
        let team = match params.assignment {
            TeamAssignment::RoundRobin => &params.teams[i % params.teams.len()],
            TeamAssignment::Random => &params.teams[rng.random_range(0..params.teams.len())],
        };
        let preprocess = single[rng.random_range(0..single.len())];
        let (gpus, train_ms) = train[rng.random_range(0..train.len())];
        let evaluate = single[rng.random_range(0..single.len())];
        let first = (3 * i) as u32;
        let name = |stage: &str| format!("pipeline-{i:04}/{stage}");
        jobs.extend([
            stage_job(
                first,
                name("preprocess"),
                arrival,
                team,
                0,
                preprocess,
                params.preprocess,
            ),
            stage_job(
                first + 1,
                name("train"),
                arrival,
                team,
                gpus,
                train_ms,
                params.per_gpu.times(gpus),
            ),
            stage_job(
                first + 2,
                name("evaluate"),
                arrival,
                team,
                1,
                evaluate,
                params.per_gpu.times(1),
            ),
        ]);
        edges.push((first, first + 1));
        edges.push((first + 1, first + 2));
        // Both draws for every pipeline, so one's deadline never shifts another's.
        let (has, u): (f64, f64) = (deadline_rng.random(), deadline_rng.random());
        let (least, most) = params.deadlines.slack;
        let deadline = (has < params.deadlines.share).then(|| {
            let work = (preprocess + train_ms + evaluate) as f64;
            arrival + (work * (least + u * (most - least))).round() as Millis
        });
        for job in &mut jobs[first as usize..] {
            job.deadline = deadline;
        }
        pipelines.push(Pipeline {
            team: team.clone(),
            arrival,
            preprocess: first,
            train: first + 1,
            evaluate: first + 2,
            deadline,
        });
    }
    let dag = Dag::new(jobs.len(), &edges).expect("chains are acyclic and in range");
    let trace = Trace {
        source: format!(
            "pipelines: {} at {}/h, seed {}, durations from {}",
            params.pipelines, params.rate_per_hour, params.seed, source.source
        ),
        jobs,
        nodes: Vec::new(),
        teams: params
            .teams
            .iter()
            .map(|name| TraceTeam {
                name: name.clone(),
                nominal_gpus: 1,
            })
            .collect(),
    };
    Ok(Pipelines {
        trace,
        dag,
        pipelines,
    })
}

// ---------------------------------------------------------------------------------------------
// KPIs

/// GPU-hours that would sit idle if each pipeline were run as one job holding, from its first
/// stage's start to its last stage's end, the most GPUs any of its stages needs: per pipeline,
/// that many GPUs × the sum of its jobs' durations, less what the jobs use. For the generated
/// chains, the train gang through preprocess and all but one of its GPUs through evaluate.
/// Run times only (waits between stages would add to it), so it is a floor: what running
/// stages as a DAG saves at least.
pub fn gpu_hours_idle_if_held_throughout(trace: &Trace, dag: &Dag) -> f64 {
    // Per pipeline: (most milli-GPU of a stage, sum of durations, sum of milli-GPU × duration).
    let mut per: Vec<(u128, u128, u128)> = vec![(0, 0, 0); dag.pipelines()];
    for job in &trace.jobs {
        let gpus = u128::from(job.gpus) * u128::from(job.gpu_milli);
        let p = &mut per[dag.pipeline(job.id) as usize];
        p.0 = p.0.max(gpus);
        p.1 += u128::from(job.duration);
        p.2 += gpus * u128::from(job.duration);
    }
    let ms: u128 = per.iter().map(|(most, ms, used)| most * ms - used).sum();
    ms as f64 / 1000.0 / 3_600_000.0
}

/// How one pipeline went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineOutcome {
    /// Its number in the [`Dag`].
    pub pipeline: u32,
    /// When its first job was submitted.
    pub submit: Millis,
    /// When its last job finished.
    pub finish: Millis,
    /// When it should have been done (the earliest deadline of its jobs).
    pub deadline: Option<Millis>,
}

/// The pipeline KPIs of one run: completion time = last job's finish − first job's submit.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineKpis {
    /// Pipelines completed.
    pub pipelines: usize,
    /// Average completion time, s.
    pub avg_completion_s: f64,
    /// Median completion time, s.
    pub p50_completion_s: f64,
    /// 95th percentile completion time, s.
    pub p95_completion_s: f64,
    /// GPU-hours held by pipelines while every job they had submitted and not finished asked
    /// for no GPU — measured from the placements granted; running stages as a DAG keeps it 0.
    pub gpu_hours_held_in_cpu_stages: f64,
    /// Pipelines with a deadline, and how many of them finished by it.
    pub deadlines: crate::kpi::DeadlinesMet,
}

/// Groups job outcomes (by trace id) into pipeline outcomes, in pipeline order.
pub(crate) fn pipeline_outcomes(dag: &Dag, outcomes: &[JobOutcome]) -> Vec<PipelineOutcome> {
    let mut by: BTreeMap<u32, (Millis, Millis, Option<Millis>)> = BTreeMap::new();
    for o in outcomes {
        let entry = by
            .entry(dag.pipeline(o.id))
            .or_insert((Millis::MAX, Millis::MIN, None));
        entry.0 = entry.0.min(o.submit);
        entry.1 = entry.1.max(o.finish);
        entry.2 = entry.2.into_iter().chain(o.deadline).min();
    }
    by.into_iter()
        .map(|(pipeline, (submit, finish, deadline))| PipelineOutcome {
            pipeline,
            submit,
            finish,
            deadline,
        })
        .collect()
}

/// The KPIs of `outcomes`; `cpu_stage_gpu_ms` is milli-GPU × ms held while in CPU-only stages.
pub(crate) fn kpis(outcomes: &[PipelineOutcome], cpu_stage_gpu_ms: u128) -> PipelineKpis {
    let mut times: Vec<Millis> = outcomes.iter().map(|o| o.finish - o.submit).collect();
    times.sort_unstable();
    let n = times.len().max(1) as f64;
    // Nearest rank, as the per-job KPIs.
    let percentile = |p: f64| {
        if times.is_empty() {
            return 0.0;
        }
        let rank = ((p / 100.0) * times.len() as f64).ceil() as usize;
        times[rank.clamp(1, times.len()) - 1] as f64 / 1000.0
    };
    PipelineKpis {
        pipelines: outcomes.len(),
        avg_completion_s: times.iter().map(|t| *t as f64).sum::<f64>() / n / 1000.0,
        p50_completion_s: percentile(50.0),
        p95_completion_s: percentile(95.0),
        gpu_hours_held_in_cpu_stages: cpu_stage_gpu_ms as f64 / 1000.0 / 3_600_000.0,
        deadlines: crate::kpi::DeadlinesMet::of(outcomes.iter().map(|o| (o.finish, o.deadline))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dag_facts_count_transitive_dependents_and_the_longest_chain() {
        // 0 → 1 → 3, 0 → 2 → 3, 3 → 4; 5 alone.
        let dag = Dag::new(6, &[(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (0, 1)]).unwrap();
        let want = [(4, 4), (2, 3), (2, 3), (1, 2), (0, 1), (0, 1)];
        for (job, (dependents, rank)) in want.into_iter().enumerate() {
            let facts = dag.facts(job as u32);
            assert_eq!(
                (facts.dependents, facts.critical_path_rank),
                (dependents, rank),
                "job {job}"
            );
        }
        assert_eq!(dag.after(3), &[1, 2]);
        assert_eq!(dag.pipelines(), 2);
        assert_eq!((dag.pipeline(4), dag.pipeline(5)), (0, 1));
    }

    #[test]
    fn a_dag_with_a_cycle_or_an_unknown_job_is_refused() {
        for (name, edges, want) in [
            (
                "cycle",
                vec![(0, 1), (1, 2), (2, 1)],
                DagError::Cycle { job: 1 },
            ),
            ("self loop", vec![(2, 2)], DagError::Cycle { job: 2 }),
            (
                "unknown job",
                vec![(0, 3)],
                DagError::UnknownJob {
                    before: 0,
                    after: 3,
                    jobs: 3,
                },
            ),
        ] {
            assert_eq!(Dag::new(3, &edges), Err(want), "{name}");
        }
    }
}
