//! The exporter: a bounded queue of finished spans and one background task
//! that posts them in batches to an OTLP/HTTP receiver.
//!
//! Bounded everywhere: the queue holds at most `queue` spans ([`Exporter::
//! record`] drops and counts when it is full, never waits), a batch at most
//! `batch` spans, one request is in flight at a time and gives up after
//! `timeout`; a batch the receiver refused or never answered is dropped and
//! counted, not retried (a receiver that is down must cost nothing but the
//! spans).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::otlp::{Span, encode_request};

/// Where and how to export.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// The receiver's base URL (`http://collector:4318`); spans go to
    /// `<endpoint>/v1/traces` unless it already ends with that path.
    pub endpoint: String,
    /// `service.name`, and any more resource attributes.
    pub resource: Vec<(String, String)>,
    /// The instrumentation scope: name and version.
    pub scope: (String, String),
    /// Spans waiting at most; more are dropped (and counted).
    pub queue: usize,
    /// Spans per request at most.
    pub batch: usize,
    /// How long a span may wait for its batch to fill.
    pub interval: Duration,
    /// How long one request may take.
    pub timeout: Duration,
}

impl ExportConfig {
    pub fn new(endpoint: impl Into<String>, service: impl Into<String>) -> ExportConfig {
        ExportConfig {
            endpoint: endpoint.into(),
            resource: vec![("service.name".into(), service.into())],
            scope: ("muster".into(), env!("CARGO_PKG_VERSION").into()),
            queue: 4096,
            batch: 512,
            interval: Duration::from_millis(500),
            timeout: Duration::from_secs(5),
        }
    }

    fn url(&self) -> String {
        let base = self.endpoint.trim_end_matches('/');
        if base.ends_with("/v1/traces") {
            base.to_string()
        } else {
            format!("{base}/v1/traces")
        }
    }
}

/// What the exporter did so far.
#[derive(Debug, Default)]
pub struct ExportStats {
    /// Spans the receiver accepted.
    pub exported: AtomicU64,
    /// Spans dropped: the queue was full, or their request failed.
    pub dropped: AtomicU64,
    /// Requests that failed (refused, timed out, or no receiver).
    pub failed_requests: AtomicU64,
}

/// A handle to the exporter; cheap to clone. The background task ends when
/// the last handle is dropped, after sending what is queued.
#[derive(Clone)]
pub struct Exporter {
    tx: mpsc::Sender<Msg>,
    stats: Arc<ExportStats>,
}

enum Msg {
    Span(Box<Span>),
    Flush(tokio::sync::oneshot::Sender<()>),
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").finish_non_exhaustive()
    }
}

impl Exporter {
    /// Starts the background task on the current Tokio runtime.
    pub fn start(cfg: ExportConfig) -> Exporter {
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        let stats = Arc::new(ExportStats::default());
        tokio::spawn(run(cfg, rx, stats.clone()));
        Exporter { tx, stats }
    }

    /// Queues a finished span; never waits. A full queue drops it (counted
    /// in [`ExportStats::dropped`]).
    pub fn record(&self, span: Span) {
        if self.tx.try_send(Msg::Span(Box::new(span))).is_err() {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn stats(&self) -> &ExportStats {
        &self.stats
    }

    /// Sends what is queued now, and waits until it was sent (or dropped).
    pub async fn flush(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        if self.tx.send(Msg::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

async fn run(cfg: ExportConfig, mut rx: mpsc::Receiver<Msg>, stats: Arc<ExportStats>) {
    let http = match reqwest::Client::builder().timeout(cfg.timeout).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "the span exporter could not make its HTTP client; spans are dropped");
            while let Some(m) = rx.recv().await {
                if let Msg::Span(_) = m {
                    stats.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            return;
        }
    };
    let url = cfg.url();
    let resource: Vec<(&str, &str)> = cfg.resource.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let scope = (cfg.scope.0.as_str(), cfg.scope.1.as_str());
    let mut batch: Vec<Span> = Vec::with_capacity(cfg.batch);
    let mut warned = false;
    loop {
        let mut flushes = Vec::new();
        // Wait for the first span (or the end), then gather for `interval`.
        match rx.recv().await {
            None => return,
            Some(Msg::Span(s)) => batch.push(*s),
            Some(Msg::Flush(done)) => flushes.push(done),
        }
        if flushes.is_empty() {
            let deadline = tokio::time::Instant::now() + cfg.interval;
            while batch.len() < cfg.batch {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(Msg::Span(s))) => batch.push(*s),
                    Ok(Some(Msg::Flush(done))) => {
                        flushes.push(done);
                        break;
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
        // A flush sends everything queued before it.
        if !flushes.is_empty() {
            while let Ok(m) = rx.try_recv() {
                match m {
                    Msg::Span(s) => batch.push(*s),
                    Msg::Flush(done) => flushes.push(done),
                }
            }
        }
        for chunk in batch.chunks(cfg.batch.max(1)) {
            let body = encode_request(&resource, scope, chunk);
            let sent = http
                .post(&url)
                .header("content-type", "application/x-protobuf")
                .body(body)
                .send()
                .await
                .and_then(|r| r.error_for_status());
            match sent {
                Ok(_) => {
                    stats.exported.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    warned = false;
                }
                Err(e) => {
                    stats.failed_requests.fetch_add(1, Ordering::Relaxed);
                    stats.dropped.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    if !warned {
                        tracing::warn!(url = %url, error = %e, "span export failed; the spans are dropped (counted)");
                        warned = true;
                    }
                }
            }
        }
        batch.clear();
        for done in flushes {
            let _ = done.send(());
        }
    }
}
