//! allot-sched: Allot's scheduling core. Pure and deterministic — no clock, no I/O, no
//! unseeded randomness: inputs in ([`Input`]), explained decisions out ([`Decision`]). The
//! allocator service and the trace simulator both drive it, and the decision log replays
//! through it.
//!
//! # Layout
//!
//! - [`model`]: time, ids, node and task specs.
//! - [`cluster`]: the live cluster view — free capacity per node and GPU, indexed for cheap
//!   best fit, changed only by grants and releases.
//! - [`placement`]: where a task fits (best fit on a node, topology-aware whole nodes for large
//!   tasks, the tightest GPU for a fraction, MIG instances).
//! - [`journal`]: journal entries (an input and its decisions) and `verify`, which replays a
//!   journal and names the first entry whose outcome differs; `journal::invariants` checks the
//!   logged decisions themselves (no GPU held twice, no task granted twice, every lease ended
//!   once).
//! - [`gang`]: all-or-nothing placement of a gang's tasks, tightest topology level first.
//! - [`policy`]: the [`Policy`] trait and the policies; only ordering and blocking differ
//!   between them.
//! - [`quota`]: team quotas in one cohort — nominal quota, borrowing and lending limits, usage,
//!   dominant-resource fair share of borrowed capacity.
//! - [`scheduler`]: [`Scheduler::apply`] and the numbered scheduling pass.
//! - [`decision`]: decisions and wait reasons, each explainable.
//! - [`bench`]: the placement benchmark's synthetic cluster and queue.
//! - [`estimate`]: duration estimates — the oracle (oracle baselines only) and a history-based
//!   online estimator that learns from finished tasks only.

pub mod bench;
pub mod cluster;
pub mod decision;
pub mod estimate;
pub mod gang;
pub mod journal;
pub mod model;
pub mod placement;
pub mod policy;
pub mod quota;
pub mod scheduler;

pub use cluster::{Cluster, Placement};
pub use decision::{Decision, WaitReason};
pub use model::{DagFacts, Gang, LeaseId, NodeIdx, NodeSpec, TaskId, TaskSpec, Time};
pub use policy::Policy;
pub use scheduler::{ApplyError, Holder, Input, RunEnd, Scheduler};
