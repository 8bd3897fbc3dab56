//! `muster-client`: a typed client for the REST API, and a [`Worker`] that
//! runs a handler per task with the heartbeats, fencing and shutdown done
//! for it.
//!
//! - [`Client`]: one or several node URLs and a bearer token. Every call goes
//!   through one place ([`Client::send`]), which fails over to the next URL
//!   with backoff on a connect error, a timeout or a 5xx, and never retries
//!   a 4xx. Calls that are not safe to repeat (a claim, a schedule's create)
//!   are retried only when the request never left (connect error) or the
//!   node answered 503, which means nothing was applied or
//!   nothing will be (G12).
//! - [`Error`]: the problem+json fields of an error answer ([`Problem`]), or
//!   why there was no answer.
//! - Typed calls per subsystem ([`types`]): tasks and queues, nodes,
//!   workflows, schedules, barriers, locks and elections, events
//!   ([`Client::events`], [`Client::wait_for_result`]).
//! - [`Worker`] (in [`worker`]): registers a worker id, long-polls claims,
//!   runs the handler with a task heartbeat beside it, completes or fails
//!   with the fencing token, drops the work on 409, honours cancel requests,
//!   and shuts down gracefully.
//!
//! ```no_run
//! # async fn demo() -> Result<(), muster_client::Error> {
//! use muster_client::{Client, Worker};
//! let client = Client::builder().url("http://127.0.0.1:7700").token("s3cret").build()?;
//! Worker::builder(client)
//!     .queue("emails")
//!     .handler(|task, _ctx| async move { Ok(serde_json::json!({"sent": task.payload["to"]})) })
//!     .build()?
//!     .run()
//!     .await?;
//! # Ok(()) }
//! ```

mod api;
mod error;
mod events;
mod tls;
pub mod types;
pub mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use error::{Error, Problem, Result};
pub use events::{EventFrame, EventsOptions};
pub use types::*;
// The answers of each subsystem, defined once in the contract crate.
pub use muster_api::barriers::*;
pub use muster_api::events::*;
pub use muster_api::limits::*;
pub use muster_api::locks::*;
pub use muster_api::nodes::*;
pub use muster_api::schedules::*;
pub use muster_api::system::*;
pub use muster_api::tasks::*;
pub use muster_api::workflows::*;
pub use worker::{CancelReason, Ctx, HandlerError, Permanent, Task, Worker, WorkerBuilder, WorkerStats};

tokio::task_local! {
    /// The W3C `traceparent` every call made in this scope sends.
    static TRACEPARENT: String;
}

/// Runs `fut` with `traceparent` sent (as the `traceparent` header) on
/// every call it makes through a [`Client`]: a task submitted there joins
/// that trace. The worker runs each handler and its reports this way, with
/// its attempt's span.
pub async fn with_traceparent<F: std::future::Future>(traceparent: String, fut: F) -> F::Output {
    TRACEPARENT.scope(traceparent, fut).await
}

/// How a call may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Repeating the call is harmless (reads, fenced writes, keyed submits):
    /// retried on any transient error.
    Idempotent,
    /// Retried on a connect error (the request never left) and on a 503
    /// (the node refused it, or its outcome is unknown and will never
    /// change, G12): a claim.
    Once,
    /// Retried only on a connect error: a create without an idempotency
    /// key, which a retry after an unknown outcome could create twice.
    Connect,
    /// Never retried; one attempt on the current URL.
    Never,
}

/// One call's options beyond method, path and body.
#[derive(Debug, Clone)]
pub struct CallOptions {
    pub retry: Retry,
    /// Added to the client's request timeout (a long poll's wait).
    pub extra_timeout: Duration,
    /// Overrides the client's request timeout.
    pub timeout: Option<Duration>,
    /// Overrides the client's retry budget.
    pub retry_for: Option<Duration>,
    /// Extra headers (an `Idempotency-Key`).
    pub headers: Vec<(&'static str, String)>,
}

impl CallOptions {
    /// Options with this retry policy and the client's defaults otherwise.
    pub fn new(retry: Retry) -> CallOptions {
        CallOptions {
            retry,
            extra_timeout: Duration::ZERO,
            timeout: None,
            retry_for: None,
            headers: Vec::new(),
        }
    }
}

/// A raw answer: the status and the body's bytes.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    /// The base URL that answered.
    pub url: String,
}

impl Answer {
    /// The body as JSON (`Null` when empty or not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// A typed client of one muster cluster. Cheap to clone (one connection
/// pool shared by the clones).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    urls: Vec<String>,
    token: Option<String>,
    /// The URL that answered last: calls start there, so a dead node costs
    /// one failed connect, not one per call.
    current: AtomicUsize,
    timeout: Duration,
    retry_for: Duration,
    backoff_base: Duration,
    backoff_cap: Duration,
    /// Tries that ended in an error that may have hidden their outcome,
    /// whether or not the call was then sent again.
    unknown_outcomes: AtomicU64,
    /// The TLS settings of every call and of the events WebSocket.
    tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("urls", &self.inner.urls)
            .field("token", &self.inner.token.as_ref().map(|_| "***"))
            .finish()
    }
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    urls: Vec<String>,
    token: Option<String>,
    timeout: Duration,
    connect_timeout: Duration,
    retry_for: Duration,
    backoff_base: Duration,
    backoff_cap: Duration,
    /// PEM certificates trusted besides the platform's roots.
    roots: Vec<Vec<u8>>,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            urls: Vec::new(),
            token: None,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            retry_for: Duration::from_secs(30),
            backoff_base: Duration::from_millis(100),
            backoff_cap: Duration::from_secs(2),
            roots: Vec::new(),
        }
    }
}

impl ClientBuilder {
    /// Adds a node's base URL (`http://host:7700`). Several: the client
    /// fails over between them in order.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.urls.push(url.into().trim_end_matches('/').to_string());
        self
    }

    /// Adds several node URLs.
    pub fn urls<I: IntoIterator<Item = S>, S: Into<String>>(mut self, urls: I) -> Self {
        for u in urls {
            self = self.url(u);
        }
        self
    }

    /// The bearer token (a `worker` token for a worker).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// A bearer token if there is one.
    pub fn token_opt(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    /// One request's time limit (a long poll adds its wait). Default 10 s.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// A connect's time limit. Default 2 s.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// How long a call keeps retrying across the URLs before it returns the
    /// last error. Default 30 s; zero: one round over the URLs.
    pub fn retry_for(mut self, d: Duration) -> Self {
        self.retry_for = d;
        self
    }

    /// The first and the largest pause between two rounds over the URLs.
    /// Default 100 ms doubling up to 2 s.
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_cap = cap.max(base);
        self
    }

    /// Trusts the certificates of a PEM bundle for `https://` URLs (and
    /// `wss://` events), besides the platform's roots: a private CA, or a
    /// node's own self-signed certificate.
    pub fn add_root_certificate_pem(mut self, pem: impl AsRef<[u8]>) -> Self {
        self.roots.push(pem.as_ref().to_vec());
        self
    }

    /// Builds the client; fails without a URL, with a URL that is not
    /// `http://` or `https://`, or with an added root that is not a PEM
    /// certificate.
    pub fn build(self) -> Result<Client> {
        if self.urls.is_empty() {
            return Err(Error::Invalid("give at least one node URL".into()));
        }
        for u in &self.urls {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(Error::Invalid(format!("`{u}` is not an http:// or https:// URL")));
            }
        }
        let tls = tls::config(&self.roots)?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls((*tls).clone())
            .tcp_nodelay(true)
            .connect_timeout(self.connect_timeout)
            .pool_max_idle_per_host(256)
            .build()
            .map_err(|e| Error::Invalid(format!("cannot build an HTTP client: {e}")))?;
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                urls: self.urls,
                token: self.token,
                current: AtomicUsize::new(0),
                timeout: self.timeout,
                retry_for: self.retry_for,
                backoff_base: self.backoff_base,
                backoff_cap: self.backoff_cap,
                unknown_outcomes: AtomicU64::new(0),
                tls,
            }),
        })
    }
}

impl Client {
    /// A builder: add URLs, a token, timeouts.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// A client of one node with an optional token and the defaults.
    pub fn new(url: &str, token: Option<String>) -> Result<Client> {
        Client::builder().url(url).token_opt(token).build()
    }

    /// The node URLs, in failover order.
    pub fn urls(&self) -> &[String] {
        &self.inner.urls
    }

    /// How many tries ended in an error that may have hidden their outcome
    /// (a timeout, a 5xx, a connection lost after the request left), whether
    /// the call was then sent again or the error returned: such a try may
    /// have been applied and its answer lost. A worker that sees this grow
    /// looks for tasks claimed for it whose answers never arrived.
    pub fn unknown_outcomes(&self) -> u64 {
        self.inner.unknown_outcomes.load(Ordering::Relaxed)
    }

    /// The URL calls start at (the one that answered last).
    pub fn current_url(&self) -> &str {
        &self.inner.urls[self.inner.current.load(Ordering::Relaxed) % self.inner.urls.len()]
    }

    pub(crate) fn tls(&self) -> Arc<rustls::ClientConfig> {
        self.inner.tls.clone()
    }

    pub(crate) fn token(&self) -> Option<&str> {
        self.inner.token.as_deref()
    }

    /// The one place every call goes through: sends `body` (already JSON)
    /// to `path` on the current URL, failing over to the next on a connect
    /// error, a timeout or a 5xx as `opts.retry` allows, with backoff
    /// after each round over the URLs, until `retry_for` has passed.
    /// Returns the first answer below 500 whatever its status, or the last
    /// error.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
        opts: &CallOptions,
    ) -> Result<Answer> {
        let n = self.inner.urls.len();
        let start = self.inner.current.load(Ordering::Relaxed);
        let deadline = Instant::now() + opts.retry_for.unwrap_or(self.inner.retry_for);
        let timeout = opts.timeout.unwrap_or(self.inner.timeout) + opts.extra_timeout;
        let mut backoff = self.inner.backoff_base;
        let mut attempt = 0usize;
        loop {
            let i = (start + attempt) % n;
            let base = &self.inner.urls[i];
            let mut req = self
                .inner
                .http
                .request(method.clone(), format!("{base}{path}"))
                .timeout(timeout);
            if let Some(t) = &self.inner.token {
                req = req.bearer_auth(t);
            }
            for (k, v) in &opts.headers {
                req = req.header(*k, v);
            }
            if let Ok(tp) = TRACEPARENT.try_with(String::clone) {
                req = req.header("traceparent", tp);
            }
            if let Some(b) = &body {
                req = req.header("content-type", "application/json").body(b.clone());
            }
            let (err, retriable, maybe_applied) = match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    match resp.bytes().await {
                        Ok(bytes) if status < 500 => {
                            let bytes = bytes.to_vec();
                            if i != start {
                                self.inner.current.store(i, Ordering::Relaxed);
                            }
                            return Ok(Answer {
                                status,
                                body: bytes,
                                url: base.clone(),
                            });
                        }
                        Ok(bytes) => {
                            let retriable = match opts.retry {
                                Retry::Idempotent => true,
                                Retry::Once => status == 503,
                                Retry::Connect | Retry::Never => false,
                            };
                            (Problem::from_body(status, &bytes).into(), retriable, true)
                        }
                        Err(e) => (
                            Error::Unreachable {
                                url: base.clone(),
                                message: format!("reading the answer: {e}"),
                            },
                            opts.retry == Retry::Idempotent,
                            true,
                        ),
                    }
                }
                Err(e) => {
                    let retriable = match opts.retry {
                        Retry::Idempotent => true,
                        Retry::Once | Retry::Connect => e.is_connect(),
                        Retry::Never => false,
                    };
                    (
                        Error::Unreachable {
                            url: base.clone(),
                            message: error_chain(&e),
                        },
                        retriable,
                        !e.is_connect(),
                    )
                }
            };
            attempt += 1;
            if maybe_applied {
                // Counted whether or not the call is sent again: a claim
                // whose read timed out is not retried, and its tasks may
                // be running under the caller's id all the same.
                self.inner.unknown_outcomes.fetch_add(1, Ordering::Relaxed);
            }
            let now = Instant::now();
            if !retriable || (now >= deadline && attempt >= n) {
                // Next time start at the URL after the one that failed.
                if n > 1 {
                    self.inner.current.store((i + 1) % n, Ordering::Relaxed);
                }
                return Err(err);
            }
            tracing::debug!(url = %base, error = %err, "muster client: retrying");
            if attempt.is_multiple_of(n) {
                tokio::time::sleep(backoff.min(deadline.saturating_duration_since(now))).await;
                backoff = (backoff * 2).min(self.inner.backoff_cap);
            }
        }
    }

    /// Sends a call and returns its raw answer whatever the status (below
    /// 500, or 5xx once retries ran out). For the CLI and the bench, which
    /// branch on the status themselves.
    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
        opts: &CallOptions,
    ) -> Result<Answer> {
        let body = body.map(|b| serde_json::to_vec(b).unwrap_or_default());
        match self.send(method, path, body, opts).await {
            Ok(a) => Ok(a),
            Err(Error::Api(p)) => Ok(Answer {
                status: p.status,
                body: serde_json::to_vec(&problem_json(&p)).unwrap_or_default(),
                url: self.current_url().to_string(),
            }),
            Err(e) => Err(e),
        }
    }

    /// A typed call: `Ok(None)` for 204, the decoded body for 2xx, and
    /// [`Error::Api`] for any other status.
    pub async fn call<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
        opts: &CallOptions,
    ) -> Result<Option<T>> {
        let body = match body {
            Some(b) => Some(serde_json::to_vec(b).map_err(|e| Error::Invalid(format!("cannot encode the body: {e}")))?),
            None => None,
        };
        let a = self.send(method, path, body, opts).await?;
        if a.status == 204 {
            return Ok(None);
        }
        if !(200..300).contains(&a.status) {
            return Err(Problem::from_body(a.status, &a.body).into());
        }
        serde_json::from_slice(&a.body).map(Some).map_err(|e| Error::Decode {
            url: a.url,
            message: format!("{e} in {}", String::from_utf8_lossy(&a.body[..a.body.len().min(200)])),
        })
    }

    /// [`Client::call`] for an operation that answers with a body; a 204
    /// reads as JSON `null` (so `Value` answers accept it, structs do not).
    pub(crate) async fn call_json<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
        opts: &CallOptions,
    ) -> Result<T> {
        match self.call(method, path, body, opts).await? {
            Some(t) => Ok(t),
            None => serde_json::from_value(serde_json::Value::Null).map_err(|_| Error::Decode {
                url: self.current_url().to_string(),
                message: "204 No Content where a body was expected".into(),
            }),
        }
    }
}

/// The problem as JSON again (for [`Client::raw`]).
fn problem_json(p: &Problem) -> serde_json::Value {
    let mut m = p.extra.clone();
    m.insert("type".into(), p.kind.clone().into());
    m.insert("title".into(), p.title.clone().into());
    m.insert("status".into(), p.status.into());
    m.insert("detail".into(), p.detail.clone().into());
    if let Some(r) = &p.request_id {
        m.insert("request_id".into(), r.clone().into());
    }
    serde_json::Value::Object(m)
}

/// An error with its sources (reqwest's own message is often just
/// "error sending request").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Percent-encodes a path segment or query value.
pub(crate) fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
