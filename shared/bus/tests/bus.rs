//! The bus against a real nats-server: streams, de-duplication, and the consumer runner's
//! promises (order, dead letters, retries).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, stream::RetentionPolicy};
use futures::StreamExt as _;

use allot_bus::consumer::{ConsumerRunner, ConsumerSpec, Delivery, Handler, HandlerError, Outcome};
use allot_bus::streams::{Ensured, names};
use allot_bus::{PublishError, Publisher, catalog, ensure_streams, headers};
use allot_events::node::HeartbeatSent;
use allot_testkit::streams::read_all;
use allot_testkit::{NatsServer, node};

fn heartbeat(seq: u64) -> HeartbeatSent {
    node("node-1").heartbeat(seq)
}

async fn setup(server: &NatsServer) -> (async_nats::Client, Publisher) {
    let client = async_nats::connect(server.url()).await.unwrap();
    let publisher = Publisher::new(client.clone(), "/test");
    ensure_streams(publisher.jetstream(), &catalog(1))
        .await
        .unwrap();
    (client, publisher)
}

/// Records what it handled; fails (transiently) or rejects on request.
#[derive(Debug, Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<u64>>>,
    attempts: Arc<Mutex<u32>>,
    fail_first_attempts: u32,
    /// `resume_after` fails (transiently) this many times first: the state busy at start.
    busy_at_start: Arc<Mutex<u32>>,
    fatal: bool,
    reject_heartbeat_seq: Option<u64>,
}

impl Handler for Recorder {
    fn resume_after(&mut self) -> Result<Option<u64>, HandlerError> {
        let mut busy = self.busy_at_start.lock().unwrap();
        if *busy > 0 {
            *busy -= 1;
            return Err(HandlerError::transient("state busy at start"));
        }
        Ok(None)
    }

    async fn handle(&mut self, batch: &[Delivery]) -> Result<Vec<Outcome>, HandlerError> {
        {
            let mut attempts = self.attempts.lock().unwrap();
            *attempts += 1;
            if *attempts <= self.fail_first_attempts {
                return Err(if self.fatal {
                    HandlerError::fatal("the journal disagrees with the code")
                } else {
                    HandlerError::transient("database is locked")
                });
            }
        }
        let mut outcomes = Vec::new();
        for d in batch {
            let seq = match &d.event.data {
                allot_events::AnyEvent::Node(allot_events::NodeEvent::HeartbeatSent(h)) => h.seq,
                _ => 0,
            };
            if Some(seq) == self.reject_heartbeat_seq {
                outcomes.push(Outcome::Rejected(format!("heartbeat {seq} is cursed")));
            } else {
                self.seen.lock().unwrap().push(seq);
                outcomes.push(Outcome::Handled);
            }
        }
        Ok(outcomes)
    }
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

/// A runner for `spec` with `recorder`, running until the returned sender fires.
fn spawn_runner(
    client: &async_nats::Client,
    spec: ConsumerSpec,
    recorder: Recorder,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<Recorder, allot_bus::BusError>>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = ConsumerRunner::new(client.clone(), spec, recorder);
    let task = tokio::spawn(runner.run(async {
        let _ = stopped.await;
    }));
    (stop, task)
}

#[tokio::test]
async fn streams_are_created_once_and_updated_when_their_spec_changes() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client);
    let specs = catalog(1);
    let first = ensure_streams(&js, &specs).await.unwrap();
    assert!(
        first.iter().all(|(_, e)| *e == Ensured::Created),
        "{first:?}"
    );
    let second = ensure_streams(&js, &specs).await.unwrap();
    assert!(
        second.iter().all(|(_, e)| *e == Ensured::Unchanged),
        "{second:?}"
    );

    let mut changed = specs.clone();
    changed[1].max_age = Some(Duration::from_secs(600));
    let third = ensure_streams(&js, &changed).await.unwrap();
    assert_eq!(third[1], (names::TELEMETRY, Ensured::Updated));
    let info = js
        .get_stream(names::TELEMETRY)
        .await
        .unwrap()
        .cached_info()
        .clone();
    assert_eq!(info.config.max_age, Duration::from_secs(600));
    assert_eq!(info.config.retention, RetentionPolicy::Limits);
}

#[tokio::test]
async fn the_same_event_published_twice_is_stored_once() {
    let server = NatsServer::start();
    let (client, publisher) = setup(&server).await;
    let event = publisher.envelope(heartbeat(1));
    let first = publisher.publish_envelope(&event).await.unwrap();
    let again = publisher.publish_envelope(&event).await.unwrap();
    assert!(!first.duplicate);
    assert!(again.duplicate, "the server recognised the id");
    assert_eq!(again.sequence, first.sequence);
    let stored = read_all(&client, names::FLEET).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(
        allot_events::decode(&stored[0].payload).unwrap().id,
        event.id
    );
}

#[tokio::test]
async fn a_telemetry_sample_carries_no_message_id_and_every_other_event_does() {
    let server = NatsServer::start();
    let (client, publisher) = setup(&server).await;
    let sample = publisher.envelope(node("node-1").sampled(40));
    let beat = publisher.envelope(heartbeat(1));
    publisher.publish_envelope(&sample).await.unwrap();
    publisher.publish_envelope(&beat).await.unwrap();
    let id = |m: &jetstream::Message| {
        m.headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_owned())
    };
    // A sample is sent once: the server keeps no duplicate-window entry for it.
    let samples = read_all(&client, names::TELEMETRY).await;
    assert_eq!(samples.len(), 1);
    assert_eq!(id(&samples[0]), None);
    assert_eq!(
        allot_events::decode(&samples[0].payload).unwrap().id,
        sample.id
    );
    let beats = read_all(&client, names::FLEET).await;
    assert_eq!(id(&beats[0]), Some(beat.id.to_string()));
    // Sent patiently (which may send it more than once), even a sample carries its id.
    let again = publisher.envelope(node("node-1").sampled(41));
    publisher
        .publish_envelope_patiently(&again, Duration::from_secs(5))
        .await
        .unwrap();
    let samples = read_all(&client, names::TELEMETRY).await;
    assert_eq!(id(&samples[1]), Some(again.id.to_string()));
}

#[tokio::test]
async fn publishing_where_no_stream_listens_is_an_error_not_a_silent_loss() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let publisher = Publisher::new(client, "/test");
    let err = publisher.publish(heartbeat(1)).await.unwrap_err();
    assert!(matches!(err, PublishError::NoStream { .. }), "{err:?}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn a_malformed_message_is_dead_lettered_with_its_reason_and_the_consumer_goes_on() {
    let server = NatsServer::start();
    let (client, publisher) = setup(&server).await;
    publisher.publish(heartbeat(1)).await.unwrap();
    let js = publisher.jetstream();
    js.publish("allot.node.heartbeat.node-1", "{not json".into())
        .await
        .unwrap()
        .await
        .unwrap();
    js.publish(
        "allot.node.heartbeat.node-1",
        r#"{"specversion":"1.0","id":"018f0000-0000-7000-8000-000000000000","source":"/x","type":"io.allot.node.v9.heartbeat_sent","time":"2026-01-01T00:00:00Z","datacontenttype":"application/json","data":{}}"#.into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    publisher.publish(heartbeat(2)).await.unwrap();

    let recorder = Recorder::default();
    let seen = recorder.seen.clone();
    let (stop, task) = spawn_runner(&client, ConsumerSpec::new(names::FLEET, "test"), recorder);
    wait_until("both valid heartbeats are handled", || {
        seen.lock().unwrap().len() == 2
    })
    .await;
    assert_eq!(
        *seen.lock().unwrap(),
        vec![1, 2],
        "in order, around the bad ones"
    );

    let dead = read_all(&client, names::DEADLETTER).await;
    assert_eq!(dead.len(), 2);
    let h = dead[0].headers.as_ref().unwrap();
    assert_eq!(
        h.get(headers::ORIGINAL_SUBJECT).unwrap().as_str(),
        "allot.node.heartbeat.node-1"
    );
    assert_eq!(
        h.get(headers::ORIGINAL_STREAM).unwrap().as_str(),
        names::FLEET
    );
    assert_eq!(h.get(headers::ORIGINAL_SEQUENCE).unwrap().as_str(), "2");
    assert_eq!(h.get(headers::CONSUMER).unwrap().as_str(), "test");
    assert!(
        h.get(headers::ERROR)
            .unwrap()
            .as_str()
            .contains("malformed CloudEvent")
    );
    assert_eq!(
        &dead[0].payload[..],
        b"{not json",
        "the original bytes are kept"
    );
    assert_eq!(
        dead[0].subject.as_str(),
        "allot.deadletter.allot.node.heartbeat.node-1"
    );
    let h = dead[1].headers.as_ref().unwrap();
    assert!(
        h.get(headers::ERROR)
            .unwrap()
            .as_str()
            .contains("version v9"),
        "{:?}",
        h.get(headers::ERROR)
    );

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let consumer_info = jetstream::new(client)
        .get_stream(names::FLEET)
        .await
        .unwrap()
        .consumer_info("test")
        .await
        .unwrap()
        .clone();
    assert_eq!(
        consumer_info.num_ack_pending, 0,
        "everything was acknowledged"
    );
    assert_eq!(consumer_info.num_pending, 0);
}

#[tokio::test]
async fn a_position_busy_at_start_is_asked_again_and_the_consumer_starts() {
    let server = NatsServer::start();
    let (client, publisher) = setup(&server).await;
    for seq in 1..=3 {
        publisher.publish(heartbeat(seq)).await.unwrap();
    }
    let recorder = Recorder {
        busy_at_start: Arc::new(Mutex::new(2)),
        ..Recorder::default()
    };
    let (seen, busy) = (recorder.seen.clone(), recorder.busy_at_start.clone());
    let (stop, task) = spawn_runner(&client, ConsumerSpec::new(names::FLEET, "test"), recorder);
    wait_until("the heartbeats are handled", || {
        seen.lock().unwrap().len() == 3
    })
    .await;
    assert_eq!(*busy.lock().unwrap(), 0, "asked three times");
    assert!(!task.is_finished(), "the runner stopped");
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_rejected_message_is_dead_lettered_and_the_rest_of_its_batch_is_handled() {
    let server = NatsServer::start();
    let (client, publisher) = setup(&server).await;
    for seq in 1..=5 {
        publisher.publish(heartbeat(seq)).await.unwrap();
    }
    let recorder = Recorder {
        reject_heartbeat_seq: Some(3),
        ..Recorder::default()
    };
    let seen = recorder.seen.clone();
    let (stop, task) = spawn_runner(&client, ConsumerSpec::new(names::FLEET, "test"), recorder);
    wait_until("four heartbeats are handled", || {
        seen.lock().unwrap().len() == 4
    })
    .await;
    assert_eq!(*seen.lock().unwrap(), vec![1, 2, 4, 5]);
    let dead = read_all(&client, names::DEADLETTER).await;
    assert_eq!(dead.len(), 1);
    let reason = dead[0]
        .headers
        .as_ref()
        .unwrap()
        .get(headers::ERROR)
        .unwrap()
        .to_string();
    assert_eq!(reason, "heartbeat 3 is cursed");
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_batch_is_settled_by_one_acknowledgement_and_nothing_is_left_pending() {
    let server = NatsServer::start();
    let (client, publisher) = setup(&server).await;
    for seq in 1..=60 {
        publisher.publish(heartbeat(seq)).await.unwrap();
    }
    // What the runner tells the server, as the server hears it.
    let mut acks = client.subscribe("$JS.ACK.FLEET.test.>").await.unwrap();
    let recorder = Recorder {
        reject_heartbeat_seq: Some(20),
        ..Recorder::default()
    };
    let seen = recorder.seen.clone();
    let mut spec = ConsumerSpec::new(names::FLEET, "test");
    spec.linger = Duration::from_millis(200);
    let (stop, task) = spawn_runner(&client, spec, recorder);
    wait_until("59 heartbeats are handled", || {
        seen.lock().unwrap().len() == 59
    })
    .await;
    let stream = jetstream::new(client.clone())
        .get_stream(names::FLEET)
        .await
        .unwrap();
    let mut settled = None;
    for _ in 0..100 {
        let info = stream.clone().consumer_info("test").await.unwrap().clone();
        if info.num_ack_pending == 0 && info.ack_floor.stream_sequence == 60 {
            settled = Some(info);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        settled.is_some(),
        "every message settled, the rejected one too"
    );
    assert_eq!(read_all(&client, names::DEADLETTER).await.len(), 1);
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    let mut heard = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), acks.next()).await {
        heard += 1;
    }
    // One for the dead letter (settling the 19 before it), one for the rest; a batch that
    // arrived in pieces adds one per piece.
    assert!(
        (2..=6).contains(&heard),
        "{heard} acknowledgements for 60 messages"
    );
}

#[tokio::test]
async fn a_transient_failure_is_retried_in_place_without_later_messages_overtaking_it() {
    let server = NatsServer::start();
    let (client, publisher) = setup(&server).await;
    for seq in 1..=3 {
        publisher.publish(heartbeat(seq)).await.unwrap();
    }
    let recorder = Recorder {
        fail_first_attempts: 2,
        ..Recorder::default()
    };
    let seen = recorder.seen.clone();
    let attempts = recorder.attempts.clone();
    let mut spec = ConsumerSpec::new(names::FLEET, "test");
    spec.max_backoff = Duration::from_millis(200);
    let (stop, task) = spawn_runner(&client, spec, recorder);
    wait_until("three heartbeats are handled", || {
        seen.lock().unwrap().len() == 3
    })
    .await;
    assert_eq!(*seen.lock().unwrap(), vec![1, 2, 3]);
    assert!(
        *attempts.lock().unwrap() >= 3,
        "failed twice, then succeeded"
    );
    assert!(read_all(&client, names::DEADLETTER).await.is_empty());
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_batch_that_keeps_failing_transiently_is_never_dead_lettered_nor_redelivered() {
    let server = NatsServer::start();
    let (client, publisher) = setup(&server).await;
    publisher.publish(heartbeat(1)).await.unwrap();
    let recorder = Recorder {
        fail_first_attempts: u32::MAX,
        ..Recorder::default()
    };
    let attempts = recorder.attempts.clone();
    let mut spec = ConsumerSpec::new(names::FLEET, "test");
    spec.max_backoff = Duration::from_millis(20);
    // Far shorter than the episode: without in-progress acks the server would redeliver.
    spec.ack_wait = Duration::from_millis(300);
    let (stop, task) = spawn_runner(&client, spec, recorder);
    // A disk-full episode: the handler fails for far longer than any delivery limit.
    wait_until("the handler was tried 30 times", || {
        *attempts.lock().unwrap() >= 30
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(read_all(&client, names::DEADLETTER).await.is_empty());
    let info = async_nats::jetstream::new(client.clone())
        .get_stream(names::FLEET)
        .await
        .unwrap()
        .consumer_info("test")
        .await
        .unwrap();
    assert_eq!(
        info.num_redelivered, 0,
        "the batch in hand was kept alive, not redelivered"
    );
    // Shutdown ends the retries; the message is still unacknowledged, for the next start.
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    assert_eq!(info.num_ack_pending, 1);
}

#[tokio::test]
async fn a_fatal_failure_stops_the_runner_and_leaves_the_message_for_the_next_start() {
    let server = NatsServer::start();
    let (client, publisher) = setup(&server).await;
    publisher.publish(heartbeat(1)).await.unwrap();
    let recorder = Recorder {
        fail_first_attempts: 1,
        fatal: true,
        ..Recorder::default()
    };
    let (_stop, task) = spawn_runner(&client, ConsumerSpec::new(names::FLEET, "test"), recorder);
    let error = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the runner stops by itself")
        .unwrap()
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "consumer test: the journal disagrees with the code"
    );
    assert!(read_all(&client, names::DEADLETTER).await.is_empty());

    // The next start handles it.
    let recorder = Recorder::default();
    let seen = recorder.seen.clone();
    let (stop, task) = spawn_runner(&client, ConsumerSpec::new(names::FLEET, "test"), recorder);
    wait_until("the heartbeat is handled after the restart", || {
        *seen.lock().unwrap() == vec![1]
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn connecting_waits_for_an_unreachable_server_instead_of_failing() {
    let mut server = NatsServer::start();
    let url = server.url();
    server.stop();
    let connecting = tokio::spawn(async move {
        allot_bus::connect(
            &allot_bus::ConnectConfig::new(url, "test"),
            std::future::pending::<()>(),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !connecting.is_finished(),
        "still retrying while the server is down"
    );
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let client = tokio::time::timeout(Duration::from_secs(15), connecting)
        .await
        .expect("connected once the server was back")
        .unwrap()
        .unwrap();
    client.flush().await.unwrap();
    drop(server);
}

#[tokio::test]
async fn connecting_gives_up_at_once_on_a_malformed_url_and_on_shutdown() {
    let err = allot_bus::connect(
        &allot_bus::ConnectConfig::new("nats://127.0.0.1:notaport", "test"),
        std::future::pending::<()>(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("notaport"), "{err}");

    let err = allot_bus::connect(
        &allot_bus::ConnectConfig::new("nats://127.0.0.1:1", "test"),
        tokio::time::sleep(Duration::from_millis(300)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, allot_bus::BusError::ShutdownBeforeConnect { .. }),
        "{err}"
    );
}

/// A server that requires a password: the credentials in the URL are what logs in (async-nats
/// alone would drop them), and wrong ones fail at once, naming the server.
#[tokio::test]
async fn credentials_in_the_url_log_in_and_wrong_ones_are_refused() {
    let server =
        NatsServer::start_with_config("authorization { user: platform, password: s3cret }");
    let url = |userinfo: &str| format!("nats://{userinfo}127.0.0.1:{}", server.port());
    let good = allot_bus::ConnectConfig::new(url("platform:s3cret@"), "test");
    let client = allot_bus::connect(&good, std::future::pending())
        .await
        .unwrap();
    client.flush().await.unwrap();
    for bad in ["platform:wrong@", ""] {
        let config = allot_bus::ConnectConfig::new(url(bad), "test");
        let err = tokio::time::timeout(
            Duration::from_secs(10),
            allot_bus::connect(&config, std::future::pending()),
        )
        .await
        .expect("a refusal is not retried for ever")
        .unwrap_err();
        assert!(err.to_string().contains("authorization"), "{bad:?}: {err}");
    }
}

/// Applies each message once, in stream order, by the position it keeps (as the services'
/// projections do: a message at or before the position counts as applied); holds its first
/// batch until `release` is notified.
#[derive(Debug, Clone, Default)]
struct Positional {
    applied: Arc<Mutex<Vec<u64>>>,
    release: Arc<tokio::sync::Notify>,
    held: bool,
    /// How often the runner asked for the position.
    asked: u32,
    /// When the runner asks for the position again (to reopen the consumer), this server
    /// process is paused (SIGSTOP) for this long: JetStream unavailable just then.
    pause_when_asked_again: Option<(u32, Duration)>,
}

impl Handler for Positional {
    fn resume_after(&mut self) -> Result<Option<u64>, HandlerError> {
        self.asked += 1;
        if let (2, Some((pid, pause))) = (self.asked, self.pause_when_asked_again) {
            signal(pid, "STOP");
            std::thread::spawn(move || {
                std::thread::sleep(pause);
                signal(pid, "CONT");
            });
        }
        Ok(Some(
            self.applied.lock().unwrap().last().copied().unwrap_or(0),
        ))
    }

    async fn handle(&mut self, batch: &[Delivery]) -> Result<Vec<Outcome>, HandlerError> {
        if !self.held {
            self.held = true;
            self.release.notified().await;
        }
        let mut applied = self.applied.lock().unwrap();
        for d in batch {
            if applied.last().is_none_or(|last| d.stream_sequence > *last) {
                applied.push(d.stream_sequence);
            }
        }
        Ok(vec![Outcome::Handled; batch.len()])
    }
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Heartbeats 1–10 through a positional runner, with deliveries 2–4 made to a pull whose
/// answer never reaches it; `pause` pauses the server for that long as the runner reopens its
/// consumer. Every heartbeat must be applied once, in order.
async fn deliveries_lost_in_flight(pause: Option<Duration>) {
    use futures::StreamExt as _;
    let server = NatsServer::start();
    let (_, publisher) = setup(&server).await;
    // JetStream requests that time out after a second, not the default ten.
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(1)))
        .connect(server.url())
        .await
        .unwrap();
    let handler = Positional {
        pause_when_asked_again: pause.map(|pause| (server.pid(), pause)),
        ..Positional::default()
    };
    let (applied, release) = (handler.applied.clone(), handler.release.clone());
    let mut spec = ConsumerSpec::new(names::FLEET, "positional");
    spec.batch = 1;
    spec.ack_wait = Duration::from_secs(1);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(
        ConsumerRunner::new(client.clone(), spec, handler).run(async {
            let _ = stopped.await;
        }),
    );
    // The runner takes heartbeat 1 and holds it: no pull of its own is outstanding.
    publisher.publish(heartbeat(1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for seq in 2..=10 {
        publisher.publish(heartbeat(seq)).await.unwrap();
    }
    // Deliveries 2–4 go to a pull whose answer never reaches the runner — as when its server
    // dies with the answer in flight: the server counts them delivered, and redelivers them
    // only after the ack wait, behind 5–10.
    let js = jetstream::new(client.clone());
    let consumer: jetstream::consumer::PullConsumer = js
        .get_stream(names::FLEET)
        .await
        .unwrap()
        .get_consumer("positional")
        .await
        .unwrap();
    let lost: Vec<u64> = consumer
        .batch()
        .max_messages(3)
        .messages()
        .await
        .unwrap()
        .take(3)
        .map(|m| m.unwrap().info().unwrap().stream_sequence)
        .collect()
        .await;
    assert_eq!(lost, [2, 3, 4]);
    release.notify_one();

    // Past the ack wait, so the lost deliveries would have come back by then.
    for _ in 0..100 + pause.map_or(0, |p| p.as_millis() / 50) {
        assert!(!task.is_finished(), "the runner stopped: {:?}", task.await);
        if applied.lock().unwrap().len() == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        *applied.lock().unwrap(),
        (1..=10).collect::<Vec<u64>>(),
        "every heartbeat applied once, in order"
    );
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn deliveries_lost_in_flight_are_applied_in_order_not_skipped_after_newer_ones() {
    deliveries_lost_in_flight(None).await;
}

/// Reopening the consumer when a server of a cluster died can meet JetStream still electing
/// leaders: its requests time out. The fault matrix found the planner stopping there; the runner
/// must try again until JetStream answers.
#[tokio::test]
async fn a_consumer_reopened_while_jetstream_does_not_answer_is_opened_again_once_it_does() {
    // Longer than a JetStream request's timeout (1 s here), so the first attempts fail.
    deliveries_lost_in_flight(Some(Duration::from_secs(3))).await;
}
