//! `allot run <service>`: one service in its own process (a Kubernetes pod, a DaemonSet on a
//! GPU node). Every setting is a flag or an `ALLOT_*` variable.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use allot_collector::SourceChoice;
use allot_collector::sim::{GpuModel, SimSpec};

use super::settings::{Lookup, Settings};
use super::{local, shutdown_on_signal};

/// `allot run` arguments.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// NATS URL(s), comma-separated for a cluster (ALLOT_NATS_URL; default: ./.allot/nats.url,
    /// then nats://127.0.0.1:4222).
    #[arg(long, global = true)]
    pub nats: Option<String>,
    /// Stream replicas when creating streams (and the allocator's lease bucket): 1, or 3 on a
    /// cluster (ALLOT_STREAM_REPLICAS).
    #[arg(long, global = true)]
    pub stream_replicas: Option<String>,
    /// Where to serve /metrics, /healthz and /readyz: IP:PORT (port 0 picks a free one),
    /// or `off` (ALLOT_OPS_ADDR; default 0.0.0.0:9090).
    #[arg(long, global = true)]
    pub ops_addr: Option<String>,
    #[command(subcommand)]
    pub service: Service,
}

/// The services `allot run` can start.
#[derive(Debug, Subcommand)]
pub enum Service {
    /// The inventory: nodes, GPUs, health and capacity.
    Inventory(InventoryArgs),
    /// The node agent: GPU telemetry from NVML or the simulator.
    Collector(CollectorArgs),
    /// The allocator of one pool (run two or more: one leads, the others stand by).
    Allocator(AllocatorArgs),
    /// The audit archiver: a hash-chained SQLite copy of the DECISIONS stream.
    Archiver(ArchiverArgs),
    /// The planner: runs workloads' DAGs, handing tasks to a pool's allocator as their
    /// dependencies succeed.
    Planner(PlannerArgs),
    /// Billing: prices every lease in the allocators' journals and publishes cost events.
    Billing(BillingArgs),
    /// The predictor: learns run times from finished tasks and publishes a prediction for
    /// every task that becomes ready.
    Predictor(PredictorArgs),
    /// Remediation: GPU health rules over telemetry and heartbeats; alerts, GPUs out of
    /// service, cordons, drains and returns to service, each an event.
    Remediation(RemediationArgs),
    /// The gateway: REST API, live events and the dashboard, with per-team tokens.
    Gateway(GatewayArgs),
}

/// Flags of `allot run gateway`.
#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// Folder for gateway.db (ALLOT_DATA_DIR; default: .allot/gateway).
    #[arg(long)]
    pub data_dir: Option<String>,
    /// Where to listen (ALLOT_LISTEN; default 0.0.0.0:8080).
    #[arg(long)]
    pub listen: Option<String>,
    /// The bootstrap admin token's file, read or created mode 0600 (ALLOT_ADMIN_TOKEN_FILE;
    /// default: none — issue tokens with `allot token create`).
    #[arg(long)]
    pub admin_token_file: Option<String>,
    /// Teams file, to check submissions as `allot submit` does (ALLOT_TEAMS_FILE).
    #[arg(long)]
    pub teams: Option<String>,
    /// Durable consumer name prefix (ALLOT_CONSUMER_PREFIX; default: gateway). Each instance
    /// keeps its own read models, so each needs its own prefix: instances sharing one would
    /// split the events between them.
    #[arg(long)]
    pub consumer_prefix: Option<String>,
    /// How long JetStream waits for an acknowledgement before redelivering (ALLOT_ACK_WAIT;
    /// default 30s).
    #[arg(long)]
    pub ack_wait: Option<String>,
    /// How long a finished workload stays in the read models, with its tasks and decisions,
    /// e.g. `90d`, or `forever` (ALLOT_RETAIN; default 30d). Costs stay; the journal on the
    /// bus keeps every decision for replay and audits.
    #[arg(long)]
    pub retain: Option<String>,
}

/// Flags of `allot run remediation`.
#[derive(Debug, Args)]
pub struct RemediationArgs {
    /// Folder for remediation.db (ALLOT_DATA_DIR; default: .allot/remediation).
    #[arg(long)]
    pub data_dir: Option<String>,
    /// The health rules (ALLOT_HEALTH_RULES; default: the built-in set, spelled out in
    /// examples/health-rules.yaml).
    #[arg(long)]
    pub rules: Option<String>,
}

/// Flags of `allot run predictor`.
#[derive(Debug, Args)]
pub struct PredictorArgs {
    /// Folder for predictor.db (ALLOT_DATA_DIR; default: .allot/predictor).
    #[arg(long)]
    pub data_dir: Option<String>,
    /// Retrain at least this often while runs keep finishing (ALLOT_RETRAIN_EVERY; default
    /// 10m).
    #[arg(long)]
    pub retrain_every: Option<String>,
    /// The price table right-sizing compares GPU models by (ALLOT_PRICES; default: none, and
    /// predictions carry no right-sizing advice; see examples/prices.yaml).
    #[arg(long)]
    pub prices: Option<String>,
}

/// Flags of `allot run billing`.
#[derive(Debug, Args)]
pub struct BillingArgs {
    /// Folder for billing.db (ALLOT_DATA_DIR; default: .allot/billing).
    #[arg(long)]
    pub data_dir: Option<String>,
    /// The price table (ALLOT_PRICES; required; see examples/prices.yaml).
    #[arg(long)]
    pub prices: Option<String>,
    /// Billing period: leases are billed per period of this length, and at their end
    /// (ALLOT_BILLING_INTERVAL; default 60s).
    #[arg(long)]
    pub interval: Option<String>,
    /// Teams file with the teams' budgets (ALLOT_TEAMS_FILE; default: none, no budgets).
    #[arg(long)]
    pub teams: Option<String>,
}

/// Flags of `allot run planner`.
#[derive(Debug, Args)]
pub struct PlannerArgs {
    /// Folder for planner.db (ALLOT_DATA_DIR; default: .allot/planner).
    #[arg(long)]
    pub data_dir: Option<String>,
    /// The pool tasks are handed to (ALLOT_POOL; default: default).
    #[arg(long)]
    pub pool: Option<String>,
    /// Teams file submissions are checked against again (ALLOT_TEAMS_FILE; default: none, so
    /// teams are not checked and the default priority classes apply).
    #[arg(long)]
    pub teams: Option<String>,
    /// Durable consumer name prefix (ALLOT_CONSUMER_PREFIX; default: planner).
    #[arg(long)]
    pub consumer_prefix: Option<String>,
    /// How long JetStream waits for an acknowledgement before redelivering (ALLOT_ACK_WAIT).
    #[arg(long)]
    pub ack_wait: Option<String>,
}

/// Flags of `allot run archiver`.
#[derive(Debug, Args)]
pub struct ArchiverArgs {
    /// The archive file (ALLOT_ARCHIVE; default: .allot/archive.db).
    #[arg(long)]
    pub db: Option<String>,
}

/// Flags of `allot run allocator`.
#[derive(Debug, Args)]
pub struct AllocatorArgs {
    /// The pool it allocates (ALLOT_POOL; default: default).
    #[arg(long)]
    pub pool: Option<String>,
    /// Scheduling policy (ALLOT_POLICY; default: allot).
    #[arg(long)]
    pub policy: Option<String>,
    /// This instance's id in the lease and the journal (ALLOT_INSTANCE; default: the host name
    /// and process id).
    #[arg(long)]
    pub instance: Option<String>,
    /// How long the lease lives unrenewed: how soon a standby takes over (ALLOT_LEASE_TTL).
    #[arg(long)]
    pub lease_ttl: Option<String>,
    /// Teams file whose quotas the pool enforces (ALLOT_TEAMS_FILE; default: none, no quotas).
    #[arg(long)]
    pub teams: Option<String>,
}

/// Flags of `allot run inventory`.
#[derive(Debug, Args)]
pub struct InventoryArgs {
    /// Folder for inventory.db (ALLOT_DATA_DIR).
    #[arg(long)]
    pub data_dir: Option<String>,
    /// Durable consumer name prefix (ALLOT_CONSUMER_PREFIX).
    #[arg(long)]
    pub consumer_prefix: Option<String>,
    /// Collector heartbeat interval (ALLOT_HEARTBEAT_INTERVAL).
    #[arg(long)]
    pub heartbeat_interval: Option<String>,
    /// Heartbeats a node may miss before it is unreachable (ALLOT_MISSED_HEARTBEATS).
    #[arg(long)]
    pub missed_heartbeats: Option<String>,
    /// How long JetStream waits for an acknowledgement before redelivering (ALLOT_ACK_WAIT).
    #[arg(long)]
    pub ack_wait: Option<String>,
}

/// Flags of `allot run collector`.
#[derive(Debug, Args)]
pub struct CollectorArgs {
    /// Node name (ALLOT_NODE; default: the host name).
    #[arg(long)]
    pub node: Option<String>,
    /// GPU pool (ALLOT_POOL).
    #[arg(long)]
    pub pool: Option<String>,
    /// Rack or topology domain (ALLOT_RACK).
    #[arg(long)]
    pub rack: Option<String>,
    /// `auto` (NVML if it loads, else the simulator), `nvml` or `sim` (ALLOT_GPU_SOURCE).
    #[arg(long)]
    pub gpu_source: Option<String>,
    /// Simulated GPUs (ALLOT_SIM_GPUS).
    #[arg(long)]
    pub sim_gpus: Option<String>,
    /// Simulated GPU model (ALLOT_SIM_MODEL).
    #[arg(long)]
    pub sim_model: Option<String>,
    /// Heartbeat interval (ALLOT_HEARTBEAT_INTERVAL).
    #[arg(long)]
    pub heartbeat_interval: Option<String>,
    /// Telemetry interval (ALLOT_TELEMETRY_INTERVAL).
    #[arg(long)]
    pub telemetry_interval: Option<String>,
    /// How granted tasks run: `process` (their command on this host), `sim` (simulated for
    /// their duration estimate) or `off` (ALLOT_EXECUTOR; default: `sim` on a simulated GPU
    /// source, else `process`).
    #[arg(long)]
    pub executor: Option<String>,
    /// Task time per wall time of simulated runs (ALLOT_SIM_SPEEDUP).
    #[arg(long)]
    pub sim_speedup: Option<String>,
    /// Time between SIGTERM and SIGKILL when a run is stopped (ALLOT_STOP_GRACE).
    #[arg(long)]
    pub stop_grace: Option<String>,
    /// Folder for the executor's state, task logs and checkpoints (ALLOT_DATA_DIR).
    #[arg(long)]
    pub data_dir: Option<String>,
}

/// Runs one service until SIGINT/SIGTERM.
pub async fn run(args: RunArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let (url, origin) =
        local::discover_url(args.nats.as_deref(), env, std::path::Path::new(".allot"))?;
    let mut s = Settings::new(env);
    let replicas: usize = s.parse(args.stream_replicas.as_deref(), "ALLOT_STREAM_REPLICAS", 1);
    if !(1..=5).contains(&replicas) {
        s.problem(format!(
            "--stream-replicas / ALLOT_STREAM_REPLICAS: {replicas}; use 1 to 5"
        ));
    }
    let ops_addr = ops_addr(args.ops_addr.as_deref(), &mut s);
    let service = match &args.service {
        Service::Inventory(a) => Configured::Inventory(inventory_config(a, &url, &mut s)),
        Service::Collector(a) => Configured::Collector(collector_config(a, &url, &mut s)),
        Service::Allocator(a) => {
            let mut config = allocator_config(a, &url, &mut s);
            // The lease bucket keeps as many copies as the streams.
            config.replicas = replicas;
            Configured::Allocator(config)
        }
        Service::Archiver(a) => Configured::Archiver(allot_archiver::Config::new(
            url.clone(),
            s.string(a.db.as_deref(), "ALLOT_ARCHIVE", ".allot/archive.db"),
        )),
        Service::Planner(a) => Configured::Planner(planner_config(a, &url, &mut s)),
        Service::Billing(a) => Configured::Billing(Box::new(billing_config(a, &url, &mut s))),
        Service::Predictor(a) => {
            let data_dir = s.string(a.data_dir.as_deref(), "ALLOT_DATA_DIR", ".allot/predictor");
            let mut config = allot_predictor::Config::new(url.clone(), data_dir);
            config.retrain_every = s.duration(
                a.retrain_every.as_deref(),
                "ALLOT_RETRAIN_EVERY",
                config.retrain_every,
            );
            config.prices = s
                .optional(a.prices.as_deref(), "ALLOT_PRICES")
                .and_then(|path| read_prices(&path, &mut s));
            Configured::Predictor(config)
        }
        Service::Remediation(a) => {
            let data_dir = s.string(
                a.data_dir.as_deref(),
                "ALLOT_DATA_DIR",
                ".allot/remediation",
            );
            let mut config = allot_remediation::Config::new(url.clone(), data_dir);
            if let Some(rules) = health_rules(a.rules.as_deref(), "--rules", &mut s) {
                config.rules = rules;
            }
            Configured::Remediation(config)
        }
        Service::Gateway(a) => {
            let data_dir = s.string(a.data_dir.as_deref(), "ALLOT_DATA_DIR", ".allot/gateway");
            let listen = s.parse(
                a.listen.as_deref(),
                "ALLOT_LISTEN",
                std::net::SocketAddr::from(([0, 0, 0, 0], 8080)),
            );
            let mut config = allot_gateway::Config::new(url.clone(), data_dir, listen);
            config.admin_token_file = s
                .optional(a.admin_token_file.as_deref(), "ALLOT_ADMIN_TOKEN_FILE")
                .map(PathBuf::from);
            config.teams = teams_file(a.teams.as_deref(), &mut s);
            config.consumer = s.string(
                a.consumer_prefix.as_deref(),
                "ALLOT_CONSUMER_PREFIX",
                "gateway",
            );
            config.ack_wait = s.duration(a.ack_wait.as_deref(), "ALLOT_ACK_WAIT", config.ack_wait);
            config.retain = retention(a.retain.as_deref(), &mut s);
            Configured::Gateway(Box::new(config))
        }
    };
    s.finish()?;
    tracing::info!(nats = %allot_bus::users::without_credentials(&url), from = %origin, "using NATS");

    let (_trigger, shutdown) = shutdown_on_signal();
    // Up before connecting: alive (/healthz) while NATS is away, not ready (/readyz) until the
    // service runs, and still answering while it drains.
    let _ops = match ops_addr {
        Some(addr) => Some(serve_ops(addr).await?),
        None => None,
    };
    let admin = allot_bus::connect(
        &allot_bus::ConnectConfig::new(&url, "allot-run"),
        shutdown.clone(),
    )
    .await?;
    allot_bus::ensure_streams(
        &async_nats::jetstream::new(admin.clone()),
        &allot_bus::catalog(replicas),
    )
    .await?;
    let _ = admin.drain().await;

    match service {
        Configured::Inventory(config) => allot_inventory::run(config, shutdown).await?,
        Configured::Collector(config) => allot_collector::run(config, shutdown).await?,
        Configured::Allocator(config) => allot_allocator::run(config, shutdown).await?,
        Configured::Archiver(config) => allot_archiver::run(config, shutdown).await?,
        Configured::Planner(config) => allot_planner::run(config, shutdown).await?,
        Configured::Billing(config) => allot_billing::run(*config, shutdown).await?,
        Configured::Predictor(config) => allot_predictor::run(config, shutdown).await?,
        Configured::Remediation(config) => allot_remediation::run(config, shutdown).await?,
        Configured::Gateway(config) => allot_gateway::run(*config, shutdown).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The ops address from `--ops-addr` / ALLOT_OPS_ADDR: `None` for `off`.
fn ops_addr(flag: Option<&str>, s: &mut Settings<'_>) -> Option<std::net::SocketAddr> {
    let value = s.string(flag, "ALLOT_OPS_ADDR", DEFAULT_OPS_ADDR);
    if value.trim() == "off" {
        return None;
    }
    match value.trim().parse() {
        Ok(addr) => Some(addr),
        Err(e) => {
            s.problem(format!(
                "--ops-addr / ALLOT_OPS_ADDR: {value:?}: {e}; use IP:PORT (e.g. \
                 {DEFAULT_OPS_ADDR}, 127.0.0.1:0) or off"
            ));
            None
        }
    }
}

/// Where `allot run` serves its ops endpoints unless told otherwise: the port the manifests
/// in deploy/k8s probe and scrape.
const DEFAULT_OPS_ADDR: &str = "0.0.0.0:9090";

/// Serves /metrics, /healthz and /readyz on `addr` until the returned guard is dropped.
async fn serve_ops(
    addr: std::net::SocketAddr,
) -> anyhow::Result<tokio_util::task::AbortOnDropHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!(
            "serving the ops endpoints on {addr}: {e} (choose another with --ops-addr / \
             ALLOT_OPS_ADDR, or off)"
        )
    })?;
    let bound = listener.local_addr()?;
    tracing::info!(ops = %bound, "serving /metrics, /healthz and /readyz");
    let server = tokio::spawn(async move {
        if let Err(e) = allot_runtime::ops::serve(listener, std::future::pending()).await {
            tracing::error!(error = %e, "the ops endpoints stopped");
        }
    });
    Ok(tokio_util::task::AbortOnDropHandle::new(server))
}

/// A service with its settings checked.
enum Configured {
    Inventory(allot_inventory::Config),
    Collector(allot_collector::Config),
    Allocator(allot_allocator::Config),
    Archiver(allot_archiver::Config),
    Planner(allot_planner::Config),
    Billing(Box<allot_billing::Config>),
    Predictor(allot_predictor::Config),
    Remediation(allot_remediation::Config),
    Gateway(Box<allot_gateway::Config>),
}

fn billing_config(a: &BillingArgs, url: &str, s: &mut Settings<'_>) -> allot_billing::Config {
    let data_dir = s.string(a.data_dir.as_deref(), "ALLOT_DATA_DIR", ".allot/billing");
    let prices = match s.optional(a.prices.as_deref(), "ALLOT_PRICES") {
        Some(path) => read_prices(&path, s).unwrap_or_else(default_prices),
        None => {
            s.problem("--prices / ALLOT_PRICES: name the price table (see examples/prices.yaml)");
            default_prices()
        }
    };
    let mut config = allot_billing::Config::new(url, data_dir, prices);
    config.interval = s.duration(
        a.interval.as_deref(),
        "ALLOT_BILLING_INTERVAL",
        config.interval,
    );
    if config.interval.is_zero() {
        s.problem("--interval / ALLOT_BILLING_INTERVAL: must be longer than zero");
    }
    if let Some(teams) = teams_file(a.teams.as_deref(), s) {
        config.budgets = allot_billing::budget::from_teams(&teams);
    }
    config
}

/// The health rules file named by `flag` (spelled `name`) or ALLOT_HEALTH_RULES, if any, read
/// and checked: every problem in it is reported.
pub(super) fn health_rules(
    flag: Option<&str>,
    name: &str,
    s: &mut Settings<'_>,
) -> Option<allot_health::RuleSet> {
    let path = s.optional(flag, "ALLOT_HEALTH_RULES")?;
    match std::fs::read_to_string(&path) {
        Ok(text) => match allot_health::RuleSet::parse(&text) {
            Ok(rules) => Some(rules),
            Err(problems) => {
                for p in problems {
                    s.problem(format!("{name} / ALLOT_HEALTH_RULES: {path}: {p}"));
                }
                None
            }
        },
        Err(e) => {
            s.problem(format!("{name} / ALLOT_HEALTH_RULES: reading {path}: {e}"));
            None
        }
    }
}

/// The teams file named by `flag` or ALLOT_TEAMS_FILE, if any, read and checked.
pub(super) fn teams_file(
    flag: Option<&str>,
    s: &mut Settings<'_>,
) -> Option<allot_workload::TeamsConfig> {
    let path = s.optional(flag, "ALLOT_TEAMS_FILE")?;
    match std::fs::read_to_string(&path) {
        Ok(text) => match allot_workload::TeamsConfig::from_yaml(&text) {
            Ok(teams) => Some(teams),
            Err(e) => {
                s.problem(format!("--teams / ALLOT_TEAMS_FILE: {path}: {e}"));
                None
            }
        },
        Err(e) => {
            s.problem(format!("--teams / ALLOT_TEAMS_FILE: reading {path}: {e}"));
            None
        }
    }
}

/// The price table in `path`; `None` with the problem recorded when it cannot be read.
fn read_prices(path: &str, s: &mut Settings<'_>) -> Option<allot_billing::PriceTable> {
    match std::fs::read_to_string(path) {
        Ok(text) => allot_billing::PriceTable::parse(&text)
            .map_err(|e| s.problem(format!("--prices / ALLOT_PRICES: {path}: {e}")))
            .ok(),
        Err(e) => {
            s.problem(format!("--prices / ALLOT_PRICES: reading {path}: {e}"));
            None
        }
    }
}

/// The text of `examples/prices.yaml`.
pub const DEFAULT_PRICES: &str = include_str!("../../examples/prices.yaml");

/// The example price table (`examples/prices.yaml`), built in: what `allot up` bills with when
/// given no other.
pub fn default_prices() -> allot_billing::PriceTable {
    allot_billing::PriceTable::parse(DEFAULT_PRICES)
        .expect("examples/prices.yaml is valid (a unit test checks it)")
}

fn planner_config(a: &PlannerArgs, url: &str, s: &mut Settings<'_>) -> allot_planner::Config {
    let data_dir = s.string(a.data_dir.as_deref(), "ALLOT_DATA_DIR", ".allot/planner");
    let mut config = allot_planner::Config::new(url, data_dir);
    config.pool = s.string(a.pool.as_deref(), "ALLOT_POOL", "default");
    if let Err(e) = allot_events::subject::validate_token("pool", &config.pool) {
        s.problem(format!("--pool / ALLOT_POOL: {e}"));
    }
    config.teams = teams_file(a.teams.as_deref(), s);
    config.consumer_prefix = s.string(
        a.consumer_prefix.as_deref(),
        "ALLOT_CONSUMER_PREFIX",
        "planner",
    );
    config.ack_wait = s.duration(a.ack_wait.as_deref(), "ALLOT_ACK_WAIT", config.ack_wait);
    config
}

fn allocator_config(a: &AllocatorArgs, url: &str, s: &mut Settings<'_>) -> allot_allocator::Config {
    let pool = s.string(a.pool.as_deref(), "ALLOT_POOL", "default");
    if let Err(e) = allot_events::subject::validate_token("pool", &pool) {
        s.problem(format!("--pool / ALLOT_POOL: {e}"));
    }
    let mut config = allot_allocator::Config::new(url, pool);
    config.policy = s.string(a.policy.as_deref(), "ALLOT_POLICY", "allot");
    let live: Vec<&str> = allot_sched::policy::NAMES
        .iter()
        .copied()
        .filter(|n| allot_sched::policy::by_name(n).is_some_and(|p| !p.uses_oracle()))
        .collect();
    match allot_sched::policy::by_name(&config.policy) {
        None => s.problem(format!(
            "--policy / ALLOT_POLICY: unknown policy {:?}; known: {}",
            config.policy,
            live.join(", ")
        )),
        Some(p) if p.uses_oracle() => s.problem(format!(
            "--policy / ALLOT_POLICY: {:?} reads true run times, which exist only in \
             simulation (allot sim); a live pool takes one of: {}",
            config.policy,
            live.join(", ")
        )),
        Some(_) => {}
    }
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "allocator".into());
    let default_instance = format!("{host}-{}", std::process::id());
    config.instance = s.string(a.instance.as_deref(), "ALLOT_INSTANCE", &default_instance);
    config.lease_ttl = s.duration(a.lease_ttl.as_deref(), "ALLOT_LEASE_TTL", config.lease_ttl);
    if let Some(teams) = teams_file(a.teams.as_deref(), s) {
        config.quotas = teams.quotas();
    }
    config
}

fn inventory_config(a: &InventoryArgs, url: &str, s: &mut Settings<'_>) -> allot_inventory::Config {
    let data_dir =
        PathBuf::from(s.string(a.data_dir.as_deref(), "ALLOT_DATA_DIR", ".allot/inventory"));
    let mut config = allot_inventory::Config::new(url, data_dir);
    config.consumer_prefix = s.string(
        a.consumer_prefix.as_deref(),
        "ALLOT_CONSUMER_PREFIX",
        "inventory",
    );
    if let Err(e) =
        allot_events::subject::validate_token("consumer prefix", &config.consumer_prefix)
    {
        s.problem(format!("--consumer-prefix / ALLOT_CONSUMER_PREFIX: {e}"));
    }
    config.liveness.heartbeat_interval = s.duration(
        a.heartbeat_interval.as_deref(),
        "ALLOT_HEARTBEAT_INTERVAL",
        Duration::from_secs(5),
    );
    config.liveness.missed_heartbeats =
        s.parse(a.missed_heartbeats.as_deref(), "ALLOT_MISSED_HEARTBEATS", 3);
    config.ack_wait = s.duration(
        a.ack_wait.as_deref(),
        "ALLOT_ACK_WAIT",
        Duration::from_secs(30),
    );
    config
}

fn collector_config(a: &CollectorArgs, url: &str, s: &mut Settings<'_>) -> allot_collector::Config {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into());
    let node = s.string(a.node.as_deref(), "ALLOT_NODE", &hostname);
    if let Err(e) = allot_events::subject::validate_token("node name", &node) {
        s.problem(format!("--node / ALLOT_NODE: {e}"));
    }
    let pool = s.string(a.pool.as_deref(), "ALLOT_POOL", "default");
    if let Err(e) = allot_events::subject::validate_token("pool", &pool) {
        s.problem(format!("--pool / ALLOT_POOL: {e}"));
    }
    let source = match s
        .string(a.gpu_source.as_deref(), "ALLOT_GPU_SOURCE", "auto")
        .as_str()
    {
        "auto" => SourceChoice::Auto,
        "nvml" => SourceChoice::Nvml,
        "sim" | "simulated" => SourceChoice::Simulated,
        other => {
            s.problem(format!(
                "--gpu-source / ALLOT_GPU_SOURCE: {other:?}; use auto, nvml or sim"
            ));
            SourceChoice::Auto
        }
    };
    let default_executor = if source == SourceChoice::Simulated {
        "sim"
    } else {
        "process"
    };
    let data_dir = std::path::PathBuf::from(s.string(
        a.data_dir.as_deref(),
        "ALLOT_DATA_DIR",
        ".allot/collector",
    ));
    let speedup = s.parse(a.sim_speedup.as_deref(), "ALLOT_SIM_SPEEDUP", 60.0f64);
    if !(speedup.is_finite() && speedup > 0.0) {
        s.problem(format!(
            "--sim-speedup / ALLOT_SIM_SPEEDUP: {speedup}; use a number above 0"
        ));
    }
    let grace = s.duration(
        a.stop_grace.as_deref(),
        "ALLOT_STOP_GRACE",
        Duration::from_secs(30),
    );
    let runs = match s
        .string(a.executor.as_deref(), "ALLOT_EXECUTOR", default_executor)
        .as_str()
    {
        "off" => allot_collector::Runs::Off,
        "sim" | "simulated" => allot_collector::Runs::Simulated(allot_collector::SimulatedRuns {
            speedup,
            ..allot_collector::SimulatedRuns::default()
        }),
        "process" => allot_collector::Runs::Process(allot_collector::ProcessRuns {
            log_dir: data_dir.join("logs"),
            checkpoint_dir: data_dir.join("checkpoints"),
            grace,
        }),
        other => {
            s.problem(format!(
                "--executor / ALLOT_EXECUTOR: {other:?}; use process, sim or off"
            ));
            allot_collector::Runs::Off
        }
    };
    let executor = allot_collector::ExecutorConfig {
        runs,
        state: Some(data_dir.join("executor.db")),
        // One node per process: simulated progress stays with it.
        shared_checkpoints: None,
    };
    let model = s.string(a.sim_model.as_deref(), "ALLOT_SIM_MODEL", "H100");
    let model = model.parse::<GpuModel>().unwrap_or_else(|e| {
        s.problem(format!("--sim-model / ALLOT_SIM_MODEL: {e}"));
        GpuModel::H100
    });
    allot_collector::Config {
        nats_url: url.to_owned(),
        node,
        pool,
        rack: s.optional(a.rack.as_deref(), "ALLOT_RACK"),
        hostname,
        source,
        sim: SimSpec {
            gpus: s.parse(a.sim_gpus.as_deref(), "ALLOT_SIM_GPUS", 8),
            model,
            ..SimSpec::default()
        },
        heartbeat_interval: s.duration(
            a.heartbeat_interval.as_deref(),
            "ALLOT_HEARTBEAT_INTERVAL",
            Duration::from_secs(5),
        ),
        telemetry_interval: s.duration(
            a.telemetry_interval.as_deref(),
            "ALLOT_TELEMETRY_INTERVAL",
            Duration::from_secs(10),
        ),
        executor,
    }
}

/// The gateway's retention (`--retain`, `ALLOT_RETAIN`): a duration, or `forever` (`None`).
fn retention(flag: Option<&str>, s: &mut Settings<'_>) -> Option<Duration> {
    match s.raw(flag, "ALLOT_RETAIN") {
        Some((_, v)) if v.trim() == "forever" => None,
        _ => Some(s.duration(flag, "ALLOT_RETAIN", allot_gateway::RETAIN)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_is_a_duration_or_forever_and_a_bad_one_is_named() {
        let env = |value: Option<&'static str>| {
            move |k: &str| {
                (k == "ALLOT_RETAIN")
                    .then_some(value)
                    .flatten()
                    .map(str::to_owned)
            }
        };
        let unset = env(None);
        let mut s = Settings::new(&unset);
        assert_eq!(retention(None, &mut s), Some(allot_gateway::RETAIN));
        assert_eq!(
            retention(Some("90d"), &mut s),
            Some(Duration::from_secs(90 * 86_400))
        );
        assert_eq!(retention(Some("forever"), &mut s), None);
        assert!(s.finish().is_ok());
        let forever = env(Some("forever"));
        let mut s = Settings::new(&forever);
        assert_eq!(retention(None, &mut s), None);
        // The flag wins over the variable.
        assert_eq!(
            retention(Some("7d"), &mut s),
            Some(Duration::from_secs(7 * 86_400))
        );
        let bad = env(Some("a month"));
        let mut s = Settings::new(&bad);
        retention(None, &mut s);
        retention(Some("0s"), &mut s);
        let problems = s.finish().unwrap_err().0;
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with("ALLOT_RETAIN=\"a month\""),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("--retain=\"0s\": must be longer than zero"),
            "{problems:?}"
        );
    }
}
