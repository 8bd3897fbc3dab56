//! The event stream over WebSockets and HTTP (G9): cross-node delivery,
//! resume with `since`, gaps, lagging clients, filters, auth, limits, and
//! the live cache's convergence when events are lost.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::common::*;
use crate::tasks::{join, submit, submit_many};

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws(app: &TestApp, query: &str) -> Ws {
    try_ws(app, query, None).await.expect("connects")
}

async fn try_ws(app: &TestApp, query: &str, bearer: Option<&str>) -> Result<Ws, u16> {
    let url = format!("{}/api/v1/events/ws?{query}", app.url.replace("http://", "ws://"));
    let mut req = url.into_client_request().unwrap();
    if let Some(t) = bearer {
        req.headers_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((s, _)) => Ok(s),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

/// A subscriber whose socket has a tiny receive buffer, so that a client
/// that stops reading is visibly slow (the kernel does not absorb megabytes
/// on its behalf).
async fn slow_ws(app: &TestApp, query: &str) -> Ws {
    let url = format!("{}/api/v1/events/ws?{query}", app.url.replace("http://", "ws://"));
    let addr: std::net::SocketAddr = app.url.trim_start_matches("http://").parse().unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let stream = sock.connect(addr).await.unwrap();
    let req = url.into_client_request().unwrap();
    let (ws, _) = tokio_tungstenite::client_async(req, tokio_tungstenite::MaybeTlsStream::Plain(stream))
        .await
        .unwrap();
    ws
}

/// The next text message as JSON, within `within`.
async fn next(ws: &mut Ws, within: Duration) -> Option<Value> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => return serde_json::from_str(&t).ok(),
            Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) | Err(_) => return None,
            Ok(Some(Ok(_))) => continue,
        }
    }
}

/// Collects messages until `n` arrived or `within` passed.
async fn collect(ws: &mut Ws, n: usize, within: Duration) -> Vec<Value> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match next(ws, left).await {
            Some(v) => out.push(v),
            None => break,
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_caused_on_one_node_reach_a_subscriber_on_another() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let mut sub = ws(&b, "topics=task.*").await;
    let id = submit(&a, "x", json!({"payload": 1})).await;
    let ev = next(&mut sub, Duration::from_secs(5)).await.expect("an event");
    assert_eq!(ev["type"], "task.enqueued");
    assert_eq!(ev["task"], id.as_str());
    assert_eq!(ev["queue"], "x");
    assert_eq!(ev["node"], a.node_id.as_str(), "the acting node");
    assert!(ev["ts"].as_i64().unwrap() > 1_700_000_000_000, "Redis time in ms");
    assert!(
        ev["id"].as_str().unwrap().starts_with(&ev["ts"].to_string()),
        "ts is the stream id's time"
    );
    assert_eq!(ev["data"]["state"], "queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnecting_with_since_misses_nothing_and_repeats_nothing() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let mut sub = ws(&b, "topics=task.enqueued").await;
    let first = submit_many(&a, "r", 30).await;
    let got = collect(&mut sub, 30, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 30);
    // Disconnect after reading 20 of them ... pretend the last 10 were lost.
    let last_seen = got[19]["id"].as_str().unwrap().to_string();
    sub.close(None).await.ok();
    drop(sub);
    // ... while more happen, through the other node.
    let second = submit_many(&a, "r", 25).await;
    let mut sub = ws(&b, &format!("topics=task.enqueued&since={last_seen}")).await;
    let third = submit_many(&b, "r", 5).await;
    let got = collect(&mut sub, 40, Duration::from_secs(5)).await;
    let ids: Vec<&str> = got.iter().map(|e| e["task"].as_str().unwrap()).collect();
    let mut want: Vec<&str> = first[20..].iter().map(String::as_str).collect();
    want.extend(second.iter().map(String::as_str));
    want.extend(third.iter().map(String::as_str));
    assert_eq!(ids, want, "replay then live, no hole and no duplicate at the seam");
    assert!(
        next(&mut sub, Duration::from_millis(300)).await.is_none(),
        "nothing more"
    );
    // The same replay over plain HTTP, in pages.
    let (s, page) = a
        .get(&format!(
            "/api/v1/events?since={last_seen}&topics=task.enqueued&limit=15"
        ))
        .await;
    assert_eq!(s, 200);
    let evs = page["events"].as_array().unwrap();
    assert_eq!(evs.len(), 15);
    assert_eq!(evs[0]["task"], first[20].as_str());
    let (_, page2) = a
        .get(&format!(
            "/api/v1/events?since={}&topics=task.enqueued&limit=100",
            page["next"].as_str().unwrap()
        ))
        .await;
    assert_eq!(page2["events"].as_array().unwrap().len(), 25);
    assert_eq!(page2["gap"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_message_comes_first_when_since_was_trimmed() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| c.events.max_len = 100).await;
    let early = submit(&a, "g", json!({})).await;
    let (_, page) = a.get("/api/v1/events?topics=task.enqueued&limit=1").await;
    let early_id = page["events"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(page["events"][0]["task"], early.as_str());
    // Enough events (in several scripts) to trim the early ones away.
    for _ in 0..6 {
        submit_many(&a, "g", 100).await;
    }
    let mut sub = ws(&a, &format!("topics=task.enqueued&since={early_id}")).await;
    let gap = next(&mut sub, Duration::from_secs(5)).await.unwrap();
    assert_eq!(gap["type"], "gap", "{gap}");
    assert!(!gap["oldest"].as_str().unwrap().is_empty());
    let then = next(&mut sub, Duration::from_secs(5)).await.unwrap();
    assert_eq!(then["type"], "task.enqueued", "then what is retained");
    let (_, page) = a.get(&format!("/api/v1/events?since={early_id}&limit=5")).await;
    assert_eq!(page["gap"], true);
    let len: i64 = redis.cmd(&["XLEN", "{muster}:events"]).await;
    assert!(len < 400, "the stream is trimmed near events.max_len: {len}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_is_lagged_and_closed_without_slowing_others() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| {
        c.events.send_timeout_ms = 1000;
        c.server.socket_send_buffer_bytes = 16 * 1024;
    })
    .await;
    let mut slow = slow_ws(&a, "topics=task.enqueued").await;
    let mut fast = ws(&a, "topics=task.enqueued").await;
    let started = Instant::now();
    let ids = submit_many(&a, "lag", 2000).await;
    let got = collect(&mut fast, 2000, Duration::from_secs(10)).await;
    let fast_took = started.elapsed();
    assert_eq!(got.len(), 2000, "the fast client got everything");
    assert_eq!(got.last().unwrap()["task"], ids[1999].as_str());
    assert!(fast_took < Duration::from_secs(5), "and promptly: {fast_took:?}");
    // The slow one has not read for a while: within send_timeout_ms the node
    // gives up on it.
    let lagged_metric = || async {
        let m = a.page("/metrics").await;
        m.lines()
            .any(|l| l.starts_with("muster_ws_lagged_total ") && !l.ends_with(" 0"))
    };
    assert!(
        wait_until(Duration::from_secs(5), lagged_metric).await,
        "the node marks the slow client lagged"
    );
    // It reads at last: what was buffered, then `lagged`, then close.
    let mut lagged = None;
    let mut seen = 0;
    while let Some(m) = next(&mut slow, Duration::from_secs(5)).await {
        if m["type"] == "lagged" {
            lagged = Some(m);
            break;
        }
        seen += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let lagged = lagged.unwrap_or_else(|| panic!("a lagged message (saw {seen} events)"));
    assert!(seen < 2000, "it did not get everything ({seen})");
    let last_id = lagged["last_id"].as_str().unwrap().to_string();
    assert!(next(&mut slow, Duration::from_secs(3)).await.is_none(), "then closed");
    // It resumes from last_id and gets the rest.
    let mut again = ws(&a, &format!("topics=task.enqueued&since={last_id}")).await;
    let rest = collect(&mut again, 2000 - seen, Duration::from_secs(10)).await;
    assert_eq!(rest.len(), 2000 - seen, "nothing lost across the lag");
    assert_eq!(rest.last().unwrap()["task"], ids[1999].as_str());
    let metrics = a.page("/metrics").await;
    assert!(metrics.contains("muster_events_relayed_total"));
    assert!(metrics.contains("muster_event_relay_lag_seconds"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_and_queue_filters() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let mut nodes_only = ws(&a, "topics=node.*").await;
    let mut one_queue = ws(&a, "topics=task.*&queue=mine").await;
    let mut claimed = ws(&a, "topics=task.claimed").await;
    join(&a, "fw").await;
    let mine = submit(&a, "mine", json!({})).await;
    submit(&a, "other", json!({})).await;
    a.post("/api/v1/queues/other/claim", json!({"node": "fw"})).await;
    let n = next(&mut nodes_only, Duration::from_secs(3)).await.unwrap();
    assert_eq!(n["type"], "node.joined");
    assert_eq!(n["node"], "fw");
    let q = next(&mut one_queue, Duration::from_secs(3)).await.unwrap();
    assert_eq!(q["task"], mine.as_str());
    assert!(
        next(&mut one_queue, Duration::from_millis(500)).await.is_none(),
        "no event of another queue"
    );
    let c = next(&mut claimed, Duration::from_secs(3)).await.unwrap();
    assert_eq!(
        (c["type"].as_str(), c["queue"].as_str()),
        (Some("task.claimed"), Some("other"))
    );
    assert!(
        next(&mut nodes_only, Duration::from_millis(300)).await.is_none(),
        "no task events"
    );
    // Bad filters are refused before the upgrade.
    assert_eq!(try_ws(&a, "topics=ta*sk", None).await.err(), Some(400));
    assert_eq!(try_ws(&a, "queue=bad%20name", None).await.err(), Some(400));
    assert_eq!(try_ws(&a, "since=yesterday", None).await.err(), Some(400));
    assert_eq!(a.get("/api/v1/events?limit=0").await.0, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_need_a_token_and_are_limited_per_node() {
    let redis = TestRedis::start();
    let tokens = vec![muster::config::TokenConfig {
        name: "reader".into(),
        role: muster::config::Role::Read,
        sha256: sha256_hex("s3cret"),
    }];
    let a = TestApp::start_with(&redis, |c| {
        c.auth.tokens = tokens;
        c.events.max_clients = 2;
    })
    .await;
    assert_eq!(try_ws(&a, "", None).await.err(), Some(401));
    assert_eq!(try_ws(&a, "token=wrong", None).await.err(), Some(401));
    let _one = try_ws(&a, "token=s3cret", None).await.expect("query token");
    let _two = try_ws(&a, "", Some("s3cret")).await.expect("bearer token");
    assert_eq!(
        try_ws(&a, "token=s3cret", None).await.err(),
        Some(503),
        "events.max_clients"
    );
    drop(_one);
    let back = wait_until(Duration::from_secs(3), || async {
        try_ws(&a, "token=s3cret", None).await.is_ok()
    })
    .await;
    assert!(back, "a slot frees when a client leaves");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_cache_converges_when_events_are_lost() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| c.events.reconcile_ms = 300).await;
    join(&a, "lw").await;
    submit_many(&a, "cache", 10).await;
    let fresh = wait_until(Duration::from_secs(3), || async {
        a.get("/api/v1/live").await.1["queues"]["cache"]["queued"] == 10
    })
    .await;
    assert!(fresh);
    // Lose every event from now on.
    a.state().live.drop_events(true);
    submit_many(&a, "cache", 5).await;
    a.post("/api/v1/queues/cache/claim", json!({"node": "lw", "max": 3}))
        .await;
    let converged = wait_until(Duration::from_secs(3), || async {
        let live = a.get("/api/v1/live").await.1;
        live["queues"]["cache"]["queued"] == 12 && live["queues"]["cache"]["running"] == 3
    })
    .await;
    assert!(converged, "reconciled from Redis within events.reconcile_ms");
    let live = a.get("/api/v1/live").await.1;
    assert_eq!(live["nodes"]["lw"]["state"], "alive");
    assert_eq!(live["throughput"].as_array().unwrap().len(), 600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_tails_events_as_json_lines() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    submit(&a, "cli", json!({})).await;
    let (_, page) = a.get("/api/v1/events?topics=task.enqueued&limit=1").await;
    let since = page["events"][0]["id"].as_str().unwrap().to_string();
    let ids = submit_many(&a, "cli", 3).await;
    let out = tokio::process::Command::new(muster_bin())
        .args([
            "events",
            "tail",
            "--url",
            &a.url,
            "--topics",
            "task.enqueued",
            "--since",
            &since,
            "--limit",
            "3",
        ])
        .output();
    let out = tokio::time::timeout(Duration::from_secs(10), out)
        .await
        .expect("tail exits")
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let got: Vec<&str> = lines.iter().map(|l| l["task"].as_str().unwrap()).collect();
    assert_eq!(got, ids.iter().map(String::as_str).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_page_renders_the_stream_and_filters() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let id = submit(&a, "page", json!({})).await;
    let html = a.page("/events?topics=task.*").await;
    assert!(html.contains(&id) && html.contains("task.enqueued"));
    assert!(
        html.contains("data-live-since="),
        "live updates resume after what is shown"
    );
    let html = a.page("/events?topics=node.*").await;
    assert!(!html.contains(&id));
    let html = a.page("/events?topics=b*d").await;
    assert!(html.contains("bad topic"));
    let js = a.http.get(format!("{}/static/js/live.js", a.url)).send().await.unwrap();
    assert_eq!(js.status(), 200);
    let _ = Value::Null;
}
