//! The latest GPU readings of every node — what `GET /api/v1/nodes` shows of each GPU's load —
//! kept in memory, not in `gateway.db`.
//!
//! Telemetry is the busiest stream by far (a sample of every node every second), and only the
//! newest sample of each node is ever shown. Projected into SQLite like the other streams, it
//! cost a quarter of the gateway's CPU at 2,000 nodes: eight row updates, an acknowledgement
//! and their share of the WAL per sample (kept in memory, 70% of that: receiving and decoding
//! 2,000 samples a second is most of it; docs/benchmarks.md). Instead an ordered consumer reads
//! TELEMETRY from each node's last sample (`DeliverPolicy::LastPerSubject`) and follows it:
//! nothing is acknowledged or stored, and a gateway that restarts, or whose read fails, reads
//! the last samples again. Like every consumer, it believes a sample only on its own node's
//! subject, the one the server lets that node's collector publish on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy};
use chrono::{DateTime, Utc};
use futures::StreamExt;

use allot_bus::Content;
use allot_events::telemetry::GpusSampled;
use allot_events::{AnyEvent, Envelope, TelemetryEvent, subject};

use crate::api::NodeView;

/// Every node's latest sample.
#[derive(Debug, Default)]
pub struct Samples {
    nodes: HashMap<String, Latest>,
}

#[derive(Debug)]
struct Latest {
    /// When the stream stored it.
    at: DateTime<Utc>,
    sample: GpusSampled,
}

impl Samples {
    /// Takes `sample`, stored at `at`, unless the node's latest is newer.
    pub fn apply(&mut self, sample: GpusSampled, at: DateTime<Utc>) {
        match self.nodes.get_mut(&sample.node) {
            Some(latest) if latest.at > at => {}
            Some(latest) => *latest = Latest { at, sample },
            None => {
                self.nodes
                    .insert(sample.node.clone(), Latest { at, sample });
            }
        }
    }

    /// Writes each GPU's latest reading into `nodes`.
    pub fn fill(&self, nodes: &mut [NodeView]) {
        for node in nodes {
            let Some(latest) = self.nodes.get(&node.name) else {
                continue;
            };
            let at = latest.at.to_rfc3339();
            for reading in &latest.sample.samples {
                if let Some(gpu) = node.gpus.iter_mut().find(|g| g.index == reading.index) {
                    gpu.utilization_pct = reading.utilization_pct.map(i64::from);
                    gpu.temperature_c = reading.temperature_c.map(i64::from);
                    gpu.memory_used_mib = Some(reading.memory_used_mib as i64);
                    gpu.power_mw = reading.power_mw.map(|p| p as i64);
                    gpu.sampled_at = Some(at.clone());
                }
            }
        }
    }
}

/// Follows TELEMETRY into `samples` for as long as the service runs, from each node's last
/// sample; when the read fails, it starts again from the last samples after a pause (250 ms,
/// doubling to 5 s while it keeps failing).
pub async fn follow(js: jetstream::Context, samples: Arc<Mutex<Samples>>) {
    let mut backoff = Duration::from_millis(250);
    loop {
        match follow_once(&js, &samples).await {
            Ok(()) => backoff = Duration::from_millis(250),
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "reading telemetry; reading the last samples again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

async fn follow_once(js: &jetstream::Context, samples: &Mutex<Samples>) -> Result<(), String> {
    let failed = |e: &dyn std::fmt::Display| format!("reading telemetry: {e}");
    let mut messages = js
        .get_stream(allot_bus::streams::names::TELEMETRY)
        .await
        .map_err(|e| failed(&e))?
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: subject::TELEMETRY_ALL.to_owned(),
            deliver_policy: DeliverPolicy::LastPerSubject,
            max_expires: allot_bus::consumer::ORDERED_MAX_EXPIRES,
            ..Default::default()
        })
        .await
        .map_err(|e| failed(&e))?
        .messages()
        .await
        .map_err(|e| failed(&e))?;
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| failed(&e))?;
        let Ok(info) = message.info() else { continue };
        let at = allot_bus::consumer::stored_at(&info);
        if let Some(sample) = read(&message) {
            samples.lock().expect("samples lock").apply(sample, at);
        }
    }
    Ok(())
}

/// The sample in a message, if it is a `GpusSampled` event on its own node's subject (the one
/// the server lets that node's collector publish on). Neither believed nor dead-lettered here:
/// the inventory, TELEMETRY's consumer of record, dead-letters what cannot be read or is on
/// another node's subject.
fn read(message: &async_nats::Message) -> Option<GpusSampled> {
    match <Envelope as Content>::read(message) {
        Ok(Envelope {
            data: AnyEvent::Telemetry(TelemetryEvent::GpusSampled(sample)),
            ..
        }) => Some(sample),
        Ok(_) => None,
        Err(why) => {
            tracing::debug!(subject = %message.subject, %why, "telemetry not taken");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(node: &str, utilization: u32) -> GpusSampled {
        serde_json::from_value(serde_json::json!({
            "node": node,
            "samples": [{"index": 0, "uuid": "GPU-0", "utilization_pct": utilization,
                "memory_used_mib": 1000, "memory_total_mib": 80_000}],
        }))
        .unwrap()
    }

    #[test]
    fn an_older_sample_read_again_does_not_replace_a_newer_one() {
        let t = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap();
        let mut samples = Samples::default();
        samples.apply(sample("n1", 10), t(1));
        samples.apply(sample("n1", 20), t(2));
        samples.apply(sample("n1", 10), t(1));
        let latest = &samples.nodes["n1"];
        assert_eq!(latest.at, t(2));
        assert_eq!(latest.sample.samples[0].utilization_pct, Some(20));
    }

    #[test]
    fn only_a_gpus_sampled_event_on_its_own_nodes_subject_is_read() {
        let node = allot_testkit::node("n1").gpus(2);
        let message = |subject: &str, event: allot_events::AnyEvent| async_nats::Message {
            subject: subject.into(),
            reply: None,
            payload: Envelope::new("/test", event).to_json().into(),
            headers: None,
            status: None,
            description: None,
            length: 0,
        };
        let sampled = || TelemetryEvent::GpusSampled(node.sampled(42)).into();
        let got = read(&message("allot.telemetry.n1", sampled())).expect("its own subject");
        assert_eq!(got.node, "n1");
        assert!(
            read(&message("allot.telemetry.n2", sampled())).is_none(),
            "another node's subject"
        );
        let registered = allot_events::NodeEvent::Registered(node.registered()).into();
        assert!(
            read(&message("allot.node.registered.n1", registered)).is_none(),
            "another event"
        );
    }
}
