//! The REST API under `/api/v1`, its OpenAPI document, and the probes.
//!
//! [`app`] builds the router from an [`AppState`], so tests drive it with `oneshot` and the
//! service serves it on a listener. Every handler first learns who calls ([`Caller`], from the
//! bearer token), then reads only what that caller may see: a member's or viewer's listings
//! are its team's, another team's object answers 404 as if it did not exist, and a role
//! without the right answers 403. Errors are RFC 9457 problems ([`Problem`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use allot_bus::{PublishError, Published, Publisher};
use async_nats::jetstream::message::PublishMessage;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};

use allot_events::AccessEvent;
use allot_events::access::TokenRole;
use allot_events::workload::WorkloadAborted;
use allot_store::rusqlite::{Connection, OptionalExtension, params};
use allot_workload::{ClusterShape, Format, NodeShape, TeamsConfig};

use crate::db::Db;
use crate::mirror::{Allocation, KpiPoint, Mirror, QueueEntry};
use crate::problem::{Problem, SpecError};
use crate::samples::{Demand, Samples};
use crate::token::{Caller, Known, Tokens};

/// The `source` of the events the gateway publishes.
pub const SOURCE: &str = "/allot/gateway";

/// What the API publishes with.
#[derive(Debug, Clone)]
pub struct Bus {
    /// For look-back: reading the journals.
    pub js: async_nats::jetstream::Context,
    /// Acknowledged publishing, as every service does it.
    pub publisher: Publisher,
}

impl Bus {
    /// Publishing and reading on `client`.
    pub fn new(client: async_nats::Client) -> Self {
        Self {
            js: async_nats::jetstream::new(client.clone()),
            publisher: Publisher::new(client, SOURCE),
        }
    }
}

/// How old the queue and nodes views may be before a read starts rebuilding them (see
/// [`AppState::snapshot`]).
pub const VIEW_MAX_AGE: chrono::TimeDelta = chrono::TimeDelta::seconds(1);

/// How old the views may be and still be served while they are rebuilt; older, a read waits
/// for the rebuild.
pub const VIEW_STALE_LIMIT: chrono::TimeDelta = chrono::TimeDelta::seconds(3);

/// The live views the busiest endpoints answer from, rebuilt when read (see
/// [`AppState::snapshot`]).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Every waiting task, per pool in queue order.
    pub queue: Vec<QueueEntry>,
    /// Every node with its GPUs and what runs on them.
    pub nodes: Vec<NodeView>,
    /// Each node as JSON, as an admin or operator sees it, and as anyone sees it with every
    /// allocation anonymised (what a member or viewer sees of a node none of its team's work
    /// runs on): serialised once per rebuild, not once per request.
    pub nodes_json: Vec<(Bytes, Bytes)>,
    /// When it was built.
    pub built: Option<DateTime<Utc>>,
}

/// `node` with every allocation but `team`'s anonymised (`None`: every one).
fn redacted(node: &NodeView, team: Option<&str>) -> NodeView {
    let mut node = node.clone();
    for g in &mut node.gpus {
        for a in &mut g.allocations {
            if team.is_none() || a.team.as_deref() != team {
                *a = GpuAllocation {
                    task_id: None,
                    workload: None,
                    task: None,
                    team: None,
                    milli: a.milli,
                };
            }
        }
    }
    node
}

/// Everything the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    db: Arc<Db>,
    tokens: RwLock<Tokens>,
    mirror: Arc<Mutex<Mirror>>,
    samples: Arc<Mutex<Samples>>,
    /// Whether the nodes view wants the samples followed.
    demand: Arc<Demand>,
    snapshot: RwLock<Arc<Snapshot>>,
    /// Held while the live views are rebuilt, so that readers who find them old at the same
    /// time wait for one rebuild instead of each making their own.
    rebuilding: Arc<tokio::sync::Mutex<()>>,
    bus: Option<Bus>,
    teams: Option<TeamsConfig>,
    /// The fleet's shape for checking submissions, at the fleet's version
    /// ([`crate::model::fleet_version`]): read again only when a node registers.
    shape: Mutex<Option<(i64, Arc<ClusterShape>)>>,
}

impl AppState {
    /// The state over the read model at `db`, the journals' `mirror` and (to publish) `bus`.
    pub fn new(
        db: Arc<Db>,
        mirror: Arc<Mutex<Mirror>>,
        bus: Option<Bus>,
        teams: Option<TeamsConfig>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                db,
                tokens: RwLock::new(Tokens::default()),
                mirror,
                samples: Arc::default(),
                demand: Arc::default(),
                snapshot: RwLock::new(Arc::new(Snapshot::default())),
                rebuilding: Arc::default(),
                bus,
                teams,
                shape: Mutex::default(),
            }),
        }
    }

    /// Every node's latest GPU readings, which [`crate::samples::follow`] keeps current.
    pub fn samples(&self) -> Arc<Mutex<Samples>> {
        self.inner.samples.clone()
    }

    /// Whether the nodes view wants the readings followed (see [`crate::samples`]).
    pub fn sample_demand(&self) -> Arc<Demand> {
        self.inner.demand.clone()
    }

    /// Accepts a token known by its hash (the bootstrap admin's, or tests').
    pub fn add_token(&self, sha256: String, known: Known) {
        self.inner
            .tokens
            .write()
            .expect("tokens lock")
            .insert(sha256, known);
    }

    /// Reloads the tokens from the read model (issued and revoked since), or only the one
    /// with hash `sha256`.
    pub async fn reload_tokens(&self, sha256: Option<String>) -> Result<(), String> {
        let rows = self.inner.db.read(move |c| read_tokens(c, sha256)).await?;
        let mut tokens = self.inner.tokens.write().expect("tokens lock");
        for (sha, known) in rows {
            tokens.insert(sha, known);
        }
        Ok(())
    }

    /// Rebuilds the live views from the read model and the mirror.
    pub async fn refresh(&self) -> Result<(), String> {
        // The GPU readings are followed while views are built (a follower that was idle
        // starts, and this waits for every node's last sample).
        self.inner.demand.want().await;
        let now = Utc::now();
        let (queue, allocations, schedulable) = {
            let mirror = self.inner.mirror.lock().expect("mirror lock");
            (
                mirror.queue(now),
                mirror.allocations(),
                mirror.schedulable(),
            )
        };
        let mut nodes = self.inner.db.read(read_nodes).await?;
        self.inner
            .samples
            .lock()
            .expect("samples lock")
            .fill(&mut nodes);
        let mut by_node: BTreeMap<&str, Vec<&Allocation>> = BTreeMap::new();
        for a in &allocations {
            by_node.entry(&a.node).or_default().push(a);
        }
        for n in &mut nodes {
            n.schedulable = schedulable.get(&n.name).copied();
            for a in by_node.get(n.name.as_str()).into_iter().flatten() {
                for [gpu, milli] in &a.gpus {
                    if let Some(g) = n.gpus.iter_mut().find(|g| g.index == *gpu) {
                        g.allocations.push(GpuAllocation {
                            task_id: Some(a.task_id),
                            workload: Some(a.workload.clone()),
                            task: Some(a.task.clone()),
                            team: Some(a.team.clone()),
                            milli: *milli,
                        });
                    }
                }
            }
        }
        let nodes_json = nodes
            .iter()
            .map(|n| {
                let full = serde_json::to_vec(n).unwrap_or_default();
                let anonymous = serde_json::to_vec(&redacted(n, None)).unwrap_or_default();
                (Bytes::from(full), Bytes::from(anonymous))
            })
            .collect();
        *self.inner.snapshot.write().expect("snapshot lock") = Arc::new(Snapshot {
            queue,
            nodes,
            nodes_json,
            built: Some(now),
        });
        Ok(())
    }

    /// The live views, built when someone reads them rather than every second whether anyone
    /// does or not (at 2,000 nodes a rebuild reads every node and serializes each twice).
    /// Views older than [`VIEW_MAX_AGE`] are served as they are while one rebuild runs in the
    /// background, so a steady reader never waits for one; views older than
    /// [`VIEW_STALE_LIMIT`] (nobody read them for a while) are rebuilt before answering.
    /// Should a rebuild fail, the last views are served; their `as_of` says how old they are.
    async fn snapshot(&self) -> Arc<Snapshot> {
        let age = |s: &Snapshot| s.built.map(|b| Utc::now() - b);
        let current = self.last_snapshot();
        match age(&current) {
            Some(age) if age < VIEW_MAX_AGE => return current,
            Some(age) if age < VIEW_STALE_LIMIT => {
                if let Ok(rebuilding) = self.inner.rebuilding.clone().try_lock_owned() {
                    let state = self.clone();
                    tokio::spawn(async move {
                        state.rebuild().await;
                        drop(rebuilding);
                    });
                }
                return current;
            }
            _ => {}
        }
        let _rebuilding = self.inner.rebuilding.lock().await;
        // Whoever held the lock may have just rebuilt them.
        let current = self.last_snapshot();
        if age(&current).is_some_and(|age| age < VIEW_MAX_AGE) {
            return current;
        }
        self.rebuild().await;
        self.last_snapshot()
    }

    async fn rebuild(&self) {
        if let Err(e) = self.refresh().await {
            tracing::warn!(error = %e, "rebuilding the live views");
        }
    }

    fn last_snapshot(&self) -> Arc<Snapshot> {
        self.inner.snapshot.read().expect("snapshot lock").clone()
    }

    /// The read model.
    pub fn db(&self) -> &Arc<Db> {
        &self.inner.db
    }
}

/// `Query`, with a malformed query answered as a problem.
#[derive(Debug, axum::extract::FromRequestParts)]
#[from_request(via(Query), rejection(Problem))]
pub struct ApiQuery<T>(pub T);

/// `Path`, with a malformed path answered as a problem.
#[derive(Debug, axum::extract::FromRequestParts)]
#[from_request(via(Path), rejection(Problem))]
pub struct ApiPath<T>(pub T);

/// `Json`, with a malformed body answered as a problem.
#[derive(Debug, axum::extract::FromRequest)]
#[from_request(via(Json), rejection(Problem))]
pub struct ApiJson<T>(pub T);

/// The tokens in the read model (revoked ones included), or only the one with `sha256`.
fn read_tokens(
    c: &Connection,
    sha256: Option<String>,
) -> allot_store::rusqlite::Result<Vec<(String, Known)>> {
    let mut stmt = c.prepare_cached(
        "SELECT sha256, token_id, team, role, expires, revoked_at FROM tokens \
         WHERE ?1 IS NULL OR sha256 = ?1",
    )?;
    let rows = stmt.query_map([sha256], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, Option<String>>(4)?,
            r.get::<_, Option<String>>(5)?.is_some(),
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (sha, token_id, team, role, expires, revoked) = row?;
        // A role this build does not know grants nothing.
        let Some(role) = TokenRole::parse(&role) else {
            continue;
        };
        let expires = expires
            .and_then(|e| DateTime::parse_from_rfc3339(&e).ok())
            .map(|e| e.with_timezone(&Utc));
        out.push((
            sha,
            Known {
                token_id,
                team,
                role,
                expires,
                revoked,
            },
        ));
    }
    Ok(out)
}

fn internal(e: String) -> Problem {
    tracing::error!(error = %e, "request failed");
    Problem::unavailable(e)
}

// ---------------------------------------------------------------------------------------------
// Authentication

fn bearer(parts: &Parts) -> Option<String> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}

fn query_token(parts: &Parts) -> Option<String> {
    // Only the event stream takes its token from the query: a browser's EventSource cannot
    // send headers. Everything else needs the header, so tokens stay out of access logs.
    if !parts.uri.path().ends_with("/events") {
        return None;
    }
    parts.uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "access_token").then(|| v.to_owned())
    })
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Problem> {
        let Some(token) = bearer(parts).or_else(|| query_token(parts)) else {
            return Err(Problem::unauthorized(
                "no bearer token: send `Authorization: Bearer <token>` (`allot token create`, \
                 or .allot/admin.token under `allot up`)",
            ));
        };
        let now = Utc::now();
        let found = state
            .inner
            .tokens
            .read()
            .expect("tokens lock")
            .authenticate(&token, now);
        if let Some(caller) = found {
            return Ok(caller);
        }
        // Perhaps issued a moment ago: look at the read model once before refusing.
        state
            .reload_tokens(Some(crate::token::sha256_hex(&token)))
            .await
            .map_err(internal)?;
        if let Some(caller) = state
            .inner
            .tokens
            .read()
            .expect("tokens lock")
            .authenticate(&token, now)
        {
            return Ok(caller);
        }
        Err(Problem::unauthorized(
            "the bearer token is not one this gateway accepts (unknown, revoked or expired)",
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Types

/// One workload in a listing.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkloadSummary {
    /// Its id.
    pub id: String,
    /// Its team.
    pub team: String,
    /// Its name.
    pub name: String,
    /// Its project, if given.
    pub project: Option<String>,
    /// Who submitted it.
    pub submitter: String,
    /// When it was submitted.
    pub submitted: String,
    /// running | succeeded | failed | aborted.
    pub state: String,
    /// Why it ended so, when it did not succeed.
    pub reason: Option<String>,
    /// When it ended.
    pub finished: Option<String>,
    /// Its tasks by state.
    pub tasks: BTreeMap<String, u32>,
}

/// A page of workloads.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkloadPage {
    /// Newest first.
    pub items: Vec<WorkloadSummary>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// One task of a workload.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskView {
    /// Its name.
    pub name: String,
    /// The tasks it waits for.
    pub after: Vec<String>,
    /// pending | waiting | running | succeeded | failed | cancelled | preempted.
    pub state: String,
    /// The current attempt (from 1).
    pub attempt: u32,
    /// The current attempt's id (`GET /tasks/{id}/explain`).
    pub task_id: Option<u64>,
    /// Its pool.
    pub pool: Option<String>,
    /// Where it runs or ran last.
    pub node: Option<String>,
    /// Why it waits, failed or was cancelled.
    pub reason: Option<String>,
    /// When it is expected to start, while it waits (ms since the epoch).
    pub eta_ms: Option<i64>,
    /// The predicted run time, ms.
    pub predicted_ms: Option<i64>,
}

/// A workload with its DAG and each task's state.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkloadDetail {
    /// The workload.
    #[serde(flatten)]
    pub summary: WorkloadSummary,
    /// Its tasks, in the spec's order.
    pub dag: Vec<TaskView>,
    /// The spec as submitted.
    #[schema(value_type = Object)]
    pub spec: serde_json::Value,
}

/// A submission's outcome.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Submitted {
    /// The workload's id.
    pub workload_id: String,
    /// The same spec and run id were submitted before: nothing new was stored.
    pub duplicate: bool,
    /// Where WORKLOADS stored it.
    pub stream_sequence: u64,
}

/// Submit options (the body is the spec, YAML or JSON).
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SubmitParams {
    /// The CI run (or other attempt): a spec submitted again with the same run id is the same
    /// workload.
    pub run_id: Option<String>,
    /// What makes two submissions the same one (default: the spec and run id's hash).
    pub idempotency_key: Option<String>,
}

/// An abort.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct AbortRequest {
    /// Why (kept in the event and shown to the team).
    #[schema(pattern = "\\S")]
    pub reason: String,
    /// Abort only this task and what waits for it.
    #[serde(default)]
    pub task: Option<String>,
}

/// An abort, as published.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AbortAccepted {
    /// The abort event's id; the planner answers it (`abort_answered` on the event stream).
    pub event_id: String,
    /// The workload.
    pub workload_id: String,
    /// The task, if one.
    pub task: Option<String>,
}

/// One fact of the decision log.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DecisionView {
    /// Its id (ascending in log order).
    pub id: i64,
    /// The pool.
    pub pool: String,
    /// The journal entry.
    pub entry: i64,
    /// When (ms since the epoch).
    pub at_ms: i64,
    /// submitted | granted | waiting | preempted | released | finished | requeued | withdrawn | predicted | reserved | rejected.
    pub kind: String,
    /// The attempt it concerns.
    pub task_id: Option<i64>,
    /// Its team.
    pub team: Option<String>,
    /// Its workload.
    pub workload: Option<String>,
    /// Its name.
    pub task: Option<String>,
    /// The rest (reason, ETA, nodes, lease …).
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

/// A page of the decision log.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DecisionPage {
    /// Newest first.
    pub items: Vec<DecisionView>,
    /// Pass as `cursor` for the next (older) page.
    pub next_cursor: Option<String>,
}

/// A task's history, from the decision log.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Explanation {
    /// The attempt.
    pub task_id: u64,
    /// Its workload.
    pub workload: Option<String>,
    /// Its name.
    pub task: Option<String>,
    /// Its team.
    pub team: String,
    /// Where it waits now, if it does.
    pub waiting: Option<QueueEntry>,
    /// Every fact about it, oldest first.
    pub history: Vec<DecisionView>,
}

/// A page of the queue.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QueuePage {
    /// In queue order.
    pub items: Vec<QueueEntry>,
    /// Waiting tasks in the caller's view.
    pub total: usize,
    /// Pass as `cursor` for the next page.
    pub next_cursor: Option<String>,
    /// When the view was built.
    pub as_of: Option<DateTime<Utc>>,
}

/// A page of the nodes.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NodePage {
    /// By name.
    pub items: Vec<NodeView>,
    /// Nodes in all.
    pub total: usize,
    /// Pass as `cursor` for the next page.
    pub next_cursor: Option<String>,
    /// When the view was built.
    pub as_of: Option<DateTime<Utc>>,
}

/// Paging of `GET /nodes`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct NodeQuery {
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// Where the previous page ended (its `next_cursor`).
    #[param(pattern = "^[0-9]{1,18}$")]
    pub cursor: Option<String>,
}

/// A share of a GPU held by a task.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GpuAllocation {
    /// The attempt (absent: another team's work).
    pub task_id: Option<u64>,
    /// Its workload.
    pub workload: Option<String>,
    /// Its name.
    pub task: Option<String>,
    /// Its team.
    pub team: Option<String>,
    /// Milli-GPU held.
    pub milli: u32,
}

/// One GPU.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GpuView {
    /// Its index on the node.
    pub index: u32,
    /// Its model.
    pub model: String,
    /// Its memory, MiB.
    pub memory_mib: i64,
    /// healthy | degraded | unhealthy.
    pub health: String,
    /// False while remediation has it out of service.
    pub in_service: bool,
    /// Last utilization, %.
    pub utilization_pct: Option<i64>,
    /// Last temperature, °C.
    pub temperature_c: Option<i64>,
    /// Last memory used, MiB.
    pub memory_used_mib: Option<i64>,
    /// Last power draw, mW.
    pub power_mw: Option<i64>,
    /// When it was read.
    pub sampled_at: Option<String>,
    /// Who holds it.
    pub allocations: Vec<GpuAllocation>,
}

/// One node.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NodeView {
    /// Its name.
    pub name: String,
    /// Its pool.
    pub pool: String,
    /// Its host.
    pub hostname: String,
    /// ready | unreachable | soft-cordoned | cordoned | drained.
    pub state: String,
    /// Why it is not ready.
    pub reason: Option<String>,
    /// Whether the allocator places work on it now (absent: not in any journal yet).
    pub schedulable: Option<bool>,
    /// Its last heartbeat.
    pub last_heartbeat: Option<String>,
    /// Its GPUs.
    pub gpus: Vec<GpuView>,
}

fn read_nodes(c: &Connection) -> allot_store::rusqlite::Result<Vec<NodeView>> {
    let mut nodes: Vec<NodeView> = c
        .prepare(
            "SELECT name, pool, hostname, reachable, state, state_reason, operator_hold, \
             last_heartbeat FROM nodes ORDER BY name",
        )?
        .query_map([], |r| {
            let reachable: bool = r.get(3)?;
            let state: String = r.get(4)?;
            let operator: Option<String> = r.get(6)?;
            let (state, reason) = if !reachable {
                ("unreachable".to_owned(), Some("no heartbeat".to_owned()))
            } else if let Some(why) = operator {
                ("cordoned".to_owned(), Some(format!("operator: {why}")))
            } else {
                (state, r.get(5)?)
            };
            Ok(NodeView {
                name: r.get(0)?,
                pool: r.get(1)?,
                hostname: r.get(2)?,
                state,
                reason,
                schedulable: None,
                last_heartbeat: r.get(7)?,
                gpus: Vec::new(),
            })
        })?
        .collect::<Result<_, _>>()?;
    let mut stmt = c.prepare(
        "SELECT node, idx, model, memory_mib, health, in_service FROM gpus ORDER BY node, idx",
    )?;
    let gpus = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            GpuView {
                index: r.get(1)?,
                model: r.get(2)?,
                memory_mib: r.get(3)?,
                health: r.get(4)?,
                in_service: r.get(5)?,
                utilization_pct: None,
                temperature_c: None,
                memory_used_mib: None,
                power_mw: None,
                sampled_at: None,
                allocations: Vec::new(),
            },
        ))
    })?;
    let index: BTreeMap<String, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), i))
        .collect();
    for g in gpus {
        let (node, gpu) = g?;
        if let Some(&i) = index.get(&node) {
            nodes[i].gpus.push(gpu);
        }
    }
    Ok(nodes)
}

/// Per team: what it was charged.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TeamCost {
    /// The team.
    pub team: String,
    /// The currency.
    pub currency: String,
    /// The total, in micro-units (exactly the sum of its cost events).
    pub amount_micros: i64,
    /// Per workload, micro-units.
    pub workloads: BTreeMap<String, i64>,
}

/// Costs.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CostReport {
    /// Per team.
    pub teams: Vec<TeamCost>,
}

/// A budget, as billing last announced it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BudgetView {
    /// The team.
    pub team: String,
    /// The period (2026-11, or a day).
    pub period: String,
    /// within | warning | exceeded.
    pub level: String,
    /// Spent, micro-units.
    pub spent_micros: i64,
    /// The budget, micro-units.
    pub budget_micros: i64,
    /// The currency.
    pub currency: String,
}

/// A pool's capacity now.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PoolUsage {
    /// The pool.
    pub pool: String,
    /// GPU capacity, milli-GPU.
    pub capacity_milli: u64,
    /// Allocated, milli-GPU.
    pub allocated_milli: u64,
    /// Waiting tasks.
    pub waiting: usize,
}

/// The cluster's KPIs.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Kpis {
    /// Now, per pool.
    pub pools: Vec<PoolUsage>,
    /// Per minute, oldest first.
    pub series: Vec<KpiPoint>,
    /// Workloads by state (the caller's view).
    pub workloads: BTreeMap<String, u32>,
}

/// The cluster and queue as they were.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LookBack {
    /// The moment asked for.
    pub at: DateTime<Utc>,
    /// Capacity then, per pool.
    pub pools: Vec<PoolUsage>,
    /// What ran where then.
    pub allocations: Vec<Allocation>,
    /// The queue then.
    pub queue: Vec<QueueEntry>,
}

/// A token to issue.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct TokenRequest {
    /// The team it acts for.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub team: String,
    /// admin | operator | member | viewer.
    #[schema(pattern = "^(admin|operator|member|viewer)$")]
    pub role: String,
    /// What it is for.
    #[serde(default)]
    pub description: String,
    /// When it stops being accepted (RFC 3339; left out: never).
    #[serde(default, deserialize_with = "some_time")]
    #[schema(value_type = String, format = DateTime)]
    pub expires: Option<DateTime<Utc>>,
}

/// A time that, when given, is one: `null` is not a time (leave the field out instead).
fn some_time<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
    DateTime::<Utc>::deserialize(d).map(Some)
}

/// A token as listed: never its secret, nor its hash.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokenView {
    /// Its public id (the first 12 hex digits of its hash).
    pub token_id: String,
    /// The team it acts for.
    pub team: String,
    /// Its role.
    pub role: String,
    /// What it is for.
    pub description: String,
    /// Who issued it.
    pub issued_by: String,
    /// When.
    pub issued_at: String,
    /// When it stops being accepted.
    pub expires: Option<String>,
    /// When it was revoked.
    pub revoked_at: Option<String>,
}

/// A token, shown once.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IssuedToken {
    /// The secret: shown only now.
    pub token: String,
    /// Its public id.
    pub token_id: String,
    /// Its team.
    pub team: String,
    /// Its role.
    pub role: String,
}

/// Filters and paging of `GET /workloads`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WorkloadQuery {
    /// Only this team's (admins and operators; others always see their own).
    pub team: Option<String>,
    /// Only in this state (`pending`, `running`, `succeeded`, `failed`, `aborted`).
    pub state: Option<String>,
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// Where the previous page ended (its `next_cursor`).
    #[param(pattern = "^[0-9]{1,18}$")]
    pub cursor: Option<String>,
}

/// Filters and paging of `GET /decisions`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DecisionQuery {
    /// Only this team's (admins and operators; others always see their own).
    pub team: Option<String>,
    /// Only about this attempt.
    pub task: Option<u64>,
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// Where the previous page ended (its `next_cursor`).
    #[param(pattern = "^[0-9]{1,18}$")]
    pub cursor: Option<String>,
}

/// Filters and paging of `GET /queue`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct QueueQuery {
    /// Only this team's (admins and operators; others always see their own).
    pub team: Option<String>,
    /// Only this pool.
    pub pool: Option<String>,
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// Where the previous page ended (its `next_cursor`).
    #[param(pattern = "^[0-9]{1,18}$")]
    pub cursor: Option<String>,
}

/// The team filter of `GET /costs` and `GET /budgets`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TeamQuery {
    /// Only this team's (admins and operators; others always see their own).
    pub team: Option<String>,
}

/// A page's size and start, checked: `limit` within 1..=1000 (default 100), `cursor` one this
/// API gave.
fn page(limit: Option<u32>, cursor: Option<&str>) -> Result<(usize, Option<i64>), Problem> {
    let limit = match limit {
        None => 100,
        Some(n @ 1..=1000) => n as usize,
        Some(n) => {
            return Err(Problem::bad_request(format!(
                "limit {n} is out of range: ask for 1 to 1000"
            )));
        }
    };
    let cursor =
        match cursor {
            None => None,
            Some(c) => Some(c.parse::<i64>().map_err(|_| {
                Problem::bad_request(format!("cursor {c:?} is not one this API gave"))
            })?),
        };
    Ok((limit, cursor))
}

/// When to look back to.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LookBackParams {
    /// An RFC 3339 time.
    pub at: DateTime<Utc>,
}

// ---------------------------------------------------------------------------------------------
// Handlers

#[utoipa::path(get, path = "/api/v1/workloads", params(WorkloadQuery),
    responses((status = 200, body = WorkloadPage), (status = 401, body = Problem)),
    security(("bearer" = [])))]
async fn list_workloads(
    caller: Caller,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<WorkloadQuery>,
) -> Result<Json<WorkloadPage>, Problem> {
    let team = caller.scope(q.team.as_deref()).map(str::to_owned);
    let (limit, cursor) = page(q.limit, q.cursor.as_deref())?;
    let cursor = cursor.unwrap_or(i64::MAX);
    let wanted = q.state.clone();
    let items = state
        .inner
        .db
        .read(move |c| {
            // Only the filters given, so that a team's page is read through `workloads_team`
            // (`?2 IS NULL OR …` would walk every team's workloads back from the newest).
            let mut stmt = c.prepare_cached(&format!(
                "SELECT id, team, name, project, submitter, submitted_at, state, reason, \
                 finished_at, seq FROM workloads WHERE seq < ?1{}{} ORDER BY seq DESC LIMIT ?4",
                if team.is_some() { " AND team = ?2" } else { "" },
                if wanted.is_some() {
                    " AND state = ?3"
                } else {
                    ""
                },
            ))?;
            let rows = stmt.query_map(params![cursor, team, wanted, limit as i64 + 1], |r| {
                Ok((summary_row(r)?, r.get::<_, i64>(9)?))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (mut s, seq) = row?;
                s.tasks = task_counts(c, &s.id)?;
                out.push((s, seq));
            }
            Ok(out)
        })
        .await
        .map_err(internal)?;
    let next_cursor = (items.len() > limit).then(|| items[limit - 1].1.to_string());
    Ok(Json(WorkloadPage {
        items: items.into_iter().take(limit).map(|(s, _)| s).collect(),
        next_cursor,
    }))
}

fn summary_row(
    r: &allot_store::rusqlite::Row<'_>,
) -> allot_store::rusqlite::Result<WorkloadSummary> {
    Ok(WorkloadSummary {
        id: r.get(0)?,
        team: r.get(1)?,
        name: r.get(2)?,
        project: r.get(3)?,
        submitter: r.get(4)?,
        submitted: r.get(5)?,
        state: r.get(6)?,
        reason: r.get(7)?,
        finished: r.get(8)?,
        tasks: BTreeMap::new(),
    })
}

fn task_counts(
    c: &Connection,
    workload: &str,
) -> allot_store::rusqlite::Result<BTreeMap<String, u32>> {
    let mut stmt =
        c.prepare_cached("SELECT state, COUNT(*) FROM tasks WHERE workload = ?1 GROUP BY state")?;
    stmt.query_map([workload], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect()
}

#[utoipa::path(get, path = "/api/v1/workloads/{id}", params(("id" = String, Path, description = "The workload's id")),
    responses((status = 200, body = WorkloadDetail), (status = 401, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
async fn get_workload(
    caller: Caller,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<WorkloadDetail>, Problem> {
    let wanted = id.clone();
    let found = state
        .inner
        .db
        .read(move |c| {
            let Some((mut summary, spec)) = c
                .query_row(
                    "SELECT id, team, name, project, submitter, submitted_at, state, reason, \
                     finished_at, spec FROM workloads WHERE id = ?1",
                    [&wanted],
                    |r| Ok((summary_row(r)?, r.get::<_, String>(9)?)),
                )
                .optional()?
            else {
                return Ok(None);
            };
            summary.tasks = task_counts(c, &wanted)?;
            let mut stmt = c.prepare(
                "SELECT name, after, state, attempt, task_id, pool, node, reason, eta_ms, \
                 predicted_ms FROM tasks WHERE workload = ?1 ORDER BY position",
            )?;
            let dag = stmt
                .query_map([&wanted], |r| {
                    let after: String = r.get(1)?;
                    Ok(TaskView {
                        name: r.get(0)?,
                        after: serde_json::from_str(&after).unwrap_or_default(),
                        state: r.get(2)?,
                        attempt: r.get(3)?,
                        task_id: r.get::<_, Option<i64>>(4)?.map(|t| t as u64),
                        pool: r.get(5)?,
                        node: r.get(6)?,
                        reason: r.get(7)?,
                        eta_ms: r.get(8)?,
                        predicted_ms: r.get(9)?,
                    })
                })?
                .collect::<Result<_, _>>()?;
            Ok(Some(WorkloadDetail {
                summary,
                dag,
                spec: serde_json::from_str(&spec).unwrap_or_default(),
            }))
        })
        .await
        .map_err(internal)?;
    match found {
        Some(w) if caller.sees(&w.summary.team) => Ok(Json(w)),
        _ => Err(Problem::not_found(format!("no workload {id}"))),
    }
}

#[utoipa::path(post, path = "/api/v1/workloads", params(SubmitParams),
    request_body(content = Object, description = "A workload spec (`apiVersion: allot/v1`, `kind: Workload`), YAML or JSON", content_type = "application/json"),
    responses((status = 201, body = Submitted), (status = 200, description = "Already submitted", body = Submitted),
        (status = 401, body = Problem), (status = 403, body = Problem), (status = 422, body = Problem), (status = 503, body = Problem)),
    security(("bearer" = [])))]
async fn submit_workload(
    caller: Caller,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<SubmitParams>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Problem> {
    if !matches!(caller.role, TokenRole::Admin | TokenRole::Member) {
        return Err(Problem::forbidden(format!(
            "a {} token may not submit workloads",
            caller.role
        )));
    }
    let text = allot_workload::limits::text(body.to_vec())
        .map_err(|p| Problem::invalid_spec("the spec was rejected", vec![spec_error(&p)]))?;
    let yaml = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.contains("yaml"))
        || !text.trim_start().starts_with('{');
    let format = if yaml { Format::Yaml } else { Format::Json };
    let inner = state.inner.clone();
    let cluster = state
        .inner
        .db
        .read(move |c| {
            let version = crate::model::fleet_version(c)?;
            let mut cached = inner.shape.lock().expect("shape lock");
            match &*cached {
                Some((v, shape)) if *v == version => Ok(shape.clone()),
                _ => {
                    let shape = Arc::new(cluster_shape(c)?);
                    *cached = Some((version, shape.clone()));
                    Ok(shape)
                }
            }
        })
        .await
        .map_err(internal)?;
    let ctx = allot_workload::Context {
        teams: state.inner.teams.as_ref(),
        cluster: (!cluster.nodes.is_empty()).then_some(&cluster),
    };
    let checked = allot_workload::check(&text, format, ctx).map_err(|problems| {
        Problem::invalid_spec(
            format!("the spec was rejected: {} problem(s)", problems.len()),
            problems.iter().map(spec_error).collect(),
        )
    })?;
    let team = checked.workload.metadata.team.clone();
    if !caller.may_submit(&team) {
        return Err(Problem::forbidden(format!(
            "this token submits for team {} only, not {team}",
            caller.team
        )));
    }
    let Some(bus) = &state.inner.bus else {
        return Err(Problem::unavailable(
            "the gateway is not connected to the bus",
        ));
    };
    let key = q.idempotency_key.clone().unwrap_or_else(|| {
        allot_workload::submit::idempotency_key(&checked.workload, q.run_id.as_deref())
    });
    let submission = allot_workload::submit::submission(
        checked.workload,
        key,
        q.run_id,
        caller.name(),
        SOURCE,
        Utc::now(),
    );
    // Sent as `allot submit` sends it: `Nats-Msg-Id` from the team, key and spec.
    let message = PublishMessage::build()
        .message_id(submission.msg_id.clone())
        .payload(Bytes::from(submission.envelope.to_json()));
    let ack: Published = bus
        .publisher
        .send_raw(submission.envelope.nats_subject(), message)
        .await
        .map_err(unavailable)?
        .wait()
        .await
        .map_err(unavailable)?;
    let status = if ack.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        [(
            header::LOCATION,
            format!("/api/v1/workloads/{}", submission.workload_id),
        )],
        Json(Submitted {
            workload_id: submission.workload_id,
            duplicate: ack.duplicate,
            stream_sequence: ack.sequence,
        }),
    )
        .into_response())
}

fn spec_error(p: &allot_workload::SpecProblem) -> SpecError {
    let mut message = p.message.clone();
    if let Some((line, col)) = p.line_column {
        message = format!("{message} (line {line}, column {col})");
    }
    SpecError {
        path: p.path.clone(),
        message,
    }
}

/// The shapes of the registered nodes, for checking a submission as `allot submit` does.
fn cluster_shape(c: &Connection) -> allot_store::rusqlite::Result<ClusterShape> {
    let mut cluster = ClusterShape::default();
    let mut stmt = c.prepare(
        "SELECT n.cpu_milli, n.memory_mib, COUNT(g.idx), COALESCE(MIN(g.model), ''), \
         COALESCE(MIN(g.memory_mib), 0) FROM nodes n LEFT JOIN gpus g ON g.node = n.name \
         GROUP BY n.name",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(NodeShape {
            count: 1,
            cpu_milli: r.get::<_, i64>(0)? as u64,
            memory_mib: r.get::<_, i64>(1)? as u64,
            gpus: r.get::<_, i64>(2)? as u32,
            gpu_model: r.get(3)?,
            gpu_memory_mib: r.get::<_, i64>(4)? as u64,
            mig: None,
        })
    })?;
    for row in rows {
        cluster.add(row?);
    }
    Ok(cluster)
}

fn unavailable(e: PublishError) -> Problem {
    Problem::unavailable(format!("{e}; retry"))
}

#[utoipa::path(post, path = "/api/v1/workloads/{id}/abort", params(("id" = String, Path, description = "The workload's id")),
    request_body = AbortRequest,
    responses((status = 202, body = AbortAccepted), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem), (status = 503, body = Problem)),
    security(("bearer" = [])))]
async fn abort_workload(
    caller: Caller,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<AbortRequest>,
) -> Result<Response, Problem> {
    let wanted = id.clone();
    let task = req.task.clone();
    let found = state
        .inner
        .db
        .read(move |c| {
            let workload = c
                .query_row(
                    "SELECT team, state FROM workloads WHERE id = ?1",
                    [&wanted],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
                )
                .optional()?;
            let has_task = match &task {
                None => true,
                Some(t) => c
                    .query_row(
                        "SELECT 1 FROM tasks WHERE workload = ?1 AND name = ?2",
                        [&wanted, t],
                        |_| Ok(()),
                    )
                    .optional()?
                    .is_some(),
            };
            Ok(workload.map(|w| (w, has_task)))
        })
        .await
        .map_err(internal)?;
    let Some(((team, current), has_task)) = found.filter(|((team, _), _)| caller.sees(team)) else {
        return Err(Problem::not_found(format!("no workload {id}")));
    };
    if !has_task {
        return Err(Problem::not_found(format!(
            "workload {id} has no task {:?}",
            req.task.as_deref().unwrap_or_default()
        )));
    }
    if !caller.may_abort(&team) {
        return Err(Problem::forbidden(format!(
            "a {} token may not abort workloads",
            caller.role
        )));
    }
    if current != "running" {
        return Err(Problem::conflict(format!(
            "workload {id} already {current}"
        )));
    }
    if req.reason.trim().is_empty() {
        return Err(Problem::bad_request("an abort needs a reason"));
    }
    let Some(bus) = &state.inner.bus else {
        return Err(Problem::unavailable(
            "the gateway is not connected to the bus",
        ));
    };
    let event = WorkloadAborted {
        workload_id: id.clone(),
        team,
        task: req.task.clone(),
        reason: req.reason,
        by: caller.name(),
    };
    let envelope = bus
        .publisher
        .envelope(allot_events::WorkloadEvent::Aborted(event));
    let event_id = envelope.id.to_string();
    bus.publisher
        .publish_envelope(&envelope)
        .await
        .map_err(unavailable)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(AbortAccepted {
            event_id,
            workload_id: id,
            task: req.task,
        }),
    )
        .into_response())
}

fn decision_row(r: &allot_store::rusqlite::Row<'_>) -> allot_store::rusqlite::Result<DecisionView> {
    let detail: String = r.get(9)?;
    Ok(DecisionView {
        id: r.get(0)?,
        pool: r.get(1)?,
        entry: r.get(2)?,
        at_ms: r.get(3)?,
        kind: r.get(4)?,
        task_id: r.get(5)?,
        team: r.get(6)?,
        workload: r.get(7)?,
        task: r.get(8)?,
        detail: serde_json::from_str(&detail).unwrap_or_default(),
    })
}

const DECISION_COLUMNS: &str =
    "id, pool, entry, at_ms, kind, task_id, team, workload, name, detail";

#[utoipa::path(get, path = "/api/v1/decisions", params(DecisionQuery),
    responses((status = 200, body = DecisionPage), (status = 401, body = Problem)),
    security(("bearer" = [])))]
async fn list_decisions(
    caller: Caller,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<DecisionQuery>,
) -> Result<Json<DecisionPage>, Problem> {
    let team = caller.scope(q.team.as_deref()).map(str::to_owned);
    let (limit, cursor) = page(q.limit, q.cursor.as_deref())?;
    let cursor = cursor.unwrap_or(i64::MAX);
    let task = q
        .task
        .map(|t| {
            i64::try_from(t).map_err(|_| Problem::bad_request(format!("task {t} is out of range")))
        })
        .transpose()?;
    let items = state
        .inner
        .db
        .read(move |c| {
            // Only the filters given, so that one team's or one task's decisions are read
            // through `decisions_team` or `decisions_task`, not every decision back from the
            // newest.
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {DECISION_COLUMNS} FROM decisions WHERE id < ?1{}{} \
                 ORDER BY id DESC LIMIT ?4",
                if team.is_some() { " AND team = ?2" } else { "" },
                if task.is_some() {
                    " AND task_id = ?3"
                } else {
                    ""
                },
            ))?;
            stmt.query_map(params![cursor, team, task, limit as i64 + 1], decision_row)?
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(internal)?;
    let next_cursor = (items.len() > limit).then(|| items[limit - 1].id.to_string());
    Ok(Json(DecisionPage {
        items: items.into_iter().take(limit).collect(),
        next_cursor,
    }))
}

#[utoipa::path(get, path = "/api/v1/tasks/{id}/explain", params(("id" = String, Path, description = "The attempt's id (`123` or `task-123`)")),
    responses((status = 200, body = Explanation), (status = 401, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
async fn explain_task(
    caller: Caller,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Explanation>, Problem> {
    let not_found = || Problem::not_found(format!("no task {id}"));
    let task_id: u64 = id
        .trim_start_matches("task-")
        .parse()
        .map_err(|_| not_found())?;
    let history = state
        .inner
        .db
        .read(move |c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {DECISION_COLUMNS} FROM decisions WHERE task_id = ?1 ORDER BY id"
            ))?;
            stmt.query_map([task_id as i64], decision_row)?
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(internal)?;
    let Some(team) = history.iter().find_map(|d| d.team.clone()) else {
        return Err(not_found());
    };
    if !caller.sees(&team) {
        return Err(not_found());
    }
    let waiting = state
        .snapshot()
        .await
        .queue
        .iter()
        .find(|q| q.task_id == task_id)
        .cloned();
    Ok(Json(Explanation {
        task_id,
        workload: history.iter().find_map(|d| d.workload.clone()),
        task: history.iter().find_map(|d| d.task.clone()),
        team,
        waiting,
        history,
    }))
}

#[utoipa::path(get, path = "/api/v1/queue", params(QueueQuery),
    responses((status = 200, body = QueuePage), (status = 401, body = Problem)),
    security(("bearer" = [])))]
async fn get_queue(
    caller: Caller,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<QueueQuery>,
) -> Result<Json<QueuePage>, Problem> {
    let snapshot = state.snapshot().await;
    let team = caller.scope(q.team.as_deref());
    let (limit, cursor) = page(q.limit, q.cursor.as_deref())?;
    let skip = cursor.unwrap_or(0).max(0) as usize;
    let mine = snapshot.queue.iter().filter(|e| {
        team.is_none_or(|t| e.team == t) && q.pool.as_deref().is_none_or(|p| e.pool == p)
    });
    let total = mine.clone().count();
    let items: Vec<QueueEntry> = mine.skip(skip).take(limit).cloned().collect();
    let next_cursor = (skip + items.len() < total).then(|| (skip + items.len()).to_string());
    Ok(Json(QueuePage {
        items,
        total,
        next_cursor,
        as_of: snapshot.built,
    }))
}

#[utoipa::path(get, path = "/api/v1/nodes", params(NodeQuery),
    responses((status = 200, body = NodePage), (status = 401, body = Problem)),
    security(("bearer" = [])))]
async fn get_nodes(
    caller: Caller,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<NodeQuery>,
) -> Result<Response, Problem> {
    let snapshot = state.snapshot().await;
    let (limit, cursor) = page(q.limit, q.cursor.as_deref())?;
    let skip = cursor.unwrap_or(0).max(0) as usize;
    let total = snapshot.nodes.len();
    let end = total.min(skip.saturating_add(limit));
    // The page is spliced from each node's JSON as serialised at the last rebuild; only a node
    // that runs some of a member's or viewer's own team's work is serialised for the request.
    let mut body = Vec::with_capacity(
        snapshot.nodes_json[skip.min(end)..end]
            .iter()
            .map(|(full, _)| full.len() + 1)
            .sum::<usize>()
            + 128,
    );
    body.extend_from_slice(b"{\"items\":[");
    for i in skip.min(end)..end {
        if i > skip {
            body.push(b',');
        }
        let (full, anonymous) = &snapshot.nodes_json[i];
        if caller.sees_all() {
            body.extend_from_slice(full);
            continue;
        }
        let node = &snapshot.nodes[i];
        let mine = node
            .gpus
            .iter()
            .flat_map(|g| &g.allocations)
            .any(|a| a.team.as_deref() == Some(caller.team.as_str()));
        if mine {
            serde_json::to_writer(&mut body, &redacted(node, Some(&caller.team)))
                .map_err(|e| internal(e.to_string()))?;
        } else {
            body.extend_from_slice(anonymous);
        }
    }
    let next_cursor = (end < total).then(|| end.to_string());
    body.extend_from_slice(b"],");
    let tail = serde_json::json!({
        "total": total,
        "next_cursor": next_cursor,
        "as_of": snapshot.built,
    });
    // `{"total":…}` without its opening brace closes the object.
    let tail = serde_json::to_vec(&tail).map_err(|e| internal(e.to_string()))?;
    body.extend_from_slice(&tail[1..]);
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

#[utoipa::path(get, path = "/api/v1/costs", params(TeamQuery),
    responses((status = 200, body = CostReport), (status = 401, body = Problem)),
    security(("bearer" = [])))]
async fn get_costs(
    caller: Caller,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<TeamQuery>,
) -> Result<Json<CostReport>, Problem> {
    let team = caller.scope(q.team.as_deref()).map(str::to_owned);
    let rows = state
        .inner
        .db
        .read(move |c| {
            // The running totals (`cost_totals`): a row per workload, not per cost event.
            let mut stmt = c.prepare(
                "SELECT team, currency, workload, amount FROM cost_totals \
                 WHERE (?1 IS NULL OR team = ?1) ORDER BY team, currency, workload",
            )?;
            stmt.query_map(params![team], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(internal)?;
    let mut teams: Vec<TeamCost> = Vec::new();
    for (team, currency, workload, amount) in rows {
        match teams.last_mut() {
            Some(t) if t.team == team && t.currency == currency => {
                t.amount_micros += amount;
                t.workloads.insert(workload, amount);
            }
            _ => teams.push(TeamCost {
                team,
                currency,
                amount_micros: amount,
                workloads: BTreeMap::from([(workload, amount)]),
            }),
        }
    }
    Ok(Json(CostReport { teams }))
}

#[utoipa::path(get, path = "/api/v1/budgets", params(TeamQuery),
    responses((status = 200, body = [BudgetView]), (status = 401, body = Problem)),
    security(("bearer" = [])))]
async fn get_budgets(
    caller: Caller,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<TeamQuery>,
) -> Result<Json<Vec<BudgetView>>, Problem> {
    let team = caller.scope(q.team.as_deref()).map(str::to_owned);
    let rows = state
        .inner
        .db
        .read(move |c| {
            let mut stmt = c.prepare(
                "SELECT team, period, level, spent, budget, currency FROM budgets \
                 WHERE (?1 IS NULL OR team = ?1) ORDER BY team, period",
            )?;
            stmt.query_map(params![team], |r| {
                Ok(BudgetView {
                    team: r.get(0)?,
                    period: r.get(1)?,
                    level: r.get(2)?,
                    spent_micros: r.get(3)?,
                    budget_micros: r.get(4)?,
                    currency: r.get(5)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(internal)?;
    Ok(Json(rows))
}

fn usage(mirror: &Mirror) -> Vec<PoolUsage> {
    mirror
        .usage()
        .into_iter()
        .map(
            |(pool, capacity_milli, allocated_milli, waiting)| PoolUsage {
                pool,
                capacity_milli,
                allocated_milli,
                waiting,
            },
        )
        .collect()
}

#[utoipa::path(get, path = "/api/v1/kpis",
    responses((status = 200, body = Kpis), (status = 401, body = Problem)),
    security(("bearer" = [])))]
async fn get_kpis(caller: Caller, State(state): State<AppState>) -> Result<Json<Kpis>, Problem> {
    let (pools, series) = {
        let mirror = state.inner.mirror.lock().expect("mirror lock");
        (usage(&mirror), mirror.kpis())
    };
    let team = caller.scope(None).map(str::to_owned);
    let workloads = state
        .inner
        .db
        .read(move |c| {
            let mut stmt = c.prepare_cached(crate::model::WORKLOADS_BY_STATE)?;
            stmt.query_map(params![team], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<BTreeMap<String, u32>, _>>()
        })
        .await
        .map_err(internal)?;
    Ok(Json(Kpis {
        pools,
        series,
        workloads,
    }))
}

#[utoipa::path(get, path = "/api/v1/lookback", params(LookBackParams),
    responses((status = 200, body = LookBack), (status = 400, body = Problem), (status = 401, body = Problem), (status = 503, body = Problem)),
    security(("bearer" = [])))]
async fn look_back(
    caller: Caller,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<LookBackParams>,
) -> Result<Json<LookBack>, Problem> {
    let Some(bus) = &state.inner.bus else {
        return Err(Problem::unavailable(
            "the gateway is not connected to the bus",
        ));
    };
    let mirror = crate::mirror::lookback(&bus.js, q.at)
        .await
        .map_err(Problem::unavailable)?;
    let mut queue = mirror.queue_at_last();
    let mut allocations = mirror.allocations();
    if !caller.sees_all() {
        queue.retain(|e| e.team == caller.team);
        allocations.retain(|a| a.team == caller.team);
    }
    Ok(Json(LookBack {
        at: q.at,
        pools: usage(&mirror),
        allocations,
        queue,
    }))
}

#[utoipa::path(post, path = "/api/v1/tokens", request_body = TokenRequest,
    responses((status = 201, body = IssuedToken), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem), (status = 503, body = Problem)),
    security(("bearer" = [])))]
async fn create_token(
    caller: Caller,
    State(state): State<AppState>,
    ApiJson(req): ApiJson<TokenRequest>,
) -> Result<Response, Problem> {
    if !caller.may_issue_tokens() {
        return Err(Problem::forbidden(format!(
            "a {} token may not issue tokens",
            caller.role
        )));
    }
    let Some(role) = TokenRole::parse(&req.role) else {
        return Err(Problem::bad_request(format!(
            "role {:?} is not one of admin, operator, member, viewer",
            req.role
        )));
    };
    if let Err(e) = allot_events::subject::validate_token("team", &req.team) {
        return Err(Problem::bad_request(e.to_string()));
    }
    let Some(bus) = &state.inner.bus else {
        return Err(Problem::unavailable(
            "the gateway is not connected to the bus",
        ));
    };
    let token = crate::token::generate();
    let issued = crate::token::issued(
        &token,
        &req.team,
        role,
        &caller.name(),
        &req.description,
        req.expires,
    );
    let sha = issued.sha256.clone();
    let known = Known {
        token_id: issued.token_id.clone(),
        team: issued.team.clone(),
        role,
        expires: issued.expires,
        revoked: false,
    };
    bus.publisher
        .publish(AccessEvent::TokenIssued(issued.clone()))
        .await
        .map_err(unavailable)?;
    // Usable at once from this instance; others learn it from the stream.
    state.add_token(sha, known);
    Ok((
        StatusCode::CREATED,
        Json(IssuedToken {
            token,
            token_id: issued.token_id,
            team: issued.team,
            role: role.to_string(),
        }),
    )
        .into_response())
}

#[utoipa::path(get, path = "/api/v1/tokens",
    responses((status = 200, body = [TokenView]), (status = 403, body = Problem)),
    security(("bearer" = [])))]
async fn list_tokens(
    caller: Caller,
    State(state): State<AppState>,
) -> Result<Json<Vec<TokenView>>, Problem> {
    if !caller.may_issue_tokens() {
        return Err(Problem::forbidden(format!(
            "a {} token may not list tokens",
            caller.role
        )));
    }
    let tokens = state
        .inner
        .db
        .read(|c| {
            c.prepare(
                "SELECT token_id, team, role, description, issued_by, issued_at, expires, \
                 revoked_at FROM tokens ORDER BY issued_at, token_id",
            )?
            .query_map([], |r| {
                Ok(TokenView {
                    token_id: r.get(0)?,
                    team: r.get(1)?,
                    role: r.get(2)?,
                    description: r.get(3)?,
                    issued_by: r.get(4)?,
                    issued_at: r.get(5)?,
                    expires: r.get(6)?,
                    revoked_at: r.get(7)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(internal)?;
    Ok(Json(tokens))
}

#[utoipa::path(delete, path = "/api/v1/tokens/{id}", params(("id" = String, Path, description = "The token's public id")),
    responses((status = 204, description = "Revoked: refused by this gateway at once, by every other as soon as it reads the event"),
        (status = 403, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem), (status = 503, body = Problem)),
    security(("bearer" = [])))]
async fn revoke_token(
    caller: Caller,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, Problem> {
    if !caller.may_issue_tokens() {
        return Err(Problem::forbidden(format!(
            "a {} token may not revoke tokens",
            caller.role
        )));
    }
    let known = state
        .inner
        .tokens
        .read()
        .expect("tokens lock")
        .by_id(&id)
        .map(|k| (k.team.clone(), k.revoked));
    let Some((team, revoked)) = known else {
        return Err(Problem::not_found(format!("no token {id}")));
    };
    if revoked {
        return Err(Problem::conflict(format!("token {id} is already revoked")));
    }
    let Some(bus) = &state.inner.bus else {
        return Err(Problem::unavailable(
            "the gateway is not connected to the bus",
        ));
    };
    bus.publisher
        .publish(AccessEvent::TokenRevoked(
            allot_events::access::TokenRevoked {
                token_id: id.clone(),
                team,
                by: caller.name(),
            },
        ))
        .await
        .map_err(unavailable)?;
    state.inner.tokens.write().expect("tokens lock").revoke(&id);
    Ok(StatusCode::NO_CONTENT)
}

async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        ApiDoc::openapi().to_json().unwrap_or_default(),
    )
        .into_response()
}

async fn fallback() -> Problem {
    Problem::not_found("no such endpoint (the API is under /api/v1; see /api/v1/openapi.json)")
}

struct BearerAuth;

/// Every error is `application/problem+json` (RFC 9457), and every operation says so for the
/// errors any of them can give: 401 without a valid token, 400 for a malformed parameter or body.
struct Problems;

impl Modify for Problems {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
        let problem = |description: &str| {
            RefOr::T(
                ResponseBuilder::new()
                    .description(description)
                    .content(
                        crate::problem::CONTENT_TYPE,
                        ContentBuilder::new()
                            .schema(Some(Ref::from_schema_name("Problem")))
                            .build(),
                    )
                    .build(),
            )
        };
        for item in openapi.paths.paths.values_mut() {
            for op in [&mut item.get, &mut item.post, &mut item.delete]
                .into_iter()
                .flatten()
            {
                let responses = &mut op.responses.responses;
                for response in responses.values_mut() {
                    let RefOr::T(response) = response else {
                        continue;
                    };
                    let is_problem = response.content.get("application/json").is_some_and(|c| {
                        matches!(c, RefOr::T(c) if matches!(&c.schema, Some(RefOr::Ref(r)) if r.ref_location.ends_with("/Problem")))
                    });
                    if is_problem {
                        let content = response.content.shift_remove("application/json");
                        response
                            .content
                            .extend(content.map(|c| (crate::problem::CONTENT_TYPE.to_owned(), c)));
                    }
                }
                responses.entry("401".to_owned()).or_insert_with(|| {
                    problem("No token, or one that is unknown, revoked or expired")
                });
                let takes_input = op.parameters.as_ref().is_some_and(|p| !p.is_empty())
                    || op.request_body.is_some();
                if takes_input {
                    responses.entry("400".to_owned()).or_insert_with(|| {
                        problem("A parameter or the body is malformed; the detail says which")
                    });
                }
            }
        }
    }
}

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document, generated from the handlers and types above.
#[derive(OpenApi)]
#[openapi(
    info(title = "Allot gateway", description = "Workloads, the queue with reasons and ETAs, nodes, decisions, costs and budgets of an Allot cluster, per team."),
    paths(list_workloads, get_workload, submit_workload, abort_workload, explain_task, get_queue,
        get_nodes, list_decisions, get_costs, get_budgets, get_kpis, look_back, create_token,
        list_tokens, revoke_token,
        crate::sse::events),
    components(schemas(Problem, SpecError)),
    modifiers(&BearerAuth, &Problems)
)]
#[derive(Debug)]
pub struct ApiDoc;

/// The gateway's router: the API, its document, the probes and the dashboard.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route(
            "/api/v1/workloads",
            get(list_workloads).post(submit_workload),
        )
        .route("/api/v1/workloads/{id}", get(get_workload))
        .route("/api/v1/workloads/{id}/abort", post(abort_workload))
        .route("/api/v1/tasks/{id}/explain", get(explain_task))
        .route("/api/v1/queue", get(get_queue))
        .route("/api/v1/nodes", get(get_nodes))
        .route("/api/v1/decisions", get(list_decisions))
        .route("/api/v1/costs", get(get_costs))
        .route("/api/v1/budgets", get(get_budgets))
        .route("/api/v1/kpis", get(get_kpis))
        .route("/api/v1/lookback", get(look_back))
        .route("/api/v1/tokens", post(create_token).get(list_tokens))
        .route("/api/v1/tokens/{id}", axum::routing::delete(revoke_token))
        .route("/api/v1/events", get(crate::sse::events))
        .route("/api/v1/openapi.json", get(openapi_json))
        .merge(crate::dashboard::routes())
        .fallback(fallback)
        .with_state(state)
        // `/metrics` (every service of the process), `/healthz`, `/readyz`: the runtime's.
        .merge(allot_runtime::ops::app(
            allot_runtime::Readiness::process().clone(),
        ))
}
