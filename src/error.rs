//! API errors as `application/problem+json` (RFC 9457).
//!
//! Every handler returns `Result<T, ApiError>`. Client errors (4xx) carry a
//! message that says what was wrong and how to fix it. Server errors (5xx)
//! carry a generic message and the request id; their detail goes to the log
//! only, so internal text never reaches a client.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::problem::{Classify, Kind};

tokio::task_local! {
    /// The id of the request being served, set by the request-id middleware so
    /// that errors can name it without threading it through every handler.
    pub static REQUEST_ID: String;
}

/// The current request's id, or `-` outside a request.
pub(crate) fn current_request_id() -> String {
    REQUEST_ID.try_with(|id| id.clone()).unwrap_or_else(|_| "-".into())
}

pub(crate) type Result<T, E = ApiError> = std::result::Result<T, E>;

/// One error type for every handler.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed or a value is out of range.
    #[error("{0}")]
    BadRequest(String),
    /// 401: no credential, or one that matches no configured token.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: the credential's role is not enough, or the caller is not allowed here.
    #[error("{0}")]
    Forbidden(String),
    /// 404: the named thing does not exist.
    #[error("{0}")]
    NotFound(String),
    /// 409: the request conflicts with the current state (stale token, say);
    /// `extra` carries the state the caller needs to recover.
    #[error("{message}")]
    Conflict { message: String, extra: Map<String, Value> },
    /// 413: a body or payload is larger than allowed.
    #[error("{0}")]
    TooLarge(String),
    /// 415: the body is not JSON.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 429: this caller holds its whole share of a resource (WebSocket
    /// subscriptions); others are still served.
    #[error("{0}")]
    TooMany(String),
    /// 503: Redis is unreachable, or this node cannot serve the request now.
    #[error("{0}")]
    Unavailable(String),
    /// 500: a bug or an unexpected failure. The text is logged, never sent.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn bad_request(msg: impl Into<String>) -> Self {
        ApiError::BadRequest(msg.into())
    }
    pub fn not_found(msg: impl Into<String>) -> Self {
        ApiError::NotFound(msg.into())
    }
    pub fn conflict(msg: impl Into<String>, extra: Value) -> Self {
        let extra = match extra {
            Value::Object(m) => m,
            Value::Null => Map::new(),
            other => {
                let mut m = Map::new();
                m.insert("state".into(), other);
                m
            }
        };
        ApiError::Conflict {
            message: msg.into(),
            extra,
        }
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        ApiError::Internal(msg.into())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The one mapping from a domain error to a response (see `problem`).
impl<E: Classify> From<E> for ApiError {
    fn from(e: E) -> Self {
        let detail = crate::problem::detail(&e);
        match e.kind() {
            Kind::BadRequest => ApiError::BadRequest(detail),
            Kind::NotFound => ApiError::NotFound(detail),
            Kind::Forbidden => ApiError::Forbidden(detail),
            Kind::Conflict(extra) => ApiError::conflict(detail, extra),
            Kind::TooLarge => ApiError::TooLarge(detail),
            Kind::Unavailable => ApiError::Unavailable(detail),
            Kind::Internal => ApiError::Internal(detail),
        }
    }
}

/// Builds a problem+json response. Also used by the middleware that turns
/// framework errors (404, 405, 413) into problems.
pub(crate) fn problem(status: StatusCode, detail: &str, extra: Option<&Map<String, Value>>) -> Response {
    let mut body = json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
        "request_id": current_request_id(),
    });
    if let (Some(extra), Value::Object(obj)) = (extra, &mut body) {
        for (k, v) in extra {
            obj.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    resp
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            ApiError::Internal(msg) => {
                tracing::error!(request_id = %current_request_id(), error = %msg, "internal error");
                problem(
                    status,
                    "an internal error occurred; the server log has the details under this request id",
                    None,
                )
            }
            ApiError::Unavailable(msg) => {
                tracing::warn!(request_id = %current_request_id(), error = %msg, "unavailable");
                // Nothing was applied, or the outcome is unknown and the call
                // is safe to retry with its idempotency key: say when.
                let mut resp = problem(status, msg, None);
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                resp
            }
            ApiError::Conflict { message, extra } => problem(status, message, Some(extra)),
            other => problem(status, &other.to_string(), None),
        }
    }
}
