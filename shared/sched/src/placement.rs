//! Where a task fits: best fit on one node, whole nodes for tasks larger than a node, the
//! tightest GPU for a fraction.
//!
//! Best fit (the node with the fewest free GPUs that still fits, ties to the lowest index) keeps
//! large holes open for large tasks; it is the reference placement of DESIGN.md and the
//! baseline every smarter placement is measured against.

use crate::cluster::{Cluster, NodeShare, NodeState, Placement};
use crate::model::{NodeIdx, TaskSpec, WHOLE_GPU_MILLI};

/// The best-fit placement for `task` on the cluster as it is, if there is one.
pub fn best_fit(cluster: &Cluster, task: &TaskSpec) -> Option<Placement> {
    if task.gpus == 0 {
        return cpu_only(cluster, task);
    }
    if task.gpus == 1 && task.gpu_milli < WHOLE_GPU_MILLI {
        return fraction(cluster, task);
    }
    let models: Vec<&str> = cluster.models().filter(|m| task.accepts(m)).collect();
    // One node, fewest free GPUs that still fit, lowest index.
    let mut best: Option<(u32, NodeIdx)> = None;
    for model in &models {
        for free in task.gpus..=cluster.max_gpus(model) {
            if best.is_some_and(|(f, _)| f < free) {
                break;
            }
            let hit = cluster
                .nodes_with_free(model, free)
                .find(|idx| fits_host(cluster.node(*idx), task));
            if let Some(idx) = hit {
                if best.is_none_or(|b| (free, idx) < b) {
                    best = Some((free, idx));
                }
                break;
            }
        }
    }
    if let Some((_, idx)) = best {
        let gpus = cluster.node(idx).free_gpus(task.gpus);
        return Some(Placement {
            shares: vec![share(idx, gpus, task)],
        });
    }
    // Larger than a node: whole idle nodes of one model, lowest indices.
    for model in &models {
        let per_node = cluster.max_gpus(model);
        if per_node == 0 || task.gpus <= per_node {
            continue;
        }
        let needed = task.gpus.div_ceil(per_node) as usize;
        let idle: Vec<NodeIdx> = cluster
            .nodes_with_free(model, per_node)
            .filter(|idx| fits_host(cluster.node(*idx), task))
            .take(needed)
            .collect();
        if idle.len() == needed {
            return Some(Placement {
                shares: idle
                    .into_iter()
                    .map(|idx| {
                        share(
                            idx,
                            (0..per_node).map(|g| (g, WHOLE_GPU_MILLI)).collect(),
                            task,
                        )
                    })
                    .collect(),
            });
        }
    }
    None
}

/// The GPU whose free share is the smallest that still holds the fraction.
fn fraction(cluster: &Cluster, task: &TaskSpec) -> Option<Placement> {
    let mut best: Option<(u32, NodeIdx, u32)> = None;
    for (i, node) in cluster.nodes().iter().enumerate() {
        if !node.schedulable || !task.accepts(&node.spec.gpu_model) || !fits_host(node, task) {
            continue;
        }
        for (g, free) in node.gpu_free.iter().enumerate() {
            if *free >= task.gpu_milli && best.is_none_or(|(f, _, _)| *free < f) {
                best = Some((*free, NodeIdx(i as u32), g as u32));
            }
        }
    }
    best.map(|(_, idx, gpu)| Placement {
        shares: vec![share(idx, vec![(gpu, task.gpu_milli)], task)],
    })
}

/// A CPU-only task: the lowest-indexed node with room.
fn cpu_only(cluster: &Cluster, task: &TaskSpec) -> Option<Placement> {
    cluster
        .nodes()
        .iter()
        .enumerate()
        .find(|(_, n)| n.schedulable && fits_host(n, task))
        .map(|(i, _)| Placement {
            shares: vec![share(NodeIdx(i as u32), Vec::new(), task)],
        })
}

/// CPU and memory, where the node tracks them.
fn fits_host(node: &NodeState, task: &TaskSpec) -> bool {
    (node.spec.cpu_milli == 0 || node.free_cpu >= task.cpu_milli)
        && (node.spec.memory_mib == 0 || node.free_memory >= task.memory_mib)
}

fn share(node: NodeIdx, gpus: Vec<(u32, u32)>, task: &TaskSpec) -> NodeShare {
    NodeShare {
        node,
        gpus,
        cpu_milli: task.cpu_milli,
        memory_mib: task.memory_mib,
    }
}
