//! The node's membership loops: its heartbeat, every `nodes.heartbeat_ms`,
//! and the prune pass that marks expired nodes dead, on the same cadence.
//!
//! Both run per shard of a split namespace (`redis.shards`): each shard's
//! registry is heartbeaten and pruned on its own, so a master that stalls
//! or fails over costs the node its registration in that master's shards
//! only ([`Health`] refuses work there and nowhere else), and the other
//! shards' prune passes keep their cadence (G3 holds there at its usual
//! bound).
//!
//! The two are separate loops, and each heartbeat runs as its own task, so
//! a heartbeat is sent on schedule whatever the prune pass or a slow call
//! before it does: under a slow link to Redis the gaps between heartbeats
//! stay one interval, and the node is not declared dead for calls that all
//! succeed (G3). Every call is bounded by `redis.timeout_ms`, so at most a
//! few heartbeats are in flight at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::{JoinHandle, JoinSet};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::{NodeKind, Nodes};
use crate::health::Health;
use crate::store::{PassLog, Store};

/// Who this node is, as it registers itself.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub id: String,
    pub addr: String,
    pub labels: BTreeMap<String, String>,
}

/// Runs until `cancel`, then waits for the heartbeats still in flight (so
/// none lands after the node has left). Errors are logged (once per outage
/// and shard) and retried at the next tick; they never mark anyone dead.
pub(crate) fn spawn(nodes: Arc<Nodes>, me: Identity, health: Arc<Health>, cancel: CancellationToken) -> JoinHandle<()> {
    let store = nodes.store().clone();
    store.spawn_each_shard(move |shard| {
        let (nodes, me, health, cancel) = (nodes.clone(), me.clone(), health.clone(), cancel.clone());
        async move {
            let prune = tokio::spawn(prune_loop(nodes.clone(), shard.clone(), cancel.clone()));
            heartbeat_loop(nodes, shard, me, health, cancel).await;
            let _ = prune.await;
        }
    })
}

async fn heartbeat_loop(nodes: Arc<Nodes>, shard: Store, me: Identity, health: Arc<Health>, cancel: CancellationToken) {
    let every = Duration::from_millis(nodes.config().heartbeat_ms);
    let mut tick = tokio::time::interval(every);
    // Skip, not Delay: a tick missed while the runtime was busy is not made
    // up in a burst, and the next one keeps the schedule.
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let log = Arc::new(std::sync::Mutex::new(PassLog::new("heartbeat", &shard)));
    let mut in_flight = JoinSet::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => break,
        }
        while in_flight.try_join_next().is_some() {}
        let (nodes, shard, me, health, log) = (nodes.clone(), shard.clone(), me.clone(), health.clone(), log.clone());
        in_flight.spawn(async move { beat(&nodes, &shard, &me, &health, &log).await });
    }
    while in_flight.join_next().await.is_some() {}
}

async fn beat(nodes: &Nodes, shard: &Store, me: &Identity, health: &Health, log: &std::sync::Mutex<PassLog>) {
    let started = Instant::now();
    let cfg = nodes.config();
    let version = env!("CARGO_PKG_VERSION");
    let i = shard.shard_index();
    let outcome = nodes
        .heartbeat_in(
            shard,
            &me.id,
            NodeKind::Node,
            "",
            cfg.ttl_ms,
            &me.addr,
            version,
            &me.labels,
        )
        .await;
    let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
    match outcome {
        Ok(b) => {
            health.heartbeat_ok(i, started, b.draining);
            log.ok();
            if b.joined {
                tracing::info!(node = %me.id, shard = i, "joined the cluster");
            }
        }
        Err(e) => {
            health.heartbeat_failed(i);
            log.failed(&e);
        }
    }
    drop(log);
    if i == 0 && shard.shard_count() > 1 {
        watch_skew(shard, health);
    }
}

/// Exports the skew between the masters' clocks and this node's failing
/// shards, and warns (at most once a minute) when the skew passes a quarter
/// of `redis.timeout_ms`: deadlines are per master, so skew costs no
/// correctness (G12), but it says the masters' clocks are not synchronised.
fn watch_skew(store: &Store, health: &Health) {
    use std::sync::atomic::{AtomicI64, Ordering};
    static WARNED_AT: AtomicI64 = AtomicI64::new(0);
    let skew = store.clock_skew_ms();
    metrics::gauge!("muster_redis_clock_skew_seconds").set(skew as f64 / 1000.0);
    metrics::gauge!("muster_shards_failing").set(health.failing_count() as f64);
    let bound = store.timeout().as_millis() as i64 / 4;
    let now = crate::store::node_clock_ms();
    if skew > bound && now - WARNED_AT.load(Ordering::Relaxed) > 60_000 {
        WARNED_AT.store(now, Ordering::Relaxed);
        tracing::warn!(
            skew_ms = skew,
            bound_ms = bound,
            "the Redis masters' clocks differ by more than redis.timeout_ms / 4: synchronise them (NTP); \
             deadlines follow each master's own clock, so nothing is applied late"
        );
    }
}

async fn prune_loop(nodes: Arc<Nodes>, shard: Store, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(nodes.config().heartbeat_ms));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut log = PassLog::new("prune", &shard);
    let label = shard.shard_index().to_string();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        if let Some(p) = log.outcome(nodes.prune_in(&shard).await) {
            // Shard 0's registry is the gauge's: every shard registers every
            // node.
            if shard.shard_index() == 0 {
                metrics::gauge!("muster_nodes", "state" => "alive").set(p.alive as f64);
                metrics::gauge!("muster_nodes", "state" => "expired").set(p.expired as f64);
            }
            if p.marked > 0 {
                tracing::warn!(count = p.marked, shard = %label, "nodes marked dead");
            }
        }
    }
}
