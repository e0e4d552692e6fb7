//! The live cluster view: every node's free capacity, kept current by applying grants and
//! releases (never rebuilt per decision), with an index that makes best-fit placement cheap.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use rustc_hash::FxHashMap as HashMap;

use crate::model::{NodeIdx, NodeSpec, WHOLE_GPU_MILLI};

/// One node's state.
#[derive(Debug, Clone)]
pub struct NodeState {
    /// As it joined.
    pub spec: NodeSpec,
    /// Free milli-GPU of each GPU, by GPU index.
    pub gpu_free: Vec<u32>,
    /// Free memory of each GPU, MiB (all zero when the node does not track GPU memory).
    pub gpu_memory_free: Vec<u64>,
    /// Free MIG instances, by profile.
    pub mig_free: BTreeMap<String, u32>,
    /// GPUs entirely free.
    pub free_whole: u32,
    /// Free CPU, millicores.
    pub free_cpu: u64,
    /// Free memory, MiB.
    pub free_memory: u64,
    /// False when cordoned or unhealthy: nothing new is placed here.
    pub schedulable: bool,
    /// GPUs out of service, by GPU index: such a GPU shows no free capacity, so nothing is
    /// placed on it, and it counts in no capacity.
    pub gpu_out: Vec<bool>,
    /// Where the cluster keeps what it knows of the node's GPU model.
    model: usize,
    /// Free milli-GPU per GPU, largest first (kept on every change).
    free_desc: Vec<u32>,
    /// A hash of `free_desc` and [`NodeState::host_free`] (kept with them).
    state_hash: u64,
    /// Free milli-GPU of all its GPUs together (kept with `free_desc`).
    free_milli: u64,
}

impl NodeState {
    /// The first `n` entirely free GPUs, lowest index first, each taken whole.
    pub fn free_gpus(&self, n: u32) -> Vec<(u32, u32)> {
        self.gpu_free
            .iter()
            .enumerate()
            .filter(|(_, free)| **free == WHOLE_GPU_MILLI)
            .take(n as usize)
            .map(|(i, _)| (i as u32, WHOLE_GPU_MILLI))
            .collect()
    }

    /// Whether the node might hold `task` on its own as it is now: an accepted model and the
    /// GPUs its request needs free. Necessary for any one-node placement, not sufficient (CPU,
    /// memory and the policy's own rules come on top): a node where it fails need not be tried.
    pub fn might_hold(&self, task: &crate::model::TaskSpec) -> bool {
        task.accepts(&self.spec.gpu_model)
            && gpus_might_hold(self.gpu_free.iter().copied(), || self.free_whole, task)
    }

    /// Whether nothing runs on the node's GPUs.
    pub fn is_idle(&self) -> bool {
        self.free_whole as usize + self.gpu_out.iter().filter(|out| **out).count()
            == self.spec.gpus as usize
    }

    /// Whether GPU `gpu` has `milli` milli-GPU and `memory_mib` of memory free (memory is only
    /// checked where the node tracks it).
    pub fn gpu_fits(&self, gpu: usize, milli: u32, memory_mib: u64) -> bool {
        self.gpu_free[gpu] >= milli
            && (self.spec.gpu_memory_mib == 0 || self.gpu_memory_free[gpu] >= memory_mib)
    }

    /// Free milli-GPU per GPU, largest first: the node's free shape, which is what packing
    /// policies compare (two nodes with equal shapes and host room lose the same by a
    /// placement).
    pub fn free_desc(&self) -> &[u32] {
        &self.free_desc
    }

    /// A hash of the free shape and the host room: nodes equal in both hash equally, so a
    /// policy that evaluates each distinct state once need not hash the node itself.
    pub fn state_hash(&self) -> u64 {
        self.state_hash
    }

    /// Free milli-GPU of all the node's GPUs together.
    pub fn free_milli(&self) -> u64 {
        self.free_milli
    }

    /// Free CPU (millicores) and memory (MiB); a node that does not track one has all of it.
    pub fn host_free(&self) -> (u64, u64) {
        let cpu = if self.spec.cpu_milli == 0 {
            u64::MAX
        } else {
            self.free_cpu
        };
        let memory = if self.spec.memory_mib == 0 {
            u64::MAX
        } else {
            self.free_memory
        };
        (cpu, memory)
    }

    /// Recomputes the free shape and its hash after a change.
    fn refresh(&mut self) {
        self.free_desc.clear();
        self.free_desc.extend_from_slice(&self.gpu_free);
        self.free_desc.sort_unstable_by(|a, b| b.cmp(a));
        self.free_milli = self.free_desc.iter().map(|f| u64::from(*f)).sum();
        let mut hasher = rustc_hash::FxHasher::default();
        self.free_desc.hash(&mut hasher);
        self.host_free().hash(&mut hasher);
        self.state_hash = hasher.finish();
    }

    /// The NVLink domain the node is in: its own name when it declares none.
    pub fn nvlink_domain(&self) -> &str {
        if self.spec.nvlink_domain.is_empty() {
            &self.spec.name
        } else {
            &self.spec.nvlink_domain
        }
    }
}

/// Whether GPUs with these free shares (a GPU out of service shows none) might hold `task`'s
/// GPU request on one node; `whole` counts the entirely free ones, asked only for whole GPUs.
pub(crate) fn gpus_might_hold(
    mut free: impl Iterator<Item = u32>,
    whole: impl FnOnce() -> u32,
    task: &crate::model::TaskSpec,
) -> bool {
    match task.gpus {
        0 => true,
        1 if task.gpu_milli < WHOLE_GPU_MILLI => free.any(|f| f >= task.gpu_milli),
        n => whole() >= n,
    }
}

/// A node as it would be if some of what runs there were released, without touching the
/// cluster: a preemption search asks it which nodes its victims could ever make room on.
#[derive(Debug, Clone)]
pub struct Freeing<'c> {
    node: &'c NodeState,
    gpu_free: Vec<u32>,
    free_cpu: u64,
    free_memory: u64,
}

impl<'c> Freeing<'c> {
    /// The node as it is.
    pub fn new(node: &'c NodeState) -> Self {
        Self {
            node,
            gpu_free: node.gpu_free.clone(),
            free_cpu: node.free_cpu,
            free_memory: node.free_memory,
        }
    }

    /// Releases `share` (of this node), as [`Cluster::release`] would.
    pub fn release(&mut self, share: &NodeShare) {
        let free = (&mut self.free_cpu, &mut self.free_memory);
        release_share(self.node, &mut self.gpu_free, free, share);
    }

    /// What would then be free on the node in all: milli-GPU, CPU (millicores) and memory
    /// (MiB), as [`NodeState::host_free`] counts them.
    pub fn room(&self) -> (u64, u64, u64) {
        let gpu = self.gpu_free.iter().map(|f| u64::from(*f)).sum();
        let cpu = if self.node.spec.cpu_milli == 0 {
            u64::MAX
        } else {
            self.free_cpu
        };
        let memory = if self.node.spec.memory_mib == 0 {
            u64::MAX
        } else {
            self.free_memory
        };
        (gpu, cpu, memory)
    }

    /// Whether the node might then hold `task` on its own: schedulable, an accepted model, the
    /// GPUs and the CPU and memory (where tracked) free. Necessary for any one-node placement,
    /// as [`NodeState::might_hold`] is.
    pub fn might_hold(&self, task: &crate::model::TaskSpec) -> bool {
        freed_might_hold(
            self.node,
            &self.gpu_free,
            self.free_cpu,
            self.free_memory,
            task,
        )
    }
}

/// [`Freeing::release`] of `share` on `node`, into its copies of the node's free GPUs and
/// free CPU and memory.
fn release_share(
    node: &NodeState,
    gpu_free: &mut [u32],
    (free_cpu, free_memory): (&mut u64, &mut u64),
    share: &NodeShare,
) {
    for (gpu, milli) in &share.gpus {
        if !node.gpu_out[*gpu as usize] {
            gpu_free[*gpu as usize] += milli;
        }
    }
    *free_cpu += share.cpu_milli;
    *free_memory += share.memory_mib;
}

/// [`Freeing::might_hold`] of `node` with `gpu_free`, `free_cpu` and `free_memory` then free.
fn freed_might_hold(
    node: &NodeState,
    gpu_free: &[u32],
    free_cpu: u64,
    free_memory: u64,
    task: &crate::model::TaskSpec,
) -> bool {
    let free = gpu_free.iter().copied();
    let whole = || free.clone().filter(|f| *f == WHOLE_GPU_MILLI).count() as u32;
    node.schedulable
        && task.accepts(&node.spec.gpu_model)
        && crate::placement::host_room(&node.spec, free_cpu, free_memory, task)
        && gpus_might_hold(free.clone(), whole, task)
}

/// Every node of a cluster as it would be if some of what runs there were released: a
/// [`Freeing`] per node a release touches, kept in flat arrays (a search releases hundreds of
/// victims over as many nodes). It borrows nothing: each call is handed the cluster it was
/// made from, as it was then (what is released and given back in between does not count), so
/// a search may try placements on the cluster while it keeps one.
#[derive(Debug)]
pub struct FreeingNodes {
    /// Per node, where its state is in `touched` (`u32::MAX`: untouched).
    slot: Vec<u32>,
    /// The nodes touched: index, where their GPUs start in `gpu_free`, free CPU and memory.
    touched: Vec<(NodeIdx, usize, u64, u64)>,
    gpu_free: Vec<u32>,
}

impl FreeingNodes {
    /// `cluster`'s nodes as they are.
    pub fn new(cluster: &Cluster) -> Self {
        Self {
            slot: vec![u32::MAX; cluster.nodes.len()],
            touched: Vec::new(),
            gpu_free: Vec::new(),
        }
    }

    /// Releases `share`, as [`Freeing::release`] would on its node of `cluster`.
    pub fn release(&mut self, cluster: &Cluster, share: &NodeShare) {
        let at = share.node.0 as usize;
        let node = &cluster.nodes[at];
        if self.slot[at] == u32::MAX {
            self.slot[at] = self.touched.len() as u32;
            self.touched.push((
                share.node,
                self.gpu_free.len(),
                node.free_cpu,
                node.free_memory,
            ));
            self.gpu_free.extend_from_slice(&node.gpu_free);
        }
        let (_, start, cpu, memory) = &mut self.touched[self.slot[at] as usize];
        let gpus = &mut self.gpu_free[*start..*start + node.gpu_free.len()];
        release_share(node, gpus, (cpu, memory), share);
    }

    /// Whether node `idx` of `cluster` might then hold `task` ([`Freeing::might_hold`]); an
    /// untouched node is `false`.
    pub fn might_hold_on(
        &self,
        cluster: &Cluster,
        idx: NodeIdx,
        task: &crate::model::TaskSpec,
    ) -> bool {
        let Some(&(_, start, cpu, memory)) = self.touched.get(self.slot[idx.0 as usize] as usize)
        else {
            return false;
        };
        let node = &cluster.nodes[idx.0 as usize];
        freed_might_hold(
            node,
            &self.gpu_free[start..start + node.gpu_free.len()],
            cpu,
            memory,
            task,
        )
    }

    /// Per node of `cluster`, whether it might then hold `task` ([`Freeing::might_hold`]); an
    /// untouched node is `false`.
    pub fn might_hold(&self, cluster: &Cluster, task: &crate::model::TaskSpec) -> Vec<bool> {
        let mut out = vec![false; self.slot.len()];
        for &(idx, ..) in &self.touched {
            out[idx.0 as usize] = self.might_hold_on(cluster, idx, task);
        }
        out
    }
}

/// A task's share of one node: which GPUs, and how much of each.
#[derive(
    Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct NodeShare {
    /// The node.
    pub node: NodeIdx,
    /// `(gpu index, milli-GPU)` pairs.
    pub gpus: Vec<(u32, u32)>,
    /// GPU memory taken on each of those GPUs, MiB (a whole GPU's share takes all of it).
    pub gpu_memory_mib: u64,
    /// A MIG instance of this profile, for MIG tasks (which take no whole GPU).
    pub mig: Option<String>,
    /// CPU, millicores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
}

/// Where a task runs: one share per node it spans.
#[derive(
    Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct Placement {
    /// Shares, by node.
    pub shares: Vec<NodeShare>,
}

impl Placement {
    /// Milli-GPU held.
    pub fn gpu_milli(&self) -> u64 {
        self.shares
            .iter()
            .flat_map(|s| &s.gpus)
            .map(|(_, m)| u64::from(*m))
            .sum()
    }
}

/// A GPU model of the cluster, as placement walks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Model<'c> {
    /// Its name, as its nodes declare it.
    pub name: &'c str,
    /// Where the cluster keeps what it knows of it.
    id: usize,
}

/// The cluster.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    nodes: Vec<NodeState>,
    by_name: HashMap<String, NodeIdx>,
    /// GPU models by the order they first joined (what a node's `model` and `Model::id`
    /// index): their names, and each one's id by name.
    model_names: Vec<String>,
    model_ids: HashMap<String, usize>,
    /// Per GPU model, schedulable nodes bucketed by their number of entirely free GPUs.
    buckets: Vec<Vec<BTreeSet<NodeIdx>>>,
    /// GPU models present, cheapest first, then by name (asked for on every placement).
    models: Vec<usize>,
    /// Cost per GPU-hour of each model (the highest its nodes declare; 0: unknown).
    model_cost: Vec<u64>,
    /// The most GPUs that a node of every model with GPUs has (asked for on every failed
    /// placement); `None` while no node has a GPU.
    one_node_gpus: Option<u32>,
    capacity_milli: u64,
    allocated_milli: u64,
    free_milli: u64,
    /// While kept ([`Cluster::log_changes`]): every node changed since, in order, once per
    /// change.
    changes: Option<Vec<NodeIdx>>,
}

impl Cluster {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a node (schedulable, all free); returns its index.
    pub fn add_node(&mut self, spec: NodeSpec) -> NodeIdx {
        let idx = NodeIdx(self.nodes.len() as u32);
        self.by_name.insert(spec.name.clone(), idx);
        self.capacity_milli += u64::from(spec.gpus) * u64::from(WHOLE_GPU_MILLI);
        self.free_milli += u64::from(spec.gpus) * u64::from(WHOLE_GPU_MILLI);
        let model = match self.model_ids.get(&spec.gpu_model) {
            Some(model) => *model,
            None => {
                let model = self.model_names.len();
                self.model_ids.insert(spec.gpu_model.clone(), model);
                self.model_names.push(spec.gpu_model.clone());
                self.model_cost.push(0);
                self.buckets.push(Vec::new());
                self.models.push(model);
                model
            }
        };
        let state = NodeState {
            model,
            gpu_free: vec![WHOLE_GPU_MILLI; spec.gpus as usize],
            gpu_memory_free: vec![spec.gpu_memory_mib; spec.gpus as usize],
            mig_free: spec.mig.clone(),
            free_whole: spec.gpus,
            free_cpu: spec.cpu_milli,
            free_memory: spec.memory_mib,
            schedulable: true,
            gpu_out: vec![false; spec.gpus as usize],
            free_desc: Vec::new(),
            state_hash: 0,
            free_milli: 0,
            spec,
        };
        let cost = &mut self.model_cost[model];
        *cost = (*cost).max(state.spec.gpu_cost);
        let (costs, names) = (&self.model_cost, &self.model_names);
        self.models
            .sort_unstable_by_key(|m| (costs[*m], names[*m].as_str()));
        self.nodes.push(state);
        self.index(idx);
        // Models without GPUs (CPU-only nodes) hold no GPU task, so they never make one span.
        self.one_node_gpus = self
            .models()
            .map(|m| self.max_gpus(m))
            .filter(|gpus| *gpus > 0)
            .min();
        idx
    }

    /// All nodes, by index.
    pub fn nodes(&self) -> &[NodeState] {
        &self.nodes
    }

    /// One node.
    pub fn node(&self, idx: NodeIdx) -> &NodeState {
        &self.nodes[idx.0 as usize]
    }

    /// A node's index by name.
    pub fn find(&self, name: &str) -> Option<NodeIdx> {
        self.by_name.get(name).copied()
    }

    /// Total GPU capacity of schedulable nodes, milli-GPU.
    pub fn capacity_milli(&self) -> u64 {
        self.capacity_milli
    }

    /// Milli-GPU currently granted.
    pub fn allocated_milli(&self) -> u64 {
        self.allocated_milli
    }

    /// Milli-GPU free on schedulable nodes (work still running on a cordoned node counts
    /// against nothing).
    pub fn free_milli(&self) -> u64 {
        self.free_milli
    }

    /// Marks a node (un)schedulable: cordoned or unhealthy nodes take nothing new.
    pub fn set_schedulable(&mut self, idx: NodeIdx, schedulable: bool) {
        let was = self.nodes[idx.0 as usize].schedulable;
        if was == schedulable {
            return;
        }
        self.unindex(idx);
        let node = &self.nodes[idx.0 as usize];
        let in_service = node.gpu_out.iter().filter(|out| !**out).count() as u64;
        let gpus = in_service * u64::from(WHOLE_GPU_MILLI);
        self.nodes[idx.0 as usize].schedulable = schedulable;
        let free: u64 = self.nodes[idx.0 as usize]
            .gpu_free
            .iter()
            .map(|f| u64::from(*f))
            .sum();
        if schedulable {
            self.capacity_milli += gpus;
            self.free_milli += free;
        } else {
            self.capacity_milli -= gpus;
            self.free_milli -= free;
        }
        self.index(idx);
    }

    /// Takes GPU `gpu` of a node out of service (`in_service: false`) or returns it; whether
    /// anything changed. Out of service, the GPU shows no free capacity (nothing is placed on
    /// it) and leaves the capacity; the caller first moves off whatever holds it.
    pub fn set_gpu_in_service(&mut self, idx: NodeIdx, gpu: u32, in_service: bool) -> bool {
        let node = &self.nodes[idx.0 as usize];
        let g = gpu as usize;
        if g >= node.gpu_out.len() || node.gpu_out[g] != in_service {
            return false;
        }
        self.unindex(idx);
        let node = &mut self.nodes[idx.0 as usize];
        let whole = u64::from(WHOLE_GPU_MILLI);
        if in_service {
            node.gpu_out[g] = false;
            node.gpu_free[g] = WHOLE_GPU_MILLI;
            node.gpu_memory_free[g] = node.spec.gpu_memory_mib;
            node.free_whole += 1;
            if node.schedulable {
                self.capacity_milli += whole;
                self.free_milli += whole;
            }
        } else {
            debug_assert_eq!(node.gpu_free[g], WHOLE_GPU_MILLI, "GPU taken while held");
            let free = node.gpu_free[g];
            if free == WHOLE_GPU_MILLI {
                node.free_whole -= 1;
            }
            node.gpu_out[g] = true;
            node.gpu_free[g] = 0;
            node.gpu_memory_free[g] = 0;
            if node.schedulable {
                self.capacity_milli -= whole;
                self.free_milli -= u64::from(free);
            }
        }
        self.index(idx);
        true
    }

    /// Schedulable nodes of `model` with exactly `free` entirely free GPUs, lowest index first.
    pub fn nodes_with_free(
        &self,
        model: Model<'_>,
        free: u32,
    ) -> impl Iterator<Item = NodeIdx> + '_ {
        self.buckets[model.id]
            .get(free as usize)
            .into_iter()
            .flat_map(|set| set.iter().copied())
    }

    /// GPU models present, cheapest first, then by name.
    pub fn models(&self) -> impl Iterator<Item = Model<'_>> + '_ {
        self.models.iter().map(|id| Model {
            name: &self.model_names[*id],
            id: *id,
        })
    }

    /// A model's cost per GPU-hour (0: unknown).
    pub fn model_cost(&self, model: Model<'_>) -> u64 {
        self.model_cost[model.id]
    }

    /// The cost per GPU-hour of a node's model (0: unknown).
    pub fn node_cost(&self, node: &NodeState) -> u64 {
        self.model_cost[node.model]
    }

    /// The largest GPU count of any node of `model`.
    pub fn max_gpus(&self, model: Model<'_>) -> u32 {
        self.buckets[model.id].len().saturating_sub(1) as u32
    }

    /// The most GPUs that a node of every model with GPUs has: a task asking for no more (and
    /// for no MIG instance) is placed on one node, whatever model it ends up on. With no GPU
    /// at all, any number.
    pub fn one_node_gpus(&self) -> u32 {
        self.one_node_gpus.unwrap_or(u32::MAX)
    }

    /// Takes the resources of `placement`.
    pub fn allocate(&mut self, placement: &Placement) {
        for share in &placement.shares {
            self.unindex(share.node);
            let node = &mut self.nodes[share.node.0 as usize];
            for (gpu, milli) in &share.gpus {
                let free = &mut node.gpu_free[*gpu as usize];
                debug_assert!(*free >= *milli, "GPU granted twice");
                if *free == WHOLE_GPU_MILLI {
                    node.free_whole -= 1;
                }
                *free -= milli;
                let memory = &mut node.gpu_memory_free[*gpu as usize];
                *memory = memory.saturating_sub(share.gpu_memory_mib);
                self.allocated_milli += u64::from(*milli);
                if node.schedulable {
                    self.free_milli -= u64::from(*milli);
                }
            }
            if let Some(profile) = &share.mig
                && let Some(free) = node.mig_free.get_mut(profile)
            {
                debug_assert!(*free > 0, "MIG instance granted twice");
                *free -= 1;
            }
            node.free_cpu = node.free_cpu.saturating_sub(share.cpu_milli);
            node.free_memory = node.free_memory.saturating_sub(share.memory_mib);
            self.index(share.node);
        }
    }

    /// Gives back the resources of `placement`.
    pub fn release(&mut self, placement: &Placement) {
        for share in &placement.shares {
            self.unindex(share.node);
            let node = &mut self.nodes[share.node.0 as usize];
            for (gpu, milli) in &share.gpus {
                self.allocated_milli -= u64::from(*milli);
                if node.gpu_out[*gpu as usize] {
                    // Out of service since: it stays without free capacity.
                    continue;
                }
                let free = &mut node.gpu_free[*gpu as usize];
                *free += milli;
                debug_assert!(*free <= WHOLE_GPU_MILLI, "GPU released twice");
                if *free == WHOLE_GPU_MILLI {
                    node.free_whole += 1;
                }
                let memory = &mut node.gpu_memory_free[*gpu as usize];
                *memory = (*memory + share.gpu_memory_mib).min(node.spec.gpu_memory_mib);
                if node.schedulable {
                    self.free_milli += u64::from(*milli);
                }
            }
            if let Some(profile) = &share.mig
                && let Some(free) = node.mig_free.get_mut(profile)
            {
                *free += 1;
            }
            node.free_cpu += share.cpu_milli;
            node.free_memory += share.memory_mib;
            self.index(share.node);
        }
    }

    /// Starts (`true`, empty) or stops keeping the log of changed nodes: what lets a placer
    /// that ranked the cluster once look again only where it changed (see
    /// [`crate::policy::packing::Incremental`]).
    pub fn log_changes(&mut self, keep: bool) {
        self.changes = keep.then(Vec::new);
    }

    /// The nodes changed since the log was started, in order (a node once per change; empty
    /// while no log is kept).
    pub fn changes(&self) -> &[NodeIdx] {
        self.changes.as_deref().unwrap_or_default()
    }

    /// Forgets the changes logged after the first `mark` but those of `changed`: the caller
    /// has put every other node they name back exactly as it was at `mark` (a preemption
    /// search gives back what it released and did not keep), so no one who looked at the
    /// cluster then needs to look at those again.
    pub fn forget_changes_since(
        &mut self,
        mark: usize,
        changed: impl IntoIterator<Item = NodeIdx>,
    ) {
        if let Some(changes) = &mut self.changes {
            changes.truncate(mark);
            changes.extend(changed);
        }
    }

    /// Files the node under its entirely free GPUs, after every change to it (which is also
    /// when its free shape is brought up to date and the change logged).
    fn index(&mut self, idx: NodeIdx) {
        if let Some(changes) = &mut self.changes {
            changes.push(idx);
        }
        self.nodes[idx.0 as usize].refresh();
        let node = &self.nodes[idx.0 as usize];
        if !node.schedulable {
            return;
        }
        let buckets = &mut self.buckets[node.model];
        let size = node.spec.gpus as usize + 1;
        if buckets.len() < size {
            buckets.resize_with(size, BTreeSet::new);
        }
        buckets[node.free_whole as usize].insert(idx);
    }

    fn unindex(&mut self, idx: NodeIdx) {
        let node = &self.nodes[idx.0 as usize];
        if let Some(set) = self.buckets[node.model].get_mut(node.free_whole as usize) {
            set.remove(&idx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(node: NodeIdx, gpu: u32) -> Placement {
        Placement {
            shares: vec![NodeShare {
                node,
                gpus: vec![(gpu, WHOLE_GPU_MILLI)],
                ..NodeShare::default()
            }],
        }
    }

    #[test]
    fn freeing_many_nodes_at_once_answers_as_freeing_each_alone() {
        // Three nodes, every GPU taken but b's second, which is out of service (a share
        // naming it, released, gives it nothing).
        let mut cluster = Cluster::new();
        let nodes: Vec<NodeIdx> = ["a", "b", "c"]
            .iter()
            .map(|n| cluster.add_node(NodeSpec::new(*n, 2, "H100")))
            .collect();
        for node in &nodes {
            cluster.allocate(&share(*node, 0));
            cluster.allocate(&share(*node, 1));
        }
        cluster.release(&share(nodes[1], 1));
        assert!(cluster.set_gpu_in_service(nodes[1], 1, false));
        // Released: both of a's GPUs, both of b's (one out of service), c's first half of one.
        let mut half = share(nodes[2], 0);
        half.shares[0].gpus[0].1 = WHOLE_GPU_MILLI / 2;
        let released = [
            share(nodes[0], 0),
            share(nodes[0], 1),
            share(nodes[1], 0),
            share(nodes[1], 1),
            half,
        ];
        let mut many = FreeingNodes::new(&cluster);
        let mut each: Vec<Freeing<'_>> = nodes
            .iter()
            .map(|n| Freeing::new(cluster.node(*n)))
            .collect();
        for placement in &released {
            let s = &placement.shares[0];
            many.release(&cluster, s);
            each[s.node.0 as usize].release(s);
        }
        let tasks = [
            crate::model::TaskSpec::new(1, "t", 2),
            crate::model::TaskSpec::new(2, "t", 1),
            {
                let mut t = crate::model::TaskSpec::new(3, "t", 1);
                t.gpu_milli = WHOLE_GPU_MILLI / 2;
                t
            },
        ];
        for task in &tasks {
            let alone: Vec<bool> = each.iter().map(|f| f.might_hold(task)).collect();
            assert_eq!(many.might_hold(&cluster, task), alone, "task {}", task.id.0);
        }
        // a holds 2 GPUs again; b only 1 (its other is out of service); c only half of one.
        assert_eq!(many.might_hold(&cluster, &tasks[0]), [true, false, false]);
        assert_eq!(many.might_hold(&cluster, &tasks[2]), [true, true, true]);
    }

    #[test]
    fn the_change_log_names_each_change_while_kept_and_forgets_what_was_put_back() {
        let mut cluster = Cluster::new();
        let a = cluster.add_node(NodeSpec::new("a", 2, "H100"));
        let b = cluster.add_node(NodeSpec::new("b", 2, "H100"));
        cluster.allocate(&share(a, 0));
        assert!(cluster.changes().is_empty(), "no log kept yet");
        cluster.log_changes(true);
        cluster.allocate(&share(b, 0));
        assert_eq!(cluster.changes(), [b]);
        // A search releases a's task and b's, then gives a's back and keeps b's stopped.
        let mark = cluster.changes().len();
        cluster.release(&share(a, 0));
        cluster.release(&share(b, 0));
        cluster.allocate(&share(a, 0));
        assert_eq!(cluster.changes(), [b, a, b, a]);
        cluster.forget_changes_since(mark, [b]);
        assert_eq!(cluster.changes(), [b, b]);
        cluster.log_changes(false);
        cluster.release(&share(a, 0));
        assert!(cluster.changes().is_empty());
    }
}
