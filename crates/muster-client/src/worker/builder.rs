//! [`WorkerBuilder`]: the queues, id, concurrency, leases and handler of a
//! [`Worker`], checked when it is built.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::{Counters, Ctx, Handler, HandlerError, Lease, Seen, Shared, Task, Worker};
use crate::{Client, Error, Result};

/// Builds a [`Worker`].
pub struct WorkerBuilder {
    client: Client,
    queues: Vec<String>,
    id: Option<String>,
    concurrency: usize,
    batch: u32,
    ttl: Duration,
    task_heartbeat: Duration,
    claim_wait: Duration,
    claim_ack: Option<Duration>,
    grace: Duration,
    labels: std::collections::BTreeMap<String, String>,
    handler: Option<Handler>,
    otlp: Option<(String, String)>,
}

impl WorkerBuilder {
    pub(super) fn new(client: Client) -> WorkerBuilder {
        WorkerBuilder {
            client,
            queues: Vec::new(),
            id: None,
            concurrency: 1,
            batch: 1,
            ttl: Duration::from_secs(10),
            task_heartbeat: Duration::from_secs(2),
            claim_wait: Duration::from_secs(5),
            claim_ack: None,
            grace: Duration::from_secs(30),
            labels: Default::default(),
            handler: None,
            otlp: None,
        }
    }

    /// Adds a queue to work (at least one). Each queue gets its own
    /// long-polling claim; all share the concurrency.
    pub fn queue(mut self, q: impl Into<String>) -> Self {
        self.queues.push(q.into());
        self
    }

    /// The worker id (`[A-Za-z0-9._-]{1,64}`), as the Nodes page shows it.
    /// Default: `<host>-<pid>-<random>`.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Handlers running at once. Default 1.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Most tasks one claim takes (1 to 1000, and never more than the free
    /// concurrency). Default 1.
    pub fn batch(mut self, n: u32) -> Self {
        self.batch = n.clamp(1, muster_api::bounds::CLAIM_MAX.end().to_owned());
        self
    }

    /// The worker's registration ttl: how long after its last heartbeat a
    /// dead worker's tasks become recoverable. It heartbeats every third of
    /// it, and takes its own lease for lapsed (cancelling its handlers) when
    /// no heartbeat sent within the ttl less `max(ttl / 10, 100 ms)`
    /// succeeded. Default 10 s (500 ms to 1 h).
    pub fn ttl(mut self, d: Duration) -> Self {
        self.ttl = d.clamp(Duration::from_millis(500), Duration::from_secs(3600));
        self
    }

    /// How often each running task is heartbeated (progress, cancel
    /// requests, a lost token). Default 2 s.
    pub fn task_heartbeat(mut self, d: Duration) -> Self {
        self.task_heartbeat = d.max(Duration::from_millis(10));
        self
    }

    /// A claim's long poll (at most 30 s). Shutdown waits for the claim in
    /// flight, so this bounds how long stopping can take on an idle queue.
    /// Default 5 s.
    pub fn claim_wait(mut self, d: Duration) -> Self {
        self.claim_wait = d.min(Duration::from_millis(muster_api::bounds::CLAIM_WAIT_MAX_MS));
        self
    }

    /// The claim lease its claims ask for (1 s to 10 min): how long a
    /// claimed task may go unacknowledged before the server puts it back.
    /// Default: the server's `claim.ack_ms`. The worker acknowledges at a
    /// third of it at the latest, so a shorter lease costs a call per task
    /// that runs longer than a third of it.
    pub fn claim_ack(mut self, d: Duration) -> Self {
        self.claim_ack = Some(d.clamp(Duration::from_secs(1), Duration::from_secs(600)));
        self
    }

    /// How long shutdown lets running handlers finish before it cancels
    /// them and hands their tasks back. Default 30 s.
    pub fn grace(mut self, d: Duration) -> Self {
        self.grace = d;
        self
    }

    /// Exports a span per attempt (`process <queue>`, a child of the task's
    /// trace context) to this OTLP/HTTP receiver (`http://collector:4318`)
    /// under `service.name` `service`. Without it, the worker still hands
    /// each handler its attempt's `traceparent` ([`Ctx::traceparent`]) and
    /// sends it with every call the handler makes through the client, but
    /// records nothing.
    pub fn otlp_endpoint(mut self, url: impl Into<String>, service: impl Into<String>) -> Self {
        self.otlp = Some((url.into(), service.into()));
        self
    }

    /// A label shown with the worker on the Nodes page.
    pub fn label(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }

    /// The handler: called once per claimed task. `Ok(result)` completes
    /// the task with `result`; `Err` fails it (retried while attempts are
    /// left, unless it is a [`Permanent`] or a cancel was requested).
    pub fn handler<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Task, Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, HandlerError>> + Send + 'static,
    {
        self.handler = Some(Arc::new(move |t, c| Box::pin(f(t, c))));
        self
    }

    /// Builds the worker; fails without a queue or a handler, or with a
    /// bad queue name or worker id.
    pub fn build(self) -> Result<Worker> {
        let handler = self
            .handler
            .ok_or_else(|| Error::Invalid("give the worker a handler".into()))?;
        if self.queues.is_empty() {
            return Err(Error::Invalid("give the worker at least one queue".into()));
        }
        if let Some(q) = self.queues.iter().find(|q| !muster_api::is_name(q)) {
            return Err(Error::Invalid(format!(
                "queue `{q}` must be 1 to 128 characters from A-Z a-z 0-9 . _ -"
            )));
        }
        let id = self.id.unwrap_or_else(|| {
            let host = muster_api::generated_node_id();
            let mut id = format!("{host}-{}-{:04x}", std::process::id(), rand::random::<u16>());
            id.truncate(64);
            id
        });
        if !muster_api::is_node_id(&id) {
            return Err(Error::Invalid(format!(
                "worker id `{id}` must be 1 to 64 characters from A-Z a-z 0-9 . _ -"
            )));
        }
        let tracer: Option<muster_trace::ExportConfig> = match self.otlp {
            Some((url, service)) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(Error::Invalid(format!(
                        "the OTLP endpoint `{url}` must be an http:// or https:// URL"
                    )));
                }
                let mut cfg = muster_trace::ExportConfig::new(url, service);
                cfg.resource.push(("service.instance.id".into(), id.clone()));
                cfg.scope = ("muster-client".into(), env!("CARGO_PKG_VERSION").into());
                Some(cfg)
            }
            None => None,
        };
        Ok(Worker {
            shared: Arc::new(Shared {
                tracer: super::trace::Tracer::new(tracer),
                client: self.client,
                queues: self.queues,
                id,
                concurrency: self.concurrency,
                batch: self.batch,
                ttl: self.ttl,
                task_heartbeat: self.task_heartbeat,
                claim_wait: self.claim_wait,
                claim_ack_ms: self.claim_ack.map(|d| d.as_millis() as u64),
                grace: self.grace,
                labels: self.labels,
                handler,
                counters: Counters::default(),
                seen: Mutex::new(Seen::default()),
                adopt_wanted: tokio::sync::Notify::new(),
                held: Mutex::new(Default::default()),
                lease: Lease::new(self.ttl),
            }),
        })
    }
}
