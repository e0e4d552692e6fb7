//! The `allot-planner` NATS micro-service: answers `allot workloads` and `allot workload ID`
//! from the planner's database (the contract is [`allot_events::query::planner`]).
//!
//! [`workloads`] and [`workload`] are plain reads of the store, tested without a bus;
//! [`Endpoint`] serves them on the four subjects, the team-scoped ones answering about the
//! team their subject names only.

use std::future::Future;

use chrono::{DateTime, TimeZone, Utc};
use futures::StreamExt;
use tracing::warn;

use allot_events::query::planner::{
    self as contract, DEFAULT_LIMIT, MAX_LIMIT, TaskCounts, TaskDetail, TaskNode, WorkloadDetail,
    WorkloadList, WorkloadQuery, WorkloadState, WorkloadSummary, WorkloadsQuery,
};
use allot_store::rusqlite::{self, Connection, OptionalExtension, Row, params};

use crate::store::StoreError;

/// Why a query got no answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The query cannot be read or asks for what its subject does not allow (the asker's).
    #[error("{0}")]
    BadRequest(String),
    /// No such workload (or not the asking team's).
    #[error("{0}")]
    NotFound(String),
    /// The database failed (the planner's).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<rusqlite::Error> for QueryError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Store(e.into())
    }
}

/// The workloads `q` asks for, newest first; `scope`: the team the asker's subject names, if
/// any, whose workloads only it may see.
pub fn workloads(
    conn: &Connection,
    q: &WorkloadsQuery,
    scope: Option<&str>,
    now: DateTime<Utc>,
) -> Result<WorkloadList, QueryError> {
    let team = match (scope, q.team.as_deref()) {
        (Some(scope), Some(team)) if scope != team => {
            return Err(QueryError::BadRequest(format!(
                "this query is scoped to team {scope}: it cannot list team {team}'s workloads"
            )));
        }
        (scope, team) => scope.or(team),
    };
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(QueryError::BadRequest(format!(
            "limit {limit} is out of range: ask for 1 to {MAX_LIMIT} workloads"
        )));
    }
    let before = q
        .cursor
        .as_deref()
        .map(|c| {
            c.parse::<i64>().map_err(|_| {
                QueryError::BadRequest(format!("cursor {c:?} is not one this planner gave"))
            })
        })
        .transpose()?;
    // A team's page names its team outright, so it is read through `workloads_of_team`
    // (`?1 IS NULL OR …` would walk every team's workloads back from the newest).
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {SUMMARY_COLUMNS}, w.received FROM workloads w
         WHERE {} AND (?2 IS NULL OR w.status = ?2)
           AND (?3 IS NULL OR w.submitted_ms >= ?3) AND (?4 IS NULL OR w.received < ?4)
         ORDER BY w.received DESC LIMIT ?5",
        if team.is_some() {
            "w.team = ?1"
        } else {
            "?1 IS NULL"
        },
    ))?;
    let mut rows = stmt
        .query_map(
            params![
                team,
                q.state.map(WorkloadState::as_str),
                q.since.map(|t| t.timestamp_millis()),
                before,
                i64::from(limit) + 1,
            ],
            |r| Ok((summary(r)?, r.get::<_, i64>(10)?)),
        )?
        .collect::<Result<Vec<_>, _>>()?;
    let next_cursor = if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(|(_, received)| received.to_string())
    } else {
        None
    };
    let workloads = rows
        .into_iter()
        .map(|(s, _)| s)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(WorkloadList {
        at: now,
        workloads,
        next_cursor,
    })
}

/// Workload `id` with its tasks; `scope` as for [`workloads`]: another team's workload is not
/// found.
pub fn workload(
    conn: &Connection,
    id: &str,
    scope: Option<&str>,
    now: DateTime<Utc>,
) -> Result<WorkloadDetail, QueryError> {
    let not_found = || QueryError::NotFound(format!("no workload {id}"));
    let summary = conn
        .query_row(
            &format!("SELECT {SUMMARY_COLUMNS} FROM workloads w WHERE w.id = ?1"),
            [id],
            summary,
        )
        .optional()?
        .ok_or_else(not_found)??;
    if scope.is_some_and(|team| team != summary.team) {
        return Err(not_found());
    }
    // Each task's run: its latest attempt that was granted (a retry not yet granted shows the
    // run before it).
    let mut stmt = conn.prepare_cached(
        "SELECT t.name, t.status, t.attempt, t.max_attempts, t.reason,
                a.nodes, a.granted_ms, a.ended_ms
         FROM tasks t
         LEFT JOIN attempts a ON a.task_id = (
             SELECT task_id FROM attempts
             WHERE workload = t.workload AND name = t.name AND granted_ms IS NOT NULL
             ORDER BY attempt DESC LIMIT 1)
         WHERE t.workload = ?1 ORDER BY t.position",
    )?;
    let tasks = stmt
        .query_map([id], |r| {
            Ok((
                TaskDetail {
                    name: r.get(0)?,
                    state: r.get(1)?,
                    attempt: r.get(2)?,
                    max_attempts: r.get(3)?,
                    nodes: Vec::new(),
                    started_at: r.get::<_, Option<i64>>(6)?.map(time),
                    ended_at: r.get::<_, Option<i64>>(7)?.map(time),
                    reason: r.get(4)?,
                },
                r.get::<_, Option<String>>(5)?,
            ))
        })?
        .map(|row| {
            let (mut task, nodes) = row?;
            if let Some(nodes) = nodes {
                task.nodes = serde_json::from_str::<Vec<TaskNode>>(&nodes).map_err(|e| {
                    StoreError::Corrupt(format!("workload {id}, task {}: nodes: {e}", task.name))
                })?;
            }
            Ok(task)
        })
        .collect::<Result<Vec<_>, QueryError>>()?;
    Ok(WorkloadDetail {
        at: now,
        workload: summary,
        tasks,
    })
}

/// The columns [`summary`] reads, from `workloads w`.
const SUMMARY_COLUMNS: &str = "w.id, w.team, w.submitter, w.run_id, w.submitted_ms, w.status,
    w.reason,
    (SELECT count(*) FROM tasks t WHERE t.workload = w.id),
    (SELECT count(*) FROM tasks t WHERE t.workload = w.id AND t.status = 'succeeded'),
    (SELECT count(*) FROM tasks t WHERE t.workload = w.id AND t.status = 'running')";

/// A row of [`SUMMARY_COLUMNS`]; the inner error is a state this build cannot read.
fn summary(r: &Row<'_>) -> rusqlite::Result<Result<WorkloadSummary, StoreError>> {
    let id: String = r.get(0)?;
    let state: String = r.get(5)?;
    let Some(state) = WorkloadState::parse(&state) else {
        return Ok(Err(StoreError::Corrupt(format!(
            "workload {id}: status {state:?}"
        ))));
    };
    Ok(Ok(WorkloadSummary {
        team: r.get(1)?,
        submitter: r.get(2)?,
        run_id: r.get(3)?,
        submitted_at: r.get::<_, Option<i64>>(4)?.map(time),
        state,
        reason: r.get(6)?,
        tasks: TaskCounts {
            total: r.get(7)?,
            succeeded: r.get(8)?,
            running: r.get(9)?,
        },
        id,
    }))
}

/// Milliseconds since the epoch as a time.
fn time(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

/// Which query an endpoint answers.
#[derive(Debug, Clone, Copy)]
enum Asked {
    Workloads,
    Workload,
}

/// Serves the planner's queries until shutdown, with its own connection to the database.
#[derive(Debug)]
pub struct Endpoint {
    /// The planner's NATS client.
    pub client: async_nats::Client,
    /// Its own connection (WAL lets it read beside the consumers).
    pub conn: Connection,
}

impl Endpoint {
    /// Answers requests until `shutdown` completes; fails only if the service cannot start.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), crate::Error> {
        use async_nats::service::ServiceExt;
        let failed = |e: async_nats::Error| crate::Error::Query(e.to_string());
        let service = self
            .client
            .service_builder()
            .description("Allot planner: workloads, their tasks and where they ran")
            .start(contract::SERVICE_NAME, env!("CARGO_PKG_VERSION"))
            .await
            .map_err(failed)?;
        let mut endpoints = Vec::new();
        for (asked, name, subject) in [
            (
                Asked::Workloads,
                "workloads",
                contract::workloads_subject(None),
            ),
            (
                Asked::Workloads,
                "team-workloads",
                contract::workloads_subject(Some("*")),
            ),
            (
                Asked::Workload,
                "workload",
                contract::workload_subject(None),
            ),
            (
                Asked::Workload,
                "team-workload",
                contract::workload_subject(Some("*")),
            ),
        ] {
            let endpoint = service
                .endpoint_builder()
                .name(name)
                .add(subject)
                .await
                .map_err(failed)?;
            endpoints.push(endpoint.map(move |request| (asked, request)).boxed());
        }
        let mut requests = futures::stream::select_all(endpoints);
        tokio::pin!(shutdown);
        loop {
            let next = tokio::select! {
                () = &mut shutdown => break,
                next = requests.next() => next,
            };
            let Some((asked, request)) = next else { break };
            let reply = self.answer(asked, &request.message);
            if let Err(e) = request.respond(reply).await {
                warn!(error = %e, "answering a workload query failed");
            }
        }
        let _ = service.stop().await;
        Ok(())
    }

    /// The answer to one request: JSON, or a micro-service error with its code.
    fn answer(
        &self,
        asked: Asked,
        message: &async_nats::Message,
    ) -> Result<bytes::Bytes, async_nats::service::error::Error> {
        // On a team's subject, the last token is the team.
        let subject = message.subject.as_str();
        let scope = match asked {
            Asked::Workloads => subject.strip_prefix(&contract::workloads_subject(None)),
            Asked::Workload => subject.strip_prefix(&contract::workload_subject(None)),
        }
        .and_then(|rest| rest.strip_prefix('.'));
        let now = Utc::now();
        let bad = |e: serde_json::Error| QueryError::BadRequest(format!("unreadable query: {e}"));
        let answer = match asked {
            Asked::Workloads => {
                let q: WorkloadsQuery = if message.payload.is_empty() {
                    WorkloadsQuery::default()
                } else {
                    serde_json::from_slice(&message.payload).map_err(bad)?
                };
                workloads(&self.conn, &q, scope, now).map(|a| serde_json::to_vec(&a))
            }
            Asked::Workload => {
                let q: WorkloadQuery = serde_json::from_slice(&message.payload).map_err(bad)?;
                workload(&self.conn, &q.id, scope, now).map(|a| serde_json::to_vec(&a))
            }
        };
        match answer {
            Ok(json) => Ok(json.expect("plain data serializes").into()),
            Err(e) => Err(e.into()),
        }
    }
}

impl From<QueryError> for async_nats::service::error::Error {
    fn from(e: QueryError) -> Self {
        let code = match &e {
            QueryError::BadRequest(_) => contract::BAD_REQUEST,
            QueryError::NotFound(_) => contract::NOT_FOUND,
            QueryError::Store(e) => {
                warn!(error = %e, "a workload query failed");
                500
            }
        };
        Self {
            status: e.to_string(),
            code,
        }
    }
}
