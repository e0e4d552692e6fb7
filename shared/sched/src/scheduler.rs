//! The scheduler: a live cluster view and a queue, changed only by applying inputs; each
//! `Schedule` input runs one pass of a short numbered pipeline (after Kueue's
//! `scheduler.go`):
//!
//! 1. **order** — pending tasks in the policy's order (re-keyed first if the policy's keys move
//!    with time);
//! 2. **nominate** — for the next task, find a placement on the free capacity;
//! 3. **admit** — grant it: take the resources, open a lease, explain the decision;
//! 4. **blocked** — if it does not fit, record why, then stop or go on as the policy says.

use std::collections::{BTreeMap, HashMap};

use crate::cluster::{Cluster, Placement};
use crate::decision::{Decision, WaitReason};
use crate::model::{LeaseId, NodeSpec, TaskId, TaskSpec, Time, WHOLE_GPU_MILLI};
use crate::policy::{PendingView, Policy, QueueKey, WhenBlocked};

/// Something that happened, in the one total order the scheduler sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A node joined.
    NodeAdded(NodeSpec),
    /// A task is ready to run.
    TaskSubmitted {
        /// The task.
        task: TaskSpec,
        /// When.
        at: Time,
    },
    /// A running task ended (completed, failed or was cancelled).
    TaskFinished {
        /// The task.
        task: TaskId,
        /// When.
        at: Time,
    },
    /// Run a scheduling pass.
    Schedule {
        /// When.
        at: Time,
    },
}

/// An input the scheduler cannot apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// A task id was submitted twice.
    #[error("{0} was already submitted")]
    DuplicateTask(TaskId),
    /// A finish for a task that is not running.
    #[error("{0} is not running")]
    NotRunning(TaskId),
    /// A request no node could ever satisfy.
    #[error("{task} can never be placed: {why}")]
    Unplaceable {
        /// The task.
        task: TaskId,
        /// Why.
        why: String,
    },
}

#[derive(Debug)]
enum State {
    Pending {
        key: QueueKey,
        seq: u64,
        submitted: Time,
        last_wait: Option<WaitReason>,
    },
    Running {
        lease: LeaseId,
        placement: Placement,
    },
}

#[derive(Debug)]
struct Task {
    spec: TaskSpec,
    state: State,
}

/// The scheduling core. See the module docs for the pass.
#[derive(Debug)]
pub struct Scheduler {
    cluster: Cluster,
    policy: Box<dyn Policy>,
    queue: BTreeMap<QueueKey, TaskId>,
    tasks: HashMap<TaskId, Task>,
    /// Distinct request shapes among pending tasks, with how many tasks have each: whether
    /// any pending task could start is a question about shapes, not tasks.
    shapes: HashMap<Shape, (usize, TaskSpec)>,
    next_seq: u64,
    next_lease: u64,
}

/// What placement depends on in a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Shape {
    gpus: u32,
    gpu_milli: u32,
    gpu_models: Vec<String>,
    cpu_milli: u64,
    memory_mib: u64,
}

impl Shape {
    fn of(spec: &TaskSpec) -> Self {
        Self {
            gpus: spec.gpus,
            gpu_milli: spec.gpu_milli,
            gpu_models: spec.gpu_models.clone(),
            cpu_milli: spec.cpu_milli,
            memory_mib: spec.memory_mib,
        }
    }
}

impl Scheduler {
    /// A scheduler with an empty cluster, deciding by `policy`.
    pub fn new(policy: Box<dyn Policy>) -> Self {
        Self {
            cluster: Cluster::new(),
            policy,
            queue: BTreeMap::new(),
            tasks: HashMap::new(),
            shapes: HashMap::new(),
            next_seq: 0,
            next_lease: 1,
        }
    }

    /// The cluster as it is now.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The policy.
    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }

    /// Tasks waiting.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// Pending tasks in queue order.
    pub fn pending_specs(&self) -> impl Iterator<Item = &TaskSpec> {
        self.queue.values().map(|id| &self.tasks[id].spec)
    }

    /// Whether some pending task could be placed on the free capacity as it is now — the
    /// question behind WR_fit (capacity idle while a task that fits waits).
    pub fn some_pending_fits(&self) -> bool {
        self.shapes
            .values()
            .any(|(_, spec)| self.policy.place(&self.cluster, spec).is_some())
    }

    /// Applies one input and returns what was decided.
    pub fn apply(&mut self, input: Input) -> Result<Vec<Decision>, ApplyError> {
        let mut out = Vec::new();
        self.apply_into(input, &mut out)?;
        Ok(out)
    }

    /// Applies one input, appending decisions to `out` (no allocation per call).
    pub fn apply_into(&mut self, input: Input, out: &mut Vec<Decision>) -> Result<(), ApplyError> {
        match input {
            Input::NodeAdded(spec) => {
                self.cluster.add_node(spec);
            }
            Input::TaskSubmitted { task, at } => self.submit(task, at)?,
            Input::TaskFinished { task, at } => self.finish(task, at, out)?,
            Input::Schedule { at } => self.pass(at, out),
        }
        Ok(())
    }

    fn submit(&mut self, spec: TaskSpec, at: Time) -> Result<(), ApplyError> {
        if self.tasks.contains_key(&spec.id) {
            return Err(ApplyError::DuplicateTask(spec.id));
        }
        if let Some(why) = self.never_fits(&spec) {
            return Err(ApplyError::Unplaceable { task: spec.id, why });
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.policy.observe_submitted(&spec);
        let key = self.policy.key(
            PendingView {
                spec: &spec,
                submitted: at,
                seq,
            },
            at,
        );
        self.queue.insert(key, spec.id);
        self.shapes
            .entry(Shape::of(&spec))
            .or_insert_with(|| (0, spec.clone()))
            .0 += 1;
        self.tasks.insert(
            spec.id,
            Task {
                spec,
                state: State::Pending {
                    key,
                    seq,
                    submitted: at,
                    last_wait: None,
                },
            },
        );
        Ok(())
    }

    /// Why no node of the cluster, even empty, could ever hold the task.
    fn never_fits(&self, spec: &TaskSpec) -> Option<String> {
        if spec.gpus == 0 {
            return None;
        }
        let models: Vec<&str> = self
            .cluster
            .models()
            .into_iter()
            .filter(|m| spec.accepts(m))
            .collect();
        if models.is_empty() {
            return Some(format!(
                "no node has an accepted GPU model ({})",
                spec.gpu_models.join(", ")
            ));
        }
        let capacity: u64 = self
            .cluster
            .nodes()
            .iter()
            .filter(|n| spec.accepts(&n.spec.gpu_model))
            .map(|n| u64::from(n.spec.gpus))
            .sum();
        (u64::from(spec.gpus) > capacity).then(|| {
            format!(
                "asks for {} GPUs; the cluster has {capacity} of the accepted models",
                spec.gpus
            )
        })
    }

    fn finish(&mut self, id: TaskId, at: Time, out: &mut Vec<Decision>) -> Result<(), ApplyError> {
        let running = matches!(
            self.tasks.get(&id),
            Some(Task {
                state: State::Running { .. },
                ..
            })
        );
        if !running {
            return Err(ApplyError::NotRunning(id));
        }
        if let Some(Task {
            state: State::Running { lease, placement },
            ..
        }) = self.tasks.remove(&id)
        {
            self.cluster.release(&placement);
            out.push(Decision::Released {
                task: id,
                lease,
                at,
            });
        }
        Ok(())
    }

    fn pass(&mut self, now: Time, out: &mut Vec<Decision>) {
        // 1. order
        if self.policy.dynamic() {
            self.rekey(now);
        }
        let mut granted: Vec<(QueueKey, TaskId, LeaseId, Placement)> = Vec::new();
        let mut blocked: Option<(TaskId, WaitReason)> = None;
        for (key, id) in &self.queue {
            let spec = &self.tasks[id].spec;
            // 2. nominate
            let Some(placement) = self.policy.place(&self.cluster, spec) else {
                // 4. blocked
                if blocked.is_none() {
                    let free = self.cluster.capacity_milli() - self.cluster.allocated_milli();
                    let reason = WaitReason::NoCapacity {
                        gpus: spec.gpus,
                        free_gpus: free / u64::from(WHOLE_GPU_MILLI),
                    };
                    blocked = Some((*id, reason));
                }
                match self.policy.when_blocked() {
                    WhenBlocked::Stop => break,
                    WhenBlocked::Continue => continue,
                }
            };
            // 3. admit
            self.cluster.allocate(&placement);
            let lease = LeaseId(self.next_lease);
            self.next_lease += 1;
            out.push(Decision::Granted {
                task: *id,
                lease,
                placement: placement.clone(),
                at: now,
                reason: format!(
                    "{}: first in the queue's order that fits; best-fit placement",
                    self.policy.name()
                ),
            });
            granted.push((*key, *id, lease, placement));
        }
        for (key, id, lease, placement) in granted {
            self.queue.remove(&key);
            if let Some(task) = self.tasks.get_mut(&id) {
                let shape = Shape::of(&task.spec);
                if let Some(entry) = self.shapes.get_mut(&shape) {
                    entry.0 -= 1;
                    if entry.0 == 0 {
                        self.shapes.remove(&shape);
                    }
                }
                task.state = State::Running { lease, placement };
            }
        }
        if let Some((id, reason)) = blocked
            && let Some(Task {
                state: State::Pending { last_wait, .. },
                ..
            }) = self.tasks.get_mut(&id)
            && last_wait.as_ref() != Some(&reason)
        {
            *last_wait = Some(reason.clone());
            out.push(Decision::Waiting {
                task: id,
                reason,
                at: now,
            });
        }
    }

    fn rekey(&mut self, now: Time) {
        let ids: Vec<TaskId> = self.queue.values().copied().collect();
        self.queue.clear();
        for id in ids {
            if let Some(task) = self.tasks.get_mut(&id)
                && let State::Pending {
                    key,
                    seq,
                    submitted,
                    ..
                } = &mut task.state
            {
                *key = self.policy.key(
                    PendingView {
                        spec: &task.spec,
                        submitted: *submitted,
                        seq: *seq,
                    },
                    now,
                );
                self.queue.insert(*key, id);
            }
        }
    }
}

#[cfg(test)]
mod tests;
