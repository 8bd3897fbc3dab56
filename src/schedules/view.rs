//! The API views of a schedule: its counts, history and state.

use super::{BTreeMap, Deserialize, Overlap, ScheduleDef, Serialize, TaskTemplate, Timing, ToSchema, Value};
use muster_api::schedules::{is_false, utc};

/// Totals of a schedule's outcomes since it was created.
#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
pub struct FireCounts {
    pub fired: u64,
    pub skipped_overlap: u64,
    pub missed: u64,
}

/// One entry of a schedule's history: a firing, a skipped occurrence, or a
/// run of consecutive missed occurrences.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
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
#[derive(Debug, Clone, Serialize, ToSchema)]
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
    #[serde(skip_serializing_if = "Option::is_none")]
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_task: Option<String>,
    /// The occurrence of the last firing (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_occurrence: Option<i64>,
    /// When the last firing happened (Redis ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_fired_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_node: Option<String>,
    pub counts: FireCounts,
    /// Newest first; only in GET /api/v1/schedules/{id}.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,
}

/// Redis time in ms from a TIME reply (0 if it is not one).
pub(super) fn redis_ms(v: Option<&Value>) -> i64 {
    match v.map(|v| redis::from_redis_value::<(i64, i64)>(v.clone())) {
        Some(Ok((s, us))) => s * 1000 + us / 1000,
        _ => 0,
    }
}

/// Builds the API view of a schedule from its hash; `now` is Redis time.
pub(super) fn schedule_from(id: &str, m: &BTreeMap<String, String>, now: i64, history: Vec<HistoryEntry>) -> Schedule {
    let num = |f: &str| m.get(f).and_then(|v| v.parse::<i64>().ok());
    let spec: Option<ScheduleDef> = m.get("spec").and_then(|s| serde_json::from_str(s).ok());
    let enabled = m.get("enabled").is_some_and(|v| v == "1");
    let expression = m.get("expr").cloned().unwrap_or_default();
    let timezone = m.get("tz").cloned().unwrap_or_else(utc);
    let cursor = num("cursor").unwrap_or(0);
    let timing = Timing::parse(&expression, &timezone).ok();
    let next = match (&timing, enabled) {
        (Some(t), true) => t.next(cursor.max(now), 5),
        _ => Vec::new(),
    };
    let overlap = match m.get("overlap").map(String::as_str) {
        Some("forbid") => Overlap::Forbid,
        Some("replace") => Overlap::Replace,
        _ => Overlap::Allow,
    };
    Schedule {
        id: id.to_string(),
        description: timing.as_ref().map(Timing::describe).unwrap_or_default(),
        expression,
        timezone,
        queue: m.get("queue").cloned().unwrap_or_default(),
        task: spec.as_ref().map(|s| s.task.clone()).unwrap_or_default(),
        enabled,
        overlap,
        starting_deadline_ms: num("deadline").map(|v| v as u64),
        backfill: m.get("backfill").is_some_and(|v| v == "1"),
        source: m.get("source").cloned().unwrap_or_else(|| "api".into()),
        version: num("version").unwrap_or(0) as u64,
        created_at: num("created_at").unwrap_or(0),
        updated_at: num("updated_at").unwrap_or(0),
        cursor,
        next,
        last_task: m.get("last_task").filter(|v| !v.is_empty()).cloned(),
        last_occurrence: num("last_t"),
        last_fired_at: num("last_at"),
        last_node: m.get("last_node").cloned(),
        counts: FireCounts {
            fired: num("fired").unwrap_or(0) as u64,
            skipped_overlap: num("skipped").unwrap_or(0) as u64,
            missed: num("missed").unwrap_or(0) as u64,
        },
        history,
    }
}
