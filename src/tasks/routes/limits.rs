//! Flow-control limits (G13): `/api/v1/limits` and a queue's limits.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use muster_api::bounds::{LIMIT_CONCURRENCY, LIMIT_RATE_MAX, LIMIT_RATE_PER_MS};
use muster_api::limits::{LimitInfo, LimitList, LimitSpec, QueueLimits};
use muster_api::{LimitName, Name};

use crate::auth::{AdminCaller, ReadCaller};
use crate::error::{ApiError, Result};
use crate::http::{ApiJson, Path, no_content};
use crate::tasks::Tasks;

/// Every limit and template, with its use now.
#[utoipa::path(get, path = "/api/v1/limits", tag = "limits", security(("bearer" = ["read"]), ("session" = ["read"])),
    responses((status = 200, body = LimitList)))]
pub(super) async fn list_limits(State(tasks): State<Arc<Tasks>>, _caller: ReadCaller) -> Result<Json<LimitList>> {
    Ok(Json(LimitList {
        limits: tasks.limits().await?,
    }))
}

/// A limit, a template (`name:*`) or a template's key (`name:key`): its
/// settings and its use now (running, tokens left, tasks waiting on it).
#[utoipa::path(get, path = "/api/v1/limits/{name}", tag = "limits", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("name" = String, Path, description = "`name`, `name:key` or `name:*`; each part [A-Za-z0-9._-]{1,128}")),
    responses((status = 200, body = LimitInfo), (status = 404, description = "Not defined")))]
pub(super) async fn get_limit(
    State(tasks): State<Arc<Tasks>>,
    _caller: ReadCaller,
    Path(name): Path<LimitName>,
) -> Result<Json<LimitInfo>> {
    Ok(Json(tasks.limit(&name).await?))
}

/// The bounds of a limit's settings, said once for every refusal.
const SPEC_HINT: &str = "send {\"concurrency\": 1 to 100000 or null, \"rate\": {\"max\": 1 to 1000000, \"per_ms\": 1 to \
                         86400000, \"burst\": 1 to 1000000} or null}, at least one of the two";

fn check(spec: &LimitSpec) -> std::result::Result<(), String> {
    if spec.concurrency.is_none() && spec.rate.is_none() {
        return Err("a limit needs `concurrency`, `rate` or both".into());
    }
    if let Some(c) = spec.concurrency
        && !LIMIT_CONCURRENCY.contains(&c)
    {
        return Err(format!(
            "`concurrency` must be 1 to {} (got {c})",
            LIMIT_CONCURRENCY.end()
        ));
    }
    if let Some(r) = spec.rate {
        if !LIMIT_RATE_MAX.contains(&r.max) {
            return Err(format!(
                "`rate.max` must be 1 to {} (got {})",
                LIMIT_RATE_MAX.end(),
                r.max
            ));
        }
        if !LIMIT_RATE_PER_MS.contains(&r.per_ms) {
            return Err(format!(
                "`rate.per_ms` must be 1 to {} (got {})",
                LIMIT_RATE_PER_MS.end(),
                r.per_ms
            ));
        }
        if !LIMIT_RATE_MAX.contains(&r.burst) {
            return Err(format!(
                "`rate.burst` must be 1 to {} (got {})",
                LIMIT_RATE_MAX.end(),
                r.burst
            ));
        }
    }
    Ok(())
}

/// Defines or changes a limit, or a template `name:*` whose settings every
/// key `name:<key>` gets (each key its own bucket and slots, made on first
/// use). A key given settings of its own (`tenant:big`) keeps them over its
/// template's. 201 when created. A change keeps the bucket and the slots held.
#[utoipa::path(put, path = "/api/v1/limits/{name}", tag = "limits", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("name" = String, Path, description = "`name`, a template `name:*`, or a template's key `name:key` given settings of its own; each part [A-Za-z0-9._-]{1,128}")),
    request_body = LimitSpec,
    responses((status = 200, body = LimitInfo, description = "Changed"), (status = 201, body = LimitInfo, description = "Created"),
               (status = 400, description = "A bad setting"),
               (status = 409, description = "Too many limits (`tasks.max_limits`)")))]
pub(super) async fn put_limit(
    State(tasks): State<Arc<Tasks>>,
    caller: AdminCaller,
    Path(name): Path<LimitName>,
    ApiJson(spec): ApiJson<LimitSpec>,
) -> Result<Response> {
    check(&spec).map_err(|m| ApiError::bad_request(format!("{m}; {SPEC_HINT}")))?;
    let (info, created) = tasks.set_limit(&name, &spec, &caller.name).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(info)).into_response())
}

/// Removes a limit or template. Tasks running under it keep their slots
/// until they end; queues and tasks that name it are no longer held by it.
#[utoipa::path(delete, path = "/api/v1/limits/{name}", tag = "limits", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("name" = String, Path, description = "`name` or `name:*`")),
    responses((status = 204, description = "Removed"), (status = 404, description = "Not defined")))]
pub(super) async fn delete_limit(
    State(tasks): State<Arc<Tasks>>,
    caller: AdminCaller,
    Path(name): Path<LimitName>,
) -> Result<Response> {
    tasks.delete_limit(&name, &caller.name).await?;
    Ok(no_content())
}

/// The limits that bind every task of a queue.
#[utoipa::path(get, path = "/api/v1/queues/{queue}/limits", tag = "limits", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("queue" = String, Path, description = "Queue name")),
    responses((status = 200, body = QueueLimits)))]
pub(super) async fn get_queue_limits(
    State(tasks): State<Arc<Tasks>>,
    _caller: ReadCaller,
    Path(queue): Path<Name>,
) -> Result<Json<QueueLimits>> {
    Ok(Json(QueueLimits {
        limits: tasks.queue_limits(&queue).await?,
    }))
}

/// Sets the limits that bind every task of a queue, on top of each task's
/// own; one limit named by several queues is shared by them. An empty list
/// removes them.
#[utoipa::path(put, path = "/api/v1/queues/{queue}/limits", tag = "limits", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("queue" = String, Path, description = "Queue name")),
    request_body = QueueLimits,
    responses((status = 200, body = QueueLimits), (status = 400, description = "A bad name"),
               (status = 409, description = "A limit not defined")))]
pub(super) async fn put_queue_limits(
    State(tasks): State<Arc<Tasks>>,
    caller: AdminCaller,
    Path(queue): Path<Name>,
    ApiJson(body): ApiJson<QueueLimits>,
) -> Result<Json<QueueLimits>> {
    crate::validate::limit_list("limits", &body.limits, 0)?;
    tasks.set_queue_limits(&queue, &body.limits, &caller.name).await?;
    Ok(Json(body))
}
