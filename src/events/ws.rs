//! One WebSocket subscriber.
//!
//! Invariants:
//! - No hole and no duplicate at the replay/live seam: the client subscribes
//!   to the node's event bus *before* replaying from Redis, and every event
//!   with an id at or below the last one handled is skipped.
//! - Each client has its own buffer of `events.client_buffer` messages,
//!   drained into the socket by a writer task. A client whose buffer stays
//!   full for `events.send_timeout_ms` (or that falls behind the node's
//!   shared event ring) is *lagged*: its unsent buffer is dropped, it gets a
//!   `lagged` message with the id of the last event written to its socket,
//!   and it is closed. It reconnects with `since` and misses nothing still
//!   retained. Only this client's own tasks ever wait for it, so a slow
//!   client never slows the tailer or any other client.
//! - When `since` is older than what the stream retains, a `gap` message
//!   with the oldest retained id comes first.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::{Event, Filter, StreamId, read_after, retained};
use crate::app::AppState;

const REPLAY_PAGE: usize = 500;

/// A message for the writer, with the stream id it carries (events only).
type Outgoing = (Message, Option<StreamId>);

/// Serves one client until it leaves, lags, goes silent, or the node stops.
pub async fn serve(
    socket: WebSocket,
    s: AppState,
    filter: Filter,
    since: Option<StreamId>,
    permit: OwnedSemaphorePermit,
) {
    metrics::gauge!("muster_ws_clients").increment(1.0);
    let cfg = s.cfg.events.clone();
    let send_timeout = Duration::from_millis(cfg.send_timeout_ms);
    // Subscribe first: anything published from now on is caught live.
    let mut rx = s.bus.subscribe();
    let (mut sink, mut stream) = socket.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Outgoing>(cfg.client_buffer as usize);
    // Set when the client lagged: the writer drops what is buffered.
    let lagged = CancellationToken::new();
    // Set when the client is done for any other reason: the writer stops.
    let stop = CancellationToken::new();
    let written: Arc<Mutex<Option<StreamId>>> = Arc::default();

    let writer = {
        let lagged = lagged.clone();
        let stop = stop.clone();
        let written = written.clone();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    m = out_rx.recv() => m,
                    _ = lagged.cancelled() => None,
                    _ = stop.cancelled() => None,
                };
                let Some((msg, id)) = next else { break };
                // Write everything already buffered in one flush: one syscall
                // for a burst of events instead of one per event.
                let mut msgs = vec![msg];
                let mut batch_id = id;
                while msgs.len() < 256 {
                    match out_rx.try_recv() {
                        Ok((m, i)) => {
                            msgs.push(m);
                            if i.is_some() {
                                batch_id = i;
                            }
                        }
                        Err(_) => break,
                    }
                }
                let batch = async {
                    for m in msgs {
                        sink.feed(m).await?;
                    }
                    sink.flush().await
                };
                tokio::pin!(batch);
                // No deadline while the client keeps up; once it lagged (or
                // the session ends), one send_timeout to finish this batch.
                let done = tokio::select! {
                    r = &mut batch => r.is_ok(),
                    _ = async { tokio::select! { _ = lagged.cancelled() => {}, _ = stop.cancelled() => {} } } => {
                        matches!(tokio::time::timeout(send_timeout, &mut batch).await, Ok(Ok(())))
                    }
                };
                if !done {
                    return;
                }
                if batch_id.is_some() {
                    *written.lock().unwrap_or_else(|p| p.into_inner()) = batch_id;
                }
            }
            if lagged.is_cancelled() {
                // Drop the unsent buffer; tell the client where to resume.
                out_rx.close();
                let last = *written.lock().unwrap_or_else(|p| p.into_inner());
                let last = last.map(|l| l.to_string()).unwrap_or_default();
                let msg = json!({"type": "lagged", "last_id": last}).to_string();
                let bye = async {
                    sink.send(Message::Text(Utf8Bytes::from(msg))).await?;
                    sink.send(Message::Close(Some(CloseFrame {
                        code: 4000,
                        reason: "lagged".into(),
                    })))
                    .await
                };
                let _ = tokio::time::timeout(send_timeout, bye).await;
            } else {
                // Flush what is queued (a close frame, say), briefly.
                let flush = async {
                    while let Ok((msg, _)) = out_rx.try_recv() {
                        sink.send(msg).await?;
                    }
                    Ok::<(), axum::Error>(())
                };
                let _ = tokio::time::timeout(Duration::from_millis(500), flush).await;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), sink.close()).await;
        })
    };

    // Inbound frames: anything from the client (pongs included) shows it is
    // alive; a close ends the session.
    let last_heard = Arc::new(Mutex::new(Instant::now()));
    let (gone_tx, mut gone_rx) = tokio::sync::oneshot::channel::<()>();
    let reader = {
        let heard = last_heard.clone();
        tokio::spawn(async move {
            while let Some(Ok(msg)) = stream.next().await {
                if matches!(msg, Message::Close(_)) {
                    break;
                }
                *heard.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
            }
            let _ = gone_tx.send(());
        })
    };

    let mut last: Option<StreamId> = None;
    let mut ok = true;
    let relay = Relay {
        out: out_tx.clone(),
        within: send_timeout,
        relayed: metrics::counter!("muster_events_relayed_total"),
        lag: metrics::histogram!("muster_event_relay_lag_seconds"),
    };
    if let Some(since) = since {
        last = Some(since);
        match retained(&s.store).await {
            Ok(r) if r.lost_after(since) => {
                let oldest = r.first.map(|f| f.to_string()).unwrap_or_default();
                let msg = json!({"type": "gap", "since": since.to_string(), "oldest": oldest}).to_string();
                ok = queue(&out_tx, (Message::Text(Utf8Bytes::from(msg)), None), send_timeout).await;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the event stream for a replay");
                stop.cancel();
                ok = false;
            }
        }
        // Replay what the stream retains after `since`, a page at a time.
        while ok {
            let page = match read_after(&s.store, last.unwrap_or(since), REPLAY_PAGE).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "replay failed");
                    stop.cancel();
                    ok = false;
                    break;
                }
            };
            let n = page.len();
            for ev in page {
                let id = ev.sid;
                if filter.matches(&ev) && !relay.deliver(&ev).await {
                    lagged.cancel();
                    ok = false;
                    break;
                }
                last = id.or(last);
            }
            if n < REPLAY_PAGE {
                break;
            }
        }
    }

    let mut ping = tokio::time::interval(Duration::from_millis(cfg.ping_ms));
    ping.tick().await;
    if ok {
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Ok(ev) => {
                        let id = ev.sid;
                        if let (Some(id), Some(l)) = (id, last)
                            && id <= l
                        {
                            continue;
                        }
                        last = id.or(last);
                        if filter.matches(&ev) && !relay.deliver(&ev).await {
                            lagged.cancel();
                            break;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        lagged.cancel();
                        break;
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                _ = ping.tick() => {
                    let quiet = last_heard.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
                    if quiet > Duration::from_millis(cfg.ping_ms * 2) {
                        tracing::debug!("WebSocket client silent for two ping intervals; closing");
                        break;
                    }
                    let _ = out_tx.try_send((Message::Ping(Default::default()), None));
                }
                _ = &mut gone_rx => break,
                _ = s.shutdown.cancelled() => {
                    let close = Message::Close(Some(CloseFrame { code: 1001, reason: "node shutting down".into() }));
                    let _ = out_tx.try_send((close, None));
                    break;
                }
            }
        }
    }
    if lagged.is_cancelled() {
        metrics::counter!("muster_ws_lagged_total").increment(1);
    }
    stop.cancel();
    drop(relay);
    drop(out_tx);
    let _ = writer.await;
    reader.abort();
    drop(permit);
    metrics::gauge!("muster_ws_clients").decrement(1.0);
}

/// Puts a message in the client's buffer, waiting at most `within` for
/// room: false when the client did not drain its buffer in time (it lags).
async fn queue(out: &mpsc::Sender<Outgoing>, msg: Outgoing, within: Duration) -> bool {
    match out.try_send(msg) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(msg)) => {
            matches!(tokio::time::timeout(within, out.send(msg)).await, Ok(Ok(())))
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

/// Delivers events into one client's buffer, with its metric handles
/// resolved once rather than per event.
struct Relay {
    out: mpsc::Sender<Outgoing>,
    within: Duration,
    relayed: metrics::Counter,
    lag: metrics::Histogram,
}

impl Relay {
    /// Queues one event for the client; false when it lags.
    async fn deliver(&self, ev: &Event) -> bool {
        let sent = queue(&self.out, (Message::Text(ev.frame()), ev.sid), self.within).await;
        if sent {
            self.relayed.increment(1);
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            self.lag.record(((now_ms - ev.ts).max(0) as f64) / 1000.0);
        }
        sent
    }
}
