//! A cluster of `allot run` processes against a real nats-server (or a 3-node JetStream
//! cluster), for end-to-end tests of pipelines: the planner, allocator(s), and one collector
//! per simulated node whose executor runs each task's command as a real process; the predictor,
//! billing, the archiver and the rest where a test starts them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Output};
use std::time::Duration;

use allot_events::alloc::Applied;
use allot_events::task::TaskStarted;
use allot_events::workload::WorkloadFinished;
use allot_events::{AllocEvent, AnyEvent, Envelope, WorkloadEvent, decode};
use allot_testkit::{NatsCluster, NatsServer};

use crate::support::{allot, log_of, spawn_logged, wait_for};

/// A 4-GPU batch job of team nlp that checkpoints on SIGTERM and, resumed, finishes at once;
/// left alone it runs 90 s (long enough for any test to preempt it).
pub const PREEMPTIBLE_BATCH: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: sweep, team: nlp, priorityClass: batch}
spec:
  tasks:
    - name: sweep
      resources: {gpus: 4}
      checkpoint: {supported: true}
      command:
        - sh
        - -c
        - |
          if [ "$ALLOT_RESUMED" = 1 ]; then echo resumed from checkpoint; exit 0; fi
          trap 'echo saving; touch "$ALLOT_CHECKPOINT_FILE"; exit 0' TERM
          echo fresh start
          i=0; while [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done
"#;

/// How long a workload may take before a test gives up (the tasks themselves take seconds).
pub const PATIENCE: Duration = Duration::from_secs(120);

/// Where a [`Cluster`]'s processes find NATS.
pub enum Nats {
    /// One server; streams with one replica.
    Server(Box<NatsServer>),
    /// A JetStream cluster; streams with three replicas (`ALLOT_STREAM_REPLICAS=3`).
    Cluster(NatsCluster),
}

impl Nats {
    /// The URL processes and commands are given: comma-separated on a cluster.
    pub fn url(&self) -> String {
        match self {
            Nats::Server(server) => server.url(),
            Nats::Cluster(cluster) => cluster.urls(),
        }
    }

    /// One URL per server, for `async_nats::connect`.
    fn url_list(&self) -> Vec<String> {
        match self {
            Nats::Server(server) => vec![server.url()],
            Nats::Cluster(cluster) => cluster.url_list(),
        }
    }

    /// How many replicas the streams keep.
    fn replicas(&self) -> usize {
        match self {
            Nats::Server(_) => 1,
            Nats::Cluster(cluster) => cluster.nodes.len(),
        }
    }

    /// The JetStream cluster, for tests that kill and restart its nodes.
    pub fn cluster_mut(&mut self) -> &mut NatsCluster {
        match self {
            Nats::Cluster(cluster) => cluster,
            Nats::Server(_) => panic!("this Cluster runs on one nats-server"),
        }
    }
}

/// A cluster of `allot run` processes.
pub struct Cluster {
    pub server: Nats,
    pub dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    client: async_nats::Client,
    procs: BTreeMap<String, Child>,
    /// Each process's `allot run` arguments, to start it again after a kill.
    args: BTreeMap<String, Vec<String>>,
    /// How many times each process was started, to keep earlier runs' logs.
    runs: BTreeMap<String, usize>,
    /// The allocators' policy.
    policy: &'static str,
}

impl Cluster {
    /// nats-server, the planner, allocator `a1`, and a collector per `(node, gpus)` whose
    /// executor runs each task's command as a process.
    pub fn start(nodes: &[(&str, u32)]) -> Cluster {
        Self::start_with(nodes, &["--executor", "process", "--stop-grace", "3s"])
    }

    /// The same, with allocators running `policy` instead of `allot`.
    pub fn start_with_policy(nodes: &[(&str, u32)], policy: &'static str) -> Cluster {
        Self::start_full(
            nodes,
            &["--executor", "process", "--stop-grace", "3s"],
            policy,
        )
    }

    /// The same, with simulated runs: each task lasts its duration estimate divided by
    /// `speedup`.
    pub fn start_simulated(nodes: &[(&str, u32)], speedup: u32) -> Cluster {
        Self::start_with(
            nodes,
            &["--executor", "sim", "--sim-speedup", &speedup.to_string()],
        )
    }

    /// Simulated runs as [`Self::start_simulated`], on `nats` (a JetStream cluster: the streams
    /// get its size in replicas, and every process is told so).
    pub fn start_simulated_on(nats: Nats, nodes: &[(&str, u32)], speedup: u32) -> Cluster {
        let speedup = speedup.to_string();
        let executor = ["--executor", "sim", "--sim-speedup", speedup.as_str()];
        let mut cluster = Self::start_on(nats, &[], &executor, "allot");
        for (node, gpus) in nodes {
            cluster.collector(node, *gpus, &executor);
        }
        cluster
    }

    /// Simulated runs as [`Self::start_simulated`], on collectors given `collector` flags as
    /// well (`--sim-model L4`, `--telemetry-interval 250ms`), per node.
    pub fn start_simulated_with(nodes: &[(&str, u32, &[&str])], speedup: u32) -> Cluster {
        let speedup = speedup.to_string();
        let executor = ["--executor", "sim", "--sim-speedup", speedup.as_str()];
        let mut cluster = Self::start_full(&[], &executor, "allot");
        for (node, gpus, extra) in nodes {
            let args: Vec<&str> = executor.iter().chain(extra.iter()).copied().collect();
            cluster.collector(node, *gpus, &args);
        }
        cluster
    }

    fn start_with(nodes: &[(&str, u32)], executor: &[&str]) -> Cluster {
        Self::start_full(nodes, executor, "allot")
    }

    fn start_full(nodes: &[(&str, u32)], executor: &[&str], policy: &'static str) -> Cluster {
        Self::start_on(
            Nats::Server(Box::new(NatsServer::start())),
            nodes,
            executor,
            policy,
        )
    }

    fn start_on(
        server: Nats,
        nodes: &[(&str, u32)],
        executor: &[&str],
        policy: &'static str,
    ) -> Cluster {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let client = async_nats::connect(server.url_list()).await.unwrap();
            let js = async_nats::jetstream::new(client.clone());
            // On a cluster a peer may still be joining: retry placement for a while.
            let mut tries = 0;
            while let Err(e) =
                allot_bus::ensure_streams(&js, &allot_bus::catalog(server.replicas())).await
            {
                tries += 1;
                assert!(tries < 60, "creating the streams: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            client
        });
        let mut cluster = Cluster {
            server,
            dir: tempfile::tempdir().unwrap(),
            rt,
            client,
            procs: BTreeMap::new(),
            args: BTreeMap::new(),
            runs: BTreeMap::new(),
            policy,
        };
        cluster.planner();
        cluster.allocator("a1");
        for (node, gpus) in nodes {
            cluster.collector(node, *gpus, executor);
        }
        cluster
    }

    /// A collector for `node` with `gpus` simulated GPUs and `extra` flags.
    fn collector(&mut self, node: &str, gpus: u32, extra: &[&str]) {
        let data = self.path(node);
        self.spawn(
            &format!("collector-{node}"),
            &[
                "collector",
                "--node",
                node,
                "--gpu-source",
                "sim",
                "--sim-gpus",
                &gpus.to_string(),
                "--heartbeat-interval",
                "1s",
                "--data-dir",
                data.to_str().unwrap(),
            ]
            .into_iter()
            .chain(extra.iter().copied())
            .collect::<Vec<_>>(),
        );
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts `allot run <args>` as process `name`.
    pub fn spawn(&mut self, name: &str, args: &[&str]) {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        self.args.insert(name.to_owned(), args);
        self.launch(name);
    }

    /// Starts process `name` with the arguments it was first spawned with; the log of its
    /// previous run is kept as `<name>.<run>.log`.
    pub fn restart(&mut self, name: &str) {
        assert!(!self.procs.contains_key(name), "{name} is still running");
        let run = self.runs.get(name).copied().unwrap_or(0);
        let _ = std::fs::rename(
            self.path(&format!("{name}.log")),
            self.path(&format!("{name}.{run}.log")),
        );
        self.launch(name);
    }

    fn launch(&mut self, name: &str) {
        let mut cmd = allot(self.dir.path());
        cmd.env("ALLOT_NATS_URL", self.server.url())
            .env("ALLOT_STREAM_REPLICAS", self.server.replicas().to_string())
            .arg("run")
            .args(&self.args[name]);
        let child = spawn_logged(cmd, self.dir.path(), name);
        self.procs.insert(name.to_owned(), child);
        *self.runs.entry(name.to_owned()).or_default() += 1;
    }

    /// Billing with `examples/prices.yaml`, billing every second of lease time.
    pub fn billing(&mut self) {
        let prices = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/prices.yaml");
        let data = self.path("billing");
        self.spawn(
            "billing",
            &[
                "billing",
                "--prices",
                prices.to_str().unwrap(),
                "--interval",
                "1s",
                "--data-dir",
                data.to_str().unwrap(),
            ],
        );
    }

    /// The audit archiver, writing `archive.db`.
    pub fn archiver(&mut self) {
        let db = self.path("archive.db");
        self.spawn("archiver", &["archiver", "--db", db.to_str().unwrap()]);
    }

    pub fn planner(&mut self) {
        self.planner_with(&[]);
    }

    /// The planner with more flags (`--ack-wait 1s` …).
    pub fn planner_with(&mut self, extra: &[&str]) {
        let data = self.path("planner");
        let mut args = vec!["planner", "--data-dir", data.to_str().unwrap()];
        args.extend_from_slice(extra);
        self.spawn("planner", &args);
    }

    pub fn predictor(&mut self) {
        self.predictor_with(&[]);
    }

    /// The predictor with more flags (`--prices FILE` …).
    pub fn predictor_with(&mut self, extra: &[&str]) {
        let data = self.path("predictor");
        let mut args = vec!["predictor", "--data-dir", data.to_str().unwrap()];
        args.extend_from_slice(extra);
        self.spawn("predictor", &args);
    }

    pub fn allocator(&mut self, instance: &str) {
        self.allocator_with(instance, &[]);
    }

    /// Allocator `instance` with more flags (`--teams FILE` …).
    pub fn allocator_with(&mut self, instance: &str, extra: &[&str]) {
        let mut args = vec![
            "allocator",
            "--instance",
            instance,
            "--policy",
            self.policy,
            "--lease-ttl",
            "2s",
        ];
        args.extend_from_slice(extra);
        self.spawn(&format!("allocator-{instance}"), &args);
    }

    /// `allot replay --verify` over the pool's journal: every decision recomputes and no
    /// invariant breaks.
    pub fn assert_replay_verifies(&self) {
        let out = allot(self.dir.path())
            .args(["replay", "--verify", "--pool", "default", "--nats"])
            .arg(self.server.url())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "replay --verify failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The pid of process `name`.
    pub fn pid(&self, name: &str) -> u32 {
        self.procs[name].id()
    }

    /// SIGKILL: no goodbye, no lease release.
    pub fn kill(&mut self, name: &str) {
        let mut child = self.procs.remove(name).expect("a process of that name");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Sends `SIG<signal>` (`STOP`, `CONT` …) to process `name`.
    pub fn signal(&self, name: &str, signal: &str) {
        crate::support::signal(self.pid(name), signal);
    }

    /// Submits `spec` with `allot submit`; its workload id.
    pub fn submit(&self, name: &str, spec: &str) -> String {
        let file = self.path(&format!("{name}.yaml"));
        std::fs::write(&file, spec).unwrap();
        let out = allot(self.dir.path())
            .arg("submit")
            .arg(&file)
            .args(["--nats", &self.server.url(), "--submitter", "ci@test"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "submit failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Runs `allot submit` on `spec` with run id `run_id` and `args` (`--wait` …) to the end.
    pub fn submit_with(&self, spec: &str, run_id: &str, args: &[&str]) -> Output {
        let file = self.path(&format!("{run_id}.yaml"));
        std::fs::write(&file, spec).unwrap();
        allot(self.dir.path())
            .arg("submit")
            .arg(&file)
            .args(["--run-id", run_id, "--nats", &self.server.url()])
            .args(["--submitter", "ci@test"])
            .args(args)
            .output()
            .unwrap()
    }

    /// Submits `spec` with `allot submit --follow` as a CI job would, in the background; the
    /// process (its output goes to `<name>.out`) and, once printed, the workload id.
    pub fn submit_following(&self, name: &str, spec: &str) -> (Child, String) {
        let file = self.path(&format!("{name}.yaml"));
        std::fs::write(&file, spec).unwrap();
        let out = std::fs::File::create(self.path(&format!("{name}.out"))).unwrap();
        let child = allot(self.dir.path())
            .arg("submit")
            .arg(&file)
            .args([
                "--nats",
                &self.server.url(),
                "--submitter",
                "ci@test",
                "--follow",
            ])
            .stdout(out)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let id = wait_for(PATIENCE, || {
            let text = std::fs::read_to_string(self.path(&format!("{name}.out"))).ok()?;
            text.lines().next().map(str::to_owned)
        })
        .expect("submit printed the workload id");
        (child, id)
    }

    /// Every event in `stream`, decoded.
    pub fn events(&self, stream: &str) -> Vec<AnyEvent> {
        self.events_on(stream, "")
    }

    /// Every event in `stream` on subjects matching `filter` (all of them when it is empty),
    /// decoded.
    pub fn events_on(&self, stream: &str, filter: &str) -> Vec<AnyEvent> {
        self.envelopes_after(stream, filter, 0)
            .into_iter()
            .map(|(_, e)| e.data)
            .collect()
    }

    /// The events in `stream` on subjects matching `filter` (all when empty) after stream
    /// sequence `after`, with their sequences; read again for a while on a cluster that is
    /// electing the stream's leader.
    pub fn envelopes_after(&self, stream: &str, filter: &str, after: u64) -> Vec<(u64, Envelope)> {
        read_envelopes(&self.rt, &self.client, stream, filter, after)
    }

    /// The sequence of the last message in `stream`.
    pub fn last_sequence(&self, stream: &str) -> u64 {
        last_sequence(&self.rt, &self.client, stream)
    }

    /// The server that leads `stream` now (its `server_name`), as the first live server of the
    /// cluster that knows one says on its monitoring endpoint (`/jsz?streams=true`).
    pub fn stream_leader(&self, stream: &str) -> Option<String> {
        let Nats::Cluster(cluster) = &self.server else {
            return None;
        };
        cluster.nodes.iter().find_map(|node| {
            let body = http_get(node.monitor_port(), "/jsz?streams=true")?;
            let jsz: serde_json::Value = serde_json::from_str(&body).ok()?;
            jsz["account_details"]
                .as_array()?
                .iter()
                .flat_map(|a| a["stream_detail"].as_array().into_iter().flatten())
                .find(|s| s["name"] == stream)?["cluster"]["leader"]
                .as_str()
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
        })
    }

    /// The WORKLOADS stream's task events and workload events.
    pub fn workloads(&self) -> Vec<AnyEvent> {
        self.events(allot_bus::streams::names::WORKLOADS)
    }

    /// The pool's journal entries, in order.
    pub fn journal(&self) -> Vec<Applied> {
        self.events(allot_bus::streams::names::DECISIONS)
            .into_iter()
            .filter_map(|e| match e {
                AnyEvent::Alloc(AllocEvent::Applied(a)) => Some(a),
                _ => None,
            })
            .collect()
    }

    /// Waits until `workload` finishes; how.
    pub fn finished(&self, workload: &str) -> WorkloadFinished {
        self.finished_within(workload, PATIENCE)
            .unwrap_or_else(|| panic!("{workload} did not finish\n{}", self.logs()))
    }

    /// How `workload` finished, if it does within `limit`.
    pub fn finished_within(&self, workload: &str, limit: Duration) -> Option<WorkloadFinished> {
        wait_for(limit, || {
            self.workloads().into_iter().find_map(|e| match e {
                AnyEvent::Workload(WorkloadEvent::Finished(f)) if f.workload_id == workload => {
                    Some(f)
                }
                _ => None,
            })
        })
    }

    /// Waits until `n` runs of `workload` whose names start with `prefix` have started.
    pub fn started(&self, workload: &str, prefix: &str, n: usize) -> Vec<TaskStarted> {
        wait_for(PATIENCE, || {
            let started = crate::pipelines::started_runs(&self.workloads(), workload, prefix);
            (started.len() >= n).then_some(started)
        })
        .unwrap_or_else(|| {
            panic!(
                "{n} runs of {workload}/{prefix}* did not start\n{}",
                self.logs()
            )
        })
    }

    /// The allocators that led the pool, in order.
    pub fn leaders(&self) -> Vec<String> {
        self.events(allot_bus::streams::names::DECISIONS)
            .into_iter()
            .filter_map(|e| match e {
                AnyEvent::Alloc(AllocEvent::LeaderElected(l)) => Some(l.leader),
                _ => None,
            })
            .collect()
    }

    /// Every process's log, for a failure message: those running and those killed and not
    /// started again (a killed leader's last words say what it was doing).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for name in self.args.keys() {
            let log = log_of(self.dir.path(), name);
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            out += &format!("--- {name} (last lines)\n");
            for line in tail.into_iter().rev() {
                out += line;
                out.push('\n');
            }
        }
        out
    }
}

/// The body of `GET path` on 127.0.0.1:`port`, if it answers 200 within a second.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read as _, Write as _};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    write!(conn, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    conn.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    (head.split(' ').nth(1) == Some("200")).then(|| body.to_owned())
}

/// The events in `stream` on subjects matching `filter` (all when empty) after sequence
/// `after`, with their sequences, read through an ordered consumer (nothing acknowledged, no
/// other consumer disturbed). On a JetStream cluster a stream may have no leader for a few
/// seconds after a server dies: reads are tried again for up to a minute.
pub fn read_envelopes(
    rt: &tokio::runtime::Runtime,
    client: &async_nats::Client,
    stream: &str,
    filter: &str,
    after: u64,
) -> Vec<(u64, Envelope)> {
    retried(rt, stream, || read(client, stream, filter, after))
        .into_iter()
        .map(|(seq, payload)| (seq, decode(&payload).unwrap()))
        .collect()
}

/// The sequence of the last message in `stream`, asked again for a while as
/// [`read_envelopes`] does.
pub fn last_sequence(
    rt: &tokio::runtime::Runtime,
    client: &async_nats::Client,
    stream: &str,
) -> u64 {
    retried(rt, stream, || async {
        let js = async_nats::jetstream::new(client.clone());
        let mut handle = js.get_stream(stream).await.map_err(|e| e.to_string())?;
        let info = handle.info().await.map_err(|e| e.to_string())?;
        Ok(info.state.last_sequence)
    })
}

/// `attempt()` until it succeeds, for up to a minute (each attempt bounded to 10 s).
fn retried<T, F: std::future::Future<Output = Result<T, String>>>(
    rt: &tokio::runtime::Runtime,
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> T {
    let mut last = String::new();
    for _ in 0..6 {
        match rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), attempt()).await })
        {
            Ok(Ok(t)) => return t,
            Ok(Err(e)) => last = e,
            Err(_) => last = "no answer within 10 s".into(),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("reading {what}: {last}")
}

/// One attempt of [`read_envelopes`]: the payloads, with their sequences.
async fn read(
    client: &async_nats::Client,
    stream: &str,
    filter: &str,
    after: u64,
) -> Result<Vec<(u64, bytes::Bytes)>, String> {
    use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
    use futures::StreamExt as _;
    let js = async_nats::jetstream::new(client.clone());
    let handle = js.get_stream(stream).await.map_err(|e| e.to_string())?;
    let mut consumer = handle
        .create_consumer(OrderedConfig {
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: after + 1,
            },
            filter_subject: filter.to_owned(),
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let pending = consumer
        .info()
        .await
        .map_err(|e| e.to_string())?
        .num_pending;
    let mut out = Vec::new();
    if pending == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| e.to_string())?;
        let info = message.info().map_err(|e| e.to_string())?;
        let (seq, left) = (info.stream_sequence, info.pending);
        out.push((seq, message.payload.clone()));
        if left == 0 {
            break;
        }
    }
    Ok(out)
}

impl Drop for Cluster {
    /// Collectors first, politely (their executors stop the runs), then the rest.
    fn drop(&mut self) {
        let names: Vec<String> = self.procs.keys().cloned().collect();
        for name in names.iter().filter(|n| n.starts_with("collector")) {
            if let Some(child) = self.procs.get_mut(name) {
                crate::support::terminate(child);
                if crate::support::wait_exit(child, Duration::from_secs(10)).is_none() {
                    let _ = child.kill();
                }
            }
        }
        for child in self.procs.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
