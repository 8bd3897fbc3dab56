//! The lease loop: every `locks.interval_ms`, end the leases of locks and
//! leaderships that lapsed by Redis time, so that waiters wake at once even
//! when nobody calls. Every node runs it; each expiry is idempotent. A failed
//! Redis call skips the pass.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::Locks;

pub fn spawn(locks: Arc<Locks>, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(locks.config().interval_ms));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = cancel.cancelled() => return,
            }
            match locks.expire_due().await {
                Ok((l, e)) if l + e > 0 => {
                    metrics::counter!("muster_locks_expired_total").increment(l as u64);
                    tracing::info!(locks = l, elections = e, "leases lapsed");
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "lease expiry pass skipped"),
            }
        }
    })
}
