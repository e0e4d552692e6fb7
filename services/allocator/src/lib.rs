//! The allocator service: the one place where GPUs are handed out.
//!
//! One allocator leads each pool; others stand by. The leader drives [`allot_sched`] from the
//! bus — nodes joining and leaving, tasks becoming ready and ending — and appends every input
//! it applies, with the decisions it made, to the pool's journal (`allot.alloc.<pool>.journal`
//! in the DECISIONS stream). The journal *is* the allocator's state: a new leader rebuilds the
//! scheduler by applying its entries in order, and `allot replay --verify` recomputes every
//! decision from it.
//!
//! # Layout
//!
//! - [`lease`]: leadership — a key in a NATS KV bucket whose entries expire after a TTL; the
//!   leader renews it by revision.
//! - [`journal`]: reading the journal back (rebuilding the scheduler and the input streams'
//!   positions) and appending to it with the expected last subject sequence, so the server
//!   rejects an append from a deposed leader (fencing).
//! - [`inputs`]: which bus events become which scheduler inputs.
//! - `leader`: the leader's loop — durable consumers feed one channel, so the scheduler sees
//!   one total order; a message is acknowledged only after its input is journalled.
//! - `metrics`: what the leader reports of its pool while it leads — tasks pending per team,
//!   scheduling pass latency, GPUs and GPUs allocated, the Wastage Ratio.
//!
//! Exactly once: every journalled input records the stream message it came from, so after a
//! crash the consumers resume right after the last journalled message of each stream, and a
//! redelivered message at or before that position is acknowledged without being applied again.

use std::future::Future;
use std::time::Duration;

use allot_sched::quota::Quota;

pub mod inputs;
pub mod journal;
mod leader;
pub mod lease;
mod metrics;

pub use journal::Journal;

/// The allocator's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// NATS URL(s).
    pub nats_url: String,
    /// The pool it allocates.
    pub pool: String,
    /// The scheduling policy ([`allot_sched::policy::by_name`]).
    pub policy: String,
    /// This instance's id (in the lease and the journal).
    pub instance: String,
    /// How long a lease lives without renewal: how soon a standby takes over after the
    /// leader dies.
    pub lease_ttl: Duration,
    /// How often the leader runs a pass while tasks wait, even without new events (keys move
    /// with time under some policies).
    pub pass_interval: Duration,
    /// Team quotas of the pool, applied when an allocator takes the lead.
    pub quotas: Vec<(String, Quota)>,
    /// Prefix of the durable consumers' names (`<prefix>-<pool>-<stream>`).
    pub consumer_prefix: String,
    /// Copies of the lease bucket: as many as the streams have (1 on one server, 3 on a
    /// cluster), so the lease outlives any one server.
    pub replicas: usize,
    /// This process is known to be the only one with its instance id (`allot up`, which holds
    /// its data folder's lock, uses a fixed id): a lease still held under that id is a dead
    /// predecessor's, taken over at once instead of waited out.
    pub sole_instance: bool,
}

impl Config {
    /// Defaults: policy `allot`, a 10 s lease in a bucket of one replica, a pass every 5 s, no
    /// quotas.
    pub fn new(nats_url: impl Into<String>, pool: impl Into<String>) -> Self {
        Self {
            nats_url: nats_url.into(),
            pool: pool.into(),
            policy: "allot".into(),
            instance: format!(
                "allocator-{}-{}",
                std::process::id(),
                &uuid::Uuid::now_v7().simple().to_string()[24..]
            ),
            lease_ttl: Duration::from_secs(10),
            pass_interval: Duration::from_secs(5),
            quotas: Vec::new(),
            consumer_prefix: "allocator".into(),
            replicas: 1,
            sole_instance: false,
        }
    }
}

/// Why the allocator stopped.
#[derive(Debug, thiserror::Error)]
pub enum AllocatorError {
    /// The bus failed in a way retrying does not fix.
    #[error(transparent)]
    Bus(#[from] allot_bus::BusError),
    /// Its task failed or panicked: the task's name and why.
    #[error("{0}")]
    Stopped(Box<allot_runtime::Stopped<AllocatorError>>),
    /// The configured policy does not exist.
    #[error("unknown policy {0:?}")]
    UnknownPolicy(String),
    /// The configured policy reads true run times, which only a simulation knows.
    #[error("policy {0:?} reads true run times, which exist only in simulation")]
    OraclePolicy(String),
    /// The journal cannot be read or continued.
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    /// The lease bucket cannot be used.
    #[error(transparent)]
    Lease(#[from] lease::LeaseError),
    /// This allocator lost (or could no longer be sure of) the pool's lease: it stops leading
    /// and stands by.
    #[error("deposed from pool {pool}: {why}")]
    LeaseLost {
        /// The pool.
        pool: String,
        /// What happened.
        why: String,
    },
    /// The input readers stopped by themselves (they only stop when told to).
    #[error("the allocator's input readers stopped")]
    Readers,
}

impl AllocatorError {
    /// Whether this ends a term as leader but not the service: it stands by and may lead
    /// again.
    pub fn is_deposition(&self) -> bool {
        matches!(
            self,
            Self::LeaseLost { .. } | Self::Journal(journal::JournalError::Deposed { .. })
        )
    }
}

/// Runs the allocator until `shutdown` completes: stands by until it holds the pool's lease,
/// leads until it loses it, and stands by again.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AllocatorError> {
    match allot_sched::policy::by_name(&config.policy) {
        None => return Err(AllocatorError::UnknownPolicy(config.policy)),
        Some(p) if p.uses_oracle() => return Err(AllocatorError::OraclePolicy(config.policy)),
        Some(_) => {}
    }
    leader::run(config, shutdown).await
}
