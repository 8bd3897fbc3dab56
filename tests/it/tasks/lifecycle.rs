//! A task's life: retries and dead letters, cancel, delay, pause, aliases, waiting claims, timestamps.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_backoff_dead_letters_retry_and_discard() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let id = submit(
        &a,
        "rt",
        json!({"max_attempts": 2, "backoff_base_ms": 300, "backoff_cap_ms": 300}),
    )
    .await;
    let t = claim_tasks(&a, "rt", "w", 1, 0).await;
    let f = fail_task(&a, &t[0], "e1").await;
    assert_eq!(f.state, "delayed");
    let task = a.api().task(&id).await.unwrap();
    let failed_at = task.attempt_log[0].ended_at.unwrap();
    let delay = f.retry_at.unwrap() - failed_at;
    assert!(
        (150..=300).contains(&delay),
        "backoff with jitter in [base/2, base]: {delay}"
    );
    assert!(claim(&a, "rt", "w", 1, 0).await.is_empty(), "not before the backoff");
    let started = Instant::now();
    let t2 = claim_tasks(&a, "rt", "w", 1, 2000).await;
    assert_eq!(t2.len(), 1, "the long poll returns when the retry is due");
    assert!(started.elapsed() < Duration::from_millis(1000));
    assert_eq!(t2[0].attempt, 2);
    let f = fail_task(&a, &t2[0], "e2").await;
    assert_eq!(f.state, "dead", "no attempts left");
    let dead = a.api().dead().await.unwrap();
    assert_eq!(dead.tasks[0].id, id);
    assert_eq!(dead.tasks[0].error.as_deref(), Some("e2"));
    // retry: queued again with fresh attempts (204)
    a.api().retry_task(&id).await.unwrap();
    let task = a.api().task(&id).await.unwrap();
    assert_eq!(task.state, "queued");
    assert_eq!(task.attempts, 0);
    assert_eq!(a.api().dead().await.unwrap().total, 0);
    assert_eq!(problem(a.api().retry_task(&id).await).status, 409, "only dead tasks");
    // non-retryable failure: dead at once
    let t3 = claim_tasks(&a, "rt", "w", 1, 0).await;
    let fatal = Fail {
        token: t3[0].token,
        error: "fatal".into(),
        retry: false,
        next: None,
    };
    let f = a.api().fail(&id, &fatal).await.unwrap();
    assert_eq!(f.state, "dead");
    // discard (204), then it is gone
    a.api().delete_task(&id).await.unwrap();
    assert_eq!(problem(a.api().task(&id).await).status, 404);
    assert_eq!(problem(a.api().delete_task(&id).await).status, 404);
    let events: Vec<String> = redis.events("muster").await.into_iter().map(|e| e.0).collect();
    for t in [
        "task.enqueued",
        "task.claimed",
        "task.failed",
        "task.retrying",
        "task.dead",
        "task.deleted",
    ] {
        assert!(events.iter().any(|e| e == t), "{t} emitted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_queued_delayed_and_running() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let queued = submit(&a, "cx", json!({"alias": "job-1"})).await;
    let delayed = submit(&a, "cx", json!({"delay_ms": 60_000})).await;
    let r = a.api().cancel(&queued).await.unwrap();
    assert_eq!(r.state, "cancelled");
    assert_eq!(a.api().cancel(&delayed).await.unwrap().state, "cancelled");
    assert_eq!(problem(a.api().cancel(&queued).await).status, 409, "already cancelled");
    assert!(claim(&a, "cx", "w", 5, 0).await.is_empty(), "nothing left to claim");
    // running: the worker learns through its heartbeat; its fail cancels
    let running = submit(&a, "cx", json!({})).await;
    let t = claim_tasks(&a, "cx", "w", 1, 0).await;
    assert_eq!(t[0].id, running);
    let r = a.api().cancel(&running).await.unwrap();
    assert!(r.cancel_requested);
    let beat = TaskHeartbeat {
        token: t[0].token,
        progress: Some(40),
        fields: None,
    };
    let hb = a.api().heartbeat_task(&running, &beat).await.unwrap();
    assert!(hb.cancel_requested);
    let f = fail_task(&a, &t[0], "stopped").await;
    assert_eq!(f.state, "cancelled");
    let q = a.api().queue("cx").await.unwrap().stats;
    assert_eq!(q.cancelled, 3);
    assert_eq!(q.running, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_pause_resume_and_aliases() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let id = submit(&a, "dl", json!({"delay_ms": 400, "alias": "nightly"})).await;
    let t = a.api().alias("nightly").await.unwrap();
    assert_eq!(t.id, id);
    assert_eq!(t.state, "delayed");
    let (s, b) = a.post("/api/v1/queues/dl/tasks", json!({"alias": "nightly"})).await;
    assert_eq!(s, 409, "alias is unique while its task lives: {b}");
    assert_eq!(as_problem(s, &b).extra["holder"], id.as_str());
    assert!(claim(&a, "dl", "w", 1, 0).await.is_empty());
    let started = Instant::now();
    let got = claim_tasks(&a, "dl", "w", 1, 3000).await;
    let waited = started.elapsed();
    assert_eq!(got.len(), 1);
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(1500),
        "{waited:?}"
    );
    // Still held while running; free once the task finished (it is kept
    // for retention, but no longer lives).
    let (s, _) = a.post("/api/v1/queues/dl/tasks", json!({"alias": "nightly"})).await;
    assert_eq!(s, 409, "held while running");
    complete_task(&a, &got[0]).await;
    let next = submit(&a, "dl2", json!({"alias": "nightly"})).await;
    let t = a.api().alias("nightly").await.unwrap();
    assert_eq!(t.id, next, "the alias moved to the new task");
    // run_at in the past: queued at once
    let past = TaskSpec {
        run_at: Some(1),
        ..Default::default()
    };
    assert_eq!(a.api().submit("dl", &past).await.unwrap().state, "queued");
    // pause: nothing is handed out until resume (204 each)
    a.api().pause_queue("dl").await.unwrap();
    let q = a.api().queues().await.unwrap();
    assert!(q.iter().find(|q| q.name == "dl").unwrap().paused, "{q:?}");
    assert!(claim(&a, "dl", "w", 1, 0).await.is_empty());
    a.api().resume_queue("dl").await.unwrap();
    assert_eq!(claim(&a, "dl", "w", 1, 0).await.len(), 1);
    let events: Vec<String> = redis.events("muster").await.into_iter().map(|e| e.0).collect();
    assert!(events.contains(&"queue.paused".to_string()) && events.contains(&"queue.resumed".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_wakes_on_an_enqueue_on_another_node() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    join(&a, "w").await;
    let mut worst = Duration::ZERO;
    for i in 0..5 {
        let b_url = b.url.clone();
        let waiter = tokio::spawn(async move {
            let http = reqwest::Client::new();
            let resp = http
                .post(format!("{b_url}/api/v1/queues/wake/claim"))
                .json(&json!({"node": "w", "wait_ms": 10_000}))
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = Instant::now();
        submit(&a, "wake", json!({"payload": i})).await;
        let (status, woke) = waiter.await.unwrap();
        assert_eq!(status, 200);
        worst = worst.max(woke.duration_since(sent));
    }
    // Woken by the event relay, not by a timer: well under the 2 s safety net.
    assert!(worst < Duration::from_millis(300), "worst wake-up {worst:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updated_at_is_the_last_change_not_the_due_time() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let redis_now = || async {
        let t: Vec<String> = redis.cmd(&["TIME"]).await;
        t[0].parse::<i64>().unwrap() * 1000 + t[1].parse::<i64>().unwrap() / 1000
    };
    let id = submit(&a, "later", json!({"delay_ms": 3_600_000})).await;
    let t = a.api().task(&id).await.unwrap();
    assert_eq!(t.state, "delayed");
    assert_eq!(t.updated_at, t.created_at, "nothing happened since the submit: {t:?}");
    assert!(t.updated_at <= redis_now().await, "{t:?}");
    let page = a.api().tasks("later", "delayed", 50, None).await.unwrap();
    assert_eq!(page.tasks[0].updated_at, t.created_at, "{page:?}");
    // A failed attempt waiting for its retry: updated when it failed.
    let retry = submit(&a, "retry", json!({"backoff_base_ms": 3_600_000})).await;
    let got = claim_tasks(&a, "retry", "w", 1, 0).await;
    let f = fail_task(&a, &got[0], "x").await;
    assert_eq!(f.state, "delayed", "{f:?}");
    let after = redis_now().await;
    let t = a.api().task(&retry).await.unwrap();
    let updated = t.updated_at;
    assert!(updated <= after && updated >= t.started_at.unwrap(), "{t:?}");
    assert!(t.run_at.unwrap() > after, "{t:?}");
}

/// Queue latency: how long the longest-waiting head of the queue (the ready
/// set, each group's line) has been claimable, by Redis time. It grows
/// while nobody claims, counts a grouped task's line too, ignores a delayed
/// task until it is due, and drops to 0 once everything is claimed; the
/// queues page shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_latency_is_the_wait_of_the_oldest_head() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let latency = |q: &'static str| {
        let a = &a;
        async move {
            // Raw: `latency_ms` must be sent (the typed answer defaults it).
            let (s, v) = a.get(&format!("/api/v1/queues/{q}")).await;
            assert_eq!(s, 200, "{v}");
            assert!(v.get("latency_ms").is_some(), "no latency_ms: {v}");
            serde_json::from_value::<muster::client::QueueDetail>(v)
                .unwrap()
                .stats
                .latency_ms
        }
    };
    submit(&a, "lat", json!({"payload": 1})).await;
    submit(&a, "lat-g", json!({"payload": 1, "group": "lat-grp"})).await;
    submit(&a, "lat-d", json!({"payload": 1, "delay_ms": 60_000})).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (plain, grouped, delayed) = (latency("lat").await, latency("lat-g").await, latency("lat-d").await);
    assert!((1000..10_000).contains(&plain), "ready head waited {plain} ms");
    assert!((1000..10_000).contains(&grouped), "group head waited {grouped} ms");
    assert_eq!(delayed, 0, "a delayed task is not waiting to be claimed yet");
    let page = a.page("/queues").await;
    assert!(page.contains("latency"), "the queues page shows latency");
    assert_eq!(claim(&a, "lat", "w", 1, 0).await.len(), 1);
    assert_eq!(claim(&a, "lat-g", "w", 1, 0).await.len(), 1);
    assert_eq!(
        (latency("lat").await, latency("lat-g").await),
        (0, 0),
        "nothing left waiting"
    );
}
