//! Probes, metrics, the Redis summary and the OpenAPI document.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::AppState;
use crate::auth::ReadCaller;
use crate::error::{ApiError, Result, problem};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(get_redis))
        .routes(routes!(openapi))
}

#[derive(Serialize, ToSchema)]
pub(crate) struct Status {
    pub status: &'static str,
    pub node: String,
    /// Split namespaces (`redis.shards`): the shards this node cannot serve
    /// now (their master does not answer, or this node's registration there
    /// may have lapsed). The node is ready while any shard serves; work in
    /// these shards is refused until they recover. Absent when every shard
    /// serves.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failing_shards: Vec<usize>,
}

/// Liveness: the process serves HTTP.
#[utoipa::path(get, path = "/healthz", tag = "system", security(()),
    responses((status = 200, description = "The process is up", body = Status)))]
async fn healthz(State(s): State<AppState>) -> Json<Status> {
    Json(Status {
        status: "ok",
        node: s.node_id.to_string(),
        failing_shards: Vec::new(),
    })
}

/// This node's readiness: why it is not ready (empty when it is), and the
/// shards it cannot serve now (each shard's master is pinged at once).
pub(crate) async fn readiness(s: &AppState) -> (Vec<String>, Vec<usize>) {
    let mut reasons = Vec::new();
    if s.health.stopping() {
        reasons.push("the node is shutting down".to_string());
    }
    if let Some(e) = &s.embedded
        && !e.healthy()
    {
        reasons.push("the embedded Redis is down and being restarted".to_string());
    }
    // Bounded well below a probe's usual timeout: a stalled master must not
    // make the probe of a node that serves other shards time out.
    let bound = s.store.timeout().min(std::time::Duration::from_secs(1));
    let pings = futures_util::future::join_all(s.store.every_shard().map(|sh| async move {
        tokio::time::timeout(bound, sh.ping()).await.unwrap_or_else(|_| {
            Err(crate::store::StoreError::Unavailable(format!(
                "no PONG within {bound:?}"
            )))
        })
    }))
    .await;
    let mut failing: Vec<usize> = s.health.failing_shards();
    let mut first_error = None;
    for (i, p) in pings.into_iter().enumerate() {
        if let Err(e) = p {
            failing.push(i);
            first_error.get_or_insert(e);
        }
    }
    failing.sort_unstable();
    failing.dedup();
    if failing.len() == s.store.shard_count() {
        match first_error {
            Some(e) => reasons.push(format!("Redis is unreachable: {e}")),
            None => reasons.push("no shard serves: this node's heartbeats fail in every one".to_string()),
        }
    }
    if !s.health.registered() {
        reasons.push("the node is not registered: its last heartbeat did not succeed within the node ttl".to_string());
    }
    (reasons, failing)
}

/// Why this node is not ready, or None when it is.
pub(crate) async fn not_ready_reasons(s: &AppState) -> Vec<String> {
    readiness(s).await.0
}

/// Readiness: Redis answers and this node's registration is fresh. On a
/// split namespace the node stays ready while any shard serves, and the
/// body names the shards that do not (`failing_shards`).
#[utoipa::path(get, path = "/readyz", tag = "system", security(()),
    responses((status = 200, description = "Ready", body = Status),
              (status = 503, description = "Not ready; `detail` says why", content_type = "application/problem+json")))]
async fn readyz(State(s): State<AppState>) -> Response {
    let (reasons, failing) = readiness(&s).await;
    if reasons.is_empty() {
        Json(Status {
            status: "ready",
            node: s.node_id.to_string(),
            failing_shards: failing,
        })
        .into_response()
    } else {
        problem(StatusCode::SERVICE_UNAVAILABLE, &reasons.join("; "), None)
    }
}

/// Prometheus metrics in the text format.
#[utoipa::path(get, path = "/metrics", tag = "system", security(("bearer" = ["read"]), ("session" = ["read"])),
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain")))]
async fn metrics(State(s): State<AppState>, _caller: ReadCaller) -> Result<Response> {
    s.tracer.publish_counts();
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::telemetry::render(s.metrics.render()),
    )
        .into_response())
}

pub(crate) use muster_api::system::RedisSummary;

pub(crate) async fn redis_summary(s: &AppState) -> Result<RedisSummary> {
    let latency = s.store.ping().await?;
    let state = s.store.server_state().await?;
    let info = s.store.server_info();
    Ok(RedisSummary {
        mode: s.store.mode().as_str().into(),
        address: s.store.address(),
        version: info.version,
        role: state.role,
        latency_ms: latency.as_secs_f64() * 1000.0,
        healthy: s.store.healthy(),
        key_prefix: s.cfg.redis.key_prefix.clone(),
        used_memory: state.used_memory,
        dbsize: Some(state.dbsize),
    })
}

/// How this node reaches Redis, and how Redis is doing.
#[utoipa::path(get, path = "/api/v1/redis", tag = "system", security(("bearer" = ["read"]), ("session" = ["read"])),
    responses((status = 200, body = RedisSummary),
              (status = 503, description = "Redis unreachable", content_type = "application/problem+json")))]
async fn get_redis(State(s): State<AppState>, _caller: ReadCaller) -> Result<Json<RedisSummary>> {
    Ok(Json(redis_summary(&s).await?))
}

/// This document.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "system", security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json")))]
async fn openapi(State(s): State<AppState>) -> Response {
    let doc = s.openapi.get().cloned().unwrap_or_else(|| "{}".into());
    ([(header::CONTENT_TYPE, "application/json")], doc).into_response()
}

/// Unknown routes: a problem for the API, the same for pages.
pub(crate) async fn not_found() -> ApiError {
    ApiError::not_found("no such route; the API is described at /api/v1/openapi.json")
}
