//! The workflow janitor: forgets finished workflows past retention.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Workflows;

pub fn spawn(workflows: Arc<Workflows>, every: Duration, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = cancel.cancelled() => return,
            }
            if let Err(e) = workflows.janitor().await {
                tracing::debug!(error = %e, "workflow janitor pass failed");
            }
        }
    })
}
