//! What every journal must keep, whichever policy or build wrote it, checked on the decisions as
//! logged: no GPU is held beyond its capacity, no task holds two leases, and every lease ends
//! once, after it was granted.
//!
//! Recomputing a journal (`verify`) proves the scheduler decided what the log says; it cannot
//! prove the decisions were sound — a scheduler bug recomputes just as faithfully. These checks
//! can. Walking the entries in order, a [`Checker`] keeps the leases held and who holds each
//! GPU:
//!
//! - `Granted` opens a lease: its task must hold none, its id must be new, and each GPU it names
//!   must exist and have room — a whole GPU (1000 milli-GPU) shares with nothing, fractions add
//!   up to at most 1000.
//! - `Released` (a finish, or the withdrawal of a running task) and `Preempted` (for another
//!   task, or a requeue) end a lease: it must be held, by that task.
//! - `Withdrawn` ends no lease: the scheduler withdraws only queued or preloaded tasks that way (a
//!   running task's withdrawal is logged as `Released`), so a task withdrawn while it holds a
//!   lease would leave that lease open for ever.
//! - `Reserved` holds room for the length of one pass only, and `Waiting` takes nothing: neither
//!   is a lease.
//!
//! MIG instances, CPU and memory are not checked here: a placement names them by node, not by
//! device, so only whole and fractional GPUs can be told apart.

use std::collections::BTreeMap;
use std::fmt;

use rustc_hash::FxHashMap as HashMap;

use crate::cluster::Placement;
use crate::decision::Decision;
use crate::journal::Entry;
use crate::model::{LeaseId, NodeIdx, TaskId, WHOLE_GPU_MILLI};
use crate::scheduler::Input;

/// The first invariant an entry breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("entry {seq}: {broken}")]
pub struct Violation {
    /// The entry.
    pub seq: u64,
    /// What it breaks.
    pub broken: Broken,
}

/// An invariant broken, with the task, lease, node and GPU concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broken {
    /// A grant takes more of a GPU than is left of it.
    GpuOverbooked {
        /// The task granted.
        task: TaskId,
        /// Its new lease.
        lease: LeaseId,
        /// The node.
        node: Node,
        /// The GPU's index on the node.
        gpu: u32,
        /// Milli-GPU the grant takes of it.
        milli: u32,
        /// The leases that already hold it.
        holders: Vec<Holder>,
    },
    /// A grant names a node or GPU that was never added.
    NoSuchGpu {
        /// The task granted.
        task: TaskId,
        /// Its new lease.
        lease: LeaseId,
        /// The node.
        node: Node,
        /// The GPU's index on the node.
        gpu: u32,
    },
    /// A task is granted while it still holds a lease.
    GrantedTwice {
        /// The task.
        task: TaskId,
        /// The new lease.
        lease: LeaseId,
        /// The lease it holds.
        holding: LeaseId,
        /// The entry that granted that one.
        since: u64,
    },
    /// A lease id is granted a second time.
    LeaseReused {
        /// The task granted.
        task: TaskId,
        /// The lease.
        lease: LeaseId,
        /// The entry that granted it first.
        first: u64,
    },
    /// A lease ends that was never granted.
    NeverGranted {
        /// The task named.
        task: TaskId,
        /// The lease.
        lease: LeaseId,
        /// How it ends.
        how: Ending,
    },
    /// A lease ends that had already ended.
    EndedTwice {
        /// The task named.
        task: TaskId,
        /// The lease.
        lease: LeaseId,
        /// How it ends this time.
        how: Ending,
        /// The entry that ended it first.
        ended: u64,
    },
    /// A lease ends for a task other than the one it was granted to.
    WrongHolder {
        /// The task named.
        task: TaskId,
        /// The lease.
        lease: LeaseId,
        /// How it ends.
        how: Ending,
        /// The task it was granted to.
        holder: TaskId,
    },
    /// A task is withdrawn while it holds a lease, which nothing would then end.
    WithdrawnWhileHolding {
        /// The task.
        task: TaskId,
        /// The lease it holds.
        lease: LeaseId,
    },
}

/// How a lease ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// `Decision::Released`.
    Released,
    /// `Decision::Preempted`.
    Preempted,
}

/// A node as messages name it: its index in placements, and its name once it was added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its index, in the order nodes were added.
    pub idx: NodeIdx,
    /// Its name (`None`: no node was added at that index).
    pub name: Option<String>,
}

/// A lease's hold on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The lease.
    pub lease: LeaseId,
    /// Its task.
    pub task: TaskId,
    /// Milli-GPU it holds of the GPU.
    pub milli: u32,
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Released => "released",
            Self::Preempted => "preempted",
        })
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "node #{} ({name})", self.idx.0),
            None => write!(f, "node #{}", self.idx.0),
        }
    }
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::GpuOverbooked {
                task,
                lease,
                node,
                gpu,
                milli,
                holders,
            } if holders.is_empty() => write!(
                f,
                "GPU {gpu} of {node} over-granted: {task} is granted lease {} with {milli} \
                 milli-GPU of it, more than its {WHOLE_GPU_MILLI}",
                lease.0
            ),
            Self::GpuOverbooked {
                task,
                lease,
                node,
                gpu,
                milli,
                holders,
            } => {
                let held: u32 = holders.iter().map(|h| h.milli).sum();
                let by: Vec<String> = holders
                    .iter()
                    .map(|h| format!("lease {} ({}, {} milli-GPU)", h.lease.0, h.task, h.milli))
                    .collect();
                write!(
                    f,
                    "GPU {gpu} of {node} held twice: {task} is granted lease {} with {milli} \
                     milli-GPU of it while {} already hold{} {held} of its \
                     {WHOLE_GPU_MILLI}",
                    lease.0,
                    by.join(", "),
                    if holders.len() == 1 { "s" } else { "" },
                )
            }
            Self::NoSuchGpu {
                task,
                lease,
                node,
                gpu,
            } => write!(
                f,
                "{task} is granted lease {} on GPU {gpu} of {node}, which has no such GPU",
                lease.0
            ),
            Self::GrantedTwice {
                task,
                lease,
                holding,
                since,
            } => write!(
                f,
                "{task} granted twice: lease {} while it still holds lease {} (granted at entry \
                 {since}, not released, preempted or withdrawn since)",
                lease.0, holding.0
            ),
            Self::LeaseReused { task, lease, first } => write!(
                f,
                "lease {} granted twice: to {task}, and first at entry {first}",
                lease.0
            ),
            Self::NeverGranted { task, lease, how } => write!(
                f,
                "lease {} of {task} {how}, but it was never granted",
                lease.0
            ),
            Self::EndedTwice {
                task,
                lease,
                how,
                ended,
            } => write!(
                f,
                "lease {} of {task} {how}, but it already ended at entry {ended}",
                lease.0
            ),
            Self::WrongHolder {
                task,
                lease,
                how,
                holder,
            } => write!(
                f,
                "lease {} {how} as {task}'s, but it was granted to {holder}",
                lease.0
            ),
            Self::WithdrawnWhileHolding { task, lease } => write!(
                f,
                "{task} withdrawn while it holds lease {} (a running task's withdrawal releases \
                 its lease; this one would never end)",
                lease.0
            ),
        }
    }
}

/// A lease while it is held.
#[derive(Debug, Clone)]
struct Held {
    task: TaskId,
    placement: Placement,
    granted: u64,
}

/// The invariants' state after the entries seen so far; [`Checker::check`] each entry in
/// journal order, from the first.
#[derive(Debug, Clone, Default)]
pub struct Checker {
    /// Name and whole GPUs of each node, by index.
    nodes: Vec<(String, u32)>,
    held: HashMap<LeaseId, Held>,
    /// Each task's lease, while it holds one.
    by_task: HashMap<TaskId, LeaseId>,
    /// Leases that ended, with the entries that granted and ended them.
    ended: HashMap<LeaseId, (u64, u64)>,
    /// Who holds each GPU now.
    gpus: HashMap<(NodeIdx, u32), Vec<Holder>>,
}

impl Checker {
    /// A checker that has seen nothing: no nodes, no leases.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks `entry`'s logged decisions against the journal so far and takes them in. After a
    /// violation the state is that of a partly applied entry: stop there.
    pub fn check(&mut self, entry: &Entry) -> Result<(), Violation> {
        if let (Input::NodeAdded(spec), None) = (&entry.input, &entry.rejected) {
            self.nodes.push((spec.name.clone(), spec.gpus));
        }
        let seq = entry.seq;
        for decision in &entry.decisions {
            let result = match decision {
                Decision::Granted {
                    task,
                    lease,
                    placement,
                    ..
                } => self.grant(seq, *task, *lease, placement),
                Decision::Released { task, lease, .. } => {
                    self.end(seq, *task, *lease, Ending::Released)
                }
                Decision::Preempted { task, lease, .. } => {
                    self.end(seq, *task, *lease, Ending::Preempted)
                }
                Decision::Withdrawn { task, .. } => match self.by_task.get(task) {
                    Some(lease) => Err(Broken::WithdrawnWhileHolding {
                        task: *task,
                        lease: *lease,
                    }),
                    None => Ok(()),
                },
                Decision::Waiting { .. } | Decision::Reserved { .. } => Ok(()),
            };
            result.map_err(|broken| Violation { seq, broken })?;
        }
        Ok(())
    }

    fn node(&self, idx: NodeIdx) -> Node {
        Node {
            idx,
            name: self.nodes.get(idx.0 as usize).map(|(name, _)| name.clone()),
        }
    }

    fn grant(
        &mut self,
        seq: u64,
        task: TaskId,
        lease: LeaseId,
        placement: &Placement,
    ) -> Result<(), Broken> {
        if let Some(holding) = self.by_task.get(&task) {
            return Err(Broken::GrantedTwice {
                task,
                lease,
                holding: *holding,
                since: self.held[holding].granted,
            });
        }
        let first = self
            .held
            .get(&lease)
            .map(|h| h.granted)
            .or_else(|| self.ended.get(&lease).map(|(granted, _)| *granted));
        if let Some(first) = first {
            return Err(Broken::LeaseReused { task, lease, first });
        }
        // Checked in full before any is taken, so a refused grant leaves no trace.
        let mut taken: BTreeMap<(NodeIdx, u32), u32> = BTreeMap::new();
        for share in &placement.shares {
            for (gpu, milli) in &share.gpus {
                let exists = self
                    .nodes
                    .get(share.node.0 as usize)
                    .is_some_and(|(_, gpus)| gpu < gpus);
                if !exists {
                    return Err(Broken::NoSuchGpu {
                        task,
                        lease,
                        node: self.node(share.node),
                        gpu: *gpu,
                    });
                }
                let key = (share.node, *gpu);
                let holding = self.gpus.get(&key).map_or(&[][..], Vec::as_slice);
                // The same GPU named twice in one placement holds it twice.
                let before = taken.get(&key).map(|&milli| Holder { lease, task, milli });
                let holders = || holding.iter().chain(before.as_ref());
                let held: u32 = holders().map(|h| h.milli).sum();
                let whole = |milli: u32| milli >= WHOLE_GPU_MILLI;
                let fits = if holders().next().is_none() {
                    *milli <= WHOLE_GPU_MILLI
                } else {
                    !whole(*milli)
                        && !holders().any(|h| whole(h.milli))
                        && held + milli <= WHOLE_GPU_MILLI
                };
                if !fits {
                    let holders = holders().copied().collect();
                    return Err(Broken::GpuOverbooked {
                        task,
                        lease,
                        node: self.node(share.node),
                        gpu: *gpu,
                        milli: *milli,
                        holders,
                    });
                }
                *taken.entry(key).or_default() += milli;
            }
        }
        for share in &placement.shares {
            for (gpu, milli) in &share.gpus {
                self.gpus
                    .entry((share.node, *gpu))
                    .or_default()
                    .push(Holder {
                        lease,
                        task,
                        milli: *milli,
                    });
            }
        }
        self.by_task.insert(task, lease);
        self.held.insert(
            lease,
            Held {
                task,
                placement: placement.clone(),
                granted: seq,
            },
        );
        Ok(())
    }

    fn end(&mut self, seq: u64, task: TaskId, lease: LeaseId, how: Ending) -> Result<(), Broken> {
        let Some(held) = self.held.get(&lease) else {
            return Err(match self.ended.get(&lease) {
                Some((_, ended)) => Broken::EndedTwice {
                    task,
                    lease,
                    how,
                    ended: *ended,
                },
                None => Broken::NeverGranted { task, lease, how },
            });
        };
        if held.task != task {
            return Err(Broken::WrongHolder {
                task,
                lease,
                how,
                holder: held.task,
            });
        }
        let held = self.held.remove(&lease).expect("looked up above");
        for share in &held.placement.shares {
            for (gpu, _) in &share.gpus {
                let key = (share.node, *gpu);
                if let Some(holders) = self.gpus.get_mut(&key) {
                    holders.retain(|h| h.lease != lease);
                    if holders.is_empty() {
                        self.gpus.remove(&key);
                    }
                }
            }
        }
        self.by_task.remove(&task);
        self.ended.insert(lease, (held.granted, seq));
        Ok(())
    }
}

/// Checks `entries` (in journal order, from the first); the first violation, if any.
pub fn check<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Result<(), Violation> {
    let mut checker = Checker::new();
    entries.into_iter().try_for_each(|e| checker.check(e))
}

#[cfg(test)]
mod tests;
