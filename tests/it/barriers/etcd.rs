//! The etcd-style Barrier (hold, release, wait) and DoubleBarrier (enter, leave, crashed entrants), and holds on the list.

use muster::client::BarrierList;

use super::*;

/// The barriers of the holds in force, in list order.
fn held(list: &BarrierList) -> Vec<String> {
    list.holds.iter().map(|h| h.barrier.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hold_release_and_wait() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start(&redis).await);
    let b = TestApp::start(&redis).await;
    // Not held: wait returns at once.
    assert!(!a.api().wait_barrier("gate", 5000).await.unwrap().held);
    // Raw: held now (201) or refreshed (200) is a status the typed client
    // does not show.
    let (s, v) = a.post("/api/v1/barriers/gate/hold", json!({"holder": "ops"})).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(
        a.post("/api/v1/barriers/gate/hold", json!({"holder": "ops"})).await.0,
        200
    );
    let p = problem(a.api().hold_barrier("gate", Some("other"), None).await);
    assert_eq!((p.status, p.extra["holder"].clone()), (409, json!("ops")));
    // Held: wait times out with held: true.
    assert!(b.api().wait_barrier("gate", 100).await.unwrap().held);
    // Waiters on two nodes wake on release.
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let a = a.clone();
        waiters.push(tokio::spawn(async move {
            let v = a.api().wait_barrier("gate", 10_000).await;
            (Instant::now(), v)
        }));
    }
    tokio::task::yield_now().await;
    let released = b.api().release_barrier("gate").await.unwrap();
    let t0 = Instant::now();
    assert!(released);
    for w in waiters {
        let (at, v) = w.await.unwrap();
        assert!(!v.unwrap().held);
        assert!(at.saturating_duration_since(t0) < Duration::from_millis(500));
    }
    assert!(!b.api().release_barrier("gate").await.unwrap());
    // A hold with a TTL lifts itself; a waiter sees it within the TTL.
    a.api().hold_barrier("gate", None, Some(300)).await.unwrap();
    let t = Instant::now();
    assert!(!b.api().wait_barrier("gate", 5000).await.unwrap().held);
    assert!(t.elapsed() < Duration::from_millis(1500), "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn double_barrier_count_too_many_and_leave() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start(&redis).await);
    let b = Arc::new(TestApp::start(&redis).await);
    let _hb: Vec<_> = futures_util::future::join_all(["w1", "w2", "w3", "w4"].map(|w| join_worker(&a, w))).await;
    // An unregistered node cannot enter.
    assert_eq!(problem(enter(&a, "d", "ghost", 3, 0).await).status, 409);
    // Two enter and wait; the third makes it ready for all three.
    let mut waiting = Vec::new();
    for (i, w) in ["w1", "w2"].into_iter().enumerate() {
        let app = if i == 0 { a.clone() } else { b.clone() };
        waiting.push(tokio::spawn(async move { enter(&app, "d", w, 3, 10_000).await }));
    }
    let two_in = wait_until(Duration::from_secs(5), || async {
        a.api().double_barrier("d").await.unwrap().entrants.len() == 2
    })
    .await;
    assert!(two_in);
    let v = enter(&a, "d", "w1", 3, 0).await.unwrap();
    assert_eq!((v.done, v.inside), (false, true), "re-entering is a no-op");
    // A different count is refused.
    assert_eq!(problem(enter(&b, "d", "w3", 4, 0).await).status, 409);
    let v = enter(&b, "d", "w3", 3, 0).await.unwrap();
    assert!(v.done, "{v:?}");
    for w in waiting {
        let v = w.await.unwrap().unwrap();
        assert_eq!((v.done, v.state.ready), (true, true), "{v:?}");
    }
    // The count+1-th entrant is refused.
    let p = problem(enter(&a, "d", "w4", 3, 0).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert_eq!(p.extra["reason"], "too_many");
    // Leaving: nobody is done until all three have left.
    let (a2, b2) = (a.clone(), b.clone());
    let l1 = tokio::spawn(async move { leave(&a2, "d", "w1", 10_000).await });
    let l2 = tokio::spawn(async move { leave(&b2, "d", "w2", 10_000).await });
    let one_left = wait_until(Duration::from_secs(5), || async {
        a.api().double_barrier("d").await.unwrap().entrants.len() == 1
    })
    .await;
    assert!(one_left);
    // Even while some have left, the barrier is still full.
    assert_eq!(problem(enter(&a, "d", "w4", 3, 0).await).status, 409);
    assert!(!l1.is_finished() && !l2.is_finished(), "leave waits for the others");
    let v = leave(&a, "d", "w3", 5000).await.unwrap();
    assert!(v.done, "{v:?}");
    for l in [l1, l2] {
        let v = l.await.unwrap().unwrap();
        assert!(v.done, "{v:?}");
    }
    // Reset: a new cycle can start.
    let v = enter(&a, "d", "w4", 1, 0).await.unwrap();
    assert!(v.done, "{v:?}");
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
    enter(&a, "e", "crash", 3, 0).await.unwrap();
    enter(&a, "e", "w1", 3, 0).await.unwrap();
    crash.store(true, Ordering::SeqCst);
    let evicted = wait_until(Duration::from_secs(5), || async {
        let d = a.api().double_barrier("e").await.unwrap();
        !d.entrants.iter().any(|e| e.node == "crash")
    })
    .await;
    assert!(evicted, "the background loop evicts an entrant whose node is dead");
    let a2 = a.clone();
    let w2_enter = tokio::spawn(async move { enter(&a2, "e", "w2", 3, 10_000).await });
    let v = enter(&a, "e", "w3", 3, 10_000).await.unwrap();
    assert!(v.done, "{v:?}");
    assert!(w2_enter.await.unwrap().unwrap().done);
    // Ready phase: w1 crashes without leaving; the others' leave completes
    // once it is dead instead of hanging.
    w1.store(true, Ordering::SeqCst);
    let t = Instant::now();
    let a2 = a.clone();
    let l2 = tokio::spawn(async move { leave(&a2, "e", "w2", 10_000).await });
    let v = leave(&a, "e", "w3", 10_000).await.unwrap();
    assert!(v.done, "{v:?}");
    assert!(l2.await.unwrap().unwrap().done);
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
    let v = a.api().barrier("maintenance").await.unwrap();
    assert_eq!((v.name.as_str(), v.configured), ("maintenance", false), "{v:?}");
    assert_eq!((v.hold.held, v.hold.holder.as_deref()), (true, Some("release-bot")));
    // Absent from the JSON, not null: read raw.
    let (_, raw) = a.get("/api/v1/barriers/maintenance").await;
    assert!(
        raw.get("participants").is_none() && raw.get("timeout_ms").is_none(),
        "{raw}"
    );
    // A configured barrier, held too.
    configure(&a, "gate", &strings(&["x"]), 0, 1000).await;
    let v = a.api().barrier("gate").await.unwrap();
    assert_eq!((v.configured, v.hold.held), (true, false), "{v:?}");
    assert_eq!(v.participants, Some(strings(&["x"])), "{v:?}");
    a.api().hold_barrier("gate", Some("ops"), None).await.unwrap();
    let list = a.api().barriers().await.unwrap();
    let configured: Vec<&str> = list.barriers.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(configured, ["gate"], "{list:?}");
    assert_eq!(held(&list), ["gate", "maintenance"], "{list:?}");
    assert_eq!(list.holds[1].holder.as_deref(), Some("release-bot"), "{list:?}");
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
    assert!(a.api().release_barrier("maintenance").await.unwrap());
    assert_eq!(problem(a.api().barrier("maintenance").await).status, 404);
    let list = a.api().barriers().await.unwrap();
    assert_eq!(held(&list), ["gate"], "{list:?}");
    assert!(!a.page("/barriers").await.contains("data-hold=\"maintenance\""));
    let resp = a
        .request(reqwest::Method::GET, "/barriers/maintenance")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    // A hold that lifts itself leaves the list too.
    a.api().hold_barrier("brief", None, Some(300)).await.unwrap();
    let list = a.api().barriers().await.unwrap();
    assert!(held(&list).contains(&"brief".to_string()), "{list:?}");
    let gone = wait_until(Duration::from_secs(3), || async {
        !held(&a.api().barriers().await.unwrap()).contains(&"brief".to_string())
    })
    .await;
    assert!(gone);
    assert_eq!(problem(a.api().barrier("brief").await).status, 404);
    // DELETE of a barrier that is only held lifts the hold.
    a.api().hold_barrier("window", Some("ops"), None).await.unwrap();
    a.api().delete_barrier("window").await.unwrap();
    assert_eq!(problem(a.api().barrier("window").await).status, 404);
    assert!(!a.api().wait_barrier("window", 0).await.unwrap().held);
    // The OpenAPI document says so (a JSON document: read raw).
    let doc = a.api().openapi().await.unwrap();
    let detail = &doc["components"]["schemas"]["BarrierDetail"];
    let required: BTreeSet<String> = serde_json::from_value(detail["required"].clone()).unwrap();
    assert!(
        ["name", "configured", "hold"].iter().all(|f| required.contains(*f)),
        "{detail}"
    );
    assert!(!required.contains("participants"), "{detail}");
    assert!(detail["properties"]["participants"].is_object(), "{detail}");
    let list_required: BTreeSet<String> =
        serde_json::from_value(doc["components"]["schemas"]["BarrierList"]["required"].clone()).unwrap();
    assert!(list_required.contains("holds"), "{doc}");
    // A round's incarnation is internal (see a_cached_verdict_never_answers_a_reopened_round).
    let round = &doc["components"]["schemas"]["Round"];
    assert!(round["properties"].get("incarnation").is_none(), "{round}");
}
