//! The task API as clients see it: script outcomes as HTTP, bad input, listings, key baseline (G4), dashboard forms, metrics.

use super::*;

/// The payload of a [`mixed_task`].
#[derive(serde::Deserialize)]
struct Mixed {
    n: u64,
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
    let req = |node: &str| ClaimRequest {
        node: node.into(),
        max: 1,
        wait_ms: 0,
        ack_ms: None,
    };
    let p = problem(a.api().claim("q1", &req("stranger")).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert!(p.detail.contains("heartbeat"));
    join(&a, "w").await;
    a.api().drain_node("w").await.unwrap();
    let p = problem(a.api().claim("q1", &req("w")).await);
    assert_eq!(p.status, 409);
    assert!(p.detail.contains("draining"));
    // delete of an unfinished task, retry of a queued one
    let id = submit(&a, "q1", json!({})).await;
    assert_eq!(a.delete(&format!("/api/v1/tasks/{id}")).await.0, 409);
    assert_eq!(a.post(&format!("/api/v1/tasks/{id}/retry"), Value::Null).await.0, 409);
    // too many queues (max 2): q1 exists, q2 fits, q3 does not (the limit is
    // per shard when split: q2 and q3 in q1's shard)
    let (q2, q3) = (name_like("muster", "q2", "q1"), name_like("muster", "q3", "q1"));
    submit(&a, &q2, json!({})).await;
    let (s, b) = a.post(&format!("/api/v1/queues/{q3}/tasks"), json!({})).await;
    assert_eq!(s, 409, "{b}");
    assert!(as_problem(s, &b).detail.contains("max_queues"));
    let (_, b) = a
        .post(&format!("/api/v1/queues/{q3}/tasks/batch"), json!({"tasks": [{}]}))
        .await;
    let b: BatchResponse = serde_json::from_value(b).unwrap();
    assert_eq!(b.results[0].code, Some(409));
    assert_eq!(a.post(&format!("/api/v1/queues/{q3}/pause"), Value::Null).await.0, 409);
    // too many groups (max 1; per shard when split, so two in one's shard)
    assert_eq!(a.put("/api/v1/groups/one", json!({"limit": 1})).await.0, 200);
    assert_eq!(
        a.put("/api/v1/groups/one", json!({"limit": 2})).await.0,
        200,
        "updating is fine"
    );
    let two = name_like("muster", "two", "one");
    assert_eq!(
        a.put(&format!("/api/v1/groups/{two}"), json!({"limit": 1})).await.0,
        409
    );
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
        assert!(!as_problem(s, &b).detail.is_empty(), "{b}");
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
    let r = serde_json::from_value::<BatchResponse>(b).unwrap().results;
    assert_eq!(
        (r[0].status.as_str(), r[1].status.as_str(), r[2].status.as_str()),
        ("created", "error", "created")
    );
    assert_eq!(r[1].code, Some(400));
    let q = a.api().queues().await.unwrap();
    assert_eq!(q.len(), 1, "only the batch's queue exists: {q:?}");
    assert_eq!(q[0].queued, 2);
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
        let page = a.api().tasks("ls", "queued", 50, cursor.as_deref()).await.unwrap();
        assert_eq!(page.total, 120);
        seen.extend(page.tasks.into_iter().map(|t| t.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, ids, "queued tasks listed in claim order");
    let got = claim(&a, "ls", "w", 3, 0).await;
    // Raw: the default page size (no `limit`).
    let (_, page) = a.get("/api/v1/queues/ls/tasks?state=running").await;
    let page: muster::client::TaskPage = serde_json::from_value(page).unwrap();
    assert_eq!(page.total, 3);
    assert_eq!(page.tasks.len(), 3);
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
    // Warm up: the counters and the event stream exist from the first task
    // on (each shard's from its first task when split: one queue per shard).
    for q in names_per_shard("muster", "warm") {
        submit(&a, &q, json!({})).await;
        let t = claim_tasks(&a, &q, "w", 1, 0).await;
        complete_task(&a, &t[0]).await;
    }
    let settled = wait_until(Duration::from_secs(10), || async {
        let keys: Vec<String> = redis.cmd(&["KEYS", "*"]).await;
        !keys.iter().any(|k| k.contains(":q:warm") || k.contains(":task:"))
    })
    .await;
    assert!(settled, "the warm-up task is gone");
    let baseline = redis.key_baseline().await;
    // 10 000 tasks: batches with idempotency keys, aliases and groups; some fail to dead.
    for chunk in 0..10 {
        let tasks: Vec<Value> = (0..1000).map(|i| mixed_task(chunk * 1000 + i)).collect();
        let (s, _) = a.post("/api/v1/queues/leak/tasks/batch", json!({"tasks": tasks})).await;
        assert_eq!(s, 200);
    }
    let mut finished = 0;
    while finished < 10_000 {
        let got = claim_tasks(&a, "leak", "w", 200, 1000).await;
        assert!(!got.is_empty(), "work remains ({finished} finished)");
        let n = |t: &ClaimedTask| serde_json::from_value::<Mixed>(t.payload.clone()).unwrap().n;
        let (ok, bad): (Vec<&ClaimedTask>, Vec<&ClaimedTask>) = got.iter().partition(|t| n(t) % 7 != 0);
        if !ok.is_empty() {
            let items = completions(ok.iter().copied(), Value::Null);
            a.api().complete_batch(&items).await.unwrap();
        }
        for t in bad {
            fail_task(&a, t, "x").await;
        }
        finished += got.len();
    }
    assert_eq!(finished, 10_000);
    let q = a.api().queue("leak").await.unwrap().stats;
    assert_eq!((q.queued, q.running, q.delayed), (0, 0, 0), "{q:?}");
    // Every key left has a TTL or belongs to the bounded baseline set.
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]).await;
    for k in &keys {
        if baseline.0.contains(k) {
            continue;
        }
        let ttl: i64 = redis.cmd(&["PTTL", k]).await;
        let bounded_index = shard_tags("muster").iter().any(|t| {
            k.starts_with(&format!("{t}:q:leak:")) || *k == format!("{t}:dead") || *k == format!("{t}:queues")
        });
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
    redis
        .assert_back_to_baseline(&baseline, Duration::from_secs(20), |_| false)
        .await;
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
    assert!(a.api().queue("ui").await.unwrap().stats.paused);
    assert_eq!(form("/ui/queues/ui/resume").await, 303);
    // a forged token changes nothing
    let forged = http
        .post(format!("{}/ui/queues/ui/pause", a.url))
        .form(&[("csrf", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 403);
    assert!(!a.api().queue("ui").await.unwrap().stats.paused);
    // cancel from the task page
    assert_eq!(form(&format!("/ui/tasks/{queued}/cancel")).await, 303);
    assert_eq!(a.api().task(&queued).await.unwrap().state, "cancelled");
    // retry and discard a dead letter
    let t = claim_tasks(&a, "ui", "w", 1, 0).await;
    assert_eq!(t[0].id, dying);
    fail_task(&a, &t[0], "x").await;
    assert_eq!(form(&format!("/ui/tasks/{dying}/retry")).await, 303);
    assert_eq!(a.api().task(&dying).await.unwrap().state, "queued");
    let t = claim_tasks(&a, "ui", "w", 1, 0).await;
    fail_task(&a, &t[0], "y").await;
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
    let t = claim_tasks(&a, &q, "w", 1, 0).await;
    complete_task(&a, &t[0]).await;
    // failed and dead by `fail`
    submit(&a, &q, json!({"max_attempts": 1})).await;
    let t = claim_tasks(&a, &q, "w", 1, 0).await;
    fail_task(&a, &t[0], "no").await;
    // failed and dead by the timeout monitor
    let id = submit(&a, &q, json!({"max_attempts": 1, "timeout_ms": 100})).await;
    claim(&a, &q, "w", 1, 0).await;
    assert!(
        wait_until(Duration::from_secs(5), || async {
            a.api().task(&id).await.unwrap().state == "dead"
        })
        .await
    );
    let value_in = |text: &str, name: &str| {
        let prefix = format!("{name}{{queue=\"{q}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // The timeout monitor counts after its pass over every shard, so the
    // task can read dead a moment before the counters move.
    let counted = wait_until(Duration::from_secs(5), || async {
        let text = a.page("/metrics").await;
        value_in(&text, "muster_tasks_failed_total") >= 2.0 && value_in(&text, "muster_tasks_dead_total") >= 2.0
    })
    .await;
    let text = a.page("/metrics").await;
    assert!(counted, "{text}");
    let value = |name: &str| value_in(&text, name);
    assert_eq!(value("muster_tasks_enqueued_total"), 3.0, "{text}");
    assert_eq!(value("muster_tasks_claimed_total"), 3.0);
    assert_eq!(value("muster_tasks_succeeded_total"), 1.0);
    assert_eq!(value("muster_tasks_failed_total"), 2.0, "fail and timeout");
    assert_eq!(value("muster_tasks_dead_total"), 2.0, "fail and timeout");
}

/// Issue 41 (memory per queued task): a task's hash leaves out its priority,
/// attempts and backoff while they hold their defaults (0, 3, 1 s, 300 s),
/// and every reader takes a missing one as that default: the task's read,
/// its claim, a failure's backoff and its attempts left. A task with other
/// values keeps and obeys them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_settings_are_left_out_of_the_hash_and_read_as_defaults() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let plain = submit(&a, "dflt", json!({"payload": 1})).await;
    let own = submit(
        &a,
        "dflt",
        json!({"payload": 2, "priority": 5, "max_attempts": 2, "backoff_base_ms": 10, "backoff_cap_ms": 20}),
    )
    .await;
    let mut conn = redis.conn().await;
    let settings = ["priority", "max_attempts", "backoff_base", "backoff_cap"];
    let fields = |id: &str| format!("{}:task:{id}", task_tag("muster", id));
    let names: Vec<String> = redis::cmd("HKEYS")
        .arg(fields(&plain))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        settings.iter().all(|f| !names.contains(&f.to_string())),
        "defaults left out: {names:?}"
    );
    let kept: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(fields(&own))
        .arg(&settings[..])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        kept,
        ["5", "2", "10", "20"].map(|v| Some(v.to_string())).to_vec(),
        "other values kept"
    );
    let t = a.api().task(&plain).await.unwrap();
    assert_eq!((t.priority, t.max_attempts), (0, 3), "read as the defaults");
    // The higher priority first, each claim with its own settings.
    let got = claim_tasks(&a, "dflt", "w", 2, 0).await;
    let got: Vec<(&str, i32, u32)> = got
        .iter()
        .map(|c| (c.id.as_str(), c.priority, c.max_attempts))
        .collect();
    assert_eq!(got, vec![(own.as_str(), 5, 2), (plain.as_str(), 0, 3)]);
    // A failure waits out its backoff: half to all of 1 s for the default,
    // of 10 ms for the other.
    async fn redis_ms(conn: &mut (impl redis::aio::ConnectionLike + Send)) -> i64 {
        let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
        s * 1000 + us / 1000
    }
    for (id, lo, hi) in [(&plain, 500, 1000), (&own, 5, 10)] {
        let tok = a.api().task(id).await.unwrap().token.unwrap();
        let before = redis_ms(&mut conn).await;
        let (s, b) = a
            .post(
                &format!("/api/v1/tasks/{id}/fail"),
                json!({"token": tok, "error": "once"}),
            )
            .await;
        let after = redis_ms(&mut conn).await;
        assert_eq!((s, &b["state"]), (200, &json!("delayed")), "{b}");
        let at = b["retry_at"].as_i64().unwrap();
        assert!(
            at >= before + lo && at <= after + hi,
            "{id}: retry at {} ms after the call, backoff {lo} to {hi} ms",
            at - before
        );
    }
    // The task with two attempts is dead after its second failure.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let again = claim_tasks(&a, "dflt", "w", 1, 0).await;
    assert_eq!(
        again.first().map(|c| (c.id.as_str(), c.attempt)),
        Some((own.as_str(), 2))
    );
    let (s, b) = a
        .post(
            &format!("/api/v1/tasks/{own}/fail"),
            json!({"token": again[0].token, "error": "twice"}),
        )
        .await;
    assert_eq!((s, &b["state"]), (200, &json!("dead")), "{b}");
}

/// Issue 41 (memory per queued task): a payload over 64 bytes is kept in
/// parts of at most 64 bytes, cut between UTF-8 characters, so the task's
/// hash stays a listpack (Redis's `hash-max-listpack-value`). Whatever the
/// length and characters, the task's reads and its claim hand back exactly
/// the payload sent, from a submit, a batch, a workflow and a schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_payloads_are_kept_in_parts_and_read_back_whole() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    // Texts whose 64-byte cuts fall inside two-, three- and four-byte characters.
    let texts: Vec<String> = vec![
        "x".repeat(79),
        "é".repeat(100),
        format!("a{}", "€".repeat(70)),
        format!("ab{}", "😀".repeat(60)),
        "y".repeat(62),
        "z".repeat(63),
        // Four parts, read with the claim's first read, and five, one more read.
        "u".repeat(250),
        "t".repeat(300),
        "q".repeat(2040),
        // 2 045 bytes of three-byte characters: parts of 63 bytes, 33 of them.
        "€".repeat(681),
        "r".repeat(2046),
        "s".repeat(5000),
    ];
    let mut sent: std::collections::HashMap<String, Value> = Default::default();
    for t in &texts {
        let payload = json!(t);
        let id = submit(&a, "parts", json!({"payload": payload})).await;
        sent.insert(id, payload);
    }
    let batch: Vec<Value> = texts.iter().map(|t| json!({"payload": {"t": t, "n": 1.5}})).collect();
    let (s, b) = a
        .post("/api/v1/queues/parts/tasks/batch", json!({"tasks": batch}))
        .await;
    assert_eq!(s, 200, "{b}");
    let b: BatchResponse = serde_json::from_value(b).unwrap();
    for (r, t) in b.results.into_iter().zip(&texts) {
        sent.insert(r.id.unwrap(), json!({"t": t, "n": 1.5}));
    }
    // The hash of a task with a 90-byte payload is a listpack.
    let ninety = submit(&a, "parts", json!({"payload": {"data": "x".repeat(79)}})).await;
    sent.insert(ninety.clone(), json!({"data": "x".repeat(79)}));
    let mut conn = redis.conn().await;
    let key = format!("{}:task:{ninety}", task_tag("muster", &ninety));
    let encoding: String = redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(encoding, "listpack", "a 90-byte payload keeps the hash compact");
    for (id, payload) in &sent {
        let t = a.api().task(id).await.unwrap();
        assert_eq!(&t.payload, payload, "read back: {id}");
    }
    let mut claimed = 0;
    while claimed < sent.len() {
        let got = claim_tasks(&a, "parts", "w", 100, 0).await;
        assert!(!got.is_empty(), "{claimed} of {} claimed", sent.len());
        for t in got {
            assert_eq!(&t.payload, &sent[&t.id], "claimed: {t:?}");
            claimed += 1;
        }
    }
    // A workflow's task and a schedule's task.
    let long = json!({"w": "é".repeat(80)});
    let (s, b) = a
        .post(
            "/api/v1/workflows",
            json!({"tasks": [{"key": "a", "queue": "parts-wf", "payload": long}]}),
        )
        .await;
    assert_eq!(s, 201, "{b}");
    let got = claim_tasks(&a, "parts-wf", "w", 1, 0).await;
    assert_eq!(got[0].payload, long);
    let (s, b) = a
        .post(
            "/api/v1/schedules",
            json!({"id": "parts-s", "expression": "0 0 1 1 *", "queue": "parts-s",
                   "task": {"payload": long}}),
        )
        .await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = a.post("/api/v1/schedules/parts-s/trigger", json!({})).await;
    assert!(s == 200 || s == 201, "{s} {b}");
    let got = claim_tasks(&a, "parts-s", "w", 1, 0).await;
    assert_eq!(got[0].payload, long);
}

/// A task whose settings all hold their defaults goes to enqueue.lua in a
/// short form (its id and payload only). Each setting of its own, alone,
/// still reaches the task: in a single submit, and in a batch between two
/// plain tasks, which keep their defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_setting_alone_reaches_its_task_among_plain_ones() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let (s, b) = a.put("/api/v1/limits/lim-one", json!({"concurrency": 2})).await;
    assert!(s == 200 || s == 201, "{s} {b}");
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let far = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 600_000) as i64;
    // (the setting, the task's field that shows it, its value there); a
    // field starting with `=` is read from the task's hash in Redis.
    let cases: Vec<(Value, &str, Value)> = vec![
        (json!({"priority": 5}), "priority", json!(5)),
        (json!({"max_attempts": 7}), "max_attempts", json!(7)),
        (json!({"timeout_ms": 60000}), "timeout_ms", json!(60000)),
        (json!({"group": "gx"}), "group", json!("gx")),
        (json!({"alias": "al"}), "alias", json!("al")),
        (json!({"idempotency_key": "ik"}), "idempotency_key", json!("ik")),
        (json!({"delay_ms": 60000}), "state", json!("delayed")),
        (json!({"run_at": far}), "run_at", json!(far)),
        (
            json!({"traceparent": tp, "tracestate": "k=v"}),
            "traceparent",
            json!(tp),
        ),
        (json!({"limits": ["lim-one"]}), "limits", json!(["lim-one"])),
        (
            json!({"debounce": {"key": "dk", "ms": 60000}}),
            "state",
            json!("delayed"),
        ),
        (json!({"backoff_base_ms": 2000}), "=backoff_base", json!("2000")),
        (json!({"backoff_cap_ms": 9000}), "=backoff_cap", json!("9000")),
    ];
    let shown = |id: String, field: &'static str| {
        let (a, redis) = (&a, &redis);
        async move {
            if let Some(f) = field.strip_prefix('=') {
                let key = format!("{}:task:{id}", task_tag("muster", &id));
                let v: Option<String> = redis.cmd(&["HGET", &key, f]).await;
                return json!(v);
            }
            let (s, t) = a.get(&format!("/api/v1/tasks/{id}")).await;
            assert_eq!(s, 200, "{t}");
            t[field].clone()
        }
    };
    let plain_ok = |t: &Value| {
        t["state"] == "queued"
            && t["priority"] == 0
            && t["max_attempts"] == 3
            && t["timeout_ms"] == 0
            && t["group"].is_null()
            && t["alias"].is_null()
            && t["limits"].is_null()
            && t["traceparent"].is_null()
    };
    for (i, (setting, field, want)) in cases.into_iter().enumerate() {
        // Alone, in a single submit (names made unique per submission).
        let mut one = setting.clone();
        one["payload"] = json!({"case": i});
        for name in ["alias", "idempotency_key", "group"] {
            if let Some(v) = one.get(name).and_then(Value::as_str) {
                one[name] = json!(format!("{v}-1"));
            }
        }
        if let Some(d) = one.get_mut("debounce") {
            d["key"] = json!("dk-1");
        }
        let id = submit(&a, "short-one", one.clone()).await;
        let got = shown(id, field).await;
        let want_one = match field {
            "alias" | "idempotency_key" | "group" => json!(format!("{}-1", want.as_str().unwrap())),
            _ => want.clone(),
        };
        assert_eq!(got, want_one, "single submit of {setting}");
        // Between two plain tasks in a batch.
        let mut mid = setting.clone();
        mid["payload"] = json!({"case": i});
        let (s, b) = a
            .post(
                "/api/v1/queues/short-batch/tasks/batch",
                json!({"tasks": [{"payload": 1}, mid, {"payload": 2}]}),
            )
            .await;
        assert!(s == 200 || s == 201, "{s} {b}");
        let r: BatchResponse = serde_json::from_value(b).unwrap();
        let ids: Vec<String> = r.results.iter().map(|x| x.id.clone().unwrap()).collect();
        assert_eq!(
            shown(ids[1].clone(), field).await,
            want,
            "{setting} between plain tasks"
        );
        for plain in [&ids[0], &ids[2]] {
            let (_, t) = a.get(&format!("/api/v1/tasks/{plain}")).await;
            assert!(plain_ok(&t), "a plain task beside {setting}: {t}");
            assert_eq!(shown(plain.clone(), "=backoff_base").await, Value::Null);
        }
    }
}
