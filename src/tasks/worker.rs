//! The janitor loop: promotes due delayed tasks, trims finished tasks past
//! retention from the indexes, forgets empty queues, and refreshes the
//! `muster_queue_depth` gauges. Every node runs it; each step is an
//! idempotent script, so running it on several nodes is harmless.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::Tasks;

pub fn spawn(tasks: Arc<Tasks>, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(tasks.config().janitor_interval_ms));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = cancel.cancelled() => return,
            }
            match tasks.janitor_pass().await {
                Ok(rows) => {
                    // Sum per label first: queues beyond the label limit
                    // share `other`, which must be their total, not the last.
                    // Latency: the worst of the queues sharing a label.
                    let mut depth: std::collections::BTreeMap<String, ([i64; 4], i64)> = Default::default();
                    for (queue, r) in rows {
                        let (d, latency) = depth.entry(tasks.labels.label(&queue)).or_default();
                        for (k, v) in [r[3], r[4], r[5], r[6]].into_iter().enumerate() {
                            d[k] += v;
                        }
                        *latency = (*latency).max(r[7]);
                    }
                    for (label, (d, latency)) in depth {
                        for (state, v) in ["queued", "delayed", "running", "dead"].into_iter().zip(d) {
                            metrics::gauge!("muster_queue_depth", "queue" => label.clone(), "state" => state)
                                .set(v as f64);
                        }
                        metrics::gauge!("muster_queue_latency_seconds", "queue" => label).set(latency as f64 / 1000.0);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "janitor pass failed"),
            }
        }
    })
}
