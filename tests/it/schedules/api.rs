//! The schedules API: validation, pages, config-defined schedules, key baseline, script outcomes.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_schedules_get_400_saying_what_is_wrong() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let base = json!({"id": "ok", "expression": "*/5 * * * *", "queue": "q"});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let cases = [
        (with("expression", json!("61 * * * *")), "expression"),
        (with("expression", json!("* * * *")), "expression"),
        (with("expression", json!("* * * * * * *")), "expression"),
        (with("expression", json!("0 0 30 2 *")), "never matches"),
        (with("timezone", json!("Europe/Berlni")), "timezone"),
        (with("timezone", json!("CEST+2")), "timezone"),
        (with("id", json!("a:b")), "`id`"),
        (with("queue", json!("no spaces")), "`queue`"),
        (with("overlap", json!("sometimes")), "sometimes"),
        (with("starting_deadline_ms", json!(0)), "starting_deadline_ms"),
        (with("starting_deadline_ms", json!(500)), "starting_deadline_ms"),
        (with("task", json!({"priority": 5000})), "priority"),
        (with("task", json!({"alias": "x"})), "alias"),
        (with("task", json!({"group": "a b"})), "group"),
        (with("surprise", json!(1)), "surprise"),
    ];
    for (body, needle) in cases {
        let (s, b) = a.post("/api/v1/schedules", body.clone()).await;
        assert_eq!(s, 400, "{body} -> {b}");
        let detail = b["detail"].as_str().unwrap();
        assert!(detail.contains(needle), "{body}: {detail:?} should mention {needle:?}");
    }
    let (s, b) = a.put("/api/v1/schedules/other", base.clone()).await;
    assert_eq!(s, 400, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("differs"));
    let (s, _) = a.post("/api/v1/schedules", base.clone()).await;
    assert_eq!(s, 201);
    let (s, b) = a.post("/api/v1/schedules", base.clone()).await;
    assert_eq!(s, 409, "{b}");
    for (method, path) in [
        ("GET", "/api/v1/schedules/nope"),
        ("DELETE", "/api/v1/schedules/nope"),
        ("POST", "/api/v1/schedules/nope/trigger"),
        ("POST", "/api/v1/schedules/nope/enable"),
    ] {
        let (s, b) = send(a.request(method.parse().unwrap(), path).json(&json!({}))).await;
        assert_eq!(s, 404, "{method} {path}: {b}");
    }
    let (s, _) = a.get("/api/v1/schedules/bad:id").await;
    assert_eq!(s, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_api_config_pages_trigger_and_events() {
    let redis = TestRedis::start();
    let from_config = |c: &mut Config| {
        fast(c);
        let text = r#"
            [[schedules.items]]
            id = "nightly"
            expression = "0 3 * * *"
            timezone = "Europe/Berlin"
            queue = "reports"
            task = { payload = { kind = "nightly" }, max_attempts = 2 }
            overlap = "forbid"
        "#;
        let parsed = Config::from_toml(text).unwrap();
        c.schedules.items = parsed.schedules.items;
    };
    let a = TestApp::start_with(&redis, from_config).await;
    // Config schedules are in Redis when the node serves; the API may not change them.
    let s = get(&a, "nightly").await;
    assert_eq!(s["source"], "config");
    assert_eq!(s["timezone"], "Europe/Berlin");
    assert_eq!(s["overlap"], "forbid");
    assert_eq!(s["task"]["payload"]["kind"], "nightly");
    let next: Vec<i64> = s["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(next.len(), 5);
    for w in next.windows(2) {
        // 03:00 Berlin every day: 23, 24 or 25 hours apart.
        let gap = w[1] - w[0];
        assert!([23, 24, 25].map(|h| h * 3_600_000).contains(&gap), "{gap}");
    }
    let (st, b) = a
        .put(
            "/api/v1/schedules/nightly",
            json!({"expression": "0 4 * * *", "queue": "reports"}),
        )
        .await;
    assert_eq!(st, 409, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("config.toml"));
    let (st, _) = a.delete("/api/v1/schedules/nightly").await;
    assert_eq!(st, 409);
    // A second node with the same config leaves it alone (no new version).
    let b2 = TestApp::start_with(&redis, from_config).await;
    assert_eq!(get(&b2, "nightly").await["version"], s["version"]);
    // An operator's disable stands across restarts until the entry changes.
    let (st, _) = a.post("/api/v1/schedules/nightly/disable", json!({})).await;
    assert_eq!(st, 204);
    let c3 = TestApp::start_with(&redis, from_config).await;
    assert_eq!(get(&c3, "nightly").await["enabled"], false);
    let (st, _) = c3.post("/api/v1/schedules/nightly/enable", json!({})).await;
    assert_eq!(st, 204);

    // API schedules: create, list, replace, trigger, delete.
    let created = create(
        &a,
        json!({"id": "hourly", "expression": "*/5 * * * *", "timezone": "UTC", "queue": "jobs",
               "task": {"payload": {"n": 1}, "priority": 7}}),
    )
    .await;
    assert_eq!(created["source"], "api");
    assert!(
        created["description"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("every 5 minutes")
    );
    let (_, list) = a.get("/api/v1/schedules").await;
    let ids: Vec<&str> = list["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["hourly", "nightly"]);
    let (st, replaced) = a
        .put(
            "/api/v1/schedules/hourly",
            json!({"expression": "0 * * * *", "queue": "jobs"}),
        )
        .await;
    assert_eq!(st, 200, "{replaced}");
    assert_eq!(replaced["expression"], "0 * * * *");
    assert!(replaced["version"].as_u64() > created["version"].as_u64());
    // A new expression starts a new timeline: its past is not an outage.
    assert_eq!(replaced["cursor"], replaced["updated_at"]);
    // Other changes keep the cursor: outcomes stand, pending occurrences stay pending.
    let (st, again) = a
        .put(
            "/api/v1/schedules/hourly",
            json!({"expression": "0 * * * *", "queue": "jobs", "task": {"priority": 3}}),
        )
        .await;
    assert_eq!(st, 200, "{again}");
    assert_eq!(again["cursor"], replaced["cursor"]);
    assert_eq!(again["task"]["priority"], 3);
    let (st, t) = a.post("/api/v1/schedules/hourly/trigger", json!({})).await;
    assert_eq!(st, 201, "{t}");
    assert_eq!(t["queue"], "jobs");
    let task_id = t["task"].as_str().unwrap();
    let (_, task) = a.get(&format!("/api/v1/tasks/{task_id}")).await;
    assert_eq!(task["queue"], "jobs");
    assert_eq!(task["state"], "queued");
    assert_eq!(
        task["idempotency_key"],
        format!("schedule:hourly:trigger:{task_id}").as_str()
    );
    assert_eq!(task["created_at"], t["occurrence"]);
    assert_eq!(t["replayed"], false);
    let s = get(&a, "hourly").await;
    assert_eq!(s["counts"]["fired"], 1);
    assert_eq!(s["last_task"], task_id);
    assert_eq!(s["history"][0]["manual"], true);
    let (st, _) = a
        .put(
            "/api/v1/schedules/new-one",
            json!({"expression": "0 * * * *", "queue": "jobs"}),
        )
        .await;
    assert_eq!(st, 201);

    // The pages.
    let page = |path: &str| {
        let req = a.http.get(format!("{}{path}", a.url));
        async move { req.send().await.unwrap().text().await.unwrap() }
    };
    let html = page("/schedules").await;
    assert!(html.contains("href=\"/schedules/nightly\"") && html.contains(">config<"));
    assert!(html.contains("Schedules") && html.contains("/ui/schedules/hourly/trigger"));
    let html = page("/schedules/hourly").await;
    assert!(
        html.contains(&format!("/tasks/{task_id}")),
        "the last fire links its task"
    );
    assert!(html.contains("trigger now") && html.contains("Next fire times"));
    assert!(html.contains(a.node_id.as_str()), "the history names the node");
    let html = page("/schedules/nightly").await;
    assert!(
        html.contains("03:00:00 CET") || html.contains("03:00:00 CEST"),
        "local fire times"
    );
    assert!(
        !html.contains("/ui/schedules/nightly/delete"),
        "no delete for a config schedule"
    );

    let (st, _) = a.delete("/api/v1/schedules/hourly").await;
    assert_eq!(st, 204);
    let (st, _) = a.get("/api/v1/schedules/hourly").await;
    assert_eq!(st, 404);
    let events = redis.events("muster").await;
    for ty in [
        "schedule.created",
        "schedule.updated",
        "schedule.fired",
        "schedule.disabled",
        "schedule.deleted",
    ] {
        assert!(events.iter().any(|(t, _, _)| t == ty), "{ty}");
    }
    let doc = a.get("/api/v1/openapi.json").await.1;
    for p in [
        "/api/v1/schedules",
        "/api/v1/schedules/{id}",
        "/api/v1/schedules/{id}/trigger",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} in the OpenAPI document");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g4_schedule_keys_return_to_baseline() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| {
        fast(c);
        c.schedules.max_skew_ms = 400;
        c.schedules.record_ttl_ms = 1000;
        c.schedules.history_max = 5;
        c.tasks.retention_ms = 500;
        c.tasks.idempotency_window_ms = 1000;
    })
    .await;
    join(&a, "w").await;
    // Warm up: the counters and the event stream exist from the first task
    // on (each shard's from its first task when split: one queue per shard).
    for q in names_per_shard("muster", "warm") {
        let (st, _) = a.post(&format!("/api/v1/queues/{q}/tasks"), json!({})).await;
        assert_eq!(st, 201);
        let t = claim(&a, &q, "w", 1, 0).await;
        a.post(
            &format!("/api/v1/tasks/{}/complete", t[0]["id"].as_str().unwrap()),
            json!({"token": t[0]["token"]}),
        )
        .await;
    }
    let settled = wait_until(Duration::from_secs(10), || async {
        let keys: Vec<String> = redis.cmd(&["KEYS", "*"]).await;
        !keys.iter().any(|k| k.contains(":q:warm") || k.contains(":task:"))
    })
    .await;
    assert!(settled);
    let baseline = redis.key_baseline().await;
    create(&a, every_second("leak", "leak")).await;
    until_fired(&a, "leak", 8, Duration::from_secs(20)).await;
    // While it runs: the history is bounded and the records expire.
    let tag = name_tag("muster", "leak");
    let hist: i64 = redis.cmd(&["LLEN", &format!("{tag}:schedule:leak:history")]).await;
    assert!(hist <= 5, "history of {hist}");
    let records: Vec<String> = redis.cmd(&["KEYS", &format!("{tag}:schedule:leak:fire:*")]).await;
    assert!(records.len() <= 3, "records outlive their TTL: {records:?}");
    for r in &records {
        let ttl: i64 = redis.cmd(&["PTTL", r]).await;
        assert!(ttl > 0 && ttl <= 1000, "{r} has PTTL {ttl}");
    }
    let (st, _) = a.delete("/api/v1/schedules/leak").await;
    assert_eq!(st, 204);
    // Work off the tasks it submitted.
    loop {
        let got = claim(&a, "leak", "w", 100, 0).await;
        if got.is_empty() {
            break;
        }
        let items: Vec<Value> = got
            .iter()
            .map(|t| json!({"id": t["id"], "token": t["token"]}))
            .collect();
        a.post("/api/v1/tasks/complete", Value::Array(items)).await;
    }
    redis
        .assert_back_to_baseline(&baseline, Duration::from_secs(20), |_| false)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_script_outcomes_and_limits() {
    let redis = TestRedis::start();
    // The node's own scheduler proposes nothing: its clock is a day behind, so
    // no occurrence after a cursor of today is within its reach. The test
    // calls the script itself.
    let a = TestApp::start_with(&redis, |c| {
        c.schedules.clock_offset_ms = -86_400_000;
        c.schedules.max_schedules = 2;
        c.tasks.max_queues = 1;
    })
    .await;
    let mut def = every_second("direct", "direct");
    def["enabled"] = json!(false);
    let created = create(&a, def).await;
    let v = created["version"].as_u64().unwrap();
    let s = &a.state().schedules;
    let now = redis_now(&redis).await;
    let t1 = now - now.rem_euclid(1000) - 3000;
    let occ = [t1, t1 + 1000];
    // -3 disabled, -1 unknown, -2 changed since the caller read it.
    assert_eq!(s.fire("direct", v, &occ, Some(t1 + 2000)).await.unwrap().code, -3);
    assert_eq!(s.fire("nope", v, &occ, Some(t1 + 2000)).await.unwrap().code, -1);
    rewind(&redis, "direct", t1 - 1000).await;
    assert_eq!(s.fire("direct", v + 1, &occ, Some(t1 + 2000)).await.unwrap().code, -2);
    // 1: both due (3 s late is on time within max_skew_ms), both fired.
    let r = s.fire("direct", v, &occ, Some(t1 + 2000)).await.unwrap();
    assert_eq!((r.code, r.fired, r.cursor), (1, 2, t1 + 1000));
    // The same proposal again, from any node, changes nothing; each of the three
    // guards is enough on its own: the cursor, the occurrence records (SET NX),
    // the tasks' idempotency keys. Each step hides the other two.
    let records: Vec<String> = occ
        .iter()
        .map(|t| format!("{}:schedule:direct:fire:{t}", name_tag("muster", "direct")))
        .collect();
    let idem: Vec<String> = occ
        .iter()
        .map(|t| format!("{}:idem:schedule:direct:{t}", name_tag("muster", "direct")))
        .collect();
    let hide = |keys: Vec<String>| {
        let redis = &redis;
        async move {
            for k in keys {
                let _: () = redis.cmd(&["RENAME", &k, &format!("{k}.hidden")]).await;
            }
        }
    };
    let unhide = |keys: Vec<String>| {
        let redis = &redis;
        async move {
            for k in keys {
                let _: () = redis.cmd(&["RENAME", &format!("{k}.hidden"), &k]).await;
            }
        }
    };
    // The cursor alone.
    hide([records.clone(), idem.clone()].concat()).await;
    let r = s.fire("direct", v, &occ, Some(t1 + 2000)).await.unwrap();
    assert_eq!((r.code, r.fired, r.skipped, r.missed), (1, 0, 0, 0), "the cursor");
    unhide([records.clone(), idem.clone()].concat()).await;
    // The occurrence records alone.
    rewind(&redis, "direct", t1 - 1000).await;
    hide(idem.clone()).await;
    let r = s.fire("direct", v, &occ, Some(t1 + 2000)).await.unwrap();
    assert_eq!(
        (r.code, r.fired, r.skipped, r.missed),
        (1, 0, 0, 0),
        "the occurrence records"
    );
    unhide(idem.clone()).await;
    // The idempotency keys alone.
    rewind(&redis, "direct", t1 - 1000).await;
    for k in &records {
        let _: i64 = redis.cmd(&["DEL", k]).await;
    }
    let r = s.fire("direct", v, &occ, Some(t1 + 2000)).await.unwrap();
    assert_eq!(
        (r.code, r.fired, r.skipped, r.missed),
        (1, 0, 0, 0),
        "the idempotency keys"
    );
    let tasks = tasks_by_occurrence(&a, "direct", "direct").await;
    assert_eq!(tasks.keys().copied().collect::<Vec<_>>(), occ.to_vec());
    assert!(tasks.values().all(|v| v.len() == 1));
    // 0: not due yet, with the wait in Redis time.
    let future = redis_now(&redis).await + 5000;
    let r = s.fire("direct", v, &[future], None).await.unwrap();
    assert_eq!(r.code, 0);
    assert!(r.wait_ms > 3000 && r.wait_ms <= 5000, "{}", r.wait_ms);
    assert_eq!(fired(&a, "direct").await, 2);

    // Limits: schedules (upsert -3) and queues (trigger -5, fire: missed).
    // Both limits are per shard when split: "other" and "third" in direct's.
    let (oid, third) = (
        name_like("muster", "other", "direct"),
        name_like("muster", "third", "direct"),
    );
    let mut other = every_second(&oid, &oid);
    other["enabled"] = json!(false);
    let v2 = create(&a, other).await["version"].as_u64().unwrap();
    let (st, b) = a.post("/api/v1/schedules", every_second(&third, "direct")).await;
    assert_eq!(st, 409, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("schedules.max_schedules"));
    let (st, b) = a.post(&format!("/api/v1/schedules/{oid}/trigger"), json!({})).await;
    assert_eq!(st, 409, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("tasks.max_queues"));
    rewind(&redis, &oid, t1 - 1000).await;
    let r = s.fire(&oid, v2, &occ, Some(t1 + 2000)).await.unwrap();
    assert_eq!((r.code, r.fired, r.missed), (1, 0, 2));
    let h = &get(&a, &oid).await["history"][0];
    assert_eq!(
        (h["result"].as_str(), h["reason"].as_str()),
        (Some("missed"), Some("too_many_queues"))
    );
}

/// A config-defined schedule `x` (03:00 Berlin) on node A's config only.
fn with_config_x(c: &mut Config) {
    fast(c);
    let text = r#"
        [[schedules.items]]
        id = "x"
        expression = "0 3 * * *"
        timezone = "Europe/Berlin"
        queue = "reports"
    "#;
    c.schedules.items = Config::from_toml(text).unwrap().schedules.items;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_schedules_are_protected_on_nodes_whose_config_lacks_them() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, with_config_x).await;
    let b = TestApp::start_with(&redis, fast).await;
    let before = get(&b, "x").await;
    assert_eq!(before["source"], "config");
    let events_before = redis.events("muster").await.len();
    // Through B, whose config.toml does not list x: every change is refused.
    use reqwest::Method;
    let def = json!({"expression": "*/5 * * * *", "queue": "elsewhere"});
    let (st, body) = problem(b.request(Method::DELETE, "/api/v1/schedules/x")).await;
    assert_eq!(st, 409, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("config.toml") && detail.contains("?force=true"),
        "{detail}"
    );
    let (st, body) = problem(b.request(Method::PUT, "/api/v1/schedules/x").json(&def)).await;
    assert_eq!(st, 409, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("config.toml"), "{body}");
    let mut created = def.clone();
    created["id"] = json!("x");
    let (st, body) = problem(b.request(Method::POST, "/api/v1/schedules").json(&created)).await;
    assert_eq!(st, 409, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("config.toml"), "{body}");
    // Nothing changed.
    let after = get(&b, "x").await;
    for f in ["version", "expression", "queue", "source", "updated_at"] {
        assert_eq!(after[f], before[f], "{f}");
    }
    assert_eq!(
        redis.events("muster").await.len(),
        events_before,
        "no event: nothing happened"
    );
    // Enable and disable still work from any node.
    assert_eq!(b.post("/api/v1/schedules/x/disable", json!({})).await.0, 204);
    assert_eq!(b.post("/api/v1/schedules/x/enable", json!({})).await.0, 204);
    // A node that lists it refuses even with `force` (it would write it back
    // at its next start); once the entry is gone from every config, `force`
    // deletes it.
    let (st, body) = a.delete("/api/v1/schedules/x?force=true").await;
    assert_eq!(st, 409, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("this node's config.toml"));
    assert_eq!(b.delete("/api/v1/schedules/x?force=true").await.0, 204);
    assert_eq!(b.get("/api/v1/schedules/x").await.0, 404);
    // An API schedule is still deleted without ceremony.
    create(&b, json!({"id": "api", "expression": "0 3 * * *", "queue": "q"})).await;
    assert_eq!(b.delete("/api/v1/schedules/api").await.0, 204);
}
