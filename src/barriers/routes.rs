//! REST routes of barriers: rounds, etcd-style holds and DoubleBarriers.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{BarrierConfigView, BarrierError, DoubleBarrier, Entrant, Hold, Round, Verdict};
use muster_api::Name;
use muster_api::barriers::{
    ArriveResponse, BarrierDetail, BarrierList, DoubleBarrierList, DoubleBarrierReply, Released, RoundList,
};

use crate::app::AppState;
use crate::auth::{AdminCaller, ReadCaller, WorkerCaller};
use crate::barriers::Barriers;
use crate::error::{ApiError, Result};
use crate::http::{ApiJson, ApiQuery, OptJson, Path, no_content};
use crate::validate;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_barriers))
        .routes(routes!(get_barrier, put_barrier, delete_barrier))
        .routes(routes!(list_rounds))
        .routes(routes!(get_round))
        .routes(routes!(arrive_round))
        .routes(routes!(hold_barrier))
        .routes(routes!(release_barrier))
        .routes(routes!(wait_barrier))
        .routes(routes!(list_double_barriers))
        .routes(routes!(get_double_barrier))
        .routes(routes!(enter_double_barrier))
        .routes(routes!(leave_double_barrier))
}

fn check_wait(s: &AppState, wait_ms: Option<u64>) -> Result<Duration> {
    let wait = wait_ms.unwrap_or(0);
    let max = s.cfg.barriers.max_wait_ms;
    if wait > max {
        return Err(ApiError::bad_request(format!(
            "`wait_ms` must be at most {max} (barriers.max_wait_ms); call again to wait longer"
        )));
    }
    Ok(Duration::from_millis(wait))
}

// --- configuration ---------------------------------------------------------

/// A barrier's configuration.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BarrierSpec {
    /// 1 to 1000 distinct node ids, `[A-Za-z0-9._-]{1,64}`.
    pub participants: Vec<String>,
    /// How many may be missing at the deadline for the round to be released
    /// anyway; 0 to participants - 1. Default 0.
    #[serde(default)]
    pub max_missing: u32,
    /// A round's deadline after its first arrival, 10 ms to 24 h.
    pub timeout_ms: u64,
}

/// Every configured barrier, and every etcd-style hold.
#[utoipa::path(get, path = "/api/v1/barriers", tag = "barriers", security(("bearer" = ["read"]), ("session" = ["read"])), responses((status = 200, body = BarrierList)))]
async fn list_barriers(State(barriers): State<Arc<Barriers>>, _caller: ReadCaller) -> Result<Json<BarrierList>> {
    Ok(Json(BarrierList {
        barriers: barriers.list().await?,
        holds: barriers.holds().await?,
    }))
}

/// One barrier's configuration and hold. A barrier that is only held
/// (etcd-style, never configured) answers 200 with `configured: false`; one
/// neither configured nor held, 404.
#[utoipa::path(get, path = "/api/v1/barriers/{name}", tag = "barriers", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("name" = String, Path, description = "Barrier name")),
    responses((status = 200, body = BarrierDetail), (status = 404, description = "Neither configured nor held")))]
async fn get_barrier(
    State(barriers): State<Arc<Barriers>>,
    _caller: ReadCaller,
    Path(name): Path<Name>,
) -> Result<Json<BarrierDetail>> {
    let config = barriers.get(&name).await?;
    let (hold, _) = barriers.hold_state(&name).await?;
    if config.is_none() && !hold.held {
        return Err(BarrierError::NotFound(name.into_string()).into());
    }
    Ok(Json(BarrierDetail::new(name.into_string(), config, hold)))
}

/// Creates (201) or updates (200) a barrier. Rounds already open keep the
/// participants and tolerance they opened with.
#[utoipa::path(put, path = "/api/v1/barriers/{name}", tag = "barriers", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("name" = String, Path, description = "Barrier name, [A-Za-z0-9._-]{1,128}")),
    request_body = BarrierSpec,
    responses((status = 201, body = BarrierConfigView, description = "Created"),
              (status = 200, body = BarrierConfigView, description = "Updated"),
              (status = 400, description = "Invalid field"), (status = 409, description = "Too many barriers")))]
async fn put_barrier(
    State(s): State<AppState>,
    caller: AdminCaller,
    Path(name): Path<Name>,
    ApiJson(spec): ApiJson<BarrierSpec>,
) -> Result<Response> {
    let n = spec.participants.len();
    if !validate::PARTICIPANTS.contains(&n) {
        return Err(ApiError::bad_request(format!(
            "`participants` must hold {} to {} node ids",
            validate::PARTICIPANTS.start(),
            validate::PARTICIPANTS.end()
        )));
    }
    let mut seen = HashSet::new();
    for p in &spec.participants {
        validate::node_id("participants[]", p)?;
        if !seen.insert(p.as_str()) {
            return Err(ApiError::bad_request(format!("`participants` lists `{p}` twice")));
        }
    }
    if spec.max_missing as usize >= n {
        return Err(ApiError::bad_request(format!(
            "`max_missing` must be less than the number of participants ({n})"
        )));
    }
    validate::in_range("timeout_ms", spec.timeout_ms, &validate::ROUND_TIMEOUT_MS)?;
    let created = s
        .barriers
        .configure(
            &name,
            &spec.participants,
            spec.max_missing,
            spec.timeout_ms,
            &caller.name,
        )
        .await?;
    let view = s
        .barriers
        .get(&name)
        .await?
        .ok_or_else(|| ApiError::internal("barrier vanished after configure"))?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(view)).into_response())
}

/// Deletes a barrier with its rounds (waiters of open rounds get 404) and its
/// hold; a barrier that is only held loses its hold.
#[utoipa::path(delete, path = "/api/v1/barriers/{name}", tag = "barriers", security(("bearer" = ["admin"]), ("session" = ["admin"])),
    params(("name" = String, Path, description = "Barrier name")),
    responses((status = 204, description = "Deleted"), (status = 404, description = "Neither configured nor held")))]
async fn delete_barrier(
    State(barriers): State<Arc<Barriers>>,
    caller: AdminCaller,
    Path(name): Path<Name>,
) -> Result<Response> {
    barriers.delete(&name, &caller.name).await?;
    Ok(no_content())
}

// --- rounds ----------------------------------------------------------------

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RoundsParams {
    /// 1 to 1000; default 50.
    pub limit: Option<usize>,
}

/// The latest rounds of a barrier, newest first.
#[utoipa::path(get, path = "/api/v1/barriers/{name}/rounds", tag = "barriers", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("name" = String, Path, description = "Barrier name"), RoundsParams),
    responses((status = 200, body = RoundList), (status = 404, description = "Unknown barrier")))]
async fn list_rounds(
    State(barriers): State<Arc<Barriers>>,
    _caller: ReadCaller,
    Path(name): Path<Name>,
    ApiQuery(p): ApiQuery<RoundsParams>,
) -> Result<Json<RoundList>> {
    let limit = p.limit.unwrap_or(50);
    validate::in_range("limit", limit, &validate::LONG_PAGE_LIMIT)?;
    if barriers.get(&name).await?.is_none() {
        return Err(BarrierError::NotFound(name.into_string()).into());
    }
    Ok(Json(RoundList {
        rounds: barriers.rounds(&name, limit).await?,
    }))
}

/// One round: arrivals with their times, missing participants, verdict.
#[utoipa::path(get, path = "/api/v1/barriers/{name}/rounds/{round}", tag = "barriers", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("name" = String, Path, description = "Barrier name"), ("round" = String, Path, description = "Round id")),
    responses((status = 200, body = Round), (status = 404, description = "Unknown round")))]
async fn get_round(
    State(s): State<AppState>,
    _caller: ReadCaller,
    Path((name, round)): Path<(Name, Name)>,
) -> Result<Json<Round>> {
    let (r, _) = s
        .barriers
        .round(&name, &round)
        .await?
        .ok_or(BarrierError::RoundNotFound {
            barrier: name.into_string(),
            round: round.into_string(),
        })?;
    Ok(Json(r))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ArriveRequest {
    /// The arriving participant's node id.
    pub node: String,
    /// Long poll: wait up to this long (at most `barriers.max_wait_ms`) for
    /// the verdict. Default 0. Arriving again is harmless, so a client that
    /// waits longer calls again.
    pub wait_ms: Option<u64>,
}

/// A participant's view of a round, borrowed from the round its waiters
/// share.
fn arrive_view<'a>(r: &'a Round, node: &'a str) -> ArriveResponse<'a> {
    let arrived_at = r.arrived_at(node);
    ArriveResponse {
        barrier: Cow::Borrowed(&r.barrier),
        round: Cow::Borrowed(&r.round),
        node: Cow::Borrowed(node),
        verdict: r.verdict,
        may_run: r.verdict == Verdict::Released && arrived_at.is_some(),
        late: r.verdict != Verdict::Pending && arrived_at.is_none(),
        arrived: Cow::Borrowed(&r.arrived),
        missing: Cow::Borrowed(&r.missing),
        arrived_at,
        participants: Cow::Borrowed(&r.participants),
        max_missing: r.max_missing,
        opened_at: r.opened_at,
        deadline: r.deadline,
        decided_at: r.decided_at,
    }
}

/// A participant arrives at a round and (with `wait_ms`) waits for its
/// verdict. The first arrival opens the round with deadline = Redis time +
/// `timeout_ms`. The verdict is decided once, in Redis: `released` when all
/// have arrived, or at the deadline when at most `max_missing` are missing;
/// `aborted` otherwise. Late arrivals read the decided verdict with
/// `may_run: false`. Waiters wake on the decision event.
#[utoipa::path(post, path = "/api/v1/barriers/{name}/rounds/{round}/arrive", tag = "barriers", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("name" = String, Path, description = "Barrier name"),
           ("round" = String, Path, description = "Round id chosen by the callers (the cycle's date, say), [A-Za-z0-9._-]{1,128}")),
    request_body = ArriveRequest,
    responses((status = 200, body = ArriveResponse), (status = 400, description = "Bad name, round, node or wait"),
              (status = 403, description = "Not a participant"), (status = 404, description = "Unknown barrier"),
              (status = 409, description = "The round would open but the barrier has `barriers.max_open_rounds` undecided rounds")))]
async fn arrive_round(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path((name, round)): Path<(Name, Name)>,
    ApiJson(req): ApiJson<ArriveRequest>,
) -> Result<Response> {
    validate::node_id("node", &req.node)?;
    let wait = check_wait(&s, req.wait_ms)?;
    let r = s.barriers.arrive_wait(&name, &round, &req.node, wait).await?;
    Ok(Json(arrive_view(&r, &req.node)).into_response())
}

// --- etcd-style Barrier ----------------------------------------------------

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct HoldRequest {
    /// Who holds it; default the caller's token name. Holding again with the
    /// same holder refreshes the TTL.
    pub holder: Option<String>,
    /// The hold lifts itself after this; 100 ms to `barriers.idle_ttl_ms`
    /// (the default).
    pub ttl_ms: Option<u64>,
}

validate::object_only!(HoldRequest);

/// etcd-style Barrier.Hold: raises the barrier; waiters block until it is
/// released or its TTL passes. 201 when raised now, 200 when refreshed.
#[utoipa::path(post, path = "/api/v1/barriers/{name}/hold", tag = "barriers", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("name" = String, Path, description = "Barrier name")),
    request_body(content = Option<HoldRequest>, description = "Optional: without a body the defaults apply"),
    responses((status = 201, body = Hold, description = "Held now"), (status = 200, body = Hold, description = "Refreshed"),
              (status = 409, description = "Held by another holder")))]
async fn hold_barrier(
    State(s): State<AppState>,
    caller: WorkerCaller,
    Path(name): Path<Name>,
    OptJson(req): OptJson<HoldRequest>,
) -> Result<Response> {
    let holder = req.holder.unwrap_or_else(|| caller.name.clone());
    validate::opaque_key("holder", &holder)?;
    let max = s.cfg.barriers.idle_ttl_ms;
    let ttl = req.ttl_ms.unwrap_or(max);
    if !(validate::MIN_LEASE_MS..=max).contains(&ttl) {
        return Err(ApiError::bad_request(format!(
            "`ttl_ms` must be between 100 and {max} (barriers.idle_ttl_ms)"
        )));
    }
    let (hold, created) = s.barriers.hold(&name, &holder, ttl).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(hold)).into_response())
}

/// etcd-style Barrier.Release: lowers the barrier, every waiter proceeds.
/// Anyone with the worker role may release; releasing a barrier that is not
/// held changes nothing.
#[utoipa::path(post, path = "/api/v1/barriers/{name}/release", tag = "barriers", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("name" = String, Path, description = "Barrier name")),
    responses((status = 200, body = Released)))]
async fn release_barrier(
    State(barriers): State<Arc<Barriers>>,
    caller: WorkerCaller,
    Path(name): Path<Name>,
) -> Result<Json<Released>> {
    Ok(Json(Released {
        released: barriers.lift(&name, &caller.name).await?,
    }))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct WaitRequest {
    /// Long poll: wait up to this long (at most `barriers.max_wait_ms`).
    pub wait_ms: Option<u64>,
}

validate::object_only!(WaitRequest);

/// etcd-style Barrier.Wait: returns once the barrier is not held (`held:
/// false`), or when `wait_ms` runs out (`held: true`).
#[utoipa::path(post, path = "/api/v1/barriers/{name}/wait", tag = "barriers", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("name" = String, Path, description = "Barrier name")),
    request_body(content = Option<WaitRequest>, description = "Optional: without a body, no wait"),
    responses((status = 200, body = Hold)))]
async fn wait_barrier(
    State(s): State<AppState>,
    _caller: ReadCaller,
    Path(name): Path<Name>,
    OptJson(req): OptJson<WaitRequest>,
) -> Result<Json<Hold>> {
    let wait = check_wait(&s, req.wait_ms)?;
    Ok(Json(s.barriers.hold_wait(&name, wait).await?))
}

// --- DoubleBarrier ---------------------------------------------------------

/// Every DoubleBarrier with entrants.
#[utoipa::path(get, path = "/api/v1/double-barriers", tag = "barriers", security(("bearer" = ["read"]), ("session" = ["read"])),
    responses((status = 200, body = DoubleBarrierList)))]
async fn list_double_barriers(
    State(barriers): State<Arc<Barriers>>,
    _caller: ReadCaller,
) -> Result<Json<DoubleBarrierList>> {
    Ok(Json(DoubleBarrierList {
        double_barriers: barriers.double_barriers().await?,
    }))
}

/// One DoubleBarrier: its count, entrants and whether it is ready.
#[utoipa::path(get, path = "/api/v1/double-barriers/{name}", tag = "barriers", security(("bearer" = ["read"]), ("session" = ["read"])),
    params(("name" = String, Path, description = "DoubleBarrier name")),
    responses((status = 200, body = DoubleBarrier)))]
async fn get_double_barrier(
    State(barriers): State<Arc<Barriers>>,
    _caller: ReadCaller,
    Path(name): Path<Name>,
) -> Result<Json<DoubleBarrier>> {
    Ok(Json(barriers.double_barrier(&name).await?))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnterRequest {
    /// The entrant: a registered, heartbeating node or worker id. If its
    /// heartbeat expires it is evicted.
    pub node: String,
    /// Entrants that make the barrier ready, 1 to 1000; the same for all.
    pub count: u32,
    /// Long poll: wait up to this long (at most `barriers.max_wait_ms`) for
    /// the barrier to be ready. Entering again is harmless.
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaveRequest {
    /// The entrant leaving.
    pub node: String,
    /// Long poll: wait up to this long (at most `barriers.max_wait_ms`) for
    /// every entrant to leave. Leaving again is harmless.
    pub wait_ms: Option<u64>,
}

/// A DoubleBarrier as `node` sees it after its enter or leave.
fn reply(e: Entrant, node: String) -> DoubleBarrierReply {
    DoubleBarrierReply {
        state: e.state,
        node,
        inside: e.inside,
        done: e.done,
    }
}

/// etcd-style DoubleBarrier.Enter: joins the barrier and (with `wait_ms`)
/// waits until `count` entrants are in. The count+1-th entrant gets 409
/// (too many) until everyone has left. An entrant whose node stops
/// heartbeating is evicted, so a crashed node cannot hang the others.
#[utoipa::path(post, path = "/api/v1/double-barriers/{name}/enter", tag = "barriers", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("name" = String, Path, description = "DoubleBarrier name")),
    request_body = EnterRequest,
    responses((status = 200, body = DoubleBarrierReply),
              (status = 409, description = "Too many entrants, a different count, or the node is not alive")))]
async fn enter_double_barrier(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path(name): Path<Name>,
    ApiJson(req): ApiJson<EnterRequest>,
) -> Result<Json<DoubleBarrierReply>> {
    validate::node_id("node", &req.node)?;
    validate::in_range("count", req.count, &validate::DOUBLE_BARRIER_COUNT)?;
    let wait = check_wait(&s, req.wait_ms)?;
    let e = s.barriers.enter_wait(&name, &req.node, req.count, wait).await?;
    Ok(Json(reply(e, req.node)))
}

/// etcd-style DoubleBarrier.Leave: leaves the barrier and (with `wait_ms`)
/// waits until every entrant of the ready cycle has left or been evicted.
#[utoipa::path(post, path = "/api/v1/double-barriers/{name}/leave", tag = "barriers", security(("bearer" = ["worker"]), ("session" = ["worker"])),
    params(("name" = String, Path, description = "DoubleBarrier name")),
    request_body = LeaveRequest,
    responses((status = 200, body = DoubleBarrierReply)))]
async fn leave_double_barrier(
    State(s): State<AppState>,
    _caller: WorkerCaller,
    Path(name): Path<Name>,
    ApiJson(req): ApiJson<LeaveRequest>,
) -> Result<Json<DoubleBarrierReply>> {
    validate::node_id("node", &req.node)?;
    let wait = check_wait(&s, req.wait_ms)?;
    let e = s.barriers.leave_wait(&name, &req.node, wait).await?;
    Ok(Json(reply(e, req.node)))
}
