//! What every consumer counts, in the process's registry ([`allot_runtime::metrics`]):
//!
//! - `allot_consumer_messages_total{consumer}`: messages the consumer's handler applied (or
//!   recognised as applied) and that were acknowledged;
//! - `allot_dead_letters_total{consumer}`: messages it dead-lettered (undecodable, or rejected
//!   by the handler), counted once the dead-letter stream stored them;
//! - `allot_consumer_pending_messages{consumer}`: its lag — the messages matching its filter
//!   that the server has not delivered to it yet, as the last message it received said
//!   (JetStream puts that count in every message's metadata, so it costs no request). It is
//!   as fresh as the last delivery: 0 once caught up, and stale while a batch is retried.
//!
//! `consumer` is the durable consumer's name (`inventory-fleet`, `billing`), or for an
//! ordered consumer a name its owner gives (`allocator-<pool>-<stream>`).

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use allot_runtime::metrics::register;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Consumer {
    consumer: String,
}

struct Families {
    messages: Family<Consumer, Counter>,
    dead_letters: Family<Consumer, Counter>,
    pending: Family<Consumer, Gauge>,
}

static FAMILIES: LazyLock<Families> = LazyLock::new(|| Families {
    messages: register(
        "consumer_messages",
        "Messages a consumer applied and acknowledged",
        Family::default(),
    ),
    dead_letters: register(
        "dead_letters",
        "Messages a consumer dead-lettered (undecodable or rejected)",
        Family::default(),
    ),
    pending: register(
        "consumer_pending_messages",
        "Messages matching a consumer's filter not yet delivered to it, as of its last delivery",
        Family::default(),
    ),
});

/// One consumer's series; cheap to clone (the clones count together).
#[derive(Debug, Clone)]
pub struct ConsumerMetrics {
    messages: Counter,
    pending: Gauge,
}

impl ConsumerMetrics {
    /// The series of the consumer `name`, created at zero if new.
    pub fn new(name: &str) -> Self {
        let label = Consumer {
            consumer: name.to_owned(),
        };
        // At zero from the start, so that a rate over the first dead letter sees it.
        drop(FAMILIES.dead_letters.get_or_create(&label));
        Self {
            messages: FAMILIES.messages.get_or_create_owned(&label),
            pending: FAMILIES.pending.get_or_create_owned(&label),
        }
    }

    /// `n` more messages applied.
    pub fn handled(&self, n: u64) {
        self.messages.inc_by(n);
    }

    /// The server has `n` more messages for the consumer after the one just received.
    pub fn pending(&self, n: u64) {
        self.pending.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// One more message of `consumer` dead-lettered.
pub(crate) fn dead_lettered(consumer: &str) {
    FAMILIES
        .dead_letters
        .get_or_create(&Consumer {
            consumer: consumer.to_owned(),
        })
        .inc();
}
