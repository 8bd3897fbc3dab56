//! The cleaner loop: every `orphans.interval_ms`, recover the tasks of dead
//! owners, fail the tasks past their timeout and put back the claimed tasks
//! not acknowledged in time; every tenth pass, sweep each queue's indexes. A
//! failed Redis call skips the step (fail closed).
//!
//! It runs per shard of a split namespace, each shard on its own cadence: a
//! master that stalls or fails over holds up the passes of its own shards
//! only, so a dead worker's tasks in the other shards are recovered at the
//! usual bound (G3), and their liveness passes never see a gap to repair.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::Orphans;
use crate::store::{PassLog, Store};

pub(crate) fn spawn(orphans: Arc<Orphans>, cancel: CancellationToken) -> JoinHandle<()> {
    let store = orphans.store.clone();
    store.spawn_each_shard(move |shard| shard_loop(orphans.clone(), shard, cancel.clone()))
}

async fn shard_loop(orphans: Arc<Orphans>, shard: Store, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(orphans.config().interval_ms));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let (mut recover_log, mut timeouts_log, mut unacked_log, mut sweep_log) = (
        PassLog::new("orphans", &shard),
        PassLog::new("timeouts", &shard),
        PassLog::new("unacked", &shard),
        PassLog::new("sweep", &shard),
    );
    let mut pass: u64 = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        pass += 1;
        if let Some(r) = recover_log.outcome(orphans.recover_in(&shard).await) {
            for (action, n) in [("requeued", r.requeued), ("dead", r.dead), ("cancelled", r.cancelled)] {
                if n > 0 {
                    metrics::counter!("muster_orphans_recovered_total", "action" => action).increment(n as u64);
                }
            }
            // Every dead letter counts here, whoever made it.
            count_by_queue(&orphans, "muster_tasks_dead_total", &r.dead_queues);
            if r.requeued + r.dead + r.cancelled > 0 {
                tracing::info!(
                    requeued = r.requeued,
                    dead = r.dead,
                    cancelled = r.cancelled,
                    shard = shard.shard_index(),
                    "recovered orphaned tasks"
                );
            }
        }
        if let Some(t) = timeouts_log.outcome(orphans.timeouts_in(&shard).await)
            && t.timed_out > 0
        {
            metrics::counter!("muster_task_timeouts_total").increment(t.timed_out as u64);
            // A timeout is a failed execution (retried or dead).
            count_by_queue(&orphans, "muster_tasks_failed_total", &t.timed_out_queues);
            count_by_queue(&orphans, "muster_tasks_dead_total", &t.dead_queues);
            tracing::info!(
                timed_out = t.timed_out,
                retried = t.retried,
                dead = t.dead,
                shard = shard.shard_index(),
                "tasks timed out"
            );
        }
        if let Some(u) = unacked_log.outcome(orphans.unacked_in(&shard).await)
            && u.requeued + u.cancelled + u.dead > 0
        {
            count_by_queue(&orphans, "muster_tasks_not_acknowledged_total", &u.requeued_queues);
            count_by_queue(&orphans, "muster_tasks_not_acknowledged_total", &u.dead_queues);
            count_by_queue(&orphans, "muster_tasks_dead_total", &u.dead_queues);
            tracing::info!(
                requeued = u.requeued,
                cancelled = u.cancelled,
                dead = u.dead,
                shard = shard.shard_index(),
                "claimed tasks not acknowledged in time went back to their queues"
            );
        }
        if pass.is_multiple_of(10)
            && let Some(repaired) = sweep_log.outcome(orphans.sweep_in(&shard).await)
        {
            for (q, recovered, removed) in repaired {
                tracing::info!(queue = %q, recovered, removed, "sweep repaired indexes");
            }
        }
        orphans.passes[shard.shard_index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// Increments a task counter once per listed queue, under its capped label.
fn count_by_queue(orphans: &Orphans, name: &'static str, queues: &[String]) {
    for q in queues {
        metrics::counter!(name, "queue" => orphans.labels.label(q)).increment(1);
    }
}
