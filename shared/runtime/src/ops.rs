//! The ops endpoints, for Prometheus and for an orchestrator's probes:
//!
//! | path | answers |
//! |---|---|
//! | `/metrics` | every metric of the process ([`crate::metrics::encode`]), Prometheus text format 0.0.4 (`text/plain; version=0.0.4`) |
//! | `/healthz` | `200 ok` while the process serves at all: liveness |
//! | `/readyz` | `200` when every service of the process is ready, else `503`; either way one line per service (`inventory ready`, `billing starting: consumer DECISIONS`): readiness |
//!
//! `allot run` serves them on its ops address (`--ops-addr`, 0.0.0.0:9090 by default); under
//! `allot up` the gateway can merge [`app`] into its own router.

use std::fmt::Write as _;
use std::future::Future;

use axum::Router;
use axum::extract::State as Extract;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::ready::{Readiness, State};

/// The ops routes, reporting the services of `readiness` (the process's:
/// [`Readiness::process`]).
pub fn app(readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

/// Serves [`app`] for the process's services on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(Readiness::process().clone()))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn metrics() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        crate::metrics::encode(),
    )
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(Extract(readiness): Extract<Readiness>) -> impl IntoResponse {
    let services = readiness.services();
    let mut body = String::new();
    if services.is_empty() {
        body.push_str("no service is running\n");
    }
    for s in &services {
        let _ = write!(body, "{} {}", s.name, s.state);
        if !s.waiting_for.is_empty() {
            let _ = write!(body, ": {}", s.waiting_for.join(", "));
        }
        body.push('\n');
    }
    let ready = !services.is_empty() && services.iter().all(|s| s.state == State::Ready);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

#[cfg(test)]
mod tests;
