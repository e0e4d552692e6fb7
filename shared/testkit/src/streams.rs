//! Reading back what a stream holds, for tests that assert on what was published.

use async_nats::jetstream::{self, consumer::DeliverPolicy};
use futures::StreamExt;

/// Every message `stream` holds now, in order (through an ordered consumer, so nothing is
/// acknowledged and other consumers are unaffected).
pub async fn read_all(client: &async_nats::Client, stream: &str) -> Vec<jetstream::Message> {
    let js = jetstream::new(client.clone());
    let mut stream = js.get_stream(stream).await.expect("stream exists");
    let count = stream.info().await.expect("stream info").state.messages as usize;
    if count == 0 {
        return Vec::new();
    }
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .expect("ordered consumer");
    consumer
        .messages()
        .await
        .expect("message stream")
        .take(count)
        .map(|m| m.expect("message"))
        .collect()
        .await
}

/// Waits until `applied()` — a consumer's position as its service recorded it — reaches the
/// last message of `stream`, read again each time (a service that publishes into the stream it
/// reads moves the end itself); panics after `limit`, naming both.
pub async fn wait_until_applied(
    client: &async_nats::Client,
    stream: &str,
    limit: std::time::Duration,
    applied: impl Fn() -> Option<u64>,
) {
    let js = jetstream::new(client.clone());
    let mut handle = js.get_stream(stream).await.expect("stream exists");
    let deadline = std::time::Instant::now() + limit;
    loop {
        let end = handle
            .info()
            .await
            .expect("stream info")
            .state
            .last_sequence;
        let at = applied();
        if at == Some(end) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{stream} was not applied: at {at:?} of {end}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
