//! Per-task Redis cost (issue 13): a one-at-a-time worker completes a task
//! and claims its next one in the same call, and a ready task wakes only as
//! many waiting claimers as it can serve.

use std::time::{Duration, Instant};

use muster::client::{ClaimedTask, Complete, Fail, FinishedNext, NextRequest};
use serde_json::{Value, json};

use crate::common::*;
use crate::tasks::{claim_tasks, join, submit};

/// A complete of `t` with `token` that claims `next` in the same call.
async fn complete_next(
    a: &TestApp,
    t: &ClaimedTask,
    token: u64,
    next: NextRequest,
) -> muster::client::Result<FinishedNext> {
    let c = Complete {
        token,
        result: Value::Null,
        next: Some(next),
    };
    a.api().complete(&t.id, &c).await
}

/// The `i` of a task's `{"i": n}` payload.
fn i_of(t: &ClaimedTask) -> u64 {
    t.payload.get("i").and_then(Value::as_u64).unwrap()
}

/// Calls of one Redis command so far (commands run inside scripts count).
async fn calls(redis: &TestRedis, cmd: &str) -> i64 {
    let info: String = redis.cmd(&["INFO", "commandstats"]).await;
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Split namespaces on the shared cluster (`MUSTER_TEST_SHARDS` and
/// `MUSTER_TEST_CLUSTER`) have keys on every master, so other tests' claims
/// land in the same `INFO commandstats` counts: the counting tests skip
/// there (they run on servers of their own in the other modes).
fn counts_are_shared() -> bool {
    sharded() && skip_on_cluster("counts commands in INFO commandstats, which other tests' split namespaces share")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_and_fail_can_claim_the_next_task_in_the_same_call() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    for i in 0..3 {
        submit(&a, "nx", json!({"payload": {"i": i}})).await;
    }
    let t = claim_tasks(&a, "nx", "w", 1, 0).await;
    let r = complete_next(&a, &t[0], t[0].token, NextRequest::default())
        .await
        .unwrap();
    assert_eq!(r.state, "succeeded", "{r:?}");
    let next = r.next.as_ref().unwrap().tasks.clone();
    assert_eq!(next.len(), 1, "{r:?}");
    assert_eq!(i_of(&next[0]), 1, "FIFO: the next task in line");
    assert!(next[0].token > t[0].token, "G1: a newer token");
    // fail with next: the failed task is retried later, the next one runs now.
    let f = Fail {
        token: next[0].token,
        error: "boom".into(),
        retry: true,
        next: Some(NextRequest {
            max: Some(5),
            ..Default::default()
        }),
    };
    let r = a.api().fail(&next[0].id, &f).await.unwrap();
    assert_eq!(r.state, "delayed", "{r:?}");
    let tasks = &r.next.as_ref().unwrap().tasks;
    assert_eq!(tasks.len(), 1, "{r:?}");
    assert_eq!(i_of(&tasks[0]), 2);
    // A stale token claims nothing and changes nothing.
    let third = tasks[0].clone();
    let p = problem(complete_next(&a, &third, third.token - 1, NextRequest::default()).await);
    assert_eq!(p.status, 409);
    // A draining worker completes but is told why it gets nothing next.
    a.api().drain_node("w").await.unwrap();
    submit(&a, "nx", json!({})).await;
    let r = complete_next(&a, &third, third.token, NextRequest::default())
        .await
        .unwrap();
    let next = r.next.as_ref().unwrap();
    assert!(next.tasks.is_empty(), "{r:?}");
    assert!(
        next.refused.as_deref().unwrap().contains("node `w` is draining"),
        "{r:?}"
    );
    // Bad input is refused before anything happens.
    let zero = NextRequest {
        max: Some(0),
        ..Default::default()
    };
    let p = problem(complete_next(&a, &third, third.token, zero).await);
    assert_eq!(p.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_task_wakes_one_waiting_claimer_not_all_of_them() {
    if counts_are_shared() {
        return;
    }
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    // Eight long-polling claimers on an empty queue.
    let spawned = Instant::now();
    let mut waiting = Vec::new();
    for _ in 0..8 {
        let http = a.http.clone();
        let url = format!("{}/api/v1/queues/herd/claim", a.url);
        waiting.push(tokio::spawn(async move {
            http.post(&url)
                .json(&json!({"node": "w", "max": 1, "wait_ms": 20_000}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
    }
    // Each ran its first (empty) claim (a claim pops the ready set once).
    let armed = wait_until(Duration::from_secs(10), || async {
        calls(&redis, "zpopmin").await >= 8
    })
    .await;
    assert!(armed);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = calls(&redis, "zpopmin").await;
    submit(&a, "herd", json!({})).await;
    let served = wait_until(Duration::from_secs(5), || async {
        waiting.iter().any(|h| h.is_finished())
    })
    .await;
    assert!(served, "one claimer got the task");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let runs = calls(&redis, "zpopmin").await - before;
    // One claim: the woken one took the only task and, the ready set being
    // empty after it, woke nobody else. (A waiter also re-checks every 2 s
    // as a safety net: only on a machine so loaded that this took that long
    // may those add claims.)
    if spawned.elapsed() < Duration::from_millis(1900) {
        assert_eq!(runs, 1, "one task woke {runs} claims (every waiter: a herd)");
    } else {
        assert!(runs < 8, "one task woke {runs} claims (every waiter: a herd)");
    }
    assert_eq!(waiting.iter().filter(|h| h.is_finished()).count(), 1);
    for h in waiting {
        h.abort();
    }
}

/// `next.wait_ms`: a one-at-a-time worker on an empty queue completes and
/// waits in the same call; a task enqueued meanwhile (on another node)
/// comes back in its answer, and, with `queue` given, the wait costs one
/// claim beyond the complete's own: two queue reads for the task, not three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_can_wait_for_the_next_task() {
    if counts_are_shared() {
        return;
    }
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    join(&a, "w").await;
    submit(&a, "nw", json!({})).await;
    let t = claim_tasks(&a, "nw", "w", 1, 0).await;
    let path = format!("/api/v1/tasks/{}/complete", t[0].id);
    // Bad waits are refused and change nothing (raw: the typed request
    // cannot hold a negative or a text wait).
    for bad in [
        json!({"wait_ms": 30_001}),
        json!({"wait_ms": -1}),
        json!({"wait_ms": "1"}),
    ] {
        let (s, r) = a.post(&path, json!({"token": t[0].token, "next": bad})).await;
        assert_eq!(s, 400, "{r}");
    }
    let pops = calls(&redis, "zpopmin").await;
    let api = a.api().clone();
    let first = t[0].clone();
    let wait = NextRequest {
        queue: Some("nw".into()),
        wait_ms: Some(10_000),
        ..Default::default()
    };
    let started = Instant::now();
    let done = tokio::spawn(async move {
        let c = Complete {
            token: first.token,
            result: Value::Null,
            next: Some(wait),
        };
        let r = api.complete(&first.id, &c).await;
        (r, started.elapsed())
    });
    // The complete is applied at once, before the wait.
    let applied = wait_until(Duration::from_secs(5), || async {
        a.api().task(&t[0].id).await.unwrap().state == "succeeded"
    })
    .await;
    assert!(applied, "{:?}", a.api().task(&t[0].id).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!done.is_finished(), "it waits while the queue is empty");
    let second = submit(&b, "nw", json!({"payload": {"n": 2}})).await;
    let (r, took) = done.await.unwrap();
    let r = r.unwrap();
    assert_eq!(r.state, "succeeded", "{r:?}");
    assert_eq!(r.next.as_ref().unwrap().tasks[0].id, second, "{r:?}");
    assert!(
        took < Duration::from_secs(8),
        "woken by the enqueue, not the end of the wait: {took:?}"
    );
    // The complete's claim and one after the wake-up; the waiter's 2 s
    // safety-net re-check adds one only if this machine was slow enough.
    let extra = (took.as_millis() / 2000) as i64;
    let reads = calls(&redis, "zpopmin").await - pops;
    assert!(
        (2..=2 + extra).contains(&reads),
        "the complete's claim and one after the wake-up: {reads} queue reads in {took:?}"
    );
    // Nothing comes: the answer comes when the wait ends, with no task.
    let t2 = &r.next.as_ref().unwrap().tasks[0];
    let started = Instant::now();
    let short = NextRequest {
        wait_ms: Some(400),
        ..Default::default()
    };
    let r = complete_next(&a, t2, t2.token, short).await.unwrap();
    assert!(r.next.as_ref().unwrap().tasks.is_empty(), "{r:?}");
    assert!(started.elapsed() >= Duration::from_millis(400));
}
