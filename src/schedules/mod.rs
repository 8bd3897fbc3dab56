//! Cron schedules that fire exactly once per occurrence across the cluster.
//!
//! Every node runs the scheduler ([`worker`]); none is special. A schedule's
//! occurrences are computed on the node (croner, in the schedule's IANA time
//! zone, DST included), but whether an occurrence is due is decided inside
//! Redis by Redis time, and each due occurrence gets its one outcome (fired,
//! skipped_overlap or missed) in one script, `lua/fire.lua`.
//!
//! Invariants:
//! - G7 exactly once: an occurrence T is fired by at most one script call,
//!   cluster-wide. The script moves the schedule's cursor (the latest
//!   occurrence with an outcome) past T in the same atomic step as it records
//!   (schedule, T) with `SET NX` and a TTL, submits the task with the
//!   idempotency key `schedule:<id>:<T>`, appends to the bounded history and
//!   emits `schedule.fired`. A node that crashes mid-call leaves either all of
//!   that or none of it.
//! - G7 never missed by a slow clock: a node proposes the occurrences from the
//!   cursor up to its own clock plus `schedules.max_skew_ms`, so a node whose
//!   clock lags by up to that bound still proposes every due occurrence on
//!   time, and one whose clock runs ahead proposes occurrences the script
//!   refuses until Redis time reaches them (G11).
//! - Missed occurrences follow the schedule's policy: later than
//!   `starting_deadline_ms` they are missed, never run; after an outage
//!   (lateness beyond `max_skew_ms`) only the latest due occurrence runs unless
//!   `backfill` is set. Missed runs are recorded and counted.
//! - G4: occurrence records carry a TTL; the history is a list trimmed to
//!   `schedules.history_max`; schedules are bounded by
//!   `schedules.max_schedules`; a deleted schedule leaves only records that
//!   expire.
//! - Every state change emits its event in the same script (G9).

pub mod routes;
mod scripts;
pub mod worker;

use std::collections::{BTreeMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, TimeZone};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use redis::Value;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use self::scripts::{DeleteReply, Scripts, SetEnabledReply, TriggerReply, UpsertMode, UpsertReply};
use crate::config::{SchedulesConfig, TasksConfig};
use crate::error::ApiError;
use crate::store::{ScriptCtx, Store, StoreError};
use crate::tasks::{NewTask, TaskSpec};

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

fn utc() -> String {
    "UTC".into()
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_false(b: &bool) -> bool {
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

/// A schedule's expression and time zone, parsed: computes its occurrences.
#[derive(Debug, Clone)]
pub struct Timing {
    cron: Cron,
    tz: Tz,
}

/// Parses a 5- or 6-field cron expression (croner's extensions included).
pub fn parse_expression(expr: &str) -> Result<Cron, String> {
    let parser = CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build();
    parser.parse(expr).map_err(|e| e.to_string())
}

impl Timing {
    /// Parses both parts; the message says which one is wrong and why.
    pub fn parse(expression: &str, timezone: &str) -> Result<Timing, String> {
        let cron = parse_expression(expression).map_err(|e| {
            format!(
                "`expression` {} is not a valid cron expression ({e}); use 5 fields \
                 (minute hour day-of-month month day-of-week) or 6 with seconds first, \
                 for example \"*/5 * * * *\"",
                crate::validate::shorten(expression)
            )
        })?;
        let tz = Tz::from_str(timezone).map_err(|_| {
            format!(
                "`timezone` {} is not an IANA time zone name; use a name such as \"UTC\", \
                 \"Europe/Berlin\" or \"America/New_York\"",
                crate::validate::shorten(timezone)
            )
        })?;
        Ok(Timing { cron, tz })
    }

    pub fn tz(&self) -> Tz {
        self.tz
    }

    fn at(&self, ms: i64) -> Option<DateTime<Tz>> {
        self.tz.timestamp_millis_opt(ms).single()
    }

    /// The occurrences strictly after `after_ms`, ascending, that are at most
    /// `until_ms`, no more than `max` of them; and the occurrence that follows
    /// the last one returned (or follows `after_ms` when none is), if any.
    /// Times are Unix ms; each is an exact instant, so a wall-clock time that a
    /// DST change repeats yields both instants when the expression matches it
    /// on both passes (croner's rules: fixed-time jobs once, intervals twice).
    pub fn occurrences(&self, after_ms: i64, until_ms: i64, max: usize) -> (Vec<i64>, Option<i64>) {
        let mut out = Vec::new();
        let Some(start) = self.at(after_ms) else {
            return (out, None);
        };
        for dt in self.cron.iter_after(start) {
            let ms = dt.timestamp_millis();
            if ms > until_ms || out.len() >= max {
                return (out, Some(ms));
            }
            out.push(ms);
        }
        (out, None)
    }

    /// The next `n` occurrences after `after_ms`.
    pub fn next(&self, after_ms: i64, n: usize) -> Vec<i64> {
        let (v, _) = self.occurrences(after_ms, i64::MAX, n);
        v
    }

    /// The expression in words, e.g. "Every 5 minutes." (croner's English,
    /// minus its "At every ...").
    pub fn describe(&self) -> String {
        let words = self.cron.describe();
        match words.strip_prefix("At every ") {
            Some(rest) => format!("Every {rest}"),
            None => words,
        }
    }

    /// A Unix ms time as a wall-clock time in the schedule's zone, with the
    /// zone's abbreviation: `2025-03-30 03:00:00 CEST`.
    pub fn local(&self, ms: i64) -> String {
        match self.at(ms) {
            Some(dt) => dt.format("%Y-%m-%d %H:%M:%S %Z").to_string(),
            None => String::new(),
        }
    }
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
pub fn check(def: &ScheduleDef, tasks: &TasksConfig) -> Result<Checked, ApiError> {
    crate::validate::name("id", &def.id)?;
    let timing = Timing::parse(&def.expression, &def.timezone).map_err(ApiError::BadRequest)?;
    // A pattern such as "0 0 30 2 *" parses but never matches.
    let probe = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    if timing.next(probe, 1).is_empty() {
        return Err(ApiError::bad_request(format!(
            "`expression` {} never matches a real date; check the day-of-month and month fields",
            crate::validate::shorten(&def.expression)
        )));
    }
    crate::validate::name("queue", &def.queue)?;
    if def
        .starting_deadline_ms
        .is_some_and(|d| !crate::validate::STARTING_DEADLINE_MS.contains(&d))
    {
        return Err(ApiError::bad_request(
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
        ApiError::BadRequest(m) => ApiError::BadRequest(format!("in `task`: {m}")),
        other => other,
    })?;
    Ok(Checked {
        def: def.clone(),
        timing,
        task,
    })
}

/// Why a schedule operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// 404
    #[error("no schedule `{0}`")]
    NotFound(String),
    /// 409
    #[error("schedule `{0}` already exists; PUT /api/v1/schedules/{0} replaces it")]
    Exists(String),
    /// 409
    #[error(
        "schedule `{0}` is defined in this node's config.toml ([[schedules.items]]), which wins at every start; change or remove it there"
    )]
    InThisConfig(String),
    /// 409
    #[error(
        "schedule `{0}` was written from a node's config.toml ([[schedules.items]]), and config wins: change it there. \
         Once no node's config.toml defines it any more, DELETE /api/v1/schedules/{0}?force=true removes it"
    )]
    FromConfig(String),
    /// 409
    #[error("the cluster already has the maximum of {0} schedules (schedules.max_schedules)")]
    TooMany(u32),
    /// 409
    #[error(
        "not fired: the overlap policy is forbid and the previous occurrence's task {0} is still live; cancel it or wait"
    )]
    Overlap(String),
    /// 409
    #[error("the cluster already has the maximum of {0} queues (tasks.max_queues)")]
    TooManyQueues(u32),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<ScheduleError> for ApiError {
    fn from(e: ScheduleError) -> Self {
        match e {
            ScheduleError::NotFound(_) => ApiError::NotFound(e.to_string()),
            ScheduleError::Overlap(ref task) => ApiError::conflict(e.to_string(), serde_json::json!({"task": task})),
            ScheduleError::Exists(_)
            | ScheduleError::InThisConfig(_)
            | ScheduleError::FromConfig(_)
            | ScheduleError::TooMany(_)
            | ScheduleError::TooManyQueues(_) => ApiError::conflict(e.to_string(), serde_json::Value::Null),
            ScheduleError::Store(s) => s.into(),
        }
    }
}

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

/// What a trigger did.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Triggered {
    pub schedule: String,
    pub task: String,
    pub queue: String,
    /// The occurrence: Redis now at the trigger (Unix ms).
    pub occurrence: i64,
    /// The live task that overlap `replace` cancelled for this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaced: Option<String>,
    /// True when the `Idempotency-Key` named an earlier trigger's task: that
    /// task is returned and nothing fired.
    pub replayed: bool,
}

/// How one fire script call ended (see `lua/fire.lua`, whose refusals are
/// the shared codes `E.NOT_FOUND`, `E.STALE` and `E.WRONG_STATE`). The
/// discriminant is [`FireResult::code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i64)]
pub enum FireOutcome {
    /// Every proposed occurrence was due and has its outcome.
    Done = 1,
    /// Stopped at a proposed occurrence not yet due (`wait_ms` until it is).
    NotDue = 0,
    /// The schedule is gone.
    NotFound = -1,
    /// The definition changed (another version) since it was read.
    Changed = -2,
    /// The schedule is disabled.
    Disabled = -3,
}

/// What one fire script call did (see `lua/fire.lua`).
#[derive(Debug, Clone, Copy)]
pub struct FireResult {
    pub outcome: FireOutcome,
    /// `outcome` as a number: 1 done, 0 not due, -1 no such schedule, -2 the
    /// definition changed, -3 disabled.
    pub code: i64,
    pub cursor: i64,
    pub fired: u64,
    pub skipped: u64,
    pub missed: u64,
    pub wait_ms: i64,
}

/// The schedule service.
pub struct Schedules {
    store: Store,
    cfg: SchedulesConfig,
    tasks: TasksConfig,
    node_id: String,
    /// Ids defined in this node's config.toml: the API may not change them.
    config_ids: HashSet<String>,
    scripts: Scripts,
    /// Wakes this node's scheduler when a schedule is written through it, so
    /// a new schedule's first occurrence is not up to `interval_ms` late here
    /// (other nodes see it at their next pass).
    pub(crate) changed: tokio::sync::Notify,
}

impl Schedules {
    pub fn new(
        store: Store,
        cfg: SchedulesConfig,
        tasks: TasksConfig,
        node_id: String,
        ctx: &ScriptCtx,
    ) -> Arc<Schedules> {
        let config_ids = cfg.items.iter().map(|d| d.id.clone()).collect();
        for result in ["fired", "skipped_overlap", "missed"] {
            metrics::counter!("muster_schedule_fires_total", "result" => result).increment(0);
        }
        Arc::new(Schedules {
            store,
            cfg,
            tasks,
            node_id,
            config_ids,
            scripts: Scripts::new(ctx),
            changed: tokio::sync::Notify::new(),
        })
    }

    pub fn config(&self) -> &SchedulesConfig {
        &self.cfg
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Checks a definition against this node's task limits.
    pub fn check(&self, def: &ScheduleDef) -> Result<Checked, ApiError> {
        check(def, &self.tasks)
    }

    /// Whether this node's config.toml defines `id`.
    pub fn in_config(&self, id: &str) -> bool {
        self.config_ids.contains(id)
    }

    fn key(&self, id: &str) -> String {
        scripts::schedule_key(self.store.keys(), id)
    }

    fn history_key(&self, id: &str) -> String {
        scripts::history_key(self.store.keys(), id)
    }

    fn set_key(&self) -> String {
        scripts::schedules_key(self.store.keys())
    }

    /// Writes a checked definition with `upsert.lua`.
    async fn upsert(
        &self,
        c: &Checked,
        mode: UpsertMode,
        actor: &str,
        config_hash: &str,
    ) -> Result<UpsertReply, StoreError> {
        let d = &c.def;
        let t = &c.task;
        let spec = serde_json::to_string(d).unwrap_or_default();
        let fields: Vec<(&str, String)> = vec![
            ("expr", d.expression.clone()),
            ("tz", d.timezone.clone()),
            ("queue", d.queue.clone()),
            ("overlap", d.overlap.as_str().into()),
            ("backfill", if d.backfill { "1" } else { "0" }.into()),
            (
                "deadline",
                d.starting_deadline_ms.map(|v| v.to_string()).unwrap_or_default(),
            ),
            ("enabled", if d.enabled { "1" } else { "0" }.into()),
            ("spec", spec),
            ("payload", t.payload.clone()),
            ("group", t.group.clone()),
            ("priority", t.priority.to_string()),
            ("max_attempts", t.max_attempts.to_string()),
            ("timeout_ms", t.timeout_ms.to_string()),
            ("backoff_base", t.backoff_base_ms.to_string()),
            ("backoff_cap", t.backoff_cap_ms.to_string()),
        ];
        let call = scripts::Upsert {
            id: &d.id,
            mode,
            actor,
            max_schedules: self.cfg.max_schedules,
            config_hash,
            fields,
        };
        self.store.run(&self.scripts.upsert, &call).await
    }

    /// Creates a schedule; refused if the id exists.
    pub async fn create(&self, c: &Checked, actor: &str) -> Result<(), ScheduleError> {
        if self.in_config(&c.def.id) {
            return Err(ScheduleError::InThisConfig(c.def.id.clone()));
        }
        match self.upsert(c, UpsertMode::Create, actor, "").await? {
            UpsertReply::Exists => Err(ScheduleError::Exists(c.def.id.clone())),
            UpsertReply::TooMany => Err(ScheduleError::TooMany(self.cfg.max_schedules)),
            UpsertReply::FromConfig => Err(ScheduleError::FromConfig(c.def.id.clone())),
            UpsertReply::Created { .. } | UpsertReply::Replaced { .. } | UpsertReply::Unchanged { .. } => {
                self.changed.notify_one();
                Ok(())
            }
        }
    }

    /// Creates or replaces a schedule. Returns true if it was created.
    /// Refused for a schedule written from config.toml, by any node.
    pub async fn put(&self, c: &Checked, actor: &str) -> Result<bool, ScheduleError> {
        if self.in_config(&c.def.id) {
            return Err(ScheduleError::InThisConfig(c.def.id.clone()));
        }
        match self.upsert(c, UpsertMode::Put, actor, "").await? {
            UpsertReply::TooMany => Err(ScheduleError::TooMany(self.cfg.max_schedules)),
            UpsertReply::FromConfig => Err(ScheduleError::FromConfig(c.def.id.clone())),
            // Exists: mode create only.
            UpsertReply::Exists => Err(ScheduleError::Exists(c.def.id.clone())),
            reply => {
                self.changed.notify_one();
                Ok(matches!(reply, UpsertReply::Created { .. }))
            }
        }
    }

    /// Writes this node's `[[schedules.items]]` into Redis: config wins for its
    /// ids. An entry whose config text is unchanged since it was last written
    /// is left alone. Returns how many were created or replaced.
    pub async fn reconcile(&self) -> Result<usize, ScheduleError> {
        let mut changed = 0;
        for def in &self.cfg.items {
            // Checked when the configuration was loaded; a failure here is a bug.
            let c = match self.check(def) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(schedule = %def.id, error = %e, "config schedule is invalid; skipped");
                    continue;
                }
            };
            let text = serde_json::to_string(def).unwrap_or_default();
            let hash = crate::auth::hex(&<sha2::Sha256 as sha2::Digest>::digest(text.as_bytes()));
            match self.upsert(&c, UpsertMode::Config, &self.node_id, &hash).await? {
                UpsertReply::TooMany => return Err(ScheduleError::TooMany(self.cfg.max_schedules)),
                UpsertReply::Created { .. } | UpsertReply::Replaced { .. } => changed += 1,
                // Unchanged; Exists and FromConfig are not answers to mode config.
                UpsertReply::Unchanged { .. } | UpsertReply::Exists | UpsertReply::FromConfig => {}
            }
        }
        Ok(changed)
    }

    /// Deletes a schedule and its history. A schedule written from
    /// config.toml is refused unless `force` (its entry was removed from every
    /// node's config); one in this node's config is refused even then, since
    /// this node would write it back at its next start.
    pub async fn delete(&self, id: &str, actor: &str, force: bool) -> Result<(), ScheduleError> {
        if self.in_config(id) {
            return Err(ScheduleError::InThisConfig(id.into()));
        }
        let call = scripts::Delete { id, actor, force };
        match self.store.run(&self.scripts.delete, &call).await? {
            DeleteReply::Deleted => Ok(()),
            DeleteReply::NotFound => Err(ScheduleError::NotFound(id.into())),
            DeleteReply::FromConfig => Err(ScheduleError::FromConfig(id.into())),
        }
    }

    /// Enables or disables a schedule (config schedules too: an operator's
    /// switch stands until their config entry changes). Returns true if it
    /// changed.
    pub async fn set_enabled(&self, id: &str, enabled: bool, actor: &str) -> Result<bool, ScheduleError> {
        let call = scripts::SetEnabled { id, enabled, actor };
        match self.store.run(&self.scripts.set_enabled, &call).await? {
            SetEnabledReply::NotFound => Err(ScheduleError::NotFound(id.into())),
            reply => {
                self.changed.notify_one();
                Ok(matches!(reply, SetEnabledReply::Changed { .. }))
            }
        }
    }

    /// Fires a schedule now, outside its expression. `key`: the client's
    /// idempotency key (validated): a trigger with a key seen within
    /// `tasks.idempotency_window_ms` returns that trigger's task and fires nothing.
    pub async fn trigger(&self, id: &str, actor: &str, key: Option<&str>) -> Result<Triggered, ScheduleError> {
        let task_id = ulid::Ulid::generate().to_string();
        let call = scripts::Trigger {
            id,
            actor,
            node: &self.node_id,
            task_id: &task_id,
            history_max: self.cfg.history_max,
            idempotency_window_ms: self.tasks.idempotency_window_ms,
            max_queues: self.tasks.max_queues,
            retention_ms: self.tasks.retention_ms,
            key,
        };
        match self.store.run(&self.scripts.trigger, &call).await? {
            TriggerReply::Fired {
                task,
                occurrence,
                queue,
                replaced,
            } => {
                metrics::counter!("muster_schedule_fires_total", "result" => "fired").increment(1);
                Ok(Triggered {
                    schedule: id.into(),
                    task,
                    queue,
                    occurrence,
                    replaced,
                    replayed: false,
                })
            }
            TriggerReply::Replayed {
                task,
                occurrence,
                queue,
            } => Ok(Triggered {
                schedule: id.into(),
                task,
                queue,
                occurrence,
                replaced: None,
                replayed: true,
            }),
            TriggerReply::Skipped { live_task } => {
                metrics::counter!("muster_schedule_fires_total", "result" => "skipped_overlap").increment(1);
                Err(ScheduleError::Overlap(live_task))
            }
            TriggerReply::TooManyQueues => Err(ScheduleError::TooManyQueues(self.tasks.max_queues)),
            TriggerReply::NotFound => Err(ScheduleError::NotFound(id.into())),
        }
    }

    /// One fire script call: `occurrences` ascending, `after` the occurrence
    /// that follows the last of them.
    pub async fn fire(
        &self,
        id: &str,
        version: u64,
        occurrences: &[i64],
        after: Option<i64>,
    ) -> Result<FireResult, StoreError> {
        let call = scripts::Fire {
            id,
            version,
            node: &self.node_id,
            grace_ms: self.cfg.max_skew_ms,
            record_ttl_ms: self.cfg.record_ttl_ms,
            history_max: self.cfg.history_max,
            idempotency_window_ms: self.tasks.idempotency_window_ms,
            max_queues: self.tasks.max_queues,
            retention_ms: self.tasks.retention_ms,
            after,
            occurrences: occurrences
                .iter()
                .map(|t| (*t, ulid::Ulid::generate().to_string()))
                .collect(),
        };
        let res = self.store.run(&self.scripts.fire, &call).await?;
        for (result, n) in [
            ("fired", res.fired),
            ("skipped_overlap", res.skipped),
            ("missed", res.missed),
        ] {
            if n > 0 {
                metrics::counter!("muster_schedule_fires_total", "result" => result).increment(n);
            }
        }
        Ok(res)
    }

    /// The ids of every schedule, sorted.
    pub async fn ids(&self) -> Result<Vec<String>, StoreError> {
        let mut ids: Vec<String> = self
            .store
            .query("schedule_ids", redis::cmd("SMEMBERS").arg(self.set_key()))
            .await?;
        ids.sort();
        Ok(ids)
    }

    /// Every schedule (without history), in two pipelined round trips.
    pub async fn list(&self) -> Result<Vec<Schedule>, StoreError> {
        let ids = self.ids().await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        p.cmd("TIME");
        for id in &ids {
            p.cmd("HGETALL").arg(self.key(id));
        }
        let replies: Vec<Value> = self.store.pipe("schedule_list", &p).await?;
        let now = redis_ms(replies.first());
        let mut out = Vec::with_capacity(ids.len());
        for (id, v) in ids.iter().zip(replies.into_iter().skip(1)) {
            let m: BTreeMap<String, String> =
                redis::from_redis_value(v).map_err(|e| StoreError::Decode(e.to_string()))?;
            if !m.is_empty() {
                out.push(schedule_from(id, &m, now, Vec::new()));
            }
        }
        Ok(out)
    }

    /// One schedule with up to `history` history entries, or None.
    pub async fn get(&self, id: &str, history: usize) -> Result<Option<Schedule>, StoreError> {
        let mut p = redis::pipe();
        p.cmd("TIME");
        p.cmd("HGETALL").arg(self.key(id));
        // LRANGE 0 -1 would be the whole list: ask for none as an empty range.
        let (start, stop) = if history == 0 { (1, 0) } else { (0, history as i64 - 1) };
        p.cmd("LRANGE").arg(self.history_key(id)).arg(start).arg(stop);
        let ((s, us), m, rows): ((i64, i64), BTreeMap<String, String>, Vec<String>) =
            self.store.pipe("schedule_get", &p).await?;
        if m.is_empty() {
            return Ok(None);
        }
        let hist = rows.iter().filter_map(|r| serde_json::from_str(r).ok()).collect();
        Ok(Some(schedule_from(id, &m, s * 1000 + us / 1000, hist)))
    }
}

/// Redis time in ms from a TIME reply (0 if it is not one).
fn redis_ms(v: Option<&Value>) -> i64 {
    match v.map(|v| redis::from_redis_value::<(i64, i64)>(v.clone())) {
        Some(Ok((s, us))) => s * 1000 + us / 1000,
        _ => 0,
    }
}

/// Builds the API view of a schedule from its hash; `now` is Redis time.
fn schedule_from(id: &str, m: &BTreeMap<String, String>, now: i64, history: Vec<HistoryEntry>) -> Schedule {
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

#[cfg(test)]
mod tests {
    use chrono::{Datelike, Utc};

    use super::*;

    fn ms(tz: Tz, y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        tz.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .earliest()
            .unwrap()
            .timestamp_millis()
    }

    fn utc_ms(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap().timestamp_millis()
    }

    fn berlin(expr: &str) -> Timing {
        Timing::parse(expr, "Europe/Berlin").unwrap()
    }

    /// Occurrences within one Berlin calendar day, as UTC ms.
    fn day(t: &Timing, y: i32, mo: u32, d: u32) -> Vec<i64> {
        let tz = t.tz();
        let start = ms(tz, y, mo, d, 0, 0) - 1;
        let next = chrono::NaiveDate::from_ymd_opt(y, mo, d).unwrap().succ_opt().unwrap();
        let end = ms(tz, next.year(), next.month(), next.day(), 0, 0) - 1;
        t.occurrences(start, end, 1000).0
    }

    #[test]
    fn berlin_spring_forward_day() {
        // 2025-03-30: 02:00 CET jumps to 03:00 CEST (01:00 UTC). The day has 23 hours.
        let hourly = berlin("0 * * * *");
        let got = day(&hourly, 2025, 3, 30);
        assert_eq!(got.len(), 23, "an hourly schedule fires 23 times");
        assert_eq!(got[0], utc_ms(2025, 3, 29, 23, 0));
        assert_eq!(got[1], utc_ms(2025, 3, 30, 0, 0), "01:00 CET");
        assert_eq!(got[2], utc_ms(2025, 3, 30, 1, 0), "03:00 CEST follows 01:00 CET");
        // A fixed time inside the gap runs once, right after the gap (03:00 CEST).
        let at_230 = berlin("30 2 * * *");
        assert_eq!(day(&at_230, 2025, 3, 30), vec![utc_ms(2025, 3, 30, 1, 0)]);
        // The days around it are ordinary.
        assert_eq!(day(&at_230, 2025, 3, 29), vec![utc_ms(2025, 3, 29, 1, 30)]);
        assert_eq!(day(&at_230, 2025, 3, 31), vec![utc_ms(2025, 3, 31, 0, 30)]);
        // An interval skips the hour that does not exist.
        let halfhourly = berlin("*/30 1-3 * * *");
        assert_eq!(
            day(&halfhourly, 2025, 3, 30),
            vec![
                utc_ms(2025, 3, 30, 0, 0),
                utc_ms(2025, 3, 30, 0, 30),
                utc_ms(2025, 3, 30, 1, 0),
                utc_ms(2025, 3, 30, 1, 30)
            ]
        );
        assert_eq!(hourly.local(got[2]), "2025-03-30 03:00:00 CEST");
    }

    #[test]
    fn berlin_fall_back_day() {
        // 2025-10-26: 03:00 CEST goes back to 02:00 CET (01:00 UTC). The day has 25 hours.
        let hourly = berlin("0 * * * *");
        let got = day(&hourly, 2025, 10, 26);
        assert_eq!(got.len(), 25, "an hourly schedule fires 25 times");
        assert_eq!(got[2], utc_ms(2025, 10, 26, 0, 0), "02:00 CEST");
        assert_eq!(got[3], utc_ms(2025, 10, 26, 1, 0), "02:00 CET, the repeated hour");
        assert_eq!(got[4], utc_ms(2025, 10, 26, 2, 0), "03:00 CET");
        // A fixed time in the repeated hour runs once, on its first pass.
        let at_230 = berlin("30 2 * * *");
        assert_eq!(day(&at_230, 2025, 10, 26), vec![utc_ms(2025, 10, 26, 0, 30)]);
        assert_eq!(day(&at_230, 2025, 10, 27), vec![utc_ms(2025, 10, 27, 1, 30)]);
        // An interval runs on both passes.
        let quarter = berlin("*/30 2 * * *");
        assert_eq!(
            day(&quarter, 2025, 10, 26),
            vec![
                utc_ms(2025, 10, 26, 0, 0),
                utc_ms(2025, 10, 26, 0, 30),
                utc_ms(2025, 10, 26, 1, 0),
                utc_ms(2025, 10, 26, 1, 30)
            ]
        );
        assert_eq!(hourly.local(got[2]), "2025-10-26 02:00:00 CEST");
        assert_eq!(hourly.local(got[3]), "2025-10-26 02:00:00 CET");
    }

    #[test]
    fn resuming_from_an_occurrence_in_the_repeated_hour_keeps_its_pass() {
        // The scheduler resumes from its cursor, an exact instant: from the
        // first 02:30 the next is the second 02:00 pass, not a repeat.
        let every_30 = berlin("*/30 * * * *");
        let first_0230 = utc_ms(2025, 10, 26, 0, 30);
        let (next, _) = every_30.occurrences(first_0230, i64::MAX, 3);
        assert_eq!(
            next,
            vec![
                utc_ms(2025, 10, 26, 1, 0),
                utc_ms(2025, 10, 26, 1, 30),
                utc_ms(2025, 10, 26, 2, 0)
            ]
        );
    }

    #[test]
    fn occurrences_report_the_successor() {
        let t = Timing::parse("* * * * * *", "UTC").unwrap();
        let base = utc_ms(2030, 1, 1, 0, 0);
        let (v, after) = t.occurrences(base, base + 3000, 10);
        assert_eq!(v, vec![base + 1000, base + 2000, base + 3000]);
        assert_eq!(after, Some(base + 4000));
        let (v, after) = t.occurrences(base + 500, base + 10_000, 2);
        assert_eq!(v, vec![base + 1000, base + 2000], "cut at max");
        assert_eq!(after, Some(base + 3000));
    }

    #[test]
    fn five_and_six_fields() {
        let five = Timing::parse("*/5 * * * *", "UTC").unwrap();
        let base = utc_ms(2030, 1, 1, 0, 0);
        assert_eq!(five.next(base, 2), vec![base + 300_000, base + 600_000]);
        let six = Timing::parse("*/10 * * * * *", "UTC").unwrap();
        assert_eq!(six.next(base, 2), vec![base + 10_000, base + 20_000]);
        assert!(Timing::parse("* * * * * * *", "UTC").is_err(), "no year field");
        assert!(Timing::parse("* * * *", "UTC").is_err());
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let e = Timing::parse("61 * * * *", "UTC").unwrap_err();
        assert!(e.contains("`expression`") && e.contains("61"), "{e}");
        let e = Timing::parse("* * * * *", "Mars/Olympus").unwrap_err();
        assert!(e.contains("`timezone`") && e.contains("Mars/Olympus"), "{e}");
        let def = ScheduleDef {
            id: "x".into(),
            expression: "0 0 30 2 *".into(),
            timezone: "UTC".into(),
            queue: "q".into(),
            task: TaskTemplate::default(),
            enabled: true,
            overlap: Overlap::Allow,
            starting_deadline_ms: None,
            backfill: false,
        };
        let e = check(&def, &TasksConfig::default()).unwrap_err().to_string();
        assert!(e.contains("never matches"), "{e}");
    }

    #[test]
    fn describes_in_words() {
        let t = Timing::parse("*/5 * * * *", "UTC").unwrap();
        assert!(
            t.describe().to_lowercase().contains("every 5 minutes"),
            "{}",
            t.describe()
        );
    }
}
