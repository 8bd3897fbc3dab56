//! Background passes per shard: failure isolation for the loops.
//!
//! On a namespace split into shards (`redis.shards`) the shards may live on
//! different Cluster masters. A loop that walked the shards one after the
//! other, or joined them, would stop at a stalled master and hold up every
//! shard behind it: a dead worker's tasks in a healthy shard would wait for
//! the whole outage (G3), and the liveness pass of the shards it skipped
//! would then read the gap as a stall and push their recovery back again.
//!
//! So every background loop runs once per shard ([`Store::spawn_each_shard`]),
//! each on its own cadence: a shard whose master fails is logged, counted
//! (`muster_shard_pass_failures_total{pass, shard}`) and retried at its next
//! tick, and the other shards' loops never wait for it. With one shard
//! this is the single loop it always was.

use std::future::Future;

use tokio::task::{JoinHandle, JoinSet};

use super::Store;

impl Store {
    /// Spawns `body` once per shard, each given that shard's view; the
    /// handle ends when every shard's loop has ended (they stop on their
    /// own cancellation token).
    pub fn spawn_each_shard<F, Fut>(&self, body: F) -> JoinHandle<()>
    where
        F: Fn(Store) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut set = JoinSet::new();
        for shard in self.every_shard() {
            set.spawn(body(shard));
        }
        tokio::spawn(async move { while set.join_next().await.is_some() {} })
    }
}

/// The outcome log of one background pass in one shard: a failure is
/// counted every time and logged when the shard starts failing (a warning)
/// and when it recovers, so an outage of one master is one warning per pass
/// and shard, not one per tick.
pub(crate) struct PassLog {
    pass: &'static str,
    shard: usize,
    label: String,
    failing: bool,
}

impl PassLog {
    pub(crate) fn new(pass: &'static str, store: &Store) -> PassLog {
        let shard = store.shard_index();
        // A zero series from the pass's start, so alerts can tell no
        // failures from not exported (issue 36 N15).
        metrics::counter!("muster_shard_pass_failures_total", "pass" => pass, "shard" => shard.to_string())
            .increment(0);
        PassLog {
            pass,
            shard,
            label: shard.to_string(),
            failing: false,
        }
    }

    /// The pass succeeded in this shard.
    pub(crate) fn ok(&mut self) {
        if std::mem::take(&mut self.failing) {
            tracing::info!(pass = self.pass, shard = self.shard, "background pass succeeds again");
        }
    }

    /// The pass failed in this shard: it is skipped until the next tick;
    /// the other shards go on.
    pub(crate) fn failed(&mut self, error: &dyn std::fmt::Display) {
        metrics::counter!("muster_shard_pass_failures_total", "pass" => self.pass, "shard" => self.label.clone())
            .increment(1);
        if std::mem::replace(&mut self.failing, true) {
            tracing::debug!(pass = self.pass, shard = self.shard, %error, "background pass failed again");
        } else {
            tracing::warn!(
                pass = self.pass,
                shard = self.shard,
                %error,
                "background pass failed in this shard; the other shards go on"
            );
        }
    }

    /// Logs `r`'s outcome and hands back its value.
    pub(crate) fn outcome<T, E: std::fmt::Display>(&mut self, r: Result<T, E>) -> Option<T> {
        match r {
            Ok(v) => {
                self.ok();
                Some(v)
            }
            Err(e) => {
                self.failed(&e);
                None
            }
        }
    }
}
