//! The operator's side of remediation: `allot cordon NODE --reason R [--drain]`,
//! `allot uncordon NODE`, and `allot remediation log [--node N] [--json]`.
//!
//! A cordon is an `OperatorCordon` event on `allot.remediation.operator_cordon.<node>`, which
//! only `admin` may publish (the server enforces it). The allocator journals it as the
//! operator's hold on the node: nothing new is placed there (with `--drain`, what runs there
//! is stopped and requeued, checkpointing tasks first told to checkpoint); remediation leaves
//! the node alone and never lifts the cordon; `allot uncordon` lifts it, and the node takes
//! work again unless remediation or reachability holds it too.
//!
//! | exit | meaning |
//! |---|---|
//! | 0 | stored (and `log` printed) |
//! | 2 | a bad node name, a node the inventory does not know (when it answers), or a team's login (cordons are the operators') |

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use comfy_table::{ContentArrangement, Table, presets::NOTHING};

use allot_bus::Publisher;
use allot_bus::streams::names;
use allot_events::remediation::{ActionTaken, OperatorCordon};
use allot_events::{AnyEvent, RemediationEvent, subject};

use super::local;
use super::settings::Lookup;

/// Where and as whom: the flags every command here shares.
#[derive(Debug, Args)]
pub struct Target {
    /// NATS URL (ALLOT_NATS_URL; default: ./.allot/nats.url, then nats://127.0.0.1:4222).
    #[arg(long)]
    pub nats: Option<String>,
    /// Folder where `allot up` keeps its state (ALLOT_DATA_DIR).
    #[arg(long)]
    pub data_dir: Option<String>,
}

/// Flags of `allot cordon`.
#[derive(Debug, Args)]
pub struct CordonArgs {
    /// The node.
    pub node: String,
    /// Why, for the record (shown by `allot status` and `allot remediation log`).
    #[arg(long)]
    pub reason: String,
    /// Also move what runs there now: tasks are stopped (checkpointing ones told to
    /// checkpoint first) and requeued, gangs whole.
    #[arg(long)]
    pub drain: bool,
    /// Who cordons (ALLOT_SUBMITTER; default `$USER@<hostname>`).
    #[arg(long)]
    pub by: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

/// Flags of `allot uncordon`.
#[derive(Debug, Args)]
pub struct UncordonArgs {
    /// The node.
    pub node: String,
    /// Why, for the record.
    #[arg(long, default_value = "returned to service by an operator")]
    pub reason: String,
    /// Who uncordons (ALLOT_SUBMITTER; default `$USER@<hostname>`).
    #[arg(long)]
    pub by: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

/// `allot remediation …`.
#[derive(Debug, Subcommand)]
pub enum RemediationCommand {
    /// Every action remediation took and every operator's cordon, oldest first.
    Log(LogArgs),
}

/// Flags of `allot remediation log`.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Only this node's.
    #[arg(long)]
    pub node: Option<String>,
    /// One JSON object per line (the events' data, with `time` and `type`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// `allot cordon`.
pub async fn cordon(args: CordonArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let event = OperatorCordon {
        node: args.node.clone(),
        cordoned: true,
        drain: args.drain,
        reason: args.reason.clone(),
        by: who(args.by.as_deref(), env),
    };
    publish(event, &args.target, env).await
}

/// `allot uncordon`.
pub async fn uncordon(args: UncordonArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    let event = OperatorCordon {
        node: args.node.clone(),
        cordoned: false,
        drain: false,
        reason: args.reason.clone(),
        by: who(args.by.as_deref(), env),
    };
    publish(event, &args.target, env).await
}

fn who(by: Option<&str>, env: Lookup<'_>) -> String {
    by.map(str::to_owned)
        .or_else(|| env("ALLOT_SUBMITTER"))
        .unwrap_or_else(|| {
            let user = env("USER").unwrap_or_else(|| "someone".into());
            format!("{user}@{}", allot_events::node::hostname())
        })
}

async fn publish(
    event: OperatorCordon,
    target: &Target,
    env: Lookup<'_>,
) -> anyhow::Result<ExitCode> {
    let verb = if event.cordoned {
        "cordoned"
    } else {
        "uncordoned"
    };
    if let Err(e) = subject::validate_token("node name", &event.node) {
        eprintln!("allot: {e}; nothing was {verb}");
        return Ok(ExitCode::from(2));
    }
    let connection = local::connect_client(
        "allot-cordon",
        target.nats.as_deref(),
        target.data_dir.as_deref(),
        env,
        &format!("nothing was {verb}"),
    )
    .await?;
    if let Some(team) = &connection.team {
        eprintln!(
            "allot: cordons are the operators'; the login from {} is team {team}'s; nothing \
             was {verb}",
            connection.origin
        );
        return Ok(ExitCode::from(2));
    }
    // A cordon of a node the inventory does not know is most likely a typo: refused. Without
    // an inventory to ask, it is published unchecked (a node may be cordoned before it joins).
    if event.cordoned {
        match super::status::ask(&connection.client, Duration::from_secs(3)).await {
            Ok(status) if !status.nodes.iter().any(|n| n.name == event.node) => {
                let known: Vec<&str> = status.nodes.iter().map(|n| n.name.as_str()).collect();
                eprintln!(
                    "allot: the inventory knows no node {:?} (it knows {}); nothing was {verb}",
                    event.node,
                    if known.is_empty() {
                        "none yet".to_owned()
                    } else {
                        known.join(", ")
                    }
                );
                connection.client.drain().await.ok();
                return Ok(ExitCode::from(2));
            }
            Ok(_) => {}
            Err(e) => eprintln!("allot: {e:#}; cordoning {} unchecked", event.node),
        }
    }
    let publisher = Publisher::new(connection.client.clone(), "/allot/cli");
    let node = event.node.clone();
    let drain = event.drain;
    publisher
        .publish(RemediationEvent::OperatorCordon(event))
        .await
        .with_context(|| format!("publishing the cordon of {node}"))?;
    connection.client.drain().await.ok();
    let and = if drain {
        "; what runs there is moved"
    } else {
        ""
    };
    println!("{node} {verb}{and}");
    Ok(ExitCode::SUCCESS)
}

/// `allot remediation …`.
pub async fn remediation(cmd: RemediationCommand, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    match cmd {
        RemediationCommand::Log(args) => log(args, env).await,
    }
}

async fn log(args: LogArgs, env: Lookup<'_>) -> anyhow::Result<ExitCode> {
    if let Some(node) = &args.node
        && let Err(e) = subject::validate_token("node name", node)
    {
        eprintln!("allot: --node: {e}");
        return Ok(ExitCode::from(2));
    }
    let connection = local::connect_client(
        "allot-remediation-log",
        args.target.nats.as_deref(),
        args.target.data_dir.as_deref(),
        env,
        "no log was read",
    )
    .await?;
    let js = async_nats::jetstream::new(connection.client.clone());
    let filter = match &args.node {
        Some(node) => format!("allot.remediation.*.{node}"),
        None => subject::REMEDIATION_ALL.to_owned(),
    };
    let messages = super::costs::read(&js, names::REMEDIATION, &filter).await?;
    let mut table = Table::new();
    table
        .load_preset(NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(["TIME", "NODE", "GPU", "ACTION", "RULE", "TASKS", "WHY"]);
    let mut rows = 0;
    for m in messages {
        let Ok(envelope) = allot_events::decode(&m.payload) else {
            continue;
        };
        let time = envelope.time.format("%Y-%m-%d %H:%M:%S").to_string();
        let AnyEvent::Remediation(event) = &envelope.data else {
            continue;
        };
        rows += 1;
        if args.json {
            let mut value = serde_json::to_value(event)?;
            if let Some(obj) = value.as_object_mut() {
                obj.insert("time".into(), envelope.time.to_rfc3339().into());
                obj.insert("type".into(), envelope.ty.clone().into());
            }
            println!("{value}");
            continue;
        }
        match event {
            RemediationEvent::ActionTaken(a) => table.add_row(row(&time, a)),
            RemediationEvent::OperatorCordon(c) => table.add_row([
                time,
                c.node.clone(),
                "-".into(),
                format!(
                    "operator {}{}",
                    if c.cordoned { "cordon" } else { "uncordon" },
                    if c.drain { " + drain" } else { "" }
                ),
                "-".into(),
                "-".into(),
                format!("{} ({})", c.reason, c.by),
            ]),
        };
    }
    connection.client.drain().await.ok();
    if !args.json {
        if rows == 0 {
            println!("no remediation actions or cordons yet");
        } else {
            println!("{table}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn row(time: &str, a: &ActionTaken) -> [String; 7] {
    let tasks = if a.tasks.is_empty() {
        "-".to_owned()
    } else {
        a.tasks
            .iter()
            .map(|t| format!("{}/{}", t.workload, t.task))
            .collect::<Vec<_>>()
            .join(",")
    };
    [
        time.to_owned(),
        a.node.clone(),
        a.gpu.map_or("-".into(), |g| g.to_string()),
        a.action.as_str().to_owned(),
        a.rule.clone(),
        tasks,
        a.reason.clone(),
    ]
}
