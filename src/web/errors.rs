//! Error pages for people: a browser that asks for a page (`GET`, `Accept:
//! text/html`) and gets a problem (an unknown task, a bad query, the
//! fallback's 404) sees an HTML page with the same status, title and detail,
//! inside the dashboard's layout, instead of raw JSON. API paths, other
//! methods and clients that do not ask for HTML keep `problem+json`.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::Layout;
use crate::app::AppState;

/// A problem body larger than this is not rewritten (ours are small).
const MAX_PROBLEM_BYTES: usize = 64 * 1024;

#[derive(Template, WebTemplate)]
#[template(path = "pages/error.html")]
pub struct ErrorPage {
    pub layout: Layout,
    pub status: u16,
    pub title: String,
    pub detail: String,
    pub request_id: String,
}

fn wants_html(req: &Request) -> bool {
    let path = req.uri().path();
    req.method() == Method::GET
        && !path.starts_with("/api/")
        && path != "/metrics"
        && req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/html"))
}

/// Rewrites a `problem+json` answer to a page request as an HTML page
/// (called by the node's surface, `app::Surface`, around its routes).
pub(crate) async fn html_errors<F, Fut>(s: &AppState, req: Request, routes: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let html = wants_html(&req);
    // Framework errors (unknown route, wrong method, bad body) become
    // problems first.
    let res = crate::http::problemize(routes(req).await).await;
    let status = res.status();
    let is_problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !html || !is_problem || !(status.is_client_error() || status.is_server_error()) {
        return res;
    }
    let (parts, body) = res.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_PROBLEM_BYTES).await else {
        return (status, "error").into_response();
    };
    let problem: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let text = |k: &str| problem.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
    let title = match text("title") {
        t if t.is_empty() => status.canonical_reason().unwrap_or("Error").to_string(),
        t => t,
    };
    let page = ErrorPage {
        layout: Layout::new(s, None, &format!("{} {title}", status.as_u16()), ""),
        status: status.as_u16(),
        title,
        detail: text("detail"),
        request_id: text("request_id"),
    };
    let mut out = (status, page).into_response();
    // Keep what the problem carried besides its body (Retry-After, Allow,
    // WWW-Authenticate, the request id).
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    if status == StatusCode::UNAUTHORIZED {
        out.headers_mut()
            .insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    }
    out
}
