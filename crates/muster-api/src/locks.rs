//! Locks on the wire.

use serde::{Deserialize, Serialize};

/// A lock held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Acquired {
    pub name: String,
    pub owner: String,
    /// The fencing token: strictly greater than every token issued before.
    /// Send it with renew and release, and to the resource you protect.
    pub token: u64,
    /// Redis ms when the lease lapses unless renewed.
    pub expires_at: i64,
    pub ttl_ms: u64,
}

/// A lease renewed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Renewed {
    pub name: String,
    pub token: u64,
    /// Redis ms.
    pub expires_at: i64,
}

/// A lock as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LockInfo {
    pub name: String,
    pub held: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The holder's fencing token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The node the lease is tied to, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Redis ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// Waiting owners, first in line first.
    pub waiters: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LockList {
    pub locks: Vec<LockInfo>,
}

/// An election as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Leadership {
    pub name: String,
    /// The leader, or null when nobody leads.
    pub leader: Option<String>,
    /// The leader's epoch: strictly greater than every epoch before it.
    pub epoch: Option<u64>,
    /// The leader's value (any JSON), if it gave one.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<serde_json::Value>))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
    /// Redis ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elected_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ElectionList {
    pub elections: Vec<Leadership>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CampaignResponse {
    /// Whether the candidate leads now (elected, or renewed as the leader).
    pub elected: bool,
    #[serde(flatten)]
    pub leadership: Leadership,
}
