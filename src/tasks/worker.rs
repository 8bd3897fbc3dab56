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
                    for (queue, r) in rows {
                        let label = tasks.labels.label(&queue);
                        for (state, v) in [("queued", r[3]), ("delayed", r[4]), ("running", r[5]), ("dead", r[6])] {
                            metrics::gauge!("muster_queue_depth", "queue" => label.clone(), "state" => state)
                                .set(v as f64);
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "janitor pass failed"),
            }
        }
    })
}
