//! Schedules on the wire.

use serde::{Deserialize, Serialize};

/// What happens when an occurrence is due while the previous firing's task is
/// still live (queued, delayed or running).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// Fire anyway: several tasks of the schedule may be live at once.
    #[default]
    Allow,
    /// Skip the occurrence (recorded as skipped_overlap).
    Forbid,
    /// Cancel the previous task (a running one's fencing token goes stale), then fire.
    Replace,
}

impl Overlap {
    /// The name as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Allow => "allow",
            Overlap::Forbid => "forbid",
            Overlap::Replace => "replace",
        }
    }
}

/// The task each occurrence submits. Aliases, idempotency keys and delays are
/// not allowed: each occurrence's task gets the idempotency key
/// `schedule:<id>:<occurrence ms>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskTemplate {
    /// Any JSON value, at most `tasks.max_payload_bytes` serialized.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<serde_json::Value>))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    /// Concurrency group, `[A-Za-z0-9._-]{1,128}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// -1000 to 1000; higher first. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Executions before the task is dead, 1 to 1000. Default `tasks.max_attempts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// One execution's time limit; absent or 0: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// First retry delay; default `tasks.backoff_base_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_base_ms: Option<u64>,
    /// Largest retry delay; default `tasks.backoff_cap_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_cap_ms: Option<u64>,
    /// Flow-control limits of each occurrence's task (G13), 1 to 8 names
    /// (`name` or a template's key `name:key`), each defined when the
    /// schedule is written through the API; not with `group`. On a split
    /// namespace the schedule's id must be in shard 0, where limits live.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<String>,
}

/// serde's default for `timezone`.
#[doc(hidden)]
pub fn utc() -> String {
    "UTC".into()
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// serde's skip test for a `false` flag.
#[doc(hidden)]
pub fn is_false(b: &bool) -> bool {
    !*b
}

fn is_allow(o: &Overlap) -> bool {
    *o == Overlap::Allow
}

/// A schedule as it is defined: the body of POST and PUT, and one
/// `[[schedules.items]]` entry of `config.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ScheduleDef {
    /// `[A-Za-z0-9._-]{1,128}`. Required for POST and in config; in PUT the path names it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// Cron expression: 5 fields (minute hour day-of-month month day-of-week) or
    /// 6 with seconds first; `@hourly`, `@daily`, `L`, `W`, `#` as in croner.
    pub expression: String,
    /// IANA time zone the expression is read in, with its DST rules. Default UTC.
    #[serde(default = "utc")]
    pub timezone: String,
    /// The queue each occurrence's task goes to.
    pub queue: String,
    /// The task each occurrence submits.
    #[serde(default)]
    pub task: TaskTemplate,
    /// Default true.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub enabled: bool,
    /// allow (default), forbid or replace.
    #[serde(default, skip_serializing_if = "is_allow")]
    pub overlap: Overlap,
    /// An occurrence that cannot start within this long of its time is
    /// recorded as missed and never run. Absent: no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_deadline_ms: Option<u64>,
    /// After an outage: false (default) runs only the latest due occurrence,
    /// true runs every due occurrence (within the deadline), in order.
    #[serde(default, skip_serializing_if = "is_false")]
    pub backfill: bool,
}

/// Totals of a schedule's outcomes since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FireCounts {
    pub fired: u64,
    pub skipped_overlap: u64,
    pub missed: u64,
}

/// One entry of a schedule's history: a firing, a skipped occurrence, or a
/// run of consecutive missed occurrences.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HistoryEntry {
    /// fired, skipped_overlap or missed.
    pub result: String,
    /// The occurrence (its intended time, Unix ms); the first of a missed run.
    pub t: i64,
    /// The last occurrence of a missed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<i64>,
    /// Occurrences in a missed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// When the outcome was decided (Redis ms).
    pub at: i64,
    /// The node that decided it.
    #[serde(default)]
    pub node: String,
    /// The task fired, or the live task an occurrence was skipped for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// How late the firing was (Redis ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_ms: Option<i64>,
    /// Why occurrences were missed: deadline, superseded (no backfill) or too_many_queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The task cancelled by overlap `replace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<String>,
    /// Fired by "trigger now".
    #[serde(default, skip_serializing_if = "is_false")]
    pub manual: bool,
    /// Who triggered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// A schedule with its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Schedule {
    pub id: String,
    pub expression: String,
    /// The expression in words.
    pub description: String,
    pub timezone: String,
    pub queue: String,
    pub task: TaskTemplate,
    pub enabled: bool,
    pub overlap: Overlap,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_deadline_ms: Option<u64>,
    pub backfill: bool,
    /// api, or config (from `[[schedules.items]]` in config.toml, which wins at start).
    pub source: String,
    /// Bumped by every change of the definition or of `enabled`.
    pub version: u64,
    pub created_at: i64,
    pub updated_at: i64,
    /// The latest occurrence that has its outcome (Unix ms); later ones are pending.
    pub cursor: i64,
    /// The next 5 occurrences (Unix ms) after now (Redis time), while enabled.
    pub next: Vec<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_task: Option<String>,
    /// The occurrence of the last firing (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_occurrence: Option<i64>,
    /// When the last firing happened (Redis ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fired_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_node: Option<String>,
    pub counts: FireCounts,
    /// Newest first; only in GET /api/v1/schedules/{id}.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,
}

// The answer of `GET /api/v1/schedules` (no doc comment: the OpenAPI
// document has no description for it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleList {
    pub schedules: Vec<Schedule>,
}

/// What a trigger did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Triggered {
    pub schedule: String,
    pub task: String,
    pub queue: String,
    /// The occurrence: Redis now at the trigger (Unix ms).
    pub occurrence: i64,
    /// The live task that overlap `replace` cancelled for this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<String>,
    /// True when the `Idempotency-Key` named an earlier trigger's task: that
    /// task is returned and nothing fired.
    pub replayed: bool,
}
