//! The scripts outside the worker path: cancel, retry, delete, pause, group limits, and the janitor's and listings' reads.

use super::{Code, FromRedisValue, Keys, ParsingError, ScriptCall, Value, qkey, read, tkey};

// --- cancel.lua, retry.lua, delete.lua: {code, state} -----------------------

/// The reply of a script answering `{code, state}`.
pub(crate) struct CodeState {
    pub code: Result<i64, Code>,
    pub state: String,
}

impl FromRedisValue for CodeState {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(CodeState {
                code: r.code()?,
                state: r.text("state")?,
            })
        })
    }
}

pub(crate) struct Cancel<'a> {
    pub id: &'a str,
    pub retention_ms: u64,
    pub actor: &'a str,
}

impl ScriptCall for Cancel<'_> {
    type Reply = CodeState;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![tkey(k, self.id)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.id.to_string(),
            self.retention_ms.to_string(),
            self.actor.to_string(),
        ]
    }
}

pub(crate) struct Retry<'a> {
    pub id: &'a str,
    pub actor: &'a str,
    pub max_queues: u32,
}

impl ScriptCall for Retry<'_> {
    type Reply = CodeState;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![tkey(k, self.id)]
    }
    fn args(&self) -> Vec<String> {
        vec![self.id.to_string(), self.actor.to_string(), self.max_queues.to_string()]
    }
}

pub(crate) struct Delete<'a> {
    pub id: &'a str,
    pub actor: &'a str,
}

impl ScriptCall for Delete<'_> {
    type Reply = CodeState;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![tkey(k, self.id)]
    }
    fn args(&self) -> Vec<String> {
        vec![self.id.to_string(), self.actor.to_string()]
    }
}

// --- pause.lua, set_group.lua ------------------------------------------------

pub(crate) struct Pause<'a> {
    pub queue: &'a str,
    pub paused: bool,
    pub actor: &'a str,
    pub max_queues: u32,
    /// None in the queue's own shard (it decides, versions the change and
    /// emits its event); else the version the own shard gave the change (a
    /// split namespace copies it to every other shard, newer versions only).
    pub version: Option<i64>,
}

/// Whether a pause or resume changed the shard, and the queue's pause
/// version there; or a refusal.
pub(crate) struct PauseReply(pub Result<(bool, i64), Code>);

impl FromRedisValue for PauseReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(PauseReply(match r.code()? {
                Ok(changed) => Ok((changed == 1, r.int("version")?)),
                Err(c) => Err(c),
            }))
        })
    }
}

impl ScriptCall for Pause<'_> {
    type Reply = PauseReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![qkey(k, self.queue, "meta")]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.queue.to_string(),
            if self.paused { "1" } else { "0" }.into(),
            self.actor.to_string(),
            self.max_queues.to_string(),
            self.version.map(|v| v.to_string()).unwrap_or_default(),
        ]
    }
}

pub(crate) struct SetGroup<'a> {
    pub group: &'a str,
    pub limit: Option<u32>,
    pub max_groups: u32,
    pub actor: &'a str,
}

pub(crate) struct SetGroupReply {
    pub code: Result<i64, Code>,
    pub running: u64,
}

impl FromRedisValue for SetGroupReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(SetGroupReply {
                code: r.code()?,
                running: r.int("running")? as u64,
            })
        })
    }
}

impl ScriptCall for SetGroup<'_> {
    type Reply = SetGroupReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![format!("{}:group_limits", k.prefix())]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.group.to_string(),
            self.limit.map(|l| l.to_string()).unwrap_or_default(),
            self.max_groups.to_string(),
            self.actor.to_string(),
        ]
    }
}

// --- janitor.lua, trim_dead.lua, counts.lua, list_queued.lua -----------------

pub(crate) struct Janitor<'a> {
    pub queue: &'a str,
    pub retention_ms: u64,
    pub dead_retention_ms: u64,
}

impl ScriptCall for Janitor<'_> {
    /// promoted, trimmed, forgotten, queued, delayed, running, dead,
    /// latency, paused, pause version.
    type Reply = Vec<i64>;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![qkey(k, self.queue, "meta")]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.queue.to_string(),
            self.retention_ms.to_string(),
            self.dead_retention_ms.to_string(),
        ]
    }
}

pub(crate) struct TrimDead {
    pub dead_retention_ms: u64,
}

impl ScriptCall for TrimDead {
    /// Entries removed.
    type Reply = i64;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![format!("{}:dead", k.prefix())]
    }
    fn args(&self) -> Vec<String> {
        vec![self.dead_retention_ms.to_string()]
    }
}

pub(crate) struct Counts<'a> {
    pub queues: &'a [String],
}

/// One queue's counts, as counts.lua reads them.
#[derive(Debug, Clone, Default)]
pub(crate) struct CountsRow {
    pub queued: u64,
    pub delayed: u64,
    pub running: u64,
    pub dead: u64,
    pub succeeded: u64,
    pub cancelled: u64,
    pub finished_last_minute: u64,
    pub paused: bool,
    pub latency_ms: u64,
}

pub(crate) struct CountsReply(pub Vec<CountsRow>);

impl ScriptCall for Counts<'_> {
    type Reply = CountsReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![format!("{}:queues", k.prefix())]
    }
    fn args(&self) -> Vec<String> {
        self.queues.to_vec()
    }
}

impl FromRedisValue for CountsReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let _now = r.int("now")?;
            let mut out = Vec::new();
            while r.remaining() > 0 {
                let mut n = |what| r.int(what).map(|v| v.max(0) as u64);
                let mut row = CountsRow {
                    queued: n("queued")?,
                    delayed: n("delayed")?,
                    running: n("running")?,
                    dead: n("dead")?,
                    succeeded: n("succeeded")?,
                    cancelled: n("cancelled")?,
                    finished_last_minute: n("finished")?,
                    paused: r.text("paused")? == "1",
                    latency_ms: 0,
                };
                let _groups = r.int("groups")?;
                row.latency_ms = r.int("latency")?.max(0) as u64;
                out.push(row);
            }
            Ok(CountsReply(out))
        })
    }
}

pub(crate) struct ListQueued<'a> {
    pub queue: &'a str,
    pub offset: usize,
    pub limit: usize,
}

pub(crate) struct ListQueuedReply {
    pub total: u64,
    pub ids: Vec<String>,
}

impl ScriptCall for ListQueued<'_> {
    type Reply = ListQueuedReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![qkey(k, self.queue, "ready")]
    }
    fn args(&self) -> Vec<String> {
        vec![self.queue.to_string(), self.offset.to_string(), self.limit.to_string()]
    }
}

impl FromRedisValue for ListQueuedReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let total = r.int("total")? as u64;
            let mut ids = Vec::with_capacity(r.remaining());
            while r.remaining() > 0 {
                ids.push(r.text("id")?);
            }
            Ok(ListQueuedReply { total, ids })
        })
    }
}
