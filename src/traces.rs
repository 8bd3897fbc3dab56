//! Tracing (issue 39): the node's spans, exported over OTLP/HTTP when
//! `telemetry.otlp_endpoint` is set, and nothing at all when it is not.
//!
//! What the node records, each a span of the request's trace or of the
//! task's:
//!
//! - a server span per HTTP request, named by its route template
//!   (`POST /api/v1/queues/{queue}/tasks`, never the raw path), child of the
//!   caller's `traceparent` when it sent one;
//! - a client span per Redis call made while serving it (`redis <op>`, with
//!   the script or command, the shard and the outcome);
//! - per task: `send <queue>` (producer) when it is submitted, whose context
//!   is what the task stores and every claim hands out, so the attempts'
//!   spans are its children; `receive <queue>` (consumer) per claim;
//!   `complete <queue>` and `fail <queue>` under the call that reported the
//!   outcome (a worker sends its attempt's `traceparent` with it), with
//!   `muster.task.outcome` `succeeded`, `retry` (and the retry's time) or
//!   `dead`.
//!
//! The request's span travels with the request's future in a task-local
//! ([`CURRENT`]): the Redis layer finds it there without being handed it.

use std::sync::Arc;

use axum::extract::{MatchedPath, Request};
use axum::response::Response;
use muster_trace::{ExportConfig, Exporter, Kind, Span, SpanContext, now_ns};

use crate::config::TelemetryConfig;

/// The node's tracer: off (the default) or exporting. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tracer(Option<Arc<Inner>>);

struct Inner {
    exporter: Exporter,
    ratio: f64,
    node: String,
    /// What the metrics were last told: exported, dropped.
    published: [std::sync::atomic::AtomicU64; 2],
}

tokio::task_local! {
    /// The span of the request being served, when it is recorded.
    static CURRENT: Current;
}

#[derive(Clone)]
struct Current {
    tracer: Tracer,
    ctx: SpanContext,
}

impl Tracer {
    /// Starts the exporter when `telemetry.otlp_endpoint` is set.
    pub(crate) fn start(cfg: &TelemetryConfig, node_id: &str) -> Tracer {
        if cfg.otlp_endpoint.is_empty() {
            return Tracer(None);
        }
        let mut ec = ExportConfig::new(&cfg.otlp_endpoint, &cfg.service_name);
        ec.resource.push(("service.instance.id".into(), node_id.into()));
        ec.queue = cfg.queue;
        Tracer(Some(Arc::new(Inner {
            exporter: Exporter::start(ec),
            ratio: cfg.sample_ratio,
            node: node_id.into(),
            published: Default::default(),
        })))
    }

    pub(crate) fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Adds what was exported and dropped since the last call to the
    /// process's counters (`/metrics` calls it before it renders).
    pub(crate) fn publish_counts(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(i) = &self.0 else {
            return;
        };
        let (exported, dropped) = self.counts();
        let new_exported = exported.saturating_sub(i.published[0].swap(exported, Relaxed));
        let new_dropped = dropped.saturating_sub(i.published[1].swap(dropped, Relaxed));
        metrics::counter!("muster_trace_spans_exported_total").increment(new_exported);
        metrics::counter!("muster_trace_spans_dropped_total").increment(new_dropped);
    }

    /// Spans exported and dropped so far by this node (zeros when off).
    pub fn counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        match &self.0 {
            Some(i) => (
                i.exporter.stats().exported.load(Relaxed),
                i.exporter.stats().dropped.load(Relaxed),
            ),
            None => (0, 0),
        }
    }

    pub(crate) fn record(&self, span: Span) {
        if let Some(i) = &self.0 {
            i.exporter.record(span);
        }
    }

    /// The context of a new span: a child of `parent` (following its
    /// sampled flag), or the first of a new trace sampled at the ratio.
    fn begin(&self, parent: Option<&SpanContext>) -> SpanContext {
        match parent {
            Some(p) => p.child(),
            None => {
                let ratio = self.0.as_ref().map_or(0.0, |i| i.ratio);
                let mut c = SpanContext::root(true);
                c.sampled = muster_trace::sampled_by_ratio(&c.trace_id, ratio);
                c
            }
        }
    }

    /// The first span of a new trace started by the node itself (a
    /// schedule's occurrence): `None` when tracing is off or the ratio
    /// leaves the trace out.
    pub(crate) fn new_root(&self) -> Option<SpanContext> {
        if !self.is_on() {
            return None;
        }
        Some(self.begin(None)).filter(|c| c.sampled)
    }

    /// Records the root span `ctx` (from [`Tracer::new_root`]).
    pub(crate) fn record_root(&self, ctx: &SpanContext, name: String, attrs: muster_trace::otlp::Attrs) {
        let now = now_ns();
        let mut span = Span::new(ctx, None, name, Kind::Internal, now);
        span.attrs = attrs;
        span.attrs.push(("muster.node", self.node().to_string().into()));
        self.record(span);
    }

    fn node(&self) -> &str {
        self.0.as_ref().map_or("", |i| i.node.as_str())
    }

    /// Sends what is queued and waits for it (tests, and a stopping node).
    pub(crate) async fn flush(&self) {
        if let Some(i) = &self.0 {
            i.exporter.flush().await;
        }
    }
}

fn current_tracer() -> Option<(Tracer, SpanContext)> {
    CURRENT.try_with(|c| (c.tracer.clone(), c.ctx)).ok()
}

/// A span of operation `op` (`send`, `receive`) on `queue`, with the
/// `messaging.*` attributes every such span has.
fn queue_span(
    ctx: &SpanContext,
    parent: Option<&SpanContext>,
    op: &'static str,
    queue: &str,
    kind: Kind,
    start: u64,
) -> Span {
    Span::new(ctx, parent, format!("{op} {queue}"), kind, start)
        .attr("messaging.system", "muster")
        .attr("messaging.operation.type", op)
        .attr("messaging.destination.name", queue.to_string())
}

/// The request metrics (`http::count_request`) and the server span of every
/// request, around `inner` (authentication and the handler: the one
/// route-level layer, `app::per_route`; no span when tracing is off).
pub(crate) async fn around<F, Fut>(tracer: &Tracer, req: Request, inner: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let path = req.extensions().get::<MatchedPath>().cloned();
    let method = crate::http::method_label(req.method());
    let start = std::time::Instant::now();
    let resp = traced(tracer, req, inner, method, path.as_ref()).await;
    crate::http::count_request(method, path.as_ref(), resp.status(), start);
    resp
}

/// The request's server span, when tracing is on and it is sampled
/// (`method` and `path` as the middleware read them).
async fn traced<F, Fut>(
    tracer: &Tracer,
    req: Request,
    inner: F,
    method: &'static str,
    path: Option<&MatchedPath>,
) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    if !tracer.is_on() {
        return inner(req).await;
    }
    let parent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(SpanContext::parse);
    let ctx = tracer.begin(parent.as_ref());
    if !ctx.sampled {
        return inner(req).await;
    }
    let route = path.map_or("unmatched", MatchedPath::as_str).to_string();
    let start = now_ns();
    let cur = Current {
        tracer: tracer.clone(),
        ctx,
    };
    let resp = CURRENT.scope(cur, inner(req)).await;
    let status = resp.status().as_u16();
    let mut span = Span::new(&ctx, parent.as_ref(), format!("{method} {route}"), Kind::Server, start)
        .attr("http.request.method", method)
        .attr("http.route", route)
        .attr("http.response.status_code", i64::from(status))
        .attr("muster.node", tracer.node().to_string());
    span.end_ns = now_ns();
    if status >= 500 {
        span.error = Some(format!("status {status}"));
    }
    tracer.record(span);
    resp
}

/// Records a Redis call made while serving a recorded request (called by
/// the store for every call; nothing happens outside such a request).
pub(crate) fn redis_call(
    op: &'static str,
    shard: usize,
    took: std::time::Duration,
    error: Option<&dyn std::fmt::Display>,
) {
    let Some((tracer, parent)) = current_tracer() else {
        return;
    };
    let start = now_ns().saturating_sub(took.as_nanos() as u64);
    let mut span = Span::new(
        &parent.child(),
        Some(&parent),
        format!("redis {op}"),
        Kind::Client,
        start,
    )
    .attr("db.system.name", "redis")
    .attr("db.operation.name", op)
    .attr("muster.shard", shard as u64);
    span.end_ns = now_ns();
    span.error = error.map(|e| e.to_string());
    tracer.record(span);
}

/// A task about to be submitted in a recorded request: its `send` span's
/// context replaces its trace context (so its attempts are the span's
/// children), and [`Sending::done`] records the span once the id is known.
pub(crate) struct Sending {
    tracer: Tracer,
    ctx: SpanContext,
    parent: SpanContext,
    trace_state: String,
    start: u64,
}

/// Prepares the `send` span of a task to submit; `None` when the request is
/// not recorded. The task's `own` trace context (a batch item's), when it
/// has one, is the span's parent; else the request's span (itself a child
/// of the request's `traceparent` header).
pub(crate) fn sending(traceparent: &mut String, tracestate: &str, own: bool) -> Option<Sending> {
    let (tracer, request) = current_tracer()?;
    let parent = match own.then(|| SpanContext::parse(traceparent)).flatten() {
        Some(own) => own,
        None => request,
    };
    if !parent.sampled {
        return None;
    }
    let ctx = parent.child();
    *traceparent = ctx.traceparent();
    Some(Sending {
        tracer,
        ctx,
        parent,
        trace_state: tracestate.to_string(),
        start: now_ns(),
    })
}

impl Sending {
    /// Records a batch's one `send` span, whose context its tasks carry.
    pub(crate) fn done_batch(self, queue: &str, created: usize) {
        let mut span = queue_span(&self.ctx, Some(&self.parent), "send", queue, Kind::Producer, self.start)
            .attr("messaging.batch.message_count", created as u64);
        span.trace_state = self.trace_state;
        span.end_ns = now_ns();
        self.tracer.record(span);
    }

    /// Records the span under another name (a workflow's run).
    pub(crate) fn finish(self, name: String, attrs: muster_trace::otlp::Attrs) {
        let mut span = Span::new(&self.ctx, Some(&self.parent), name, Kind::Internal, self.start);
        span.attrs = attrs;
        span.trace_state = self.trace_state;
        span.end_ns = now_ns();
        self.tracer.record(span);
    }

    /// Records the span: `id` of the created task, or the refusal.
    pub(crate) fn done(self, queue: &str, id: Option<&str>, outcome: &str) {
        let mut span = queue_span(&self.ctx, Some(&self.parent), "send", queue, Kind::Producer, self.start)
            .attr("muster.task.outcome", outcome.to_string());
        if let Some(id) = id {
            span = span.attr("messaging.message.id", id.to_string());
        } else {
            span.error = Some(outcome.to_string());
        }
        span.trace_state = self.trace_state;
        span.end_ns = now_ns();
        self.tracer.record(span);
    }
}

/// A claim handed `tasks` out. One task: a `receive` span in its trace.
/// Several: one `receive` span of the claim's request, linked to each
/// task's context (a span per task would cost the node about as much as
/// the rest of a batched task's handling; BENCHMARKS.md).
pub(crate) fn received_all(tracer: &Tracer, queue: &str, tasks: &[crate::tasks::Claimed], start: u64) {
    if !tracer.is_on() || tasks.is_empty() {
        return;
    }
    if let [task] = tasks {
        return received(tracer, queue, task, start);
    }
    let Some((_, request)) = current_tracer() else {
        return;
    };
    let mut span = queue_span(
        &request.child(),
        Some(&request),
        "receive",
        queue,
        Kind::Consumer,
        start,
    )
    .attr("messaging.batch.message_count", tasks.len() as u64)
    .attr("muster.node", tracer.node().to_string());
    span.links = tasks
        .iter()
        .filter_map(|t| t.traceparent.as_deref().and_then(SpanContext::parse))
        .map(|c| (c.trace_id, c.span_id))
        .collect();
    span.end_ns = now_ns();
    tracer.record(span);
}

fn received(tracer: &Tracer, queue: &str, task: &crate::tasks::Claimed, start: u64) {
    let Some(parent) = task.traceparent.as_deref().and_then(SpanContext::parse) else {
        return;
    };
    if !parent.sampled {
        return;
    }
    let mut span = queue_span(&parent.child(), Some(&parent), "receive", queue, Kind::Consumer, start)
        .attr("messaging.message.id", task.id.clone())
        .attr("muster.task.attempt", task.attempt)
        .attr("muster.task.token", task.token)
        .attr("muster.node", tracer.node().to_string());
    span.end_ns = now_ns();
    tracer.record(span);
}

/// A worker reported a task's outcome: `complete` or `fail` span under the
/// request (whose parent is the attempt's span when the worker sent it).
pub(crate) fn settled(verb: &'static str, id: &str, outcome: Result<&crate::tasks::Finished, String>, start: u64) {
    let Some((tracer, parent)) = current_tracer() else {
        return;
    };
    let mut span = Span::new(&parent.child(), Some(&parent), verb, Kind::Internal, start)
        .attr("messaging.system", "muster")
        .attr("messaging.operation.type", "settle")
        .attr("messaging.message.id", id.to_string());
    match outcome {
        Ok(f) => {
            let what = match f.state.as_str() {
                "succeeded" => "succeeded",
                "dead" => "dead",
                "cancelled" => "cancelled",
                _ => "retry",
            };
            span = span
                .attr("muster.task.outcome", what)
                .attr("muster.task.attempt", f.attempt)
                .attr("muster.task.state", f.state.clone());
            if let Some(at) = f.retry_at {
                span.events.push(muster_trace::Event {
                    time_ns: now_ns(),
                    name: "retry scheduled",
                    attrs: vec![("muster.task.retry_at", at.into())],
                });
            }
        }
        Err(why) => span.error = Some(why),
    }
    span.end_ns = now_ns();
    tracer.record(span);
}

/// The orphan cleaner recovered a task of a dead owner: a `recover` span in
/// the task's trace, with what recovery did (`requeued`, `dead`,
/// `cancelled`).
/// A task a liveness pass acted on that has a trace context: id, action,
/// queue, traceparent (the node records a span for it).
pub(crate) type Traced = (String, String, String, String);

/// What a liveness pass did to a task, for its span (issue 39).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// Its worker died (`recover.lua`).
    Recovered,
    /// It ran past its `timeout_ms` (`timeouts.lua`).
    TimedOut,
    /// Its claim was not acknowledged in time (`unacked.lua`).
    NotAcknowledged,
}

impl Liveness {
    fn verb(self) -> &'static str {
        match self {
            Liveness::Recovered => "recover",
            Liveness::TimedOut => "timeout",
            Liveness::NotAcknowledged => "unacked",
        }
    }

    /// The span's error, if what happened is one.
    fn error(self, action: &str) -> Option<String> {
        match (self, action) {
            (Liveness::Recovered, "dead") => Some("dead: no attempts left after its owner died".into()),
            (Liveness::TimedOut, "dead") => Some("timed out; dead: no attempts left".into()),
            (Liveness::TimedOut, _) => Some("timed out".into()),
            (Liveness::NotAcknowledged, "dead") => {
                Some("dead: not acknowledged more than claim.max_unacked times".into())
            }
            _ => None,
        }
    }
}

/// A span per traced task a liveness pass acted on (`traced`: id, action,
/// queue, traceparent), a child of the task's context: `recover <queue>`,
/// `timeout <queue>` or `unacked <queue>`, from the pass's start.
pub(crate) fn liveness(tracer: &Tracer, why: Liveness, traced: &[Traced], start: u64) {
    if !tracer.is_on() {
        return;
    }
    for (id, action, queue, traceparent) in traced {
        let Some(parent) = SpanContext::parse(traceparent).filter(|p| p.sampled) else {
            continue;
        };
        let mut span = Span::new(
            &parent.child(),
            Some(&parent),
            format!("{} {queue}", why.verb()),
            Kind::Internal,
            start,
        )
        .attr("messaging.system", "muster")
        .attr("messaging.destination.name", queue.to_string())
        .attr("messaging.message.id", id.to_string())
        .attr("muster.task.outcome", action.to_string())
        .attr("muster.node", tracer.node().to_string());
        span.error = why.error(action);
        span.end_ns = now_ns();
        tracer.record(span);
    }
}
