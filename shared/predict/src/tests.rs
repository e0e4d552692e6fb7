use crate::eval::{self, EvalJob};
use crate::{Basis, Features, Job, Predictor, Recency, TrainParams};

fn job(team: &str, gpus: u32, submit_ms: u64) -> Job {
    Job {
        team: team.into(),
        identity: None,
        gpus,
        gpu_milli: 1000,
        submit_ms,
        declared_ms: None,
    }
}

const HOUR: u64 = 3_600_000;

#[test]
fn a_cold_start_falls_back_declared_then_team_then_global_and_says_which() {
    let mut p = Predictor::new(TrainParams::default());
    let first = p.submitted(1, &job("vision", 2, 0));
    assert_eq!((first.basis, first.point_ms), (Basis::Default, HOUR));
    assert_eq!(first.model_version, None);
    let declared = Job {
        declared_ms: Some(20 * 60_000),
        ..job("vision", 2, 0)
    };
    let p_declared = p.predict(&declared);
    assert_eq!(
        (p_declared.basis, p_declared.point_ms),
        (Basis::Declared, 1_200_000)
    );
    assert!(p_declared.p10_ms < p_declared.point_ms && p_declared.point_ms < p_declared.p90_ms);

    p.finished(1, &job("vision", 2, 0), 30 * 60_000);
    // Its own team and size finished once: that, even over a declared estimate.
    assert_eq!(p.predict(&declared).basis, Basis::TeamGpus);
    assert_eq!(p.predict(&declared).point_ms, 1_800_000);
    // Another size of the team: the declared estimate first, then the team's runs.
    let other_size = job("vision", 8, 0);
    assert_eq!(
        p.predict(&Job {
            declared_ms: Some(60_000),
            ..other_size.clone()
        })
        .basis,
        Basis::Declared
    );
    assert_eq!(p.predict(&other_size).basis, Basis::Team);
    // Another team: everyone's.
    assert_eq!(p.predict(&job("nlp", 1, 0)).basis, Basis::Global);
    assert_eq!(p.predict(&job("nlp", 1, 0)).point_ms, 1_800_000);

    // The same task, run twice: its own runs.
    let same = |i| Job {
        identity: Some("train-eval/train-0".into()),
        ..job("vision", 2, i)
    };
    for i in 2..4 {
        p.submitted(i, &same(i));
        p.finished(i, &same(i), 5 * 60_000);
    }
    let own = p.predict(&same(9));
    assert_eq!((own.basis, own.point_ms), (Basis::Identity, 300_000));
    assert_eq!(own.model_version, None, "nothing trained yet");
}

/// Bursts of four submissions a minute apart, each burst's jobs running the same 5–50 s, a
/// burst every hour: from the second job of a burst on, its finished siblings say exactly how
/// long it will run, and nothing else does.
fn bursts(n_bursts: u64) -> Vec<EvalJob> {
    let mut jobs = Vec::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for b in 0..n_bursts {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let duration = 5_000 + seed % 45_000;
        for k in 0..4 {
            jobs.push(EvalJob {
                job: job("vision", 1, b * HOUR + k * 60_000),
                duration_ms: duration,
            });
        }
    }
    jobs
}

#[test]
fn it_learns_to_trust_a_bursts_finished_siblings_where_they_say_how_long_it_runs() {
    let jobs = bursts(1_000);
    let report = eval::evaluate(&jobs, 600 * HOUR, TrainParams::default());
    let allot = &report.predictors[eval::ALLOT];
    let last10 = &report.predictors[eval::TEAM_GPUS_LAST10];
    assert_eq!(report.test_jobs, 1_600);
    // Three jobs in four are predicted exactly; the first of each burst cannot be.
    assert!(allot.mdale < 1e-6, "{allot:?}");
    assert!(allot.within_2x >= 0.75, "{allot:?}");
    assert!(last10.mdale > 0.2, "the baseline cannot know: {last10:?}");
    // The interval is calibrated: about 80% of runs fall inside it.
    let coverage = allot.coverage_p10_p90.unwrap();
    assert!((0.7..=0.95).contains(&coverage), "{coverage}");

    // What it trusts, asked directly.
    let mut p = Predictor::new(TrainParams::default());
    for (i, j) in jobs.iter().enumerate().take(2_000) {
        p.submitted(i as u64, &j.job);
        p.finished(i as u64, &j.job, j.duration_ms);
    }
    assert_eq!(p.retrain(), Some(1));
    let mut recency = Recency::default();
    for (i, j) in jobs.iter().enumerate().take(2_001) {
        recency.submitted(i as u64, &j.job);
        recency.finished(i as u64, &j.job, j.duration_ms);
    }
    // The second of its burst: one sibling finished, the key's last runs are mostly the
    // previous burst's.
    let second = &jobs[2_001];
    let features = Features::of(&second.job, &recency, second.job.submit_ms);
    let model = p.model().unwrap();
    assert_eq!(model.trusts(&features), "its burst's finished runs");
    assert_eq!(
        model.predict(&features).0.round() as u64,
        second.duration_ms
    );
}

#[test]
fn the_same_history_trains_the_same_model() {
    let jobs = bursts(200);
    let train = || {
        let mut p = Predictor::new(TrainParams::default());
        for (i, j) in jobs.iter().enumerate() {
            p.submitted(i as u64, &j.job);
            p.finished(i as u64, &j.job, j.duration_ms);
        }
        assert!(p.retrain_due());
        p.retrain();
        assert!(!p.retrain_due(), "nothing new since");
        p.model().cloned().unwrap()
    };
    assert_eq!(train(), train());
}

#[test]
fn runs_still_going_count_as_censored_so_a_sweep_of_long_runs_is_not_called_short() {
    let mut recency = Recency::default();
    // Ten submissions an hour ago: three failed within a minute, seven are still running.
    for i in 0..10 {
        recency.submitted(i, &job("nlp", 4, 0));
    }
    for i in 0..3 {
        recency.finished(i, &job("nlp", 4, 0), 40_000);
    }
    let f = Features::of(&job("nlp", 4, HOUR), &recency, HOUR);
    let base = f.base_ms;
    assert_eq!(base, 40_000.0, "the last finished say 40 s");
    let km = (f.base_ms.ln() + f.values[3]).exp();
    assert!(
        km >= 0.99 * HOUR as f64,
        "the censored median knows better: {km}"
    );
}

#[test]
fn the_densest_cluster_lands_on_a_mode_where_the_median_falls_between_them() {
    let mut recency = Recency::default();
    // Ten runs, oldest first: three fast failures, two runs in between, five of two hours.
    let runs = [40, 40, 600, 40, 1_500, 7_200, 7_200, 7_200, 7_200, 7_200];
    for (i, s) in runs.into_iter().enumerate() {
        let j = job("nlp", 4, i as u64 * HOUR);
        recency.submitted(i as u64, &j);
        recency.finished(i as u64, &j, s * 1_000);
    }
    let f = Features::of(&job("nlp", 4, 10 * HOUR), &recency, 10 * HOUR);
    // The last-ten median is the mean of the middle two, 1,500 s and two hours: what no run
    // took.
    assert_eq!(f.base_ms, (1_500_000 + 2 * HOUR) as f64 / 2.0);
    // Every window, recent or not, finds the two-hour cluster.
    for i in [17, 18] {
        let v = (f.base_ms.ln() + f.values[i]).exp();
        assert!((v / (2 * HOUR) as f64 - 1.0).abs() < 1e-9, "{i}: {v}");
    }
}

#[test]
fn the_ensemble_is_the_median_of_three_to_five_statistics_learned_from_the_history() {
    let jobs = bursts(300);
    let mut p = Predictor::new(TrainParams::default());
    for (i, j) in jobs.iter().enumerate() {
        p.submitted(i as u64, &j.job);
        p.finished(i as u64, &j.job, j.duration_ms);
    }
    p.retrain();
    let model = p.model().unwrap();
    let ensemble = model.ensemble();
    assert!((3..=5).contains(&ensemble.len()), "{ensemble:?}");
    // The first of a burst: no sibling finished, nothing is exact; the ensemble speaks.
    let mut recency = Recency::default();
    for (i, j) in jobs.iter().enumerate() {
        recency.submitted(i as u64, &j.job);
        recency.finished(i as u64, &j.job, j.duration_ms);
    }
    let next = job("vision", 1, 300 * HOUR);
    let f = Features::of(&next, &recency, next.submit_ms);
    assert_eq!(model.trusts(&f), "the median of several statistics");
}

/// Two teams whose runs want different statistics, submitting in turn every ten minutes: one
/// drifts (each run a random step from the last, so the last few say most), the other scatters
/// widely around a fixed median (so the more runs a statistic takes in, the better).
fn two_teams(n: u64) -> Vec<EvalJob> {
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut uniform = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut normal = move || {
        let (u, v) = (uniform().max(1e-12), uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    };
    let mut drifting = (20.0 * 60_000.0_f64).ln();
    let mut jobs = Vec::new();
    for i in 0..n {
        let at = i * 10 * 60_000;
        drifting = (drifting + 0.5 * normal()).clamp(11.0, 16.0);
        let scattered = (20.0 * 60_000.0_f64).ln() + 1.5 * normal();
        jobs.push(EvalJob {
            job: job("drift", 1, at),
            duration_ms: drifting.exp() as u64,
        });
        jobs.push(EvalJob {
            job: job("scatter", 4, at + 5 * 60_000),
            duration_ms: scattered.exp() as u64,
        });
    }
    jobs
}

#[test]
fn teams_whose_runs_want_different_statistics_each_get_an_ensemble_of_their_own() {
    let jobs = two_teams(6_000);
    let split = 4_000 * 10 * 60_000;
    let shared_only = TrainParams {
        min_per_team: usize::MAX,
        ..TrainParams::default()
    };
    let own = eval::evaluate(&jobs, split, TrainParams::default());
    let shared = eval::evaluate(&jobs, split, shared_only);
    let (own, shared) = (
        &own.predictors[eval::ALLOT],
        &shared.predictors[eval::ALLOT],
    );
    // Learned on both teams at once, one ensemble serves neither well.
    assert!(
        own.mdale < 0.97 * shared.mdale,
        "{own:?} against {shared:?}"
    );

    let mut p = Predictor::new(TrainParams::default());
    let mut recency = Recency::default();
    for (i, j) in jobs.iter().enumerate().take(8_000) {
        p.submitted(i as u64, &j.job);
        p.finished(i as u64, &j.job, j.duration_ms);
        recency.submitted(i as u64, &j.job);
        recency.finished(i as u64, &j.job, j.duration_ms);
    }
    p.retrain();
    let model = p.model().unwrap();
    let of = |team| {
        Features::of(
            &job(team, 1, 8_000 * 10 * 60_000),
            &recency,
            8_000 * 10 * 60_000,
        )
    };
    let (drift, scatter) = (
        model.ensemble_for(&of("drift")),
        model.ensemble_for(&of("scatter")),
    );
    // The scattered team takes in more runs (the last ten, the censored median) than the
    // drifting one, whose last few say most.
    assert!(model.segment_ensembles() >= 1);
    assert_ne!(drift, scatter);
    assert!(
        scatter.contains(&"last ten of its team and size"),
        "{scatter:?}"
    );
    assert!(
        !drift.contains(&"last ten of its team and size"),
        "{drift:?}"
    );
}

#[test]
fn quantiles_by_selection_are_those_of_the_sorted_values() {
    let sorted_quantile = |values: &[f64], q: f64| {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let at = (v.len() - 1) as f64 * q;
        let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
        v[lo] + (v[hi] - v[lo]) * (at - lo as f64)
    };
    let mut seed = 0x853c_49e6_748f_ea9b_u64;
    for len in 1..60 {
        let values: Vec<f64> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Ties too: a tenth of the draws repeat a value.
                ((seed % 1_000) as f64 / 7.0).floor()
            })
            .collect();
        for q in [0.0, 0.1, 0.25, 0.5, 0.9, 1.0] {
            let got = crate::recency::quantile_of(&mut values.clone(), q);
            assert_eq!(got, sorted_quantile(&values, q), "{len} values, q {q}");
        }
    }
}
