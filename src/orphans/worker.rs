//! The cleaner loop: every `orphans.interval_ms`, recover the tasks of dead
//! owners and fail the tasks past their timeout; every tenth pass, sweep each
//! queue's indexes. A failed Redis call skips the step (fail closed).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::Orphans;

pub fn spawn(orphans: Arc<Orphans>, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(orphans.config().interval_ms));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut pass: u64 = 0;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = cancel.cancelled() => return,
            }
            pass += 1;
            match orphans.recover().await {
                Ok(r) => {
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
                            "recovered orphaned tasks"
                        );
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cleaner pass skipped"),
            }
            match orphans.timeouts().await {
                Ok(t) if t.timed_out > 0 => {
                    metrics::counter!("muster_task_timeouts_total").increment(t.timed_out as u64);
                    // A timeout is a failed execution (retried or dead).
                    count_by_queue(&orphans, "muster_tasks_failed_total", &t.timed_out_queues);
                    count_by_queue(&orphans, "muster_tasks_dead_total", &t.dead_queues);
                    tracing::info!(
                        timed_out = t.timed_out,
                        retried = t.retried,
                        dead = t.dead,
                        "tasks timed out"
                    );
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "timeout pass skipped"),
            }
            if pass.is_multiple_of(10) {
                match orphans.sweep_all().await {
                    Ok(repaired) => {
                        for (q, recovered, removed) in repaired {
                            tracing::info!(queue = %q, recovered, removed, "sweep repaired indexes");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "sweep skipped"),
                }
            }
            orphans.passes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    })
}

/// Increments a task counter once per listed queue, under its capped label.
fn count_by_queue(orphans: &Orphans, name: &'static str, queues: &[String]) {
    for q in queues {
        metrics::counter!(name, "queue" => orphans.labels.label(q)).increment(1);
    }
}
