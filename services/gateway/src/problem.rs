//! Errors as RFC 9457 problem details (`application/problem+json`).
//!
//! Every error the API returns is one of these: a `type` URI naming the kind of problem (under
//! `https://allot.dev/problems/`, documented in docs/api.md), a short `title`, the HTTP
//! `status`, a `detail` for people, and — for a rejected workload spec — every problem found,
//! each with its path, as `allot validate` prints them.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// The media type of a problem.
pub const CONTENT_TYPE: &str = "application/problem+json";

/// One problem found in a workload spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SpecError {
    /// Where in the spec (`spec.tasks[1].resources.gpu`).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// An RFC 9457 problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Problem {
    /// What kind of problem (a URI).
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What happened this time.
    pub detail: String,
    /// Every problem of a rejected spec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<SpecError>,
}

const BASE: &str = "https://allot.dev/problems/";

impl Problem {
    fn new(status: StatusCode, kind: &str, title: &str, detail: impl Into<String>) -> Self {
        Self {
            kind: format!("{BASE}{kind}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            errors: Vec::new(),
        }
    }

    /// 401: no token, or one the gateway does not accept.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            detail,
        )
    }

    /// 403: the caller's role may not do this.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", "Forbidden", detail)
    }

    /// 404: nothing by that name — or nothing the caller may see.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }

    /// 400: the request itself is malformed (query, body, cursor).
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "Bad request",
            detail,
        )
    }

    /// 422: a workload spec was rejected; every problem is listed.
    pub fn invalid_spec(detail: impl Into<String>, errors: Vec<SpecError>) -> Self {
        Self {
            errors,
            ..Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-spec",
                "Invalid workload spec",
                detail,
            )
        }
    }

    /// 409: the request conflicts with the object's state (a finished workload).
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", "Conflict", detail)
    }

    /// 503: the bus or the store could not be reached; retry.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Service unavailable",
            detail,
        )
    }

    /// 500: a bug.
    pub fn internal(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            detail,
        )
    }
}

/// axum's own rejections of a malformed query, path or JSON body, as 400 problems naming what
/// is wrong (the gateway's extractors `ApiQuery`, `ApiPath` and `ApiJson` use them).
macro_rules! bad_request_from {
    ($($rejection:ty),*) => {$(
        impl From<$rejection> for Problem {
            fn from(e: $rejection) -> Self {
                Problem::bad_request(e.body_text())
            }
        }
    )*};
}
bad_request_from!(
    axum::extract::rejection::QueryRejection,
    axum::extract::rejection::PathRejection,
    axum::extract::rejection::JsonRejection
);

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"allot\""),
            );
        }
        response
    }
}
