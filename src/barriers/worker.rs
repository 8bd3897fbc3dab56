//! The barrier loop: every `barriers.interval_ms`, decide the rounds whose
//! deadline passed with nobody calling, and evict DoubleBarrier entrants
//! whose node is gone. Every node runs it; the decision is set at most once
//! per round in Redis, so running it on several nodes is harmless. A failed
//! Redis call skips the pass.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::Barriers;

pub fn spawn(barriers: Arc<Barriers>, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(barriers.config().interval_ms));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = cancel.cancelled() => return,
            }
            match barriers.decide_due().await {
                Ok((released, aborted)) if released + aborted > 0 => {
                    tracing::info!(released, aborted, "decided barrier rounds at their deadline");
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "barrier deadline pass skipped"),
            }
            match barriers.sweep_double_barriers().await {
                Ok(n) if n > 0 => tracing::info!(evicted = n, "evicted DoubleBarrier entrants of dead nodes"),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "DoubleBarrier sweep skipped"),
            }
        }
    })
}
