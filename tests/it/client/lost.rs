//! Work a worker may have lost: a claim applied whose answer never came,
//! a task gone from under its handler, and the worker's own registration
//! lease running out while it can reach no node.

use super::*;

/// The node's port, for a proxy in front of it.
fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

/// A claim the node applied and answered too late: the worker's read timed
/// out, which a claim does not retry (it could claim twice). That error
/// alone makes the worker look for tasks held under its id: the task is
/// adopted (or handed back and claimed again) and runs once, instead of
/// staying `running` under a live worker with no timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_came_after_the_timeout_is_adopted() {
    if skip_on_cluster("a fault proxy in front of a node of the test's own") {
        return;
    }
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let proxy = FaultProxy::start(port_of(&app.url)).await;
    let direct = client(std::slice::from_ref(&app.url));
    let through = Client::builder()
        .url(format!("http://127.0.0.1:{}", proxy.port))
        .timeout(Duration::from_secs(1))
        .retry_for(Duration::from_secs(5))
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .build()
        .unwrap();
    let q = "client-late-claim";
    // A claim lost before the worker starts: its adoption at start is over
    // once this task has run, so the one below is not found by it.
    let hb = muster::client::NodeHeartbeat {
        ttl_ms: Some(120_000),
        ..Default::default()
    };
    direct.heartbeat_node("w-late", &hb).await.unwrap();
    let first = direct.submit(q, &spec(json!("first"), 0)).await.unwrap().id;
    let req = muster::client::ClaimRequest {
        node: "w-late".into(),
        max: 1,
        wait_ms: 0,
        ack_ms: None,
    };
    assert_eq!(direct.claim(q, &req).await.unwrap().len(), 1);
    let runs = Arc::new(AtomicU64::new(0));
    let worker = Arc::new(
        Worker::builder(through)
            .queue(q)
            .id("w-late")
            .concurrency(2)
            // No registration heartbeat during the test: nothing else fails
            // (and is retried) while the answer is late.
            .ttl(Duration::from_secs(120))
            .claim_wait(Duration::from_millis(200))
            .handler({
                let runs = runs.clone();
                move |_t, _ctx| {
                    runs.fetch_add(1, Ordering::Relaxed);
                    async { Ok(json!("done")) }
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
    let adopted = direct.wait_for_result(&first, Duration::from_secs(10)).await.unwrap();
    assert_eq!(adopted.state, "succeeded", "{adopted:?}");
    let stats = worker.stats();
    assert_eq!(stats.adopted + stats.handed_back, 1, "{stats:?}");
    // From now on every answer takes 1.5 s, beyond the claim's 1.2 s
    // (timeout plus long poll): the next claim is applied, its answer lost.
    proxy.set_latency(Duration::from_millis(1500), Duration::ZERO);
    let id = direct.submit(q, &spec(json!("x"), 0)).await.unwrap().id;
    assert!(
        wait_until(Duration::from_secs(10), || async {
            direct.task(&id).await.is_ok_and(|t| t.state == "running")
        })
        .await,
        "the claim was never applied"
    );
    proxy.set_latency(Duration::ZERO, Duration::ZERO);
    let t = direct.wait_for_result(&id, Duration::from_secs(15)).await;
    let stats = worker.stats();
    let t = t.unwrap_or_else(|e| panic!("the task was stranded: {e}; {stats:?}"));
    assert_eq!(t.state, "succeeded", "{t:?}");
    assert_eq!(runs.load(Ordering::Relaxed), 2, "{stats:?}");
    // (The task's record, attempts and owner, says how it ran when this
    // fails: it failed once in 12 to 30 runs with both cores busy, the
    // task run once by a plain claim, `claimed: 1`.)
    assert_eq!(stats.adopted + stats.handed_back, 2, "{stats:?}; the task: {t:?}");
    let _ = tx.send(());
    run.await.unwrap().unwrap();
}

/// Milliseconds since the Unix epoch on this host's clock, which is the
/// clock of the test's Redis (on the same host): comparable with the
/// attempt log's `claimed_at`.
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// What the handlers saw, by task id, on the test's one clock.
#[derive(Default)]
struct Timeline {
    /// The cut worker's handlers: when each was cancelled, why, and when
    /// it returned (also in wall ms).
    cut: HashMap<String, (Instant, Option<CancelReason>, Instant, i64)>,
    /// The other worker's handlers: when each started and returned.
    other: HashMap<String, (Instant, Instant)>,
}

/// A worker cut off from every node (a fault proxy drops its connections)
/// for twice its ttl: its registration lapses and the cluster hands its
/// tasks to another worker. Its own lease lapsed first, so every handler
/// was cancelled (`LeaseExpired`) and had returned before the other worker
/// started the task: no task ran on two workers at once. When the link
/// heals its late reports are refused (the tasks were recovered) and it
/// claims again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_from_every_node_stops_its_handlers_before_others_get_the_tasks() {
    if skip_on_cluster("a fault proxy in front of a node of the test's own") {
        return;
    }
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let proxy = FaultProxy::start(port_of(&app.url)).await;
    let direct = client(std::slice::from_ref(&app.url));
    let cut_client = Client::builder()
        .url(format!("http://127.0.0.1:{}", proxy.port))
        .timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_millis(300))
        .retry_for(Duration::from_secs(1))
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .build()
        .unwrap();
    let q = "client-cut";
    let ttl = Duration::from_secs(2);
    let n = 3;
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(direct.submit(q, &spec(json!(i), 0)).await.unwrap().id);
    }
    let timeline: Arc<Mutex<Timeline>> = Arc::default();
    let running = Arc::new(AtomicU64::new(0));
    let cut_worker = Arc::new(
        Worker::builder(cut_client)
            .queue(q)
            .id("w-cut")
            .concurrency(n)
            .batch(n as u32)
            .ttl(ttl)
            .task_heartbeat(Duration::from_millis(200))
            .claim_wait(Duration::from_millis(200))
            .grace(Duration::from_millis(200))
            .handler({
                let (timeline, running) = (timeline.clone(), running.clone());
                move |t, ctx| {
                    let (timeline, running) = (timeline.clone(), running.clone());
                    async move {
                        running.fetch_add(1, Ordering::Relaxed);
                        let _ = tokio::time::timeout(Duration::from_secs(30), ctx.cancelled()).await;
                        let cancelled = Instant::now();
                        let reason = ctx.cancel_reason();
                        // A handler takes a moment to stop.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        timeline
                            .lock()
                            .unwrap()
                            .cut
                            .insert(t.id.clone(), (cancelled, reason, Instant::now(), wall_ms()));
                        Err::<Value, HandlerError>("stopped".into())
                    }
                }
            })
            .build()
            .unwrap(),
    );
    let (cut_stop, cut_stopped) = tokio::sync::oneshot::channel::<()>();
    let cut_run = tokio::spawn({
        let w = cut_worker.clone();
        async move { w.run_until(async { cut_stopped.await.unwrap_or(()) }).await }
    });
    assert!(wait_for(Duration::from_secs(10), || running.load(Ordering::Relaxed) == n as u64).await);

    let other = Arc::new(
        Worker::builder(direct.clone())
            .queue(q)
            .id("w-other")
            .concurrency(n)
            .claim_wait(Duration::from_millis(200))
            .handler({
                let timeline = timeline.clone();
                move |t, _ctx| {
                    let timeline = timeline.clone();
                    async move {
                        let started = Instant::now();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        timeline
                            .lock()
                            .unwrap()
                            .other
                            .insert(t.id.clone(), (started, Instant::now()));
                        Ok(json!("other"))
                    }
                }
            })
            .build()
            .unwrap(),
    );
    let (other_stop, other_stopped) = tokio::sync::oneshot::channel::<()>();
    let other_run = tokio::spawn({
        let w = other.clone();
        async move { w.run_until(async { other_stopped.await.unwrap_or(()) }).await }
    });

    let cut_at = Instant::now();
    proxy.block();
    let mut claimed_again = HashMap::new();
    for id in &ids {
        let t = direct.wait_for_result(id, Duration::from_secs(15)).await.unwrap();
        assert_eq!(t.result, Some(json!("other")), "{t:?}");
        assert_eq!(t.attempt_log[0].node, "w-cut", "{t:?}");
        assert_eq!(t.attempt_log[0].outcome.as_deref(), Some("orphaned"), "{t:?}");
        assert_eq!(t.attempt_log[1].node, "w-other", "{t:?}");
        claimed_again.insert(id.clone(), t.attempt_log[1].claimed_at);
    }
    // Twice the ttl in all, then the link heals.
    tokio::time::sleep((2 * ttl).saturating_sub(cut_at.elapsed())).await;
    proxy.unblock();

    let stats = cut_worker.stats();
    {
        let tl = timeline.lock().unwrap();
        for id in &ids {
            let (cancelled, reason, returned, returned_ms) = tl
                .cut
                .get(id)
                .copied()
                .unwrap_or_else(|| panic!("the cut worker's handler of {id} was never cancelled; {stats:?}"));
            let (started, _) = tl.other[id];
            assert_eq!(reason, Some(CancelReason::LeaseExpired), "{id}");
            assert!(cancelled > cut_at, "{id} cancelled before the cut");
            // The other worker's claim, by Redis time (this host's clock).
            assert!(
                returned_ms < claimed_again[id],
                "{id}: the cut worker's handler returned {} ms after the other worker claimed the task",
                returned_ms - claimed_again[id]
            );
            assert!(
                returned < started,
                "{id}: the cut worker's handler returned {:?} after the other worker started it",
                returned - started
            );
            eprintln!(
                "{id}: cancelled {:?} after the cut; returned {} ms before the other worker's claim",
                cancelled - cut_at,
                claimed_again[id] - returned_ms
            );
        }
    }
    assert_eq!(stats.lease_lapses, 1, "{stats:?}");

    // Healed: its reports are refused (the tasks were recovered), and it
    // claims again.
    assert!(
        wait_for(Duration::from_secs(10), || cut_worker.stats().dropped == n as u64).await,
        "{:?}",
        cut_worker.stats()
    );
    let _ = other_stop.send(());
    other_run.await.unwrap().unwrap();
    let again = direct.submit(q, &spec(json!("again"), 0)).await.unwrap().id;
    assert!(
        wait_for(Duration::from_secs(10), || running.load(Ordering::Relaxed)
            == n as u64 + 1)
        .await,
        "the cut worker did not claim again; {:?}",
        cut_worker.stats()
    );
    let t = direct.task(&again).await.unwrap();
    assert_eq!(t.owner.as_deref(), Some("w-cut"), "{t:?}");
    let _ = cut_stop.send(());
    let stats = cut_run.await.unwrap().unwrap();
    assert_eq!(
        (stats.completed, stats.failed, stats.handed_back),
        (0, 0, 1),
        "{stats:?}"
    );
}

/// A task gone from under its handler (its hash deleted, as a Redis that
/// lost its data would have it): the task heartbeat's 404 cancels the
/// handler as `Lost` and its result is dropped, as a 409 would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_heartbeat_404_cancels_the_handler_as_lost() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(std::slice::from_ref(&app.url));
    let q = "client-gone";
    let id = c.submit(q, &spec(json!("x"), 0)).await.unwrap().id;
    let reason: Arc<Mutex<Option<Option<CancelReason>>>> = Arc::default();
    let worker = Arc::new(
        Worker::builder(c.clone())
            .queue(q)
            .id("w-gone")
            .task_heartbeat(Duration::from_millis(100))
            .claim_wait(Duration::from_millis(200))
            .handler({
                let reason = reason.clone();
                move |_t, ctx| {
                    let reason = reason.clone();
                    async move {
                        let _ = tokio::time::timeout(Duration::from_secs(10), ctx.cancelled()).await;
                        *reason.lock().unwrap() = Some(ctx.cancel_reason());
                        Ok(json!("dropped"))
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
    assert!(wait_for(Duration::from_secs(5), || worker.stats().claimed == 1).await);
    let key = format!("{}:task:{id}", task_tag("muster", &id));
    let deleted: i64 = redis.cmd(&["DEL", &key]).await;
    assert_eq!(deleted, 1, "{key}");
    assert!(wait_for(Duration::from_secs(5), || reason.lock().unwrap().is_some()).await);
    assert_eq!(*reason.lock().unwrap(), Some(Some(CancelReason::Lost)));
    let _ = tx.send(());
    let stats = run.await.unwrap().unwrap();
    assert_eq!((stats.completed, stats.dropped), (0, 1), "{stats:?}");
}
