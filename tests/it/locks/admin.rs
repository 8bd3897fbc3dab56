//! muster lock run, roles, keys back to baseline, a long line of lapsed waiters, and script outcomes as HTTP.

use super::*;

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
    let info = a.api().lock("cronjob").await.unwrap();
    assert!(!info.held, "released when the command exits");
    let events = redis.events("muster").await;
    assert!(
        !events.iter().any(|(t, _, _)| t == "lock.expired"),
        "renewed, never lapsed"
    );
    // 2. Someone holds it: --wait runs out (exit 5), the command never runs.
    let held = acquire(&a, "cronjob", "other", 30_000, 0).await.unwrap();
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
    release(&a, "cronjob", held.token).await.unwrap();
    // 3. The lock is lost (an admin breaks it): the command is stopped.
    let pid_file = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
    let mut child = lock_run(&a, &["cronjob", "--ttl", "600ms"], &["sh", "-c", &script])
        .spawn()
        .unwrap();
    // The shell creates the file before it writes the pid: wait for the pid.
    let read_pid = || {
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
    };
    let started = wait_until(Duration::from_secs(5), || async { read_pid().is_some() }).await;
    assert!(started);
    let pid: u32 = read_pid().unwrap();
    assert!(process_alive(pid));
    a.api().break_lock("cronjob").await.unwrap();
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
    // The OpenAPI document lists the new routes (a JSON document: read raw).
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
    let baseline = redis.key_baseline().await;
    // Locks: released, lapsed, waited for; elections: resigned and lapsed.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("l{}", i % 4);
            let v = acquire(&a, &name, &format!("o{i}"), 300, 5000).await.unwrap();
            if i % 3 != 0 {
                let _ = release(&a, &name, v.token).await;
            }
            let e = format!("e{}", i % 2);
            let me = format!("c{i}");
            let v = a.api().campaign(&e, &campaign(&me, 300, 5000, None)).await;
            if i % 2 == 0 {
                // The epoch of whoever leads (none when the campaign failed).
                let epoch = v.ok().and_then(|v| v.leadership.epoch);
                let _ = a.api().resign(&e, &me, epoch).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Counters are single keys; everything else lapses.
    // Locks and elections are in the shards of their names (each with its
    // counters and indexes); every shard has its event stream and the node
    // registry.
    let counters = [
        shard_keys("muster", "locks:fence"),
        shard_keys("muster", "elections:epoch"),
    ]
    .concat();
    let bounded = [shard_keys("muster", "locks"), shard_keys("muster", "elections")].concat();
    let tags = shard_tags("muster");
    let is_events = |k: &str| tags.iter().any(|t| k == format!("{t}:events"));
    let is_node = |k: &str| tags.iter().any(|t| k.starts_with(&format!("{t}:nodes:")));
    let unbounded = redis
        .keys_without_ttl(&baseline, |k| {
            counters.iter().chain(&bounded).any(|c| c == k) || is_events(k)
        })
        .await;
    assert!(unbounded.is_empty(), "keys without a TTL: {unbounded:?}");
    redis
        .assert_back_to_baseline(&baseline, Duration::from_secs(10), |k| {
            counters.iter().any(|c| c == k) || is_node(k)
        })
        .await;
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
    let mut q = vec!["ZADD".to_string(), kn("crowd", "lock:crowd:q")];
    let mut qx = vec!["ZADD".to_string(), kn("crowd", "lock:crowd:qx")];
    for i in 0..n {
        q.extend([i.to_string(), format!("ghost{i}")]);
        qx.extend(["1".to_string(), format!("ghost{i}")]);
    }
    for args in [&q, &qx] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(redis.cmd::<i64>(&args).await, n);
    }
    let v = acquire(&a, "crowd", "fresh", 5000, 0).await.unwrap();
    assert_eq!(v.owner, "fresh");
    for k in [kn("crowd", "lock:crowd:q"), kn("crowd", "lock:crowd:qx")] {
        assert_eq!(redis.cmd::<i64>(&["ZCARD", &k]).await, 0, "{k}");
    }
}

/// Every refusal a lock or election script returns, by its code, maps to its
/// HTTP status and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_outcomes_map_to_http() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    // E.NOT_FOUND: breaking a lock nobody holds.
    assert_eq!(problem(a.api().break_lock("free").await).status, 404);
    // E.STALE: releasing a free lock under a token.
    assert_eq!(problem(release(&a, "free", 7).await).status, 409);
    // E.LAPSED: the lease lapsed by Redis time before the expiry loop saw it
    // (its index entry still says later).
    let held = acquire(&a, "l", "o", 60_000, 0).await.unwrap();
    let _: i64 = redis.cmd(&["HSET", &kn("l", "lock:l"), "expires_at", "1"]).await;
    // (The problem's extension members are untyped: read from its map.)
    let p = problem(a.api().renew("l", held.token, Some(5000)).await);
    assert_eq!((p.status, p.extra["reason"].clone()), (409, json!("lapsed")), "{p:?}");
    assert!(!a.api().lock("l").await.unwrap().held);
    // E.NODE_NOT_ALIVE: a lease tied to a node that is not registered
    // (30 s: locks.default_ttl_ms).
    let tied = Acquire {
        owner: "o".into(),
        ttl_ms: 30_000,
        wait_ms: 0,
        node: Some("nowhere".into()),
    };
    assert_eq!(problem(a.api().acquire("n", &tied).await).status, 409);
    // E.STALE: a candidate that does not lead resigns.
    let v = a.api().campaign("e", &campaign("c1", 60_000, 0, None)).await.unwrap();
    assert!(v.elected, "{v:?}");
    let p = problem(a.api().resign("e", "c2", None).await);
    assert_eq!(
        (p.status, p.extra["leader"].clone(), p.extra["epoch"].as_u64()),
        (409, json!("c1"), v.leadership.epoch),
        "{p:?}"
    );
}
