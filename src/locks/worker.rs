//! The lease loop: every `locks.interval_ms`, end the leases of locks and
//! leaderships that lapsed by Redis time, so that waiters wake at once even
//! when nobody calls. Every node runs it; each expiry is idempotent. A failed
//! Redis call skips the pass. It runs per shard of a split namespace, each
//! on its own cadence: a stalled master holds up its own shards only.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::Locks;
use crate::store::PassLog;

pub(crate) fn spawn(locks: Arc<Locks>, cancel: CancellationToken) -> JoinHandle<()> {
    let store = locks.store().clone();
    store.spawn_each_shard(move |shard| {
        let (locks, cancel) = (locks.clone(), cancel.clone());
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(locks.config().interval_ms));
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut log = PassLog::new("lock_expiry", &shard);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = cancel.cancelled() => return,
                }
                if let Some((l, e)) = log.outcome(locks.expire_due_in(&shard).await)
                    && l + e > 0
                {
                    metrics::counter!("muster_locks_expired_total").increment(l as u64);
                    tracing::info!(locks = l, elections = e, "leases lapsed");
                }
            }
        }
    })
}
