//! What the registry holds and answers: kinds, states, a node's record, a
//! listing, a heartbeat's outcome.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

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
    /// Its worst state over the shards of a split namespace (`redis.shards`):
    /// a node dead in one shard is listed dead, with that shard in
    /// `shards_not_alive`.
    pub state: NodeState,
    /// Split namespaces: the shards where it is not alive (late, dead or
    /// left there; its tasks there are recovered as a dead node's). Absent
    /// when it is alive in every shard read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards_not_alive: Vec<usize>,
    /// The shards whose registry lists it (for the merge).
    #[serde(skip)]
    #[schema(ignore)]
    pub shards_seen: Vec<usize>,
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
    /// Split namespaces: shards that could not be read (their master is
    /// unreachable or stalled); the states shown leave them out. Absent when
    /// every shard answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable_shards: Vec<usize>,
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
    /// Split namespaces: shards where this heartbeat could not be applied
    /// (their master is unreachable or stalled). The registration there runs
    /// on from the last heartbeat that landed; after an outage of the whole
    /// shard every lease there is given back (no one could heartbeat), so a
    /// worker need not stop. Absent when every shard applied it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable_shards: Vec<usize>,
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
