//! Connecting to NATS: retried with capped backoff and a clear log line while the server is
//! unreachable, so a service started before its server waits instead of crash-looping.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::{Client, ConnectErrorKind, ConnectOptions, Event};

use crate::error::BusError;

/// How to reach NATS.
#[derive(Debug, Clone)]
pub struct ConnectConfig {
    /// One URL or a comma-separated list (`nats://a:4222,nats://b:4222`).
    pub url: String,
    /// Connection name shown by the server (`allot-inventory`, `allot-collector-node-1` …).
    pub name: String,
    /// Longest wait between two connection attempts.
    pub max_backoff: Duration,
}

impl ConnectConfig {
    /// A config for `url` under connection name `name`, with a 10 s backoff cap.
    pub fn new(url: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            name: name.into(),
            max_backoff: Duration::from_secs(10),
        }
    }
}

/// Splits a comma-separated server list (`nats://a:4222,nats://b:4222`) into addresses; the
/// client takes one address per string.
pub fn server_list(url: &str) -> Vec<&str> {
    url.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// `options` with the credentials written in `url` (`nats://user:password@host:4222`, or
/// `nats://token@host`), from its first server that has any.
///
/// async-nats parses credentials in server URLs but does not send them (nats.rs issue #1623),
/// so every Allot connection passes them explicitly.
pub fn with_url_credentials(options: ConnectOptions, url: &str) -> ConnectOptions {
    let credentials = server_list(url).into_iter().find_map(|s| {
        let addr: async_nats::ServerAddr = s.parse().ok()?;
        let user = addr.username()?.to_owned();
        Some((user, addr.password().map(str::to_owned)))
    });
    match credentials {
        Some((user, Some(password))) => options.user_and_password(user, password),
        Some((token, None)) => options.token(token),
        None => options,
    }
}

/// The wait before attempt `attempt` (1-based): 100 ms doubling, capped.
pub fn backoff(attempt: u32, cap: Duration) -> Duration {
    let exp = attempt.saturating_sub(1).min(16);
    Duration::from_millis(100u64.saturating_mul(1 << exp)).min(cap)
}

/// Connects to NATS, retrying with backoff while the server is unreachable.
///
/// Gives up only for errors a retry cannot fix (a malformed URL, rejected credentials) or when
/// `shutdown` completes first.
pub async fn connect(
    config: &ConnectConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<Client, BusError> {
    tokio::pin!(shutdown);
    // The URL may carry a password: logs and errors show it without.
    let shown = crate::users::without_credentials(&config.url);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match options(config).connect(server_list(&config.url)).await {
            Ok(client) => {
                if attempt > 1 {
                    tracing::info!(url = %shown, attempt, "connected to NATS");
                }
                return Ok(client);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ConnectErrorKind::ServerParse
                        | ConnectErrorKind::Authentication
                        | ConnectErrorKind::AuthorizationViolation
                        | ConnectErrorKind::Tls
                ) =>
            {
                return Err(BusError::Connect {
                    url: shown,
                    source: e,
                });
            }
            Err(e) => {
                let wait = backoff(attempt, config.max_backoff);
                tracing::warn!(
                    url = %shown,
                    attempt,
                    retry_in_ms = wait.as_millis() as u64,
                    error = %e,
                    "NATS is unreachable; retrying"
                );
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = &mut shutdown => {
                        return Err(BusError::ShutdownBeforeConnect { url: shown });
                    }
                }
            }
        }
    }
}

/// Notices that a client connected again (to the same server or another of its cluster).
///
/// A long-lived ordered consumer does not survive the death of the server it lives on, and
/// when that server was also the client's, async-nats spends a minute asking about the lost
/// consumer before it gives up and says so; meanwhile the read delivers nothing. A reader that
/// waits on [`Reconnects::next`] beside its messages opens its consumer again at once instead.
#[derive(Debug)]
pub struct Reconnects {
    client: Client,
    seen: u64,
}

impl Reconnects {
    /// Watches `client` from now on.
    pub fn new(client: &Client) -> Self {
        Self {
            seen: client.statistics().connects.load(Ordering::Relaxed),
            client: client.clone(),
        }
    }

    /// Completes once the client has connected again since this was created or last completed
    /// (checked four times a second).
    pub async fn next(&mut self) {
        loop {
            let now = self.client.statistics().connects.load(Ordering::Relaxed);
            if now != self.seen {
                self.seen = now;
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn options(config: &ConnectConfig) -> ConnectOptions {
    let name = config.name.clone();
    let cap = config.max_backoff;
    with_url_credentials(ConnectOptions::new(), &config.url)
        .name(&config.name)
        .connection_timeout(Duration::from_secs(2))
        .max_reconnects(None)
        .reconnect_delay_callback(move |attempts| backoff(attempts as u32, cap))
        .event_callback(move |event| {
            let name = name.clone();
            async move {
                match event {
                    Event::Disconnected => {
                        tracing::warn!(connection = %name, "lost the NATS connection; reconnecting")
                    }
                    Event::Connected => tracing::info!(connection = %name, "NATS connection up"),
                    Event::LameDuckMode => {
                        tracing::warn!(connection = %name, "NATS server entering lame-duck mode")
                    }
                    Event::SlowConsumer(sid) => {
                        tracing::warn!(connection = %name, sid, "slow consumer: messages dropped by the client")
                    }
                    Event::ServerError(e) => tracing::warn!(connection = %name, error = %e, "NATS server error"),
                    Event::ClientError(e) => tracing::warn!(connection = %name, error = %e, "NATS client error"),
                    Event::Draining | Event::Closed => {
                        tracing::debug!(connection = %name, %event, "NATS connection event")
                    }
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_url_list_is_split_into_servers() {
        assert_eq!(
            server_list("nats://a:4222, nats://b:4223,,nats://c:4224 "),
            ["nats://a:4222", "nats://b:4223", "nats://c:4224"]
        );
        assert_eq!(
            server_list("nats://127.0.0.1:4222"),
            ["nats://127.0.0.1:4222"]
        );
    }

    #[test]
    fn backoff_doubles_from_100ms_and_stops_at_the_cap() {
        let cap = Duration::from_secs(10);
        let waits: Vec<u64> = (1..=10)
            .map(|a| backoff(a, cap).as_millis() as u64)
            .collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000]
        );
        assert_eq!(
            backoff(u32::MAX, cap),
            cap,
            "no overflow on huge attempt counts"
        );
    }
}
