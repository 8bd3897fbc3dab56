//! The scripts of the etcd-style recipes: Barrier (hold, lift) and DoubleBarrier (enter, leave, sweep).

use super::{
    Code, FromRedisValue, Keys, ParsingError, ScriptCall, Value, count, db_in_key, db_index_key, db_key, decode_error,
    hold_key, holds_key, positive, read,
};

// --- hold.lua -----------------------------------------------------------------

pub(crate) struct Hold<'a> {
    pub name: &'a str,
    /// Who holds it (free text id).
    pub holder: &'a str,
    pub ttl_ms: u64,
    pub me: &'a str,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum HoldReply {
    /// 1 held now, or 2 refreshed by the same holder (`again`).
    Held {
        holder: String,
        held_at: i64,
        expires_at: i64,
        again: bool,
    },
    /// Held by another holder.
    HeldByOther { holder: String },
}

impl ScriptCall for Hold<'_> {
    type Reply = HoldReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![hold_key(k, self.name), holds_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.name.to_string(),
            self.holder.to_string(),
            self.ttl_ms.to_string(),
            self.me.to_string(),
        ]
    }
}

impl FromRedisValue for HoldReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let holder = r.text("holder")?;
            let (held_at, expires_at) = (r.int("held_at")?, r.int("expires_at")?);
            Ok(match code {
                Ok(c @ (1 | 2)) => HoldReply::Held {
                    holder,
                    held_at,
                    expires_at,
                    again: c == 2,
                },
                Err(Code::WrongState) => HoldReply::HeldByOther { holder },
                other => return Err(decode_error(format!("hold outcome {other:?}"))),
            })
        })
    }
}

// --- lift.lua -----------------------------------------------------------------

pub(crate) struct Lift<'a> {
    pub name: &'a str,
    /// Who released it.
    pub actor: &'a str,
    pub me: &'a str,
}

/// Whether the barrier was held (and is lifted now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lifted(pub bool);

impl ScriptCall for Lift<'_> {
    type Reply = Lifted;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![hold_key(k, self.name), holds_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![self.name.to_string(), self.actor.to_string(), self.me.to_string()]
    }
}

impl FromRedisValue for Lifted {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| match r.code()? {
            Ok(c @ (0 | 1)) => Ok(Lifted(c == 1)),
            other => Err(decode_error(format!("lift outcome {other:?}"))),
        })
    }
}

// --- enter.lua ----------------------------------------------------------------

pub(crate) struct Enter<'a> {
    pub name: &'a str,
    /// The entrant node (must be registered and alive).
    pub node: &'a str,
    pub count: u32,
    pub node_ttl_ms: u64,
    pub idle_ttl_ms: u64,
    pub me: &'a str,
}

/// A DoubleBarrier's state as an enter returns it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DoubleState {
    /// The barrier's count (the one given when it has none yet).
    pub count: u32,
    pub entrants: u32,
    pub ready_at: Option<i64>,
    /// The ready cycle, or ''.
    pub cycle: String,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum EnterReply {
    /// 1 entered now, or 2 already an entrant (`again`).
    Entered { state: DoubleState, again: bool },
    /// Full: `state.count` entrants are in, or have not all left yet.
    TooMany { state: DoubleState },
    /// The barrier has another count (`state.count`).
    CountMismatch { state: DoubleState },
    /// The entrant's node is not alive.
    NodeNotAlive,
}

impl ScriptCall for Enter<'_> {
    type Reply = EnterReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![db_key(k, self.name), db_in_key(k, self.name), db_index_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.name.to_string(),
            self.node.to_string(),
            self.count.to_string(),
            self.node_ttl_ms.to_string(),
            self.idle_ttl_ms.to_string(),
            self.me.to_string(),
        ]
    }
}

impl FromRedisValue for EnterReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let state = DoubleState {
                count: count(r.int("count")?, "count")?,
                entrants: count(r.int("entrants")?, "entrants")?,
                ready_at: positive(r.int("ready_at")?),
                cycle: r.text("cycle")?,
            };
            Ok(match code {
                Ok(c @ (1 | 2)) => EnterReply::Entered { state, again: c == 2 },
                Err(Code::TooMany) => EnterReply::TooMany { state },
                Err(Code::WrongState) => EnterReply::CountMismatch { state },
                Err(Code::NodeNotAlive) => EnterReply::NodeNotAlive,
                other => return Err(decode_error(format!("enter outcome {other:?}"))),
            })
        })
    }
}

// --- leave.lua ----------------------------------------------------------------

pub(crate) struct Leave<'a> {
    pub name: &'a str,
    /// The node leaving.
    pub node: &'a str,
    pub node_ttl_ms: u64,
    pub me: &'a str,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LeaveReply {
    /// 1 left now, 0 was not an entrant.
    pub left_now: bool,
    /// Entrants still in.
    pub entrants: u32,
    /// The ready cycle the barrier was in before the call (None when not
    /// ready).
    pub ready_at: Option<i64>,
    /// '' when it was not ready.
    pub cycle: String,
}

impl ScriptCall for Leave<'_> {
    type Reply = LeaveReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![db_key(k, self.name), db_in_key(k, self.name)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.name.to_string(),
            self.node.to_string(),
            self.node_ttl_ms.to_string(),
            self.me.to_string(),
        ]
    }
}

impl FromRedisValue for LeaveReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let left_now = match r.code()? {
                Ok(c @ (0 | 1)) => c == 1,
                other => return Err(decode_error(format!("leave outcome {other:?}"))),
            };
            Ok(LeaveReply {
                left_now,
                entrants: count(r.int("entrants")?, "entrants")?,
                ready_at: positive(r.int("ready_at")?),
                cycle: r.text("cycle")?,
            })
        })
    }
}

// --- db_sweep.lua -------------------------------------------------------------

pub(crate) struct DbSweep<'a> {
    pub node_ttl_ms: u64,
    pub idle_ttl_ms: u64,
    pub me: &'a str,
    /// Most DoubleBarriers looked at per call.
    pub limit: u32,
}

/// What a sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Entrants evicted.
    pub evicted: i64,
    /// DoubleBarriers still known.
    pub barriers: i64,
}

impl ScriptCall for DbSweep<'_> {
    type Reply = Swept;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![db_index_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.node_ttl_ms.to_string(),
            self.idle_ttl_ms.to_string(),
            self.me.to_string(),
            self.limit.to_string(),
        ]
    }
}

impl FromRedisValue for Swept {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(Swept {
                evicted: r.int("evicted")?,
                barriers: r.int("barriers")?,
            })
        })
    }
}
