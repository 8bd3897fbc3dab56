//! Authentication and roles.
//!
//! Tokens are configured as SHA-256 digests with a role (`read` < `worker` <
//! `admin`). A presented token is hashed and compared with every configured
//! digest in constant time, so neither the comparison nor the number of
//! tokens tried reveals how close a guess was.
//!
//! Credentials: `Authorization: Bearer <token>` (API), the `muster_session`
//! cookie (dashboard; HttpOnly, SameSite=Strict), or a `token` query
//! parameter on the event endpoints (browsers cannot set headers on a
//! WebSocket). With no tokens configured, every caller is an anonymous admin
//! and the server refuses to bind anything but loopback.
//!
//! Sessions: signing in stores a random 256-bit session id in the cookie,
//! never the token. Redis keeps only the SHA-256 of the id (`session` key,
//! with a TTL of `auth.session_ttl_ms`), mapped to the digest of the token
//! that signed in; every cookie request reads it back (one GET) and looks
//! the token up in the *current* config. So signing out (the key is
//! deleted) ends the session on every node at once, and removing a token
//! from the config ends its sessions too. When Redis cannot answer, a
//! cookie request gets 503, never an anonymous page.
//!
//! Dashboard forms carry a CSRF token derived from the session id, so a
//! page on another site cannot submit them. The REST API takes the cookie
//! for writes only with that token in `x-csrf-token` and from this node's
//! own origin; no-auth mode refuses writes from other origins and `Host`
//! names that are not this node's (see [`middleware`]). A WebSocket handshake
//! authenticated by the cookie must come from this node's own origin (or
//! one in `server.allowed_origins`): SameSite does not stop another port of
//! the same host.

use std::marker::PhantomData;

use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use sha2::{Digest, Sha256};

use crate::app::AppState;
use crate::config::{AuthConfig, Role};
use crate::error::ApiError;

mod sessions;
pub(crate) use sessions::{create_session, end_session};
use sessions::{csrf_for, session_caller};

pub(crate) const SESSION_COOKIE: &str = "muster_session";

/// The header that carries the CSRF token on an API write authenticated by
/// the session cookie.
pub(crate) const CSRF_HEADER: &str = "x-csrf-token";

struct Token {
    name: String,
    role: Role,
    digest: [u8; 32],
    /// The CSRF token of a caller presenting this bearer token, derived
    /// once from the digest and the node's secret (not per request: a
    /// SHA-256 per API call was a measurable share of the node's work).
    csrf: String,
}

/// The configured tokens and the CSRF secret.
pub struct Auth {
    tokens: Vec<Token>,
    /// The CSRF token of anonymous (no-auth) callers, from a per-process
    /// secret.
    anon_csrf: String,
}

/// Who is calling, attached to every request by [`middleware`].
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: String,
    pub role: Role,
    /// The CSRF token this caller's forms must carry.
    pub csrf: String,
}

impl Caller {
    /// 403 unless the caller's role includes `role`.
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.role >= role {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "this needs the `{}` role; the token `{}` has `{}`",
                role.as_str(),
                self.name,
                self.role.as_str()
            )))
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role >= Role::Admin
    }
}

impl Auth {
    pub fn new(cfg: &AuthConfig) -> Self {
        let mut secret = [0u8; 32];
        secret.copy_from_slice(&Sha256::digest(ulid::Ulid::generate().to_string().as_bytes()));
        let tokens = cfg
            .tokens
            .iter()
            .map(|t| {
                let mut digest = [0u8; 32];
                for (i, chunk) in t.sha256.as_bytes().chunks(2).enumerate().take(32) {
                    let hex = std::str::from_utf8(chunk).unwrap_or("00");
                    digest[i] = u8::from_str_radix(hex, 16).unwrap_or(0);
                }
                Token {
                    name: t.name.clone(),
                    role: t.role,
                    digest,
                    csrf: csrf_for(&[&secret[..], &digest[..]].concat()),
                }
            })
            .collect();
        Auth {
            tokens,
            anon_csrf: csrf_for(&secret),
        }
    }

    /// Whether any token is configured.
    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The configured token with this digest (every token compared).
    fn by_digest(&self, digest: &[u8; 32]) -> Option<&Token> {
        let mut found: Option<&Token> = None;
        for t in &self.tokens {
            if ct_eq(&t.digest, digest) {
                found = Some(t);
            }
        }
        found
    }

    /// The caller for a presented secret, or None.
    pub fn resolve(&self, secret: &str) -> Option<Caller> {
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        self.by_digest(&digest).map(|t| Caller {
            name: t.name.clone(),
            role: t.role,
            csrf: t.csrf.clone(),
        })
    }

    /// The caller when auth is off.
    pub fn anonymous(&self) -> Caller {
        Caller {
            name: "anonymous".into(),
            role: Role::Admin,
            csrf: self.anon_csrf.clone(),
        }
    }
}

/// Equality that takes the same time wherever the inputs differ.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for i in 0..32 {
        diff |= a[i] ^ b[i];
    }
    diff == 0
}

/// Constant-time comparison of two CSRF tokens.
pub(crate) fn csrf_ok(expected: &str, got: &str) -> bool {
    if expected.len() != got.len() {
        return false;
    }
    expected.bytes().zip(got.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn query_token(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "token")
        .map(|(_, v)| {
            // tokens are printable ASCII; undo the percent-encoding a browser may apply
            percent_decode(v)
        })
}

fn percent_decode(s: &str) -> String {
    fn hexval(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hexval(bytes[i + 1]), hexval(bytes[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Paths anyone may call: probes, static assets, the sign-in page.
fn is_public(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/readyz" | "/login" | "/favicon.ico" | "/api/v1/openapi.json"
    ) || path.starts_with("/static/")
        // Authenticated by the failover secret in the handler.
        || path.starts_with("/internal/failover/")
}

/// Whether the request asks for a WebSocket.
fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// `scheme://host[:port]` without a default port, lowercased.
fn normal_origin(scheme: &str, authority: &str) -> String {
    let scheme = scheme.to_ascii_lowercase();
    let authority = authority.trim_end_matches('/').to_ascii_lowercase();
    let authority = match (scheme.as_str(), authority.rsplit_once(':')) {
        ("http", Some((host, "80"))) | ("https", Some((host, "443"))) => host.to_string(),
        _ => authority,
    };
    format!("{scheme}://{authority}")
}

/// Whether a browser's `Origin` is this node's own (the request's `Host`,
/// over http or https, or the advertised URL) or one of
/// `server.allowed_origins`. No `Origin` at all is not a browser: allowed.
pub(crate) fn origin_allowed(s: &AppState, headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let Some((scheme, authority)) = origin.to_str().ok().and_then(|o| o.split_once("://")) else {
        return false;
    };
    let origin = normal_origin(scheme, authority);
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    let own = |sch: &str| !host.is_empty() && origin == normal_origin(sch, host);
    let listed = |url: &str| {
        url.split_once("://")
            .is_some_and(|(sch, rest)| origin == normal_origin(sch, rest.split('/').next().unwrap_or("")))
    };
    own("http") || own("https") || listed(&s.advertise) || s.cfg.server.allowed_origins.iter().any(|o| listed(o))
}

/// Whether a method may change state (all but GET, HEAD and OPTIONS).
fn is_write(m: &Method) -> bool {
    !matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// A browser request sent by a page of another origin: its `Origin` is not
/// ours (see [`origin_allowed`]), or, without `Origin`, `Sec-Fetch-Site`
/// says `cross-site` or `same-site` (another port or a sibling subdomain is
/// the same site, and SameSite cookies go along). Non-browser clients send
/// neither header.
pub(crate) fn from_another_origin(s: &AppState, headers: &HeaderMap) -> bool {
    if headers.contains_key(header::ORIGIN) {
        return !origin_allowed(s, headers);
    }
    headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("cross-site") || v.eq_ignore_ascii_case("same-site"))
}

/// No-auth mode: whether the `Host` names this node. Loopback names
/// (`localhost`, `*.localhost`, 127.0.0.0/8, `::1`), the host of
/// `server.listen` and of the advertised URL, and `server.allowed_hosts`
/// (`name` or `name:port`) are; any other name is a DNS-rebinding page
/// reaching a loopback-only node through its own domain. A request with no
/// `Host` (HTTP/1.0) is no browser's.
fn host_allowed(s: &AppState, req: &Request) -> bool {
    let host = match req.headers().get(header::HOST) {
        Some(h) => match h.to_str() {
            Ok(h) => h.to_ascii_lowercase(),
            Err(_) => return false,
        },
        None => match req.uri().authority() {
            Some(a) => a.as_str().to_ascii_lowercase(),
            None => return true,
        },
    };
    let name = host_name(&host);
    let listed = |entry: &str| {
        let entry = entry.to_ascii_lowercase();
        entry == host || entry == name
    };
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
        || name == host_name(&s.cfg.server.listen.to_ascii_lowercase())
        || s.advertise
            .split_once("://")
            .is_some_and(|(_, rest)| name == host_name(&rest.split('/').next().unwrap_or("").to_ascii_lowercase()))
        || s.cfg.server.allowed_hosts.iter().any(|h| listed(h))
}

/// `name` of `name:port`, `[v6]:port`, `[v6]` or `name` (brackets dropped).
fn host_name(authority: &str) -> String {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("").to_string();
    }
    match authority.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name.to_string(),
        _ => authority.to_string(),
    }
}

/// 403 for a no-auth request from a page of another origin.
fn refuse_cross_site() -> Response {
    ApiError::Forbidden(
        "this node has no tokens (every local caller is an admin), so it refuses writes and \
         WebSockets from pages of other origins (`Origin` or `Sec-Fetch-Site`); add the page's origin \
         to server.allowed_origins, or configure [[auth.tokens]]"
            .into(),
    )
    .into_response()
}

/// Resolves the caller of every request; refuses unauthenticated API calls
/// (401) and sends unauthenticated dashboard visitors to the sign-in page.
///
/// Cookies are for pages (issue 36): an API write authenticated by the
/// session cookie must come from this node's own pages (no foreign
/// `Origin`, no cross- or same-site `Sec-Fetch-Site`) and carry the
/// session's CSRF token in `x-csrf-token`; bearer tokens are not checked
/// (a browser never sends them on its own). With no tokens configured,
/// every write and WebSocket from another origin is refused, and so is a
/// `Host` that does not name this node (DNS rebinding). A caller let
/// through goes on to [`crate::durability::around`] and the handler.
/// (Called inside `traces::around` by the one route-level layer,
/// `app::per_route`.)
pub(crate) async fn check(s: &AppState, mut req: Request, next: Next) -> Response {
    let auth = &s.auth;
    if !auth.enabled() {
        if !host_allowed(s, &req) {
            return ApiError::Forbidden(
                "the Host header does not name this node; with no tokens configured a node answers only \
                 to loopback names and its listen address (DNS rebinding); add the name to \
                 server.allowed_hosts"
                    .into(),
            )
            .into_response();
        }
        if (is_write(req.method()) || is_websocket(req.headers())) && from_another_origin(s, req.headers()) {
            return refuse_cross_site();
        }
        req.extensions_mut().insert(auth.anonymous());
        return crate::durability::around(s, req, next).await;
    }
    let path = req.uri().path().to_string();
    let headers = req.headers();
    let mut by_cookie = false;
    let mut presented = true;
    let caller = if let Some(t) = bearer(headers) {
        auth.resolve(t)
    } else if let Some(id) = cookie(headers, SESSION_COOKIE) {
        // Assets and probes need no caller: no Redis read for them.
        if is_public(&path) && path != "/login" {
            None
        } else {
            by_cookie = true;
            match session_caller(s, id).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read a dashboard session");
                    return ApiError::Unavailable("sessions are kept in Redis, which is unavailable now".into())
                        .into_response();
                }
            }
        }
    } else if let Some(t) = path
        .starts_with("/api/v1/events")
        .then(|| query_token(req.uri().query()))
        .flatten()
    {
        auth.resolve(&t)
    } else {
        presented = false;
        None
    };
    match caller {
        Some(_) if by_cookie && is_websocket(req.headers()) && !origin_allowed(s, req.headers()) => {
            ApiError::Forbidden(
                "this WebSocket was opened by a page of another origin with the session cookie; \
                 add the page's origin to server.allowed_origins, or authenticate with a token"
                    .into(),
            )
            .into_response()
        }
        Some(_)
            if by_cookie
                && path.starts_with("/api/")
                && is_write(req.method())
                && from_another_origin(s, req.headers()) =>
        {
            ApiError::Forbidden(
                "an API write with the session cookie must come from this node's own pages (this one's \
                 `Origin` or `Sec-Fetch-Site` says another origin); send `Authorization: Bearer <token>` instead"
                    .into(),
            )
            .into_response()
        }
        Some(c)
            if by_cookie
                && path.starts_with("/api/")
                && is_write(req.method())
                && !req
                    .headers()
                    .get(CSRF_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|got| csrf_ok(&c.csrf, got)) =>
        {
            ApiError::Forbidden(
                "an API write with the session cookie needs the session's CSRF token in `x-csrf-token` \
                 (the `data-csrf` of any dashboard page); or send `Authorization: Bearer <token>`"
                    .into(),
            )
            .into_response()
        }
        Some(c) => {
            req.extensions_mut().insert(c);
            crate::durability::around(s, req, next).await
        }
        None if is_public(&path) => crate::durability::around(s, req, next).await,
        None if path.starts_with("/api/") || path == "/metrics" => {
            let msg = if by_cookie {
                "the session has ended; sign in again, or send `Authorization: Bearer <token>`"
            } else if presented {
                "the token is not recognized; check it against [auth] tokens in the config"
            } else {
                "authentication required: send `Authorization: Bearer <token>`"
            };
            let mut resp = ApiError::Unauthorized(msg.into()).into_response();
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
            resp
        }
        None => Redirect::to("/login").into_response(),
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::Unauthorized("authentication required".into()))
    }
}

/// The least role an operation needs, as a type: a handler that takes
/// [`WorkerCaller`] answers 403 to a `read` caller before its path, query or
/// body is parsed, because axum runs this extractor before the body one.
/// Derefs to the [`Caller`].
pub(crate) struct Need<R>(pub Caller, PhantomData<R>);

/// A role marker for [`Need`].
pub(crate) trait LeastRole {
    const ROLE: Role;
}

/// Role markers: `Need<least::Worker>` and friends, named by the aliases below.
pub(crate) mod least {
    use super::{LeastRole, Role};

    pub(crate) struct Read;
    pub(crate) struct Worker;
    pub(crate) struct Admin;

    impl LeastRole for Read {
        const ROLE: Role = Role::Read;
    }
    impl LeastRole for Worker {
        const ROLE: Role = Role::Worker;
    }
    impl LeastRole for Admin {
        const ROLE: Role = Role::Admin;
    }
}

/// Any authenticated caller (`read` and up).
pub(crate) type ReadCaller = Need<least::Read>;
/// A caller with the `worker` role or more.
pub(crate) type WorkerCaller = Need<least::Worker>;
/// A caller with the `admin` role.
pub(crate) type AdminCaller = Need<least::Admin>;

impl<R> std::ops::Deref for Need<R> {
    type Target = Caller;

    fn deref(&self) -> &Caller {
        &self.0
    }
}

impl<S: Send + Sync, R: LeastRole> FromRequestParts<S> for Need<R> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        caller.require(R::ROLE)?;
        Ok(Need(caller, PhantomData))
    }
}

/// The caller if known (for public pages such as the sign-in form).
pub(crate) struct MaybeCaller(pub Option<Caller>);

impl<S: Send + Sync> FromRequestParts<S> for MaybeCaller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(MaybeCaller(parts.extensions.get::<Caller>().cloned()))
    }
}

#[cfg(test)]
mod tests;
