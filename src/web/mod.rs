//! The dashboard: server-rendered askama pages, readable without JavaScript.
//!
//! Every state-changing form posts to a `/ui/...` route with the caller's
//! CSRF token; the handler checks the token and the role, then calls the same
//! service method as the REST API and redirects back (post/redirect/get).

pub mod assets;
pub mod errors;
pub mod schedules;
pub mod search;
pub mod tasks;
pub mod workflows;

pub mod barriers;

use std::sync::Arc;
use std::time::SystemTime;

use askama::Template;
use askama_web::WebTemplate;
use axum::Form;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use crate::app::AppState;
use crate::auth::{Caller, MaybeCaller, ReadCaller, SESSION_COOKIE, csrf_ok};
use crate::config::Role;
use crate::error::{ApiError, Result};
use crate::nodes::NodeList;
use crate::nodes::Nodes;
use crate::system::RedisSummary;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(overview_page))
        .route("/nodes", get(nodes_page))
        .route("/orphans", get(orphans_page))
        .route("/events", get(events_page))
        .route("/failover", get(failover_page))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/ui/nodes/{id}/drain", post(ui_drain_node))
        .route("/ui/nodes/{id}/remove", post(ui_remove_node))
        .route("/static/{*path}", get(assets::serve))
        .route("/favicon.ico", get(assets::favicon))
        .merge(tasks::router())
        .merge(workflows::router())
        .merge(schedules::router())
        .merge(barriers::router())
        .merge(search::router())
}

/// The navigation, in order. Later subsystems add their pages here.
pub const NAV: &[(&str, &str)] = &[
    ("Overview", "/"),
    ("Nodes", "/nodes"),
    ("Queues", "/queues"),
    ("Dead letters", "/dead"),
    ("Orphans", "/orphans"),
    ("Workflows", "/workflows"),
    ("Schedules", "/schedules"),
    ("Barriers", "/barriers"),
    ("Limits", "/limits"),
    ("Locks", "/locks"),
    ("Events", "/events"),
    ("Failover", "/failover"),
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
    /// Redis time (ms, the node's estimate) when the page was rendered:
    /// countdowns on the page count from it, not from the browser's clock.
    pub now_ms: i64,
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
            now_ms: s.store.redis_now_estimate().unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_millis() as i64)
                    .unwrap_or(0)
            }),
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
    pub queued: i64,
    pub running: i64,
    pub dead_tasks: i64,
    pub chart_points: String,
    pub throughput_now: String,
    pub throughput_max: u32,
    /// The last ten minutes' totals (the live chart's span).
    pub recent: Totals,
    /// The last hour's totals; `None` when the history could not be read.
    pub hour: Option<Totals>,
    /// The queue the history charts are for (none: all queues).
    pub chart_queue: Option<String>,
}

/// Outcome totals over a chart's span, shown as text beside the chart (all
/// of it a page without JavaScript gets).
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    pub succeeded: u64,
    pub failed: u64,
    pub dead: u64,
}

/// The last hour's totals for one queue or all, from the outcome history;
/// `None` when Redis could not be read.
pub async fn hour_totals(s: &AppState, queue: Option<&str>) -> Option<Totals> {
    let h = s.stats.series(crate::stats::Range::Hour, queue).await.ok()?;
    Some(Totals {
        succeeded: h.succeeded.iter().sum(),
        failed: h.failed.iter().sum(),
        dead: h.dead.iter().sum(),
    })
}

/// The SVG polyline of a throughput series in a 600 x 100 box (the same
/// drawing live.js does on updates).
pub fn chart_points(series: &[u32]) -> String {
    if series.len() < 2 {
        return "0,100 600,100".into();
    }
    let max = series.iter().copied().max().unwrap_or(0).max(1) as f64;
    let step = 600.0 / (series.len() - 1) as f64;
    series
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{:.1},{:.1}", i as f64 * step, 100.0 - *v as f64 * 100.0 / max))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn overview_page(State(s): State<AppState>, caller: ReadCaller) -> Result<OverviewPage> {
    let list = s.nodes.list().await.ok();
    let redis = crate::system::redis_summary(&s).await.map_err(|e| e.to_string());
    let uptime = SystemTime::now().duration_since(s.started_at).unwrap_or_default();
    let live = s.live.snapshot();
    let sum = |f: fn(&crate::events::live::LiveQueue) -> i64| live.queues.values().map(f).sum::<i64>();
    let recent = &live.throughput[live.throughput.len().saturating_sub(10)..];
    let throughput_now = if recent.is_empty() {
        "0.0".to_string()
    } else {
        format!(
            "{:.1}",
            recent.iter().map(|v| *v as f64).sum::<f64>() / recent.len() as f64
        )
    };
    let total = |v: &[u32]| v.iter().map(|n| *n as u64).sum::<u64>();
    let dead = total(&live.dead_per_second);
    let recent_totals = Totals {
        succeeded: total(&live.throughput).saturating_sub(dead),
        failed: total(&live.failed_per_second),
        dead,
    };
    Ok(OverviewPage {
        recent: recent_totals,
        hour: hour_totals(&s, None).await,
        chart_queue: None,
        queued: sum(|q| q.queued),
        running: sum(|q| q.running),
        dead_tasks: sum(|q| q.dead),
        chart_points: chart_points(&live.throughput),
        throughput_now,
        throughput_max: live.throughput.iter().copied().max().unwrap_or(0),
        layout: Layout::new(&s, Some(&caller.0), "Overview", "Overview"),
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

async fn nodes_page(State(s): State<AppState>, caller: ReadCaller) -> Result<NodesPage> {
    let list = s.nodes.list().await?;
    Ok(NodesPage {
        layout: Layout::new(&s, Some(&caller.0), "Nodes", "Nodes"),
        list,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/failover.html")]
pub struct FailoverPage {
    pub layout: Layout,
    pub st: crate::failover::Status,
}

async fn failover_page(State(s): State<AppState>, caller: ReadCaller) -> Result<FailoverPage> {
    Ok(FailoverPage {
        layout: Layout::new(&s, Some(&caller.0), "Failover", "Failover"),
        st: s.failover.status().await,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/orphans.html")]
pub struct OrphansPage {
    pub layout: Layout,
    pub report: crate::orphans::routes::OrphanReport,
    pub counts: Vec<(String, u64)>,
}

async fn orphans_page(State(s): State<AppState>, caller: ReadCaller) -> Result<OrphansPage> {
    let report = crate::orphans::routes::report(&s, 200).await?;
    let counts = report.counts.iter().map(|(k, v)| (k.clone(), *v)).collect();
    Ok(OrphansPage {
        layout: Layout::new(&s, Some(&caller.0), "Orphans", "Orphans"),
        report,
        counts,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/events.html")]
pub struct EventsPage {
    pub layout: Layout,
    pub topics: String,
    pub topics_attr: String,
    pub queue: Option<String>,
    pub since: Option<String>,
    pub events: Vec<EventRow>,
    pub count: usize,
    pub oldest: Option<String>,
    pub error: Option<String>,
}

pub struct EventRow {
    pub ts: i64,
    pub kind: String,
    pub node: String,
    pub subjects: Vec<(String, String)>,
    pub data: String,
}

#[derive(Deserialize)]
pub struct EventsQuery {
    topics: Option<String>,
    queue: Option<String>,
}

async fn events_page(
    State(s): State<AppState>,
    caller: ReadCaller,
    Query(q): Query<EventsQuery>,
) -> Result<EventsPage> {
    let topics = q.topics.unwrap_or_default();
    let queue = q.queue.filter(|v| !v.is_empty());
    let mut page = EventsPage {
        layout: Layout::new(&s, Some(&caller.0), "Events", "Events"),
        topics_attr: if topics.is_empty() { "*".into() } else { topics.clone() },
        topics,
        queue,
        since: None,
        events: Vec::new(),
        count: 0,
        oldest: None,
        error: None,
    };
    let filter = match crate::events::Filter::parse(Some(&page.topics), page.queue.as_deref()) {
        Ok(f) => f,
        Err(e) => {
            page.error = Some(e);
            page.topics_attr = "none".into();
            return Ok(page);
        }
    };
    // The page's live updates resume right after what it shows: after its
    // newest event, or after the stream's end as read before the replay.
    let end = crate::events::tailer::last_cursor(&s.store).await?;
    let info = crate::events::retained_all(&s.store).await?;
    let replay = crate::events::replay(&s.store, None, 100, &filter, &info).await?;
    page.oldest = replay.oldest.clone();
    page.since = Some(replay.next.clone().unwrap_or_else(|| end.to_string()));
    for raw in replay.events.iter().rev() {
        let v: serde_json::Value = serde_json::from_str(raw.get()).unwrap_or_default();
        let mut subjects = Vec::new();
        if let Some(obj) = v.as_object() {
            for (k, val) in obj {
                if !["id", "type", "ts", "node", "data"].contains(&k.as_str()) {
                    subjects.push((k.clone(), val.as_str().unwrap_or("").to_string()));
                }
            }
        }
        page.events.push(EventRow {
            ts: v["ts"].as_i64().unwrap_or(0),
            kind: v["type"].as_str().unwrap_or("").into(),
            node: v["node"].as_str().unwrap_or("").into(),
            subjects,
            data: v["data"].to_string(),
        });
    }
    page.count = page.events.len();
    Ok(page)
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

async fn login(State(s): State<AppState>, headers: HeaderMap, Form(form): Form<LoginForm>) -> Response {
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
    let id = match crate::auth::create_session(&s, &form.token).await {
        Ok(id) => id,
        Err(e) => return ApiError::from(e).into_response(),
    };
    // Secure when the browser reached us over https: the advertised URL
    // says so, or the TLS proxy in front does.
    let https = s.advertise.starts_with("https://")
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https"));
    let secure = if https { "; Secure" } else { "" };
    let max_age = s.cfg.auth.session_ttl_ms / 1000;
    let cookie = format!("{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}");
    let mut resp = Redirect::to("/").into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

#[derive(Deserialize)]
pub struct CsrfForm {
    /// Missing reads as empty: the CSRF check's 403, not a 422 (issue 36, N9).
    #[serde(default)]
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

async fn logout(
    State(s): State<AppState>,
    headers: HeaderMap,
    caller: Caller,
    Form(form): Form<CsrfForm>,
) -> Result<Response> {
    check_csrf(&caller, &form.csrf)?;
    if let Some(id) = crate::auth::cookie(&headers, SESSION_COOKIE) {
        crate::auth::end_session(&s, id).await?;
    }
    let mut resp = Redirect::to("/login").into_response();
    resp.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("muster_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    Ok(resp)
}

/// Removes a departed (dead, late or left) node or worker from the registry,
/// as `DELETE /api/v1/nodes/{id}` does.
async fn ui_remove_node(State(nodes): State<Arc<Nodes>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Admin)?;
    crate::validate::node_id("id", &f.name)?;
    nodes.leave(&f.name, "removed").await?;
    Ok(Redirect::to("/nodes").into_response())
}

async fn ui_drain_node(State(nodes): State<Arc<Nodes>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Admin)?;
    crate::validate::node_id("id", &f.name)?;
    nodes.drain(&f.name, &f.caller.name).await?;
    Ok(Redirect::to("/nodes").into_response())
}

/// A dashboard form posted to `/ui/<thing>/{name}/<action>`: the caller, the
/// path's name (validated) and the CSRF token checked before the handler
/// runs. The handler checks the role it needs and calls the service.
pub struct UiForm {
    pub caller: Caller,
    pub name: String,
    headers: HeaderMap,
}

impl UiForm {
    /// Back to the referring page (ours only), or `default`.
    pub fn back(&self, default: &str) -> Response {
        back(&self.headers, default).into_response()
    }
}

impl axum::extract::FromRequest<AppState> for UiForm {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &AppState) -> Result<Self, Self::Rejection> {
        use axum::extract::FromRequestParts;
        let (mut parts, body) = req.into_parts();
        let caller = Caller::from_request_parts(&mut parts, state).await?;
        let Path(name) = Path::<String>::from_request_parts(&mut parts, state)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        crate::validate::name("name", &name)?;
        let headers = parts.headers.clone();
        let req = axum::extract::Request::from_parts(parts, body);
        let Form(form) = Form::<CsrfForm>::from_request(req, state).await.map_err(|_| {
            ApiError::Forbidden("the form's CSRF token is missing; reload the page and try again".into())
        })?;
        check_csrf(&caller, &form.csrf)?;
        Ok(UiForm { caller, name, headers })
    }
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

    /// Milliseconds (unsigned) as a human duration; `–` for 0.
    #[askama::filter_fn]
    pub fn wait(ms: &u64, _: &dyn askama::Values) -> askama::Result<String> {
        Ok(if *ms == 0 {
            "–".into()
        } else {
            super::human_duration(*ms as i64)
        })
    }

    /// A Redis ms timestamp as a UTC date and time.
    #[askama::filter_fn]
    pub fn ts(ms: &i64, _: &dyn askama::Values) -> askama::Result<String> {
        Ok(super::format_ms(*ms))
    }

    /// The first 80 characters of a text (a payload, an error), with `…`
    /// when cut: a table cell's preview; the task page shows it whole.
    #[askama::filter_fn]
    pub fn preview(text: &str, _: &dyn askama::Values) -> askama::Result<String> {
        Ok(super::preview(text, 80))
    }
}

/// The first `max` characters of `text` on one line, with `…` when cut.
pub fn preview(text: &str, max: usize) -> String {
    let one_line: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    match one_line.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &one_line[..at]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests;
