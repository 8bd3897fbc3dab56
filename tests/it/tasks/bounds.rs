//! What the task store refuses, and what it bounds: how far ahead a task may
//! be due, how deep a listing may go, how many queues exist, which names can
//! be addressed, what a group PUT must say, and what a long poll leaves
//! behind when its client goes away. Each refusal is a 4xx problem+json that
//! says what to send, and changes nothing.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use muster::client::{BatchResponse, TaskSpec};

use super::{claim, claim_tasks, complete_task, join, submit};
use crate::common::*;

/// One year (366 days), the bound of `delay_ms` and of `run_at` - Redis time.
const YEAR_MS: i64 = 366 * 24 * 3600 * 1000;

/// Redis time, ms.
async fn redis_now_ms(redis: &TestRedis) -> i64 {
    let t: Vec<String> = redis.cmd(&["TIME"]).await;
    t[0].parse::<i64>().unwrap() * 1000 + t[1].parse::<i64>().unwrap() / 1000
}

/// Sends a request; returns the status, the Content-Type and the JSON body.
async fn send_typed(req: reqwest::RequestBuilder) -> (u16, String, Value) {
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = resp.text().await.unwrap_or_default();
    (status, ctype, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Asserts a 400 problem+json whose detail contains every one of `words`.
#[track_caller]
fn assert_problem(got: &(u16, String, Value), words: &[&str], what: &str) {
    let (status, ctype, body) = got;
    assert_eq!(*status, 400, "{what}: {body}");
    assert!(ctype.starts_with("application/problem+json"), "{what}: {ctype}");
    let detail = as_problem(*status, body).detail;
    for w in words {
        assert!(detail.contains(w), "{what}: the detail should mention {w:?}: {detail}");
    }
}

/// Keys of task state in the namespace (tasks, queues, idempotency keys, aliases).
async fn task_keys(redis: &TestRedis) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for tag in shard_tags("muster") {
        for pat in ["task:*", "q:*", "idem:*", "alias:*", "queues"] {
            keys.extend(redis.cmd::<Vec<String>>(&["KEYS", &format!("{tag}:{pat}")]).await);
        }
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_at_more_than_a_year_ahead_is_refused_and_creates_nothing() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let now = redis_now_ms(&redis).await;
    let path = "/api/v1/queues/runat/tasks";
    // Beyond 2^53 (i64::MAX used to be stored as -2^63 and run at once), and
    // beyond a year after Redis time (refused by the script, which knows it).
    let far: Vec<(Value, &[&str])> = vec![
        (json!(i64::MAX), &["run_at", "one year"]),
        (json!(9_007_199_254_740_993_i64), &["run_at", "one year"]),
        (json!(1_000_000_000_000_000_000_i64), &["run_at", "one year"]),
        (json!(now + YEAR_MS + 60_000), &["run_at", "one year", "Redis time"]),
        (json!(-1), &["run_at"]),
    ];
    for (run_at, words) in &far {
        let body = json!({"payload": {}, "run_at": run_at, "idempotency_key": format!("k{run_at}"), "alias": "al"});
        let got = send_typed(a.request(Method::POST, path).json(&body)).await;
        assert_problem(&got, words, &format!("run_at {run_at}"));
        let (s, b) = a.post(&format!("{path}/batch"), json!({"tasks": [body]})).await;
        assert_eq!(s, 200, "{b}");
        let r = &serde_json::from_value::<BatchResponse>(b).unwrap().results[0];
        assert_eq!((r.status.as_str(), r.code), ("error", Some(400)), "{r:?}");
    }
    assert_eq!(task_keys(&redis).await, Vec::<String>::new(), "nothing was created");
    let q = a.api().queues().await.unwrap();
    assert!(q.is_empty(), "no queue was registered: {q:?}");
    // Within the year: delayed until then, not run now.
    let ok = now + YEAR_MS - 60_000;
    let id = submit(&a, "runat", json!({"run_at": ok})).await;
    let t = a.api().task(&id).await.unwrap();
    assert_eq!((t.state.as_str(), t.run_at), ("delayed", Some(ok)), "{t:?}");
    join(&a, "w").await;
    assert!(
        claim(&a, "runat", "w", 1, 0).await.is_empty(),
        "a far-future task is not claimable now"
    );
}

/// Sends one HTTP/1.1 request exactly as written (no client normalises its
/// path); returns the status and the JSON body.
async fn raw_request(app: &TestApp, method: &str, path: &str, body: &str) -> (u16, String, Value) {
    let mut s = tokio::net::TcpStream::connect(app.url.trim_start_matches("http://"))
        .await
        .unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let ctype = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type: "))
        .unwrap_or("")
        .to_string();
    (status, ctype, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_and_dot_dot_are_not_names() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    // As path segments (sent as-is: an ordinary client would drop them).
    let paths = [
        ("POST", "/api/v1/queues/./tasks", "{}", "`queue`"),
        ("POST", "/api/v1/queues/../claim", r#"{"node":"w"}"#, "`queue`"),
        (
            "PUT",
            "/api/v1/barriers/..",
            r#"{"participants":["w"],"timeout_ms":1000}"#,
            "`name`",
        ),
        (
            "POST",
            "/api/v1/locks/./acquire",
            r#"{"owner":"o","ttl_ms":1000}"#,
            "`name`",
        ),
        ("PUT", "/api/v1/groups/..", r#"{"limit":1}"#, "`group`"),
        ("PUT", "/api/v1/nodes/./heartbeat", "{}", "`id`"),
        ("GET", "/api/v1/schedules/..", "", "`id`"),
        ("GET", "/api/v1/aliases/.", "", "`alias`"),
    ];
    for (method, path, body, field) in paths {
        let got = raw_request(&a, method, path, body).await;
        assert_problem(
            &got,
            &[field, "cannot be", "path segments"],
            &format!("{method} {path}"),
        );
    }
    // As names in a body, which become path segments later.
    let bodies = [
        ("/api/v1/queues/ok/tasks", json!({"group": "."}), "`group`"),
        ("/api/v1/queues/ok/tasks", json!({"alias": ".."}), "`alias`"),
        ("/api/v1/queues/ok/claim", json!({"node": ".."}), "`node`"),
        (
            "/api/v1/workflows",
            json!({"tasks": [{"key": "a", "queue": "."}]}),
            "`queue`",
        ),
    ];
    for (path, body, field) in bodies {
        let got = send_typed(a.request(Method::POST, path).json(&body)).await;
        assert_problem(&got, &[field, "cannot be"], &format!("{path} {body}"));
    }
    assert_eq!(task_keys(&redis).await, Vec::<String>::new(), "nothing was created");
    let n = a.api().nodes().await.unwrap();
    assert!(!n.iter().any(|n| n.id == "."), "no node `.`: {n:?}");
    // Names that only contain dots among other characters are fine.
    submit(&a, "...", json!({"group": ".a"})).await;
    submit(&a, "a..b", json!({})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_put_needs_a_body_to_remove_a_limit() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let path = "/api/v1/groups/g1";
    a.api().set_group_limit("g1", Some(2)).await.unwrap();
    let limit = || async {
        let g = a.api().groups().await.unwrap();
        g.into_iter().find(|g| g.name == "g1").and_then(|g| g.limit)
    };
    let refused = [
        ("no body", a.request(Method::PUT, path)),
        (
            "an empty JSON body",
            a.request(Method::PUT, path).header("content-type", "application/json"),
        ),
        ("null", a.request(Method::PUT, path).json(&Value::Null)),
        ("{}", a.request(Method::PUT, path).json(&json!({}))),
        ("a string", a.request(Method::PUT, path).json(&json!({"limit": "3"}))),
    ];
    for (what, req) in refused {
        let got = send_typed(req).await;
        assert_problem(&got, &[r#"{"limit": null}"#, "to remove it"], what);
        assert_eq!(limit().await, Some(2), "{what} changed nothing");
    }
    // Raw: an explicit `null` (what the typed call sends for None too).
    let (s, b) = a.put(path, json!({"limit": null})).await;
    assert_eq!(s, 200, "{b}");
    let g: muster::client::GroupInfo = serde_json::from_value(b).unwrap();
    assert_eq!(g.limit, None, "{g:?}");
    assert_eq!(limit().await, None, "an explicit null removes the limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_abandoned_mid_wait_leave_no_waiter_behind() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let wakers = &a.state().bus.wakers;
    assert_eq!(wakers.waiting_queues(), 0);
    // 200 long polls on made-up queue names, each on its own connection...
    let mut conns = Vec::new();
    for i in 0..200 {
        let mut s = tokio::net::TcpStream::connect(a.url.trim_start_matches("http://"))
            .await
            .unwrap();
        let body = r#"{"node":"w","wait_ms":30000}"#;
        let req = format!(
            "POST /api/v1/queues/made-up-{i}/claim HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        conns.push(s);
    }
    let all_waiting = wait_until(Duration::from_secs(10), || async { wakers.waiting_queues() == 200 }).await;
    assert!(all_waiting, "{} queues waiting", wakers.waiting_queues());
    assert!(
        a.page("/metrics").await.contains("muster_claim_waiting_queues"),
        "the map's size is a metric"
    );
    // ...whose clients all go away long before wait_ms.
    drop(conns);
    let forgotten = wait_until(Duration::from_secs(5), || async { wakers.waiting_queues() == 0 }).await;
    assert!(forgotten, "{} queues still have a waiter", wakers.waiting_queues());
    // A claim that answers normally leaves nothing either.
    assert!(claim(&a, "made-up-0", "w", 1, 50).await.is_empty());
    assert_eq!(wakers.waiting_queues(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_answered_even_when_its_queue_could_not_be_created_now() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| c.tasks.max_queues = 1).await;
    join(&a, "w").await;
    let keyed = TaskSpec {
        idempotency_key: Some("K".into()),
        ..Default::default()
    };
    let first = a.api().submit("q1", &keyed).await.unwrap();
    assert!(!first.replayed, "{first:?}");
    // The task finishes and is discarded; its queue is forgotten...
    let got = claim_tasks(&a, "q1", "w", 1, 0).await;
    let id = first.id.as_str();
    assert_eq!(got[0].id, id);
    complete_task(&a, &got[0]).await;
    a.api().delete_task(id).await.unwrap();
    let forgotten = wait_until(Duration::from_secs(10), || async {
        a.api().queues().await.unwrap().is_empty()
    })
    .await;
    assert!(forgotten, "q1 is forgotten");
    // ...and another queue takes the only place (max_queues is per shard
    // when split: q2 in q1's shard).
    submit(&a, &name_like("muster", "q2", "q1"), json!({})).await;
    // The key is still within its window: the same task, not a 409.
    let b = a.api().submit("q1", &keyed).await.unwrap();
    assert_eq!((&b.id, b.replayed), (&first.id, true), "{b:?}");
    // Raw: the second task without an idempotency key (the client would add one).
    let (s, b) = a
        .post(
            "/api/v1/queues/q1/tasks/batch",
            json!({"tasks": [{"idempotency_key": "K"}, {}]}),
        )
        .await;
    assert_eq!(s, 200);
    let r = serde_json::from_value::<BatchResponse>(b).unwrap().results;
    assert_eq!(r[0].status, "replayed", "{r:?}");
    assert_eq!(r[0].id.as_ref(), Some(&first.id), "{r:?}");
    assert_eq!(r[1].code, Some(409), "a new task still needs room: {r:?}");
    let q = a.api().queues().await.unwrap();
    assert_eq!(q.len(), 1, "{q:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_index_is_trimmed_when_no_queue_is_left() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| {
        c.tasks.max_queues = 2;
        c.tasks.retention_ms = 300;
        c.tasks.dead_retention_ms = 1500;
    })
    .await;
    join(&a, "w").await;
    // A dead task whose queue is not registered: a workflow successor refused
    // for max_queues (the other way, a queue forgotten in the same pass that
    // trimmed the task from it, is a race of a few milliseconds).
    // Raw: a workflow start through the client carries an idempotency key,
    // which this test's "no task state is left" would then count.
    let (s, w) = a
        .post(
            "/api/v1/workflows",
            json!({"tasks": [
                {"key": "a", "queue": "wa"},
                {"key": "b", "queue": "wb", "depends_on": ["a"]}
            ]}),
        )
        .await;
    assert_eq!(s, 201, "{w}");
    let w: muster::client::CreatedWorkflow = serde_json::from_value(w).unwrap();
    // max_queues is per shard when split: "other" in the workflow's shard
    // (its id names it), so that wb finds no room there.
    let wid = w.id.as_str();
    let other = name_in_shard("muster", "other", shard_map("muster").home(wid));
    submit(&a, &other, json!({})).await;
    for q in ["wa", other.as_str()] {
        let got = claim_tasks(&a, q, "w", 1, 0).await;
        complete_task(&a, &got[0]).await;
    }
    let dead = a.api().dead().await.unwrap();
    assert_eq!(dead.total, 1, "{dead:?}");
    // Every queue is forgotten after retention; the dead index still empties.
    let no_queues = wait_until(Duration::from_secs(10), || async {
        let mut n = 0;
        for k in shard_keys("muster", "queues") {
            n += redis.cmd::<i64>(&["SCARD", &k]).await;
        }
        n == 0
    })
    .await;
    assert!(no_queues, "the finished queues are forgotten");
    let trimmed = wait_until(Duration::from_secs(10), || async {
        let mut n = 0;
        for k in shard_keys("muster", "dead") {
            n += redis.cmd::<i64>(&["ZCARD", &k]).await;
        }
        n == 0
    })
    .await;
    let dead = a.api().dead().await.unwrap();
    assert!(trimmed, "P:dead still names a task: {dead:?}");
    assert_eq!(task_keys(&redis).await, Vec::<String>::new(), "no task state is left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queued_listing_merges_groups_in_claim_order_down_to_its_depth_bound() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    // 10 100 tasks: plain and in five groups, some with a higher priority.
    let n = 10_100;
    // Claim order holds within a shard when split: groups in deep's.
    let groups: Vec<String> = (0..5).map(|g| name_like("muster", &format!("g{g}"), "deep")).collect();
    let spec = |i: usize| {
        let mut t = json!({"payload": i, "priority": if i.is_multiple_of(3) { 5 } else { 0 }});
        if i % 6 < 5 {
            t["group"] = json!(groups[i % 6]);
        }
        t
    };
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let tasks: Vec<Value> = chunk.iter().map(|&i| spec(i)).collect();
        let (s, b) = a.post("/api/v1/queues/deep/tasks/batch", json!({"tasks": tasks})).await;
        assert_eq!(s, 200);
        let results = serde_json::from_value::<BatchResponse>(b).unwrap().results;
        for (&i, r) in chunk.iter().zip(results) {
            ids.push((i, r.id.unwrap()));
        }
    }
    // Claim order: higher priority first, then submission order, across groups.
    let mut expected = ids.clone();
    expected.sort_by_key(|(i, _)| (!i.is_multiple_of(3), *i));
    let expected: Vec<String> = expected.into_iter().map(|(_, id)| id).collect();
    let page = |cursor: usize, limit: usize| {
        let a = &a;
        async move {
            let cursor = cursor.to_string();
            let p = a.api().tasks("deep", "queued", limit, Some(&cursor)).await.unwrap();
            assert_eq!(p.total, n as u64, "{}", p.total);
            let got: Vec<String> = p.tasks.into_iter().map(|t| t.id).collect();
            (got, p.next_cursor)
        }
    };
    // Paging from the start follows next_cursor.
    let mut cursor = 0;
    while cursor < 300 {
        let (got, next) = page(cursor, 37).await;
        assert_eq!(got, expected[cursor..cursor + 37], "page at {cursor}");
        cursor = next.unwrap().parse().unwrap();
    }
    // Down to the bound, and no further.
    let (got, next) = page(9_990, 50).await;
    assert_eq!(got, expected[9_990..10_040]);
    assert_eq!(next, None, "no cursor beyond 10000 is offered");
    let (got, _) = page(10_000, 100).await;
    assert_eq!(got, expected[10_000..10_100]);
    let deep = "/api/v1/queues/deep/tasks?state=queued&cursor=10001";
    let got = send_typed(a.request(Method::GET, deep)).await;
    assert_problem(&got, &["`cursor`", "at most 10000", "state=queued"], deep);
    let got = send_typed(a.request(Method::GET, "/queues/deep?state=queued&cursor=1000000")).await;
    assert_eq!(got.0, 400, "the dashboard page is bounded too: {}", got.2);
    // Other states page at any depth (one sorted set each); when split, every
    // state pages down to the same bound (each page reads every shard).
    let (s, _) = a.get("/api/v1/queues/deep/tasks?state=dead&cursor=1000000").await;
    assert_eq!(s, if sharded() { 400 } else { 200 });
}
