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
