//! Barriers (G8): every participant of a round reads the same verdict, the
//! verdict follows the rule, late arrivals read it too, a round nobody calls
//! about is decided at its deadline, waiters wake on the decision; etcd-style
//! holds and DoubleBarriers (count, too-many, leave, a crashed entrant); the
//! CLI's exit codes; the page, the metrics, keys returning to baseline, and
//! each script refusal's HTTP answer.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

async fn configure(app: &TestApp, name: &str, parts: &[String], max_missing: u32, timeout_ms: u64) {
    let (s, body) = app
        .put(
            &format!("/api/v1/barriers/{name}"),
            json!({"participants": parts, "max_missing": max_missing, "timeout_ms": timeout_ms}),
        )
        .await;
    assert!(s == 200 || s == 201, "{s} {body}");
}

async fn arrive(app: &TestApp, name: &str, round: &str, node: &str, wait_ms: u64) -> (u16, Value) {
    app.post(
        &format!("/api/v1/barriers/{name}/rounds/{round}/arrive"),
        json!({"node": node, "wait_ms": wait_ms}),
    )
    .await
}

fn names(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

/// Decision events per round: round id -> [verdict, ...].
async fn decisions(redis: &TestRedis, barrier: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (ty, _, f) in redis.events("muster").await {
        if (ty == "barrier.released" || ty == "barrier.aborted") && f["barrier"] == barrier {
            out.entry(f["round"].as_str().unwrap().to_string())
                .or_default()
                .push(ty.trim_start_matches("barrier.").to_string());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_participant_reads_one_verdict_that_follows_the_rule() {
    let redis = TestRedis::start();
    let nodes = Arc::new(vec![
        TestApp::start(&redis).await,
        TestApp::start(&redis).await,
        TestApp::start(&redis).await,
    ]);
    let n = 5;
    let m = 1u32;
    let parts: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
    configure(&nodes[0], "cycle", &parts, m, 1500).await;
    // k = 0 ..= m + 1 participants missing, three rounds each, all at once;
    // arrivals spread over the three nodes with random delays.
    let mut rounds = Vec::new();
    for k in 0..=(m as usize + 1) {
        for rep in 0..3 {
            let round = format!("k{k}-{rep}");
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                order.swap(i, rand::random_range(0..=i));
            }
            let missing: BTreeSet<String> = order[..k].iter().map(|&i| parts[i].clone()).collect();
            rounds.push((round, k, missing));
        }
    }
    let mut tasks = Vec::new();
    for (round, _, missing) in &rounds {
        for (i, p) in parts.iter().enumerate() {
            if missing.contains(p) {
                continue;
            }
            let (nodes, round, p) = (nodes.clone(), round.clone(), p.clone());
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(rand::random_range(0..300))).await;
                let (s, v) = arrive(&nodes[i % 3], "cycle", &round, &p, 10_000).await;
                assert_eq!(s, 200, "{v}");
                (round, p, v)
            }));
        }
    }
    let mut answers: BTreeMap<String, Vec<(String, Value)>> = BTreeMap::new();
    for t in tasks {
        let (round, p, v) = t.await.unwrap();
        answers.entry(round).or_default().push((p, v));
    }
    for (round, k, missing) in &rounds {
        let got = &answers[round];
        let expected = if *k as u32 <= m { "released" } else { "aborted" };
        let present: BTreeSet<String> = parts.iter().filter(|p| !missing.contains(*p)).cloned().collect();
        for (p, v) in got {
            assert_eq!(v["verdict"], expected, "round {round}, {p}: {v}");
            assert_eq!(names(&v["arrived"]), present, "round {round}: {v}");
            assert_eq!(&names(&v["missing"]), missing, "round {round}: {v}");
            assert_eq!(v["may_run"], expected == "released", "round {round}, {p}: {v}");
            assert_eq!(v["late"], false);
            let reason_deadline = *k > 0;
            let (_, r) = nodes[1].get(&format!("/api/v1/barriers/cycle/rounds/{round}")).await;
            assert_eq!(r["reason"], if reason_deadline { "deadline" } else { "all_arrived" });
        }
        // Every participant saw the same decision time.
        let decided: HashSet<i64> = got.iter().map(|(_, v)| v["decided_at"].as_i64().unwrap()).collect();
        assert_eq!(decided.len(), 1, "round {round}");
        // The missing ones arrive late: same verdict, may not run.
        for (i, p) in missing.iter().enumerate() {
            let (s, v) = arrive(&nodes[i % 3], "cycle", round, p, 0).await;
            assert_eq!(s, 200);
            assert_eq!(v["verdict"], expected, "late {p} in {round}: {v}");
            assert_eq!(v["may_run"], false);
            assert_eq!(v["late"], true);
            assert_eq!(&names(&v["missing"]), missing);
        }
    }
    // Exactly one decision per round, written once, whoever decided it.
    let d = decisions(&redis, "cycle").await;
    assert_eq!(d.len(), rounds.len(), "{d:?}");
    for (round, k, _) in &rounds {
        let expected = if *k as u32 <= m { "released" } else { "aborted" };
        assert_eq!(d[round], vec![expected.to_string()], "round {round}");
    }
    let events = redis.events("muster").await;
    let late = events.iter().filter(|(t, _, _)| t == "barrier.late").count();
    assert_eq!(late, rounds.iter().map(|(_, k, _)| k).sum::<usize>());
    let opened = events.iter().filter(|(t, _, _)| t == "barrier.round_opened").count();
    assert_eq!(opened, rounds.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_nobody_calls_about_is_decided_at_its_deadline() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let parts: Vec<String> = ["x", "y", "z"].iter().map(|s| s.to_string()).collect();
    configure(&a, "quiet", &parts, 1, 300).await;
    // Two of three arrive without waiting: released at the deadline.
    assert_eq!(arrive(&a, "quiet", "r1", "x", 0).await.1["verdict"], "pending");
    assert_eq!(arrive(&b, "quiet", "r1", "y", 0).await.1["verdict"], "pending");
    // One of three: aborted at the deadline.
    assert_eq!(arrive(&b, "quiet", "r2", "z", 0).await.1["verdict"], "pending");
    let decided = wait_until(Duration::from_secs(5), || async {
        let (_, r1) = a.get("/api/v1/barriers/quiet/rounds/r1").await;
        let (_, r2) = a.get("/api/v1/barriers/quiet/rounds/r2").await;
        r1["verdict"] != "pending" && r2["verdict"] != "pending"
    })
    .await;
    assert!(decided, "the background loop decides rounds past their deadline");
    for (round, verdict) in [("r1", "released"), ("r2", "aborted")] {
        let (_, r) = a.get(&format!("/api/v1/barriers/quiet/rounds/{round}")).await;
        assert_eq!(r["verdict"], verdict, "{r}");
        assert_eq!(r["reason"], "deadline");
        let late_by = r["decided_at"].as_i64().unwrap() - r["deadline"].as_i64().unwrap();
        // barriers.interval_ms is 200; allow scheduling slack.
        assert!((0..=1000).contains(&late_by), "decided {late_by} ms after the deadline");
    }
    // Two nodes ran the loop; each round still has exactly one decision.
    let d = decisions(&redis, "quiet").await;
    assert_eq!(d["r1"], vec!["released"]);
    assert_eq!(d["r2"], vec!["aborted"]);
    // A participant reading afterwards: may run only if it had arrived.
    let (_, v) = arrive(&a, "quiet", "r1", "x", 0).await;
    assert_eq!((v["may_run"].clone(), v["late"].clone()), (json!(true), json!(false)));
    let (_, v) = arrive(&a, "quiet", "r1", "z", 0).await;
    assert_eq!((v["may_run"].clone(), v["late"].clone()), (json!(false), json!(true)));
    // The deadline index holds open rounds only.
    let open: i64 = redis.cmd(&["ZCARD", "{muster}:barriers:deadlines"]).await;
    assert_eq!(open, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_wake_on_the_decision_not_by_polling() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start(&redis).await);
    let b = TestApp::start(&redis).await;
    let parts: Vec<String> = ["w", "last"].iter().map(|s| s.to_string()).collect();
    configure(&a, "wake", &parts, 0, 30_000).await;
    // The safety re-check is 1 s: a waiter that were not woken by the event
    // would answer anywhere up to 1 s late; five rounds make a lucky pass
    // vanishingly unlikely.
    let mut worst = Duration::ZERO;
    for i in 0..5 {
        let round = format!("r{i}");
        let (a2, r2) = (a.clone(), round.clone());
        let waiter = tokio::spawn(async move {
            let v = arrive(&a2, "wake", &r2, "w", 10_000).await;
            (Instant::now(), v)
        });
        let arrived = wait_until(Duration::from_secs(5), || async {
            let (s, r) = a.get(&format!("/api/v1/barriers/wake/rounds/{round}")).await;
            s == 200 && r["arrived"].as_array().is_some_and(|x| x.len() == 1)
        })
        .await;
        assert!(arrived);
        let t0 = Instant::now();
        let (_, v) = arrive(&b, "wake", &round, "last", 0).await;
        assert_eq!(v["verdict"], "released");
        let (at, (s, v)) = waiter.await.unwrap();
        assert_eq!(s, 200);
        assert_eq!(v["verdict"], "released");
        assert_eq!(v["may_run"], true);
        worst = worst.max(at.saturating_duration_since(t0));
    }
    assert!(worst < Duration::from_millis(300), "slowest wake-up {worst:?}");
    let text = a.page("/metrics").await;
    assert!(
        text.contains("muster_barrier_rounds_total{verdict=\"released\"}"),
        "rounds counter"
    );
    assert!(text.contains("muster_barrier_wait_seconds_bucket"), "wait histogram");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_problems() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let parts: Vec<String> = ["x", "y"].iter().map(|s| s.to_string()).collect();
    // Unknown barrier, non-participant, bad names and values.
    assert_eq!(arrive(&a, "nope", "r", "x", 0).await.0, 404);
    configure(&a, "b", &parts, 1, 1000).await;
    let (s, v) = arrive(&a, "b", "r", "intruder", 0).await;
    assert_eq!(s, 403, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("not a participant"));
    // A non-participant opens nothing.
    assert_eq!(a.get("/api/v1/barriers/b/rounds/r").await.0, 404);
    assert_eq!(arrive(&a, "b", "a:b", "x", 0).await.0, 400);
    assert_eq!(arrive(&a, "b", "r", "bad id", 0).await.0, 400);
    assert_eq!(arrive(&a, "b", "r", "x", 3_600_000).await.0, 400);
    for body in [
        json!({"participants": [], "timeout_ms": 100}),
        json!({"participants": ["a", "a"], "timeout_ms": 100}),
        json!({"participants": ["a"], "max_missing": 1, "timeout_ms": 100}),
        json!({"participants": ["a"], "timeout_ms": 0}),
        json!({"participants": ["a"], "timeout_ms": 100, "extra": 1}),
    ] {
        let (s, v) = a.put("/api/v1/barriers/c", body.clone()).await;
        assert_eq!(s, 400, "{body}: {v}");
    }
    // Configuration changes apply to new rounds; open rounds keep theirs.
    assert_eq!(arrive(&a, "b", "open", "x", 0).await.1["verdict"], "pending");
    configure(&a, "b", &["z".to_string()], 0, 1000).await;
    let (s, v) = arrive(&a, "b", "open", "y", 0).await;
    assert_eq!((s, v["verdict"].as_str()), (200, Some("released")), "{v}");
    assert_eq!(arrive(&a, "b", "new", "x", 0).await.0, 403);
    // Delete: gone, with its rounds.
    assert_eq!(a.delete("/api/v1/barriers/b").await.0, 204);
    assert_eq!(a.get("/api/v1/barriers/b/rounds/open").await.0, 404);
    assert_eq!(a.delete("/api/v1/barriers/b").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_are_bounded_and_keys_return_to_baseline() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| {
        c.barriers.rounds_kept = 5;
        c.barriers.round_retention_ms = 1000;
        c.barriers.idle_ttl_ms = 1000;
    })
    .await;
    join_worker(&a, "dw").await;
    let baseline: HashSet<String> = redis.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect();
    let parts: Vec<String> = ["x", "y"].iter().map(|s| s.to_string()).collect();
    configure(&a, "bounded", &parts, 0, 200).await;
    for i in 0..20 {
        let round = format!("r{i:02}");
        arrive(&a, "bounded", &round, "x", 0).await;
        if i % 2 == 0 {
            arrive(&a, "bounded", &round, "y", 0).await;
        }
    }
    // The last round may still be open; wait for the deadline loop.
    let settled = wait_until(Duration::from_secs(5), || async {
        let (_, r) = a.get("/api/v1/barriers/bounded/rounds").await;
        r["rounds"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["verdict"] != "pending")
    })
    .await;
    assert!(settled);
    let (_, r) = a.get("/api/v1/barriers/bounded/rounds?limit=100").await;
    let kept = r["rounds"].as_array().unwrap();
    assert_eq!(kept.len(), 5, "rounds_kept rounds once all are decided");
    assert_eq!(kept[0]["round"], "r19", "newest first");
    let round_keys: Vec<String> = redis.cmd(&["KEYS", "{muster}:barrier:bounded:r:*"]).await;
    assert_eq!(round_keys.len(), 5, "{round_keys:?}");
    // A hold and a DoubleBarrier, then everything goes away.
    a.post("/api/v1/barriers/h/hold", json!({"ttl_ms": 500})).await;
    let (s, v) = a
        .post("/api/v1/double-barriers/d/enter", json!({"node": "dw", "count": 2}))
        .await;
    assert_eq!(s, 200, "{v}");
    a.post("/api/v1/double-barriers/d/leave", json!({"node": "dw"})).await;
    // Every key left has a TTL, or is bounded: the stream (MAXLEN), the
    // barrier's config and the set of names (max_barriers), the
    // DoubleBarrier index (trimmed by idle time and swept by the loop).
    let bounded = [
        "{muster}:events",
        "{muster}:barriers",
        "{muster}:barrier:bounded",
        "{muster}:dbarriers",
    ];
    for k in redis.cmd::<Vec<String>>(&["KEYS", "*"]).await {
        if baseline.contains(&k) {
            continue;
        }
        let ttl: i64 = redis.cmd(&["PTTL", &k]).await;
        // -2: it expired between the listing and this check.
        assert!(ttl != -1 || bounded.contains(&k.as_str()), "{k} has no TTL");
    }
    // Decided rounds (and their index) expire after round_retention_ms on their own.
    let expired = wait_until(Duration::from_secs(5), || async {
        redis
            .cmd::<Vec<String>>(&["KEYS", "{muster}:barrier:bounded:r*"])
            .await
            .is_empty()
    })
    .await;
    assert!(expired, "rounds and their index expire");
    assert_eq!(a.delete("/api/v1/barriers/bounded").await.0, 204);
    let back = wait_until(Duration::from_secs(10), || async {
        let now: HashSet<String> = redis.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect();
        now.difference(&baseline)
            .all(|k| k == "{muster}:events" || k.starts_with("{muster}:nodes:"))
    })
    .await;
    let now: HashSet<String> = redis.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect();
    assert!(back, "left over: {:?}", now.difference(&baseline).collect::<Vec<_>>());
}

// --- etcd-style Barrier ------------------------------------------------------

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

// --- DoubleBarrier -----------------------------------------------------------

/// Joins an external worker and keeps it heartbeating (ttl 500 ms) until the
/// returned flag is set (a crash: it stops heartbeating).
async fn join_worker(app: &TestApp, id: &str) -> Arc<AtomicBool> {
    let (s, _) = app
        .put(&format!("/api/v1/nodes/{id}/heartbeat"), json!({"ttl_ms": 500}))
        .await;
    assert_eq!(s, 200);
    let stop = Arc::new(AtomicBool::new(false));
    let (url, id, flag) = (app.url.clone(), id.to_string(), stop.clone());
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        while !flag.load(Ordering::SeqCst) {
            let _ = http
                .put(format!("{url}/api/v1/nodes/{id}/heartbeat"))
                .json(&json!({"ttl_ms": 500}))
                .send()
                .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    stop
}

async fn enter(app: &TestApp, name: &str, node: &str, count: u32, wait_ms: u64) -> (u16, Value) {
    app.post(
        &format!("/api/v1/double-barriers/{name}/enter"),
        json!({"node": node, "count": count, "wait_ms": wait_ms}),
    )
    .await
}

async fn leave(app: &TestApp, name: &str, node: &str, wait_ms: u64) -> (u16, Value) {
    app.post(
        &format!("/api/v1/double-barriers/{name}/leave"),
        json!({"node": node, "wait_ms": wait_ms}),
    )
    .await
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

// --- the CLI and the page ----------------------------------------------------

fn cli_arrive(app: &TestApp, round: &str, node: &str, wait: &str) -> (Option<i32>, Value) {
    let out = Command::new(muster_bin())
        .args([
            "barrier", "arrive", "cron", round, "--node", node, "--wait", wait, "--url", &app.url,
        ])
        .env_remove("MUSTER_CONFIG")
        .env_remove("MUSTER_TOKEN")
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cli_exit_codes_and_verdict_json() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let parts: Vec<String> = ["h1", "h2", "h3"].iter().map(|s| s.to_string()).collect();
    configure(&a, "cron", &parts, 1, 800).await;
    // h1 and h2 arrive (h3 is lost): both may run (exit 0); h3 is late (4).
    let url = a.url.clone();
    let h2 = std::thread::spawn(move || {
        let out = Command::new(muster_bin())
            .args([
                "barrier", "arrive", "cron", "day1", "--node", "h2", "--wait", "10s", "--url", &url,
            ])
            .env_remove("MUSTER_TOKEN")
            .output()
            .unwrap();
        out.status.code()
    });
    let (code, v) = cli_arrive(&a, "day1", "h1", "10s");
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["verdict"], "released");
    assert_eq!(v["may_run"], true);
    assert_eq!(names(&v["missing"]), BTreeSet::from(["h3".to_string()]));
    assert_eq!(h2.join().unwrap(), Some(0));
    let (code, v) = cli_arrive(&a, "day1", "h3", "10s");
    assert_eq!((code, v["late"].clone()), (Some(4), json!(true)), "{v}");
    // Alone: aborted at the deadline (3).
    let (code, v) = cli_arrive(&a, "day2", "h1", "10s");
    assert_eq!((code, v["verdict"].clone()), (Some(3), json!("aborted")), "{v}");
    // No verdict within --wait (5).
    let (code, v) = cli_arrive(&a, "day3", "h1", "100ms");
    assert_eq!((code, v["verdict"].clone()), (Some(5), json!("pending")), "{v}");
    // A non-participant is an error (1), with the reason on stderr.
    let (code, _) = cli_arrive(&a, "day4", "intruder", "1s");
    assert_eq!(code, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barriers_page_shows_rounds_with_arrivals() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let parts: Vec<String> = ["n-one", "n-two"].iter().map(|s| s.to_string()).collect();
    configure(&a, "nightly", &parts, 1, 60_000).await;
    arrive(&a, "nightly", "2026-11-22", "n-one", 0).await;
    let html = a.page("/barriers").await;
    assert!(
        html.contains("nightly") && html.contains("n-one") && html.contains("n-two"),
        "{html}"
    );
    assert!(html.contains("http-equiv=\"refresh\""), "live while a round is open");
    let resp = a
        .request(reqwest::Method::GET, "/barriers/nightly")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let html = resp.text().await.unwrap();
    assert!(html.contains("2026-11-22") && html.contains("pending"), "{html}");
    arrive(&a, "nightly", "2026-11-22", "n-two", 0).await;
    let html = a.page("/barriers/nightly").await;
    assert!(
        html.contains("released") && !html.contains("http-equiv=\"refresh\""),
        "{html}"
    );
    assert_eq!(
        a.request(reqwest::Method::GET, "/barriers/unknown")
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

// --- rounds kept, rounds open, incarnations, holds (issue #15) ----------------

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// How many times round `round` of `barrier` was opened, by the events.
async fn openings(redis: &TestRedis, barrier: &str, round: &str) -> usize {
    redis
        .events("muster")
        .await
        .iter()
        .filter(|(ty, _, f)| ty == "barrier.round_opened" && f["barrier"] == barrier && f["round"] == round)
        .count()
}

/// G8 with `rounds_kept` 1 and two rounds open: the arrival that decides the
/// older round used to delete it in the same script (404 for it and its
/// waiters; a re-arrival opened it again and a second verdict followed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deciding_a_round_never_deletes_it() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start_with(&redis, |c| c.barriers.rounds_kept = 1).await);
    let parts = strings(&["pa", "pb", "pc"]);
    configure(&a, "small", &parts, 0, 60_000).await;
    for r in ["r1", "r2"] {
        let (s, v) = arrive(&a, "small", r, "pa", 0).await;
        assert_eq!((s, v["verdict"].clone()), (200, json!("pending")), "{v}");
    }
    // pc waits for r1's verdict.
    let a2 = a.clone();
    let waiter = tokio::spawn(async move { arrive(&a2, "small", "r1", "pc", 10_000).await });
    let waiting = wait_until(Duration::from_secs(5), || async {
        let (_, r) = a.get("/api/v1/barriers/small/rounds/r1").await;
        r["arrived"].as_array().is_some_and(|v| v.len() == 2)
    })
    .await;
    assert!(waiting, "pc arrived at r1");
    // pb completes r1.
    let (s, v) = arrive(&a, "small", "r1", "pb", 200).await;
    assert_eq!(s, 200, "the completing arrival reads its round: {v}");
    assert_eq!(
        (v["verdict"].clone(), v["may_run"].clone()),
        (json!("released"), json!(true)),
        "{v}"
    );
    let (s, v) = waiter.await.unwrap();
    assert_eq!(s, 200, "the waiter reads the round: {v}");
    assert_eq!(
        (v["verdict"].clone(), v["may_run"].clone()),
        (json!("released"), json!(true)),
        "{v}"
    );
    let (s, r) = a.get("/api/v1/barriers/small/rounds/r1").await;
    assert_eq!((s, r["verdict"].clone()), (200, json!("released")), "{r}");
    assert!(r.get("incarnation").is_none(), "internal: {r}");
    // Arriving again (the documented retry) reads that verdict; nothing reopens.
    for p in &parts {
        let (s, v) = arrive(&a, "small", "r1", p, 0).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(
            (v["verdict"].clone(), v["may_run"].clone()),
            (json!("released"), json!(true)),
            "{p}: {v}"
        );
        assert_eq!(v["late"], false, "{v}");
    }
    assert_eq!(decisions(&redis, "small").await["r1"], ["released"], "one verdict");
    assert_eq!(openings(&redis, "small", "r1").await, 1, "r1 opened once");
    // The bound holds: deciding r2 deletes r1, the older decided round beyond
    // rounds_kept = 1, and never r2 itself.
    arrive(&a, "small", "r2", "pb", 0).await;
    let (s, v) = arrive(&a, "small", "r2", "pc", 0).await;
    assert_eq!((s, v["verdict"].clone()), (200, json!("released")), "{v}");
    assert_eq!(a.get("/api/v1/barriers/small/rounds/r2").await.0, 200);
    assert_eq!(a.get("/api/v1/barriers/small/rounds/r1").await.0, 404);
    let keys: Vec<String> = redis.cmd(&["KEYS", "{muster}:barrier:small:r:*"]).await;
    assert_eq!(keys, ["{muster}:barrier:small:r:r2"]);
    let (_, list) = a.get("/api/v1/barriers/small/rounds").await;
    assert_eq!(list["rounds"].as_array().unwrap().len(), 1, "{list}");
}

/// G4 for undecided rounds: at most `max_open_rounds` per barrier; the
/// arrival that would open one more gets 409 and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_rounds_are_bounded_per_barrier() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| {
        c.barriers.max_open_rounds = 2;
        c.barriers.rounds_kept = 1;
    })
    .await;
    configure(&a, "capped", &strings(&["x", "y"]), 0, 60_000).await;
    for r in ["o1", "o2"] {
        assert_eq!(arrive(&a, "capped", r, "x", 0).await.0, 200);
    }
    let keys_before: Vec<String> = redis.cmd(&["KEYS", "*"]).await;
    let events_before = redis.events("muster").await.len();
    let (s, v) = arrive(&a, "capped", "o3", "x", 1000).await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["reason"], "too_many_open_rounds", "{v}");
    assert_eq!(v["max_open_rounds"], 2, "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("barriers.max_open_rounds"),
        "{v}"
    );
    let keys_after: Vec<String> = redis.cmd(&["KEYS", "*"]).await;
    assert_eq!(
        keys_before.into_iter().collect::<BTreeSet<_>>(),
        keys_after.into_iter().collect::<BTreeSet<_>>()
    );
    assert_eq!(redis.events("muster").await.len(), events_before, "no event");
    assert_eq!(a.get("/api/v1/barriers/capped/rounds/o3").await.0, 404);
    // Open rounds still take arrivals; a non-participant is still 403.
    assert_eq!(arrive(&a, "capped", "o1", "x", 0).await.0, 200);
    assert_eq!(arrive(&a, "capped", "o3", "intruder", 0).await.0, 403);
    // Once one is decided, another may open.
    let (_, v) = arrive(&a, "capped", "o1", "y", 0).await;
    assert_eq!(v["verdict"], "released");
    let (s, v) = arrive(&a, "capped", "o3", "x", 0).await;
    assert_eq!((s, v["verdict"].clone()), (200, json!("pending")), "{v}");
    // A stale entry (a round decided by a node that predates the open index,
    // say) does not hold a place: at the bound, entries past their deadline
    // whose round is decided or gone are dropped first.
    assert_eq!(arrive(&a, "capped", "o2", "y", 0).await.1["verdict"], "released");
    redis
        .cmd::<i64>(&["ZADD", "{muster}:barrier:capped:open", "1", "ghost"])
        .await;
    assert_eq!(redis.cmd::<i64>(&["ZCARD", "{muster}:barrier:capped:open"]).await, 2);
    let (s, v) = arrive(&a, "capped", "o4", "x", 0).await;
    assert_eq!((s, v["verdict"].clone()), (200, json!("pending")), "{v}");
    let (s, v) = arrive(&a, "capped", "o5", "x", 0).await;
    assert_eq!((s, v["reason"].clone()), (409, json!("too_many_open_rounds")), "{v}");
}

/// The decided-rounds cache of a node never answers for another incarnation
/// of the round: after the barrier is deleted and configured again, a
/// participant at the reopened round waits for that round's own verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cached_verdict_never_answers_a_reopened_round() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start(&redis).await);
    let parts = strings(&["x", "y"]);
    configure(&a, "again", &parts, 0, 60_000).await;
    // x waits; y's arrival decides; x's waiter reads the decided round (and
    // the node keeps it for its other waiters).
    let a2 = a.clone();
    let waiter = tokio::spawn(async move { arrive(&a2, "again", "r", "x", 10_000).await });
    let waiting = wait_until(Duration::from_secs(5), || async {
        let (_, r) = a.get("/api/v1/barriers/again/rounds/r").await;
        r["arrived"].as_array().is_some_and(|v| v.len() == 1)
    })
    .await;
    assert!(waiting);
    arrive(&a, "again", "r", "y", 0).await;
    let (s, v) = waiter.await.unwrap();
    assert_eq!((s, v["verdict"].clone()), (200, json!("released")), "{v}");
    // The same round id, a new incarnation.
    assert_eq!(a.delete("/api/v1/barriers/again").await.0, 204);
    configure(&a, "again", &parts, 0, 60_000).await;
    // Longer than the 1 s re-check, within the cache's 5 s.
    let (s, v) = arrive(&a, "again", "r", "x", 1500).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["verdict"], "pending", "the old verdict must not answer: {v}");
    assert_eq!(v["may_run"], false, "{v}");
    assert_eq!(names(&v["arrived"]), BTreeSet::from(["x".to_string()]), "{v}");
    // Its own verdict does.
    let a2 = a.clone();
    let waiter = tokio::spawn(async move { arrive(&a2, "again", "r", "x", 10_000).await });
    arrive(&a, "again", "r", "y", 0).await;
    let (s, v) = waiter.await.unwrap();
    assert_eq!(
        (s, v["verdict"].clone(), v["may_run"].clone()),
        (200, json!("released"), json!(true)),
        "{v}"
    );
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

/// Every refusal a barrier script returns, by its code, maps to its HTTP
/// status and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_outcomes_map_to_http() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| {
        c.barriers.max_barriers = 1;
        c.barriers.max_open_rounds = 1;
    })
    .await;
    // E.NOT_FOUND: an arrival at a barrier nobody configured.
    assert_eq!(arrive(&a, "nope", "r", "x", 0).await.0, 404);
    // delete.lua's 0: deleting a barrier that is neither configured nor held.
    assert_eq!(a.delete("/api/v1/barriers/nope").await.0, 404);
    configure(&a, "only", &strings(&["x", "y"]), 0, 60_000).await;
    // E.TOO_MANY (max_barriers): a second barrier; updating the first is fine.
    let (s, v) = a
        .put(
            "/api/v1/barriers/second",
            json!({"participants": ["x"], "max_missing": 0, "timeout_ms": 1000}),
        )
        .await;
    assert_eq!(s, 409, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("barriers.max_barriers"), "{v}");
    configure(&a, "only", &strings(&["x", "y"]), 1, 60_000).await;
    // E.NOT_PARTICIPANT: 403, and nothing opened.
    let (s, v) = arrive(&a, "only", "r1", "intruder", 0).await;
    assert_eq!(s, 403, "{v}");
    assert_eq!(a.get("/api/v1/barriers/only/rounds/r1").await.0, 404);
    // E.TOO_MANY (max_open_rounds): a second open round.
    assert_eq!(arrive(&a, "only", "r1", "x", 0).await.0, 200);
    let (s, v) = arrive(&a, "only", "r2", "x", 0).await;
    assert_eq!((s, v["reason"].clone()), (409, json!("too_many_open_rounds")), "{v}");
    assert_eq!(v["max_open_rounds"], 1, "{v}");
    // E.WRONG_STATE (hold.lua): held by another holder.
    assert_eq!(a.post("/api/v1/barriers/g/hold", json!({"holder": "ops"})).await.0, 201);
    let (s, v) = a.post("/api/v1/barriers/g/hold", json!({"holder": "other"})).await;
    assert_eq!((s, v["holder"].clone()), (409, json!("ops")), "{v}");
    // E.NODE_NOT_ALIVE: an entrant whose node is not registered.
    let (s, v) = enter(&a, "d", "ghost", 2, 0).await;
    assert_eq!(s, 409, "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("`ghost` is not registered"),
        "{v}"
    );
    let _hb: Vec<_> = futures_util::future::join_all(["w1", "w2", "w3"].map(|w| join_worker(&a, w))).await;
    assert_eq!(enter(&a, "d", "w1", 2, 0).await.0, 200);
    // E.WRONG_STATE (enter.lua): another count; the barrier's is returned.
    let (s, v) = enter(&a, "d", "w2", 3, 0).await;
    assert_eq!(
        (s, v["reason"].clone(), v["count"].clone()),
        (409, json!("count_mismatch"), json!(2)),
        "{v}"
    );
    // E.TOO_MANY (enter.lua): the count+1-th entrant.
    assert_eq!(enter(&a, "d", "w2", 2, 0).await.0, 200);
    let (s, v) = enter(&a, "d", "w3", 2, 0).await;
    assert_eq!(
        (s, v["reason"].clone(), v["count"].clone()),
        (409, json!("too_many"), json!(2)),
        "{v}"
    );
}
