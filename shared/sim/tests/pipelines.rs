//! Synthetic pipelines and DAG runs: the generator is reproducible, refuses impossible
//! parameters with the error that names the problem, and the engine runs each pipeline's
//! stages in order, with its CPU-only stage holding no GPU, under every policy.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use allot_sched::policy::{Contender, PendingView, Policy, QueueKey, VictimOrder, WhenBlocked};
use allot_sched::quota::{Amounts, Quotas};
use allot_sched::{Cluster, DagFacts, Decision, NodeSpec, Placement, TaskId, TaskSpec, Time};
use allot_sim::pipelines::{
    self, Deadlines, HostRequest, ParamProblem, Params, PipelineError, Pipelines, TeamAssignment,
};
use allot_sim::scenario::{self, Scenario};
use allot_sim::{Observer, SimConfig, SimResult, Trace, TraceJob};

// ---------------------------------------------------------------------------------------------
// Fixtures

/// A source trace: `(GPUs, seconds)` per job.
fn source(jobs: &[(u32, u64)]) -> Trace {
    Trace {
        source: "test".into(),
        jobs: jobs
            .iter()
            .enumerate()
            .map(|(i, (gpus, secs))| TraceJob {
                id: i as u32,
                name: format!("job-{i}"),
                submit: 0,
                duration: secs * 1000,
                gpus: *gpus,
                gpu_milli: 1000,
                gpu_models: Vec::new(),
                team: "vc".into(),
                priority: 0,
                cpu_milli: 0,
                memory_mib: 0,
                deadline: None,
            })
            .collect(),
        ..Trace::default()
    }
}

/// Short 1-GPU jobs and 2-, 4- and 8-GPU jobs of various lengths, and sizes never drawn.
fn small_source() -> Trace {
    source(&[
        (1, 300),
        (1, 900),
        (1, 1_800),
        (1, 60),
        (2, 3_600),
        (2, 600),
        (4, 7_200),
        (4, 1_200),
        (8, 10_800),
        (8, 2_400),
        (16, 99_999),
        (3, 99_999),
    ])
}

fn params(pipelines: usize, seed: u64) -> Params {
    Params {
        pipelines,
        seed,
        rate_per_hour: 6.0,
        ..Params::default()
    }
}

/// `count` nodes of `gpus` GPUs, with host resources as scenario `pipelines` has them.
fn cluster(count: u32, gpus: u32) -> Vec<NodeSpec> {
    (1..=count)
        .map(|i| pipelines::node(format!("node-{i}"), gpus, "gpu"))
        .collect()
}

fn scenario_of(generated: &Pipelines, nodes: Vec<NodeSpec>) -> Scenario {
    Scenario {
        name: "pipelines-test".into(),
        trace: generated.trace.clone(),
        nodes,
        nominal: generated
            .trace
            .teams
            .iter()
            .map(|t| (t.name.clone(), t.nominal_gpus))
            .collect(),
        dag: Some(generated.dag.clone()),
    }
}

/// A policy that decides like `inner` and records the DAG facts of every task submitted.
#[derive(Debug)]
struct Recording {
    inner: Box<dyn Policy>,
    seen: Arc<Mutex<BTreeMap<TaskId, DagFacts>>>,
}

impl Policy for Recording {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn key(&self, task: PendingView<'_>, now: Time) -> QueueKey {
        self.inner.key(task, now)
    }
    fn dynamic(&self) -> bool {
        self.inner.dynamic()
    }
    fn when_blocked(&self) -> WhenBlocked {
        self.inner.when_blocked()
    }
    fn preemptive(&self) -> bool {
        self.inner.preemptive()
    }
    fn may_preempt(
        &self,
        preemptor: Contender<'_>,
        victim: Contender<'_>,
        quotas: &Quotas,
    ) -> bool {
        self.inner.may_preempt(preemptor, victim, quotas)
    }
    fn preemption_reason(
        &self,
        preemptor: Contender<'_>,
        victim: Contender<'_>,
        quotas: &Quotas,
    ) -> String {
        self.inner.preemption_reason(preemptor, victim, quotas)
    }
    fn victim_order(&self) -> VictimOrder {
        self.inner.victim_order()
    }
    fn admits(&self, team: &str, demand: Amounts, quotas: &Quotas) -> bool {
        self.inner.admits(team, demand, quotas)
    }
    fn needs_estimates(&self) -> bool {
        self.inner.needs_estimates()
    }
    fn uses_oracle(&self) -> bool {
        self.inner.uses_oracle()
    }
    fn place(&self, cluster: &Cluster, task: &TaskSpec) -> Option<Placement> {
        self.inner.place(cluster, task)
    }
    fn parameters(&self) -> String {
        self.inner.parameters()
    }
    fn observe_submitted(&mut self, task: &TaskSpec) {
        self.seen.lock().unwrap().insert(task.id, task.dag);
        self.inner.observe_submitted(task);
    }
}

/// Runs `scenario` under `policy`, returning the result, every decision, and the DAG facts
/// each task was submitted with.
fn run(
    scenario: &Scenario,
    policy: &str,
) -> (SimResult, Vec<Decision>, BTreeMap<TaskId, DagFacts>) {
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let policy = Box::new(Recording {
        inner: allot_sched::policy::by_name(policy).expect("a known policy"),
        seen: seen.clone(),
    });
    let mut decisions = Vec::new();
    let mut record = |d: &Decision| decisions.push(d.clone());
    let mut observer = Observer {
        progress: None,
        decision: Some(&mut record),
        journal: None,
    };
    let result = allot_sim::run_scenario(scenario, policy, &SimConfig::default(), &mut observer)
        .expect("the simulation runs");
    let seen = seen.lock().unwrap().clone();
    (result, decisions, seen)
}

fn real_traces(test: &str) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    if dir.join("philly/jobs.csv").is_file() {
        Some(dir)
    } else {
        eprintln!(
            "skipping {test}: the real traces are not at {} (see shared/traces/README.md)",
            dir.display()
        );
        None
    }
}

// ---------------------------------------------------------------------------------------------
// The generator

#[test]
fn a_seed_always_gives_the_same_pipelines_and_another_seed_different_ones() {
    let source = small_source();
    let first = pipelines::generate(&source, &params(40, 7)).unwrap();
    let again = pipelines::generate(&source, &params(40, 7)).unwrap();
    let other = pipelines::generate(&source, &params(40, 8)).unwrap();
    assert_eq!(first, again);
    assert_ne!(first.trace.jobs, other.trace.jobs);
    assert_ne!(
        first
            .pipelines
            .iter()
            .map(|p| p.arrival)
            .collect::<Vec<_>>(),
        other
            .pipelines
            .iter()
            .map(|p| p.arrival)
            .collect::<Vec<_>>(),
    );
}

#[test]
fn deadlines_fall_within_their_slack_on_every_stage_and_change_nothing_else() {
    let source = small_source();
    let with = |share: f64| Params {
        deadlines: Deadlines {
            share,
            ..Deadlines::default()
        },
        ..params(300, 7)
    };
    let none = pipelines::generate(&source, &with(0.0)).unwrap();
    let all = pipelines::generate(&source, &with(1.0)).unwrap();
    let some = pipelines::generate(&source, &params(300, 7)).unwrap();
    // The same pipelines: deadlines are drawn on a stream of their own.
    let strip = |p: &Pipelines| {
        let mut jobs = p.trace.jobs.clone();
        jobs.iter_mut().for_each(|j| j.deadline = None);
        jobs
    };
    assert_eq!(strip(&none), strip(&all));
    assert_eq!(strip(&none), strip(&some));
    assert!(none.trace.jobs.iter().all(|j| j.deadline.is_none()));
    let (least, most) = Deadlines::default().slack;
    for p in &all.pipelines {
        let stages = [p.preprocess, p.train, p.evaluate].map(|j| &all.trace.jobs[j as usize]);
        let work: u64 = stages.iter().map(|j| j.duration).sum();
        let deadline = p.deadline.expect("every pipeline has one at share 1");
        assert!(stages.iter().all(|j| j.deadline == Some(deadline)), "{p:?}");
        let slack = (deadline - p.arrival) as f64 / work as f64;
        assert!((least - 1e-6..=most + 1e-6).contains(&slack), "{slack}");
    }
    // About a third have one by default (binomial, 300 draws: 100 ± 3 sd is 76..124).
    let n = some
        .pipelines
        .iter()
        .filter(|p| p.deadline.is_some())
        .count();
    assert!((76..=124).contains(&n), "{n} of 300");
    // Impossible deadline parameters are named, every one.
    let bad = Params {
        deadlines: Deadlines {
            share: 1.5,
            slack: (0.5, 2.0),
        },
        ..params(10, 1)
    };
    assert_eq!(
        bad.problems(),
        [
            ParamProblem::DeadlineShare(1.5),
            ParamProblem::DeadlineSlack(0.5, 2.0)
        ]
    );
}

#[test]
fn each_pipeline_is_a_cpu_stage_a_gang_from_the_multi_gpu_jobs_and_a_one_gpu_stage() {
    let source = small_source();
    let generated = pipelines::generate(&source, &params(60, 3)).unwrap();
    let jobs = &generated.trace.jobs;
    assert_eq!(jobs.len(), 180);
    let single: Vec<u64> = source
        .jobs
        .iter()
        .filter(|j| j.gpus == 1)
        .map(|j| j.duration)
        .collect();
    let multi: Vec<(u32, u64)> = source
        .jobs
        .iter()
        .filter(|j| [2, 4, 8].contains(&j.gpus))
        .map(|j| (j.gpus, j.duration))
        .collect();
    let mut last_arrival = 0;
    for (i, p) in generated.pipelines.iter().enumerate() {
        let (pre, train, eval) = (
            &jobs[p.preprocess as usize],
            &jobs[p.train as usize],
            &jobs[p.evaluate as usize],
        );
        assert_eq!(
            (pre.gpus, pre.gpu_milli, train.gpus > 1, eval.gpus),
            (0, 0, true, 1),
            "{i}"
        );
        assert!(pre.cpu_milli > 0 && pre.memory_mib > 0, "{i}");
        assert!(single.contains(&pre.duration) && single.contains(&eval.duration));
        assert!(multi.contains(&(train.gpus, train.duration)), "{i}");
        assert_eq!(generated.dag.after(p.train), &[p.preprocess]);
        assert_eq!(generated.dag.after(p.evaluate), &[p.train]);
        assert_eq!(p.team, format!("team-{}", i % 4 + 1), "round robin");
        assert!(p.arrival >= last_arrival);
        last_arrival = p.arrival;
    }
    let facts = |job| {
        let f = generated.dag.facts(job);
        (f.dependents, f.critical_path_rank)
    };
    let p = &generated.pipelines[0];
    assert_eq!(
        [facts(p.preprocess), facts(p.train), facts(p.evaluate)],
        [(2, 3), (1, 2), (0, 1)]
    );
}

#[test]
fn teams_drawn_at_random_still_come_from_the_list_and_follow_the_seed() {
    let source = small_source();
    let random = Params {
        assignment: TeamAssignment::Random,
        teams: vec!["a".into(), "b".into(), "c".into()],
        ..params(90, 5)
    };
    let teams = |p: &Params| -> Vec<String> {
        pipelines::generate(&source, p)
            .unwrap()
            .pipelines
            .into_iter()
            .map(|p| p.team)
            .collect()
    };
    let drawn = teams(&random);
    assert_eq!(drawn, teams(&random));
    for team in ["a", "b", "c"] {
        assert!(drawn.iter().any(|t| t == team), "{team} never drawn");
    }
    assert_ne!(
        drawn,
        (0..90)
            .map(|i| ["a", "b", "c"][i % 3].to_owned())
            .collect::<Vec<_>>()
    );
}

#[test]
fn impossible_parameters_are_refused_with_every_problem_named() {
    let defaults = params(10, 1);
    let cases = [
        (
            "no pipelines",
            Params {
                pipelines: 0,
                ..defaults.clone()
            },
            vec![ParamProblem::NoPipelines],
        ),
        (
            "zero rate",
            Params {
                rate_per_hour: 0.0,
                ..defaults.clone()
            },
            vec![ParamProblem::Rate(0.0)],
        ),
        (
            "infinite rate",
            Params {
                rate_per_hour: f64::INFINITY,
                ..defaults.clone()
            },
            vec![ParamProblem::Rate(f64::INFINITY)],
        ),
        (
            "no teams",
            Params {
                teams: Vec::new(),
                ..defaults.clone()
            },
            vec![ParamProblem::NoTeams],
        ),
        (
            "a one-GPU gang",
            Params {
                train_gpus: vec![1, 4],
                ..defaults.clone()
            },
            vec![ParamProblem::TrainGpus(1)],
        ),
        (
            "no train sizes",
            Params {
                train_gpus: Vec::new(),
                ..defaults.clone()
            },
            vec![ParamProblem::NoTrainGpus],
        ),
        (
            "a CPU stage without CPU, and no pipelines",
            Params {
                pipelines: 0,
                preprocess: HostRequest {
                    cpu_milli: 0,
                    memory_mib: 1024,
                },
                ..defaults.clone()
            },
            vec![ParamProblem::NoPipelines, ParamProblem::PreprocessCpu],
        ),
    ];
    for (name, params, want) in cases {
        let got = pipelines::generate(&small_source(), &params);
        assert_eq!(got, Err(PipelineError::Params(want.clone())), "{name}");
        assert!(params.problems() == want, "{name}");
    }
}

#[test]
fn a_source_without_the_jobs_to_draw_from_is_refused() {
    let cases = [
        ("no 1-GPU jobs", source(&[(2, 60), (8, 60)]), "1-GPU"),
        (
            "no gang-sized jobs",
            source(&[(1, 60), (16, 60)]),
            "2/4/8-GPU",
        ),
    ];
    for (name, trace, want_what) in cases {
        assert_eq!(
            pipelines::generate(&trace, &params(5, 1)),
            Err(PipelineError::NoTraceJobs {
                what: want_what.into()
            }),
            "{name}"
        );
    }
}

#[test]
fn a_stage_the_cluster_could_never_hold_is_refused_before_generating() {
    let big_cpu = Params {
        preprocess: HostRequest {
            cpu_milli: 1_000_000,
            memory_mib: 1,
        },
        ..params(5, 1)
    };
    let cases = [
        (
            "8-GPU gang on two 2-GPU nodes",
            params(5, 1),
            cluster(2, 2),
            "train",
            8,
        ),
        (
            "a CPU stage larger than any node",
            big_cpu,
            cluster(4, 8),
            "preprocess",
            0,
        ),
    ];
    for (name, params, nodes, want_stage, want_gpus) in cases {
        match params.check_fits(&nodes) {
            Err(PipelineError::Unplaceable { stage, gpus, .. }) => {
                assert_eq!((stage, gpus), (want_stage, want_gpus), "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(params(5, 1).check_fits(&cluster(2, 8)), Ok(()));
}

// ---------------------------------------------------------------------------------------------
// Running pipelines

#[test]
fn stages_run_in_order_and_the_cpu_stage_holds_no_gpu_under_every_policy() {
    // 40 pipelines arriving 12 an hour on 2 × 8 GPUs: they queue, and preemptive policies
    // preempt.
    let generated = pipelines::generate(
        &small_source(),
        &Params {
            rate_per_hour: 12.0,
            ..params(40, 11)
        },
    )
    .unwrap();
    let scenario = scenario_of(&generated, cluster(2, 8));
    for policy in ["fifo", "kueue", "allot", "tiresias"] {
        let (result, decisions, facts) = run(&scenario, policy);
        let outcome: BTreeMap<u32, _> = result.outcomes.iter().map(|o| (o.id, o)).collect();
        assert_eq!(outcome.len(), 120, "{policy}: every stage finishes");
        for p in &generated.pipelines {
            let stages = [p.preprocess, p.train, p.evaluate];
            assert_eq!(outcome[&p.preprocess].submit, p.arrival, "{policy}");
            for pair in stages.windows(2) {
                let (before, after) = (outcome[&pair[0]], outcome[&pair[1]]);
                assert_eq!(
                    after.submit, before.finish,
                    "{policy}: job {} is submitted when job {} finishes",
                    pair[1], pair[0]
                );
                assert!(after.first_start >= before.finish, "{policy}");
            }
            for job in stages {
                assert_eq!(
                    facts[&TaskId(u64::from(job))],
                    generated.dag.facts(job),
                    "{policy}: job {job} carries its DAG facts"
                );
            }
        }
        let cpu_only: Vec<u64> = generated
            .pipelines
            .iter()
            .map(|p| u64::from(p.preprocess))
            .collect();
        let mut granted = 0;
        for d in &decisions {
            if let Decision::Granted {
                task, placement, ..
            } = d
                && cpu_only.contains(&task.0)
            {
                granted += 1;
                assert_eq!(placement.gpu_milli(), 0, "{policy}: {d:?}");
                assert!(placement.shares.iter().all(|s| s.gpus.is_empty()), "{d:?}");
                assert!(placement.shares.iter().all(|s| s.cpu_milli > 0), "{d:?}");
            }
        }
        assert!(granted >= 40, "{policy}: every CPU stage was granted");
        let kpis = result.pipelines.expect("pipeline KPIs");
        assert_eq!(kpis.pipelines, 40, "{policy}");
        assert_eq!(kpis.gpu_hours_held_in_cpu_stages, 0.0, "{policy}");
        assert!(kpis.p50_completion_s <= kpis.p95_completion_s);
        for p in &result.pipeline_outcomes {
            let stages = &generated.pipelines[p.pipeline as usize];
            assert_eq!(p.submit, stages.arrival);
            assert_eq!(p.finish, outcome[&stages.evaluate].finish);
        }
    }
}

#[test]
fn a_small_pipelines_scenario_completes_every_pipeline_under_two_policies() {
    let Some(traces) = real_traces("a_small_pipelines_scenario_completes_every_pipeline") else {
        return;
    };
    let params = Params {
        pipelines: 30,
        seed: 42,
        rate_per_hour: 4.0,
        ..Params::default()
    };
    let scenario = scenario::pipelines(&traces, &params, cluster(4, 8)).unwrap();
    assert_eq!(scenario.trace.jobs.len(), 90);
    for policy in ["fifo", "allot"] {
        let (result, _, _) = run(&scenario, policy);
        let kpis = result.pipelines.expect("pipeline KPIs");
        assert_eq!((result.kpis.jobs, kpis.pipelines), (90, 30), "{policy}");
        assert_eq!(kpis.gpu_hours_held_in_cpu_stages, 0.0, "{policy}");
        assert!(kpis.avg_completion_s > 0.0, "{policy}");
        // Every pipeline with a deadline is counted, met or not, and its three stages too.
        let with = scenario
            .trace
            .jobs
            .iter()
            .filter(|j| j.deadline.is_some())
            .count();
        assert_eq!(kpis.deadlines.with * 3, with, "{policy}");
        assert_eq!(result.kpis.deadlines.with, with, "{policy}");
        assert!(kpis.deadlines.met <= kpis.deadlines.with);
    }
}

#[test]
fn the_philly_scenario_is_refused_with_a_named_problem_when_its_gangs_cannot_fit() {
    let Some(traces) = real_traces("the_philly_scenario_is_refused") else {
        return;
    };
    let got = scenario::pipelines(&traces, &params(10, 1), cluster(1, 4));
    assert!(
        matches!(
            got,
            Err(PipelineError::Unplaceable {
                stage: "train",
                gpus: 8,
                ..
            })
        ),
        "{got:?}"
    );
}
