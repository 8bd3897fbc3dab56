//! The node's membership loops: its heartbeat, every `nodes.heartbeat_ms`,
//! and the prune pass that marks expired nodes dead, on the same cadence.
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

/// Who this node is, as it registers itself.
#[derive(Debug, Clone)]
pub struct Identity {
    pub id: String,
    pub addr: String,
    pub labels: BTreeMap<String, String>,
}

/// Runs until `cancel`, then waits for the heartbeats still in flight (so
/// none lands after the node has left). Errors are logged (once per outage)
/// and retried at the next tick; they never mark anyone dead.
pub fn spawn(nodes: Arc<Nodes>, me: Identity, health: Arc<Health>, cancel: CancellationToken) -> JoinHandle<()> {
    let prune = tokio::spawn(prune_loop(nodes.clone(), cancel.clone()));
    tokio::spawn(async move {
        heartbeat_loop(nodes, me, health, cancel).await;
        let _ = prune.await;
    })
}

async fn heartbeat_loop(nodes: Arc<Nodes>, me: Identity, health: Arc<Health>, cancel: CancellationToken) {
    let every = Duration::from_millis(nodes.config().heartbeat_ms);
    let mut tick = tokio::time::interval(every);
    // Skip, not Delay: a tick missed while the runtime was busy is not made
    // up in a burst, and the next one keeps the schedule.
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut in_flight = JoinSet::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => break,
        }
        while in_flight.try_join_next().is_some() {}
        let (nodes, me, health, failing) = (nodes.clone(), me.clone(), health.clone(), failing.clone());
        in_flight.spawn(async move { beat(&nodes, &me, &health, &failing).await });
    }
    while in_flight.join_next().await.is_some() {}
}

async fn beat(nodes: &Nodes, me: &Identity, health: &Health, failing: &std::sync::atomic::AtomicBool) {
    use std::sync::atomic::Ordering;
    let started = Instant::now();
    let cfg = nodes.config();
    let version = env!("CARGO_PKG_VERSION");
    match nodes
        .heartbeat(&me.id, NodeKind::Node, cfg.ttl_ms, &me.addr, version, &me.labels)
        .await
    {
        Ok(hb) => {
            health.heartbeat_ok(started, hb.state == "draining");
            if failing.swap(false, Ordering::Relaxed) {
                tracing::info!(node = %me.id, rejoined = hb.joined, "heartbeat succeeds again");
            } else if hb.joined {
                tracing::info!(node = %me.id, "joined the cluster");
            }
        }
        Err(e) => {
            health.heartbeat_failed();
            if !failing.swap(true, Ordering::Relaxed) {
                tracing::warn!(node = %me.id, error = %e, "heartbeat failed; this node is not ready until it succeeds");
            }
        }
    }
}

async fn prune_loop(nodes: Arc<Nodes>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(nodes.config().heartbeat_ms));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        match nodes.prune().await {
            Ok(p) => {
                metrics::gauge!("muster_nodes", "state" => "alive").set(p.alive as f64);
                metrics::gauge!("muster_nodes", "state" => "expired").set(p.expired as f64);
                if p.marked > 0 {
                    tracing::warn!(count = p.marked, "nodes marked dead");
                }
            }
            Err(e) => tracing::debug!(error = %e, "prune failed"),
        }
    }
}
