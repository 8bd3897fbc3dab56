//! REST routes of the task store: the worker path (claim, heartbeat, complete, fail).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use muster_api::tasks::{CompleteBatchResponse, CompleteOutcome, TaskHeartbeatAnswer as HeartbeatResponse};
use muster_api::{Name, TaskId};

/// The answer to a claim, with the payloads as stored.
type ClaimResponse = muster_api::tasks::ClaimResponse<Box<RawValue>>;
/// The answer to a complete or fail, with the payloads as stored.
type FinishedNext = muster_api::tasks::FinishedNext<Box<RawValue>>;

use crate::app::AppState;
use crate::auth::WorkerCaller;
use crate::error::{ApiError, Result};
use crate::http::{ApiJson, Path, no_content};
use crate::tasks::Tasks;
use crate::tasks::{NextAsk, NextClaim, TaskError};
use crate::validate;

use super::check_task_id;
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ClaimRequest {
    /// The claiming node or worker id; it must be registered (heartbeating).
    pub node: String,
    /// 1 to 1000; default 1.
    pub max: Option<u32>,
    /// Long-poll: wait up to this long (at most 30 000 ms) for a task. Default 0.
    pub wait_ms: Option<u64>,
    /// The claim lease, 1 000 to 600 000 ms; default `claim.ack_ms` (10 000).
    /// Acknowledge each task within it (a task heartbeat,
    /// `POST /api/v1/tasks/{id}/ack`, or its complete or fail), or it goes
    /// back to the queue, its token is refused, and no attempt is counted.
    pub ack_ms: Option<u64>,
}

/// Claims tasks for a node: each with its fencing token. 204 when none came
/// within `wait_ms`. A waiting claim wakes as soon as a task of this queue
/// becomes claimable anywhere in the cluster. Each task must be acknowledged
/// within its `ack_ms` (the claim lease): a task heartbeat, an ack, or its
/// complete or fail; otherwise it goes back to the queue (its attempt not
/// counted) and its token is refused, so an answer that never reached the
/// worker strands nothing.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/claim", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("queue" = String, Path, description = "Queue name")),
    request_body = ClaimRequest,
    responses((status = 200, body = ClaimResponse), (status = 204, description = "Nothing to claim"),
               (status = 409, description = "The node is not registered, or draining, or a worker registered by another credential"),
               (status = 503, description = "Redis unreachable or this node is stopping")))]
pub(super) async fn claim_tasks(
    State(s): State<AppState>,
    caller: WorkerCaller,
    Path(queue): Path<Name>,
    ApiJson(req): ApiJson<ClaimRequest>,
) -> Result<Response> {
    validate::node_id("node", &req.node)?;
    let max = req.max.unwrap_or(1);
    validate::in_range("max", max, &validate::CLAIM_MAX)?;
    let wait = req.wait_ms.unwrap_or(0);
    validate::in_range("wait_ms", wait, &(0..=validate::CLAIM_WAIT_MAX_MS))?;
    if let Some(ack) = req.ack_ms {
        validate::in_range("ack_ms", ack, &validate::CLAIM_ACK_MS)?;
    }
    if let Some(why) = s.health.refuses_work() {
        return Err(ApiError::Unavailable(format!("{why}; claim through another node")));
    }
    let ack_ms = s.tasks.ack_ms(req.ack_ms);
    let start = muster_trace::now_ns();
    let r = s
        .tasks
        .claim_wait(
            &queue,
            &req.node,
            &caller.name,
            max,
            ack_ms,
            Duration::from_millis(wait),
        )
        .await?;
    if r.tasks.is_empty() {
        return Ok(no_content());
    }
    crate::traces::received_all(&s.tracer, &queue, &r.tasks, start);
    Ok(Json(ClaimResponse {
        tasks: r.tasks,
        shards_not_tried: r.not_tried,
    })
    .into_response())
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct HeartbeatRequest {
    pub token: u64,
    /// 0 to 100.
    pub progress: Option<u8>,
    /// A small JSON object of runtime fields (at most 4 KiB), replacing the previous one.
    #[schema(value_type = Option<Object>)]
    pub fields: Option<Box<RawValue>>,
}

/// The holder of the current token reports it is still working (optionally
/// with progress and fields) and learns whether a cancel was requested.
#[utoipa::path(post, path = "/api/v1/tasks/{id}/heartbeat", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("id" = String, Path, description = "Task id")),
    request_body = HeartbeatRequest,
    responses((status = 200, body = HeartbeatResponse),
               (status = 409, description = "Stale token: the body carries the current state"),
               (status = 404, description = "Unknown task")))]
pub(super) async fn heartbeat_task(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path(id): Path<TaskId>,
    ApiJson(req): ApiJson<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>> {
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
pub(super) struct AckRequest {
    /// The token of the claim being acknowledged.
    pub token: u64,
}

/// The holder of the current token acknowledges its claim: the claim lease
/// ends, and the task is not put back in its queue for want of an
/// acknowledgement (a task heartbeat, a complete or a fail does the same).
/// Idempotent; answers like a heartbeat.
#[utoipa::path(post, path = "/api/v1/tasks/{id}/ack", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("id" = String, Path, description = "Task id")),
    request_body = AckRequest,
    responses((status = 200, body = HeartbeatResponse),
               (status = 409, description = "Stale token (the task went back to its queue, or runs under a newer claim): drop the work; the body carries the current state"),
               (status = 404, description = "Unknown task")))]
pub(super) async fn ack_task(
    State(tasks): State<Arc<Tasks>>,
    _caller: WorkerCaller,
    Path(id): Path<TaskId>,
    ApiJson(req): ApiJson<AckRequest>,
) -> Result<Json<HeartbeatResponse>> {
    let cancel_requested = tasks.heartbeat(&id, req.token, None, None).await?;
    Ok(Json(HeartbeatResponse {
        state: "running".into(),
        cancel_requested,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CompleteRequest {
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
pub(super) struct NextRequest {
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
    /// The next tasks' claim lease, 1 000 to 600 000 ms; default
    /// `claim.ack_ms`. As a claim's `ack_ms`.
    pub ack_ms: Option<u64>,
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
    if let Some(ack) = n.ack_ms {
        validate::in_range("next.ack_ms", ack, &validate::CLAIM_ACK_MS)?;
    }
    if let Some(why) = s.health.refuses_work() {
        return Ok(NextAsk {
            claim: NextClaim::default(),
            refused_here: Some(format!("{why}; claim through another node")),
            wait: Duration::ZERO,
        });
    }
    Ok(NextAsk {
        claim: NextClaim {
            max,
            queue: n.queue,
            ack_ms: s.tasks.ack_ms(n.ack_ms),
        },
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
pub(super) async fn complete_task(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path(id): Path<TaskId>,
    ApiJson(req): ApiJson<CompleteRequest>,
) -> Result<Json<FinishedNext>> {
    let result = result_text(&s, req.result)?;
    let ask = next_ask(&s, req.next)?;
    let items = [(id.to_string(), req.token, result)];
    let start = muster_trace::now_ns();
    let (out, next) = s
        .tasks
        .finish_then_claim(ask, |next| s.tasks.complete_then(&items, next))
        .await?;
    if let Some(n) = &next
        && let Some(first) = n.tasks.first()
    {
        crate::traces::received_all(&s.tracer, &first.queue, &n.tasks, start);
    }
    match out.into_iter().next() {
        Some(r) => {
            let finished = r?;
            crate::traces::settled("complete", &id, Ok(&finished), start);
            Ok(Json(FinishedNext { finished, next }))
        }
        None => Err(ApiError::internal("complete returned nothing")),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CompleteItem {
    pub id: String,
    pub token: u64,
    #[schema(value_type = Option<serde_json::Value>)]
    pub result: Option<Box<RawValue>>,
}

/// A list of completions, bare or as `{"tasks": [...]}`: the request's
/// shape for the OpenAPI document; the body is read by [`parse_batch`].
#[derive(Debug, Deserialize, ToSchema)]
#[allow(dead_code)]
#[serde(untagged)]
pub(super) enum CompleteBatch {
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
        crate::lenient::from_str::<Vec<CompleteItem>>(text)
    } else {
        crate::lenient::from_str::<Wrapped>(text).map(|w| w.tasks)
    };
    parsed.map_err(|e| {
        ApiError::bad_request(format!(
            "expected a list of {{id, token, result}} (or {{\"tasks\": [...]}}): {e}"
        ))
    })
}

/// Completes up to 1000 tasks in one script; one outcome per item, in order.
#[utoipa::path(post, path = "/api/v1/tasks/complete", tag = "tasks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    request_body = CompleteBatch,
    responses((status = 200, body = CompleteBatchResponse), (status = 400, description = "Bad batch")))]
pub(super) async fn complete_batch(
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
                status: "invalid".into(),
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
                    status: "completed".into(),
                    state: Some(f.state),
                    error: None,
                },
                Err(TaskError::NotFound(_)) => CompleteOutcome {
                    id: id.clone(),
                    status: "not_found".into(),
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
                        status: "conflict".into(),
                        state,
                        error: Some(e.to_string()),
                    }
                }
                Err(e @ TaskError::Store(_)) => CompleteOutcome {
                    id: id.clone(),
                    status: "unknown".into(),
                    state: None,
                    error: Some(ApiError::from(e).to_string()),
                },
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
pub(super) struct FailRequest {
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
pub(super) async fn fail_task(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path(id): Path<TaskId>,
    ApiJson(req): ApiJson<FailRequest>,
) -> Result<Json<FinishedNext>> {
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
    let start = muster_trace::now_ns();
    let (finished, next) = s
        .tasks
        .finish_then_claim(ask, |next| s.tasks.fail_then(&id, req.token, &error, retry, next))
        .await?;
    crate::traces::settled("fail", &id, Ok(&finished), start);
    if let Some(n) = &next
        && let Some(first) = n.tasks.first()
    {
        crate::traces::received_all(&s.tracer, &first.queue, &n.tasks, start);
    }
    Ok(Json(FinishedNext { finished, next }))
}
