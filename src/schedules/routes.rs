//! REST routes of the schedules.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{Schedule, ScheduleDef, ScheduleError, Triggered};
use muster_api::Name;
use muster_api::schedules::ScheduleList;

use crate::app::AppState;
use crate::auth::{AdminCaller, ReadCaller};
use crate::error::{ApiError, Result};
use crate::http::{ApiJson, ApiQuery, Path, no_content};
use crate::schedules::Schedules;
use crate::validate;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_schedules, create_schedule))
        .routes(routes!(get_schedule, put_schedule, delete_schedule))
        .routes(routes!(trigger_schedule))
        .routes(routes!(enable_schedule))
        .routes(routes!(disable_schedule))
}

/// Every schedule with its next fire times and totals.
#[utoipa::path(get, path = "/api/v1/schedules", tag = "schedules", security(("bearer" = ["read"]), ("session" = ["read"])),
    responses((status = 200, body = ScheduleList)))]
async fn list_schedules(State(schedules): State<Arc<Schedules>>, _caller: ReadCaller) -> Result<Json<ScheduleList>> {
    Ok(Json(ScheduleList {
        schedules: schedules.list().await?,
    }))
}

/// Creates a schedule. It fires the occurrences after its creation.
#[utoipa::path(post, path = "/api/v1/schedules", tag = "schedules", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    request_body = ScheduleDef,
    responses((status = 201, body = Schedule, description = "Created"),
               (status = 400, description = "Invalid id, expression, time zone, queue or task"),
               (status = 409, description = "The id exists, is defined in config.toml, too many schedules, or its task names a flow-control limit not defined")))]
async fn create_schedule(
    State(s): State<AppState>,
    caller: AdminCaller,
    ApiJson(def): ApiJson<ScheduleDef>,
) -> Result<Response> {
    let c = s.schedules.check(&def)?;
    s.schedules.create(&c, &caller.name).await?;
    let created = s
        .schedules
        .get(&def.id, 0)
        .await?
        .ok_or_else(|| ApiError::internal("the schedule vanished right after it was created"))?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct GetParams {
    /// History entries to include, newest first: 0 to 1000, default 50.
    pub history: Option<usize>,
}

/// One schedule with its recent history (fired, skipped and missed occurrences).
#[utoipa::path(get, path = "/api/v1/schedules/{id}", tag = "schedules", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("id" = String, Path, description = "Schedule id"), GetParams),
    responses((status = 200, body = Schedule), (status = 404, description = "Unknown schedule")))]
async fn get_schedule(
    State(schedules): State<Arc<Schedules>>,
    _caller: ReadCaller,
    Path(id): Path<Name>,
    ApiQuery(p): ApiQuery<GetParams>,
) -> Result<Json<Schedule>> {
    let history = p.history.unwrap_or(50);
    validate::in_range("history", history, &validate::SCHEDULE_HISTORY)?;
    schedules
        .get(&id, history)
        .await?
        .map(Json)
        .ok_or_else(|| ScheduleError::NotFound(id.into_string()).into())
}

/// Creates or replaces a schedule. A replaced schedule keeps its cursor:
/// occurrences that already have an outcome are not fired again.
#[utoipa::path(put, path = "/api/v1/schedules/{id}", tag = "schedules", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("id" = String, Path, description = "Schedule id")),
    request_body = ScheduleDef,
    responses((status = 200, body = Schedule, description = "Replaced"),
               (status = 201, body = Schedule, description = "Created"),
               (status = 400, description = "Invalid field, or the body's id differs from the path"),
               (status = 409, description = "Defined in config.toml, too many schedules, or its task names a flow-control limit not defined")))]
async fn put_schedule(
    State(s): State<AppState>,
    caller: AdminCaller,
    Path(id): Path<Name>,
    ApiJson(mut def): ApiJson<ScheduleDef>,
) -> Result<Response> {
    if def.id.is_empty() {
        def.id = id.to_string();
    } else if def.id != id.as_str() {
        return Err(ApiError::bad_request(format!(
            "the body's `id` ({}) differs from the path ({id}); leave it out or make them equal",
            validate::shorten(&def.id)
        )));
    }
    let c = s.schedules.check(&def)?;
    let created = s.schedules.put(&c, &caller.name).await?;
    let view = s
        .schedules
        .get(&id, 0)
        .await?
        .ok_or_else(|| ApiError::internal("the schedule vanished right after it was written"))?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(view)).into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeleteParams {
    /// Delete a schedule written from config.toml too: for one whose entry
    /// was removed from every node's config (a node whose config still lists
    /// it refuses, and would write it back at its next start).
    pub force: Option<bool>,
}

/// Deletes a schedule and its history. Its tasks live on.
#[utoipa::path(delete, path = "/api/v1/schedules/{id}", tag = "schedules", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("id" = String, Path, description = "Schedule id"), DeleteParams),
    responses((status = 204, description = "Deleted"), (status = 404, description = "Unknown schedule"),
               (status = 409, description = "Written from config.toml (without `force`), or defined in this node's config.toml")))]
async fn delete_schedule(
    State(schedules): State<Arc<Schedules>>,
    caller: AdminCaller,
    Path(id): Path<Name>,
    ApiQuery(p): ApiQuery<DeleteParams>,
) -> Result<Response> {
    schedules.delete(&id, &caller.name, p.force.unwrap_or(false)).await?;
    Ok(no_content())
}

/// Fires the schedule now, outside its expression. The overlap policy
/// applies: with `forbid` and a live previous task the answer is 409. With
/// an `Idempotency-Key`, a retry within `tasks.idempotency_window_ms`
/// returns the first call's task (200, `replayed`) and fires nothing.
#[utoipa::path(post, path = "/api/v1/schedules/{id}/trigger", tag = "schedules", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("id" = String, Path, description = "Schedule id"),
           ("Idempotency-Key" = Option<String>, Header,
            description = "1 to 200 printable ASCII characters; the same key returns the same task")),
    responses((status = 201, body = Triggered, description = "Fired"),
               (status = 200, body = Triggered, description = "Replay of an Idempotency-Key: the earlier trigger's task"),
               (status = 400, description = "Invalid Idempotency-Key"),
               (status = 404, description = "Unknown schedule"),
               (status = 409, description = "Skipped by the overlap policy (the live task is in `task`), or too many queues")))]
async fn trigger_schedule(
    State(schedules): State<Arc<Schedules>>,
    caller: AdminCaller,
    Path(id): Path<Name>,
    headers: HeaderMap,
) -> Result<Response> {
    let key = crate::tasks::routes::idempotency_header(&headers)?;
    let t = schedules.trigger(&id, &caller.name, key.as_deref()).await?;
    let status = if t.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(t)).into_response())
}

/// Enables a schedule: it fires the occurrences after now (those while it was
/// disabled are neither run nor counted as missed).
#[utoipa::path(post, path = "/api/v1/schedules/{id}/enable", tag = "schedules", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("id" = String, Path, description = "Schedule id")),
    responses((status = 204, description = "Enabled"), (status = 404, description = "Unknown schedule")))]
async fn enable_schedule(
    State(schedules): State<Arc<Schedules>>,
    caller: AdminCaller,
    Path(id): Path<Name>,
) -> Result<Response> {
    schedules.set_enabled(&id, true, &caller.name).await?;
    Ok(no_content())
}

/// Disables a schedule: it fires nothing until enabled.
#[utoipa::path(post, path = "/api/v1/schedules/{id}/disable", tag = "schedules", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("id" = String, Path, description = "Schedule id")),
    responses((status = 204, description = "Disabled"), (status = 404, description = "Unknown schedule")))]
async fn disable_schedule(
    State(schedules): State<Arc<Schedules>>,
    caller: AdminCaller,
    Path(id): Path<Name>,
) -> Result<Response> {
    schedules.set_enabled(&id, false, &caller.name).await?;
    Ok(no_content())
}
