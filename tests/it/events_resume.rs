//! A Redis blip on one node's connection leaves no gap in that node's event
//! feed: its tailer resumes from the last id it delivered (not from `$`), so
//! a WebSocket subscriber on that node gets every event written while the
//! node was cut off, once each, in stream order, with no `gap` message.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use muster::testing::StreamId;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::common::skip_on_cluster;
use crate::common::*;
use crate::tasks::{submit, submit_many};

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const QUEUE: &str = "blip";

async fn ws(app: &TestApp, query: &str) -> Ws {
    let url = format!("{}/api/v1/events/ws?{query}", app.url.replace("http://", "ws://"));
    let req = url.into_client_request().unwrap();
    let (s, _) = tokio_tungstenite::connect_async(req).await.expect("connects");
    s
}

enum Next {
    Msg(Value),
    /// The server closed the socket (or it failed): what happened.
    Closed(String),
    Quiet,
}

/// The next text message as JSON, within `within`.
async fn next(ws: &mut Ws, within: Duration) -> Next {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => {
                return Next::Msg(serde_json::from_str(&t).expect("events are JSON"));
            }
            Ok(Some(Ok(Message::Close(f)))) => return Next::Closed(format!("close frame {f:?}")),
            Ok(None) => return Next::Closed("end of stream".into()),
            Ok(Some(Err(e))) => return Next::Closed(format!("error {e}")),
            Ok(Some(Ok(_))) => continue,
            Err(_) => return Next::Quiet,
        }
    }
}

/// One subscriber's feed as the test sees it: every message checked, the
/// enqueued tasks of [`QUEUE`] in arrival order, and reconnections (with
/// `since`) when the server closes the socket.
struct Feed {
    ws: Ws,
    query: String,
    last: Option<Vec<StreamId>>,
    last_id: String,
    enqueued: Vec<String>,
    reconnects: Vec<String>,
}

impl Feed {
    /// Reads until `enqueued` holds `n` tasks or `within` passes.
    async fn read_until(&mut self, app: &TestApp, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.enqueued.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match next(&mut self.ws, left).await {
                Next::Msg(m) => self.check(m),
                Next::Closed(why) => {
                    // Not expected (nothing in a live session depends on
                    // Redis), but a client would resume like this.
                    eprintln!(
                        "events_resume: B closed the socket ({why}); reconnecting with since={}",
                        self.last_id
                    );
                    self.reconnects.push(why);
                    assert!(
                        self.reconnects.len() <= 3,
                        "closed again and again: {:?}",
                        self.reconnects
                    );
                    let q = format!("{}&since={}", self.query, self.last_id);
                    self.ws = ws(app, &q).await;
                }
                Next::Quiet => return,
            }
        }
    }

    fn check(&mut self, m: Value) {
        // Only events: a `gap` or `lagged` notice has no `ts` and is no event.
        let ev: muster::client::Event =
            serde_json::from_value(m.clone()).unwrap_or_else(|e| panic!("only events in a node's feed ({e}): {m}"));
        let ty = ev.kind.as_str();
        assert!(ty != "gap" && ty != "lagged", "no {ty} message in a node's feed: {m}");
        let id = ev.id.as_str();
        // A cursor (one stream id per shard) when split: stream order holds
        // within each shard, so no part goes back and one moves on.
        let sid: Vec<StreamId> = id
            .split(',')
            .map(|p| StreamId::parse(p).unwrap_or_else(|| panic!("a stream id: {m}")))
            .collect();
        if let Some(prev) = &self.last {
            assert!(
                sid.len() == prev.len() && sid.iter().zip(prev).all(|(a, b)| a >= b) && sid != *prev,
                "stream order, no repeat: {id} after {}",
                self.last_id
            );
        }
        self.last = Some(sid);
        self.last_id = id.to_string();
        if ty == "task.enqueued" && ev.subject("queue") == Some(QUEUE) {
            self.enqueued.push(ev.subject("task").unwrap().to_string());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_blip_leaves_no_gap_in_a_nodes_feed() {
    if skip_on_cluster("a fault proxy in front of one Redis server") {
        return;
    }
    const N: usize = 50;
    let started = Instant::now();
    let redis = TestRedis::start();
    let proxy = FaultProxy::start(redis.port).await;
    // a writes; b reaches Redis only through the proxy and serves the subscriber.
    let a = TestApp::start(&redis).await;
    let b = TestApp::start_with(&redis, |c| c.redis.url = proxy.url()).await;
    let query = "topics=task.*".to_string();
    let mut feed = Feed {
        ws: ws(&b, &query).await,
        query,
        last: None,
        last_id: String::new(),
        enqueued: Vec::new(),
        reconnects: Vec::new(),
    };

    // Warm-up: events from a reach b's subscriber live.
    let warm = submit_many(&a, QUEUE, 3).await;
    feed.read_until(&b, 3, Duration::from_secs(5)).await;
    assert_eq!(feed.enqueued, warm, "b relays a's events before the blip");

    // The blip: b's connections to Redis (its tailer's included) are cut and
    // refused while a goes on writing.
    proxy.block();
    let blocked_at = Instant::now();
    // The proxy cuts within ~10 ms; write only once b's tailer is surely off.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut during = Vec::with_capacity(N);
    for i in 0..N {
        during.push(submit(&a, QUEUE, json!({"payload": {"i": i}})).await);
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    // (Every shard's stream when split.)
    let mut len = 0;
    for k in shard_keys("muster", "events") {
        len += redis.cmd::<usize>(&["XLEN", &k]).await;
    }
    assert!(len >= 3 + N, "the events are in the stream: {len}");
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(blocked_at.elapsed())).await;
    // Nothing of it reached b while it was cut off (else the blip was no blip).
    match next(&mut feed.ws, Duration::from_millis(100)).await {
        Next::Quiet => {}
        Next::Msg(m) => panic!("b relayed an event while cut off from Redis: {m}"),
        Next::Closed(why) => panic!("b closed the socket during the blip: {why}"),
    }
    proxy.unblock();
    let unblocked_at = Instant::now();

    // Every event of the blip arrives, once, in order, with nothing lost.
    feed.read_until(&b, 3 + N, Duration::from_secs(10)).await;
    let caught_up = unblocked_at.elapsed();
    let got = &feed.enqueued[3..];
    let missing = during.iter().filter(|t| !got.contains(t)).count();
    assert_eq!(
        got,
        &during[..],
        "b's subscriber got {} of the {N} events written during the blip ({missing} missing); \
         did the tailer resume from `$` instead of its last id?",
        got.len()
    );

    // Live relaying goes on after the resume, with no repeat at the seam.
    let after = submit_many(&a, QUEUE, 5).await;
    feed.read_until(&b, 3 + N + 5, Duration::from_secs(5)).await;
    assert_eq!(&feed.enqueued[3 + N..], &after[..], "live after the resume");
    match next(&mut feed.ws, Duration::from_millis(300)).await {
        Next::Quiet => {}
        Next::Msg(m) => feed.check(m),
        Next::Closed(why) => panic!("closed after the resume: {why}"),
    }
    assert_eq!(feed.enqueued.len(), 3 + N + 5, "nothing more, no duplicate");
    eprintln!(
        "events_resume: {N} events written during a {:?} blip reached b's subscriber {:?} after Redis came back; \
         socket {}; whole test {:?}",
        unblocked_at - blocked_at,
        caught_up,
        if feed.reconnects.is_empty() {
            "stayed open (one connection throughout)".to_string()
        } else {
            format!("was closed and resumed with since: {:?}", feed.reconnects)
        },
        started.elapsed()
    );
}
