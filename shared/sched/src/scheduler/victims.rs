//! The running tasks as one sweep's preemption searches see them, indexed by team and ranked.
//!
//! Within a pass nothing a preemption search reads of a running task moves: its key, whether it
//! has outlived its usage limit and the work a preemption would lose are all fixed by the pass's
//! `now`. So they are computed once per sweep, when the first search needs them, and kept
//! current as tasks start and stop during the sweep — instead of once per running task per
//! preemptor. Which tasks run, by team, the scheduler keeps from sweep to sweep (an unranked
//! [`Running`]); a sweep ranks a copy, which the next pass at the same time starts from while
//! only submissions came in between. Grouping by team lets a search settle a whole team with
//! one question to the policy ([`Policy::may_preempt_team`]): a team that borrows is reclaimed
//! whole, a team that may lose nothing is skipped without looking at its tasks.
//!
//! The victim order is the one the scheduler always used — past its usage limit first, then
//! the policy's [`VictimOrder`], ties to the worst key — as a total order ([`Victim`]'s rank),
//! so neither the index's layout nor the order tasks joined it can change a decision. A team's
//! tasks are split by the first part of their keys (a priority class, for the policies that
//! have one), each class sorted in that order when a search first reads it, and a [`Search`]
//! merges the classes lazily, asking the policy about a task only when the search gets to it:
//! most searches stop after a few victims and never look at the thousands behind them, and a
//! policy's key floor ([`Policy::victim_floor`]) skips whole classes unread.
//!
//! [`Policy::may_preempt_team`]: crate::policy::Policy::may_preempt_team
//! [`Policy::victim_floor`]: crate::policy::Policy::victim_floor

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use std::cell::OnceCell;
use std::sync::Arc;

use crate::cluster::NodeShare;
use crate::model::{TaskId, TaskSpec};
use crate::policy::{QueueKey, VictimOrder};

/// A running task, as a preemption search weighs it.
#[derive(Debug, Clone)]
pub(super) struct Runner {
    /// Its team's number.
    pub team: usize,
    pub key: QueueKey,
    pub id: TaskId,
    /// Whole GPUs it holds (what the search counts toward the preemptor's need).
    pub gpus: u32,
    /// It has run past its usage limit: it may be taken whatever the policy says.
    pub over: bool,
    /// Run time since its last checkpoint, ms: what preempting it would lose.
    pub lost: u64,
    /// It is a gang's member (a search takes its group whole).
    pub gang: bool,
    /// Its spec, once a search asked the policy about it ([`Runner::spec`]).
    spec: OnceCell<Arc<TaskSpec>>,
    /// What it holds, one share per node, once a search weighed where it runs
    /// ([`Runner::held`]; a gang's member's group is weighed whole instead).
    held: OnceCell<Box<[NodeShare]>>,
}

impl Runner {
    /// A runner of these terms; its spec and shares are looked up when first asked for.
    pub fn new(
        team: usize,
        key: QueueKey,
        id: TaskId,
        gpus: u32,
        over: bool,
        lost: u64,
        gang: bool,
    ) -> Self {
        Self {
            team,
            key,
            id,
            gpus,
            over,
            lost,
            gang,
            spec: OnceCell::new(),
            held: OnceCell::new(),
        }
    }

    /// Its spec, `lookup` the first time it is asked for. The searches of a sweep ask about
    /// the same victims again and again (those of one preemptor are the next one's): a
    /// lookup in the task table each time, a cache miss, was about a sixth of the placement
    /// bench's pass; a copy made for every running task as its runner is made costs a replay
    /// more than it saves.
    pub fn spec(&self, lookup: impl FnOnce() -> Arc<TaskSpec>) -> &TaskSpec {
        self.spec.get_or_init(lookup)
    }

    /// What it holds, `lookup` the first time it is asked for (as [`Runner::spec`]).
    pub fn held(&self, lookup: impl FnOnce() -> Box<[NodeShare]>) -> &[NodeShare] {
        self.held.get_or_init(lookup)
    }

    /// What it holds, if [`Runner::held`] looked it up already.
    pub fn held_known(&self) -> Option<&[NodeShare]> {
        self.held.get().map(|held| &**held)
    }
}

/// The running tasks by team.
#[derive(Debug, Clone)]
pub(super) struct Running {
    order: VictimOrder,
    teams: Vec<Team>,
    /// Where a team is in `teams`, by the number the scheduler gave it (`usize::MAX`: none).
    slots: Vec<usize>,
}

/// One team's running tasks.
#[derive(Debug, Clone)]
pub(super) struct Team {
    pub name: String,
    /// Its running tasks whose class the policy does not name without a key, in no order.
    ids: Vec<TaskId>,
    /// Its running tasks whose class the policy names ([`Policy::class`]), by class in class
    /// order, each class in no order: kept split as tasks start and stop, so a sweep neither
    /// looks a task up nor splits the team to rank it.
    ///
    /// [`Policy::class`]: crate::policy::Policy::class
    by_class: Vec<(i64, Vec<TaskId>)>,
    /// How many of them have a usage limit.
    pub limited: usize,
    /// Computed the first time a search looks at the team (most searches settle most teams
    /// with one question and never read their tasks): its runners by the first part of their
    /// keys (a priority class), in key order, each class ranked on its own. A search with a
    /// key floor skips the classes wholly below it without reading them.
    ranked: Option<Vec<(i64, Ranked)>>,
}

impl Team {
    fn add(&mut self, id: TaskId, class: Option<i64>) {
        let Some(class) = class else {
            self.ids.push(id);
            return;
        };
        match self.by_class.binary_search_by_key(&class, |(c, _)| *c) {
            Ok(at) => self.by_class[at].1.push(id),
            Err(at) => self.by_class.insert(at, (class, vec![id])),
        }
    }

    /// Takes task `id` out; whether it was there, and if so the class the policy named for it
    /// (`None`: none).
    fn take(&mut self, id: TaskId) -> Option<Option<i64>> {
        let lists = std::iter::once((None, &mut self.ids))
            .chain(self.by_class.iter_mut().map(|(c, l)| (Some(*c), l)));
        for (class, list) in lists {
            if let Some(at) = list.iter().position(|i| *i == id) {
                list.swap_remove(at);
                return Some(class);
            }
        }
        None
    }

    fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.by_class.iter().all(|(_, ids)| ids.is_empty())
    }

    /// The runners of its running tasks computed so far.
    #[cfg(any(test, debug_assertions))]
    fn runners(&self) -> impl Iterator<Item = &Runner> {
        self.ranked
            .iter()
            .flatten()
            .flat_map(|(_, ranked)| ranked.from(0))
            .map(|(_, r)| r)
    }
}

/// A class of a team's runners in victim order — sorted only as far as searches have read it
/// (most read a few of thousands; a search with a key floor skips whole classes: openb's
/// latency-sensitive pods read only the best-effort ones) — and the GPUs they hold.
#[derive(Debug, Default, Clone)]
struct Ranked {
    /// The class's tasks whose runners are not made yet: while no search has read a class
    /// whose tasks' class the policy names without a key ([`Policy::class`]), its tasks are
    /// only counted in (openb's latency-sensitive pods, which no search reads, are never keyed).
    ///
    /// [`Policy::class`]: crate::policy::Policy::class
    unread: Option<Vec<TaskId>>,
    /// Every runner the sweep made, by number (those that stopped are left in place).
    runners: Vec<Runner>,
    /// The ranks and numbers of those running: the first `sorted` in victim order, and
    /// before every other; the rest in no order.
    list: Vec<(Victim, u32)>,
    sorted: usize,
    gpus: u64,
}

impl Ranked {
    fn with_capacity(n: usize) -> Self {
        Self {
            runners: Vec::with_capacity(n),
            list: Vec::with_capacity(n),
            ..Self::default()
        }
    }

    fn push(&mut self, victim: Victim, r: Runner) {
        self.gpus += victim.gpus();
        self.list.push((victim, self.runners.len() as u32));
        self.runners.push(r);
    }

    /// The runner at `at` in victim order, if there are that many, with its number.
    fn get(&mut self, at: usize) -> Option<(Victim, u32, &Runner)> {
        if at >= self.sorted && at < self.list.len() {
            // Sort the next stretch (at least doubling what is sorted): a search that reads
            // a few costs one pass over the class, one that reads all a sort.
            let upto = (at + 1)
                .max(2 * self.sorted)
                .max(SORTED_FIRST)
                .min(self.list.len());
            let rest = &mut self.list[self.sorted..];
            let n = upto - self.sorted;
            if n < rest.len() {
                rest.select_nth_unstable_by_key(n - 1, |(v, _)| *v);
            }
            rest[..n].sort_unstable_by_key(|(v, _)| *v);
            self.sorted = upto;
        }
        let (victim, r) = *self.list.get(at)?;
        Some((victim, r, &self.runners[r as usize]))
    }

    /// A class whose runners are made when a search first reads it.
    fn unread(ids: &[TaskId]) -> Self {
        Self {
            unread: Some(ids.to_vec()),
            ..Self::default()
        }
    }

    /// Adds task `id` to an unread class.
    fn defer(&mut self, id: TaskId) {
        self.unread
            .as_mut()
            .expect("only an unread class defers")
            .push(id);
    }

    /// Makes the runners of an unread class (`runner`), ranked in `order`.
    fn read(&mut self, order: VictimOrder, runner: &mut impl FnMut(TaskId) -> Runner) {
        let Some(ids) = self.unread.take() else {
            return;
        };
        self.runners.reserve(ids.len());
        self.list.reserve(ids.len());
        for id in ids {
            let r = runner(id);
            self.push(Victim::new(&r, order), r);
        }
    }

    fn insert(&mut self, victim: Victim, r: Runner) {
        if let Some(ids) = &mut self.unread {
            ids.push(r.id);
            return;
        }
        let n = self.runners.len() as u32;
        self.runners.push(r);
        self.gpus += victim.gpus();
        if self.sorted > 0 && victim < self.list[self.sorted - 1].0 {
            let at = self.list[..self.sorted].partition_point(|(v, _)| *v < victim);
            self.list.insert(at, (victim, n));
            self.sorted += 1;
        } else {
            self.list.push((victim, n));
        }
    }

    /// Removes task `id`; whether it was there.
    fn remove(&mut self, id: TaskId) -> bool {
        if let Some(ids) = &mut self.unread {
            let Some(at) = ids.iter().position(|i| *i == id) else {
                return false;
            };
            ids.swap_remove(at);
            return true;
        }
        let Some(at) = self.list.iter().position(|(v, _)| v.id() == id) else {
            return false;
        };
        // Only the sorted stretch keeps its order: the runners behind it there move up one, and
        // the class's last runner fills the gap left at the stretch's end. (A class holds
        // thousands and a taken victim is near its front: shifting the whole class cost more
        // than the search that took it.)
        if at < self.sorted {
            self.list[at..self.sorted].rotate_left(1);
            self.sorted -= 1;
        }
        let (victim, _) = self.list.swap_remove(self.sorted.max(at));
        self.gpus -= victim.gpus();
        true
    }

    fn len(&self) -> usize {
        self.list.len()
    }

    /// The runners from `at` (no further than read) on in victim order, in no order.
    fn from(&self, at: usize) -> impl Iterator<Item = (Victim, &Runner)> + '_ {
        self.list[at..]
            .iter()
            .map(|(v, r)| (*v, &self.runners[*r as usize]))
    }
}

/// How many runners of a class the first read sorts.
const SORTED_FIRST: usize = 32;

/// Which of a team's running tasks a search may take.
#[derive(Debug, Clone, Copy)]
pub(super) struct Terms {
    /// `Some(true)`: every one; `Some(false)`: only those past their usage limits; `None`: ask
    /// the policy task by task.
    pub whole: Option<bool>,
    /// Task by task, only keys worse than this can qualify (those past their limits aside).
    pub floor: Option<QueueKey>,
}

impl Terms {
    /// Whether `r` qualifies; `ask` is the policy's answer for it.
    fn allow(&self, r: &Runner, ask: &mut impl FnMut(&Runner) -> bool) -> bool {
        r.over
            || (self.floor.is_none_or(|floor| r.key > floor)
                && self.whole.unwrap_or_else(|| ask(r)))
    }
}

impl Running {
    /// The index of `all` running tasks: (team's number, team, task, (whether it has a usage
    /// limit, its class if the policy names one)), to be taken in `order`.
    pub fn of<'a>(
        order: VictimOrder,
        all: impl IntoIterator<Item = (usize, &'a str, TaskId, (bool, Option<i64>))>,
    ) -> Self {
        let mut running = Self {
            order,
            teams: Vec::new(),
            slots: Vec::new(),
        };
        for (number, team, id, terms) in all {
            running.enter(number, team, id, terms);
        }
        running
    }

    /// Adds task `id` of team `number` (named `name`), which started (and has a usage limit,
    /// and a class, as `limited` and `class` say), to an index whose teams are not ranked yet
    /// (as kept between sweeps).
    pub fn enter(
        &mut self,
        number: usize,
        name: &str,
        id: TaskId,
        (limited, class): (bool, Option<i64>),
    ) {
        let team = self.team(number, name);
        debug_assert!(team.ranked.is_none(), "a ranked team is kept by `insert`");
        team.limited += usize::from(limited);
        team.add(id, class);
    }

    /// The teams with running tasks.
    pub fn teams(&self) -> impl Iterator<Item = &Team> {
        self.teams.iter().filter(|team| !team.is_empty())
    }

    /// Whether `other` holds the same tasks by team (in any order): checked in debug builds.
    pub fn same_tasks(&self, other: &Running) -> bool {
        type Ids = Vec<(TaskId, Option<i64>)>;
        fn by_number(r: &Running) -> Vec<(usize, &str, usize, Ids)> {
            let mut teams: Vec<(usize, &str, usize, Ids)> = r
                .slots
                .iter()
                .enumerate()
                .filter(|(_, slot)| **slot != usize::MAX)
                .map(|(number, slot)| {
                    let team = &r.teams[*slot];
                    let mut ids: Ids = team.ids.iter().map(|id| (*id, None)).collect();
                    for (class, of) in &team.by_class {
                        ids.extend(of.iter().map(|id| (*id, Some(*class))));
                    }
                    ids.sort_unstable();
                    (number, team.name.as_str(), team.limited, ids)
                })
                .filter(|(_, _, _, ids)| !ids.is_empty())
                .collect();
            teams.sort_unstable();
            teams
        }
        by_number(self) == by_number(other)
    }

    fn team(&mut self, number: usize, name: &str) -> &mut Team {
        if self.slots.len() <= number {
            self.slots.resize(number + 1, usize::MAX);
        }
        if self.slots[number] == usize::MAX {
            self.slots[number] = self.teams.len();
            self.teams.push(Team {
                name: name.to_owned(),
                ids: Vec::new(),
                by_class: Vec::new(),
                limited: 0,
                ranked: None,
            });
        }
        &mut self.teams[self.slots[number]]
    }

    /// Adds task `id` of team `number` (named `name`), which started (`runner` makes its
    /// runner if the team's are computed already, unless its `class`, if named, is unread).
    pub fn insert(
        &mut self,
        number: usize,
        name: &str,
        id: TaskId,
        (limited, class): (bool, Option<i64>),
        runner: impl FnOnce(TaskId) -> Runner,
    ) {
        let order = self.order;
        let team = self.team(number, name);
        team.limited += usize::from(limited);
        team.add(id, class);
        if let Some(classes) = &mut team.ranked {
            if let Some(class) = class
                && let Ok(at) = classes.binary_search_by_key(&class, |(c, _)| *c)
                && classes[at].1.unread.is_some()
            {
                classes[at].1.defer(id);
                return;
            }
            let r = runner(id);
            let class = r.key.0;
            let at = match classes.binary_search_by_key(&class, |(c, _)| *c) {
                Ok(at) => at,
                Err(at) => {
                    classes.insert(at, (class, Ranked::default()));
                    at
                }
            };
            classes[at].1.insert(Victim::new(&r, order), r);
        }
    }

    /// Removes task `id` of team `number`, if it is there.
    pub fn remove(&mut self, number: usize, id: TaskId, limited: bool) {
        let Some(&slot) = self.slots.get(number).filter(|s| **s != usize::MAX) else {
            return;
        };
        let team = &mut self.teams[slot];
        let Some(class) = team.take(id) else {
            return;
        };
        team.limited -= usize::from(limited);
        if let Some(classes) = &mut team.ranked {
            // A task whose class the policy named is ranked in that class (the first part of
            // every key it has): only that one is read. (Reading the others first, each whole,
            // cost more than the search that took the task.)
            let named = class
                .and_then(|class| classes.binary_search_by_key(&class, |(c, _)| *c).ok())
                .is_some_and(|at| classes[at].1.remove(id));
            let removed = named || classes.iter_mut().any(|(_, r)| r.remove(id));
            debug_assert!(removed, "a running task of a ranked team is ranked");
        }
    }

    /// Every running task's runner computed so far (checked in debug builds against fresh
    /// ones).
    #[cfg(any(test, debug_assertions))]
    pub fn runners(&self) -> impl Iterator<Item = &Runner> {
        self.teams.iter().flat_map(Team::runners)
    }

    /// Task `id` of team `number`, if its team's runners were computed.
    #[cfg(test)]
    pub fn get(&self, number: usize, id: TaskId) -> Option<&Runner> {
        self.teams[*self.slots.get(number)?]
            .runners()
            .find(|r| r.id == id)
    }

    /// A search among the teams `terms` names terms for (`None`: the team is left out), and
    /// at most how many whole GPUs its victims hold; `runner` computes a team's runners the
    /// first time one is looked at — only for the classes the search reads, where a task's
    /// class was named as it started (the first part of every key it has).
    pub fn search(
        &mut self,
        mut terms: impl FnMut(&Team) -> Option<Terms>,
        mut runner: impl FnMut(TaskId) -> Runner,
    ) -> (Search, u64) {
        let mut parts = Vec::new();
        let mut gpus = 0;
        for (at, team) in self.teams.iter_mut().enumerate() {
            let Some(terms) = terms(team) else {
                continue;
            };
            let order = self.order;
            let classes = team.ranked.get_or_insert_with(|| {
                let mut classes: Vec<(i64, Ranked)> = team
                    .by_class
                    .iter()
                    .map(|(class, ids)| (*class, Ranked::unread(ids)))
                    .collect();
                for (i, id) in team.ids.iter().enumerate() {
                    let r = runner(*id);
                    let at = match classes.iter().position(|(c, _)| *c == r.key.0) {
                        Some(at) => at,
                        None => {
                            // Room for every task left (most teams have one class).
                            classes.push((r.key.0, Ranked::with_capacity(team.ids.len() - i)));
                            classes.len() - 1
                        }
                    };
                    classes[at].1.push(Victim::new(&r, order), r);
                }
                classes.sort_unstable_by_key(|(c, _)| *c);
                classes
            });
            for (class, (first, ranked)) in classes.iter_mut().enumerate() {
                if terms.floor.is_some_and(|floor| below(*first, floor)) {
                    continue;
                }
                ranked.read(order, &mut runner);
                debug_assert!(
                    ranked.runners.iter().all(|r| r.key.0 == *first),
                    "a task's class is the first part of its key"
                );
                gpus += ranked.gpus;
                parts.push(Part {
                    team: at,
                    class,
                    terms,
                    next: 0,
                    len: ranked.len(),
                });
            }
        }
        let search = Search {
            parts,
            heads: BinaryHeap::new(),
            started: false,
            last: None,
        };
        (search, gpus)
    }

    fn ranked(&mut self, part: &Part) -> &mut Ranked {
        let classes = self.teams[part.team].ranked.as_mut();
        &mut classes.expect("a search's teams are ranked")[part.class].1
    }

    fn ranked_of(&self, part: &Part) -> &Ranked {
        let classes = self.teams[part.team].ranked.as_ref();
        &classes.expect("a search's teams are ranked")[part.class].1
    }
}

/// Whether every key of `class` is at most `floor`: the class is below the floor, or is the
/// floor's own class where the floor is that class's last key. A search with that floor finds
/// no victim there.
pub(super) fn below(class: i64, floor: QueueKey) -> bool {
    class < floor.0 || (class == floor.0 && (floor.1, floor.2) == (i64::MAX, u64::MAX))
}

/// A task a search may take, ranked: the smallest rank goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Victim {
    rank: (bool, u64, Reverse<(QueueKey, TaskId)>),
    /// Whole GPUs it holds (after the rank, which alone orders: it holds the task's id).
    gpus: u32,
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
            gpus: runner.gpus,
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

    pub fn gpus(&self) -> u64 {
        u64::from(self.gpus)
    }
}

/// One search's victims in rank order, merged from the teams' ranked lists as the search takes
/// them. Each call is handed the [`Running`] it was made from (unchanged since) and the
/// policy's answer for a task (`ask`), which must not change during the search.
#[derive(Clone)]
pub(super) struct Search {
    parts: Vec<Part>,
    /// Each part's next victim, smallest rank first, with its part and runner's number.
    heads: BinaryHeap<Reverse<(Victim, usize, u32)>>,
    started: bool,
    /// The part and runner's number of the victim taken last.
    last: Option<(usize, u32)>,
}

/// A team's class taking part in a search.
#[derive(Clone)]
struct Part {
    team: usize,
    class: usize,
    terms: Terms,
    /// Where in the team's list to look next (its head, if any, is before).
    next: usize,
    /// The list's length.
    len: usize,
}

impl Search {
    /// The next victim in rank order.
    pub fn next(
        &mut self,
        running: &mut Running,
        mut ask: impl FnMut(&Runner) -> bool,
    ) -> Option<Victim> {
        if !self.started {
            self.started = true;
            for part in 0..self.parts.len() {
                self.advance(part, running, &mut ask);
            }
        }
        let Reverse((victim, part, r)) = self.heads.pop()?;
        self.last = Some((part, r));
        self.advance(part, running, &mut ask);
        Some(victim)
    }

    /// The runner of the victim [`Self::next`] took last.
    pub fn taken<'r>(&self, running: &'r Running) -> &'r Runner {
        let (part, r) = self.last.expect("a victim was taken");
        &running.ranked_of(&self.parts[part]).runners[r as usize]
    }

    /// Moves `part`'s head to its next qualifying task, if any.
    fn advance(&mut self, at: usize, running: &mut Running, ask: &mut impl FnMut(&Runner) -> bool) {
        let part = &mut self.parts[at];
        let ranked = running.ranked(part);
        while let Some((victim, n, r)) = ranked.get(part.next) {
            part.next += 1;
            if part.terms.allow(r, ask) {
                self.heads.push(Reverse((victim, at, n)));
                return;
            }
        }
    }

    /// At most how many victims are left (the tasks not looked at yet are counted whether
    /// they qualify or not): what looking at all of them would cost.
    pub fn left(&self) -> usize {
        self.heads.len() + self.parts.iter().map(|p| p.len - p.next).sum::<usize>()
    }

    /// The victims not taken yet, with their runners, in no order.
    pub fn remaining<'a>(
        &'a self,
        running: &'a Running,
        mut ask: impl FnMut(&Runner) -> bool + 'a,
    ) -> impl Iterator<Item = (Victim, &'a Runner)> + 'a {
        let heads = self.heads.iter().map(|Reverse((v, part, r))| {
            (
                *v,
                &running.ranked_of(&self.parts[*part]).runners[*r as usize],
            )
        });
        let rest = self.parts.iter().flat_map(|p| {
            running.teams[p.team]
                .ranked
                .iter()
                .flat_map(|classes| classes[p.class].1.from(p.next))
                .map(move |(v, r)| (p.terms, v, r))
        });
        heads
            .chain(rest.filter_map(move |(terms, v, r)| terms.allow(r, &mut ask).then_some((v, r))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner(id: u64, key: i64, over: bool, lost: u64) -> Runner {
        Runner::new(0, QueueKey(0, key, id), TaskId(id), 1, over, lost, false)
    }

    fn made(id: TaskId) -> Runner {
        // The runners the tests make carry their key in the id: 10 × key + id.
        runner(id.0, (id.0 / 10) as i64, false, 0)
    }

    const ALL: Terms = Terms {
        whole: Some(true),
        floor: None,
    };

    /// Every victim of a search with `terms` for each team, in the order taken.
    fn taken(running: &mut Running, terms: Terms, make: impl FnMut(TaskId) -> Runner) -> Vec<u64> {
        let (mut search, _) = running.search(|_| Some(terms), make);
        std::iter::from_fn(|| search.next(running, |_| true))
            .map(|v| v.id().0)
            .collect()
    }

    #[test]
    fn victims_come_past_their_limit_first_then_by_lost_work_then_worst_key() {
        let all = [
            runner(1, 10, false, 5),
            runner(2, 30, false, 5),
            runner(3, 20, false, 1),
            runner(4, 0, true, 99),
        ];
        let make = |id: TaskId| all[id.0 as usize - 1].clone();
        // Two teams: the search merges their lists into one order.
        let order = |o| {
            let mut running = Running::of(
                o,
                all.iter().map(|r| {
                    (
                        (r.id.0 % 2) as usize,
                        ["a", "b"][(r.id.0 % 2) as usize],
                        r.id,
                        (r.over, None),
                    )
                }),
            );
            taken(&mut running, ALL, make)
        };
        assert_eq!(order(VictimOrder::LeastLostWork), [4, 3, 2, 1]);
        assert_eq!(order(VictimOrder::WorstFirst), [4, 2, 3, 1]);
    }

    #[test]
    fn teams_are_merged_in_one_order_and_asked_about_only_as_far_as_taken() {
        // 60 tasks in three teams, keys in no order by id.
        let key = |id: u64| ((id * 37) % 61) as i64;
        let make = |id: TaskId| runner(id.0, key(id.0), false, 0);
        let ids: Vec<u64> = (1..=60).collect();
        let mut running = Running::of(
            VictimOrder::WorstFirst,
            ids.iter().map(|id| {
                (
                    (*id % 3) as usize,
                    ["a", "b", "c"][(*id % 3) as usize],
                    TaskId(*id),
                    (false, None),
                )
            }),
        );
        let terms = Terms {
            whole: None,
            floor: None,
        };
        let (mut search, gpus) = running.search(|_| Some(terms), make);
        assert_eq!(gpus, 60);
        // The policy allows only even ids; take five.
        let mut asked = 0;
        let mut first = Vec::new();
        for _ in 0..5 {
            let v = search
                .next(&mut running, |r| {
                    asked += 1;
                    r.id.0.is_multiple_of(2)
                })
                .unwrap();
            first.push(v.id().0);
        }
        let mut allowed: Vec<u64> = ids.iter().copied().filter(|id| id % 2 == 0).collect();
        allowed.sort_by_key(|id| std::cmp::Reverse(key(*id)));
        assert_eq!(first, allowed[..5]);
        assert!(asked < 30, "asked about {asked} tasks to take 5");
        // What is left is the rest, in any order; `left` bounds it.
        let mut rest: Vec<u64> = search
            .remaining(&running, |r| r.id.0.is_multiple_of(2))
            .map(|(v, _)| v.id().0)
            .collect();
        rest.sort_by_key(|id| std::cmp::Reverse(key(*id)));
        assert_eq!(rest, allowed[5..]);
        assert!(search.left() >= rest.len());
    }

    #[test]
    fn removing_a_task_keeps_every_other_findable() {
        let mut running = Running::of(VictimOrder::WorstFirst, []);
        let team = |id: u64| {
            if id.is_multiple_of(2) {
                (0, "a")
            } else {
                (1, "b")
            }
        };
        for id in 0..5 {
            running.insert(team(id).0, team(id).1, TaskId(id), (false, None), made);
        }
        running.search(|_| Some(ALL), made);
        running.remove(0, TaskId(0), false);
        running.remove(1, TaskId(3), false);
        running.remove(1, TaskId(3), false);
        running.remove(7, TaskId(3), false);
        for id in [1, 2, 4] {
            assert_eq!(
                running.get(team(id).0, TaskId(id)).map(|r| r.id),
                Some(TaskId(id))
            );
        }
        assert!(running.get(0, TaskId(0)).is_none());
        // A task that starts once the lists are ranked takes its place in the order.
        running.insert(1, "b", TaskId(15), (false, None), made);
        assert_eq!(taken(&mut running, ALL, made), [15, 4, 2, 1]);
    }

    /// Removing tasks from a class partly sorted by an earlier search, in the sorted stretch
    /// and after it, leaves every other task in victim order for the next search.
    #[test]
    fn removing_from_a_partly_sorted_class_keeps_the_victim_order() {
        let key = |id: u64| ((id * 37) % 101) as i64;
        let make = |id: TaskId| runner(id.0, key(id.0), false, 0);
        let ids: Vec<u64> = (1..=100).collect();
        let mut running = Running::of(
            VictimOrder::WorstFirst,
            ids.iter().map(|id| (0, "a", TaskId(*id), (false, None))),
        );
        let mut order = ids.clone();
        order.sort_by_key(|id| std::cmp::Reverse(key(*id)));
        // A search reads ten: the class is sorted only part of the way.
        let (mut search, _) = running.search(|_| Some(ALL), make);
        for want in &order[..10] {
            assert_eq!(
                search.next(&mut running, |_| true).map(|v| v.id().0),
                Some(*want)
            );
        }
        // Taken: the first, the third and the tenth of the order, and two far behind.
        let gone = [order[0], order[2], order[9], order[60], order[99]];
        for id in gone {
            running.remove(0, TaskId(id), false);
        }
        order.retain(|id| !gone.contains(id));
        assert_eq!(taken(&mut running, ALL, make), order);
    }

    #[test]
    fn a_class_named_without_a_key_is_keyed_only_once_a_search_reads_it() {
        // Tasks 1–4 (and 3,000, started later) of class 5 (a higher priority), 5–8 of class
        // 7; keys carry the class.
        let class = |id: TaskId| if id.0 <= 4 || id.0 == 3_000 { 5 } else { 7 };
        let runner = |id: TaskId| Runner {
            key: QueueKey(class(id), id.0 as i64, id.0),
            ..made(id)
        };
        let mut running = Running::of(
            VictimOrder::WorstFirst,
            (1..=8).map(|id| (0, "a", TaskId(id), (false, Some(class(TaskId(id)))))),
        );
        let mut keyed = Vec::new();
        let floor = Terms {
            whole: None,
            floor: Some(QueueKey(5, i64::MAX, u64::MAX)),
        };
        let (mut search, gpus) = running.search(
            |_| Some(floor),
            |id| {
                keyed.push(id.0);
                runner(id)
            },
        );
        assert_eq!(gpus, 4, "only class 7 counts");
        keyed.sort_unstable();
        assert_eq!(
            keyed,
            [5, 6, 7, 8],
            "class 5 lies below the floor: never keyed"
        );
        let first: Vec<u64> = std::iter::from_fn(|| search.next(&mut running, |_| true))
            .map(|v| v.id().0)
            .collect();
        assert_eq!(first, [8, 7, 6, 5]);
        // Started and stopped while class 5 is unread: counted in, then out, unkeyed.
        running.insert(0, "a", TaskId(3_000), (false, Some(5)), |_| {
            unreachable!("class 5 is unread")
        });
        running.remove(0, TaskId(2), false);
        let (mut search, _) = running.search(|_| Some(ALL), runner);
        let all: Vec<u64> = std::iter::from_fn(|| search.next(&mut running, |_| true))
            .map(|v| v.id().0)
            .collect();
        assert_eq!(
            all,
            [8, 7, 6, 5, 3_000, 4, 3, 1],
            "worst key first, class by class"
        );
    }

    #[test]
    fn a_floor_leaves_out_better_keys_unless_a_task_has_a_usage_limit() {
        let mut running = Running::of(
            VictimOrder::WorstFirst,
            [TaskId(11), TaskId(32), TaskId(23)].map(|id| (0, "a", id, (false, None))),
        );
        let terms = |limited: usize| Terms {
            whole: None,
            floor: Some(QueueKey(0, 2, 0)).filter(|_| limited == 0),
        };
        let ids = |running: &mut Running| {
            let (mut search, _) = running.search(|t| Some(terms(t.limited)), made);
            std::iter::from_fn(|| search.next(running, |_| true))
                .map(|v| v.id().0)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&mut running), [32, 23]);
        running.insert(0, "a", TaskId(4), (true, None), |id| {
            runner(id.0, 0, true, 0)
        });
        assert_eq!(ids(&mut running), [4, 32, 23, 11]);
        running.remove(0, TaskId(4), true);
        assert_eq!(ids(&mut running), [32, 23]);
    }

    #[test]
    fn a_team_never_looked_at_is_never_computed() {
        let mut running = Running::of(
            VictimOrder::WorstFirst,
            [
                (0, "a", TaskId(1), (false, None)),
                (1, "b", TaskId(2), (true, None)),
            ],
        );
        let mut made_for = Vec::new();
        running.search(
            |t| (t.name == "b").then_some(ALL),
            |id| {
                made_for.push(id);
                made(id)
            },
        );
        assert_eq!(made_for, [TaskId(2)]);
        assert!(running.get(0, TaskId(1)).is_none());
        assert_eq!(running.get(1, TaskId(2)).map(|r| r.id), Some(TaskId(2)));
    }

    #[test]
    fn a_floor_at_the_end_of_a_class_skips_the_class_unread() {
        // Keys (class, key, id): tasks 1–3 in class 0, 4–6 in class 1.
        let make = |id: TaskId| {
            Runner::new(
                0,
                QueueKey(i64::from(id.0 > 3), id.0 as i64, id.0),
                id,
                2,
                false,
                0,
                false,
            )
        };
        let mut running = Running::of(
            VictimOrder::WorstFirst,
            (1..=6).map(|id| (0, "a", TaskId(id), (false, None))),
        );
        let terms = Terms {
            whole: None,
            floor: Some(QueueKey(0, i64::MAX, u64::MAX)),
        };
        let (mut search, gpus) = running.search(|_| Some(terms), make);
        assert_eq!(gpus, 6, "only class 1's GPUs count");
        let mut asked = Vec::new();
        let taken: Vec<u64> = std::iter::from_fn(|| {
            search.next(&mut running, |r| {
                asked.push(r.id.0);
                true
            })
        })
        .map(|v| v.id().0)
        .collect();
        assert_eq!(taken, [6, 5, 4]);
        asked.sort_unstable();
        assert_eq!(asked, [4, 5, 6]);
    }
}
