//! Bulk actions on dead letters (`POST /api/v1/dead/retry|discard`, the
//! dashboard's "Retry all" / "Discard all"): every dead task of a queue, or
//! of all queues when said explicitly, handled oldest first in bounded pages
//! of 500 per script call; other queues untouched; bad requests refused.

use futures_util::future::join_all;
use serde_json::{Value, json};

use crate::common::*;
use crate::tasks::{claim, join};

/// `n` dead tasks in `queue`: submitted in batches, claimed, failed without
/// retry, eight at a time.
pub async fn make_dead(app: &TestApp, queue: &str, n: usize) {
    join(app, "bulk-w").await;
    let mut left = n;
    while left > 0 {
        let k = left.min(1000);
        let tasks: Vec<Value> = (0..k).map(|i| json!({"payload": i, "max_attempts": 1})).collect();
        let (s, b) = app
            .post(&format!("/api/v1/queues/{queue}/tasks/batch"), json!({"tasks": tasks}))
            .await;
        assert_eq!(s, 200, "{b}");
        let claimed = claim(app, queue, "bulk-w", k as u32, 0).await;
        assert_eq!(claimed.len(), k);
        for chunk in claimed.chunks(8) {
            let fails = chunk.iter().map(|t| async move {
                let path = format!("/api/v1/tasks/{}/fail", t["id"].as_str().unwrap());
                app.post(&path, json!({"token": t["token"], "error": "boom", "retry": false}))
                    .await
            });
            for (s, b) in join_all(fails).await {
                assert_eq!(s, 200, "{b}");
            }
        }
        left -= k;
    }
}

async fn dead_count(app: &TestApp, queue: &str) -> u64 {
    let (s, b) = app.get(&format!("/api/v1/queues/{queue}")).await;
    assert_eq!(s, 200, "{b}");
    b["dead"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_retried_and_discarded_in_bulk_page_by_page() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    make_dead(&app, "bulk-a", 1200).await;
    make_dead(&app, "bulk-b", 3).await;
    assert_eq!(dead_count(&app, "bulk-a").await, 1200);

    // Bad requests change nothing.
    for body in [
        json!({}),
        json!({"queue": "bulk-a", "all_queues": true}),
        json!({"queue": "bad name"}),
        json!({"queue": "**"}),
        json!({"queue": "bulk-a", "limit": 0}),
        json!({"queue": "bulk-a", "nope": 1}),
    ] {
        let (s, b) = app.post("/api/v1/dead/retry", body.clone()).await;
        assert_eq!(s, 400, "{body}: {b}");
        assert!(b["detail"].is_string(), "{b}");
    }
    let s = app
        .request(reqwest::Method::POST, "/api/v1/dead/discard")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(s, 415, "no body acts on nothing");
    assert_eq!(dead_count(&app, "bulk-a").await, 1200);

    // One queue's dead letters, in three pages; the other queue untouched.
    let (s, b) = app.post("/api/v1/dead/retry", json!({"queue": "bulk-a"})).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(without_pages(b, 3), json!({"done": 1200, "left": 0, "refused": 0}));
    assert_eq!(dead_count(&app, "bulk-a").await, 0);
    assert_eq!(dead_count(&app, "bulk-b").await, 3);
    let (_, q) = app.get("/api/v1/queues/bulk-a").await;
    assert_eq!(q["queued"], 1200, "{q}");
    // A retried task starts again with a fresh set of attempts.
    let t = claim(&app, "bulk-a", "bulk-w", 1, 0).await.pop().unwrap();
    assert_eq!(t["attempt"], 1, "{t}");

    // Every queue's, up to a limit, oldest first.
    let (s, b) = app
        .post("/api/v1/dead/discard", json!({"queue": "*", "limit": 2}))
        .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(without_pages(b, 1), json!({"done": 2, "left": 1, "refused": 0}));
    let (s, b) = app.post("/api/v1/dead/discard", json!({"queue": "*"})).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["done"], 1);
    assert_eq!(dead_count(&app, "bulk-b").await, 0);
    let (_, dead) = app.get("/api/v1/dead").await;
    assert_eq!(dead["total"], 0, "{dead}");
}

/// A bulk outcome without its page count, after checking the count: one
/// shard takes `one_shard_pages`; a split namespace (`MUSTER_TEST_SHARDS`)
/// visits every shard, with at least one script call each.
fn without_pages(mut b: serde_json::Value, one_shard_pages: u64) -> serde_json::Value {
    let pages = b["pages"].as_u64().expect("pages");
    let extra = u64::from(test_shards()) - 1;
    assert!(
        (one_shard_pages..=one_shard_pages + extra).contains(&pages),
        "{pages} pages: {one_shard_pages}, plus at most one per other shard"
    );
    b.as_object_mut().unwrap().remove("pages");
    b
}
