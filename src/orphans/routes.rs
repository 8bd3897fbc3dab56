//! REST route of the orphan cleaner.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::AppState;
use crate::auth::ReadCaller;
use crate::error::Result;
use crate::http::ApiQuery;
use crate::nodes::NodeState;
pub(crate) use muster_api::tasks::OrphanReport;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_orphans))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct OrphanParams {
    /// 1 to 1000; default 100.
    pub limit: Option<usize>,
}

pub(crate) async fn report(s: &AppState, limit: usize) -> Result<OrphanReport> {
    let (recovered, counts) = s.orphans.history(limit).await?;
    let nodes = s.nodes.list().await?;
    let suspects = nodes
        .nodes
        .into_iter()
        .filter(|n| n.suspect || matches!(n.state, NodeState::Late | NodeState::Dead))
        .collect();
    Ok(OrphanReport {
        recovered,
        counts: counts.into_iter().collect(),
        suspects,
    })
}

/// Recovered tasks, suspect nodes and totals.
#[utoipa::path(get, path = "/api/v1/orphans", tag = "orphans", security(("bearer" = ["read"]), ("session" = ["read"])), params(OrphanParams),
    responses((status = 200, body = OrphanReport)))]
async fn list_orphans(
    State(s): State<AppState>,
    _caller: ReadCaller,
    ApiQuery(p): ApiQuery<OrphanParams>,
) -> Result<Json<OrphanReport>> {
    let limit = p.limit.unwrap_or(100);
    crate::validate::in_range("limit", limit, &crate::validate::LONG_PAGE_LIMIT)?;
    Ok(Json(report(&s, limit).await?))
}
