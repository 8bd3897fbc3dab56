//! The routes of bulk actions on dead letters (`tasks/bulk.rs`).

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::AppState;
use crate::auth::AdminCaller;
use crate::error::{ApiError, Result};
use crate::http::ApiJson;
use crate::tasks::bulk::{BulkAction, BulkOutcome, MAX_TASKS};
use crate::validate;

pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(retry_dead))
        .routes(routes!(discard_dead))
}

/// Which dead letters a bulk action takes: one queue's, or every queue's
/// with `"queue": "*"`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct BulkRequest {
    /// The queue whose dead letters to take, or `*` for every queue's.
    #[schema(min_length = 1, max_length = 128, pattern = "^([A-Za-z0-9._-]+|\\*)$")]
    pub queue: String,
    /// At most this many tasks, oldest first (1 to 10 000 000); all when absent.
    #[schema(minimum = 1, maximum = 10_000_000)]
    pub limit: Option<u64>,
}

/// `queue: "*"`: every queue's dead letters.
pub(super) const ALL_QUEUES: &str = "*";

fn bulk_args(b: BulkRequest) -> Result<(Option<String>, u64)> {
    let queue = if b.queue == ALL_QUEUES {
        None
    } else {
        validate::name("queue", &b.queue)
            .map_err(|e| ApiError::bad_request(format!("{e}, or `*` for every queue's dead letters")))?;
        Some(b.queue)
    };
    let limit = b.limit.unwrap_or(MAX_TASKS);
    validate::in_range("limit", limit, &(1..=MAX_TASKS))?;
    Ok((queue, limit))
}

/// Retries dead tasks in bulk: each is queued again with a fresh set of
/// attempts, oldest first, 500 per Redis script call.
#[utoipa::path(post, path = "/api/v1/dead/retry", tag = "tasks", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    request_body = BulkRequest,
    responses((status = 200, body = BulkOutcome), (status = 400, description = "No body, a bad queue name, or a bad limit")))]
async fn retry_dead(
    State(s): State<AppState>,
    caller: AdminCaller,
    ApiJson(body): ApiJson<BulkRequest>,
) -> Result<Json<BulkOutcome>> {
    bulk(&s, &caller.name, body, BulkAction::Retry).await
}

async fn bulk(s: &AppState, actor: &str, body: BulkRequest, action: BulkAction) -> Result<Json<BulkOutcome>> {
    let (queue, limit) = bulk_args(body)?;
    Ok(Json(s.tasks.dead_bulk(queue.as_deref(), action, limit, actor).await?))
}

/// Discards dead tasks in bulk, oldest first, 500 per Redis script call.
#[utoipa::path(post, path = "/api/v1/dead/discard", tag = "tasks", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    request_body = BulkRequest,
    responses((status = 200, body = BulkOutcome), (status = 400, description = "No body, a bad queue name, or a bad limit")))]
async fn discard_dead(
    State(s): State<AppState>,
    caller: AdminCaller,
    ApiJson(body): ApiJson<BulkRequest>,
) -> Result<Json<BulkOutcome>> {
    bulk(&s, &caller.name, body, BulkAction::Discard).await
}
