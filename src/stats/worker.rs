//! The history loop: counts every outcome event this node's bus carries
//! (reading what it skipped from the stream when it lags) and,
//! every [`FLUSH_EVERY`](super::FLUSH_EVERY), samples the queues' depth and
//! latency from the live view and merges what grew into Redis. A failed
//! merge is retried on the next tick; the last one runs at shutdown (for
//! at most a second).

use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::Stats;
use crate::events::Bus;
use crate::events::live::Live;

pub(crate) fn spawn(stats: Arc<Stats>, bus: Arc<Bus>, live: Arc<Live>, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut rx = bus.subscribe();
        let mut tick = tokio::time::interval(super::FLUSH_EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Ok(ev) => stats.count(&ev),
                    Err(RecvError::Lagged(n)) => match stats.recount().await {
                        Ok(read) => tracing::debug!(missed = n, read, "the history fell behind the event bus and recounted from the stream"),
                        Err(e) => tracing::debug!(missed = n, error = %e, "the history fell behind the event bus and could not recount"),
                    },
                    Err(RecvError::Closed) => return,
                },
                _ = tick.tick() => {
                    let snap = live.snapshot();
                    if snap.reconciled_at > 0 {
                        let queues: Vec<(String, u64, u64)> = snap
                            .queues
                            .iter()
                            .map(|(name, q)| (name.clone(), q.queued.max(0) as u64, q.latency_ms))
                            .collect();
                        stats.sample(snap.reconciled_at, &queues);
                    }
                    if let Err(e) = stats.flush().await {
                        tracing::debug!(error = %e, "merging the outcome history into Redis failed; retrying next tick");
                    }
                }
                _ = cancel.cancelled() => {
                    // The last minute's counts, without holding up the
                    // shutdown when Redis is gone (other nodes counted too).
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), stats.flush()).await;
                    return;
                }
            }
        }
    })
}
