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

/// `event_frames` hands over the node's frames as sent: an enqueue's event
/// text names its task; a token the node refuses is the node's 401 problem,
/// not a stream that stays silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_frames_are_the_nodes_text_and_a_refusal_is_a_problem() {
    use futures_util::StreamExt;
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| {
        c.auth.tokens = role_tokens("frames");
    })
    .await;
    let admin = api_client(std::slice::from_ref(&app.url), Some("frames-a".into()));
    let q = "client-frames";
    let opts = EventsOptions {
        topics: Some("task.enqueued".into()),
        queue: Some(q.into()),
        since: None,
    };
    let mut frames = admin.event_frames(&opts).await.unwrap();
    let id = admin.submit(q, &spec(json!("f"), 0)).await.unwrap().id;
    let text = tokio::time::timeout(Duration::from_secs(10), frames.next())
        .await
        .expect("a frame within 10 s")
        .expect("the stream is open")
        .unwrap();
    assert!(text.contains("task.enqueued") && text.contains(&id), "{text}");
    let stranger = api_client(std::slice::from_ref(&app.url), Some("not-a-token".into()));
    match stranger.event_frames(&opts).await {
        Err(muster::client::Error::Api(p)) => assert_eq!(p.status, 401, "{p:?}"),
        Err(e) => panic!("a 401 problem, got {e}"),
        Ok(_) => panic!("a 401 problem, got a stream"),
    }
}
