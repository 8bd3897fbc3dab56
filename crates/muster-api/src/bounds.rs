//! The bounds of every number, size and name the API takes. They are the
//! single source of the server's checks, the OpenAPI document (the server
//! writes them into its schemas) and the clients' own clamps, so none of
//! them can drift from the others.

use std::ops::RangeInclusive;

/// Longest queue, group, alias, barrier, lock, election or schedule name.
pub const NAME_MAX_LEN: usize = 128;
/// Longest node or worker id.
pub const NODE_ID_MAX_LEN: usize = 64;
/// Task and workflow ids: 26 ASCII letters and digits (ULIDs).
pub const ID_LEN: usize = 26;
/// Longest idempotency key, lock owner, candidate or holder.
pub const OPAQUE_KEY_MAX_LEN: usize = 200;

/// `limit` of task listings (a queue's tasks, dead tasks).
pub const TASK_PAGE_LIMIT: RangeInclusive<usize> = 1..=500;
/// Deepest `cursor` of a task listing.
pub const TASK_CURSOR_MAX: usize = 1_000_000;
/// `limit` of the workflow listing.
pub const WORKFLOW_PAGE_LIMIT: RangeInclusive<usize> = 1..=200;
/// `limit` of the orphan report, the event replay and a barrier's rounds.
pub const LONG_PAGE_LIMIT: RangeInclusive<usize> = 1..=1000;
/// `history` entries of one schedule.
pub const SCHEDULE_HISTORY: RangeInclusive<usize> = 0..=1000;
/// Tasks claimed by one call (`max`, `next.max`).
pub const CLAIM_MAX: RangeInclusive<u32> = 1..=1000;
/// Longest long poll of a claim (`wait_ms`, `next.wait_ms`).
pub const CLAIM_WAIT_MAX_MS: u64 = 30_000;
/// A claim's lease (`ack_ms`, `next.ack_ms`, `claim.ack_ms` unless 0): how
/// long a claimed task may go unacknowledged.
pub const CLAIM_ACK_MS: RangeInclusive<u64> = 1_000..=600_000;
/// Items of a batch submit or a batch complete.
pub const BATCH_ITEMS: RangeInclusive<usize> = 1..=1000;
/// Participants of a barrier.
pub const PARTICIPANTS: RangeInclusive<usize> = 1..=1000;
/// A barrier round's `timeout_ms`: 10 ms to 24 h.
pub const ROUND_TIMEOUT_MS: RangeInclusive<u64> = 10..=86_400_000;
/// A DoubleBarrier's `count`.
pub const DOUBLE_BARRIER_COUNT: RangeInclusive<u32> = 1..=1000;
/// Shortest lease of a lock, an election or a hold (the longest is in config).
pub const MIN_LEASE_MS: u64 = 100;
/// A group's concurrency `limit`.
pub const GROUP_LIMIT: RangeInclusive<u32> = 1..=100_000;
/// A flow-control limit's concurrency (tasks running at once).
pub const LIMIT_CONCURRENCY: RangeInclusive<u32> = 1..=100_000;
/// A rate's tokens per period, and its burst (tokens saved up).
pub const LIMIT_RATE_MAX: RangeInclusive<u32> = 1..=1_000_000;
/// A rate's period (ms): one millisecond to one day.
pub const LIMIT_RATE_PER_MS: RangeInclusive<u64> = 1..=86_400_000;
/// The flow-control limits one task names of its own.
pub const TASK_LIMITS_MAX: usize = 8;
/// A limit name: `name`, `name:key` or `name:*`.
pub const LIMIT_NAME_MAX_LEN: usize = 2 * NAME_MAX_LEN + 1;
/// A debounce window (ms): one millisecond to one day.
pub const DEBOUNCE_MS: RangeInclusive<u64> = 1..=86_400_000;
/// A task heartbeat's `progress`.
pub const PROGRESS: RangeInclusive<u8> = 0..=100;
/// An external worker's heartbeat `ttl_ms`.
pub const WORKER_TTL_MS: RangeInclusive<u64> = 500..=3_600_000;
/// An external worker's labels: how many, and the longest key and value.
pub const WORKER_LABELS_MAX: usize = 32;
pub const WORKER_LABEL_KEY_MAX_LEN: usize = 64;
pub const WORKER_LABEL_VALUE_MAX_LEN: usize = 256;
/// An external worker's `addr` and `version`.
pub const WORKER_ADDR_MAX_LEN: usize = 256;
pub const WORKER_VERSION_MAX_LEN: usize = 64;
/// A task's `priority`.
pub const PRIORITY: RangeInclusive<i32> = -1000..=1000;
/// A task's `max_attempts`.
pub const MAX_ATTEMPTS: RangeInclusive<u32> = 1..=1000;
/// A task's longest `timeout_ms`: 7 days.
pub const TASK_TIMEOUT_MAX_MS: u64 = 7 * 24 * 3600 * 1000;
/// Longest retry backoff (`backoff_base_ms`, `backoff_cap_ms`): 24 h.
pub const BACKOFF_MAX_MS: u64 = 24 * 3600 * 1000;
/// A schedule's `starting_deadline_ms`: 1 s to 7 days.
pub const STARTING_DEADLINE_MS: RangeInclusive<u64> = 1000..=7 * 24 * 3600 * 1000;
/// A schedule's cron `expression`: 1 to 256 characters.
pub const EXPRESSION_LEN: RangeInclusive<usize> = 1..=256;
/// A schedule's `timezone` (an IANA name, the longest is 32): 1 to 64 characters.
pub const TIMEZONE_LEN: RangeInclusive<usize> = 1..=64;
/// An event filter's `topics`: at most 32 comma-separated parts, each at
/// most 64 characters.
pub const TOPICS_MAX: usize = 32;
pub const TOPIC_MAX_LEN: usize = 64;

/// The JSON Schema pattern of a name: the charset, not `.` or `..`
/// (ECMA-262 without lookaround, which some schema tools cannot run).
pub fn name_pattern(max: usize) -> String {
    format!(
        "^([A-Za-z0-9_-][A-Za-z0-9._-]{{0,{}}}|\\.[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{}}}|\\.\\.[A-Za-z0-9._-]{{1,{}}})$",
        max - 1,
        max - 2,
        max - 2
    )
}

/// The JSON Schema pattern of a flow-control limit name: `name` or
/// `name:key`, and with `template` also `name:*`.
pub fn limit_name_pattern(template: bool) -> String {
    let part = name_pattern(NAME_MAX_LEN);
    let part = &part[1..part.len() - 1];
    let key = if template {
        format!("({part}|\\*)")
    } else {
        format!("({part})")
    };
    format!("^({part})(:{key})?$")
}

/// The JSON Schema pattern of a task or workflow id.
pub fn id_pattern() -> String {
    format!("^[A-Za-z0-9]{{{ID_LEN}}}$")
}

/// The JSON Schema pattern of an opaque key: printable ASCII, no spaces.
pub fn opaque_key_pattern() -> String {
    format!("^[!-~]{{1,{OPAQUE_KEY_MAX_LEN}}}$")
}
