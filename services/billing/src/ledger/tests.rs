use super::*;
use allot_events::alloc::{Launch, NodeGrant};
use allot_sched::journal::Entry;
use allot_sched::{RunEnd, TaskSpec, Time};

pub(crate) const POOL: &str = "p";
pub(crate) const MINUTE: Time = 60_000;
const HOUR: Time = 3_600_000;

pub(crate) fn prices() -> PriceTable {
    PriceTable::parse(
        r#"
currency: EUR
tables:
  - effectiveFrom: "1970-01-01T00:00:00Z"
    gpuHour: {H100: "2.50"}
    cpuCoreHour: "0.04"
    memoryGiBHour: "0.005"
  - effectiveFrom: "1970-01-02T00:00:00Z"
    gpuHour: {H100: "2.00"}
    cpuCoreHour: "0.04"
    memoryGiBHour: "0.005"
"#,
    )
    .unwrap()
}

/// Journal entries, numbered in order (also for the crate's storage tests).
pub(crate) struct Journal(pub u64);

impl Journal {
    pub(crate) fn entry(
        &mut self,
        input: Input,
        decisions: Vec<Decision>,
        dispatch: Vec<Dispatch>,
    ) -> Applied {
        self.0 += 1;
        Applied {
            pool: POOL.into(),
            source: None,
            entry: Entry {
                seq: self.0,
                input,
                decisions,
                rejected: None,
            },
            launch: None,
            dispatch,
        }
    }

    pub(crate) fn submitted(&mut self, task: u64, team: &str, at: Time) -> Applied {
        self.entry(
            Input::TaskSubmitted {
                task: TaskSpec::new(task, team, 1),
                at,
            },
            vec![],
            vec![],
        )
    }

    /// A grant of `milli` of one H100 plus 2 cores and 4 GiB (`gpu_only`: the GPU alone).
    pub(crate) fn granted(
        &mut self,
        task: u64,
        lease: u64,
        milli: u32,
        gpu_only: bool,
        at: Time,
    ) -> Applied {
        let dispatch = Dispatch {
            task: TaskId(task),
            lease: LeaseId(lease),
            launch: Launch {
                workload: "w-1".into(),
                name: format!("t{task}"),
                team: String::new(),
                run: Default::default(),
            },
            nodes: vec![NodeGrant {
                node: "n1".into(),
                gpu_model: "H100".into(),
                gpus: vec![(0, milli)],
                mig: None,
                cpu_milli: if gpu_only { 0 } else { 2000 },
                memory_mib: if gpu_only { 0 } else { 4096 },
            }],
        };
        let decision = Decision::Granted {
            task: TaskId(task),
            lease: LeaseId(lease),
            placement: Default::default(),
            at,
            reason: "r".into(),
        };
        self.entry(Input::Schedule { at }, vec![decision], vec![dispatch])
    }

    pub(crate) fn released(&mut self, task: u64, lease: u64, at: Time) -> Applied {
        let d = Decision::Released {
            task: TaskId(task),
            lease: LeaseId(lease),
            at,
        };
        self.entry(
            Input::TaskFinished {
                task: TaskId(task),
                at,
                run: Some(RunEnd::Completed {
                    lease: LeaseId(lease),
                }),
            },
            vec![d],
            vec![],
        )
    }

    pub(crate) fn preempted(&mut self, task: u64, lease: u64, at: Time) -> Applied {
        let d = Decision::Preempted {
            task: TaskId(task),
            lease: LeaseId(lease),
            at,
            for_task: None,
            lost: 0,
            reason: "r".into(),
        };
        self.entry(Input::Schedule { at }, vec![d], vec![])
    }

    pub(crate) fn tick(&mut self, at: Time) -> Applied {
        self.entry(Input::Schedule { at }, vec![], vec![])
    }
}

fn run(entries: &[Applied], interval: Time) -> Vec<CostAccrued> {
    let mut ledger = PoolLedger::default();
    entries
        .iter()
        .flat_map(|e| ledger.apply(POOL, e, &prices(), interval))
        .collect()
}

fn total(events: &[CostAccrued]) -> i64 {
    events.iter().map(|e| e.amount).sum()
}

#[test]
fn a_lease_costs_its_seconds_times_its_price_to_the_micro_unit() {
    struct Case {
        name: &'static str,
        milli: u32,
        gpu_only: bool,
        held: Time,
        preempted: bool,
        /// The analytic cost, micro-units.
        want: i64,
    }
    let cases = [
        Case {
            name: "a whole H100 for an hour: 2.50",
            milli: 1000,
            gpu_only: true,
            held: HOUR,
            preempted: false,
            want: 2_500_000,
        },
        Case {
            name: "a quarter of an H100 for 30 minutes: 2.50 × 0.25 × 0.5",
            milli: 250,
            gpu_only: true,
            held: 30 * MINUTE,
            preempted: false,
            want: 312_500,
        },
        Case {
            name: "preempted after 10.5 minutes: billed for what it held until then",
            milli: 1000,
            gpu_only: true,
            held: 10 * MINUTE + 30_000,
            preempted: true,
            want: 437_500,
        },
        Case {
            name: "GPU, 2 cores and 4 GiB for an hour: 2.50 + 2 × 0.04 + 4 × 0.005",
            milli: 1000,
            gpu_only: false,
            held: HOUR,
            preempted: false,
            want: 2_500_000 + 80_000 + 20_000,
        },
        Case {
            name: "an odd fraction over periods: rounded down once, for the whole lease",
            milli: 333,
            gpu_only: true,
            held: 150_000,
            preempted: false,
            // ⌊333 × 150,000 × 2,500,000 ÷ (1000 × 3,600,000)⌋ = ⌊34,687.5⌋
            want: 34_687,
        },
    ];
    for case in cases {
        let mut j = Journal(0);
        let start = 7 * MINUTE + 1_234;
        let entries = vec![
            j.submitted(1, "vision", start),
            j.granted(1, 1, case.milli, case.gpu_only, start),
            j.tick(start + case.held / 2),
            if case.preempted {
                j.preempted(1, 1, start + case.held)
            } else {
                j.released(1, 1, start + case.held)
            },
        ];
        let events = run(&entries, MINUTE);
        assert_eq!(total(&events), case.want, "{}: {events:#?}", case.name);
        assert!(
            events
                .iter()
                .all(|e| e.team == "vision" && e.workload == "w-1")
        );
        // Contiguous periods from the grant to the end, the last one marked.
        assert_eq!(events[0].from_ms, start, "{}", case.name);
        assert!(events.windows(2).all(|w| w[0].to_ms == w[1].from_ms));
        assert_eq!(events.last().unwrap().to_ms, start + case.held);
        assert_eq!(events.iter().filter(|e| e.last).count(), 1);
        assert!(events.last().unwrap().last);
        // Every full period is one interval long, aligned to it.
        for e in &events[1..events.len() - 1] {
            assert_eq!((e.from_ms % MINUTE, e.to_ms - e.from_ms), (0, MINUTE));
        }
    }
}

#[test]
fn periods_are_billed_as_the_journal_clock_passes_them_and_never_twice() {
    let mut j = Journal(0);
    let submitted = j.submitted(1, "vision", 0);
    let granted = j.granted(1, 1, 1000, true, 0);
    let tick = j.tick(2 * MINUTE + 5);
    let mut ledger = PoolLedger::default();
    let p = prices();
    assert!(ledger.apply(POOL, &submitted, &p, MINUTE).is_empty());
    assert!(ledger.apply(POOL, &granted, &p, MINUTE).is_empty());
    let due = ledger.apply(POOL, &tick, &p, MINUTE);
    let periods: Vec<(Time, Time)> = due.iter().map(|e| (e.from_ms, e.to_ms)).collect();
    assert_eq!(periods, [(0, MINUTE), (MINUTE, 2 * MINUTE)]);
    // The same entries again (a redelivery, a replay): nothing new.
    for e in [&submitted, &granted, &tick] {
        assert!(ledger.apply(POOL, e, &p, MINUTE).is_empty());
    }
}

#[test]
fn a_lease_spanning_a_price_change_is_split_at_its_effective_time() {
    let day = 24 * HOUR;
    let mut j = Journal(0);
    let entries = vec![
        j.submitted(1, "vision", day - HOUR),
        j.granted(1, 1, 1000, true, day - HOUR),
        j.released(1, 1, day + HOUR),
    ];
    let events = run(&entries, 4 * HOUR);
    // 1 h at 2.50, then 1 h at 2.00.
    assert_eq!(total(&events), 4_500_000);
    let split: Vec<(Time, i64)> = events
        .iter()
        .map(|e| (e.to_ms, e.lines[0].unit_price))
        .collect();
    assert_eq!(split, [(day, 2_500_000), (day + HOUR, 2_000_000)]);
}

#[test]
fn a_resource_without_a_price_is_flagged_not_hidden() {
    let mut j = Journal(0);
    let mut grant = j.granted(1, 1, 1000, true, 0);
    grant.dispatch[0].nodes[0].gpu_model = "B200".into();
    let entries = vec![grant, j.released(1, 1, HOUR)];
    let events = run(&entries, HOUR);
    let line = &events[0].lines[0];
    assert_eq!(
        (line.resource.as_str(), line.unpriced, line.amount),
        ("gpu:B200", true, 0)
    );
    // Submitted without a team on record: charged to "unattributed", never dropped.
    assert_eq!(events[0].team, UNATTRIBUTED);
}

/// A journal of many leases over a day: grants, releases, preemptions, a withdrawal, ticks
/// across period ends and the price change at midnight.
fn busy_day() -> Vec<Applied> {
    let mut j = Journal(0);
    let mut out = Vec::new();
    for task in 1..=40u64 {
        let at = task * 7 * MINUTE + task * 1_013;
        out.push(j.submitted(task, if task % 3 == 0 { "nlp" } else { "vision" }, at));
        if task % 11 == 0 {
            let d = Decision::Withdrawn {
                task: TaskId(task),
                at: at + 5,
                reason: "r".into(),
            };
            out.push(j.entry(Input::Schedule { at: at + 5 }, vec![d], vec![]));
            continue;
        }
        out.push(j.granted(
            task,
            task,
            250 * (1 + task as u32 % 4),
            task % 2 == 0,
            at + 10,
        ));
        if task % 5 == 0 {
            out.push(j.preempted(task, task, at + 20 * MINUTE));
            out.push(j.granted(task, 100 + task, 1000, false, at + 25 * MINUTE));
        }
        if task > 3 && task % 4 != 1 {
            let ends = task - 3;
            let lease = if ends % 5 == 0 { 100 + ends } else { ends };
            out.push(j.released(ends, lease, at + 30));
        }
        out.push(j.tick(at + 3 * MINUTE + 17));
    }
    out.push(j.tick(30 * HOUR));
    out
}

#[test]
fn the_sweep_skipped_between_period_ends_bills_exactly_what_sweeping_every_entry_bills() {
    let p = prices();
    let mut ledger = PoolLedger::default();
    let mut swept = PoolLedger::default();
    let mut events = Vec::new();
    for e in busy_day() {
        events.extend(ledger.apply(POOL, &e, &p, MINUTE));
        // Restored, it knows no bound: every entry sweeps every open lease.
        let mut fresh =
            PoolLedger::restore(swept.last_entry, swept.teams.clone(), swept.leases.clone());
        let expected = fresh.apply(POOL, &e, &p, MINUTE);
        swept = fresh;
        assert_eq!(events[events.len() - expected.len()..], expected[..]);
        assert_eq!(ledger, swept);
    }
    assert!(events.len() > 1_000, "{} events", events.len());
    assert!(
        events.iter().any(|e| e.last),
        "leases released during the day bill their last periods"
    );
}

#[test]
fn what_each_entry_changed_stored_row_by_row_is_the_whole_ledger() {
    let p = prices();
    let mut ledger = PoolLedger::default();
    let mut teams: BTreeMap<TaskId, String> = BTreeMap::new();
    let mut leases: BTreeMap<LeaseId, OpenLease> = BTreeMap::new();
    for e in busy_day() {
        ledger.apply(POOL, &e, &p, MINUTE);
        let changes = ledger.take_changes();
        for (task, team) in changes.teams {
            match team {
                Some(team) => teams.insert(task, team),
                None => teams.remove(&task),
            };
        }
        for (lease, open) in changes.leases {
            match open {
                Some(open) => leases.insert(lease, open),
                None => leases.remove(&lease),
            };
        }
        assert_eq!(
            PoolLedger::restore(changes.last_entry, teams.clone(), leases.clone()),
            ledger
        );
    }
    // An entry within a period that has not ended changes no lease.
    let mut j = Journal(ledger.last_entry);
    ledger.apply(POOL, &j.submitted(500, "vision", 31 * HOUR), &p, MINUTE);
    ledger.apply(
        POOL,
        &j.granted(500, 500, 1000, false, 31 * HOUR),
        &p,
        MINUTE,
    );
    ledger.take_changes();
    ledger.apply(POOL, &j.tick(31 * HOUR + MINUTE / 2), &p, MINUTE);
    assert!(ledger.take_changes().leases.is_empty());
    ledger.apply(POOL, &j.tick(31 * HOUR + MINUTE), &p, MINUTE);
    assert_eq!(
        ledger.take_changes().leases.len(),
        ledger.leases.len(),
        "every open lease is billed at the period's end"
    );
    // Everything, when asked for.
    ledger.mark_all_changed();
    let all = ledger.take_changes();
    assert_eq!(all.teams.len(), ledger.teams.len());
    assert_eq!(all.leases.len(), ledger.leases.len());
}
