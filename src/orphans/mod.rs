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
pub mod worker;

use std::sync::Arc;

use redis::Value;
use serde::Serialize;
use utoipa::ToSchema;

use crate::config::{NodesConfig, OrphansConfig, TasksConfig};
use crate::store::reply::{int, text};
use crate::store::{Lua, ScriptCtx, Store, StoreError};

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

struct Scripts {
    recover: Lua,
    timeouts: Lua,
    sweep: Lua,
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
        let l = |name, src| Lua::load(name, src, ctx);
        Arc::new(Orphans {
            store,
            cfg,
            node_ttl_ms: nodes.ttl_ms,
            tasks,
            node_id,
            labels,
            scripts: Scripts {
                recover: l("orphans_recover", include_str!("lua/recover.lua")),
                timeouts: l("orphans_timeouts", include_str!("lua/timeouts.lua")),
                sweep: l("orphans_sweep", include_str!("lua/sweep.lua")),
            },
        })
    }

    pub fn config(&self) -> &OrphansConfig {
        &self.cfg
    }

    fn recovery_args(&self) -> [String; 5] {
        [
            self.tasks.retention_ms.to_string(),
            self.tasks.dead_retention_ms.to_string(),
            self.cfg.history_max.to_string(),
            self.cfg.history_max_age_ms.to_string(),
            self.node_id.clone(),
        ]
    }

    /// One cleaner pass.
    pub async fn recover(&self) -> Result<Recovery, StoreError> {
        let mut args = vec![self.node_ttl_ms.to_string(), "1000".to_string()];
        args.extend(self.recovery_args());
        let r: Vec<Value> = self
            .store
            .eval(&self.scripts.recover, &[self.store.keys().nodes()], &args)
            .await?;
        let g = |i: usize| r.get(i).map(int).unwrap_or(0);
        Ok(Recovery {
            requeued: g(0),
            dead: g(1),
            cancelled: g(2),
            stale: g(3),
            grace_until: g(4),
            dead_queues: names(r.get(5)),
        })
    }

    /// One timeout pass.
    pub async fn timeouts(&self) -> Result<Timeouts, StoreError> {
        let jitter: f64 = rand::random();
        let key = format!("{}:deadlines", self.store.keys().prefix());
        let r: Vec<Value> = self
            .store
            .eval(
                &self.scripts.timeouts,
                &[key],
                &[
                    self.node_ttl_ms.to_string(),
                    "1000".into(),
                    format!("{jitter:.6}"),
                    self.tasks.retention_ms.to_string(),
                    self.tasks.dead_retention_ms.to_string(),
                    self.node_id.clone(),
                ],
            )
            .await?;
        let g = |i: usize| r.get(i).map(int).unwrap_or(0);
        Ok(Timeouts {
            timed_out: g(0),
            retried: g(1),
            dead: g(2),
            grace_until: g(3),
            timed_out_queues: names(r.get(4)),
            dead_queues: names(r.get(5)),
        })
    }

    /// The consistency sweep of one queue. Returns (recovered, removed).
    pub async fn sweep(&self, queue: &str) -> Result<(i64, i64), StoreError> {
        let key = format!("{}:q:{queue}:running", self.store.keys().prefix());
        let mut args = vec![queue.to_string(), self.node_ttl_ms.to_string(), "2000".to_string()];
        args.extend(self.recovery_args());
        let r: Vec<Value> = self.store.eval(&self.scripts.sweep, &[key], &args).await?;
        Ok((r.first().map(int).unwrap_or(0), r.get(1).map(int).unwrap_or(0)))
    }

    /// The most recent recoveries, newest first, and the totals per action.
    pub async fn history(&self, limit: usize) -> Result<(Vec<OrphanRecord>, Vec<(String, u64)>), StoreError> {
        let p = self.store.keys().prefix();
        let mut pipe = redis::pipe();
        pipe.cmd("ZRANGE")
            .arg(format!("{p}:orphans:history"))
            .arg(0)
            .arg(limit.saturating_sub(1))
            .arg("REV");
        pipe.cmd("HGETALL").arg(format!("{p}:orphans:counts"));
        let (rows, counts): (Vec<String>, Vec<(String, u64)>) = self.store.pipe("orphans_history", &pipe).await?;
        let records = rows.iter().filter_map(|r| serde_json::from_str(r).ok()).collect();
        Ok((records, counts))
    }
}

/// A list of names in a script reply (absent: none).
fn names(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(items)) => items.iter().map(text).collect(),
        _ => Vec::new(),
    }
}
