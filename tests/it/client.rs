//! `muster::client` and its `Worker` against real nodes and a real Redis:
//! exactly-once completion across a node killed and restarted, a killed
//! worker's task recovered and won by the next worker, graceful shutdown,
//! a stale token cancelling the handler, cancel requests, problem+json
//! errors, failover between URLs, the event stream's resume and
//! `wait_for_result`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use muster::client::{CancelReason, Client, EventFrame, EventsOptions, HandlerError, Permanent, TaskSpec, Worker};
use serde_json::{Value, json};

use crate::common::*;

/// A node on a fixed port, so a restarted node answers at the same URL.
struct FixedNode {
    running: Option<muster::Running>,
    port: u16,
    _dir: tempfile::TempDir,
}

impl FixedNode {
    async fn start(redis: &TestRedis, port: u16) -> FixedNode {
        let dir = tempfile::Builder::new().prefix("muster-node").tempdir().unwrap();
        let cfg = redis.test_config(dir.path());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let running = muster::start(cfg, listener).await.expect("node starts");
        FixedNode {
            running: Some(running),
            port,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops without leaving, as a crash would.
    async fn kill(&mut self) {
        if let Some(r) = self.running.take() {
            r.kill().await;
        }
    }
}

impl Drop for FixedNode {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.cancel_token().cancel();
        }
    }
}

fn client(urls: &[String]) -> Client {
    Client::builder()
        .urls(urls.iter().cloned())
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_millis(500))
        .retry_for(Duration::from_secs(10))
        .backoff(Duration::from_millis(20), Duration::from_millis(300))
        .build()
        .unwrap()
}

/// A task spec with a payload and options.
fn spec(payload: Value, timeout_ms: u64) -> TaskSpec {
    TaskSpec {
        payload,
        timeout_ms: Some(timeout_ms),
        backoff_base_ms: Some(10),
        backoff_cap_ms: Some(50),
        ..Default::default()
    }
}

async fn wait_for(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    wait_until(within, || std::future::ready(cond())).await
}

/// 1 000 tasks through one Worker over two nodes; one node is killed and
/// restarted mid-way. Every task is completed exactly once: the worker's
/// accepted completions are exactly 1 000, every task is succeeded with
/// exactly one succeeded attempt, and a handler ran twice only for a task
/// the cluster itself recovered (its result was dropped, not sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_completes_each_task_once_while_a_node_is_killed_and_restarted() {
    let redis = TestRedis::start();
    let mut a = FixedNode::start(&redis, free_port()).await;
    let b = FixedNode::start(&redis, free_port()).await;
    let urls = vec![a.url(), b.url()];
    let c = client(&urls);
    let queue = "client-ha";
    let mut ids = Vec::new();
    for chunk in 0..2 {
        let specs: Vec<TaskSpec> = (0..500).map(|i| spec(json!({"i": chunk * 500 + i}), 5_000)).collect();
        for r in c.submit_batch(queue, &specs).await.unwrap() {
            assert_eq!(r.status, "created", "{r:?}");
            ids.push(r.id.unwrap());
        }
    }
    let runs: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let handled = Arc::new(AtomicU64::new(0));
    let worker = {
        let (runs, handled) = (runs.clone(), handled.clone());
        Arc::new(
            Worker::builder(c.clone())
                .queue(queue)
                .id("w-ha")
                .concurrency(8)
                .batch(8)
                .ttl(Duration::from_secs(3))
                .task_heartbeat(Duration::from_millis(300))
                .claim_wait(Duration::from_millis(300))
                .handler(move |task, _ctx| {
                    let (runs, handled) = (runs.clone(), handled.clone());
                    async move {
                        *runs.lock().unwrap().entry(task.id.clone()).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        handled.fetch_add(1, Ordering::Relaxed);
                        Ok(json!({"i": task.payload["i"]}))
                    }
                })
                .build()
                .unwrap(),
        )
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn({
        let w = worker.clone();
        async move { w.run_until(async { stop_rx.await.unwrap_or(()) }).await }
    });

    assert!(wait_for(Duration::from_secs(30), || handled.load(Ordering::Relaxed) >= 250).await);
    let port = a.port;
    let done_at_kill = worker.stats().completed;
    a.kill().await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let done_while_down = worker.stats().completed;
    a = FixedNode::start(&redis, port).await;
    assert!(
        wait_for(Duration::from_secs(45), || worker.stats().completed >= 1000).await,
        "stuck at {:?}",
        worker.stats()
    );
    let _ = stop_tx.send(());
    let stats = run.await.unwrap().unwrap();
    assert_eq!(stats.completed, 1000, "{stats:?}");
    assert_eq!(stats.failed, 0, "{stats:?}");
    // (The other node may have served the rest while this one was down: a
    // fast run did all 1 000 in those 700 ms, on 2026-12-04.)
    assert!(done_at_kill < 1000, "the kill happened mid-way");

    // The server's view: every task succeeded, with exactly one succeeded attempt.
    let runs = runs.lock().unwrap().clone();
    let mut recovered = 0;
    for id in &ids {
        let t = c.task(id).await.unwrap();
        assert_eq!(t.state, "succeeded", "{t:?}");
        let wins = t
            .attempt_log
            .iter()
            .filter(|at| at.outcome.as_deref() == Some("succeeded"))
            .count();
        assert_eq!(wins, 1, "{t:?}");
        let n = runs.get(id).copied().unwrap_or(0);
        assert!(n >= 1, "task {id} never reached the handler");
        if n > 1 {
            // Ran again only because the cluster took it back (a claim whose
            // answer died with the node, recovered by its timeout).
            assert!(t.attempts as usize >= n as usize, "{t:?} ran {n} times");
            recovered += 1;
        }
    }
    // Every run came from a claim the worker got, or from one whose answer
    // died with the node and that it found and adopted.
    assert_eq!(
        (stats.claimed + stats.adopted) as usize,
        runs.values().map(|n| *n as usize).sum::<usize>(),
        "{stats:?}"
    );
    let q = c.queue(queue).await.unwrap();
    assert_eq!((q.stats.succeeded, q.stats.running, q.stats.queued), (1000, 0, 0));
    eprintln!(
        "{stats:?}; {recovered} tasks recovered by the cluster and run again; {done_while_down} done when the node came back"
    );
    drop(a);
}

/// A worker killed mid-task (its future dropped: no complete, no fail, no
/// more heartbeats) has its task recovered by the cluster, and the second
/// worker's result is the task's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_task_is_recovered_and_the_second_worker_wins() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(std::slice::from_ref(&app.url));
    let id = c.submit("client-kill", &spec(json!("x"), 0)).await.unwrap().id;
    let started = Arc::new(AtomicU64::new(0));
    let w1 = Worker::builder(c.clone())
        .queue("client-kill")
        .id("w-kill-1")
        .ttl(Duration::from_millis(800))
        .claim_wait(Duration::from_millis(200))
        .handler({
            let started = started.clone();
            move |_t, _ctx| {
                started.fetch_add(1, Ordering::Relaxed);
                async move {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok(json!("w1"))
                }
            }
        })
        .build()
        .unwrap();
    let run1 = tokio::spawn(async move { w1.run_until(std::future::pending()).await });
    assert!(wait_for(Duration::from_secs(5), || started.load(Ordering::Relaxed) == 1).await);
    run1.abort();
    let _ = run1.await;

    let w2 = Worker::builder(c.clone())
        .queue("client-kill")
        .id("w-kill-2")
        .claim_wait(Duration::from_millis(200))
        .handler(|_t, _ctx| async { Ok(json!("w2")) })
        .build()
        .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let run2 = tokio::spawn(async move { w2.run_until(async { rx.await.unwrap_or(()) }).await });
    let t = c.wait_for_result(&id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(t.state, "succeeded", "{t:?}");
    assert_eq!(t.result, Some(json!("w2")));
    assert_eq!(t.attempt_log.len(), 2, "{t:?}");
    assert_eq!(t.attempt_log[0].node, "w-kill-1");
    assert_eq!(t.attempt_log[0].outcome.as_deref(), Some("orphaned"), "{t:?}");
    assert_eq!(t.attempt_log[1].node, "w-kill-2");
    let _ = tx.send(());
    let stats = run2.await.unwrap().unwrap();
    assert_eq!(stats.completed, 1);
    assert_eq!(
        started.load(Ordering::Relaxed),
        1,
        "the killed worker's handler ran once, then stopped"
    );
}

/// Shutdown during work: no more claims, the running handlers finish and
/// their tasks complete, then the worker leaves. A handler that outlives
/// the grace period is cancelled and its task handed back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_tasks_and_leaves() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(std::slice::from_ref(&app.url));
    let q = "client-shutdown";
    let mut first = Vec::new();
    for i in 0..3 {
        first.push(c.submit(q, &spec(json!(i), 0)).await.unwrap().id);
    }
    let running = Arc::new(AtomicU64::new(0));
    let worker = Arc::new(
        Worker::builder(c.clone())
            .queue(q)
            .id("w-shut")
            .concurrency(3)
            .batch(3)
            .claim_wait(Duration::from_millis(300))
            .grace(Duration::from_secs(5))
            .handler({
                let running = running.clone();
                move |_t, _ctx| {
                    let running = running.clone();
                    async move {
                        running.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(800)).await;
                        Ok(json!("done"))
                    }
                }
            })
            .build()
            .unwrap(),
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn({
        let w = worker.clone();
        async move { w.run_until(async { rx.await.unwrap_or(()) }).await }
    });
    assert!(wait_for(Duration::from_secs(5), || running.load(Ordering::Relaxed) == 3).await);
    let t0 = Instant::now();
    let _ = tx.send(());
    // Submitted after the shutdown began: never claimed.
    let late = c.submit(q, &spec(json!("late"), 0)).await.unwrap().id;
    let stats = run.await.unwrap().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(
        (stats.claimed, stats.completed, stats.handed_back),
        (3, 3, 0),
        "{stats:?}"
    );
    for id in &first {
        assert_eq!(c.task(id).await.unwrap().state, "succeeded");
    }
    assert_eq!(c.task(&late).await.unwrap().state, "queued");
    // It left: its registration is gone (`POST /api/v1/nodes/{id}/leave`,
    // which a worker token may call).
    let gone = match c.node("w-shut").await {
        Err(e) => e.is_not_found(),
        Ok(_) => false,
    };
    assert!(gone, "the worker is still registered");

    // Past the grace period: cancelled and handed back for a retry.
    let reason: Arc<Mutex<Option<CancelReason>>> = Arc::default();
    let slow = Worker::builder(c.clone())
        .queue(q)
        .id("w-slow")
        .claim_wait(Duration::from_millis(200))
        .grace(Duration::from_millis(300))
        .handler({
            let reason = reason.clone();
            move |_t, ctx| {
                let reason = reason.clone();
                async move {
                    ctx.cancelled().await;
                    *reason.lock().unwrap() = ctx.cancel_reason();
                    Err::<Value, HandlerError>("stopped".into())
                }
            }
        })
        .build()
        .unwrap();
    let stop = async { tokio::time::sleep(Duration::from_millis(500)).await };
    let stats = slow.run_until(stop).await.unwrap();
    assert_eq!(
        (stats.claimed, stats.handed_back, stats.completed),
        (1, 1, 0),
        "{stats:?}"
    );
    let t = c.task(&late).await.unwrap();
    assert!(t.state == "queued" || t.state == "delayed", "{t:?}");
    assert_eq!(t.attempts, 1, "{t:?}");
}

/// A stale token (the task timed out and was claimed again elsewhere while
/// the first handler still ran) cancels the first handler as `Lost` and its
/// result is never sent: the second worker's result wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_token_cancels_the_handler_instead_of_completing_twice() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(std::slice::from_ref(&app.url));
    let q = "client-stale";
    let id = c.submit(q, &spec(json!("x"), 600)).await.unwrap().id;
    let seen: Arc<Mutex<Option<(CancelReason, Duration)>>> = Arc::default();
    let w1 = Arc::new(
        Worker::builder(c.clone())
            .queue(q)
            .id("w-stale-1")
            .task_heartbeat(Duration::from_millis(100))
            .claim_wait(Duration::from_millis(200))
            .handler({
                let seen = seen.clone();
                move |_t, ctx| {
                    let seen = seen.clone();
                    async move {
                        let t0 = Instant::now();
                        let _ = tokio::time::timeout(Duration::from_secs(8), ctx.cancelled()).await;
                        if let Some(r) = ctx.cancel_reason() {
                            *seen.lock().unwrap() = Some((r, t0.elapsed()));
                        }
                        // Whatever it returns must not be sent.
                        Ok(json!("w1"))
                    }
                }
            })
            .build()
            .unwrap(),
    );
    let (tx1, rx1) = tokio::sync::oneshot::channel::<()>();
    let run1 = tokio::spawn({
        let w = w1.clone();
        async move { w.run_until(async { rx1.await.unwrap_or(()) }).await }
    });
    assert!(wait_for(Duration::from_secs(5), || w1.stats().claimed == 1).await);
    // The first worker stops claiming, so the retry goes to the second.
    let _ = tx1.send(());
    let w2 = Worker::builder(c.clone())
        .queue(q)
        .id("w-stale-2")
        .claim_wait(Duration::from_millis(200))
        .handler(|_t, _ctx| async { Ok(json!("w2")) })
        .build()
        .unwrap();
    let (tx2, rx2) = tokio::sync::oneshot::channel::<()>();
    let run2 = tokio::spawn(async move { w2.run_until(async { rx2.await.unwrap_or(()) }).await });

    let stats1 = run1.await.unwrap().unwrap();
    let (reason, after) = seen.lock().unwrap().expect("the first handler was cancelled");
    assert_eq!(reason, CancelReason::Lost);
    assert!(after < Duration::from_secs(3), "cancelled only after {after:?}");
    assert_eq!((stats1.completed, stats1.dropped), (0, 1), "{stats1:?}");
    let t = c.wait_for_result(&id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(t.result, Some(json!("w2")), "{t:?}");
    let wins = t
        .attempt_log
        .iter()
        .filter(|a| a.outcome.as_deref() == Some("succeeded"))
        .count();
    assert_eq!(wins, 1, "{t:?}");
    let _ = tx2.send(());
    assert_eq!(run2.await.unwrap().unwrap().completed, 1);
}

/// A cancel request reaches the handler through the task heartbeat; its
/// error then ends the task cancelled (no retry). A `Permanent` error goes
/// dead without a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_requests_and_permanent_errors() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(std::slice::from_ref(&app.url));
    let q = "client-cancel";
    let id = c.submit(q, &spec(json!("wait"), 0)).await.unwrap().id;
    let bad = c.submit(q, &spec(json!("bad"), 0)).await.unwrap().id;
    let reasons: Arc<Mutex<Vec<CancelReason>>> = Arc::default();
    let worker = Arc::new(
        Worker::builder(c.clone())
            .queue(q)
            .id("w-cancel")
            .concurrency(2)
            .task_heartbeat(Duration::from_millis(100))
            .claim_wait(Duration::from_millis(200))
            .handler({
                let reasons = reasons.clone();
                move |t, ctx| {
                    let reasons = reasons.clone();
                    async move {
                        if t.payload == json!("bad") {
                            return Err(Permanent::error("cannot ever work"));
                        }
                        ctx.cancelled().await;
                        reasons.lock().unwrap().extend(ctx.cancel_reason());
                        Err("stopped on request".into())
                    }
                }
            })
            .build()
            .unwrap(),
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn({
        let w = worker.clone();
        async move { w.run_until(async { rx.await.unwrap_or(()) }).await }
    });
    assert!(wait_for(Duration::from_secs(5), || worker.stats().claimed == 2).await);
    let answer = c.cancel(&id).await.unwrap();
    assert!(answer.cancel_requested);
    let t = c.wait_for_result(&id, Duration::from_secs(5)).await.unwrap();
    assert_eq!(t.state, "cancelled", "{t:?}");
    assert_eq!(*reasons.lock().unwrap(), vec![CancelReason::CancelRequested]);
    let t = c.wait_for_result(&bad, Duration::from_secs(5)).await.unwrap();
    assert_eq!((t.state.as_str(), t.attempts), ("dead", 1), "{t:?}");
    assert_eq!(t.error.as_deref(), Some("cannot ever work"));
    let _ = tx.send(());
    let stats = run.await.unwrap().unwrap();
    assert_eq!((stats.failed, stats.cancel_requests), (2, 1), "{stats:?}");
}

mod acks;
mod calls;
mod coverage;
mod failover;
mod lagged;
mod lost;
mod tls;
