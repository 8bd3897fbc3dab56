//! G12: a call the node has given up on never takes effect afterwards, and
//! heartbeats keep time on a slow link (issue 22).
//!
//! The node reaches Redis through the fault proxy. `hold` keeps what the
//! node sends in transit past its timeout (the node answers 503 and cuts the
//! connection), then `release` delivers it, as a healed partition would
//! deliver what sat in a send buffer. Redis runs each script then, finds its
//! deadline passed, and refuses it (`LATE`): nothing changes.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::skip_on_cluster;
use crate::common::*;
use crate::tasks::{claim, submit};

/// How many scripts Redis refused for arriving after their deadline.
async fn late_refusals(redis: &TestRedis) -> i64 {
    let info: String = redis.cmd(&["INFO", "errorstats"]).await;
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_LATE:count="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_held_in_transit_past_the_timeout_change_nothing() {
    if skip_on_cluster("a fault proxy in front of one Redis server") {
        return;
    }
    let redis = TestRedis::start();
    let proxy = FaultProxy::start(redis.port).await;
    let direct = TestApp::start(&redis).await;
    let a = TestApp::start_with(&redis, |c| c.redis.url = proxy.url()).await;
    let (s, _) = a.put("/api/v1/nodes/w/heartbeat", json!({"ttl_ms": 60_000})).await;
    assert_eq!(s, 200);
    let task = submit(&a, "late", json!({})).await;
    let parts = vec!["w".to_string(), "v".to_string()];
    let (s, _) = a
        .put(
            "/api/v1/barriers/b",
            json!({"participants": parts, "max_missing": 0, "timeout_ms": 60_000}),
        )
        .await;
    assert!(s == 200 || s == 201);
    // Load every script on the server first, as a running cluster has
    // (a held EVALSHA of a script Redis has not seen yet would come back
    // NOSCRIPT and prove nothing).
    assert_eq!(claim(&a, "warm", "w", 1, 0).await.len(), 0);
    let (s, _) = a
        .post(
            "/api/v1/locks/warm/acquire",
            json!({"owner": "o", "ttl_ms": 1000, "wait_ms": 0}),
        )
        .await;
    assert_eq!(s, 200);
    let (s, _) = a
        .put(
            "/api/v1/barriers/warm",
            json!({"participants": ["w", "v"], "max_missing": 0, "timeout_ms": 60_000}),
        )
        .await;
    assert!(s == 200 || s == 201);
    let (s, _) = a
        .post(
            "/api/v1/barriers/warm/rounds/r0/arrive",
            json!({"node": "w", "wait_ms": 0}),
        )
        .await;
    assert!(s < 300, "{s}");
    let before = late_refusals(&redis).await;

    proxy.hold();
    let (claim_r, submit_r, hb_r, lock_r, arrive_r) = tokio::join!(
        a.post(
            "/api/v1/queues/late/claim",
            json!({"node": "w", "max": 1, "wait_ms": 0})
        ),
        a.post("/api/v1/queues/other/tasks", json!({"payload": {"x": 1}})),
        a.put("/api/v1/nodes/w2/heartbeat", json!({"ttl_ms": 60_000})),
        a.post(
            "/api/v1/locks/l/acquire",
            json!({"owner": "o", "ttl_ms": 60_000, "wait_ms": 0})
        ),
        a.post(
            "/api/v1/barriers/b/rounds/r1/arrive",
            json!({"node": "w", "wait_ms": 0})
        ),
    );
    for (what, (s, body)) in [
        ("claim", &claim_r),
        ("submit", &submit_r),
        ("heartbeat", &hb_r),
        ("lock acquire", &lock_r),
        ("barrier arrive", &arrive_r),
    ] {
        assert_eq!(*s, 503, "{what} gets 503 while its call is held: {body}");
    }
    // Past every deadline, then the bytes arrive.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.release();

    // The node works again once it has reconnected; by then the proxy has
    // delivered what it held (it was first in line).
    let back = wait_until(Duration::from_secs(5), || async {
        a.get(&format!("/api/v1/tasks/{task}")).await.0 == 200
    })
    .await;
    assert!(back);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let t = direct.api().task(&task).await.unwrap();
    assert_eq!(t.state, "queued", "the held claim did not run: {t:?}");
    assert_eq!(t.attempts, 0, "{t:?}");
    let (_, q) = direct.get("/api/v1/queues").await;
    assert!(
        !q.to_string().contains("\"other\""),
        "the held submit created no queue or task: {q}"
    );
    let (s, _) = direct.get("/api/v1/nodes/w2").await;
    assert_eq!(s, 404, "the held heartbeat registered nobody");
    let (_, l) = direct.get("/api/v1/locks/l").await;
    assert_eq!(l["held"], false, "the held acquire granted nothing: {l}");
    let (s, r) = direct.get("/api/v1/barriers/b/rounds").await;
    assert_eq!(s, 200);
    assert!(
        r["rounds"].as_array().is_none_or(|v| v.is_empty()),
        "the held arrival opened no round: {r}"
    );
    // Redis ran each of them and refused it: the test really delivered them.
    let refused = wait_until(Duration::from_secs(5), || async {
        late_refusals(&redis).await >= before + 5
    })
    .await;
    assert!(refused, "the held scripts reached Redis and were refused as late");
    // The same call, not held, works once the node's own heartbeat is fresh.
    let claimed = wait_until(Duration::from_secs(5), || async {
        let (s, _) = a
            .post(
                "/api/v1/queues/late/claim",
                json!({"node": "w", "max": 1, "wait_ms": 0}),
            )
            .await;
        s == 200
    })
    .await;
    assert!(claimed);
}

/// Latency on the node's link to Redis: heartbeats go out on schedule (not
/// after the prune pass and a slow call), so a node whose heartbeats all
/// succeed is never declared dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_link_does_not_make_a_heartbeating_node_look_dead() {
    if skip_on_cluster("a fault proxy in front of one Redis server") {
        return;
    }
    let redis = TestRedis::start();
    let proxy = FaultProxy::start(redis.port).await;
    let tweak = |c: &mut muster::config::Config| {
        c.nodes.heartbeat_ms = 250;
        c.nodes.ttl_ms = 1200;
        c.redis.timeout_ms = 1000;
    };
    let judge = TestApp::start_with(&redis, tweak).await;
    let slow = TestApp::start_with(&redis, |c| {
        tweak(c);
        c.redis.url = proxy.url();
    })
    .await;
    // 300 ms each way, up to 100 ms more: a round trip of 600 to 800 ms,
    // so a heartbeat followed by a prune pass takes longer than the ttl.
    proxy.set_latency(Duration::from_millis(300), Duration::from_millis(100));
    tokio::time::sleep(Duration::from_secs(8)).await;
    let events = redis.events("muster").await;
    let deaths: Vec<&(String, String, Value)> = events
        .iter()
        .filter(|(t, n, _)| t == "node.dead" && n == &slow.node_id)
        .collect();
    assert!(deaths.is_empty(), "the slow node was declared dead: {deaths:?}");
    let n = judge.api().node(&slow.node_id).await.unwrap();
    assert_eq!(n.state, muster::client::NodeState::Alive, "{n:?}");
}
