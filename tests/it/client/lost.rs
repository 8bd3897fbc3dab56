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
    assert_eq!(stats.adopted + stats.handed_back, 2, "{stats:?}");
    let _ = tx.send(());
    run.await.unwrap().unwrap();
}
