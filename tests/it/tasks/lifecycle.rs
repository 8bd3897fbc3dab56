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
    let t = claim(&a, "rt", "w", 1, 0).await;
    let (s, f) = a
        .post(
            &format!("/api/v1/tasks/{id}/fail"),
            json!({"token": t[0]["token"], "error": "e1"}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(f["state"], "delayed");
    let (_, task) = a.get(&format!("/api/v1/tasks/{id}")).await;
    let failed_at = task["attempt_log"][0]["ended_at"].as_i64().unwrap();
    let delay = f["retry_at"].as_i64().unwrap() - failed_at;
    assert!(
        (150..=300).contains(&delay),
        "backoff with jitter in [base/2, base]: {delay}"
    );
    assert!(claim(&a, "rt", "w", 1, 0).await.is_empty(), "not before the backoff");
    let started = Instant::now();
    let t2 = claim(&a, "rt", "w", 1, 2000).await;
    assert_eq!(t2.len(), 1, "the long poll returns when the retry is due");
    assert!(started.elapsed() < Duration::from_millis(1000));
    assert_eq!(t2[0]["attempt"], 2);
    let (_, f) = a
        .post(
            &format!("/api/v1/tasks/{id}/fail"),
            json!({"token": t2[0]["token"], "error": "e2"}),
        )
        .await;
    assert_eq!(f["state"], "dead", "no attempts left");
    let (_, dead) = a.get("/api/v1/dead").await;
    assert_eq!(dead["tasks"][0]["id"], id.as_str());
    assert_eq!(dead["tasks"][0]["error"], "e2");
    // retry: queued again with fresh attempts
    assert_eq!(a.post(&format!("/api/v1/tasks/{id}/retry"), Value::Null).await.0, 204);
    let (_, task) = a.get(&format!("/api/v1/tasks/{id}")).await;
    assert_eq!(task["state"], "queued");
    assert_eq!(task["attempts"], 0);
    assert_eq!(a.get("/api/v1/dead").await.1["total"], 0);
    assert_eq!(
        a.post(&format!("/api/v1/tasks/{id}/retry"), Value::Null).await.0,
        409,
        "only dead tasks"
    );
    // non-retryable failure: dead at once
    let t3 = claim(&a, "rt", "w", 1, 0).await;
    let (_, f) = a
        .post(
            &format!("/api/v1/tasks/{id}/fail"),
            json!({"token": t3[0]["token"], "error": "fatal", "retry": false}),
        )
        .await;
    assert_eq!(f["state"], "dead");
    // discard
    assert_eq!(a.delete(&format!("/api/v1/tasks/{id}")).await.0, 204);
    assert_eq!(a.get(&format!("/api/v1/tasks/{id}")).await.0, 404);
    assert_eq!(a.delete(&format!("/api/v1/tasks/{id}")).await.0, 404);
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
    let (s, r) = a.post(&format!("/api/v1/tasks/{queued}/cancel"), Value::Null).await;
    assert_eq!((s, r["state"].as_str()), (200, Some("cancelled")));
    assert_eq!(
        a.post(&format!("/api/v1/tasks/{delayed}/cancel"), Value::Null).await.1["state"],
        "cancelled"
    );
    assert_eq!(
        a.post(&format!("/api/v1/tasks/{queued}/cancel"), Value::Null).await.0,
        409,
        "already cancelled"
    );
    assert!(claim(&a, "cx", "w", 5, 0).await.is_empty(), "nothing left to claim");
    // running: the worker learns through its heartbeat; its fail cancels
    let running = submit(&a, "cx", json!({})).await;
    let t = claim(&a, "cx", "w", 1, 0).await;
    let tok = t[0]["token"].clone();
    let (_, r) = a.post(&format!("/api/v1/tasks/{running}/cancel"), Value::Null).await;
    assert_eq!(r["cancel_requested"], true);
    let (_, hb) = a
        .post(
            &format!("/api/v1/tasks/{running}/heartbeat"),
            json!({"token": tok, "progress": 40}),
        )
        .await;
    assert_eq!(hb["cancel_requested"], true);
    let (_, f) = a
        .post(
            &format!("/api/v1/tasks/{running}/fail"),
            json!({"token": tok, "error": "stopped"}),
        )
        .await;
    assert_eq!(f["state"], "cancelled");
    let (_, q) = a.get("/api/v1/queues/cx").await;
    assert_eq!(q["cancelled"], 3);
    assert_eq!(q["running"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_pause_resume_and_aliases() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let id = submit(&a, "dl", json!({"delay_ms": 400, "alias": "nightly"})).await;
    let (_, t) = a.get("/api/v1/aliases/nightly").await;
    assert_eq!(t["id"], id.as_str());
    assert_eq!(t["state"], "delayed");
    let (s, b) = a.post("/api/v1/queues/dl/tasks", json!({"alias": "nightly"})).await;
    assert_eq!(s, 409, "alias is unique while its task lives: {b}");
    assert_eq!(b["holder"], id.as_str());
    assert!(claim(&a, "dl", "w", 1, 0).await.is_empty());
    let started = Instant::now();
    let got = claim(&a, "dl", "w", 1, 3000).await;
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
    let (s, b) = a
        .post(
            &format!("/api/v1/tasks/{id}/complete"),
            json!({"token": got[0]["token"]}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let next = submit(&a, "dl2", json!({"alias": "nightly"})).await;
    let (_, t) = a.get("/api/v1/aliases/nightly").await;
    assert_eq!(t["id"], next.as_str(), "the alias moved to the new task");
    // run_at in the past: queued at once
    let (_, r) = a.post("/api/v1/queues/dl/tasks", json!({"run_at": 1})).await;
    assert_eq!(r["state"], "queued");
    // pause: nothing is handed out until resume
    assert_eq!(a.post("/api/v1/queues/dl/pause", Value::Null).await.0, 204);
    let (_, q) = a.get("/api/v1/queues").await;
    assert_eq!(q["queues"][0]["paused"], true);
    assert!(claim(&a, "dl", "w", 1, 0).await.is_empty());
    assert_eq!(a.post("/api/v1/queues/dl/resume", Value::Null).await.0, 204);
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
    let (_, t) = a.get(&format!("/api/v1/tasks/{id}")).await;
    assert_eq!(t["state"], "delayed");
    assert_eq!(
        t["updated_at"], t["created_at"],
        "nothing happened since the submit: {t}"
    );
    assert!(t["updated_at"].as_i64().unwrap() <= redis_now().await, "{t}");
    let (_, page) = a.get("/api/v1/queues/later/tasks?state=delayed").await;
    assert_eq!(page["tasks"][0]["updated_at"], t["created_at"], "{page}");
    // A failed attempt waiting for its retry: updated when it failed.
    let retry = submit(&a, "retry", json!({"backoff_base_ms": 3_600_000})).await;
    let got = claim(&a, "retry", "w", 1, 0).await;
    let (s, f) = a
        .post(
            &format!("/api/v1/tasks/{retry}/fail"),
            json!({"token": got[0]["token"], "error": "x"}),
        )
        .await;
    assert_eq!((s, f["state"].as_str()), (200, Some("delayed")), "{f}");
    let after = redis_now().await;
    let (_, t) = a.get(&format!("/api/v1/tasks/{retry}")).await;
    let updated = t["updated_at"].as_i64().unwrap();
    assert!(updated <= after && updated >= t["started_at"].as_i64().unwrap(), "{t}");
    assert!(t["run_at"].as_i64().unwrap() > after, "{t}");
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
            let (s, v) = a.get(&format!("/api/v1/queues/{q}")).await;
            assert_eq!(s, 200, "{v}");
            v["latency_ms"].as_u64().unwrap_or_else(|| panic!("no latency_ms: {v}"))
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
