//! Workflows: DAGs whose successors are dispatched exactly once, on real
//! Redis with several nodes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;
use crate::tasks::{claim, join};

fn diamond(queue: &str) -> Value {
    json!({"tasks": [
        {"key": "a", "queue": queue, "payload": "a"},
        {"key": "b", "queue": queue, "payload": "b", "depends_on": ["a"]},
        {"key": "c", "queue": queue, "payload": "c", "depends_on": ["a"]},
        {"key": "d", "queue": queue, "payload": "d", "depends_on": ["b", "c"]}
    ]})
}

async fn start(app: &TestApp, body: Value) -> String {
    let (s, b) = app.post("/api/v1/workflows", body).await;
    assert!(s == 201 || s == 200, "{s} {b}");
    b["id"].as_str().unwrap().to_string()
}

async fn wf(app: &TestApp, id: &str) -> Value {
    let (s, b) = app.get(&format!("/api/v1/workflows/{id}")).await;
    assert_eq!(s, 200, "{b}");
    b
}

fn key_state(w: &Value, key: &str) -> String {
    w["tasks"].as_array().unwrap().iter().find(|t| t["key"] == key).unwrap()["state"]
        .as_str()
        .unwrap()
        .to_string()
}

fn task_id(w: &Value, key: &str) -> String {
    w["tasks"].as_array().unwrap().iter().find(|t| t["key"] == key).unwrap()["task_id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn complete(app: &TestApp, t: &Value) -> u16 {
    app.post(
        &format!("/api/v1/tasks/{}/complete", t["id"].as_str().unwrap()),
        json!({"token": t["token"]}),
    )
    .await
    .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diamond_runs_in_dependency_order() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let id = start(&a, diamond("dia")).await;
    let w = wf(&a, &id).await;
    assert_eq!(w["state"], "running");
    assert_eq!(key_state(&w, "a"), "queued");
    assert_eq!(key_state(&w, "b"), "pending");
    // Only `a` can be claimed.
    let got = claim(&a, "dia", "w", 10, 0).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["payload"], "a");
    assert_eq!(complete(&a, &got[0]).await, 200);
    // Now b and c, not d.
    let got = claim(&a, "dia", "w", 10, 0).await;
    let payloads: HashSet<&str> = got.iter().map(|t| t["payload"].as_str().unwrap()).collect();
    assert_eq!(payloads, HashSet::from(["b", "c"]));
    assert_eq!(complete(&a, &got[0]).await, 200);
    assert!(
        claim(&a, "dia", "w", 10, 0).await.is_empty(),
        "d waits for both b and c"
    );
    assert_eq!(complete(&a, &got[1]).await, 200);
    let got2 = claim(&a, "dia", "w", 10, 0).await;
    assert_eq!(got2.len(), 1);
    assert_eq!(got2[0]["payload"], "d");
    assert_eq!(complete(&a, &got2[0]).await, 200);
    let w = wf(&a, &id).await;
    assert_eq!(w["state"], "succeeded");
    assert!(w["finished_at"].as_i64().is_some());
    let events: Vec<String> = redis.events("muster").await.into_iter().map(|e| e.0).collect();
    assert!(events.contains(&"workflow.started".into()) && events.contains(&"workflow.succeeded".into()));
    let (_, list) = a.get("/api/v1/workflows?state=succeeded").await;
    assert_eq!(list["workflows"][0]["id"], id.as_str());
    let html = a.page(&format!("/workflows/{id}")).await;
    assert!(html.contains("<svg class=\"dag\"") && html.contains("node succeeded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wide_dags_over_three_nodes_run_each_task_once_after_its_dependencies() {
    let redis = TestRedis::start();
    let apps = Arc::new(vec![
        TestApp::start(&redis).await,
        TestApp::start(&redis).await,
        TestApp::start(&redis).await,
    ]);
    // Layers of 6: each task depends on two tasks of the layer before.
    let mut tasks = Vec::new();
    for layer in 0..5 {
        for i in 0..6 {
            let key = format!("t{layer}-{i}");
            let deps: Vec<String> = if layer == 0 {
                vec![]
            } else {
                vec![
                    format!("t{}-{}", layer - 1, i),
                    format!("t{}-{}", layer - 1, (i + 1) % 6),
                ]
            };
            tasks.push(json!({"key": key, "queue": "wide", "payload": key, "depends_on": deps}));
        }
    }
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(start(&apps[0], json!({"tasks": tasks})).await);
    }
    // Six workers over three nodes; each records (payload, workflow task order).
    let done: Arc<tokio::sync::Mutex<Vec<(String, u64)>>> = Arc::default();
    let mut handles = Vec::new();
    for w in 0..6 {
        let apps = apps.clone();
        let done = done.clone();
        handles.push(tokio::spawn(async move {
            let app = &apps[w % 3];
            let me = format!("ww{w}");
            join(app, &me).await;
            let mut idle = 0;
            while idle < 10 {
                let got = claim(app, "wide", &me, 3, 100).await;
                if got.is_empty() {
                    idle += 1;
                    continue;
                }
                idle = 0;
                for t in got {
                    done.lock()
                        .await
                        .push((t["id"].as_str().unwrap().to_string(), t["token"].as_u64().unwrap()));
                    assert_eq!(complete(app, &t).await, 200);
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let done = done.lock().await;
    assert_eq!(done.len(), 4 * 30, "every task ran");
    let unique: HashSet<&String> = done.iter().map(|d| &d.0).collect();
    assert_eq!(unique.len(), 4 * 30, "each exactly once");
    // Successors were claimed (token order) only after their dependencies.
    let token_of: HashMap<&str, u64> = done.iter().map(|(id, t)| (id.as_str(), *t)).collect();
    for id in &ids {
        let w = wf(&apps[1], id).await;
        assert_eq!(w["state"], "succeeded");
        for t in w["tasks"].as_array().unwrap() {
            let mine = token_of[t["task_id"].as_str().unwrap()];
            for d in t["depends_on"].as_array().unwrap() {
                let dep = task_id(&w, d.as_str().unwrap());
                assert!(
                    token_of[dep.as_str()] < mine,
                    "{} claimed before its dependency {d}",
                    t["key"]
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_and_duplicate_completions_dispatch_the_successor_once() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    join(&a, "w").await;
    for round in 0..15 {
        let q = format!("race{round}");
        let id = start(&a, diamond(&q)).await;
        let first = claim(&a, &q, "w", 1, 0).await;
        assert_eq!(complete(&a, &first[0]).await, 200);
        let pair = claim(&a, &q, "w", 2, 0).await;
        assert_eq!(pair.len(), 2);
        // The last two dependencies complete at the same moment on two nodes,
        // each twice (a duplicate with the same token).
        let (r1, r2, r3, r4) = tokio::join!(
            complete(&a, &pair[0]),
            complete(&b, &pair[1]),
            complete(&b, &pair[0]),
            complete(&a, &pair[1])
        );
        let mut codes = [r1, r2, r3, r4];
        codes.sort();
        assert_eq!(codes, [200, 200, 409, 409], "each completion accepted once");
        let w = wf(&a, &id).await;
        let d = task_id(&w, "d");
        let enq = redis
            .events("muster")
            .await
            .into_iter()
            .filter(|(t, _, f)| t == "task.enqueued" && f["task"] == d.as_str())
            .count();
        assert_eq!(enq, 1, "d dispatched exactly once (round {round})");
        assert_eq!(claim(&a, &q, "w", 10, 0).await.len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fast_cancels_everything_not_started() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let id = start(
        &a,
        json!({"failure_policy": "fail_fast", "tasks": [
            {"key": "bad", "queue": "ff", "payload": "bad", "max_attempts": 1},
            {"key": "slow", "queue": "ff", "payload": "slow"},
            {"key": "waiting", "queue": "ff2", "payload": "w"},
            {"key": "after", "queue": "ff", "payload": "after", "depends_on": ["bad", "slow"]}
        ]}),
    )
    .await;
    let got = claim(&a, "ff", "w", 10, 0).await;
    let bad = got.iter().find(|t| t["payload"] == "bad").unwrap();
    let slow = got.iter().find(|t| t["payload"] == "slow").unwrap();
    let (s, _) = a
        .post(
            &format!("/api/v1/tasks/{}/fail", bad["id"].as_str().unwrap()),
            json!({"token": bad["token"], "error": "x"}),
        )
        .await;
    assert_eq!(s, 200);
    let w = wf(&a, &id).await;
    assert_eq!(w["state"], "failed");
    assert_eq!(key_state(&w, "after"), "cancelled", "pending: cancelled");
    assert_eq!(key_state(&w, "waiting"), "cancelled", "queued, not started: cancelled");
    assert!(claim(&a, "ff2", "w", 10, 0).await.is_empty());
    // The running one was asked to stop; it finishes and the workflow closes.
    let (_, hb) = a
        .post(
            &format!("/api/v1/tasks/{}/heartbeat", slow["id"].as_str().unwrap()),
            json!({"token": slow["token"]}),
        )
        .await;
    assert_eq!(hb["cancel_requested"], true);
    assert_eq!(complete(&a, slow).await, 200);
    let w = wf(&a, &id).await;
    assert_eq!(w["open"], 0);
    assert!(w["finished_at"].as_i64().is_some());
    assert!(
        claim(&a, "ff", "w", 10, 0).await.is_empty(),
        "nothing was dispatched after the failure"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_skips_only_the_failed_branch() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let id = start(
        &a,
        json!({"failure_policy": "continue", "tasks": [
            {"key": "x1", "queue": "co", "payload": "x1", "max_attempts": 1},
            {"key": "x2", "queue": "co", "payload": "x2", "depends_on": ["x1"]},
            {"key": "x3", "queue": "co", "payload": "x3", "depends_on": ["x2"]},
            {"key": "y1", "queue": "co", "payload": "y1"},
            {"key": "y2", "queue": "co", "payload": "y2", "depends_on": ["y1"]}
        ]}),
    )
    .await;
    let got = claim(&a, "co", "w", 10, 0).await;
    for t in &got {
        if t["payload"] == "x1" {
            a.post(
                &format!("/api/v1/tasks/{}/fail", t["id"].as_str().unwrap()),
                json!({"token": t["token"], "retry": false}),
            )
            .await;
        } else {
            assert_eq!(complete(&a, t).await, 200);
        }
    }
    let w = wf(&a, &id).await;
    assert_eq!(w["state"], "running", "the independent branch goes on");
    assert_eq!(key_state(&w, "x2"), "skipped");
    assert_eq!(key_state(&w, "x3"), "skipped");
    let y2 = claim(&a, "co", "w", 10, 0).await;
    assert_eq!(y2.len(), 1);
    assert_eq!(y2[0]["payload"], "y2");
    assert_eq!(complete(&a, &y2[0]).await, 200);
    let w = wf(&a, &id).await;
    assert_eq!(w["state"], "failed", "a branch failed");
    assert_eq!(key_state(&w, "y2"), "succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_idempotency_and_cancel() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let (s, b) = a
        .post(
            "/api/v1/workflows",
            json!({"tasks": [
            {"key": "a", "queue": "v", "depends_on": ["c"]},
            {"key": "b", "queue": "v", "depends_on": ["a"]},
            {"key": "c", "queue": "v", "depends_on": ["b"]}]}),
        )
        .await;
    assert_eq!(s, 400);
    assert!(b["detail"].as_str().unwrap().starts_with("cycle: "), "{b}");
    for bad in [
        json!({"tasks": []}),
        json!({"tasks": [{"key": "a", "queue": "v"}, {"key": "a", "queue": "v"}]}),
        json!({"tasks": [{"key": "a", "queue": "v", "depends_on": ["nope"]}]}),
        json!({"tasks": [{"key": "a b", "queue": "v"}]}),
        json!({"tasks": [{"key": "a", "queue": "v", "alias": "x"}]}),
        json!({"tasks": [{"key": "a", "queue": "v"}], "failure_policy": "sometimes"}),
    ] {
        assert_eq!(a.post("/api/v1/workflows", bad.clone()).await.0, 400, "{bad}");
    }
    assert_eq!(a.get("/api/v1/workflows/01ARZ3NDEKTSV4RRFFQ69G5FAV").await.0, 404);
    assert_eq!(a.get("/api/v1/workflows?state=odd").await.0, 400);
    // Idempotent start.
    let mut body = diamond("idem");
    body["idempotency_key"] = json!("nightly-2026-11-22");
    let (s1, b1) = a.post("/api/v1/workflows", body.clone()).await;
    let (s2, b2) = a.post("/api/v1/workflows", body).await;
    assert_eq!((s1, s2), (201, 200));
    assert_eq!(b1["id"], b2["id"]);
    assert_eq!(b2["replayed"], true);
    assert_eq!(claim(&a, "idem", "w", 10, 0).await.len(), 1, "one workflow, one root");
    // Cancel.
    let id = b1["id"].as_str().unwrap();
    assert_eq!(
        a.post(&format!("/api/v1/workflows/{id}/cancel"), Value::Null).await.0,
        204
    );
    let w = wf(&a, id).await;
    assert_eq!(w["state"], "cancelled");
    assert_eq!(key_state(&w, "d"), "cancelled");
    assert_eq!(
        a.post(&format!("/api/v1/workflows/{id}/cancel"), Value::Null).await.0,
        409
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflow_keys_return_to_baseline_after_retention() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| {
        c.tasks.retention_ms = 800;
        c.tasks.idempotency_window_ms = 1500;
    })
    .await;
    join(&a, "w").await;
    let baseline = redis.key_baseline().await;
    for i in 0..5 {
        let mut body = diamond("ret");
        body["idempotency_key"] = json!(format!("k{i}"));
        start(&a, body).await;
    }
    let mut left = 20;
    while left > 0 {
        let got = claim(&a, "ret", "w", 10, 500).await;
        for t in &got {
            assert_eq!(complete(&a, t).await, 200);
        }
        left -= got.len();
    }
    // Only the workflow's own keys and its tasks' are checked here.
    redis
        .assert_back_to_baseline(&baseline, Duration::from_secs(15), |k| {
            !(k.contains(":wf") || k.contains(":task:") || k.contains(":q:ret") || k.contains(":workflows"))
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_whose_queue_cannot_be_created_dies_visibly_and_can_be_retried() {
    if skip_when_sharded("tasks.max_queues counts per shard, and a workflow without groups or key lands in any shard") {
        return;
    }
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| c.tasks.max_queues = 2).await;
    join(&a, "w").await;
    // Both queues fit when the workflow starts; only `wa` is registered then.
    let id = start(
        &a,
        json!({"failure_policy": "continue", "tasks": [
            {"key": "a", "queue": "wa", "payload": "a"},
            {"key": "b", "queue": "wb", "payload": "b", "depends_on": ["a"]},
            {"key": "c", "queue": "wa", "payload": "c", "depends_on": ["a"]}
        ]}),
    )
    .await;
    // Meanwhile another queue takes the last place.
    let (s, other) = a.post("/api/v1/queues/other/tasks", json!({})).await;
    assert_eq!(s, 201, "{other}");
    let queues = || async {
        let (_, q) = a.get("/api/v1/queues").await;
        let mut names: Vec<String> = q["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    assert_eq!(queues().await, ["other", "wa"]);
    let got = claim(&a, "wa", "w", 1, 0).await;
    assert_eq!(complete(&a, &got[0]).await, 200);
    // `b` could not be queued without passing tasks.max_queues: dead, saying why.
    let w = wf(&a, &id).await;
    assert_eq!(
        (key_state(&w, "b"), key_state(&w, "c")),
        ("dead".into(), "queued".into()),
        "{w}"
    );
    let b = task_id(&w, "b");
    let (_, t) = a.get(&format!("/api/v1/tasks/{b}")).await;
    assert_eq!(t["state"], "dead", "{t}");
    assert!(t["error"].as_str().unwrap().contains("tasks.max_queues"), "{t}");
    let (_, dead) = a.get("/api/v1/dead").await;
    assert_eq!(
        dead["tasks"][0]["id"],
        b.as_str(),
        "listed with the dead letters: {dead}"
    );
    assert_eq!(queues().await, ["other", "wa"], "the bound holds");
    // The independent branch goes on (policy continue); the workflow fails at the end.
    let got = claim(&a, "wa", "w", 1, 0).await;
    assert_eq!(complete(&a, &got[0]).await, 200);
    let w = wf(&a, &id).await;
    assert_eq!(
        (w["state"].as_str(), w["open"].as_i64()),
        (Some("failed"), Some(0)),
        "{w}"
    );
    // A retry is refused while there is no room, and queues it once there is.
    let (s, r) = a.post(&format!("/api/v1/tasks/{b}/retry"), Value::Null).await;
    assert_eq!(s, 409, "{r}");
    assert!(r["detail"].as_str().unwrap().contains("max_queues"), "{r}");
    let got = claim(&a, "other", "w", 1, 0).await;
    assert_eq!(got[0]["id"], other["id"]);
    assert_eq!(complete(&a, &got[0]).await, 200);
    assert_eq!(
        a.delete(&format!("/api/v1/tasks/{}", other["id"].as_str().unwrap()))
            .await
            .0,
        204
    );
    let freed = wait_until(Duration::from_secs(10), || async { queues().await == ["wa"] }).await;
    assert!(freed, "the empty queue is forgotten: {:?}", queues().await);
    let (s, r) = a.post(&format!("/api/v1/tasks/{b}/retry"), Value::Null).await;
    assert_eq!(s, 204, "{r}");
    assert_eq!(queues().await, ["wa", "wb"]);
    let got = claim(&a, "wb", "w", 1, 0).await;
    assert_eq!(got[0]["id"], b.as_str());
}
