//! What remediation did about a node, a GPU or a task, and an operator's cordons.
//!
//! Every action names the rule that fired, the readings that triggered it and the tasks it
//! affected, so `allot explain` and `allot remediation log` can say why. The allocator turns
//! the actions that touch capacity into journalled scheduler inputs (a hold on the node, a
//! drain, a GPU out of service), so a replay of the decision log never consults the rules.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use allot_sched::LeaseId;

use crate::envelope::EventKind;
use crate::subject;

domain_events! {
    /// Remediation's actions, and operators' cordons.
    pub enum RemediationEvent in "remediation" {
        /// Remediation acted on a node or a GPU, asked an actuator for a reset, or alerted.
        ActionTaken(ActionTaken) = "action_taken",
        /// An operator cordoned or uncordoned a node (`allot cordon` / `allot uncordon`).
        OperatorCordon(OperatorCordon) = "operator_cordon",
    }
}

impl EventKind for RemediationEvent {
    fn event_type(&self) -> String {
        RemediationEvent::event_type(self)
    }
    fn nats_subject(&self) -> String {
        subject::remediation(self.name(), &self.entity())
    }
    /// The node.
    fn entity(&self) -> String {
        match self {
            Self::ActionTaken(e) => e.node.clone(),
            Self::OperatorCordon(e) => e.node.clone(),
        }
    }
    fn team(&self) -> Option<&str> {
        match self {
            Self::ActionTaken(e) => e.team.as_deref(),
            Self::OperatorCordon(_) => None,
        }
    }
}

/// What remediation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Told the people concerned (the operators; for an application fault, the task's team);
    /// touched nothing.
    Alert,
    /// Took one GPU out of service: its tasks are requeued, nothing new is placed on it.
    GpuOutOfService,
    /// Returned a GPU it had taken out to service.
    GpuReturnToService,
    /// No new work on the node; what runs there stays.
    SoftCordon,
    /// No new work on the node, which is out of service until it has been healthy for the
    /// rule's time; what runs there stays.
    Cordon,
    /// Cordoned the node and moved its work: tasks that checkpoint are told to (SIGTERM) and
    /// given their grace period, then every task there is stopped and requeued, gangs whole.
    Drain,
    /// Returned a node it had cordoned or drained to service (healthy for the rule's time).
    ReturnToService,
    /// Asked an external actuator to reset one GPU.
    ResetRequest,
    /// Asked an external actuator to reboot the node.
    RebootRequest,
    /// Reclaimed an idle grant: the task's GPUs stayed under the utilization threshold for the
    /// whole window; it is stopped and requeued.
    IdleReclaim,
}

impl Action {
    /// The name as written on the wire (`gpu_out_of_service` …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Alert => "alert",
            Self::GpuOutOfService => "gpu_out_of_service",
            Self::GpuReturnToService => "gpu_return_to_service",
            Self::SoftCordon => "soft_cordon",
            Self::Cordon => "cordon",
            Self::Drain => "drain",
            Self::ReturnToService => "return_to_service",
            Self::ResetRequest => "reset_request",
            Self::RebootRequest => "reboot_request",
            Self::IdleReclaim => "idle_reclaim",
        }
    }
}

/// One reading behind an action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Evidence {
    /// What was measured (`thermal_margin_c`, `xid`, `heartbeat_silence_ms` …).
    pub signal: String,
    /// The GPU, for a GPU reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// The value read.
    pub value: f64,
    /// The rule's threshold, where it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    /// When it was read (the bus's time of the sample).
    pub at: DateTime<Utc>,
}

/// A run an action affected.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Affected {
    /// The lease it runs under.
    pub lease: LeaseId,
    /// Its workload.
    pub workload: String,
    /// The task's name in the workload.
    pub task: String,
    /// Its team (empty when the grant did not say).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub team: String,
}

/// Remediation acted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionTaken {
    /// The node.
    pub node: String,
    /// The GPU, for an action on one GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// What was done.
    pub action: Action,
    /// The rule that fired (or cleared), by its name in the rules file.
    pub rule: String,
    /// Why, in words an operator can act on.
    pub reason: String,
    /// The readings that decided it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<Evidence>,
    /// When the breach (or the healthy spell, for a return to service) began.
    pub since: DateTime<Utc>,
    /// The runs on the node (or GPU) when it acted, as its last telemetry showed them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<Affected>,
    /// The team concerned, for an alert about its task (an application fault) or a reclaim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// Why the action is milder than the rule asks (an operator holds the node; the circuit
    /// breaker is open), when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downgraded: Option<String>,
}

/// An operator cordoned (or uncordoned) a node: no new work while cordoned; remediation
/// leaves the node alone (its verdicts there become alerts) and never lifts the cordon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorCordon {
    /// The node.
    pub node: String,
    /// Cordoned (`true`) or uncordoned.
    pub cordoned: bool,
    /// Also stop and requeue what runs there (`allot cordon --drain`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
    /// Why, as the operator wrote it.
    pub reason: String,
    /// Who (the CLI user).
    pub by: String,
}
