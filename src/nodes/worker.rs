//! The node's membership loop: heartbeat, then prune, every `nodes.heartbeat_ms`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
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

/// Runs until `cancel`. Errors are logged (once per outage) and retried at the
/// next tick; they never mark anyone dead.
pub fn spawn(nodes: Arc<Nodes>, me: Identity, health: Arc<Health>, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let cfg = nodes.config().clone();
        let mut tick = tokio::time::interval(Duration::from_millis(cfg.heartbeat_ms));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = cancel.cancelled() => return,
            }
            let version = env!("CARGO_PKG_VERSION");
            match nodes
                .heartbeat(&me.id, NodeKind::Node, cfg.ttl_ms, &me.addr, version, &me.labels)
                .await
            {
                Ok(hb) => {
                    health.heartbeat_ok(hb.state == "draining");
                    if failing {
                        tracing::info!(node = %me.id, rejoined = hb.joined, "heartbeat succeeds again");
                        failing = false;
                    } else if hb.joined {
                        tracing::info!(node = %me.id, "joined the cluster");
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(node = %me.id, error = %e, "heartbeat failed; this node is not ready until it succeeds");
                        failing = true;
                    }
                    continue;
                }
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
    })
}
