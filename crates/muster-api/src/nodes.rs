//! Nodes (muster nodes and workers) on the wire.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A node's state as seen now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// The name as the API writes it.
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

/// `state == "alive"` reads as the JSON does.
impl PartialEq<str> for NodeState {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for NodeState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// One registered node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeInfo {
    pub id: String,
    pub kind: String,
    /// Its worst state over the shards of a split namespace (`redis.shards`):
    /// a node dead in one shard is listed dead, with that shard in
    /// `shards_not_alive`.
    pub state: NodeState,
    /// Split namespaces: the shards where it is not alive (late, dead or
    /// left there; its tasks there are recovered as a dead node's). Absent
    /// when it is alive in every shard read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards_not_alive: Vec<usize>,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeList {
    /// Redis time of the listing, ms.
    pub now: i64,
    pub nodes: Vec<NodeInfo>,
    pub alive: usize,
    pub draining: usize,
    pub dead: usize,
    /// Split namespaces: shards that could not be read (their master is
    /// unreachable or stalled); the states shown leave them out. Absent when
    /// every shard answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable_shards: Vec<usize>,
}

/// Result of one heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Heartbeat))]
pub struct NodeHeartbeatAnswer {
    pub joined: bool,
    /// Redis ms.
    pub now: i64,
    pub expires_at: i64,
    /// `active` or `draining`.
    pub state: String,
    /// Split namespaces: shards where this heartbeat could not be applied
    /// (their master is unreachable or stalled). The registration there runs
    /// on from the last heartbeat that landed; after an outage of the whole
    /// shard every lease there is given back (no one could heartbeat), so a
    /// worker need not stop. Absent when every shard applied it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable_shards: Vec<usize>,
}
