//! `GET /api/v1/events`: the change log as Server-Sent Events.
//!
//! Each event's `id` is its row in the change log (see [`crate::model`]). A client that loses
//! its connection reconnects with `Last-Event-ID` (browsers do it by themselves) and receives
//! exactly the changes after it: the log is read in id order and a row below one already read
//! can never appear later. Without it, the stream starts with what happens next; with
//! `?after=0`, from the oldest change kept. When the client's position is older than the log
//! keeps, the first event is `reset` (reload the views, then follow). Members and viewers
//! receive their team's changes and the cluster's (nodes, remediation).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use crate::api::{ApiQuery, AppState};
use crate::problem::Problem;
use crate::token::Caller;

/// One event of the stream, as `text/event-stream` frames it.
#[derive(Debug, Clone, ToSchema)]
pub struct StreamEvent {
    /// The change's id: resume after it with `Last-Event-ID` or `?after=` (none on `reset`).
    pub id: Option<String>,
    /// What changed: `workload`, `task`, `decision`, `node`, `remediation`, `cost`, `budget`,
    /// `abort_requested`, `abort_answered`; or `reset` (changes were missed: read the views
    /// again).
    pub event: String,
    /// The change as JSON: `{"id", "at", "team", "data"}`.
    pub data: String,
}

/// Where to start.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventParams {
    /// Start after this change id (`Last-Event-ID` wins when both are given; `0`: from the
    /// oldest kept).
    pub after: Option<i64>,
    /// The bearer token, for clients that cannot send headers (a browser's EventSource).
    pub access_token: Option<String>,
}

/// How often an idle stream looks for new changes.
const POLL: Duration = Duration::from_millis(200);

/// One row of the change log.
type Row = (i64, String, String, Option<String>, String);

/// The live change log.
#[utoipa::path(get, path = "/api/v1/events", params(EventParams,
        ("Last-Event-ID" = Option<i64>, Header, nullable = false, description = "Resume after this event id")),
    responses((status = 200, description = "A stream of changes (`text/event-stream`): events `workload`, `task`, `decision`, `node`, `remediation`, `cost`, `budget`, `abort_requested`, `abort_answered`, and `reset`", content_type = "text/event-stream", body = StreamEvent),
        (status = 400, body = Problem), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn events(
    caller: Caller,
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<EventParams>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Problem> {
    let last_event_id = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .ok_or_else(|| {
                    Problem::bad_request("Last-Event-ID is not an event id of this stream")
                })?,
        ),
    };
    let db = state.db().clone();
    let (oldest, newest) = db
        .read(|c| {
            // Two subqueries: asked together in one, MIN and MAX read the whole table.
            c.query_row(
                "SELECT (SELECT MIN(id) FROM changes), (SELECT MAX(id) FROM changes)",
                [],
                |r| Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, Option<i64>>(1)?)),
            )
        })
        .await
        .map_err(Problem::unavailable)?;
    let start = last_event_id.or(q.after).unwrap_or(newest.unwrap_or(0));
    let reset = oldest.is_some_and(|o| start < o - 1) && start > 0;
    let team = (!caller.sees_all()).then(|| caller.team.clone());
    let mut pending: VecDeque<Event> = VecDeque::new();
    if reset {
        pending.push_back(
            Event::default()
                .event("reset")
                .data(r#"{"reason":"the changes after this position are no longer kept: reload"}"#),
        );
    }
    let stream = futures::stream::unfold((start, pending), move |(mut last, mut pending)| {
        let db = db.clone();
        let team = team.clone();
        async move {
            loop {
                if let Some(e) = pending.pop_front() {
                    return Some((Ok(e), (last, pending)));
                }
                let after = last;
                let rows: Vec<Row> = match db
                    .read(move |c| {
                        let mut stmt = c.prepare_cached(
                            "SELECT id, at, kind, team, data FROM changes WHERE id > ?1 \
                                 ORDER BY id LIMIT 500",
                        )?;
                        stmt.query_map([after], |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                        })?
                        .collect()
                    })
                    .await
                {
                    Ok(rows) => rows,
                    Err(e) => {
                        tracing::warn!(error = %e, "event stream: reading the change log");
                        Vec::new()
                    }
                };
                if rows.is_empty() {
                    tokio::time::sleep(POLL).await;
                    continue;
                }
                for (id, at, kind, row_team, data) in rows {
                    last = id;
                    if let (Some(mine), Some(theirs)) = (&team, &row_team)
                        && mine != theirs
                    {
                        continue;
                    }
                    let data = format!(
                        r#"{{"id":{id},"at":{},"team":{},"data":{data}}}"#,
                        serde_json::Value::String(at),
                        row_team.map_or("null".to_owned(), |t| serde_json::Value::String(t)
                            .to_string()),
                    );
                    pending.push_back(Event::default().id(id.to_string()).event(kind).data(data));
                }
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
