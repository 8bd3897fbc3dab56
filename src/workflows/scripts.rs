//! The workflow scripts: one argument struct and one reply type per script,
//! each mirroring the header of its `lua/*.lua` file (keys and arguments in
//! the documented order; replies decoded strictly, codes by name).
//! `lua/hook.lua` is a library of the task scripts, not called from here.

use redis::{FromRedisValue, ParsingError, Value};

use crate::store::reply::{decode_error, read};
use crate::store::{Code, Keys, Lua, ScriptCall, ScriptCtx};

/// Every workflow script, loaded once per node.
pub(crate) struct Scripts {
    pub create: Lua,
    pub cancel: Lua,
    pub janitor: Lua,
}

impl Scripts {
    pub(crate) fn new(ctx: &ScriptCtx) -> Scripts {
        let l = |name, src| Lua::load(name, src, ctx);
        Scripts {
            create: l("workflow_create", include_str!("lua/create.lua")),
            cancel: l("workflow_cancel", include_str!("lua/cancel.lua")),
            janitor: l("workflow_janitor", include_str!("lua/janitor.lua")),
        }
    }
}

// The key layout of `lua/hook.lua`.

/// Hash: workflow `w`'s state; with `part`, one of its other keys
/// (`spec`, `next`, `wait`, `st`).
pub(crate) fn workflow_key(k: &Keys, w: &str, part: Option<&str>) -> String {
    match part {
        Some(p) => format!("{}:wf:{w}:{p}", k.prefix()),
        None => format!("{}:wf:{w}", k.prefix()),
    }
}
/// Zset: every workflow id by created_at.
pub(crate) fn workflows_key(k: &Keys) -> String {
    format!("{}:workflows", k.prefix())
}
/// Zset: finished workflow ids by finished_at.
pub(crate) fn done_key(k: &Keys) -> String {
    format!("{}:workflows:done", k.prefix())
}

// --- create.lua ---------------------------------------------------------------

pub(crate) struct Create<'a> {
    pub id: &'a str,
    /// fail_fast | continue
    pub policy: &'a str,
    /// '' for none.
    pub idempotency_key: &'a str,
    pub idempotency_window_ms: u64,
    /// How long a finished workflow is kept.
    pub retention_ms: u64,
    /// The submitting node, for events.
    pub node: &'a str,
    /// tasks.max_queues
    pub max_queues: u32,
    /// tasks.dead_retention_ms
    pub dead_retention_ms: u64,
    /// (key, spec JSON, dependency count, comma-separated dependents)
    pub keys: &'a [(String, String, usize, String)],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CreateReply {
    Created {
        id: String,
    },
    /// The idempotency key names an earlier workflow (`id`).
    Replayed {
        id: String,
    },
    /// tasks.max_queues would be exceeded.
    TooManyQueues,
    /// A task names a flow-control limit not defined (its name).
    UnknownLimit(String),
}

impl ScriptCall for Create<'_> {
    type Reply = CreateReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![workflows_key(k)]
    }
    fn args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(9 + 4 * self.keys.len());
        args.extend([
            self.id.to_string(),
            self.policy.to_string(),
            self.idempotency_key.to_string(),
            self.idempotency_window_ms.to_string(),
            self.retention_ms.to_string(),
            self.node.to_string(),
            self.max_queues.to_string(),
            self.dead_retention_ms.to_string(),
            self.keys.len().to_string(),
        ]);
        for (k, spec, n, next) in self.keys {
            args.extend([k.clone(), spec.clone(), n.to_string(), next.clone()]);
        }
        args
    }
}

impl FromRedisValue for CreateReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let id = r.text("id")?;
            Ok(match code {
                Ok(1) => CreateReply::Created { id },
                Ok(2) => CreateReply::Replayed { id },
                Err(Code::TooManyQueues) => CreateReply::TooManyQueues,
                Err(Code::UnknownLimit) => CreateReply::UnknownLimit(id),
                other => return Err(decode_error(format!("create outcome {other:?}"))),
            })
        })
    }
}

// --- cancel.lua ---------------------------------------------------------------

pub(crate) struct Cancel<'a> {
    pub id: &'a str,
    /// Who cancelled, for the event.
    pub actor: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CancelReply {
    Cancelled,
    /// Finished already, in `state`.
    Finished {
        state: String,
    },
    NotFound,
}

impl ScriptCall for Cancel<'_> {
    type Reply = CancelReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![workflow_key(k, self.id, None)]
    }
    fn args(&self) -> Vec<String> {
        vec![self.id.to_string(), self.actor.to_string()]
    }
}

impl FromRedisValue for CancelReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let state = r.text("state")?;
            Ok(match code {
                Ok(1) => CancelReply::Cancelled,
                Ok(0) => CancelReply::Finished { state },
                Err(Code::NotFound) => CancelReply::NotFound,
                other => return Err(decode_error(format!("cancel outcome {other:?}"))),
            })
        })
    }
}

// --- janitor.lua --------------------------------------------------------------

pub(crate) struct Janitor {
    pub retention_ms: u64,
    /// Most workflows forgotten in one call.
    pub limit: u32,
}

/// The number of workflows forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JanitorReply {
    pub forgotten: u64,
}

impl ScriptCall for Janitor {
    type Reply = JanitorReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![workflows_key(k), done_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![self.retention_ms.to_string(), self.limit.to_string()]
    }
}

impl FromRedisValue for JanitorReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let n = r.int("forgotten")?;
            if n < 0 || r.remaining() != 0 {
                return Err(decode_error(format!("janitor count {n}")));
            }
            Ok(JanitorReply { forgotten: n as u64 })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::reply::testing::{arr, check_with_extra as check, int, s};

    /// `extra`: the arguments of the variable part (after the documented ones).
    #[test]
    fn every_call_passes_what_its_header_documents() {
        let two = [
            ("a".to_string(), "{}".to_string(), 0, "b".to_string()),
            ("b".to_string(), "{}".to_string(), 1, String::new()),
        ];
        for keys in [&[][..], &two[..]] {
            let call = Create {
                id: "w",
                policy: "fail_fast",
                idempotency_key: "",
                idempotency_window_ms: 1,
                retention_ms: 1,
                node: "n",
                max_queues: 1,
                dead_retention_ms: 1,
                keys,
            };
            check(&call, include_str!("lua/create.lua"), 4 * keys.len());
            // ARGV[9] is n; the fields follow from ARGV[10].
            let args = call.args();
            assert_eq!(args[8], keys.len().to_string());
            if !keys.is_empty() {
                assert_eq!(&args[9..13], ["a", "{}", "0", "b"]);
            }
        }
        check(&Cancel { id: "w", actor: "a" }, include_str!("lua/cancel.lua"), 0);
        check(
            &Janitor {
                retention_ms: 1,
                limit: 1000,
            },
            include_str!("lua/janitor.lua"),
            0,
        );
        let k = Keys::new("muster");
        assert_eq!(workflow_key(&k, "w", None), "{muster}:wf:w");
        assert_eq!(workflow_key(&k, "w", Some("st")), "{muster}:wf:w:st");
        assert_eq!(workflows_key(&k), "{muster}:workflows");
        assert_eq!(done_key(&k), "{muster}:workflows:done");
    }

    #[test]
    fn scripts_return_no_bare_negative_codes() {
        for src in [
            include_str!("lua/create.lua"),
            include_str!("lua/cancel.lua"),
            include_str!("lua/janitor.lua"),
            include_str!("lua/hook.lua"),
        ] {
            for l in src.lines().filter(|l| l.contains("return")) {
                let after = &l[l.find("return").unwrap()..];
                assert!(!after.starts_with("return -") && !after.starts_with("return {-"), "{l}");
            }
        }
    }

    #[test]
    fn replies_decode_by_code_name_and_strictly() {
        let c = |v| CreateReply::from_redis_value(v);
        assert_eq!(
            c(arr(vec![int(1), s("w1")])).unwrap(),
            CreateReply::Created { id: "w1".into() }
        );
        assert_eq!(
            c(arr(vec![int(2), s("w0")])).unwrap(),
            CreateReply::Replayed { id: "w0".into() }
        );
        assert_eq!(
            c(arr(vec![int(Code::TooManyQueues as i64), s("")])).unwrap(),
            CreateReply::TooManyQueues
        );
        assert!(c(arr(vec![int(Code::NotFound as i64), s("")])).is_err());
        assert!(c(arr(vec![int(3), s("")])).is_err());
        assert!(c(arr(vec![int(1)])).is_err());

        let x = |v| CancelReply::from_redis_value(v);
        assert_eq!(x(arr(vec![int(1), s("cancelled")])).unwrap(), CancelReply::Cancelled);
        assert_eq!(
            x(arr(vec![int(0), s("succeeded")])).unwrap(),
            CancelReply::Finished {
                state: "succeeded".into()
            }
        );
        assert_eq!(
            x(arr(vec![int(Code::NotFound as i64), s("")])).unwrap(),
            CancelReply::NotFound
        );
        // The old bare -2 is STALE now, which cancel never returns.
        assert!(x(arr(vec![int(-2), s("")])).is_err());
        assert!(x(arr(vec![int(1)])).is_err());

        let j = |v| JanitorReply::from_redis_value(v);
        assert_eq!(j(int(3)).unwrap(), JanitorReply { forgotten: 3 });
        assert!(j(int(-1)).is_err());
        assert!(j(s("x")).is_err());
        assert!(j(arr(vec![])).is_err());
    }
}
