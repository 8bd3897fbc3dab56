//! One WebSocket subscriber.
//!
//! Invariants:
//! - No hole and no duplicate at the replay/live seam: the client subscribes
//!   to the node's event bus *before* replaying from Redis, and every event
//!   at or below the position handled in its shard is skipped (positions
//!   are kept per shard: [`Cursor`]).
//! - A client may be at most `events.client_buffer` events behind the node's
//!   bus (the bus's ring holds that many), and a write to it may take at
//!   most `events.send_timeout_ms`. A client that breaks either bound is
//!   *lagged*: it gets a `lagged` message and is closed. The message carries
//!   the id up to which the node handled the stream for it (every matching
//!   event up to it was queued to the socket before the message), never an
//!   empty one: the last id scanned, whether or not it matched the filter,
//!   else the client's `since`, else the bus's mark when it subscribed. It
//!   reconnects with `since=last_id` and misses nothing still retained.
//!   Only this client's own task ever waits for its socket, and the bus never
//!   waits for anyone, so a slow client never slows the tailer or others.
//! - Events that arrive together are written with one flush (one system
//!   call) instead of one each.
//! - When `since` is older than what the stream retains, a `gap` message
//!   with the oldest retained id comes first.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::broadcast;

use super::{Cursor, Event, Filter, StreamId, read_after};
use crate::app::AppState;

const REPLAY_PAGE: usize = 500;
/// Most events written with one flush.
const BATCH: usize = 256;

/// The writing half of one client, with what it has queued so far.
/// The least time a lagged client gets to read what was queued before its
/// `lagged` message, and the message.
const LAGGED_WITHIN: Duration = Duration::from_secs(5);

struct Out {
    sink: SplitSink<WebSocket, Message>,
    within: Duration,
    /// The position up to which the streams were handled for this client:
    /// every event up to it that matches the filter was queued to the
    /// socket, so precedes any later `lagged` message on the wire.
    upto: Option<Cursor>,
    relayed: metrics::Counter,
    lag: metrics::Histogram,
}

impl Out {
    /// Queues an event (no system call yet, unless the socket's write
    /// buffer is full: then it waits for the client, at most `within`).
    /// Errs with how the session ends when the event could not be queued.
    async fn feed(&mut self, ev: &Event) -> Result<(), End> {
        match tokio::time::timeout(self.within, self.sink.feed(Message::Text(ev.frame()))).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(End::Gone),
            Err(_) => return Err(End::Lagged),
        }
        self.relayed.increment(1);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        self.lag.record(((now_ms - ev.ts).max(0) as f64) / 1000.0);
        Ok(())
    }

    /// Records that every event of its shard up to `ev` was handled (queued
    /// or filtered out).
    fn handled(&mut self, ev: &Event) {
        if let Some(id) = ev.sid {
            self.upto.get_or_insert_with(Cursor::default).advance(ev.shard, id);
        }
    }

    /// Writes what is queued; false when the client did not take it in time.
    async fn flush(&mut self) -> bool {
        matches!(tokio::time::timeout(self.within, self.sink.flush()).await, Ok(Ok(())))
    }

    async fn send_text(&mut self, text: String) -> bool {
        self.send_text_within(text, self.within).await
    }

    async fn send_text_within(&mut self, text: String, within: Duration) -> bool {
        matches!(
            tokio::time::timeout(within, self.sink.send(Message::Text(Utf8Bytes::from(text)))).await,
            Ok(Ok(()))
        )
    }
}

/// How a session ended.
enum End {
    /// The client left, went silent, or its socket failed.
    Gone,
    /// The client fell behind.
    Lagged,
    /// The node is stopping.
    Shutdown,
}

/// A subscription to the node's event bus, taken by the upgrade's handler
/// before the `101` goes out: every event the bus publishes after the
/// client sees its upgrade reaches the session, however late the session's
/// task starts (it starts only once hyper has handed the socket over, and
/// a live-only client that submitted at once lost what came before that).
pub(crate) struct Subscription {
    rx: broadcast::Receiver<Arc<Event>>,
    /// The bus's mark when it subscribed: every event after it reaches `rx`.
    mark: Option<Cursor>,
}

impl Subscription {
    pub(crate) fn new(s: &AppState) -> Subscription {
        let rx = s.bus.subscribe();
        Subscription { rx, mark: s.bus.mark() }
    }
}

/// Serves one client until it leaves, lags, goes silent, or the node stops.
pub(crate) async fn serve(
    socket: WebSocket,
    s: AppState,
    filter: Filter,
    since: Option<Cursor>,
    sub: Subscription,
    permit: super::slots::Slot,
) {
    metrics::gauge!("muster_ws_clients").increment(1.0);
    let cfg = s.cfg.events.clone();
    #[cfg(feature = "test-util")]
    if cfg.session_start_delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(cfg.session_start_delay_ms)).await;
    }
    let Subscription { mut rx, mark } = sub;
    // Where a `lagged` before any event was handled sends the client back
    // to: its `since`, or for a live-only client the bus's mark (every event
    // after it reaches `rx`); the stream's end if the tailer has none yet.
    let start = match since.clone().or(mark) {
        Some(at) => Some(at),
        None => match super::tailer::last_cursor(&s.store).await {
            Ok(at) => Some(at),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the event stream for a new subscriber");
                None
            }
        },
    };
    let (sink, mut stream) = socket.split();
    let mut out = Out {
        sink,
        within: Duration::from_millis(cfg.send_timeout_ms),
        upto: start,
        relayed: metrics::counter!("muster_events_relayed_total"),
        lag: metrics::histogram!("muster_event_relay_lag_seconds"),
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

    let end = session(&s, &mut out, &mut rx, &filter, since, &last_heard, &mut gone_rx).await;
    match end {
        End::Lagged => {
            metrics::counter!("muster_ws_lagged_total").increment(1);
            // Only when even the stream's end could not be read: from the start.
            let last = out
                .upto
                .clone()
                .unwrap_or_else(|| Cursor::at(s.store.shard_count(), StreamId(0, 0)))
                .to_string();
            // The `lagged` message goes out behind everything already
            // queued, which a client that was slow takes a while to read: it
            // gets at least LAGGED_WITHIN for that (the permit is held
            // meanwhile), so a client that reads at all learns why it is
            // closed. One that reads nothing resumes from the last event it
            // got, which is as good.
            let within = out.within.max(LAGGED_WITHIN);
            let bye = async {
                if out
                    .send_text_within(json!({"type": "lagged", "last_id": last}).to_string(), within)
                    .await
                {
                    let close = Message::Close(Some(CloseFrame {
                        code: 4000,
                        reason: "lagged".into(),
                    }));
                    let _ = tokio::time::timeout(out.within, out.sink.send(close)).await;
                }
            };
            bye.await;
        }
        End::Shutdown => {
            let close = Message::Close(Some(CloseFrame {
                code: 1001,
                reason: "node shutting down".into(),
            }));
            let _ = tokio::time::timeout(Duration::from_millis(500), out.sink.send(close)).await;
        }
        End::Gone => {}
    }
    let _ = tokio::time::timeout(Duration::from_millis(200), out.sink.close()).await;
    reader.abort();
    drop(permit);
    metrics::gauge!("muster_ws_clients").decrement(1.0);
}

async fn session(
    s: &AppState,
    out: &mut Out,
    rx: &mut broadcast::Receiver<Arc<Event>>,
    filter: &Filter,
    since: Option<Cursor>,
    last_heard: &Mutex<Instant>,
    gone_rx: &mut tokio::sync::oneshot::Receiver<()>,
) -> End {
    let mut last: Option<Cursor> = since.clone();
    if let Some(since) = since {
        match super::stream::retained_all(&s.store).await {
            Ok(r) if super::stream::lost_after(&since, &r) => {
                let oldest = super::stream::oldest(&r).unwrap_or_default();
                if !out
                    .send_text(json!({"type": "gap", "since": since.to_string(), "oldest": oldest}).to_string())
                    .await
                {
                    return End::Lagged;
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the event stream for a replay");
                return End::Gone;
            }
        }
        // Replay what the stream retains after `since`, a page at a time.
        loop {
            let page = match read_after(&s.store, last.as_ref().unwrap_or(&since), REPLAY_PAGE).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "replay failed");
                    return End::Gone;
                }
            };
            let n = page.len();
            for ev in &page {
                if filter.matches(ev)
                    && let Err(end) = out.feed(ev).await
                {
                    return end;
                }
                if let Some(id) = ev.sid {
                    last.get_or_insert_with(Cursor::default).advance(ev.shard, id);
                }
                out.handled(ev);
            }
            if !out.flush().await {
                return End::Lagged;
            }
            if n < REPLAY_PAGE {
                break;
            }
        }
    }

    let ping_every = Duration::from_millis(s.cfg.events.ping_ms);
    let mut ping = tokio::time::interval(ping_every);
    ping.tick().await;
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let first = match ev {
                    Ok(ev) => ev,
                    Err(broadcast::error::RecvError::Lagged(_)) => return End::Lagged,
                    Err(broadcast::error::RecvError::Closed) => return End::Gone,
                };
                // This event and whatever else is already waiting, in one flush.
                let mut batch = vec![first];
                while batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(ev) => batch.push(ev),
                        Err(broadcast::error::TryRecvError::Lagged(_)) => return End::Lagged,
                        Err(_) => break,
                    }
                }
                let mut queued = false;
                for ev in &batch {
                    if let (Some(id), Some(l)) = (ev.sid, &last)
                        && l.covers(ev.shard, id)
                    {
                        continue;
                    }
                    if let Some(id) = ev.sid {
                        last.get_or_insert_with(Cursor::default).advance(ev.shard, id);
                    }
                    if filter.matches(ev) {
                        if let Err(end) = out.feed(ev).await {
                            return end;
                        }
                        queued = true;
                    }
                    out.handled(ev);
                }
                if queued && !out.flush().await {
                    return End::Lagged;
                }
            }
            _ = ping.tick() => {
                let quiet = last_heard.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
                if quiet > ping_every * 2 {
                    tracing::debug!("WebSocket client silent for two ping intervals; closing");
                    return End::Gone;
                }
                if out.sink.feed(Message::Ping(Default::default())).await.is_err() || !out.flush().await {
                    return End::Lagged;
                }
            }
            _ = &mut *gone_rx => return End::Gone,
            _ = s.shutdown.cancelled() => return End::Shutdown,
        }
    }
}
