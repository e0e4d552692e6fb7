//! Deadlines under `allot`: work that would miss its deadline waiting its turn goes first
//! (earliest deadline first), preempts only when even that would not be enough, and a deadline
//! that cannot be kept buys nothing.

use super::*;

const MIN: u64 = 60_000;
const HOUR: u64 = 3_600_000;

/// What happened to each task in a run to completion.
#[derive(Debug, Default)]
struct Run {
    /// (task, start, end) of each run that finished.
    finished: Vec<(u64, Time, Time)>,
    /// (task, for task, reason) of each preemption.
    preempted: Vec<(u64, u64, String)>,
    /// Tasks a `Waiting` decision flagged at risk.
    flagged: Vec<u64>,
}

impl Run {
    fn end_of(&self, id: u64) -> Time {
        self.finished
            .iter()
            .find(|(t, ..)| *t == id)
            .map(|(_, _, end)| *end)
            .unwrap_or_else(|| panic!("task {id} never finished: {self:?}"))
    }
}

/// Runs `arrivals` — (when, task, how long it really runs; predicted exactly) — on one 8-GPU
/// node under `policy` until everything has finished, a pass at every arrival and end.
fn run(policy: &str, arrivals: Vec<(Time, TaskSpec, Time)>) -> Run {
    let mut s = scheduler(crate::policy::by_name(policy).unwrap(), vec![node("n1")]);
    let lasts: BTreeMap<u64, Time> = arrivals.iter().map(|(_, t, d)| (t.id.0, *d)).collect();
    let mut arrivals: Vec<(Time, TaskSpec)> = arrivals
        .into_iter()
        .map(|(at, mut t, d)| {
            t.predicted_duration = Some(d);
            (at, t)
        })
        .collect();
    arrivals.reverse();
    let mut running: BTreeMap<u64, Time> = BTreeMap::new();
    let mut out = Run::default();
    for _ in 0..1_000 {
        let next_arrival = arrivals.last().map(|(at, _)| *at);
        let next_end = running.iter().map(|(id, since)| since + lasts[id]).min();
        let Some(now) = next_arrival.into_iter().chain(next_end).min() else {
            return out;
        };
        let mut inputs = Vec::new();
        for (id, since) in running.clone() {
            if since + lasts[&id] == now {
                running.remove(&id);
                out.finished.push((id, since, now));
                inputs.push(finish(id, now));
            }
        }
        while arrivals.last().is_some_and(|(at, _)| *at == now) {
            let (at, t) = arrivals.pop().unwrap();
            inputs.push(Input::TaskSubmitted { task: t, at });
        }
        inputs.push(pass(now));
        for input in inputs {
            for d in s.apply(input).unwrap() {
                match d {
                    Decision::Granted { task, at, .. } => {
                        running.insert(task.0, at);
                    }
                    Decision::Preempted {
                        task,
                        for_task,
                        reason,
                        ..
                    } => {
                        running.remove(&task.0);
                        out.preempted
                            .push((task.0, for_task.map_or(0, |t| t.0), reason));
                    }
                    Decision::Waiting {
                        task,
                        at_risk: true,
                        ..
                    } => out.flagged.push(task.0),
                    _ => {}
                }
            }
        }
    }
    panic!("no end in sight: {out:?}")
}

/// A 20-minute task runs; a minute later three 10-minute tasks and task 2 (40 minutes,
/// deadline `deadline` after the start) arrive, all of the same priority and team, each
/// taking the whole node. (Short enough that the starvation guard, an hour, plays no part.)
fn scenario(deadline: Option<Time>) -> Vec<(Time, TaskSpec, Time)> {
    let mut d = task(2).gpus(8).0;
    d.deadline = deadline;
    let mut arrivals = vec![(0, task(1).gpus(8).0, 20 * MIN), (MIN, d, 40 * MIN)];
    for id in 10..13 {
        arrivals.push((MIN, task(id).gpus(8).0, 10 * MIN));
    }
    arrivals
}

#[test]
fn allot_starts_work_that_would_miss_its_deadline_first_without_preempting_when_it_need_not() {
    // Shortest first, task 2 would start at 50 min and end at 90: past an 80-minute deadline.
    let without = run("allot", scenario(None));
    assert_eq!(without.end_of(2), 90 * MIN);
    let with = run("allot", scenario(Some(80 * MIN)));
    // At risk: it goes first once task 1 ends, and is done at 60 min; task 1 is not
    // preempted, since waiting for it still keeps the deadline.
    assert_eq!(with.end_of(2), 60 * MIN, "{with:?}");
    assert!(with.preempted.is_empty(), "{with:?}");
    assert_eq!(with.flagged, [2], "{with:?}");
    // The short tasks still all run, after it.
    assert_eq!(with.finished.len(), 5);
}

#[test]
fn allot_preempts_for_a_deadline_only_when_waiting_for_running_work_would_miss_it() {
    // Deadline 50 min: even first in line (start at 20 min, end at 60) it would miss, but
    // started now it makes it — urgent: task 1 is preempted for it.
    let urgent = run("allot", scenario(Some(50 * MIN)));
    assert_eq!(urgent.end_of(2), 41 * MIN, "{urgent:?}");
    let [(victim, for_task, why)] = &urgent.preempted[..] else {
        panic!("one preemption expected: {urgent:?}")
    };
    assert_eq!((*victim, *for_task), (1, 2));
    assert!(why.contains("deadline"), "{why}");
    // Nothing preempts the run it started for shorter work: no other preemption above.
}

#[test]
fn a_deadline_that_cannot_be_kept_buys_no_place_in_line() {
    // Deadline 30 min for 40 minutes of work: no order keeps it, so task 2 waits its turn as
    // if it had none (shortest first) and preempts nothing.
    let hopeless = run("allot", scenario(Some(30 * MIN)));
    let none = run("allot", scenario(None));
    assert_eq!(hopeless.end_of(2), none.end_of(2));
    assert!(hopeless.preempted.is_empty() && hopeless.flagged.is_empty());
}

#[test]
fn a_waiting_task_is_flagged_at_risk_once_its_eta_and_run_time_pass_its_deadline() {
    // fifo (no precedence for deadlines) answers the question all the same: task 2 is behind
    // a one-hour task; with a deadline 2.5 h away its ETA (1 h) plus 2 h passes it, with one
    // 4 h away it does not.
    for (deadline, want) in [(150 * MIN, true), (4 * HOUR, false)] {
        let mut s = scheduler(Box::new(Fifo), vec![node("n1")]);
        let mut t2 = task(2).gpus(8).0;
        t2.predicted_duration = Some(2 * HOUR);
        t2.deadline = Some(deadline);
        let mut t1 = task(1).gpus(8).0;
        t1.predicted_duration = Some(HOUR);
        s.apply(Input::TaskSubmitted { task: t1, at: 0 }).unwrap();
        s.apply(pass(0)).unwrap();
        s.apply(Input::TaskSubmitted { task: t2, at: MIN }).unwrap();
        s.apply(pass(MIN)).unwrap();
        let w = s.waiting(TaskId(2), MIN).expect("task 2 waits");
        assert_eq!(w.eta, Some(HOUR));
        assert_eq!(w.at_risk, want, "deadline {deadline}");
    }
}

#[test]
fn a_pass_judges_a_bounded_number_of_deadlines_earliest_first_and_the_next_the_rest() {
    // One node, busy for an hour; 40 waiting 30-minute tasks, each due in 40 minutes plus its
    // number of seconds: all at risk (each waits behind the others), none hopeless.
    let mut s = scheduler(crate::policy::by_name("allot").unwrap(), vec![node("n1")]);
    let mut hold = task(1).gpus(8).0;
    hold.predicted_duration = Some(HOUR);
    s.apply(Input::TaskSubmitted { task: hold, at: 0 }).unwrap();
    s.apply(pass(0)).unwrap();
    let n = DEADLINE_JUDGEMENTS_PER_PASS as u64 + 8;
    for i in 0..n {
        let mut t = task(100 + i).gpus(8).0;
        t.predicted_duration = Some(30 * MIN);
        // Later ids get earlier deadlines: the order judged is by deadline, not arrival.
        t.deadline = Some(100 * MIN + (n - i) * 1_000);
        s.apply(Input::TaskSubmitted { task: t, at: MIN }).unwrap();
    }
    let flagged = |decisions: Vec<Decision>| -> Vec<u64> {
        decisions
            .into_iter()
            .filter_map(|d| match d {
                Decision::Waiting {
                    task,
                    at_risk: true,
                    ..
                } => Some(task.0),
                _ => None,
            })
            .collect()
    };
    let first = flagged(s.apply(pass(MIN)).unwrap());
    assert_eq!(first.len(), DEADLINE_JUDGEMENTS_PER_PASS);
    // The earliest deadlines: the highest ids.
    assert!(first.iter().all(|id| *id >= 100 + 8), "{first:?}");
    let second = flagged(s.apply(pass(MIN + 1)).unwrap());
    assert_eq!(second.len(), 8, "{second:?}");
}
