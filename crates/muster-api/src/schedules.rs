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
