//! Dashboard pages of workflows: the list, and one workflow drawn as a DAG
//! (server-side layout by levels, plain SVG).

use std::collections::HashMap;
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

use crate::app::AppState;
use crate::auth::ReadCaller;
use crate::config::Role;
use crate::error::Result;
use crate::http::Path;
use crate::workflows::Workflows;
use crate::workflows::{Workflow, WorkflowSummary};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/workflows", get(workflows_page))
        .route("/workflows/{id}", get(workflow_page))
        .route("/ui/workflows/{id}/cancel", post(ui_cancel))
}

#[derive(Deserialize)]
pub struct ListQuery {
    state: Option<String>,
    cursor: Option<usize>,
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/workflows.html")]
pub struct WorkflowsPage {
    pub layout: Layout,
    pub list: Vec<WorkflowSummary>,
    pub state: Option<String>,
    pub states: Vec<&'static str>,
    pub next: Option<usize>,
}

async fn workflows_page(
    State(s): State<AppState>,
    caller: ReadCaller,
    Query(q): Query<ListQuery>,
) -> Result<WorkflowsPage> {
    let states = vec!["running", "succeeded", "failed", "cancelled"];
    let state = q.state.filter(|st| states.contains(&st.as_str()));
    let (list, next) = s
        .workflows
        .list(state.as_deref(), 50, q.cursor.unwrap_or(0).min(1_000_000))
        .await?;
    Ok(WorkflowsPage {
        layout: Layout::new(&s, Some(&caller.0), "Workflows", "Workflows"),
        list,
        state,
        states,
        next,
    })
}

pub struct NodeBox {
    pub key: String,
    pub state: String,
    pub label: String,
    pub href: String,
    pub x: i64,
    pub y: i64,
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/workflow.html")]
pub struct WorkflowPage {
    pub layout: Layout,
    pub wf: Workflow,
    pub boxes: Vec<NodeBox>,
    /// From a dependency's right edge to its dependent's left edge.
    pub edges: Vec<Edge>,
    pub width: i64,
    pub height: i64,
}

/// An edge: (x1, y1, x2, y2).
type Edge = (i64, i64, i64, i64);

/// Columns by level (a task's level is one more than its deepest dependency),
/// rows by key within a level. Returns the boxes, edges, width and height.
fn layout(wf: &Workflow) -> (Vec<NodeBox>, Vec<Edge>, i64, i64) {
    let by_key: HashMap<&str, usize> = wf.tasks.iter().enumerate().map(|(i, t)| (t.key.as_str(), i)).collect();
    let mut level = vec![usize::MAX; wf.tasks.len()];
    // The DAG is acyclic (checked at creation); iterate to a fixed point.
    for _ in 0..=wf.tasks.len() {
        let mut changed = false;
        for (i, t) in wf.tasks.iter().enumerate() {
            let l = t
                .depends_on
                .iter()
                .filter_map(|d| by_key.get(d.as_str()))
                .map(|&j| level[j])
                .try_fold(
                    0usize,
                    |acc, l| if l == usize::MAX { None } else { Some(acc.max(l + 1)) },
                );
            if let Some(l) = l
                && level[i] != l
            {
                level[i] = l;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut rows: HashMap<usize, i64> = HashMap::new();
    let mut pos = vec![(0i64, 0i64); wf.tasks.len()];
    let mut boxes = Vec::with_capacity(wf.tasks.len());
    for (i, t) in wf.tasks.iter().enumerate() {
        let l = if level[i] == usize::MAX { 0 } else { level[i] };
        let row = rows.entry(l).or_insert(0);
        let (x, y) = (20 + l as i64 * 200, 20 + *row * 58);
        *row += 1;
        pos[i] = (x, y);
        let label = match &t.task_state {
            Some(ts) if ts != &t.state => format!("{} · {}", t.state, ts),
            _ => t.state.clone(),
        };
        let href = if t.state == "pending" || t.state == "skipped" {
            "#".into()
        } else {
            format!("/tasks/{}", t.task_id)
        };
        let state = t
            .task_state
            .clone()
            .filter(|s| s == "running")
            .unwrap_or_else(|| t.state.clone());
        boxes.push(NodeBox {
            key: t.key.clone(),
            state,
            label,
            href,
            x,
            y,
        });
    }
    let mut edges = Vec::new();
    for (i, t) in wf.tasks.iter().enumerate() {
        for d in &t.depends_on {
            if let Some(&j) = by_key.get(d.as_str()) {
                edges.push((pos[j].0 + 150, pos[j].1 + 19, pos[i].0, pos[i].1 + 19));
            }
        }
    }
    let width = pos.iter().map(|p| p.0 + 170).max().unwrap_or(200);
    let height = pos.iter().map(|p| p.1 + 58).max().unwrap_or(80);
    (boxes, edges, width, height)
}

async fn workflow_page(State(s): State<AppState>, caller: ReadCaller, Path(id): Path<Name>) -> Result<WorkflowPage> {
    let wf = s.workflows.get(&id).await?;
    let (boxes, edges, width, height) = layout(&wf);
    Ok(WorkflowPage {
        layout: Layout::new(&s, Some(&caller.0), &format!("Workflow {id}"), "Workflows"),
        wf,
        boxes,
        edges,
        width,
        height,
    })
}

async fn ui_cancel(State(workflows): State<Arc<Workflows>>, f: UiForm) -> Result<Response> {
    f.caller.require(Role::Admin)?;
    workflows.cancel(&f.name, &f.caller.name).await?;
    Ok(Redirect::to(&format!("/workflows/{}", f.name)).into_response())
}
