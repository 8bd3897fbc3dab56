//! Locks and elections: fencing tokens strictly increase and stale ones are
//! refused, waiters are served in FIFO order, an abandoned waiter does not
//! block the line, a dead holder's lock is re-acquired after its TTL (or at
//! its node's death), one leader per epoch under contention, `muster lock
//! run`, roles, keys returning to baseline, and each script refusal's HTTP
//! answer.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster::client::{Acquire, Acquired, Campaign, Result as ApiResult};
use serde_json::{Value, json};

use crate::common::*;

/// Key `rest` of the shard lock or election `name` lives in (`{muster}:<rest>`
/// with one shard, `{muster#i.k}:<rest>` when split: the shard of its name).
fn kn(name: &str, rest: &str) -> String {
    format!("{}:{rest}", name_tag("muster", name))
}

async fn acquire(app: &TestApp, name: &str, owner: &str, ttl_ms: u64, wait_ms: u64) -> ApiResult<Acquired> {
    let a = Acquire {
        owner: owner.into(),
        ttl_ms,
        wait_ms,
        node: None,
    };
    app.api().acquire(name, &a).await
}

/// Releases the lock held under `token` (204; a refusal is a problem).
async fn release(app: &TestApp, name: &str, token: u64) -> ApiResult<()> {
    app.api().release(name, token).await
}

async fn waiters(app: &TestApp, name: &str) -> Vec<String> {
    app.api().lock(name).await.unwrap().waiters
}

/// A campaign as the tests make it.
fn campaign(candidate: &str, ttl_ms: u64, wait_ms: u64, value: Option<Value>) -> Campaign {
    Campaign {
        candidate: candidate.into(),
        ttl_ms,
        wait_ms,
        value,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_and_stale_tokens_are_refused() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let mut last = 0u64;
    // Tokens grow across every lock of a shard (one counter per shard): a
    // second lock in the shard of `res` (`other` itself with one shard).
    let other = name_like("muster", "other", "res");
    for i in 0..20 {
        let app = if i % 2 == 0 { &a } else { &b };
        let name = if i % 3 == 0 { other.as_str() } else { "res" };
        let v = acquire(app, name, &format!("o{i}"), 5000, 0).await.unwrap();
        let token = v.token;
        assert!(token > last, "token {token} after {last}");
        last = token;
        release(app, name, v.token).await.unwrap();
    }
    let held = acquire(&a, "res", "holder", 5000, 0).await.unwrap();
    let token = held.token;
    // A second owner is refused; the holder acquiring again keeps its token.
    // (The problem's extension members are untyped: read from its map.)
    let p = problem(acquire(&b, "res", "rival", 5000, 0).await);
    assert_eq!((p.status, p.extra["holder"].clone()), (409, json!("holder")), "{p:?}");
    let v = acquire(&b, "res", "holder", 5000, 0).await.unwrap();
    assert_eq!(v.token, token, "re-acquire returns the same token");
    // Renew with the token extends; with a stale one is refused.
    let v = a.api().renew("res", token, Some(8000)).await.unwrap();
    assert!(v.expires_at > held.expires_at);
    let p = problem(a.api().renew("res", token - 1, None).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert_eq!(
        (p.extra["reason"].clone(), p.extra["token"].as_u64()),
        (json!("stale_token"), Some(token))
    );
    assert_eq!(problem(release(&a, "res", token - 1).await).status, 409);
    let info = a.api().lock("res").await.unwrap();
    assert_eq!(
        (info.owner.as_deref(), info.token),
        (Some("holder"), Some(token)),
        "unchanged"
    );
    release(&a, "res", token).await.unwrap();
    // Released: the old token is stale now.
    assert_eq!(problem(release(&a, "res", token).await).status, 409);
    assert_eq!(problem(a.api().renew("res", token, None).await).status, 409);
    // Bad input.
    assert_eq!(problem(acquire(&a, "bad:name", "o", 1000, 0).await).status, 400);
    assert_eq!(problem(acquire(&a, "x", "has space", 1000, 0).await).status, 400);
    assert_eq!(problem(acquire(&a, "x", "o", 10, 0).await).status, 400);
    assert_eq!(problem(acquire(&a, "x", "o", 1000, 3_600_000).await).status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_are_served_in_fifo_order() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start(&redis).await);
    let b = Arc::new(TestApp::start(&redis).await);
    let held = acquire(&a, "fifo", "first", 30_000, 0).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::<(String, u64)>::new()));
    let mut tasks = Vec::new();
    let names = ["w1", "w2", "w3", "w4", "w5"];
    for (i, w) in names.iter().enumerate() {
        // Alternate nodes; each waiter is in line before the next one comes.
        let app = if i % 2 == 0 { a.clone() } else { b.clone() };
        let order = order.clone();
        let me = w.to_string();
        tasks.push(tokio::spawn(async move {
            let v = acquire(&app, "fifo", &me, 30_000, 20_000)
                .await
                .unwrap_or_else(|e| panic!("{me}: {e:?}"));
            order.lock().unwrap().push((me, v.token));
            release(&app, "fifo", v.token).await.unwrap();
        }));
        let queued = wait_until(Duration::from_secs(5), || async {
            waiters(&a, "fifo").await.len() == i + 1
        })
        .await;
        assert!(queued, "{w} waits in line");
    }
    assert_eq!(waiters(&b, "fifo").await, names.to_vec());
    // The line lapses on its own if every waiter vanished.
    for k in [kn("fifo", "lock:fifo:q"), kn("fifo", "lock:fifo:qx")] {
        let ttl: i64 = redis.cmd(&["PTTL", &k]).await;
        assert!(ttl > 0, "{k} has no TTL");
    }
    release(&a, "fifo", held.token).await.unwrap();
    let handoffs = Instant::now();
    for t in tasks {
        t.await.unwrap();
    }
    // Each waiter wakes on the release event: five hand-offs take
    // milliseconds (without the wake-up the first waiter alone sleeps until
    // its one-second re-check, 0.7 s or more after the release, and the
    // next ones until theirs: 1.7 s or more in all). 900 ms leaves room for
    // two busy cores (606 ms once in the 12-shard Cluster pass).
    assert!(
        handoffs.elapsed() < Duration::from_millis(900),
        "{:?}",
        handoffs.elapsed()
    );
    let got = order.lock().unwrap().clone();
    let who: Vec<&str> = got.iter().map(|(w, _)| w.as_str()).collect();
    assert_eq!(who, names.to_vec(), "served first come, first served");
    let tokens: Vec<u64> = got.iter().map(|(_, t)| *t).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert!(tokens[0] > held.token);
    // Mutual exclusion in the event log: acquired and released alternate.
    let events = redis.events("muster").await;
    let mut holding = false;
    for (t, _, f) in events.iter().filter(|(_, _, f)| f["lock"] == "fifo") {
        match t.as_str() {
            "lock.acquired" => {
                assert!(!holding, "acquired while held: {f}");
                holding = true;
            }
            "lock.released" | "lock.expired" => holding = false,
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abandoned_waiter_does_not_block_the_line() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start_with(&redis, |c| c.locks.waiter_ttl_ms = 600).await);
    let held = acquire(&a, "line", "holder", 30_000, 0).await.unwrap();
    // A waiter whose node died before it could give up its place: in line,
    // lapsing waiter_ttl after its last poll.
    let (secs, micros): (i64, i64) = redis.cmd(&["TIME"]).await;
    let lapse = (secs * 1000 + micros / 1000 + 600).to_string();
    redis
        .cmd::<i64>(&["ZADD", &kn("line", "lock:line:q"), "1", "ghost"])
        .await;
    redis
        .cmd::<i64>(&["ZADD", &kn("line", "lock:line:qx"), &lapse, "ghost"])
        .await;
    let a2 = a.clone();
    let live = tokio::spawn(async move { acquire(&a2, "line", "live", 30_000, 20_000).await });
    let queued = wait_until(Duration::from_secs(5), || async {
        waiters(&a, "line").await == ["ghost", "live"]
    })
    .await;
    assert!(queued);
    let t = Instant::now();
    release(&a, "line", held.token).await.unwrap();
    let v = live.await.unwrap().unwrap();
    assert_eq!(v.owner, "live", "{v:?}");
    // Within the ghost's lapse plus one re-check.
    assert!(t.elapsed() < Duration::from_millis(2000), "{:?}", t.elapsed());
    // A waiter that gives up (wait_ms ran out) leaves the line at once.
    let p = problem(acquire(&a, "line", "impatient", 1000, 200).await);
    assert_eq!((p.status, p.extra["reason"].clone()), (409, json!("busy")));
    assert!(waiters(&a, "line").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_holders_lock_is_reacquired_after_its_ttl() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let held = acquire(&a, "job", "dies", 700, 0).await.unwrap();
    let t = Instant::now();
    // The holder dies (never renews); a waiter on another node gets the lock
    // when the lease lapses by Redis time.
    let v = acquire(&b, "job", "next", 5000, 10_000).await.unwrap();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(500),
        "not before the lease lapsed: {took:?}"
    );
    assert!(took < Duration::from_millis(1700), "soon after it lapsed: {took:?}");
    assert!(v.token > held.token);
    // The dead holder's token is stale.
    let p = problem(a.api().renew("job", held.token, None).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert_eq!(problem(release(&a, "job", held.token).await).status, 409);
    let expired: Vec<_> = redis
        .events("muster")
        .await
        .into_iter()
        .filter(|(t, _, f)| t == "lock.expired" && f["lock"] == "job")
        .collect();
    assert_eq!(expired.len(), 1, "{expired:?}");
    // With nobody calling, the background loop expires a lapsed lease.
    acquire(&a, "idle", "x", 300, 0).await.unwrap();
    let gone = wait_until(Duration::from_secs(3), || async {
        redis
            .events("muster")
            .await
            .iter()
            .any(|(t, _, f)| t == "lock.expired" && f["lock"] == "idle")
    })
    .await;
    assert!(gone);
    let left: i64 = redis.cmd(&["EXISTS", &kn("idle", "lock:idle")]).await;
    assert_eq!(left, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_tied_to_a_node_ends_when_the_node_dies() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let stop = Arc::new(AtomicBool::new(false));
    a.put("/api/v1/nodes/wn/heartbeat", json!({"ttl_ms": 500})).await;
    let (url, flag) = (a.url.clone(), stop.clone());
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        while !flag.load(Ordering::SeqCst) {
            let _ = http
                .put(format!("{url}/api/v1/nodes/wn/heartbeat"))
                .json(&json!({"ttl_ms": 500}))
                .send()
                .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let tied = |owner: &str, node: &str| Acquire {
        owner: owner.into(),
        ttl_ms: 60_000,
        wait_ms: 0,
        node: Some(node.into()),
    };
    a.api().acquire("tied", &tied("wn-proc", "wn")).await.unwrap();
    let p = problem(a.api().acquire("x", &tied("o", "never-registered")).await);
    assert_eq!(p.status, 409, "{p:?}");
    stop.store(true, Ordering::SeqCst);
    let t = Instant::now();
    acquire(&a, "tied", "successor", 5000, 10_000).await.unwrap();
    // Long before the 60 s lease: the node's ttl (500 ms) and one prune pass
    // (100 ms), then the node.dead event wakes the successor (about 560 ms
    // here; without the wake-up it would wait for its one-second re-check).
    assert!(t.elapsed() < Duration::from_millis(900), "{:?}", t.elapsed());
    let reason = redis
        .events("muster")
        .await
        .into_iter()
        .find(|(t, _, f)| t == "lock.expired" && f["lock"] == "tied")
        .map(|(_, _, f)| f["data"].as_str().unwrap().to_string())
        .unwrap();
    assert!(reason.contains("node_dead"), "{reason}");
}

// --- elections ---------------------------------------------------------------

// --- muster lock run ---------------------------------------------------------

// --- roles and keys ----------------------------------------------------------

mod elections;

mod admin;
