//! Redis stalls of every length (SIGSTOP of the server) never make a live
//! node or worker look dead (G3), never undo a drain, and never let a
//! node-tied lock or DoubleBarrier entry go to someone else while its worker
//! is alive. The liveness pass gives every lease back after a stall (see
//! `src/nodes/lua/liveness.lua`).

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::skip_on_cluster;
use crate::common::*;
use muster::client::{ClaimRequest, Complete, NextRequest, NodeState};

use crate::tasks::{claim, claim_tasks, submit};

/// A claim of one task for `node`, at once.
fn one(node: &str) -> ClaimRequest {
    ClaimRequest {
        node: node.into(),
        max: 1,
        wait_ms: 0,
        ack_ms: None,
    }
}

async fn heartbeat(app: &TestApp, worker: &str, ttl_ms: u64) -> u16 {
    app.put(&format!("/api/v1/nodes/{worker}/heartbeat"), json!({"ttl_ms": ttl_ms}))
        .await
        .0
}

/// A worker that heartbeats every `every` with `ttl_ms` until aborted.
fn keep_alive(app: &TestApp, worker: &str, ttl_ms: u64, every: Duration) -> tokio::task::JoinHandle<()> {
    let url = format!("{}/api/v1/nodes/{worker}/heartbeat", app.url);
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        loop {
            let _ = http.put(&url).json(&json!({"ttl_ms": ttl_ms})).send().await;
            tokio::time::sleep(every).await;
        }
    })
}

fn count(events: &[(String, String, Value)], ty: &str, node: &str) -> usize {
    events.iter().filter(|(t, n, _)| t == ty && n == node).count()
}

/// Issue 15 #0: stalls just shorter than the ttl (and longer ones) used to
/// declare a worker that heartbeats on time dead and requeue its task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalls_shorter_or_longer_than_the_ttl_declare_nobody_dead() {
    if skip_on_cluster("freezes the Redis server (SIGSTOP)") {
        return;
    }
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    // ttl 600 ms, heartbeat every 100 ms: the node's own settings.
    assert_eq!(heartbeat(&a, "w", 600).await, 200);
    let hb = keep_alive(&a, "w", 600, Duration::from_millis(100));
    let id = submit(&a, "st", json!({})).await;
    let t = claim_tasks(&a, "st", "w", 1, 0).await;
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].id, id);
    // The worker got its task: it acknowledges the claim (the claim lease
    // would otherwise put it back during the stalls, which outlast it).
    a.api().ack_task(&id, t[0].token).await.unwrap();
    for ms in [550u64, 580, 450, 300, 590, 1200, 560] {
        redis.freeze(Duration::from_millis(ms)).join().unwrap();
        // Let the cleaner passes of both nodes run between stalls.
        a.cleaner_passes(4).await;
        b.cleaner_passes(4).await;
    }
    a.cleaner_passes(10).await;
    b.cleaner_passes(10).await;
    let events = redis.events("muster").await;
    let dead: Vec<_> = events.iter().filter(|(t, _, _)| t == "node.dead").collect();
    assert!(dead.is_empty(), "nobody was declared dead: {dead:?}");
    assert!(
        !events.iter().any(|(t, _, _)| t == "orphan.recovered"),
        "the live worker's task was not recovered"
    );
    // Each stall longer than 3/8 of the ttl was told, with what it gave back.
    let stalled: Vec<Value> = events
        .iter()
        .filter(|(t, _, _)| t == "liveness.stalled")
        .map(|(_, _, f)| serde_json::from_str(f["data"].as_str().unwrap()).unwrap())
        .collect();
    assert!(
        stalled.len() >= 5,
        "the longer stalls emitted liveness.stalled: {stalled:?}"
    );
    for d in &stalled {
        let (gap, extended, leases) = (
            d["gap_ms"].as_i64().unwrap(),
            d["extended_ms"].as_i64().unwrap(),
            d["leases"].as_i64().unwrap(),
        );
        assert!(0 < extended && extended < gap, "{d}");
        assert!(leases >= 3, "the worker and both nodes got their leases back: {d}");
    }
    for n in ["w", a.node_id.as_str(), b.node_id.as_str()] {
        assert_eq!(
            count(&events, "node.joined", n),
            1,
            "{n} joined once, no spurious re-join"
        );
    }
    let r = a
        .api()
        .complete(
            &id,
            &Complete {
                token: t[0].token,
                result: Value::Null,
                next: None,
            },
        )
        .await;
    assert!(r.is_ok(), "the owner completes with its token: {r:?}");
    hb.abort();
}

/// Issue 15 #2: a stall longer than the ttl used to turn every draining
/// node back to active (its next heartbeat counted as a new join).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_survives_a_stall_longer_than_the_ttl() {
    if skip_on_cluster("freezes the Redis server (SIGSTOP)") {
        return;
    }
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    assert_eq!(heartbeat(&a, "w", 600).await, 200);
    let hb = keep_alive(&a, "w", 600, Duration::from_millis(100));
    submit(&a, "dr", json!({})).await;
    a.api().drain_node("w").await.unwrap();
    redis.freeze(Duration::from_millis(1500)).join().unwrap();
    // The worker's heartbeats succeed again.
    let back = wait_until(Duration::from_secs(5), || async {
        heartbeat(&a, "w", 600).await == 200
    })
    .await;
    assert!(back);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let p = problem(a.api().claim("dr", &one("w")).await);
    assert_eq!(p.status, 409, "still draining: {p:?}");
    let n = a.api().node("w").await.unwrap();
    assert_eq!(n.state, NodeState::Draining, "{n:?}");
    hb.abort();
}

/// Issue 15 #2, the other way back: a draining worker that was really
/// declared dead and comes back is still draining (only leaving ends it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_worker_that_died_and_returns_is_still_draining() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    assert_eq!(heartbeat(&a, "w", 500).await, 200);
    a.api().drain_node("w").await.unwrap();
    let died = wait_until(Duration::from_secs(5), || async {
        redis
            .events("muster")
            .await
            .iter()
            .any(|(t, n, _)| t == "node.dead" && n == "w")
    })
    .await;
    assert!(died);
    assert_eq!(heartbeat(&a, "w", 60_000).await, 200);
    let n = a.api().node("w").await.unwrap();
    assert_eq!(n.state, NodeState::Draining, "{n:?}");
}

/// Issue 15 #3: a worker with a ttl of its own longer than the cluster's
/// keeps its node-tied lock and its DoubleBarrier place across a stall
/// longer than that ttl, until its lease (given back) runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_ttl_worker_keeps_its_lock_and_double_barrier_place_across_a_stall() {
    if skip_on_cluster("freezes the Redis server (SIGSTOP)") {
        return;
    }
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let _b = TestApp::start(&redis).await;
    assert_eq!(heartbeat(&a, "slow", 3000).await, 200);
    assert_eq!(heartbeat(&a, "other", 60_000).await, 200);
    let (s, v) = a
        .post(
            "/api/v1/locks/tied/acquire",
            json!({"owner": "slow-proc", "ttl_ms": 600_000, "node": "slow"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = a
        .post(
            "/api/v1/double-barriers/d/enter",
            json!({"node": "slow", "count": 3, "wait_ms": 0}),
        )
        .await;
    assert!(s == 200 || s == 202, "{s} {v}");
    // The worker's lease (3 s) runs out inside this stall.
    redis.freeze(Duration::from_millis(3500)).join().unwrap();
    // Past the cluster ttl after the stall (every node's passes ran), and
    // before the worker's own lease, given back, runs out.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let (s, v) = a
        .post(
            "/api/v1/locks/tied/acquire",
            json!({"owner": "thief", "ttl_ms": 10_000, "wait_ms": 0}),
        )
        .await;
    assert_eq!(s, 409, "the lock is still held by the live worker: {v}");
    let (s, v) = a
        .post(
            "/api/v1/double-barriers/d/enter",
            json!({"node": "other", "count": 3, "wait_ms": 0}),
        )
        .await;
    assert!(s == 200 || s == 202, "{s} {v}");
    let events = redis.events("muster").await;
    assert!(
        !events
            .iter()
            .any(|(t, _, _)| t == "dbarrier.evicted" || t == "lock.expired" || t == "node.dead"),
        "nothing expired: {:?}",
        events.iter().map(|e| &e.0).collect::<Vec<_>>()
    );
    // Without heartbeats the lease does run out, and the lock is free.
    let freed = wait_until(Duration::from_secs(8), || async {
        a.post(
            "/api/v1/locks/tied/acquire",
            json!({"owner": "thief", "ttl_ms": 10_000, "wait_ms": 0}),
        )
        .await
        .0 == 200
    })
    .await;
    assert!(freed, "a dead worker's lock is freed once its lease ran out");
}

/// Issue 15 #11: a node that must not hand out work (draining here; its own
/// heartbeat failing likewise) answers claims with 503, and claims nothing
/// for a complete's `next`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_node_refuses_claims_through_it() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    assert_eq!(heartbeat(&a, "w", 60_000).await, 200);
    let (s, _) = b.post(&format!("/api/v1/nodes/{}/drain", a.node_id), json!({})).await;
    assert_eq!(s, 204);
    // The node learns it at its next heartbeat.
    let refused = wait_until(Duration::from_secs(3), || async {
        a.api()
            .claim("nd", &one("w"))
            .await
            .is_err_and(|e| e.status() == Some(503))
    })
    .await;
    assert!(refused, "claims through a draining node get 503");
    submit(&a, "nd", json!({})).await;
    let p = problem(a.api().claim("nd", &one("w")).await);
    assert_eq!(p.status, 503);
    assert!(p.detail.contains("draining"), "{p:?}");
    // Another node still hands the task out.
    let t = claim_tasks(&b, "nd", "w", 1, 0).await;
    assert_eq!(t.len(), 1);
    // A complete through the draining node still completes, but its `next`
    // claims nothing there and says why, as a claim would.
    submit(&a, "nd", json!({})).await;
    let c = Complete {
        token: t[0].token,
        result: Value::Null,
        next: Some(NextRequest {
            max: Some(1),
            ..Default::default()
        }),
    };
    let r = a.api().complete(&t[0].id, &c).await.unwrap();
    assert_eq!(r.state, "succeeded", "{r:?}");
    let next = r.next.as_ref().expect("next");
    assert!(next.tasks.is_empty(), "{r:?}");
    assert!(next.refused.as_deref().unwrap().contains("draining"), "{r:?}");
    assert_eq!(
        claim(&b, "nd", "w", 1, 0).await.len(),
        1,
        "the next task is still queued"
    );
}
