//! The client's one error type, carrying the server's problem+json fields.

use serde_json::{Map, Value};

/// An `application/problem+json` answer (RFC 9457), as the node sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// The HTTP status.
    pub status: u16,
    /// The problem type URI (`about:blank` for every muster error).
    pub kind: String,
    /// The status's short name (`Conflict`, `Bad Request`).
    pub title: String,
    /// What was wrong and how to fix it.
    pub detail: String,
    /// The node's request id (also in its log), when it sent one.
    pub request_id: Option<String>,
    /// Any further fields (a lock's `holder` and `reason`, a schedule's live
    /// `task`, ...).
    pub extra: Map<String, Value>,
}

impl Problem {
    /// Reads a problem from a status and a body. A body that is not a
    /// problem (a proxy's HTML page, say) becomes the `detail`.
    pub fn from_body(status: u16, body: &[u8]) -> Problem {
        let reason = reqwest::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Error")
            .to_string();
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(mut m)) => {
                let mut take = |k: &str| match m.remove(k) {
                    Some(Value::String(s)) => Some(s),
                    Some(other) => Some(other.to_string()),
                    None => None,
                };
                let kind = take("type").unwrap_or_else(|| "about:blank".into());
                let title = take("title").unwrap_or_else(|| reason.clone());
                let detail = take("detail").unwrap_or_default();
                let request_id = take("request_id");
                m.remove("status");
                Problem {
                    status,
                    kind,
                    title,
                    detail,
                    request_id,
                    extra: m,
                }
            }
            _ => Problem {
                status,
                kind: "about:blank".into(),
                title: reason,
                detail: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
                request_id: None,
                extra: Map::new(),
            },
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.title, self.detail)
    }
}

/// Everything a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node answered with an error status. 4xx are never retried; a 5xx
    /// is this only after the retries ran out.
    #[error("{0}")]
    Api(Box<Problem>),
    /// No node could be reached (connect error or timeout) before the
    /// retries ran out.
    #[error("cannot reach {url}: {message}")]
    Unreachable { url: String, message: String },
    /// The node answered something this client cannot read.
    #[error("unexpected answer from {url}: {message}")]
    Decode { url: String, message: String },
    /// A wait (for a result, say) ended without the outcome.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The client was built or called with something invalid (no URL, a bad
    /// URL, a token that is not a header value).
    #[error("invalid client use: {0}")]
    Invalid(String),
}

impl From<Problem> for Error {
    fn from(p: Problem) -> Error {
        Error::Api(Box::new(p))
    }
}

impl Error {
    /// The HTTP status of an [`Error::Api`].
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api(p) => Some(p.status),
            _ => None,
        }
    }

    /// The problem+json of an [`Error::Api`].
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Error::Api(p) => Some(p),
            _ => None,
        }
    }

    /// 409: for heartbeat, complete and fail, the fencing token is stale
    /// (the task was recovered from this worker, or already finished).
    pub fn is_conflict(&self) -> bool {
        self.status() == Some(409)
    }

    /// 404: the thing asked about does not exist.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// Worth retrying later: unreachable, a timeout or a 5xx.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Api(p) => p.status >= 500,
            Error::Unreachable { .. } | Error::Timeout(_) => true,
            Error::Decode { .. } | Error::Invalid(_) => false,
        }
    }
}

/// `Result` with the client's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
