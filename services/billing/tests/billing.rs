//! Billing against a real nats-server: a journal published into DECISIONS (as the allocator
//! writes it) is priced to the micro-unit — a whole GPU, a fractional one, a preempted lease —
//! and delivering every journal message twice, or restarting billing, changes no total.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use allot_billing::{Config, PriceTable};
use allot_bus::{Publisher, catalog, ensure_streams};
use allot_events::alloc::{Applied, Dispatch, Launch, NodeGrant};
use allot_events::cost::CostAccrued;
use allot_events::{AllocEvent, AnyEvent, CostEvent, decode};
use allot_sched::journal::Entry;
use allot_sched::{Decision, Input, LeaseId, RunEnd, TaskId, TaskSpec};
use allot_testkit::NatsServer;

const POOL: &str = "default";
const MINUTE: u64 = 60_000;
/// A Monday, 09:00 UTC, so periods align to whole minutes.
const T0: u64 = 1_795_424_400_000;

const PRICES: &str = r#"
currency: EUR
tables:
  - effectiveFrom: "2026-01-01T00:00:00Z"
    gpuHour: {H100: "2.50"}
    cpuCoreHour: "0.04"
    memoryGiBHour: "0.005"
"#;

/// Journal entries as the allocator appends them.
struct Journal(u64, Vec<Applied>);

impl Journal {
    fn push(&mut self, input: Input, decisions: Vec<Decision>, dispatch: Vec<Dispatch>) {
        self.0 += 1;
        self.1.push(Applied {
            pool: POOL.into(),
            source: None,
            entry: Entry {
                seq: self.0,
                input,
                decisions,
                rejected: None,
            },
            launch: None,
            dispatch,
        });
    }

    fn lease(&mut self, task: u64, team: &str, milli: u32, from: u64, to: u64, preempted: bool) {
        self.push(
            Input::TaskSubmitted {
                task: TaskSpec::new(task, team, 1),
                at: from,
            },
            vec![],
            vec![],
        );
        let dispatch = Dispatch {
            task: TaskId(task),
            lease: LeaseId(task),
            launch: Launch {
                workload: format!("{team}-run"),
                name: "train".into(),
                team: String::new(),
                run: Default::default(),
            },
            nodes: vec![NodeGrant {
                node: "n1".into(),
                gpu_model: "H100".into(),
                gpus: vec![(task as u32, milli)],
                mig: None,
                cpu_milli: 0,
                memory_mib: 0,
            }],
        };
        let granted = Decision::Granted {
            task: TaskId(task),
            lease: LeaseId(task),
            placement: Default::default(),
            at: from,
            reason: "test".into(),
        };
        self.push(Input::Schedule { at: from }, vec![granted], vec![dispatch]);
        let end = if preempted {
            Decision::Preempted {
                task: TaskId(task),
                lease: LeaseId(task),
                at: to,
                for_task: None,
                lost: 0,
                reason: "test".into(),
            }
        } else {
            Decision::Released {
                task: TaskId(task),
                lease: LeaseId(task),
                at: to,
            }
        };
        self.push(
            Input::TaskFinished {
                task: TaskId(task),
                at: to,
                run: Some(RunEnd::Completed {
                    lease: LeaseId(task),
                }),
            },
            vec![end],
            vec![],
        );
    }
}

/// Three leases: vision's whole H100 for an hour (2.50) and a preemption after 10.5 minutes
/// (0.4375); nlp's quarter of an H100 for 30 minutes (0.3125).
fn journal() -> Vec<Applied> {
    let mut j = Journal(0, Vec::new());
    j.lease(1, "vision", 1000, T0, T0 + 60 * MINUTE, false);
    j.lease(2, "nlp", 250, T0 + 5 * MINUTE, T0 + 35 * MINUTE, false);
    j.lease(
        3,
        "vision",
        1000,
        T0 + 2 * MINUTE,
        T0 + 12 * MINUTE + 30_000,
        true,
    );
    j.1.sort_by_key(|a| a.entry.input.at());
    for (i, a) in j.1.iter_mut().enumerate() {
        a.entry.seq = i as u64 + 1;
    }
    j.1
}

/// A server with Allot's streams, and a client of it.
async fn bus() -> (NatsServer, async_nats::Client) {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    ensure_streams(&async_nats::jetstream::new(client.clone()), &catalog(1))
        .await
        .unwrap();
    (server, client)
}

/// Every cost event stored, with its id.
async fn costs(client: &async_nats::Client) -> Vec<(String, CostAccrued)> {
    allot_testkit::streams::read_all(client, "COSTS")
        .await
        .into_iter()
        .filter_map(|m| {
            let envelope = decode(&m.payload).unwrap();
            match envelope.data {
                AnyEvent::Cost(CostEvent::Accrued(c)) => Some((envelope.id.to_string(), c)),
                _ => None,
            }
        })
        .collect()
}

/// Runs billing until the three leases' last periods are stored (or 30 s pass).
async fn bill(url: &str, dir: &std::path::Path, client: &async_nats::Client, teams: Option<&str>) {
    let mut config = Config::new(url, dir, PriceTable::parse(PRICES).unwrap());
    if let Some(teams) = teams {
        config.budgets = allot_billing::budget::from_teams(
            &allot_workload::TeamsConfig::from_yaml(teams).unwrap(),
        );
    }
    config.interval = Duration::from_secs(60);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let billing = tokio::spawn(allot_billing::run(config, async {
        let _ = stopped.await;
    }));
    // Done when it has applied the whole journal (its recorded position is the stream's end).
    let db = dir.join("billing.db");
    allot_testkit::streams::wait_until_applied(
        client,
        "DECISIONS",
        Duration::from_secs(30),
        || {
            allot_store::rusqlite::Connection::open(&db)
                .ok()
                .and_then(|c| allot_store::position(&c, "billing").ok().flatten())
        },
    )
    .await;
    let _ = stop.send(());
    billing.await.unwrap().unwrap();
}

fn totals(events: &[(String, CostAccrued)]) -> BTreeMap<String, i64> {
    let mut by_team = BTreeMap::new();
    for (_, c) in events {
        *by_team.entry(c.team.clone()).or_default() += c.amount;
    }
    by_team
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_equal_lease_time_times_price_and_redelivery_or_restart_bills_nothing_twice() {
    let (server, client) = bus().await;
    let publisher = Publisher::new(client.clone(), "/allot/allocator/test");
    // Every journal message twice (a re-sent append stored again under a new id).
    for applied in journal() {
        for _ in 0..2 {
            publisher
                .publish(AllocEvent::Applied(applied.clone()))
                .await
                .unwrap();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    bill(&server.url(), dir.path(), &client, None).await;
    let first = costs(&client).await;
    let want = BTreeMap::from([
        ("nlp".to_owned(), 312_500),
        ("vision".to_owned(), 2_500_000 + 437_500),
    ]);
    assert_eq!(totals(&first), want);
    // Each event id once: nothing was published twice.
    let ids: BTreeSet<&String> = first.iter().map(|(id, _)| id).collect();
    assert_eq!(ids.len(), first.len());
    // Minute periods: 60 + 30 + 11 (10.5 minutes from :02, the last half-minute its own).
    let per_lease: BTreeMap<u64, usize> = first.iter().fold(BTreeMap::new(), |mut m, (_, c)| {
        *m.entry(c.lease.0).or_default() += 1;
        m
    });
    assert_eq!(per_lease, BTreeMap::from([(1, 60), (2, 30), (3, 11)]));
    // The costs subjects are the team's and the workload's.
    let subjects: BTreeSet<String> = allot_testkit::streams::read_all(&client, "COSTS")
        .await
        .into_iter()
        .map(|m| m.subject.to_string())
        .collect();
    assert_eq!(
        subjects,
        BTreeSet::from([
            "allot.cost.nlp.nlp-run".to_owned(),
            "allot.cost.vision.vision-run".to_owned()
        ])
    );

    // Billing restarted from scratch (its database lost): it re-reads the whole journal and
    // publishes the same events under the same ids; JetStream stores none of them again.
    let fresh = tempfile::tempdir().unwrap();
    bill(&server.url(), fresh.path(), &client, None).await;
    let again = costs(&client).await;
    assert_eq!(again.len(), first.len());
    assert_eq!(totals(&again), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_warning_and_exceeded_fire_once_each_when_spending_crosses_them() {
    let (server, client) = bus().await;
    let publisher = Publisher::new(client.clone(), "/allot/allocator/test");
    for applied in journal() {
        publisher
            .publish(AllocEvent::Applied(applied))
            .await
            .unwrap();
    }
    // vision spends 2.9375 this month; its budget is 2.00 (warning at 1.60).
    let teams = "teams:\n  - {name: vision, budget: {amount: \"2.00\", blockBelow: standard}}\n  - {name: nlp}\n";
    let dir = tempfile::tempdir().unwrap();
    bill(&server.url(), dir.path(), &client, Some(teams)).await;

    let mut vision_spent = 0i64;
    let mut crossings = Vec::new();
    for m in allot_testkit::streams::read_all(&client, "COSTS").await {
        match decode(&m.payload).unwrap().data {
            AnyEvent::Cost(CostEvent::Accrued(c)) if c.team == "vision" => vision_spent += c.amount,
            AnyEvent::Cost(CostEvent::BudgetCrossed(b)) => {
                assert_eq!(m.subject.as_str(), "allot.cost.vision._budget");
                crossings.push((b.level, vision_spent, b.spent, b.block_below));
            }
            _ => {}
        }
    }
    use allot_events::cost::BudgetLevel::{Exceeded, Warning};
    let levels: Vec<_> = crossings.iter().map(|c| c.0).collect();
    assert_eq!(levels, [Warning, Exceeded], "{crossings:?}");
    for (level, spent_before, reported, floor) in crossings {
        let threshold = if level == Warning {
            1_600_000
        } else {
            2_000_000
        };
        // Announced with the cost that crossed it: the spending it reports is what the cost
        // events up to it add to, it is past the threshold, and the minute before was not.
        assert_eq!(reported, spent_before);
        assert!(reported >= threshold, "{level:?} at {reported}");
        assert!(
            reported - 2 * 41_667 < threshold,
            "{level:?} late: at {reported}"
        );
        assert_eq!(floor, Some(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leases_last_cost_reports_the_idle_share_telemetry_saw() {
    use allot_events::TelemetryEvent;
    let (server, client) = bus().await;
    let publisher = Publisher::new(client.clone(), "/test");
    // One lease of a whole H100 (GPU 0 of n1) for an hour.
    let mut journal = Journal(0, Vec::new());
    journal.lease(0, "vision", 1000, T0, T0 + 60 * MINUTE, false);
    let release = journal.1.pop().unwrap();
    for applied in journal.1 {
        publisher
            .publish(AllocEvent::Applied(applied))
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(server.url(), dir.path(), PriceTable::parse(PRICES).unwrap());
    config.interval = Duration::from_secs(3600);
    let billing = tokio::spawn(allot_billing::run(config, std::future::pending()));
    let db = dir.path().join("billing.db");
    let counted = |want: i64| {
        let db = db.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let n: Option<i64> = allot_store::rusqlite::Connection::open(&db)
                    .ok()
                    .and_then(|c| {
                        c.query_row("SELECT sum(samples) FROM holdings", [], |r| r.get(0))
                            .ok()
                    })
                    .flatten();
                if n == Some(want) {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "{n:?} samples counted, want {want}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    counted(0).await;
    // Three samples of the leased GPU idle, one busy; GPU 1 (not leased) counts for nothing.
    let n1 = allot_testkit::node("n1").gpus(2);
    for util in [0, 0, 50, 0] {
        let mut sample = n1.sampled(util);
        sample.samples[1].utilization_pct = Some(0);
        publisher
            .publish(TelemetryEvent::GpusSampled(sample))
            .await
            .unwrap();
    }
    counted(4).await;
    publisher
        .publish(AllocEvent::Applied(release))
        .await
        .unwrap();
    let last = loop {
        if let Some((_, c)) = costs(&client).await.into_iter().find(|(_, c)| c.last) {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    billing.abort();
    let idle = last.idle.expect("a GPU lease reports its idle share");
    assert_eq!((idle.samples, idle.idle_samples), (4, 3));
    assert_eq!(idle.gpu_amount, 2_500_000);
    assert_eq!(idle.amount, 1_875_000, "three quarters of 2.50");
    assert_eq!(
        last.amount, 2_500_000,
        "reported beside the amount, not deducted"
    );
}
