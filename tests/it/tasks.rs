//! The task store against real Redis and several nodes: G1 (single winner,
//! fencing), G5 (idempotency), G6 (group limits, FIFO, no head-of-line
//! blocking), G4 (no leaks), and every outcome of every task script.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use muster::client::{
    BatchResponse, ClaimRequest, ClaimedTask, Complete, CompleteItem, Fail, NextRequest, NodeHeartbeat, Submitted,
    TaskHeartbeat, TaskSpec,
};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::common::*;

/// Registers a worker id with a long ttl.
pub async fn join(app: &TestApp, worker: &str) {
    let hb = NodeHeartbeat {
        ttl_ms: Some(120_000),
        ..Default::default()
    };
    app.api().heartbeat_node(worker, &hb).await.unwrap();
}

/// Submits a task as `body` says (raw, so a test may send any JSON; no
/// idempotency key is added): its id.
pub async fn submit(app: &TestApp, queue: &str, body: Value) -> String {
    let (s, b) = app.post(&format!("/api/v1/queues/{queue}/tasks"), body).await;
    assert!(s == 201 || s == 200, "{s} {b}");
    serde_json::from_value::<Submitted>(b).unwrap().id
}

pub async fn submit_many(app: &TestApp, queue: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut left = n;
    while left > 0 {
        let k = left.min(1000);
        let tasks: Vec<Value> = (0..k).map(|i| json!({"payload": {"i": n - left + i}})).collect();
        let (s, b) = app
            .post(&format!("/api/v1/queues/{queue}/tasks/batch"), json!({"tasks": tasks}))
            .await;
        assert_eq!(s, 200, "{b}");
        for r in serde_json::from_value::<BatchResponse>(b).unwrap().results {
            assert_eq!(r.status, "created", "{r:?}");
            ids.push(r.id.unwrap());
        }
        left -= k;
    }
    ids
}

/// Claims up to `max` tasks for `node`, typed (empty on 204).
pub async fn claim_tasks(app: &TestApp, queue: &str, node: &str, max: u32, wait_ms: u64) -> Vec<ClaimedTask> {
    let req = ClaimRequest {
        node: node.into(),
        max,
        wait_ms,
        ack_ms: None,
    };
    match app.api().claim(queue, &req).await {
        Ok(tasks) => tasks,
        Err(e) => panic!("claim: {e:?}"),
    }
}

/// [`claim_tasks`] as JSON, for the tests that read claims as sent.
pub async fn claim(app: &TestApp, queue: &str, node: &str, max: u32, wait_ms: u64) -> Vec<Value> {
    let tasks = claim_tasks(app, queue, node, max, wait_ms).await;
    tasks.iter().map(|t| serde_json::to_value(t).unwrap()).collect()
}

/// Completes a claimed task (no result) through the typed client.
pub async fn complete_task(app: &TestApp, t: &ClaimedTask) -> muster::client::FinishedNext {
    let c = Complete {
        token: t.token,
        result: Value::Null,
        next: None,
    };
    app.api().complete(&t.id, &c).await.unwrap()
}

/// A batch complete's items: each claimed task with its token and `result`.
pub fn completions<'a>(tasks: impl IntoIterator<Item = &'a ClaimedTask>, result: Value) -> Vec<CompleteItem> {
    tasks
        .into_iter()
        .map(|t| CompleteItem {
            id: t.id.clone(),
            token: t.token,
            result: result.clone(),
        })
        .collect()
}

/// Fails a claimed task (retried while attempts are left).
pub async fn fail_task(app: &TestApp, t: &ClaimedTask, error: &str) -> muster::client::FinishedNext {
    let f = Fail {
        token: t.token,
        error: error.into(),
        retry: true,
        next: None,
    };
    app.api().fail(&t.id, &f).await.unwrap()
}

/// A task of the key-leak workloads: an idempotency key always, and by `n` a
/// group (limited or not), an alias, or a single attempt (so it dies).
pub fn mixed_task(n: usize) -> Value {
    let mut t = json!({"payload": {"n": n}, "idempotency_key": format!("k{n}")});
    if n.is_multiple_of(3) {
        t["group"] = json!(if n.is_multiple_of(2) { "gg" } else { "free" });
    }
    if n.is_multiple_of(50) {
        t["alias"] = json!(format!("a{n}"));
    }
    if n.is_multiple_of(7) {
        t["max_attempts"] = json!(1);
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_each_attempt_is_claimed_once_across_three_nodes() {
    let redis = TestRedis::start();
    let nodes = Arc::new(vec![
        TestApp::start(&redis).await,
        TestApp::start(&redis).await,
        TestApp::start(&redis).await,
    ]);
    let total = 5000;
    submit_many(&nodes[0], "g1", total).await;
    let claims: Arc<Mutex<Vec<(String, u64, u32)>>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..12 {
        let nodes = nodes.clone();
        let claims = claims.clone();
        workers.push(tokio::spawn(async move {
            let app = &nodes[w % 3];
            let me = format!("w{w}");
            join(app, &me).await;
            loop {
                let got = claim_tasks(app, "g1", &me, 25, 0).await;
                if got.is_empty() {
                    break;
                }
                let items = completions(&got, json!(w));
                for r in app.api().complete_batch(&items).await.unwrap() {
                    assert_eq!(r.status, "completed", "{r:?}");
                }
                let mut c = claims.lock().await;
                for t in &got {
                    c.push((t.id.clone(), t.token, t.attempt));
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let claims = claims.lock().await;
    assert_eq!(claims.len(), total, "every task claimed exactly once");
    let ids: HashSet<_> = claims.iter().map(|c| &c.0).collect();
    assert_eq!(ids.len(), total, "no task claimed twice");
    let tokens: HashSet<_> = claims.iter().map(|c| c.1).collect();
    assert_eq!(tokens.len(), total, "every claim has its own token");
    assert!(claims.iter().all(|c| c.2 == 1 && c.1 < (1u64 << 53)));
    let q = nodes[1].api().queues().await.unwrap();
    assert_eq!(q[0].succeeded, total as u64, "{q:?}");
    // Claim events: exactly one per attempt.
    let events = redis.events("muster").await;
    assert_eq!(events.iter().filter(|(t, _, _)| t == "task.claimed").count(), total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_tokens_are_refused_and_change_nothing() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    stale_tokens_scenario(&a, &b).await;
}

/// Completing a task that was never claimed (no attempts yet) is a stale
/// token like any other, not an undecodable script reply (a 500 before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completing_a_never_claimed_task_is_a_conflict() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let id = submit(&a, "nc", json!({"payload": 1})).await;
    // Raw: a complete without a `result` field at all.
    let (s, r) = a
        .post(&format!("/api/v1/tasks/{id}/complete"), json!({"token": 1}))
        .await;
    assert_eq!(s, 409, "{r}");
    assert_eq!(as_problem(s, &r).extra["state"], "queued", "{r}");
    let (s, r) = a.post("/api/v1/tasks/complete", json!([{"id": id, "token": 1}])).await;
    assert_eq!(s, 200, "{r}");
    let r: muster::client::CompleteBatchResponse = serde_json::from_value(r).unwrap();
    assert_eq!(r.results[0].status, "conflict", "{r:?}");
}

/// G1 through two nodes: a retried task's old token is refused everywhere
/// (409, nothing changes); the holder completes once. Also run on a cluster.
pub async fn stale_tokens_scenario(a: &TestApp, b: &TestApp) {
    join(a, "wa").await;
    join(a, "wb").await;
    let id = submit(
        a,
        "st",
        json!({"payload": 1, "backoff_base_ms": 0, "backoff_cap_ms": 0}),
    )
    .await;
    let first = claim_tasks(a, "st", "wa", 1, 0).await;
    let t1 = first[0].token;
    // The first holder fails; the task is retried immediately and claimed again.
    let fail = |token: u64, error: &str| Fail {
        token,
        error: error.into(),
        retry: true,
        next: None,
    };
    let f = a.api().fail(&id, &fail(t1, "boom")).await.unwrap();
    assert_eq!(f.state, "delayed");
    let second = claim_tasks(b, "st", "wb", 1, 2000).await;
    assert_eq!(second.len(), 1);
    let t2 = second[0].token;
    assert!(t2 > t1, "a later claim has a greater token");
    assert_eq!(second[0].attempt, 2);
    // Every call with the old token is refused with the current state.
    let late = Complete {
        token: t1,
        result: json!("late"),
        next: None,
    };
    let beat = TaskHeartbeat {
        token: t1,
        progress: Some(50),
        fields: None,
    };
    for (path, p) in [
        ("complete", problem(b.api().complete(&id, &late).await)),
        ("fail", problem(b.api().fail(&id, &fail(t1, "late")).await)),
        ("heartbeat", problem(b.api().heartbeat_task(&id, &beat).await)),
    ] {
        assert_eq!(p.status, 409, "{path}: {p:?}");
        assert_eq!(p.extra["state"], "running", "{p:?}");
        assert!(p.detail.contains("stale"));
    }
    let task = a.api().task(&id).await.unwrap();
    assert_eq!(task.state, "running");
    assert_eq!(task.token, Some(t2));
    assert_eq!(task.progress, 0, "the stale heartbeat changed nothing");
    assert!(task.result.is_none());
    // The current holder completes; afterwards even it is refused.
    let done = Complete {
        token: t2,
        result: json!({"ok": 1}),
        next: None,
    };
    a.api().complete(&id, &done).await.unwrap();
    let p = problem(a.api().complete(&id, &done).await);
    assert_eq!(p.status, 409);
    assert_eq!(p.extra["state"], "succeeded");
    let task = a.api().task(&id).await.unwrap();
    let log = &task.attempt_log;
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].outcome.as_deref(), Some("failed"));
    assert_eq!(log[0].node, "wa");
    assert_eq!(log[1].outcome.as_deref(), Some("succeeded"));
    assert_eq!(log[1].token, t2);
    assert_eq!(task.result, Some(json!({"ok": 1})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_one_task_per_idempotency_key_across_nodes() {
    let redis = TestRedis::start();
    let nodes = Arc::new(vec![
        TestApp::start(&redis).await,
        TestApp::start(&redis).await,
        TestApp::start(&redis).await,
    ]);
    for round in 0..5 {
        let mut reqs = Vec::new();
        for i in 0..30 {
            let nodes = nodes.clone();
            reqs.push(tokio::spawn(async move {
                let app = &nodes[i % 3];
                let req = app
                    .request(reqwest::Method::POST, "/api/v1/queues/idem/tasks")
                    .header("Idempotency-Key", format!("order-{round}"))
                    .json(&json!({"payload": {"i": i}}));
                send(req).await
            }));
        }
        let mut created = 0;
        let mut ids = HashSet::new();
        for r in reqs {
            let (s, b) = r.await.unwrap();
            let b: Submitted = match s {
                200 | 201 => serde_json::from_value(b).unwrap(),
                _ => panic!("{s} {b}"),
            };
            match s {
                201 => created += 1,
                _ => assert!(b.replayed),
            }
            ids.insert(b.id);
        }
        assert_eq!(created, 1, "exactly one 201");
        assert_eq!(ids.len(), 1, "everyone got the same task");
    }
    let q = nodes[0].api().queues().await.unwrap();
    assert_eq!(q[0].queued, 5, "five keys, five tasks: {q:?}");
    // A replay through another queue names the original task's queue (keys
    // are unique within a shard when split: take a queue in idem's shard).
    let elsewhere = name_like("muster", "elsewhere", "idem");
    let spec = muster::client::TaskSpec {
        idempotency_key: Some("order-0".into()),
        ..Default::default()
    };
    let b = nodes[1].api().submit(&elsewhere, &spec).await.unwrap();
    assert!(b.replayed, "{b:?}");
    assert_eq!(b.queue, "idem", "{b:?}");
    assert_eq!(b.state, "queued", "{b:?}");
    // Header and body must agree.
    let req = nodes[0]
        .request(reqwest::Method::POST, "/api/v1/queues/idem/tasks")
        .header("Idempotency-Key", "a")
        .json(&json!({"idempotency_key": "b"}));
    assert_eq!(send(req).await.0, 400);
}

mod bounds;
mod cost;

mod groups;

mod lifecycle;

mod api;

mod leases;
