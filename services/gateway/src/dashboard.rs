//! The dashboard: one page and its script and styles, compiled into the binary (no CDN, no
//! Node at run time). It reads the same API as everyone, with the token it is given, and
//! follows `GET /api/v1/events` to refresh what changed.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

const INDEX: &str = include_str!("../assets/index.html");
const SCRIPT: &str = include_str!("../assets/app.js");
const STYLE: &str = include_str!("../assets/style.css");

/// `/`, `/assets/app.js`, `/assets/style.css`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async {
                ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX).into_response()
            }),
        )
        .route(
            "/assets/app.js",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                    SCRIPT,
                )
                    .into_response()
            }),
        )
        .route(
            "/assets/style.css",
            get(|| async {
                ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
            }),
        )
}
