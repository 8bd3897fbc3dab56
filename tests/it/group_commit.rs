//! Group commit (issue 41): concurrent single submits for one queue ride in
//! one script call, and each keeps the outcome it would have had alone.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::skip_on_cluster;
use crate::common::*;

/// The value of one series in `/metrics` (0 when absent).
fn series(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grouped_submits_keep_their_own_outcomes() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let queue = "grouped";
    // An alias held before the burst: the submits that ask for it are
    // refused, alone.
    let (s, held) = app
        .post(
            &format!("/api/v1/queues/{queue}/tasks"),
            json!({"payload": 0, "alias": "taken"}),
        )
        .await;
    assert_eq!(s, 201, "{held}");
    let holder = held["id"].as_str().unwrap().to_string();

    // Under server.max_connections_per_address (256): one connection each.
    const N: usize = 200;
    let bodies: Vec<Value> = (0..N)
        .map(|i| match i % 20 {
            0 => json!({"payload": i, "alias": "taken"}),
            1 | 2 => json!({"payload": "once", "idempotency_key": "same-key"}),
            _ => json!({"payload": i}),
        })
        .collect();
    let path = format!("/api/v1/queues/{queue}/tasks");
    let answers = futures_util::future::join_all(bodies.iter().map(|b| app.post(&path, b.clone()))).await;

    let mut created = std::collections::BTreeSet::new();
    let (mut replays, mut once) = (Vec::new(), Vec::new());
    for (b, (s, r)) in bodies.iter().zip(&answers) {
        if b.get("alias").is_some() {
            assert_eq!(*s, 409, "the alias is taken: {r}");
            assert!(r["detail"].as_str().unwrap_or("").contains(&holder), "{r}");
        } else if b.get("idempotency_key").is_some() {
            assert!(*s == 201 || *s == 200, "{s} {r}");
            once.push(r["id"].as_str().unwrap().to_string());
            if *s == 200 {
                replays.push(r["id"].as_str().unwrap().to_string());
            }
        } else {
            assert_eq!(*s, 201, "{r}");
            assert_eq!(r["state"], "queued", "{r}");
            assert!(
                created.insert(r["id"].as_str().unwrap().to_string()),
                "each its own id: {r}"
            );
        }
    }
    // One key, one task: the first submit created it, every other one
    // (in the same group or not) answered the original.
    once.dedup();
    assert_eq!(once.len(), 1, "one task per idempotency key: {once:?}");
    assert_eq!(
        replays.len(),
        2 * N / 20 - 1,
        "every other submit of the key is a replay"
    );
    // Each created task is there with its own payload.
    for (b, (_, r)) in bodies.iter().zip(&answers).filter(|(_, (s, _))| *s == 201) {
        let (st, t) = app.get(&format!("/api/v1/tasks/{}", r["id"].as_str().unwrap())).await;
        assert_eq!(st, 200);
        assert_eq!(t["payload"], b["payload"], "{t}");
    }
    let want = json!(created.len() + 2);
    let counted = wait_until(Duration::from_secs(5), || async {
        app.get(&format!("/api/v1/queues/{queue}")).await.1["queued"] == want
    })
    .await;
    assert!(counted, "{}", app.get(&format!("/api/v1/queues/{queue}")).await.1);

    // They did ride together: some script calls carried several submits.
    let m = app.page("/metrics").await;
    let calls = series(&m, "muster_group_commit_calls_total{op=\"submit\"}");
    let items = series(&m, "muster_group_commit_items_total{op=\"submit\"}");
    assert!(
        calls >= 1.0 && items > calls,
        "grouped calls {calls}, their items {items}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_past_its_deadline_changes_nothing() {
    if skip_on_cluster("a fault proxy in front of one Redis server") {
        return;
    }
    let redis = TestRedis::start_with(&["--enable-debug-command", "yes"]);
    let proxy = FaultProxy::start(redis.port).await;
    let direct = TestApp::start(&redis).await;
    // One call in flight: the rest queue behind it.
    let a = TestApp::start_with(&redis, |c| {
        c.redis.url = proxy.url();
        c.tasks.group_in_flight = 1;
    })
    .await;
    // The script loaded first (a held EVALSHA Redis has never seen would
    // come back NOSCRIPT and prove nothing).
    let (s, _) = a.post("/api/v1/queues/warm/tasks", json!({"payload": 0})).await;
    assert_eq!(s, 201);
    let submit = |i: u64| {
        let a = &a;
        async move {
            a.post(
                "/api/v1/queues/held/tasks",
                json!({"payload": i, "idempotency_key": format!("k{i}")}),
            )
            .await
        }
    };

    // Redis stalls for 1.3 s. The first submit's call waits in Redis; the
    // next ones queue behind it in the node, and their deadlines (1.5 s from
    // their arrival) run while they wait. Then everything the node sends is
    // held in transit, and the group goes when the first call returns: it
    // is held past the node's timeout (503 to each member) and delivered
    // after its deadline, the earliest of its members'.
    redis.stall(Duration::from_millis(1300));
    let first = submit(0);
    let members = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        futures_util::future::join_all((1..=20).map(submit)).await
    };
    let hold = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.hold();
    };
    let ((s0, r0), answers, ()) = tokio::join!(first, members, hold);
    assert_eq!(s0, 201, "the first call went before the hold: {r0}");
    for (s, r) in &answers {
        assert_eq!(*s, 503, "the group was held past the node's timeout: {r}");
    }
    // Redis gets the group now, past its deadline, and refuses it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.release();
    let back = wait_until(Duration::from_secs(10), || async {
        a.post("/api/v1/queues/after/tasks", json!({"payload": 1})).await.0 == 201
    })
    .await;
    assert!(back);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let info: String = redis.cmd(&["INFO", "errorstats"]).await;
    assert!(
        info.contains("errorstat_LATE"),
        "the held group reached Redis and was refused: {info}"
    );
    // No member answered 503 took effect: each key is unused.
    for i in 1..=20 {
        let (s, r) = direct
            .post(
                "/api/v1/queues/held/tasks",
                json!({"payload": i, "idempotency_key": format!("k{i}")}),
            )
            .await;
        assert_eq!(s, 201, "k{i} was never applied: {r}");
    }
    let m = a.page("/metrics").await;
    assert!(
        series(&m, "muster_group_commit_items_total{op=\"submit\"}") >= 2.0,
        "the members went as a group"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grouped_completes_keep_their_own_outcomes_and_claim_each_their_owners_next() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let queue = "grouped-done";
    const W: usize = 48;
    for i in 0..2 * W {
        crate::tasks::submit(&app, queue, json!({"payload": i})).await;
    }
    let mut held = Vec::new();
    for w in 0..W {
        let worker = format!("gw{w}");
        crate::tasks::join(&app, &worker).await;
        let t = crate::tasks::claim_tasks(&app, queue, &worker, 1, 0).await;
        assert_eq!(t.len(), 1);
        held.push((worker, t[0].id.clone(), t[0].token));
    }
    // Every worker completes at once, asking for its next task; one in
    // eight with a stale token.
    let stale = |w: usize| w.is_multiple_of(8);
    let answers = futures_util::future::join_all(held.iter().enumerate().map(|(w, (_, id, token))| {
        let token = if stale(w) { token + 1000 } else { *token };
        let app = &app;
        async move {
            app.post(
                &format!("/api/v1/tasks/{id}/complete"),
                json!({"token": token, "result": w, "next": {"max": 1}}),
            )
            .await
        }
    }))
    .await;

    let mut next_ids = std::collections::BTreeSet::new();
    let mut tokens = std::collections::BTreeSet::new();
    for (w, ((worker, id, token), (s, r))) in held.iter().zip(&answers).enumerate() {
        let (_, t) = app.get(&format!("/api/v1/tasks/{id}")).await;
        if stale(w) {
            assert_eq!(*s, 409, "a stale token is refused alone: {r}");
            assert_eq!(t["state"], "running", "{t}");
            continue;
        }
        assert_eq!(*s, 200, "{r}");
        assert_eq!(r["state"], "succeeded", "{r}");
        assert_eq!(t["result"], json!(w), "its own result: {t}");
        let next = r["next"]["tasks"].as_array().expect("a next task");
        assert_eq!(next.len(), 1, "{r}");
        let nid = next[0]["id"].as_str().unwrap().to_string();
        let ntoken = next[0]["token"].as_u64().unwrap();
        assert!(next_ids.insert(nid.clone()), "each its own next task: {r}");
        assert!(tokens.insert(ntoken), "each its own fencing token: {r}");
        assert!(ntoken > *token, "tokens only grow (G1)");
        let (_, n) = app.get(&format!("/api/v1/tasks/{nid}")).await;
        assert_eq!(n["state"], "running", "{n}");
        assert_eq!(n["owner"], json!(worker), "claimed for the worker that asked: {n}");
        // The token it was handed is the one that completes it.
        let (s, r) = app
            .post(&format!("/api/v1/tasks/{nid}/complete"), json!({"token": ntoken}))
            .await;
        assert_eq!(s, 200, "{r}");
    }
    assert_eq!(next_ids.len(), W - W / 8);

    let m = app.page("/metrics").await;
    let calls = series(&m, "muster_group_commit_calls_total{op=\"complete\"}");
    let items = series(&m, "muster_group_commit_items_total{op=\"complete\"}");
    assert!(
        calls >= 1.0 && items > calls,
        "grouped calls {calls}, their items {items}"
    );
}
