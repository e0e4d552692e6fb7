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
