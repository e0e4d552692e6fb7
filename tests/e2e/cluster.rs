//! A cluster of `allot run` processes against a real nats-server, for end-to-end tests of
//! pipelines: the planner, allocator(s), and one collector per simulated node whose executor
//! runs each task's command as a real process; the predictor where a test starts it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Output};
use std::time::Duration;

use allot_events::alloc::Applied;
use allot_events::task::TaskStarted;
use allot_events::workload::WorkloadFinished;
use allot_events::{AllocEvent, AnyEvent, WorkloadEvent, decode};
use allot_testkit::NatsServer;

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

/// A cluster of `allot run` processes.
pub struct Cluster {
    pub server: NatsServer,
    pub dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    client: async_nats::Client,
    procs: BTreeMap<String, Child>,
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
        let server = NatsServer::start();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let client = async_nats::connect(server.url()).await.unwrap();
            let js = async_nats::jetstream::new(client.clone());
            allot_bus::ensure_streams(&js, &allot_bus::catalog(1))
                .await
                .unwrap();
            client
        });
        let mut cluster = Cluster {
            server,
            dir: tempfile::tempdir().unwrap(),
            rt,
            client,
            procs: BTreeMap::new(),
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
        let mut cmd = allot(self.dir.path());
        cmd.env("ALLOT_NATS_URL", self.server.url())
            .arg("run")
            .args(args);
        let child = spawn_logged(cmd, self.dir.path(), name);
        self.procs.insert(name.to_owned(), child);
    }

    pub fn planner(&mut self) {
        let data = self.path("planner");
        self.spawn(
            "planner",
            &["planner", "--data-dir", data.to_str().unwrap()],
        );
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
        self.rt.block_on(async {
            allot_testkit::streams::read_all(&self.client, stream)
                .await
                .into_iter()
                .map(|m| decode(&m.payload).unwrap().data)
                .collect()
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

    /// Every process's log, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for name in self.procs.keys() {
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
