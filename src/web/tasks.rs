//! Dashboard pages of the task store: Queues, Queue, Task, Dead letters.

use std::sync::Arc;

use askama::Template;
use askama_web::WebTemplate;
use axum::Router;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use super::filters;
use super::{Layout, UiForm};
use muster_api::Name;
use muster_api::limits::LimitInfo;

use crate::app::AppState;
use crate::auth::{Caller, ReadCaller};
use crate::config::Role;
use crate::error::{ApiError, Result};
use crate::http::Path;
use crate::tasks::Tasks;
use crate::tasks::bulk::{self, BulkAction};
use crate::tasks::{GroupInfo, QueueStats, STATES, Task, TaskPage};
use crate::validate;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/queues", get(queues_page))
        .route("/queues/{queue}", get(queue_page))
        .route("/tasks/{id}", get(task_page))
        .route("/dead", get(dead_page))
        .route("/limits", get(limits_page))
        .route("/ui/queues/{queue}/pause", post(ui_pause))
        .route("/ui/queues/{queue}/resume", post(ui_resume))
        .route("/ui/tasks/{id}/cancel", post(ui_cancel))
        .route("/ui/tasks/{id}/retry", post(ui_retry))
        .route("/ui/tasks/{id}/discard", post(ui_discard))
        .route("/ui/dead/bulk", post(ui_dead_bulk))
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/queues.html")]
pub struct QueuesPage {
    pub layout: Layout,
    pub queues: Vec<QueueStats>,
}

async fn queues_page(State(s): State<AppState>, caller: ReadCaller) -> Result<QueuesPage> {
    let queues = s.tasks.queues().await?;
    Ok(QueuesPage {
        layout: Layout::new(&s, Some(&caller.0), "Queues", "Queues"),
        queues,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/limits.html")]
pub struct LimitsPage {
    pub layout: Layout,
    pub limits: Vec<LimitRow>,
}

/// A limit as the page shows it.
pub struct LimitRow {
    pub info: LimitInfo,
    pub template: bool,
    /// Every concurrency slot is taken.
    pub full: bool,
    /// The bucket is empty.
    pub dry: bool,
}

/// Every flow-control limit and template with its use now; live (the page
/// is fetched again on each limit, queue or task event).
async fn limits_page(State(s): State<AppState>, caller: ReadCaller) -> Result<LimitsPage> {
    Ok(LimitsPage {
        layout: Layout::new(&s, Some(&caller.0), "Limits", "Limits"),
        limits: s
            .tasks
            .limits()
            .await?
            .into_iter()
            .map(|info| LimitRow {
                template: info.name.ends_with(":*"),
                full: info.concurrency.is_some_and(|c| info.running >= u64::from(c)),
                dry: info.tokens == Some(0),
                info,
            })
            .collect(),
    })
}

#[derive(Deserialize)]
pub struct PageQuery {
    state: Option<String>,
    cursor: Option<usize>,
    /// After a bulk action: what it did (see `ui_dead_bulk`).
    bulk: Option<String>,
    done: Option<u64>,
    left: Option<u64>,
    refused: Option<u64>,
}

impl PageQuery {
    /// The line reporting a bulk action, when the page was reached from one.
    fn bulk_report(&self) -> Option<String> {
        let verb = match self.bulk.as_deref()? {
            "retry" => "Retried",
            "discard" => "Discarded",
            _ => return None,
        };
        let mut line = format!("{verb} {} dead tasks; {} left", self.done?, self.left.unwrap_or(0));
        if let Some(r) = self.refused.filter(|r| *r > 0) {
            line.push_str(&format!(
                "; {r} not retried: their queue was forgotten and the cluster has tasks.max_queues queues"
            ));
        }
        Some(line + ".")
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/queue.html")]
pub struct QueuePage {
    pub layout: Layout,
    pub stats: QueueStats,
    pub tabs: Vec<(&'static str, u64)>,
    pub state: String,
    pub groups: Vec<GroupInfo>,
    /// The flow-control limits that bind every task of the queue.
    pub limits: Vec<String>,
    pub page: TaskPage,
    pub cursor: usize,
    /// The report of a bulk action that led here.
    pub bulk: Option<String>,
    /// The queue's last hour; `None` when the history could not be read.
    pub hour: Option<super::Totals>,
    pub chart_queue: Option<String>,
}

async fn queue_page(
    State(s): State<AppState>,
    caller: ReadCaller,
    Path(queue): Path<Name>,
    Query(q): Query<PageQuery>,
) -> Result<QueuePage> {
    let state = q.state.clone().unwrap_or_else(|| "queued".into());
    if !STATES.contains(&state.as_str()) {
        return Err(ApiError::bad_request(format!(
            "`state` must be one of {}",
            STATES.join(", ")
        )));
    }
    let cursor = q.cursor.unwrap_or(0).min(1_000_000);
    let stats = s.tasks.stats_for(&[queue.to_string()]).await?.pop().unwrap_or_default();
    let tabs = vec![
        ("queued", stats.queued),
        ("delayed", stats.delayed),
        ("running", stats.running),
        ("succeeded", stats.succeeded),
        ("cancelled", stats.cancelled),
        ("dead", stats.dead),
    ];
    let st = &stats;
    let empty = st.queued + st.delayed + st.running + st.succeeded + st.cancelled + st.dead == 0;
    if empty && !s.tasks.queues().await?.iter().any(|q| q.name == queue.as_str()) {
        return Err(ApiError::not_found(format!(
            "no queue `{queue}`: a queue exists once a task was submitted to it"
        )));
    }
    let groups = s.tasks.groups(Some(&queue)).await?;
    let limits = s.tasks.queue_limits(&queue).await?;
    let page = s.tasks.list(&queue, &state, 50, cursor).await?;
    let bulk = q.bulk_report();
    let hour = super::hour_totals(&s, Some(&queue)).await;
    Ok(QueuePage {
        hour,
        chart_queue: Some(queue.to_string()),
        layout: Layout::new(&s, Some(&caller.0), &format!("Queue {queue}"), "Queues"),
        bulk,
        stats,
        tabs,
        state,
        groups,
        limits,
        page,
        cursor,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/task.html")]
pub struct TaskPageView {
    pub layout: Layout,
    pub task: Task,
    pub payload: String,
    pub fields: Option<String>,
    pub result: Option<String>,
    pub can_cancel: bool,
    pub finished: bool,
    /// The task's trace id (issue 39), and its link when
    /// `telemetry.trace_url` is set.
    pub trace_id: Option<String>,
    pub trace_link: Option<String>,
}

fn pretty(raw: &serde_json::value::RawValue) -> String {
    serde_json::from_str::<serde_json::Value>(raw.get())
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| raw.get().to_string())
}

async fn task_page(State(s): State<AppState>, caller: ReadCaller, Path(id): Path<Name>) -> Result<TaskPageView> {
    let task = s
        .tasks
        .get(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no task `{id}`")))?;
    let active = matches!(task.state.as_str(), "queued" | "delayed" | "running");
    let trace_id = task
        .traceparent
        .as_deref()
        .and_then(muster_trace::SpanContext::parse)
        .map(|c| c.trace_id_hex());
    let url = &s.cfg.telemetry.trace_url;
    let trace_link = trace_id
        .as_ref()
        .filter(|_| !url.is_empty())
        .map(|t| url.replace("{trace_id}", t));
    Ok(TaskPageView {
        trace_id,
        trace_link,
        layout: Layout::new(&s, Some(&caller.0), &format!("Task {id}"), "Queues"),
        payload: pretty(&task.payload),
        fields: task.fields.as_deref().map(pretty),
        result: task.result.as_deref().map(pretty),
        can_cancel: active && caller.role >= Role::Worker && !task.cancel_requested,
        finished: !active,
        task,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/dead.html")]
pub struct DeadPage {
    pub layout: Layout,
    pub page: TaskPage,
    pub cursor: usize,
    pub bulk: Option<String>,
}

async fn dead_page(State(s): State<AppState>, caller: ReadCaller, Query(q): Query<PageQuery>) -> Result<DeadPage> {
    let cursor = q.cursor.unwrap_or(0).min(1_000_000);
    let page = s.tasks.dead(50, cursor).await?;
    Ok(DeadPage {
        layout: Layout::new(&s, Some(&caller.0), "Dead letters", "Dead letters"),
        page,
        cursor,
        bulk: q.bulk_report(),
    })
}

async fn ui_pause(State(tasks): State<Arc<Tasks>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Admin)?;
    tasks.set_paused(&f.name, true, &f.caller.name).await?;
    Ok(f.back("/queues"))
}

async fn ui_resume(State(tasks): State<Arc<Tasks>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Admin)?;
    tasks.set_paused(&f.name, false, &f.caller.name).await?;
    Ok(f.back("/queues"))
}

async fn ui_cancel(State(tasks): State<Arc<Tasks>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Worker)?;
    tasks.cancel(&f.name, &f.caller.name).await?;
    Ok(f.back(&format!("/tasks/{}", f.name)))
}

async fn ui_retry(State(tasks): State<Arc<Tasks>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Admin)?;
    tasks.retry(&f.name, &f.caller.name).await?;
    Ok(f.back("/dead"))
}

async fn ui_discard(State(tasks): State<Arc<Tasks>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Admin)?;
    tasks.delete(&f.name, &f.caller.name).await?;
    // The task page is gone; go to the dead letters.
    Ok(axum::response::Redirect::to("/dead").into_response())
}

/// The bulk form of the Dead letters page (every queue) and of a queue's
/// dead tab (`queue` set).
#[derive(Debug, Deserialize)]
pub struct BulkForm {
    /// Missing reads as empty, so a form without it is the CSRF check's
    /// 403, not a deserialization 422 (issue 36, N9); likewise `action`,
    /// refused (400) after the CSRF and role checks.
    #[serde(default)]
    csrf: String,
    queue: Option<String>,
    #[serde(default)]
    action: String,
    /// The form's checkbox: "yes" when the admin confirmed.
    confirm: Option<String>,
}

async fn ui_dead_bulk(
    State(s): State<AppState>,
    caller: Caller,
    form: axum::extract::Form<BulkForm>,
) -> Result<Response> {
    let f = form.0;
    super::check_csrf(&caller, &f.csrf)?;
    caller.require(Role::Admin)?;
    if f.confirm.as_deref() != Some("yes") {
        return Err(ApiError::bad_request(
            "the bulk action was not confirmed: tick the box next to the buttons",
        ));
    }
    let action = match f.action.as_str() {
        "retry" => BulkAction::Retry,
        "discard" => BulkAction::Discard,
        _ => return Err(ApiError::bad_request("`action` must be retry or discard")),
    };
    let queue = f.queue.filter(|q| !q.is_empty());
    if let Some(q) = &queue {
        validate::name("queue", q)?;
    }
    let out = s
        .tasks
        .dead_bulk(queue.as_deref(), action, bulk::MAX_TASKS, &caller.name)
        .await?;
    let report = format!(
        "bulk={}&done={}&left={}&refused={}",
        f.action, out.done, out.left, out.refused
    );
    Ok(match queue {
        Some(q) => Redirect::to(&format!("/queues/{q}?state=dead&{report}")),
        None => Redirect::to(&format!("/dead?{report}")),
    }
    .into_response())
}
