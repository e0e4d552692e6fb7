//! The allocator's journal: one event per input it applied, with the decisions it made, on
//! one subject per pool (`allot.alloc.<pool>.journal`) in the DECISIONS stream.
//!
//! The journal is the allocator's durable state: a new leader rebuilds the scheduler by
//! applying its entries in order, and `allot replay --verify` recomputes every decision from
//! it. Every append carries the subject sequence the leader expects to follow, so an append
//! from a deposed leader is rejected by the server (fencing).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use allot_sched::journal::Entry;
use allot_sched::{Decision, LeaseId, TaskId};

use crate::task::RunSpec;

use crate::envelope::EventKind;
use crate::subject;

domain_events! {
    /// The allocator's journal.
    // Events are decoded, matched and dropped one at a time: boxing the big variant would buy
    // nothing but an allocation.
    #[allow(clippy::large_enum_variant)]
    pub enum AllocEvent in "alloc" {
        /// An allocator became the pool's leader; entries after it are its.
        LeaderElected(LeaderElected) = "leader_elected",
        /// An input was applied, with its decisions.
        Applied(Applied) = "applied",
    }
}

impl EventKind for AllocEvent {
    fn event_type(&self) -> String {
        AllocEvent::event_type(self)
    }
    fn nats_subject(&self) -> String {
        subject::alloc_journal(&self.entity())
    }
    /// The pool.
    fn entity(&self) -> String {
        match self {
            Self::LeaderElected(e) => e.pool.clone(),
            Self::Applied(e) => e.pool.clone(),
        }
    }
}

/// An allocator took the lead of a pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaderElected {
    /// The pool.
    pub pool: String,
    /// Who leads (instance id).
    pub leader: String,
    /// The policy it schedules with; a replay runs the same one.
    pub policy: String,
    /// The journal format (`allot-journal/v1`).
    pub format: String,
    /// How many entries the journal already held (the new leader continues after them).
    pub entries: u64,
}

/// Where an applied input came from: the stream message it was derived from (none for the
/// allocator's own passes and configuration).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Stream name.
    pub stream: String,
    /// Sequence in that stream.
    pub sequence: u64,
}

/// One applied input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Applied {
    /// The pool.
    pub pool: String,
    /// The stream message the input came from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// The input and its decisions.
    pub entry: Entry,
    /// For a task submitted from a ready event: how it runs (kept to dispatch its grants,
    /// also after a change of leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<Launch>,
    /// One per grant among the decisions: what runs where, for the executors of the nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dispatch: Vec<Dispatch>,
}

/// A task as its executor knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Launch {
    /// The workload it belongs to.
    pub workload: String,
    /// Its name in the workload.
    pub name: String,
    /// The team it runs for (empty in journals written before it was recorded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub team: String,
    /// How it runs.
    pub run: RunSpec,
}

/// A grant, resolved to node names for the executors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Dispatch {
    /// The task.
    pub task: TaskId,
    /// Its lease.
    pub lease: LeaseId,
    /// What to run.
    pub launch: Launch,
    /// Its share of each node it spans (a gang member spans one node).
    pub nodes: Vec<NodeGrant>,
}

impl Dispatch {
    /// The executors' orders for the grants among `decisions`, on `cluster` as it is after
    /// them: node names and models instead of the scheduler's node indices, and each task's
    /// launch from `launch`.
    pub fn for_grants(
        decisions: &[allot_sched::Decision],
        cluster: &allot_sched::Cluster,
        mut launch: impl FnMut(TaskId) -> Launch,
    ) -> Vec<Dispatch> {
        decisions
            .iter()
            .filter_map(|d| match d {
                allot_sched::Decision::Granted {
                    task,
                    lease,
                    placement,
                    ..
                } => Some(Dispatch {
                    task: *task,
                    lease: *lease,
                    launch: launch(*task),
                    nodes: placement
                        .shares
                        .iter()
                        .map(|share| {
                            let node = &cluster.node(share.node).spec;
                            NodeGrant {
                                node: node.name.clone(),
                                gpu_model: node.gpu_model.clone(),
                                gpus: share.gpus.clone(),
                                mig: share.mig.clone(),
                                cpu_milli: share.cpu_milli,
                                memory_mib: share.memory_mib,
                            }
                        })
                        .collect(),
                }),
                _ => None,
            })
            .collect()
    }
}

/// A task's share of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeGrant {
    /// The node.
    pub node: String,
    /// The node's GPU model (what a GPU-hour of it costs depends on it).
    #[serde(default)]
    pub gpu_model: String,
    /// `(GPU index, milli-GPU)` pairs: the GPUs it may use and how much of each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<(u32, u32)>,
    /// A MIG instance of this profile, for MIG tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<String>,
    /// CPU, millicores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
}

/// Reads a pool's journal (its entries in order) for every time it grants a GPU share that, with the leases holding that GPU, makes more
/// than one whole GPU (a whole GPU shares with nothing), or ends a lease that is not held.
pub fn gpus_granted_twice(journal: &[Applied]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut holders: BTreeMap<(String, u32), BTreeMap<LeaseId, u32>> = BTreeMap::new();
    let mut held: BTreeMap<LeaseId, Vec<(String, u32)>> = BTreeMap::new();
    for a in journal {
        let seq = a.entry.seq;
        for d in &a.entry.decisions {
            match d {
                Decision::Granted { lease, .. } => {
                    let Some(dispatch) = a.dispatch.iter().find(|g| g.lease == *lease) else {
                        problems.push(format!(
                            "entry {seq}: lease {lease:?} granted without a dispatch"
                        ));
                        continue;
                    };
                    if held.contains_key(lease) {
                        problems.push(format!(
                            "entry {seq}: lease {lease:?} granted while it is held"
                        ));
                    }
                    let gpus = held.entry(*lease).or_default();
                    for node in &dispatch.nodes {
                        for &(gpu, milli) in &node.gpus {
                            let on = holders.entry((node.node.clone(), gpu)).or_default();
                            let total: u32 = on.values().sum::<u32>() + milli;
                            if total > allot_sched::model::WHOLE_GPU_MILLI {
                                problems.push(format!(
                                    "entry {seq}: {} GPU {gpu} granted to lease {lease:?} ({milli} \
                                     milli-GPU) while leases {:?} hold it",
                                    node.node, on
                                ));
                            }
                            on.insert(*lease, milli);
                            gpus.push((node.node.clone(), gpu));
                        }
                    }
                }
                Decision::Released { lease, .. } | Decision::Preempted { lease, .. } => {
                    match held.remove(lease) {
                        Some(gpus) => {
                            for gpu in gpus {
                                holders.get_mut(&gpu).map(|on| on.remove(lease));
                            }
                        }
                        None => problems.push(format!(
                            "entry {seq}: lease {lease:?} ended but is not held"
                        )),
                    }
                }
                _ => {}
            }
        }
    }
    problems
}
