//! The barrier loop: every `barriers.interval_ms`, decide the rounds whose
//! deadline passed with nobody calling, and evict DoubleBarrier entrants
//! whose node is gone. Every node runs it; the decision is set at most once
//! per round in Redis, so running it on several nodes is harmless. A failed
//! Redis call skips the pass. It runs per shard of a split namespace, each
//! on its own cadence: a stalled master holds up its own shards only.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::Barriers;
use crate::store::PassLog;

pub(crate) fn spawn(barriers: Arc<Barriers>, cancel: CancellationToken) -> JoinHandle<()> {
    let store = barriers.store().clone();
    store.spawn_each_shard(move |shard| {
        let (barriers, cancel) = (barriers.clone(), cancel.clone());
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(barriers.config().interval_ms));
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut deadlines = PassLog::new("barrier_deadlines", &shard);
            let mut sweeps = PassLog::new("double_barrier_sweep", &shard);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = cancel.cancelled() => return,
                }
                if let Some((released, aborted)) = deadlines.outcome(barriers.decide_due_shard(&shard).await)
                    && released + aborted > 0
                {
                    tracing::info!(released, aborted, "decided barrier rounds at their deadline");
                }
                if let Some(n) = sweeps.outcome(barriers.sweep_double_barriers_in(&shard).await)
                    && n > 0
                {
                    tracing::info!(evicted = n, "evicted DoubleBarrier entrants of dead nodes");
                }
            }
        }
    })
}
