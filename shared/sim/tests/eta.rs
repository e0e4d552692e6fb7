//! ETA accuracy on runs small enough to work out by hand: the start time the scheduler promised
//! a waiting job, recorded from its first `Waiting` decision, against the start it got.

use std::collections::BTreeMap;

use allot_sched::NodeSpec;
use allot_sim::kpi::{Eta, JobOutcome};
use allot_sim::{SimConfig, SimResult, Trace, TraceJob};

const MIN: u64 = 60_000;

/// A job of one team: (submitted, GPUs, run time).
fn job(id: u32, submit: u64, gpus: u32, duration: u64) -> TraceJob {
    TraceJob {
        id,
        name: format!("job-{id}"),
        submit,
        duration,
        gpus,
        gpu_milli: 1000,
        gpu_models: Vec::new(),
        team: "team-a".into(),
        priority: 0,
        cpu_milli: 0,
        memory_mib: 0,
        deadline: None,
    }
}

/// Runs `jobs` under `policy` on one node of `gpus` GPUs.
fn run(policy: &str, gpus: u32, jobs: Vec<TraceJob>) -> SimResult {
    run_with(policy, gpus, jobs, &SimConfig::default())
}

fn run_with(policy: &str, gpus: u32, jobs: Vec<TraceJob>, config: &SimConfig) -> SimResult {
    let trace = Trace {
        source: "hand-built".into(),
        jobs,
        ..Trace::default()
    };
    allot_sim::run(
        &trace,
        &[NodeSpec::new("n1", gpus, "H100")],
        allot_sched::policy::by_name(policy).unwrap(),
        &BTreeMap::from([("team-a".to_owned(), 1)]),
        config,
    )
    .unwrap()
}

fn outcome(result: &SimResult, id: u32) -> &JobOutcome {
    result.outcomes.iter().find(|o| o.id == id).unwrap()
}

#[test]
fn a_job_behind_one_of_known_length_is_promised_that_jobs_end_exactly() {
    // One GPU; job 0 runs 10 min from 0, job 1 arrives at 1 min. The oracle policy knows job
    // 0's length, so job 1 is promised the 10th minute and starts then.
    let r = run(
        "sjf-oracle",
        1,
        vec![job(0, 0, 1, 10 * MIN), job(1, MIN, 1, 5 * MIN)],
    );
    let waiter = outcome(&r, 1);
    assert_eq!(waiter.first_start, 10 * MIN);
    assert_eq!(
        waiter.eta,
        Some(Eta {
            start: 10 * MIN,
            given_at: MIN
        })
    );
    assert_eq!(outcome(&r, 0).eta, None, "job 0 never waited");
    let eta = r.kpis.eta;
    assert_eq!((eta.jobs, eta.missing), (1, 0));
    assert_eq!(eta.median_rel_error, Some(0.0));
    assert_eq!(eta.within_25pct, Some(1.0));
}

#[test]
fn a_wrong_estimate_shows_as_its_error_over_the_wait_and_silence_is_counted_apart() {
    // Two GPUs under fifo, which estimates from finished runs: job 0 holds both for 10 min.
    // - Job 1 (1 min) heads the queue: nothing has finished, so job 0 is expected to run the
    //   1 h default and job 1 is promised minute 60; it starts at 10 after a 9 min wait:
    //   error 50 / 9.
    // - Job 2 (2 min) waits behind job 1 and is never told anything, then starts with it at
    //   minute 10: 8 min without an ETA, counted as missing.
    // - Job 3 (3 min, 2 GPUs) heads the queue once jobs 1 and 2 start at 10; job 0's 10 min
    //   run is now the estimate, so job 3 is promised minute 20, and starts at 15 when jobs 1
    //   and 2 end: error 5 / 12. Its first promise came at minute 10, not at its submission.
    let r = run(
        "fifo",
        2,
        vec![
            job(0, 0, 2, 10 * MIN),
            job(1, MIN, 1, 5 * MIN),
            job(2, 2 * MIN, 1, 5 * MIN),
            job(3, 3 * MIN, 2, 5 * MIN),
        ],
    );
    let starts: Vec<u64> = (0..4).map(|id| outcome(&r, id).first_start / MIN).collect();
    assert_eq!(starts, [0, 10, 10, 15]);
    assert_eq!(
        outcome(&r, 1).eta,
        Some(Eta {
            start: 60 * MIN,
            given_at: MIN
        })
    );
    assert_eq!(outcome(&r, 2).eta, None);
    assert_eq!(
        outcome(&r, 3).eta,
        Some(Eta {
            start: 20 * MIN,
            given_at: 10 * MIN
        })
    );
    let eta = r.kpis.eta;
    assert_eq!((eta.jobs, eta.missing), (2, 1));
    // Nearest-rank median of {5/12, 50/9}: the lower one.
    assert_eq!(eta.median_rel_error, Some(5.0 / 12.0));
    assert_eq!(eta.within_25pct, Some(0.0));
}

#[test]
fn asked_at_submission_every_waiting_job_is_given_an_eta() {
    // The second scenario above, asking the scheduler for each job's ETA as it is submitted:
    // job 2, which no decision told anything, is told minute 60 (it starts beside job 1 once
    // job 0 ends, expected after the 1 h default), and starts at 10: error 50 / 8.
    let jobs = vec![
        job(0, 0, 2, 10 * MIN),
        job(1, MIN, 1, 5 * MIN),
        job(2, 2 * MIN, 1, 5 * MIN),
        job(3, 3 * MIN, 2, 5 * MIN),
    ];
    let config = SimConfig {
        eta_at_submit: true,
        ..SimConfig::default()
    };
    let r = run_with("fifo", 2, jobs.clone(), &config);
    assert_eq!(
        outcome(&r, 2).eta_at_submit,
        Some(Eta {
            start: 60 * MIN,
            given_at: 2 * MIN
        })
    );
    let at_submit = r.kpis.eta_at_submit;
    assert_eq!((at_submit.jobs, at_submit.missing), (3, 0));
    assert_eq!(
        r.kpis.eta,
        run("fifo", 2, jobs).kpis.eta,
        "asking decides nothing"
    );
}
