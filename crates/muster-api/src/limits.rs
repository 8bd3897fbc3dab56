//! Flow-control limits on the wire (G13): rate and concurrency, named,
//! per key of a template, and per queue.

use serde::{Deserialize, Serialize};

/// A token bucket: `max` tokens refill evenly over `per_ms`, and at most
/// `burst` are saved up (the bucket starts full). Every task started takes
/// one, so no window of `per_ms` ever sees more than `max + burst` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Rate {
    /// Tokens per period, 1 to 1 000 000.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1_000_000))]
    pub max: u32,
    /// The period, 1 ms to one day (86 400 000).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 86_400_000))]
    pub per_ms: u64,
    /// Tokens that may be saved up, 1 to 1 000 000.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1_000_000))]
    pub burst: u32,
}

/// What `PUT /api/v1/limits/{name}` takes: at least one of the two.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LimitSpec {
    /// At most this many tasks hold the limit at once, 1 to 100 000;
    /// null or absent: no bound on concurrency.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100_000))]
    pub concurrency: Option<u32>,
    /// null or absent: no rate.
    #[serde(default)]
    pub rate: Option<Rate>,
}

/// A limit, its settings and its use now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitInfo {
    /// `name`, a template `name:*`, or a template's key `name:key`.
    pub name: String,
    pub concurrency: Option<u32>,
    pub rate: Option<Rate>,
    /// Tasks holding a slot of it now (those started under its concurrency).
    pub running: u64,
    /// Whole tokens in its bucket now; null without a rate.
    pub tokens: Option<u64>,
    /// Queued tasks waiting on it: those whose own limits start with it, and
    /// those of the queues that name it.
    pub waiting: u64,
    /// The queues whose limits name it.
    pub queues: Vec<String>,
}

/// Every limit and template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitList {
    pub limits: Vec<LimitInfo>,
}

/// A queue's limits: they bind every task of it (`PUT
/// /api/v1/queues/{queue}/limits`); an empty list removes them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QueueLimits {
    /// 0 to 8 defined limits (or template keys `name:key`).
    #[cfg_attr(feature = "openapi", schema(max_items = 8))]
    pub limits: Vec<String>,
}
