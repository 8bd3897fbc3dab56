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
    pub fn new(ctx: &ScriptCtx) -> Scripts {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// Occurrences (ascending) with a fresh task id each.
    pub occurrences: Vec<(i64, String)>,
}

impl ScriptCall for Fire<'_> {
    type Reply = FireResult;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![schedule_key(k, self.id)]
    }
    fn args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(11 + 2 * self.occurrences.len());
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
        for (t, task) in &self.occurrences {
            args.push(t.to_string());
            args.push(task.clone());
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
mod tests {
    use super::*;
    use crate::store::reply::testing::{arr, check_with_extra as check, int, s};

    /// `extra`: the arguments of the variable part (n pairs after the
    /// documented ones).
    #[test]
    fn every_call_passes_what_its_header_documents() {
        for fields in [vec![], vec![("expr", "* * * * *".to_string()), ("tz", "UTC".into())]] {
            let extra = 2 * fields.len();
            check(
                &Upsert {
                    id: "s",
                    mode: UpsertMode::Config,
                    actor: "a",
                    max_schedules: 10,
                    config_hash: "h",
                    fields,
                },
                include_str!("lua/upsert.lua"),
                extra,
            );
        }
        check(
            &Delete {
                id: "s",
                actor: "a",
                force: false,
            },
            include_str!("lua/delete.lua"),
            0,
        );
        check(
            &SetEnabled {
                id: "s",
                enabled: true,
                actor: "a",
            },
            include_str!("lua/set_enabled.lua"),
            0,
        );
        for occurrences in [vec![], vec![(1000, "t1".to_string()), (2000, "t2".into())]] {
            let extra = 2 * occurrences.len();
            let call = Fire {
                id: "s",
                version: 1,
                node: "n",
                grace_ms: 1,
                record_ttl_ms: 1,
                history_max: 1,
                idempotency_window_ms: 1,
                max_queues: 1,
                retention_ms: 1,
                after: None,
                occurrences,
            };
            check(&call, include_str!("lua/fire.lua"), extra);
            // ARGV[11] is n; the pairs follow from ARGV[12].
            assert_eq!(call.args()[10], (extra / 2).to_string());
        }
        check(
            &Trigger {
                id: "s",
                actor: "a",
                node: "n",
                task_id: "t",
                history_max: 1,
                idempotency_window_ms: 1,
                max_queues: 1,
                retention_ms: 1,
                key: None,
            },
            include_str!("lua/trigger.lua"),
            0,
        );
        let k = Keys::new("muster");
        assert_eq!(schedule_key(&k, "s"), "{muster}:schedule:s");
        assert_eq!(history_key(&k, "s"), "{muster}:schedule:s:history");
        assert_eq!(schedules_key(&k), "{muster}:schedules");
    }

    #[test]
    fn scripts_return_no_bare_negative_codes() {
        for src in [
            include_str!("lua/upsert.lua"),
            include_str!("lua/delete.lua"),
            include_str!("lua/set_enabled.lua"),
            include_str!("lua/fire.lua"),
            include_str!("lua/trigger.lua"),
            include_str!("lua/lib.lua"),
        ] {
            for l in src.lines().filter(|l| l.contains("return")) {
                let after = &l[l.find("return").unwrap()..];
                assert!(!after.starts_with("return -") && !after.starts_with("return {-"), "{l}");
            }
        }
    }

    #[test]
    fn replies_decode_by_code_name_and_strictly() {
        let u = |v| UpsertReply::from_redis_value(v);
        assert_eq!(
            u(arr(vec![int(1), int(1)])).unwrap(),
            UpsertReply::Created { version: 1 }
        );
        assert_eq!(
            u(arr(vec![int(3), int(4)])).unwrap(),
            UpsertReply::Unchanged { version: 4 }
        );
        assert_eq!(
            u(arr(vec![int(Code::Exists as i64), int(2)])).unwrap(),
            UpsertReply::Exists
        );
        assert_eq!(
            u(arr(vec![int(Code::TooMany as i64), int(0)])).unwrap(),
            UpsertReply::TooMany
        );
        assert_eq!(
            u(arr(vec![int(Code::WrongState as i64), int(2)])).unwrap(),
            UpsertReply::FromConfig
        );
        assert!(u(arr(vec![int(1)])).is_err(), "short");
        assert!(u(arr(vec![int(4), int(1)])).is_err(), "unknown outcome");
        assert!(
            u(arr(vec![int(Code::NotFound as i64), int(0)])).is_err(),
            "not upsert's code"
        );
        assert!(u(arr(vec![int(-999), int(0)])).is_err(), "unknown code");

        let d = |v| DeleteReply::from_redis_value(v);
        assert_eq!(d(int(1)).unwrap(), DeleteReply::Deleted);
        assert_eq!(d(int(Code::NotFound as i64)).unwrap(), DeleteReply::NotFound);
        assert_eq!(d(int(Code::WrongState as i64)).unwrap(), DeleteReply::FromConfig);
        assert!(d(int(0)).is_err());
        assert!(d(arr(vec![])).is_err());

        let e = |v| SetEnabledReply::from_redis_value(v);
        assert_eq!(
            e(arr(vec![int(1), int(5)])).unwrap(),
            SetEnabledReply::Changed { version: 5 }
        );
        assert_eq!(
            e(arr(vec![int(0), int(5)])).unwrap(),
            SetEnabledReply::Unchanged { version: 5 }
        );
        assert_eq!(
            e(arr(vec![int(Code::NotFound as i64), int(0)])).unwrap(),
            SetEnabledReply::NotFound
        );
        assert!(e(int(1)).is_err());

        let f = |v| FireResult::from_redis_value(v);
        let r = f(arr(vec![int(1), int(60_000), int(2), int(1), int(3), int(-1)])).unwrap();
        assert_eq!((r.outcome, r.code), (FireOutcome::Done, 1));
        assert_eq!(
            (r.cursor, r.fired, r.skipped, r.missed, r.wait_ms),
            (60_000, 2, 1, 3, -1)
        );
        let r = f(arr(vec![int(0), int(1), int(0), int(0), int(0), int(250)])).unwrap();
        assert_eq!((r.outcome, r.wait_ms), (FireOutcome::NotDue, 250));
        for (c, o) in [
            (Code::NotFound, FireOutcome::NotFound),
            (Code::Stale, FireOutcome::Changed),
            (Code::WrongState, FireOutcome::Disabled),
        ] {
            let r = f(arr(vec![int(c as i64), int(0), int(0), int(0), int(0), int(-1)])).unwrap();
            assert_eq!((r.outcome, r.code), (o, o as i64));
        }
        assert!(f(arr(vec![int(1), int(0), int(0), int(0), int(0)])).is_err(), "short");
        assert!(f(arr(vec![int(2), int(0), int(0), int(0), int(0), int(-1)])).is_err());
        assert!(
            f(arr(vec![
                int(Code::TooManyQueues as i64),
                int(0),
                int(0),
                int(0),
                int(0),
                int(-1)
            ]))
            .is_err()
        );

        let t = |v| TriggerReply::from_redis_value(v);
        assert_eq!(
            t(arr(vec![int(1), s("T1"), int(9), s("q"), s("")])).unwrap(),
            TriggerReply::Fired {
                task: "T1".into(),
                occurrence: 9,
                queue: "q".into(),
                replaced: None
            }
        );
        assert_eq!(
            t(arr(vec![int(1), s("T1"), int(9), s("q"), s("T0")])).unwrap(),
            TriggerReply::Fired {
                task: "T1".into(),
                occurrence: 9,
                queue: "q".into(),
                replaced: Some("T0".into())
            }
        );
        assert_eq!(
            t(arr(vec![int(2), s("T1"), int(9), s("q"), s("")])).unwrap(),
            TriggerReply::Replayed {
                task: "T1".into(),
                occurrence: 9,
                queue: "q".into()
            }
        );
        assert_eq!(
            t(arr(vec![int(3), s("T0"), int(9), s("q"), s("")])).unwrap(),
            TriggerReply::Skipped { live_task: "T0".into() }
        );
        assert_eq!(
            t(arr(vec![int(Code::NotFound as i64), s(""), int(0), s(""), s("")])).unwrap(),
            TriggerReply::NotFound
        );
        assert_eq!(
            t(arr(vec![int(Code::TooManyQueues as i64), s(""), int(9), s("q"), s("")])).unwrap(),
            TriggerReply::TooManyQueues
        );
        assert!(t(arr(vec![int(1), s("T1"), int(9)])).is_err(), "short");
        assert!(
            t(arr(vec![int(4), s(""), int(0), s(""), s("")])).is_err(),
            "unknown outcome"
        );
        assert!(t(arr(vec![int(Code::Stale as i64), s(""), int(0), s(""), s("")])).is_err());
    }
}
