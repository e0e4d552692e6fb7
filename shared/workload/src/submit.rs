//! What makes two submissions the same one, and the event that carries a submission.
//!
//! The **idempotency key** defaults to SHA-256 over the canonical spec (the workload serialized
//! by its types, so YAML or JSON, key order, comments and spacing do not matter) and the run id:
//! a retried CI job with the same spec and `--run-id` produces the same key. The key is the
//! message's `Nats-Msg-Id`, so JetStream stores the event once within the WORKLOADS stream's
//! duplicate window; the CloudEvent `id` is a UUIDv5 of the key, and the **workload id**
//! (`<name>-<10 hex digits>`) is derived from it too, so even a re-submission after the
//! window names the same workload and the planner can treat it as known.

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use allot_events::workload::{Workload, WorkloadSubmitted};
use allot_events::{AnyEvent, Envelope};

/// The namespace of CloudEvent ids derived from idempotency keys (UUIDv5).
pub const EVENT_ID_NAMESPACE: Uuid = Uuid::from_u128(0x6a1f_9c2e_4b7d_4e21_9a83_5d0c_7e14_b2f6);

/// The workload as it is hashed: compact JSON of the typed spec.
pub fn canonical_json(workload: &Workload) -> Vec<u8> {
    serde_json::to_vec(workload).expect("a workload serializes to JSON")
}

/// The default idempotency key: hex SHA-256 of `allot/v1 workload\n`, the canonical spec, `\n`
/// and the run id (empty when there is none).
pub fn idempotency_key(workload: &Workload, run_id: Option<&str>) -> String {
    let mut hash = Sha256::new();
    hash.update(b"allot/v1 workload\n");
    hash.update(canonical_json(workload));
    hash.update(b"\n");
    hash.update(run_id.unwrap_or_default().as_bytes());
    hex(&hash.finalize())
}

/// `<metadata.name>-<first 10 hex digits of SHA-256(key)>`.
pub fn workload_id(workload: &Workload, key: &str) -> String {
    let digest = hex(&Sha256::digest(key.as_bytes()));
    format!("{}-{}", workload.metadata.name, &digest[..10])
}

/// The CloudEvent id of the submission with `key`: the same key, the same event.
pub fn event_id(key: &str) -> Uuid {
    Uuid::new_v5(&EVENT_ID_NAMESPACE, key.as_bytes())
}

/// A submission ready to publish: the CloudEvent, and the `Nats-Msg-Id` to send it with.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    /// The `WorkloadSubmitted` CloudEvent.
    pub envelope: Envelope<AnyEvent>,
    /// The idempotency key (also in the event's data).
    pub msg_id: String,
    /// The workload's id.
    pub workload_id: String,
}

/// The submission of `workload` under `key`, from `source` (e.g. `/allot/cli`), at `now`.
pub fn submission(
    workload: Workload,
    key: String,
    run_id: Option<String>,
    submitter: String,
    source: &str,
    now: DateTime<Utc>,
) -> Submission {
    let workload_id = workload_id(&workload, &key);
    let event = WorkloadSubmitted {
        workload_id: workload_id.clone(),
        idempotency_key: key.clone(),
        run_id,
        submitter,
        spec: workload,
    };
    let mut envelope = Envelope::at(source, event, now);
    envelope.id = event_id(&key);
    Submission {
        envelope,
        msg_id: key,
        workload_id,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
