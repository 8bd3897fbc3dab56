//! HTTP plumbing shared by every route: request ids, metrics by matched
//! path, problem+json for framework errors, and the JSON extractor whose
//! rejections are problems too.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{LazyLock, Mutex};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{FromRequest, MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, REQUEST_ID, problem};

pub(crate) static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The edge of every request, around everything else (called once per
/// request by the server's connection loop with the rest of the surface as
/// `inner`: no layer, no boxed service; BENCHMARKS.md, issue 41):
///
/// - gives it an id (the caller's `x-request-id` when it is sane, else a new
///   ULID), visible to error bodies and logs, and echoed on the response;
/// - refuses a request target over [`MAX_URI_BYTES`] with 414 problem+json;
/// - answers a panic below it (none should be reachable from a request;
///   this is the last line of defence) with 500 problem+json;
/// - sets the browser hardening headers on every response (pages, assets
///   and API alike: they are harmless on JSON); a handler's own value wins.
pub(crate) async fn edge<F, Fut>(req: Request, inner: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: Future<Output = Response>,
{
    let id = req
        .headers()
        .get(&X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| (1..=64).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)))
        .map(str::to_string)
        .unwrap_or_else(|| ulid::Ulid::generate().to_string());
    let echoed = HeaderValue::from_str(&id).ok();
    let mut resp = REQUEST_ID
        .scope(id, async move {
            let len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
            if len > MAX_URI_BYTES {
                return problem(
                    StatusCode::URI_TOO_LONG,
                    &format!("the request target is {len} bytes; the limit is {MAX_URI_BYTES}"),
                    None,
                );
            }
            // `inner` is called inside the guard too: a panic while it
            // builds its future is caught as well as one while it runs.
            match AssertUnwindSafe(async move { inner(req).await }).catch_unwind().await {
                Ok(resp) => resp,
                Err(panic) => panic_response(panic),
            }
        })
        .await;
    let h = resp.headers_mut();
    if let Some(v) = echoed {
        h.insert(X_REQUEST_ID.clone(), v);
    }
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
    ] {
        if !h.contains_key(&name) {
            h.insert(name, HeaderValue::from_static(value));
        }
    }
    resp
}

/// Longest accepted request target (path and query), in bytes. Longer ones
/// get 414 problem+json here; hyper itself refuses targets of 65534 bytes
/// and more, with an empty 414 (see docs/configuration.md, Security).
pub(crate) const MAX_URI_BYTES: usize = 8 * 1024;

/// The policy of every response: scripts, styles and everything else only
/// from this node (no inline script or style, so an injected tag runs
/// nothing), WebSockets back to this node, no framing by any site, forms
/// posting only here.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// The `method` label: one of the standard methods, else `other`. hyper
/// accepts any token as a method and this runs before authentication, so
/// the raw method would let anyone add series without bound (issue 36, N2).
pub(crate) fn method_label(m: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// Counts a request and its duration by method, matched route and status
/// (called by the route-level middleware, `traces::around`, with the
/// request's [`MatchedPath`] and [`method_label`]). Every label is bounded:
/// the route template (`/api/v1/tasks/{id}`, or `unmatched`), never the raw
/// path; the method from [`method_label`]; the status a number below 1000.
pub(crate) fn count_request(method: &'static str, path: Option<&MatchedPath>, status: StatusCode, start: Instant) {
    let path = path.map_or("unmatched", MatchedPath::as_str);
    let (count, time) = request_metrics(method, path, status.as_u16());
    count.increment(1);
    time.record(start.elapsed().as_secs_f64());
}

/// The request metrics' handles by method, status and route, registered once
/// per process: `counter!` with labels hashes them and copies them into the
/// registry's key on every call (about 8 000 instructions a request for the
/// two; BENCHMARKS.md, issue 41). Bounded as their labels are. The recorder
/// is installed before any node serves (`node::metrics_handle`).
fn request_metrics(method: &'static str, path: &str, status: u16) -> (metrics::Counter, metrics::Histogram) {
    type Handles = HashMap<(&'static str, u16), HashMap<Box<str>, (metrics::Counter, metrics::Histogram)>>;
    static HANDLES: LazyLock<Mutex<Handles>> = LazyLock::new(Default::default);
    let mut all = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    let by_path = all.entry((method, status)).or_default();
    if let Some(h) = by_path.get(path) {
        return h.clone();
    }
    let h = (
        metrics::counter!("muster_http_requests_total", "method" => method, "path" => path.to_string(),
            "status" => status.to_string()),
        metrics::histogram!("muster_http_request_duration_seconds", "method" => method, "path" => path.to_string()),
    );
    by_path.insert(path.into(), h.clone());
    h
}

/// Turns error responses produced outside our handlers (unknown route, wrong
/// method, body over the limit, bad path or query) into problem+json.
/// (Called by `web::errors::html_errors`, which sees every response below
/// the edge: one step for both rewrites.)
pub(crate) async fn problemize(resp: Response) -> Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let ctype = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ctype.starts_with("application/problem+json") || ctype.starts_with("text/html") {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_string();
    let detail = match status {
        StatusCode::NOT_FOUND if text.is_empty() => {
            "no such route; the API is described at /api/v1/openapi.json".to_string()
        }
        StatusCode::METHOD_NOT_ALLOWED => {
            let allowed = parts
                .headers
                .get(header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            format!("method not allowed on this route; allowed: {allowed}")
        }
        StatusCode::PAYLOAD_TOO_LARGE => {
            "the request body is larger than the limit (server.max_body_bytes); send less".to_string()
        }
        _ if text.is_empty() => status.canonical_reason().unwrap_or("error").to_string(),
        _ => text,
    };
    let mut out = problem(status, &detail, None);
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

/// Turns a panic inside a handler into a 500 problem (no panic should be
/// reachable from a request; this is the last line of defence).
fn panic_response(err: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into());
    ApiError::Internal(format!("handler panicked: {msg}")).into_response()
}

/// `Json<T>` whose rejections are problem+json with a useful message.
pub(crate) struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request<Body>, state: &S) -> Result<Self, Self::Rejection> {
        use axum::extract::rejection::JsonRejection;
        if !json_content_type(req.headers()) {
            return Err(ApiError::UnsupportedMediaType(
                "send the body as JSON with `Content-Type: application/json`".into(),
            ));
        }
        let bytes = match axum::body::Bytes::from_request(req, state).await {
            Ok(b) => b,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                return Err(ApiError::TooLarge(
                    "the request body is larger than the limit (server.max_body_bytes); send less".into(),
                ));
            }
            Err(e) => return Err(ApiError::bad_request(e.body_text())),
        };
        match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(JsonRejection::JsonSyntaxError(e)) => Err(ApiError::bad_request(format!(
                "the body is not valid JSON: {}",
                e.body_text()
            ))),
            // `4197.0` where an integer belongs: JSON Schema calls it an
            // integer, so it is read as one (src/lenient.rs).
            Err(JsonRejection::JsonDataError(e)) if crate::lenient::refused_a_float(&e.body_text()) => {
                crate::lenient::json(&bytes).map(ApiJson).map_err(|text| {
                    ApiError::bad_request(format!("the JSON does not match the expected fields: {text}"))
                })
            }
            Err(JsonRejection::JsonDataError(e)) => Err(ApiError::bad_request(format!(
                "the JSON does not match the expected fields: {}",
                e.body_text()
            ))),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// `application/json` or `application/<anything>+json`, parameters ignored
/// (as axum's `Json` decides it).
fn json_content_type(headers: &axum::http::HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let Some(subtype) = essence.strip_prefix("application/") else {
        return false;
    };
    subtype == "json" || (subtype.ends_with("+json") && subtype.len() > "+json".len())
}

/// An optional JSON body: an empty body is `T::default()`.
pub(crate) struct OptJson<T>(pub T);

impl<T, S> FromRequest<S> for OptJson<T>
where
    T: DeserializeOwned + Default,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request<Body>, state: &S) -> Result<Self, Self::Rejection> {
        let empty = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()) == Some("0")
            || (req.headers().get(header::CONTENT_TYPE).is_none()
                && req.headers().get(header::TRANSFER_ENCODING).is_none()
                && req.headers().get(header::CONTENT_LENGTH).is_none());
        if empty {
            return Ok(OptJson(T::default()));
        }
        let ApiJson(v) = ApiJson::<T>::from_request(req, state).await?;
        Ok(OptJson(v))
    }
}

/// Query-string extractor whose rejections are problems.
pub(crate) struct ApiQuery<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            // `limit=10.0` where an integer belongs (src/lenient.rs).
            Err(e) => match crate::lenient::query(parts.uri.query().unwrap_or("")) {
                Ok(v) => Ok(ApiQuery(v)),
                Err(_) => Err(ApiError::bad_request(format!("bad query string: {}", e.body_text()))),
            },
        }
    }
}

/// A path whose parameters are checked by their types before the handler
/// runs: `Path<Name>`, `Path<NodeId>`, `Path<TaskId>`, a type that names one
/// of a fixed set (a static asset, a failover message kind), or a tuple of
/// them in the route's order. A parameter that is not what its type requires
/// is a 400 problem naming it, as the handler's own checks would have said;
/// one that names nothing there is, a 404.
pub(crate) struct Path<T>(pub T);

/// One path parameter, taken from its (percent-decoded) text.
pub(crate) trait FromPathParam: Sized {
    fn from_param(key: &str, value: &str) -> Result<Self, crate::problem::Invalid>;
}

impl FromPathParam for String {
    fn from_param(_key: &str, value: &str) -> Result<Self, crate::problem::Invalid> {
        Ok(value.to_string())
    }
}

/// The checked type's own rule decides (one pass over the text); only a
/// refusal asks `explain` for the message that names the parameter.
fn checked<T: TryFrom<String>>(
    value: &str,
    explain: impl FnOnce() -> crate::problem::Invalid,
) -> Result<T, crate::problem::Invalid> {
    T::try_from(value.to_string()).map_err(|_| explain())
}

impl FromPathParam for muster_api::Name {
    fn from_param(key: &str, value: &str) -> Result<Self, crate::problem::Invalid> {
        checked(value, || {
            crate::validate::name(key, value)
                .err()
                .unwrap_or_else(|| crate::problem::Invalid::new(format!("`{key}` is not a name")))
        })
    }
}

impl FromPathParam for muster_api::NodeId {
    fn from_param(key: &str, value: &str) -> Result<Self, crate::problem::Invalid> {
        checked(value, || {
            crate::validate::node_id(key, value)
                .err()
                .unwrap_or_else(|| crate::problem::Invalid::new(format!("`{key}` is not a node id")))
        })
    }
}

impl FromPathParam for muster_api::LimitName {
    fn from_param(key: &str, value: &str) -> Result<Self, crate::problem::Invalid> {
        checked(value, || {
            crate::problem::Invalid::new(format!(
                "`{key}` must be a limit name: a name, `name:key` or a template `name:*`, each part 1 to \
                 {} characters from A-Z a-z 0-9 . _ -",
                muster_api::bounds::NAME_MAX_LEN
            ))
        })
    }
}

impl FromPathParam for muster_api::TaskId {
    fn from_param(key: &str, value: &str) -> Result<Self, crate::problem::Invalid> {
        checked(value, || {
            crate::problem::Invalid::new(format!(
                "`{key}` must be a 26-character id of letters and digits (got {})",
                crate::validate::shorten(value)
            ))
        })
    }
}

/// The whole of a route's parameters.
pub(crate) trait FromPathParams: Sized {
    fn from_params(params: &[(&str, &str)]) -> Result<Self, crate::problem::Invalid>;
}

macro_rules! one_param {
    ($($t:ty),*) => {$(
        impl FromPathParams for $t {
            fn from_params(params: &[(&str, &str)]) -> Result<Self, crate::problem::Invalid> {
                one(params)
            }
        }
    )*};
}
one_param!(
    String,
    muster_api::Name,
    muster_api::NodeId,
    muster_api::TaskId,
    muster_api::LimitName
);

/// [`FromPathParams`] of a route whose one parameter is `T` (for a type
/// defined beside its route).
pub(crate) fn one<T: FromPathParam>(params: &[(&str, &str)]) -> Result<T, crate::problem::Invalid> {
    match params {
        [(k, v)] => T::from_param(k, v),
        _ => Err(crate::problem::Invalid::new("this route takes one path parameter")),
    }
}

impl<A: FromPathParam, B: FromPathParam> FromPathParams for (A, B) {
    fn from_params(params: &[(&str, &str)]) -> Result<Self, crate::problem::Invalid> {
        match params {
            [(ka, va), (kb, vb)] => Ok((A::from_param(ka, va)?, B::from_param(kb, vb)?)),
            _ => Err(crate::problem::Invalid::new("this route takes two path parameters")),
        }
    }
}

impl<T, S> axum::extract::FromRequestParts<S> for Path<T>
where
    T: FromPathParams,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Self::Rejection> {
        let raw = axum::extract::RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("bad path: {}", e.body_text())))?;
        let params: Vec<(&str, &str)> = raw.iter().collect();
        Ok(Path(T::from_params(&params)?))
    }
}

/// A 204 with no body.
pub(crate) fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str) -> Request {
        Request::builder()
            .uri("/api/v1/anything")
            .header(&X_REQUEST_ID, id)
            .body(Body::empty())
            .unwrap()
    }

    async fn body(resp: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(resp.into_body(), 64 * 1024).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// The last line of defence: a panic below the edge, while the handler
    /// runs or while its future is built, is a 500 problem under the
    /// request's id, with the edge's headers, and the server goes on.
    #[tokio::test]
    async fn a_panic_below_the_edge_is_a_500_problem_under_the_requests_id() {
        let running = edge(request("panics-running"), |_| async { panic!("boom while running") }).await;
        let building = edge(request("panics-building"), |_| -> std::future::Ready<Response> {
            panic!("boom while building")
        })
        .await;
        for (resp, id) in [(running, "panics-running"), (building, "panics-building")] {
            assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
            assert_eq!(resp.headers()[&X_REQUEST_ID], id);
            assert_eq!(resp.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert!(
                resp.headers()[header::CONTENT_TYPE]
                    .to_str()
                    .unwrap()
                    .starts_with("application/problem+json")
            );
            let problem = body(resp).await;
            assert_eq!(problem["status"], 500);
            assert_eq!(problem["request_id"], id);
        }
        // And a request that does not panic is answered by `inner`, with
        // the id it gave and the headers added where it set none.
        let fine = edge(request("fine"), |req| async move {
            assert_eq!(crate::error::current_request_id(), "fine");
            let mut resp = (StatusCode::OK, req.uri().path().to_string()).into_response();
            resp.headers_mut()
                .insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("SAMEORIGIN"));
            resp
        })
        .await;
        assert_eq!(fine.status(), StatusCode::OK);
        assert_eq!(fine.headers()[header::X_FRAME_OPTIONS], "SAMEORIGIN");
        assert_eq!(fine.headers()[header::REFERRER_POLICY], "same-origin");
    }

    #[tokio::test]
    async fn a_target_over_the_bound_is_414_and_never_reaches_inner() {
        let long = format!("/api/v1/{}", "a".repeat(MAX_URI_BYTES));
        let req = Request::builder().uri(long).body(Body::empty()).unwrap();
        let resp = edge(req, |_| async { panic!("inner must not run") }).await;
        assert_eq!(resp.status(), StatusCode::URI_TOO_LONG);
        assert!(resp.headers().contains_key(&X_REQUEST_ID));
    }
}
