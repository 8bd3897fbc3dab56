//! limit_set.lua, limit_delete.lua, limit_read.lua, queue_limits.lua, and the
//! split namespace's limit_reserve.lua, limit_confirm.lua, limit_return.lua.

use redis::{FromRedisValue, ParsingError, Value};

use super::qkey;
use crate::store::reply::read;
use crate::store::{Code, Keys, ScriptCall};

fn limits_key(k: &Keys) -> String {
    format!("{}:limits", k.prefix())
}

pub(crate) struct LimitSet<'a> {
    pub name: &'a str,
    /// 0: none.
    pub concurrency: u32,
    /// (max, per_ms, burst), or None.
    pub rate: Option<(u32, u64, u32)>,
    pub max_limits: u32,
    pub actor: &'a str,
}

/// Whether the limit was created (Ok(true)) or changed, or the refusal.
pub(crate) struct LimitSetReply(pub Result<bool, Code>);

impl FromRedisValue for LimitSetReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let created = r.int("created")? == 1;
            Ok(LimitSetReply(code.map(|_| created)))
        })
    }
}

impl ScriptCall for LimitSet<'_> {
    type Reply = LimitSetReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![limits_key(k)]
    }
    fn args(&self) -> Vec<String> {
        let (max, per, burst) = self.rate.unwrap_or((0, 0, 0));
        vec![
            self.name.to_string(),
            self.concurrency.to_string(),
            max.to_string(),
            per.to_string(),
            burst.to_string(),
            self.max_limits.to_string(),
            self.actor.to_string(),
        ]
    }
}

pub(crate) struct LimitDelete<'a> {
    pub name: &'a str,
    pub actor: &'a str,
}

impl ScriptCall for LimitDelete<'_> {
    /// 1 removed, or E.NOT_FOUND.
    type Reply = Vec<i64>;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![limits_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![self.name.to_string(), self.actor.to_string()]
    }
}

pub(crate) struct LimitRead<'a> {
    pub name: &'a str,
}

/// A limit's settings and use (see limit_read.lua), or None: not defined.
pub(crate) struct LimitReadReply(pub Option<LimitRow>);

pub(crate) struct LimitRow {
    pub concurrency: u32,
    pub rate: Option<(u32, u64, u32)>,
    pub running: u64,
    pub tokens: Option<u64>,
    pub waiting: u64,
    pub queues: Vec<String>,
}

impl FromRedisValue for LimitReadReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let c = r.int("concurrency")?;
            let (max, per, burst) = (r.int("rate max")?, r.int("rate per_ms")?, r.int("rate burst")?);
            let (running, tokens, waiting) = (r.int("running")?, r.int("tokens")?, r.int("waiting")?);
            let queues = r.text("queues")?;
            Ok(LimitReadReply(code.ok().map(|_| {
                LimitRow {
                    concurrency: c.max(0) as u32,
                    rate: (max > 0).then_some((max as u32, per.max(0) as u64, burst.max(0) as u32)),
                    running: running.max(0) as u64,
                    tokens: (tokens >= 0).then_some(tokens as u64),
                    waiting: waiting.max(0) as u64,
                    queues: queues
                        .split(',')
                        .filter(|q| !q.is_empty())
                        .map(str::to_string)
                        .collect(),
                }
            })))
        })
    }
}

impl ScriptCall for LimitRead<'_> {
    type Reply = LimitReadReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![limits_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![self.name.to_string()]
    }
}

pub(crate) struct QueueLimitsSet<'a> {
    pub queue: &'a str,
    pub limits: &'a [String],
    pub actor: &'a str,
}

/// Ok, or the limit named that is not defined.
pub(crate) struct QueueLimitsReply(pub Result<(), String>);

impl FromRedisValue for QueueLimitsReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let name = r.text("name")?;
            Ok(QueueLimitsReply(code.map(|_| ()).map_err(|_| name)))
        })
    }
}

impl ScriptCall for QueueLimitsSet<'_> {
    type Reply = QueueLimitsReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![qkey(k, self.queue, "limits")]
    }
    fn args(&self) -> Vec<String> {
        vec![self.queue.to_string(), self.limits.join(","), self.actor.to_string()]
    }
}

fn resv_key(k: &Keys) -> String {
    format!("{}:limit_resv", k.prefix())
}

pub(crate) struct LimitReserve<'a> {
    pub queue: &'a str,
    pub want: u32,
    pub rid: &'a str,
    pub ttl_ms: u64,
    /// Outbox entries of the claim's shard, handed over first.
    pub returned: &'a [String],
}

/// What was reserved: tasks, when a limit without room may have some again
/// (Redis ms), the limits reserved under.
pub(crate) struct Reserved {
    pub k: u32,
    pub next_due: Option<i64>,
    pub names: String,
    /// Shard 0's Redis time of the reservation (ms).
    pub at: i64,
}

impl FromRedisValue for Reserved {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let k = r.int("k")?;
            let next_due = r.int("next_due")?;
            Ok(Reserved {
                k: k.max(0) as u32,
                next_due: (next_due >= 0).then_some(next_due),
                names: r.text("names")?,
                at: r.int("at")?,
            })
        })
    }
}

impl ScriptCall for LimitReserve<'_> {
    type Reply = Reserved;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![resv_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.queue.to_string(),
            self.want.to_string(),
            self.rid.to_string(),
            self.ttl_ms.to_string(),
        ]
        .into_iter()
        .chain(self.returned.iter().cloned())
        .collect()
    }
}

pub(crate) struct LimitConfirm<'a> {
    pub rid: &'a str,
    pub names: &'a str,
    pub k: u32,
    /// `id:attempt` of each task claimed.
    pub used: Vec<String>,
}

impl ScriptCall for LimitConfirm<'_> {
    /// 1 settled, 2 settled after the reservation had lapsed.
    type Reply = Vec<i64>;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![resv_key(k)]
    }
    fn args(&self) -> Vec<String> {
        let mut a = vec![self.rid.to_string(), self.names.to_string(), self.k.to_string()];
        a.extend(self.used.iter().cloned());
        a
    }
}

pub(crate) struct LimitReturn<'a> {
    /// `id:attempt|names` entries from a shard's outbox.
    pub entries: &'a [String],
}

impl ScriptCall for LimitReturn<'_> {
    /// {slots freed}.
    type Reply = Vec<i64>;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![limits_key(k)]
    }
    fn args(&self) -> Vec<String> {
        self.entries.to_vec()
    }
}

pub(crate) struct LimitKeys {
    pub idle_ms: u64,
}

impl ScriptCall for LimitKeys {
    /// {forgotten, kept}.
    type Reply = Vec<i64>;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![format!("{}:limit_keys", k.prefix())]
    }
    fn args(&self) -> Vec<String> {
        vec![self.idle_ms.to_string()]
    }
}
