//! The janitor loop: promotes due delayed tasks, trims finished tasks past
//! retention from the indexes, forgets empty queues, and refreshes the
//! `muster_queue_depth` gauges. Every node runs it; each step is an
//! idempotent script, so running it on several nodes is harmless.
//!
//! It runs per shard of a split namespace, each shard on its own cadence (a
//! stalled master holds up only its own shards), beside the per-shard read
//! of the shard's set of queues that tells claims where a queue's tasks are
//! (`shards.rs`). The gauges sum the latest rows of every shard: a shard
//! that cannot be read keeps its last rows.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::Tasks;
use super::shards::REFRESH;
use crate::store::{PassLog, Store};

/// Each shard's latest janitor rows (queue, stats), for the gauges.
type Rows = Arc<Mutex<Vec<Vec<(String, [i64; 10])>>>>;

pub(crate) fn spawn(tasks: Arc<Tasks>, cancel: CancellationToken) -> JoinHandle<()> {
    let rows: Rows = Arc::new(Mutex::new(vec![Vec::new(); tasks.store().shard_count()]));
    let store = tasks.store().clone();
    store.spawn_each_shard(move |shard| {
        let (tasks, rows, cancel) = (tasks.clone(), rows.clone(), cancel.clone());
        async move {
            let refresh = tokio::spawn(refresh_loop(tasks.clone(), shard.clone(), cancel.clone()));
            let slots = tokio::spawn(return_slots_loop(tasks.clone(), shard.clone(), cancel.clone()));
            janitor_loop(tasks, shard, rows, cancel).await;
            let _ = refresh.await;
            let _ = slots.await;
        }
    })
}

async fn janitor_loop(tasks: Arc<Tasks>, shard: Store, rows: Rows, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(tasks.config().janitor_interval_ms));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut log = PassLog::new("janitor", &shard);
    let mut limit_labels = BTreeSet::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        let Some(mine) = log.outcome(tasks.janitor_in(&shard).await) else {
            continue;
        };
        let all = {
            let mut rows = rows.lock().unwrap_or_else(|p| p.into_inner());
            rows[shard.shard_index()] = mine;
            rows.clone()
        };
        if all.len() > 1 {
            match tasks.converge_pause(shard.shard_index(), &all).await {
                Ok(n) if n > 0 => tracing::info!(
                    queues = n,
                    shard = shard.shard_index(),
                    "pause state copied to this shard"
                ),
                Ok(_) => {}
                Err(e) => log.failed(&e),
            }
        }
        set_gauges(&tasks, all.into_iter().flatten());
        if shard.shard_index() == 0 {
            match tasks.limits().await {
                Ok(limits) => set_limit_gauges(&mut limit_labels, &limits),
                Err(e) => log.failed(&e),
            }
        }
    }
}

/// The flow-control limits' gauges: named limits only (templates `name:*`
/// have no use of their own, and their keys are unbounded); a limit deleted
/// since the last pass drops to zero.
fn set_limit_gauges(seen: &mut BTreeSet<String>, limits: &[muster_api::limits::LimitInfo]) {
    let now: BTreeSet<String> = limits
        .iter()
        .filter(|l| !l.name.ends_with(":*"))
        .map(|l| l.name.clone())
        .collect();
    for gone in seen.difference(&now) {
        for name in ["muster_limit_running", "muster_limit_tokens", "muster_limit_waiting"] {
            metrics::gauge!(name, "limit" => gone.clone()).set(0.0);
        }
    }
    for l in limits.iter().filter(|l| now.contains(&l.name)) {
        metrics::gauge!("muster_limit_running", "limit" => l.name.clone()).set(l.running as f64);
        metrics::gauge!("muster_limit_waiting", "limit" => l.name.clone()).set(l.waiting as f64);
        if let Some(t) = l.tokens {
            metrics::gauge!("muster_limit_tokens", "limit" => l.name.clone()).set(t as f64);
        }
    }
    *seen = now;
}

/// Sums per label first: queues beyond the label limit share `other`, which
/// must be their total, not the last; a queue's shards add up too. Latency:
/// the worst of the rows sharing a label.
fn set_gauges(tasks: &Tasks, rows: impl Iterator<Item = (String, [i64; 10])>) {
    let mut depth: BTreeMap<String, ([i64; 4], i64)> = Default::default();
    for (queue, r) in rows {
        let (d, latency) = depth.entry(tasks.labels.label(&queue)).or_default();
        for (k, v) in [r[3], r[4], r[5], r[6]].into_iter().enumerate() {
            d[k] += v;
        }
        *latency = (*latency).max(r[7]);
    }
    for (label, (d, latency)) in depth {
        for (state, v) in ["queued", "delayed", "running", "dead"].into_iter().zip(d) {
            metrics::gauge!("muster_queue_depth", "queue" => label.clone(), "state" => state).set(v as f64);
        }
        metrics::gauge!("muster_queue_latency_seconds", "queue" => label).set(latency as f64 / 1000.0);
    }
}

/// Split namespaces: reads the shard's set of queues every [`REFRESH`], so
/// claims know which shards hold a queue's tasks without waiting for any
/// shard (see `Tasks::shards_of`).
async fn refresh_loop(tasks: Arc<Tasks>, shard: Store, cancel: CancellationToken) {
    if shard.shard_count() == 1 {
        return;
    }
    let mut tick = tokio::time::interval(REFRESH);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut log = PassLog::new("queue_shards", &shard);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        log.outcome(tasks.refresh_queue_shards(&shard).await);
    }
}

/// Split namespaces, shards but 0: hands the shard's outbox of limit slots
/// to shard 0 every [`RETURN_EVERY`] (at once again while it is full), so a
/// concurrency slot held by a task that ended here is free again within it.
async fn return_slots_loop(tasks: Arc<Tasks>, shard: Store, cancel: CancellationToken) {
    if shard.shard_count() == 1 || shard.shard_index() == 0 {
        return;
    }
    let mut tick = tokio::time::interval(RETURN_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut log = PassLog::new("limit_slots", &shard);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        while let Some(n) = log.outcome(tasks.return_limit_slots(&shard).await) {
            if n < super::limits::RETURN_BATCH || cancel.is_cancelled() {
                break;
            }
        }
    }
}

/// How often a node hands each shard's outbox of limit slots to shard 0.
const RETURN_EVERY: Duration = Duration::from_millis(50);
