//! The barrier scripts: one argument struct and one reply type per script,
//! each mirroring the header of its `lua/*.lua` file (keys and arguments in
//! the documented order; replies decoded strictly, codes by name).

use std::collections::BTreeMap;

use redis::{FromRedisValue, ParsingError, Value};

use super::Verdict;
use crate::store::reply::{decode_error, read};
use crate::store::{Code, Keys, Lua, ScriptCall, ScriptCtx};

mod etcd;
pub(crate) use etcd::*;

/// Every barrier script, loaded once per node.
pub(crate) struct Scripts {
    pub configure: Lua,
    pub delete: Lua,
    pub arrive: Lua,
    pub decide_due: Lua,
    pub hold: Lua,
    pub lift: Lua,
    pub enter: Lua,
    pub leave: Lua,
    pub db_sweep: Lua,
}

impl Scripts {
    pub(super) fn new(ctx: &ScriptCtx) -> Scripts {
        let l = |name, src| Lua::load(name, src, ctx);
        Scripts {
            configure: l("barrier_configure", include_str!("lua/configure.lua")),
            delete: l("barrier_delete", include_str!("lua/delete.lua")),
            arrive: l("barrier_arrive", include_str!("lua/arrive.lua")),
            decide_due: l("barrier_decide_due", include_str!("lua/decide_due.lua")),
            hold: l("barrier_hold", include_str!("lua/hold.lua")),
            lift: l("barrier_lift", include_str!("lua/lift.lua")),
            enter: l("dbarrier_enter", include_str!("lua/enter.lua")),
            leave: l("dbarrier_leave", include_str!("lua/leave.lua")),
            db_sweep: l("dbarrier_sweep", include_str!("lua/db_sweep.lua")),
        }
    }
}

// The key layout of `lua/lib.lua`.

/// Set: configured barrier names.
pub(crate) fn index_key(k: &Keys) -> String {
    format!("{}:barriers", k.prefix())
}
/// Hash: barrier `b`'s configuration.
pub(crate) fn config_key(k: &Keys, b: &str) -> String {
    format!("{}:barrier:{b}", k.prefix())
}
/// Sorted set: barrier `b`'s stored rounds by opening time.
pub(crate) fn rounds_key(k: &Keys, b: &str) -> String {
    format!("{}:barrier:{b}:rounds", k.prefix())
}
/// Sorted set: barrier `b`'s undecided rounds by deadline.
pub(crate) fn open_key(k: &Keys, b: &str) -> String {
    format!("{}:barrier:{b}:open", k.prefix())
}
/// Sorted set: barrier `b`'s decided rounds by decision time.
pub(crate) fn decided_key(k: &Keys, b: &str) -> String {
    format!("{}:barrier:{b}:decided", k.prefix())
}
/// Hash: round `r` of barrier `b`.
pub(crate) fn round_key(k: &Keys, b: &str, r: &str) -> String {
    format!("{}:barrier:{b}:r:{r}", k.prefix())
}
/// Sorted set: open rounds (`<b>/<r>`) by deadline.
pub(crate) fn deadlines_key(k: &Keys) -> String {
    format!("{}:barriers:deadlines", k.prefix())
}
/// Hash: barrier `b`'s etcd-style hold.
pub(crate) fn hold_key(k: &Keys, b: &str) -> String {
    format!("{}:barrier:{b}:hold", k.prefix())
}
/// Sorted set: held barrier names by when their hold lifts itself.
pub(crate) fn holds_key(k: &Keys) -> String {
    format!("{}:barriers:holds", k.prefix())
}
/// Hash: DoubleBarrier `b`.
pub(crate) fn db_key(k: &Keys, b: &str) -> String {
    format!("{}:dbarrier:{b}", k.prefix())
}
/// Sorted set: DoubleBarrier `b`'s entrants by entry time.
pub(crate) fn db_in_key(k: &Keys, b: &str) -> String {
    format!("{}:dbarrier:{b}:in", k.prefix())
}
/// Sorted set: DoubleBarrier names by last activity.
pub(crate) fn db_index_key(k: &Keys) -> String {
    format!("{}:dbarriers", k.prefix())
}

/// A Redis time as returned: 0 means none.
fn positive(v: i64) -> Option<i64> {
    (v > 0).then_some(v)
}

/// A count as returned (never negative).
fn count(v: i64, what: &str) -> Result<u32, ParsingError> {
    u32::try_from(v).map_err(|_| decode_error(format!("{what} {v}")))
}

// --- configure.lua ------------------------------------------------------------

pub(crate) struct Configure<'a> {
    pub name: &'a str,
    /// The validated participants (no duplicates).
    pub participants: &'a [String],
    pub max_missing: u32,
    pub timeout_ms: u64,
    /// Who configured it (token name).
    pub actor: &'a str,
    pub max_barriers: u32,
    /// The acting muster node (events).
    pub me: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConfigureReply {
    /// 1 created, or 0 updated.
    Done { created: bool },
    /// `barriers.max_barriers` would be exceeded.
    TooMany,
}

impl ScriptCall for Configure<'_> {
    type Reply = ConfigureReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![index_key(k), config_key(k, self.name)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.name.to_string(),
            format!(",{},", self.participants.join(",")),
            self.participants.len().to_string(),
            self.max_missing.to_string(),
            self.timeout_ms.to_string(),
            self.actor.to_string(),
            self.max_barriers.to_string(),
            self.me.to_string(),
        ]
    }
}

impl FromRedisValue for ConfigureReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            r.int("now_ms")?;
            Ok(match code {
                Ok(c @ (0 | 1)) => ConfigureReply::Done { created: c == 1 },
                Err(Code::TooMany) => ConfigureReply::TooMany,
                other => return Err(decode_error(format!("configure outcome {other:?}"))),
            })
        })
    }
}

// --- delete.lua ---------------------------------------------------------------

pub(crate) struct Delete<'a> {
    pub name: &'a str,
    /// Who deleted it (token name).
    pub actor: &'a str,
    pub me: &'a str,
}

/// Whether the barrier existed (configured or held) and is gone now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deleted(pub bool);

impl ScriptCall for Delete<'_> {
    type Reply = Deleted;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![
            index_key(k),
            config_key(k, self.name),
            rounds_key(k, self.name),
            deadlines_key(k),
            hold_key(k, self.name),
            open_key(k, self.name),
            decided_key(k, self.name),
            holds_key(k),
        ]
    }
    fn args(&self) -> Vec<String> {
        vec![self.name.to_string(), self.actor.to_string(), self.me.to_string()]
    }
}

impl FromRedisValue for Deleted {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| match r.code()? {
            Ok(c @ (0 | 1)) => Ok(Deleted(c == 1)),
            other => Err(decode_error(format!("delete outcome {other:?}"))),
        })
    }
}

// --- arrive.lua ---------------------------------------------------------------

pub(crate) struct Arrive<'a> {
    pub name: &'a str,
    pub round: &'a str,
    /// The participant (node id) arriving.
    pub node: &'a str,
    pub me: &'a str,
    pub retention_ms: u64,
    pub rounds_kept: u32,
    pub max_open_rounds: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ArriveReply {
    /// 1: the round after the call.
    Arrived {
        /// The verdict this call set, if it decided the round.
        decided: Option<Verdict>,
        /// Redis ms at the call.
        now: i64,
        /// The round hash (empty if it is gone).
        fields: BTreeMap<String, String>,
    },
    /// No such barrier.
    NotFound,
    /// The node is not a participant of this round.
    NotParticipant,
    /// The round would open, but `max_open_rounds` are undecided already.
    TooManyOpenRounds,
}

impl ScriptCall for Arrive<'_> {
    type Reply = ArriveReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![
            config_key(k, self.name),
            round_key(k, self.name, self.round),
            rounds_key(k, self.name),
            deadlines_key(k),
        ]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.name.to_string(),
            self.round.to_string(),
            self.node.to_string(),
            self.me.to_string(),
            self.retention_ms.to_string(),
            self.rounds_kept.to_string(),
            self.max_open_rounds.to_string(),
        ]
    }
}

impl FromRedisValue for ArriveReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let decided = match r.text("decided")?.as_str() {
                "" => None,
                "released" => Some(Verdict::Released),
                "aborted" => Some(Verdict::Aborted),
                other => return Err(decode_error(format!("arrive verdict `{other}`"))),
            };
            let now = r.int("now_ms")?;
            if r.remaining() % 2 != 0 {
                return Err(decode_error("arrive: a round field without its value"));
            }
            let mut fields = BTreeMap::new();
            while r.remaining() > 0 {
                let field = r.text("a round field")?;
                fields.insert(field, r.text("a round value")?);
            }
            Ok(match code {
                Ok(1) => ArriveReply::Arrived { decided, now, fields },
                Err(Code::NotFound) => ArriveReply::NotFound,
                Err(Code::NotParticipant) => ArriveReply::NotParticipant,
                Err(Code::TooMany) => ArriveReply::TooManyOpenRounds,
                other => return Err(decode_error(format!("arrive outcome {other:?}"))),
            })
        })
    }
}

// --- decide_due.lua -----------------------------------------------------------

pub(crate) struct DecideDue<'a> {
    pub me: &'a str,
    pub retention_ms: u64,
    /// Most rounds looked at per call.
    pub limit: u32,
    pub rounds_kept: u32,
}

/// The rounds one call decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DecidedDue {
    pub released: i64,
    pub aborted: i64,
    /// The limit was reached: call again.
    pub more: bool,
}

impl ScriptCall for DecideDue<'_> {
    type Reply = DecidedDue;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![deadlines_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.me.to_string(),
            self.retention_ms.to_string(),
            self.limit.to_string(),
            self.rounds_kept.to_string(),
        ]
    }
}

impl FromRedisValue for DecidedDue {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(DecidedDue {
                released: r.int("released")?,
                aborted: r.int("aborted")?,
                more: match r.int("more")? {
                    0 => false,
                    1 => true,
                    other => return Err(decode_error(format!("decide_due more {other}"))),
                },
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::reply::testing::{arr, check, int, s};

    #[test]
    fn every_call_passes_what_its_header_documents() {
        let parts = ["a".to_string(), "b".to_string()];
        let configure = Configure {
            name: "b",
            participants: &parts,
            max_missing: 1,
            timeout_ms: 1,
            actor: "t",
            max_barriers: 10,
            me: "n",
        };
        check(&configure, include_str!("lua/configure.lua"));
        assert_eq!(configure.args()[1..3], [",a,b,".to_string(), "2".to_string()]);
        check(
            &Delete {
                name: "b",
                actor: "t",
                me: "n",
            },
            include_str!("lua/delete.lua"),
        );
        check(
            &Arrive {
                name: "b",
                round: "r",
                node: "a",
                me: "n",
                retention_ms: 1,
                rounds_kept: 1,
                max_open_rounds: 1,
            },
            include_str!("lua/arrive.lua"),
        );
        check(
            &DecideDue {
                me: "n",
                retention_ms: 1,
                limit: 100,
                rounds_kept: 1,
            },
            include_str!("lua/decide_due.lua"),
        );
        check(
            &Hold {
                name: "b",
                holder: "h",
                ttl_ms: 1,
                me: "n",
            },
            include_str!("lua/hold.lua"),
        );
        check(
            &Lift {
                name: "b",
                actor: "t",
                me: "n",
            },
            include_str!("lua/lift.lua"),
        );
        check(
            &Enter {
                name: "d",
                node: "a",
                count: 2,
                node_ttl_ms: 1,
                idle_ttl_ms: 1,
                me: "n",
            },
            include_str!("lua/enter.lua"),
        );
        check(
            &Leave {
                name: "d",
                node: "a",
                node_ttl_ms: 1,
                me: "n",
            },
            include_str!("lua/leave.lua"),
        );
        check(
            &DbSweep {
                node_ttl_ms: 1,
                idle_ttl_ms: 1,
                me: "n",
                limit: 1000,
            },
            include_str!("lua/db_sweep.lua"),
        );
        let k = Keys::new("muster");
        assert_eq!(round_key(&k, "b", "r"), "{muster}:barrier:b:r:r");
        assert_eq!(deadlines_key(&k), "{muster}:barriers:deadlines");
        assert_eq!(db_in_key(&k, "d"), "{muster}:dbarrier:d:in");
    }

    #[test]
    fn replies_decode_by_code_name_and_strictly() {
        let code = |c: Code| int(c as i64);

        assert_eq!(
            ConfigureReply::from_redis_value(arr(vec![int(1), int(5)])).unwrap(),
            ConfigureReply::Done { created: true }
        );
        assert_eq!(
            ConfigureReply::from_redis_value(arr(vec![code(Code::TooMany), int(5)])).unwrap(),
            ConfigureReply::TooMany
        );
        assert!(ConfigureReply::from_redis_value(arr(vec![int(0)])).is_err());
        assert!(ConfigureReply::from_redis_value(arr(vec![int(-1), int(5)])).is_err());
        assert!(ConfigureReply::from_redis_value(arr(vec![int(-999), int(5)])).is_err());

        let a = |v| ArriveReply::from_redis_value(arr(v));
        assert_eq!(
            a(vec![
                int(1),
                s("released"),
                int(7),
                s("parts"),
                s(",a,"),
                s("a:a"),
                s("6")
            ])
            .unwrap(),
            ArriveReply::Arrived {
                decided: Some(Verdict::Released),
                now: 7,
                fields: [("parts".into(), ",a,".into()), ("a:a".into(), "6".into())].into(),
            }
        );
        assert_eq!(
            a(vec![code(Code::NotFound), s(""), int(7)]).unwrap(),
            ArriveReply::NotFound
        );
        assert_eq!(
            a(vec![code(Code::NotParticipant), s(""), int(7)]).unwrap(),
            ArriveReply::NotParticipant
        );
        assert_eq!(
            a(vec![code(Code::TooMany), s(""), int(7)]).unwrap(),
            ArriveReply::TooManyOpenRounds
        );
        assert!(a(vec![code(Code::Stale), s(""), int(7)]).is_err());
        assert!(a(vec![int(1), s("")]).is_err());
        assert!(a(vec![int(1), s("maybe"), int(7)]).is_err());
        assert!(a(vec![int(1), s(""), int(7), s("parts")]).is_err());

        assert_eq!(Deleted::from_redis_value(int(0)).unwrap(), Deleted(false));
        assert!(Deleted::from_redis_value(int(2)).is_err());
        assert_eq!(Lifted::from_redis_value(int(1)).unwrap(), Lifted(true));
        assert!(Lifted::from_redis_value(int(-1)).is_err());

        assert_eq!(
            DecidedDue::from_redis_value(arr(vec![int(2), int(1), int(1)])).unwrap(),
            DecidedDue {
                released: 2,
                aborted: 1,
                more: true
            }
        );
        assert!(DecidedDue::from_redis_value(arr(vec![int(2), int(1)])).is_err());

        let h = |v| HoldReply::from_redis_value(arr(v));
        assert_eq!(
            h(vec![int(2), s("x"), int(3), int(9)]).unwrap(),
            HoldReply::Held {
                holder: "x".into(),
                held_at: 3,
                expires_at: 9,
                again: true
            }
        );
        assert_eq!(
            h(vec![code(Code::WrongState), s("y"), int(3), int(9)]).unwrap(),
            HoldReply::HeldByOther { holder: "y".into() }
        );
        assert!(h(vec![code(Code::WrongState), s("y")]).is_err());
        assert!(h(vec![int(-1), s("y"), int(3), int(9)]).is_err());

        let e = |v| EnterReply::from_redis_value(arr(v));
        let state = DoubleState {
            count: 3,
            entrants: 3,
            ready_at: None,
            cycle: String::new(),
        };
        assert_eq!(
            e(vec![code(Code::TooMany), int(3), int(3), int(0), s("")]).unwrap(),
            EnterReply::TooMany { state: state.clone() }
        );
        assert_eq!(
            e(vec![code(Code::WrongState), int(3), int(3), int(0), s("")]).unwrap(),
            EnterReply::CountMismatch { state }
        );
        assert_eq!(
            e(vec![code(Code::NodeNotAlive), int(2), int(0), int(0), s("")]).unwrap(),
            EnterReply::NodeNotAlive
        );
        assert_eq!(
            e(vec![int(1), int(2), int(2), int(5), s("1-0")]).unwrap(),
            EnterReply::Entered {
                state: DoubleState {
                    count: 2,
                    entrants: 2,
                    ready_at: Some(5),
                    cycle: "1-0".into()
                },
                again: false
            }
        );
        assert!(e(vec![int(1), int(2), int(2)]).is_err());
        assert!(e(vec![code(Code::Stale), int(2), int(0), int(0), s("")]).is_err());

        assert_eq!(
            LeaveReply::from_redis_value(arr(vec![int(1), int(0), int(5), s("1-0")])).unwrap(),
            LeaveReply {
                left_now: true,
                entrants: 0,
                ready_at: Some(5),
                cycle: "1-0".into()
            }
        );
        assert!(LeaveReply::from_redis_value(arr(vec![int(2), int(0), int(0), s("")])).is_err());
        assert!(LeaveReply::from_redis_value(arr(vec![int(1), int(0)])).is_err());

        assert_eq!(
            Swept::from_redis_value(arr(vec![int(2), int(4)])).unwrap(),
            Swept {
                evicted: 2,
                barriers: 4
            }
        );
        assert!(Swept::from_redis_value(arr(vec![int(2)])).is_err());
    }
}
