//! Membership: nodes see each other, the dead are detected by Redis time
//! and pruned, leaving is immediate, and a Redis outage marks nobody dead.

use std::time::{Duration, Instant};

use muster::client::{NodeHeartbeat, NodeInfo, NodeList, NodeState};
use serde_json::json;

use crate::common::skip_on_cluster;
use crate::common::*;

fn node_state(list: &[NodeInfo], id: &str) -> Option<NodeState> {
    list.iter().find(|n| n.id == id).map(|n| n.state)
}

/// A heartbeat with this ttl and nothing else.
fn beat(ttl_ms: u64) -> NodeHeartbeat {
    NodeHeartbeat {
        ttl_ms: Some(ttl_ms),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_see_each_other() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let c = TestApp::start(&redis).await;
    for app in [&a, &b, &c] {
        // Raw for the counts beside the list (the client's `nodes()` gives the list).
        let (status, list) = app.get("/api/v1/nodes").await;
        assert_eq!(status, 200);
        let list: NodeList = serde_json::from_value(list).unwrap();
        for id in [&a.node_id, &b.node_id, &c.node_id] {
            assert_eq!(node_state(&list.nodes, id), Some(NodeState::Alive), "{list:?}");
        }
        assert_eq!(list.alive, 3);
    }
    let events = redis.events("muster").await;
    let joined = events.iter().filter(|(t, _, _)| t == "node.joined").count();
    assert_eq!(joined, 3, "one node.joined per node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_is_dead_within_ttl_plus_heartbeat_then_pruned() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let mut b = TestApp::start(&redis).await;
    let ttl = Duration::from_millis(600);
    let heartbeat = Duration::from_millis(100);
    // Past the start-up grace, so the measurement is of steady state.
    tokio::time::sleep(ttl).await;
    let victim = b.node_id.clone();
    b.kill().await;
    let killed = Instant::now();
    let dead = wait_until(Duration::from_secs(5), || async {
        let list = a.api().nodes().await.unwrap();
        node_state(&list, &victim) == Some(NodeState::Dead)
    })
    .await;
    assert!(dead, "the killed node is marked dead");
    let took = killed.elapsed();
    // The heartbeat may have been sent just before the kill: dead at most
    // ttl + one prune interval after it (plus scheduling slack on a busy machine).
    assert!(
        took <= ttl + heartbeat + Duration::from_millis(400),
        "marked dead after {took:?}"
    );
    // The listing says dead from the lapsed heartbeat score; the event comes
    // from the next prune pass, which on a split namespace (12 shards on the
    // CI's Cluster pass) may follow the listing by a moment.
    let dead_events = || async {
        redis
            .events("muster")
            .await
            .iter()
            .filter(|(t, n, _)| t == "node.dead" && *n == victim)
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(5), || async { dead_events().await >= 1 }).await,
        "node.dead is emitted"
    );
    // A few more prune passes: still one.
    tokio::time::sleep(heartbeat * 5).await;
    assert_eq!(dead_events().await, 1, "node.dead is emitted exactly once");
    // After dead_retention (2 s in tests) it is forgotten.
    let pruned = wait_until(Duration::from_secs(5), || async {
        let list = a.api().nodes().await.unwrap();
        node_state(&list, &victim).is_none()
    })
    .await;
    assert!(pruned, "the dead node is pruned after dead_retention_ms");
    // The registry is in every shard when split.
    for tag in shard_tags("muster") {
        let exists: i64 = redis.cmd(&["EXISTS", &format!("{tag}:node:{victim}")]).await;
        assert_eq!(exists, 0, "its info hash is gone from {tag}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_leave_is_seen_at_once() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let mut b = TestApp::start(&redis).await;
    let id = b.node_id.clone();
    b.shutdown().await;
    let list = a.api().nodes().await.unwrap();
    assert_eq!(node_state(&list, &id), None, "gone immediately: {list:?}");
    let events = redis.events("muster").await;
    assert!(events.iter().any(|(t, n, _)| t == "node.left" && *n == id));
    assert!(
        !events.iter().any(|(t, _, _)| t == "node.dead"),
        "a leave is not a death"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_makes_nodes_unready_but_marks_nobody_dead() {
    if skip_on_cluster("kills and restarts the Redis server (AOF), behind a fault proxy") {
        return;
    }
    // AOF with fsync always, so the registry survives the restart and the
    // stale scores are really there when Redis returns.
    let mut redis = TestRedis::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    // b reaches Redis through a proxy, so it can come back later than a.
    let proxy = FaultProxy::start(redis.port).await;
    let a = TestApp::start(&redis).await;
    let b = TestApp::start_with(&redis, |c| c.redis.url = proxy.url()).await;
    assert_eq!(a.get("/readyz").await.0, 200);
    redis.kill();
    proxy.block();
    let unready = wait_until(Duration::from_secs(5), || async {
        a.get("/readyz").await.0 == 503 && b.get("/readyz").await.0 == 503
    })
    .await;
    assert!(unready, "both nodes report not-ready while Redis is down");
    let (s, body) = a.get("/readyz").await;
    assert!(as_problem(s, &body).detail.contains("Redis"), "{body}");
    // Down for well over a ttl (600 ms): every score is stale on return.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    redis.restart();
    // a is back at once and prunes; b is back 300 ms later, inside the grace.
    let a_back = wait_until(Duration::from_secs(10), || async { a.get("/readyz").await.0 == 200 }).await;
    assert!(a_back);
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.unblock();
    let ready = wait_until(Duration::from_secs(10), || async { b.get("/readyz").await.0 == 200 }).await;
    assert!(ready, "both nodes recover when Redis returns");
    // Let several prune passes run after the grace.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let events = redis.events("muster").await;
    let dead: Vec<_> = events.iter().filter(|(t, _, _)| t == "node.dead").collect();
    assert!(dead.is_empty(), "nobody was marked dead: {dead:?}");
    let list = a.api().nodes().await.unwrap();
    assert_eq!(node_state(&list, &a.node_id), Some(NodeState::Alive));
    assert_eq!(node_state(&list, &b.node_id), Some(NodeState::Alive));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_workers_join_and_expire() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let labelled = NodeHeartbeat {
        labels: [("zone".to_string(), "a".to_string())].into(),
        ..beat(800)
    };
    let hb = a.api().heartbeat_node("worker-1", &labelled).await.unwrap();
    assert!(hb.joined);
    let hb2 = a.api().heartbeat_node("worker-1", &beat(800)).await.unwrap();
    assert!(!hb2.joined);
    let node = a.api().node("worker-1").await.unwrap();
    assert_eq!(node.kind, "worker");
    assert_eq!(node.state, NodeState::Alive);
    let dead = wait_until(Duration::from_secs(5), || async {
        a.api().node("worker-1").await.unwrap().state == NodeState::Dead
    })
    .await;
    assert!(dead, "a worker that stops heartbeating is dead after its own ttl");
    // bad ids and ttl
    assert_eq!(
        a.put("/api/v1/nodes/bad%20id/heartbeat", serde_json::json!({})).await.0,
        400
    );
    assert_eq!(
        a.put("/api/v1/nodes/w/heartbeat", serde_json::json!({"ttl_ms": 1}))
            .await
            .0,
        400
    );
    assert_eq!(
        a.put(
            &format!("/api/v1/nodes/{}/heartbeat", "x".repeat(65)),
            serde_json::json!({})
        )
        .await
        .0,
        400
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_is_seen_cluster_wide_and_by_the_node() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    a.api().drain_node(&b.node_id).await.unwrap();
    let node = a.api().node(&b.node_id).await.unwrap();
    assert_eq!(node.state, NodeState::Draining);
    let learned = wait_until(Duration::from_secs(3), || async { b.state().health.draining() }).await;
    assert!(learned, "the drained node learns it from its heartbeat");
    assert_eq!(problem(a.api().drain_node("nobody").await).status, 404);
    let events = redis.events("muster").await;
    assert_eq!(events.iter().filter(|(t, _, _)| t == "node.draining").count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_nodes_bounds_the_registry() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| c.nodes.max_nodes = 2).await;
    a.api().heartbeat_node("w1", &NodeHeartbeat::default()).await.unwrap();
    let p = problem(a.api().heartbeat_node("w2", &NodeHeartbeat::default()).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert!(p.detail.contains("max_nodes"));
}

/// A worker leaves through the API with a worker token: its registration
/// goes (kept dead while it still holds tasks, which are recovered); a muster
/// node cannot be removed this way (409), an unknown id is 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_leaves_but_cannot_remove_a_node() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    app.api().heartbeat_node("leaver", &beat(60_000)).await.unwrap();
    app.api().leave_worker("leaver").await.unwrap();
    assert_eq!(problem(app.api().node("leaver").await).status, 404);
    let p = problem(app.api().leave_worker("leaver").await);
    assert_eq!(p.status, 404, "{p:?}");
    let p = problem(app.api().leave_worker(&app.node_id).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert!(p.detail.contains("not a worker"), "{p:?}");
    assert!(app.api().node(&app.node_id).await.is_ok());

    // Leaving while holding a task: kept (dead) until the task is recovered.
    app.api().heartbeat_node("holder", &beat(60_000)).await.unwrap();
    let id = crate::tasks::submit(&app, "leave-q", json!({})).await;
    assert_eq!(crate::tasks::claim(&app, "leave-q", "holder", 1, 0).await.len(), 1);
    app.api().leave_worker("holder").await.unwrap();
    let requeued = wait_until(Duration::from_secs(10), || async {
        app.api().task(&id).await.unwrap().state == "queued"
    })
    .await;
    assert!(requeued, "the leaver's task was recovered");
}

/// Starts a node on `redis` with `prefix`; the error text when it refuses.
async fn start_refused(redis: &TestRedis, prefix: &str) -> Option<String> {
    start_sharded(redis, prefix, 1).await
}

/// Starts and stops a node on namespace `prefix` split into `shards`: None,
/// or why it refused to start.
async fn start_sharded(redis: &TestRedis, prefix: &str, shards: u32) -> Option<String> {
    let dir = tempfile::Builder::new().prefix("muster-node").tempdir().unwrap();
    let mut cfg = redis.test_config(dir.path());
    cfg.redis.key_prefix = prefix.into();
    cfg.redis.shards = shards;
    redis.adopt(&mut cfg);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    match muster::start(cfg, listener).await {
        Ok(running) => {
            running.shutdown().await;
            None
        }
        Err(e) => Some(e.to_string()),
    }
}

/// The first node records the namespace's layout (one shard); a namespace
/// recorded with another layout, which this node would read half empty, is
/// refused at start with what to do, and the refusal changes nothing. A
/// namespace with data from before the layout was recorded is one shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_laid_out_in_other_shards_is_refused_at_start() {
    let redis = TestRedis::start();
    let layout = |p: &str| format!("{{{p}}}:layout");
    assert_eq!(start_refused(&redis, "muster").await, None);
    let rec: Vec<String> = redis.cmd(&["HMGET", &layout("muster"), "shards", "placement"]).await;
    assert_eq!(rec, ["1", "single"]);
    assert_eq!(
        redis.cmd::<i64>(&["PTTL", &layout("muster")]).await,
        -1,
        "kept: one key per namespace"
    );

    // Recorded by a node that splits the namespace in 12.
    redis
        .cmd::<i64>(&["HSET", &layout("muster"), "shards", "12", "placement", "fnv1a32"])
        .await;
    let e = start_refused(&redis, "muster").await.expect("refused");
    assert!(
        e.contains("split into 12 shard") && e.contains("fnv1a32") && e.contains("redis.key_prefix"),
        "{e}"
    );
    let rec: Vec<String> = redis.cmd(&["HMGET", &layout("muster"), "shards", "placement"]).await;
    assert_eq!(rec, ["12", "fnv1a32"], "the refusal changed nothing");

    // Data written before layouts were recorded is one shard: a node that
    // would split it is refused.
    redis.cmd::<()>(&["SET", "{old}:seq", "41"]).await;
    let e = start_sharded(&redis, "old", 12).await.expect("refused");
    assert!(
        e.contains("split into 1 shard") && e.contains("redis.shards = 12"),
        "{e}"
    );
    assert_eq!(
        redis.cmd::<i64>(&["EXISTS", &layout("old")]).await,
        0,
        "nothing recorded"
    );
    assert_eq!(start_refused(&redis, "old").await, None, "a one-shard node takes it");
    let rec: Vec<String> = redis.cmd(&["HMGET", &layout("old"), "shards", "placement"]).await;
    assert_eq!(rec, ["1", "single"]);
    // An empty namespace takes the first layout that reaches it, recorded
    // under the namespace's own tag whatever the split.
    assert_eq!(start_sharded(&redis, "new", 12).await, None);
    let rec: Vec<String> = redis.cmd(&["HMGET", &layout("new"), "shards", "placement"]).await;
    assert_eq!(rec, ["12", "fnv1a32-spread"]);
    assert_eq!(start_sharded(&redis, "new", 12).await, None, "the same layout again");
    for other in [1, 6] {
        let e = start_sharded(&redis, "new", other).await.expect("refused");
        assert!(e.contains("split into 12 shard"), "{e}");
    }
}
