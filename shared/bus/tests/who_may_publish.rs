//! Who may speak on the bus, against a real nats-server running the `authorization` block
//! `allot up` generates: every forged event below comes from a user that is not its author,
//! and the server refuses it — the publish is never acknowledged, nothing is stored, and the
//! server reports a permissions violation naming the subject.
//!
//! Every refusal is paired with the same event published by its rightful author and
//! acknowledged, so no test passes merely because nothing works.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use async_nats::jetstream::{self, consumer::pull, stream};
use async_nats::{Client, ConnectErrorKind, Event};
use futures::StreamExt;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use allot_bus::consumer::{ConsumerRunner, ConsumerSpec, Delivery, Handler, HandlerError, Outcome};
use allot_bus::streams::names;
use allot_bus::users::{Role, Users};
use allot_bus::{catalog, ensure_streams};
use allot_events::alloc::LeaderElected;
use allot_events::remediation::{ActionTaken, OperatorCordon};
use allot_events::task::{TaskCompleted, TaskPredicted};
use allot_events::workload::{WorkloadAborted, WorkloadFinished};
use allot_events::{
    AllocEvent, AnyEvent, Envelope, NodeEvent, RemediationEvent, TaskEvent, WorkloadEvent, subject,
};
use allot_testkit::{NatsServer, node};

/// How long a publish waits for its PubAck: a refused one never gets it.
const ACK_WAIT: Duration = Duration::from_millis(1500);

/// A connection as one user, recording the server's errors (permissions violations).
struct Login {
    user: String,
    client: Client,
    js: jetstream::Context,
    errors: mpsc::UnboundedReceiver<String>,
}

impl Login {
    /// Waits for the server to report a permissions violation naming `subject`.
    async fn violation(&mut self, subject: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut seen = Vec::new();
        loop {
            match tokio::time::timeout_at(deadline, self.errors.recv()).await {
                Ok(Some(e)) => {
                    if e.to_lowercase().contains("permissions violation")
                        && e.contains(&format!("\"{subject}\""))
                    {
                        return Ok(());
                    }
                    seen.push(e);
                }
                _ => bail!(
                    "{}: no permissions violation for {subject:?}; server errors: {seen:?}",
                    self.user
                ),
            }
        }
    }

    /// Publishes `event` on its subject through JetStream and awaits the PubAck.
    async fn publish(&self, event: impl Into<AnyEvent>) -> anyhow::Result<()> {
        let envelope = Envelope::new("/test", event);
        self.publish_on(&envelope.nats_subject(), envelope.to_json())
            .await
    }

    async fn publish_on(&self, subject: &str, payload: Vec<u8>) -> anyhow::Result<()> {
        self.js
            .publish(subject.to_owned(), payload.into())
            .await?
            .await
            .with_context(|| format!("{} publishing on {subject}", self.user))?;
        Ok(())
    }

    /// `event` from this user must be refused: no PubAck, and the server names the violation.
    async fn refused(&mut self, event: impl Into<AnyEvent>) -> anyhow::Result<()> {
        let envelope = Envelope::new("/forged", event);
        self.refused_on(&envelope.nats_subject(), envelope.to_json())
            .await
    }

    async fn refused_on(&mut self, subject: &str, payload: Vec<u8>) -> anyhow::Result<()> {
        let acked = self.publish_on(subject, payload).await;
        ensure!(
            acked.is_err(),
            "{} published on {subject} and was acknowledged",
            self.user
        );
        self.violation(subject).await
    }
}

/// A server running the generated users, with the catalogue's streams created by `admin`.
struct Bus {
    server: NatsServer,
    users: Users,
    admin: Login,
}

impl Bus {
    async fn start() -> anyhow::Result<Self> {
        let users = Users::generate_random(&["node-1", "node-2"], &["A", "B"], &BTreeMap::new())?;
        let server = NatsServer::start_with_config(&users.render());
        let admin = login(&server, &users, &Role::Admin).await?;
        ensure_streams(&admin.js, &catalog(1)).await?;
        Ok(Self {
            server,
            users,
            admin,
        })
    }

    async fn login(&self, role: &Role) -> anyhow::Result<Login> {
        login(&self.server, &self.users, role).await
    }

    /// How many messages `stream` holds.
    async fn held(&self, stream: &str) -> anyhow::Result<u64> {
        Ok(self
            .admin
            .js
            .get_stream(stream)
            .await?
            .info()
            .await?
            .state
            .messages)
    }
}

async fn login(server: &NatsServer, users: &Users, role: &Role) -> anyhow::Result<Login> {
    let creds = users
        .credentials(role, &server.url())
        .context("user generated")?;
    let (tx, errors) = mpsc::unbounded_channel();
    let client = creds
        .connect_options()
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let Event::ServerError(e) = event {
                    let _ = tx.send(e.to_string());
                }
            }
        })
        .connect(server.url())
        .await
        .with_context(|| format!("logging in as {}", creds.user))?;
    let mut js = jetstream::new(client.clone());
    js.set_timeout(ACK_WAIT);
    Ok(Login {
        user: creds.user,
        client,
        js,
        errors,
    })
}

fn collector(node: &str) -> Role {
    Role::Collector(node.to_owned())
}

fn team(team: &str) -> Role {
    Role::Team(team.to_owned())
}

fn completed(node: &str) -> TaskEvent {
    TaskEvent::Completed(
        serde_json::from_value::<TaskCompleted>(
            json!({ "pool": "default", "task": 7, "node": node, "lease": 3 }),
        )
        .expect("a valid TaskCompleted"),
    )
}

fn finished(team: &str) -> WorkloadEvent {
    WorkloadEvent::Finished(
        serde_json::from_value::<WorkloadFinished>(json!({
            "workload_id": "train-0123456789", "team": team, "outcome": "succeeded"
        }))
        .expect("a valid WorkloadFinished"),
    )
}

fn predicted() -> TaskEvent {
    TaskEvent::Predicted(
        serde_json::from_value::<TaskPredicted>(json!({
            "pool": "default", "task": 7, "workload": "train-0123456789", "name": "train",
            "duration_ms": 60_000, "p10_ms": 30_000, "p90_ms": 120_000, "basis": "global"
        }))
        .expect("a valid TaskPredicted"),
    )
}

fn remediation_action() -> RemediationEvent {
    RemediationEvent::ActionTaken(
        serde_json::from_value::<ActionTaken>(json!({
            "node": "node-1", "action": "drain", "rule": "overheat", "reason": "hot",
            "since": "2026-11-24T10:00:00Z"
        }))
        .expect("a valid ActionTaken"),
    )
}

fn operator_cordon() -> RemediationEvent {
    RemediationEvent::OperatorCordon(OperatorCordon {
        node: "node-1".into(),
        cordoned: true,
        drain: false,
        reason: "forged".into(),
        by: "someone".into(),
    })
}

fn journal_entry() -> AllocEvent {
    AllocEvent::LeaderElected(LeaderElected {
        pool: "default".into(),
        leader: "forger".into(),
        policy: "fifo".into(),
        format: "allot-journal/v1".into(),
        entries: 0,
    })
}

/// A submission of team `team`, as a raw client would publish it (only the subject matters to
/// the server; the planner checks the rest).
fn submission(team: &str) -> (String, Vec<u8>) {
    let payload = json!({
        "specversion": "1.0", "id": "0192f0c4-0000-7000-8000-000000000001",
        "source": "/raw", "type": "io.allot.workload.v1.submitted",
        "time": "2025-01-01T00:00:00Z", "team": team, "data": {}
    });
    (
        subject::workload_submitted(team),
        payload.to_string().into_bytes(),
    )
}

#[tokio::test]
async fn a_client_without_credentials_or_with_a_wrong_password_cannot_connect() -> anyhow::Result<()>
{
    let bus = Bus::start().await?;
    let anonymous = async_nats::ConnectOptions::new()
        .connect(bus.server.url())
        .await;
    let err = anonymous.err().context("an anonymous client was let in")?;
    ensure!(
        matches!(
            err.kind(),
            ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication
        ),
        "anonymous: {err}"
    );
    let guessed = async_nats::ConnectOptions::with_user_and_password(
        "collector-node-1".into(),
        "password".into(),
    )
    .connect(bus.server.url())
    .await;
    ensure!(guessed.is_err(), "a guessed password was let in");

    // With its own credentials, a collector connects and reports a completion on its node.
    bus.login(&collector("node-1"))
        .await?
        .publish(completed("node-1"))
        .await
}

#[tokio::test]
async fn a_task_completion_is_believed_only_from_the_collector_of_its_node() -> anyhow::Result<()> {
    let bus = Bus::start().await?;
    let before = bus.held(names::WORKLOADS).await?;
    for role in [
        collector("node-2"),
        Role::Planner,
        Role::Allocator,
        team("A"),
    ] {
        bus.login(&role).await?.refused(completed("node-1")).await?;
    }
    ensure!(
        bus.held(names::WORKLOADS).await? == before,
        "a forged completion was stored"
    );
    bus.login(&collector("node-1"))
        .await?
        .publish(completed("node-1"))
        .await?;
    ensure!(bus.held(names::WORKLOADS).await? == before + 1);
    Ok(())
}

#[tokio::test]
async fn a_workload_is_finished_only_by_the_planner() -> anyhow::Result<()> {
    let bus = Bus::start().await?;
    for role in [
        collector("node-1"),
        team("A"),
        Role::Billing,
        Role::Allocator,
    ] {
        bus.login(&role).await?.refused(finished("A")).await?;
    }
    bus.login(&Role::Planner)
        .await?
        .publish(finished("A"))
        .await
}

#[tokio::test]
async fn a_prediction_comes_only_from_the_predictor() -> anyhow::Result<()> {
    let bus = Bus::start().await?;
    for role in [
        collector("node-1"),
        team("A"),
        Role::Planner,
        Role::Allocator,
        Role::Billing,
    ] {
        bus.login(&role).await?.refused(predicted()).await?;
    }
    let before = bus.held(names::WORKLOADS).await?;
    bus.login(&Role::Predictor)
        .await?
        .publish(predicted())
        .await?;
    ensure!(bus.held(names::WORKLOADS).await? == before + 1);
    Ok(())
}

#[tokio::test]
async fn capacity_is_taken_out_only_by_remediation_or_an_operator() -> anyhow::Result<()> {
    let bus = Bus::start().await?;
    for role in [
        collector("node-1"),
        team("A"),
        Role::Inventory,
        Role::Allocator,
        Role::Predictor,
    ] {
        bus.login(&role)
            .await?
            .refused(remediation_action())
            .await?;
    }
    // Remediation acts, but an operator's cordon is the operator's (`admin`) alone.
    for role in [Role::Remediation, collector("node-1"), team("A")] {
        bus.login(&role).await?.refused(operator_cordon()).await?;
    }
    ensure!(
        bus.held(names::REMEDIATION).await? == 0,
        "a forged action was stored"
    );
    bus.login(&Role::Remediation)
        .await?
        .publish(remediation_action())
        .await?;
    bus.login(&Role::Admin)
        .await?
        .publish(operator_cordon())
        .await?;
    ensure!(bus.held(names::REMEDIATION).await? == 2);
    Ok(())
}

#[tokio::test]
async fn the_journal_is_written_only_by_the_allocator() -> anyhow::Result<()> {
    let bus = Bus::start().await?;
    for role in [
        Role::Planner,
        collector("node-1"),
        team("A"),
        Role::Inventory,
        Role::Archiver,
    ] {
        bus.login(&role).await?.refused(journal_entry()).await?;
    }
    ensure!(
        bus.held(names::DECISIONS).await? == 0,
        "a forged entry was stored"
    );
    bus.login(&Role::Allocator)
        .await?
        .publish(journal_entry())
        .await
}

#[tokio::test]
async fn a_node_is_registered_only_by_its_own_collector() -> anyhow::Result<()> {
    let bus = Bus::start().await?;
    let ghost = NodeEvent::Registered(node("node-ghost").gpus(8).registered());
    let other = NodeEvent::Registered(node("node-1").gpus(8).registered());
    let mut two = bus.login(&collector("node-2")).await?;
    two.refused(ghost.clone()).await?;
    two.refused(other.clone()).await?;
    bus.login(&Role::Planner).await?.refused(ghost).await?;
    two.publish(NodeEvent::Registered(node("node-2").gpus(8).registered()))
        .await?;
    bus.login(&collector("node-1")).await?.publish(other).await
}

#[tokio::test]
async fn a_team_submits_and_aborts_only_under_its_own_name() -> anyhow::Result<()> {
    let bus = Bus::start().await?;
    let mut b = bus.login(&team("B")).await?;
    let (subject_a, payload_a) = submission("A");
    b.refused_on(&subject_a, payload_a.clone()).await?;
    let abort = |team: &str| {
        WorkloadEvent::Aborted(WorkloadAborted {
            workload_id: "train-0123456789".into(),
            team: team.into(),
            task: None,
            reason: "forged".into(),
            by: "mallory".into(),
        })
    };
    b.refused(abort("A")).await?;

    let (subject_b, payload_b) = submission("B");
    b.publish_on(&subject_b, payload_b).await?;
    b.publish(abort("B")).await?;
    bus.login(&team("A"))
        .await?
        .publish_on(&subject_a, payload_a)
        .await
}

#[tokio::test]
async fn a_team_user_cannot_reach_jetstream_or_forge_a_reply() -> anyhow::Result<()> {
    let bus = Bus::start().await?;
    let mut a = bus.login(&team("A")).await?;
    let info = a.js.get_stream(names::WORKLOADS).await;
    ensure!(info.is_err(), "team A read WORKLOADS' info");
    a.violation(&format!("$JS.API.STREAM.INFO.{}", names::WORKLOADS))
        .await?;
    // A PubAck (or any reply) forged onto another client's inbox.
    a.client
        .publish(
            "_INBOX.someone.1",
            r#"{"stream":"WORKLOADS","seq":1}"#.into(),
        )
        .await?;
    a.client.flush().await?;
    a.violation("_INBOX.someone.1").await
}

#[tokio::test]
async fn no_service_can_delete_purge_or_rewrite_a_stream() -> anyhow::Result<()> {
    let bus = Bus::start().await?;
    bus.login(&collector("node-1"))
        .await?
        .publish(completed("node-1"))
        .await?;
    for role in [
        Role::Planner,
        Role::Allocator,
        Role::Inventory,
        Role::Billing,
        Role::Predictor,
        Role::Archiver,
        collector("node-1"),
    ] {
        let mut login = bus.login(&role).await?;
        let user = login.user.clone();
        ensure!(
            login.js.delete_stream(names::WORKLOADS).await.is_err(),
            "{user} deleted WORKLOADS"
        );
        login
            .violation(&format!("$JS.API.STREAM.DELETE.{}", names::WORKLOADS))
            .await?;
        let stream = login.js.get_stream(names::FLEET).await?;
        ensure!(stream.purge().await.is_err(), "{user} purged FLEET");
        login
            .violation(&format!("$JS.API.STREAM.PURGE.{}", names::FLEET))
            .await?;
        ensure!(
            stream.delete_message(1).await.is_err(),
            "{user} deleted a message"
        );
        login
            .violation(&format!("$JS.API.STREAM.MSG.DELETE.{}", names::FLEET))
            .await?;
        let mut widened = stream.cached_info().config.clone();
        widened.subjects.push("allot.forged.>".into());
        ensure!(
            login.js.update_stream(widened).await.is_err(),
            "{user} updated FLEET"
        );
        login
            .violation(&format!("$JS.API.STREAM.UPDATE.{}", names::FLEET))
            .await?;
        let own = login
            .js
            .create_stream(stream::Config {
                name: "FORGED".into(),
                subjects: vec!["allot.forged.>".into()],
                ..Default::default()
            })
            .await;
        ensure!(own.is_err(), "{user} created a stream");
        login.violation("$JS.API.STREAM.CREATE.FORGED").await?;
    }
    ensure!(
        bus.held(names::WORKLOADS).await? == 1,
        "WORKLOADS lost its event"
    );
    Ok(())
}

#[tokio::test]
async fn every_service_can_still_do_its_job() -> anyhow::Result<()> {
    let bus = Bus::start().await?;
    // Consuming: a durable pull consumer, fetched and acknowledged, by a service user.
    bus.login(&collector("node-1"))
        .await?
        .publish(completed("node-1"))
        .await?;
    let planner = bus.login(&Role::Planner).await?;
    let consumer = planner
        .js
        .get_stream(names::WORKLOADS)
        .await?
        .create_consumer(pull::Config {
            durable_name: Some("planner-test".into()),
            filter_subjects: vec!["allot.task.completed.*.*".into()],
            ..Default::default()
        })
        .await?;
    let mut batch = consumer.fetch().max_messages(1).messages().await?;
    let message = batch
        .next()
        .await
        .context("the completion is delivered")?
        .map_err(|e| anyhow::anyhow!(e))?;
    ensure!(message.subject.as_str() == "allot.task.completed.default.node-1");
    message.ack().await.map_err(|e| anyhow::anyhow!(e))?;

    // The predictor reads GPU telemetry (and the fleet) with durable consumers of its own.
    let gpus = node("node-1").gpus(1);
    let collector_1 = bus.login(&collector("node-1")).await?;
    collector_1
        .publish(NodeEvent::Registered(gpus.registered()))
        .await?;
    collector_1
        .publish(allot_events::TelemetryEvent::GpusSampled(gpus.sampled(40)))
        .await?;
    let predictor = bus.login(&Role::Predictor).await?;
    for (stream, filter) in [
        (names::TELEMETRY, subject::TELEMETRY_ALL.to_owned()),
        (names::FLEET, subject::node_registered("*")),
    ] {
        let consumer = predictor
            .js
            .get_stream(stream)
            .await?
            .create_consumer(pull::Config {
                durable_name: Some(format!("predictor-test-{}", stream.to_lowercase())),
                filter_subjects: vec![filter],
                ..Default::default()
            })
            .await?;
        let mut batch = consumer.fetch().max_messages(1).messages().await?;
        let message = batch
            .next()
            .await
            .with_context(|| format!("the predictor is delivered a message of {stream}"))?
            .map_err(|e| anyhow::anyhow!(e))?;
        message.ack().await.map_err(|e| anyhow::anyhow!(e))?;
    }

    // The allocator's lease bucket, and its key.
    let allocator = bus.login(&Role::Allocator).await?;
    let leases = allocator
        .js
        .create_key_value(jetstream::kv::Config {
            bucket: allot_bus::users::LEASE_BUCKET.into(),
            history: 1,
            max_age: Duration::from_secs(10),
            ..Default::default()
        })
        .await?;
    leases
        .create("allocator-default", "allocator-up".into())
        .await?;
    let mut collector_one = bus.login(&collector("node-1")).await?;
    let forged_lease = format!("$KV.{}.allocator-default", allot_bus::users::LEASE_BUCKET);
    collector_one
        .refused_on(&forged_lease, b"forger".to_vec())
        .await?;

    // The inventory answers status queries; a collector cannot.
    let inventory = bus.login(&Role::Inventory).await?;
    let mut queries = inventory
        .client
        .subscribe("allot.query.inventory.status")
        .await?;
    inventory.client.flush().await?;
    let answering = tokio::spawn(async move {
        if let Some(query) = queries.next().await
            && let Some(reply) = query.reply
        {
            let _ = inventory.client.publish(reply, "{}".into()).await;
            let _ = inventory.client.flush().await;
        }
    });
    let answer = bus
        .login(&team("A"))
        .await?
        .client
        .request("allot.query.inventory.status", "".into())
        .await?;
    ensure!(answer.payload.as_ref() == b"{}");
    answering.await?;

    // Everyone may dead-letter; billing publishes costs.
    bus.login(&Role::Archiver)
        .await?
        .publish_on(
            "allot.deadletter.allot.alloc.default.journal",
            b"{}".to_vec(),
        )
        .await?;
    bus.login(&Role::Billing)
        .await?
        .publish_on(&subject::cost("A", "train-0123456789"), b"{}".to_vec())
        .await
}

/// Records the node of every completion it is handed.
#[derive(Debug, Clone, Default)]
struct Completions(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Handler for Completions {
    async fn handle(&mut self, batch: &[Delivery]) -> Result<Vec<Outcome>, HandlerError> {
        for d in batch {
            if let AnyEvent::Task(TaskEvent::Completed(c)) = &d.event.data {
                self.0.lock().unwrap().push(c.node.clone());
            }
        }
        Ok(vec![Outcome::Handled; batch.len()])
    }
}

#[tokio::test]
async fn a_collector_cannot_speak_for_another_node_through_the_content_of_its_own_subject()
-> anyhow::Result<()> {
    let bus = Bus::start().await?;
    // node-2 may publish on its own subject, so the server takes this; its content claims
    // node-1's task.
    let forged = Envelope::new("/forged", completed("node-1"));
    bus.login(&collector("node-2"))
        .await?
        .publish_on("allot.task.completed.default.node-2", forged.to_json())
        .await?;
    bus.login(&collector("node-2"))
        .await?
        .publish(completed("node-2"))
        .await?;

    let seen = Completions::default();
    let planner = bus.login(&Role::Planner).await?;
    let spec = ConsumerSpec {
        filter_subjects: vec!["allot.task.completed.*.*".into()],
        ..ConsumerSpec::new(names::WORKLOADS, "completions")
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn(
        ConsumerRunner::new(planner.client.clone(), spec, seen.clone()).run(async {
            let _ = stopped.await;
        }),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while bus.held(names::DEADLETTER).await? < 1 || seen.0.lock().unwrap().is_empty() {
        ensure!(
            Instant::now() < deadline,
            "nothing handled or dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    runner.await??;
    ensure!(
        *seen.0.lock().unwrap() == ["node-2"],
        "handled completions of {:?}",
        seen.0.lock().unwrap()
    );
    let letter = bus
        .admin
        .js
        .get_stream(names::DEADLETTER)
        .await?
        .get_raw_message(1)
        .await?;
    ensure!(letter.subject.as_str() == "allot.deadletter.allot.task.completed.default.node-2");
    Ok(())
}

fn token_issued(team: &str) -> allot_events::AccessEvent {
    allot_events::AccessEvent::TokenIssued(allot_events::access::TokenIssued {
        token_id: "0123456789ab".into(),
        sha256: "0123456789ab".repeat(5) + "cdef",
        team: team.into(),
        role: allot_events::access::TokenRole::Admin,
        by: "forger".into(),
        description: String::new(),
        expires: None,
    })
}

#[tokio::test]
async fn api_tokens_are_issued_only_by_the_gateway_or_an_operator() -> anyhow::Result<()> {
    let bus = Bus::start().await?;
    for role in [
        team("A"),
        collector("node-1"),
        Role::Planner,
        Role::Allocator,
        Role::Remediation,
    ] {
        bus.login(&role).await?.refused(token_issued("A")).await?;
    }
    ensure!(
        bus.held(names::ACCESS).await? == 0,
        "a forged token was stored"
    );
    // The gateway issues for its callers, and may not write the journal.
    let mut gateway = bus.login(&Role::Gateway).await?;
    gateway.publish(token_issued("A")).await?;
    gateway.refused(journal_entry()).await?;
    bus.login(&Role::Admin)
        .await?
        .publish(token_issued("B"))
        .await?;
    ensure!(bus.held(names::ACCESS).await? == 2);
    Ok(())
}
