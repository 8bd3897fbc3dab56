//! `GET /api/v1/failover`, and the internal endpoints of a coordinated
//! failover round (`POST /internal/failover/{ping|invalidate|reconfigure}`),
//! authenticated by the shared `[failover] secret`, not by API tokens.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use sha2::{Digest, Sha256};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{Answer, ClientError, Kind, Message, SECRET_HEADER, Status};
use crate::app::AppState;
use crate::auth::ReadCaller;
use crate::error::{ApiError, Result};
use crate::http::{ApiJson, FromPathParam, FromPathParams, Path, one};
use crate::problem::Invalid;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_failover))
        .routes(routes!(internal_message))
}

/// Redis topology and failover state: mode, master, replicas with offset and
/// lag, fencing epoch, last switch, and in coordinated mode each client's
/// answer in the current or last round.
#[utoipa::path(get, path = "/api/v1/failover", tag = "failover", security(("bearer" = ["read"]), ("session" = ["read"])),
    responses((status = 200, body = Status, description = "The failover status")))]
async fn get_failover(State(s): State<AppState>, _caller: ReadCaller) -> Result<Json<Status>> {
    Ok(Json(s.failover.status().await))
}

/// A coordinated failover message from the coordinator (internal; needs the
/// `x-muster-failover-secret` header). 409 when the round is older than the
/// newest this node has seen.
#[utoipa::path(post, path = "/internal/failover/{kind}", tag = "failover",
    params(("kind" = Kind, Path, description = "The message: ping, invalidate or reconfigure")),
    request_body = Message,
    responses((status = 200, body = Answer, description = "This node's answer"),
              (status = 404, description = "[failover] role is off on this node, or an unknown message"),
              (status = 409, description = "The round is older than the newest this node has seen (`newest_round`)"),
              (status = 503, description = "The new master cannot be used")))]
async fn internal_message(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(kind): Path<Kind>,
    ApiJson(msg): ApiJson<Message>,
) -> Result<Json<Answer>> {
    if !s.failover.coordinated() {
        return Err(ApiError::not_found(
            "this node takes no failover messages: [failover] role is off",
        ));
    }
    let presented = headers.get(SECRET_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
    // Compare digests, so the comparison takes the same time whatever matches.
    let a = Sha256::digest(presented.as_bytes());
    let b = Sha256::digest(s.failover.secret().as_bytes());
    if presented.is_empty() || a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) != 0 {
        return Err(ApiError::Unauthorized(format!(
            "the `{SECRET_HEADER}` header is missing or does not match [failover] secret"
        )));
    }
    // Run to the end even if the coordinator hangs up (its answer timeout):
    // a reconfigure cut off between the switch and the master file would
    // leave the two disagreeing until the next re-publication.
    let f = s.failover.clone();
    let handled = tokio::spawn(async move { f.handle(kind, &msg).await })
        .await
        .map_err(|e| ApiError::internal(format!("failover message handler failed: {e}")))?;
    match handled {
        Ok(a) => Ok(Json(a)),
        Err(e @ ClientError::Stale { newest, .. }) => Err(ApiError::conflict(
            e.to_string(),
            serde_json::json!({ "newest_round": newest }),
        )),
        Err(e @ ClientError::Bad(_)) => Err(ApiError::bad_request(e.to_string())),
        Err(e @ ClientError::Unusable { .. }) => Err(ApiError::Unavailable(e.to_string())),
    }
}

/// The message kind in the path: ping, invalidate or reconfigure; any other
/// is a 404 before the handler runs.
impl FromPathParam for Kind {
    fn from_param(_key: &str, value: &str) -> Result<Self, Invalid> {
        match value {
            "ping" => Ok(Kind::Ping),
            "invalidate" => Ok(Kind::Invalidate),
            "reconfigure" => Ok(Kind::Reconfigure),
            other => Err(Invalid::Unknown(format!(
                "unknown failover message `{}`: use ping, invalidate or reconfigure",
                other.chars().take(32).collect::<String>()
            ))),
        }
    }
}

impl FromPathParams for Kind {
    fn from_params(params: &[(&str, &str)]) -> Result<Self, Invalid> {
        one(params)
    }
}
