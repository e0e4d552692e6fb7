use super::*;

const GIB: u64 = 1024;

/// A pool of H100 (80 GiB, 2.90/h), A100-40GB (40 GiB, 1.40/h) and L4 (24 GiB, 0.55/h), and a
/// V100 nobody priced.
fn pool() -> Vec<Offer> {
    vec![
        offer("H100", 80 * GIB, Some(2_900_000)),
        offer("A100-40GB", 40 * GIB, Some(1_400_000)),
        offer("L4", 24 * GIB, Some(550_000)),
        offer("V100", 16 * GIB, None),
    ]
}

fn offer(model: &str, memory_mib: u64, price: Option<i64>) -> Offer {
    Offer {
        model: model.into(),
        memory_mib,
        price_micros_per_hour: price,
    }
}

/// `n` runs on an H100 that peaked at `peak_gib` and averaged `util`% of the GPU.
fn runs(n: usize, peak_gib: u64, util: f64) -> Vec<RunUsage> {
    (0..n)
        .map(|_| RunUsage {
            peak_memory_mib: peak_gib * GIB,
            mean_util_pct: Some(util),
            samples: 20,
            model: Some("H100".into()),
        })
        .collect()
}

fn whole(gpus: u32) -> Request {
    Request {
        gpus,
        gpu_milli: 1000,
        mig_profile: None,
    }
}

struct Case {
    name: &'static str,
    history: Vec<RunUsage>,
    request: Request,
    /// model, milli, GiB asked; or the reason's words.
    want: Result<(&'static str, u32), &'static str>,
}

#[test]
fn the_cheapest_model_and_smallest_share_that_held_the_last_runs() {
    let cases = [
        Case {
            name: "no history: nothing to go on, and it says so",
            history: Vec::new(),
            request: whole(1),
            want: Err("0 finished run(s) measured by telemetry, 3 needed"),
        },
        Case {
            name: "runs telemetry never saw do not count",
            history: {
                let mut h = runs(2, 10, 30.0);
                h.push(RunUsage {
                    samples: 0,
                    ..h[0].clone()
                });
                h
            },
            request: whole(1),
            want: Err("2 finished run(s) measured by telemetry, 3 needed"),
        },
        Case {
            name: "a task that needs the big GPU: 60 GiB + 10% fits only the H100, and it is busy",
            history: runs(3, 60, 95.0),
            request: whole(1),
            want: Ok(("H100", 1000)),
        },
        Case {
            name: "a small, idle task fits an eighth of the cheapest GPU",
            // 2 GiB + 10% of 24 GiB is 94 milli; 8% util + 10% is 89 milli: one eighth.
            history: runs(5, 2, 8.0),
            request: whole(1),
            want: Ok(("L4", 125)),
        },
        Case {
            name: "compute, not memory, sets the share: 45% busy + 10% is 495 milli, half a GPU",
            history: runs(4, 4, 45.0),
            request: whole(1),
            want: Ok(("L4", 500)),
        },
        Case {
            name: "memory too large for an L4 but cheaper as a share of an A100 than of an H100",
            // 30 GiB + 10% = 33 GiB: 825→875 milli of an A100 (1.225/h) beats 413→500 of an H100
            // (1.45/h).
            history: runs(3, 30, 20.0),
            request: whole(1),
            want: Ok(("A100-40GB", 875)),
        },
        Case {
            name: "the largest peak counts, not the typical one",
            history: {
                let mut h = runs(9, 2, 10.0);
                h.push(runs(1, 30, 10.0).remove(0));
                h
            },
            request: whole(1),
            want: Ok(("A100-40GB", 875)),
        },
        Case {
            name: "only the last ten runs count: an old huge peak is forgotten",
            history: {
                let mut h = runs(1, 70, 10.0);
                h.extend(runs(10, 2, 10.0));
                h
            },
            request: whole(1),
            want: Ok(("L4", 125)),
        },
        Case {
            name: "a task of four GPUs keeps four whole GPUs; only the model changes",
            history: runs(3, 12, 20.0),
            request: whole(4),
            want: Ok(("L4", 1000)),
        },
        Case {
            name: "more memory than any priced model holds",
            history: runs(3, 79, 50.0),
            request: whole(1),
            want: Err("no priced GPU model of its pool holds"),
        },
        Case {
            name: "a CPU-only task",
            history: runs(3, 0, 0.0),
            request: whole(0),
            want: Err("it takes no GPU"),
        },
        Case {
            name: "a MIG instance",
            history: runs(3, 5, 10.0),
            request: Request {
                mig_profile: Some("1g.10gb".into()),
                ..whole(1)
            },
            want: Err("MIG instance (1g.10gb)"),
        },
    ];
    for case in cases {
        let got = recommend(&case.history, &case.request, &pool(), Params::default());
        match (&got, &case.want) {
            (Ok(r), Ok((model, milli))) => {
                assert_eq!(
                    (r.model.as_str(), r.gpu_milli),
                    (*model, *milli),
                    "{}",
                    case.name
                );
                assert_eq!(r.gpus, case.request.gpus, "{}", case.name);
            }
            (Err(e), Err(words)) => {
                assert!(e.to_string().contains(words), "{}: {e}", case.name);
            }
            _ => panic!("{}: got {got:?}, want {:?}", case.name, case.want),
        }
    }
}

#[test]
fn the_saving_is_the_requests_price_on_the_model_it_ran_on_minus_the_recommendations() {
    // A whole H100 (2.90/h) asked for; an eighth of an L4 (0.06875/h) held every run.
    let r = recommend(&runs(3, 2, 8.0), &whole(1), &pool(), Params::default()).unwrap();
    assert_eq!(r.gpu_memory_mib, 2 * GIB + (2 * GIB).div_ceil(10));
    assert_eq!(r.micros_per_hour, 68_750);
    assert_eq!(r.requested_micros_per_hour, Some(2_900_000));
    assert_eq!(r.saving_micros_per_hour(), Some(2_831_250));
    assert_eq!(r.runs, 3);

    // Ran on a model without a price: the recommendation stands, the saving is unknown.
    let mut history = runs(3, 2, 8.0);
    for run in &mut history {
        run.model = Some("V100".into());
    }
    let r = recommend(&history, &whole(1), &pool(), Params::default()).unwrap();
    assert_eq!(r.saving_micros_per_hour(), None);
}

#[test]
fn a_share_is_never_more_than_a_whole_gpu_and_always_a_multiple_of_an_eighth() {
    for milli in 1..=1000 {
        let r = round_up(milli);
        assert!(
            r >= milli && r <= 1000 && r.is_multiple_of(FRACTION_STEP_MILLI),
            "{milli} → {r}"
        );
        assert!(r - milli < FRACTION_STEP_MILLI, "{milli} → {r}");
    }
}
