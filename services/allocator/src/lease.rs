//! Leadership of a pool: the key `allocator-<pool>` in the KV bucket `allot-leases`.
//!
//! The bucket's entries expire after the lease TTL. A candidate takes the lead by *creating*
//! the key (which fails while another holds it), and the leader keeps it by *updating* it at
//! the revision it last wrote, a few times per TTL. A leader that misses its renewals loses the
//! key to a standby once it expires; if it then tries to write the journal, the journal's
//! expected-sequence check rejects it (see [`crate::journal`]) — the lease decides who should
//! lead, the journal makes sure nobody else can.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
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

/// The lease bucket, created with `ttl` if it does not exist.
pub async fn bucket(js: &jetstream::Context, ttl: Duration) -> Result<kv::Store, LeaseError> {
    js.create_key_value(kv::Config {
        bucket: BUCKET.into(),
        description: "Which allocator leads each pool (entries expire unless renewed)".into(),
        history: 1,
        max_age: ttl,
        ..kv::Config::default()
    })
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
    /// Takes the lease of `pool` for `holder` if nobody holds it.
    pub async fn acquire(store: &kv::Store, pool: &str, holder: &str) -> Option<Lease> {
        let key = key(pool);
        let revision = store
            .create(&key, Bytes::from(holder.to_owned()))
            .await
            .ok()?;
        Some(Lease {
            store: store.clone(),
            key,
            holder: holder.to_owned(),
            revision,
        })
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
