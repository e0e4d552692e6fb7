//! Test harness for Allot: real `nats-server` processes for integration and end-to-end tests.
//!
//! Every server runs from a generated config file in its own temporary directory, listens on
//! random free ports on 127.0.0.1, keeps its JetStream store in that directory, and is killed
//! (and reaped) when its handle is dropped. Everything is blocking `std::process` code, so the
//! harness works from plain `#[test]` functions and from `#[tokio::test]` alike.
//!
//! # Layout
//!
//! - [`binary`] finds the `nats-server` executable: `$ALLOT_NATS_SERVER`, then the copy that
//!   `scripts/install-nats.sh` puts in `<workspace>/.tools/bin`, then `PATH`. When none is
//!   there, [`MissingNatsServer`] says what was tried and how to install it.
//! - [`server`] is [`NatsServer`], one JetStream-enabled server for one test: start (optionally
//!   with extra config such as `accounts` blocks), restart on the same port and store, graceful
//!   stop, kill, and its log for failure messages.
//! - [`cluster`] is [`NatsCluster`], a JetStream cluster of N such servers (`n1`..`nN`, cluster
//!   `allot-test`) that is handed out only once a meta leader is elected, with per-node kill and
//!   restart for failover tests.
//! - [`fixtures`] builds events for tests from a few words —
//!   `node("node-1").gpus(4).model("A100").registered()`, `.heartbeat(3)`, `.sampled(70)` —
//!   so a test states what matters to it and nothing else.
//! - [`streams`] reads back what a stream holds (`read_all`), for asserting on what was published.
//! - `net` (private) holds the loopback plumbing: picking free ports, the `INFO` readiness
//!   probe, and a minimal HTTP GET for the monitoring endpoints.

pub mod binary;
pub mod cluster;
pub mod fixtures;
mod net;
pub mod server;
pub mod streams;

pub use binary::{MissingNatsServer, nats_server_binary};
pub use cluster::NatsCluster;
pub use fixtures::node;
pub use server::NatsServer;
