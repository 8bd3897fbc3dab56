//! REST route of the outcome history: the data behind the dashboard's charts.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{Range, Series};
use crate::app::AppState;
use crate::auth::ReadCaller;
use crate::error::Result;
use crate::http::ApiQuery;
use crate::stats::Stats;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_stats))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct StatsParams {
    /// `hour` (60 points, one per minute; the default) or `month` (30
    /// points, one per UTC day).
    pub range: Option<Range>,
    /// One queue's numbers; all queues together when absent.
    pub queue: Option<String>,
}

/// Tasks succeeded, failed and dead per minute or per day, with the queue
/// depth and latency sampled in each step, for one queue or all: the data
/// of the dashboard's charts, columns oldest first. Minute history is kept
/// two hours, day history 32 days; the current step is still filling.
#[utoipa::path(get, path = "/api/v1/stats", tag = "system", security(("bearer" = ["read"]), ("session" = ["read"])), params(StatsParams),
    responses((status = 200, body = Series)))]
async fn get_stats(
    State(stats): State<Arc<Stats>>,
    _caller: ReadCaller,
    ApiQuery(p): ApiQuery<StatsParams>,
) -> Result<Json<Series>> {
    if let Some(q) = &p.queue {
        crate::validate::name("queue", q)?;
    }
    Ok(Json(
        stats.series(p.range.unwrap_or(Range::Hour), p.queue.as_deref()).await?,
    ))
}
