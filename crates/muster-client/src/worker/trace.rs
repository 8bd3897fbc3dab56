//! The worker's spans (issue 39): one `process <queue>` span per attempt,
//! a child of the trace context the claim handed out, exported when the
//! builder was given an OTLP endpoint.

use std::sync::OnceLock;

use muster_trace::{ExportConfig, Exporter, Kind, Span, SpanContext, now_ns};

use super::Task;
use super::run::Outcome;

pub(super) struct Tracer {
    cfg: Option<ExportConfig>,
    /// Started on first use, inside the runtime the worker runs on.
    exporter: OnceLock<Exporter>,
}

impl Tracer {
    pub(super) fn new(cfg: Option<ExportConfig>) -> Tracer {
        Tracer {
            cfg,
            exporter: OnceLock::new(),
        }
    }

    fn exporter(&self) -> Option<&Exporter> {
        let cfg = self.cfg.as_ref()?;
        Some(self.exporter.get_or_init(|| Exporter::start(cfg.clone())))
    }

    /// The span of an attempt of `task` about to start: `None` when the
    /// task carries no trace context.
    pub(super) fn begin(&self, task: &Task) -> Option<Attempt> {
        let parent = SpanContext::parse(task.traceparent.as_deref()?)?;
        Some(Attempt {
            ctx: parent.child(),
            parent,
            start: now_ns(),
        })
    }

    /// Sends the spans still queued (a stopping worker).
    pub(super) async fn flush(&self) {
        if let Some(e) = self.exporter.get() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(6), e.flush()).await;
        }
    }
}

/// One attempt's span, open while its handler runs.
pub(super) struct Attempt {
    ctx: SpanContext,
    parent: SpanContext,
    start: u64,
}

impl Attempt {
    pub(super) fn traceparent(&self) -> String {
        self.ctx.traceparent()
    }

    /// Ends the span with the handler's outcome, and exports it when the
    /// trace is sampled and the worker exports.
    pub(super) fn end(&self, tracer: &Tracer, task: &Task, worker: &str, outcome: &Outcome) {
        if !self.ctx.sampled {
            return;
        }
        let Some(exporter) = tracer.exporter() else {
            return;
        };
        let mut span = Span::new(
            &self.ctx,
            Some(&self.parent),
            format!("process {}", task.queue),
            Kind::Consumer,
            self.start,
        )
        .attr("messaging.system", "muster")
        .attr("messaging.operation.type", "process")
        .attr("messaging.destination.name", task.queue.clone())
        .attr("messaging.message.id", task.id.clone())
        .attr("muster.task.attempt", task.attempt)
        .attr("muster.worker.id", worker.to_string());
        span.trace_state = task.tracestate.clone().unwrap_or_default();
        span.error = match outcome {
            Outcome::Done(Ok(_)) => None,
            Outcome::Done(Err(e)) => Some(e.to_string()),
            Outcome::Panicked(why) => Some(format!("the handler panicked: {why}")),
            Outcome::HandedBack => Some("handed back: the worker stopped".into()),
        };
        span.end_ns = now_ns();
        exporter.record(span);
    }
}
