//! Workflows: DAGs whose successors are dispatched exactly once, on real
//! Redis with several nodes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use muster::client::{
    ClaimedTask, Complete, CreatedWorkflow, Error, Fail, FailurePolicy, NewWorkflow, Submitted, TaskHeartbeat,
    Workflow, WorkflowTaskSpec,
};
use serde_json::{Value, json};

use crate::common::*;
use crate::tasks::join;

/// One task of a workflow: `key` in `queue` with `payload`, after `deps`.
fn step(key: &str, queue: &str, payload: Value, deps: &[&str]) -> WorkflowTaskSpec {
    WorkflowTaskSpec {
        key: key.into(),
        queue: queue.into(),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        payload,
        group: None,
        priority: None,
        delay_ms: None,
        max_attempts: None,
        timeout_ms: None,
        backoff_base_ms: None,
        backoff_cap_ms: None,
        limits: Vec::new(),
    }
}

/// A workflow of these tasks with the default failure policy and no key.
fn workflow(tasks: Vec<WorkflowTaskSpec>) -> NewWorkflow {
    NewWorkflow {
        tasks,
        ..NewWorkflow::default()
    }
}

fn diamond(queue: &str) -> NewWorkflow {
    workflow(vec![
        step("a", queue, json!("a"), &[]),
        step("b", queue, json!("b"), &["a"]),
        step("c", queue, json!("c"), &["a"]),
        step("d", queue, json!("d"), &["b", "c"]),
    ])
}

/// Starts a workflow (201, or 200 for a replay); returns its id.
async fn start(app: &TestApp, w: &NewWorkflow) -> String {
    app.api().start_workflow(w).await.unwrap().id
}

async fn wf(app: &TestApp, id: &str) -> Workflow {
    app.api().workflow(id).await.unwrap()
}

fn key_state(w: &Workflow, key: &str) -> String {
    w.node(key).unwrap().state.clone()
}

fn task_id(w: &Workflow, key: &str) -> String {
    w.node(key).unwrap().task_id.clone()
}

/// Claims up to `max` of a queue's tasks for a worker (empty when none came).
use crate::tasks::claim_tasks as claim;

/// Completes a claimed task with its token; the answer's status (200, or
/// the refusal's).
async fn complete(app: &TestApp, t: &ClaimedTask) -> u16 {
    let c = Complete {
        token: t.token,
        result: Value::Null,
        next: None,
    };
    match app.api().complete(&t.id, &c).await {
        Ok(_) => 200,
        Err(Error::Api(p)) => p.status,
        Err(e) => panic!("complete {}: {e}", t.id),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diamond_runs_in_dependency_order() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let id = start(&a, &diamond("dia")).await;
    let w = wf(&a, &id).await;
    assert_eq!(w.state, "running");
    assert_eq!(key_state(&w, "a"), "queued");
    assert_eq!(key_state(&w, "b"), "pending");
    // Only `a` can be claimed.
    let got = claim(&a, "dia", "w", 10, 0).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, "a");
    assert_eq!(complete(&a, &got[0]).await, 200);
    // Now b and c, not d.
    let got = claim(&a, "dia", "w", 10, 0).await;
    let payloads: HashSet<&str> = got.iter().map(|t| t.payload.as_str().unwrap()).collect();
    assert_eq!(payloads, HashSet::from(["b", "c"]));
    assert_eq!(complete(&a, &got[0]).await, 200);
    assert!(
        claim(&a, "dia", "w", 10, 0).await.is_empty(),
        "d waits for both b and c"
    );
    assert_eq!(complete(&a, &got[1]).await, 200);
    let got2 = claim(&a, "dia", "w", 10, 0).await;
    assert_eq!(got2.len(), 1);
    assert_eq!(got2[0].payload, "d");
    assert_eq!(complete(&a, &got2[0]).await, 200);
    let w = wf(&a, &id).await;
    assert_eq!(w.state, "succeeded");
    assert!(w.finished_at.is_some());
    let events: Vec<String> = redis.events("muster").await.into_iter().map(|e| e.0).collect();
    assert!(events.contains(&"workflow.started".into()) && events.contains(&"workflow.succeeded".into()));
    let list = a.api().workflows(Some("succeeded"), 50).await.unwrap();
    assert_eq!(list.workflows[0].id, id);
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
            let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
            tasks.push(step(&key, "wide", json!(key), &deps));
        }
    }
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(start(&apps[0], &workflow(tasks.clone())).await);
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
                    done.lock().await.push((t.id.clone(), t.token));
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
        assert_eq!(w.state, "succeeded");
        for t in &w.tasks {
            let mine = token_of[t.task_id.as_str()];
            for d in &t.depends_on {
                let dep = task_id(&w, d);
                assert!(
                    token_of[dep.as_str()] < mine,
                    "{} claimed before its dependency {d}",
                    t.key
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
        let id = start(&a, &diamond(&q)).await;
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
    let mut bad = step("bad", "ff", json!("bad"), &[]);
    bad.max_attempts = Some(1);
    let w = NewWorkflow {
        failure_policy: FailurePolicy::FailFast,
        ..workflow(vec![
            bad,
            step("slow", "ff", json!("slow"), &[]),
            step("waiting", "ff2", json!("w"), &[]),
            step("after", "ff", json!("after"), &["bad", "slow"]),
        ])
    };
    let id = start(&a, &w).await;
    let got = claim(&a, "ff", "w", 10, 0).await;
    let bad = got.iter().find(|t| t.payload == "bad").unwrap();
    let slow = got.iter().find(|t| t.payload == "slow").unwrap();
    let f = Fail {
        token: bad.token,
        error: "x".into(),
        retry: true,
        next: None,
    };
    a.api().fail(&bad.id, &f).await.unwrap();
    let w = wf(&a, &id).await;
    assert_eq!(w.state, "failed");
    assert_eq!(key_state(&w, "after"), "cancelled", "pending: cancelled");
    assert_eq!(key_state(&w, "waiting"), "cancelled", "queued, not started: cancelled");
    assert!(claim(&a, "ff2", "w", 10, 0).await.is_empty());
    // The running one was asked to stop; it finishes and the workflow closes.
    let hb = TaskHeartbeat {
        token: slow.token,
        ..TaskHeartbeat::default()
    };
    assert!(a.api().heartbeat_task(&slow.id, &hb).await.unwrap().cancel_requested);
    assert_eq!(complete(&a, slow).await, 200);
    let w = wf(&a, &id).await;
    assert_eq!(w.open, 0);
    assert!(w.finished_at.is_some());
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
    let mut x1 = step("x1", "co", json!("x1"), &[]);
    x1.max_attempts = Some(1);
    let w = NewWorkflow {
        failure_policy: FailurePolicy::Continue,
        ..workflow(vec![
            x1,
            step("x2", "co", json!("x2"), &["x1"]),
            step("x3", "co", json!("x3"), &["x2"]),
            step("y1", "co", json!("y1"), &[]),
            step("y2", "co", json!("y2"), &["y1"]),
        ])
    };
    let id = start(&a, &w).await;
    let got = claim(&a, "co", "w", 10, 0).await;
    for t in &got {
        if t.payload == "x1" {
            let f = Fail {
                token: t.token,
                error: String::new(),
                retry: false,
                next: None,
            };
            a.api().fail(&t.id, &f).await.unwrap();
        } else {
            assert_eq!(complete(&a, t).await, 200);
        }
    }
    let w = wf(&a, &id).await;
    assert_eq!(w.state, "running", "the independent branch goes on");
    assert_eq!(key_state(&w, "x2"), "skipped");
    assert_eq!(key_state(&w, "x3"), "skipped");
    let y2 = claim(&a, "co", "w", 10, 0).await;
    assert_eq!(y2.len(), 1);
    assert_eq!(y2[0].payload, "y2");
    assert_eq!(complete(&a, &y2[0]).await, 200);
    let w = wf(&a, &id).await;
    assert_eq!(w.state, "failed", "a branch failed");
    assert_eq!(key_state(&w, "y2"), "succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_idempotency_and_cancel() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let v = |key: &str, deps: &[&str]| step(key, "v", Value::Null, deps);
    let cycle = workflow(vec![v("a", &["c"]), v("b", &["a"]), v("c", &["b"])]);
    let p = problem(a.api().start_workflow(&cycle).await);
    assert_eq!(p.status, 400);
    assert!(p.detail.starts_with("cycle: "), "{p:?}");
    for bad in [
        workflow(vec![]),
        workflow(vec![v("a", &[]), v("a", &[])]),
        workflow(vec![v("a", &["nope"])]),
        workflow(vec![v("a b", &[])]),
    ] {
        assert_eq!(problem(a.api().start_workflow(&bad).await).status, 400, "{bad:?}");
    }
    // Bodies the typed workflow cannot hold: sent raw.
    for bad in [
        json!({"tasks": [{"key": "a", "queue": "v", "alias": "x"}]}),
        json!({"tasks": [{"key": "a", "queue": "v"}], "failure_policy": "sometimes"}),
    ] {
        assert_eq!(a.post("/api/v1/workflows", bad.clone()).await.0, 400, "{bad}");
    }
    assert_eq!(
        problem(a.api().workflow("01ARZ3NDEKTSV4RRFFQ69G5FAV").await).status,
        404
    );
    assert_eq!(problem(a.api().workflows(Some("odd"), 50).await).status, 400);
    // Idempotent start (raw, for the statuses: 201 new, 200 replay).
    let body = NewWorkflow {
        idempotency_key: Some("nightly-2026-11-22".into()),
        ..diamond("idem")
    };
    let body = serde_json::to_value(&body).unwrap();
    let (s1, b1) = a.post("/api/v1/workflows", body.clone()).await;
    let (s2, b2) = a.post("/api/v1/workflows", body).await;
    assert_eq!((s1, s2), (201, 200), "{b1} {b2}");
    let b1: CreatedWorkflow = serde_json::from_value(b1).unwrap();
    let b2: CreatedWorkflow = serde_json::from_value(b2).unwrap();
    assert_eq!(b1.id, b2.id);
    assert!(b2.replayed);
    assert_eq!(claim(&a, "idem", "w", 10, 0).await.len(), 1, "one workflow, one root");
    // Cancel.
    let id = b1.id.as_str();
    a.api().cancel_workflow(id).await.unwrap();
    let w = wf(&a, id).await;
    assert_eq!(w.state, "cancelled");
    assert_eq!(key_state(&w, "d"), "cancelled");
    assert_eq!(problem(a.api().cancel_workflow(id).await).status, 409);
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
        let w = NewWorkflow {
            idempotency_key: Some(format!("k{i}")),
            ..diamond("ret")
        };
        start(&a, &w).await;
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
    let w = NewWorkflow {
        failure_policy: FailurePolicy::Continue,
        ..workflow(vec![
            step("a", "wa", json!("a"), &[]),
            step("b", "wb", json!("b"), &["a"]),
            step("c", "wa", json!("c"), &["a"]),
        ])
    };
    let id = start(&a, &w).await;
    // Meanwhile another queue takes the last place (raw: the typed submit
    // would add an idempotency key).
    let (s, other) = a.post("/api/v1/queues/other/tasks", json!({})).await;
    assert_eq!(s, 201, "{other}");
    let other: Submitted = serde_json::from_value(other).unwrap();
    let queues = || async {
        let mut names: Vec<String> = a.api().queues().await.unwrap().into_iter().map(|q| q.name).collect();
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
        "{w:?}"
    );
    let b = task_id(&w, "b");
    let t = a.api().task(&b).await.unwrap();
    assert_eq!(t.state, "dead", "{t:?}");
    assert!(t.error.as_deref().unwrap().contains("tasks.max_queues"), "{t:?}");
    let dead = a.api().dead_page(100, None).await.unwrap();
    assert_eq!(dead.tasks[0].id, b, "listed with the dead letters: {dead:?}");
    assert_eq!(queues().await, ["other", "wa"], "the bound holds");
    // The independent branch goes on (policy continue); the workflow fails at the end.
    let got = claim(&a, "wa", "w", 1, 0).await;
    assert_eq!(complete(&a, &got[0]).await, 200);
    let w = wf(&a, &id).await;
    assert_eq!((w.state.as_str(), w.open), ("failed", 0), "{w:?}");
    // A retry is refused while there is no room, and queues it once there is.
    let p = problem(a.api().retry_task(&b).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert!(p.detail.contains("max_queues"), "{p:?}");
    let got = claim(&a, "other", "w", 1, 0).await;
    assert_eq!(got[0].id, other.id);
    assert_eq!(complete(&a, &got[0]).await, 200);
    a.api().delete_task(&other.id).await.unwrap();
    let freed = wait_until(Duration::from_secs(10), || async { queues().await == ["wa"] }).await;
    assert!(freed, "the empty queue is forgotten: {:?}", queues().await);
    a.api().retry_task(&b).await.unwrap();
    assert_eq!(queues().await, ["wa", "wb"]);
    let got = claim(&a, "wb", "w", 1, 0).await;
    assert_eq!(got[0].id, b);
}
