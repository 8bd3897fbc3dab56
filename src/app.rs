//! The shared application state and the router that merges every
//! subsystem's routes, the dashboard and what goes around them.

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::Response;
use metrics_exporter_prometheus::PrometheusHandle;
use tower::Service;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::auth::Auth;
use crate::config::Config;
use crate::events::Bus;
use crate::health::Health;
use crate::nodes::Nodes;
use crate::orphans::Orphans;
use crate::store::Store;
use crate::store::embedded::EmbeddedRedis;
use crate::tasks::Tasks;

// Declared here, not in lib.rs, so that the API document's code lives beside
// the router that serves it.
#[path = "openapi.rs"]
pub(crate) mod openapi;

/// Everything a handler may need; cheap to clone: one reference count
/// (the router clones it several times per request, and a struct of two
/// dozen `Arc`s cost that many atomic operations each time).
#[derive(Clone)]
pub struct AppState(Arc<AppParts>);

impl AppState {
    pub fn new(parts: AppParts) -> Self {
        AppState(Arc::new(parts))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppParts;
    fn deref(&self) -> &AppParts {
        &self.0
    }
}

/// A handler that needs one service takes just that one
/// (`State<Arc<Tasks>>`): axum hands it out of the state by `FromRef`.
macro_rules! service_from_state {
    ($($field:ident: $t:ty),* $(,)?) => {$(
        impl axum::extract::FromRef<AppState> for Arc<$t> {
            fn from_ref(s: &AppState) -> Arc<$t> {
                s.$field.clone()
            }
        }
    )*};
}

service_from_state!(
    tasks: Tasks,
    nodes: Nodes,
    orphans: Orphans,
    workflows: crate::workflows::Workflows,
    schedules: crate::schedules::Schedules,
    barriers: crate::barriers::Barriers,
    locks: crate::locks::Locks,
    stats: crate::stats::Stats,
);

/// The parts of [`AppState`].
pub struct AppParts {
    pub cfg: Arc<Config>,
    pub node_id: Arc<str>,
    /// The URL this node advertises (dashboard links, peers).
    pub advertise: Arc<str>,
    pub store: Store,
    pub nodes: Arc<Nodes>,
    pub tasks: Arc<Tasks>,
    pub orphans: Arc<Orphans>,
    pub workflows: Arc<crate::workflows::Workflows>,
    pub bus: Arc<Bus>,
    /// The cached live view the dashboard reads.
    pub live: Arc<crate::events::live::Live>,
    /// One slot per WebSocket subscriber (`events.max_clients`, and
    /// `events.max_clients_per_principal` per token or no-auth address).
    pub ws_slots: Arc<crate::events::slots::Slots>,
    /// Cancelled when the node starts shutting down: long polls and
    /// WebSockets end early.
    pub shutdown: tokio_util::sync::CancellationToken,
    pub health: Arc<Health>,
    pub auth: Arc<Auth>,
    pub metrics: PrometheusHandle,
    pub embedded: Option<Arc<EmbeddedRedis>>,
    pub started_at: SystemTime,
    /// The OpenAPI document, rendered once when the router is built.
    pub openapi: Arc<OnceLock<String>>,
    pub schedules: Arc<crate::schedules::Schedules>,
    pub barriers: Arc<crate::barriers::Barriers>,
    pub locks: Arc<crate::locks::Locks>,
    /// Long polls of barriers, locks and elections, woken by events.
    pub waiters: Arc<crate::longpoll::Waiters>,
    pub failover: crate::failover::Failover,
    /// The outcome history behind the charts.
    pub stats: Arc<crate::stats::Stats>,
    /// Tracing (issue 39): off unless `telemetry.otlp_endpoint` is set.
    pub tracer: crate::traces::Tracer,
}

/// The root of the document; [`openapi::document`] completes it once every
/// route is merged.
#[derive(OpenApi)]
#[openapi(info(
    title = "muster",
    description = "High-availability coordination server for worker clusters. Errors are \
                   application/problem+json (schema `Problem`). Authenticate with \
                   `Authorization: Bearer <token>`; each operation names the least role it needs \
                   (read < worker < admin) as the scopes of its security requirement. A method a \
                   path does not list answers 405 with an `Allow` header (components.responses.\
                   MethodNotAllowed); a body that does not arrive within server.body_read_timeout_ms \
                   answers 408 and closes the connection. Integers may be written as integral \
                   floats (`30.0`), as JSON Schema counts them."
))]
struct ApiDoc;

/// The API routes with their OpenAPI description.
pub(crate) fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(crate::system::router())
        .merge(crate::nodes::routes::router())
        .merge(crate::tasks::routes::router())
        .merge(crate::orphans::routes::router())
        .merge(crate::events::routes::router())
        .merge(crate::workflows::routes::router())
        .merge(crate::schedules::routes::router())
        .merge(crate::barriers::routes::router())
        .merge(crate::locks::routes::router())
        .merge(crate::failover::routes::router())
        .merge(crate::stats::routes::router())
}

/// The whole HTTP surface of a node: its routes, and around them the edge
/// (`http::edge`: request ids, the target's length, panics, hardening
/// headers) and the error pages (`web::errors::html_errors`, with framework
/// errors made problems). The server calls it once per request: plain
/// function calls around the router, where `from_fn` layers each cloned
/// the service behind them and boxed a future per request (BENCHMARKS.md,
/// issue 41). They wrap the whole router, so they see final responses (a
/// 405 with its `Allow`, the fallback's 404): `Router::layer` wraps each
/// route's method router, which adds the `Allow` of its 405 only after its
/// layers ran.
#[derive(Clone)]
pub(crate) struct Surface {
    routes: Router,
    state: AppState,
}

impl crate::serve::Answer for Surface {
    async fn answer(self, req: Request) -> Response {
        let Surface { mut routes, state } = self;
        crate::http::edge(req, |req| {
            crate::web::errors::html_errors(&state, req, |req| async move {
                match routes.call(req).await {
                    Ok(resp) => resp,
                    Err(never) => match never {},
                }
            })
        })
        .await
    }
}

/// The one layer of every route: the request metrics and span
/// (`traces::around`) around authentication (`auth::check`), which lets a
/// caller through to the replicated-acknowledgement wait
/// (`durability::around`) and the handler.
async fn per_route(State(s): State<AppState>, req: Request, next: Next) -> Response {
    crate::traces::around(&s.tracer, req, |req| crate::auth::check(&s, req, next)).await
}

/// The whole HTTP surface of a node.
pub(crate) fn surface(state: AppState) -> Surface {
    let (api, doc) = api_router().split_for_parts();
    let doc = openapi::document(doc, &state.cfg);
    let _ = state
        .openapi
        .set(serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".into()));
    let max_body = state.cfg.server.max_body_bytes;
    let routes = Router::new()
        .merge(api)
        .merge(crate::web::router())
        .fallback(crate::system::not_found)
        // The body limit applies when a handler reads the body (`ApiJson`,
        // forms), after its role extractor: a caller without the role gets
        // 403 whatever the body's size (tower-http's RequestBodyLimitLayer
        // would answer 413 first, from Content-Length).
        .layer(DefaultBodyLimit::max(max_body))
        .layer(from_fn_with_state(state.clone(), per_route))
        .with_state(state.clone());
    Surface { routes, state }
}
