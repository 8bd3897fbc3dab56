//! `muster events tail`: prints the cluster's events as JSON lines, resuming
//! after a disconnect from the last id it printed (nothing missed while the
//! stream retains it, nothing printed twice).

use std::io::Write;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

pub struct TailOptions {
    pub url: String,
    pub token: Option<String>,
    pub topics: Option<String>,
    pub queue: Option<String>,
    pub since: Option<String>,
    /// Stop after this many events (for scripts and tests).
    pub limit: Option<u64>,
}

fn ws_url(base: &str, topics: Option<&str>, queue: Option<&str>, since: Option<&str>) -> String {
    let base = base.trim_end_matches('/');
    let base = if let Some(rest) = base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        base.to_string()
    };
    let mut q = Vec::new();
    if let Some(t) = topics {
        q.push(format!("topics={}", enc(t)));
    }
    if let Some(v) = queue {
        q.push(format!("queue={}", enc(v)));
    }
    if let Some(s) = since {
        q.push(format!("since={}", enc(s)));
    }
    format!("{base}/api/v1/events/ws?{}", q.join("&"))
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.*".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Runs until interrupted (or `limit` events were printed).
pub async fn run(opts: TailOptions) -> anyhow::Result<()> {
    let mut since = opts.since.clone();
    let mut printed: u64 = 0;
    let mut backoff = Duration::from_millis(200);
    loop {
        let url = ws_url(
            &opts.url,
            opts.topics.as_deref(),
            opts.queue.as_deref(),
            since.as_deref(),
        );
        let mut req = url.as_str().into_client_request()?;
        if let Some(t) = &opts.token {
            req.headers_mut()
                .insert("authorization", format!("Bearer {t}").parse()?);
        }
        match tokio_tungstenite::connect_async(req).await {
            Ok((mut ws, _)) => {
                backoff = Duration::from_millis(200);
                while let Some(msg) = ws.next().await {
                    let Ok(msg) = msg else { break };
                    let Message::Text(text) = msg else { continue };
                    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                    match v["type"].as_str() {
                        Some("lagged") => {
                            eprintln!("muster events tail: fell behind; resuming after {}", v["last_id"]);
                            if let Some(id) = v["last_id"].as_str().filter(|s| !s.is_empty()) {
                                since = Some(id.to_string());
                            }
                            break;
                        }
                        Some("gap") => {
                            eprintln!(
                                "muster events tail: events after {} were trimmed; the stream now starts at {}",
                                v["since"], v["oldest"]
                            );
                            continue;
                        }
                        _ => {}
                    }
                    if let Some(id) = v["id"].as_str() {
                        since = Some(id.to_string());
                    }
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{text}")?;
                    out.flush()?;
                    printed += 1;
                    if opts.limit.is_some_and(|l| printed >= l) {
                        return Ok(());
                    }
                }
                eprintln!("muster events tail: disconnected; reconnecting");
            }
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                let status = resp.status();
                let body = resp
                    .body()
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                if status.is_client_error() {
                    anyhow::bail!("the node refused the subscription ({status}): {body}");
                }
                eprintln!("muster events tail: {status}; retrying");
            }
            Err(e) => eprintln!("muster events tail: {e}; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::ws_url;

    #[test]
    fn builds_ws_urls() {
        assert_eq!(
            ws_url("http://h:1/", Some("task.*,node.dead"), None, Some("5-0")),
            "ws://h:1/api/v1/events/ws?topics=task.*%2Cnode.dead&since=5-0"
        );
        assert_eq!(
            ws_url("https://h", None, Some("q"), None),
            "wss://h/api/v1/events/ws?queue=q"
        );
    }
}
