//! Leadership of a pool: the key `allocator-<pool>` in the KV bucket `allot-leases`.
//!
//! The bucket's entries expire after the lease TTL. A candidate takes the lead by *creating*
//! the key (which fails while another holds it), and the leader keeps it by *updating* it at
//! the revision it last wrote, a few times per TTL. A leader that misses its renewals loses the
//! key to a standby once it expires; if it then tries to write the journal, the journal's
//! expected-sequence check rejects it (see [`crate::journal`]) — the lease decides who should
//! lead, the journal makes sure nobody else can.

use std::time::Duration;

use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::{self, ErrorCode, kv};
use bytes::Bytes;

/// The KV bucket of leases.
pub const BUCKET: &str = "allot-leases";

/// The lease key of a pool.
pub fn key(pool: &str) -> String {
    format!("allocator-{pool}")
}

/// The lease bucket cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("lease bucket {BUCKET}: {0}")]
pub struct LeaseError(String);

impl LeaseError {
    /// The server did not answer within `within` (the lease TTL).
    pub fn timed_out(within: Duration) -> LeaseError {
        LeaseError(format!("no answer within the lease TTL {within:?}"))
    }
}

/// The lease bucket, created with `ttl` and `replicas` copies if it does not exist, and raised
/// to `replicas` if it has fewer (never lowered: a standby started without the setting must not
/// undo the operator's). On a JetStream cluster it needs as many replicas as the streams: with
/// one, the death of the server holding it leaves no allocator able to renew or take the lease,
/// and the pool stops allocating until that server returns. A bucket that cannot be raised (a
/// user without the right to update streams) is used as it is, with a warning.
///
/// A bucket that exists is opened, never created again: on a fresh cluster the allocators
/// start together, and a second create proposal while the first is in flight can go
/// unanswered until its timeout — long enough for the standby to miss a takeover.
pub async fn bucket(
    js: &jetstream::Context,
    ttl: Duration,
    replicas: usize,
) -> Result<kv::Store, LeaseError> {
    let current = match js.get_stream(format!("KV_{BUCKET}")).await {
        Ok(stream) => Some(stream.cached_info().config.clone()),
        Err(e)
            if matches!(
                e.kind(),
                GetStreamErrorKind::JetStream(ref err)
                    if err.error_code() == ErrorCode::STREAM_NOT_FOUND
            ) =>
        {
            None
        }
        Err(e) => return Err(LeaseError(e.to_string())),
    };
    let config = |num_replicas| kv::Config {
        bucket: BUCKET.into(),
        description: "Which allocator leads each pool (entries expire unless renewed)".into(),
        history: 1,
        max_age: ttl,
        num_replicas,
        ..kv::Config::default()
    };
    let Some(current) = current else {
        return js
            .create_key_value(config(replicas))
            .await
            .map_err(|e| LeaseError(e.to_string()));
    };
    if current.max_age != ttl {
        // A leader counts on its lease for this instance's TTL; entries that expire sooner
        // would let a standby lead while it still does.
        return Err(LeaseError(format!(
            "its entries expire after {:?}, but this allocator's lease TTL is {ttl:?}: give \
             every allocator of the pool the same TTL, or delete the bucket to recreate it",
            current.max_age
        )));
    }
    let have = current.num_replicas;
    if have < replicas
        && let Err(e) = js.update_key_value(config(replicas)).await
    {
        tracing::warn!(
            bucket = BUCKET,
            replicas = have,
            wanted = replicas,
            error = %e,
            "the lease bucket keeps fewer copies than the streams and could not be raised; \
             kept with one, the pool stops allocating while the server holding it is down"
        );
    }
    js.get_key_value(BUCKET)
        .await
        .map_err(|e| LeaseError(e.to_string()))
}

/// What one renewal found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// Still ours, for another TTL.
    Renewed,
    /// Not ours any more; says who holds it now.
    Lost(String),
    /// The server did not confirm either way (timeout, connection lost).
    Unsure(String),
}

/// A held lease.
#[derive(Debug)]
pub struct Lease {
    store: kv::Store,
    key: String,
    holder: String,
    revision: u64,
}

impl Lease {
    /// The lease `holder` now holds at `revision`.
    fn held(store: &kv::Store, key: String, holder: &str, revision: u64) -> Lease {
        Lease {
            store: store.clone(),
            key,
            holder: holder.to_owned(),
            revision,
        }
    }

    /// Takes the lease of `pool` for `holder` if nobody holds it: `Ok(None)` while someone
    /// does, an error when the server did not answer as expected.
    pub async fn acquire(
        store: &kv::Store,
        pool: &str,
        holder: &str,
    ) -> Result<Option<Lease>, LeaseError> {
        let key = key(pool);
        match store.create(&key, Bytes::from(holder.to_owned())).await {
            Ok(revision) => Ok(Some(Lease::held(store, key, holder, revision))),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(LeaseError(format!("taking {key}: {e}"))),
        }
    }

    /// Takes the lease of `pool` if it is still held under `holder`'s own name — by an earlier
    /// process of this instance that died holding it — instead of waiting for it to expire:
    /// `Ok(None)` if someone else holds it (or took it meanwhile). Only for an instance known
    /// to be the one process with its name ([`crate::Config::sole_instance`]); anywhere else
    /// the holder of that name may be alive.
    pub async fn take_over_own(
        store: &kv::Store,
        pool: &str,
        holder: &str,
    ) -> Result<Option<Lease>, LeaseError> {
        let key = key(pool);
        let entry = store
            .entry(&key)
            .await
            .map_err(|e| LeaseError(format!("reading {key}: {e}")))?;
        let Some(entry) = entry
            .filter(|e| e.operation == kv::Operation::Put && e.value.as_ref() == holder.as_bytes())
        else {
            return Ok(None);
        };
        match store
            .update(&key, Bytes::from(holder.to_owned()), entry.revision)
            .await
        {
            Ok(revision) => Ok(Some(Lease::held(store, key, holder, revision))),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(e) => Err(LeaseError(format!("taking over {key}: {e}"))),
        }
    }

    /// Renews the lease. [`Renewal::Lost`] if it expired or was taken (someone else's write is
    /// now the key's latest), [`Renewal::Unsure`] if the server did not answer as expected.
    pub async fn renew(&mut self) -> Renewal {
        match self
            .store
            .update(&self.key, Bytes::from(self.holder.clone()), self.revision)
            .await
        {
            Ok(revision) => {
                self.revision = revision;
                Renewal::Renewed
            }
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                let now = match self.store.entry(&self.key).await {
                    Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
                        format!("now held by {}", String::from_utf8_lossy(&entry.value))
                    }
                    _ => "it expired and nobody holds it now".to_owned(),
                };
                Renewal::Lost(now)
            }
            Err(e) => Renewal::Unsure(e.to_string()),
        }
    }

    /// The holder's name.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Gives the lease up (on shutdown), so a standby need not wait for it to expire.
    pub async fn release(self) {
        // Deleting at our revision only: never remove a lease someone else took meanwhile.
        if let Ok(Some(entry)) = self.store.entry(&self.key).await
            && entry.revision == self.revision
        {
            let _ = self.store.delete(&self.key).await;
        }
    }
}
