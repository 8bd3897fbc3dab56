//! "Acknowledged means replicated" (`redis.ack_replicas`, the `Durability`
//! header) at the HTTP edge: which operations wait for replicas, and the
//! answer when they cannot.
//!
//! Invariants:
//! - The operations in [`ACKED`] are every change a client is told succeeded
//!   whose loss at a failover would contradict that answer. When one runs
//!   with `n = replicas(...) > 0`, its handler runs inside the store's ack
//!   scope (every script on one dedicated connection, `store/ack.rs`) and a
//!   2xx answer leaves only after `n` replicas confirmed; otherwise the client
//!   gets 503 `replicated: false` with what the answer would have been (the
//!   task id where there is one) and `Retry-After`. An error answer (4xx,
//!   5xx) changed nothing and is sent as it is.
//! - The table is the one seam: the routes are unchanged, the OpenAPI
//!   document adds the header and the 503 to exactly these operations, and a
//!   test checks that each entry is a real operation.
//! - One header, not a body field: it reaches every operation alike
//!   (bodyless ones such as cancel and retry, batch bodies, and bodies whose
//!   schemas refuse unknown fields), and a proxy or client library can set it
//!   per request without touching the payload.

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::app::AppState;
use crate::error::{ApiError, problem};
use crate::store::{AckScope, Confirmation};

/// The request header: `Durability: replicated`.
pub(crate) const HEADER: &str = "durability";
/// The response header of an acknowledged change: how many replicas
/// confirmed it.
pub(crate) const REPLICAS_HEADER: &str = "durability-replicas";

/// Every operation that waits for replicas, as (method, route template).
pub const ACKED: &[(Method, &str)] = &[
    (Method::POST, "/api/v1/queues/{queue}/tasks"),
    (Method::POST, "/api/v1/queues/{queue}/tasks/batch"),
    (Method::POST, "/api/v1/tasks/{id}/complete"),
    (Method::POST, "/api/v1/tasks/complete"),
    (Method::POST, "/api/v1/tasks/{id}/fail"),
    (Method::POST, "/api/v1/tasks/{id}/cancel"),
    (Method::POST, "/api/v1/tasks/{id}/retry"),
    (Method::POST, "/api/v1/dead/retry"),
    (Method::POST, "/api/v1/dead/discard"),
    (Method::POST, "/api/v1/workflows"),
    (Method::POST, "/api/v1/schedules"),
    (Method::PUT, "/api/v1/schedules/{id}"),
    (Method::DELETE, "/api/v1/schedules/{id}"),
    (Method::POST, "/api/v1/schedules/{id}/trigger"),
    (Method::POST, "/api/v1/schedules/{id}/enable"),
    (Method::POST, "/api/v1/schedules/{id}/disable"),
    (Method::PUT, "/api/v1/barriers/{name}"),
    (Method::DELETE, "/api/v1/barriers/{name}"),
    (Method::POST, "/api/v1/barriers/{name}/rounds/{round}/arrive"),
    (Method::POST, "/api/v1/barriers/{name}/hold"),
    (Method::POST, "/api/v1/barriers/{name}/release"),
    (Method::POST, "/api/v1/double-barriers/{name}/enter"),
    (Method::POST, "/api/v1/double-barriers/{name}/leave"),
    (Method::POST, "/api/v1/locks/{name}/acquire"),
];

/// Whether `method path` (a route template) waits for replicas.
pub(crate) fn is_acked(method: &str, path: &str) -> bool {
    ACKED
        .iter()
        .any(|(m, p)| m.as_str().eq_ignore_ascii_case(method) && *p == path)
}

/// How many replicas a request needs: the header's `replicated` (any case,
/// surrounding blanks ignored) asks for `max(redis.ack_replicas, 1)`;
/// without the header, `redis.ack_replicas`. The header given twice is
/// refused, whatever its values: which one counts would be a guess (issue
/// 36, N6).
pub(crate) fn replicas<'a>(
    headers: impl IntoIterator<Item = &'a HeaderValue>,
    configured: u32,
) -> Result<u32, ApiError> {
    let mut headers = headers.into_iter();
    let Some(v) = headers.next() else {
        return Ok(configured);
    };
    if headers.next().is_some() {
        return Err(ApiError::bad_request(
            "the Durability header is given more than once: send it once, with the value `replicated`",
        ));
    }
    match v.to_str().map(str::trim) {
        Ok(v) if v.eq_ignore_ascii_case("replicated") => Ok(configured.max(1)),
        _ => Err(ApiError::bad_request(
            "the Durability header takes one value, `replicated` (wait for redis.ack_replicas replicas, \
             at least 1, before answering); leave it out for the node's default",
        )),
    }
}

/// Around the handler, inside the auth middleware (which calls it for a
/// caller it lets through, so a refused one waits for nothing, and one
/// `from_fn` layer serves both): on an operation of [`ACKED`] that needs
/// replicas, runs the handler in an ack scope and confirms a 2xx answer
/// with `WAIT`.
pub(crate) async fn around(s: &AppState, req: Request, next: Next) -> Response {
    let acked = req
        .extensions()
        .get::<MatchedPath>()
        .is_some_and(|p| is_acked(req.method().as_str(), p.as_str()));
    if !acked {
        return next.run(req).await;
    }
    let n = match replicas(req.headers().get_all(HEADER), s.cfg.redis.ack_replicas) {
        Ok(n) => n,
        Err(e) => return e.into_response(),
    };
    if n == 0 {
        return next.run(req).await;
    }
    let path_id = task_path_id(req.uri().path());
    let scope = AckScope::default();
    let mut resp = s.store.in_ack_scope(&scope, next.run(req)).await;
    if !resp.status().is_success() {
        return resp;
    }
    let wait = std::time::Duration::from_millis(s.cfg.redis.ack_timeout_ms);
    match s.store.confirm_replicated(&scope, n, wait).await {
        Confirmation::Replicated(k) => {
            resp.headers_mut().insert(REPLICAS_HEADER, HeaderValue::from(k));
            resp
        }
        Confirmation::Short(k) => {
            let detail = format!(
                "the change was applied on the Redis master, but only {k} of the {n} replicas required confirmed it \
                 within {} ms (redis.ack_timeout_ms): it may be lost if the master fails now. Retry the request \
                 (a submit with the same Idempotency-Key returns the same task) to learn whether it survived",
                wait.as_millis()
            );
            not_replicated(resp, &detail, n, Some(k), path_id).await
        }
        Confirmation::Unknown(why) => {
            tracing::warn!(error = %why, "a replicated acknowledgement failed");
            let detail = format!(
                "the change may have been applied on the Redis master, but whether {n} replicas have it is \
                 unknown ({why}). Retry the request (a submit with the same Idempotency-Key returns the same \
                 task) to learn whether it survived"
            );
            not_replicated(resp, &detail, n, None, path_id).await
        }
    }
}

/// `{id}` of `/api/v1/tasks/{id}/...`: the task a complete, fail, cancel or
/// retry changed.
fn task_path_id(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/api/v1/tasks/")?;
    let (id, _) = rest.split_once('/')?;
    Some(id.to_string())
}

/// Longest success body carried into the 503 (a batch of 1000 answers is far
/// below it).
const MAX_RESULT_BYTES: usize = 4 * 1024 * 1024;

/// The 503 for a change that was not confirmed: `replicated: false`, the
/// replicas required and confirmed, the task id where there is one, and the
/// body the success would have had as `result`.
async fn not_replicated(
    resp: Response,
    detail: &str,
    required: u32,
    acked: Option<u32>,
    path_id: Option<String>,
) -> Response {
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), MAX_RESULT_BYTES)
        .await
        .unwrap_or_default();
    let result: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let mut extra = Map::new();
    extra.insert("replicated".into(), json!(false));
    extra.insert("replicas_required".into(), json!(required));
    extra.insert("replicas_acked".into(), json!(acked));
    let task_id = path_id.or_else(|| {
        // A submit: the new (or replayed) task's id.
        result
            .get("id")
            .and_then(Value::as_str)
            .filter(|_| result.get("queue").is_some())
            .map(str::to_string)
    });
    if let Some(id) = task_id {
        extra.insert("task_id".into(), json!(id));
    }
    extra.insert("result_status".into(), json!(status.as_u16()));
    extra.insert("result".into(), result);
    let mut out = problem(StatusCode::SERVICE_UNAVAILABLE, detail, Some(&extra));
    out.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    out
}
