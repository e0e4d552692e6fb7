//! What makes two submissions the same one, and the event that carries a submission.
//!
//! The **idempotency key** defaults to SHA-256 over the canonical spec (the workload serialized
//! by its types, so YAML or JSON, key order, comments and spacing do not matter) and the run id:
//! a retried CI job with the same spec and `--run-id` produces the same key. The message's
//! `Nats-Msg-Id` is a hash of the team, the key and the spec, so JetStream stores a retry once
//! within the WORKLOADS stream's duplicate window; the CloudEvent `id` is a UUIDv5 of it, and
//! the **workload id**
//! (`<name>-<10 hex digits>`) is derived from it and the team, so even a re-submission after the
//! window names the same workload and the planner can treat it as known. The planner derives the
//! id again from what a submission says: an id that does not follow, or a known id whose spec
//! differs, is refused — a raw client cannot squat the id of someone else's submission.

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

/// `<metadata.name>-<first 10 hex digits of SHA-256(<team>\n<key>)>`.
///
/// The team is part of it, so a team cannot take the id another team's submission will have
/// (the planner checks every submission's id against this derivation, and the server lets a
/// team submit only under its own team).
pub fn workload_id(workload: &Workload, key: &str) -> String {
    let digest = hex(&Sha256::digest(
        format!("{}\n{key}", workload.metadata.team).as_bytes(),
    ));
    format!("{}-{}", workload.metadata.name, &digest[..10])
}

/// The `Nats-Msg-Id` of the submission of `workload` with `key`: hex SHA-256 of
/// `allot/v1 submission\n<team>\n<key>\n<canonical spec>`. A retry (same team, key and spec)
/// is stored once; two teams that choose the same key, or one key reused for another spec, are
/// different messages, so the planner sees the second and refuses it out loud instead of
/// JetStream dropping it as a duplicate.
pub fn msg_id(workload: &Workload, key: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(b"allot/v1 submission\n");
    hash.update(workload.metadata.team.as_bytes());
    hash.update(b"\n");
    hash.update(key.as_bytes());
    hash.update(b"\n");
    hash.update(canonical_json(workload));
    hex(&hash.finalize())
}

/// The CloudEvent id of the submission with `msg_id` ([`msg_id`]): the same team, key and
/// spec, the same event.
pub fn event_id(msg_id: &str) -> Uuid {
    Uuid::new_v5(&EVENT_ID_NAMESPACE, msg_id.as_bytes())
}

/// A submission ready to publish: the CloudEvent, and the `Nats-Msg-Id` to send it with.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    /// The `WorkloadSubmitted` CloudEvent.
    pub envelope: Envelope<AnyEvent>,
    /// Its `Nats-Msg-Id` ([`msg_id`]: of the team, the idempotency key and the spec).
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
    let msg_id = msg_id(&workload, &key);
    let event = WorkloadSubmitted {
        workload_id: workload_id.clone(),
        idempotency_key: key.clone(),
        run_id,
        submitter,
        spec: workload,
    };
    let mut envelope = Envelope::at(source, event, now);
    envelope.id = event_id(&msg_id);
    Submission {
        envelope,
        msg_id,
        workload_id,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(team: &str) -> Workload {
        let text = format!(
            "apiVersion: allot/v1\nkind: Workload\nmetadata: {{name: nightly, team: {team}}}\n\
             spec:\n  tasks:\n    - {{name: a, command: [\"true\"]}}\n"
        );
        crate::check(&text, crate::Format::Yaml, crate::Context::default())
            .expect("a valid spec")
            .workload
    }

    #[test]
    fn the_same_key_names_different_workloads_and_messages_for_different_teams() {
        let (vision, nlp) = (workload("vision"), workload("nlp"));
        let key = "nightly-2026-11-24";
        assert_ne!(workload_id(&vision, key), workload_id(&nlp, key));
        assert_eq!(workload_id(&vision, key), workload_id(&vision, key));
        let now = Utc::now();
        let a = submission(vision, key.into(), None, "ci".into(), "/t", now);
        let b = submission(nlp, key.into(), None, "ci".into(), "/t", now);
        assert_ne!(a.msg_id, b.msg_id);
        assert_ne!(a.envelope.id, b.envelope.id);
        assert!(a.workload_id.starts_with("nightly-"));
    }
}
