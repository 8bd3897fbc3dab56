//! Bulk actions on dead letters (`POST /api/v1/dead/retry|discard`, the
//! dashboard's "Retry all" / "Discard all"): every dead task of a queue, or
//! of all queues when said explicitly, handled oldest first in bounded pages
//! of 500 per script call; other queues untouched; bad requests refused.

use futures_util::future::join_all;
use muster::client::{BulkOutcome, ClaimRequest, Fail};
use serde_json::{Value, json};

use crate::common::*;
use crate::tasks::{claim_tasks, join};

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
        // A lease long enough for a thousand fails on a loaded machine: the
        // point here is the dead letters, not the claim lease.
        let req = ClaimRequest {
            node: "bulk-w".into(),
            max: k as u32,
            wait_ms: 0,
            ack_ms: Some(600_000),
        };
        let claimed = app.api().claim(queue, &req).await.unwrap();
        assert_eq!(claimed.len(), k);
        for chunk in claimed.chunks(8) {
            let fails = chunk.iter().map(|t| async move {
                let f = Fail {
                    token: t.token,
                    error: "boom".into(),
                    retry: false,
                    next: None,
                };
                app.api().fail(&t.id, &f).await
            });
            for r in join_all(fails).await {
                assert!(r.is_ok(), "{r:?}");
            }
        }
        left -= k;
    }
}

async fn dead_count(app: &TestApp, queue: &str) -> u64 {
    app.api().queue(queue).await.unwrap().stats.dead
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
        assert!(!as_problem(s, &b).detail.is_empty(), "{b}");
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
    let b = app.api().retry_dead("bulk-a", None).await.unwrap();
    assert_eq!(without_pages(b, 3), (1200, 0, 0));
    assert_eq!(dead_count(&app, "bulk-a").await, 0);
    assert_eq!(dead_count(&app, "bulk-b").await, 3);
    let q = app.api().queue("bulk-a").await.unwrap().stats;
    assert_eq!(q.queued, 1200, "{q:?}");
    // A retried task starts again with a fresh set of attempts.
    let t = claim_tasks(&app, "bulk-a", "bulk-w", 1, 0).await.pop().unwrap();
    assert_eq!(t.attempt, 1, "{t:?}");

    // Every queue's, up to a limit, oldest first.
    let b = app.api().discard_dead("*", Some(2)).await.unwrap();
    assert_eq!(without_pages(b, 1), (2, 1, 0));
    let b = app.api().discard_dead("*", None).await.unwrap();
    assert_eq!(b.done, 1);
    assert_eq!(dead_count(&app, "bulk-b").await, 0);
    let dead = app.api().dead().await.unwrap();
    assert_eq!(dead.total, 0, "{dead:?}");
}

/// A bulk outcome's (done, left, refused), after checking its page count:
/// one shard takes `one_shard_pages`; a split namespace
/// (`MUSTER_TEST_SHARDS`) visits every shard, with at least one script call
/// each.
fn without_pages(b: BulkOutcome, one_shard_pages: u64) -> (u64, u64, u64) {
    let pages = b.pages;
    let extra = u64::from(test_shards()) - 1;
    assert!(
        (one_shard_pages..=one_shard_pages + extra).contains(&pages),
        "{pages} pages: {one_shard_pages}, plus at most one per other shard"
    );
    (b.done, b.left, b.refused)
}
