//! REST routes of the task store.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{Submitted, TaskError, TaskSpec};
use muster_api::Name;

use crate::app::AppState;
use crate::auth::WorkerCaller;
use crate::error::{ApiError, Result};
use crate::http::{ApiJson, Path};
use crate::validate;

mod admin;
mod bulk;
mod work;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(submit_task, admin::list_tasks))
        .routes(routes!(submit_batch))
        .routes(routes!(work::claim_tasks))
        .routes(routes!(admin::list_queues))
        .routes(routes!(admin::get_queue))
        .routes(routes!(admin::pause_queue))
        .routes(routes!(admin::resume_queue))
        .routes(routes!(admin::get_task, admin::delete_task))
        .routes(routes!(admin::get_alias))
        .routes(routes!(work::heartbeat_task))
        .routes(routes!(work::ack_task))
        .routes(routes!(work::complete_task))
        .routes(routes!(work::complete_batch))
        .routes(routes!(work::fail_task))
        .routes(routes!(admin::cancel_task))
        .routes(routes!(admin::retry_task))
        .routes(routes!(admin::list_dead))
        .routes(routes!(admin::list_groups))
        .routes(routes!(admin::put_group))
        .merge(bulk::router())
}

/// The answer to a submit.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SubmitResponse {
    pub id: String,
    pub queue: String,
    /// queued or delayed (or the original task's state on a replay).
    pub state: String,
    /// True when an idempotency key returned an existing task.
    pub replayed: bool,
}

/// The `Idempotency-Key` header, validated like `idempotency_key` (task
/// submit and schedule trigger).
pub(crate) fn idempotency_header(headers: &HeaderMap) -> Result<Option<String>> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(v) => {
            let v = v
                .to_str()
                .map_err(|_| ApiError::bad_request("the Idempotency-Key header must be ASCII"))?;
            validate::opaque_key("Idempotency-Key", v)?;
            Ok(Some(v.to_string()))
        }
    }
}

/// Submits a task. 201 for a new task; 200 with the original task when the
/// idempotency key (field or `Idempotency-Key` header) was seen within its window.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/tasks", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("queue" = String, Path, description = "Queue name, [A-Za-z0-9._-]{1,128}"),
           ("Idempotency-Key" = Option<String>, Header, description = "Same as `idempotency_key`")),
    request_body = TaskSpec,
    responses((status = 201, body = SubmitResponse, description = "Created"),
               (status = 200, body = SubmitResponse, description = "Replay of an idempotency key"),
               (status = 400, description = "Invalid field, or `run_at` more than one year after Redis time"),
               (status = 409, description = "Alias taken or too many queues"),
               (status = 413, description = "Payload too large")))]
async fn submit_task(
    State(s): State<AppState>,
    caller: WorkerCaller,
    Path(queue): Path<Name>,
    headers: HeaderMap,
    ApiJson(mut spec): ApiJson<TaskSpec>,
) -> Result<Response> {
    if let Some(h) = idempotency_header(&headers)? {
        match &spec.idempotency_key {
            Some(k) if *k != h => {
                return Err(ApiError::bad_request(
                    "the Idempotency-Key header and `idempotency_key` differ; send one",
                ));
            }
            _ => spec.idempotency_key = Some(h),
        }
    }
    let task = crate::tasks::spec::check(&spec, s.tasks.config())?;
    let (alias, run_at) = (task.alias.clone(), task.run_at);
    let room = s.tasks.config().queue_room(caller.role);
    let out = s.tasks.submit(&queue, &[task], &s.node_id, room).await?;
    match out.into_iter().next() {
        Some(Submitted::Created { id, state }) => Ok((
            StatusCode::CREATED,
            Json(SubmitResponse {
                id,
                queue: queue.into_string(),
                state,
                replayed: false,
            }),
        )
            .into_response()),
        Some(Submitted::Replayed {
            id,
            state,
            queue: original,
        }) => Ok((
            StatusCode::OK,
            Json(SubmitResponse {
                id,
                queue: original,
                state,
                replayed: true,
            }),
        )
            .into_response()),
        Some(Submitted::AliasTaken { holder }) => Err(TaskError::AliasTaken { alias, holder }.into()),
        Some(Submitted::TooManyQueues) => Err(s.tasks.too_many_queues(room).into()),
        Some(Submitted::RunAtTooFar { now }) => Err(TaskError::RunAtTooFar { run_at, now }.into()),
        None => Err(ApiError::internal("enqueue returned nothing")),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchRequest {
    /// 1 to 1000 tasks.
    pub tasks: Vec<TaskSpec>,
}

/// One item's outcome in a batch.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BatchItem {
    /// created, replayed or error.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// For errors: the HTTP status this item would have had.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BatchResponse {
    /// One entry per submitted task, in order.
    pub results: Vec<BatchItem>,
}

fn item_error(e: &ApiError) -> BatchItem {
    BatchItem {
        status: "error",
        id: None,
        state: None,
        code: Some(e.status().as_u16()),
        error: Some(e.to_string()),
    }
}

/// Submits up to 1000 tasks in one script. Invalid items get an error entry
/// and the others are submitted.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/tasks/batch", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("queue" = String, Path, description = "Queue name")),
    request_body = BatchRequest,
    responses((status = 200, body = BatchResponse), (status = 400, description = "Bad queue or batch size")))]
async fn submit_batch(
    State(s): State<AppState>,
    caller: WorkerCaller,
    Path(queue): Path<Name>,
    ApiJson(req): ApiJson<BatchRequest>,
) -> Result<Json<BatchResponse>> {
    if !validate::BATCH_ITEMS.contains(&req.tasks.len()) {
        return Err(ApiError::bad_request(format!(
            "`tasks` must hold {} to {} tasks",
            validate::BATCH_ITEMS.start(),
            validate::BATCH_ITEMS.end()
        )));
    }
    let mut results: Vec<Option<BatchItem>> = Vec::with_capacity(req.tasks.len());
    let mut valid = Vec::new();
    let mut slots = Vec::new();
    for (i, spec) in req.tasks.iter().enumerate() {
        match crate::tasks::spec::check(spec, s.tasks.config()) {
            Ok(t) => {
                valid.push(t);
                slots.push(i);
                results.push(None);
            }
            Err(e) => results.push(Some(item_error(&e.into()))),
        }
    }
    let room = s.tasks.config().queue_room(caller.role);
    let outcomes = s.tasks.submit(&queue, &valid, &s.node_id, room).await?;
    for ((slot, outcome), task) in slots.into_iter().zip(outcomes).zip(valid.iter()) {
        results[slot] = Some(match outcome {
            Submitted::Created { id, state } => BatchItem {
                status: "created",
                id: Some(id),
                state: Some(state),
                code: None,
                error: None,
            },
            Submitted::Replayed { id, state, .. } => BatchItem {
                status: "replayed",
                id: Some(id),
                state: Some(state),
                code: None,
                error: None,
            },
            Submitted::AliasTaken { holder } => item_error(
                &TaskError::AliasTaken {
                    alias: task.alias.clone(),
                    holder,
                }
                .into(),
            ),
            Submitted::TooManyQueues => item_error(&s.tasks.too_many_queues(room).into()),
            Submitted::RunAtTooFar { now } => item_error(
                &TaskError::RunAtTooFar {
                    run_at: task.run_at,
                    now,
                }
                .into(),
            ),
        });
    }
    Ok(Json(BatchResponse {
        results: results.into_iter().flatten().collect(),
    }))
}

fn check_task_id(id: &str) -> Result<()> {
    Ok(validate::id("task", id)?)
}
