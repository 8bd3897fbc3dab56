//! The cluster's own state on the wire: failover, live views, Redis, stats.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A client's answer to a coordinated failover message
/// (`POST /internal/failover/{kind}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Answer, description = "A client's answer."))]
pub struct FailoverAnswer {
    pub node: String,
    pub round: u64,
    /// `pong` (cannot reach the master either), `reachable` (can: the round
    /// must not go on), `invalidated`, `reconfigured`.
    pub answer: String,
}

/// A master switch, for the Failover page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Switch {
    pub from: String,
    pub to: String,
    /// Node clock, ms since the epoch (informational only).
    pub at_ms: i64,
}

/// The last message this node answered, for the Failover page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LastMessage {
    pub kind: String,
    pub round: u64,
    pub answer: String,
    /// Node clock, ms.
    pub at_ms: i64,
}

/// One replica as the master reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Replica {
    pub addr: String,
    pub state: String,
    pub offset: i64,
    /// Bytes behind the master's offset.
    pub lag_bytes: i64,
    /// Seconds since the last ack, as INFO reports it.
    pub lag_s: i64,
}

/// One round as the page shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RoundStatus {
    pub id: u64,
    /// `ping`, `invalidate`, `promote`, `reconfigure`, `done`, `cancelled`,
    /// or `publish` (a re-publication of a healthy master).
    pub phase: String,
    pub started_at_ms: i64,
    pub ended_at_ms: Option<i64>,
    /// Why it was cancelled, or what it promoted.
    pub result: String,
    /// Each client's answer to the round's last message (or the error).
    pub answers: BTreeMap<String, String>,
    pub master: String,
}

/// The coordinator's side of `GET /api/v1/failover`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CoordinatorStatus {
    pub master: String,
    pub redis_servers: Vec<String>,
    /// Consecutive failed checks of the master.
    pub failures: u32,
    pub promotions: u64,
    pub clients: BTreeMap<String, String>,
    /// The current round, or the last one.
    pub round: Option<RoundStatus>,
    /// The last few rounds, newest first (re-publications excluded).
    pub history: Vec<RoundStatus>,
}

/// `GET /api/v1/failover`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FailoverStatus {
    /// `embedded`, `standalone`, `sentinel`, `cluster`, `coordinated`.
    pub mode: String,
    pub node: String,
    /// The master this node uses (`host:port`, URL, or cluster seeds); empty
    /// while invalidated.
    pub master: String,
    pub master_reachable: bool,
    pub master_offset: Option<i64>,
    pub replicas: Vec<Replica>,
    /// The fencing epoch (high bits of every token).
    pub epoch: Option<u64>,
    /// Master switches this node made since it started.
    pub switches: u64,
    pub last_switch: Option<Switch>,
    /// Sentinel mode: the sentinels and the master they name.
    pub sentinels: Vec<String>,
    pub sentinel_master: Option<String>,
    /// Coordinated mode: `client` or `coordinator`.
    pub role: Option<String>,
    pub newest_round: Option<u64>,
    pub last_message: Option<LastMessage>,
    /// Coordinator only.
    pub coordinator: Option<CoordinatorStatus>,
}

// `GET /api/v1/redis` (no doc comment: the schema has no description).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RedisSummary {
    /// embedded, standalone, sentinel or cluster.
    pub mode: String,
    pub address: String,
    pub version: String,
    /// The server's role from `ROLE` (master, slave, ...).
    pub role: String,
    /// Round trip of a PING just now, milliseconds.
    pub latency_ms: f64,
    pub healthy: bool,
    pub key_prefix: String,
    /// Used memory in bytes, from `INFO memory`.
    pub used_memory: Option<u64>,
    /// Number of keys in the database.
    pub dbsize: Option<u64>,
}
