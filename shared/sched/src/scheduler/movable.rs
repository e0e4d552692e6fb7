//! The running tasks a relocation could move, by node, kept as tasks start and stop.
//!
//! [`Scheduler::relocate_for`] looks for a node where moving a few small tasks elsewhere makes
//! room for a unit that fits nowhere. It used to walk every task, keep those that could move
//! and sort them by node for each attempt; on openb, where some 9,000 attempts each read every
//! one of 8,000 running pods, that walk and sort were a third of the run. What makes a running
//! task movable at all (one share on one node, no gang, no MIG instance, some GPU) and what an
//! attempt weighs it by (its GPU share, priority, arrival, and the start and checkpoints that
//! say how much work a move would lose) change only as it starts, reports a checkpoint and
//! stops, so they are kept here by node: an attempt reads the entries alone, and weighs those
//! only on the nodes whose movable tasks could make room.
//!
//! What the cheapest move off a node costs is remembered there too ([`Movable::cover_cost`]).
//! A pass often asks again about a node that did not change: every blocked unit of a size
//! asks, and many arrivals come at one time (on openb, four attempts in five are at the time
//! of the one before, and an attempt weighs some 110 nodes). An answer holds while the node's
//! entries stay as they are, and is asked for the same room, priority, restart cost, time and
//! free GPU share; any change to the entries forgets the node's answers.
//!
//! [`Scheduler::relocate_for`]: super::Scheduler::relocate_for

use smallvec::SmallVec;

use crate::cluster::Placement;
use crate::model::{NodeIdx, TaskId, Time};

/// A running task relocation could move, as it weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    /// Its GPU share, milli-GPU (more than 0).
    pub milli: u64,
    pub priority: i32,
    /// Its arrival order (ties of cost go to the earlier).
    pub seq: u64,
    pub id: TaskId,
    /// What a move would lose is computed from these, as for any running task.
    pub since: Time,
    pub checkpointed: Time,
    pub checkpoint_every: Option<Time>,
}

impl Entry {
    /// The work moving it at `now` would lose, ms.
    pub fn lost_work(&self, now: Time) -> Time {
        super::lost_work(self.since, self.checkpointed, self.checkpoint_every, now)
    }
}

/// What a relocation asks of a node's movable tasks: to make room for `need` milli-GPU for a
/// task of `priority`, a move costing each task it takes its share × (`restart` + the work it
/// would lose at `now`), milli-GPU·ms. It may take tasks of a smaller share and no higher
/// priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ask {
    pub need: u64,
    pub priority: i32,
    pub restart: Time,
    pub now: Time,
}

impl Ask {
    fn may_take(&self, e: &Entry) -> bool {
        e.milli < self.need && e.priority <= self.priority
    }

    fn cost(&self, e: &Entry) -> u128 {
        u128::from(e.milli) * u128::from(self.restart + e.lost_work(self.now))
    }
}

/// How many answers of [`Movable::cover_cost`] a node keeps (the latest).
const COVERS_KEPT: usize = 2;

/// An answer of [`Movable::cover_cost`]: what was asked, with the node's free share, and the
/// cost.
type Cover = (Ask, u64, Option<u128>);

/// The movable running tasks, by node.
#[derive(Debug, Clone, Default)]
pub(super) struct Movable {
    /// Indexed by node; each node's entries in no order.
    nodes: Vec<Vec<Entry>>,
    /// Indexed by node: what its entries hold together, kept with them.
    summaries: Vec<Summary>,
    /// Indexed by node: its latest answers to [`Self::cover_cost`], latest first; emptied as
    /// its entries change.
    covers: Vec<[Option<Cover>; COVERS_KEPT]>,
}

/// What a node's movable tasks hold together, whatever a relocation asks of them: enough for
/// an attempt to pass over a node whose tasks could not make room, and to bound from below
/// what moving any of them would cost, without reading the entries — an attempt reads every
/// node's summary, laid out side by side, and the entries of the few nodes it weighs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Summary {
    /// Their GPU shares added up, milli-GPU (0: no movable task).
    pub milli: u64,
    /// The smallest GPU share among them.
    pub least_milli: u64,
    /// The latest point from which one of them would lose work: its start or last reported
    /// checkpoint, `Time::MAX` if it checkpoints periodically (it may lose almost nothing).
    pub latest: Time,
    /// The GPU share of that one.
    pub latest_milli: u64,
    /// The latest such point among the others (0 if there are none).
    pub next: Time,
}

impl Summary {
    fn of(entries: &[Entry]) -> Self {
        let mut summary = Self {
            least_milli: u64::MAX,
            ..Self::default()
        };
        for (i, e) in entries.iter().enumerate() {
            summary.milli += e.milli;
            summary.least_milli = summary.least_milli.min(e.milli);
            let from = match e.checkpoint_every {
                Some(every) if every > 0 => Time::MAX,
                _ => e.since.max(e.checkpointed),
            };
            if i == 0 || from > summary.latest {
                summary.next = if i == 0 { 0 } else { summary.latest };
                summary.latest = from;
                summary.latest_milli = e.milli;
            } else {
                summary.next = summary.next.max(from);
            }
        }
        summary
    }

    /// At least what moving those of them that free `missing` milli-GPU or more would cost at
    /// `now`, a move costing each its share × (`restart` + the work it would lose), milli-GPU·ms.
    /// The one with the latest point loses the least; every other loses at least what one from
    /// `next` would. So a move that takes the latest costs at least its share × its least loss,
    /// plus the rest of what is missing at the others' least; one that leaves it, at least what
    /// is missing (and no less than the smallest share) at the others' least.
    pub fn least_cost(&self, missing: u64, restart: Time, now: Time) -> u128 {
        let latest = u128::from(restart + now.saturating_sub(self.latest));
        let others = u128::from(restart + now.saturating_sub(self.next));
        let with_latest = u128::from(self.latest_milli) * latest
            + u128::from(missing.saturating_sub(self.latest_milli)) * others;
        let without = u128::from(self.least_milli.max(missing)) * others;
        with_latest.min(without)
    }
}

impl Movable {
    /// Adds `entry`, which started on `node`.
    pub fn enter(&mut self, node: NodeIdx, entry: Entry) {
        let at = node.0 as usize;
        if self.nodes.len() <= at {
            self.nodes.resize_with(at + 1, Vec::new);
            self.summaries.resize(at + 1, Summary::default());
            self.covers.resize(at + 1, [None; COVERS_KEPT]);
        }
        self.nodes[at].push(entry);
        self.changed(at);
    }

    /// The entries of the node at `at` changed.
    fn changed(&mut self, at: usize) {
        self.summaries[at] = Summary::of(&self.nodes[at]);
        self.covers[at] = [None; COVERS_KEPT];
    }

    /// Removes task `id`, which ran at `placement`, if it is there.
    pub fn remove(&mut self, placement: &Placement, id: TaskId) {
        if let [share] = placement.shares.as_slice()
            && let at = share.node.0 as usize
            && let Some(entries) = self.nodes.get_mut(at)
            && let Some(found) = entries.iter().position(|e| e.id == id)
        {
            entries.swap_remove(found);
            self.changed(at);
        }
    }

    /// Every node with a movable task, in node order, with what its tasks hold together.
    pub fn summaries(&self) -> impl Iterator<Item = (NodeIdx, Summary)> + '_ {
        self.summaries
            .iter()
            .enumerate()
            .filter(|(_, summary)| summary.milli > 0)
            .map(|(node, summary)| (NodeIdx(node as u32), *summary))
    }

    /// Every node with a movable task, in node order, with its entries.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeIdx, &[Entry])> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, entries)| !entries.is_empty())
            .map(|(node, entries)| (NodeIdx(node as u32), entries.as_slice()))
    }

    /// The movable tasks on `node`, in no order.
    pub fn on(&self, node: NodeIdx) -> &[Entry] {
        self.nodes.get(node.0 as usize).map_or(&[], Vec::as_slice)
    }

    /// Task `id`, which runs at `placement`, reported a checkpoint: it has been saved up to
    /// `checkpointed`.
    pub fn checkpointed(&mut self, placement: &Placement, id: TaskId, checkpointed: Time) {
        if let [share] = placement.shares.as_slice()
            && let at = share.node.0 as usize
            && let Some(entries) = self.nodes.get_mut(at)
            && let Some(entry) = entries.iter_mut().find(|e| e.id == id)
        {
            entry.checkpointed = checkpointed;
            self.changed(at);
        }
    }

    /// What moving the cheapest of `node`'s tasks that `ask` may take costs (by cost, then
    /// arrival), taken until with the node's `free` share they make room: `None` if all of
    /// them together do not. Remembered until the node's entries change.
    pub fn cover_cost(&mut self, node: NodeIdx, free: u64, ask: Ask) -> Option<u128> {
        let at = node.0 as usize;
        let kept = self.covers.get_mut(at)?;
        if let Some((_, _, cost)) = kept
            .iter()
            .flatten()
            .find(|(a, f, _)| (*a, *f) == (ask, free))
        {
            debug_assert_eq!(
                *cost,
                cover(&self.nodes[at], free, ask).as_deref().map(cost_of),
                "a remembered cover of {node:?} costs what a fresh one does"
            );
            return *cost;
        }
        let cost = cover(&self.nodes[at], free, ask).as_deref().map(cost_of);
        kept.rotate_right(1);
        kept[0] = Some((ask, free, cost));
        cost
    }

    /// The tasks whose move [`Self::cover_cost`] costs, cheapest first.
    pub fn cover(&self, node: NodeIdx, free: u64, ask: Ask) -> Vec<TaskId> {
        cover(self.on(node), free, ask)
            .unwrap_or_default()
            .into_iter()
            .map(|(_, _, id, _)| id)
            .collect()
    }

    /// Every entry with its node, by node and task: checked against the task table in debug
    /// builds.
    pub fn all(&self) -> Vec<(NodeIdx, Entry)> {
        let mut all: Vec<(NodeIdx, Entry)> = self
            .nodes()
            .flat_map(|(node, entries)| entries.iter().map(move |e| (node, *e)))
            .collect();
        all.sort_unstable_by_key(|(node, e)| (*node, e.id));
        all
    }
}

/// The cheapest of `entries` that `ask` may take (by cost, then arrival), taken until with
/// `free` they cover the need, each with its cost; `None` if all of them do not.
fn cover(entries: &[Entry], mut free: u64, ask: Ask) -> Option<Weighed> {
    let mut weighed: Weighed = entries
        .iter()
        .filter(|e| ask.may_take(e))
        .map(|e| (ask.cost(e), e.seq, e.id, e.milli))
        .collect();
    if free + weighed.iter().map(|w| w.3).sum::<u64>() < ask.need {
        return None;
    }
    weighed.sort_unstable();
    let taken = weighed
        .iter()
        .take_while(|(.., milli)| {
            let short = free < ask.need;
            free += milli;
            short
        })
        .count();
    weighed.truncate(taken);
    Some(weighed)
}

/// The tasks of a node [`cover`] weighs: (cost, arrival, task, milli-GPU), on the stack for a
/// node of up to 16 (a move's search weighs hundreds of nodes a question: a heap allocation
/// each was about 2% of openb).
type Weighed = SmallVec<[(u128, u64, TaskId, u64); 16]>;

/// What the tasks [`cover`] takes cost together.
fn cost_of(taken: &[(u128, u64, TaskId, u64)]) -> u128 {
    taken.iter().map(|(cost, ..)| cost).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64) -> Entry {
        Entry {
            milli: 500,
            priority: 0,
            seq: id,
            id: TaskId(id),
            since: 0,
            checkpointed: 0,
            checkpoint_every: None,
        }
    }

    fn on(node: u32) -> Placement {
        Placement {
            shares: vec![crate::cluster::NodeShare {
                node: NodeIdx(node),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn a_summary_costs_a_move_no_more_than_any_set_of_its_tasks_that_frees_enough() {
        // Shares, starts and checkpoint intervals of a node's movable tasks: one started last
        // with a small share, older ones, a tie on the latest start, one checkpointing.
        let cases: [&[(u64, Time, Option<Time>)]; 4] = [
            &[(100, 9_000, None), (700, 1_000, None), (500, 4_000, None)],
            &[(300, 9_000, None), (300, 9_000, None), (900, 2_000, None)],
            &[
                (250, 5_000, Some(600)),
                (500, 8_000, None),
                (250, 1_000, None),
            ],
            &[(800, 7_000, None)],
        ];
        let (restart, now) = (60, 10_000);
        for entries in cases {
            let entries: Vec<Entry> = entries
                .iter()
                .enumerate()
                .map(|(i, (milli, since, every))| Entry {
                    milli: *milli,
                    since: *since,
                    checkpointed: *since,
                    checkpoint_every: *every,
                    ..entry(i as u64)
                })
                .collect();
            let summary = Summary::of(&entries);
            for missing in [1, 100, 250, 301, 600, 900, 1_200, 1_500] {
                // The cheapest set of them that frees at least `missing`, by brute force.
                let cheapest = (1u32..1 << entries.len())
                    .filter_map(|set| {
                        let taken = entries
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| set >> i & 1 == 1);
                        let freed: u64 = taken.clone().map(|(_, e)| e.milli).sum();
                        (freed >= missing).then(|| {
                            taken
                                .map(|(_, e)| {
                                    u128::from(e.milli) * u128::from(restart + e.lost_work(now))
                                })
                                .sum::<u128>()
                        })
                    })
                    .min();
                if let Some(cheapest) = cheapest {
                    assert!(
                        summary.least_cost(missing, restart, now) <= cheapest,
                        "{entries:?} missing {missing}: bound {} above {cheapest}",
                        summary.least_cost(missing, restart, now)
                    );
                }
            }
        }
    }

    #[test]
    fn the_cheapest_move_off_a_node_follows_its_tasks_as_they_change() {
        let mut movable = Movable::default();
        let node = NodeIdx(2);
        // Shares 500, 300 and 400, started at 0, 5,000 and 8,000.
        for (id, milli, since) in [(1, 500, 0), (2, 300, 5_000), (3, 400, 8_000)] {
            movable.enter(
                node,
                Entry {
                    milli,
                    since,
                    checkpointed: since,
                    ..entry(id)
                },
            );
        }
        let ask = Ask {
            need: 1_000,
            priority: 0,
            restart: 60,
            now: 10_000,
        };
        let ids = |m: &Movable, free| -> Vec<u64> {
            m.cover(node, free, ask).iter().map(|id| id.0).collect()
        };
        // 300 free: the two latest, 400 × 2,060 + 300 × 5,060.
        assert_eq!(movable.cover_cost(node, 300, ask), Some(2_342_000));
        assert_eq!(ids(&movable, 300), [3, 2]);
        // Asked again, the same; with less free, or for a task of lower priority, not.
        assert_eq!(movable.cover_cost(node, 300, ask), Some(2_342_000));
        assert_eq!(movable.cover_cost(node, 0, ask), Some(7_372_000));
        let lower = Ask {
            priority: -1,
            ..ask
        };
        assert_eq!(movable.cover_cost(node, 300, lower), None);
        // A checkpoint makes the oldest the cheapest.
        movable.checkpointed(&on(2), TaskId(1), 9_900);
        assert_eq!(movable.cover_cost(node, 300, ask), Some(904_000));
        assert_eq!(ids(&movable, 300), [1, 3]);
        // It stops; a task started now costs only its restart.
        movable.remove(&on(2), TaskId(1));
        assert_eq!(movable.cover_cost(node, 300, ask), Some(2_342_000));
        movable.enter(
            node,
            Entry {
                milli: 700,
                since: 10_000,
                checkpointed: 10_000,
                ..entry(4)
            },
        );
        assert_eq!(movable.cover_cost(node, 300, ask), Some(42_000));
        assert_eq!(ids(&movable, 300), [4]);
        // A node without movable tasks makes no room.
        assert_eq!(movable.cover_cost(NodeIdx(0), 300, ask), None);
        assert_eq!(movable.cover_cost(NodeIdx(9), 300, ask), None);
    }

    #[test]
    fn entries_are_found_on_their_node_until_removed() {
        let mut movable = Movable::default();
        movable.enter(NodeIdx(3), entry(1));
        movable.enter(NodeIdx(0), entry(2));
        movable.enter(NodeIdx(3), entry(3));
        let ids = |m: &Movable| -> Vec<(NodeIdx, TaskId)> {
            m.all().into_iter().map(|(n, e)| (n, e.id)).collect()
        };
        assert_eq!(
            ids(&movable),
            vec![
                (NodeIdx(0), TaskId(2)),
                (NodeIdx(3), TaskId(1)),
                (NodeIdx(3), TaskId(3))
            ]
        );
        // What a move would lose is counted from the last checkpoint, once one is reported.
        assert_eq!(movable.all()[2].1.lost_work(90), 90);
        movable.checkpointed(&on(3), TaskId(3), 60);
        assert_eq!(movable.all()[2].1.lost_work(90), 30);
        movable.remove(&on(3), TaskId(1));
        // Removing from the wrong node, or twice, changes nothing.
        movable.remove(&on(0), TaskId(3));
        movable.remove(&on(3), TaskId(1));
        let nodes: Vec<(NodeIdx, Vec<TaskId>)> = movable
            .nodes()
            .map(|(n, es)| (n, es.iter().map(|e| e.id).collect()))
            .collect();
        assert_eq!(
            nodes,
            vec![(NodeIdx(0), vec![TaskId(2)]), (NodeIdx(3), vec![TaskId(3)])]
        );
    }
}
