//! The allocator against a real nats-server: it grants from bus events, a standby takes over
//! when the leader dies, the journal replays to the same decisions, and a deposed leader's
//! append is rejected.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use allot_allocator::journal::{self, JournalError};
use allot_allocator::{Config, Journal};
use allot_bus::{Publisher, catalog, ensure_streams};
use allot_events::task::{TaskCompleted, TaskReady};
use allot_events::{AllocEvent, NodeEvent, TaskEvent};
use allot_sched::journal::{Entry, Header};
use allot_sched::{Decision, TaskId, TaskSpec};
use allot_testkit::{NatsCluster, NatsServer, node};

const POOL: &str = "p";

fn config(url: &str, instance: &str) -> Config {
    Config {
        policy: "fifo".into(),
        instance: instance.into(),
        lease_ttl: Duration::from_secs(2),
        pass_interval: Duration::from_millis(200),
        ..Config::new(url, POOL)
    }
}

fn ready(id: u64, gpus: u32) -> TaskEvent {
    TaskEvent::Ready(TaskReady {
        pool: POOL.into(),
        workload: "w".into(),
        name: format!("t{id}"),
        task: TaskSpec::new(id, "vision", gpus),
        run: Default::default(),
    })
}

/// A client of the server at `url` with the streams made, its JetStream context and a
/// publisher.
async fn bus(url: &str) -> (async_nats::jetstream::Context, Publisher) {
    let client = async_nats::connect(url).await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    ensure_streams(&js, &catalog(1)).await.unwrap();
    (js, Publisher::new(client, "/test"))
}

/// Registers nodes `n1` and `n2` of four GPUs each in the pool.
async fn two_nodes(publisher: &Publisher) {
    for n in ["n1", "n2"] {
        let registered = node(n).gpus(4).pool(POOL).registered();
        publisher
            .publish(NodeEvent::Registered(registered))
            .await
            .unwrap();
    }
}

/// The journal's events until `done` holds of them (or 30 s pass).
async fn journal_until(
    js: &async_nats::jetstream::Context,
    done: impl Fn(&[AllocEvent]) -> bool,
) -> Vec<AllocEvent> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events: Vec<AllocEvent> = journal::read(js, POOL)
            .await
            .unwrap()
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        if done(&events) || Instant::now() > deadline {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn entries(events: &[AllocEvent]) -> Vec<Entry> {
    events
        .iter()
        .filter_map(|e| match e {
            AllocEvent::Applied(a) => Some(a.entry.clone()),
            AllocEvent::LeaderElected(_) => None,
        })
        .collect()
}

fn granted(events: &[AllocEvent]) -> BTreeSet<u64> {
    entries(events)
        .iter()
        .flat_map(|e| &e.decisions)
        .filter_map(|d| match d {
            Decision::Granted { task, .. } => Some(task.0),
            _ => None,
        })
        .collect()
}

/// The lease and first node of `task`'s latest grant: what its executor's reports name.
fn grant_of(events: &[AllocEvent], task: u64) -> (allot_sched::LeaseId, String) {
    events
        .iter()
        .filter_map(|e| match e {
            AllocEvent::Applied(a) => Some(&a.dispatch),
            AllocEvent::LeaderElected(_) => None,
        })
        .flatten()
        .filter(|d| d.task == TaskId(task))
        .map(|d| (d.lease, d.nodes[0].node.clone()))
        .next_back()
        .expect("the task was granted")
}

fn leaders(events: &[AllocEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            AllocEvent::LeaderElected(l) => Some(l.leader.clone()),
            AllocEvent::Applied(_) => None,
        })
        .collect()
}

/// No GPU is held by two leases at once, over the whole journal.
fn assert_no_gpu_granted_twice(entries: &[Entry]) {
    let mut held: BTreeSet<(u32, u32)> = BTreeSet::new();
    let mut by_task: std::collections::BTreeMap<TaskId, Vec<(u32, u32)>> = Default::default();
    for entry in entries {
        for d in &entry.decisions {
            match d {
                Decision::Granted {
                    task, placement, ..
                } => {
                    let gpus: Vec<(u32, u32)> = placement
                        .shares
                        .iter()
                        .flat_map(|s| s.gpus.iter().map(move |(g, _)| (s.node.0, *g)))
                        .collect();
                    for gpu in &gpus {
                        assert!(held.insert(*gpu), "GPU {gpu:?} granted twice (to {task})");
                    }
                    by_task.insert(*task, gpus);
                }
                Decision::Released { task, .. } | Decision::Preempted { task, .. } => {
                    for gpu in by_task.remove(task).unwrap_or_default() {
                        held.remove(&gpu);
                    }
                }
                Decision::Waiting { .. }
                | Decision::Reserved { .. }
                | Decision::Withdrawn { .. } => {}
            }
        }
    }
}

#[test]
fn a_standby_takes_over_when_the_leader_dies_and_the_journal_replays() {
    let server = NatsServer::start();
    let url = server.url();
    // The leader runs on a runtime of its own, so that dropping it kills it as a crash would:
    // no lease released, no goodbye.
    let leader_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let a = config(&url, "a");
    leader_rt.spawn(async move {
        allot_allocator::run(a, std::future::pending())
            .await
            .unwrap();
    });

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (js, publisher) = bus(&url).await;
        two_nodes(&publisher).await;
        for id in 1..=3 {
            publisher.publish(ready(id, 4)).await.unwrap();
        }
        let events = journal_until(&js, |e| granted(e).len() == 2).await;
        assert_eq!(
            granted(&events),
            BTreeSet::from([1, 2]),
            "two nodes, two grants: {events:?}"
        );
        assert_eq!(leaders(&events), ["a"]);

        // A standby waits while the leader lives.
        let b = config(&url, "b");
        let standby = tokio::spawn(allot_allocator::run(b, std::future::pending()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(leaders(&journal_until(&js, |_| true).await), ["a"]);

        // The leader dies; task 1 completes meanwhile.
        leader_rt.shutdown_background();
        let (lease, node) = grant_of(&events, 1);
        publisher
            .publish(TaskEvent::Completed(TaskCompleted {
                pool: POOL.into(),
                task: TaskId(1),
                node,
                lease,
            }))
            .await
            .unwrap();
        let events = journal_until(&js, |e| granted(e).contains(&3)).await;
        assert_eq!(leaders(&events), ["a", "b"], "b took over");
        assert_eq!(granted(&events), BTreeSet::from([1, 2, 3]));

        // Every decision recomputes from the journal, and no GPU was ever held twice.
        let entries = entries(&events);
        let summary =
            allot_sched::journal::verify(&Header::new("fifo"), entries.clone(), None, None)
                .unwrap();
        assert_eq!(summary.entries as usize, entries.len());
        assert_no_gpu_granted_twice(&entries);
        let nodes_added = entries
            .iter()
            .filter(|e| matches!(e.input, allot_sched::Input::NodeAdded(_)))
            .count();
        assert_eq!(nodes_added, 2, "the new leader did not add the nodes again");
        standby.abort();
    });
}

#[test]
fn a_deposed_leaders_append_is_rejected() {
    let server = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = async_nats::connect(&server.url()).await.unwrap();
        let js = async_nats::jetstream::new(client.clone());
        ensure_streams(&js, &catalog(1)).await.unwrap();
        let publisher = Publisher::new(client.clone(), "/test");
        let (mut old, _) = Journal::open(publisher.clone(), POOL, "fifo")
            .await
            .unwrap();
        old.elected("old", "fifo").await.unwrap();
        // A new leader reads the journal and appends.
        let (mut new, _) = Journal::open(publisher.clone(), POOL, "fifo")
            .await
            .unwrap();
        new.elected("new", "fifo").await.unwrap();
        // The old one, unaware, tries to go on with a batch of three entries: the whole batch
        // is refused, not just its first entry.
        let mut scheduler =
            allot_sched::Scheduler::new(allot_sched::policy::by_name("fifo").unwrap());
        let mut stage_three = |journal: &mut Journal| {
            for at in 1..=3 {
                let input = allot_sched::Input::Schedule { at };
                journal.apply(&mut scheduler, input, None, None);
            }
        };
        stage_three(&mut old);
        let err = old.commit().await.unwrap_err();
        assert!(matches!(err, JournalError::Deposed { .. }), "{err}");
        let events = journal::read(&js, POOL).await.unwrap();
        assert_eq!(events.len(), 2, "only the two elections are in the journal");
        // The new leader's batch lands whole, in order, after its election.
        stage_three(&mut new);
        new.commit().await.unwrap();
        let events = journal::read(&js, POOL).await.unwrap();
        let seqs: Vec<u64> = events
            .iter()
            .filter_map(|(_, e)| match e {
                allot_events::AllocEvent::Applied(a) => Some(a.entry.seq),
                _ => None,
            })
            .collect();
        assert_eq!(seqs, [1, 2, 3]);
        // A journal written under one policy is not continued under another.
        let err = Journal::open(publisher, POOL, "allot").await.unwrap_err();
        assert!(matches!(err, JournalError::PolicyChanged { .. }), "{err}");
    });
}

#[test]
fn a_team_over_budget_gets_nothing_new_below_its_floor_until_it_is_within_again() {
    use allot_events::CostEvent;
    use allot_events::cost::{BudgetCrossed, BudgetLevel};
    let server = NatsServer::start();
    let url = server.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (js, publisher) = bus(&url).await;
        let crossed = |level| {
            CostEvent::BudgetCrossed(BudgetCrossed {
                team: "vision".into(),
                period: "2026-11".into(),
                level,
                spent: 10,
                budget: 10,
                currency: "EUR".into(),
                block_below: Some(100),
            })
        };
        let registered = node("n1").gpus(4).pool(POOL).registered();
        publisher
            .publish(NodeEvent::Registered(registered))
            .await
            .unwrap();
        tokio::spawn(allot_allocator::run(
            config(&url, "a"),
            std::future::pending(),
        ));
        // Billing says the team is over budget; the allocator journals it (a warning changes
        // nothing and is not journalled).
        publisher
            .publish(crossed(BudgetLevel::Warning))
            .await
            .unwrap();
        publisher
            .publish(crossed(BudgetLevel::Exceeded))
            .await
            .unwrap();
        let budgets = |e: &[AllocEvent]| {
            entries(e)
                .iter()
                .filter(|e| matches!(e.input, allot_sched::Input::TeamBudget { .. }))
                .count()
        };
        let events = journal_until(&js, |e| budgets(e) == 1).await;
        assert_eq!(budgets(&events), 1);
        // A batch task (priority 0) and a critical one (1000) of the over-budget team.
        publisher.publish(ready(1, 1)).await.unwrap();
        let mut critical = TaskSpec::new(2, "vision", 1);
        critical.priority = 1000;
        publisher
            .publish(TaskEvent::Ready(TaskReady {
                pool: POOL.into(),
                workload: "w".into(),
                name: "t2".into(),
                task: critical,
                run: Default::default(),
            }))
            .await
            .unwrap();
        let waiting_on_budget = |e: &[AllocEvent]| {
            entries(e).iter().flat_map(|e| &e.decisions).any(|d| {
                matches!(
                    d,
                    Decision::Waiting {
                        task: TaskId(1),
                        reason: allot_sched::WaitReason::Budget { floor: 100, .. },
                        ..
                    }
                )
            })
        };
        let events = journal_until(&js, |e| granted(e).contains(&2) && waiting_on_budget(e)).await;
        assert_eq!(
            granted(&events),
            BTreeSet::from([2]),
            "only the critical task starts"
        );
        assert!(
            waiting_on_budget(&events),
            "the batch task waits, saying why"
        );

        // A new period: the team is within its budget again, and the batch task starts.
        publisher
            .publish(crossed(BudgetLevel::Within))
            .await
            .unwrap();
        let events = journal_until(&js, |e| granted(e).contains(&1)).await;
        assert_eq!(granted(&events), BTreeSet::from([1, 2]));
        assert_eq!(budgets(&events), 2);
    });
}

#[test]
fn a_task_report_naming_another_lease_or_node_is_refused_and_the_task_runs_on() {
    let server = NatsServer::start();
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (js, publisher) = bus(&url).await;
        two_nodes(&publisher).await;
        tokio::spawn(allot_allocator::run(
            config(&url, "a"),
            std::future::pending(),
        ));
        publisher.publish(ready(1, 4)).await.unwrap();
        let events = journal_until(&js, |e| granted(e).contains(&1)).await;
        let (lease, node) = grant_of(&events, 1);
        let elsewhere = if node == "n1" { "n2" } else { "n1" };

        // A stale or forged completion: another lease; the right lease on another node.
        let forged = [
            TaskCompleted {
                pool: POOL.into(),
                task: TaskId(1),
                node: node.clone(),
                lease: allot_sched::LeaseId(lease.0 + 100),
            },
            TaskCompleted {
                pool: POOL.into(),
                task: TaskId(1),
                node: elsewhere.into(),
                lease,
            },
        ];
        for f in forged {
            publisher.publish(TaskEvent::Completed(f)).await.unwrap();
        }
        let mut dead = Vec::new();
        for _ in 0..100 {
            dead = allot_testkit::streams::read_all(
                &js.client(),
                allot_bus::streams::names::DEADLETTER,
            )
            .await;
            if dead.len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let reasons: Vec<String> = dead
            .iter()
            .map(|m| {
                m.headers
                    .as_ref()
                    .unwrap()
                    .get(allot_bus::headers::ERROR)
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(reasons[0].contains("the task holds lease"), "{reasons:?}");
        assert!(reasons[1].contains("that lease is not on"), "{reasons:?}");

        // The real completion ends it.
        publisher
            .publish(TaskEvent::Completed(TaskCompleted {
                pool: POOL.into(),
                task: TaskId(1),
                node,
                lease,
            }))
            .await
            .unwrap();
        let released = |e: &[AllocEvent]| {
            entries(e)
                .iter()
                .flat_map(|e| &e.decisions)
                .filter(|d| matches!(d, Decision::Released { .. }))
                .count()
        };
        let events = journal_until(&js, |e| released(e) == 1).await;
        assert_eq!(
            released(&events),
            1,
            "released once, by the genuine completion"
        );
        let finishes = entries(&events)
            .iter()
            .filter(|e| matches!(e.input, allot_sched::Input::TaskFinished { .. }))
            .count();
        assert_eq!(finishes, 1, "the refused reports were not journalled");
    });
}

/// Waits (up to 30 s) until both followers of the lease bucket have caught up with its leader.
async fn wait_until_current(js: &async_nats::jetstream::Context) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut stream = js
            .get_stream(format!("KV_{}", allot_allocator::lease::BUCKET))
            .await
            .unwrap();
        let cluster = stream.info().await.unwrap().cluster.clone().unwrap();
        if cluster.replicas.len() == 2 && cluster.replicas.iter().all(|p| p.current) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the raised replicas never caught up: {cluster:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publishes `event`, again for up to 30 s while a stream of a cluster has no leader (just
/// created, or its leader's server just died).
async fn publish_retrying(publisher: &Publisher, event: impl Into<allot_events::AnyEvent> + Clone) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = publisher.publish(event.clone()).await {
        assert!(Instant::now() < deadline, "publishing: {e}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The replicas of the lease bucket's stream.
async fn lease_replicas(js: &async_nats::jetstream::Context) -> usize {
    let mut stream = js
        .get_stream(format!("KV_{}", allot_allocator::lease::BUCKET))
        .await
        .unwrap();
    stream.info().await.unwrap().config.num_replicas
}

#[test]
fn on_a_three_node_cluster_the_lease_outlives_the_server_that_held_it() {
    let mut cluster = NatsCluster::start(3);
    let url = cluster.urls();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (js, publisher) = rt.block_on(async {
        let client = async_nats::connect(cluster.url_list()).await.unwrap();
        let js = async_nats::jetstream::new(client.clone());
        // A peer may still be joining the cluster: retry placement for a while.
        let mut tries = 0;
        while let Err(e) = ensure_streams(&js, &catalog(3)).await {
            tries += 1;
            assert!(tries < 60, "streams with 3 replicas: {e}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // A bucket an allocator left at one replica is raised to the streams' three, and one
        // started without the setting does not lower it again.
        let ttl = Duration::from_secs(2);
        allot_allocator::lease::bucket(&js, ttl, 1).await.unwrap();
        assert_eq!(lease_replicas(&js).await, 1);
        allot_allocator::lease::bucket(&js, ttl, 3).await.unwrap();
        assert_eq!(lease_replicas(&js).await, 3);
        wait_until_current(&js).await;
        allot_allocator::lease::bucket(&js, ttl, 1).await.unwrap();
        assert_eq!(lease_replicas(&js).await, 3);
        // An allocator configured with another TTL is refused the bucket, with both named:
        // its lease would not expire when it counts on.
        let refused = allot_allocator::lease::bucket(&js, Duration::from_secs(5), 3)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("2s") && refused.contains("5s"),
            "{refused}"
        );

        let publisher = Publisher::new(client.clone(), "/test");
        for n in ["n1", "n2"] {
            let registered = node(n).gpus(4).pool(POOL).registered();
            publish_retrying(&publisher, NodeEvent::Registered(registered)).await;
        }
        for instance in ["a", "b"] {
            let config = Config {
                replicas: 3,
                ..config(&url, instance)
            };
            tokio::spawn(allot_allocator::run(config, std::future::pending()));
        }
        publish_retrying(&publisher, ready(1, 4)).await;
        let events = journal_until(&js, |e| granted(e).contains(&1)).await;
        assert!(granted(&events).contains(&1), "{events:?}");
        (js, publisher)
    });

    // The server leading the lease bucket dies: the lease lives on the other two, so an
    // allocator still leads and grants the next task.
    let holder = rt.block_on(async {
        let mut stream = js
            .get_stream(format!("KV_{}", allot_allocator::lease::BUCKET))
            .await
            .unwrap();
        stream
            .info()
            .await
            .unwrap()
            .cluster
            .clone()
            .unwrap()
            .leader
            .unwrap()
    });
    let index = cluster
        .nodes
        .iter()
        .position(|n| n.server_name() == holder)
        .unwrap();
    cluster.kill_node(index);
    rt.block_on(async {
        // Past two lease TTLs: whoever led when the server died has had to renew since.
        tokio::time::sleep(Duration::from_secs(4)).await;
        publish_retrying(&publisher, ready(2, 4)).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let granted = match journal::read(&js, POOL).await {
                Ok(events) => granted(&events.into_iter().map(|(_, e)| e).collect::<Vec<_>>()),
                Err(_) => BTreeSet::new(),
            };
            if granted.contains(&2) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no allocator granted task 2 within 30 s of {holder}'s death (granted {granted:?})"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

#[test]
fn an_allocator_that_cannot_open_the_lease_bucket_keeps_trying_and_leads_once_it_can() {
    let server = NatsServer::start();
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = async_nats::connect(&url).await.unwrap();
        let js = async_nats::jetstream::new(client.clone());
        ensure_streams(&js, &catalog(1)).await.unwrap();
        // A stream in the bucket's place that is no KV bucket: opening the bucket fails, as it
        // does while a cluster that just lost a server elects the bucket's leader.
        let squatter = format!("KV_{}", allot_allocator::lease::BUCKET);
        js.create_stream(async_nats::jetstream::stream::Config {
            name: squatter.clone(),
            subjects: vec!["squatter.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
        let allocator = tokio::spawn(allot_allocator::run(
            config(&url, "a"),
            std::future::pending(),
        ));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            !allocator.is_finished(),
            "the allocator gave up: {:?}",
            allocator.await
        );
        assert!(leaders(&journal_until(&js, |_| true).await).is_empty());

        js.delete_stream(&squatter).await.unwrap();
        let events = journal_until(&js, |e| !leaders(e).is_empty()).await;
        assert_eq!(
            leaders(&events),
            ["a"],
            "it led once the bucket could be opened"
        );
        allocator.abort();
    });
}

/// A lease left under an instance's own name by a process that died holding it (a SIGKILLed
/// `allot up`): an instance known to be the one process of that name leads at once; any other
/// waits for the lease to expire, since the holder of that name may be alive.
#[test]
fn a_sole_instance_takes_over_the_lease_its_dead_predecessor_left_and_no_other_does() {
    let server = NatsServer::start();
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = async_nats::connect(&url).await.unwrap();
        let js = async_nats::jetstream::new(client.clone());
        ensure_streams(&js, &catalog(1)).await.unwrap();
        // Longer than `journal_until` waits: only a takeover lets anyone lead within it.
        let ttl = Duration::from_secs(60);
        let store = allot_allocator::lease::bucket(&js, ttl, 1).await.unwrap();
        store
            .put(allot_allocator::lease::key(POOL), "up".into())
            .await
            .unwrap();
        let config = |sole_instance| Config {
            lease_ttl: ttl,
            sole_instance,
            ..config(&url, "up")
        };

        let unsure = tokio::spawn(allot_allocator::run(config(false), std::future::pending()));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            leaders(&journal_until(&js, |_| true).await).is_empty(),
            "an instance that may have a live twin waits the lease out"
        );
        unsure.abort();

        let sole = tokio::spawn(allot_allocator::run(config(true), std::future::pending()));
        let events = journal_until(&js, |e| !leaders(e).is_empty()).await;
        assert_eq!(leaders(&events), ["up"], "the sole instance led at once");
        sole.abort();
    });
}

#[test]
fn a_new_leader_reads_every_backlog_before_it_decides() {
    use allot_events::RemediationEvent;
    use allot_events::remediation::OperatorCordon;
    let server = NatsServer::start();
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (js, publisher) = bus(&url).await;
        two_nodes(&publisher).await;
        // Before any allocator runs: a long remediation history ending in n1's cordon, then
        // a task that fits either node. The task's stream is far shorter than the cordon's.
        let cordon = |cordoned: bool| {
            RemediationEvent::OperatorCordon(OperatorCordon {
                node: "n1".into(),
                cordoned,
                drain: false,
                reason: "fan swap".into(),
                by: "ops".into(),
            })
        };
        for i in 0..2_000 {
            publisher.publish(cordon(i % 2 == 0)).await.unwrap();
        }
        publisher.publish(cordon(true)).await.unwrap();
        publisher.publish(ready(1, 4)).await.unwrap();
        tokio::spawn(allot_allocator::run(
            config(&url, "a"),
            std::future::pending(),
        ));
        let events = journal_until(&js, |e| granted(e).contains(&1)).await;
        let (_, node) = grant_of(&events, 1);
        assert_eq!(
            node, "n2",
            "the task went to the node cordoned before it was submitted"
        );
        // It was decided after every input: no pass ran before the last cordon was read.
        let entries = entries(&events);
        let grant = entries
            .iter()
            .position(|e| {
                e.decisions
                    .iter()
                    .any(|d| matches!(d, Decision::Granted { .. }))
            })
            .unwrap();
        let holds = |entries: &[Entry]| {
            entries
                .iter()
                .filter(|e| matches!(e.input, allot_sched::Input::NodeHeld { .. }))
                .count()
        };
        assert_eq!(holds(&entries), 2_001);
        assert_eq!(
            holds(&entries[..grant]),
            2_001,
            "a pass decided before the last cordon was read"
        );
    });
}
