//! The orphan cleaner and the timeout monitor.
//!
//! Invariants:
//! - G3: a running task whose owner stops heartbeating is requeued (front of
//!   its queue) or dead-lettered within `owner ttl + orphans.interval_ms`:
//!   every node runs `recover.lua` every interval, and the script decides
//!   deadness by Redis time itself (no dependency on another loop).
//! - Fail closed: when a pass's Redis call fails, the node does nothing; after
//!   Redis was unreachable or stalled for longer than a ttl, nothing is
//!   recovered or timed out for one more ttl (the grace in `liveness.lua`), so
//!   live owners can heartbeat first.
//! - Each recovery is one atomic, idempotent script; several nodes running the
//!   cleaner at once recover each task at most once per attempt.
//! - The orphan history is bounded by count and by age (G4).

pub mod routes;
pub(crate) mod scripts;
pub mod worker;

use std::sync::Arc;

use serde::Serialize;
use utoipa::ToSchema;

use crate::config::{NodesConfig, OrphansConfig, TasksConfig};
use crate::store::{ScriptCtx, Store, StoreError};
use scripts::{Recover, RecoveryOpts, Scripts, Sweep, TimeoutsCall};

/// What one cleaner pass did.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct Recovery {
    pub requeued: i64,
    pub dead: i64,
    pub cancelled: i64,
    /// Index entries of tasks that were no longer running under that owner.
    pub stale: i64,
    /// Non-zero while the post-stall grace holds (Redis ms).
    pub grace_until: i64,
    /// The queue of each task dead-lettered by this pass.
    pub dead_queues: Vec<String>,
}

/// What one timeout pass did.
#[derive(Debug, Clone, Default)]
pub struct Timeouts {
    pub timed_out: i64,
    pub retried: i64,
    pub dead: i64,
    pub grace_until: i64,
    /// The queue of each timed-out task, and of each one that went dead.
    pub timed_out_queues: Vec<String>,
    pub dead_queues: Vec<String>,
}

/// One recovered task.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct OrphanRecord {
    pub task: String,
    pub queue: String,
    /// The owner that stopped heartbeating.
    pub owner: String,
    /// The attempt that was lost.
    pub attempt: u32,
    /// Redis ms.
    pub detected_at: i64,
    /// requeued, dead or cancelled.
    pub action: String,
    #[serde(default)]
    pub reason: String,
}

pub struct Orphans {
    pub(crate) store: Store,
    cfg: OrphansConfig,
    node_ttl_ms: u64,
    tasks: TasksConfig,
    node_id: String,
    scripts: Scripts,
    /// The task metrics' queue labels (shared with `Tasks`).
    pub(crate) labels: Arc<crate::tasks::QueueLabels>,
    /// Cleaner passes this node completed (recovery, timeouts, and the
    /// sweep when due), attempted or skipped: what a test waits on instead
    /// of sleeping through a few intervals.
    pub(crate) passes: std::sync::atomic::AtomicU64,
}

impl Orphans {
    pub fn new(
        store: Store,
        cfg: OrphansConfig,
        nodes: &NodesConfig,
        tasks: TasksConfig,
        node_id: String,
        labels: Arc<crate::tasks::QueueLabels>,
        ctx: &ScriptCtx,
    ) -> Arc<Orphans> {
        Arc::new(Orphans {
            store,
            cfg,
            node_ttl_ms: nodes.ttl_ms,
            tasks,
            node_id,
            labels,
            scripts: Scripts::new(ctx),
            passes: Default::default(),
        })
    }

    /// Cleaner passes this node completed since it started.
    pub fn passes(&self) -> u64 {
        self.passes.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn config(&self) -> &OrphansConfig {
        &self.cfg
    }

    fn recovery_opts(&self) -> RecoveryOpts<'_> {
        RecoveryOpts {
            retention_ms: self.tasks.retention_ms,
            dead_retention_ms: self.tasks.dead_retention_ms,
            history_max: self.cfg.history_max,
            history_max_age_ms: self.cfg.history_max_age_ms,
            actor: &self.node_id,
        }
    }

    /// The shards of the namespace, one view each (one for one shard).
    fn shards(&self) -> impl Iterator<Item = Store> + '_ {
        (0..self.store.shards().len()).map(|i| self.store.shard(i))
    }

    /// One cleaner pass, in every shard (each decides by its own copy of
    /// the registry, in the same script as the recovery: G3).
    pub async fn recover(&self) -> Result<Recovery, StoreError> {
        let call = Recover {
            ttl_ms: self.node_ttl_ms,
            limit: 1000,
            opts: self.recovery_opts(),
        };
        let mut all = Recovery::default();
        for s in self.shards() {
            let r = s.run(&self.scripts.recover, &call).await?;
            all.requeued += r.requeued;
            all.dead += r.dead;
            all.cancelled += r.cancelled;
            all.stale += r.stale;
            all.grace_until = all.grace_until.max(r.grace_until);
            all.dead_queues.extend(r.dead_queues);
        }
        Ok(all)
    }

    /// One timeout pass, in every shard.
    pub async fn timeouts(&self) -> Result<Timeouts, StoreError> {
        let call = TimeoutsCall {
            ttl_ms: self.node_ttl_ms,
            limit: 1000,
            jitter: rand::random(),
            retention_ms: self.tasks.retention_ms,
            dead_retention_ms: self.tasks.dead_retention_ms,
            actor: &self.node_id,
        };
        let mut all = Timeouts::default();
        for s in self.shards() {
            let t = s.run(&self.scripts.timeouts, &call).await?;
            all.timed_out += t.timed_out;
            all.retried += t.retried;
            all.dead += t.dead;
            all.grace_until = all.grace_until.max(t.grace_until);
            all.timed_out_queues.extend(t.timed_out_queues);
            all.dead_queues.extend(t.dead_queues);
        }
        Ok(all)
    }

    /// The consistency sweep of every queue of every shard. Returns each
    /// queue that needed repairs, with (recovered, removed).
    pub async fn sweep_all(&self) -> Result<Vec<(String, i64, i64)>, StoreError> {
        let mut out = Vec::new();
        for s in self.shards() {
            let key = format!("{}:queues", s.keys().prefix());
            let queues: Vec<String> = s.query("queues_names", redis::cmd("SMEMBERS").arg(key)).await?;
            for q in queues {
                let call = Sweep {
                    queue: &q,
                    ttl_ms: self.node_ttl_ms,
                    window: 2000,
                    opts: self.recovery_opts(),
                };
                let r = s.run(&self.scripts.sweep, &call).await?;
                if r.recovered + r.removed > 0 {
                    out.push((q, r.recovered, r.removed));
                }
            }
        }
        Ok(out)
    }

    /// The most recent recoveries, newest first, and the totals per action
    /// (each shard keeps its own: merged by time, summed).
    pub async fn history(&self, limit: usize) -> Result<(Vec<OrphanRecord>, Vec<(String, u64)>), StoreError> {
        let reads = self.shards().map(|s| async move {
            let k = s.keys();
            let mut pipe = redis::pipe();
            pipe.cmd("ZRANGE")
                .arg(scripts::history_key(k))
                .arg(0)
                .arg(limit.saturating_sub(1))
                .arg("REV");
            pipe.cmd("HGETALL").arg(scripts::counts_key(k));
            s.pipe::<(Vec<String>, Vec<(String, u64)>)>("orphans_history", &pipe)
                .await
        });
        let mut records: Vec<OrphanRecord> = Vec::new();
        let mut totals: std::collections::BTreeMap<String, u64> = Default::default();
        for (rows, counts) in futures_util::future::try_join_all(reads).await? {
            records.extend(rows.iter().filter_map(|r| serde_json::from_str::<OrphanRecord>(r).ok()));
            for (action, n) in counts {
                *totals.entry(action).or_default() += n;
            }
        }
        // Stable: one shard's records keep their order.
        records.sort_by_key(|r| std::cmp::Reverse(r.detected_at));
        records.truncate(limit);
        Ok((records, totals.into_iter().collect()))
    }
}
