//! The API view of a schedule (its counts, history and state, the types of
//! `muster_api::schedules`), built from its Redis hash.

use super::{BTreeMap, Overlap, ScheduleDef, Timing, Value};
use muster_api::schedules::{FireCounts, HistoryEntry, Schedule, utc};

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
