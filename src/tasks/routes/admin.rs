//! REST routes of the task store: listings, queues, single tasks, dead letters and groups.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use muster_api::tasks::{Cancelled as CancelResponse, GroupList, QueueDetail, QueueList};
use muster_api::{Name, TaskId};

use crate::auth::{AdminCaller, ReadCaller, WorkerCaller};
use crate::error::{ApiError, Result};
use crate::http::{ApiQuery, OptJson, Path, no_content};
use crate::tasks::Tasks;
use crate::tasks::{GroupInfo, STATES, Task, TaskError, TaskPage};
use crate::validate;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ListParams {
    /// queued, delayed, running, succeeded, cancelled or dead. Default queued.
    pub state: Option<String>,
    /// 1 to 500; default 50.
    pub limit: Option<usize>,
    /// From the previous page's `next_cursor`. At most 10 000 for state=queued
    /// (the listing of queued tasks goes that deep), else 1 000 000.
    pub cursor: Option<String>,
}

fn page_args(p: &ListParams) -> Result<(usize, usize)> {
    let limit = p.limit.unwrap_or(50);
    validate::in_range("limit", limit, &validate::TASK_PAGE_LIMIT)?;
    let cursor = match &p.cursor {
        None => 0,
        Some(c) => c
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request("`cursor` must come from `next_cursor`"))?,
    };
    if cursor > validate::TASK_CURSOR_MAX {
        return Err(ApiError::bad_request("`cursor` is out of range"));
    }
    Ok((limit, cursor))
}

/// Tasks of a queue in one state, a page at a time (two pipelined round trips).
/// Queued tasks come in claim order, down to the 10 000th.
#[utoipa::path(get, path = "/api/v1/queues/{queue}/tasks", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("queue" = String, Path, description = "Queue name"), ListParams),
    responses((status = 200, body = TaskPage),
               (status = 400, description = "Bad state, limit or cursor (at most 10000 for state=queued)")))]
pub(super) async fn list_tasks(
    State(tasks): State<Arc<Tasks>>,
    _caller: ReadCaller,
    Path(queue): Path<Name>,
    ApiQuery(p): ApiQuery<ListParams>,
) -> Result<Json<TaskPage>> {
    let state = p.state.clone().unwrap_or_else(|| "queued".into());
    if !STATES.contains(&state.as_str()) {
        return Err(ApiError::bad_request(format!(
            "`state` must be one of {}",
            STATES.join(", ")
        )));
    }
    let (limit, cursor) = page_args(&p)?;
    Ok(Json(tasks.list(&queue, &state, limit, cursor).await?))
}

/// Every queue with its counts.
#[utoipa::path(get, path = "/api/v1/queues", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])), responses((status = 200, body = QueueList)))]
pub(super) async fn list_queues(State(tasks): State<Arc<Tasks>>, _caller: ReadCaller) -> Result<Json<QueueList>> {
    Ok(Json(QueueList {
        queues: tasks.queues().await?,
    }))
}

/// One queue's counts and its groups.
#[utoipa::path(get, path = "/api/v1/queues/{queue}", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("queue" = String, Path, description = "Queue name")),
    responses((status = 200, body = QueueDetail)))]
pub(super) async fn get_queue(
    State(tasks): State<Arc<Tasks>>,
    _caller: ReadCaller,
    Path(queue): Path<Name>,
) -> Result<Json<QueueDetail>> {
    let stats = tasks.stats_for(&[queue.to_string()]).await?.pop().unwrap_or_default();
    let groups = tasks.groups(Some(&queue)).await?;
    Ok(Json(QueueDetail { stats, groups }))
}

/// Pauses a queue: claims get nothing until it is resumed.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/pause", tag = "tasks", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("queue" = String, Path, description = "Queue name")),
    responses((status = 204, description = "Paused")))]
pub(super) async fn pause_queue(
    State(tasks): State<Arc<Tasks>>,
    caller: AdminCaller,
    Path(queue): Path<Name>,
) -> Result<Response> {
    tasks.set_paused(&queue, true, &caller.name).await?;
    Ok(no_content())
}

/// Resumes a paused queue.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/resume", tag = "tasks", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("queue" = String, Path, description = "Queue name")),
    responses((status = 204, description = "Resumed")))]
pub(super) async fn resume_queue(
    State(tasks): State<Arc<Tasks>>,
    caller: AdminCaller,
    Path(queue): Path<Name>,
) -> Result<Response> {
    tasks.set_paused(&queue, false, &caller.name).await?;
    Ok(no_content())
}

/// One task with its attempts.
#[utoipa::path(get, path = "/api/v1/tasks/{id}", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("id" = String, Path, description = "Task id")),
    responses((status = 200, body = Task), (status = 404, description = "Unknown task")))]
pub(super) async fn get_task(
    State(tasks): State<Arc<Tasks>>,
    _caller: ReadCaller,
    Path(id): Path<TaskId>,
) -> Result<Json<Task>> {
    tasks
        .get(&id)
        .await?
        .map(Json)
        .ok_or_else(|| TaskError::NotFound(id.into_string()).into())
}

/// Discards a finished (succeeded, cancelled or dead) task now.
#[utoipa::path(delete, path = "/api/v1/tasks/{id}", tag = "tasks", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("id" = String, Path, description = "Task id")),
    responses((status = 204, description = "Deleted"), (status = 404, description = "Unknown task"),
               (status = 409, description = "Not finished")))]
pub(super) async fn delete_task(
    State(tasks): State<Arc<Tasks>>,
    caller: AdminCaller,
    Path(id): Path<TaskId>,
) -> Result<Response> {
    tasks.delete(&id, &caller.name).await?;
    Ok(no_content())
}

/// The task holding an alias.
#[utoipa::path(get, path = "/api/v1/aliases/{alias}", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("alias" = String, Path, description = "Alias")),
    responses((status = 200, body = Task), (status = 404, description = "No task holds this alias")))]
pub(super) async fn get_alias(
    State(tasks): State<Arc<Tasks>>,
    _caller: ReadCaller,
    Path(alias): Path<Name>,
) -> Result<Json<Task>> {
    let id = tasks.alias_holder(&alias).await?;
    let not_found = || ApiError::not_found(format!("no task holds the alias `{alias}`"));
    let id = id.ok_or_else(not_found)?;
    tasks.get(&id).await?.map(Json).ok_or_else(not_found)
}

/// Cancels a queued or delayed task; asks a running task's worker to stop
/// (it learns on its next heartbeat).
#[utoipa::path(post, path = "/api/v1/tasks/{id}/cancel", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("id" = String, Path, description = "Task id")),
    responses((status = 200, body = CancelResponse), (status = 409, description = "Already finished"),
               (status = 404, description = "Unknown task")))]
pub(super) async fn cancel_task(
    State(tasks): State<Arc<Tasks>>,
    caller: WorkerCaller,
    Path(id): Path<TaskId>,
) -> Result<Json<CancelResponse>> {
    let state = tasks.cancel(&id, &caller.name).await?;
    let cancel_requested = state == "running";
    Ok(Json(CancelResponse {
        state,
        cancel_requested,
    }))
}

/// Requeues a dead task with a fresh set of attempts.
#[utoipa::path(post, path = "/api/v1/tasks/{id}/retry", tag = "tasks", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("id" = String, Path, description = "Task id")),
    responses((status = 204, description = "Queued again"),
               (status = 409, description = "Not dead, or its queue was forgotten and the cluster has tasks.max_queues queues"),
               (status = 404, description = "Unknown task")))]
pub(super) async fn retry_task(
    State(tasks): State<Arc<Tasks>>,
    caller: AdminCaller,
    Path(id): Path<TaskId>,
) -> Result<Response> {
    tasks.retry(&id, &caller.name).await?;
    Ok(no_content())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct PageParams {
    /// 1 to 500; default 50.
    pub limit: Option<usize>,
    pub cursor: Option<String>,
}

/// Dead tasks of every queue, newest first.
#[utoipa::path(get, path = "/api/v1/dead", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])), params(PageParams),
    responses((status = 200, body = TaskPage)))]
pub(super) async fn list_dead(
    State(tasks): State<Arc<Tasks>>,
    _caller: ReadCaller,
    ApiQuery(p): ApiQuery<PageParams>,
) -> Result<Json<TaskPage>> {
    let (limit, cursor) = page_args(&ListParams {
        state: None,
        limit: p.limit,
        cursor: p.cursor,
    })?;
    Ok(Json(tasks.dead(limit, cursor).await?))
}

/// Groups with a configured limit, with their slots in use.
#[utoipa::path(get, path = "/api/v1/groups", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])), responses((status = 200, body = GroupList)))]
pub(super) async fn list_groups(State(tasks): State<Arc<Tasks>>, _caller: ReadCaller) -> Result<Json<GroupList>> {
    Ok(Json(GroupList {
        groups: tasks.groups(None).await?,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct GroupRequest {
    /// Required: at most this many tasks of the group run at once,
    /// cluster-wide (1 to 100 000); null removes the limit.
    #[serde(deserialize_with = "nullable")]
    #[schema(required = true)]
    pub limit: Option<u32>,
}

/// Reads an optional value whose field must be present (`null` is a value),
/// unlike a plain `Option` field, which serde also fills when it is missing.
fn nullable<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<u32>, D::Error> {
    Option::<u32>::deserialize(d)
}

const GROUP_BODY: &str = r#"send {"limit": n} (1 to 100000) to set the group's limit, or {"limit": null} to remove it"#;

/// Sets or removes a group's concurrency limit. The body is required, so
/// that a stray PUT cannot lift a limit: `{"limit": null}` removes it.
#[utoipa::path(put, path = "/api/v1/groups/{group}", tag = "tasks", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("group" = String, Path, description = "Group name")),
    request_body = GroupRequest,
    responses((status = 200, body = GroupInfo), (status = 400, description = "No body, or a bad limit"),
               (status = 409, description = "Too many groups")))]
pub(super) async fn put_group(
    State(tasks): State<Arc<Tasks>>,
    caller: AdminCaller,
    Path(group): Path<Name>,
    body: std::result::Result<OptJson<Option<serde_json::Value>>, ApiError>,
) -> Result<Json<GroupInfo>> {
    let hint = |m: String| format!("{m}; {GROUP_BODY}");
    let req: GroupRequest = match body {
        Ok(OptJson(Some(v))) => GroupRequest::deserialize(crate::lenient::value(v))
            .map_err(|e| ApiError::bad_request(hint(e.to_string())))?,
        Ok(OptJson(None)) => return Err(ApiError::bad_request(hint("the body is missing".into()))),
        Err(ApiError::BadRequest(m)) => return Err(ApiError::BadRequest(hint(m))),
        Err(ApiError::UnsupportedMediaType(m)) => return Err(ApiError::UnsupportedMediaType(hint(m))),
        Err(e) => return Err(e),
    };
    if req.limit.is_some_and(|l| !validate::GROUP_LIMIT.contains(&l)) {
        return Err(ApiError::bad_request(format!(
            "`limit` must be between {} and {}, or null for no limit",
            validate::GROUP_LIMIT.start(),
            validate::GROUP_LIMIT.end()
        )));
    }
    let running = tasks.set_group_limit(&group, req.limit, &caller.name).await?;
    Ok(Json(GroupInfo {
        name: group.into_string(),
        limit: req.limit,
        running,
        queued: 0,
    }))
}
