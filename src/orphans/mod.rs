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
//! - No stranded claim: a claimed task that its worker does not acknowledge
//!   within the claim's `ack_ms` is put back in its queue, its token
//!   refused and its attempt not counted, within `ack_ms +
//!   orphans.interval_ms` (`lua/unacked.lua`), unless its owner is gone
//!   (then it is an orphan, as above).

pub(crate) mod routes;
pub(crate) mod scripts;
pub(crate) mod worker;

use std::sync::Arc;

use serde::Serialize;
use utoipa::ToSchema;

use crate::config::{NodesConfig, OrphansConfig, TasksConfig};
use crate::store::{ScriptCtx, Store, StoreError};
use crate::traces::{Liveness, Traced};
use scripts::{Recover, RecoveryOpts, Scripts, Sweep, TimeoutsCall, UnackedCall};

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
    /// Each recovered task with a trace context: id, what recovery did
    /// (requeued, dead, cancelled), queue, traceparent (issue 39).
    pub traced: Vec<(String, String, String, String)>,
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
    /// Each timed-out task with a trace context: id, what followed
    /// (retried, dead, cancelled), queue, traceparent (issue 39).
    pub traced: Vec<Traced>,
}

/// What one pass of the claim lease did (`lua/unacked.lua`).
#[derive(Debug, Clone, Default)]
pub struct Unacked {
    /// Claimed tasks not acknowledged in time, back in their queues.
    pub requeued: i64,
    /// Those whose cancel was requested meanwhile: cancelled instead.
    pub cancelled: i64,
    pub grace_until: i64,
    /// The queue of each requeued task.
    pub requeued_queues: Vec<String>,
    /// Put back more than `claim.max_unacked` times with no attempt left:
    /// dead.
    pub dead: i64,
    /// The queue of each task that went dead.
    pub dead_queues: Vec<String>,
    /// Each task put back with a trace context: id, what happened to it
    /// (requeued, dead, cancelled), queue, traceparent (issue 39).
    pub traced: Vec<Traced>,
}

pub(crate) use muster_api::tasks::OrphanRecord;

pub struct Orphans {
    pub(crate) store: Store,
    cfg: OrphansConfig,
    node_ttl_ms: u64,
    /// `claim.max_unacked`.
    max_unacked: u32,
    tasks: TasksConfig,
    node_id: String,
    scripts: Scripts,
    /// The task metrics' queue labels (shared with `Tasks`).
    pub(crate) labels: Arc<crate::tasks::QueueLabels>,
    /// Cleaner passes this node completed per shard (recovery, timeouts, and
    /// the sweep when due), attempted or skipped: what a test waits on
    /// instead of sleeping through a few intervals.
    pub(crate) passes: Vec<std::sync::atomic::AtomicU64>,
    /// A span per traced task recovered (issue 39).
    tracer: crate::traces::Tracer,
}

impl Orphans {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        cfg: OrphansConfig,
        nodes: &NodesConfig,
        claim: &crate::config::ClaimConfig,
        tasks: TasksConfig,
        node_id: String,
        labels: Arc<crate::tasks::QueueLabels>,
        ctx: &ScriptCtx,
        tracer: crate::traces::Tracer,
    ) -> Arc<Orphans> {
        let shards = store.shard_count();
        Arc::new(Orphans {
            store,
            cfg,
            node_ttl_ms: nodes.ttl_ms,
            max_unacked: claim.max_unacked,
            tasks,
            node_id,
            labels,
            passes: (0..shards).map(|_| Default::default()).collect(),
            scripts: Scripts::new(ctx),
            tracer,
        })
    }

    /// Cleaner passes this node completed since it started in every shard
    /// (the fewest of any shard: each shard's cleaner runs on its own).
    pub fn passes(&self) -> u64 {
        self.passes
            .iter()
            .map(|p| p.load(std::sync::atomic::Ordering::Relaxed))
            .min()
            .unwrap_or(0)
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

    /// One cleaner pass in shard `s` (it decides by its own copy of the
    /// registry, in the same script as the recovery: G3).
    pub async fn recover_in(&self, s: &Store) -> Result<Recovery, StoreError> {
        let call = Recover {
            ttl_ms: self.node_ttl_ms,
            limit: 1000,
            opts: self.recovery_opts(),
        };
        let start = muster_trace::now_ns();
        let r = s.run(&self.scripts.recover, &call).await?;
        crate::traces::liveness(&self.tracer, Liveness::Recovered, &r.traced, start);
        Ok(r)
    }

    /// One timeout pass in shard `s`.
    pub async fn timeouts_in(&self, s: &Store) -> Result<Timeouts, StoreError> {
        let call = TimeoutsCall {
            ttl_ms: self.node_ttl_ms,
            limit: 1000,
            jitter: rand::random(),
            retention_ms: self.tasks.retention_ms,
            dead_retention_ms: self.tasks.dead_retention_ms,
            actor: &self.node_id,
        };
        let start = muster_trace::now_ns();
        let r = s.run(&self.scripts.timeouts, &call).await?;
        crate::traces::liveness(&self.tracer, Liveness::TimedOut, &r.traced, start);
        Ok(r)
    }

    /// One pass of the claim lease in shard `s`: claimed tasks not
    /// acknowledged within their `ack_ms` go back to their queues.
    pub async fn unacked_in(&self, s: &Store) -> Result<Unacked, StoreError> {
        let call = UnackedCall {
            ttl_ms: self.node_ttl_ms,
            limit: 1000,
            retention_ms: self.tasks.retention_ms,
            actor: &self.node_id,
            max_unacked: self.max_unacked,
            dead_retention_ms: self.tasks.dead_retention_ms,
        };
        let start = muster_trace::now_ns();
        let r = s.run(&self.scripts.unacked, &call).await?;
        crate::traces::liveness(&self.tracer, Liveness::NotAcknowledged, &r.traced, start);
        Ok(r)
    }

    /// The consistency sweep of every queue of shard `s`. Returns each
    /// queue that needed repairs, with (recovered, removed).
    pub async fn sweep_in(&self, s: &Store) -> Result<Vec<(String, i64, i64)>, StoreError> {
        let mut out = Vec::new();
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
        Ok(out)
    }

    /// The most recent recoveries, newest first, and the totals per action
    /// (each shard keeps its own: merged by time, summed).
    pub async fn history(&self, limit: usize) -> Result<(Vec<OrphanRecord>, Vec<(String, u64)>), StoreError> {
        let reads = self.store.every_shard().map(|s| async move {
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
        // A shard that cannot be read is left out (its master failed): the
        // others' history is shown; only when none answers is it an error.
        let mut read = Vec::new();
        let mut first_error = None;
        for r in futures_util::future::join_all(reads).await {
            match r {
                Ok(v) => read.push(v),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let (true, Some(e)) = (read.is_empty(), first_error) {
            return Err(e);
        }
        for (rows, counts) in read {
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
