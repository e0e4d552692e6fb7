//! Shapes that found no placement, remembered until capacity frees where they might fit.
//!
//! Placement searches every node, and a pass asks it for every waiting task. But a request
//! that found no room cannot find any while capacity only shrinks; and when capacity frees on
//! some nodes, a request that can only go on one node can only newly fit on one of those. So
//! each failed shape records how far the log of freed nodes had got, and is tried again only
//! once a node freed since then might hold it ([`NodeState::might_hold`], necessary for any
//! one-node placement). Requests that may span nodes are tried again after any release.
//! Changes that are not plain releases (a node joining or coming back into service, a quota
//! or budget change) forget everything.
//!
//! The same log answers a second question: which shapes no preemption search could make room
//! for, were every victim it may take gone ([`Scheduler::no_victims_could_make_room`]). What a
//! node could offer so is what is free there plus what the classes a search may take hold; a
//! task of those classes that starts takes from one and adds to the other, any other task that
//! starts only takes. So, as for a placement, only a release can make a node newly able to.
//!
//! [`Scheduler::no_victims_could_make_room`]: super::Scheduler::no_victims_could_make_room
//!
//! [`NodeState::might_hold`]: crate::cluster::NodeState::might_hold

use rustc_hash::FxHashMap as HashMap;

use crate::cluster::Cluster;
use crate::model::{NodeIdx, RequestShape as Shape, TaskSpec};
use crate::policy::Policy;

#[derive(Debug, Default)]
pub(super) struct NoRoom {
    /// Each shape that found no room since everything was last forgotten, with where its entry
    /// is in `since`.
    shapes: HashMap<Shape, u32>,
    /// Per entry: the length of `freed` when its shape last found no room; `None` once it may
    /// fit again. (A waiting task keeps its shape's [`Slot`], so a sweep asks whether it still
    /// fits nowhere without hashing the shape or looking the task up.)
    since: Vec<Option<usize>>,
    /// How many entries of `since` are `Some`.
    live: usize,
    /// How many times everything was forgotten: a [`Slot`] of an earlier era names nothing.
    era: u64,
    /// Each shape no preemption could make room for, by which classes a search may take
    /// ([`Classes`]), with the length of `freed` when that was last found.
    beyond_help: HashMap<Shape, Vec<(Classes, usize)>>,
    /// Nodes where capacity was freed, in order (kept only while some shape is remembered, and
    /// at most [`MAX_FREED`] long).
    freed: Vec<NodeIdx>,
}

/// Where a shape's entry is kept in [`NoRoom`], while nothing is forgotten all at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    era: u64,
    at: u32,
}

/// The classes a preemption search may take, as its key floor names them: those above the
/// first number, and that class itself unless the flag says the floor is its last key
/// ([`super::victims::below`]).
pub(super) type Classes = (i64, bool);

/// How many releases are remembered before everything is forgotten (which is always correct):
/// shapes that never fit again would otherwise keep the log growing.
const MAX_FREED: usize = 1 << 16;

impl NoRoom {
    /// Forgets every shape: what changed may let any of them fit anywhere.
    pub fn clear(&mut self) {
        self.era += 1;
        self.shapes.clear();
        self.since.clear();
        self.live = 0;
        self.beyond_help.clear();
        self.freed.clear();
    }

    /// `shape` found no room on the cluster as it is; where its entry is kept.
    pub fn insert(&mut self, shape: Shape) -> Slot {
        let next = self.since.len() as u32;
        let at = *self.shapes.entry(shape).or_insert(next);
        if at == next {
            self.since.push(None);
        }
        let since = &mut self.since[at as usize];
        self.live += usize::from(since.is_none());
        *since = Some(self.freed.len());
        Slot { era: self.era, at }
    }

    /// Where `shape`'s entry is kept, if it found no room since everything was last forgotten.
    pub fn slot(&self, shape: &Shape) -> Option<Slot> {
        self.shapes.get(shape).map(|at| Slot {
            era: self.era,
            at: *at,
        })
    }

    /// Whether the shape kept at `slot` found no room and nothing was freed since it was last
    /// asked (or found none): [`Self::room`] would answer [`Room::Nowhere`] without reading
    /// anything.
    pub fn read_to_end(&self, slot: Slot) -> bool {
        slot.era == self.era && self.since[slot.at as usize] == Some(self.freed.len())
    }

    /// The shape kept at `at` (which found no room) may fit again.
    fn forget(&mut self, at: u32) {
        self.since[at as usize] = None;
        self.live -= 1;
    }

    /// Capacity was freed on `nodes` (and nothing else changed).
    pub fn freed(&mut self, nodes: impl IntoIterator<Item = NodeIdx>) {
        if self.live == 0 && self.beyond_help.is_empty() {
            self.freed.clear();
        } else {
            self.freed.extend(nodes);
            if self.freed.len() > MAX_FREED {
                self.clear();
            }
        }
    }

    /// `shape` is beyond the help of any search that may take `classes`, on the cluster as it
    /// is.
    pub fn insert_beyond_help(&mut self, shape: &Shape, classes: Classes) {
        let at = self.freed.len();
        let known = self.beyond_help.entry(shape.clone()).or_default();
        match known.iter_mut().find(|(c, _)| *c == classes) {
            Some((_, since)) => *since = at,
            None => known.push((classes, at)),
        }
    }

    /// Whether `shape` is known to be beyond the help of any search that may take `classes`:
    /// it was found so, and no node freed since `might_help` (whether a node might now hold
    /// it, were every such victim gone).
    pub fn beyond_help(
        &mut self,
        shape: &Shape,
        classes: Classes,
        might_help: impl Fn(NodeIdx) -> bool,
    ) -> bool {
        let Some(known) = self.beyond_help.get_mut(shape) else {
            return false;
        };
        let Some(at) = known.iter().position(|(c, _)| *c == classes) else {
            return false;
        };
        if none_since(&self.freed, &mut known[at].1, might_help) {
            return true;
        }
        known.swap_remove(at);
        if known.is_empty() {
            self.beyond_help.remove(shape);
        }
        false
    }

    /// Whether `task`, of `shape`, is known to fit nowhere on `cluster`: its shape found no
    /// room, and no node freed since might hold it (any release since counts for a task that
    /// may span nodes).
    pub fn excludes(
        &mut self,
        shape: &Shape,
        task: &TaskSpec,
        cluster: &Cluster,
        policy: &dyn Policy,
    ) -> bool {
        let Some(&at) = self.shapes.get(shape) else {
            return false;
        };
        let Some(since) = self.since[at as usize].as_mut() else {
            return false;
        };
        if self.freed.len() == *since
            || (one_node(policy, cluster, task)
                && none_since(&self.freed, since, |n| cluster.node(n).might_hold(task)))
        {
            return true;
        }
        self.forget(at);
        false
    }
}

/// What is known of where a task whose shape found no room may fit now ([`NoRoom::room`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Room {
    /// Nowhere: no node freed since might hold it.
    Nowhere,
    /// Only on these nodes, freed since it found none, each of which might hold it (sorted,
    /// each once): no other node gained capacity since, and it fitted on none then.
    Among(Vec<NodeIdx>),
    /// Anywhere, for all that is known: its shape was not found to fit nowhere, or it may span
    /// nodes.
    Anywhere,
}

impl NoRoom {
    /// Where `task`, of `shape`, may fit on `cluster`: [`Self::excludes`], and when it does not,
    /// which nodes alone a task placed on one node could go on. A placement among those is the
    /// one a search of the whole cluster finds (the policies rank a placement by its node, not
    /// by which other nodes were looked at), at the cost of a few nodes instead of all.
    pub fn room(
        &mut self,
        shape: &Shape,
        task: &TaskSpec,
        cluster: &Cluster,
        policy: &dyn Policy,
    ) -> Room {
        let Some(&at) = self.shapes.get(shape) else {
            return Room::Anywhere;
        };
        let Some(since) = self.since[at as usize].as_mut() else {
            return Room::Anywhere;
        };
        let span = &self.freed[*since..];
        if span.is_empty() {
            return Room::Nowhere;
        }
        // Longer than the cluster, the log would cost more to read than the cluster does to
        // search: only whether any node in it might hold the task is asked.
        if span.len() > cluster.nodes().len().max(AMONG_AT_LEAST)
            || !one_node(policy, cluster, task)
        {
            return if self.excludes(shape, task, cluster, policy) {
                Room::Nowhere
            } else {
                Room::Anywhere
            };
        }
        let mut among: Vec<NodeIdx> = span
            .iter()
            .copied()
            .filter(|n| cluster.node(*n).might_hold(task))
            .collect();
        if among.is_empty() {
            *since = self.freed.len();
            return Room::Nowhere;
        }
        self.forget(at);
        among.sort_unstable();
        among.dedup();
        Room::Among(among)
    }
}

/// [`NoRoom::room`] names the nodes a task may go on from a log of releases at most as long as
/// the cluster has nodes, or this many.
const AMONG_AT_LEAST: usize = 64;

/// Whether no node freed from `since` on is one `might` names; if so, `since` moves to the
/// end of `freed` (those nodes need not be asked again).
fn none_since(freed: &[NodeIdx], since: &mut usize, might: impl Fn(NodeIdx) -> bool) -> bool {
    let none = !freed[*since..].iter().any(|n| might(*n));
    if none {
        *since = freed.len();
    }
    none
}

/// Whether every placement of `task` is on one node: no MIG instance (the scheduler places
/// those itself), and the policy places it on one node ([`Policy::one_node`]).
pub(super) fn one_node(policy: &dyn Policy, cluster: &Cluster, task: &TaskSpec) -> bool {
    task.mig_profile.is_none() && policy.one_node(cluster, task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{NodeShare, Placement};
    use crate::model::{NodeSpec, WHOLE_GPU_MILLI};
    use crate::policy::Fifo;

    /// The nodes a task whose shape found no room may now go on are those freed since that
    /// might hold it, each once and in order; a task that may span nodes, or whose shape was
    /// not found to fit nowhere, may go anywhere.
    #[test]
    fn room_names_the_freed_nodes_that_might_hold_the_task() {
        let mut cluster = Cluster::default();
        let nodes: Vec<NodeIdx> = ["a", "b", "c"]
            .into_iter()
            .map(|n| cluster.add_node(NodeSpec::new(n, 8, "H100")))
            .collect();
        let gpus = |node, from: u32, to: u32| Placement {
            shares: vec![NodeShare {
                node,
                gpus: (from..to).map(|g| (g, WHOLE_GPU_MILLI)).collect(),
                ..NodeShare::default()
            }],
        };
        for &node in &nodes {
            cluster.allocate(&gpus(node, 0, 7));
        }
        let [a, b, c] = nodes[..] else { unreachable!() };
        let task = TaskSpec::new(1, "t", 4);
        let shape = Shape::of(&task);
        let mut no_room = NoRoom::default();
        assert_eq!(no_room.room(&shape, &task, &cluster, &Fifo), Room::Anywhere);
        no_room.insert(shape.clone());
        assert_eq!(no_room.room(&shape, &task, &cluster, &Fifo), Room::Nowhere);
        // One GPU more on a (2 free), three on c, three then one on b.
        let release = |cluster: &mut Cluster, no_room: &mut NoRoom, node, from, to| {
            cluster.release(&gpus(node, from, to));
            no_room.freed([node]);
        };
        release(&mut cluster, &mut no_room, a, 0, 1);
        assert_eq!(no_room.room(&shape, &task, &cluster, &Fifo), Room::Nowhere);
        release(&mut cluster, &mut no_room, c, 0, 3);
        release(&mut cluster, &mut no_room, b, 0, 3);
        release(&mut cluster, &mut no_room, b, 3, 4);
        assert_eq!(
            no_room.room(&shape, &task, &cluster, &Fifo),
            Room::Among(vec![b, c])
        );
        // Asked, it is forgotten: the next placement is searched for in full.
        assert_eq!(no_room.room(&shape, &task, &cluster, &Fifo), Room::Anywhere);
        // A request that may span nodes, after any release: anywhere.
        let wide = TaskSpec::new(2, "t", 12);
        let wide_shape = Shape::of(&wide);
        no_room.insert(wide_shape.clone());
        release(&mut cluster, &mut no_room, a, 1, 2);
        assert_eq!(
            no_room.room(&wide_shape, &wide, &cluster, &Fifo),
            Room::Anywhere
        );
    }

    #[test]
    fn a_shape_is_tried_again_only_once_a_freed_node_might_hold_it() {
        let mut cluster = Cluster::default();
        let a = cluster.add_node(NodeSpec::new("a", 8, "H100"));
        let b = cluster.add_node(NodeSpec::new("b", 8, "H100"));
        // Each node with 7 of 8 GPUs taken: a 4-GPU task fits nowhere.
        let take = |node, n: u32| Placement {
            shares: vec![NodeShare {
                node,
                gpus: (0..n).map(|g| (g, WHOLE_GPU_MILLI)).collect(),
                ..NodeShare::default()
            }],
        };
        cluster.allocate(&take(a, 7));
        cluster.allocate(&take(b, 7));
        let task = TaskSpec::new(1, "t", 4);
        let shape = Shape::of(&task);
        let mut no_room = NoRoom::default();
        no_room.insert(shape.clone());
        assert!(no_room.excludes(&shape, &task, &cluster, &Fifo));
        // One GPU freed on a: still no node with 4 free.
        let one = Placement {
            shares: vec![NodeShare {
                node: a,
                gpus: vec![(0, WHOLE_GPU_MILLI)],
                ..NodeShare::default()
            }],
        };
        cluster.release(&one);
        no_room.freed([a]);
        assert!(no_room.excludes(&shape, &task, &cluster, &Fifo));
        // The same release seen by a request that may span nodes (more GPUs than a node has):
        // try again.
        let wide = TaskSpec::new(2, "t", 12);
        let wide_shape = Shape::of(&wide);
        let mut spanning = NoRoom::default();
        spanning.insert(wide_shape.clone());
        spanning.freed([a]);
        assert!(!spanning.excludes(&wide_shape, &wide, &cluster, &Fifo));
        // Three more on b: b has 4 free, so the shape is tried again (and forgotten).
        let three = Placement {
            shares: vec![NodeShare {
                node: b,
                gpus: (0..3).map(|g| (g, WHOLE_GPU_MILLI)).collect(),
                ..NodeShare::default()
            }],
        };
        cluster.release(&three);
        no_room.freed([b]);
        assert!(!no_room.excludes(&shape, &task, &cluster, &Fifo));
        assert!(!no_room.excludes(&shape, &task, &cluster, &Fifo));
    }

    #[test]
    fn a_task_is_bound_to_one_node_unless_the_policy_may_span_it() {
        let mut cluster = Cluster::default();
        cluster.add_node(NodeSpec::new("big", 8, "H100"));
        cluster.add_node(NodeSpec::new("cpu", 0, ""));
        let one = TaskSpec::new(1, "t", 1);
        let four = TaskSpec::new(2, "t", 4);
        // A CPU-only node makes no GPU task span.
        assert!(one_node(&Fifo, &cluster, &one));
        assert!(one_node(&Fifo, &cluster, &four));
        // Beside one-GPU nodes, best fit may span four of them; FGD places whole GPUs on one
        // node whenever a model has nodes that large.
        cluster.add_node(NodeSpec::new("small", 1, "T4"));
        assert!(one_node(&Fifo, &cluster, &one));
        assert!(!one_node(&Fifo, &cluster, &four));
        assert!(one_node(
            &crate::policy::packing::Fgd::new(),
            &cluster,
            &four
        ));
        let mut mig = one.clone();
        mig.mig_profile = Some("1g.10gb".into());
        assert!(!one_node(&Fifo, &cluster, &mig));
    }

    #[test]
    fn a_slot_reads_to_the_end_until_a_release_or_forgetting() {
        let mut cluster = Cluster::default();
        let a = cluster.add_node(NodeSpec::new("a", 8, "H100"));
        let gpus = |from: u32, to: u32| Placement {
            shares: vec![NodeShare {
                node: a,
                gpus: (from..to).map(|g| (g, WHOLE_GPU_MILLI)).collect(),
                ..NodeShare::default()
            }],
        };
        cluster.allocate(&gpus(0, 8));
        let task = TaskSpec::new(1, "t", 1);
        let shape = Shape::of(&task);
        let mut no_room = NoRoom::default();
        assert_eq!(no_room.slot(&shape), None);
        let slot = no_room.insert(shape.clone());
        assert_eq!(no_room.slot(&shape), Some(slot));
        assert!(no_room.read_to_end(slot));
        // Answering for it keeps it so: what was found to fit nowhere still does.
        assert!(no_room.excludes(&shape, &task, &cluster, &Fifo));
        assert!(no_room.read_to_end(slot));
        // A release ends it, until the shape is asked again and still fits nowhere.
        no_room.freed([a]);
        assert!(!no_room.read_to_end(slot));
        assert_eq!(no_room.room(&shape, &task, &cluster, &Fifo), Room::Nowhere);
        assert!(no_room.read_to_end(slot));
        // Forgetting everything ends it for good: the slot names nothing any more.
        no_room.clear();
        assert!(!no_room.read_to_end(slot));
        let again = no_room.insert(shape.clone());
        assert_ne!(again, slot);
        assert!(!no_room.read_to_end(slot));
        assert!(no_room.read_to_end(again));
        // Freed where it might fit, the shape may fit again: its slot reads to no end.
        cluster.release(&gpus(0, 1));
        no_room.freed([a]);
        assert_eq!(
            no_room.room(&shape, &task, &cluster, &Fifo),
            Room::Among(vec![a])
        );
        assert!(!no_room.read_to_end(again));
        assert_eq!(no_room.room(&shape, &task, &cluster, &Fifo), Room::Anywhere);
        // Found to fit nowhere again, it is kept where it was.
        assert_eq!(no_room.insert(shape.clone()), again);
        assert!(no_room.read_to_end(again));
    }
}
