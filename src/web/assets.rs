//! Static assets, compiled into the binary so a node needs no files beside
//! it and the dashboard works with no internet (no CDN anywhere).

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// (path under /static/, content type, body)
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "css/muster.css",
        "text/css; charset=utf-8",
        include_str!("../../static/css/muster.css"),
    ),
    (
        "js/live.js",
        "text/javascript; charset=utf-8",
        include_str!("../../static/js/live.js"),
    ),
    (
        "js/charts.js",
        "text/javascript; charset=utf-8",
        include_str!("../../static/js/charts.js"),
    ),
    // uPlot 1.6.32 (MIT, LICENSE beside it), its package's dist/ files as
    // published: the dashboard's charting library.
    (
        "vendor/uplot/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../../static/vendor/uplot/uPlot.iife.min.js"),
    ),
    (
        "vendor/uplot/uPlot.min.css",
        "text/css; charset=utf-8",
        include_str!("../../static/vendor/uplot/uPlot.min.css"),
    ),
    (
        "vendor/uplot/LICENSE",
        "text/plain; charset=utf-8",
        include_str!("../../static/vendor/uplot/LICENSE"),
    ),
];

pub async fn serve(Path(path): Path<String>) -> Response {
    match ASSETS.iter().find(|(p, _, _)| *p == path) {
        Some((_, ctype, body)) => (
            [
                (header::CONTENT_TYPE, *ctype),
                (header::CACHE_CONTROL, "public, max-age=300"),
            ],
            *body,
        )
            .into_response(),
        None => crate::error::ApiError::not_found(format!("no static asset `{path}`")).into_response(),
    }
}

pub async fn favicon() -> Response {
    StatusCode::NO_CONTENT.into_response()
}
