//! REST routes of the task store.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{Submitted, TaskError, TaskSpec};
use muster_api::Name;
use muster_api::tasks::{BatchItem, BatchResponse, Submitted as SubmitResponse};

use crate::app::AppState;
use crate::auth::WorkerCaller;
use crate::error::{ApiError, Result};
use crate::http::{ApiJson, Path};
use crate::validate;

mod admin;
mod bulk;
mod limits;
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
        .routes(routes!(limits::list_limits))
        .routes(routes!(limits::get_limit, limits::put_limit, limits::delete_limit))
        .routes(routes!(limits::get_queue_limits, limits::put_queue_limits))
        .merge(bulk::router())
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

/// The caller's W3C trace context from the `traceparent` and `tracestate`
/// headers, for the tasks of a submit that carry none of their own. As the
/// W3C recommendation asks of a receiver, a malformed `traceparent` is
/// ignored (the task starts no trace), and so is a `tracestate` that is too
/// long or beside no valid `traceparent`.
pub(crate) fn trace_headers(headers: &HeaderMap) -> Option<(String, String)> {
    let tp = headers.get("traceparent")?.to_str().ok()?;
    muster_trace::SpanContext::parse(tp)?;
    let ts = headers
        .get("tracestate")
        .and_then(|v| v.to_str().ok())
        .filter(|ts| muster_trace::valid_tracestate(ts))
        .unwrap_or("");
    Some((tp.trim().to_string(), ts.to_string()))
}

/// Gives `task` the request's trace context when it has none of its own,
/// and its `send` span when the request is traced.
fn traced(task: &mut crate::tasks::NewTask, headers: Option<&(String, String)>) -> Option<crate::traces::Sending> {
    let own = !task.traceparent.is_empty();
    if !own && let Some((tp, ts)) = headers {
        task.traceparent = tp.clone();
        task.tracestate = ts.clone();
    }
    crate::traces::sending(&mut task.traceparent, &task.tracestate, own)
}

/// Submits a task. 201 for a new task; 200 with the original task when the
/// idempotency key (field or `Idempotency-Key` header) was seen within its window.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/tasks", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("queue" = String, Path, description = "Queue name, [A-Za-z0-9._-]{1,128}"),
           ("Idempotency-Key" = Option<String>, Header, description = "Same as `idempotency_key`"),
           ("traceparent" = Option<String>, Header, description = "W3C trace context of the caller: the task joins its trace (unless its body has `traceparent`); a malformed one is ignored"),
           ("tracestate" = Option<String>, Header, description = "W3C trace state beside `traceparent`, at most 512 printable ASCII characters (a longer one is ignored)")),
    request_body = TaskSpec,
    responses((status = 201, body = SubmitResponse, description = "Created"),
               (status = 200, body = SubmitResponse, description = "Replay of an idempotency key"),
               (status = 400, description = "Invalid field, or `run_at` more than one year after Redis time"),
               (status = 409, description = "Alias taken, too many queues, a limit named that is not defined, or a new template key past `tasks.max_limit_keys`"),
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
    let mut task = crate::tasks::spec::check(&spec, s.tasks.config())?;
    let sending = traced(&mut task, trace_headers(&headers).as_ref());
    let (alias, run_at) = (task.alias.clone(), task.run_at);
    let room = s.tasks.config().queue_room(caller.role);
    let out = s.tasks.submit_one(&queue, task, &s.node_id, room).await?;
    if let Some(span) = sending {
        match &out {
            Submitted::Created { id, .. } => span.done(&queue, Some(id), "created"),
            Submitted::Replayed { id, .. } => span.done(&queue, Some(id), "replayed"),
            _ => span.done(&queue, None, "refused"),
        }
    }
    match Some(out) {
        Some(Submitted::Created { id, state, replaced }) => Ok((
            StatusCode::CREATED,
            Json(SubmitResponse {
                id,
                queue: queue.into_string(),
                state,
                replayed: false,
                replaced,
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
                replaced: None,
            }),
        )
            .into_response()),
        Some(Submitted::AliasTaken { holder }) => Err(TaskError::AliasTaken { alias, holder }.into()),
        Some(Submitted::TooManyQueues) => Err(s.tasks.too_many_queues(room).into()),
        Some(Submitted::RunAtTooFar { now }) => Err(TaskError::RunAtTooFar { run_at, now }.into()),
        Some(Submitted::UnknownLimit { name }) => Err(TaskError::UnknownLimit(name).into()),
        Some(Submitted::TooManyLimitKeys { name }) => Err(s.tasks.too_many_limit_keys(name).into()),
        None => Err(ApiError::internal("enqueue returned nothing")),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchRequest {
    /// 1 to 1000 tasks.
    pub tasks: Vec<TaskSpec>,
}

fn item_error(e: &ApiError) -> BatchItem {
    BatchItem {
        status: "error".into(),
        id: None,
        state: None,
        code: Some(e.status().as_u16()),
        error: Some(e.to_string()),
        replaced: None,
    }
}

/// Submits up to 1000 tasks in one script. Invalid items get an error entry
/// and the others are submitted.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/tasks/batch", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("queue" = String, Path, description = "Queue name"),
           ("traceparent" = Option<String>, Header, description = "W3C trace context for the items without a `traceparent` of their own; a malformed one is ignored"),
           ("tracestate" = Option<String>, Header, description = "W3C trace state beside `traceparent`, at most 512 printable ASCII characters (a longer one is ignored)")),
    request_body = BatchRequest,
    responses((status = 200, body = BatchResponse), (status = 400, description = "Bad queue or batch size")))]
async fn submit_batch(
    State(s): State<AppState>,
    caller: WorkerCaller,
    Path(queue): Path<Name>,
    headers: HeaderMap,
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
    // The items without a trace context of their own share one: the
    // header's, or with tracing on the batch's one `send` span (a span per
    // item would cost about as much as the rest of a batched submit).
    let mut spans = Vec::new();
    let (mut batch_tp, batch_ts) = trace_headers(&headers).unwrap_or_default();
    let batch_span = crate::traces::sending(&mut batch_tp, &batch_ts, false);
    for (i, spec) in req.tasks.iter().enumerate() {
        match crate::tasks::spec::check(spec, s.tasks.config()) {
            Ok(mut t) => {
                if t.traceparent.is_empty() {
                    t.traceparent.clone_from(&batch_tp);
                    t.tracestate.clone_from(&batch_ts);
                    spans.push(None);
                } else {
                    spans.push(traced(&mut t, None));
                }
                valid.push(t);
                slots.push(i);
                results.push(None);
            }
            Err(e) => results.push(Some(item_error(&e.into()))),
        }
    }
    let room = s.tasks.config().queue_room(caller.role);
    let outcomes = s.tasks.submit(&queue, &valid, &s.node_id, room).await?;
    if let Some(span) = batch_span {
        let created = outcomes
            .iter()
            .filter(|o| matches!(o, Submitted::Created { .. }))
            .count();
        span.done_batch(&queue, created);
    }
    for (span, outcome) in spans.into_iter().zip(&outcomes) {
        if let Some(span) = span {
            match outcome {
                Submitted::Created { id, .. } => span.done(&queue, Some(id), "created"),
                Submitted::Replayed { id, .. } => span.done(&queue, Some(id), "replayed"),
                _ => span.done(&queue, None, "refused"),
            }
        }
    }
    for ((slot, outcome), task) in slots.into_iter().zip(outcomes).zip(valid.iter()) {
        results[slot] = Some(match outcome {
            Submitted::Created { id, state, replaced } => BatchItem {
                status: "created".into(),
                id: Some(id),
                state: Some(state),
                code: None,
                error: None,
                replaced,
            },
            Submitted::Replayed { id, state, .. } => BatchItem {
                status: "replayed".into(),
                id: Some(id),
                state: Some(state),
                code: None,
                error: None,
                replaced: None,
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
            Submitted::UnknownLimit { name } => item_error(&TaskError::UnknownLimit(name).into()),
            Submitted::TooManyLimitKeys { name } => item_error(&s.tasks.too_many_limit_keys(name).into()),
        });
    }
    Ok(Json(BatchResponse {
        results: results.into_iter().flatten().collect(),
    }))
}

fn check_task_id(id: &str) -> Result<()> {
    Ok(validate::id("task", id)?)
}
