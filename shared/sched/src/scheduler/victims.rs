//! The running tasks as one sweep's preemption searches see them, indexed by team.
//!
//! Within a pass nothing a preemption search reads of a running task moves: its key, whether it
//! has outlived its usage limit and the work a preemption would lose are all fixed by the pass's
//! `now`. So they are computed once per sweep, when the first search needs them, and kept
//! current as tasks start and stop during the sweep — instead of once per running task per
//! preemptor. Grouping by team lets a search settle a whole team with one question to the
//! policy ([`Policy::may_preempt_team`]): a team that borrows is reclaimed whole, a team that
//! may lose nothing is skipped without looking at its tasks.
//!
//! The victim order is the one the scheduler always used — past its usage limit first, then
//! the policy's [`VictimOrder`], ties to the worst key — as a total order on
//! ([`Victim::rank`]), so neither the index's layout nor the order tasks joined it can change a
//! decision. Searches take victims lazily from a heap: most stop after a few.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap as HashMap;

use crate::model::TaskId;
use crate::policy::{QueueKey, VictimOrder};

/// A running task, as a preemption search weighs it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Runner {
    pub key: QueueKey,
    pub id: TaskId,
    /// Whole GPUs it holds (what the search counts toward the preemptor's need).
    pub gpus: u32,
    /// It has run past its usage limit: it may be taken whatever the policy says.
    pub over: bool,
    /// Run time since its last checkpoint, ms: what preempting it would lose.
    pub lost: u64,
    /// It has a usage limit, so it may come to be taken past it whatever its key.
    pub limited: bool,
}

/// The running tasks by team, each team's worst key first.
#[derive(Debug, Default)]
pub(super) struct Running {
    teams: Vec<Team>,
    /// Where each task is: its team, and its key (its place in the team's list).
    at: HashMap<TaskId, (usize, QueueKey)>,
}

/// One team's running tasks.
#[derive(Debug)]
pub(super) struct Team {
    pub name: String,
    /// Worst key first.
    pub runners: Vec<Runner>,
    /// How many of them have a usage limit.
    pub limited: usize,
}

impl Team {
    fn position(&self, key: QueueKey, id: TaskId) -> usize {
        self.runners.partition_point(|r| (r.key, r.id) > (key, id))
    }

    /// Its tasks whose keys are worse than `floor` (all of them without one), or all of them
    /// while any has a usage limit: the only ones a policy with that floor may take.
    pub fn above(&self, floor: Option<QueueKey>) -> &[Runner] {
        match floor {
            Some(floor) if self.limited == 0 => {
                &self.runners[..self.runners.partition_point(|r| r.key > floor)]
            }
            _ => &self.runners,
        }
    }
}

impl Running {
    /// The index of `all`, sorted once.
    pub fn of<'a>(all: impl IntoIterator<Item = (&'a str, Runner)>) -> Self {
        let mut running = Self::default();
        for (team, runner) in all {
            let t = running.team(team);
            let team = &mut running.teams[t];
            team.limited += usize::from(runner.limited);
            team.runners.push(runner);
            running.at.insert(runner.id, (t, runner.key));
        }
        for team in &mut running.teams {
            team.runners
                .sort_unstable_by_key(|r| Reverse((r.key, r.id)));
        }
        running
    }

    fn team(&mut self, name: &str) -> usize {
        match self.teams.iter().position(|t| t.name == name) {
            Some(t) => t,
            None => {
                self.teams.push(Team {
                    name: name.to_owned(),
                    runners: Vec::new(),
                    limited: 0,
                });
                self.teams.len() - 1
            }
        }
    }

    pub fn insert(&mut self, team: &str, runner: Runner) {
        let t = self.team(team);
        let team = &mut self.teams[t];
        let at = team.position(runner.key, runner.id);
        team.limited += usize::from(runner.limited);
        team.runners.insert(at, runner);
        self.at.insert(runner.id, (t, runner.key));
    }

    pub fn remove(&mut self, id: TaskId) {
        let Some((t, key)) = self.at.remove(&id) else {
            return;
        };
        let team = &mut self.teams[t];
        let at = team.position(key, id);
        let gone = team.runners.remove(at);
        team.limited -= usize::from(gone.limited);
    }

    pub fn get(&self, id: TaskId) -> Option<&Runner> {
        let &(t, key) = self.at.get(&id)?;
        let team = &self.teams[t];
        team.runners.get(team.position(key, id))
    }

    /// The teams with running tasks.
    pub fn teams(&self) -> impl Iterator<Item = &Team> {
        self.teams.iter()
    }
}

/// A task a search may take, ranked: the smallest rank goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Victim {
    rank: (bool, u64, Reverse<(QueueKey, TaskId)>),
}

impl Victim {
    pub fn new(runner: &Runner, order: VictimOrder) -> Self {
        let lost = match order {
            VictimOrder::WorstFirst => 0,
            // Lost work counts per GPU.
            VictimOrder::LeastLostWork => runner.lost.saturating_mul(u64::from(runner.gpus.max(1))),
        };
        Self {
            rank: (!runner.over, lost, Reverse((runner.key, runner.id))),
        }
    }

    pub fn id(&self) -> TaskId {
        self.rank.2.0.1
    }

    pub fn over(&self) -> bool {
        !self.rank.0
    }
}

/// Victims in rank order, taken one at a time.
pub(super) struct Victims(BinaryHeap<Reverse<Victim>>);

impl Victims {
    pub fn new(all: Vec<Victim>) -> Self {
        Self(BinaryHeap::from(
            all.into_iter().map(Reverse).collect::<Vec<_>>(),
        ))
    }
}

impl Iterator for Victims {
    type Item = Victim;

    fn next(&mut self) -> Option<Victim> {
        self.0.pop().map(|Reverse(v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner(id: u64, key: i64, over: bool, lost: u64) -> Runner {
        Runner {
            key: QueueKey(0, key, id),
            id: TaskId(id),
            gpus: 1,
            over,
            lost,
            limited: over,
        }
    }

    #[test]
    fn victims_come_past_their_limit_first_then_by_lost_work_then_worst_key() {
        let all = [
            runner(1, 10, false, 5),
            runner(2, 30, false, 5),
            runner(3, 20, false, 1),
            runner(4, 0, true, 99),
        ];
        let order = |o| {
            let victims = all.iter().map(|r| Victim::new(r, o)).collect();
            Victims::new(victims).map(|v| v.id().0).collect::<Vec<_>>()
        };
        assert_eq!(order(VictimOrder::LeastLostWork), [4, 3, 2, 1]);
        assert_eq!(order(VictimOrder::WorstFirst), [4, 2, 3, 1]);
    }

    #[test]
    fn removing_a_task_keeps_every_other_findable() {
        let mut running = Running::default();
        for id in 0..5 {
            running.insert(if id % 2 == 0 { "a" } else { "b" }, runner(id, 0, false, 0));
        }
        running.remove(TaskId(0));
        running.remove(TaskId(3));
        running.remove(TaskId(3));
        for id in [1, 2, 4] {
            assert_eq!(running.get(TaskId(id)).map(|r| r.id), Some(TaskId(id)));
        }
        assert!(running.get(TaskId(0)).is_none());
        let count: usize = running.teams().map(|t| t.runners.len()).sum();
        assert_eq!(count, 3);
    }

    #[test]
    fn a_floor_leaves_out_better_keys_unless_a_task_has_a_usage_limit() {
        let mut running = Running::of(
            [(1, 10), (2, 30), (3, 20)].map(|(id, key)| ("a", runner(id, key, false, 0))),
        );
        let ids = |running: &Running| {
            let team = running.teams().next().unwrap();
            team.above(Some(QueueKey(0, 15, 0)))
                .iter()
                .map(|r| r.id.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&running), [2, 3]);
        running.insert("a", runner(4, 5, true, 0));
        assert_eq!(ids(&running), [2, 3, 1, 4]);
        running.remove(TaskId(4));
        assert_eq!(ids(&running), [2, 3]);
    }
}
