//! The Worker and the claim lease: a task that finishes within a third of
//! its lease is acknowledged by its complete (no call added); a longer one
//! by an early first heartbeat, however long `task_heartbeat` is, so the
//! server never puts back a task the worker runs.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_acknowledges_long_tasks_early_and_short_ones_by_their_complete() {
    let redis = TestRedis::start();
    // A lease of 2 s (the early heartbeat has about 1.3 s to land: on a
    // loaded CI machine 1 s was once not enough); the long tasks outlast it.
    let app = TestApp::start_with(&redis, |c| c.claim.ack_ms = 2000).await;
    let c = client(std::slice::from_ref(&app.url));
    let queue = "client-acks";
    let mut ids = Vec::new();
    for ms in [10, 5000, 20, 3600] {
        ids.push(c.submit(queue, &spec(json!({"ms": ms}), 60_000)).await.unwrap().id);
    }
    let runs: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let worker = {
        let runs = runs.clone();
        Arc::new(
            Worker::builder(c.clone())
                .queue(queue)
                .id("w-acks")
                .concurrency(4)
                .batch(4)
                // Far beyond the lease: only the early first heartbeat
                // acknowledges the long tasks.
                .task_heartbeat(Duration::from_secs(30))
                .claim_wait(Duration::from_millis(300))
                .handler(move |task, _ctx| {
                    let runs = runs.clone();
                    async move {
                        *runs.lock().unwrap().entry(task.id.clone()).or_default() += 1;
                        let ms = task.payload["ms"].as_u64().unwrap();
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        Ok(json!(ms))
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
    let done = wait_until(Duration::from_secs(15), || {
        let (c, ids) = (c.clone(), ids.clone());
        async move {
            for id in &ids {
                if c.task(id).await.map(|t| t.state != "succeeded").unwrap_or(true) {
                    return false;
                }
            }
            true
        }
    })
    .await;
    let _ = stop_tx.send(());
    let stats = run.await.unwrap().unwrap();
    assert!(done, "not every task succeeded: {stats:?}");
    assert_eq!((stats.completed, stats.dropped), (4, 0), "{stats:?}");
    for id in &ids {
        assert_eq!(runs.lock().unwrap().get(id), Some(&1), "{id} ran more than once");
        let t = c.task(id).await.unwrap();
        assert_eq!(t.attempts, 1, "{t:?}");
        assert!(
            t.attempt_log
                .iter()
                .all(|a| a.outcome.as_deref() != Some("not_acknowledged")),
            "the worker let its claim lapse: {t:?}"
        );
    }
}
