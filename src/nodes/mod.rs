//! Node registry: who is in the cluster and who is alive.
//!
//! Invariants:
//! - Liveness is one sorted set scored by heartbeat expiry in Redis time (G11):
//!   a node is alive while its score is ahead of Redis `TIME`. No node's own
//!   clock takes part.
//! - A node is *marked* dead (event `node.dead`, orphan recovery allowed)
//!   only after a liveness pass (`lua/liveness.lua`), which gives every entry
//!   its lease back after Redis was unreachable or stalled, so an outage of
//!   any length never makes a live node look dead.
//! - A Redis error never marks anyone dead: every dead decision is made inside
//!   Redis, and a node that cannot reach Redis decides nothing.
//! - Info hashes carry a TTL; the sorted set is bounded by `nodes.max_nodes`
//!   and pruned, so nothing here grows without bound (G4).

pub mod routes;
mod scripts;
pub mod worker;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use utoipa::ToSchema;

use crate::config::NodesConfig;
use crate::store::{ScriptCtx, Store, StoreError};
use scripts::{DrainReply, HeartbeatOutcome, LeaveReply, Scripts};

#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    #[error("the cluster already has the maximum of {0} registered nodes (nodes.max_nodes)")]
    TooMany(u32),
    #[error("no live node `{0}`")]
    NotFound(String),
    #[error("`{0}` is a muster node, not a worker: only an admin removes nodes (DELETE /api/v1/nodes/{0})")]
    NotAWorker(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<NodesError> for crate::error::ApiError {
    fn from(e: NodesError) -> Self {
        use crate::error::ApiError;
        match e {
            NodesError::TooMany(_) => ApiError::Conflict {
                message: e.to_string(),
                extra: Default::default(),
            },
            NodesError::NotFound(_) => ApiError::NotFound(e.to_string()),
            NodesError::NotAWorker(_) => ApiError::Conflict {
                message: e.to_string(),
                extra: Default::default(),
            },
            NodesError::Store(s) => s.into(),
        }
    }
}

/// What kind of member a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    /// A muster server process.
    Node,
    /// An external worker that heartbeats over REST.
    Worker,
}

impl NodeKind {
    fn as_str(self) -> &'static str {
        match self {
            NodeKind::Node => "node",
            NodeKind::Worker => "worker",
        }
    }
}

/// A node's state as seen now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Heartbeating.
    Alive,
    /// Alive, but takes no new work.
    Draining,
    /// Its heartbeat expired and it is not yet marked dead (at most one
    /// cleaner pass, or the grace after a Redis outage).
    Late,
    /// Marked dead: its tasks are being or have been recovered.
    Dead,
    /// Left the cluster; kept until its tasks are recovered.
    Left,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Alive => "alive",
            NodeState::Draining => "draining",
            NodeState::Late => "late",
            NodeState::Dead => "dead",
            NodeState::Left => "left",
        }
    }
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One registered node.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NodeInfo {
    pub id: String,
    pub kind: String,
    pub state: NodeState,
    /// Heartbeat due soon (less than half its ttl left) but not yet expired.
    pub suspect: bool,
    pub addr: String,
    pub version: String,
    pub labels: BTreeMap<String, String>,
    /// Redis ms.
    pub started_at: Option<i64>,
    /// Redis ms of the last heartbeat.
    pub last_seen: Option<i64>,
    /// Redis ms at which the last heartbeat expires.
    pub expires_at: i64,
    pub heartbeat_age_ms: Option<i64>,
    pub ttl_ms: Option<i64>,
}

/// The registry as of one Redis instant.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NodeList {
    /// Redis time of the listing, ms.
    pub now: i64,
    pub nodes: Vec<NodeInfo>,
    pub alive: usize,
    pub draining: usize,
    pub dead: usize,
}

/// Result of one heartbeat.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Heartbeat {
    pub joined: bool,
    /// Redis ms.
    pub now: i64,
    pub expires_at: i64,
    /// `active` or `draining`.
    pub state: String,
}

/// Result of one prune pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct Prune {
    pub marked: i64,
    pub removed: i64,
    pub alive: i64,
    pub expired: i64,
    /// Non-zero while task timeouts wait after a Redis stall (Redis ms).
    pub grace_until: i64,
}

/// The registry service.
pub struct Nodes {
    store: Store,
    cfg: NodesConfig,
    scripts: Scripts,
}

impl Nodes {
    pub fn new(store: Store, cfg: NodesConfig, ctx: &ScriptCtx) -> Arc<Nodes> {
        let scripts = Scripts::new(ctx);
        Arc::new(Nodes { store, cfg, scripts })
    }

    pub fn config(&self) -> &NodesConfig {
        &self.cfg
    }

    /// Registers or refreshes `id` for `ttl_ms`.
    pub async fn heartbeat(
        &self,
        id: &str,
        kind: NodeKind,
        ttl_ms: u64,
        addr: &str,
        version: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<Heartbeat, NodesError> {
        let labels = serde_json::to_string(labels).unwrap_or_else(|_| "{}".into());
        let call = scripts::Heartbeat {
            id,
            kind,
            ttl_ms,
            info_ttl_ms: ttl_ms + self.cfg.dead_retention_ms,
            max_nodes: self.cfg.max_nodes,
            addr,
            version,
            labels: &labels,
        };
        let reply = self.store.run_on_every_shard(&self.scripts.heartbeat, &call).await?;
        // The script read Redis time before this reply arrived: a sample for
        // the node's estimate of Redis time (script deadlines, G12).
        self.store.observe_clock(reply.now, std::time::Instant::now());
        if reply.outcome == HeartbeatOutcome::TooMany {
            return Err(NodesError::TooMany(self.cfg.max_nodes));
        }
        Ok(Heartbeat {
            joined: reply.outcome == HeartbeatOutcome::Joined,
            now: reply.now,
            expires_at: reply.expires_at,
            state: reply.state,
        })
    }

    /// Marks expired nodes dead and removes long-dead ones.
    pub async fn prune(&self) -> Result<Prune, NodesError> {
        let call = scripts::Prune {
            ttl_ms: self.cfg.ttl_ms,
            dead_retention_ms: self.cfg.dead_retention_ms,
            limit: 100,
        };
        Ok(self.store.run_on_every_shard(&self.scripts.prune, &call).await?)
    }

    /// Marks a live node draining. Returns false if it already was.
    pub async fn drain(&self, id: &str, actor: &str) -> Result<bool, NodesError> {
        let call = scripts::Drain { id, actor };
        let reply = self.store.run_on_every_shard(&self.scripts.drain, &call).await?;
        match reply {
            DrainReply::NotAlive => Err(NodesError::NotFound(id.into())),
            DrainReply::Marked => Ok(true),
            DrainReply::AlreadyDraining => Ok(false),
        }
    }

    /// Removes a node from the cluster (see `leave.lua`).
    pub async fn leave(&self, id: &str, reason: &str) -> Result<(), NodesError> {
        self.leave_as(id, reason, None).await
    }

    /// An external worker leaves: like [`Nodes::leave`], for worker
    /// registrations only, checked in the same script.
    pub async fn leave_worker(&self, id: &str) -> Result<(), NodesError> {
        self.leave_as(id, "left", Some(NodeKind::Worker)).await
    }

    async fn leave_as(&self, id: &str, reason: &str, only: Option<NodeKind>) -> Result<(), NodesError> {
        let call = scripts::Leave { id, reason, only };
        let reply = self.store.run_on_every_shard(&self.scripts.leave, &call).await?;
        match reply {
            LeaveReply::NotFound => Err(NodesError::NotFound(id.into())),
            LeaveReply::OtherKind => Err(NodesError::NotAWorker(id.into())),
            LeaveReply::Removed | LeaveReply::Kept => Ok(()),
        }
    }

    /// Every registered node, read in two pipelined round trips.
    pub async fn list(&self) -> Result<NodeList, NodesError> {
        let k = self.store.keys();
        let mut p = redis::pipe();
        p.cmd("TIME")
            .cmd("ZRANGE")
            .arg(k.nodes())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES");
        let ((secs, micros), members): ((i64, i64), Vec<(String, f64)>) = self.store.pipe("nodes_list", &p).await?;
        let now = secs * 1000 + micros / 1000;
        let mut p = redis::pipe();
        for (id, _) in &members {
            p.cmd("HGETALL").arg(k.node(id));
        }
        let infos: Vec<BTreeMap<String, String>> = if members.is_empty() {
            Vec::new()
        } else {
            self.store.pipe("nodes_info", &p).await?
        };
        let mut list = NodeList {
            now,
            nodes: Vec::with_capacity(members.len()),
            alive: 0,
            draining: 0,
            dead: 0,
        };
        for ((id, score), info) in members.into_iter().zip(infos) {
            let node = node_info(id, score as i64, &info, now);
            match node.state {
                NodeState::Alive => list.alive += 1,
                NodeState::Draining => {
                    list.alive += 1;
                    list.draining += 1
                }
                NodeState::Dead | NodeState::Late | NodeState::Left => list.dead += 1,
            }
            list.nodes.push(node);
        }
        list.nodes.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(list)
    }

    /// The state of one node, if registered.
    pub async fn get(&self, id: &str) -> Result<Option<NodeInfo>, NodesError> {
        let k = self.store.keys();
        let mut p = redis::pipe();
        p.cmd("TIME")
            .cmd("ZSCORE")
            .arg(k.nodes())
            .arg(id)
            .cmd("HGETALL")
            .arg(k.node(id));
        let ((secs, micros), score, info): ((i64, i64), Option<f64>, BTreeMap<String, String>) =
            self.store.pipe("node_get", &p).await?;
        let now = secs * 1000 + micros / 1000;
        Ok(score.map(|s| node_info(id.to_string(), s as i64, &info, now)))
    }
}

fn node_info(id: String, expires_at: i64, info: &BTreeMap<String, String>, now: i64) -> NodeInfo {
    let num = |f: &str| info.get(f).and_then(|v| v.parse::<i64>().ok());
    let stored = info.get("state").map(String::as_str).unwrap_or("");
    let state = if stored == "left" {
        NodeState::Left
    } else if expires_at > now {
        if stored == "draining" {
            NodeState::Draining
        } else {
            NodeState::Alive
        }
    } else if info.contains_key("dead_at") || info.is_empty() {
        NodeState::Dead
    } else {
        NodeState::Late
    };
    let ttl_ms = num("ttl_ms");
    let suspect = matches!(state, NodeState::Alive | NodeState::Draining)
        && ttl_ms.is_some_and(|ttl| (expires_at - now) * 2 < ttl);
    let last_seen = num("last_seen");
    NodeInfo {
        kind: info.get("kind").cloned().unwrap_or_else(|| "node".into()),
        state,
        suspect,
        addr: info.get("addr").cloned().unwrap_or_default(),
        version: info.get("version").cloned().unwrap_or_default(),
        labels: info
            .get("labels")
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_default(),
        started_at: num("started_at"),
        last_seen,
        expires_at,
        heartbeat_age_ms: last_seen.map(|s| (now - s).max(0)),
        ttl_ms,
        id,
    }
}
