//! A preemption search that stops releasing the victims which cannot help its unit decides
//! exactly as one that releases every victim in turn: same victims, same explanations, same
//! placements, whatever the quotas say. So does one that walks node by node, for a unit that
//! fits nowhere ([`super::super::by_node`]), a scheduler that rules out, from what each class
//! holds per node, the searches no victims could end, and one that keeps a sweep's ranking of
//! the running tasks for the next pass at the same time.

use super::*;

/// Every decision of a busy cluster under `policy` — five teams with small quotas, nodes of two
/// models with CPU, many small low-priority tasks (some in gangs of two) and larger urgent ones
/// that preempt them, passes after the tasks and after the gangs at each time — with searches
/// sorting out as `sort_out_after` says; how many did, and how many gang members were
/// preempted.
fn decisions(
    policy: &str,
    seed: u64,
    sort_out_after: (usize, usize),
) -> (Vec<String>, usize, usize) {
    // Walking node by node, most searches would never sort out.
    let (log, s, gang_preempted) = run(policy, seed, sort_out_after, true, true, (false, true));
    (log, s.sorted_out, gang_preempted)
}

/// [`decisions`], with or without the teams' quotas, the searches no victims could end ruled
/// out (`rule_out`), searches walking node by node where they can (`by_node`) and rankings
/// kept between passes at one time (`keep_ranking`); the scheduler at the end, and how many
/// gang members were preempted.
fn run(
    policy: &str,
    seed: u64,
    sort_out_after: (usize, usize),
    quotas: bool,
    rule_out: bool,
    (by_node, keep_ranking): (bool, bool),
) -> (Vec<String>, Scheduler, usize) {
    let mut s = Scheduler::new(crate::policy::by_name(policy).unwrap());
    s.sort_out_after = sort_out_after;
    s.rule_out = rule_out;
    s.by_node = by_node;
    s.keep_ranking = keep_ranking;
    for i in 0..16 {
        let mut spec = NodeSpec::new(format!("n{i}"), 8, if i % 3 == 0 { "A100" } else { "H100" });
        spec.cpu_milli = 64_000;
        s.apply(Input::NodeAdded(spec)).unwrap();
    }
    // Nominal quotas add up to the GPUs: a team within its quota reclaims what others borrow.
    let teams = [("a", 40), ("b", 32), ("c", 24), ("d", 16), ("e", 16)];
    for (team, gpus) in teams.into_iter().filter(|_| quotas) {
        s.apply(quota(team, gpus)).unwrap();
    }
    let mut draw = Draw(seed);
    let mut log = Vec::new();
    let mut running: Vec<TaskId> = Vec::new();
    let mut ganged: Vec<TaskId> = Vec::new();
    let mut gang_preempted = 0;
    let mut id = 0;
    // One pass at `at`: what runs is kept in `running`, each decision logged.
    let schedule = |s: &mut Scheduler,
                    at,
                    running: &mut Vec<TaskId>,
                    ganged: &[TaskId],
                    log: &mut Vec<String>| {
        let mut gang_preempted = 0;
        for d in s.apply(Input::Schedule { at }).unwrap() {
            match &d {
                Decision::Granted { task, .. } => running.push(*task),
                Decision::Preempted { task, .. } => {
                    running.retain(|r| r != task);
                    gang_preempted += usize::from(ganged.contains(task));
                }
                _ => {}
            }
            log.push(serde_json::to_string(&d).unwrap());
        }
        gang_preempted
    };
    for step in 0..120u64 {
        let at = step * 60_000;
        for _ in 0..draw.below(8) {
            id += 1;
            let team = teams[draw.below(teams.len() as u64) as usize].0;
            let mut spec = TaskSpec::new(id, team, [1, 1, 1, 2, 4, 8][draw.below(6) as usize]);
            if spec.gpus == 1 && draw.below(2) == 0 {
                spec.gpu_milli = [250, 500][draw.below(2) as usize];
            }
            spec.priority = i32::from(draw.below(8) == 0);
            spec.cpu_milli = 1_000 * (1 + draw.below(8));
            // From a minute to about ten hours, most of them short.
            let lasts = 60_000 * (1 + draw.below(10) * draw.below(10) * draw.below(6));
            spec.oracle_duration = Some(lasts);
            spec.predicted_duration = Some(lasts);
            s.apply(Input::TaskSubmitted { task: spec, at }).unwrap();
        }
        gang_preempted += schedule(&mut s, at, &mut running, &ganged, &mut log);
        if draw.below(4) == 0 {
            // A gang of two low-priority 2-GPU tasks: preempted whole, as one victim.
            let team = teams[draw.below(teams.len() as u64) as usize].0;
            let lasts = 60_000 * (1 + draw.below(10) * draw.below(10));
            for _ in 0..2 {
                id += 1;
                let mut spec = TaskSpec::new(id, team, 2);
                spec.gang = Some(crate::model::Gang {
                    name: format!("g{step}"),
                    size: 2,
                });
                spec.oracle_duration = Some(lasts);
                spec.predicted_duration = Some(lasts);
                ganged.push(TaskId(id));
                s.apply(Input::TaskSubmitted { task: spec, at }).unwrap();
            }
        }
        if !running.is_empty() && draw.below(2) == 0 {
            let done = running.swap_remove(draw.below(running.len() as u64) as usize);
            s.apply(Input::TaskFinished {
                task: done,
                at,
                run: None,
            })
            .unwrap();
        }
        gang_preempted += schedule(&mut s, at, &mut running, &ganged, &mut log);
    }
    (log, s, gang_preempted)
}

/// Asserts that two runs of one `case` decided alike, naming the first decision that differs.
fn assert_same(case: &str, (one, a): (&str, &[String]), (other, b): (&str, &[String])) {
    let first = a.iter().zip(b).position(|(x, y)| x != y);
    assert_eq!(
        (a.len(), first),
        (b.len(), None),
        "{case}: the first decision that differs, {one}: {:?}; {other}: {:?}",
        first.map(|at| &a[at]),
        first.map(|at| &b[at]),
    );
}

#[test]
fn sorting_victims_out_changes_no_decision() {
    for policy in ["allot", "kueue"] {
        let (mut sorted, mut gangs) = (0, 0);
        for seed in 1..=6 {
            let (all, none, _) = decisions(policy, seed, (usize::MAX, 1));
            assert_eq!(none, 0);
            let (some, times, gang_preempted) = decisions(policy, seed, (1, usize::MAX));
            sorted += times;
            gangs += gang_preempted;
            assert!(
                all.iter().any(|d| d.contains("\"preempted\"")),
                "{policy}, seed {seed}: nothing was preempted"
            );
            assert_eq!(all, some, "{policy}, seed {seed}");
        }
        assert!(sorted > 0, "{policy}: no search sorted its victims out");
        assert!(gangs > 0, "{policy}: no gang was preempted");
    }
}

/// Runs every case — `allot` and `kueue`, with and without quotas, six seeds — with a shortcut
/// off and on (`shortcut(on)`: `run`'s `rule_out` and `(by_node, keep_ranking)`), and asserts
/// that each run preempted something, that both decided alike, and that for each policy and
/// quota setting the shortcut was taken (`taken` counts it) at least once.
fn shortcut_changes_no_decision(
    (off, on): (&str, &str),
    shortcut: impl Fn(bool) -> (bool, (bool, bool)),
    taken: impl Fn(&Scheduler) -> usize,
) {
    let each = (SORT_OUT_AFTER, SORT_OUT_SHARE);
    for policy in ["allot", "kueue"] {
        for quotas in [false, true] {
            let mut times = 0;
            for seed in 1..=6 {
                let case = format!("{policy}, quotas {quotas}, seed {seed}");
                let (rule_out, shortcuts) = shortcut(false);
                let (all, _, _) = run(policy, seed, each, quotas, rule_out, shortcuts);
                let (rule_out, shortcuts) = shortcut(true);
                let (some, s, _) = run(policy, seed, each, quotas, rule_out, shortcuts);
                times += taken(&s);
                assert!(
                    all.iter().any(|d| d.contains("\"preempted\"")),
                    "{case}: nothing was preempted"
                );
                assert_same(&case, (off, &all), (on, &some));
            }
            assert!(times > 0, "{policy}, quotas {quotas}: no {on}");
        }
    }
}

#[test]
fn ruling_out_searches_no_victims_could_end_changes_no_decision() {
    shortcut_changes_no_decision(
        ("without ruling out", "search ruled out"),
        |on| (on, (true, true)),
        |s| s.ruled_out,
    );
}

#[test]
fn walking_node_by_node_changes_no_decision() {
    shortcut_changes_no_decision(
        ("releasing every victim", "search walked node by node"),
        |on| (true, (on, true)),
        |s| s.walked_by_node,
    );
}

#[test]
fn a_task_no_preemption_could_help_gets_its_victims_once_the_task_in_its_way_is_gone() {
    // Each node: one GPU held by urgent work, seven by background work. No preemption can
    // give an urgent 8-GPU task a node, until the urgent 1-GPU task on `a` is gone (withdrawn:
    // a finished run would teach the estimator, and a learned estimate changes which victims
    // a search may take).
    let urgent = |t: TaskBuilder| {
        let mut t = t;
        t.0.priority = 1;
        t
    };
    let log = script(
        "allot",
        vec![node("a"), node("b")],
        vec![
            submit(urgent(task(1)), 0),
            submit(urgent(task(2)), 0),
            submit(task(3).gpus(7), 0),
            submit(task(4).gpus(7), 0),
            pass(0),
            submit(urgent(task(5).gpus(8)), 60_000),
            pass(60_000),
            // Asked again with nothing freed: still beyond help (and remembered so).
            pass(120_000),
            Input::TaskWithdrawn {
                task: TaskId(1),
                reason: "aborted".into(),
                at: 180_000,
                run: None,
            },
            pass(180_000),
        ],
    );
    assert_eq!(
        log,
        [
            "grant 1@a",
            "grant 2@b",
            "grant 3@a",
            "grant 4@b",
            "release 1",
            "preempt 3 for 5",
            "grant 5@a",
        ]
    );
}

#[test]
fn keeping_a_ranking_for_the_next_pass_at_the_same_time_changes_no_decision() {
    shortcut_changes_no_decision(
        ("ranking afresh", "ranking kept"),
        |on| (true, (true, on)),
        |s| s.rankings_kept,
    );
}
