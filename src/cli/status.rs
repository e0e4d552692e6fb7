//! `allot status`: nodes, GPUs, health and utilization, as the inventory sees them.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use comfy_table::{Table, presets::NOTHING};

use allot_events::query::{self, ClusterStatus};

use super::local;
use super::settings::Lookup;

/// Flags of `allot status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// NATS URL (ALLOT_NATS_URL; default: ./.allot/nats.url, then nats://127.0.0.1:4222).
    #[arg(long)]
    pub nats: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Folder where `allot up` keeps its state (ALLOT_DATA_DIR).
    #[arg(long)]
    pub data_dir: Option<String>,
}

/// Asks the inventory and prints its answer.
pub async fn status(args: StatusArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let (url, origin) = local::instance_url(args.nats.as_deref(), args.data_dir.as_deref(), env)?;
    let status = fetch(&url, &origin).await.context("asking the inventory")?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &status)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", render(&status))?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn fetch(url: &str, origin: &str) -> anyhow::Result<ClusterStatus> {
    let client = local::connect_url("allot-status", url, origin).await?;
    ask(&client, Duration::from_secs(5)).await
}

/// The cluster as the inventory answers for it within `wait`, or why it did not.
pub(super) async fn ask(
    client: &async_nats::Client,
    wait: Duration,
) -> anyhow::Result<ClusterStatus> {
    let reply = tokio::time::timeout(
        wait,
        client.request(query::STATUS_SUBJECT, bytes::Bytes::new()),
    )
    .await
    .with_context(|| format!("the inventory did not answer within {} s", wait.as_secs()))?;
    let reply = match reply {
        Ok(reply) => reply,
        Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
            bail!("the inventory service is not running")
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(headers) = &reply.headers
        && let Some(error) = headers.get("Nats-Service-Error")
    {
        bail!("the inventory answered with an error: {error}");
    }
    serde_json::from_slice(&reply.payload).context("decoding the inventory's answer")
}

/// The two tables `allot status` prints: nodes, then GPUs.
pub fn render(status: &ClusterStatus) -> String {
    if status.nodes.is_empty() {
        return "no nodes registered yet\n".into();
    }
    let mut nodes = Table::new();
    nodes.load_preset(NOTHING).set_header([
        "NODE",
        "POOL",
        "RACK",
        "STATE",
        "SOURCE",
        "GPUS",
        "HEALTHY",
        "UTIL",
        "GPU MEM USED",
        "LAST HEARTBEAT",
    ]);
    for n in &status.nodes {
        let healthy = n.gpus.iter().filter(|g| g.health == "healthy").count();
        let utils: Vec<u32> = n
            .gpus
            .iter()
            .filter_map(|g| g.utilization_pct)
            .map(u32::from)
            .collect();
        let util = if utils.is_empty() {
            "-".into()
        } else {
            format!("{}%", utils.iter().sum::<u32>() / utils.len() as u32)
        };
        let used: u64 = n.gpus.iter().filter_map(|g| g.memory_used_mib).sum();
        let total: u64 = n.gpus.iter().filter_map(|g| g.memory_total_mib).sum();
        let models: Vec<&str> = n.gpus.iter().filter_map(|g| g.model.as_deref()).collect();
        let gpus = match models.first() {
            Some(m) if models.iter().all(|x| x == m) => format!("{}×{m}", n.gpus.len()),
            _ => n.gpus.len().to_string(),
        };
        let ago = n
            .last_heartbeat_at
            .map(|t| format!("{}s ago", (status.at - t).num_seconds().max(0)))
            .unwrap_or_else(|| "never".into());
        nodes.add_row([
            n.name.clone(),
            n.pool.clone(),
            n.rack.clone().unwrap_or_else(|| "-".into()),
            n.state.clone(),
            n.gpu_source.clone(),
            gpus,
            format!("{healthy}/{}", n.gpus.len()),
            util,
            format!(
                "{:.1}/{:.1} GiB",
                used as f64 / 1024.0,
                total as f64 / 1024.0
            ),
            ago,
        ]);
    }
    let mut gpus = Table::new();
    gpus.load_preset(NOTHING).set_header([
        "NODE", "GPU", "MODEL", "HEALTH", "UTIL", "MEM USED", "TEMP", "POWER", "HELD BY", "UUID",
    ]);
    for n in &status.nodes {
        for g in &n.gpus {
            let health = match (&g.out_of_service, g.health_reason.is_empty()) {
                (Some(why), _) => format!("out of service ({why})"),
                (None, true) => g.health.clone(),
                (None, false) => format!("{} ({})", g.health, g.health_reason),
            };
            gpus.add_row([
                n.name.clone(),
                g.index.to_string(),
                g.model.clone().unwrap_or_else(|| "?".into()),
                health,
                g.utilization_pct
                    .map(|u| format!("{u}%"))
                    .unwrap_or_else(|| "-".into()),
                match (g.memory_used_mib, g.memory_total_mib) {
                    (Some(u), Some(t)) => format!("{u}/{t} MiB"),
                    _ => "-".into(),
                },
                g.temperature_c
                    .map(|t| format!("{t}°C"))
                    .unwrap_or_else(|| "-".into()),
                g.power_mw
                    .map(|p| format!("{}W", p / 1000))
                    .unwrap_or_else(|| "-".into()),
                held_by(g),
                g.uuid.clone(),
            ]);
        }
    }
    let total: usize = status.gpu_count();
    let healthy = status
        .nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .filter(|g| g.health == "healthy")
        .count();
    // Why each node that is not ready is held: the operator's words or remediation's rule.
    let held: Vec<String> = status
        .nodes
        .iter()
        .filter(|n| !n.reason.is_empty())
        .map(|n| format!("  {} {}: {}", n.name, n.state, n.reason))
        .collect();
    let held = if held.is_empty() {
        String::new()
    } else {
        format!("\n\nnot ready:\n{}", held.join("\n"))
    };
    format!(
        "{} nodes, {total} GPUs ({healthy} healthy)\n\n{nodes}{held}\n\n{gpus}\n",
        status.nodes.len()
    )
}

/// `train-eval-3f9a2c71d0/train-0 (lease 7, team vision)`, one per run on the GPU, a share
/// when it is one (`… 250m`); `-` when nothing runs on it.
fn held_by(g: &allot_events::query::GpuStatus) -> String {
    if g.held_by.is_empty() {
        return "-".into();
    }
    g.held_by
        .iter()
        .map(|h| {
            let share = if h.milli < 1000 {
                format!(" {}m", h.milli)
            } else {
                String::new()
            };
            let team = if h.team.is_empty() {
                String::new()
            } else {
                format!(", team {}", h.team)
            };
            format!(
                "{}/{} (lease {}{team}){share}",
                h.workload, h.task, h.lease.0
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
