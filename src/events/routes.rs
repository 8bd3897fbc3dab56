//! Event routes: the WebSocket feed, the same replay over plain HTTP, and the
//! node's cached live view.

use axum::extract::{ConnectInfo, State, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::live::Snapshot;
use super::slots::NoSlot;
use super::stream::{SinceError, read_since, retained_all};
use super::{EventPage, Filter, replay};
use crate::app::AppState;
use crate::auth::ReadCaller;
use crate::error::{ApiError, Result};
use crate::http::ApiQuery;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_events))
        .routes(routes!(events_ws))
        .routes(routes!(get_live))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WsParams {
    /// Comma-separated event types or prefixes: `task.*,node.dead`; default
    /// all. A topic that matches no event type is refused (400).
    pub topics: Option<String>,
    /// Only events of this queue.
    pub queue: Option<String>,
    /// Resume after this event: the `id` of the last event received, passed
    /// back as it came (an opaque cursor: one stream id, or with
    /// `redis.shards` > 1 one per shard joined by commas); `0` replays all
    /// that is retained. Refused (400) when it lies more than 5 s past both
    /// the stream's newest id and Redis time.
    pub since: Option<String>,
    /// Bearer token, for clients that cannot set headers (browsers).
    // Read by the auth layer from the query string; declared here so the
    // OpenAPI document lists it.
    #[allow(dead_code)]
    pub token: Option<String>,
}

fn since_error(e: SinceError) -> ApiError {
    match e {
        SinceError::Bad(m) => ApiError::BadRequest(m),
        SinceError::Store(e) => e.into(),
    }
}

/// The cluster event feed over a WebSocket. Each text message is one event
/// `{"id", "type", "ts", "node", <subjects>, "data"}`, or a control message:
/// `{"type": "gap", "oldest"}` (events after `since` were trimmed),
/// `{"type": "lagged", "last_id"}` (the client fell behind and is closed;
/// reconnect with `since=last_id`).
#[utoipa::path(get, path = "/api/v1/events/ws", tag = "events", security(("bearer" = ["read"]), ("session" = ["read"])), params(WsParams),
    responses((status = 101, description = "Switching to the WebSocket protocol"),
              (status = 400, description = "Bad or unknown topics, bad queue, or a `since` that is not a stream id or lies past the stream's newest event"),
              (status = 429, description = "The caller's token (with its sessions), or in no-auth mode its address, holds `events.max_clients_per_principal` subscribers on this node"),
              (status = 503, description = "Too many subscribers on this node (events.max_clients)")))]
async fn events_ws(
    State(s): State<AppState>,
    caller: ReadCaller,
    remote: Option<Extension<ConnectInfo<std::net::SocketAddr>>>,
    ApiQuery(p): ApiQuery<WsParams>,
    ws: WebSocketUpgrade,
) -> Result<Response> {
    let filter = Filter::parse(p.topics.as_deref(), p.queue.as_deref()).map_err(ApiError::BadRequest)?;
    let since = read_since(&s.store, p.since.as_deref())
        .await
        .map_err(since_error)?
        .map(|(since, _)| since);
    // Tokens are principals; without tokens everyone is "anonymous", so the
    // client's address is.
    let principal = match remote {
        Some(Extension(ConnectInfo(remote))) if s.cfg.auth.tokens.is_empty() => {
            format!("the address {}", crate::serve::client_key(remote.ip()))
        }
        _ => format!("the token `{}`", caller.name),
    };
    let permit = s.ws_slots.take(&principal).map_err(|why| match why {
        NoSlot::Share => ApiError::TooMany(format!(
            "{principal} already holds {} event subscribers on this node \
             (events.max_clients_per_principal); close one first",
            s.ws_slots.per_principal()
        )),
        NoSlot::Node => ApiError::Unavailable(format!(
            "this node already serves {} event subscribers (events.max_clients); connect to another node",
            s.ws_slots.max()
        )),
    })?;
    if s.health.stopping() {
        return Err(ApiError::Unavailable("this node is shutting down".into()));
    }
    // Subscribed here, before the 101: what is published once the client
    // sees its upgrade is delivered, however late the session starts.
    let sub = super::ws::Subscription::new(&s);
    Ok(ws
        .on_upgrade(move |socket| super::ws::serve(socket, s, filter, since, sub, permit))
        .into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReplayParams {
    /// Events after this one: the `id` of the last event received or the
    /// page's `next`, passed back as it came (an opaque cursor: one stream
    /// id, or with `redis.shards` > 1 one per shard joined by commas);
    /// default: the last `limit` events. Refused (400) when it lies more
    /// than 5 s past both the stream's newest id and Redis time.
    pub since: Option<String>,
    /// 1 to 1000; default 100.
    pub limit: Option<usize>,
    pub topics: Option<String>,
    pub queue: Option<String>,
}

/// The event stream over plain HTTP, with the same filters as the WebSocket.
#[utoipa::path(get, path = "/api/v1/events", tag = "events", security(("bearer" = ["read"]), ("session" = ["read"])), params(ReplayParams),
    responses((status = 200, body = EventPage),
              (status = 400, description = "Bad parameters: unknown topics, or a `since` past the stream's newest event")))]
async fn list_events(
    State(s): State<AppState>,
    _caller: ReadCaller,
    ApiQuery(p): ApiQuery<ReplayParams>,
) -> Result<Json<EventPage>> {
    let limit = p.limit.unwrap_or(100);
    crate::validate::in_range("limit", limit, &crate::validate::LONG_PAGE_LIMIT)?;
    let filter = Filter::parse(p.topics.as_deref(), p.queue.as_deref()).map_err(ApiError::BadRequest)?;
    let (since, info) = match read_since(&s.store, p.since.as_deref()).await.map_err(since_error)? {
        Some((since, info)) => (Some(since), info),
        None => (None, retained_all(&s.store).await?),
    };
    Ok(Json(replay(&s.store, since, limit, &filter, &info).await?))
}

/// This node's cached live view (what the dashboard shows): node states,
/// queue counts, orphan totals, throughput over the last ten minutes.
#[utoipa::path(get, path = "/api/v1/live", tag = "events", security(("bearer" = ["read"]), ("session" = ["read"])), responses((status = 200, body = Snapshot)))]
async fn get_live(State(s): State<AppState>, _caller: ReadCaller) -> Result<Json<Snapshot>> {
    Ok(Json(s.live.snapshot()))
}
