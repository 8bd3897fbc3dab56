//! The schedules API: validation, pages, config-defined schedules, key baseline, script outcomes.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_schedules_get_400_saying_what_is_wrong() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let base = def("ok", "*/5 * * * *", "q");
    let with = |f: &dyn Fn(&mut ScheduleDef)| {
        let mut d = base.clone();
        f(&mut d);
        d
    };
    let task = |t: TaskTemplate| with(&|d| d.task = t.clone());
    let cases = [
        (with(&|d| d.expression = "61 * * * *".into()), "expression"),
        (with(&|d| d.expression = "* * * *".into()), "expression"),
        (with(&|d| d.expression = "* * * * * * *".into()), "expression"),
        (with(&|d| d.expression = "0 0 30 2 *".into()), "never matches"),
        (with(&|d| d.timezone = "Europe/Berlni".into()), "timezone"),
        (with(&|d| d.timezone = "CEST+2".into()), "timezone"),
        (with(&|d| d.id = "a:b".into()), "`id`"),
        (with(&|d| d.queue = "no spaces".into()), "`queue`"),
        (with(&|d| d.starting_deadline_ms = Some(0)), "starting_deadline_ms"),
        (with(&|d| d.starting_deadline_ms = Some(500)), "starting_deadline_ms"),
        (
            task(TaskTemplate {
                priority: Some(5000),
                ..TaskTemplate::default()
            }),
            "priority",
        ),
        (
            task(TaskTemplate {
                group: Some("a b".into()),
                ..TaskTemplate::default()
            }),
            "group",
        ),
    ];
    for (d, needle) in cases {
        let p = problem(a.api().create_schedule(&d).await);
        assert_eq!(p.status, 400, "{d:?} -> {p:?}");
        assert!(
            p.detail.contains(needle),
            "{d:?}: {:?} should mention {needle:?}",
            p.detail
        );
    }
    // Bodies the typed definition cannot hold: sent raw.
    let raw = json!({"id": "ok", "expression": "*/5 * * * *", "queue": "q"});
    let raw_with = |k: &str, v: Value| {
        let mut b = raw.clone();
        b[k] = v;
        b
    };
    for (body, needle) in [
        (raw_with("overlap", json!("sometimes")), "sometimes"),
        (raw_with("task", json!({"alias": "x"})), "alias"),
        (raw_with("surprise", json!(1)), "surprise"),
    ] {
        let (s, b) = a.post("/api/v1/schedules", body.clone()).await;
        let p = as_problem(s, &b);
        assert_eq!(p.status, 400, "{body} -> {b}");
        assert!(
            p.detail.contains(needle),
            "{body}: {:?} should mention {needle:?}",
            p.detail
        );
    }
    // A body whose id differs from the path (the client sends them equal).
    let (s, b) = a.put("/api/v1/schedules/other", raw.clone()).await;
    let p = as_problem(s, &b);
    assert_eq!(p.status, 400, "{b}");
    assert!(p.detail.contains("differs"));
    create(&a, base.clone()).await;
    let p = problem(a.api().create_schedule(&base).await);
    assert_eq!(p.status, 409, "{p:?}");
    let nope = [
        ("GET", problem(a.api().schedule("nope").await)),
        ("DELETE", problem(a.api().delete_schedule("nope").await)),
        ("trigger", problem(a.api().trigger_schedule("nope", None).await)),
        ("enable", problem(a.api().set_schedule_enabled("nope", true).await)),
    ];
    for (what, p) in nope {
        assert_eq!(p.status, 404, "{what} nope: {p:?}");
    }
    assert_eq!(problem(a.api().schedule("bad:id").await).status, 400);
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
    assert_eq!(s.source, "config");
    assert_eq!(s.timezone, "Europe/Berlin");
    assert_eq!(s.overlap, Overlap::Forbid);
    let payload = s.task.payload.clone().unwrap_or_default();
    assert_eq!(
        payload.get("kind").and_then(Value::as_str),
        Some("nightly"),
        "{payload}"
    );
    assert_eq!(s.next.len(), 5);
    for w in s.next.windows(2) {
        // 03:00 Berlin every day: 23, 24 or 25 hours apart.
        let gap = w[1] - w[0];
        assert!([23, 24, 25].map(|h| h * 3_600_000).contains(&gap), "{gap}");
    }
    let p = problem(a.api().put_schedule(&def("nightly", "0 4 * * *", "reports")).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert!(p.detail.contains("config.toml"));
    assert_eq!(problem(a.api().delete_schedule("nightly").await).status, 409);
    // A second node with the same config leaves it alone (no new version).
    let b2 = TestApp::start_with(&redis, from_config).await;
    assert_eq!(get(&b2, "nightly").await.version, s.version);
    // An operator's disable stands across restarts until the entry changes.
    a.api().set_schedule_enabled("nightly", false).await.unwrap();
    let c3 = TestApp::start_with(&redis, from_config).await;
    assert!(!get(&c3, "nightly").await.enabled);
    c3.api().set_schedule_enabled("nightly", true).await.unwrap();

    // API schedules: create, list, replace, trigger, delete.
    let mut hourly = def("hourly", "*/5 * * * *", "jobs");
    hourly.task = TaskTemplate {
        payload: Some(json!({"n": 1})),
        priority: Some(7),
        ..TaskTemplate::default()
    };
    let created = create(&a, hourly).await;
    assert_eq!(created.source, "api");
    assert!(created.description.to_lowercase().contains("every 5 minutes"));
    let list = a.api().schedules().await.unwrap();
    let ids: Vec<&str> = list.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, vec!["hourly", "nightly"]);
    // PUT answers 200 for a replace and 201 for a create: raw, to see which.
    let put = |id: &str, d: ScheduleDef| {
        let req = a
            .request(reqwest::Method::PUT, &format!("/api/v1/schedules/{id}"))
            .json(&d);
        async move {
            let (st, b) = send(req).await;
            let s: Schedule = serde_json::from_value(b.clone()).unwrap_or_else(|e| panic!("{e}: {st} {b}"));
            (st, s)
        }
    };
    let (st, replaced) = put("hourly", def("hourly", "0 * * * *", "jobs")).await;
    assert_eq!(st, 200, "{replaced:?}");
    assert_eq!(replaced.expression, "0 * * * *");
    assert!(replaced.version > created.version);
    // A new expression starts a new timeline: its past is not an outage.
    assert_eq!(replaced.cursor, replaced.updated_at);
    // Other changes keep the cursor: outcomes stand, pending occurrences stay pending.
    let mut d = def("hourly", "0 * * * *", "jobs");
    d.task.priority = Some(3);
    let (st, again) = put("hourly", d).await;
    assert_eq!(st, 200, "{again:?}");
    assert_eq!(again.cursor, replaced.cursor);
    assert_eq!(again.task.priority, Some(3));
    let (st, t) = a.post("/api/v1/schedules/hourly/trigger", json!({})).await;
    assert_eq!(st, 201, "{t}");
    let t: Triggered = serde_json::from_value(t).unwrap();
    assert_eq!(t.queue, "jobs");
    let task_id = t.task.as_str();
    let task = a.api().task(task_id).await.unwrap();
    assert_eq!(task.queue, "jobs");
    assert_eq!(task.state, "queued");
    assert_eq!(
        task.idempotency_key.as_deref(),
        Some(format!("schedule:hourly:trigger:{task_id}").as_str())
    );
    assert_eq!(task.created_at, t.occurrence);
    assert!(!t.replayed);
    let s = get(&a, "hourly").await;
    assert_eq!(s.counts.fired, 1);
    assert_eq!(s.last_task.as_deref(), Some(task_id));
    assert!(s.history[0].manual);
    let (st, _) = put("new-one", def("new-one", "0 * * * *", "jobs")).await;
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

    a.api().delete_schedule("hourly").await.unwrap();
    assert_eq!(problem(a.api().schedule("hourly").await).status, 404);
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
        let _ = complete(&a, &t[0]).await;
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
    a.api().delete_schedule("leak").await.unwrap();
    // Work off the tasks it submitted.
    loop {
        let got = claim(&a, "leak", "w", 100, 0).await;
        if got.is_empty() {
            break;
        }
        let items = completions(&got, Value::Null);
        let _ = a.api().complete_batch(&items).await;
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
    let mut direct = every_second("direct", "direct");
    direct.enabled = false;
    let created = create(&a, direct).await;
    let v = created.version;
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
    other.enabled = false;
    let v2 = create(&a, other).await.version;
    let p = problem(a.api().create_schedule(&every_second(&third, "direct")).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert!(p.detail.contains("schedules.max_schedules"));
    let p = problem(a.api().trigger_schedule(&oid, None).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert!(p.detail.contains("tasks.max_queues"));
    rewind(&redis, &oid, t1 - 1000).await;
    let r = s.fire(&oid, v2, &occ, Some(t1 + 2000)).await.unwrap();
    assert_eq!((r.code, r.fired, r.missed), (1, 0, 2));
    let h = &get(&a, &oid).await.history[0];
    assert_eq!(
        (h.result.as_str(), h.reason.as_deref()),
        ("missed", Some("too_many_queues"))
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
    assert_eq!(before.source, "config");
    let events_before = redis.events("muster").await.len();
    // Through B, whose config.toml does not list x: every change is refused,
    // with a problem+json answer (raw, to check its content type too).
    use reqwest::Method;
    let body = json!({"expression": "*/5 * * * *", "queue": "elsewhere"});
    let p = raw_problem(b.request(Method::DELETE, "/api/v1/schedules/x")).await;
    assert_eq!(p.status, 409, "{p:?}");
    assert!(
        p.detail.contains("config.toml") && p.detail.contains("?force=true"),
        "{}",
        p.detail
    );
    let p = raw_problem(b.request(Method::PUT, "/api/v1/schedules/x").json(&body)).await;
    assert_eq!(p.status, 409, "{p:?}");
    assert!(p.detail.contains("config.toml"), "{p:?}");
    let created = json!({"id": "x", "expression": "*/5 * * * *", "queue": "elsewhere"});
    let p = raw_problem(b.request(Method::POST, "/api/v1/schedules").json(&created)).await;
    assert_eq!(p.status, 409, "{p:?}");
    assert!(p.detail.contains("config.toml"), "{p:?}");
    // Nothing changed.
    let after = get(&b, "x").await;
    assert_eq!(after.version, before.version, "version");
    assert_eq!(after.expression, before.expression, "expression");
    assert_eq!(after.queue, before.queue, "queue");
    assert_eq!(after.source, before.source, "source");
    assert_eq!(after.updated_at, before.updated_at, "updated_at");
    assert_eq!(
        redis.events("muster").await.len(),
        events_before,
        "no event: nothing happened"
    );
    // Enable and disable still work from any node.
    b.api().set_schedule_enabled("x", false).await.unwrap();
    b.api().set_schedule_enabled("x", true).await.unwrap();
    // A node that lists it refuses even with `force` (it would write it back
    // at its next start); once the entry is gone from every config, `force`
    // deletes it.
    // (`force` has no client method: raw.)
    let (st, body) = a.delete("/api/v1/schedules/x?force=true").await;
    let p = as_problem(st, &body);
    assert_eq!(p.status, 409, "{body}");
    assert!(p.detail.contains("this node's config.toml"));
    assert_eq!(b.delete("/api/v1/schedules/x?force=true").await.0, 204);
    assert_eq!(problem(b.api().schedule("x").await).status, 404);
    // An API schedule is still deleted without ceremony.
    create(&b, def("api", "0 3 * * *", "q")).await;
    b.api().delete_schedule("api").await.unwrap();
}
