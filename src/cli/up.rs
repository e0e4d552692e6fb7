//! `allot up`: nats-server, every service and a simulated cluster in one process.
//!
//! Each service gets its own NATS connection and talks to the others only through JetStream,
//! exactly as when they run as separate pods; only the process boundary is missing.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use allot_collector::Injection;
use allot_collector::sim::{GpuModel, SimSpec};

use super::settings::{Lookup, Settings};
use super::{auth, local, shutdown_on_signal, within_grace};

/// Flags of `allot up`; each also reads its `ALLOT_*` variable.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Use this NATS server or cluster instead of starting one (ALLOT_NATS_URL).
    #[arg(long)]
    pub nats: Option<String>,
    /// Folder for state, the embedded server's store and its URL (ALLOT_DATA_DIR).
    #[arg(long)]
    pub data_dir: Option<String>,
    /// Port for the embedded nats-server; 0 = 4222 if free, else any (ALLOT_NATS_PORT).
    #[arg(long)]
    pub nats_port: Option<String>,
    /// Simulated nodes, named node-1 … node-N (ALLOT_SIM_NODES).
    #[arg(long)]
    pub sim_nodes: Option<String>,
    /// GPUs per simulated node (ALLOT_SIM_GPUS).
    #[arg(long)]
    pub sim_gpus: Option<String>,
    /// GPU models of the simulated nodes, comma-separated, assigned round-robin (ALLOT_SIM_MODELS).
    #[arg(long)]
    pub sim_models: Option<String>,
    /// Collector heartbeat interval (ALLOT_HEARTBEAT_INTERVAL).
    #[arg(long)]
    pub heartbeat_interval: Option<String>,
    /// Collector telemetry interval (ALLOT_TELEMETRY_INTERVAL).
    #[arg(long)]
    pub telemetry_interval: Option<String>,
    /// Heartbeats a node may miss before it is unreachable (ALLOT_MISSED_HEARTBEATS).
    #[arg(long)]
    pub missed_heartbeats: Option<String>,
    /// How the simulated nodes run granted tasks: `sim` (for their duration estimate, sped
    /// up) or `process` (their command, on this machine) (ALLOT_EXECUTOR).
    #[arg(long)]
    pub executor: Option<String>,
    /// Task time per wall time of simulated runs: 60 runs a 45m estimate in 45 s
    /// (ALLOT_SIM_SPEEDUP).
    #[arg(long)]
    pub sim_speedup: Option<String>,
    /// The price table billing uses (ALLOT_PRICES; default: the built-in copy of
    /// examples/prices.yaml).
    #[arg(long)]
    pub prices: Option<String>,
    /// Teams file: teams, priority classes, quotas and budgets, for the planner, the allocator
    /// and billing
    /// (ALLOT_TEAMS_FILE; default: none).
    #[arg(long)]
    pub teams: Option<String>,
    /// Health rules for remediation (ALLOT_HEALTH_RULES; default: the built-in set, spelled
    /// out in examples/health-rules.yaml).
    #[arg(long)]
    pub health_rules: Option<String>,
    /// Restarts of the embedded nats-server allowed within a minute before `allot up` gives
    /// up and stops (ALLOT_NATS_RESTARTS; default 5). For tests.
    #[arg(long, hide = true)]
    pub nats_restarts: Option<String>,
    /// Inject a fault into a simulated node at a time after the start, e.g. `xid79:node-2@90s`;
    /// repeatable. Kinds: overheat, spike, xid<N>, ecc, power, partition, idle, rowremap,
    /// nvlink (ALLOT_INJECT, comma-separated).
    #[arg(long, value_name = "KIND:NODE@TIME")]
    pub inject: Vec<String>,
    /// Where the gateway (API and dashboard) listens (ALLOT_LISTEN; default 127.0.0.1:8080,
    /// or any free port when 8080 is taken). The URL is printed and written to
    /// `<data dir>/gateway.url`, the admin token to `<data dir>/admin.token` (mode 0600).
    #[arg(long)]
    pub listen: Option<String>,
}

/// How `allot up`'s nodes run tasks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExecutorKind {
    /// Simulated runs, `speedup` times faster than their estimates.
    Simulated {
        /// Task time per wall time.
        speedup: f64,
    },
    /// Real processes on this machine.
    Process,
}

/// The validated configuration of `allot up`.
#[derive(Debug, Clone, PartialEq)]
pub struct UpConfig {
    pub nats: Option<String>,
    pub data_dir: PathBuf,
    pub nats_port: u16,
    pub sim_nodes: u32,
    pub sim_gpus: u32,
    pub sim_models: Vec<GpuModel>,
    pub heartbeat_interval: Duration,
    pub telemetry_interval: Duration,
    pub missed_heartbeats: u32,
    pub executor: ExecutorKind,
    pub prices: allot_billing::PriceTable,
    pub teams: Option<allot_workload::TeamsConfig>,
    /// Where `teams` came from.
    pub teams_file: Option<String>,
    /// Restarts of the embedded nats-server allowed within a minute.
    pub nats_restarts: u32,
    /// Remediation's health rules.
    pub health_rules: allot_health::RuleSet,
    /// Faults to inject into the simulated nodes.
    pub inject: Vec<Injection>,
    /// Where the gateway listens.
    pub listen: std::net::SocketAddr,
}

impl UpConfig {
    /// Reads and checks every setting, reporting all problems at once.
    pub fn resolve(
        args: &UpArgs,
        env: Lookup<'_>,
    ) -> Result<Self, super::settings::InvalidSettings> {
        let mut s = Settings::new(env);
        let nats = s.optional(args.nats.as_deref(), "ALLOT_NATS_URL");
        let data_dir =
            PathBuf::from(s.string(args.data_dir.as_deref(), "ALLOT_DATA_DIR", ".allot"));
        let nats_port = s.parse(args.nats_port.as_deref(), "ALLOT_NATS_PORT", 0u16);
        let sim_nodes = s.parse(args.sim_nodes.as_deref(), "ALLOT_SIM_NODES", 4u32);
        let sim_gpus = s.parse(args.sim_gpus.as_deref(), "ALLOT_SIM_GPUS", 8u32);
        let models = s.string(args.sim_models.as_deref(), "ALLOT_SIM_MODELS", "H100");
        let mut sim_models = Vec::new();
        for name in models.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            match name.parse::<GpuModel>() {
                Ok(m) => sim_models.push(m),
                Err(e) => s.problem(format!("--sim-models / ALLOT_SIM_MODELS: {e}")),
            }
        }
        if sim_models.is_empty() && !models.split(',').any(|m| !m.trim().is_empty()) {
            s.problem("--sim-models / ALLOT_SIM_MODELS: name at least one GPU model");
        }
        let heartbeat_interval = s.duration(
            args.heartbeat_interval.as_deref(),
            "ALLOT_HEARTBEAT_INTERVAL",
            Duration::from_secs(2),
        );
        let telemetry_interval = s.duration(
            args.telemetry_interval.as_deref(),
            "ALLOT_TELEMETRY_INTERVAL",
            Duration::from_secs(5),
        );
        let missed_heartbeats = s.parse(
            args.missed_heartbeats.as_deref(),
            "ALLOT_MISSED_HEARTBEATS",
            3u32,
        );
        if sim_gpus == 0 || sim_gpus > 16 {
            s.problem(format!(
                "--sim-gpus / ALLOT_SIM_GPUS: {sim_gpus} GPUs per node; use 1 to 16"
            ));
        }
        if sim_nodes > 2000 {
            s.problem(format!(
                "--sim-nodes / ALLOT_SIM_NODES: {sim_nodes} nodes; use at most 2000"
            ));
        }
        let speedup = s.parse(args.sim_speedup.as_deref(), "ALLOT_SIM_SPEEDUP", 60.0f64);
        if !(speedup.is_finite() && speedup > 0.0) {
            s.problem(format!(
                "--sim-speedup / ALLOT_SIM_SPEEDUP: {speedup}; use a number above 0"
            ));
        }
        let executor = match s
            .string(args.executor.as_deref(), "ALLOT_EXECUTOR", "sim")
            .as_str()
        {
            "sim" | "simulated" => ExecutorKind::Simulated { speedup },
            "process" => ExecutorKind::Process,
            other => {
                s.problem(format!(
                    "--executor / ALLOT_EXECUTOR: {other:?}; use sim or process"
                ));
                ExecutorKind::Simulated { speedup }
            }
        };
        let prices = match s.optional(args.prices.as_deref(), "ALLOT_PRICES") {
            None => super::run::default_prices(),
            Some(path) => std::fs::read_to_string(&path)
                .map_err(|e| format!("reading {path}: {e}"))
                .and_then(|t| {
                    allot_billing::PriceTable::parse(&t).map_err(|e| format!("{path}: {e}"))
                })
                .unwrap_or_else(|why| {
                    s.problem(format!("--prices / ALLOT_PRICES: {why}"));
                    super::run::default_prices()
                }),
        };
        let teams = super::run::teams_file(args.teams.as_deref(), &mut s);
        let teams_file = args.teams.clone().or_else(|| env("ALLOT_TEAMS_FILE"));
        let nats_restarts = s.parse(args.nats_restarts.as_deref(), "ALLOT_NATS_RESTARTS", 5u32);
        let health_rules =
            super::run::health_rules(args.health_rules.as_deref(), "--health-rules", &mut s)
                .unwrap_or_default();
        if missed_heartbeats == 0 {
            s.problem("--missed-heartbeats / ALLOT_MISSED_HEARTBEATS: must be at least 1");
        }
        let inject = injections(&args.inject, env, sim_nodes, &sim_models, &mut s);
        let listen = s.parse(
            args.listen.as_deref(),
            "ALLOT_LISTEN",
            std::net::SocketAddr::from(([127, 0, 0, 1], DEFAULT_GATEWAY_PORT)),
        );
        s.finish()?;
        Ok(Self {
            nats,
            data_dir,
            nats_port,
            sim_nodes,
            sim_gpus,
            sim_models,
            heartbeat_interval,
            telemetry_interval,
            missed_heartbeats,
            executor,
            prices,
            teams,
            teams_file,
            nats_restarts,
            health_rules,
            inject,
            listen,
        })
    }
}

/// The gateway's port unless `--listen` says otherwise (any free one when it is taken).
const DEFAULT_GATEWAY_PORT: u16 = 8080;

/// The faults of `--inject` (repeatable) or `ALLOT_INJECT` (comma-separated), each checked
/// against the simulated nodes `node-1` … `node-N` and their models.
fn injections(
    flags: &[String],
    env: Lookup<'_>,
    sim_nodes: u32,
    sim_models: &[GpuModel],
    s: &mut Settings<'_>,
) -> Vec<Injection> {
    let given: Vec<String> = if flags.is_empty() {
        let var = env("ALLOT_INJECT").unwrap_or_default();
        var.split(',')
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .map(str::to_owned)
            .collect()
    } else {
        flags.to_vec()
    };
    let mut schedule = Vec::new();
    for text in &given {
        match text.parse::<Injection>() {
            Ok(injection) => schedule.push(injection),
            Err(e) => s.problem(format!("--inject / ALLOT_INJECT: {e}")),
        }
    }
    // Without a valid model the nodes are unknown; that problem is reported already.
    if !sim_models.is_empty() {
        // As run_services names them and hands out the models.
        let model = |i: u32| sim_models[(i as usize - 1) % sim_models.len()];
        let nodes: BTreeMap<String, GpuModel> = (1..=sim_nodes)
            .map(|i| (format!("node-{i}"), model(i)))
            .collect();
        if let Err(e) = allot_collector::sim::inject::check(&schedule, &nodes) {
            for problem in e.0 {
                s.problem(format!("--inject / ALLOT_INJECT: {problem}"));
            }
        }
    }
    schedule
}

/// Runs `allot up` until SIGINT/SIGTERM, or until a service or the embedded nats-server fails
/// for good: then every service is stopped and the error names the part that failed.
pub async fn up(args: UpArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let config = UpConfig::resolve(&args, env)?;
    // Before anything else in the folder is touched: a second instance would share the store
    // and the databases of the first.
    let lock = Arc::new(local::DataDirLock::acquire(&config.data_dir)?);
    let (trigger, shutdown) = shutdown_on_signal();

    // The embedded server believes only who may speak: one user per role (see `auth`).
    let users = match &config.nats {
        Some(_) => None,
        None => Some(auth::prepare(
            &config.data_dir,
            &node_names(&config),
            &team_names(&config),
        )?),
    };
    let mut embedded = match &config.nats {
        Some(_) => None,
        None => {
            let binary = local::nats_server_binary(env)?;
            let users_config = auth::server_config_file(&config.data_dir);
            Some(
                local::EmbeddedNats::start(
                    &binary,
                    &config.data_dir,
                    config.nats_port,
                    Some(&users_config),
                )
                .await?,
            )
        }
    };
    if let (Some(users), Some(nats)) = (&users, &embedded) {
        auth::write_credentials(&config.data_dir, users, nats.url())?;
    }
    let url = match (&config.nats, &embedded) {
        (Some(url), _) => url.clone(),
        (None, Some(nats)) => nats.url().to_owned(),
        (None, None) => unreachable!("either --nats or an embedded server"),
    };
    lock.record(Some(&url), embedded.as_ref().map(local::EmbeddedNats::pid))?;

    let urls = Urls {
        url: &url,
        users: users.as_ref(),
    };
    let admin = match prepare(&urls, embedded.as_mut(), shutdown.clone()).await {
        Ok(admin) => admin,
        Err(e) => {
            if let Some(nats) = embedded {
                nats.stop().await;
            }
            return Err(e);
        }
    };

    let (stop_nats, nats_stopping) = oneshot::channel::<()>();
    let (nats_failed_tx, mut nats_failed) = oneshot::channel::<anyhow::Error>();
    let supervisor = embedded.map(|nats| {
        let lock = Arc::clone(&lock);
        let limit = local::RestartLimit::new(config.nats_restarts, NATS_RESTART_WINDOW);
        let started = move |nats: &local::EmbeddedNats| {
            if let Err(e) = lock.record(Some(nats.url()), Some(nats.pid())) {
                tracing::warn!(error = %format!("{e:#}"), "could not update the lock file");
            }
        };
        tokio::spawn(async move {
            let stop = async {
                let _ = nats_stopping.await;
            };
            if let Err(e) = nats.supervise(limit, started, stop).await {
                let _ = nats_failed_tx.send(e);
            }
        })
    });

    let result = run_services(&config, &urls, shutdown, trigger, &mut nats_failed).await;
    let _ = within_grace("NATS drain", Duration::from_secs(5), admin.drain()).await;
    // The server goes last: the services drained their connections through it.
    let _ = stop_nats.send(());
    if let Some(supervisor) = supervisor {
        let _ = supervisor.await;
    }
    tracing::info!("allot stopped");
    result?;
    // nats-server may also have given up while the services were stopping.
    if let Ok(e) = nats_failed.try_recv() {
        return Err(e.context("nats-server failed"));
    }
    Ok(ExitCode::SUCCESS)
}

/// The names of the simulated nodes: `node-1` … `node-N`.
fn node_names(config: &UpConfig) -> Vec<String> {
    (1..=config.sim_nodes)
        .map(|i| format!("node-{i}"))
        .collect()
}

/// The teams of the teams file, each of which gets a user.
fn team_names(config: &UpConfig) -> Vec<String> {
    config
        .teams
        .iter()
        .flat_map(|t| t.teams.iter().map(|team| team.name.clone()))
        .collect()
}

/// How each service reaches the server: as its own user on the embedded server, or with the
/// URL as given (`--nats`).
struct Urls<'a> {
    url: &'a str,
    users: Option<&'a allot_bus::Users>,
}

impl Urls<'_> {
    fn of(&self, role: allot_bus::Role) -> String {
        self.users
            .and_then(|users| users.url_for(&role, self.url))
            .unwrap_or_else(|| self.url.to_owned())
    }
}

/// How long the embedded nats-server's restarts are counted against `--nats-restarts`.
const NATS_RESTART_WINDOW: Duration = Duration::from_secs(60);

/// Connects the admin client, creates the streams and only then announces the embedded
/// server's URL, so a command that finds `nats.url` finds a working Allot.
async fn prepare(
    urls: &Urls<'_>,
    embedded: Option<&mut local::EmbeddedNats>,
    shutdown: super::Shutdown,
) -> anyhow::Result<async_nats::Client> {
    let admin = allot_bus::connect(
        &allot_bus::ConnectConfig::new(urls.of(allot_bus::Role::Admin), "allot-up"),
        shutdown,
    )
    .await
    .context("connecting to NATS")?;
    let js = async_nats::jetstream::new(admin.clone());
    allot_bus::ensure_streams(&js, &allot_bus::catalog(1)).await?;
    if let Some(nats) = embedded {
        nats.announce()?;
    }
    Ok(admin)
}

/// The services of `allot up`, each a task known by its name.
#[derive(Default)]
struct Services {
    tasks: JoinSet<anyhow::Result<()>>,
    names: HashMap<tokio::task::Id, String>,
}

impl Services {
    fn spawn(
        &mut self,
        name: impl Into<String>,
        run: impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let handle = self.tasks.spawn(run);
        self.names.insert(handle.id(), name.into());
    }

    /// The next service to end, by name, and how it ended (a panic is an error too).
    async fn next_end(&mut self) -> Option<(String, anyhow::Result<()>)> {
        let (id, result) = match self.tasks.join_next_with_id().await? {
            Ok((id, result)) => (id, result),
            Err(e) => (e.id(), Err(anyhow::anyhow!("{e}"))),
        };
        let name = self.names.remove(&id).unwrap_or_else(|| "a service".into());
        Some((name, result))
    }

    /// The services still running, for the message when they overrun their grace period.
    fn running(&self) -> String {
        let mut names: Vec<&str> = self.names.values().map(String::as_str).collect();
        names.sort_unstable();
        names.join(", ")
    }
}

/// Runs every service until `shutdown`, or until one of them or nats-server (`nats_failed`)
/// fails: the first failure stops all the others, and is the error returned.
async fn run_services(
    config: &UpConfig,
    urls: &Urls<'_>,
    shutdown: super::Shutdown,
    trigger: oneshot::Sender<()>,
    nats_failed: &mut oneshot::Receiver<anyhow::Error>,
) -> anyhow::Result<()> {
    use allot_bus::Role;
    // Injected faults are timed from here.
    let start = tokio::time::Instant::now();
    let mut services = Services::default();
    let mut inventory =
        allot_inventory::Config::new(urls.of(Role::Inventory), config.data_dir.join("inventory"));
    inventory.liveness.heartbeat_interval = config.heartbeat_interval;
    inventory.liveness.missed_heartbeats = config.missed_heartbeats;
    let stop = shutdown.clone();
    services.spawn("inventory", async move {
        Ok(allot_inventory::run(inventory, stop).await?)
    });
    // The allocator of the simulated pool (a standby would be a second one with another
    // instance id; one is enough on a laptop). The folder's lock makes it the one process with
    // its id: a lease left under that id by a killed `allot up` is taken over at once.
    let allocator = allot_allocator::Config {
        instance: "allocator-up".into(),
        sole_instance: true,
        quotas: config
            .teams
            .as_ref()
            .map(allot_workload::TeamsConfig::quotas)
            .unwrap_or_default(),
        ..allot_allocator::Config::new(urls.of(Role::Allocator), "default")
    };
    let stop = shutdown.clone();
    services.spawn("allocator", async move {
        Ok(allot_allocator::run(allocator, stop).await?)
    });
    // The planner hands the pool's allocator each workload's tasks as their dependencies succeed.
    let mut planner =
        allot_planner::Config::new(urls.of(Role::Planner), config.data_dir.join("planner"));
    planner.teams.clone_from(&config.teams);
    let stop = shutdown.clone();
    services.spawn("planner", async move {
        Ok(allot_planner::run(planner, stop).await?)
    });
    // The predictor: a run-time prediction for every task, learned from those that finished.
    // It right-sizes with the prices billing charges.
    let mut predictor =
        allot_predictor::Config::new(urls.of(Role::Predictor), config.data_dir.join("predictor"));
    predictor.prices = Some(config.prices.clone());
    let stop = shutdown.clone();
    services.spawn("predictor", async move {
        Ok(allot_predictor::run(predictor, stop).await?)
    });
    // Billing: every lease in the journal priced, cost events per team and workload.
    let mut billing = allot_billing::Config::new(
        urls.of(Role::Billing),
        config.data_dir.join("billing"),
        config.prices.clone(),
    );
    if let Some(teams) = &config.teams {
        billing.budgets = allot_billing::budget::from_teams(teams);
    }
    let stop = shutdown.clone();
    services.spawn("billing", async move {
        Ok(allot_billing::run(billing, stop).await?)
    });
    // The audit archive: a hash-chained copy of the allocator's journal.
    let archiver =
        allot_archiver::Config::new(urls.of(Role::Archiver), config.data_dir.join("archive.db"));
    let stop = shutdown.clone();
    services.spawn("archiver", async move {
        Ok(allot_archiver::run(archiver, stop).await?)
    });
    // Remediation: the health rules over every node's telemetry and heartbeats.
    let mut remediation = allot_remediation::Config::new(
        urls.of(Role::Remediation),
        config.data_dir.join("remediation"),
    );
    remediation.rules = config.health_rules.clone();
    let stop = shutdown.clone();
    services.spawn("remediation", async move {
        Ok(allot_remediation::run(remediation, stop).await?)
    });
    // The gateway: the API and the dashboard, with the admin token in the data folder.
    let mut gateway = allot_gateway::Config::new(
        urls.of(Role::Gateway),
        config.data_dir.join("gateway"),
        config.listen,
    );
    gateway.listen_fallback = config.listen.port() == DEFAULT_GATEWAY_PORT;
    gateway.admin_token_file = Some(config.data_dir.join("admin.token"));
    gateway.teams.clone_from(&config.teams);
    gateway.url_file = Some(config.data_dir.join("gateway.url"));
    let stop = shutdown.clone();
    services.spawn("gateway", async move {
        Ok(allot_gateway::run(gateway, stop).await?)
    });
    let mut sim_loads = BTreeMap::new();
    for i in 1..=config.sim_nodes {
        let node = format!("node-{i}");
        let model = config.sim_models[(i as usize - 1) % config.sim_models.len()];
        let collector = allot_collector::Config {
            nats_url: urls.of(Role::Collector(node.clone())),
            node: node.clone(),
            pool: "default".into(),
            rack: Some(format!("rack-{}", (i - 1) / 4 + 1)),
            hostname: node.clone(),
            source: allot_collector::SourceChoice::Simulated,
            sim: SimSpec {
                gpus: config.sim_gpus,
                model,
                seed: u64::from(i),
                ..SimSpec::default()
            },
            heartbeat_interval: config.heartbeat_interval,
            telemetry_interval: config.telemetry_interval,
            executor: executor_config(config, &node),
        };
        // Opened here, not by the collector, to keep the handle faults are injected through.
        let source = allot_collector::SimulatedSource::new(&node, collector.sim.clone());
        sim_loads.insert(node.clone(), source.load());
        let stop = shutdown.clone();
        services.spawn(format!("collector {node}"), async move {
            Ok(allot_collector::run_with_source(collector, Box::new(source), stop).await?)
        });
    }
    if !config.inject.is_empty() {
        let injector = allot_collector::Injector::new(config.inject.clone(), sim_loads)?;
        let stop = shutdown.clone();
        services.spawn("fault injection", async move {
            injector.run(start, stop).await;
            Ok(())
        });
    }
    if let ExecutorKind::Simulated { speedup } = config.executor {
        tracing::info!(
            speedup,
            "simulated runs last their duration estimate ÷ {speedup}; billing prices the GPU time \
             they really hold, so costs are {speedup}× below what the estimates would cost"
        );
    }
    match (&config.teams, &config.teams_file) {
        (Some(teams), Some(file)) => tracing::info!(
            file = %file,
            teams = %team_names(config).join(", "),
            classes = teams.priority_classes.len(),
            "teams file in force: submissions naming another team are refused; quotas and \
             budgets apply"
        ),
        _ => tracing::warn!(
            "no teams file: any team name is accepted and no quota or budget applies \
             (pass --teams FILE, e.g. examples/teams.yaml; `./dev up` does)"
        ),
    }
    tracing::info!(
        nats = %allot_bus::users::without_credentials(urls.url),
        authenticated = urls.users.is_some(),
        nodes = config.sim_nodes,
        gpus_per_node = config.sim_gpus,
        "allot is up; try `allot status` in this folder, Ctrl-C to stop"
    );

    // Run until a signal, or until a part stops on its own (which is a failure).
    let mut failure: Option<anyhow::Error> = None;
    tokio::select! {
        // Services stop when shutdown fires: seen first, their exit is not a failure.
        biased;
        () = shutdown.clone() => {}
        Some((name, result)) = services.next_end() => {
            let error = result
                .err()
                .unwrap_or_else(|| anyhow::anyhow!("it stopped on its own"));
            tracing::error!(service = %name, "a service failed; stopping the others");
            failure = Some(error.context(format!("{name} failed")));
        }
        // A dropped sender (no embedded server) disables this branch.
        Ok(error) = &mut *nats_failed => {
            tracing::error!(service = "nats-server", "nats-server failed; stopping every service");
            failure = Some(error.context("nats-server failed"));
        }
    }
    if failure.is_some() {
        let _ = trigger.send(());
    }
    let drained = within_grace("services", Duration::from_secs(15), async {
        while let Some((name, result)) = services.next_end().await {
            if let Err(e) = result {
                match &failure {
                    None => failure = Some(e.context(format!("{name} stopped with an error"))),
                    Some(_) => {
                        tracing::error!(service = %name, error = %format!("{e:#}"), "service stopped with an error");
                    }
                }
            }
        }
    })
    .await;
    if drained.is_none() {
        let running = services.running();
        services.tasks.abort_all();
        failure.get_or_insert_with(|| {
            anyhow::anyhow!("{running} did not stop within the grace period")
        });
    }
    failure.map_or(Ok(()), Err)
}

/// The executor of simulated node `node`: its state, logs and checkpoints under the data folder.
fn executor_config(config: &UpConfig, node: &str) -> allot_collector::ExecutorConfig {
    let dir = config.data_dir.join("executor");
    let runs = match config.executor {
        ExecutorKind::Simulated { speedup } => {
            allot_collector::Runs::Simulated(allot_collector::SimulatedRuns {
                speedup,
                ..allot_collector::SimulatedRuns::default()
            })
        }
        ExecutorKind::Process => allot_collector::Runs::Process(allot_collector::ProcessRuns {
            log_dir: dir.join("logs"),
            checkpoint_dir: dir.join("checkpoints"),
            grace: Duration::from_secs(10),
        }),
    };
    allot_collector::ExecutorConfig {
        runs,
        state: Some(dir.join(format!("{node}.db"))),
        // The simulated nodes share checkpoint storage, as a real cluster's runs do: a task
        // moved to another node resumes from its last checkpoint.
        shared_checkpoints: Some(dir.join("sim-progress")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> UpArgs {
        UpArgs {
            nats: None,
            data_dir: None,
            nats_port: None,
            sim_nodes: None,
            sim_gpus: None,
            sim_models: None,
            heartbeat_interval: None,
            telemetry_interval: None,
            missed_heartbeats: None,
            executor: None,
            sim_speedup: None,
            prices: None,
            teams: None,
            nats_restarts: None,
            health_rules: None,
            inject: Vec::new(),
            listen: None,
        }
    }

    #[test]
    fn the_built_in_price_table_prices_every_simulated_gpu_model() {
        let prices = super::super::run::default_prices();
        for model in ["H100", "A100-80GB", "A100-40GB", "V100", "L4", "T4", "A10"] {
            assert!(prices.at(0).gpu(model).is_some(), "{model} has no price");
        }
    }

    #[test]
    fn defaults_give_a_four_node_h100_cluster() {
        let config = UpConfig::resolve(&args(), &|_| None).unwrap();
        assert_eq!((config.sim_nodes, config.sim_gpus), (4, 8));
        assert_eq!(config.sim_models, vec!["H100".parse().unwrap()]);
        assert_eq!(config.data_dir, PathBuf::from(".allot"));
        assert!(config.nats.is_none());
    }

    #[test]
    fn every_invalid_setting_is_listed_at_once() {
        let env = |k: &str| match k {
            "ALLOT_SIM_NODES" => Some("three".into()),
            "ALLOT_SIM_MODELS" => Some("H100,Z9000".into()),
            _ => None,
        };
        let args = UpArgs {
            sim_gpus: Some("0".into()),
            heartbeat_interval: Some("soon".into()),
            ..args()
        };
        let err = UpConfig::resolve(&args, &env).unwrap_err();
        let text = err.to_string();
        for want in [
            "ALLOT_SIM_NODES=\"three\"",
            "Z9000",
            "--sim-gpus",
            "--heartbeat-interval=\"soon\"",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        assert_eq!(err.0.len(), 4, "{text}");
    }

    #[test]
    fn injections_are_checked_against_the_simulated_nodes_every_problem_at_once() {
        let bad = UpArgs {
            sim_nodes: Some("3".into()),
            sim_models: Some("H100,L4".into()),
            inject: vec![
                "overheat:node-1@30s".into(),
                "xid79:node-4@1m".into(),
                "boom:node-1@soon".into(),
                "nvlink:node-2@10s".into(),
                "partition:node-3@2m".into(),
            ],
            ..args()
        };
        let err = UpConfig::resolve(&bad, &|_| None).unwrap_err();
        let text = err.to_string();
        for want in [
            "--inject / ALLOT_INJECT: injection \"boom:node-1@soon\": unknown kind \"boom\"",
            "bad time \"soon\"",
            "no simulated node \"node-4\" (the nodes are node-1, node-2, node-3)",
            "node-2's L4 GPUs have no NVLink",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        assert_eq!(err.0.len(), 3, "{text}");

        let env = |k: &str| {
            (k == "ALLOT_INJECT").then(|| "overheat:node-1@30s, partition:node-2@2m".into())
        };
        let config = UpConfig::resolve(&args(), &env).unwrap();
        let written: Vec<String> = config.inject.iter().map(ToString::to_string).collect();
        assert_eq!(written, ["overheat:node-1@30s", "partition:node-2@2m"]);
    }
}
