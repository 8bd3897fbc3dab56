//! The event stream over the WebSocket (`GET /api/v1/events/ws`), resumed
//! from the last id across disconnects and node failures, and waiting for a
//! task's result.
//!
//! The server's control frames (`src/events/ws.rs`): `{"type": "lagged",
//! "last_id"}` when this client fell behind and is being closed (every
//! matching event up to `last_id` was sent before it, so the stream
//! reconnects with `since=last_id` and nothing is lost or repeated), and
//! `{"type": "gap", "since", "oldest"}` when events after `since` were
//! already trimmed (those are lost: the stream yields [`EventFrame::Gap`] so
//! the caller can resynchronise from the current state).

use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::{Client, Error, Problem, Result, enc};
use muster_api::events::Event;
use muster_api::tasks::TaskInfo;

/// What to follow.
#[derive(Debug, Clone, Default)]
pub struct EventsOptions {
    /// Event types and prefixes, comma-separated (`task.*,node.dead`);
    /// None: all.
    pub topics: Option<String>,
    /// Only this queue's events.
    pub queue: Option<String>,
    /// Resume after this event (the `id` of the last one received, an
    /// opaque cursor); `0` replays what is retained; None: from now.
    pub since: Option<String>,
}

/// One item of the event stream.
#[derive(Debug, Clone, PartialEq)]
pub enum EventFrame {
    /// An event.
    Event(Event),
    /// Events after `since` were trimmed before they could be sent; the
    /// stream goes on from `oldest`. What happened in between must be read
    /// from the current state (a task, a queue).
    Gap { since: String, oldest: String },
}

impl Client {
    /// Follows the cluster's events. The stream reconnects by itself (to the
    /// next URL, with backoff) and resumes after the last event it yielded,
    /// so while the server retains them no event is missed or repeated
    /// (before the first event with `since` unset, a reconnect resumes from
    /// the server's now). A refusal (4xx: bad topic, bad `since`, no role)
    /// is yielded as an error and ends the stream. Dropping the stream
    /// closes the connection.
    pub fn events(&self, opts: EventsOptions) -> impl Stream<Item = Result<EventFrame>> + Send + Unpin + 'static {
        let (tx, mut rx) = mpsc::channel::<Result<EventFrame>>(1024);
        let client = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = follow(client, opts, &tx) => {}
                _ = tx.closed() => {}
            }
        });
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
    }

    /// Waits until the task is succeeded, dead or cancelled and returns it
    /// (its `result` or `error`); [`Error::Timeout`] after `timeout`. Woken
    /// by the task's events, and reads the task at least every second, so a
    /// lost event costs a second, not the result.
    pub async fn wait_for_result(&self, task_id: &str, timeout: Duration) -> Result<TaskInfo> {
        let deadline = Instant::now() + timeout;
        let first = self.task(task_id).await?;
        if first.is_terminal() {
            return Ok(first);
        }
        let mut events = self.events(EventsOptions {
            topics: Some("task.succeeded,task.dead,task.cancelled".into()),
            queue: Some(first.queue.clone()),
            since: None,
        });
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "task {task_id} did not finish within {timeout:?}"
                )));
            }
            let tick = left.min(Duration::from_secs(1));
            let woke = tokio::time::timeout(tick, async {
                while let Some(item) = events.next().await {
                    match item {
                        Ok(EventFrame::Event(e)) if e.subject("task") == Some(task_id) => return,
                        Ok(EventFrame::Gap { .. }) => return,
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
                // The stream ended (refused): fall back to reading each tick.
                std::future::pending::<()>().await
            })
            .await;
            let _ = woke;
            let t = self.task(task_id).await?;
            if t.is_terminal() {
                return Ok(t);
            }
        }
    }
}

fn ws_url(base: &str, opts: &EventsOptions, since: Option<&str>) -> String {
    let base = if let Some(rest) = base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        base.to_string()
    };
    let mut q = Vec::new();
    if let Some(t) = &opts.topics {
        // Commas and the `*` wildcard are fine in a query.
        q.push(format!("topics={}", enc(t).replace("%2C", ",").replace("%2A", "*")));
    }
    if let Some(v) = &opts.queue {
        q.push(format!("queue={}", enc(v)));
    }
    if let Some(s) = since {
        q.push(format!("since={}", enc(s)));
    }
    format!("{base}/api/v1/events/ws?{}", q.join("&"))
}

/// Connects, reads and reconnects until the receiver goes away or the
/// server refuses the subscription.
/// One WebSocket connection of the event stream.
type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

impl Client {
    /// Opens the event stream's WebSocket at `url` with the client's token
    /// and TLS settings, within 5 s. A refusal (4xx) is [`Error::Api`]; a bad
    /// URL or token [`Error::Invalid`]; anything else [`Error::Unreachable`].
    async fn open_socket(&self, url: &str) -> Result<Socket> {
        let mut req = url
            .into_client_request()
            .map_err(|e| Error::Invalid(format!("bad events URL {url}: {e}")))?;
        if let Some(t) = self.token() {
            let v = format!("Bearer {t}")
                .parse()
                .map_err(|_| Error::Invalid("the token is not a header value".into()))?;
            req.headers_mut().insert("authorization", v);
        }
        let connect = tokio_tungstenite::connect_async_tls_with_config(
            req,
            None,
            false,
            Some(tokio_tungstenite::Connector::Rustls(self.tls())),
        );
        let unreachable = |message: String| Error::Unreachable {
            url: url.to_string(),
            message,
        };
        match tokio::time::timeout(Duration::from_secs(5), connect).await {
            Ok(Ok((ws, _))) => Ok(ws),
            Ok(Err(tokio_tungstenite::tungstenite::Error::Http(resp))) if resp.status().is_client_error() => {
                let body = resp.body().clone().unwrap_or_default();
                Err(Problem::from_body(resp.status().as_u16(), &body).into())
            }
            Ok(Err(e)) => Err(unreachable(e.to_string())),
            Err(_) => Err(unreachable("the WebSocket handshake timed out".into())),
        }
    }

    /// The event stream's frames as the node sends them (events and the
    /// `lagged` and `gap` notices, unparsed JSON text), over one connection
    /// to the current node: no resume, no failover, the stream ends when the
    /// connection does. For a consumer that reads a field or two of many
    /// events (a relay, a latency probe) and would rather not pay for a full
    /// parse; everyone else wants [`Client::events`].
    pub async fn event_frames(
        &self,
        opts: &EventsOptions,
    ) -> Result<impl Stream<Item = Result<String>> + Send + Unpin + use<>> {
        let url = ws_url(self.current_url(), opts, opts.since.as_deref());
        let ws = self.open_socket(&url).await?;
        let url = self.current_url().to_string();
        Ok(ws.filter_map(move |m| {
            let out = match m {
                Ok(Message::Text(t)) => Some(Ok(t.to_string())),
                Ok(_) => None,
                Err(e) => Some(Err(Error::Unreachable {
                    url: url.clone(),
                    message: format!("the events WebSocket failed: {e}"),
                })),
            };
            std::future::ready(out)
        }))
    }
}

async fn follow(client: Client, opts: EventsOptions, tx: &mpsc::Sender<Result<EventFrame>>) {
    let urls = client.urls().to_vec();
    let mut since = opts.since.clone();
    let mut i = urls.iter().position(|u| u == client.current_url()).unwrap_or(0);
    let mut backoff = Duration::from_millis(100);
    loop {
        let url = ws_url(&urls[i % urls.len()], &opts, since.as_deref());
        let connect = match client.open_socket(&url).await {
            Err(e @ Error::Invalid(_)) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
            other => other,
        };
        match connect {
            Ok(mut ws) => {
                backoff = Duration::from_millis(100);
                while let Some(msg) = ws.next().await {
                    let Ok(msg) = msg else { break };
                    let text = match msg {
                        Message::Text(t) => t,
                        Message::Close(_) => break,
                        _ => continue,
                    };
                    let v: serde_json::Value = match serde_json::from_str(&text) {
                        Ok(v) => v,
                        Err(_) => continue,
                    };
                    match v["type"].as_str() {
                        Some("lagged") => {
                            if let Some(id) = v["last_id"].as_str().filter(|s| !s.is_empty()) {
                                since = Some(id.to_string());
                            }
                            break;
                        }
                        Some("gap") => {
                            let frame = EventFrame::Gap {
                                since: v["since"].as_str().unwrap_or("").to_string(),
                                oldest: v["oldest"].as_str().unwrap_or("").to_string(),
                            };
                            if tx.send(Ok(frame)).await.is_err() {
                                return;
                            }
                            continue;
                        }
                        _ => {}
                    }
                    match serde_json::from_value::<Event>(v) {
                        Ok(e) => {
                            since = Some(e.id.clone());
                            if tx.send(Ok(EventFrame::Event(e))).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => tracing::debug!(error = %e, "muster client: skipping an unreadable event"),
                    }
                }
                // Disconnected or lagged: resume from the same node, after a
                // breath so a node that closes at once is not spun on.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Err(e @ Error::Api(_)) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
            Err(e) => tracing::debug!(error = %e, "muster client: events connect failed"),
        }
        i += 1;
        if i.is_multiple_of(urls.len()) {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_ws_urls() {
        let o = EventsOptions {
            topics: Some("task.*,node.dead".into()),
            queue: Some("q".into()),
            since: None,
        };
        assert_eq!(
            ws_url("http://h:1", &o, Some("5-0")),
            "ws://h:1/api/v1/events/ws?topics=task.*,node.dead&queue=q&since=5-0"
        );
        assert_eq!(
            ws_url("https://h", &EventsOptions::default(), None),
            "wss://h/api/v1/events/ws?"
        );
    }
}
