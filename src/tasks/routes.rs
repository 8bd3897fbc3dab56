//! REST routes of the task store.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{
    Claimed, Finished, GroupInfo, NextAsk, NextClaim, NextTasks, QueueStats, STATES, Submitted, Task, TaskError,
    TaskPage, TaskSpec,
};
use crate::app::AppState;
use crate::auth::{AdminCaller, ReadCaller, WorkerCaller};
use crate::error::{ApiError, Result};
use crate::http::{ApiJson, ApiQuery, OptJson, no_content};
use crate::validate;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(submit_task, list_tasks))
        .routes(routes!(submit_batch))
        .routes(routes!(claim_tasks))
        .routes(routes!(list_queues))
        .routes(routes!(get_queue))
        .routes(routes!(pause_queue))
        .routes(routes!(resume_queue))
        .routes(routes!(get_task, delete_task))
        .routes(routes!(get_alias))
        .routes(routes!(heartbeat_task))
        .routes(routes!(complete_task))
        .routes(routes!(complete_batch))
        .routes(routes!(fail_task))
        .routes(routes!(cancel_task))
        .routes(routes!(retry_task))
        .routes(routes!(list_dead))
        .routes(routes!(list_groups))
        .routes(routes!(put_group))
}

/// The answer to a submit.
#[derive(Debug, Serialize, ToSchema)]
pub struct SubmitResponse {
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
    _caller: WorkerCaller,
    Path(queue): Path<String>,
    headers: HeaderMap,
    ApiJson(mut spec): ApiJson<TaskSpec>,
) -> Result<Response> {
    validate::name("queue", &queue)?;
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
    let task = spec.validate(s.tasks.config())?;
    let (alias, run_at) = (task.alias.clone(), task.run_at);
    let out = s.tasks.submit(&queue, &[task], &s.node_id).await?;
    match out.into_iter().next() {
        Some(Submitted::Created { id, state }) => Ok((
            StatusCode::CREATED,
            Json(SubmitResponse {
                id,
                queue,
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
        Some(Submitted::TooManyQueues) => Err(TaskError::TooManyQueues(s.tasks.config().max_queues).into()),
        Some(Submitted::RunAtTooFar { now }) => Err(TaskError::RunAtTooFar { run_at, now }.into()),
        None => Err(ApiError::internal("enqueue returned nothing")),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// 1 to 1000 tasks.
    pub tasks: Vec<TaskSpec>,
}

/// One item's outcome in a batch.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchItem {
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
pub struct BatchResponse {
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
    _caller: WorkerCaller,
    Path(queue): Path<String>,
    ApiJson(req): ApiJson<BatchRequest>,
) -> Result<Json<BatchResponse>> {
    validate::name("queue", &queue)?;
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
        match spec.validate(s.tasks.config()) {
            Ok(t) => {
                valid.push(t);
                slots.push(i);
                results.push(None);
            }
            Err(e) => results.push(Some(item_error(&e))),
        }
    }
    let outcomes = s.tasks.submit(&queue, &valid, &s.node_id).await?;
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
            Submitted::TooManyQueues => item_error(&TaskError::TooManyQueues(s.tasks.config().max_queues).into()),
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

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// The claiming node or worker id; it must be registered (heartbeating).
    pub node: String,
    /// 1 to 1000; default 1.
    pub max: Option<u32>,
    /// Long-poll: wait up to this long (at most 30 000 ms) for a task. Default 0.
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClaimResponse {
    pub tasks: Vec<Claimed>,
}

/// Claims tasks for a node: each with its fencing token. 204 when none came
/// within `wait_ms`. A waiting claim wakes as soon as a task of this queue
/// becomes claimable anywhere in the cluster.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/claim", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("queue" = String, Path, description = "Queue name")),
    request_body = ClaimRequest,
    responses((status = 200, body = ClaimResponse), (status = 204, description = "Nothing to claim"),
               (status = 409, description = "The node is not registered, or draining"),
               (status = 503, description = "Redis unreachable or this node is stopping")))]
async fn claim_tasks(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path(queue): Path<String>,
    ApiJson(req): ApiJson<ClaimRequest>,
) -> Result<Response> {
    validate::name("queue", &queue)?;
    validate::node_id("node", &req.node)?;
    let max = req.max.unwrap_or(1);
    validate::in_range("max", max, &validate::CLAIM_MAX)?;
    let wait = req.wait_ms.unwrap_or(0);
    validate::in_range("wait_ms", wait, &(0..=validate::CLAIM_WAIT_MAX_MS))?;
    if let Some(why) = s.health.refuses_work() {
        return Err(ApiError::Unavailable(format!("{why}; claim through another node")));
    }
    let r = s
        .tasks
        .claim_wait(&queue, &req.node, max, Duration::from_millis(wait))
        .await?;
    if r.tasks.is_empty() {
        return Ok(no_content());
    }
    Ok(Json(ClaimResponse { tasks: r.tasks }).into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
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
async fn list_tasks(
    State(s): State<AppState>,
    _caller: ReadCaller,
    Path(queue): Path<String>,
    ApiQuery(p): ApiQuery<ListParams>,
) -> Result<Json<TaskPage>> {
    validate::name("queue", &queue)?;
    let state = p.state.clone().unwrap_or_else(|| "queued".into());
    if !STATES.contains(&state.as_str()) {
        return Err(ApiError::bad_request(format!(
            "`state` must be one of {}",
            STATES.join(", ")
        )));
    }
    let (limit, cursor) = page_args(&p)?;
    Ok(Json(s.tasks.list(&queue, &state, limit, cursor).await?))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct QueueList {
    pub queues: Vec<QueueStats>,
}

/// Every queue with its counts.
#[utoipa::path(get, path = "/api/v1/queues", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])), responses((status = 200, body = QueueList)))]
async fn list_queues(State(s): State<AppState>, _caller: ReadCaller) -> Result<Json<QueueList>> {
    Ok(Json(QueueList {
        queues: s.tasks.queues().await?,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct QueueDetail {
    #[serde(flatten)]
    pub stats: QueueStats,
    /// Groups with queued tasks here or a configured limit.
    pub groups: Vec<GroupInfo>,
}

/// One queue's counts and its groups.
#[utoipa::path(get, path = "/api/v1/queues/{queue}", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("queue" = String, Path, description = "Queue name")),
    responses((status = 200, body = QueueDetail)))]
async fn get_queue(
    State(s): State<AppState>,
    _caller: ReadCaller,
    Path(queue): Path<String>,
) -> Result<Json<QueueDetail>> {
    validate::name("queue", &queue)?;
    let stats = s
        .tasks
        .stats_for(std::slice::from_ref(&queue))
        .await?
        .pop()
        .unwrap_or_default();
    let groups = s.tasks.groups(Some(&queue)).await?;
    Ok(Json(QueueDetail { stats, groups }))
}

/// Pauses a queue: claims get nothing until it is resumed.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/pause", tag = "tasks", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("queue" = String, Path, description = "Queue name")),
    responses((status = 204, description = "Paused")))]
async fn pause_queue(State(s): State<AppState>, caller: AdminCaller, Path(queue): Path<String>) -> Result<Response> {
    validate::name("queue", &queue)?;
    s.tasks.set_paused(&queue, true, &caller.name).await?;
    Ok(no_content())
}

/// Resumes a paused queue.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/resume", tag = "tasks", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("queue" = String, Path, description = "Queue name")),
    responses((status = 204, description = "Resumed")))]
async fn resume_queue(State(s): State<AppState>, caller: AdminCaller, Path(queue): Path<String>) -> Result<Response> {
    validate::name("queue", &queue)?;
    s.tasks.set_paused(&queue, false, &caller.name).await?;
    Ok(no_content())
}

fn check_task_id(id: &str) -> Result<()> {
    validate::id("task", id)
}

/// One task with its attempts.
#[utoipa::path(get, path = "/api/v1/tasks/{id}", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("id" = String, Path, description = "Task id")),
    responses((status = 200, body = Task), (status = 404, description = "Unknown task")))]
async fn get_task(State(s): State<AppState>, _caller: ReadCaller, Path(id): Path<String>) -> Result<Json<Task>> {
    check_task_id(&id)?;
    s.tasks
        .get(&id)
        .await?
        .map(Json)
        .ok_or_else(|| TaskError::NotFound(id).into())
}

/// Discards a finished (succeeded, cancelled or dead) task now.
#[utoipa::path(delete, path = "/api/v1/tasks/{id}", tag = "tasks", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("id" = String, Path, description = "Task id")),
    responses((status = 204, description = "Deleted"), (status = 404, description = "Unknown task"),
               (status = 409, description = "Not finished")))]
async fn delete_task(State(s): State<AppState>, caller: AdminCaller, Path(id): Path<String>) -> Result<Response> {
    check_task_id(&id)?;
    s.tasks.delete(&id, &caller.name).await?;
    Ok(no_content())
}

/// The task holding an alias.
#[utoipa::path(get, path = "/api/v1/aliases/{alias}", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("alias" = String, Path, description = "Alias")),
    responses((status = 200, body = Task), (status = 404, description = "No task holds this alias")))]
async fn get_alias(State(s): State<AppState>, _caller: ReadCaller, Path(alias): Path<String>) -> Result<Json<Task>> {
    validate::name("alias", &alias)?;
    let id = s.tasks.alias_holder(&alias).await?;
    let not_found = || ApiError::not_found(format!("no task holds the alias `{alias}`"));
    let id = id.ok_or_else(not_found)?;
    s.tasks.get(&id).await?.map(Json).ok_or_else(not_found)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    pub token: u64,
    /// 0 to 100.
    pub progress: Option<u8>,
    /// A small JSON object of runtime fields (at most 4 KiB), replacing the previous one.
    #[schema(value_type = Option<Object>)]
    pub fields: Option<Box<RawValue>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HeartbeatResponse {
    pub state: String,
    /// The task was asked to stop: finish with `fail` and it is cancelled.
    pub cancel_requested: bool,
}

/// The holder of the current token reports it is still working (optionally
/// with progress and fields) and learns whether a cancel was requested.
#[utoipa::path(post, path = "/api/v1/tasks/{id}/heartbeat", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("id" = String, Path, description = "Task id")),
    request_body = HeartbeatRequest,
    responses((status = 200, body = HeartbeatResponse),
               (status = 409, description = "Stale token: the body carries the current state"),
               (status = 404, description = "Unknown task")))]
async fn heartbeat_task(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>> {
    check_task_id(&id)?;
    if let Some(p) = req.progress {
        validate::in_range("progress", p, &validate::PROGRESS)?;
    }
    let fields = match req.fields {
        Some(f) if !f.get().trim_start().starts_with('{') => {
            return Err(ApiError::bad_request("`fields` must be a JSON object"));
        }
        Some(f) if f.get().len() > 4096 => return Err(ApiError::TooLarge("`fields` is limited to 4 KiB".into())),
        Some(f) => Some(f.get().to_string()),
        None => None,
    };
    let cancel_requested = s.tasks.heartbeat(&id, req.token, req.progress, fields).await?;
    Ok(Json(HeartbeatResponse {
        state: "running".into(),
        cancel_requested,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    pub token: u64,
    /// Any JSON value, at most `tasks.max_payload_bytes`.
    #[schema(value_type = Option<serde_json::Value>)]
    pub result: Option<Box<RawValue>>,
    /// Also claim the worker's next task(s) in the same call: one call per
    /// task for a worker that takes one at a time.
    pub next: Option<NextRequest>,
}

/// What to claim next, for the task's owner, in the same call as a complete
/// or fail. When nothing is claimable `next.tasks` is empty, at once or, with
/// `wait_ms`, when the wait ends; the worker then long-polls `claim` as usual.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NextRequest {
    /// 1 to 1000; default 1.
    pub max: Option<u32>,
    /// The queue to claim from; default the finished task's queue.
    pub queue: Option<String>,
    /// 0 to 30000; default 0. When nothing is claimable, wait up to this
    /// long for a task, as a claim's `wait_ms` does: the finish is applied at
    /// once, and the answer comes with the task or when the wait ends. With
    /// `queue` given this costs no more Redis calls than the task needs;
    /// without it, one more claim.
    pub wait_ms: Option<u64>,
}

/// The outcome of a complete or fail, with the next task(s) when asked for.
#[derive(Debug, Serialize, ToSchema)]
pub struct FinishedNext {
    #[serde(flatten)]
    pub finished: Finished,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<NextTasks>,
}

fn next_ask(s: &AppState, next: Option<NextRequest>) -> Result<NextAsk> {
    let Some(n) = next else {
        return Ok(NextAsk {
            claim: NextClaim::default(),
            refused_here: None,
            wait: Duration::ZERO,
        });
    };
    let max = n.max.unwrap_or(1);
    validate::in_range("next.max", max, &validate::CLAIM_MAX)?;
    if let Some(q) = &n.queue {
        validate::name("next.queue", q)?;
    }
    let wait = n.wait_ms.unwrap_or(0);
    validate::in_range("next.wait_ms", wait, &(0..=validate::CLAIM_WAIT_MAX_MS))?;
    if let Some(why) = s.health.refuses_work() {
        return Ok(NextAsk {
            claim: NextClaim::default(),
            refused_here: Some(format!("{why}; claim through another node")),
            wait: Duration::ZERO,
        });
    }
    Ok(NextAsk {
        claim: NextClaim { max, queue: n.queue },
        refused_here: None,
        wait: Duration::from_millis(wait),
    })
}

fn result_text(s: &AppState, result: Option<Box<RawValue>>) -> Result<String> {
    let text = result.map(|r| r.get().to_string()).unwrap_or_default();
    if text.len() > s.tasks.config().max_payload_bytes {
        return Err(ApiError::TooLarge(format!(
            "the result is {} bytes; the limit is {} (tasks.max_payload_bytes)",
            text.len(),
            s.tasks.config().max_payload_bytes
        )));
    }
    Ok(text)
}

/// The holder of the current token reports success; with `next`, the same
/// call claims the worker's next task(s).
#[utoipa::path(post, path = "/api/v1/tasks/{id}/complete", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("id" = String, Path, description = "Task id")),
    request_body = CompleteRequest,
    responses((status = 200, body = FinishedNext),
               (status = 409, description = "Stale token: changes nothing; the body carries the current state"),
               (status = 404, description = "Unknown task")))]
async fn complete_task(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CompleteRequest>,
) -> Result<Json<FinishedNext>> {
    check_task_id(&id)?;
    let result = result_text(&s, req.result)?;
    let ask = next_ask(&s, req.next)?;
    let items = [(id.clone(), req.token, result)];
    let (out, next) = s
        .tasks
        .finish_then_claim(ask, |next| s.tasks.complete_then(&items, next))
        .await?;
    match out.into_iter().next() {
        Some(r) => Ok(Json(FinishedNext { finished: r?, next })),
        None => Err(ApiError::internal("complete returned nothing")),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteItem {
    pub id: String,
    pub token: u64,
    #[schema(value_type = Option<serde_json::Value>)]
    pub result: Option<Box<RawValue>>,
}

/// A list of completions, bare or as `{"tasks": [...]}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum CompleteBatch {
    List(Vec<CompleteItem>),
    Wrapped { tasks: Vec<CompleteItem> },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapped {
    tasks: Vec<CompleteItem>,
}

/// Reads a [`CompleteBatch`] (serde's untagged enums cannot hold raw JSON
/// values, so the shape is picked by the first character).
fn parse_batch(body: &RawValue) -> Result<Vec<CompleteItem>> {
    let text = body.get().trim_start();
    let parsed = if text.starts_with('[') {
        serde_json::from_str::<Vec<CompleteItem>>(text)
    } else {
        serde_json::from_str::<Wrapped>(text).map(|w| w.tasks)
    };
    parsed.map_err(|e| {
        ApiError::bad_request(format!(
            "expected a list of {{id, token, result}} (or {{\"tasks\": [...]}}): {e}"
        ))
    })
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CompleteOutcome {
    pub id: String,
    /// completed, conflict (stale token), not_found, or invalid.
    pub status: &'static str,
    /// The task's state after the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CompleteBatchResponse {
    pub results: Vec<CompleteOutcome>,
}

/// Completes up to 1000 tasks in one script; one outcome per item, in order.
#[utoipa::path(post, path = "/api/v1/tasks/complete", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    request_body = CompleteBatch,
    responses((status = 200, body = CompleteBatchResponse), (status = 400, description = "Bad batch")))]
async fn complete_batch(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    ApiJson(body): ApiJson<Box<RawValue>>,
) -> Result<Json<CompleteBatchResponse>> {
    let items = parse_batch(&body)?;
    if !validate::BATCH_ITEMS.contains(&items.len()) {
        return Err(ApiError::bad_request(format!(
            "send {} to {} completions",
            validate::BATCH_ITEMS.start(),
            validate::BATCH_ITEMS.end()
        )));
    }
    let mut results: Vec<Option<CompleteOutcome>> = Vec::with_capacity(items.len());
    let mut valid = Vec::new();
    let mut slots = Vec::new();
    for (i, it) in items.into_iter().enumerate() {
        let checked = check_task_id(&it.id).and_then(|_| result_text(&s, it.result));
        match checked {
            Ok(text) => {
                slots.push(i);
                valid.push((it.id, it.token, text));
                results.push(None);
            }
            Err(e) => results.push(Some(CompleteOutcome {
                id: it.id,
                status: "invalid",
                state: None,
                error: Some(e.to_string()),
            })),
        }
    }
    if !valid.is_empty() {
        let out = s.tasks.complete(&valid).await?;
        for ((slot, (id, _, _)), r) in slots.into_iter().zip(valid.iter()).zip(out) {
            results[slot] = Some(match r {
                Ok(f) => CompleteOutcome {
                    id: id.clone(),
                    status: "completed",
                    state: Some(f.state),
                    error: None,
                },
                Err(TaskError::NotFound(_)) => CompleteOutcome {
                    id: id.clone(),
                    status: "not_found",
                    state: None,
                    error: None,
                },
                Err(e @ TaskError::Conflict { .. }) => {
                    let state = match &e {
                        TaskError::Conflict { state, .. } => Some(state.clone()),
                        _ => None,
                    };
                    CompleteOutcome {
                        id: id.clone(),
                        status: "conflict",
                        state,
                        error: Some(e.to_string()),
                    }
                }
                Err(e) => return Err(e.into()),
            });
        }
    }
    Ok(Json(CompleteBatchResponse {
        results: results.into_iter().flatten().collect(),
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    pub token: u64,
    /// What went wrong (at most 4 KiB kept).
    #[serde(default)]
    pub error: String,
    /// False: do not retry, dead at once. Default true.
    pub retry: Option<bool>,
    /// Also claim the worker's next task(s) in the same call.
    pub next: Option<NextRequest>,
}

/// The holder of the current token reports a failure: retried after a
/// backoff while attempts are left, else dead. With `next`, the same call
/// claims the worker's next task(s).
#[utoipa::path(post, path = "/api/v1/tasks/{id}/fail", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("id" = String, Path, description = "Task id")),
    request_body = FailRequest,
    responses((status = 200, body = FinishedNext),
               (status = 409, description = "Stale token: changes nothing"),
               (status = 404, description = "Unknown task")))]
async fn fail_task(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<FailRequest>,
) -> Result<Json<FinishedNext>> {
    check_task_id(&id)?;
    let mut error = req.error;
    if error.len() > 4096 {
        let mut cut = 4096;
        while !error.is_char_boundary(cut) {
            cut -= 1;
        }
        error.truncate(cut);
    }
    let ask = next_ask(&s, req.next)?;
    let retry = req.retry.unwrap_or(true);
    let (finished, next) = s
        .tasks
        .finish_then_claim(ask, |next| s.tasks.fail_then(&id, req.token, &error, retry, next))
        .await?;
    Ok(Json(FinishedNext { finished, next }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CancelResponse {
    /// cancelled, or running when the worker was asked to stop.
    pub state: String,
    pub cancel_requested: bool,
}

/// Cancels a queued or delayed task; asks a running task's worker to stop
/// (it learns on its next heartbeat).
#[utoipa::path(post, path = "/api/v1/tasks/{id}/cancel", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("id" = String, Path, description = "Task id")),
    responses((status = 200, body = CancelResponse), (status = 409, description = "Already finished"),
               (status = 404, description = "Unknown task")))]
async fn cancel_task(
    State(s): State<AppState>,
    caller: WorkerCaller,
    Path(id): Path<String>,
) -> Result<Json<CancelResponse>> {
    check_task_id(&id)?;
    let state = s.tasks.cancel(&id, &caller.name).await?;
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
async fn retry_task(State(s): State<AppState>, caller: AdminCaller, Path(id): Path<String>) -> Result<Response> {
    check_task_id(&id)?;
    s.tasks.retry(&id, &caller.name).await?;
    Ok(no_content())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// 1 to 500; default 50.
    pub limit: Option<usize>,
    pub cursor: Option<String>,
}

/// Dead tasks of every queue, newest first.
#[utoipa::path(get, path = "/api/v1/dead", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])), params(PageParams),
    responses((status = 200, body = TaskPage)))]
async fn list_dead(
    State(s): State<AppState>,
    _caller: ReadCaller,
    ApiQuery(p): ApiQuery<PageParams>,
) -> Result<Json<TaskPage>> {
    let (limit, cursor) = page_args(&ListParams {
        state: None,
        limit: p.limit,
        cursor: p.cursor,
    })?;
    Ok(Json(s.tasks.dead(limit, cursor).await?))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GroupList {
    pub groups: Vec<GroupInfo>,
}

/// Groups with a configured limit, with their slots in use.
#[utoipa::path(get, path = "/api/v1/groups", tag = "tasks", security(("bearer" = ["read"]), ("session" = ["read"])), responses((status = 200, body = GroupList)))]
async fn list_groups(State(s): State<AppState>, _caller: ReadCaller) -> Result<Json<GroupList>> {
    Ok(Json(GroupList {
        groups: s.tasks.groups(None).await?,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupRequest {
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
async fn put_group(
    State(s): State<AppState>,
    caller: AdminCaller,
    Path(group): Path<String>,
    body: std::result::Result<OptJson<Option<serde_json::Value>>, ApiError>,
) -> Result<Json<GroupInfo>> {
    validate::name("group", &group)?;
    let hint = |m: String| format!("{m}; {GROUP_BODY}");
    let req: GroupRequest = match body {
        Ok(OptJson(Some(v))) => serde_json::from_value(v).map_err(|e| ApiError::bad_request(hint(e.to_string())))?,
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
    let running = s.tasks.set_group_limit(&group, req.limit, &caller.name).await?;
    Ok(Json(GroupInfo {
        name: group,
        limit: req.limit,
        running,
        queued: 0,
    }))
}
