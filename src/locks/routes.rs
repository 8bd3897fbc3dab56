//! REST routes of locks and elections.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use muster_api::locks::{CampaignResponse, ElectionList, LockList};
pub(crate) use muster_api::{Acquired, Renewed};

use super::{Leadership, LockError, LockInfo, Locks};
use muster_api::Name;

use crate::app::AppState;
use crate::auth::{AdminCaller, ReadCaller, WorkerCaller};
use crate::error::{ApiError, Result};
use crate::http::{ApiJson, Path, no_content};
use crate::validate;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_locks))
        .routes(routes!(get_lock, break_lock))
        .routes(routes!(acquire_lock))
        .routes(routes!(renew_lock))
        .routes(routes!(release_lock))
        .routes(routes!(list_elections))
        .routes(routes!(get_leader))
        .routes(routes!(campaign))
        .routes(routes!(resign))
}

fn check_ttl(s: &AppState, ttl: Option<u64>) -> Result<u64> {
    let c = &s.cfg.locks;
    let ttl = ttl.unwrap_or(c.default_ttl_ms);
    if !(validate::MIN_LEASE_MS..=c.max_ttl_ms).contains(&ttl) {
        return Err(ApiError::bad_request(format!(
            "`ttl_ms` must be between 100 and {} (locks.max_ttl_ms)",
            c.max_ttl_ms
        )));
    }
    Ok(ttl)
}

fn check_wait(s: &AppState, wait: Option<u64>) -> Result<Duration> {
    let wait = wait.unwrap_or(0);
    let max = s.cfg.locks.max_wait_ms;
    if wait > max {
        return Err(ApiError::bad_request(format!(
            "`wait_ms` must be at most {max} (locks.max_wait_ms); call again to wait longer"
        )));
    }
    Ok(Duration::from_millis(wait))
}

// --- locks -----------------------------------------------------------------

/// Every held lock.
#[utoipa::path(get, path = "/api/v1/locks", tag = "locks", security(("bearer" = ["read"]), ("session" = ["read"])), responses((status = 200, body = LockList)))]
async fn list_locks(State(locks): State<Arc<Locks>>, _caller: ReadCaller) -> Result<Json<LockList>> {
    Ok(Json(LockList {
        locks: locks.list().await?,
    }))
}

/// One lock: its holder, token, lease and waiters.
#[utoipa::path(get, path = "/api/v1/locks/{name}", tag = "locks", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("name" = String, Path, description = "Lock name")),
    responses((status = 200, body = LockInfo)))]
async fn get_lock(
    State(locks): State<Arc<Locks>>,
    _caller: ReadCaller,
    Path(name): Path<Name>,
) -> Result<Json<LockInfo>> {
    Ok(Json(locks.get(&name).await?))
}

/// Breaks a lock whoever holds it (its holder's next renew or release gets
/// 409). For operators; holders use `release`.
#[utoipa::path(delete, path = "/api/v1/locks/{name}", tag = "locks", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("name" = String, Path, description = "Lock name")),
    responses((status = 204, description = "Broken"), (status = 404, description = "Not held")))]
async fn break_lock(State(locks): State<Arc<Locks>>, caller: AdminCaller, Path(name): Path<Name>) -> Result<Response> {
    locks.release(&name, None, &caller.name).await?;
    Ok(no_content())
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AcquireRequest {
    /// Who takes the lock: 1 to 200 printable ASCII characters, unique per
    /// holder process. Acquiring again as the holder extends the lease and
    /// returns the same token.
    pub owner: String,
    /// Lease length, 100 ms to `locks.max_ttl_ms`; default `locks.default_ttl_ms`.
    pub ttl_ms: Option<u64>,
    /// Long poll: wait in line up to this long (at most `locks.max_wait_ms`).
    /// Waiters are served first come, first served. Default 0: try once.
    pub wait_ms: Option<u64>,
    /// Optional node or worker id: the lease also ends as soon as that node's
    /// heartbeat expires.
    pub node: Option<String>,
}

/// Acquires a lock and returns its fencing token. With `wait_ms`, waits in
/// a FIFO line and wakes when the lock is released or its lease lapses.
/// 409 when it is still held by someone else when `wait_ms` runs out.
#[utoipa::path(post, path = "/api/v1/locks/{name}/acquire", tag = "locks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("name" = String, Path, description = "Lock name, [A-Za-z0-9._-]{1,128}")),
    request_body = AcquireRequest,
    responses((status = 200, body = Acquired), (status = 400, description = "Bad name, owner, ttl or wait"),
              (status = 409, description = "Held by another owner (`holder`, `position` in line), or the node is not alive")))]
async fn acquire_lock(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path(name): Path<Name>,
    ApiJson(req): ApiJson<AcquireRequest>,
) -> Result<Json<Acquired>> {
    validate::opaque_key("owner", &req.owner)?;
    if let Some(n) = &req.node {
        validate::node_id("node", n)?;
    }
    let ttl = check_ttl(&s, req.ttl_ms)?;
    let wait = check_wait(&s, req.wait_ms)?;
    let g = s
        .locks
        .acquire_wait(&name, &req.owner, ttl, req.node.as_deref(), wait)
        .await?;
    Ok(Json(Acquired {
        name: name.into_string(),
        owner: req.owner,
        token: g.token,
        expires_at: g.expires_at,
        ttl_ms: ttl,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RenewRequest {
    /// The holder's fencing token.
    pub token: u64,
    /// New lease length from now; default `locks.default_ttl_ms`.
    pub ttl_ms: Option<u64>,
}

/// Extends the lease held under `token`. 409 when the token is stale or the
/// lease already lapsed: the lock is lost, stop using the resource.
#[utoipa::path(post, path = "/api/v1/locks/{name}/renew", tag = "locks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("name" = String, Path, description = "Lock name")),
    request_body = RenewRequest,
    responses((status = 200, body = Renewed), (status = 409, description = "Stale token or lapsed lease")))]
async fn renew_lock(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path(name): Path<Name>,
    ApiJson(req): ApiJson<RenewRequest>,
) -> Result<Json<Renewed>> {
    let ttl = check_ttl(&s, req.ttl_ms)?;
    let expires_at = s.locks.renew(&name, req.token, ttl).await?;
    Ok(Json(Renewed {
        name: name.into_string(),
        token: req.token,
        expires_at,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReleaseRequest {
    /// The holder's fencing token.
    pub token: u64,
}

/// Releases the lock held under `token`; the first waiter in line gets it.
/// 409 when the token is stale or the lease already lapsed.
#[utoipa::path(post, path = "/api/v1/locks/{name}/release", tag = "locks", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("name" = String, Path, description = "Lock name")),
    request_body = ReleaseRequest,
    responses((status = 204, description = "Released"), (status = 409, description = "Stale token or lapsed lease")))]
async fn release_lock(
    State(locks): State<Arc<Locks>>,
    caller: WorkerCaller,
    Path(name): Path<Name>,
    ApiJson(req): ApiJson<ReleaseRequest>,
) -> Result<Response> {
    match locks.release(&name, Some(req.token), &caller.name).await {
        Ok(()) => Ok(no_content()),
        Err(LockError::NotHeld(_)) => Err(LockError::Stale {
            name: name.into_string(),
            token: req.token,
            holder: None,
            current: None,
        }
        .into()),
        Err(e) => Err(e.into()),
    }
}

// --- elections -------------------------------------------------------------

/// Every election that has a leader.
#[utoipa::path(get, path = "/api/v1/elections", tag = "elections", security(("bearer" = ["read"]), ("session" = ["read"])), responses((status = 200, body = ElectionList)))]
async fn list_elections(State(locks): State<Arc<Locks>>, _caller: ReadCaller) -> Result<Json<ElectionList>> {
    Ok(Json(ElectionList {
        elections: locks.elections().await?,
    }))
}

/// The leader of an election and its epoch (`leader: null` when nobody leads).
#[utoipa::path(get, path = "/api/v1/elections/{name}", tag = "elections", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("name" = String, Path, description = "Election name")),
    responses((status = 200, body = Leadership)))]
async fn get_leader(
    State(locks): State<Arc<Locks>>,
    _caller: ReadCaller,
    Path(name): Path<Name>,
) -> Result<Json<Leadership>> {
    Ok(Json(locks.leader(&name).await?))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CampaignRequest {
    /// The candidate: 1 to 200 printable ASCII characters, unique per process.
    pub candidate: String,
    /// Leadership lease, 100 ms to `locks.max_ttl_ms`; default
    /// `locks.default_ttl_ms`. The leader campaigns again to renew it.
    pub ttl_ms: Option<u64>,
    /// Long poll: wait up to this long (at most `locks.max_wait_ms`) to be elected.
    pub wait_ms: Option<u64>,
    /// Any JSON the leader publishes (its address, say); at most 64 KiB.
    #[schema(value_type = Option<serde_json::Value>)]
    pub value: Option<serde_json::Value>,
}

/// Campaigns for leadership. Elected: a new epoch, strictly greater than
/// every epoch before, so there is at most one leader per epoch. The leader
/// calling again renews its lease and keeps its epoch. With `wait_ms`, waits
/// until elected and wakes when the leader resigns or its lease lapses.
#[utoipa::path(post, path = "/api/v1/elections/{name}/campaign", tag = "elections", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("name" = String, Path, description = "Election name, [A-Za-z0-9._-]{1,128}")),
    request_body = CampaignRequest,
    responses((status = 200, body = CampaignResponse), (status = 400, description = "Bad input")))]
async fn campaign(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path(name): Path<Name>,
    ApiJson(req): ApiJson<CampaignRequest>,
) -> Result<Json<CampaignResponse>> {
    validate::opaque_key("candidate", &req.candidate)?;
    let ttl = check_ttl(&s, req.ttl_ms)?;
    let wait = check_wait(&s, req.wait_ms)?;
    let value = match &req.value {
        None => None,
        Some(v) => {
            let text = serde_json::to_string(v).map_err(|e| ApiError::bad_request(e.to_string()))?;
            if text.len() > 64 * 1024 {
                return Err(ApiError::TooLarge("`value` is limited to 64 KiB".into()));
            }
            Some(text)
        }
    };
    let c = s
        .locks
        .campaign_wait(&name, &req.candidate, ttl, value.as_deref(), wait)
        .await?;
    Ok(Json(CampaignResponse {
        elected: c.code > 0,
        leadership: c.state,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResignRequest {
    /// The leader resigning.
    pub candidate: String,
    /// Its epoch; when given, the call is refused unless it leads at this epoch.
    pub epoch: Option<u64>,
}

/// The leader resigns; waiting candidates wake and one is elected with a
/// greater epoch. 409 unless the candidate leads (at `epoch`).
#[utoipa::path(post, path = "/api/v1/elections/{name}/resign", tag = "elections", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("name" = String, Path, description = "Election name")),
    request_body = ResignRequest,
    responses((status = 204, description = "Resigned"), (status = 409, description = "Not the leader")))]
async fn resign(
    State(locks): State<Arc<Locks>>,
    _caller: WorkerCaller,
    Path(name): Path<Name>,
    ApiJson(req): ApiJson<ResignRequest>,
) -> Result<Response> {
    validate::opaque_key("candidate", &req.candidate)?;
    locks.resign(&name, &req.candidate, req.epoch).await?;
    Ok(no_content())
}
