//! Workloads: the spec a team submits (`apiVersion: allot/v1`, `kind: Workload`) and the
//! past-tense events about it (submitted, aborted).
//!
//! The spec types are the wire contract, written as a user writes them: quantities stay text
//! (`"500m"`, `"64Gi"`) and durations stay humantime text (`"2h"`), so what was submitted is
//! what is stored. `allot-workload` parses, validates and interprets them; every consumer reads
//! them through it. Field names are camelCase like Kubernetes objects, and every struct denies
//! unknown fields: a typo is an error, never a silently ignored request.

use std::borrow::Cow;
use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::envelope::EventKind;
use crate::subject;

/// The only `apiVersion` this build reads.
pub const API_VERSION: &str = "allot/v1";
/// The only `kind`.
pub const KIND: &str = "Workload";

/// `apiVersion` of a workload document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ApiVersion {
    /// `allot/v1`.
    #[default]
    #[serde(rename = "allot/v1")]
    V1,
}

/// `kind` of a workload document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Kind {
    /// `Workload`.
    #[default]
    Workload,
}

// One constant each, so a wrong value reads "expected \"allot/v1\"" rather than a `oneOf` failure.
impl JsonSchema for ApiVersion {
    fn schema_name() -> Cow<'static, str> {
        "ApiVersion".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "description": "Always `allot/v1`.", "const": API_VERSION })
    }
}

impl JsonSchema for Kind {
    fn schema_name() -> Cow<'static, str> {
        "Kind".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "description": "Always `Workload`.", "const": KIND })
    }
}

/// A workload: a DAG of tasks a team asks Allot to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Workload {
    /// Always `allot/v1`.
    pub api_version: ApiVersion,
    /// Always `Workload`.
    pub kind: Kind,
    /// Who asks, and how urgently.
    pub metadata: Metadata,
    /// What to run.
    pub spec: WorkloadSpec,
}

/// A workload's name, owner and priority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Metadata {
    /// The workload's name (1-48 characters from a-z, A-Z, 0-9, '-' and '_'); the workload id is
    /// this name plus a hash of the submission.
    pub name: String,
    /// The owning team (a subject token; must be a team of the teams configuration).
    pub team: String,
    /// A project within the team, for reports and billing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// A priority class of the configuration (`batch`, `standard`, `critical` by default);
    /// absent: the configuration's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// What to run: the tasks, in any order (`after` gives the order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadSpec {
    /// The tasks; names are unique within the workload.
    pub tasks: Vec<Task>,
}

/// One task of a workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Task {
    /// Name, unique within the workload (1-64 characters from a-z, A-Z, 0-9, '-' and '_').
    pub name: String,
    /// What the task needs; absent: nothing tracked (a CPU-only task of no particular size).
    #[serde(default)]
    pub resources: Resources,
    /// The program and its arguments (argv; no shell).
    pub command: Vec<String>,
    /// Container image to run the command in; absent: the node's environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Tasks (by name) that must succeed before this one starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// A gang: tasks of the same gang start together or not at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<String>,
    /// How long the task is expected to run (`"45m"`), a hint for scheduling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_estimate: Option<String>,
    /// When the task should be done: a duration after submission (`"6h"`) or an RFC 3339 time.
    /// Among equal priorities, work that would miss it waiting its turn starts first (earliest
    /// deadline first) and is flagged at risk; one that cannot be kept even if the task started
    /// now buys no place in line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// Usage limit: once a run has lasted this long (`"2h"`), the task may be preempted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runtime: Option<String>,
    /// What to do when a run fails; absent: no retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    /// Whether and how often the task checkpoints; absent: it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Checkpoint>,
    /// `false`: its GPUs are never reclaimed for idling (a debugging session that waits on a
    /// person). Absent or `true`: where the operators enabled idle reclaim, a run whose GPUs
    /// stay under the threshold for the window, past its warm-up, is told and then stopped and
    /// requeued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_reclaim: Option<bool>,
}

/// What a task needs. At most one of `gpus`, `gpuFraction`, `gpuMilli` and `migProfile`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Resources {
    /// Whole GPUs (`4`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Quantity>,
    /// A share of one GPU as a decimal (`"0.25"`), at most three decimals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_fraction: Option<Quantity>,
    /// A share of one GPU in thousandths (`250`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_milli: Option<u32>,
    /// GPU memory needed on each GPU (`"20Gi"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory: Option<Quantity>,
    /// GPU models the task accepts (`["H100", "A100-80GB"]`); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_models: Vec<String>,
    /// One MIG instance of this profile (`"1g.10gb"`) instead of GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// CPU: cores (`"16"`, `"0.5"`) or millicores (`"500m"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory: bytes with a suffix `Ki`, `Mi`, `Gi`, `Ti` (or `k`, `M`, `G`, `T`), e.g. `"64Gi"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Let the predictor's right-sizing replace the GPU model, share and GPU memory asked
    /// for above, for attempts started after it has advice for this task (from its earlier
    /// runs' telemetry): the cheapest model and smallest share that held them. Default false:
    /// the request stands as written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub right_size: bool,
}

/// Retries of a failed run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Retry {
    /// Runs in all, the first included (1: no retry).
    pub max_attempts: u32,
    /// Wait before the first retry (`"30s"`), doubled for each further one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
}

/// Checkpointing, so a preempted task loses only the work since its last checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Checkpoint {
    /// The task saves and resumes its state (on SIGTERM, and every `interval`).
    pub supported: bool,
    /// How often it checkpoints while running (`"10m"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
}

/// A resource quantity as written: `"16"`, `"500m"`, `"64Gi"`, or a plain number.
///
/// Kept as text so the stored spec is what was submitted; `allot-workload` parses it strictly.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Quantity(pub String);

impl Quantity {
    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Quantity {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Quantity;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a quantity such as 4, \"500m\" or \"64Gi\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity(v.to_owned()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
        }
        de.deserialize_any(Visitor)
    }
}

impl JsonSchema for Quantity {
    fn schema_name() -> Cow<'static, str> {
        "Quantity".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A quantity: a number, or text such as \"500m\" (milli) or \"64Gi\" (binary suffixes Ki, Mi, Gi, Ti; decimal k, M, G, T).",
            "type": ["string", "number"]
        })
    }
}

domain_events! {
    /// What happened to workloads as a whole.
    pub enum WorkloadEvent in "workload" {
        /// A team submitted a validated workload.
        Submitted(WorkloadSubmitted) = "submitted",
        /// An operator or the owner aborted a workload, or one of its tasks and what follows it.
        Aborted(WorkloadAborted) = "aborted",
        /// The planner saw the workload to its end: every task succeeded, one failed for good,
        /// or it was aborted.
        Finished(WorkloadFinished) = "finished",
        /// The planner's answer to an abort: carried out, or refused and why.
        AbortAnswered(WorkloadAbortAnswered) = "abort_answered",
    }
}

impl EventKind for WorkloadEvent {
    fn event_type(&self) -> String {
        WorkloadEvent::event_type(self)
    }
    fn nats_subject(&self) -> String {
        match self {
            Self::Submitted(e) => subject::workload_submitted(&e.spec.metadata.team),
            Self::Aborted(e) => subject::workload_aborted(&e.team),
            Self::Finished(e) => subject::workload_finished(&e.team),
            Self::AbortAnswered(e) => subject::workload_abort_answered(&e.team),
        }
    }
    fn entity(&self) -> String {
        match self {
            Self::Submitted(e) => e.workload_id.clone(),
            Self::Aborted(e) => match &e.task {
                Some(task) => format!("{}/{task}", e.workload_id),
                None => e.workload_id.clone(),
            },
            Self::Finished(e) => e.workload_id.clone(),
            Self::AbortAnswered(e) => e.workload_id.clone(),
        }
    }
    fn team(&self) -> Option<&str> {
        match self {
            Self::Submitted(e) => Some(&e.spec.metadata.team),
            Self::Aborted(e) => Some(&e.team),
            Self::Finished(e) => Some(&e.team),
            Self::AbortAnswered(e) => Some(&e.team),
        }
    }
}

/// A workload was validated and submitted.
///
/// Published with a `Nats-Msg-Id` derived from the team, `idempotency_key` and the spec, so a
/// retried submission within the WORKLOADS stream's duplicate window is stored once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSubmitted {
    /// The workload's id: `<metadata.name>-<10 hex digits of SHA-256(<team>\n<key>)>`; the
    /// planner refuses an id that does not follow.
    pub workload_id: String,
    /// What makes two submissions the same one (default: a hash of the canonical spec and the
    /// run id).
    pub idempotency_key: String,
    /// The CI run (or other attempt) that submitted it, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Who submitted it (user, CI job), as the submitting tool saw it.
    pub submitter: String,
    /// The workload as submitted.
    pub spec: Workload,
}

/// A workload, or one task and everything downstream of it, was aborted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkloadAborted {
    /// The workload's id.
    pub workload_id: String,
    /// The owning team (the subject's key).
    pub team: String,
    /// The task aborted with its dependents; absent: the whole workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// Why, in the words of whoever aborted it.
    pub reason: String,
    /// Who aborted it.
    pub by: String,
}

/// How a workload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadOutcome {
    /// Every task succeeded.
    Succeeded,
    /// A task failed on its last attempt; the tasks not yet done were cancelled.
    Failed,
    /// An operator or the owner aborted it (or one of its tasks).
    Aborted,
}

/// A workload ended (published once, by the planner, with a `Nats-Msg-Id` derived from the
/// workload id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFinished {
    /// The workload's id.
    pub workload_id: String,
    /// The owning team (the subject's key).
    pub team: String,
    /// How it ended.
    pub outcome: WorkloadOutcome,
    /// What ended it, when it did not succeed (`task train failed after 3 attempts: exit
    /// status 1`, `aborted by alice: wrong learning rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Whether the planner carried an abort out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AbortOutcome {
    /// Done: the tasks named were stopped or cancelled.
    Accepted,
    /// Nothing was done (an unknown workload or task, another team's workload, a workload
    /// already finished); `detail` says why.
    Refused,
}

/// The planner's answer to one `WorkloadAborted` (published once, with a `Nats-Msg-Id` derived
/// from the abort's event id), so whoever aborted learns what came of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkloadAbortAnswered {
    /// The CloudEvent id of the `WorkloadAborted` answered.
    pub abort: String,
    /// The workload it named.
    pub workload_id: String,
    /// The team it was published under (the subject's key).
    pub team: String,
    /// The task it named; absent: the whole workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// Carried out or refused.
    pub outcome: AbortOutcome,
    /// What was done (`cancelled eval; stopped train-0, train-1`), or why nothing was.
    pub detail: String,
}
