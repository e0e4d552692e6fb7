//! Moving small tasks off a node to start one that fragmentation alone blocks decides exactly
//! as before when the moves that cannot work are passed over untried, only the cheapest
//! nodes' victims are ordered, and a move is tried in two steps (what rules it out cheaply,
//! then — only if it saves more than it costs — every victim placed): same moves, same
//! explanations, same placements.

use super::*;

/// Every decision of a fragmented cluster under `allot` — nodes of 4 and 8 GPUs with little CPU
/// to spare, mostly fractional tasks of two priorities, whole-GPU tasks among them, few ends —
/// with moves that cannot work passed over (`rule_out`) or tried; and the scheduler at the end.
fn run(seed: u64, rule_out: bool) -> (Vec<String>, Scheduler) {
    let mut s = Scheduler::new(crate::policy::by_name("allot").unwrap());
    s.rule_out_moves = rule_out;
    for i in 0..12 {
        let mut spec = NodeSpec::new(format!("n{i}"), if i % 3 == 0 { 4 } else { 8 }, "A100");
        spec.cpu_milli = 32_000;
        spec.memory_mib = 256 * 1024;
        s.apply(Input::NodeAdded(spec)).unwrap();
    }
    let mut draw = Draw(seed);
    let mut log = Vec::new();
    let mut running: Vec<TaskId> = Vec::new();
    let mut id = 0;
    for step in 0..300u64 {
        let at = step * 30_000;
        for _ in 0..draw.below(6) {
            id += 1;
            let whole = draw.below(4) == 0;
            let mut spec = TaskSpec::new(id, "t", if whole { 1 + draw.below(2) as u32 } else { 1 });
            if !whole {
                spec.gpu_milli = [100, 250, 300, 500, 700][draw.below(5) as usize];
            }
            spec.priority = i32::from(draw.below(3) == 0);
            spec.cpu_milli = 1_000 * (1 + draw.below(6));
            spec.memory_mib = 4_096 * (1 + draw.below(8));
            let lasts = 60_000 * (30 + draw.below(10) * draw.below(60));
            spec.oracle_duration = Some(lasts);
            spec.predicted_duration = Some(lasts);
            s.apply(Input::TaskSubmitted { task: spec, at }).unwrap();
        }
        if !running.is_empty() {
            let done = running.swap_remove(draw.below(running.len() as u64) as usize);
            s.apply(Input::TaskFinished {
                task: done,
                at,
                run: None,
            })
            .unwrap();
        }
        for d in s.apply(Input::Schedule { at }).unwrap() {
            match &d {
                Decision::Granted { task, .. } => running.push(*task),
                Decision::Preempted { task, .. } => running.retain(|r| r != task),
                _ => {}
            }
            log.push(serde_json::to_string(&d).unwrap());
        }
    }
    (log, s)
}

#[test]
fn passing_over_moves_that_cannot_work_changes_no_decision() {
    let (mut moved, mut ruled_out) = (0, 0);
    for seed in 1..=6 {
        let (all, _) = run(seed, false);
        let (some, s) = run(seed, true);
        ruled_out += s.moves_ruled_out;
        moved += all
            .iter()
            .filter(|d| d.contains("moved to make room"))
            .count();
        let first = all.iter().zip(&some).position(|(a, b)| a != b);
        assert_eq!(
            (all.len(), first),
            (some.len(), None),
            "seed {seed}: the first decision that differs, trying every move: {:?}; passing \
             over those that cannot work: {:?}",
            first.map(|at| &all[at]),
            first.map(|at| &some[at]),
        );
    }
    assert!(moved > 0, "no task was moved");
    assert!(ruled_out > 0, "no move was passed over");
}
