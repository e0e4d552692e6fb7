//! The stream catalogue: every JetStream stream Allot uses, declared once, created or updated
//! idempotently when a service starts.

use std::time::Duration;

use async_nats::jetstream::{
    self,
    stream::{Config, DiscardPolicy, RetentionPolicy, StorageType},
};

use allot_events::subject;

use crate::error::BusError;

/// One stream as Allot wants it.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSpec {
    /// Stream name (`FLEET`, `TELEMETRY` …).
    pub name: &'static str,
    /// What the stream holds, for operators.
    pub description: &'static str,
    /// Subjects captured.
    pub subjects: Vec<String>,
    /// Retention policy.
    pub retention: RetentionPolicy,
    /// File (the default) or memory.
    pub storage: StorageType,
    /// Replicas: 1 on a laptop, 3 in production.
    pub replicas: usize,
    /// Oldest message kept; `None` keeps messages until other limits apply.
    pub max_age: Option<Duration>,
    /// Messages kept per subject; `None` for no limit.
    pub max_msgs_per_subject: Option<i64>,
    /// Forbid deleting single messages (audit streams).
    pub deny_delete: bool,
    /// Forbid purging the stream (audit streams).
    pub deny_purge: bool,
    /// Window in which a repeated `Nats-Msg-Id` is dropped as a duplicate.
    pub duplicate_window: Duration,
    /// Accept atomic batches ([`crate::Publisher::publish_atomic`]).
    pub allow_atomic: bool,
}

impl StreamSpec {
    fn new(name: &'static str, description: &'static str, subjects: &[&str]) -> Self {
        Self {
            name,
            description,
            subjects: subjects.iter().map(|s| (*s).to_owned()).collect(),
            retention: RetentionPolicy::Limits,
            storage: StorageType::File,
            replicas: 1,
            max_age: None,
            max_msgs_per_subject: None,
            deny_delete: false,
            deny_purge: false,
            duplicate_window: Duration::from_secs(120),
            allow_atomic: false,
        }
    }

    /// The JetStream configuration for this spec.
    pub fn config(&self) -> Config {
        Config {
            name: self.name.to_owned(),
            description: Some(self.description.to_owned()),
            subjects: self.subjects.clone(),
            retention: self.retention,
            storage: self.storage,
            num_replicas: self.replicas,
            max_age: self.max_age.unwrap_or_default(),
            max_messages_per_subject: self.max_msgs_per_subject.unwrap_or(-1),
            max_messages: -1,
            max_bytes: -1,
            discard: DiscardPolicy::Old,
            deny_delete: self.deny_delete,
            deny_purge: self.deny_purge,
            duplicate_window: self.duplicate_window,
            allow_direct: true,
            allow_atomic_publish: self.allow_atomic,
            ..Config::default()
        }
    }

    /// This spec as it should be applied over a running stream: with the stream's replicas
    /// where it has more. Replicas are the operator's to raise (`--stream-replicas 3` on a
    /// cluster); a service started with the single-server default must never lower them.
    fn over(&self, current: &Config) -> Self {
        Self {
            replicas: self.replicas.max(current.num_replicas),
            ..self.clone()
        }
    }

    /// Whether a running stream's config already matches this spec in every managed field.
    fn matches(&self, current: &Config) -> bool {
        let want = self.config();
        let mut subjects = current.subjects.clone();
        subjects.sort();
        let mut want_subjects = want.subjects.clone();
        want_subjects.sort();
        subjects == want_subjects
            && current.description == want.description
            && current.retention == want.retention
            && current.storage == want.storage
            && current.num_replicas == want.num_replicas
            && current.max_age == want.max_age
            && current.max_messages_per_subject == want.max_messages_per_subject
            && current.deny_delete == want.deny_delete
            && current.deny_purge == want.deny_purge
            && current.duplicate_window == want.duplicate_window
            && current.allow_atomic_publish == want.allow_atomic_publish
    }
}

/// Registrations and heartbeats kept per node (per subject) in FLEET.
pub const FLEET_MSGS_PER_SUBJECT: i64 = 64;

/// How long WORKLOADS remembers a `Nats-Msg-Id`: a workload submitted again within this window
/// (a CI job retried with the same spec and run id) is stored once. One hour covers automatic
/// retries and a person re-running a failed job soon after, while keeping the server's table of
/// ids small (task lifecycle events share the stream). Beyond the window the same submission
/// is stored again, but with the same workload id, which the planner treats as known.
pub const WORKLOADS_DUPLICATE_WINDOW: Duration = Duration::from_secs(3600);

/// How long COSTS remembers a `Nats-Msg-Id`: billing gives every cost event a stable id and
/// publishes it again after a crash or a lost acknowledgement; within this window the server
/// stores it once, so a team is never charged twice for one period of one lease.
pub const COSTS_DUPLICATE_WINDOW: Duration = Duration::from_secs(3600);

/// How long the REMEDIATION stream remembers message ids: remediation publishes each action
/// under an id derived from its rule state, so one re-published after a crash is stored once.
pub const REMEDIATION_DUPLICATE_WINDOW: Duration = Duration::from_secs(3600);

/// Stream names, for consumers and tools.
pub mod names {
    /// Node registrations and heartbeats.
    pub const FLEET: &str = "FLEET";
    /// GPU telemetry (short-lived).
    pub const TELEMETRY: &str = "TELEMETRY";
    /// Inventory state changes.
    pub const INVENTORY: &str = "INVENTORY";
    /// Messages no consumer could handle, with the reason.
    pub const DEADLETTER: &str = "DEADLETTER";
    /// Workloads and their tasks' lifecycle: the durable record of what was asked and done.
    pub const WORKLOADS: &str = "WORKLOADS";
    /// The allocator's append-only journal: every input it applied and every decision it made.
    pub const DECISIONS: &str = "DECISIONS";
    /// Cost events of every team (`allot.cost.<team>.<workload>`), from billing; append-only.
    /// Each team reads its own share through a stream in its own NATS account (see
    /// [`crate::accounts`]), never this one.
    pub const COSTS: &str = "COSTS";
    /// Remediation's actions and operators' cordons (`allot.remediation.<event>.<node>`);
    /// append-only: the allocator's journal points into it.
    pub const REMEDIATION: &str = "REMEDIATION";
    /// API tokens issued and revoked (the gateway's).
    pub const ACCESS: &str = "ACCESS";
}

/// Every stream Allot uses, with `replicas` copies each (1 on one server, 3 on a cluster).
pub fn catalog(replicas: usize) -> Vec<StreamSpec> {
    let mut streams = vec![
        StreamSpec {
            // Keep the last registrations and heartbeats of every node, however old: a node
            // that registered a year ago is still part of the cluster.
            max_msgs_per_subject: Some(FLEET_MSGS_PER_SUBJECT),
            ..StreamSpec::new(
                names::FLEET,
                "Node registrations and heartbeats from collectors",
                &[subject::NODE_ALL],
            )
        },
        StreamSpec {
            max_age: Some(Duration::from_secs(3600)),
            ..StreamSpec::new(
                names::TELEMETRY,
                "GPU telemetry samples (kept one hour)",
                &[subject::TELEMETRY_ALL],
            )
        },
        StreamSpec::new(
            names::INVENTORY,
            "Inventory conclusions: reachability and GPU health changes",
            &[subject::INVENTORY_ALL],
        ),
        // The durable record: kept for ever, nothing in it can be deleted or purged.
        StreamSpec {
            deny_delete: true,
            deny_purge: true,
            duplicate_window: WORKLOADS_DUPLICATE_WINDOW,
            ..StreamSpec::new(
                names::WORKLOADS,
                "Workloads submitted and aborted, and their tasks' lifecycle",
                &[subject::WORKLOAD_ALL, subject::TASK_ALL],
            )
        },
        // The allocator commits each batch of journal entries atomically, in one round trip.
        StreamSpec {
            deny_delete: true,
            deny_purge: true,
            allow_atomic: true,
            ..StreamSpec::new(
                names::DECISIONS,
                "The allocator's journal: every input applied and every decision made, in order",
                &[subject::ALLOC_ALL],
            )
        },
        StreamSpec {
            deny_delete: true,
            ..StreamSpec::new(
                names::DEADLETTER,
                "Messages a consumer could not handle, with the error and origin in headers",
                &["allot.deadletter.>"],
            )
        },
        // What every team is charged: part of the durable record, like DECISIONS.
        StreamSpec {
            deny_delete: true,
            deny_purge: true,
            duplicate_window: COSTS_DUPLICATE_WINDOW,
            ..StreamSpec::new(
                names::COSTS,
                "Cost events per team and workload, from billing; each team reads its own share",
                &[subject::COST_ALL],
            )
        },
        // Why capacity left and came back: the allocator journals these actions, so they are
        // part of the durable record too.
        StreamSpec {
            deny_delete: true,
            deny_purge: true,
            duplicate_window: REMEDIATION_DUPLICATE_WINDOW,
            ..StreamSpec::new(
                names::REMEDIATION,
                "Remediation's actions on nodes, GPUs and tasks, and operators' cordons",
                &[subject::REMEDIATION_ALL],
            )
        },
        // Who was granted what: an audit trail, so nothing in it can be deleted or purged. A
        // token is withdrawn by a later revocation, never by erasing its issue.
        StreamSpec {
            deny_delete: true,
            deny_purge: true,
            ..StreamSpec::new(
                names::ACCESS,
                "API tokens issued and revoked (hashes only), for the gateway",
                &[subject::ACCESS_ALL],
            )
        },
    ];
    for s in &mut streams {
        s.replicas = replicas;
    }
    streams
}

/// What [`ensure_streams`] did with one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// The stream did not exist and was created.
    Created,
    /// The stream existed with another configuration and was updated.
    Updated,
    /// The stream already matched its spec.
    Unchanged,
}

/// Creates missing streams and updates drifted ones, never lowering a stream's replicas; safe to
/// run from every service at start-up (when nothing drifted it only reads each stream's info).
pub async fn ensure_streams(
    js: &jetstream::Context,
    specs: &[StreamSpec],
) -> Result<Vec<(&'static str, Ensured)>, BusError> {
    let mut out = Vec::with_capacity(specs.len());
    for spec in specs {
        let outcome = match js.get_stream(spec.name).await {
            Ok(mut stream) => {
                let info = stream
                    .info()
                    .await
                    .map_err(|e| BusError::jetstream("reading stream", spec.name, e))?;
                let spec = spec.over(&info.config);
                if spec.matches(&info.config) {
                    Ensured::Unchanged
                } else {
                    js.update_stream(spec.config())
                        .await
                        .map_err(|e| BusError::jetstream("updating stream", spec.name, e))?;
                    tracing::info!(stream = spec.name, "stream configuration updated");
                    Ensured::Updated
                }
            }
            Err(_) => {
                // Not found (or not readable): create-or-update also settles the race with
                // another service creating the same stream at the same moment.
                match js.create_or_update_stream(spec.config()).await {
                    Ok(_) => {
                        tracing::info!(stream = spec.name, subjects = ?spec.subjects, "stream created");
                        Ensured::Created
                    }
                    // On a cluster, a create proposed while another service's is in flight
                    // can go unanswered until it times out, though the stream now exists.
                    Err(e) => match js.get_stream(spec.name).await {
                        Ok(_) => Ensured::Unchanged,
                        Err(_) => return Err(BusError::jetstream("creating stream", spec.name, e)),
                    },
                }
            }
        };
        out.push((spec.name, outcome));
    }
    Ok(out)
}
