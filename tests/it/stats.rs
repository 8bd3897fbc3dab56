//! The outcome history behind the dashboard's charts: counted once across
//! nodes, per queue and for all, bounded, and served at `GET /api/v1/stats`.

use std::time::Duration;

use muster::client::{Range, StatsSeries};
use serde_json::{Value, json};

use crate::common::*;
use crate::tasks::completions;
use crate::tasks::{claim_tasks, complete_task, fail_task, join, submit};

/// The (succeeded, failed, dead) totals of a stats answer.
fn totals(h: &StatsSeries) -> (u64, u64, u64) {
    (h.succeeded.iter().sum(), h.failed.iter().sum(), h.dead.iter().sum())
}

/// The sum of one field over every minute key in Redis.
async fn redis_total(redis: &TestRedis, field: &str) -> u64 {
    let mut n = 0;
    for k in redis.keys().await.into_iter().filter(|k| k.contains(":stats:m:")) {
        let v: Option<u64> = redis.cmd(&["HGET", &k, field]).await;
        n += v.unwrap_or(0);
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_count_each_outcome_once() {
    let redis = TestRedis::start();
    let baseline = redis.key_baseline().await;
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let c = TestApp::start(&redis).await;
    join(&a, "w").await;
    // 6 succeed in `ok`; in `bad`, 3 fail once and then succeed, 2 die at
    // their only attempt: 9 succeeded, 5 failed attempts, 2 dead.
    for _ in 0..6 {
        submit(&a, "ok", json!({})).await;
    }
    for _ in 0..3 {
        submit(
            &b,
            "bad",
            json!({"max_attempts": 2, "backoff_base_ms": 1, "backoff_cap_ms": 1}),
        )
        .await;
    }
    for _ in 0..2 {
        submit(&c, "bad", json!({"max_attempts": 1})).await;
    }
    for t in claim_tasks(&a, "ok", "w", 10, 0).await {
        complete_task(&a, &t).await;
    }
    for t in claim_tasks(&a, "bad", "w", 10, 0).await {
        fail_task(&a, &t, "boom").await;
    }
    let mut retried = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while retried.len() < 3 && std::time::Instant::now() < deadline {
        retried.extend(claim_tasks(&a, "bad", "w", 10, 0).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(retried.len(), 3, "the three retries came back");
    for t in &retried {
        complete_task(&a, t).await;
    }

    // Every node counted every outcome; Redis holds each once, not three times.
    let merged = wait_until(Duration::from_secs(20), || async {
        redis_total(&redis, "*:s").await == 9
            && redis_total(&redis, "*:f").await == 5
            && redis_total(&redis, "*:d").await == 2
    })
    .await;
    assert!(
        merged,
        "merged totals s/f/d: {} {} {} (want 9 5 2)",
        redis_total(&redis, "*:s").await,
        redis_total(&redis, "*:f").await,
        redis_total(&redis, "*:d").await
    );
    // Three more flushes by every node change nothing.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        (
            redis_total(&redis, "*:s").await,
            redis_total(&redis, "*:f").await,
            redis_total(&redis, "*:d").await
        ),
        (9, 5, 2)
    );
    assert_eq!(
        (redis_total(&redis, "bad:s").await, redis_total(&redis, "ok:s").await),
        (3, 6)
    );

    // The API, from any node, hour and month, all queues or one.
    for app in [&a, &b, &c] {
        // Raw: no `range` at all (the client always sends one); the default is the hour.
        let (s, h) = app.get("/api/v1/stats").await;
        assert_eq!(s, 200, "{h}");
        let h: StatsSeries = serde_json::from_value(h).unwrap();
        assert_eq!((h.range, h.step_s), (Range::Hour, 60), "{h:?}");
        assert_eq!(h.t.len(), 60);
        assert!(h.t.windows(2).all(|w| w[1] - w[0] == 60), "one point per minute");
        assert_eq!(totals(&h), (9, 5, 2), "{h:?}");
        let m = app.api().stats("month", Some("bad")).await.unwrap();
        assert_eq!((m.step_s, m.queue.as_deref()), (86_400, Some("bad")));
        assert_eq!(m.t.len(), 30);
        assert_eq!(totals(&m), (3, 5, 2), "{m:?}");
    }
    let none = a.api().stats("hour", Some("never-used")).await.unwrap();
    assert_eq!(totals(&none).0, 0);

    // Bad input: a clear 400, nothing written.
    for bad in [
        "/api/v1/stats?range=year",
        "/api/v1/stats?queue=no%20spaces",
        "/api/v1/stats?range=",
    ] {
        let (s, v) = a.get(bad).await;
        assert_eq!(s, 400, "{bad}: {v}");
        assert!(!as_problem(s, &v).detail.is_empty(), "{v}");
    }

    // The pages show the hour's totals, without JavaScript too.
    let page = a.page("/queues/bad").await;
    assert!(
        page.contains(r#"data-chart="rates""#) && page.contains(r#"data-queue="bad""#),
        "{page}"
    );
    assert!(
        page.contains(r#"<span data-total="dead">2</span>"#),
        "the queue page shows its dead"
    );

    // Bounded: the history keys carry their TTLs; all else is back to baseline.
    redis.assert_history_bounded().await;
    for k in redis
        .keys()
        .await
        .into_iter()
        .filter(|k| crate::common::keys::is_history(k))
    {
        let ttl: i64 = redis.cmd(&["PTTL", &k]).await;
        assert!(ttl > 0, "{k} has a TTL");
    }
    let _ = baseline;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_smaller_count_never_lowers_the_history() {
    // Two nodes; the second joins after the first counted: its smaller count
    // for the same minute must not lower (or add to) the first's.
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    for _ in 0..4 {
        submit(&a, "m", json!({})).await;
    }
    let first = claim_tasks(&a, "m", "w", 4, 0).await;
    for t in &first[..3] {
        complete_task(&a, t).await;
    }
    assert!(
        wait_until(Duration::from_secs(15), || async {
            redis_total(&redis, "m:s").await == 3
        })
        .await
    );
    let b = TestApp::start(&redis).await;
    // Let b's bus start before the last outcome.
    tokio::time::sleep(Duration::from_millis(500)).await;
    complete_task(&a, &first[3]).await;
    assert!(
        wait_until(Duration::from_secs(15), || async {
            redis_total(&redis, "m:s").await == 4
        })
        .await
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    // b counted 1 for a minute a counted 4 in (or 3 and 1 across a minute
    // boundary): the merged total stays 4 either way.
    assert_eq!(redis_total(&redis, "m:s").await, 4);
    // (The history is in shard 0 when split.)
    let days: Vec<String> = redis
        .cmd(&["KEYS", &format!("{}:stats:d:*", shard_tag("muster", 0))])
        .await;
    let mut day_total = 0;
    for d in &days {
        let v: Option<u64> = redis.cmd(&["HGET", d, "m:s"]).await;
        day_total += v.unwrap_or(0);
    }
    assert_eq!(day_total, 4, "the day is the sum of its merged minutes");
    let h = b.api().stats("hour", Some("m")).await.unwrap();
    assert_eq!(totals(&h).0, 4, "{h:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_sent_again_changes_nothing() {
    // A flush whose answer was lost is sent again by the next tick (its
    // fields still look grown to the node): the max-merge makes that
    // harmless, and a day grows only by what its minute grew.
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    // One real flush loads the script's function (loaded on first use).
    let stats = &a.state().stats;
    // An id past every event the node counted (it counts each id once).
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    stats.count(&muster::testing::Event::from_fields(
        format!("{}-0", now_ms + 60_000),
        vec![("type".into(), "task.succeeded".into()), ("queue".into(), "x".into())],
    ));
    stats.flush().await.unwrap();
    let functions: Vec<redis::Value> = redis.cmd(&["FUNCTION", "LIST", "LIBRARYNAME", "stats_flush*"]).await;
    let name = format!("{functions:?}")
        .split('"')
        .find(|s| s.starts_with("stats_flush_"))
        .expect("the flush function is loaded")
        .to_string();
    let tag = shard_tag("muster", 0);
    let m: &'static str = format!("{tag}:stats:m:100").leak();
    let d: &'static str = format!("{tag}:stats:d:0").leak();
    let flush = |v: u64| {
        let (redis, name) = (&redis, name.clone());
        async move {
            let v = v.to_string();
            let grew: i64 = redis
                .cmd(&[
                    "FCALL",
                    &name,
                    "2",
                    m,
                    d,
                    "7200000",
                    "2764800000",
                    "1",
                    "q:s",
                    &v,
                    "99999999999999",
                ])
                .await;
            grew
        }
    };
    let read = |k: &'static str| {
        let redis = &redis;
        async move { redis.cmd::<Option<u64>>(&["HGET", k, "q:s"]).await.unwrap_or(0) }
    };
    assert_eq!(flush(5).await, 1);
    assert_eq!(flush(5).await, 0, "sent again: nothing grew");
    assert_eq!((read(m).await, read(d).await), (5, 5));
    assert_eq!(flush(7).await, 1);
    assert_eq!((read(m).await, read(d).await), (7, 7), "the day grew by 2, not 7");
    assert_eq!(
        flush(3).await,
        0,
        "a smaller count (a node that joined late) lowers nothing"
    );
    assert_eq!((read(m).await, read(d).await), (7, 7));
    let ttl: i64 = redis.cmd(&["PTTL", m]).await;
    assert!((1..=7_200_000).contains(&ttl), "{ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lags_its_bus_still_counts_every_outcome() {
    // With a bus of 8 events, a burst of completions leaves the history's
    // receiver behind (`Lagged`); it must recount what it skipped from the
    // stream, and count nothing twice.
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| c.events.client_buffer = 8).await;
    join(&a, "w").await;
    let n = 3000;
    for chunk in 0..n / 1000 {
        let tasks: Vec<Value> = (0..1000).map(|i| json!({"payload": chunk * 1000 + i})).collect();
        let (s, v) = a.post("/api/v1/queues/lag/tasks/batch", json!({"tasks": tasks})).await;
        assert_eq!(s, 200, "{v}");
    }
    let mut done = 0;
    while done < n {
        let got = claim_tasks(&a, "lag", "w", 500, 0).await;
        assert!(!got.is_empty(), "work remains ({done} done)");
        let items = completions(&got, Value::Null);
        let r = a.api().complete_batch(&items).await;
        assert!(r.is_ok(), "{r:?}");
        done += got.len();
    }
    let exact = wait_until(Duration::from_secs(20), || async {
        redis_total(&redis, "lag:s").await == n as u64
    })
    .await;
    assert!(exact, "counted {} of {n}", redis_total(&redis, "lag:s").await);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(redis_total(&redis, "lag:s").await, n as u64, "nothing counted twice");
}
