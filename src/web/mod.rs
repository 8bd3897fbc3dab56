//! The dashboard: server-rendered askama pages, readable without JavaScript.
//!
//! Every state-changing form posts to a `/ui/...` route with the caller's
//! CSRF token; the handler checks the token and the role, then calls the same
//! service method as the REST API and redirects back (post/redirect/get).

pub mod assets;
pub mod tasks;

pub mod barriers;

use std::time::SystemTime;

use askama::Template;
use askama_web::WebTemplate;
use axum::Form;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use crate::app::AppState;
use crate::auth::{Caller, MaybeCaller, SESSION_COOKIE, csrf_ok};
use crate::config::Role;
use crate::error::{ApiError, Result};
use crate::nodes::NodeList;
use crate::system::RedisSummary;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(overview_page))
        .route("/nodes", get(nodes_page))
        .route("/orphans", get(orphans_page))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/ui/nodes/{id}/drain", post(ui_drain_node))
        .route("/static/{*path}", get(assets::serve))
        .route("/favicon.ico", get(assets::favicon))
        .merge(tasks::router())
        .merge(barriers::router())
}

/// The navigation, in order. Later subsystems add their pages here.
pub const NAV: &[(&str, &str)] = &[
    ("Overview", "/"),
    ("Nodes", "/nodes"),
    ("Queues", "/queues"),
    ("Dead letters", "/dead"),
    ("Barriers", "/barriers"),
    ("Locks", "/locks"),
];

/// What every page's layout shows.
pub struct Layout {
    pub title: String,
    pub active: &'static str,
    pub nav: &'static [(&'static str, &'static str)],
    pub user: String,
    pub role: &'static str,
    pub admin: bool,
    pub csrf: String,
    pub auth: bool,
    pub node_id: String,
    pub version: &'static str,
}

impl Layout {
    pub fn new(s: &AppState, caller: Option<&Caller>, title: &str, active: &'static str) -> Self {
        Layout {
            title: title.to_string(),
            active,
            nav: NAV,
            user: caller.map(|c| c.name.clone()).unwrap_or_default(),
            role: caller.map(|c| c.role.as_str()).unwrap_or(""),
            admin: caller.is_some_and(Caller::is_admin),
            csrf: caller.map(|c| c.csrf.clone()).unwrap_or_default(),
            auth: s.auth.enabled(),
            node_id: s.node_id.to_string(),
            version: env!("CARGO_PKG_VERSION"),
        }
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/overview.html")]
pub struct OverviewPage {
    pub layout: Layout,
    pub alive: usize,
    pub draining: usize,
    pub dead: usize,
    pub redis: std::result::Result<RedisSummary, String>,
    pub advertise: String,
    pub ready: String,
    pub uptime: String,
}

async fn overview_page(State(s): State<AppState>, caller: Caller) -> Result<OverviewPage> {
    caller.require(Role::Read)?;
    let list = s.nodes.list().await.ok();
    let redis = crate::system::redis_summary(&s).await.map_err(|e| e.to_string());
    let uptime = SystemTime::now().duration_since(s.started_at).unwrap_or_default();
    Ok(OverviewPage {
        layout: Layout::new(&s, Some(&caller), "Overview", "Overview"),
        alive: list.as_ref().map_or(0, |l| l.alive),
        draining: list.as_ref().map_or(0, |l| l.draining),
        dead: list.as_ref().map_or(0, |l| l.dead),
        redis,
        advertise: s.advertise.to_string(),
        ready: crate::system::not_ready_reasons(&s).await.join("; "),
        uptime: human_duration(uptime.as_millis() as i64),
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/nodes.html")]
pub struct NodesPage {
    pub layout: Layout,
    pub list: NodeList,
}

async fn nodes_page(State(s): State<AppState>, caller: Caller) -> Result<NodesPage> {
    caller.require(Role::Read)?;
    let list = s.nodes.list().await?;
    Ok(NodesPage {
        layout: Layout::new(&s, Some(&caller), "Nodes", "Nodes"),
        list,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/orphans.html")]
pub struct OrphansPage {
    pub layout: Layout,
    pub report: crate::orphans::routes::OrphanReport,
    pub counts: Vec<(String, u64)>,
}

async fn orphans_page(State(s): State<AppState>, caller: Caller) -> Result<OrphansPage> {
    caller.require(Role::Read)?;
    let report = crate::orphans::routes::report(&s, 200).await?;
    let counts = report.counts.iter().map(|(k, v)| (k.clone(), *v)).collect();
    Ok(OrphansPage {
        layout: Layout::new(&s, Some(&caller), "Orphans", "Orphans"),
        report,
        counts,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/login.html")]
pub struct LoginPage {
    pub layout: Layout,
    pub error: Option<String>,
}

async fn login_page(State(s): State<AppState>, MaybeCaller(caller): MaybeCaller) -> Response {
    if !s.auth.enabled() || caller.is_some() {
        return Redirect::to("/").into_response();
    }
    LoginPage {
        layout: Layout::new(&s, None, "Sign in", ""),
        error: None,
    }
    .into_response()
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(s): State<AppState>, Form(form): Form<LoginForm>) -> Response {
    if !s.auth.enabled() {
        return Redirect::to("/").into_response();
    }
    if form.token.len() > 512 || s.auth.resolve(&form.token).is_none() {
        let page = LoginPage {
            layout: Layout::new(&s, None, "Sign in", ""),
            error: Some("That token is not recognized.".into()),
        };
        let mut resp = page.into_response();
        *resp.status_mut() = axum::http::StatusCode::UNAUTHORIZED;
        return resp;
    }
    let secure = if s.advertise.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!(
        "{SESSION_COOKIE}={}; HttpOnly; SameSite=Strict; Path=/; Max-Age=86400{secure}",
        form.token
    );
    let mut resp = Redirect::to("/").into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

#[derive(Deserialize)]
pub struct CsrfForm {
    pub csrf: String,
}

/// 403 unless the form carries the caller's CSRF token.
pub fn check_csrf(caller: &Caller, got: &str) -> Result<()> {
    if csrf_ok(&caller.csrf, got) {
        Ok(())
    } else {
        Err(ApiError::Forbidden(
            "the form's CSRF token is missing or stale; reload the page and try again".into(),
        ))
    }
}

async fn logout(caller: Caller, Form(form): Form<CsrfForm>) -> Result<Response> {
    check_csrf(&caller, &form.csrf)?;
    let mut resp = Redirect::to("/login").into_response();
    resp.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("muster_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    Ok(resp)
}

async fn ui_drain_node(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Result<Response> {
    check_csrf(&caller, &form.csrf)?;
    caller.require(Role::Admin)?;
    crate::validate::node_id("id", &id)?;
    s.nodes.drain(&id, &caller.name).await?;
    Ok(Redirect::to("/nodes").into_response())
}

/// Where to go back to after a form: the referring page when it is ours.
pub fn back(headers: &HeaderMap, default: &str) -> Redirect {
    let target = headers
        .get(header::REFERER)
        .and_then(|v| v.to_str().ok())
        .and_then(|r| r.find("://").map(|i| &r[i + 3..]))
        .and_then(|r| r.find('/').map(|i| r[i..].to_string()))
        .filter(|p| p.starts_with('/') && !p.starts_with("//"))
        .unwrap_or_else(|| default.to_string());
    Redirect::to(&target)
}

/// `1.2 s`, `3 min`, `2 h 5 min`.
pub fn human_duration(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1000)
    } else if ms < 86_400_000 {
        format!("{} h {} min", ms / 3_600_000, (ms % 3_600_000) / 60_000)
    } else {
        format!("{} d {} h", ms / 86_400_000, (ms % 86_400_000) / 3_600_000)
    }
}

/// A Redis millisecond timestamp as `2026-11-22 22:31:37.123Z`.
pub fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    // civil_from_days (Howard Hinnant), proleptic Gregorian.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{millis:03}Z",
        tod / 3600,
        (tod % 3600) / 60,
        tod % 60
    )
}

/// Template filters shared by the pages.
pub mod filters {
    /// Milliseconds as a human duration.
    #[askama::filter_fn]
    pub fn age(ms: &i64, _: &dyn askama::Values) -> askama::Result<String> {
        Ok(super::human_duration(*ms))
    }

    /// A Redis ms timestamp as a UTC date and time.
    #[askama::filter_fn]
    pub fn ts(ms: &i64, _: &dyn askama::Values) -> askama::Result<String> {
        Ok(super::format_ms(*ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_timestamps() {
        assert_eq!(format_ms(0), "1970-01-01 00:00:00.000Z");
        assert_eq!(format_ms(1_795_386_697_123), "2026-11-22 22:31:37.123Z");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29 00:00:00.000Z");
    }

    #[test]
    fn human_durations() {
        assert_eq!(human_duration(5), "5 ms");
        assert_eq!(human_duration(1500), "1.5 s");
        assert_eq!(human_duration(125_000), "2 min 5 s");
    }
}
