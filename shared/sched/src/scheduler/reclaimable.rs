//! What running tasks hold on each node, by class: the most a preemption search bounded by a
//! key floor could ever free there.
//!
//! A preemption search ranks the running tasks it may take (their keys, lost work, GPUs: a
//! question to the estimator and the policy per task) before it takes the first. On a full
//! cluster most searches fail, and many fail because no node could hold the unit even were
//! every allowed victim gone (openb: 6,267 of 10,526 searches, each ranking thousands of
//! running pods first). When a policy's keys start with a class fixed by the spec
//! ([`Policy::class`], a priority) and its victims are bounded by a key floor
//! ([`Policy::victim_floor`]), the classes past the floor bound every victim. Kept here by node
//! as tasks start and stop, what those classes hold answers the question for a one-node unit
//! from the nodes alone (the question [`Freeing::might_hold`] answers, necessary for any
//! placement), before anything is ranked.
//!
//! [`Policy::class`]: crate::policy::Policy::class
//! [`Policy::victim_floor`]: crate::policy::Policy::victim_floor
//! [`Freeing::might_hold`]: crate::cluster::Freeing::might_hold

use crate::cluster::{NodeState, Placement};
use crate::model::{NodeIdx, TaskSpec, WHOLE_GPU_MILLI};

/// Per node, by class, what the running tasks of that class hold there.
#[derive(Debug, Clone, Default)]
pub(super) struct Reclaimable {
    /// Indexed by node; each node's classes in no order (there are few).
    nodes: Vec<Vec<(i64, Held)>>,
}

/// What tasks hold on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Held {
    /// Milli-GPU, by GPU index.
    gpus: Vec<u32>,
    cpu_milli: u64,
    memory_mib: u64,
}

impl Reclaimable {
    /// A task of `class` started at `placement`.
    pub fn enter(&mut self, class: i64, placement: &Placement) {
        for share in &placement.shares {
            let held = self.held_mut(class, share.node);
            for (gpu, milli) in &share.gpus {
                let gpu = *gpu as usize;
                if held.gpus.len() <= gpu {
                    held.gpus.resize(gpu + 1, 0);
                }
                held.gpus[gpu] += milli;
            }
            held.cpu_milli += share.cpu_milli;
            held.memory_mib += share.memory_mib;
        }
    }

    /// A task of `class` that ran at `placement` stopped.
    pub fn remove(&mut self, class: i64, placement: &Placement) {
        for share in &placement.shares {
            let held = self.held_mut(class, share.node);
            for (gpu, milli) in &share.gpus {
                held.gpus[*gpu as usize] -= milli;
            }
            held.cpu_milli -= share.cpu_milli;
            held.memory_mib -= share.memory_mib;
        }
    }

    /// Whether `node` (number `at`) might hold `task` on its own were every task of the
    /// classes `counts` names gone from it: [`Freeing::might_hold`]'s question, asked of the
    /// sums, without copying the node.
    ///
    /// [`Freeing::might_hold`]: crate::cluster::Freeing::might_hold
    pub fn might_hold(
        &self,
        node: &NodeState,
        at: NodeIdx,
        counts: impl Fn(i64) -> bool,
        task: &TaskSpec,
    ) -> bool {
        if !node.schedulable || !task.accepts(&node.spec.gpu_model) {
            return false;
        }
        let classes = self.nodes.get(at.0 as usize).map_or(&[][..], Vec::as_slice);
        let counted = || {
            classes
                .iter()
                .filter(|(class, _)| counts(*class))
                .map(|(_, held)| held)
        };
        let (cpu, memory) = counted().fold((node.free_cpu, node.free_memory), |(c, m), held| {
            (c + held.cpu_milli, m + held.memory_mib)
        });
        if !crate::placement::host_room(&node.spec, cpu, memory, task) {
            return false;
        }
        // Each GPU in service as it would be: free, plus what the counted classes hold on it.
        let free = |gpu: usize| {
            node.gpu_free[gpu]
                + counted()
                    .map(|held| held.gpus.get(gpu).copied().unwrap_or(0))
                    .sum::<u32>()
        };
        // A GPU out of service stays without free capacity, whatever held it.
        let freed =
            (0..node.gpu_free.len()).map(|gpu| if node.gpu_out[gpu] { 0 } else { free(gpu) });
        let whole = || freed.clone().filter(|f| *f == WHOLE_GPU_MILLI).count() as u32;
        crate::cluster::gpus_might_hold(freed.clone(), whole, task)
    }

    /// Every non-empty holding, in node and class order: two indexes of the same tasks compare
    /// equal (checked in debug builds against the task table).
    pub fn normalized(&self) -> Vec<(usize, i64, Held)> {
        let mut all: Vec<(usize, i64, Held)> = Vec::new();
        for (node, classes) in self.nodes.iter().enumerate() {
            for (class, held) in classes {
                let mut held = held.clone();
                while held.gpus.last() == Some(&0) {
                    held.gpus.pop();
                }
                if held != Held::default() {
                    all.push((node, *class, held));
                }
            }
        }
        all.sort_unstable();
        all
    }

    fn held_mut(&mut self, class: i64, node: NodeIdx) -> &mut Held {
        let at = node.0 as usize;
        if self.nodes.len() <= at {
            self.nodes.resize_with(at + 1, Vec::new);
        }
        let classes = &mut self.nodes[at];
        let slot = match classes.iter().position(|(c, _)| *c == class) {
            Some(slot) => slot,
            None => {
                classes.push((class, Held::default()));
                classes.len() - 1
            }
        };
        &mut classes[slot].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Cluster, Freeing, NodeShare};
    use crate::model::NodeSpec;

    #[test]
    fn a_node_might_hold_a_task_only_with_the_classes_counted_released() {
        let mut cluster = Cluster::default();
        let mut spec = NodeSpec::new("a", 2, "H100");
        spec.cpu_milli = 16_000;
        let a = cluster.add_node(spec);
        let share = |gpu: u32, milli: u32| Placement {
            shares: vec![NodeShare {
                node: a,
                gpus: vec![(gpu, milli)],
                cpu_milli: 4_000,
                ..NodeShare::default()
            }],
        };
        // GPU 0 whole to class 0; GPU 1 split between classes 0 and 1.
        let (whole, half, other) = (share(0, WHOLE_GPU_MILLI), share(1, 500), share(1, 500));
        let mut running = vec![(0, whole), (0, half), (1, other)];
        let mut held = Reclaimable::default();
        for (class, p) in &running {
            cluster.allocate(p);
            held.enter(*class, p);
        }
        let two = TaskSpec::new(1, "t", 2);
        let might = |cluster: &Cluster,
                     held: &Reclaimable,
                     running: &[(i64, Placement)],
                     counts: &dyn Fn(i64) -> bool| {
            let by_sums = held.might_hold(cluster.node(a), a, counts, &two);
            // The same answer as releasing the counted tasks' shares one by one.
            let mut freeing = Freeing::new(cluster.node(a));
            for (_, p) in running.iter().filter(|(class, _)| counts(*class)) {
                freeing.release(&p.shares[0]);
            }
            assert_eq!(by_sums, freeing.might_hold(&two));
            by_sums
        };
        assert!(
            !might(&cluster, &held, &running, &|c| c == 0),
            "class 1 still holds half of GPU 1"
        );
        assert!(might(&cluster, &held, &running, &|_| true));
        let (class, other) = running.pop().unwrap();
        held.remove(class, &other);
        cluster.release(&other);
        assert!(
            might(&cluster, &held, &running, &|c| c == 0),
            "what class 1 held is gone"
        );
        assert!(!might(&cluster, &held, &running, &|_| false));
    }
}
