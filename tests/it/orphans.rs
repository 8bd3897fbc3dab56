//! The orphan cleaner and timeout monitor (G3), in-process nodes on real Redis.

use std::time::{Duration, Instant};

use muster::client::{ClaimedTask, NodeHeartbeat, NodeState};
use serde_json::{Value, json};

use crate::common::skip_on_cluster;
use crate::common::*;
use crate::tasks::{claim, claim_tasks, submit};

/// Registers a worker with a short ttl.
async fn join_ttl(app: &TestApp, worker: &str, ttl_ms: u64) {
    let hb = NodeHeartbeat {
        ttl_ms: Some(ttl_ms),
        ..Default::default()
    };
    app.api().heartbeat_node(worker, &hb).await.unwrap();
}

/// A task's state now.
async fn state_of(app: &TestApp, id: &str) -> String {
    app.api().task(id).await.unwrap().state
}

/// A complete of a task with `token`, whoever holds it now: the refusal if any.
async fn complete_with(app: &TestApp, t: &ClaimedTask, token: u64) -> muster::client::Result<()> {
    let c = muster::client::Complete {
        token,
        result: Value::Null,
        next: None,
    };
    app.api().complete(&t.id, &c).await.map(drop)
}

/// Registers a worker and keeps it alive until the returned handle is
/// aborted (the "kill").
async fn heartbeat_forever(app: &TestApp, worker: &str, ttl_ms: u64) -> tokio::task::JoinHandle<()> {
    join_ttl(app, worker, ttl_ms).await;
    let url = format!("{}/api/v1/nodes/{worker}/heartbeat", app.url);
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        loop {
            let _ = http.put(&url).json(&json!({"ttl_ms": ttl_ms})).send().await;
            tokio::time::sleep(Duration::from_millis(ttl_ms / 4)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_task_is_requeued_at_the_front_within_ttl_plus_interval() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let ttl = 500;
    let hb = heartbeat_forever(&a, "doomed", ttl).await;
    join_ttl(&a, "rescuer", 60_000).await;
    let victim = submit(&a, "orph", json!({"payload": "important"})).await;
    let behind = submit(&a, "orph", json!({"payload": "later"})).await;
    let got = claim_tasks(&a, "orph", "doomed", 1, 0).await;
    assert_eq!(got[0].id, victim);
    let old_token = got[0].token;
    // The worker dies: no more heartbeats.
    hb.abort();
    let killed = Instant::now();
    let recovered = wait_until(Duration::from_secs(5), || async {
        state_of(&b, &victim).await == "queued"
    })
    .await;
    assert!(recovered, "the orphan is requeued");
    let took = killed.elapsed();
    // ttl after the last heartbeat (at most ttl/4 before the kill) plus one
    // cleaner interval (100 ms in tests), plus scheduling slack.
    assert!(
        took < Duration::from_millis(ttl + 100 + 500),
        "recovered after {took:?}"
    );
    // At the front of its queue, ahead of the task that was behind it.
    let next = claim_tasks(&b, "orph", "rescuer", 1, 0).await;
    assert_eq!(next[0].id, victim, "requeued at the front");
    assert_eq!(next[0].attempt, 2);
    assert!(next[0].token > old_token);
    // The dead worker's token is dead.
    let p = problem(complete_with(&a, &got[0], old_token).await);
    assert_eq!(p.status, 409, "{p:?}");
    let _ = behind;
    // History, API, event, metric.
    let report = a.api().orphans().await.unwrap();
    let rec = &report.recovered[0];
    assert_eq!(rec.task, victim);
    assert_eq!(rec.owner, "doomed");
    assert_eq!(rec.action, "requeued");
    assert_eq!(rec.attempt, 1);
    assert_eq!(report.counts.get("requeued"), Some(&1));
    let events = redis.events("muster").await;
    let rec_events: Vec<_> = events.iter().filter(|(t, _, _)| t == "orphan.recovered").collect();
    assert_eq!(rec_events.len(), 1, "recovered once, though two nodes run the cleaner");
    assert!(events.iter().any(|(t, n, _)| t == "node.dead" && n == "doomed"));
    let task = a.api().task(&victim).await.unwrap();
    assert_eq!(task.attempt_log[0].outcome.as_deref(), Some("orphaned"));
    let html = a.page("/orphans").await;
    assert!(html.contains(&victim) && html.contains("doomed"));
    let metrics = a.page("/metrics").await;
    assert!(metrics.contains("muster_orphans_recovered_total{action=\"requeued\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_with_no_attempts_left_is_dead_and_its_group_slot_freed() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    a.api().set_group_limit("solo", Some(1)).await.unwrap();
    let hb = heartbeat_forever(&a, "short", 500).await;
    join_ttl(&a, "other", 60_000).await;
    let id = submit(&a, "last", json!({"max_attempts": 1, "group": "solo"})).await;
    let next = submit(&a, "last", json!({"group": "solo"})).await;
    claim(&a, "last", "short", 1, 0).await;
    assert!(claim(&a, "last", "other", 1, 0).await.is_empty(), "the group is full");
    hb.abort();
    let dead = wait_until(Duration::from_secs(5), || async { state_of(&a, &id).await == "dead" }).await;
    assert!(dead);
    let got = claim_tasks(&a, "last", "other", 1, 2000).await;
    assert_eq!(got[0].id, next, "the dead owner's slot was released");
    let d = a.api().dead().await.unwrap();
    assert_eq!(d.tasks[0].id, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_keeps_heartbeating_keeps_its_task() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let hb = heartbeat_forever(&a, "steady", 500).await;
    let id = submit(&a, "keep", json!({})).await;
    let t = claim_tasks(&a, "keep", "steady", 1, 0).await;
    assert_eq!(t[0].id, id);
    // Past the ttl, several cleaner passes with the owner heartbeating.
    a.cleaner_passes(15).await;
    let r = complete_with(&a, &t[0], t[0].token).await;
    assert!(r.is_ok(), "never recovered from a live owner: {r:?}");
    hb.abort();
    let r = a.api().orphans().await.unwrap();
    assert!(r.recovered.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_worker_recovers_its_tasks_at_once() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join_ttl(&a, "gone", 60_000).await;
    let id = submit(&a, "rm", json!({})).await;
    claim(&a, "rm", "gone", 1, 0).await;
    a.api().remove_node("gone").await.unwrap();
    let back = wait_until(Duration::from_secs(3), || async { state_of(&a, &id).await == "queued" }).await;
    assert!(back, "an admin removal recovers at the next cleaner pass");
    // Once its tasks are recovered the node is forgotten (dead retention 2 s in tests).
    let forgotten = wait_until(Duration::from_secs(5), || async {
        a.api().node("gone").await.is_err_and(|e| e.status() == Some(404))
    })
    .await;
    assert!(forgotten);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_monitor_fails_overdue_tasks_and_late_completes_get_409() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join_ttl(&a, "slow", 60_000).await;
    let id = submit(
        &a,
        "to",
        json!({"timeout_ms": 300, "max_attempts": 2, "backoff_base_ms": 0, "backoff_cap_ms": 0}),
    )
    .await;
    let t1 = claim_tasks(&a, "to", "slow", 1, 0).await;
    let retried = wait_until(Duration::from_secs(3), || async {
        let t = state_of(&a, &id).await;
        t == "delayed" || t == "queued"
    })
    .await;
    assert!(retried, "timed out and scheduled for retry");
    let p = problem(complete_with(&a, &t1[0], t1[0].token).await);
    assert_eq!(p.status, 409, "the late complete is refused: {p:?}");
    let t2 = claim_tasks(&a, "to", "slow", 1, 2000).await;
    assert_eq!(t2[0].attempt, 2);
    let dead = wait_until(Duration::from_secs(3), || async { state_of(&a, &id).await == "dead" }).await;
    assert!(dead, "second timeout, no attempts left");
    let task = a.api().task(&id).await.unwrap();
    assert!(task.error.as_deref().unwrap().contains("timed out"));
    assert_eq!(task.attempt_log[1].outcome.as_deref(), Some("timed_out"));
    let events = redis.events("muster").await;
    assert!(
        events
            .iter()
            .any(|(t, _, f)| t == "task.failed" && f["data"].as_str().unwrap().contains("timeout"))
    );
    let metrics = a.page("/metrics").await;
    assert!(metrics.contains("muster_task_timeouts_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_stall_longer_than_the_ttl_orphans_nothing() {
    if skip_on_cluster("stalls the Redis server with DEBUG SLEEP") {
        return;
    }
    let redis = TestRedis::start_with(&["--enable-debug-command", "yes"]);
    let a = TestApp::start(&redis).await;
    let ttl = 600u64;
    let hb = heartbeat_forever(&a, "alive", ttl).await;
    let id = submit(&a, "stall", json!({"timeout_ms": 60_000})).await;
    let t = claim_tasks(&a, "stall", "alive", 1, 0).await;
    assert_eq!(t[0].id, id);
    // Stall Redis for twice the ttl.
    redis.stall(Duration::from_millis(2 * ttl));
    // Well past the stall: several cleaner passes with the worker heartbeating.
    a.cleaner_passes(15).await;
    let r = complete_with(&a, &t[0], t[0].token).await;
    assert!(r.is_ok(), "the owner can still complete: {r:?}");
    let report = a.api().orphans().await.unwrap();
    assert!(report.recovered.is_empty(), "{report:?}");
    let events = redis.events("muster").await;
    assert!(
        !events.iter().any(|(t, _, _)| t == "node.dead"),
        "nobody was declared dead"
    );
    hb.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_recovers_tasks_of_owners_missing_from_the_registry() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join_ttl(&a, "ghost", 60_000).await;
    let id = submit(&a, "sw", json!({})).await;
    claim(&a, "sw", "ghost", 1, 0).await;
    // Someone deletes the worker's registration and index by hand.
    // (The registry is in every shard when split.)
    for tag in shard_tags("muster") {
        let _: () = redis.cmd(&["ZREM", &format!("{tag}:nodes"), "ghost"]).await;
        let _: () = redis
            .cmd(&["DEL", &format!("{tag}:node:ghost"), &format!("{tag}:node:ghost:tasks")])
            .await;
    }
    // And leaves a dangling entry in the ready set (in sw's shard, with its task).
    let ready = format!("{}:q:sw:ready", name_tag("muster", "sw"));
    let _: () = redis.cmd(&["ZADD", &ready, "1", "01ARZ3NDEKTSV4RRFFQ69G5FAV"]).await;
    let fixed = wait_until(Duration::from_secs(5), || async { state_of(&a, &id).await == "queued" }).await;
    assert!(fixed, "the sweep (every tenth pass) recovered it");
    let gone = wait_until(Duration::from_secs(3), || async {
        let n: i64 = redis.cmd(&["ZCARD", &ready]).await;
        n == 1
    })
    .await;
    assert!(gone, "the dangling ready entry was removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_redis_stops_handing_out_work() {
    if skip_on_cluster("a fault proxy in front of one Redis server") {
        return;
    }
    let redis = TestRedis::start();
    let proxy = FaultProxy::start(redis.port).await;
    let a = TestApp::start(&redis).await;
    let b = TestApp::start_with(&redis, |c| c.redis.url = proxy.url()).await;
    join_ttl(&a, "w", 60_000).await;
    submit(&a, "cut", json!({})).await;
    proxy.block();
    // Bounds generous for a loaded machine; what was answered last is in
    // the message when one is missed.
    let last = std::sync::Mutex::new((0u16, Value::Null));
    let refused = wait_until(Duration::from_secs(15), || async {
        let r = b.post("/api/v1/queues/cut/claim", json!({"node": "w"})).await;
        let ok = r.0 == 503;
        *last.lock().unwrap() = r;
        ok
    })
    .await;
    assert!(
        refused,
        "no claims through a node that cannot reach Redis: last {:?}",
        last.lock().unwrap()
    );
    proxy.unblock();
    // The proxy cuts open connections within a few ms of block(), so a claim
    // sent just before may have taken the first task: give it another.
    submit(&a, "cut", json!({})).await;
    let ok = wait_until(Duration::from_secs(20), || async {
        let r = b.post("/api/v1/queues/cut/claim", json!({"node": "w"})).await;
        let ok = r.0 == 200;
        *last.lock().unwrap() = r;
        ok
    })
    .await;
    assert!(ok, "claims resume when Redis is back: last {:?}", last.lock().unwrap());
    let _ = Value::Null;
}

/// After Redis was unreachable for longer than the node ttl, a worker
/// registered with a longer ttl of its own (it heartbeats less often) gets
/// that ttl to heartbeat again, not just the node ttl: no false orphan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_a_slow_heartbeating_worker_keeps_its_task() {
    if skip_on_cluster("a fault proxy in front of one Redis server") {
        return;
    }
    let redis = TestRedis::start();
    let proxy = FaultProxy::start(redis.port).await;
    // The only node reaches Redis through the proxy: its cleaner stops too.
    let a = TestApp::start_with(&redis, |c| c.redis.url = proxy.url()).await;
    let (worker_ttl, period) = (2000u64, 1800u64);
    join_ttl(&a, "slow", worker_ttl).await;
    let id = submit(&a, "slowq", json!({"timeout_ms": 60_000})).await;
    let t = claim_tasks(&a, "slowq", "slow", 1, 0).await;
    let token = t[0].token;
    let url = format!("{}/api/v1/nodes/slow/heartbeat", a.url);
    let hb = tokio::spawn(async move {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        loop {
            let _ = http.put(&url).json(&json!({"ttl_ms": worker_ttl})).send().await;
            tokio::time::sleep(Duration::from_millis(period)).await;
        }
    });
    // Out from just after the worker's heartbeat until its entry expired
    // (longer than the node ttl of 600 ms). The worker's next heartbeat
    // comes about 1.5 s after Redis is back: later than the node ttl, within
    // its own.
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.block();
    tokio::time::sleep(Duration::from_millis(worker_ttl)).await;
    proxy.unblock();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let task = a.api().task(&id).await.unwrap();
    assert_eq!(task.state, "running", "{task:?}");
    let r = complete_with(&a, &t[0], token).await;
    assert!(r.is_ok(), "the owner can still complete: {r:?}");
    hb.abort();
}

/// Dead workers stay listed for dead_retention_ms; more than a page of them
/// must not hide a newer dead worker's task from the cleaner (G3 bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_listed_dead_workers_do_not_delay_a_recovery() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| c.nodes.dead_retention_ms = 60_000).await;
    for i in 0..150 {
        join_ttl(&a, &format!("gone-{i:03}"), 500).await;
    }
    // All 150 expire (and are marked dead) before the victim joins.
    assert!(
        wait_until(Duration::from_secs(5), || async {
            let l = a.api().nodes().await.unwrap();
            l.iter().filter(|n| n.state == NodeState::Dead).count() >= 150
        })
        .await
    );
    let ttl = 500;
    let hb = heartbeat_forever(&a, "victim", ttl).await;
    let id = submit(&a, "many", json!({"payload": 1})).await;
    assert_eq!(claim(&a, "many", "victim", 1, 0).await.len(), 1);
    hb.abort();
    let killed = Instant::now();
    assert!(
        wait_until(Duration::from_secs(5), || async { state_of(&a, &id).await == "queued" }).await,
        "the victim's task is recovered"
    );
    let took = killed.elapsed();
    assert!(
        took < Duration::from_millis(ttl + 100 + 700),
        "recovered after {took:?}"
    );
}
