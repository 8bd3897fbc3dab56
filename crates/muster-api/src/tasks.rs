//! Tasks on the wire.

use serde::{Deserialize, Serialize};

/// Task options as the API takes them (shared by single and batch submit,
/// and by workflows and schedules, which submit tasks too).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Any JSON value, at most `tasks.max_payload_bytes` serialized.
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    #[serde(default)]
    pub payload: serde_json::Value,
    /// Concurrency group, `[A-Za-z0-9._-]{1,128}`.
    pub group: Option<String>,
    /// -1000 to 1000; higher first. Default 0.
    pub priority: Option<i32>,
    /// Claimable after this delay, at most one year (366 days).
    pub delay_ms: Option<u64>,
    /// Claimable at this Redis time (ms since the epoch). Not with delay_ms.
    /// At most one year (366 days) after the Redis time of the submit; a
    /// time in the past means now. Refused above 2^53 before Redis is asked.
    pub run_at: Option<i64>,
    /// Executions before the task is dead, 1 to 1000. Default `tasks.max_attempts`.
    pub max_attempts: Option<u32>,
    /// One execution's time limit; 0 or absent: none. At most 7 days.
    pub timeout_ms: Option<u64>,
    /// Unique while the task lives; find it with GET /api/v1/aliases/{alias}.
    pub alias: Option<String>,
    /// Same key within `tasks.idempotency_window_ms`: the same task, never a second.
    pub idempotency_key: Option<String>,
    /// First retry delay; default `tasks.backoff_base_ms`.
    pub backoff_base_ms: Option<u64>,
    /// Largest retry delay; default `tasks.backoff_cap_ms`.
    pub backoff_cap_ms: Option<u64>,
}

/// Counts of one queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueStats {
    pub name: String,
    pub queued: u64,
    pub delayed: u64,
    pub running: u64,
    pub dead: u64,
    pub succeeded: u64,
    pub cancelled: u64,
    pub paused: bool,
    /// `active`, `paused`, or on a split namespace while a pause or resume
    /// has not reached every shard yet (a master failed), `pausing` or
    /// `resuming`: some shards still hand out (or still hold back) the
    /// queue's grouped tasks until the janitors converge them.
    #[serde(default)]
    pub pause_state: String,
    /// Tasks that reached a terminal state in the last minute.
    pub finished_last_minute: u64,
    /// Queue latency: how long the longest-waiting task at the head of a
    /// line (the ready set, each group's line) has been claimable, in Redis
    /// ms; 0 with nothing queued.
    #[serde(default)]
    pub latency_ms: u64,
}

/// A group with its limit and the slots in use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupInfo {
    pub name: String,
    /// None: unlimited.
    #[serde(default)]
    pub limit: Option<u32>,
    pub running: u64,
    /// Queued tasks of the group, in the queue asked about.
    #[serde(default)]
    pub queued: u64,
}
