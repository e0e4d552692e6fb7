//! Where a task fits: best fit on one node; topology-aware whole nodes for tasks larger than a
//! node; the tightest GPU for a fraction; the fullest node for a MIG instance.
//!
//! Best fit (the node with the fewest free GPUs that still fits, ties to the lowest index) keeps
//! large holes open for large tasks; it is the reference placement of DESIGN.md and the
//! baseline every smarter placement is measured against.
//!
//! A task larger than a node takes whole idle nodes, as close together as they can be: inside
//! one NVLink domain if one has enough idle nodes (the one with the fewest that suffice), else
//! inside one rack (likewise), else the lowest-indexed idle nodes anywhere.
//!
//! **Auto-tiering**: where GPU models have costs ([`crate::NodeSpec::gpu_cost`]), a task that
//! accepts several models is placed on the cheapest that fits — best fit within that model —
//! and only goes up a tier when no cheaper model has room. Without costs every model is one
//! tier and best fit looks across all of them.
//!
//! Every function takes a `within` filter so that a gang can be confined to one node, one
//! NVLink domain or one rack (see the scheduler's gang placement).

use std::collections::BTreeMap;

use crate::cluster::{Cluster, Model, NodeShare, NodeState, Placement};
use crate::model::{NodeIdx, NodeSpec, TaskSpec, WHOLE_GPU_MILLI};

/// A filter on nodes: which may be used.
pub type Within<'a> = &'a dyn Fn(NodeIdx) -> bool;

/// The best-fit placement for `task` on the cluster as it is, if there is one.
pub fn best_fit(cluster: &Cluster, task: &TaskSpec) -> Option<Placement> {
    best_fit_within(cluster, task, &|_| true)
}

/// [`best_fit`] on the nodes `within` accepts.
pub fn best_fit_within(
    cluster: &Cluster,
    task: &TaskSpec,
    within: Within<'_>,
) -> Option<Placement> {
    if task.mig_profile.is_some() {
        return mig(cluster, task, within);
    }
    if task.gpus == 0 {
        return cpu_only(cluster, task, within);
    }
    if task.gpus == 1 && task.gpu_milli < WHOLE_GPU_MILLI {
        return fraction(cluster, task, within);
    }
    let models: Vec<Model<'_>> = cluster.models().filter(|m| task.accepts(m.name)).collect();
    let usable = |idx: NodeIdx| {
        within(idx)
            && fits_host(cluster.node(idx), task)
            && fits_gpu_memory(cluster.node(idx), task)
    };
    // One node, cheapest tier first, fewest free GPUs that still fit, lowest index.
    let mut best: Option<(u64, u32, NodeIdx)> = None;
    for model in &models {
        let cost = cluster.model_cost(*model);
        if best.is_some_and(|(c, _, _)| c < cost) {
            break;
        }
        for free in task.gpus..=cluster.max_gpus(*model) {
            if best.is_some_and(|(_, f, _)| f < free) {
                break;
            }
            if let Some(idx) = cluster
                .nodes_with_free(*model, free)
                .find(|idx| usable(*idx))
            {
                if best.is_none_or(|b| (cost, free, idx) < b) {
                    best = Some((cost, free, idx));
                }
                break;
            }
        }
    }
    if let Some((_, _, idx)) = best {
        let node = cluster.node(idx);
        return Some(Placement {
            shares: vec![whole(node, idx, node.free_gpus(task.gpus), task)],
        });
    }
    // Larger than a node: whole idle nodes of one model, as close together as possible.
    for model in &models {
        let per_node = cluster.max_gpus(*model);
        if per_node == 0 || task.gpus <= per_node {
            continue;
        }
        let needed = task.gpus.div_ceil(per_node) as usize;
        let idle: Vec<NodeIdx> = cluster
            .nodes_with_free(*model, per_node)
            .filter(|idx| usable(*idx))
            .collect();
        if idle.len() < needed {
            continue;
        }
        let chosen = closest(cluster, &idle, needed);
        return Some(Placement {
            shares: chosen
                .into_iter()
                .map(|idx| {
                    let node = cluster.node(idx);
                    whole(node, idx, node.free_gpus(per_node), task)
                })
                .collect(),
        });
    }
    None
}

/// `needed` of the `idle` nodes (sorted by index), in one NVLink domain if possible, else in
/// one rack, else the first ones.
fn closest(cluster: &Cluster, idle: &[NodeIdx], needed: usize) -> Vec<NodeIdx> {
    for level in [Level::NvlinkDomain, Level::Rack] {
        let mut groups: BTreeMap<&str, Vec<NodeIdx>> = BTreeMap::new();
        for idx in idle {
            if let Some(key) = level.key(cluster.node(*idx)) {
                groups.entry(key).or_default().push(*idx);
            }
        }
        // The tightest group that suffices; ties to the one holding the lowest index.
        if let Some(group) = groups
            .into_values()
            .filter(|g| g.len() >= needed)
            .min_by_key(|g| (g.len(), g[0]))
        {
            return group[..needed].to_vec();
        }
    }
    idle[..needed].to_vec()
}

/// A level of the topology, from the tightest to the loosest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// One node.
    Node,
    /// One NVLink domain.
    NvlinkDomain,
    /// One rack.
    Rack,
    /// Anywhere in the pool.
    Pool,
}

impl Level {
    /// From the tightest to the loosest.
    pub const ALL: [Level; 4] = [Level::Node, Level::NvlinkDomain, Level::Rack, Level::Pool];

    /// The group `node` belongs to at this level (`None`: the level is unknown for the node,
    /// e.g. no rack declared).
    pub fn key<'a>(&self, node: &'a NodeState) -> Option<&'a str> {
        match self {
            Self::Node => Some(&node.spec.name),
            Self::NvlinkDomain => Some(node.nvlink_domain()),
            Self::Rack => (!node.spec.rack.is_empty()).then_some(node.spec.rack.as_str()),
            Self::Pool => Some(""),
        }
    }

    /// Its name in explanations.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Node => "one node",
            Self::NvlinkDomain => "one NVLink domain",
            Self::Rack => "one rack",
            Self::Pool => "the pool",
        }
    }
}

/// The GPU whose free share is the smallest that still holds the fraction (and its memory).
fn fraction(cluster: &Cluster, task: &TaskSpec, within: Within<'_>) -> Option<Placement> {
    let mut best: Option<((u64, u32), NodeIdx, u32)> = None;
    for (i, node) in cluster.nodes().iter().enumerate() {
        let idx = NodeIdx(i as u32);
        if !node.schedulable
            || !task.accepts(&node.spec.gpu_model)
            || !fits_host(node, task)
            || !within(idx)
        {
            continue;
        }
        let cost = cluster.node_cost(node);
        for (g, free) in node.gpu_free.iter().enumerate() {
            if node.gpu_fits(g, task.gpu_milli, task.gpu_memory_mib)
                && best.is_none_or(|(f, _, _)| (cost, *free) < f)
            {
                best = Some(((cost, *free), idx, g as u32));
            }
        }
    }
    best.map(|(_, idx, gpu)| Placement {
        shares: vec![NodeShare {
            gpus: vec![(gpu, task.gpu_milli)],
            gpu_memory_mib: task.gpu_memory_mib,
            ..host(idx, task)
        }],
    })
}

/// A MIG instance of the task's profile on the node with the fewest such instances free (so
/// partly used GPUs fill up first), ties to the lowest index.
fn mig(cluster: &Cluster, task: &TaskSpec, within: Within<'_>) -> Option<Placement> {
    let profile = task.mig_profile.as_deref()?;
    let mut best: Option<(u32, NodeIdx)> = None;
    for (i, node) in cluster.nodes().iter().enumerate() {
        let idx = NodeIdx(i as u32);
        let free = node.mig_free.get(profile).copied().unwrap_or(0);
        if free == 0
            || !node.schedulable
            || !task.accepts(&node.spec.gpu_model)
            || !fits_host(node, task)
            || !within(idx)
        {
            continue;
        }
        if best.is_none_or(|(f, _)| free < f) {
            best = Some((free, idx));
        }
    }
    best.map(|(_, idx)| Placement {
        shares: vec![NodeShare {
            mig: Some(profile.to_owned()),
            ..host(idx, task)
        }],
    })
}

/// A CPU-only task: the lowest-indexed node with room.
fn cpu_only(cluster: &Cluster, task: &TaskSpec, within: Within<'_>) -> Option<Placement> {
    cluster
        .nodes()
        .iter()
        .enumerate()
        .find(|(i, n)| n.schedulable && fits_host(n, task) && within(NodeIdx(*i as u32)))
        .map(|(i, _)| Placement {
            shares: vec![host(NodeIdx(i as u32), task)],
        })
}

/// CPU and memory, where the node tracks them.
pub fn fits_host(node: &NodeState, task: &TaskSpec) -> bool {
    host_room(&node.spec, node.free_cpu, node.free_memory, task)
}

/// Whether a node declared as `spec`, with this CPU and memory free, has the task's CPU and
/// memory (a node that does not track one has all of it).
pub fn host_room(spec: &NodeSpec, free_cpu: u64, free_memory: u64, task: &TaskSpec) -> bool {
    (spec.cpu_milli == 0 || free_cpu >= task.cpu_milli)
        && (spec.memory_mib == 0 || free_memory >= task.memory_mib)
}

/// Whether the node's GPUs have as much memory as the task asks of each.
pub fn fits_gpu_memory(node: &NodeState, task: &TaskSpec) -> bool {
    node.spec.gpu_memory_mib == 0 || node.spec.gpu_memory_mib >= task.gpu_memory_mib
}

/// The task's CPU and memory on node `idx`, no GPU.
pub fn host(node: NodeIdx, task: &TaskSpec) -> NodeShare {
    NodeShare {
        node,
        cpu_milli: task.cpu_milli,
        memory_mib: task.memory_mib,
        ..NodeShare::default()
    }
}

/// Whole GPUs `gpus` of `node` for the task (with all their memory), and its CPU and memory.
pub fn whole(node: &NodeState, idx: NodeIdx, gpus: Vec<(u32, u32)>, task: &TaskSpec) -> NodeShare {
    NodeShare {
        gpus,
        gpu_memory_mib: node.spec.gpu_memory_mib,
        ..host(idx, task)
    }
}
