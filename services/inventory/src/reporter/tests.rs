use std::time::{Duration, Instant};

use super::{Judgement, Liveness};

#[test]
fn liveness_is_judged_only_after_a_grace_period_from_the_start_and_from_every_stall() {
    // Heartbeats every second, three may be missed: a grace period of 3 s; the reporter ticks
    // every second, so a gap of more than 2 s between ticks is a stall.
    let liveness = Liveness {
        heartbeat_interval: Duration::from_secs(1),
        missed_heartbeats: 3,
    };
    struct Case {
        name: &'static str,
        /// Ticks, ms after the start.
        ticks: Vec<u64>,
        want: Vec<bool>,
    }
    let cases = [
        Case {
            name: "not before the grace period after the start",
            ticks: vec![0, 1000, 2000, 3000, 4000],
            want: vec![false, false, false, true, true],
        },
        Case {
            name: "ticks a little late are no stall",
            ticks: vec![0, 1000, 2000, 3000, 4900, 6800],
            want: vec![false, false, false, true, true, true],
        },
        Case {
            name: "a pause of 5 s starts the grace period again",
            ticks: vec![0, 1000, 2000, 3000, 8000, 9000, 10_000, 11_000],
            want: vec![false, false, false, true, false, false, false, true],
        },
        Case {
            name: "a stall during the grace period extends it",
            ticks: vec![0, 1000, 4500, 5500, 6500, 7500],
            want: vec![false, false, false, false, false, true],
        },
    ];
    for case in cases {
        let start = Instant::now();
        let mut judgement = Judgement::new(start, liveness, Duration::from_secs(1));
        let got: Vec<bool> = case
            .ticks
            .iter()
            .map(|ms| judgement.at(start + Duration::from_millis(*ms)))
            .collect();
        assert_eq!(got, case.want, "{}", case.name);
    }
}

#[test]
fn a_report_that_takes_long_is_no_stall() {
    let liveness = Liveness {
        heartbeat_interval: Duration::from_secs(1),
        missed_heartbeats: 3,
    };
    let start = Instant::now();
    let at = |ms: u64| start + Duration::from_millis(ms);
    let mut judgement = Judgement::new(start, liveness, Duration::from_secs(1));
    for ms in [0, 1000, 2000, 3000] {
        judgement.at(at(ms));
        judgement.ended(at(ms));
    }
    // The tick at 4 s publishes for 2.5 s; the next tick comes a second after it ended.
    assert!(judgement.at(at(4000)));
    judgement.ended(at(6500));
    assert!(judgement.at(at(7500)), "judging goes on");
}
