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

use muster::client::{Arrive, ArriveAnswer, Entrant, Result as ApiResult, Verdict};
use serde_json::json;

use crate::common::*;

/// Key `rest` of the shard barrier `name` lives in (`{muster}:<rest>` with
/// one shard, `{muster#i.k}:<rest>` when split: the shard of its name).
fn kn(name: &str, rest: &str) -> String {
    format!("{}:{rest}", name_tag("muster", name))
}

/// Creates (201) or updates (200) a barrier.
async fn configure(app: &TestApp, name: &str, parts: &[String], max_missing: u32, timeout_ms: u64) {
    app.api()
        .put_barrier(name, parts, max_missing, timeout_ms)
        .await
        .unwrap_or_else(|e| panic!("configuring {name}: {e:?}"));
}

async fn arrive(app: &TestApp, name: &str, round: &str, node: &str, wait_ms: u64) -> ApiResult<ArriveAnswer> {
    let a = Arrive {
        node: node.into(),
        wait_ms,
    };
    app.api().arrive(name, round, &a).await
}

fn names(v: &[String]) -> BTreeSet<String> {
    v.iter().cloned().collect()
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
                let v = arrive(&nodes[i % 3], "cycle", &round, &p, 10_000).await.unwrap();
                (round, p, v)
            }));
        }
    }
    let mut answers: BTreeMap<String, Vec<(String, ArriveAnswer)>> = BTreeMap::new();
    for t in tasks {
        let (round, p, v) = t.await.unwrap();
        answers.entry(round).or_default().push((p, v));
    }
    for (round, k, missing) in &rounds {
        let got = &answers[round];
        let expected = if *k as u32 <= m {
            Verdict::Released
        } else {
            Verdict::Aborted
        };
        let present: BTreeSet<String> = parts.iter().filter(|p| !missing.contains(*p)).cloned().collect();
        for (p, v) in got {
            assert_eq!(v.verdict, expected, "round {round}, {p}: {v:?}");
            assert_eq!(names(&v.arrived), present, "round {round}: {v:?}");
            assert_eq!(&names(&v.missing), missing, "round {round}: {v:?}");
            assert_eq!(v.may_run, expected == Verdict::Released, "round {round}, {p}: {v:?}");
            assert!(!v.late);
            let reason_deadline = *k > 0;
            let r = nodes[1].api().round("cycle", round).await.unwrap();
            assert_eq!(
                r.reason.as_deref(),
                Some(if reason_deadline { "deadline" } else { "all_arrived" })
            );
        }
        // Every participant saw the same decision time.
        let decided: HashSet<i64> = got.iter().map(|(_, v)| v.decided_at.unwrap()).collect();
        assert_eq!(decided.len(), 1, "round {round}");
        // The missing ones arrive late: same verdict, may not run.
        for (i, p) in missing.iter().enumerate() {
            let v = arrive(&nodes[i % 3], "cycle", round, p, 0).await.unwrap();
            assert_eq!(v.verdict, expected, "late {p} in {round}: {v:?}");
            assert!(!v.may_run);
            assert!(v.late);
            assert_eq!(&names(&v.missing), missing);
        }
    }
    // Exactly one decision per round, written once, whoever decided it.
    let d = decisions(&redis, "cycle").await;
    assert_eq!(d.len(), rounds.len(), "{d:?}");
    for (round, k, _) in &rounds {
        let expected = if *k as u32 <= m {
            Verdict::Released
        } else {
            Verdict::Aborted
        };
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
    assert_eq!(
        arrive(&a, "quiet", "r1", "x", 0).await.unwrap().verdict,
        Verdict::Pending
    );
    assert_eq!(
        arrive(&b, "quiet", "r1", "y", 0).await.unwrap().verdict,
        Verdict::Pending
    );
    // One of three: aborted at the deadline.
    assert_eq!(
        arrive(&b, "quiet", "r2", "z", 0).await.unwrap().verdict,
        Verdict::Pending
    );
    let decided = wait_until(Duration::from_secs(5), || async {
        let r1 = a.api().round("quiet", "r1").await.unwrap();
        let r2 = a.api().round("quiet", "r2").await.unwrap();
        r1.verdict != Verdict::Pending && r2.verdict != Verdict::Pending
    })
    .await;
    assert!(decided, "the background loop decides rounds past their deadline");
    for (round, verdict) in [("r1", Verdict::Released), ("r2", Verdict::Aborted)] {
        let r = a.api().round("quiet", round).await.unwrap();
        assert_eq!(r.verdict, verdict, "{r:?}");
        assert_eq!(r.reason.as_deref(), Some("deadline"));
        let late_by = r.decided_at.unwrap() - r.deadline;
        // barriers.interval_ms is 200; allow scheduling slack.
        assert!((0..=1000).contains(&late_by), "decided {late_by} ms after the deadline");
    }
    // Two nodes ran the loop; each round still has exactly one decision.
    let d = decisions(&redis, "quiet").await;
    assert_eq!(d["r1"], vec!["released"]);
    assert_eq!(d["r2"], vec!["aborted"]);
    // A participant reading afterwards: may run only if it had arrived.
    let v = arrive(&a, "quiet", "r1", "x", 0).await.unwrap();
    assert_eq!((v.may_run, v.late), (true, false));
    let v = arrive(&a, "quiet", "r1", "z", 0).await.unwrap();
    assert_eq!((v.may_run, v.late), (false, true));
    // The deadline index holds open rounds only.
    let open: i64 = redis.cmd(&["ZCARD", &kn("quiet", "barriers:deadlines")]).await;
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
            // 404 until the waiter's arrival opened the round.
            a.api().round("wake", &round).await.is_ok_and(|r| r.arrived.len() == 1)
        })
        .await;
        assert!(arrived);
        let t0 = Instant::now();
        let v = arrive(&b, "wake", &round, "last", 0).await.unwrap();
        assert_eq!(v.verdict, Verdict::Released);
        let (at, v) = waiter.await.unwrap();
        let v = v.unwrap();
        assert_eq!(v.verdict, Verdict::Released);
        assert!(v.may_run);
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
    assert_eq!(problem(arrive(&a, "nope", "r", "x", 0).await).status, 404);
    configure(&a, "b", &parts, 1, 1000).await;
    let p = problem(arrive(&a, "b", "r", "intruder", 0).await);
    assert_eq!(p.status, 403, "{p:?}");
    assert!(p.detail.contains("not a participant"));
    // A non-participant opens nothing.
    assert_eq!(problem(a.api().round("b", "r").await).status, 404);
    assert_eq!(problem(arrive(&a, "b", "a:b", "x", 0).await).status, 400);
    assert_eq!(problem(arrive(&a, "b", "r", "bad id", 0).await).status, 400);
    assert_eq!(problem(arrive(&a, "b", "r", "x", 3_600_000).await).status, 400);
    // Bodies the typed client would never send (raw on purpose).
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
    assert_eq!(arrive(&a, "b", "open", "x", 0).await.unwrap().verdict, Verdict::Pending);
    configure(&a, "b", &["z".to_string()], 0, 1000).await;
    let v = arrive(&a, "b", "open", "y", 0).await.unwrap();
    assert_eq!(v.verdict, Verdict::Released, "{v:?}");
    assert_eq!(problem(arrive(&a, "b", "new", "x", 0).await).status, 403);
    // Delete: gone, with its rounds.
    a.api().delete_barrier("b").await.unwrap();
    assert_eq!(problem(a.api().round("b", "open").await).status, 404);
    assert_eq!(problem(a.api().delete_barrier("b").await).status, 404);
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
    let baseline = redis.key_baseline().await;
    let parts: Vec<String> = ["x", "y"].iter().map(|s| s.to_string()).collect();
    configure(&a, "bounded", &parts, 0, 200).await;
    for i in 0..20 {
        let round = format!("r{i:02}");
        let _ = arrive(&a, "bounded", &round, "x", 0).await;
        if i % 2 == 0 {
            let _ = arrive(&a, "bounded", &round, "y", 0).await;
        }
    }
    // The last round may still be open; wait for the deadline loop.
    let settled = wait_until(Duration::from_secs(5), || async {
        let rounds = a.api().rounds("bounded", 50).await.unwrap();
        rounds.iter().all(|r| r.verdict != Verdict::Pending)
    })
    .await;
    assert!(settled);
    let kept = a.api().rounds("bounded", 100).await.unwrap();
    assert_eq!(kept.len(), 5, "rounds_kept rounds once all are decided");
    assert_eq!(kept[0].round, "r19", "newest first");
    let round_keys: Vec<String> = redis.cmd(&["KEYS", &kn("bounded", "barrier:bounded:r:*")]).await;
    assert_eq!(round_keys.len(), 5, "{round_keys:?}");
    // A hold and a DoubleBarrier, then everything goes away.
    a.api().hold_barrier("h", None, Some(500)).await.unwrap();
    enter(&a, "d", "dw", 2, 0).await.unwrap();
    let _ = leave(&a, "d", "dw", 0).await;
    // Every key left has a TTL, or is bounded: the stream (MAXLEN), the
    // barrier's config and the set of names (max_barriers), the
    // DoubleBarrier index (trimmed by idle time and swept by the loop).
    // Barriers are in the shards of their names (each with its indexes);
    // every shard has its event stream and the node registry.
    let tags = shard_tags("muster");
    let is_events = |k: &str| tags.iter().any(|t| k == format!("{t}:events"));
    let is_node = |k: &str| tags.iter().any(|t| k.starts_with(&format!("{t}:nodes:")));
    let bounded = [
        shard_keys("muster", "barriers"),
        shard_keys("muster", "dbarriers"),
        vec![kn("bounded", "barrier:bounded")],
    ]
    .concat();
    let unbounded = redis
        .keys_without_ttl(&baseline, |k| is_events(k) || bounded.iter().any(|b| b == k))
        .await;
    assert!(unbounded.is_empty(), "keys without a TTL: {unbounded:?}");
    // Decided rounds (and their index) expire after round_retention_ms on their own.
    let expired = wait_until(Duration::from_secs(5), || async {
        redis
            .cmd::<Vec<String>>(&["KEYS", &kn("bounded", "barrier:bounded:r*")])
            .await
            .is_empty()
    })
    .await;
    assert!(expired, "rounds and their index expire");
    a.api().delete_barrier("bounded").await.unwrap();
    redis
        .assert_back_to_baseline(&baseline, Duration::from_secs(10), |k| is_events(k) || is_node(k))
        .await;
}

// --- etcd-style Barrier ------------------------------------------------------

// --- DoubleBarrier -----------------------------------------------------------

// --- the CLI and the page ----------------------------------------------------

// --- rounds kept, rounds open, incarnations, holds (issue #15) ----------------

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
    assert_eq!(problem(arrive(&a, "nope", "r", "x", 0).await).status, 404);
    // delete.lua's 0: deleting a barrier that is neither configured nor held.
    assert_eq!(problem(a.api().delete_barrier("nope").await).status, 404);
    configure(&a, "only", &strings(&["x", "y"]), 0, 60_000).await;
    // E.TOO_MANY (max_barriers): a second barrier; updating the first is
    // fine. (Split, the bound counts per shard: the second is in the first's.)
    let second = name_like("muster", "second", "only");
    let p = problem(a.api().put_barrier(&second, &strings(&["x"]), 0, 1000).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert!(p.detail.contains("barriers.max_barriers"), "{p:?}");
    configure(&a, "only", &strings(&["x", "y"]), 1, 60_000).await;
    // E.NOT_PARTICIPANT: 403, and nothing opened.
    let p = problem(arrive(&a, "only", "r1", "intruder", 0).await);
    assert_eq!(p.status, 403, "{p:?}");
    assert_eq!(problem(a.api().round("only", "r1").await).status, 404);
    // E.TOO_MANY (max_open_rounds): a second open round. (The problem's
    // extension members are untyped: read from its map.)
    arrive(&a, "only", "r1", "x", 0).await.unwrap();
    let p = problem(arrive(&a, "only", "r2", "x", 0).await);
    assert_eq!(
        (p.status, p.extra["reason"].clone()),
        (409, json!("too_many_open_rounds")),
        "{p:?}"
    );
    assert_eq!(p.extra["max_open_rounds"], 1, "{p:?}");
    // E.WRONG_STATE (hold.lua): held by another holder. (Raw: 201, held
    // now, is a status the typed client does not show.)
    assert_eq!(a.post("/api/v1/barriers/g/hold", json!({"holder": "ops"})).await.0, 201);
    let p = problem(a.api().hold_barrier("g", Some("other"), None).await);
    assert_eq!((p.status, p.extra["holder"].clone()), (409, json!("ops")), "{p:?}");
    // E.NODE_NOT_ALIVE: an entrant whose node is not registered.
    let p = problem(enter(&a, "d", "ghost", 2, 0).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert!(p.detail.contains("`ghost` is not registered"), "{p:?}");
    let _hb: Vec<_> = futures_util::future::join_all(["w1", "w2", "w3"].map(|w| join_worker(&a, w))).await;
    enter(&a, "d", "w1", 2, 0).await.unwrap();
    // E.WRONG_STATE (enter.lua): another count; the barrier's is returned.
    let p = problem(enter(&a, "d", "w2", 3, 0).await);
    assert_eq!(
        (p.status, p.extra["reason"].clone(), p.extra["count"].clone()),
        (409, json!("count_mismatch"), json!(2)),
        "{p:?}"
    );
    // E.TOO_MANY (enter.lua): the count+1-th entrant.
    enter(&a, "d", "w2", 2, 0).await.unwrap();
    let p = problem(enter(&a, "d", "w3", 2, 0).await);
    assert_eq!(
        (p.status, p.extra["reason"].clone(), p.extra["count"].clone()),
        (409, json!("too_many"), json!(2)),
        "{p:?}"
    );
}

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

async fn enter(app: &TestApp, name: &str, node: &str, count: u32, wait_ms: u64) -> ApiResult<Entrant> {
    app.api().enter_double_barrier(name, node, count, wait_ms).await
}

async fn leave(app: &TestApp, name: &str, node: &str, wait_ms: u64) -> ApiResult<Entrant> {
    app.api().leave_double_barrier(name, node, wait_ms).await
}

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

mod etcd;

mod rounds;
