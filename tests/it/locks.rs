//! Locks and elections: fencing tokens strictly increase and stale ones are
//! refused, waiters are served in FIFO order, an abandoned waiter does not
//! block the line, a dead holder's lock is re-acquired after its TTL (or at
//! its node's death), one leader per epoch under contention, `muster lock
//! run`, roles, keys returning to baseline, and each script refusal's HTTP
//! answer.

use std::collections::{BTreeSet, HashSet};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

async fn acquire(app: &TestApp, name: &str, owner: &str, ttl_ms: u64, wait_ms: u64) -> (u16, Value) {
    app.post(
        &format!("/api/v1/locks/{name}/acquire"),
        json!({"owner": owner, "ttl_ms": ttl_ms, "wait_ms": wait_ms}),
    )
    .await
}

async fn release(app: &TestApp, name: &str, token: &Value) -> u16 {
    app.post(&format!("/api/v1/locks/{name}/release"), json!({"token": token}))
        .await
        .0
}

async fn waiters(app: &TestApp, name: &str) -> Vec<String> {
    let (_, v) = app.get(&format!("/api/v1/locks/{name}")).await;
    v["waiters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_and_stale_tokens_are_refused() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let mut last = 0u64;
    for i in 0..20 {
        let app = if i % 2 == 0 { &a } else { &b };
        let name = if i % 3 == 0 { "other" } else { "res" };
        let (s, v) = acquire(app, name, &format!("o{i}"), 5000, 0).await;
        assert_eq!(s, 200, "{v}");
        let token = v["token"].as_u64().unwrap();
        assert!(token > last, "token {token} after {last}");
        last = token;
        assert_eq!(release(app, name, &v["token"]).await, 204);
    }
    let (_, held) = acquire(&a, "res", "holder", 5000, 0).await;
    let token = held["token"].as_u64().unwrap();
    // A second owner is refused; the holder acquiring again keeps its token.
    let (s, v) = acquire(&b, "res", "rival", 5000, 0).await;
    assert_eq!((s, v["holder"].clone()), (409, json!("holder")), "{v}");
    let (s, v) = acquire(&b, "res", "holder", 5000, 0).await;
    assert_eq!(
        (s, v["token"].as_u64()),
        (200, Some(token)),
        "re-acquire returns the same token"
    );
    // Renew with the token extends; with a stale one is refused.
    let (s, v) = a
        .post("/api/v1/locks/res/renew", json!({"token": token, "ttl_ms": 8000}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(v["expires_at"].as_i64().unwrap() > held["expires_at"].as_i64().unwrap());
    let (s, v) = a.post("/api/v1/locks/res/renew", json!({"token": token - 1})).await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(
        (v["reason"].clone(), v["token"].as_u64()),
        (json!("stale_token"), Some(token))
    );
    assert_eq!(release(&a, "res", &json!(token - 1)).await, 409);
    let (_, info) = a.get("/api/v1/locks/res").await;
    assert_eq!(
        (info["owner"].clone(), info["token"].as_u64()),
        (json!("holder"), Some(token)),
        "unchanged"
    );
    assert_eq!(release(&a, "res", &json!(token)).await, 204);
    // Released: the old token is stale now.
    assert_eq!(release(&a, "res", &json!(token)).await, 409);
    let (s, _) = a.post("/api/v1/locks/res/renew", json!({"token": token})).await;
    assert_eq!(s, 409);
    // Bad input.
    assert_eq!(acquire(&a, "bad:name", "o", 1000, 0).await.0, 400);
    assert_eq!(acquire(&a, "x", "has space", 1000, 0).await.0, 400);
    assert_eq!(acquire(&a, "x", "o", 10, 0).await.0, 400);
    assert_eq!(acquire(&a, "x", "o", 1000, 3_600_000).await.0, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_are_served_in_fifo_order() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start(&redis).await);
    let b = Arc::new(TestApp::start(&redis).await);
    let (_, held) = acquire(&a, "fifo", "first", 30_000, 0).await;
    let order = Arc::new(Mutex::new(Vec::<(String, u64)>::new()));
    let mut tasks = Vec::new();
    let names = ["w1", "w2", "w3", "w4", "w5"];
    for (i, w) in names.iter().enumerate() {
        // Alternate nodes; each waiter is in line before the next one comes.
        let app = if i % 2 == 0 { a.clone() } else { b.clone() };
        let order = order.clone();
        let me = w.to_string();
        tasks.push(tokio::spawn(async move {
            let (s, v) = acquire(&app, "fifo", &me, 30_000, 20_000).await;
            assert_eq!(s, 200, "{me}: {v}");
            order.lock().unwrap().push((me, v["token"].as_u64().unwrap()));
            assert_eq!(release(&app, "fifo", &v["token"]).await, 204);
        }));
        let queued = wait_until(Duration::from_secs(5), || async {
            waiters(&a, "fifo").await.len() == i + 1
        })
        .await;
        assert!(queued, "{w} waits in line");
    }
    assert_eq!(waiters(&b, "fifo").await, names.to_vec());
    // The line lapses on its own if every waiter vanished.
    for k in ["{muster}:lock:fifo:q", "{muster}:lock:fifo:qx"] {
        let ttl: i64 = redis.cmd(&["PTTL", k]).await;
        assert!(ttl > 0, "{k} has no TTL");
    }
    assert_eq!(release(&a, "fifo", &held["token"]).await, 204);
    let handoffs = Instant::now();
    for t in tasks {
        t.await.unwrap();
    }
    // Each waiter wakes on the release event: five hand-offs take
    // milliseconds (without the wake-up the first waiter alone would sleep
    // until its one-second re-check).
    assert!(
        handoffs.elapsed() < Duration::from_millis(500),
        "{:?}",
        handoffs.elapsed()
    );
    let got = order.lock().unwrap().clone();
    let who: Vec<&str> = got.iter().map(|(w, _)| w.as_str()).collect();
    assert_eq!(who, names.to_vec(), "served first come, first served");
    let tokens: Vec<u64> = got.iter().map(|(_, t)| *t).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert!(tokens[0] > held["token"].as_u64().unwrap());
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
    let (_, held) = acquire(&a, "line", "holder", 30_000, 0).await;
    // A waiter whose node died before it could give up its place: in line,
    // lapsing waiter_ttl after its last poll.
    let (secs, micros): (i64, i64) = redis.cmd(&["TIME"]).await;
    let lapse = (secs * 1000 + micros / 1000 + 600).to_string();
    redis.cmd::<i64>(&["ZADD", "{muster}:lock:line:q", "1", "ghost"]).await;
    redis
        .cmd::<i64>(&["ZADD", "{muster}:lock:line:qx", &lapse, "ghost"])
        .await;
    let a2 = a.clone();
    let live = tokio::spawn(async move { acquire(&a2, "line", "live", 30_000, 20_000).await });
    let queued = wait_until(Duration::from_secs(5), || async {
        waiters(&a, "line").await == ["ghost", "live"]
    })
    .await;
    assert!(queued);
    let t = Instant::now();
    assert_eq!(release(&a, "line", &held["token"]).await, 204);
    let (s, v) = live.await.unwrap();
    assert_eq!((s, v["owner"].clone()), (200, json!("live")), "{v}");
    // Within the ghost's lapse plus one re-check.
    assert!(t.elapsed() < Duration::from_millis(2000), "{:?}", t.elapsed());
    // A waiter that gives up (wait_ms ran out) leaves the line at once.
    let (s, v) = acquire(&a, "line", "impatient", 1000, 200).await;
    assert_eq!((s, v["reason"].clone()), (409, json!("busy")));
    assert!(waiters(&a, "line").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_holders_lock_is_reacquired_after_its_ttl() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let (_, held) = acquire(&a, "job", "dies", 700, 0).await;
    let t = Instant::now();
    // The holder dies (never renews); a waiter on another node gets the lock
    // when the lease lapses by Redis time.
    let (s, v) = acquire(&b, "job", "next", 5000, 10_000).await;
    assert_eq!(s, 200, "{v}");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(500),
        "not before the lease lapsed: {took:?}"
    );
    assert!(took < Duration::from_millis(1700), "soon after it lapsed: {took:?}");
    assert!(v["token"].as_u64() > held["token"].as_u64());
    // The dead holder's token is stale.
    let (s, body) = a.post("/api/v1/locks/job/renew", json!({"token": held["token"]})).await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(release(&a, "job", &held["token"]).await, 409);
    let expired: Vec<_> = redis
        .events("muster")
        .await
        .into_iter()
        .filter(|(t, _, f)| t == "lock.expired" && f["lock"] == "job")
        .collect();
    assert_eq!(expired.len(), 1, "{expired:?}");
    // With nobody calling, the background loop expires a lapsed lease.
    acquire(&a, "idle", "x", 300, 0).await;
    let gone = wait_until(Duration::from_secs(3), || async {
        redis
            .events("muster")
            .await
            .iter()
            .any(|(t, _, f)| t == "lock.expired" && f["lock"] == "idle")
    })
    .await;
    assert!(gone);
    let left: i64 = redis.cmd(&["EXISTS", "{muster}:lock:idle"]).await;
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
    let (s, v) = a
        .post(
            "/api/v1/locks/tied/acquire",
            json!({"owner": "wn-proc", "ttl_ms": 60_000, "node": "wn"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        a.post(
            "/api/v1/locks/x/acquire",
            json!({"owner": "o", "node": "never-registered"})
        )
        .await
        .0,
        409
    );
    stop.store(true, Ordering::SeqCst);
    let t = Instant::now();
    let (s, v) = acquire(&a, "tied", "successor", 5000, 10_000).await;
    assert_eq!(s, 200, "{v}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_leader_per_epoch_under_contention() {
    let redis = TestRedis::start();
    let apps = Arc::new(vec![
        TestApp::start(&redis).await,
        TestApp::start(&redis).await,
        TestApp::start(&redis).await,
    ]);
    let won = Arc::new(Mutex::new(Vec::<(u64, String)>::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..9 {
        let (apps, won) = (apps.clone(), won.clone());
        tasks.push(tokio::spawn(async move {
            let app = &apps[c % 3];
            let me = format!("cand{c}");
            let mut terms = 0;
            while terms < 3 {
                let (s, v) = app
                    .post(
                        "/api/v1/elections/leader/campaign",
                        json!({"candidate": me, "ttl_ms": 5000, "wait_ms": 10_000, "value": {"c": c}}),
                    )
                    .await;
                assert_eq!(s, 200, "{v}");
                if v["elected"] != true {
                    continue;
                }
                let epoch = v["epoch"].as_u64().unwrap();
                won.lock().unwrap().push((epoch, me.clone()));
                let (_, l) = app.get("/api/v1/elections/leader").await;
                assert_eq!(
                    (l["leader"].as_str(), l["epoch"].as_u64()),
                    (Some(me.as_str()), Some(epoch))
                );
                assert_eq!(l["value"]["c"], c);
                let (s, _) = app
                    .post(
                        "/api/v1/elections/leader/resign",
                        json!({"candidate": me, "epoch": epoch}),
                    )
                    .await;
                assert_eq!(s, 204);
                terms += 1;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Candidates wake on each resignation: 27 hand-offs in well under the
    // one-second re-check each.
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
    let won = won.lock().unwrap().clone();
    assert_eq!(won.len(), 27);
    let epochs: BTreeSet<u64> = won.iter().map(|(e, _)| *e).collect();
    assert_eq!(epochs.len(), won.len(), "every leadership has its own epoch");
    // In the event log: epochs strictly increase, and a new leader is elected
    // only after the previous one resigned or lapsed.
    let mut current: Option<u64> = None;
    let mut last = 0u64;
    for (t, _, f) in redis.events("muster").await {
        if f["election"] != "leader" {
            continue;
        }
        let data: Value = serde_json::from_str(f["data"].as_str().unwrap()).unwrap();
        let epoch = data["epoch"].as_u64().unwrap();
        match t.as_str() {
            "election.elected" => {
                assert!(current.is_none(), "elected {epoch} while {current:?} leads");
                assert!(epoch > last, "epoch {epoch} after {last}");
                current = Some(epoch);
                last = epoch;
            }
            "election.resigned" | "election.expired" => {
                assert_eq!(current, Some(epoch));
                current = None;
            }
            _ => {}
        }
    }
    let (_, l) = apps[0].get("/api/v1/elections/leader").await;
    assert_eq!(l["leader"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_leader_is_replaced_with_a_greater_epoch() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let (_, first) = a
        .post(
            "/api/v1/elections/e/campaign",
            json!({"candidate": "c1", "ttl_ms": 400}),
        )
        .await;
    assert_eq!(first["elected"], true);
    // The leader renews by campaigning again: same epoch.
    let (_, again) = a
        .post(
            "/api/v1/elections/e/campaign",
            json!({"candidate": "c1", "ttl_ms": 400}),
        )
        .await;
    assert_eq!(
        (again["elected"].clone(), again["epoch"].clone()),
        (json!(true), first["epoch"].clone())
    );
    let (_, other) = b.post("/api/v1/elections/e/campaign", json!({"candidate": "c2"})).await;
    assert_eq!(
        (other["elected"].clone(), other["leader"].clone()),
        (json!(false), json!("c1"))
    );
    // c1 stops renewing: c2, waiting, is elected when the lease lapses.
    let (_, second) = b
        .post(
            "/api/v1/elections/e/campaign",
            json!({"candidate": "c2", "ttl_ms": 5000, "wait_ms": 5000}),
        )
        .await;
    assert_eq!(second["elected"], true, "{second}");
    assert!(second["epoch"].as_u64() > first["epoch"].as_u64());
    let (_, l) = a.get("/api/v1/elections/e").await;
    assert_eq!(
        (l["leader"].clone(), l["epoch"].clone()),
        (json!("c2"), second["epoch"].clone())
    );
    // The old leader cannot resign the new leadership, nor renew into it.
    let (s, v) = a
        .post(
            "/api/v1/elections/e/resign",
            json!({"candidate": "c1", "epoch": first["epoch"]}),
        )
        .await;
    assert_eq!((s, v["leader"].clone()), (409, json!("c2")));
    let (_, v) = a.post("/api/v1/elections/e/campaign", json!({"candidate": "c1"})).await;
    assert_eq!(v["elected"], false);
    let (_, list) = a.get("/api/v1/elections").await;
    assert_eq!(list["elections"][0]["leader"], "c2");
}

// --- muster lock run ---------------------------------------------------------

fn lock_run(app: &TestApp, args: &[&str], cmd: &[&str]) -> Command {
    let mut c = Command::new(muster_bin());
    c.args(["lock", "run"])
        .args(args)
        .args(["--url", &app.url, "--"])
        .args(cmd)
        .env_remove("MUSTER_TOKEN")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_run_holds_renews_and_stops_the_command_when_lost() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    // 1. The command runs with the token; its exit code passes through; the
    //    lock is released afterwards. It outlives several lease lengths.
    let out_file = dir.path().join("token");
    let script = format!("sleep 1; echo $MUSTER_LOCK_TOKEN > {}; exit 7", out_file.display());
    let out = lock_run(&a, &["cronjob", "--ttl", "400ms"], &["sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    let token: u64 = std::fs::read_to_string(&out_file).unwrap().trim().parse().unwrap();
    assert!(token > 0);
    let (_, info) = a.get("/api/v1/locks/cronjob").await;
    assert_eq!(info["held"], false, "released when the command exits");
    let events = redis.events("muster").await;
    assert!(
        !events.iter().any(|(t, _, _)| t == "lock.expired"),
        "renewed, never lapsed"
    );
    // 2. Someone holds it: --wait runs out (exit 5), the command never runs.
    let (_, held) = acquire(&a, "cronjob", "other", 30_000, 0).await;
    let marker = dir.path().join("ran");
    let out = lock_run(
        &a,
        &["cronjob", "--wait", "300ms"],
        &["touch", marker.to_str().unwrap()],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(5));
    assert!(!marker.exists());
    assert_eq!(release(&a, "cronjob", &held["token"]).await, 204);
    // 3. The lock is lost (an admin breaks it): the command is stopped.
    let pid_file = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
    let mut child = lock_run(&a, &["cronjob", "--ttl", "600ms"], &["sh", "-c", &script])
        .spawn()
        .unwrap();
    let started = wait_until(Duration::from_secs(5), || async { pid_file.exists() }).await;
    assert!(started);
    let pid: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert!(process_alive(pid));
    assert_eq!(a.delete("/api/v1/locks/cronjob").await.0, 204);
    let t = Instant::now();
    // Polled like wait_until (the child cannot be borrowed by its closure).
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "muster lock run stops when the lock is lost"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(status.code(), Some(6));
    let gone = wait_until(Duration::from_secs(2), || async { !process_alive(pid) }).await;
    assert!(gone, "the command was stopped");
}

// --- roles and keys ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_guard_barriers_and_locks() {
    use muster::config::{Role, TokenConfig};
    let redis = TestRedis::start();
    let tokens = [("r", Role::Read), ("w", Role::Worker), ("a", Role::Admin)]
        .into_iter()
        .map(|(name, role)| TokenConfig {
            name: name.into(),
            role,
            sha256: sha256_hex(&format!("tok-{name}")),
        })
        .collect();
    let app = TestApp::start_with(&redis, |c| c.auth.tokens = tokens).await;
    let call = |tok: &'static str, m: reqwest::Method, path: &'static str, body: Value| {
        let req = app.request(m, path).bearer_auth(tok).json(&body);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    let barrier = json!({"participants": ["x"], "timeout_ms": 1000});
    assert_eq!(
        call("tok-w", reqwest::Method::PUT, "/api/v1/barriers/b", barrier.clone()).await,
        403
    );
    assert_eq!(
        call("tok-a", reqwest::Method::PUT, "/api/v1/barriers/b", barrier).await,
        201
    );
    let arrive = json!({"node": "x"});
    assert_eq!(
        call(
            "tok-r",
            reqwest::Method::POST,
            "/api/v1/barriers/b/rounds/1/arrive",
            arrive.clone()
        )
        .await,
        403
    );
    assert_eq!(
        call(
            "tok-w",
            reqwest::Method::POST,
            "/api/v1/barriers/b/rounds/1/arrive",
            arrive
        )
        .await,
        200
    );
    assert_eq!(
        call("tok-r", reqwest::Method::GET, "/api/v1/barriers/b/rounds", Value::Null).await,
        200
    );
    let acq = json!({"owner": "o"});
    assert_eq!(
        call("tok-r", reqwest::Method::POST, "/api/v1/locks/l/acquire", acq.clone()).await,
        403
    );
    assert_eq!(
        call("tok-w", reqwest::Method::POST, "/api/v1/locks/l/acquire", acq).await,
        200
    );
    assert_eq!(
        call("tok-w", reqwest::Method::DELETE, "/api/v1/locks/l", Value::Null).await,
        403
    );
    assert_eq!(
        call("tok-a", reqwest::Method::DELETE, "/api/v1/locks/l", Value::Null).await,
        204
    );
    let camp = json!({"candidate": "c"});
    assert_eq!(
        call(
            "tok-r",
            reqwest::Method::POST,
            "/api/v1/elections/e/campaign",
            camp.clone()
        )
        .await,
        403
    );
    assert_eq!(
        call("tok-w", reqwest::Method::POST, "/api/v1/elections/e/campaign", camp).await,
        200
    );
    assert_eq!(
        call("tok-r", reqwest::Method::GET, "/api/v1/elections/e", Value::Null).await,
        200
    );
    // The OpenAPI document lists the new routes.
    let (_, doc) = app.get("/api/v1/openapi.json").await;
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/api/v1/barriers",
        "/api/v1/barriers/{name}",
        "/api/v1/barriers/{name}/rounds",
        "/api/v1/barriers/{name}/rounds/{round}",
        "/api/v1/barriers/{name}/rounds/{round}/arrive",
        "/api/v1/barriers/{name}/hold",
        "/api/v1/barriers/{name}/release",
        "/api/v1/barriers/{name}/wait",
        "/api/v1/double-barriers",
        "/api/v1/double-barriers/{name}",
        "/api/v1/double-barriers/{name}/enter",
        "/api/v1/double-barriers/{name}/leave",
        "/api/v1/locks",
        "/api/v1/locks/{name}",
        "/api/v1/locks/{name}/acquire",
        "/api/v1/locks/{name}/renew",
        "/api/v1/locks/{name}/release",
        "/api/v1/elections",
        "/api/v1/elections/{name}",
        "/api/v1/elections/{name}/campaign",
        "/api/v1/elections/{name}/resign",
    ] {
        assert!(paths.contains_key(p), "{p} missing from the OpenAPI document");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_and_election_keys_return_to_baseline() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start_with(&redis, |c| c.locks.waiter_ttl_ms = 300).await);
    let baseline: HashSet<String> = redis.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect();
    // Locks: released, lapsed, waited for; elections: resigned and lapsed.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("l{}", i % 4);
            let (s, v) = acquire(&a, &name, &format!("o{i}"), 300, 5000).await;
            assert_eq!(s, 200, "{v}");
            if i % 3 != 0 {
                release(&a, &name, &v["token"]).await;
            }
            let e = format!("e{}", i % 2);
            let (_, v) = a
                .post(
                    &format!("/api/v1/elections/{e}/campaign"),
                    json!({"candidate": format!("c{i}"), "ttl_ms": 300, "wait_ms": 5000}),
                )
                .await;
            if i % 2 == 0 {
                a.post(
                    &format!("/api/v1/elections/{e}/resign"),
                    json!({"candidate": format!("c{i}"), "epoch": v["epoch"]}),
                )
                .await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Counters are single keys; everything else lapses.
    let counters = ["{muster}:locks:fence", "{muster}:elections:epoch"];
    for k in redis.cmd::<Vec<String>>(&["KEYS", "*"]).await {
        if baseline.contains(&k) || counters.contains(&k.as_str()) || k == "{muster}:events" {
            continue;
        }
        let ttl: i64 = redis.cmd(&["PTTL", &k]).await;
        let index = k == "{muster}:locks" || k == "{muster}:elections";
        // -2: it expired between the listing and this check.
        assert!(ttl != -1 || index, "{k} has no TTL");
    }
    let back = wait_until(Duration::from_secs(10), || async {
        let now: HashSet<String> = redis.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect();
        now.difference(&baseline)
            .all(|k| counters.contains(&k.as_str()) || k.starts_with("{muster}:nodes:"))
    })
    .await;
    let now: HashSet<String> = redis.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect();
    assert!(back, "left over: {:?}", now.difference(&baseline).collect::<Vec<_>>());
}

/// More lapsed waiters than Lua's `unpack` takes at once (about 8000; a
/// crashed node leaves all its waiters to lapse together): the next acquire
/// still removes them all and is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_after_thousands_of_lapsed_waiters_succeeds() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let n = 9000;
    // The queue layout of locks/lua/lib.lua: P:lock:<l>:q owner -> order,
    // P:lock:<l>:qx owner -> when its place lapses (here long past).
    let mut q = vec!["ZADD".to_string(), "{muster}:lock:crowd:q".into()];
    let mut qx = vec!["ZADD".to_string(), "{muster}:lock:crowd:qx".into()];
    for i in 0..n {
        q.extend([i.to_string(), format!("ghost{i}")]);
        qx.extend(["1".to_string(), format!("ghost{i}")]);
    }
    for args in [&q, &qx] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(redis.cmd::<i64>(&args).await, n);
    }
    let (s, v) = acquire(&a, "crowd", "fresh", 5000, 0).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["owner"], "fresh");
    for k in ["{muster}:lock:crowd:q", "{muster}:lock:crowd:qx"] {
        assert_eq!(redis.cmd::<i64>(&["ZCARD", k]).await, 0, "{k}");
    }
}

/// Every refusal a lock or election script returns, by its code, maps to its
/// HTTP status and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_outcomes_map_to_http() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    // E.NOT_FOUND: breaking a lock nobody holds.
    assert_eq!(a.delete("/api/v1/locks/free").await.0, 404);
    // E.STALE: releasing a free lock under a token.
    assert_eq!(release(&a, "free", &json!(7)).await, 409);
    // E.LAPSED: the lease lapsed by Redis time before the expiry loop saw it
    // (its index entry still says later).
    let (_, held) = acquire(&a, "l", "o", 60_000, 0).await;
    let _: i64 = redis.cmd(&["HSET", "{muster}:lock:l", "expires_at", "1"]).await;
    let (s, v) = a
        .post("/api/v1/locks/l/renew", json!({"token": held["token"], "ttl_ms": 5000}))
        .await;
    assert_eq!((s, v["reason"].clone()), (409, json!("lapsed")), "{v}");
    assert_eq!(a.get("/api/v1/locks/l").await.1["held"], json!(false));
    // E.NODE_NOT_ALIVE: a lease tied to a node that is not registered.
    let (s, _) = a
        .post("/api/v1/locks/n/acquire", json!({"owner": "o", "node": "nowhere"}))
        .await;
    assert_eq!(s, 409);
    // E.STALE: a candidate that does not lead resigns.
    let (s, v) = a
        .post(
            "/api/v1/elections/e/campaign",
            json!({"candidate": "c1", "ttl_ms": 60_000}),
        )
        .await;
    assert_eq!((s, v["elected"].clone()), (200, json!(true)), "{v}");
    let epoch = v["epoch"].clone();
    let (s, v) = a.post("/api/v1/elections/e/resign", json!({"candidate": "c2"})).await;
    assert_eq!(
        (s, v["leader"].clone(), v["epoch"].clone()),
        (409, json!("c1"), epoch),
        "{v}"
    );
}
