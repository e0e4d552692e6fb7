//! A preemption search for a unit that fits nowhere and goes on one node, walked node by node.
//!
//! The search of [`Scheduler::preempt_for`] releases victims in rank order, and after each
//! release tries to place the unit among the nodes released so far. For a single task that
//! fitted nowhere, goes on one node and whose team's quota admits it already, only the node of
//! the victim just released can newly hold it: every other node is as it was when the last try
//! failed there, or never might hold it (capacity only grows as victims go, and a try happens
//! whenever a released node might hold the unit). So the search ends at the first victim whose
//! node, with every victim taken there so far released, holds the unit; its placement is the
//! one found on that node alone; and the victims stopped are those taken there, in rank order.
//! Victims taken on other nodes keep running, since the quota that admitted the unit admits it
//! with them charged back (usage only falls as victims are refunded).
//!
//! So this walk takes the same victims in the same order, but only counts what each frees on
//! its node ([`FreeingNodes`]) and releases on the cluster only the victims of a node that then
//! might hold the unit, for the one try that node needs, giving them back if it fails. It leaves
//! every other node untouched, and explains only the victims it stops, each with the quotas as
//! the full search would have read them (everyone taken before it refunded). A victim in a gang
//! or on more than one node ends the walk undecided: the full search, from the start, decides.

use super::victims::{Running, Search, Victim};
use super::{Contender, Placed, Scheduler, Task, Unit, may_take};
use crate::cluster::FreeingNodes;
use crate::model::{NodeIdx, TaskId};
use crate::quota::{self, Quotas};

/// How a walk by node ended.
pub(super) enum ByNode {
    /// The unit's placement, and the victims to stop for it in rank order, with the words that
    /// explain each. Their resources are released on the cluster; their quota is not refunded.
    Found(Placed, Vec<(TaskId, String)>),
    /// No node the victims are on could hold the unit: the cluster is as it was.
    Nowhere,
    /// A victim in a gang or on several nodes: the full search must decide (the cluster is as
    /// it was).
    Undecided,
}

impl Scheduler {
    /// Walks `victims` (a search not started yet, of `running`, for `unit` as `preemptor`,
    /// whose policy answers are asked of `quotas` as they were when the search began) node by
    /// node — see the module's docs. The unit is one task that fits nowhere, goes on one node
    /// and its quota admits now.
    pub(super) fn preempt_by_node(
        &mut self,
        unit: &Unit,
        preemptor: Contender<'_>,
        quotas: &Quotas,
        mut victims: Search,
        running: &mut Running,
        now: crate::model::Time,
    ) -> ByNode {
        let task = &unit.specs[0];
        let own = self.tasks[&task.id].team;
        let mut freeing = FreeingNodes::new(&self.cluster);
        // Every victim taken, in rank order, each with where the one taken before it on its
        // node is in it; and, per node, where its last one is (`NONE`: none yet). A search
        // takes hundreds of victims over as many nodes, and tries a node's only once they
        // might make room there.
        const NONE: u32 = u32::MAX;
        let mut taken: Vec<(Victim, NodeIdx)> = Vec::new();
        let mut before: Vec<u32> = Vec::new();
        let mut last_on: Vec<u32> = vec![NONE; self.cluster.nodes().len()];
        loop {
            let policy = &*self.policy;
            let tasks = &self.tasks;
            let Some(victim) = victims.next(running, |r| {
                may_take(policy, tasks, quotas, preemptor, own, r)
            }) else {
                return ByNode::Nowhere;
            };
            let runner = victims.taken(running);
            if runner.gang {
                return ByNode::Undecided;
            }
            // (Kept with the runner: the walks of a pass read the same victims first.)
            let [share] = runner.held(|| self.shares_of(runner.id).into()) else {
                return ByNode::Undecided;
            };
            let node = share.node;
            freeing.release(&self.cluster, share);
            let last = &mut last_on[node.0 as usize];
            before.push(*last);
            *last = taken.len() as u32;
            taken.push((victim, node));
            if !freeing.might_hold_on(&self.cluster, node, task) {
                continue;
            }
            // The one try this release calls for, on this node alone.
            let mut ids: Vec<TaskId> = Vec::new();
            let mut at = last_on[node.0 as usize];
            while at != NONE {
                ids.push(taken[at as usize].0.id());
                at = before[at as usize];
            }
            ids.reverse();
            let held = self.placements_of(&ids);
            held.iter().for_each(|p| self.cluster.release(p));
            let placed = self.place_among(task, &[node]).map(|p| (vec![p], None));
            debug_assert_eq!(
                placed,
                self.place_unit(unit),
                "only the node of the victim just released can newly hold the unit"
            );
            let Some(placed) = placed else {
                held.iter().for_each(|p| self.cluster.allocate(p));
                continue;
            };
            let stopped = self.explain(preemptor, &taken, node, now);
            return ByNode::Found(placed, stopped);
        }
    }

    /// The victims in `taken` (rank order) on `node`, each with the words the full search
    /// would explain it in: read of the quotas with every victim taken before it refunded, as
    /// that search refunds them. Those stopped are left refunded, the others charged back.
    fn explain(
        &mut self,
        preemptor: Contender<'_>,
        taken: &[(Victim, NodeIdx)],
        node: NodeIdx,
        now: crate::model::Time,
    ) -> Vec<(TaskId, String)> {
        let mut stopped = Vec::new();
        let mut slots = QuotaSlots::default();
        for (victim, on) in taken {
            if *on == node {
                stopped.push((victim.id(), self.why_taken(preemptor, *victim, now)));
            }
            let task = &self.tasks[&victim.id()];
            let at = slots.of(&mut self.quotas, task);
            self.quotas.refund_at(at, quota::demand(&task.spec));
        }
        // Those that keep running are charged back; those stopped stay refunded.
        for (victim, on) in taken {
            if *on != node {
                let task = &self.tasks[&victim.id()];
                let at = slots.of(&mut self.quotas, task);
                self.quotas.charge_at(at, quota::demand(&task.spec));
            }
        }
        stopped
    }
}

/// Each team's entry in the quotas ([`Quotas::slot`]) by the team's number, looked up by name
/// once per walk rather than for every victim [`Scheduler::explain`] refunds or charges back.
#[derive(Default)]
struct QuotaSlots(Vec<Option<usize>>);

impl QuotaSlots {
    fn of(&mut self, quotas: &mut Quotas, task: &Task) -> usize {
        if self.0.len() <= task.team {
            self.0.resize(task.team + 1, None);
        }
        *self.0[task.team].get_or_insert_with(|| quotas.slot(&task.spec.team))
    }
}
