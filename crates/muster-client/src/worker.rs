//! [`Worker`]: a worker loop that is correct by construction.
//!
//! What it guarantees (each has a test in `tests/it/client.rs`):
//!
//! - **Registered while it holds work.** The worker id is registered with
//!   `PUT /api/v1/nodes/{id}/heartbeat` before the first claim and every
//!   third of its ttl after; if the process dies, the heartbeat stops and
//!   the cluster recovers its tasks within `ttl + orphans.interval_ms` (G3).
//! - **One task heartbeat per running task**, beside the handler, with the
//!   fencing token and the progress the handler reported.
//! - **Claims acknowledged, at no cost on the hot path.** A claimed task
//!   must be acknowledged within its claim lease (`ack_ms` in the claim's
//!   answer, the server's `claim.ack_ms` by default) or the server puts it
//!   back in its queue. A task that finishes sooner is acknowledged by its
//!   complete or fail: no call is added. A handler still running at a
//!   third of the lease is acknowledged by the task's first heartbeat,
//!   sent then if `task_heartbeat` is longer. An adopted task (see *Lost
//!   answers*) is acknowledged before it starts.
//! - **Fenced results, never twice.** A task is completed or failed with the
//!   token of its claim. A 409 from a heartbeat means the task was taken
//!   from this worker, a 404 that it is gone: the handler's
//!   [`CancellationToken`] is cancelled ([`CancelReason::Lost`]) and its
//!   result is dropped: no complete or fail is sent. A 409 from the complete itself is resolved by reading
//!   the task (it may be this worker's own complete, applied before a lost
//!   answer); otherwise the result is dropped.
//! - **Its own lease.** The worker keeps its registration lease on the
//!   monotonic clock, from the send time of its newest registration
//!   heartbeat that succeeded; it lapses `ttl` less a margin of
//!   `max(ttl / 10, 100 ms)` after that, before the cluster can take the
//!   worker for dead. Then every running handler is cancelled
//!   ([`CancelReason::LeaseExpired`]) and nothing is claimed (a task whose
//!   claim is answered meanwhile is not started) until a heartbeat
//!   succeeds again; then the worker looks for tasks held under its id
//!   that it did not start (see *Lost answers*). A cancelled handler's
//!   outcome is still reported with its token: it counts if the task was
//!   not recovered meanwhile, and is refused (409) and dropped if it was.
//!   So a worker cut off from every node stops its handlers before another
//!   worker can get their tasks. Local bookkeeping only: no call is added.
//! - **Cancel requests.** When a heartbeat says a cancel was requested, the
//!   handler's token is cancelled ([`CancelReason::CancelRequested`]); an
//!   `Err` from it then fails the task without retry, which the server
//!   records as cancelled, and an `Ok` completes it with its result (the
//!   work happened). The Python and TypeScript workers do the same.
//! - **Transient errors** (a node down, 503, timeouts) are retried with
//!   backoff across the client's URLs; a complete or fail is retried until
//!   it is applied, refused (409) or the worker is stopped hard.
//! - **One call per task.** With `batch` 1 (the default) a complete also
//!   claims the slot's next task (`next` in the same call), so a busy
//!   worker makes one call per task, not two; the long-polling claim runs
//!   only when that found nothing.
//! - **Completes together.** With `batch` above 1, results that finish
//!   together are completed in one `POST /api/v1/tasks/complete` (up to
//!   `batch` per call); an item refused with 409 is resolved like a single
//!   complete's 409.
//! - **Lost answers.** A claim (or a complete's next task) applied by a node
//!   whose answer never arrived leaves a task running under this worker's
//!   id with a token it never saw. Whenever a try of a call ended in an
//!   error that may have hidden its outcome (a read timeout, a 5xx, a
//!   connection lost after the request left: [`Client::unknown_outcomes`]),
//!   whether it was retried or not, and once at start (a worker restarted
//!   under the same id), the worker lists its queues' running tasks and
//!   runs those held under its id with an unseen token, or hands them back
//!   (`fail`, retry) when no slot is free; it never starts a token twice.
//!   It looks 500 ms after it is asked and again 2.5 s after, for a
//!   request held on the way longer than its timeout and applied after
//!   the first look; a look whose list call fails is tried again with
//!   backoff until one succeeds.
//!   Two live workers must never share an id.
//! - **Graceful shutdown** ([`Worker::run_until`], [`Worker::run`] on SIGTERM
//!   or ctrl-c): stop claiming (a claim already in flight is awaited, never
//!   dropped, so no claimed task is lost on the way), let the running
//!   handlers finish within the grace period, then cancel the rest
//!   ([`CancelReason::Shutdown`]) and hand their tasks back (`fail` with
//!   retry, which uses up one attempt), stop heartbeating and leave
//!   (`POST /api/v1/nodes/{id}/leave`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::types::{ClaimRequest, Complete, CompleteItem, Fail, NextRequest, NodeHeartbeat, TaskHeartbeat};
use super::{Client, Result};
use muster_api::nodes::NodeHeartbeatAnswer;
use muster_api::tasks::{ClaimedTask, CompleteOutcome, FinishedNext};

mod builder;
mod complete;
mod lease;
mod run;
mod tokens;
mod trace;
pub use builder::WorkerBuilder;
use lease::{Lease, lease_loop};
use run::{adopter, claim_loop, registration_loop};
use tokens::Seen;

/// The task a handler gets: what the claim returned.
pub type Task = ClaimedTask;

/// What a handler may fail with: any error. Wrap it in [`Permanent`] to
/// fail the task without a retry.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A handler error that must not be retried: the task goes dead at once.
#[derive(Debug)]
pub struct Permanent(pub String);

impl Permanent {
    /// A permanent failure with this message, as a [`HandlerError`].
    pub fn error(msg: impl Into<String>) -> HandlerError {
        Box::new(Permanent(msg.into()))
    }
}

impl std::fmt::Display for Permanent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Permanent {}

/// Why a handler's token was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// A heartbeat got 409 (the task was recovered from this worker, or
    /// timed out, and may run elsewhere) or 404 (the task is gone). Its
    /// result will be dropped.
    Lost,
    /// This worker's own registration lease lapsed: no registration
    /// heartbeat succeeded for its `ttl` less a margin (`max(ttl / 10,
    /// 100 ms)`), so the cluster may soon take it for dead and hand the task
    /// to another worker. Stop. What the handler returns is still reported
    /// with the task's token: it counts if the task was not recovered
    /// meanwhile (an `Err` fails it for a retry), and is refused and
    /// dropped if it was.
    LeaseExpired,
    /// Someone asked the task to stop (`POST /api/v1/tasks/{id}/cancel`).
    /// Return an `Err` and the task ends cancelled.
    CancelRequested,
    /// The worker is shutting down and the grace period is over; the task
    /// is handed back.
    Shutdown,
}

/// The handler's view of its task's execution: cancellation and progress.
#[derive(Clone)]
pub struct Ctx {
    inner: Arc<CtxInner>,
}

struct CtxInner {
    cancel: CancellationToken,
    reason: OnceLock<CancelReason>,
    /// 0 to 100; 255: nothing reported since the last heartbeat.
    progress: AtomicU8,
    fields: Mutex<Option<Value>>,
    worker_id: String,
    /// The attempt's span, as a `traceparent`.
    traceparent: Option<String>,
}

impl Ctx {
    fn new(worker_id: &str, traceparent: Option<String>) -> Ctx {
        Ctx {
            inner: Arc::new(CtxInner {
                cancel: CancellationToken::new(),
                reason: OnceLock::new(),
                progress: AtomicU8::new(u8::MAX),
                fields: Mutex::new(None),
                worker_id: worker_id.to_string(),
                traceparent,
            }),
        }
    }

    /// The W3C `traceparent` of this attempt's span (a child of the task's
    /// trace context), when the task has one: pass it on to what the
    /// handler calls. Calls through the [`Client`](crate::Client) from the
    /// handler carry it already.
    pub fn traceparent(&self) -> Option<&str> {
        self.inner.traceparent.as_deref()
    }

    /// Cancelled when the handler should stop: see [`Ctx::cancel_reason`].
    pub fn token(&self) -> &CancellationToken {
        &self.inner.cancel
    }

    /// Resolves when the handler should stop.
    pub async fn cancelled(&self) {
        self.inner.cancel.cancelled().await
    }

    /// Whether the handler should stop.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// Why the handler should stop, once it should.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.inner.reason.get().copied()
    }

    /// Reports progress (0 to 100, clamped); sent with the next heartbeat.
    pub fn progress(&self, percent: u8) {
        self.inner.progress.store(percent.min(100), Ordering::Relaxed);
    }

    /// Sets the task's runtime fields (a small JSON object, at most 4 KiB);
    /// sent with the next heartbeat.
    pub fn set_fields(&self, fields: Value) {
        *self.inner.fields.lock().unwrap_or_else(|e| e.into_inner()) = Some(fields);
    }

    /// The worker id the task is claimed for.
    pub fn worker_id(&self) -> &str {
        &self.inner.worker_id
    }

    fn cancel(&self, why: CancelReason) {
        let _ = self.inner.reason.set(why);
        self.inner.cancel.cancel();
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type Handler = Arc<dyn Fn(Task, Ctx) -> BoxFuture<Result<Value, HandlerError>> + Send + Sync>;

/// What a worker did so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Tasks claimed.
    pub claimed: u64,
    /// Tasks completed (the server accepted the complete).
    pub completed: u64,
    /// Tasks failed (for a retry, dead or cancelled).
    pub failed: u64,
    /// Results dropped because the token was stale (409).
    pub dropped: u64,
    /// Handlers cancelled on a cancel request.
    pub cancel_requests: u64,
    /// Tasks handed back at shutdown after the grace period.
    pub handed_back: u64,
    /// Handlers that panicked (their tasks were failed for a retry).
    pub panicked: u64,
    /// Tasks claimed for this worker whose claim's answer was lost, found
    /// and run (see the module docs).
    pub adopted: u64,
    /// Times its registration lease lapsed (every running handler was
    /// cancelled with [`CancelReason::LeaseExpired`]).
    pub lease_lapses: u64,
}

#[derive(Default)]
struct Counters {
    claimed: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    cancel_requests: AtomicU64,
    handed_back: AtomicU64,
    panicked: AtomicU64,
    adopted: AtomicU64,
    lease_lapses: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> WorkerStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WorkerStats {
            claimed: g(&self.claimed),
            completed: g(&self.completed),
            failed: g(&self.failed),
            dropped: g(&self.dropped),
            cancel_requests: g(&self.cancel_requests),
            handed_back: g(&self.handed_back),
            panicked: g(&self.panicked),
            adopted: g(&self.adopted),
            lease_lapses: g(&self.lease_lapses),
        }
    }
}

fn inc(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// A worker: claims tasks from its queues and runs the handler on each.
/// See the [module docs](self) for what it guarantees.
pub struct Worker {
    shared: Arc<Shared>,
}

struct Shared {
    client: Client,
    queues: Vec<String>,
    id: String,
    concurrency: usize,
    batch: u32,
    ttl: Duration,
    task_heartbeat: Duration,
    claim_wait: Duration,
    /// The claim lease its claims ask for (None: the server's).
    claim_ack_ms: Option<u64>,
    grace: Duration,
    labels: std::collections::BTreeMap<String, String>,
    handler: Handler,
    counters: Counters,
    /// Tokens this worker started (claimed, chained or adopted): never
    /// started twice.
    seen: Mutex<Seen>,
    /// Wakes the adopter (see `run::adopter`).
    adopt_wanted: tokio::sync::Notify,
    /// Tokens of tasks this worker runs, or whose outcome it could not
    /// report (the task may still run under them on the server): never
    /// adopted, whatever `seen` has forgotten.
    held: Mutex<std::collections::HashSet<u64>>,
    /// The registration lease, on this process's clock.
    lease: Lease,
    /// The span exporter, when the builder was given an OTLP endpoint
    /// (started on the first run: building needs no runtime).
    tracer: trace::Tracer,
}

/// Tokens a run hands to its parts.
#[derive(Clone)]
struct Run {
    /// Stop claiming (shutdown started).
    stop_claiming: CancellationToken,
    /// The grace period is over: cancel handlers and hand tasks back.
    hard_stop: CancellationToken,
    /// The run was dropped (its future aborted, the process going down):
    /// every loop and handler it spawned stops at once, reporting nothing,
    /// as if the process had died.
    killed: CancellationToken,
    slots: Arc<Semaphore>,
    /// With `batch` above 1: where results go to be completed together.
    completes: Option<tokio::sync::mpsc::Sender<complete::Pending>>,
}

impl Worker {
    /// A builder for a worker using `client`.
    pub fn builder(client: Client) -> WorkerBuilder {
        WorkerBuilder::new(client)
    }

    /// The worker id it registers and claims as.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// What it did so far.
    pub fn stats(&self) -> WorkerStats {
        self.shared.counters.snapshot()
    }

    /// Runs until SIGTERM or ctrl-c, then shuts down gracefully.
    pub async fn run(&self) -> Result<WorkerStats> {
        self.run_until(shutdown_signal()).await
    }

    /// Runs until `shutdown` resolves, then stops claiming, lets running
    /// handlers finish within the grace period, hands back what is left,
    /// and leaves. Fails only when the worker cannot register at all (a
    /// 4xx: a bad token, too many nodes).
    pub async fn run_until(&self, shutdown: impl Future<Output = ()>) -> Result<WorkerStats> {
        let s = &self.shared;
        let hard_stop = CancellationToken::new();
        let killed = CancellationToken::new();
        let _kill_on_drop = killed.clone().drop_guard();
        let completes = (s.batch > 1).then(|| {
            let (tx, completer) = complete::channel(self.shared.clone(), hard_stop.clone());
            let killed = killed.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = completer => {}
                    _ = killed.cancelled() => {}
                }
            });
            tx
        });
        let run = Run {
            stop_claiming: CancellationToken::new(),
            hard_stop,
            killed,
            slots: Arc::new(Semaphore::new(s.concurrency)),
            completes,
        };
        tokio::pin!(shutdown);

        // 1. Register (retrying transient errors) before the first claim.
        let mut backoff = Duration::from_millis(100);
        loop {
            tokio::select! {
                r = s.beat() => match r {
                    Ok(_) => break,
                    Err(e) if e.is_transient() => tracing::warn!(worker = %s.id, error = %e, "cannot register; retrying"),
                    Err(e) => return Err(e),
                },
                _ = &mut shutdown => return Ok(self.stats()),
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = &mut shutdown => return Ok(self.stats()),
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }

        // 2. Keep the registration alive until the very end.
        let heartbeats_done = CancellationToken::new();
        let registration = tokio::spawn(registration_loop(
            self.shared.clone(),
            heartbeats_done.clone(),
            run.killed.clone(),
        ));
        let lease = tokio::spawn(lease_loop(
            self.shared.clone(),
            heartbeats_done.clone(),
            run.killed.clone(),
        ));

        // 3. One long-polling claim loop per queue.
        let claimers: Vec<_> = s
            .queues
            .iter()
            .map(|q| tokio::spawn(claim_loop(self.shared.clone(), q.clone(), run.clone())))
            .collect();

        // A restarted worker may hold tasks under its id from its last run.
        s.adopt_soon();
        let adopter = tokio::spawn(adopter(self.shared.clone(), run.clone()));

        // 4. Shutdown: stop claiming; the claims in flight are awaited so no
        // claimed task is lost on the way.
        shutdown.await;
        tracing::info!(worker = %s.id, "shutting down: no more claims, finishing running tasks");
        run.stop_claiming.cancel();
        for c in claimers {
            let _ = c.await;
        }
        let _ = adopter.await;
        // 5. Running handlers finish within the grace period; then they are
        // cancelled and their tasks handed back.
        let all = s.concurrency as u32;
        if tokio::time::timeout(s.grace, run.slots.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!(worker = %s.id, grace = ?s.grace, "grace period over: handing back running tasks");
            run.hard_stop.cancel();
            let _ = run.slots.acquire_many(all).await;
        }
        // 6. Leave: stop heartbeating and remove the registration (a worker
        // token suffices; if the call fails the registration expires after
        // its ttl, holding nothing).
        heartbeats_done.cancel();
        let _ = registration.await;
        let _ = lease.await;
        let _ = s.client.leave_worker(&s.id).await;
        // 7. The attempts' spans still queued go out.
        s.tracer.flush().await;
        Ok(self.stats())
    }
}

fn registration_of(s: &Shared) -> NodeHeartbeat {
    NodeHeartbeat {
        ttl_ms: Some(s.ttl.as_millis() as u64),
        labels: s.labels.clone(),
        addr: String::new(),
        version: format!("muster-client {}", env!("CARGO_PKG_VERSION")),
    }
}

/// SIGTERM or ctrl-c.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
