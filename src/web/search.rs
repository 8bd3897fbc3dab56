//! Search from the header: a task id, an alias, an idempotency key or a
//! workflow id goes straight to its page (303); anything else gets a page
//! that says what was looked for and where (404), or what a term may
//! contain (400). A plain GET form, so it works without JavaScript.

use askama::Template;
use askama_web::WebTemplate;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use serde::Deserialize;

use super::Layout;
use crate::app::AppState;
use crate::auth::ReadCaller;
use crate::error::Result;
use crate::validate;
use crate::workflows::WorkflowError;

pub fn router() -> Router<AppState> {
    Router::new().route("/search", get(search))
}

#[derive(Debug, Deserialize)]
pub struct SearchQuery {
    pub q: Option<String>,
}

#[derive(Template, WebTemplate)]
#[template(path = "pages/search.html")]
pub struct SearchPage {
    pub layout: Layout,
    pub term: String,
    /// Why nothing was found, or an empty string before a search.
    pub message: String,
}

async fn search(State(s): State<AppState>, caller: ReadCaller, Query(q): Query<SearchQuery>) -> Result<Response> {
    let term = q.q.unwrap_or_default().trim().to_string();
    let page = |message: String| SearchPage {
        layout: Layout::new(&s, Some(&caller.0), "Search", ""),
        term: term.clone(),
        message,
    };
    if term.is_empty() {
        return Ok(page(String::new()).into_response());
    }
    // Idempotency keys take any printable ASCII but spaces, as the submit
    // does; task ids, aliases and workflow ids are names within that.
    if let Err(e) = validate::opaque_key("search term", &term) {
        let why = format!(
            "Nothing can match: {e}. Task ids, aliases and workflow ids are made of A-Z a-z 0-9 . _ -, \
             and idempotency keys of printable ASCII characters without spaces."
        );
        return Ok((StatusCode::BAD_REQUEST, page(why)).into_response());
    }
    if let Some((id, _how)) = s.tasks.lookup(&term).await? {
        return Ok(Redirect::to(&format!("/tasks/{id}")).into_response());
    }
    if validate::is_name(&term) {
        match s.workflows.get(&term).await {
            Ok(_) => return Ok(Redirect::to(&format!("/workflows/{term}")).into_response()),
            Err(WorkflowError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let why = "No task id, alias, idempotency key or workflow id matches it. Finished tasks and \
               workflows are kept for their retention only; idempotency keys for their window."
        .to_string();
    Ok((StatusCode::NOT_FOUND, page(why)).into_response())
}
