//! `muster bench-ws`: how many WebSocket subscribers a node feeds, and how late.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use muster_client::{Client, EventsOptions, TaskSpec};
use serde::Serialize;
use serde_json::json;
use tokio::sync::Mutex;

use super::latency::Latency;

/// What `muster bench-ws` runs.
#[derive(Debug, Clone)]
pub struct WsBenchOptions {
    pub url: String,
    pub token: Option<String>,
    pub clients: usize,
    /// Tasks submitted per second while the clients listen.
    pub rate: usize,
    pub seconds: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct WsBenchReport {
    pub clients: usize,
    pub rate: usize,
    pub seconds: u64,
    pub events: usize,
    pub deliveries: usize,
    pub expected_deliveries: usize,
    /// From the event's Redis timestamp to its arrival at a client.
    pub latency: Latency,
}

/// Relay latency with many WebSocket clients on one node while tasks flow:
/// every client subscribes to `task.enqueued`, tasks are submitted at `rate`
/// per second, and each delivery's latency is the client's wall clock minus
/// the event's Redis time (same machine, so one clock).
pub async fn run_ws(opts: WsBenchOptions) -> anyhow::Result<WsBenchReport> {
    use futures_util::StreamExt;

    let client = Client::builder().url(&opts.url).token_opt(opts.token.clone()).build()?;
    let queue = format!("ws-bench-{}", ulid::Ulid::generate().to_string().to_lowercase());
    let follow = EventsOptions {
        topics: Some("task.enqueued".into()),
        queue: Some(queue.clone()),
        since: None,
    };
    let samples: Arc<Mutex<Vec<f64>>> = Arc::default();
    let received = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::with_capacity(opts.clients);
    for _ in 0..opts.clients {
        // Raw frames: the bench reads one field of each, not the event.
        let mut rx = client.event_frames(&follow).await?;
        let samples = samples.clone();
        let received = received.clone();
        let stop = stop.clone();
        clients.push(tokio::spawn(async move {
            let mut local = Vec::new();
            loop {
                let msg = tokio::select! {
                    m = rx.next() => m,
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {
                        if stop.load(Ordering::Relaxed) { break } else { continue }
                    }
                };
                let Some(Ok(t)) = msg else {
                    break;
                };
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                // Only the ts field is needed: skip a full parse per message.
                if let Some(ts) = t
                    .split_once("\"ts\":")
                    .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
                    .and_then(|n| n.parse::<i64>().ok())
                {
                    local.push(now.as_secs_f64() * 1000.0 - ts as f64);
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
            samples.lock().await.extend(local);
        }));
    }
    let start = Instant::now();
    let mut sent = 0usize;
    // Ten submits a second, each of rate/10 tasks, spread evenly.
    let per_tick = (opts.rate / 10).max(1);
    while start.elapsed() < Duration::from_secs(opts.seconds) {
        let due = start + Duration::from_millis(100 * (sent / per_tick) as u64);
        tokio::time::sleep_until(due.into()).await;
        let tasks: Vec<TaskSpec> = (0..per_tick)
            .map(|i| TaskSpec {
                payload: json!(i),
                ..TaskSpec::default()
            })
            .collect();
        client.submit_batch(&queue, &tasks).await?;
        sent += per_tick;
    }
    let expected = sent * opts.clients;
    let deadline = Instant::now() + Duration::from_secs(10);
    while (received.load(Ordering::Relaxed) as usize) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.await;
    }
    let samples = std::mem::take(&mut *samples.lock().await);
    Ok(WsBenchReport {
        clients: opts.clients,
        rate: opts.rate,
        seconds: opts.seconds,
        events: sent,
        deliveries: samples.len(),
        expected_deliveries: expected,
        latency: Latency::of(samples),
    })
}

pub fn render_ws(r: &WsBenchReport) -> String {
    format!(
        "{} WebSocket clients, {} tasks/s for {} s: {} events, {} of {} deliveries\n\
         relay latency (event's Redis time to client): p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms\n",
        r.clients,
        r.rate,
        r.seconds,
        r.events,
        r.deliveries,
        r.expected_deliveries,
        r.latency.p50_ms,
        r.latency.p99_ms,
        r.latency.max_ms
    )
}
