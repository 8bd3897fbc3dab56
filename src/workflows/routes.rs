//! REST routes of workflows.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{NewWorkflow, Workflow};
use muster_api::TaskId;
use muster_api::workflows::WorkflowList;

use crate::app::AppState;
use crate::auth::{AdminCaller, ReadCaller, WorkerCaller};
use crate::error::{ApiError, Result};
use crate::http::{ApiJson, ApiQuery, Path};
use crate::workflows::Workflows;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_workflow, list_workflows))
        .routes(routes!(get_workflow))
        .routes(routes!(cancel_workflow))
}

pub(crate) use muster_api::workflows::CreatedWorkflow;

/// Starts a workflow: a DAG of tasks. Tasks without dependencies are queued
/// at once; each other task is queued, exactly once, when all its
/// dependencies succeeded. 201 for a new workflow, 200 for a replay of its
/// idempotency key (also accepted as the `Idempotency-Key` header).
#[utoipa::path(post, path = "/api/v1/workflows", tag = "workflows", security(("bearer" = ["worker"]), ("session" = ["worker"])), request_body = NewWorkflow,
    params(("Idempotency-Key" = Option<String>, Header, description = "Same as `idempotency_key`"),
           ("traceparent" = Option<String>, Header, description = "W3C trace context: every task of the run carries it (with tracing on, a span of the run under it); a malformed one is ignored"),
           ("tracestate" = Option<String>, Header, description = "W3C trace state beside `traceparent`, at most 512 printable ASCII characters (a longer one is ignored)")),
    responses((status = 201, body = CreatedWorkflow), (status = 200, body = CreatedWorkflow, description = "Replay"),
              (status = 400, description = "Invalid DAG: duplicate key, unknown dependency, cycle (named)"),
              (status = 409, description = "Its new queues do not fit in tasks.max_queues, or a task names a flow-control limit not defined"),
              (status = 413, description = "A payload is too large")))]
async fn create_workflow(
    State(s): State<AppState>,
    caller: WorkerCaller,
    headers: HeaderMap,
    ApiJson(mut w): ApiJson<NewWorkflow>,
) -> Result<Response> {
    if let Some(h) = headers.get("idempotency-key") {
        let h = h
            .to_str()
            .map_err(|_| ApiError::bad_request("the Idempotency-Key header must be ASCII"))?;
        match &w.idempotency_key {
            Some(k) if k != h => {
                return Err(ApiError::bad_request(
                    "the Idempotency-Key header and `idempotency_key` differ; send one",
                ));
            }
            _ => w.idempotency_key = Some(h.to_string()),
        }
    }
    // The run's trace: the caller's (header), or with tracing on a span of
    // this request standing for the run; every task of the run carries it.
    let (tp, ts) = crate::tasks::routes::trace_headers(&headers).unwrap_or_default();
    let mut tp = tp;
    let run = crate::traces::sending(&mut tp, &ts, false);
    let trace = (!tp.is_empty()).then_some((tp.as_str(), ts.as_str()));
    let plan = s.workflows.plan(&w, trace)?;
    let room = s.tasks.config().queue_room(caller.role);
    let (id, new) = s.workflows.create(&plan, &s.node_id, room).await?;
    if let Some(run) = run {
        run.finish("workflow run".into(), vec![("muster.workflow.id", id.clone().into())]);
    }
    let status = if new { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(CreatedWorkflow { id, replayed: !new })).into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WorkflowListParams {
    /// running, succeeded, failed or cancelled.
    pub state: Option<String>,
    /// 1 to 200; default 50.
    pub limit: Option<usize>,
    pub cursor: Option<usize>,
}

/// Workflows, newest first.
#[utoipa::path(get, path = "/api/v1/workflows", tag = "workflows", security(("bearer" = ["read"]), ("session" = ["read"])), params(WorkflowListParams),
    responses((status = 200, body = WorkflowList)))]
async fn list_workflows(
    State(s): State<AppState>,
    _caller: ReadCaller,
    ApiQuery(p): ApiQuery<WorkflowListParams>,
) -> Result<Json<WorkflowList>> {
    if let Some(st) = &p.state
        && !["running", "succeeded", "failed", "cancelled"].contains(&st.as_str())
    {
        return Err(ApiError::bad_request(
            "`state` must be running, succeeded, failed or cancelled",
        ));
    }
    let limit = p.limit.unwrap_or(50);
    crate::validate::in_range("limit", limit, &crate::validate::WORKFLOW_PAGE_LIMIT)?;
    let (workflows, next_cursor) = s
        .workflows
        .list(p.state.as_deref(), limit, p.cursor.unwrap_or(0).min(1_000_000))
        .await?;
    Ok(Json(WorkflowList { workflows, next_cursor }))
}

/// A workflow with each task's state.
#[utoipa::path(get, path = "/api/v1/workflows/{id}", tag = "workflows", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("id" = String, Path, description = "Workflow id")),
    responses((status = 200, body = Workflow), (status = 404, description = "Unknown workflow")))]
async fn get_workflow(
    State(workflows): State<Arc<Workflows>>,
    _caller: ReadCaller,
    Path(id): Path<TaskId>,
) -> Result<Json<Workflow>> {
    Ok(Json(workflows.get(&id).await?))
}

/// Cancels a running workflow: what has not started is cancelled, running
/// tasks are asked to stop.
#[utoipa::path(post, path = "/api/v1/workflows/{id}/cancel", tag = "workflows", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("id" = String, Path, description = "Workflow id")),
    responses((status = 204, description = "Cancelled"), (status = 404, description = "Unknown workflow"),
              (status = 409, description = "Already finished")))]
async fn cancel_workflow(
    State(workflows): State<Arc<Workflows>>,
    caller: AdminCaller,
    Path(id): Path<TaskId>,
) -> Result<Response> {
    workflows.cancel(&id, &caller.name).await?;
    Ok(crate::http::no_content())
}
