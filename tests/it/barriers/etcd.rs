//! The etcd-style Barrier (hold, release, wait) and DoubleBarrier (enter, leave, crashed entrants), and holds on the list.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hold_release_and_wait() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start(&redis).await);
    let b = TestApp::start(&redis).await;
    // Not held: wait returns at once.
    let (s, v) = a.post("/api/v1/barriers/gate/wait", json!({"wait_ms": 5000})).await;
    assert_eq!((s, v["held"].clone()), (200, json!(false)));
    let (s, v) = a.post("/api/v1/barriers/gate/hold", json!({"holder": "ops"})).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(
        a.post("/api/v1/barriers/gate/hold", json!({"holder": "ops"})).await.0,
        200
    );
    let (s, v) = a.post("/api/v1/barriers/gate/hold", json!({"holder": "other"})).await;
    assert_eq!((s, v["holder"].clone()), (409, json!("ops")));
    // Held: wait times out with held: true.
    let (_, v) = b.post("/api/v1/barriers/gate/wait", json!({"wait_ms": 100})).await;
    assert_eq!(v["held"], true);
    // Waiters on two nodes wake on release.
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let a = a.clone();
        waiters.push(tokio::spawn(async move {
            let v = a.post("/api/v1/barriers/gate/wait", json!({"wait_ms": 10_000})).await;
            (Instant::now(), v)
        }));
    }
    tokio::task::yield_now().await;
    let (_, v) = b.post("/api/v1/barriers/gate/release", json!({})).await;
    let t0 = Instant::now();
    assert_eq!(v["released"], true);
    for w in waiters {
        let (at, (s, v)) = w.await.unwrap();
        assert_eq!((s, v["held"].clone()), (200, json!(false)));
        assert!(at.saturating_duration_since(t0) < Duration::from_millis(500));
    }
    assert_eq!(
        b.post("/api/v1/barriers/gate/release", json!({})).await.1["released"],
        false
    );
    // A hold with a TTL lifts itself; a waiter sees it within the TTL.
    a.post("/api/v1/barriers/gate/hold", json!({"ttl_ms": 300})).await;
    let t = Instant::now();
    let (_, v) = b.post("/api/v1/barriers/gate/wait", json!({"wait_ms": 5000})).await;
    assert_eq!(v["held"], false);
    assert!(t.elapsed() < Duration::from_millis(1500), "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn double_barrier_count_too_many_and_leave() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start(&redis).await);
    let b = Arc::new(TestApp::start(&redis).await);
    let _hb: Vec<_> = futures_util::future::join_all(["w1", "w2", "w3", "w4"].map(|w| join_worker(&a, w))).await;
    // An unregistered node cannot enter.
    assert_eq!(enter(&a, "d", "ghost", 3, 0).await.0, 409);
    // Two enter and wait; the third makes it ready for all three.
    let mut waiting = Vec::new();
    for (i, w) in ["w1", "w2"].into_iter().enumerate() {
        let app = if i == 0 { a.clone() } else { b.clone() };
        waiting.push(tokio::spawn(async move { enter(&app, "d", w, 3, 10_000).await }));
    }
    let two_in = wait_until(Duration::from_secs(5), || async {
        a.get("/api/v1/double-barriers/d").await.1["entrants"]
            .as_array()
            .unwrap()
            .len()
            == 2
    })
    .await;
    assert!(two_in);
    let (s, v) = enter(&a, "d", "w1", 3, 0).await;
    assert_eq!(
        (s, v["done"].clone(), v["inside"].clone()),
        (200, json!(false), json!(true)),
        "re-entering is a no-op"
    );
    // A different count is refused.
    assert_eq!(enter(&b, "d", "w3", 4, 0).await.0, 409);
    let (s, v) = enter(&b, "d", "w3", 3, 0).await;
    assert_eq!((s, v["done"].clone()), (200, json!(true)), "{v}");
    for w in waiting {
        let (s, v) = w.await.unwrap();
        assert_eq!(
            (s, v["done"].clone(), v["ready"].clone()),
            (200, json!(true), json!(true)),
            "{v}"
        );
    }
    // The count+1-th entrant is refused.
    let (s, v) = enter(&a, "d", "w4", 3, 0).await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["reason"], "too_many");
    // Leaving: nobody is done until all three have left.
    let (a2, b2) = (a.clone(), b.clone());
    let l1 = tokio::spawn(async move { leave(&a2, "d", "w1", 10_000).await });
    let l2 = tokio::spawn(async move { leave(&b2, "d", "w2", 10_000).await });
    let one_left = wait_until(Duration::from_secs(5), || async {
        a.get("/api/v1/double-barriers/d").await.1["entrants"]
            .as_array()
            .unwrap()
            .len()
            == 1
    })
    .await;
    assert!(one_left);
    // Even while some have left, the barrier is still full.
    assert_eq!(enter(&a, "d", "w4", 3, 0).await.0, 409);
    assert!(!l1.is_finished() && !l2.is_finished(), "leave waits for the others");
    let (s, v) = leave(&a, "d", "w3", 5000).await;
    assert_eq!((s, v["done"].clone()), (200, json!(true)), "{v}");
    for l in [l1, l2] {
        let (s, v) = l.await.unwrap();
        assert_eq!((s, v["done"].clone()), (200, json!(true)), "{v}");
    }
    // Reset: a new cycle can start.
    let (s, v) = enter(&a, "d", "w4", 1, 0).await;
    assert_eq!((s, v["done"].clone()), (200, json!(true)), "{v}");
    let events = redis.events("muster").await;
    let ready = events.iter().filter(|(t, _, _)| t == "dbarrier.ready").count();
    assert_eq!(ready, 2);
    assert_eq!(events.iter().filter(|(t, _, _)| t == "dbarrier.reset").count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crashed_entrant_does_not_hang_the_others() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start(&redis).await);
    let w1 = join_worker(&a, "w1").await;
    let _w2 = join_worker(&a, "w2").await;
    let _w3 = join_worker(&a, "w3").await;
    let crash = join_worker(&a, "crash").await;
    // Entering phase: an entrant crashes; its slot frees up once its node is dead.
    assert_eq!(enter(&a, "e", "crash", 3, 0).await.0, 200);
    assert_eq!(enter(&a, "e", "w1", 3, 0).await.0, 200);
    crash.store(true, Ordering::SeqCst);
    let evicted = wait_until(Duration::from_secs(5), || async {
        let (_, d) = a.get("/api/v1/double-barriers/e").await;
        !d["entrants"].as_array().unwrap().iter().any(|e| e["node"] == "crash")
    })
    .await;
    assert!(evicted, "the background loop evicts an entrant whose node is dead");
    let a2 = a.clone();
    let w2_enter = tokio::spawn(async move { enter(&a2, "e", "w2", 3, 10_000).await });
    let (s, v) = enter(&a, "e", "w3", 3, 10_000).await;
    assert_eq!((s, v["done"].clone()), (200, json!(true)), "{v}");
    assert_eq!(w2_enter.await.unwrap().1["done"], true);
    // Ready phase: w1 crashes without leaving; the others' leave completes
    // once it is dead instead of hanging.
    w1.store(true, Ordering::SeqCst);
    let t = Instant::now();
    let a2 = a.clone();
    let l2 = tokio::spawn(async move { leave(&a2, "e", "w2", 10_000).await });
    let (s, v) = leave(&a, "e", "w3", 10_000).await;
    assert_eq!((s, v["done"].clone()), (200, json!(true)), "{v}");
    assert_eq!(l2.await.unwrap().1["done"], true);
    // Node ttl 500 ms (the worker's), loop every 200 ms.
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let events = redis.events("muster").await;
    let evictions: Vec<_> = events
        .iter()
        .filter(|(t, _, _)| t == "dbarrier.evicted")
        .map(|(_, _, f)| f["data"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(evictions.len(), 2, "{evictions:?}");
}

/// An etcd-style hold on a barrier that was never configured shows in GET
/// (`configured: false`), in the list, and on the dashboard; DELETE lifts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_are_visible_configured_or_not() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let (s, v) = a
        .post(
            "/api/v1/barriers/maintenance/hold",
            json!({"holder": "release-bot", "ttl_ms": 3_600_000}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = a.get("/api/v1/barriers/maintenance").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["name"].clone(), v["configured"].clone()),
        (json!("maintenance"), json!(false)),
        "{v}"
    );
    assert_eq!(
        (v["hold"]["held"].clone(), v["hold"]["holder"].clone()),
        (json!(true), json!("release-bot"))
    );
    assert!(v.get("participants").is_none() && v.get("timeout_ms").is_none(), "{v}");
    // A configured barrier, held too.
    configure(&a, "gate", &strings(&["x"]), 0, 1000).await;
    let (s, v) = a.get("/api/v1/barriers/gate").await;
    assert_eq!(
        (s, v["configured"].clone(), v["hold"]["held"].clone()),
        (200, json!(true), json!(false)),
        "{v}"
    );
    assert_eq!(v["participants"], json!(["x"]), "{v}");
    a.post("/api/v1/barriers/gate/hold", json!({"holder": "ops"})).await;
    let (_, list) = a.get("/api/v1/barriers").await;
    let listed = |list: &Value, key: &str, field: &str| -> Vec<String> {
        list[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b[field].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(listed(&list, "barriers", "name"), ["gate"], "{list}");
    assert_eq!(listed(&list, "holds", "barrier"), ["gate", "maintenance"], "{list}");
    assert_eq!(list["holds"][1]["holder"], "release-bot", "{list}");
    // The dashboard.
    let html = a.page("/barriers").await;
    assert!(
        html.contains("data-hold=\"maintenance\"") && html.contains("release-bot"),
        "{html}"
    );
    let resp = a
        .request(reqwest::Method::GET, "/barriers/maintenance")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let html = resp.text().await.unwrap();
    assert!(
        html.contains("release-bot") && html.contains("not configured"),
        "{html}"
    );
    // Released: gone from all three.
    let (_, v) = a.post("/api/v1/barriers/maintenance/release", json!({})).await;
    assert_eq!(v["released"], true);
    assert_eq!(a.get("/api/v1/barriers/maintenance").await.0, 404);
    let (_, list) = a.get("/api/v1/barriers").await;
    assert_eq!(listed(&list, "holds", "barrier"), ["gate"], "{list}");
    assert!(!a.page("/barriers").await.contains("data-hold=\"maintenance\""));
    let resp = a
        .request(reqwest::Method::GET, "/barriers/maintenance")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    // A hold that lifts itself leaves the list too.
    a.post("/api/v1/barriers/brief/hold", json!({"ttl_ms": 300})).await;
    let (_, list) = a.get("/api/v1/barriers").await;
    assert!(
        listed(&list, "holds", "barrier").contains(&"brief".to_string()),
        "{list}"
    );
    let gone = wait_until(Duration::from_secs(3), || async {
        let (_, list) = a.get("/api/v1/barriers").await;
        !listed(&list, "holds", "barrier").contains(&"brief".to_string())
    })
    .await;
    assert!(gone);
    assert_eq!(a.get("/api/v1/barriers/brief").await.0, 404);
    // DELETE of a barrier that is only held lifts the hold.
    a.post("/api/v1/barriers/window/hold", json!({"holder": "ops"})).await;
    assert_eq!(a.delete("/api/v1/barriers/window").await.0, 204);
    assert_eq!(a.get("/api/v1/barriers/window").await.0, 404);
    let (_, v) = a.post("/api/v1/barriers/window/wait", json!({})).await;
    assert_eq!(v["held"], false);
    // The OpenAPI document says so.
    let (_, doc) = a.get("/api/v1/openapi.json").await;
    let detail = &doc["components"]["schemas"]["BarrierDetail"];
    let required: BTreeSet<String> = names(&detail["required"]);
    assert!(
        ["name", "configured", "hold"].iter().all(|f| required.contains(*f)),
        "{detail}"
    );
    assert!(!required.contains("participants"), "{detail}");
    assert!(detail["properties"]["participants"].is_object(), "{detail}");
    assert!(
        names(&doc["components"]["schemas"]["BarrierList"]["required"]).contains("holds"),
        "{doc}"
    );
    // A round's incarnation is internal (see a_cached_verdict_never_answers_a_reopened_round).
    let round = &doc["components"]["schemas"]["Round"];
    assert!(round["properties"].get("incarnation").is_none(), "{round}");
}
