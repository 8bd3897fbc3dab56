//! A schedule's definition as configured or sent to the API, and its check.

use super::{Deserialize, NewTask, Serialize, TaskSpec, TasksConfig, Timing, ToSchema};
use crate::problem::Invalid;
use crate::store::shards::ShardMap;

/// What happens when an occurrence is due while the previous firing's task is
/// still live (queued, delayed or running).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskTemplate {
    /// Any JSON value, at most `tasks.max_payload_bytes` serialized.
    #[schema(value_type = Option<serde_json::Value>)]
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

pub(super) fn utc() -> String {
    "UTC".into()
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

pub(super) fn is_false(b: &bool) -> bool {
    !*b
}

fn is_allow(o: &Overlap) -> bool {
    *o == Overlap::Allow
}

/// A schedule as it is defined: the body of POST and PUT, and one
/// `[[schedules.items]]` entry of `config.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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

/// A definition that passed every check.
#[derive(Debug, Clone)]
pub struct Checked {
    pub def: ScheduleDef,
    pub timing: Timing,
    pub task: NewTask,
}

/// Checks a definition: the id, expression, time zone, queue, deadline and
/// task template. Errors are 400s that say what is wrong (413 for a payload
/// over `tasks.max_payload_bytes`).
pub fn check(def: &ScheduleDef, tasks: &TasksConfig, shards: &ShardMap) -> Result<Checked, Invalid> {
    crate::validate::name("id", &def.id)?;
    let timing = Timing::parse(&def.expression, &def.timezone).map_err(Invalid::Value)?;
    // A pattern such as "0 0 30 2 *" parses but never matches.
    let probe = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    if timing.next(probe, 1).is_empty() {
        return Err(Invalid::new(format!(
            "`expression` {} never matches a real date; check the day-of-month and month fields",
            crate::validate::shorten(&def.expression)
        )));
    }
    crate::validate::name("queue", &def.queue)?;
    if def
        .starting_deadline_ms
        .is_some_and(|d| !crate::validate::STARTING_DEADLINE_MS.contains(&d))
    {
        return Err(Invalid::new(
            "`starting_deadline_ms` must be between 1000 (1 s) and 604800000 (7 days), or absent for no deadline",
        ));
    }
    let t = &def.task;
    let spec = TaskSpec {
        payload: t.payload.clone().unwrap_or(serde_json::Value::Null),
        group: t.group.clone(),
        priority: t.priority,
        max_attempts: t.max_attempts,
        timeout_ms: t.timeout_ms,
        backoff_base_ms: t.backoff_base_ms,
        backoff_cap_ms: t.backoff_cap_ms,
        ..TaskSpec::default()
    };
    let task = spec.validate(tasks).map_err(|e| match e {
        Invalid::Value(m) => Invalid::Value(format!("in `task`: {m}")),
        other => other,
    })?;
    same_shard(&def.id, &task.group, shards)?;
    Ok(Checked {
        def: def.clone(),
        timing,
        task,
    })
}

/// A split namespace keeps a schedule in the shard of its id and fires its
/// task in the same script, so the task lives there too; a task that names
/// a group must live in the group's shard (its limit is one atomic check
/// there). Refuses an id and a group in different shards, suggesting an id
/// that fits.
fn same_shard(id: &str, group: &str, shards: &ShardMap) -> Result<(), Invalid> {
    let n = shards.len();
    let home = |s: &str| shards.home(s);
    if n == 1 || group.is_empty() || home(id) == home(group) {
        return Ok(());
    }
    let fit = (1..10_000)
        .map(|k| format!("{id}-{k}"))
        .find(|c| c.len() <= 128 && home(c) == home(group));
    Err(Invalid::new(format!(
        "with redis.shards = {n} a schedule lives in the shard of its id and fires its task there, but the \
         task names the group `{group}`, whose tasks live in shard {}, and the id `{id}` is in shard {}: \
         use an id in the group's shard{}, or no group (docs/sharding.md)",
        home(group),
        home(id),
        fit.map(|f| format!(" such as `{f}`")).unwrap_or_default(),
    )))
}
