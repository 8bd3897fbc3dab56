//! Dashboard pages of the schedules: the list and one schedule (its next fire
//! times, history, and the enable, disable, trigger and delete forms).

use std::sync::Arc;

use askama::Template;
use askama_web::WebTemplate;
use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use super::filters;
use super::{Layout, UiForm};
use muster_api::Name;

use crate::app::AppState;
use crate::auth::ReadCaller;
use crate::config::Role;
use crate::error::{ApiError, Result};
use crate::http::Path;
use crate::schedules::Schedules;
use crate::schedules::{HistoryEntry, Schedule, Timing};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/schedules", get(schedules_page))
        .route("/schedules/{id}", get(schedule_page))
        .route("/ui/schedules/{id}/enable", post(ui_enable))
        .route("/ui/schedules/{id}/disable", post(ui_disable))
        .route("/ui/schedules/{id}/trigger", post(ui_trigger))
        .route("/ui/schedules/{id}/delete", post(ui_delete))
}

/// A time shown both in the schedule's zone and in UTC.
pub struct When {
    pub ms: i64,
    /// Wall-clock time in the schedule's zone, with its abbreviation.
    pub local: String,
}

fn when(timing: Option<&Timing>, ms: i64) -> When {
    When {
        ms,
        local: timing.map(|t| t.local(ms)).unwrap_or_default(),
    }
}

pub struct Row {
    pub s: Schedule,
    pub next: Option<When>,
    pub last: Option<When>,
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/schedules.html")]
pub struct SchedulesPage {
    pub layout: Layout,
    pub rows: Vec<Row>,
    pub max_skew_ms: u64,
}

async fn schedules_page(State(s): State<AppState>, caller: ReadCaller) -> Result<SchedulesPage> {
    let rows = s
        .schedules
        .list()
        .await?
        .into_iter()
        .map(|sc| {
            let timing = Timing::parse(&sc.expression, &sc.timezone).ok();
            Row {
                next: sc.next.first().map(|ms| when(timing.as_ref(), *ms)),
                last: sc.last_occurrence.map(|ms| when(timing.as_ref(), ms)),
                s: sc,
            }
        })
        .collect();
    Ok(SchedulesPage {
        layout: Layout::new(&s, Some(&caller.0), "Schedules", "Schedules"),
        rows,
        max_skew_ms: s.schedules.config().max_skew_ms,
    })
}

pub struct HistoryRow {
    pub e: HistoryEntry,
    pub t: When,
    pub last: Option<When>,
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/schedule.html")]
pub struct SchedulePageView {
    pub layout: Layout,
    pub s: Schedule,
    pub next: Vec<When>,
    pub history: Vec<HistoryRow>,
    pub template: String,
    /// Defined in this node's config.toml (the API may not change or delete
    /// it; one written from another node's config needs `force` to delete).
    pub in_config: bool,
}

async fn schedule_page(
    State(s): State<AppState>,
    caller: ReadCaller,
    Path(id): Path<Name>,
) -> Result<SchedulePageView> {
    let sc = s
        .schedules
        .get(&id, s.schedules.config().history_max as usize)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no schedule `{id}`")))?;
    let timing = Timing::parse(&sc.expression, &sc.timezone).ok();
    let next = sc.next.iter().map(|ms| when(timing.as_ref(), *ms)).collect();
    let history = sc
        .history
        .iter()
        .map(|e| HistoryRow {
            t: when(timing.as_ref(), e.t),
            last: e.last.map(|ms| when(timing.as_ref(), ms)),
            e: e.clone(),
        })
        .collect();
    Ok(SchedulePageView {
        layout: Layout::new(&s, Some(&caller.0), &format!("Schedule {id}"), "Schedules"),
        template: serde_json::to_string_pretty(&sc.task).unwrap_or_default(),
        in_config: s.schedules.in_config(&id),
        next,
        history,
        s: sc,
    })
}

async fn ui_enable(State(schedules): State<Arc<Schedules>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Admin)?;
    schedules.set_enabled(&f.name, true, &f.caller.name).await?;
    Ok(f.back(&format!("/schedules/{}", f.name)))
}

async fn ui_disable(State(schedules): State<Arc<Schedules>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Admin)?;
    schedules.set_enabled(&f.name, false, &f.caller.name).await?;
    Ok(f.back(&format!("/schedules/{}", f.name)))
}

async fn ui_trigger(State(schedules): State<Arc<Schedules>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Admin)?;
    schedules.trigger(&f.name, &f.caller.name, None).await?;
    Ok(f.back(&format!("/schedules/{}", f.name)))
}

async fn ui_delete(State(schedules): State<Arc<Schedules>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Admin)?;
    schedules.delete(&f.name, &f.caller.name, false).await?;
    Ok(Redirect::to("/schedules").into_response())
}
