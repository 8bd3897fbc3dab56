//! The event stream through a node that lags its subscribers: the client
//! resumes after the last event it yielded and yields every event once, in
//! order.

use std::collections::HashSet;

use muster::client::{EventFrame, EventsOptions};
use tokio_tungstenite::tungstenite::Message;

use super::*;

/// With a bus of 8 events, a burst of a thousand enqueues lags every
/// subscriber (a raw WebSocket beside the client shows the node sending
/// `lagged`); the client's stream still yields each of the 3 000 events
/// exactly once, in stream order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagged_stream_resumes_without_loss_or_duplicates() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| c.events.client_buffer = 8).await;
    let c = client(std::slice::from_ref(&app.url));
    let q = "client-lagged";
    let ws_url = format!(
        "{}/api/v1/events/ws?topics=task.enqueued&queue={q}",
        app.url.replace("http://", "ws://")
    );
    let (mut raw, _) = tokio_tungstenite::connect_async(ws_url).await.unwrap();
    let mut stream = c.events(EventsOptions {
        topics: Some("task.enqueued".into()),
        queue: Some(q.into()),
        since: Some("0".into()),
    });
    let mut submitted = HashSet::new();
    for round in 0..3 {
        let specs: Vec<TaskSpec> = (0..1000).map(|i| spec(json!([round, i]), 0)).collect();
        for item in c.submit_batch(q, &specs).await.unwrap() {
            submitted.insert(item.id.expect("submitted"));
        }
    }
    // The node lags a subscriber this far behind.
    let mut lagged = false;
    while let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_secs(10), raw.next()).await {
        if let Message::Text(t) = m
            && t.contains("\"lagged\"")
        {
            lagged = true;
            break;
        }
    }
    assert!(
        lagged,
        "the node never lagged the raw subscriber: the test proves nothing"
    );
    let mut seen = HashSet::new();
    let mut last = String::new();
    while seen.len() < submitted.len() {
        let frame = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .unwrap_or_else(|_| panic!("stalled after {} of {} events", seen.len(), submitted.len()));
        match frame {
            Some(Ok(EventFrame::Event(e))) => {
                // A cursor (one stream id per shard) when split: it never
                // goes back in any shard and moves on in at least one.
                let parts = |id: &str| -> Vec<(u64, u64)> {
                    id.split(',')
                        .map(|p| {
                            let (ms, seq) = p.split_once('-').unwrap();
                            (ms.parse().unwrap(), seq.parse().unwrap())
                        })
                        .collect()
                };
                if !last.is_empty() {
                    let (now, before) = (parts(&e.id), parts(&last));
                    assert!(
                        now.len() == before.len() && now.iter().zip(&before).all(|(a, b)| a >= b) && now != before,
                        "out of order: {} after {last}",
                        e.id
                    );
                }
                last = e.id.clone();
                let task = e.subject("task").unwrap().to_string();
                assert!(submitted.contains(&task), "an event of another task: {e:?}");
                assert!(seen.insert(task), "a duplicate: {e:?}");
            }
            other => panic!("unexpected: {other:?}"),
        }
    }
}
