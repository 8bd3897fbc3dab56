//! The schedule scripts: one argument struct and one reply type per script,
//! each mirroring the header of its `lua/*.lua` file (keys and arguments in
//! the documented order; replies decoded strictly, codes by name).

use redis::{FromRedisValue, ParsingError, Value};

use super::{FireOutcome, FireResult};
use crate::store::reply::{decode_error, read};
use crate::store::{Code, Keys, Lua, ScriptCall, ScriptCtx};

/// Every schedule script, loaded once per node.
pub(crate) struct Scripts {
    pub upsert: Lua,
    pub delete: Lua,
    pub set_enabled: Lua,
    pub fire: Lua,
    pub trigger: Lua,
}

impl Scripts {
    pub(super) fn new(ctx: &ScriptCtx) -> Scripts {
        let l = |name, src| Lua::load(name, src, ctx);
        Scripts {
            upsert: l("schedule_upsert", include_str!("lua/upsert.lua")),
            delete: l("schedule_delete", include_str!("lua/delete.lua")),
            set_enabled: l("schedule_set_enabled", include_str!("lua/set_enabled.lua")),
            fire: l("schedule_fire", include_str!("lua/fire.lua")),
            trigger: l("schedule_trigger", include_str!("lua/trigger.lua")),
        }
    }
}

// The key layout of `lua/lib.lua`.

/// Hash: schedule `s`'s definition and runtime state.
pub(crate) fn schedule_key(k: &Keys, s: &str) -> String {
    format!("{}:schedule:{s}", k.prefix())
}
/// List: schedule `s`'s history, newest first.
pub(crate) fn history_key(k: &Keys, s: &str) -> String {
    format!("{}:schedule:{s}:history", k.prefix())
}
/// Set: every schedule id.
pub(crate) fn schedules_key(k: &Keys) -> String {
    format!("{}:schedules", k.prefix())
}

fn flag(b: bool) -> String {
    if b { "1" } else { "0" }.into()
}

// --- upsert.lua ---------------------------------------------------------------

/// How `upsert.lua` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpsertMode {
    /// Refused if the schedule exists.
    Create,
    /// Create or replace.
    Put,
    /// Create or replace as defined in config.toml.
    Config,
}

impl UpsertMode {
    fn as_str(self) -> &'static str {
        match self {
            UpsertMode::Create => "create",
            UpsertMode::Put => "put",
            UpsertMode::Config => "config",
        }
    }
}

pub(crate) struct Upsert<'a> {
    pub id: &'a str,
    pub mode: UpsertMode,
    /// Token name or node id, for the event.
    pub actor: &'a str,
    pub max_schedules: u32,
    /// A digest of the config entry ('' unless mode is config).
    pub config_hash: &'a str,
    /// The definition's fields (see `lua/lib.lua`), enabled included.
    pub fields: Vec<(&'static str, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UpsertReply {
    Created {
        version: u64,
    },
    Replaced {
        version: u64,
    },
    /// Mode config and the stored config_hash is the same: nothing written.
    Unchanged {
        version: u64,
    },
    /// Mode create and the schedule exists.
    Exists,
    /// `schedules.max_schedules` reached.
    TooMany,
    /// Written from config.toml (modes create and put).
    FromConfig,
    /// The task names a limit not defined (modes create and put).
    UnknownLimit(String),
}

impl ScriptCall for Upsert<'_> {
    type Reply = UpsertReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![schedule_key(k, self.id)]
    }
    fn args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(6 + 2 * self.fields.len());
        args.extend([
            self.id.to_string(),
            self.mode.as_str().to_string(),
            self.actor.to_string(),
            self.max_schedules.to_string(),
            self.config_hash.to_string(),
            self.fields.len().to_string(),
        ]);
        for (f, v) in &self.fields {
            args.push(f.to_string());
            args.push(v.clone());
        }
        args
    }
}

impl FromRedisValue for UpsertReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let version = r.int("version")?.max(0) as u64;
            Ok(match code {
                Ok(1) => UpsertReply::Created { version },
                Ok(2) => UpsertReply::Replaced { version },
                Ok(3) => UpsertReply::Unchanged { version },
                Err(Code::Exists) => UpsertReply::Exists,
                Err(Code::TooMany) => UpsertReply::TooMany,
                Err(Code::WrongState) => UpsertReply::FromConfig,
                Err(Code::UnknownLimit) => UpsertReply::UnknownLimit(r.text("limit")?),
                other => return Err(decode_error(format!("upsert outcome {other:?}"))),
            })
        })
    }
}

// --- delete.lua ---------------------------------------------------------------

pub(crate) struct Delete<'a> {
    pub id: &'a str,
    /// Who deleted, for the event.
    pub actor: &'a str,
    /// Delete even a schedule written from config.toml.
    pub force: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeleteReply {
    Deleted,
    NotFound,
    /// Written from config.toml and not forced.
    FromConfig,
}

impl ScriptCall for Delete<'_> {
    type Reply = DeleteReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![schedule_key(k, self.id)]
    }
    fn args(&self) -> Vec<String> {
        vec![self.id.to_string(), self.actor.to_string(), flag(self.force)]
    }
}

impl FromRedisValue for DeleteReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(match r.code()? {
                Ok(1) => DeleteReply::Deleted,
                Err(Code::NotFound) => DeleteReply::NotFound,
                Err(Code::WrongState) => DeleteReply::FromConfig,
                other => return Err(decode_error(format!("delete outcome {other:?}"))),
            })
        })
    }
}

// --- set_enabled.lua ----------------------------------------------------------

pub(crate) struct SetEnabled<'a> {
    pub id: &'a str,
    pub enabled: bool,
    /// Who switched it, for the event.
    pub actor: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SetEnabledReply {
    /// Changed: the new version.
    Changed {
        version: u64,
    },
    /// Already so: the current version.
    Unchanged {
        version: u64,
    },
    NotFound,
}

impl ScriptCall for SetEnabled<'_> {
    type Reply = SetEnabledReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![schedule_key(k, self.id)]
    }
    fn args(&self) -> Vec<String> {
        vec![self.id.to_string(), flag(self.enabled), self.actor.to_string()]
    }
}

impl FromRedisValue for SetEnabledReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let version = r.int("version")?.max(0) as u64;
            Ok(match code {
                Ok(1) => SetEnabledReply::Changed { version },
                Ok(0) => SetEnabledReply::Unchanged { version },
                Err(Code::NotFound) => SetEnabledReply::NotFound,
                other => return Err(decode_error(format!("set_enabled outcome {other:?}"))),
            })
        })
    }
}

// --- fire.lua -----------------------------------------------------------------

pub(crate) struct Fire<'a> {
    pub id: &'a str,
    /// The version the occurrences were computed from.
    pub version: u64,
    /// This node (history, events, the tasks' submitter).
    pub node: &'a str,
    /// Lateness up to which an occurrence is on time (schedules.max_skew_ms).
    pub grace_ms: u64,
    pub record_ttl_ms: u64,
    pub history_max: u32,
    /// tasks.idempotency_window_ms
    pub idempotency_window_ms: u64,
    /// tasks.max_queues
    pub max_queues: u32,
    /// tasks.retention_ms, for a task cancelled by 'replace'.
    pub retention_ms: u64,
    /// The occurrence after the last one proposed, if any.
    pub after: Option<i64>,
    /// Occurrences (ascending) with a fresh task id and the traceparent
    /// its task would carry ('' none) each.
    pub occurrences: Vec<(i64, String, String)>,
}

impl ScriptCall for Fire<'_> {
    type Reply = FireResult;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![schedule_key(k, self.id)]
    }
    fn args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(11 + 3 * self.occurrences.len());
        args.extend([
            self.id.to_string(),
            self.version.to_string(),
            self.node.to_string(),
            self.grace_ms.to_string(),
            self.record_ttl_ms.to_string(),
            self.history_max.to_string(),
            self.idempotency_window_ms.to_string(),
            self.max_queues.to_string(),
            self.retention_ms.to_string(),
            self.after.unwrap_or(0).to_string(),
            self.occurrences.len().to_string(),
        ]);
        for (t, task, tp) in &self.occurrences {
            args.push(t.to_string());
            args.push(task.clone());
            args.push(tp.clone());
        }
        args
    }
}

impl FromRedisValue for FireResult {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let cursor = r.int("cursor")?;
            let (fired, skipped, missed) = (r.int("fired")?, r.int("skipped")?, r.int("missed")?);
            let wait_ms = r.int("wait_ms")?;
            let mut fired_at = Vec::new();
            while r.remaining() > 0 {
                fired_at.push(r.int("fired occurrence")?);
            }
            let outcome = match code {
                Ok(1) => FireOutcome::Done,
                Ok(0) => FireOutcome::NotDue,
                Err(Code::NotFound) => FireOutcome::NotFound,
                Err(Code::Stale) => FireOutcome::Changed,
                Err(Code::WrongState) => FireOutcome::Disabled,
                other => return Err(decode_error(format!("fire outcome {other:?}"))),
            };
            Ok(FireResult {
                outcome,
                code: outcome as i64,
                cursor,
                fired: fired.max(0) as u64,
                skipped: skipped.max(0) as u64,
                missed: missed.max(0) as u64,
                wait_ms,
                fired_at,
            })
        })
    }
}

// --- trigger.lua --------------------------------------------------------------

pub(crate) struct Trigger<'a> {
    pub id: &'a str,
    /// The caller's name, for history and events.
    pub actor: &'a str,
    /// This node (the task's submitter).
    pub node: &'a str,
    /// A fresh task id (a ULID).
    pub task_id: &'a str,
    pub history_max: u32,
    /// tasks.idempotency_window_ms
    pub idempotency_window_ms: u64,
    /// tasks.max_queues
    pub max_queues: u32,
    /// tasks.retention_ms, for a task cancelled by 'replace'.
    pub retention_ms: u64,
    /// The client's Idempotency-Key, if any.
    pub key: Option<&'a str>,
    /// The task's traceparent ('' none).
    pub traceparent: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TriggerReply {
    /// A new task; `replaced`: the live task 'replace' cancelled.
    Fired {
        task: String,
        occurrence: i64,
        queue: String,
        replaced: Option<String>,
    },
    /// The Idempotency-Key names an earlier trigger's task.
    Replayed {
        task: String,
        occurrence: i64,
        queue: String,
    },
    /// Overlap 'forbid' and the previous task (`live_task`) is live.
    Skipped {
        live_task: String,
    },
    NotFound,
    /// tasks.max_queues reached.
    TooManyQueues,
}

impl ScriptCall for Trigger<'_> {
    type Reply = TriggerReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![schedule_key(k, self.id)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.id.to_string(),
            self.actor.to_string(),
            self.node.to_string(),
            self.task_id.to_string(),
            self.history_max.to_string(),
            self.idempotency_window_ms.to_string(),
            self.max_queues.to_string(),
            self.retention_ms.to_string(),
            self.key.unwrap_or_default().to_string(),
            self.traceparent.to_string(),
        ]
    }
}

impl FromRedisValue for TriggerReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let (task, occurrence) = (r.text("task")?, r.int("occurrence")?);
            let (queue, replaced) = (r.text("queue")?, r.text("replaced")?);
            Ok(match code {
                Ok(1) => TriggerReply::Fired {
                    task,
                    occurrence,
                    queue,
                    replaced: Some(replaced).filter(|r| !r.is_empty()),
                },
                Ok(2) => TriggerReply::Replayed {
                    task,
                    occurrence,
                    queue,
                },
                Ok(3) => TriggerReply::Skipped { live_task: task },
                Err(Code::NotFound) => TriggerReply::NotFound,
                Err(Code::TooManyQueues) => TriggerReply::TooManyQueues,
                other => return Err(decode_error(format!("trigger outcome {other:?}"))),
            })
        })
    }
}

#[cfg(test)]
mod tests;
