//! The collector against a real nats-server: what it publishes, how it waits for streams, and
//! how it stops.

use std::future::Future;
use std::time::{Duration, Instant};

use allot_bus::Publisher;
use allot_bus::async_nats::{self, jetstream};
use allot_bus::streams::names;
use allot_collector::{
    Config, Error, ExecutorConfig, GpuModel, GpuSource, InjectKind, Runs, SimFault, SimSpec,
    SimulatedRuns, SimulatedSource, SourceChoice,
};
use allot_events::alloc::{Applied, Dispatch, Launch, NodeGrant};
use allot_events::node::{GpuSourceKind, HeartbeatSent, NodeRegistered};
use allot_events::task::RunSpec;
use allot_events::telemetry::GpusSampled;
use allot_events::{AllocEvent, AnyEvent, Envelope, NodeEvent, TaskEvent, TelemetryEvent, decode};
use allot_sched::journal::Entry;
use allot_sched::{Input, LeaseId, TaskId};
use allot_testkit::NatsServer;
use anyhow::{Context as _, bail};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a test waits for the collector to publish what it expects.
const PATIENCE: Duration = Duration::from_secs(10);
/// How long a stopped collector may take to return.
const STOP_WITHIN: Duration = Duration::from_secs(5);

/// A fast-ticking simulated collector config: 4 × H100 on `node`.
fn config(url: &str, node: &str) -> Config {
    let mut config = Config::new(url, node);
    config.source = SourceChoice::Simulated;
    config.sim = SimSpec {
        gpus: 4,
        model: GpuModel::H100,
        cpu_milli: 32_000,
        memory_mib: 256 * 1024,
        ..SimSpec::default()
    };
    config.pool = "train".to_owned();
    config.rack = Some("r12".to_owned());
    config.heartbeat_interval = Duration::from_millis(50);
    config.telemetry_interval = Duration::from_millis(100);
    config
}

/// A running collector and the means to stop it.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), Error>>,
}

impl Running {
    fn spawn<F>(run: impl FnOnce(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> F) -> Self
    where
        F: Future<Output = Result<(), Error>> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run(Box::pin(async move {
            let _ = stopped.await;
        })));
        Self { stop, task }
    }

    /// Requests shutdown and returns what the collector returned, failing if it takes longer
    /// than [`STOP_WITHIN`].
    async fn stop(self) -> anyhow::Result<Result<(), Error>> {
        let _ = self.stop.send(());
        let joined = tokio::time::timeout(STOP_WITHIN, self.task)
            .await
            .context("the collector did not stop in time")?;
        Ok(joined?)
    }
}

async fn streams(client: &async_nats::Client) -> anyhow::Result<jetstream::Context> {
    let js = jetstream::new(client.clone());
    allot_bus::ensure_streams(&js, &allot_bus::catalog(1)).await?;
    Ok(js)
}

/// Every event in `stream`, in order.
async fn events(js: &jetstream::Context, stream: &str) -> anyhow::Result<Vec<Envelope<AnyEvent>>> {
    let mut stream = js.get_stream(stream).await?;
    let state = stream.info().await?.state.clone();
    let mut out = Vec::new();
    if state.messages == 0 {
        return Ok(out);
    }
    for sequence in state.first_sequence..=state.last_sequence {
        let message = stream.get_raw_message(sequence).await?;
        out.push(decode(&message.payload)?);
    }
    Ok(out)
}

/// Reads `stream` until `done` holds for its events, or fails after [`PATIENCE`].
async fn wait_for(
    js: &jetstream::Context,
    stream: &str,
    what: &str,
    done: impl Fn(&[Envelope<AnyEvent>]) -> bool,
) -> anyhow::Result<Vec<Envelope<AnyEvent>>> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let events = events(js, stream).await?;
        if done(&events) {
            return Ok(events);
        }
        if Instant::now() > deadline {
            bail!("waited {PATIENCE:?} for {what} in {stream}; have {events:#?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn registrations(events: &[Envelope<AnyEvent>]) -> Vec<&NodeRegistered> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            AnyEvent::Node(NodeEvent::Registered(r)) => Some(r),
            _ => None,
        })
        .collect()
}

fn heartbeats(events: &[Envelope<AnyEvent>]) -> Vec<&HeartbeatSent> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            AnyEvent::Node(NodeEvent::HeartbeatSent(h)) => Some(h),
            _ => None,
        })
        .collect()
}

fn samples(events: &[Envelope<AnyEvent>]) -> Vec<&GpusSampled> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            AnyEvent::Telemetry(TelemetryEvent::GpusSampled(s)) => Some(s),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_simulated_node_registers_then_heartbeats_and_samples_until_shutdown()
-> anyhow::Result<()> {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await?;
    let js = streams(&client).await?;

    let config = config(&server.url(), "node-7");
    let collector = Running::spawn(|shutdown| allot_collector::run(config, shutdown));

    let fleet = wait_for(
        &js,
        names::FLEET,
        "a registration and 4 heartbeats",
        |events| heartbeats(events).len() >= 4,
    )
    .await?;
    let telemetry = wait_for(&js, names::TELEMETRY, "2 samples", |events| {
        samples(events).len() >= 2
    })
    .await?;
    collector.stop().await??;

    // Registered first, once, with the simulated node's description.
    let registered = registrations(&fleet);
    assert_eq!(registered.len(), 1, "{fleet:#?}");
    assert!(
        matches!(fleet[0].data, AnyEvent::Node(NodeEvent::Registered(_))),
        "the registration comes before any heartbeat"
    );
    let node = registered[0];
    assert_eq!(node.node, "node-7");
    assert_eq!(node.pool, "train");
    assert_eq!(node.rack.as_deref(), Some("r12"));
    assert_eq!((node.cpu_milli, node.memory_mib), (32_000, 256 * 1024));
    assert_eq!(node.gpu_source, GpuSourceKind::Simulated);
    assert_eq!(node.gpus.len(), 4);
    let mut uuids: Vec<&str> = node.gpus.iter().map(|g| g.uuid.as_str()).collect();
    for (i, gpu) in node.gpus.iter().enumerate() {
        assert_eq!(gpu.index, i as u32);
        assert_eq!(gpu.model, "H100");
        assert_eq!(gpu.memory_total_mib, 81_559);
        assert_eq!(gpu.nvlink_peers.len(), 3, "H100s share one NVLink domain");
    }
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), 4, "distinct uuids");
    for event in fleet.iter().chain(&telemetry) {
        assert_eq!(event.source, "/allot/collector/node-7");
    }

    // Heartbeats count up from 1.
    let seqs: Vec<u64> = heartbeats(&fleet).iter().map(|h| h.seq).collect();
    assert_eq!(seqs[0], 1, "{seqs:?}");
    assert!(seqs.windows(2).all(|w| w[1] > w[0]), "{seqs:?}");
    assert!(heartbeats(&fleet).iter().all(|h| h.node == "node-7"));

    // Every sample covers every GPU, under the uuids it registered.
    for sampled in samples(&telemetry) {
        assert_eq!(sampled.node, "node-7");
        let sample_uuids: Vec<&str> = sampled.samples.iter().map(|s| s.uuid.as_str()).collect();
        let registered_uuids: Vec<&str> = node.gpus.iter().map(|g| g.uuid.as_str()).collect();
        assert_eq!(sample_uuids, registered_uuids);
    }

    // Stopped means stopped: nothing more is published.
    let (fleet_after, telemetry_after) = (fleet_len(&js).await?, telemetry_len(&js).await?);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fleet_len(&js).await?, fleet_after);
    assert_eq!(telemetry_len(&js).await?, telemetry_after);
    Ok(())
}

async fn fleet_len(js: &jetstream::Context) -> anyhow::Result<usize> {
    Ok(events(js, names::FLEET).await?.len())
}

async fn telemetry_len(js: &jetstream::Context) -> anyhow::Result<usize> {
    Ok(events(js, names::TELEMETRY).await?.len())
}

#[tokio::test]
async fn load_and_faults_set_through_the_sim_handle_show_in_published_telemetry()
-> anyhow::Result<()> {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await?;
    let js = streams(&client).await?;

    let config = config(&server.url(), "node-8");
    let source = SimulatedSource::new(&config.node, config.sim.clone());
    let load = source.load();
    load.set_load(2, 90, 40_000)?;
    load.inject_fault(3, SimFault::Xid(79))?;
    let source: Box<dyn GpuSource> = Box::new(source);
    let collector =
        Running::spawn(|shutdown| allot_collector::run_with_source(config, source, shutdown));

    let telemetry = wait_for(&js, names::TELEMETRY, "a sample", |e| {
        !samples(e).is_empty()
    })
    .await?;
    let first = &samples(&telemetry)[0].samples;
    assert!(first[2].utilization_pct.unwrap() >= 88, "{:?}", first[2]);
    assert!(first[2].memory_used_mib >= 40_000, "{:?}", first[2]);
    assert_eq!(
        first[0].utilization_pct,
        Some(0),
        "untouched GPUs stay idle"
    );
    assert_eq!(
        (first[3].xid_errors, first[3].last_xid),
        (Some(1), Some(79))
    );

    // Driven while running, as `allot up` does.
    load.inject_fault(1, SimFault::Overheat)?;
    wait_for(&js, names::TELEMETRY, "GPU 1 overheating", |events| {
        samples(events)
            .last()
            .is_some_and(|s| s.samples[1].temperature_c.is_some_and(|t| t >= 95))
    })
    .await?;
    collector.stop().await??;
    Ok(())
}

/// Grants task 1 (lease 10) GPU 0 of `node` in pool `pool` for `duration`, as the allocator
/// would.
async fn grant_gpu_0(
    client: &async_nats::Client,
    pool: &str,
    node: &str,
    duration: Duration,
) -> anyhow::Result<()> {
    let dispatch = Dispatch {
        task: TaskId(1),
        lease: LeaseId(10),
        launch: Launch {
            workload: "train-eval-1".into(),
            name: "train".into(),
            team: String::new(),
            run: RunSpec {
                duration_ms: Some(duration.as_millis() as u64),
                ..RunSpec::default()
            },
        },
        nodes: vec![NodeGrant {
            node: node.into(),
            gpu_model: "H100".into(),
            gpus: vec![(0, 1000)],
            mig: None,
            cpu_milli: 1000,
            memory_mib: 1024,
        }],
    };
    let applied = Applied {
        pool: pool.into(),
        source: None,
        entry: Entry {
            seq: 1,
            input: Input::Schedule { at: 1 },
            decisions: vec![],
            rejected: None,
        },
        launch: None,
        dispatch: vec![dispatch],
    };
    Publisher::new(client.clone(), "/allot/allocator/test")
        .publish(AllocEvent::Applied(applied))
        .await?;
    Ok(())
}

/// Whether WORKLOADS holds an event of task 1 that `is` picks.
async fn task_1(js: &jetstream::Context, is: impl Fn(&TaskEvent) -> bool) -> anyhow::Result<bool> {
    Ok(events(js, names::WORKLOADS)
        .await?
        .iter()
        .any(|e| matches!(&e.data, AnyEvent::Task(t) if is(t))))
}

#[tokio::test]
async fn a_partitioned_node_goes_silent_while_its_runs_go_on() -> anyhow::Result<()> {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await?;
    let js = streams(&client).await?;

    let mut config = config(&server.url(), "node-11");
    config.executor = ExecutorConfig {
        runs: Runs::Simulated(SimulatedRuns {
            speedup: 1.0,
            default_duration: Duration::from_secs(1),
        }),
        state: None,
        shared_checkpoints: None,
    };
    let source = SimulatedSource::new(&config.node, config.sim.clone());
    let load = source.load();
    let pool = config.pool.clone();
    let source: Box<dyn GpuSource> = Box::new(source);
    let collector =
        Running::spawn(|shutdown| allot_collector::run_with_source(config, source, shutdown));

    // The run holds GPU 0 for 2 s; telemetry shows it busy.
    wait_for(&js, names::FLEET, "the registration", |e| {
        !registrations(e).is_empty()
    })
    .await?;
    grant_gpu_0(&client, &pool, "node-11", Duration::from_secs(2)).await?;
    wait_for(&js, names::TELEMETRY, "GPU 0 busy with the run", |events| {
        samples(events)
            .last()
            .is_some_and(|s| s.samples[0].utilization_pct.unwrap() > 80 && !s.held.is_empty())
    })
    .await?;
    assert!(
        task_1(&js, |t| matches!(t, TaskEvent::Started(_))).await?,
        "the run started"
    );
    assert!(
        !task_1(&js, |t| matches!(t, TaskEvent::Completed(_))).await?,
        "the run is not over yet"
    );

    allot_collector::sim::inject::apply(InjectKind::Partition, &load);
    // A publish already under way when the node was cut off may still land.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (fleet_cut, telemetry_cut) = (fleet_len(&js).await?, telemetry_len(&js).await?);

    // The run goes on to its end, and says so…
    let deadline = Instant::now() + PATIENCE;
    while !task_1(&js, |t| matches!(t, TaskEvent::Completed(_))).await? {
        if Instant::now() > deadline {
            bail!("the run did not complete within {PATIENCE:?} of the partition");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // …while the node publishes nothing: over a second of 50 ms heartbeats and 100 ms samples.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        fleet_len(&js).await?,
        fleet_cut,
        "no heartbeat after the partition"
    );
    assert_eq!(
        telemetry_len(&js).await?,
        telemetry_cut,
        "no telemetry after the partition"
    );
    collector.stop().await??;
    Ok(())
}

#[tokio::test]
async fn registration_is_retried_until_the_streams_exist() -> anyhow::Result<()> {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await?;

    let collector = Running::spawn({
        let config = config(&server.url(), "node-9");
        |shutdown| allot_collector::run(config, shutdown)
    });
    // Let a few registration attempts fail for want of a stream.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let js = streams(&client).await?;
    let fleet = wait_for(&js, names::FLEET, "the registration", |e| {
        !registrations(e).is_empty()
    })
    .await?;
    assert_eq!(registrations(&fleet)[0].node, "node-9");
    collector.stop().await??;
    Ok(())
}

#[tokio::test]
async fn an_invalid_node_name_is_rejected_before_anything_is_published() -> anyhow::Result<()> {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await?;
    let js = streams(&client).await?;

    let config = config(&server.url(), "bad.name");
    let result = tokio::time::timeout(
        STOP_WITHIN,
        allot_collector::run(config, std::future::pending()),
    )
    .await
    .context("an invalid config must fail at once, without waiting for shutdown")?;

    let error = result.expect_err("a node name with a dot must be rejected");
    assert!(matches!(error, Error::InvalidConfig(_)), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("node name \"bad.name\""), "{message}");
    assert_eq!(fleet_len(&js).await?, 0);
    assert_eq!(telemetry_len(&js).await?, 0);
    Ok(())
}

#[tokio::test]
async fn shutdown_while_nats_is_unreachable_returns_ok() -> anyhow::Result<()> {
    // Nothing listens on port 1, so the collector keeps retrying the connection.
    let collector = Running::spawn({
        let config = config("nats://127.0.0.1:1", "node-10");
        |shutdown| allot_collector::run(config, shutdown)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    collector.stop().await??;
    Ok(())
}
