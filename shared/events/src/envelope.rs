//! The CloudEvents 1.0 envelope (structured JSON mode) and decoding from the wire.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{
    AccessEvent, AllocEvent, CostEvent, InventoryEvent, NodeEvent, RemediationEvent, TYPE_PREFIX,
    TaskEvent, TelemetryEvent, WorkloadEvent,
};

/// The CloudEvents spec version Allot writes and accepts.
pub const SPEC_VERSION: &str = "1.0";

/// A CloudEvents 1.0 event in structured JSON mode, with Allot's extension attributes.
///
/// `id` is a UUIDv7 (time-ordered) and is also sent as the `Nats-Msg-Id` header, so JetStream
/// stores an event published twice only once — except a telemetry sample, which is never
/// published twice ([`EventKind::deduplicated`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Envelope<T = AnyEvent> {
    /// Always `"1.0"`.
    pub specversion: String,
    /// Unique id of this event (UUIDv7); the JetStream de-duplication key.
    pub id: Uuid,
    /// Who produced the event, e.g. `/allot/collector/node-1`.
    pub source: String,
    /// `io.allot.<domain>.v<major>.<event>`.
    #[serde(rename = "type")]
    pub ty: String,
    /// When the producer observed what the event reports.
    pub time: DateTime<Utc>,
    /// The entity the event is about (a node name, a workload id …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Always `application/json`.
    pub datacontenttype: String,
    /// Extension: the team the event belongs to, when it belongs to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// Extension: W3C trace context of the operation that caused the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The event's payload.
    pub data: T,
}

/// What every domain event can say about itself.
pub trait EventKind {
    /// Full CloudEvents type (`io.allot.node.v1.registered`).
    fn event_type(&self) -> String;
    /// The NATS subject the event is published on.
    fn nats_subject(&self) -> String;
    /// The entity the event is about (CloudEvents `subject`).
    fn entity(&self) -> String;
    /// The team the event belongs to, if any.
    fn team(&self) -> Option<&str> {
        None
    }
    /// Whether the event is published with its id as `Nats-Msg-Id`, so that the stream stores
    /// it once however often it is sent (within the stream's duplicate window). Every event
    /// but a telemetry sample: those are sent once and never again (see
    /// [`TelemetryEvent`](crate::TelemetryEvent)), and an id the server remembers for each of
    /// them would cost it a duplicate-window entry per sample that nothing can ever match.
    fn deduplicated(&self) -> bool {
        true
    }
}

/// Any event Allot knows, by domain.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum AnyEvent {
    /// Facts a node's collector reports about the node.
    Node(NodeEvent),
    /// GPU telemetry samples.
    Telemetry(TelemetryEvent),
    /// State changes the inventory derives (reachability, health).
    Inventory(InventoryEvent),
    /// Workloads submitted and aborted.
    Workload(WorkloadEvent),
    /// Tasks' lifecycle.
    Task(TaskEvent),
    /// The allocator's journal.
    Alloc(AllocEvent),
    /// Costs and budgets.
    Cost(CostEvent),
    /// Remediation's actions and operators' cordons.
    Remediation(RemediationEvent),
    /// API tokens issued and revoked.
    Access(AccessEvent),
}

impl From<NodeEvent> for AnyEvent {
    fn from(e: NodeEvent) -> Self {
        Self::Node(e)
    }
}
impl From<TelemetryEvent> for AnyEvent {
    fn from(e: TelemetryEvent) -> Self {
        Self::Telemetry(e)
    }
}
impl From<InventoryEvent> for AnyEvent {
    fn from(e: InventoryEvent) -> Self {
        Self::Inventory(e)
    }
}
impl From<WorkloadEvent> for AnyEvent {
    fn from(e: WorkloadEvent) -> Self {
        Self::Workload(e)
    }
}
impl From<TaskEvent> for AnyEvent {
    fn from(e: TaskEvent) -> Self {
        Self::Task(e)
    }
}
impl From<AllocEvent> for AnyEvent {
    fn from(e: AllocEvent) -> Self {
        Self::Alloc(e)
    }
}
impl From<CostEvent> for AnyEvent {
    fn from(e: CostEvent) -> Self {
        Self::Cost(e)
    }
}
impl From<RemediationEvent> for AnyEvent {
    fn from(e: RemediationEvent) -> Self {
        Self::Remediation(e)
    }
}
impl From<AccessEvent> for AnyEvent {
    fn from(e: AccessEvent) -> Self {
        Self::Access(e)
    }
}

impl EventKind for AnyEvent {
    fn event_type(&self) -> String {
        match self {
            Self::Node(e) => e.event_type(),
            Self::Telemetry(e) => e.event_type(),
            Self::Inventory(e) => e.event_type(),
            Self::Workload(e) => e.event_type(),
            Self::Task(e) => e.event_type(),
            Self::Alloc(e) => e.event_type(),
            Self::Cost(e) => e.event_type(),
            Self::Remediation(e) => e.event_type(),
            Self::Access(e) => e.event_type(),
        }
    }
    fn nats_subject(&self) -> String {
        match self {
            Self::Node(e) => e.nats_subject(),
            Self::Telemetry(e) => e.nats_subject(),
            Self::Inventory(e) => e.nats_subject(),
            Self::Workload(e) => e.nats_subject(),
            Self::Task(e) => e.nats_subject(),
            Self::Alloc(e) => e.nats_subject(),
            Self::Cost(e) => e.nats_subject(),
            Self::Remediation(e) => e.nats_subject(),
            Self::Access(e) => e.nats_subject(),
        }
    }
    fn entity(&self) -> String {
        match self {
            Self::Node(e) => e.entity(),
            Self::Telemetry(e) => e.entity(),
            Self::Inventory(e) => e.entity(),
            Self::Workload(e) => e.entity(),
            Self::Task(e) => e.entity(),
            Self::Alloc(e) => e.entity(),
            Self::Cost(e) => e.entity(),
            Self::Remediation(e) => e.entity(),
            Self::Access(e) => e.entity(),
        }
    }
    fn team(&self) -> Option<&str> {
        match self {
            Self::Node(e) => e.team(),
            Self::Telemetry(e) => e.team(),
            Self::Inventory(e) => e.team(),
            Self::Workload(e) => e.team(),
            Self::Task(e) => e.team(),
            Self::Alloc(e) => e.team(),
            Self::Cost(e) => e.team(),
            Self::Remediation(e) => e.team(),
            Self::Access(e) => e.team(),
        }
    }
    fn deduplicated(&self) -> bool {
        match self {
            Self::Node(e) => e.deduplicated(),
            Self::Telemetry(e) => e.deduplicated(),
            Self::Inventory(e) => e.deduplicated(),
            Self::Workload(e) => e.deduplicated(),
            Self::Task(e) => e.deduplicated(),
            Self::Alloc(e) => e.deduplicated(),
            Self::Cost(e) => e.deduplicated(),
            Self::Remediation(e) => e.deduplicated(),
            Self::Access(e) => e.deduplicated(),
        }
    }
}

impl Envelope<AnyEvent> {
    /// Wraps `event` in a new envelope: fresh UUIDv7 id, `time` = now.
    pub fn new(source: impl Into<String>, event: impl Into<AnyEvent>) -> Self {
        Self::at(source, event, Utc::now())
    }

    /// Wraps `event` in a new envelope observed at `time`.
    pub fn at(source: impl Into<String>, event: impl Into<AnyEvent>, time: DateTime<Utc>) -> Self {
        let data = event.into();
        Self {
            specversion: SPEC_VERSION.to_owned(),
            id: Uuid::now_v7(),
            source: source.into(),
            ty: data.event_type(),
            time,
            subject: Some(data.entity()),
            datacontenttype: "application/json".to_owned(),
            team: data.team().map(str::to_owned),
            traceparent: None,
            data,
        }
    }

    /// The NATS subject this event is published on.
    pub fn nats_subject(&self) -> String {
        self.data.nats_subject()
    }

    /// The event as structured-mode CloudEvents JSON.
    ///
    /// Written into a buffer kept per thread and copied out at its final length: a vector
    /// grown from empty would be reallocated and copied about five times for a node's
    /// telemetry sample (2 KB).
    pub fn to_json(&self) -> Vec<u8> {
        thread_local! {
            static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        /// A buffer that grew past this (a large event) is not kept.
        const KEEP: usize = 64 * 1024;
        BUFFER.with_borrow_mut(|buffer| {
            buffer.clear();
            // Serializing plain data structs with string keys cannot fail.
            serde_json::to_writer(&mut *buffer, self).expect("events serialize to JSON");
            let json = buffer.to_vec();
            if buffer.capacity() > KEEP {
                *buffer = Vec::new();
            }
            json
        })
    }
}

/// Why bytes from the wire are not an event this build understands.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON, or JSON that is not a CloudEvents envelope.
    #[error("malformed CloudEvent: {0}")]
    Malformed(#[source] serde_json::Error),
    /// A CloudEvents `specversion` other than 1.0.
    #[error("unsupported CloudEvents specversion {0:?} (expected \"1.0\")")]
    SpecVersion(String),
    /// A type outside `io.allot.*`, or an Allot domain/event this build does not know.
    #[error("unknown event type {0:?}")]
    UnknownType(String),
    /// A known event at a major version newer than this build understands.
    #[error("event type {ty:?} is version v{found}; this build understands up to v{supported}")]
    UnsupportedVersion {
        /// The full type as received.
        ty: String,
        /// The major version received.
        found: u32,
        /// The newest major version this build reads.
        supported: u32,
    },
    /// A known type whose `data` does not match its schema.
    #[error("invalid data for {ty}: {source}")]
    InvalidData {
        /// The full type as received.
        ty: String,
        /// What serde found wrong.
        #[source]
        source: serde_json::Error,
    },
}

/// Decodes a structured-mode CloudEvent into a typed Allot event.
///
/// Events as Allot writes them name their `type` before their `data`, and those are read in
/// one pass: `data` is parsed straight into the payload type `type` names, as it is reached.
/// Anything else — `data` first (CloudEvents does not fix the order), or input that is not a
/// valid event — is read by [`decode_in_two_passes`], which alone decides what is wrong with
/// it, so the answer never depends on the path.
pub fn decode(bytes: &[u8]) -> Result<Envelope<AnyEvent>, DecodeError> {
    // UTF-8 checked once for the whole event (fast on ASCII), so that strings are not checked
    // one by one as they are read: that was a fifth of decoding a telemetry sample.
    let Ok(text) = std::str::from_utf8(bytes) else {
        return decode_in_two_passes(bytes);
    };
    let mut reader = serde_json::Deserializer::from_str(text);
    match serde::Deserializer::deserialize_map(&mut reader, OnePass).and_then(|e| {
        reader.end()?;
        Ok(e)
    }) {
        Ok(envelope) => Ok(envelope),
        Err(_) => decode_in_two_passes(bytes),
    }
}

/// The envelope read first with `data` left as raw JSON text, then `data` parsed into the
/// payload type its `type` names: what [`decode`] falls back to, and the one judge of why bytes
/// are not an event.
fn decode_in_two_passes(bytes: &[u8]) -> Result<Envelope<AnyEvent>, DecodeError> {
    let raw: Envelope<&serde_json::value::RawValue> =
        serde_json::from_slice(bytes).map_err(DecodeError::Malformed)?;
    if raw.specversion != SPEC_VERSION {
        return Err(DecodeError::SpecVersion(raw.specversion));
    }
    let (domain, version, name) =
        parse_type(&raw.ty).ok_or_else(|| DecodeError::UnknownType(raw.ty.clone()))?;

    let Some((supported, names)) = known_domain(domain) else {
        return Err(DecodeError::UnknownType(raw.ty));
    };
    if version > supported {
        return Err(DecodeError::UnsupportedVersion {
            ty: raw.ty,
            found: version,
            supported,
        });
    }
    if !names.contains(&name) {
        return Err(DecodeError::UnknownType(raw.ty));
    }
    // Every domain is still at v1, so there is nothing older to upcast yet; an upcaster for
    // `version < supported` goes here when a v2 arrives.
    let data = serde::de::DeserializeSeed::deserialize(
        Data { domain, name },
        &mut serde_json::Deserializer::from_str(raw.data.get()),
    );
    let data = match data {
        Err(source) => return Err(DecodeError::InvalidData { ty: raw.ty, source }),
        Ok(data) => data,
    };
    Ok(Envelope {
        specversion: raw.specversion,
        id: raw.id,
        source: raw.source,
        ty: raw.ty,
        time: raw.time,
        subject: raw.subject,
        datacontenttype: raw.datacontenttype,
        team: raw.team,
        traceparent: raw.traceparent,
        data,
    })
}

/// What this build reads of `domain`: the newest major version of its events, and their
/// names; `None` for a domain it does not know.
fn known_domain(domain: &str) -> Option<(u32, &'static [&'static str])> {
    Some(match domain {
        NodeEvent::DOMAIN => (NodeEvent::VERSION, NodeEvent::NAMES),
        TelemetryEvent::DOMAIN => (TelemetryEvent::VERSION, TelemetryEvent::NAMES),
        InventoryEvent::DOMAIN => (InventoryEvent::VERSION, InventoryEvent::NAMES),
        WorkloadEvent::DOMAIN => (WorkloadEvent::VERSION, WorkloadEvent::NAMES),
        TaskEvent::DOMAIN => (TaskEvent::VERSION, TaskEvent::NAMES),
        AllocEvent::DOMAIN => (AllocEvent::VERSION, AllocEvent::NAMES),
        CostEvent::DOMAIN => (CostEvent::VERSION, CostEvent::NAMES),
        RemediationEvent::DOMAIN => (RemediationEvent::VERSION, RemediationEvent::NAMES),
        AccessEvent::DOMAIN => (AccessEvent::VERSION, AccessEvent::NAMES),
        _ => return None,
    })
}

/// The `type` of an event this build reads: its domain and event name, or `None` for a type
/// it does not know or a newer major version.
fn supported_type(ty: &str) -> Option<(&str, &str)> {
    let (domain, version, name) = parse_type(ty)?;
    let (supported, names) = known_domain(domain)?;
    (version <= supported && names.contains(&name)).then_some((domain, name))
}

/// Reads an envelope whose `specversion` and `type` come before its `data` in one pass (see
/// [`decode`]); fails on anything else, including what the derived reading would accept only
/// in another order.
struct OnePass;

/// Parses `data` as the payload of the event `type` named (one [`known_domain`] knows).
struct Data<'a> {
    domain: &'a str,
    name: &'a str,
}

impl<'de> serde::de::DeserializeSeed<'de> for Data<'_> {
    type Value = AnyEvent;

    fn deserialize<D: serde::Deserializer<'de>>(self, data: D) -> Result<AnyEvent, D::Error> {
        let name = self.name;
        match self.domain {
            NodeEvent::DOMAIN => NodeEvent::deserialize_data(name, data).map(AnyEvent::Node),
            TelemetryEvent::DOMAIN => {
                TelemetryEvent::deserialize_data(name, data).map(AnyEvent::Telemetry)
            }
            InventoryEvent::DOMAIN => {
                InventoryEvent::deserialize_data(name, data).map(AnyEvent::Inventory)
            }
            WorkloadEvent::DOMAIN => {
                WorkloadEvent::deserialize_data(name, data).map(AnyEvent::Workload)
            }
            TaskEvent::DOMAIN => TaskEvent::deserialize_data(name, data).map(AnyEvent::Task),
            AllocEvent::DOMAIN => AllocEvent::deserialize_data(name, data).map(AnyEvent::Alloc),
            CostEvent::DOMAIN => CostEvent::deserialize_data(name, data).map(AnyEvent::Cost),
            RemediationEvent::DOMAIN => {
                RemediationEvent::deserialize_data(name, data).map(AnyEvent::Remediation)
            }
            AccessEvent::DOMAIN => AccessEvent::deserialize_data(name, data).map(AnyEvent::Access),
            _ => Err(<D::Error as serde::de::Error>::custom("unknown domain")),
        }
    }
}

impl<'de> serde::de::Visitor<'de> for OnePass {
    type Value = Envelope<AnyEvent>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a CloudEvent naming its type before its data")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        /// Reads a field's value, refusing a second one as the derived reading does.
        fn once<'de, A: serde::de::MapAccess<'de>, T: Deserialize<'de>>(
            map: &mut A,
            slot: &mut Option<T>,
            field: &'static str,
        ) -> Result<(), A::Error> {
            if slot.is_some() {
                return Err(A::Error::duplicate_field(field));
            }
            *slot = Some(map.next_value()?);
            Ok(())
        }
        let (mut specversion, mut source, mut ty, mut datacontenttype) = (
            None::<String>,
            None::<String>,
            None::<String>,
            None::<String>,
        );
        let (mut id, mut time) = (None::<Uuid>, None::<DateTime<Utc>>);
        let (mut subject, mut team, mut traceparent) = (
            None::<Option<String>>,
            None::<Option<String>>,
            None::<Option<String>>,
        );
        let mut data = None;
        // An escaped key is not `&str`-borrowable: the error sends it to the other path.
        while let Some(key) = map.next_key::<&'de str>()? {
            match key {
                "specversion" => once(&mut map, &mut specversion, "specversion")?,
                "id" => once(&mut map, &mut id, "id")?,
                "source" => once(&mut map, &mut source, "source")?,
                "type" => once(&mut map, &mut ty, "type")?,
                "time" => once(&mut map, &mut time, "time")?,
                "subject" => once(&mut map, &mut subject, "subject")?,
                "datacontenttype" => once(&mut map, &mut datacontenttype, "datacontenttype")?,
                "team" => once(&mut map, &mut team, "team")?,
                "traceparent" => once(&mut map, &mut traceparent, "traceparent")?,
                "data" => {
                    let (Some(spec), Some(ty)) = (&specversion, &ty) else {
                        return Err(A::Error::custom("data before specversion or type"));
                    };
                    if spec != SPEC_VERSION || data.is_some() {
                        return Err(A::Error::custom("not for this path"));
                    }
                    let (domain, name) = supported_type(ty)
                        .ok_or_else(|| A::Error::custom("a type this build does not read"))?;
                    data = Some(map.next_value_seed(Data { domain, name })?);
                }
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        let missing = A::Error::missing_field;
        Ok(Envelope {
            specversion: specversion.ok_or_else(|| missing("specversion"))?,
            id: id.ok_or_else(|| missing("id"))?,
            source: source.ok_or_else(|| missing("source"))?,
            ty: ty.ok_or_else(|| missing("type"))?,
            time: time.ok_or_else(|| missing("time"))?,
            subject: subject.flatten(),
            datacontenttype: datacontenttype.ok_or_else(|| missing("datacontenttype"))?,
            team: team.flatten(),
            traceparent: traceparent.flatten(),
            data: data.ok_or_else(|| missing("data"))?,
        })
    }
}

/// Splits `io.allot.<domain>.v<N>.<event>` into its parts.
fn parse_type(ty: &str) -> Option<(&str, u32, &str)> {
    let rest = ty.strip_prefix(TYPE_PREFIX)?;
    let mut parts = rest.splitn(3, '.');
    let domain = parts.next()?;
    let version = parts.next()?.strip_prefix('v')?.parse().ok()?;
    let name = parts.next()?;
    Some((domain, version, name))
}

#[cfg(test)]
mod tests;
