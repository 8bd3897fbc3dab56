//! The task store against real Redis and several nodes: G1 (single winner,
//! fencing), G5 (idempotency), G6 (group limits, FIFO, no head-of-line
//! blocking), G4 (no leaks), and every outcome of every task script.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::common::*;

/// Registers a worker id with a long ttl.
pub async fn join(app: &TestApp, worker: &str) {
    let (s, b) = app
        .put(&format!("/api/v1/nodes/{worker}/heartbeat"), json!({"ttl_ms": 120_000}))
        .await;
    assert_eq!(s, 200, "{b}");
}

pub async fn submit(app: &TestApp, queue: &str, body: Value) -> String {
    let (s, b) = app.post(&format!("/api/v1/queues/{queue}/tasks"), body).await;
    assert!(s == 201 || s == 200, "{s} {b}");
    b["id"].as_str().unwrap().to_string()
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
        for r in b["results"].as_array().unwrap() {
            assert_eq!(r["status"], "created", "{r}");
            ids.push(r["id"].as_str().unwrap().to_string());
        }
        left -= k;
    }
    ids
}

pub async fn claim(app: &TestApp, queue: &str, node: &str, max: u32, wait_ms: u64) -> Vec<Value> {
    let (s, b) = app
        .post(
            &format!("/api/v1/queues/{queue}/claim"),
            json!({"node": node, "max": max, "wait_ms": wait_ms}),
        )
        .await;
    match s {
        200 => b["tasks"].as_array().unwrap().clone(),
        204 => Vec::new(),
        _ => panic!("claim: {s} {b}"),
    }
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

fn token(t: &Value) -> u64 {
    t["token"].as_u64().unwrap()
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
                let got = claim(app, "g1", &me, 25, 0).await;
                if got.is_empty() {
                    break;
                }
                let items: Vec<Value> = got
                    .iter()
                    .map(|t| json!({"id": t["id"], "token": t["token"], "result": w}))
                    .collect();
                let (s, b) = app.post("/api/v1/tasks/complete", Value::Array(items)).await;
                assert_eq!(s, 200, "{b}");
                for r in b["results"].as_array().unwrap() {
                    assert_eq!(r["status"], "completed", "{r}");
                }
                let mut c = claims.lock().await;
                for t in &got {
                    c.push((
                        t["id"].as_str().unwrap().into(),
                        token(t),
                        t["attempt"].as_u64().unwrap() as u32,
                    ));
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
    let (_, q) = nodes[1].get("/api/v1/queues").await;
    assert_eq!(q["queues"][0]["succeeded"], total as u64, "{q}");
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
    let (s, r) = a
        .post(&format!("/api/v1/tasks/{id}/complete"), json!({"token": 1}))
        .await;
    assert_eq!(s, 409, "{r}");
    assert_eq!(r["state"], "queued", "{r}");
    let (s, r) = a.post("/api/v1/tasks/complete", json!([{"id": id, "token": 1}])).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["results"][0]["status"], "conflict", "{r}");
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
    let first = claim(a, "st", "wa", 1, 0).await;
    let t1 = token(&first[0]);
    // The first holder fails; the task is retried immediately and claimed again.
    let (s, f) = a
        .post(
            &format!("/api/v1/tasks/{id}/fail"),
            json!({"token": t1, "error": "boom"}),
        )
        .await;
    assert_eq!(s, 200, "{f}");
    assert_eq!(f["state"], "delayed");
    let second = claim(b, "st", "wb", 1, 2000).await;
    assert_eq!(second.len(), 1);
    let t2 = token(&second[0]);
    assert!(t2 > t1, "a later claim has a greater token");
    assert_eq!(second[0]["attempt"], 2);
    // Every call with the old token is refused with the current state.
    for (path, body) in [
        ("complete", json!({"token": t1, "result": "late"})),
        ("fail", json!({"token": t1, "error": "late"})),
        ("heartbeat", json!({"token": t1, "progress": 50})),
    ] {
        let (s, r) = b.post(&format!("/api/v1/tasks/{id}/{path}"), body).await;
        assert_eq!(s, 409, "{path}: {r}");
        assert_eq!(r["state"], "running", "{r}");
        assert!(r["detail"].as_str().unwrap().contains("stale"));
    }
    let (_, task) = a.get(&format!("/api/v1/tasks/{id}")).await;
    assert_eq!(task["state"], "running");
    assert_eq!(task["token"], t2);
    assert_eq!(task["progress"], 0, "the stale heartbeat changed nothing");
    assert!(task.get("result").is_none());
    // The current holder completes; afterwards even it is refused.
    let (s, _) = a
        .post(
            &format!("/api/v1/tasks/{id}/complete"),
            json!({"token": t2, "result": {"ok": 1}}),
        )
        .await;
    assert_eq!(s, 200);
    let (s, r) = a
        .post(&format!("/api/v1/tasks/{id}/complete"), json!({"token": t2}))
        .await;
    assert_eq!(s, 409);
    assert_eq!(r["state"], "succeeded");
    let (_, task) = a.get(&format!("/api/v1/tasks/{id}")).await;
    let log = task["attempt_log"].as_array().unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0]["outcome"], "failed");
    assert_eq!(log[0]["node"], "wa");
    assert_eq!(log[1]["outcome"], "succeeded");
    assert_eq!(log[1]["token"], t2);
    assert_eq!(task["result"], json!({"ok": 1}));
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
            match s {
                201 => created += 1,
                200 => assert_eq!(b["replayed"], true),
                _ => panic!("{s} {b}"),
            }
            ids.insert(b["id"].as_str().unwrap().to_string());
        }
        assert_eq!(created, 1, "exactly one 201");
        assert_eq!(ids.len(), 1, "everyone got the same task");
    }
    let (_, q) = nodes[0].get("/api/v1/queues").await;
    assert_eq!(q["queues"][0]["queued"], 5, "five keys, five tasks: {q}");
    // A replay through another queue names the original task's queue.
    let (s, b) = nodes[1]
        .post("/api/v1/queues/elsewhere/tasks", json!({"idempotency_key": "order-0"}))
        .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["queue"], "idem", "{b}");
    assert_eq!(b["state"], "queued", "{b}");
    // Header and body must agree.
    let req = nodes[0]
        .request(reqwest::Method::POST, "/api/v1/queues/idem/tasks")
        .header("Idempotency-Key", "a")
        .json(&json!({"idempotency_key": "b"}));
    assert_eq!(send(req).await.0, 400);
}

/// Running tasks per group, read atomically (one script), from the tasks'
/// own state: the ground truth the limit must hold for.
async fn running_per_group(redis: &TestRedis, queues: &[&str]) -> HashMap<String, i64> {
    let script = redis::Script::new(
        r"local out = {}
          for i = 1, #KEYS do
            local ids = redis.call('ZRANGE', KEYS[i], 0, -1)
            for _, id in ipairs(ids) do
              local g = redis.call('HGET', '{muster}:task:' .. id, 'group')
              if g and g ~= '' then out[#out + 1] = g end
            end
          end
          return out",
    );
    let mut inv = script.prepare_invoke();
    for q in queues {
        inv.key(format!("{{muster}}:q:{q}:running"));
    }
    let mut conn = redis.conn().await;
    let groups: Vec<String> = inv.invoke_async(&mut conn).await.unwrap();
    let mut m = HashMap::new();
    for g in groups {
        *m.entry(g).or_insert(0) += 1;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_group_limits_hold_fifo_within_groups() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let limits = [("ga", 1u32), ("gb", 2), ("gc", 3)];
    for (g, l) in limits {
        let (s, r) = a.put(&format!("/api/v1/groups/{g}"), json!({"limit": l})).await;
        assert_eq!(s, 200, "{r}");
    }
    // 2 queues, 4 groups (gd unlimited) plus ungrouped tasks, random order.
    let queues = ["ga6", "gb6"];
    let mut order: HashMap<String, Vec<String>> = HashMap::new();
    let mut rng = 12345u64;
    let mut next = || {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) as usize
    };
    for _ in 0..400 {
        let q = queues[next() % 2];
        let g = ["ga", "gb", "gc", "gd", ""][next() % 5];
        let body = if g.is_empty() {
            json!({"payload": 0})
        } else {
            json!({"payload": 0, "group": g})
        };
        let id = submit(&a, q, body).await;
        if !g.is_empty() {
            order.entry(format!("{q}/{g}")).or_default().push(id);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let sampler = {
        let stop = stop.clone();
        let violations = violations.clone();
        let redis_port = redis.port;
        tokio::spawn(async move {
            let client = redis::Client::open(format!("redis://127.0.0.1:{redis_port}")).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                let script = redis::Script::new(
                    r"local out = {}
                      for i = 1, #KEYS do
                        for _, id in ipairs(redis.call('ZRANGE', KEYS[i], 0, -1)) do
                          local g = redis.call('HGET', '{muster}:task:' .. id, 'group')
                          if g and g ~= '' then out[#out + 1] = g end
                        end
                      end
                      return out",
                );
                let groups: Vec<String> = script
                    .key("{muster}:q:ga6:running")
                    .key("{muster}:q:gb6:running")
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                let mut m: HashMap<&str, u32> = HashMap::new();
                for g in &groups {
                    *m.entry(g.as_str()).or_insert(0) += 1;
                }
                for (g, l) in [("ga", 1u32), ("gb", 2), ("gc", 3)] {
                    let n = m.get(g).copied().unwrap_or(0);
                    if n > l {
                        violations.lock().await.push(format!("{g}: {n} running, limit {l}"));
                    }
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            samples
        })
    };
    // 8 workers on two nodes hold each task for a random few ms.
    let claimed: Arc<Mutex<Vec<(String, String, u64)>>> = Arc::default();
    let apps = Arc::new(vec![a, b]);
    let mut workers = Vec::new();
    for w in 0..8 {
        let apps = apps.clone();
        let claimed = claimed.clone();
        workers.push(tokio::spawn(async move {
            let app = &apps[w % 2];
            let me = format!("g6w{w}");
            join(app, &me).await;
            let mut idle = 0;
            let mut seed = w as u64 + 7;
            while idle < 3 {
                let q = ["ga6", "gb6"][(seed % 2) as usize];
                seed = seed.wrapping_mul(31).wrapping_add(17);
                let got = claim(app, q, &me, 2, 0).await;
                if got.is_empty() {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                idle = 0;
                for t in &got {
                    let g = t["group"].as_str().unwrap_or("").to_string();
                    claimed
                        .lock()
                        .await
                        .push((format!("{q}/{g}"), t["id"].as_str().unwrap().into(), token(t)));
                }
                tokio::time::sleep(Duration::from_millis(1 + seed % 6)).await;
                for t in &got {
                    let (s, _) = app
                        .post(
                            &format!("/api/v1/tasks/{}/complete", t["id"].as_str().unwrap()),
                            json!({"token": t["token"]}),
                        )
                        .await;
                    assert_eq!(s, 200);
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    assert!(samples > 50, "the sampler ran ({samples} samples)");
    let v = violations.lock().await;
    assert!(v.is_empty(), "limits exceeded: {:?}", &v[..v.len().min(10)]);
    // Everything ran.
    let (_, qs) = apps[0].get("/api/v1/queues").await;
    let done: u64 = qs["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["succeeded"].as_u64().unwrap())
        .sum();
    assert_eq!(done, 400, "{qs}");
    // FIFO within each (queue, group): claim order (token order) is enqueue order.
    let claimed = claimed.lock().await;
    let mut by_group: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    for (k, id, tok) in claimed.iter() {
        if !k.ends_with('/') {
            by_group.entry(k.clone()).or_default().push((*tok, id.clone()));
        }
    }
    for (k, mut v) in by_group {
        v.sort();
        let got: Vec<String> = v.into_iter().map(|(_, id)| id).collect();
        assert_eq!(&got, order.get(&k).unwrap(), "FIFO in {k}");
    }
    assert!(running_per_group(&redis, &queues).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_a_full_group_does_not_block_others() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    a.put("/api/v1/groups/slow", json!({"limit": 1})).await;
    let s1 = submit(&a, "hol", json!({"group": "slow", "priority": 10})).await;
    let _s2 = submit(&a, "hol", json!({"group": "slow", "priority": 10})).await;
    let _s3 = submit(&a, "hol", json!({"group": "slow", "priority": 10})).await;
    let other = submit(&a, "hol", json!({"group": "fast"})).await;
    let plain = submit(&a, "hol", json!({})).await;
    let got = claim(&a, "hol", "w", 10, 0).await;
    let ids: Vec<&str> = got.iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        vec![s1.as_str(), other.as_str(), plain.as_str()],
        "slow's head, then the others"
    );
    // The group page shows the slot in use and the queued ones.
    let (_, q) = a.get("/api/v1/queues/hol").await;
    let slow = q["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "slow")
        .unwrap()
        .clone();
    assert_eq!(slow["running"], 1);
    assert_eq!(slow["queued"], 2);
    assert_eq!(slow["limit"], 1);
    // Raising the limit lets the next one start at once.
    a.put("/api/v1/groups/slow", json!({"limit": 2})).await;
    assert_eq!(claim(&a, "hol", "w", 10, 0).await.len(), 1);
    // Completing one frees a slot.
    let t = &got[0];
    a.post(&format!("/api/v1/tasks/{s1}/complete"), json!({"token": t["token"]}))
        .await;
    assert_eq!(claim(&a, "hol", "w", 10, 0).await.len(), 1);
    // Removing the limit: nothing left anyway.
    let (s, _) = a.put("/api/v1/groups/slow", json!({"limit": null})).await;
    assert_eq!(s, 200);
    let (s, _) = a.put("/api/v1/groups/slow", json!({"limit": 0})).await;
    assert_eq!(s, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_then_fifo() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let low = submit(&a, "prio", json!({"priority": -5})).await;
    let n1 = submit(&a, "prio", json!({})).await;
    let high = submit(&a, "prio", json!({"priority": 7})).await;
    let n2 = submit(&a, "prio", json!({})).await;
    let got = claim(&a, "prio", "w", 10, 0).await;
    let ids: Vec<&str> = got.iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![high.as_str(), n1.as_str(), n2.as_str(), low.as_str()]);
    let toks: Vec<u64> = got.iter().map(token).collect();
    assert!(toks.windows(2).all(|w| w[0] < w[1]), "tokens increase within a claim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_backoff_dead_letters_retry_and_discard() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let id = submit(
        &a,
        "rt",
        json!({"max_attempts": 2, "backoff_base_ms": 300, "backoff_cap_ms": 300}),
    )
    .await;
    let t = claim(&a, "rt", "w", 1, 0).await;
    let (s, f) = a
        .post(
            &format!("/api/v1/tasks/{id}/fail"),
            json!({"token": t[0]["token"], "error": "e1"}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(f["state"], "delayed");
    let (_, task) = a.get(&format!("/api/v1/tasks/{id}")).await;
    let failed_at = task["attempt_log"][0]["ended_at"].as_i64().unwrap();
    let delay = f["retry_at"].as_i64().unwrap() - failed_at;
    assert!(
        (150..=300).contains(&delay),
        "backoff with jitter in [base/2, base]: {delay}"
    );
    assert!(claim(&a, "rt", "w", 1, 0).await.is_empty(), "not before the backoff");
    let started = Instant::now();
    let t2 = claim(&a, "rt", "w", 1, 2000).await;
    assert_eq!(t2.len(), 1, "the long poll returns when the retry is due");
    assert!(started.elapsed() < Duration::from_millis(1000));
    assert_eq!(t2[0]["attempt"], 2);
    let (_, f) = a
        .post(
            &format!("/api/v1/tasks/{id}/fail"),
            json!({"token": t2[0]["token"], "error": "e2"}),
        )
        .await;
    assert_eq!(f["state"], "dead", "no attempts left");
    let (_, dead) = a.get("/api/v1/dead").await;
    assert_eq!(dead["tasks"][0]["id"], id.as_str());
    assert_eq!(dead["tasks"][0]["error"], "e2");
    // retry: queued again with fresh attempts
    assert_eq!(a.post(&format!("/api/v1/tasks/{id}/retry"), Value::Null).await.0, 204);
    let (_, task) = a.get(&format!("/api/v1/tasks/{id}")).await;
    assert_eq!(task["state"], "queued");
    assert_eq!(task["attempts"], 0);
    assert_eq!(a.get("/api/v1/dead").await.1["total"], 0);
    assert_eq!(
        a.post(&format!("/api/v1/tasks/{id}/retry"), Value::Null).await.0,
        409,
        "only dead tasks"
    );
    // non-retryable failure: dead at once
    let t3 = claim(&a, "rt", "w", 1, 0).await;
    let (_, f) = a
        .post(
            &format!("/api/v1/tasks/{id}/fail"),
            json!({"token": t3[0]["token"], "error": "fatal", "retry": false}),
        )
        .await;
    assert_eq!(f["state"], "dead");
    // discard
    assert_eq!(a.delete(&format!("/api/v1/tasks/{id}")).await.0, 204);
    assert_eq!(a.get(&format!("/api/v1/tasks/{id}")).await.0, 404);
    assert_eq!(a.delete(&format!("/api/v1/tasks/{id}")).await.0, 404);
    let events: Vec<String> = redis.events("muster").await.into_iter().map(|e| e.0).collect();
    for t in [
        "task.enqueued",
        "task.claimed",
        "task.failed",
        "task.retrying",
        "task.dead",
        "task.deleted",
    ] {
        assert!(events.iter().any(|e| e == t), "{t} emitted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_queued_delayed_and_running() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let queued = submit(&a, "cx", json!({"alias": "job-1"})).await;
    let delayed = submit(&a, "cx", json!({"delay_ms": 60_000})).await;
    let (s, r) = a.post(&format!("/api/v1/tasks/{queued}/cancel"), Value::Null).await;
    assert_eq!((s, r["state"].as_str()), (200, Some("cancelled")));
    assert_eq!(
        a.post(&format!("/api/v1/tasks/{delayed}/cancel"), Value::Null).await.1["state"],
        "cancelled"
    );
    assert_eq!(
        a.post(&format!("/api/v1/tasks/{queued}/cancel"), Value::Null).await.0,
        409,
        "already cancelled"
    );
    assert!(claim(&a, "cx", "w", 5, 0).await.is_empty(), "nothing left to claim");
    // running: the worker learns through its heartbeat; its fail cancels
    let running = submit(&a, "cx", json!({})).await;
    let t = claim(&a, "cx", "w", 1, 0).await;
    let tok = t[0]["token"].clone();
    let (_, r) = a.post(&format!("/api/v1/tasks/{running}/cancel"), Value::Null).await;
    assert_eq!(r["cancel_requested"], true);
    let (_, hb) = a
        .post(
            &format!("/api/v1/tasks/{running}/heartbeat"),
            json!({"token": tok, "progress": 40}),
        )
        .await;
    assert_eq!(hb["cancel_requested"], true);
    let (_, f) = a
        .post(
            &format!("/api/v1/tasks/{running}/fail"),
            json!({"token": tok, "error": "stopped"}),
        )
        .await;
    assert_eq!(f["state"], "cancelled");
    let (_, q) = a.get("/api/v1/queues/cx").await;
    assert_eq!(q["cancelled"], 3);
    assert_eq!(q["running"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_pause_resume_and_aliases() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let id = submit(&a, "dl", json!({"delay_ms": 400, "alias": "nightly"})).await;
    let (_, t) = a.get("/api/v1/aliases/nightly").await;
    assert_eq!(t["id"], id.as_str());
    assert_eq!(t["state"], "delayed");
    let (s, b) = a.post("/api/v1/queues/dl/tasks", json!({"alias": "nightly"})).await;
    assert_eq!(s, 409, "alias is unique while its task lives: {b}");
    assert_eq!(b["holder"], id.as_str());
    assert!(claim(&a, "dl", "w", 1, 0).await.is_empty());
    let started = Instant::now();
    let got = claim(&a, "dl", "w", 1, 3000).await;
    let waited = started.elapsed();
    assert_eq!(got.len(), 1);
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(1500),
        "{waited:?}"
    );
    // Still held while running; free once the task finished (it is kept
    // for retention, but no longer lives).
    let (s, _) = a.post("/api/v1/queues/dl/tasks", json!({"alias": "nightly"})).await;
    assert_eq!(s, 409, "held while running");
    let (s, b) = a
        .post(
            &format!("/api/v1/tasks/{id}/complete"),
            json!({"token": got[0]["token"]}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let next = submit(&a, "dl2", json!({"alias": "nightly"})).await;
    let (_, t) = a.get("/api/v1/aliases/nightly").await;
    assert_eq!(t["id"], next.as_str(), "the alias moved to the new task");
    // run_at in the past: queued at once
    let (_, r) = a.post("/api/v1/queues/dl/tasks", json!({"run_at": 1})).await;
    assert_eq!(r["state"], "queued");
    // pause: nothing is handed out until resume
    assert_eq!(a.post("/api/v1/queues/dl/pause", Value::Null).await.0, 204);
    let (_, q) = a.get("/api/v1/queues").await;
    assert_eq!(q["queues"][0]["paused"], true);
    assert!(claim(&a, "dl", "w", 1, 0).await.is_empty());
    assert_eq!(a.post("/api/v1/queues/dl/resume", Value::Null).await.0, 204);
    assert_eq!(claim(&a, "dl", "w", 1, 0).await.len(), 1);
    let events: Vec<String> = redis.events("muster").await.into_iter().map(|e| e.0).collect();
    assert!(events.contains(&"queue.paused".to_string()) && events.contains(&"queue.resumed".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_wakes_on_an_enqueue_on_another_node() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    join(&a, "w").await;
    let mut worst = Duration::ZERO;
    for i in 0..5 {
        let b_url = b.url.clone();
        let waiter = tokio::spawn(async move {
            let http = reqwest::Client::new();
            let resp = http
                .post(format!("{b_url}/api/v1/queues/wake/claim"))
                .json(&json!({"node": "w", "wait_ms": 10_000}))
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = Instant::now();
        submit(&a, "wake", json!({"payload": i})).await;
        let (status, woke) = waiter.await.unwrap();
        assert_eq!(status, 200);
        worst = worst.max(woke.duration_since(sent));
    }
    // Woken by the event relay, not by a timer: well under the 2 s safety net.
    assert!(worst < Duration::from_millis(300), "worst wake-up {worst:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_outcomes_map_to_http() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| {
        c.tasks.max_queues = 2;
        c.tasks.max_groups = 1;
    })
    .await;
    let ghost = "01ARZ3NDEKTSV4RRFFQ69G5FAV";
    for path in ["complete", "fail", "heartbeat"] {
        let (s, _) = a
            .post(&format!("/api/v1/tasks/{ghost}/{path}"), json!({"token": 1}))
            .await;
        assert_eq!(s, 404, "{path} on an unknown task");
    }
    assert_eq!(
        a.post(&format!("/api/v1/tasks/{ghost}/cancel"), Value::Null).await.0,
        404
    );
    assert_eq!(
        a.post(&format!("/api/v1/tasks/{ghost}/retry"), Value::Null).await.0,
        404
    );
    assert_eq!(a.delete(&format!("/api/v1/tasks/{ghost}")).await.0, 404);
    assert_eq!(a.get(&format!("/api/v1/tasks/{ghost}")).await.0, 404);
    assert_eq!(a.get("/api/v1/aliases/nobody").await.0, 404);
    // claim: unknown node, then draining node
    let (s, b) = a.post("/api/v1/queues/q1/claim", json!({"node": "stranger"})).await;
    assert_eq!(s, 409, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("heartbeat"));
    join(&a, "w").await;
    a.post("/api/v1/nodes/w/drain", Value::Null).await;
    let (s, b) = a.post("/api/v1/queues/q1/claim", json!({"node": "w"})).await;
    assert_eq!(s, 409);
    assert!(b["detail"].as_str().unwrap().contains("draining"));
    // delete of an unfinished task, retry of a queued one
    let id = submit(&a, "q1", json!({})).await;
    assert_eq!(a.delete(&format!("/api/v1/tasks/{id}")).await.0, 409);
    assert_eq!(a.post(&format!("/api/v1/tasks/{id}/retry"), Value::Null).await.0, 409);
    // too many queues (max 2): q1 exists, q2 fits, q3 does not
    submit(&a, "q2", json!({})).await;
    let (s, b) = a.post("/api/v1/queues/q3/tasks", json!({})).await;
    assert_eq!(s, 409, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("max_queues"));
    let (_, b) = a.post("/api/v1/queues/q3/tasks/batch", json!({"tasks": [{}]})).await;
    assert_eq!(b["results"][0]["code"], 409);
    assert_eq!(a.post("/api/v1/queues/q3/pause", Value::Null).await.0, 409);
    // too many groups (max 1)
    assert_eq!(a.put("/api/v1/groups/one", json!({"limit": 1})).await.0, 200);
    assert_eq!(
        a.put("/api/v1/groups/one", json!({"limit": 2})).await.0,
        200,
        "updating is fine"
    );
    assert_eq!(a.put("/api/v1/groups/two", json!({"limit": 1})).await.0, 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_task_input_is_refused_and_changes_nothing() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| c.tasks.max_payload_bytes = 1000).await;
    join(&a, "w").await;
    let cases: Vec<(&str, Value, u16)> = vec![
        ("/api/v1/queues/bad%20name/tasks", json!({}), 400),
        ("/api/v1/queues/a:b/tasks", json!({}), 400),
        ("/api/v1/queues/ok/tasks", json!({"group": "x y"}), 400),
        ("/api/v1/queues/ok/tasks", json!({"alias": "{tag}"}), 400),
        ("/api/v1/queues/ok/tasks", json!({"priority": 5000}), 400),
        ("/api/v1/queues/ok/tasks", json!({"delay_ms": 5, "run_at": 5}), 400),
        ("/api/v1/queues/ok/tasks", json!({"max_attempts": 0}), 400),
        ("/api/v1/queues/ok/tasks", json!({"payload": "x".repeat(2000)}), 413),
        ("/api/v1/queues/ok/tasks", json!({"paylod": 1}), 400),
        ("/api/v1/queues/ok/tasks", json!({"idempotency_key": "has space"}), 400),
        ("/api/v1/queues/ok/tasks/batch", json!({"tasks": []}), 400),
        ("/api/v1/queues/ok/claim", json!({"node": "w", "max": 0}), 400),
        ("/api/v1/queues/ok/claim", json!({"node": "w", "max": 1001}), 400),
        ("/api/v1/queues/ok/claim", json!({"node": "w", "wait_ms": 30_001}), 400),
        ("/api/v1/queues/ok/claim", json!({"node": "bad node"}), 400),
        ("/api/v1/tasks/not-an-id/complete", json!({"token": 1}), 400),
        (
            "/api/v1/tasks/01ARZ3NDEKTSV4RRFFQ69G5FAV/complete",
            json!({"token": "1"}),
            400,
        ),
        (
            "/api/v1/tasks/01ARZ3NDEKTSV4RRFFQ69G5FAV/heartbeat",
            json!({"token": 1, "progress": 101}),
            400,
        ),
        (
            "/api/v1/tasks/01ARZ3NDEKTSV4RRFFQ69G5FAV/heartbeat",
            json!({"token": 1, "fields": [1]}),
            400,
        ),
        ("/api/v1/tasks/complete", json!([]), 400),
    ];
    for (path, body, want) in cases {
        let (s, b) = a.post(path, body.clone()).await;
        assert_eq!(s, want, "{path} {body}: {b}");
        assert!(b["detail"].as_str().is_some_and(|d| !d.is_empty()), "{b}");
    }
    let (s, _) = a.get("/api/v1/queues/ok/tasks?state=finished").await;
    assert_eq!(s, 400);
    let (s, _) = a.get("/api/v1/queues/ok/tasks?limit=0").await;
    assert_eq!(s, 400);
    let (s, _) = a.get("/api/v1/queues/ok/tasks?cursor=abc").await;
    assert_eq!(s, 400);
    // A batch with one bad item submits the rest.
    let (s, b) = a
        .post(
            "/api/v1/queues/ok/tasks/batch",
            json!({"tasks": [{"payload": 1}, {"priority": 9999}, {"payload": 3}]}),
        )
        .await;
    assert_eq!(s, 200);
    let r = b["results"].as_array().unwrap();
    assert_eq!(
        (
            r[0]["status"].as_str(),
            r[1]["status"].as_str(),
            r[2]["status"].as_str()
        ),
        (Some("created"), Some("error"), Some("created"))
    );
    assert_eq!(r[1]["code"], 400);
    let (_, q) = a.get("/api/v1/queues").await;
    assert_eq!(
        q["queues"].as_array().unwrap().len(),
        1,
        "only the batch's queue exists: {q}"
    );
    assert_eq!(q["queues"][0]["queued"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_pages_through_states() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let ids = submit_many(&a, "ls", 120).await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/queues/ls/tasks?state=queued&limit=50&cursor={c}"),
            None => "/api/v1/queues/ls/tasks?state=queued&limit=50".to_string(),
        };
        let (s, page) = a.get(&path).await;
        assert_eq!(s, 200);
        assert_eq!(page["total"], 120);
        for t in page["tasks"].as_array().unwrap() {
            seen.push(t["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, ids, "queued tasks listed in claim order");
    let got = claim(&a, "ls", "w", 3, 0).await;
    let (_, page) = a.get("/api/v1/queues/ls/tasks?state=running").await;
    assert_eq!(page["total"], 3);
    assert_eq!(page["tasks"].as_array().unwrap().len(), 3);
    assert_eq!(got.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g4_keys_return_to_baseline_after_retention() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| {
        c.tasks.retention_ms = 1000;
        c.tasks.dead_retention_ms = 1000;
        c.tasks.idempotency_window_ms = 3000;
    })
    .await;
    join(&a, "w").await;
    a.put("/api/v1/groups/gg", json!({"limit": 5})).await;
    // Warm up: the counters and the event stream exist from the first task on.
    let warm = submit(&a, "warm", json!({})).await;
    let t = claim(&a, "warm", "w", 1, 0).await;
    a.post(
        &format!("/api/v1/tasks/{warm}/complete"),
        json!({"token": t[0]["token"]}),
    )
    .await;
    let settled = wait_until(Duration::from_secs(10), || async {
        let keys: Vec<String> = redis.cmd(&["KEYS", "*"]).await;
        !keys.iter().any(|k| k.contains(":q:warm") || k.contains(":task:"))
    })
    .await;
    assert!(settled, "the warm-up task is gone");
    let baseline: HashSet<String> = redis.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect();
    // 10 000 tasks: batches with idempotency keys, aliases and groups; some fail to dead.
    for chunk in 0..10 {
        let tasks: Vec<Value> = (0..1000).map(|i| mixed_task(chunk * 1000 + i)).collect();
        let (s, _) = a.post("/api/v1/queues/leak/tasks/batch", json!({"tasks": tasks})).await;
        assert_eq!(s, 200);
    }
    let mut finished = 0;
    while finished < 10_000 {
        let got = claim(&a, "leak", "w", 200, 1000).await;
        assert!(!got.is_empty(), "work remains ({finished} finished)");
        let (ok, bad): (Vec<&Value>, Vec<&Value>) =
            got.iter().partition(|t| t["payload"]["n"].as_u64().unwrap() % 7 != 0);
        if !ok.is_empty() {
            let items: Vec<Value> = ok.iter().map(|t| json!({"id": t["id"], "token": t["token"]})).collect();
            a.post("/api/v1/tasks/complete", Value::Array(items)).await;
        }
        for t in bad {
            a.post(
                &format!("/api/v1/tasks/{}/fail", t["id"].as_str().unwrap()),
                json!({"token": t["token"], "error": "x"}),
            )
            .await;
        }
        finished += got.len();
    }
    assert_eq!(finished, 10_000);
    let (_, q) = a.get("/api/v1/queues/leak").await;
    assert_eq!(
        (q["queued"].as_u64(), q["running"].as_u64(), q["delayed"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{q}"
    );
    // Every key left has a TTL or belongs to the bounded baseline set.
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]).await;
    for k in &keys {
        if baseline.contains(k) {
            continue;
        }
        let ttl: i64 = redis.cmd(&["PTTL", k]).await;
        let bounded_index = k.starts_with("{muster}:q:leak:") || k == "{muster}:dead" || k == "{muster}:queues";
        if ttl == -1 && !bounded_index {
            let dump: HashMap<String, String> = redis.cmd(&["HGETALL", k]).await;
            let id = k.rsplit(':').next().unwrap();
            let evs: Vec<_> = redis
                .events("muster")
                .await
                .into_iter()
                .filter(|e| e.2["task"] == id)
                .collect();
            let ttl2: i64 = redis.cmd(&["PTTL", k]).await;
            panic!("{k} has no TTL ({ttl} then {ttl2}) and is not a trimmed index: {dump:?} {evs:?}");
        }
    }
    // After retention (1 s) and the idempotency window (3 s): back to baseline.
    let back = wait_until(Duration::from_secs(20), || async {
        let now: HashSet<String> = redis.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect();
        now == baseline
    })
    .await;
    let now: HashSet<String> = redis.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect();
    let extra: Vec<_> = now.difference(&baseline).take(10).collect();
    assert!(back, "keys left over: {extra:?} ({} in all)", now.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_forms_pause_cancel_retry_and_discard() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let html = http
        .get(format!("{}/queues", a.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = csrf_of(&html);
    let form = |path: &str| {
        let url = format!("{}{path}", a.url);
        let csrf = csrf.clone();
        let http = http.clone();
        async move {
            http.post(url)
                .form(&[("csrf", csrf.as_str())])
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let queued = submit(&a, "ui", json!({})).await;
    let dying = submit(&a, "ui", json!({"max_attempts": 1})).await;
    // pause / resume
    assert_eq!(form("/ui/queues/ui/pause").await, 303);
    assert_eq!(a.get("/api/v1/queues/ui").await.1["paused"], true);
    assert_eq!(form("/ui/queues/ui/resume").await, 303);
    // a forged token changes nothing
    let forged = http
        .post(format!("{}/ui/queues/ui/pause", a.url))
        .form(&[("csrf", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 403);
    assert_eq!(a.get("/api/v1/queues/ui").await.1["paused"], false);
    // cancel from the task page
    assert_eq!(form(&format!("/ui/tasks/{queued}/cancel")).await, 303);
    assert_eq!(a.get(&format!("/api/v1/tasks/{queued}")).await.1["state"], "cancelled");
    // retry and discard a dead letter
    let t = claim(&a, "ui", "w", 1, 0).await;
    assert_eq!(t[0]["id"], dying.as_str());
    a.post(
        &format!("/api/v1/tasks/{dying}/fail"),
        json!({"token": t[0]["token"], "error": "x"}),
    )
    .await;
    assert_eq!(form(&format!("/ui/tasks/{dying}/retry")).await, 303);
    assert_eq!(a.get(&format!("/api/v1/tasks/{dying}")).await.1["state"], "queued");
    let t = claim(&a, "ui", "w", 1, 0).await;
    a.post(
        &format!("/api/v1/tasks/{dying}/fail"),
        json!({"token": t[0]["token"], "error": "y"}),
    )
    .await;
    assert_eq!(form(&format!("/ui/tasks/{dying}/discard")).await, 303);
    assert_eq!(a.get(&format!("/api/v1/tasks/{dying}")).await.0, 404);
    // bad names are refused before anything happens
    assert_eq!(form("/ui/queues/bad%20name/pause").await, 400);
}

/// Task outcome counters carry the (capped) queue label, and count every
/// way a task ends: complete, fail, timeout, and the orphan cleaner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_outcome_metrics_are_labelled_by_queue() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let q = format!("mq{}", std::process::id());
    // succeeded
    submit(&a, &q, json!({})).await;
    let t = claim(&a, &q, "w", 1, 0).await;
    let (s, _) = a
        .post(
            &format!("/api/v1/tasks/{}/complete", t[0]["id"].as_str().unwrap()),
            json!({"token": t[0]["token"]}),
        )
        .await;
    assert_eq!(s, 200);
    // failed and dead by `fail`
    submit(&a, &q, json!({"max_attempts": 1})).await;
    let t = claim(&a, &q, "w", 1, 0).await;
    let (s, _) = a
        .post(
            &format!("/api/v1/tasks/{}/fail", t[0]["id"].as_str().unwrap()),
            json!({"token": t[0]["token"], "error": "no"}),
        )
        .await;
    assert_eq!(s, 200);
    // failed and dead by the timeout monitor
    let id = submit(&a, &q, json!({"max_attempts": 1, "timeout_ms": 100})).await;
    claim(&a, &q, "w", 1, 0).await;
    assert!(
        wait_until(Duration::from_secs(5), || async {
            a.get(&format!("/api/v1/tasks/{id}")).await.1["state"] == "dead"
        })
        .await
    );
    let text = a.page("/metrics").await;
    let value = |name: &str| {
        let prefix = format!("{name}{{queue=\"{q}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(value("muster_tasks_enqueued_total"), 3.0, "{text}");
    assert_eq!(value("muster_tasks_claimed_total"), 3.0);
    assert_eq!(value("muster_tasks_succeeded_total"), 1.0);
    assert_eq!(value("muster_tasks_failed_total"), 2.0, "fail and timeout");
    assert_eq!(value("muster_tasks_dead_total"), 2.0, "fail and timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updated_at_is_the_last_change_not_the_due_time() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let redis_now = || async {
        let t: Vec<String> = redis.cmd(&["TIME"]).await;
        t[0].parse::<i64>().unwrap() * 1000 + t[1].parse::<i64>().unwrap() / 1000
    };
    let id = submit(&a, "later", json!({"delay_ms": 3_600_000})).await;
    let (_, t) = a.get(&format!("/api/v1/tasks/{id}")).await;
    assert_eq!(t["state"], "delayed");
    assert_eq!(
        t["updated_at"], t["created_at"],
        "nothing happened since the submit: {t}"
    );
    assert!(t["updated_at"].as_i64().unwrap() <= redis_now().await, "{t}");
    let (_, page) = a.get("/api/v1/queues/later/tasks?state=delayed").await;
    assert_eq!(page["tasks"][0]["updated_at"], t["created_at"], "{page}");
    // A failed attempt waiting for its retry: updated when it failed.
    let retry = submit(&a, "retry", json!({"backoff_base_ms": 3_600_000})).await;
    let got = claim(&a, "retry", "w", 1, 0).await;
    let (s, f) = a
        .post(
            &format!("/api/v1/tasks/{retry}/fail"),
            json!({"token": got[0]["token"], "error": "x"}),
        )
        .await;
    assert_eq!((s, f["state"].as_str()), (200, Some("delayed")), "{f}");
    let after = redis_now().await;
    let (_, t) = a.get(&format!("/api/v1/tasks/{retry}")).await;
    let updated = t["updated_at"].as_i64().unwrap();
    assert!(updated <= after && updated >= t["started_at"].as_i64().unwrap(), "{t}");
    assert!(t["run_at"].as_i64().unwrap() > after, "{t}");
}

mod bounds;
mod cost;
