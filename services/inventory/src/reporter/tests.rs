use std::time::{Duration, Instant};

use super::{Change, Judgement, Liveness, Quiet, liveness_changes};

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

/// A simulated node: its name, when in each second it beats (ms), and its silent spans (ms,
/// end excluded).
type Beating<'a> = (&'a str, u64, &'a [(u64, u64)]);

/// Ticks a reporter every second from 0 to `until` s over nodes beating every second; what it
/// declared, as (tick s, node, "unreachable" or "recovered").
fn declared(nodes: &[Beating<'_>], until: u64) -> Vec<(u64, String, &'static str)> {
    let liveness = Liveness {
        heartbeat_interval: Duration::from_secs(1),
        missed_heartbeats: 3,
    };
    let base = chrono::DateTime::parse_from_rfc3339("2026-11-26T00:00:00Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    let at = |ms: u64| base + chrono::Duration::milliseconds(ms as i64);
    let mut reachable: Vec<bool> = vec![true; nodes.len()];
    let mut quiet = Quiet::default();
    let mut out = Vec::new();
    for tick in 0..=until {
        let now = tick * 1000;
        let heard: Vec<_> = nodes
            .iter()
            .zip(&reachable)
            .map(|((name, offset, silent), r)| {
                let last = (0..=now / 1000)
                    .map(|s| s * 1000 + offset)
                    .filter(|t| *t <= now && !silent.iter().any(|(a, b)| (*a..*b).contains(t)))
                    .max()
                    .unwrap_or(0);
                ((*name).to_owned(), at(last), *r)
            })
            .collect();
        for change in liveness_changes(&heard, liveness, at(now), true, &mut quiet) {
            let (node, what, now_reachable) = match change {
                Change::Unreachable(e) => (e.node, "unreachable", false),
                Change::Recovered(e) => (e.node, "recovered", true),
                Change::Health(_) => unreachable!("liveness only"),
            };
            let i = nodes.iter().position(|(n, _, _)| *n == node).unwrap();
            reachable[i] = now_reachable;
            out.push((tick, node, what));
        }
    }
    out
}

#[test]
fn a_fleet_that_goes_quiet_at_once_is_suspected_of_a_bus_fault_not_declared_unreachable() {
    let owned = |v: &[(u64, &str, &'static str)]| -> Vec<(u64, String, &'static str)> {
        v.iter()
            .map(|(t, n, w)| (*t, (*n).to_owned(), *w))
            .collect()
    };
    // Three nodes beating at staggered offsets; heartbeats every second, three may be missed.
    let election: &[(u64, u64)] = &[(10_000, 16_000)];
    assert_eq!(
        declared(
            &[
                ("a", 100, election),
                ("b", 400, election),
                ("c", 700, election)
            ],
            30
        ),
        owned(&[]),
        "6 s with no heartbeat from anyone (a stream electing a leader): nobody is declared"
    );
    let dead: &[(u64, u64)] = &[(10_000, u64::MAX)];
    assert_eq!(
        declared(&[("a", 100, &[]), ("b", 400, &[]), ("c", 700, dead)], 30),
        owned(&[(13, "c", "unreachable")]),
        "one node silent while the others beat: declared after its three missed heartbeats"
    );
    assert_eq!(
        declared(
            &[("a", 100, election), ("b", 400, election), ("c", 700, dead)],
            30
        ),
        owned(&[(20, "c", "unreachable")]),
        "the one node not heard after the quiet: declared a full deadline after the fleet was \
         heard again"
    );
    assert_eq!(
        declared(&[("a", 100, dead)], 30),
        owned(&[(13, "a", "unreachable")]),
        "a node alone is judged as before"
    );
    let got = declared(&[("a", 100, dead), ("b", 400, dead), ("c", 700, dead)], 60);
    assert_eq!(
        got.iter()
            .map(|(_, n, w)| (n.as_str(), *w))
            .collect::<Vec<_>>(),
        [
            ("a", "unreachable"),
            ("b", "unreachable"),
            ("c", "unreachable")
        ],
        "a fleet quiet for longer than four deadlines is believed: {got:?}"
    );
    // Quiet from 12 s (the newest heartbeat 9.7 s), believed after 12 s more, declared a
    // deadline after that.
    assert!(got.iter().all(|(t, _, _)| *t == 28), "{got:?}");
    let back: &[(u64, u64)] = &[(10_000, 40_000)];
    let got = declared(&[("a", 100, back), ("b", 400, back), ("c", 700, back)], 50);
    assert_eq!(
        got.iter().filter(|(_, _, w)| *w == "recovered").count(),
        3,
        "and each is reachable again when heard: {got:?}"
    );
}
