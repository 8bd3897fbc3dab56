//! Static assets, compiled into the binary so a node needs no files beside
//! it and the dashboard works with no internet (no CDN anywhere).

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::http::{FromPathParam, FromPathParams, Path, one};
use crate::problem::Invalid;

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

/// One of [`ASSETS`], named by the request's path: any other path is a 404
/// before the handler runs.
pub struct Asset {
    ctype: &'static str,
    body: &'static str,
}

impl FromPathParam for Asset {
    fn from_param(_key: &str, value: &str) -> Result<Self, Invalid> {
        match ASSETS.iter().find(|(p, _, _)| *p == value) {
            Some(&(_, ctype, body)) => Ok(Asset { ctype, body }),
            None => Err(Invalid::Unknown(format!(
                "no static asset `{}`",
                value.chars().take(64).collect::<String>()
            ))),
        }
    }
}

impl FromPathParams for Asset {
    fn from_params(params: &[(&str, &str)]) -> Result<Self, Invalid> {
        one(params)
    }
}

pub async fn serve(Path(asset): Path<Asset>) -> Response {
    (
        [
            (header::CONTENT_TYPE, asset.ctype),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        asset.body,
    )
        .into_response()
}

pub async fn favicon() -> Response {
    StatusCode::NO_CONTENT.into_response()
}
