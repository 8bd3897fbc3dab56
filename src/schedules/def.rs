//! A schedule's definition as configured or sent to the API, and its check.

use super::{NewTask, ScheduleDef, TaskSpec, TasksConfig, Timing};
use crate::problem::Invalid;
use crate::store::shards::ShardMap;

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
pub(crate) fn check(def: &ScheduleDef, tasks: &TasksConfig, shards: &ShardMap) -> Result<Checked, Invalid> {
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
        limits: (!t.limits.is_empty()).then(|| t.limits.clone()),
        ..TaskSpec::default()
    };
    let task = crate::tasks::spec::check(&spec, tasks).map_err(|e| match e {
        Invalid::Value(m) => Invalid::Value(format!("in `task`: {m}")),
        other => other,
    })?;
    same_shard(&def.id, &task.group, shards)?;
    limits_shard(&def.id, &task.limits, shards)?;
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

/// A split namespace keeps flow-control limits in shard 0, and a task with
/// limits of its own lives there (its claim takes them in one script), so a
/// schedule whose task names limits must be in shard 0 too. Refuses an id
/// elsewhere, suggesting one that fits.
fn limits_shard(id: &str, limits: &[String], shards: &ShardMap) -> Result<(), Invalid> {
    let n = shards.len();
    if n == 1 || limits.is_empty() || shards.home(id) == 0 {
        return Ok(());
    }
    let fit = (1..10_000)
        .map(|k| format!("{id}-{k}"))
        .find(|c| c.len() <= 128 && shards.home(c) == 0);
    Err(Invalid::new(format!(
        "with redis.shards = {n} a schedule lives in the shard of its id and fires its task there, but the \
         task names flow-control limits, which live in shard 0, and the id `{id}` is in shard {}: use an id \
         in shard 0{} (docs/sharding.md)",
        shards.home(id),
        fit.map(|f| format!(" such as `{f}`")).unwrap_or_default(),
    )))
}
