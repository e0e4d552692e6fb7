//! Workload specs as users write them, checked before anything is published.
//!
//! The types are `allot_events::workload` (they travel in `WorkloadSubmitted`); this crate
//! reads, checks and interprets them, with no I/O, so `allot validate`, `allot submit`, the
//! gateway and the planner all agree on what a spec means.
//!
//! # Layout
//!
//! - [`parse`]: YAML or JSON text → [`Workload`]. Syntax errors carry line and column; then the
//!   document is checked against the spec's JSON Schema so **every** structural problem
//!   (unknown fields, wrong types, missing fields) is reported at once, by path.
//! - [`validate`]: the checks types cannot express, all collected into one `Vec<SpecProblem>`:
//!   quantities, names, duplicate tasks, unknown or cyclic dependencies, gang rules, teams and
//!   priority classes, and requests no node of the cluster could ever hold. [`check`] runs
//!   parsing and validation together.
//! - [`limits`]: the largest spec (bytes as written and as published, tasks) and the longest
//!   duration, so `allot validate`, `allot submit` and the planner agree; [`limits::text`]
//!   turns bytes read from a file or standard input into text, or a problem (too large, not
//!   UTF-8).
//! - [`problem`]: [`SpecProblem`] — a path such as `spec.tasks[2].after[0]`, the task's name,
//!   the message, and the line and column where the format gives them.
//! - [`quantity`]: strict parsing of `"500m"`, `"64Gi"`, `"0.25"`, `"2h"`.
//! - [`dag`]: the dependency graph (petgraph): cycles printed as `a -> b -> c -> a`, and each
//!   task's [`DagFacts`] (dependents, critical-path rank) for the scheduler.
//! - [`teams`]: the teams file (`teams.yaml`): teams (subject tokens, quotas later) and priority
//!   classes (`batch` = 0, `standard` = 100, `critical` = 1000 by default).
//! - [`cluster`]: the cluster's node shapes, from `--cluster 4x8:H100` or the inventory.
//! - [`submit`]: the idempotency key (a hash of the canonical spec and the run id), the workload
//!   id, and the `WorkloadSubmitted` CloudEvent whose `Nats-Msg-Id` is that key.

pub mod cluster;
pub mod dag;
pub mod limits;
pub mod parse;
pub mod problem;
pub mod quantity;
pub mod submit;
pub mod teams;
pub mod validate;

pub use allot_events::workload::Workload;
pub use allot_sched::model::DagFacts;
pub use cluster::{ClusterShape, NodeShape};
pub use parse::Format;
pub use problem::{ProblemKind, SpecProblem};
pub use teams::TeamsConfig;
pub use validate::{Checked, Context, check, validate};
