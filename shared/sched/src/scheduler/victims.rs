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
}

/// The running tasks by team. A team's runners (key, lost work …) are computed only when a
/// search first looks at them, and kept in no order (the search's heap ranks them): a search
/// settles most teams with one question to the policy and never reads their tasks.
#[derive(Debug, Default)]
pub(super) struct Running {
    teams: Vec<Team>,
}

/// One team's running tasks.
#[derive(Debug)]
pub(super) struct Team {
    pub name: String,
    /// Its running tasks, in no order.
    ids: Vec<TaskId>,
    /// How many of them have a usage limit.
    pub limited: usize,
    /// Once computed, in no order.
    runners: Option<Vec<Runner>>,
}

impl Team {
    /// Its runners, in no order, computed by `runner` the first time.
    pub fn runners(&mut self, runner: impl FnMut(TaskId) -> Runner) -> &[Runner] {
        self.runners
            .get_or_insert_with(|| self.ids.iter().copied().map(runner).collect())
    }

    /// Its tasks whose keys are worse than `floor` (all of them without one), or all of them
    /// while any has a usage limit: the only ones a policy with that floor may take. The
    /// search ranks them itself, so they are filtered, not sorted: most searches look at a
    /// team once per sweep.
    pub fn above(
        &mut self,
        floor: Option<QueueKey>,
        runner: impl FnMut(TaskId) -> Runner,
    ) -> impl Iterator<Item = &Runner> {
        let floor = floor.filter(|_| self.limited == 0);
        self.runners(runner)
            .iter()
            .filter(move |r| floor.is_none_or(|floor| r.key > floor))
    }
}

impl Running {
    /// The index of `all` running tasks: (team's number, team, task, whether it has a usage
    /// limit). Tasks come grouped by nothing in particular: a team is found by its number (the
    /// scheduler numbers teams as they first submit), not by comparing names.
    pub fn of<'a>(all: impl IntoIterator<Item = (usize, &'a str, TaskId, bool)>) -> Self {
        let mut running = Self::default();
        let mut slots: Vec<usize> = Vec::new();
        for (number, team, id, limited) in all {
            if slots.len() <= number {
                slots.resize(number + 1, usize::MAX);
            }
            if slots[number] == usize::MAX {
                slots[number] = running.team(team);
            }
            let team = &mut running.teams[slots[number]];
            team.limited += usize::from(limited);
            team.ids.push(id);
        }
        running
    }

    fn team(&mut self, name: &str) -> usize {
        match self.teams.iter().position(|t| t.name == name) {
            Some(t) => t,
            None => {
                self.teams.push(Team {
                    name: name.to_owned(),
                    ids: Vec::new(),
                    limited: 0,
                    runners: None,
                });
                self.teams.len() - 1
            }
        }
    }

    /// Adds task `id` of `team`, which started (`runner` makes its runner if the team's are
    /// computed already).
    pub fn insert(
        &mut self,
        team: &str,
        id: TaskId,
        limited: bool,
        runner: impl FnOnce(TaskId) -> Runner,
    ) {
        let t = self.team(team);
        let team = &mut self.teams[t];
        team.limited += usize::from(limited);
        team.ids.push(id);
        if let Some(runners) = &mut team.runners {
            runners.push(runner(id));
        }
    }

    /// Removes task `id` of `team`, if it is there.
    pub fn remove(&mut self, team: &str, id: TaskId, limited: bool) {
        let Some(team) = self.teams.iter_mut().find(|t| t.name == team) else {
            return;
        };
        let Some(at) = team.ids.iter().position(|i| *i == id) else {
            return;
        };
        team.ids.swap_remove(at);
        team.limited -= usize::from(limited);
        if let Some(runners) = &mut team.runners {
            runners.retain(|r| r.id != id);
        }
    }

    /// Task `id` of `team`, if its team's runners were computed.
    #[cfg(test)]
    pub fn get(&self, team: &str, id: TaskId) -> Option<&Runner> {
        let team = self.teams.iter().find(|t| t.name == team)?;
        team.runners.as_ref()?.iter().find(|r| r.id == id)
    }

    /// The teams with running tasks.
    pub fn teams_mut(&mut self) -> impl Iterator<Item = &mut Team> {
        self.teams.iter_mut()
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

    /// Its key in the pass.
    pub fn key(&self) -> QueueKey {
        self.rank.2.0.0
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

impl Victims {
    /// How many victims are not taken yet.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The victims not taken yet, in no order.
    pub fn remaining(&self) -> impl Iterator<Item = Victim> + '_ {
        self.0.iter().map(|Reverse(v)| *v)
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

    fn made(id: TaskId) -> Runner {
        // The runners the tests insert carry their key in the id: 10 × key + id.
        runner(id.0, (id.0 / 10) as i64, false, 0)
    }

    #[test]
    fn removing_a_task_keeps_every_other_findable() {
        let mut running = Running::default();
        let team = |id: u64| if id.is_multiple_of(2) { "a" } else { "b" };
        for id in 0..5 {
            running.insert(team(id), TaskId(id), false, made);
        }
        for t in running.teams_mut() {
            t.runners(made);
        }
        running.remove("a", TaskId(0), false);
        running.remove("b", TaskId(3), false);
        running.remove("b", TaskId(3), false);
        for id in [1, 2, 4] {
            assert_eq!(
                running.get(team(id), TaskId(id)).map(|r| r.id),
                Some(TaskId(id))
            );
        }
        assert!(running.get("a", TaskId(0)).is_none());
        let count: usize = running.teams_mut().map(|t| t.runners(made).len()).sum();
        assert_eq!(count, 3);
    }

    #[test]
    fn a_floor_leaves_out_better_keys_unless_a_task_has_a_usage_limit() {
        let mut running =
            Running::of([TaskId(11), TaskId(32), TaskId(23)].map(|id| (0, "a", id, false)));
        let ids = |running: &mut Running| {
            let team = running.teams_mut().next().unwrap();
            let mut ids: Vec<u64> = team
                .above(Some(QueueKey(0, 2, 0)), made)
                .map(|r| r.id.0)
                .collect();
            ids.sort_unstable_by(|a, b| b.cmp(a));
            ids
        };
        assert_eq!(ids(&mut running), [32, 23]);
        running.insert("a", TaskId(4), true, |id| runner(id.0, 0, true, 0));
        assert_eq!(ids(&mut running), [32, 23, 11, 4]);
        running.remove("a", TaskId(4), true);
        assert_eq!(ids(&mut running), [32, 23]);
    }

    #[test]
    fn a_team_never_looked_at_is_never_computed() {
        let mut running = Running::of([(0, "a", TaskId(1), false), (1, "b", TaskId(2), true)]);
        let mut made_for = Vec::new();
        for t in running.teams_mut() {
            if t.name == "b" {
                t.runners(|id| {
                    made_for.push(id);
                    made(id)
                });
            }
        }
        assert_eq!(made_for, [TaskId(2)]);
        assert!(running.get("a", TaskId(1)).is_none());
        assert_eq!(running.get("b", TaskId(2)).map(|r| r.id), Some(TaskId(2)));
    }
}
