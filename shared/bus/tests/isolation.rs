//! Per-team isolation, against a real nats-server running the configuration `allot nats-config`
//! generates for teams A and B: each team reads its own cost events (live and through its own
//! stream) and nothing of the other's, cannot reach PLATFORM's JetStream API, and cannot publish.
//!
//! Every refusal is paired with the same operation succeeding for the right user, so no test
//! passes merely because nothing works. The last tests run the configuration *without* the team
//! users' permissions, to show that the account exports alone already keep each team to its own
//! subjects — including the consumer-create hole that subject permissions cannot close.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use async_nats::jetstream::{self, consumer::pull, stream::Stream};
use async_nats::{Client, Event, HeaderMap, RequestErrorKind};
use futures::StreamExt;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

use allot_bus::accounts::{self, Accounts, Credentials, PLATFORM_API_PREFIX};
use allot_bus::streams::{Ensured, names};
use allot_bus::{catalog, ensure_streams, ensure_team_streams};
use allot_events::subject;
use allot_testkit::NatsServer;

const TEAMS: [&str; 2] = ["A", "B"];
/// How long a refused operation is given to (not) deliver anything.
const QUIET: Duration = Duration::from_millis(700);
/// How long sourcing into a team stream may take.
const SOURCING: Duration = Duration::from_secs(15);

/// A connection that records the server's errors (permissions violations) as they arrive.
struct Login {
    client: Client,
    errors: mpsc::UnboundedReceiver<String>,
}

impl Login {
    async fn new(server: &NatsServer, creds: &Credentials) -> anyhow::Result<Self> {
        let (tx, errors) = mpsc::unbounded_channel();
        let client = creds
            .connect_options()
            .request_timeout(Some(Duration::from_millis(1500)))
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
        Ok(Self { client, errors })
    }

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
                _ => bail!("no permissions violation for {subject:?}; server errors: {seen:?}"),
            }
        }
    }

    /// A request that must be refused: it gets no answer, and the server names the violation.
    async fn refused_request(&mut self, subject: &str, payload: Value) -> anyhow::Result<()> {
        let answer = self
            .client
            .request(subject.to_owned(), payload.to_string().into())
            .await;
        ensure!(
            answer.is_err(),
            "{subject}: answered {:?}",
            answer.map(|m| m.payload)
        );
        self.violation(subject).await
    }

    /// A publish that must be refused.
    async fn refused_publish(&mut self, subject: &str) -> anyhow::Result<()> {
        self.client.publish(subject.to_owned(), "{}".into()).await?;
        self.client.flush().await?;
        self.violation(subject).await
    }
}

/// A server running the generated configuration, with COSTS and the team streams created and one
/// cost event per team published *before* the team streams existed.
struct Bus {
    server: NatsServer,
    accounts: Accounts,
    platform: Login,
}

impl Bus {
    async fn start(team_permissions: bool) -> anyhow::Result<Self> {
        let accounts = Accounts::generate(&TEAMS, &mut StdRng::from_os_rng())?;
        let config = if team_permissions {
            accounts.render()
        } else {
            accounts.render_exports_only()
        };
        let server = NatsServer::start_with_config(&config);
        let platform = Login::new(&server, &accounts.platform_credentials(&server.url())).await?;
        let js = jetstream::new(platform.client.clone());
        ensure_streams(&js, &catalog(1)).await?;
        let bus = Self {
            server,
            accounts,
            platform,
        };
        for team in TEAMS {
            bus.publish_cost(team, "before").await?;
        }
        let created = ensure_team_streams(&bus.platform.client, &TEAMS, 1).await?;
        ensure!(
            created.iter().all(|(_, e)| *e == Ensured::Created),
            "{created:?}"
        );
        Ok(bus)
    }

    async fn team(&self, team: &str) -> anyhow::Result<Login> {
        let creds = self
            .accounts
            .team_credentials(team, &self.server.url())
            .context("team generated")?;
        Login::new(&self.server, &creds).await
    }

    /// Publishes a cost event of `team` as billing would (acknowledged, with a message id).
    async fn publish_cost(&self, team: &str, workload: &str) -> anyhow::Result<()> {
        let js = jetstream::new(self.platform.client.clone());
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("{team}/{workload}").as_str());
        let body = json!({ "team": team, "workload": workload, "amount_micros": 1_250_000 });
        js.publish_with_headers(
            subject::cost(team, workload),
            headers,
            body.to_string().into(),
        )
        .await?
        .await
        .with_context(|| format!("cost event of {team}/{workload} acknowledged"))?;
        Ok(())
    }

    /// Publishes `team`'s cost event of `workload` until `live` (a subscription of the team's
    /// own) receives it, and returns what it received. The server wires an account's stream
    /// import when the account's first client connects, and a new subscription into the
    /// imports after the client's flush; under load a publish can overtake either (seen: 1 run
    /// in 3 with the other tests beside it, and once in CI a single publish that B waited 3 s
    /// for in vain).
    async fn published_until_seen(
        &self,
        team: &str,
        workload: &str,
        live: &mut async_nats::Subscriber,
    ) -> anyhow::Result<async_nats::Message> {
        for _ in 0..10 {
            self.publish_cost(team, workload).await?;
            if let Ok(Some(m)) = timeout(Duration::from_secs(1), live.next()).await {
                return Ok(m);
            }
        }
        bail!("{team}'s live event {workload} never arrived in 10 publishes")
    }

    async fn costs_messages(&self) -> anyhow::Result<u64> {
        let js = jetstream::new(self.platform.client.clone());
        Ok(js
            .get_stream(names::COSTS)
            .await?
            .info()
            .await?
            .state
            .messages)
    }
}

/// Waits until `stream` holds at least `n` messages.
async fn wait_for_messages(stream: &mut Stream, n: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + SOURCING;
    loop {
        let held = stream.info().await?.state.messages;
        if held >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} holds {held} messages, not {n}",
                stream.cached_info().config.name
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The subjects of every message a durable pull consumer on `stream` delivers, until it has
/// been quiet for a moment.
async fn consume_subjects(stream: &Stream, durable: &str) -> anyhow::Result<BTreeSet<String>> {
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(durable.to_owned()),
            ..Default::default()
        })
        .await?;
    let mut subjects = BTreeSet::new();
    let mut messages = consumer.messages().await?;
    while let Ok(Some(message)) = timeout(QUIET, messages.next()).await {
        let message = message.map_err(|e| anyhow::anyhow!(e))?;
        subjects.insert(message.subject.to_string());
        message.ack().await.map_err(|e| anyhow::anyhow!(e))?;
    }
    Ok(subjects)
}

fn set(subjects: &[&str]) -> BTreeSet<String> {
    subjects.iter().map(|s| (*s).to_owned()).collect()
}

/// A consumer-create request on COSTS for consumer `name`, with `filter` merged into its config.
fn consumer_request(name: &str, filter: Value) -> Value {
    let mut config = json!({ "name": name, "ack_policy": "explicit" });
    if let (Some(config), Value::Object(filter)) = (config.as_object_mut(), filter) {
        config.extend(filter);
    }
    json!({ "stream_name": "COSTS", "config": config })
}

/// Nothing arrives on `sub` for a moment.
async fn receives_nothing(sub: &mut async_nats::Subscriber) -> anyhow::Result<()> {
    if let Ok(Some(m)) = timeout(QUIET, sub.next()).await {
        bail!("received {} ({:?})", m.subject, m.payload);
    }
    Ok(())
}

#[tokio::test]
async fn a_team_receives_its_own_cost_events_live_and_through_its_durable_stream()
-> anyhow::Result<()> {
    let bus = Bus::start(true).await?;
    let a = bus.team("A").await?;
    let mut live = a.client.subscribe(subject::cost_of_team("A")).await?;
    a.client.flush().await?;

    // JetStream stores A's event once (same message id); the extra live copies
    // `published_until_seen` may have caused are skipped below.
    let event = bus.published_until_seen("A", "train-1", &mut live).await?;
    assert_eq!(event.subject.as_str(), "allot.cost.A.train-1");
    while let Ok(Some(m)) = timeout(QUIET, live.next()).await {
        assert_eq!(
            m.subject.as_str(),
            "allot.cost.A.train-1",
            "only copies of A's event"
        );
    }
    bus.publish_cost("B", "train-2").await?;
    receives_nothing(&mut live).await?;

    // The durable stream holds A's history, including the event published before it existed.
    let js = jetstream::new(a.client.clone());
    let mut stream = js.get_stream(accounts::team_stream("A")).await?;
    wait_for_messages(&mut stream, 2).await?;
    assert_eq!(
        consume_subjects(&stream, "finance").await?,
        set(&["allot.cost.A.before", "allot.cost.A.train-1"])
    );

    // Creating the team streams again changes nothing.
    let again = ensure_team_streams(&bus.platform.client, &TEAMS, 1).await?;
    assert!(
        again.iter().all(|(_, e)| *e == Ensured::Unchanged),
        "{again:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_team_cannot_subscribe_to_another_teams_subjects() -> anyhow::Result<()> {
    let bus = Bus::start(true).await?;
    let mut a = bus.team("A").await?;
    let b = bus.team("B").await?;
    let mut b_live = b.client.subscribe(subject::cost_of_team("B")).await?;
    b.client.flush().await?;

    let mut a_on_b = a.client.subscribe("allot.cost.B.>").await?;
    a.violation("allot.cost.B.>").await?;
    let mut a_on_all = a.client.subscribe(">").await?;
    a.violation(">").await?;
    let mut a_on_sync = a.client.subscribe("allot.sync.cost.B.>").await?;
    a.violation("allot.sync.cost.B.>").await?;

    // Every copy B's event may take to arrive would have reached A's subscriptions too, had
    // they leaked.
    let to_b = bus.published_until_seen("B", "secret", &mut b_live).await?;
    assert_eq!(to_b.subject.as_str(), "allot.cost.B.secret");
    receives_nothing(&mut a_on_b).await?;
    receives_nothing(&mut a_on_all).await?;
    receives_nothing(&mut a_on_sync).await?;
    Ok(())
}

#[tokio::test]
async fn a_team_cannot_reach_another_teams_events_through_any_jetstream_api() -> anyhow::Result<()>
{
    let bus = Bus::start(true).await?;
    let mut a = bus.team("A").await?;
    let consumer_on_b = |name: &str| {
        json!({ "stream_name": "COSTS", "config": {
            "name": name, "filter_subject": "allot.cost.B.>", "ack_policy": "explicit" } })
    };

    // A consumer on PLATFORM's COSTS, through its own API and through the imported one.
    a.refused_request(
        "$JS.API.CONSUMER.CREATE.COSTS.spy.allot.cost.B.>",
        consumer_on_b("spy"),
    )
    .await?;
    a.refused_request("$JS.API.CONSUMER.CREATE.COSTS", consumer_on_b("spy"))
        .await?;
    a.refused_request(
        "$JS.API.CONSUMER.DURABLE.CREATE.COSTS.spy",
        consumer_on_b("spy"),
    )
    .await?;
    a.refused_request(
        &format!("{PLATFORM_API_PREFIX}.CONSUMER.CREATE.COSTS.spy.allot.cost.B.>"),
        consumer_on_b("spy"),
    )
    .await?;
    // Even with its own filter, the user cannot use the import the server's sourcing uses.
    a.refused_request(
        &format!("{PLATFORM_API_PREFIX}.CONSUMER.CREATE.COSTS.mine.allot.cost.A.>"),
        json!({ "stream_name": "COSTS", "config": {
            "name": "mine", "filter_subject": "allot.cost.A.>", "ack_policy": "explicit" } }),
    )
    .await?;

    // Stream info, message get and direct get on COSTS.
    a.refused_request("$JS.API.STREAM.INFO.COSTS", json!({}))
        .await?;
    a.refused_request("$JS.API.STREAM.MSG.GET.COSTS", json!({ "seq": 1 }))
        .await?;
    a.refused_request("$JS.API.DIRECT.GET.COSTS", json!({ "seq": 1 }))
        .await?;
    a.refused_request(
        &format!("{PLATFORM_API_PREFIX}.STREAM.INFO.COSTS"),
        json!({}),
    )
    .await?;

    // A stream of its own sourcing B's subjects, and its stream re-pointed at B's.
    let sourcing_b = json!({
        "name": "SPY", "retention": "limits", "storage": "file", "num_replicas": 1,
        "sources": [{ "name": "COSTS", "filter_subject": "allot.cost.B.>",
            "external": { "api": PLATFORM_API_PREFIX, "deliver": "allot.sync.cost.A" } }] });
    a.refused_request("$JS.API.STREAM.CREATE.SPY", sourcing_b)
        .await?;
    let mut repointed = serde_json::to_value(accounts::team_stream_config("A", 1))?;
    repointed["sources"][0]["filter_subject"] = json!("allot.cost.B.>");
    a.refused_request("$JS.API.STREAM.UPDATE.COSTS_A", repointed.clone())
        .await?;
    a.refused_request("$JS.API.STREAM.DELETE.COSTS_A", json!({}))
        .await?;

    // Not vacuous: the platform can update the team stream through the team's export...
    let platform_update = bus
        .platform
        .client
        .request(
            "$JS.team.A.API.STREAM.UPDATE.COSTS_A",
            repointed.to_string().into(),
        )
        .await?;
    let answer: Value = serde_json::from_slice(&platform_update.payload)?;
    ensure!(answer.get("error").is_none(), "platform update: {answer}");
    // ... and puts it back, as `ensure_team_streams` does for any drift.
    let restored = ensure_team_streams(&bus.platform.client, &["A"], 1).await?;
    assert_eq!(restored, [("COSTS_A".to_owned(), Ensured::Updated)]);

    // A's own stream serves A: what it holds is A's, whatever filter A asks for.
    let js = jetstream::new(a.client.clone());
    let mut stream = js.get_stream("COSTS_A").await?;
    wait_for_messages(&mut stream, 1).await?;
    let subjects = consume_subjects(&stream, "audit").await?;
    ensure!(
        subjects.iter().all(|s| s.starts_with("allot.cost.A.")),
        "{subjects:?}"
    );
    let filtered_on_b = stream
        .create_consumer(pull::Config {
            durable_name: Some("b-filter".into()),
            filter_subject: "allot.cost.B.>".into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(filtered_on_b.cached_info().num_pending, 0);
    Ok(())
}

#[tokio::test]
async fn a_team_cannot_publish_anything_on_the_bus() -> anyhow::Result<()> {
    let bus = Bus::start(true).await?;
    let mut a = bus.team("A").await?;
    let forged = [
        "allot.cost.A.x",
        "allot.cost.B.x",
        "allot.workload.submitted.A",
        "allot.task.ready.default",
        "allot.alloc.default.journal",
    ];
    let mut platform_sees = Vec::new();
    for subject in forged {
        platform_sees.push(bus.platform.client.subscribe(subject).await?);
    }
    bus.platform.client.flush().await?;
    let before = bus.costs_messages().await?;

    for subject in forged {
        a.refused_publish(subject).await?;
    }
    for sub in &mut platform_sees {
        receives_nothing(sub).await?;
    }
    assert_eq!(bus.costs_messages().await?, before);

    // Not vacuous: the platform's publish is stored and seen.
    bus.publish_cost("A", "x").await?;
    assert_eq!(bus.costs_messages().await?, before + 1);
    let seen = timeout(Duration::from_secs(3), platform_sees[0].next())
        .await?
        .context("open")?;
    assert_eq!(seen.subject.as_str(), "allot.cost.A.x");
    Ok(())
}

/// The same checks with the team users' permissions removed: what keeps A out of B's events is
/// then only the accounts' exports and imports — in particular the consumer-create export that
/// carries A's filter in its subject.
#[tokio::test]
async fn without_user_permissions_the_exports_alone_keep_a_team_to_its_own_events()
-> anyhow::Result<()> {
    let bus = Bus::start(false).await?;
    let a = bus.team("A").await?;
    let prefix = PLATFORM_API_PREFIX;
    let request = |subject: String, payload: Value| {
        let client = a.client.clone();
        async move { client.request(subject, payload.to_string().into()).await }
    };
    let api_answer =
        |payload: &[u8]| -> anyhow::Result<Value> { Ok(serde_json::from_slice(payload)?) };

    // The path the server's sourcing uses works for A's own filter (so the refusals below are
    // not an artefact of a broken import)...
    let own = request(
        format!("{prefix}.CONSUMER.CREATE.COSTS.own.allot.cost.A.>"),
        consumer_request("own", json!({ "filter_subject": "allot.cost.A.>" })),
    )
    .await?;
    let own = api_answer(&own.payload)?;
    ensure!(own.get("error").is_none(), "own filter refused: {own}");

    // ... while another filter in the subject is not routable at all,
    for subject in [
        format!("{prefix}.CONSUMER.CREATE.COSTS.spy.allot.cost.B.>"),
        format!("{prefix}.CONSUMER.CREATE.COSTS.spy.allot.cost.*.>"),
        format!("{prefix}.CONSUMER.CREATE.COSTS.spy.>"),
        format!("{prefix}.CONSUMER.CREATE.COSTS"),
        format!("{prefix}.CONSUMER.DURABLE.CREATE.COSTS.spy"),
        format!("{prefix}.CONSUMER.INFO.COSTS.own"),
        format!("{prefix}.CONSUMER.MSG.NEXT.COSTS.own"),
        format!("{prefix}.STREAM.INFO.COSTS"),
        format!("{prefix}.STREAM.MSG.GET.COSTS"),
        format!("{prefix}.DIRECT.GET.COSTS"),
    ] {
        match request(
            subject.clone(),
            consumer_request("spy", json!({ "filter_subject": "allot.cost.B.>" })),
        )
        .await
        {
            Err(e) if e.kind() == RequestErrorKind::NoResponders => {}
            other => bail!("{subject}: {other:?}"),
        }
    }
    // ... and A's filter in the subject with another in the payload is refused by the server.
    for payload_filter in [
        json!({ "filter_subject": "allot.cost.B.>" }),
        json!({ "filter_subject": ">" }),
        json!({ "filter_subjects": ["allot.cost.B.>"] }),
        json!({ "filter_subjects": ["allot.cost.A.>", "allot.cost.B.>"] }),
    ] {
        let answer = request(
            format!("{prefix}.CONSUMER.CREATE.COSTS.spy.allot.cost.A.>"),
            consumer_request("spy", payload_filter.clone()),
        )
        .await?;
        let answer = api_answer(&answer.payload)?;
        ensure!(
            answer.get("error").is_some(),
            "{payload_filter}: created {answer}"
        );
    }

    // A stream of A's own that sources B's subjects, or everything, never receives anything;
    // its real team stream (same server, same wait) does receive A's events.
    let js = jetstream::new(a.client.clone());
    for (name, filter) in [("SPY_B", Some("allot.cost.B.>")), ("SPY_ALL", None)] {
        let mut config = accounts::team_stream_config("A", 1);
        config.name = name.to_owned();
        config.sources.as_mut().context("sources")?[0].filter_subject = filter.map(str::to_owned);
        js.create_stream(config).await?;
    }
    // And A re-pointing its own stream at B's subjects (it may, without permissions).
    let mut repointed = accounts::team_stream_config("A", 1);
    repointed.sources.as_mut().context("sources")?[0].filter_subject =
        Some("allot.cost.B.>".into());
    repointed.name = "COSTS_A".into();
    let mut spy_a = js.get_stream("COSTS_A").await?;
    wait_for_messages(&mut spy_a, 1).await?; // A's "before" event, sourced with A's filter
    js.update_stream(repointed).await?;

    bus.publish_cost("B", "secret").await?;
    bus.publish_cost("A", "after").await?;
    // Give sourcing time: a control stream sourcing A's filter sees the new event.
    let mut control = {
        let mut config = accounts::team_stream_config("A", 1);
        config.name = "CONTROL".into();
        js.create_stream(config).await?
    };
    wait_for_messages(&mut control, 2).await?;
    for name in ["SPY_B", "SPY_ALL"] {
        let held = js.get_stream(name).await?.info().await?.state.messages;
        assert_eq!(held, 0, "{name} sourced B's events");
    }
    let subjects = consume_subjects(&spy_a, "check").await?;
    ensure!(
        subjects.iter().all(|s| s.starts_with("allot.cost.A.")),
        "COSTS_A re-pointed at B got {subjects:?}"
    );

    // Live: even subscribed to everything, A sees only what PLATFORM exports to it.
    let mut all = a.client.subscribe(">").await?;
    a.client.flush().await?;
    // (Its own streams' sourcing deliveries and heartbeats on `allot.sync.cost.A.…` show too.)
    // B's event is stored before A's is published, so had it leaked it would arrive first. The
    // server wires a new subscription into the account's imports asynchronously, so a loaded
    // machine may drop the first live events: both are published again, B's first, until A's
    // arrives (each round read for half a second).
    let mut costs = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut own_seen = false;
    while !own_seen && Instant::now() < deadline {
        bus.publish_cost("B", "secret-2").await?;
        bus.publish_cost("A", "live").await?;
        let until = Instant::now() + Duration::from_millis(500);
        while let Ok(Some(m)) = tokio::time::timeout_at(until, all.next()).await {
            if m.subject.starts_with("allot.cost.") {
                costs.insert(m.subject.to_string());
            }
            own_seen |= m.subject.as_str() == "allot.cost.A.live";
        }
    }
    assert_eq!(costs, set(&["allot.cost.A.live"]));

    // And whatever A publishes stays in its account.
    let forged = ["allot.cost.A.forged", "allot.workload.submitted.A"];
    let mut platform_sees = Vec::new();
    for subject in forged {
        platform_sees.push(bus.platform.client.subscribe(subject).await?);
    }
    bus.platform.client.flush().await?;
    let before = bus.costs_messages().await?;
    for subject in forged {
        a.client.publish(subject, "{}".into()).await?;
    }
    a.client.flush().await?;
    for sub in &mut platform_sees {
        receives_nothing(sub).await?;
    }
    assert_eq!(bus.costs_messages().await?, before);
    Ok(())
}
