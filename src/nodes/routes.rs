//! REST routes of the node registry.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{Heartbeat, NodeInfo, NodeKind, NodeList};
use muster_api::NodeId;

use crate::app::AppState;
use crate::auth::{AdminCaller, ReadCaller, WorkerCaller};
use crate::error::{ApiError, Result};
use crate::http::{OptJson, Path, no_content};
use crate::nodes::Nodes;
use crate::validate;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_nodes))
        .routes(routes!(get_node, delete_node))
        .routes(routes!(leave_worker))
        .routes(routes!(heartbeat_node))
        .routes(routes!(drain_node))
}

/// Every registered node with its state, as of one Redis instant.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", security(("bearer" = ["read"]), ("session" = ["read"])), responses((status = 200, body = NodeList)))]
async fn list_nodes(State(nodes): State<Arc<Nodes>>, _caller: ReadCaller) -> Result<Json<NodeList>> {
    Ok(Json(nodes.list().await?))
}

/// One node.
#[utoipa::path(get, path = "/api/v1/nodes/{id}", tag = "nodes", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("id" = String, Path, description = "Node id")),
    responses((status = 200, body = NodeInfo), (status = 404, description = "Unknown node")))]
async fn get_node(
    State(nodes): State<Arc<Nodes>>,
    _caller: ReadCaller,
    Path(id): Path<NodeId>,
) -> Result<Json<NodeInfo>> {
    nodes
        .get(&id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no node `{id}` is registered")))
}

/// Body of an external worker's heartbeat.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct HeartbeatBody {
    /// Lifetime of this heartbeat, 500 to 3 600 000 ms; default `nodes.ttl_ms`.
    pub ttl_ms: Option<u64>,
    /// Up to 32 labels (keys up to 64 characters, values up to 256); no
    /// control or bidirectional formatting characters in keys or values.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Where the worker runs (host, URL); shown on the Nodes page. No
    /// control or bidirectional formatting characters.
    #[serde(default)]
    pub addr: String,
    /// The worker's version, shown on the Nodes page. No control or
    /// bidirectional formatting characters.
    #[serde(default)]
    pub version: String,
}

validate::object_only!(HeartbeatBody);

/// An external worker joins the cluster or refreshes its membership. A
/// worker must heartbeat before it claims, and keep heartbeating while it
/// runs tasks: when its heartbeat expires its tasks are recovered. A
/// worker id belongs to the credential (token name) that registered it
/// until it leaves or is marked dead; a muster node's id is never a worker's.
#[utoipa::path(put, path = "/api/v1/nodes/{id}/heartbeat", tag = "nodes", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("id" = String, Path, description = "Worker id, [A-Za-z0-9._-]{1,64}")),
    request_body(content = Option<HeartbeatBody>, description = "Optional: without a body the defaults apply"),
    responses((status = 200, body = Heartbeat), (status = 400, description = "Bad id or body"),
              (status = 409, description = "Too many nodes, a muster node's id, or a worker registered by another credential")))]
async fn heartbeat_node(
    State(s): State<AppState>,
    caller: WorkerCaller,
    Path(id): Path<NodeId>,
    OptJson(body): OptJson<HeartbeatBody>,
) -> Result<Json<Heartbeat>> {
    let ttl = body.ttl_ms.unwrap_or(s.cfg.nodes.ttl_ms);
    validate::in_range("ttl_ms", ttl, &validate::WORKER_TTL_MS)?;
    if body.labels.len() > validate::WORKER_LABELS_MAX
        || body.labels.iter().any(|(k, v)| {
            k.is_empty()
                || k.chars().count() > validate::WORKER_LABEL_KEY_MAX_LEN
                || v.chars().count() > validate::WORKER_LABEL_VALUE_MAX_LEN
        })
    {
        return Err(ApiError::bad_request(format!(
            "`labels`: at most {}, keys 1 to {} characters, values at most {} characters",
            validate::WORKER_LABELS_MAX,
            validate::WORKER_LABEL_KEY_MAX_LEN,
            validate::WORKER_LABEL_VALUE_MAX_LEN
        )));
    }
    if body.addr.chars().count() > validate::WORKER_ADDR_MAX_LEN
        || body.version.chars().count() > validate::WORKER_VERSION_MAX_LEN
    {
        return Err(ApiError::bad_request(format!(
            "`addr` is limited to {} characters and `version` to {}",
            validate::WORKER_ADDR_MAX_LEN,
            validate::WORKER_VERSION_MAX_LEN
        )));
    }
    for (k, v) in &body.labels {
        validate::plain_text("a `labels` key", k)?;
        validate::plain_text(&format!("`labels.{}`", k.escape_debug()), v)?;
    }
    validate::plain_text("`addr`", &body.addr)?;
    validate::plain_text("`version`", &body.version)?;
    if *s.node_id == *id {
        return Err(ApiError::bad_request(format!(
            "`{id}` is this muster node's own id; pick another worker id"
        )));
    }
    let hb = s
        .nodes
        .heartbeat(
            &id,
            NodeKind::Worker,
            &caller.name,
            ttl,
            &body.addr,
            &body.version,
            &body.labels,
            |i| s.health.failing(i),
        )
        .await?;
    Ok(Json(hb))
}

/// Marks a node draining for the whole cluster: it gets no new work.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/drain", tag = "nodes", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("id" = String, Path, description = "Node id")),
    responses((status = 204, description = "Draining"), (status = 404, description = "No live node with this id")))]
async fn drain_node(State(nodes): State<Arc<Nodes>>, caller: AdminCaller, Path(id): Path<NodeId>) -> Result<Response> {
    nodes.drain(&id, &caller.name).await?;
    Ok(no_content())
}

/// An external worker leaves the cluster when it stops: its registration is
/// removed at once, or, while it still holds running tasks, kept (dead) until
/// the orphan cleaner has recovered them. Only worker registrations: a
/// muster node is removed by an admin (`DELETE /api/v1/nodes/{id}`), and
/// a worker only by the credential that registered it.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/leave", tag = "nodes", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("id" = String, Path, description = "The worker's id")),
    responses((status = 204, description = "Left"), (status = 404, description = "Unknown worker"),
               (status = 403, description = "A worker registered by another credential"),
               (status = 409, description = "A muster node, not a worker")))]
async fn leave_worker(
    State(nodes): State<Arc<Nodes>>,
    caller: WorkerCaller,
    Path(id): Path<NodeId>,
) -> Result<Response> {
    nodes.leave_worker(&id, &caller.name).await?;
    Ok(no_content())
}

/// Removes a node from the registry. Its running tasks are recovered by the
/// orphan cleaner. A live node that keeps heartbeating joins again.
#[utoipa::path(delete, path = "/api/v1/nodes/{id}", tag = "nodes", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("id" = String, Path, description = "Node id")),
    responses((status = 204, description = "Removed"), (status = 404, description = "Unknown node")))]
async fn delete_node(
    State(nodes): State<Arc<Nodes>>,
    _caller: AdminCaller,
    Path(id): Path<NodeId>,
) -> Result<Response> {
    nodes.leave(&id, "removed").await?;
    Ok(no_content())
}
