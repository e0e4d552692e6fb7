//! allot-sim: replays GPU-cluster traces through allot-sched, the same library the allocator
//! service runs, and measures the KPIs of DESIGN.md.
//!
//! # Layout
//!
//! - [`trace`]: what a loaded trace is ([`Trace`], [`TraceJob`], [`TraceNode`]) and
//!   [`LoadError`], which names the file, line and column of a bad row.
//! - [`load`]: one loader per format — Philly, openb, Tiresias, and a generic CSV.
//! - [`engine`]: the discrete-event loop (release, submit, one pass per event time), which
//!   submits a job that waits for others only once they have finished; [`SimConfig`]
//!   (checkpoint interval and restart overhead for preemptions) and [`Observer`] (progress and
//!   decisions, for the caller to show).
//! - [`kpi`]: JCT, queueing delay, makespan, allocation ratio, Wastage Ratio and WR_fit, Jain's
//!   fairness — one definition for every policy.
//! - [`pipelines`]: DAG workloads — the [`Dag`] of which jobs wait for which, the synthetic
//!   preprocess → train → evaluate pipelines with durations drawn from Philly, and the pipeline
//!   KPIs (completion time, GPU time held in CPU-only stages).
//! - [`scenario`]: named scenarios (`philly-640`, `pipelines`) that fix trace, cluster and
//!   quotas.
//! - [`packing`]: the FGD paper's GPU packing experiment on openb (`openb-packing`).

pub mod engine;
pub mod kpi;
pub mod load;
pub mod packing;
pub mod pipelines;
pub mod scenario;
pub mod trace;

pub use engine::{Observer, SimConfig, SimError, SimResult, run, run_scenario};
pub use kpi::Kpis;
pub use pipelines::{Dag, PipelineKpis};
pub use trace::{LoadError, Millis, Trace, TraceJob, TraceNode, TraceTeam};
