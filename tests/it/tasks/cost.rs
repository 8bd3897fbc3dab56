//! Per-task Redis cost (issue 13): a one-at-a-time worker completes a task
//! and claims its next one in the same call, and a ready task wakes only as
//! many waiting claimers as it can serve.

use std::sync::Arc;
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

/// Eight long-polling claims of worker `w` on the empty queue `q` (20 s
/// each), once each ran its first claim (a claim pops the ready set once)
/// and a moment more.
async fn eight_waiters(redis: &TestRedis, a: &TestApp, q: &str) -> Vec<tokio::task::JoinHandle<reqwest::Result<u16>>> {
    let pops = calls(redis, "zpopmin").await;
    let mut waiting = Vec::new();
    for _ in 0..8 {
        let http = a.http.clone();
        let url = format!("{}/api/v1/queues/{q}/claim", a.url);
        waiting.push(tokio::spawn(async move {
            http.post(&url)
                .json(&json!({"node": "w", "max": 1, "wait_ms": 20_000}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
    }
    let armed = wait_until(Duration::from_secs(10), || async {
        calls(redis, "zpopmin").await - pops >= 8
    })
    .await;
    assert!(armed, "the eight claims did not all run");
    tokio::time::sleep(Duration::from_millis(200)).await;
    waiting
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_task_wakes_one_waiting_claimer_not_all_of_them() {
    if counts_are_shared() {
        return;
    }
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let spawned = Instant::now();
    let waiting = eight_waiters(&redis, &a, "herd").await;
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

/// What one Redis server runs, as `MONITOR` shows it, from now until the
/// handle is aborted (each command a line).
async fn monitor(redis: &TestRedis) -> (tokio::task::JoinHandle<()>, Arc<std::sync::Mutex<String>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", redis.port)).await.unwrap();
    conn.write_all(b"MONITOR\r\n").await.unwrap();
    let mut ok = [0u8; 5];
    conn.read_exact(&mut ok).await.unwrap();
    assert_eq!(&ok, b"+OK\r\n");
    let out = seen.clone();
    let h = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = conn.read(&mut buf).await {
            if n == 0 {
                break;
            }
            out.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (h, seen)
}

/// A long-polling claim woken by an event that made nothing claimable in
/// its queue (here a group's limit changed, which wakes every waiter; in a
/// busy cluster, mostly a task another worker's complete took first) looks
/// again for three commands (the time, the ready set's size, the delayed
/// head), not a whole claim (the worker's registration, the queue's pause
/// and limits, a pop of the ready set).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_woken_for_nothing_looks_again_without_a_whole_claim() {
    if skip_on_cluster("watches one server's MONITOR") {
        return;
    }
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let waiting = eight_waiters(&redis, &a, "idle").await;
    let (watch, seen) = monitor(&redis).await;
    let started = Instant::now();
    let (s, b) = a.put("/api/v1/groups/any", json!({"limit": 3})).await;
    assert!(s == 200 || s == 201, "{s} {b}");
    let count = |cmd: &str| {
        let needle = format!("\"{cmd}\" \"{{muster}}:q:idle:ready\"");
        seen.lock().unwrap().matches(&needle).count()
    };
    // Every waiter looked again: the ready set's size, once each.
    assert!(
        wait_until(Duration::from_secs(5), || std::future::ready(count("ZCARD") >= 8)).await,
        "the waiters did not look again: {} ZCARDs",
        count("ZCARD")
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // None ran a whole claim (a waiter also claims whole every 2 s as a
    // safety net: only on a machine so loaded that this took that long may
    // those add some).
    if started.elapsed() < Duration::from_millis(1800) {
        assert_eq!(count("ZPOPMIN"), 0, "woken claims popped the ready set");
    }
    watch.abort();
    // And a task still reaches a waiter at once.
    let id = submit(&a, "idle", json!({})).await;
    let served = wait_until(Duration::from_secs(5), || async {
        waiting.iter().any(|h| h.is_finished())
    })
    .await;
    assert!(served, "no waiter got {id}");
    for h in waiting {
        h.abort();
    }
}

/// `next.wait_ms`: a one-at-a-time worker on an empty queue completes and
/// waits in the same call; a task enqueued meanwhile (on another node)
/// comes back in its answer, and, with `queue` given, the wait costs one
/// claim beyond the complete's own, and the ready set is popped once for
/// the task: the complete's own claim found the queue empty by its size.
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
    // One pop, by the claim after the wake-up (the complete's own claim
    // read the empty queue's size only); the waiter's 2 s safety-net
    // re-check adds one only if this machine was slow enough.
    let extra = (took.as_millis() / 2000) as i64;
    let reads = calls(&redis, "zpopmin").await - pops;
    assert!(
        (1..=1 + extra).contains(&reads),
        "one pop, by the claim after the wake-up: {reads} pops in {took:?}"
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
