//! What the registry holds: kinds, a shard's heartbeat, a prune pass. What
//! it answers (states, a node's record, a listing, a heartbeat's outcome)
//! is the contract's (`muster_api::nodes`).

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

pub(crate) use muster_api::nodes::{NodeHeartbeatAnswer as Heartbeat, NodeInfo, NodeList, NodeState};

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
    pub(super) fn as_str(self) -> &'static str {
        match self {
            NodeKind::Node => "node",
            NodeKind::Worker => "worker",
        }
    }
}

/// One shard's answer to a heartbeat.
#[derive(Debug, Clone, Copy)]
pub struct ShardBeat {
    pub joined: bool,
    /// Redis ms, by that shard's master.
    pub now: i64,
    pub expires_at: i64,
    pub draining: bool,
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

/// A node's record as the API shows it: its hash, its expiry in the
/// registry (Redis ms) and Redis time now.
pub(super) fn node_info(id: String, expires_at: i64, info: &BTreeMap<String, String>, now: i64) -> NodeInfo {
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
        shards_not_alive: Vec::new(),
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
