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
//!
//! It follows only while someone reads: the nodes view, which is built when read, asks for the
//! samples ([`Demand::want`]) and waits for every node's last one when the follower was idle;
//! [`FOLLOW_FOR`] after the last such read the follower stops and forgets them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;

use allot_bus::Content;
use allot_events::telemetry::GpusSampled;
use allot_events::{AnyEvent, Envelope, TelemetryEvent, subject};

use crate::api::NodeView;

/// How long telemetry is followed after the nodes view last asked for it.
pub const FOLLOW_FOR: Duration = Duration::from_secs(60);

/// How long a view waits for every node's last sample when the follower starts (a view built
/// without them shows no readings until the next one).
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(2);

/// Whether anyone wants the samples, and whether they are current.
#[derive(Debug)]
pub struct Demand {
    /// When a view last asked for them.
    wanted: watch::Sender<Option<Instant>>,
    /// The follower holds every node's last sample and follows new ones.
    current: watch::Sender<bool>,
    /// A follower runs (without one, nobody waits for the samples).
    followed: std::sync::atomic::AtomicBool,
    /// How long after the last want the follower stops.
    follow_for: Duration,
}

impl Default for Demand {
    fn default() -> Self {
        Self::new(FOLLOW_FOR)
    }
}

impl Demand {
    /// Followed for `follow_for` after each want ([`FOLLOW_FOR`] in the service).
    pub fn new(follow_for: Duration) -> Self {
        Self {
            wanted: watch::Sender::new(None),
            current: watch::Sender::new(false),
            followed: std::sync::atomic::AtomicBool::new(false),
            follow_for,
        }
    }

    /// A view needs the samples now: the follower (re)starts if it was idle. Returns once
    /// they hold every node's last sample, or after [`CATCH_UP_WAIT`].
    pub async fn want(&self) {
        self.wanted.send_replace(Some(Instant::now()));
        if !self.followed.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let mut current = self.current.subscribe();
        let _ = tokio::time::timeout(CATCH_UP_WAIT, current.wait_for(|c| *c)).await;
    }

    /// When following may stop: `follow_for` after the last want (now if none).
    fn until(&self) -> Instant {
        self.wanted
            .borrow()
            .map_or_else(Instant::now, |at| at + self.follow_for)
    }

    /// Returns once a view wants the samples.
    async fn wanted(&self) {
        let mut wanted = self.wanted.subscribe();
        let _ = wanted
            .wait_for(|at| at.is_some_and(|at| at.elapsed() < self.follow_for))
            .await;
    }
}

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

    /// Forgets every sample (nobody reads them any more).
    pub fn clear(&mut self) {
        self.nodes = HashMap::new();
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

/// Follows TELEMETRY into `samples` while `demand` wants them, from each node's last sample;
/// when the read fails, it starts again from the last samples after a pause (250 ms, doubling
/// to 5 s while it keeps failing). [`FOLLOW_FOR`] after the last want (the demand's own
/// period) it stops and forgets them until the next.
pub async fn follow(js: jetstream::Context, samples: Arc<Mutex<Samples>>, demand: Arc<Demand>) {
    demand
        .followed
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut backoff = Duration::from_millis(250);
    loop {
        demand.wanted().await;
        match follow_while_wanted(&js, &samples, &demand).await {
            Ok(()) => backoff = Duration::from_millis(250),
            Err(e) => {
                demand.current.send_replace(false);
                tracing::warn!(error = %e, retry_in = ?backoff, "reading telemetry; reading the last samples again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Reads every node's last sample, then new ones, until nobody has wanted them for the
/// demand's period (then forgets them) or the read ends.
async fn follow_while_wanted(
    js: &jetstream::Context,
    samples: &Mutex<Samples>,
    demand: &Demand,
) -> Result<(), String> {
    let failed = |e: &dyn std::fmt::Display| format!("reading telemetry: {e}");
    let consumer = js
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
        .map_err(|e| failed(&e))?;
    if consumer.cached_info().num_pending == 0 {
        demand.current.send_replace(true);
    }
    let mut messages = consumer.messages().await.map_err(|e| failed(&e))?;
    // One timer for the whole read, moved on only when it fires before a later want's end.
    let idle = tokio::time::sleep_until(demand.until());
    tokio::pin!(idle);
    loop {
        let message = tokio::select! {
            message = messages.next() => message,
            () = idle.as_mut() => {
                let until = demand.until();
                if until > Instant::now() {
                    idle.as_mut().reset(until);
                    continue;
                }
                demand.current.send_replace(false);
                samples.lock().expect("samples lock").clear();
                return Ok(());
            }
        };
        let Some(message) = message else {
            return Ok(());
        };
        let message = message.map_err(|e| failed(&e))?;
        let Ok(info) = message.info() else { continue };
        let at = allot_bus::consumer::stored_at(&info);
        if let Some(sample) = read(&message) {
            samples.lock().expect("samples lock").apply(sample, at);
        }
        if info.pending == 0 {
            demand
                .current
                .send_if_modified(|current| !std::mem::replace(current, true));
        }
    }
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

    /// Telemetry is read only while views want it: nothing before the first want, every
    /// node's last sample by the time a want returns, and nothing kept once nobody has wanted
    /// them for the demand's period (real nats-server; the period 1 s here, 60 s in service).
    #[tokio::test]
    async fn samples_are_followed_only_while_views_want_them() {
        let nats = allot_testkit::NatsServer::start();
        let client = async_nats::connect(nats.url()).await.unwrap();
        let js = jetstream::new(client.clone());
        allot_bus::ensure_streams(&js, &allot_bus::catalog(1))
            .await
            .unwrap();
        let publisher = allot_bus::Publisher::new(client, "/test");
        let node = allot_testkit::node("n1").gpus(2);
        publisher
            .publish(TelemetryEvent::GpusSampled(node.sampled(30)))
            .await
            .unwrap();
        let samples: Arc<Mutex<Samples>> = Arc::default();
        let demand = Arc::new(Demand::new(Duration::from_secs(1)));
        let follower = tokio::spawn(follow(js, samples.clone(), demand.clone()));
        let held = || samples.lock().unwrap().nodes.len();

        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(held(), 0, "nothing is read before a view wants it");
        demand.want().await;
        assert_eq!(held(), 1, "a want returns with every node's last sample");

        // Bounded: 40 × 100 ms after the last want, the samples are gone.
        let mut forgotten = false;
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if held() == 0 {
                forgotten = true;
                break;
            }
        }
        assert!(forgotten, "nobody wanted them for the period: forgotten");
        demand.want().await;
        assert_eq!(held(), 1, "read again at the next want");
        follower.abort();
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
