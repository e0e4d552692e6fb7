//! The running tasks a relocation could move, by node, kept as tasks start and stop.
//!
//! [`Scheduler::relocate_for`] looks for a node where moving a few small tasks elsewhere makes
//! room for a unit that fits nowhere. It used to walk every task, keep those that could move
//! and sort them by node for each attempt; on openb, where some 9,000 attempts each read every
//! one of 8,000 running pods, that walk and sort were a third of the run. What makes a running
//! task movable at all (one share on one node, no gang, no MIG instance, some GPU) and what an
//! attempt weighs it by (its GPU share, priority and arrival) do not change while it runs, so
//! they are kept here by node: an attempt reads a node's entries only, and asks the task table
//! how much work a move would lose only on the nodes its victims could make room on.
//!
//! [`Scheduler::relocate_for`]: super::Scheduler::relocate_for

use crate::cluster::Placement;
use crate::model::{NodeIdx, TaskId};

/// A running task relocation could move, as it weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    /// Its GPU share, milli-GPU (more than 0).
    pub milli: u64,
    pub priority: i32,
    /// Its arrival order (ties of cost go to the earlier).
    pub seq: u64,
    pub id: TaskId,
}

/// The movable running tasks, by node.
#[derive(Debug, Clone, Default)]
pub(super) struct Movable {
    /// Indexed by node; each node's entries in no order.
    nodes: Vec<Vec<Entry>>,
}

impl Movable {
    /// Adds `entry`, which started on `node`.
    pub fn enter(&mut self, node: NodeIdx, entry: Entry) {
        let at = node.0 as usize;
        if self.nodes.len() <= at {
            self.nodes.resize_with(at + 1, Vec::new);
        }
        self.nodes[at].push(entry);
    }

    /// Removes task `id`, which ran at `placement`, if it is there.
    pub fn remove(&mut self, placement: &Placement, id: TaskId) {
        if let [share] = placement.shares.as_slice()
            && let Some(entries) = self.nodes.get_mut(share.node.0 as usize)
            && let Some(at) = entries.iter().position(|e| e.id == id)
        {
            entries.swap_remove(at);
        }
    }

    /// Every node with a movable task, in node order, with its entries.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeIdx, &[Entry])> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, entries)| !entries.is_empty())
            .map(|(node, entries)| (NodeIdx(node as u32), entries.as_slice()))
    }

    /// Every (node, task) held, sorted: checked against the task table in debug builds.
    pub fn pairs(&self) -> Vec<(NodeIdx, TaskId)> {
        let mut pairs: Vec<(NodeIdx, TaskId)> = self
            .nodes()
            .flat_map(|(node, entries)| entries.iter().map(move |e| (node, e.id)))
            .collect();
        pairs.sort_unstable();
        pairs
    }
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
    fn entries_are_found_on_their_node_until_removed() {
        let mut movable = Movable::default();
        movable.enter(NodeIdx(3), entry(1));
        movable.enter(NodeIdx(0), entry(2));
        movable.enter(NodeIdx(3), entry(3));
        assert_eq!(
            movable.pairs(),
            vec![
                (NodeIdx(0), TaskId(2)),
                (NodeIdx(3), TaskId(1)),
                (NodeIdx(3), TaskId(3))
            ]
        );
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
