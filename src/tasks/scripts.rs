//! The task scripts: one argument struct and one reply type per script,
//! each mirroring the header of its `lua/*.lua` file (keys and arguments in
//! the documented order; replies decoded strictly, codes by name).

use redis::{FromRedisValue, ParsingError, Value};

use crate::store::reply::{Reader, decode_error, read};
use crate::store::{Code, Keys, Lua, ScriptCall, ScriptCtx};

mod admin;
mod limits;
pub(crate) use admin::*;
pub(crate) use limits::*;

/// Every task script, loaded once per node.
pub(crate) struct Scripts {
    pub enqueue: Lua,
    pub claim: Lua,
    pub complete: Lua,
    pub fail: Lua,
    pub heartbeat: Lua,
    pub cancel: Lua,
    pub retry: Lua,
    pub delete: Lua,
    pub pause: Lua,
    pub set_group: Lua,
    pub janitor: Lua,
    pub trim_dead: Lua,
    pub counts: Lua,
    pub list_queued: Lua,
    pub dead_bulk: Lua,
    pub limit_set: Lua,
    pub limit_delete: Lua,
    pub limit_read: Lua,
    pub queue_limits: Lua,
    pub limit_reserve: Lua,
    pub limit_confirm: Lua,
    pub limit_return: Lua,
    pub limit_keys: Lua,
}

impl Scripts {
    pub(super) fn new(ctx: &ScriptCtx) -> Scripts {
        let l = |name, src| Lua::load(name, src, ctx);
        Scripts {
            enqueue: l("task_enqueue", include_str!("lua/enqueue.lua")),
            claim: l("task_claim", include_str!("lua/claim.lua")),
            complete: l("task_complete", include_str!("lua/complete.lua")),
            fail: l("task_fail", include_str!("lua/fail.lua")),
            heartbeat: l("task_heartbeat", include_str!("lua/heartbeat.lua")),
            cancel: l("task_cancel", include_str!("lua/cancel.lua")),
            retry: l("task_retry", include_str!("lua/retry.lua")),
            delete: l("task_delete", include_str!("lua/delete.lua")),
            pause: l("queue_pause", include_str!("lua/pause.lua")),
            set_group: l("group_set", include_str!("lua/set_group.lua")),
            janitor: l("queue_janitor", include_str!("lua/janitor.lua")),
            trim_dead: l("dead_trim", include_str!("lua/trim_dead.lua")),
            counts: l("queue_counts", include_str!("lua/counts.lua")),
            list_queued: l("queue_list_queued", include_str!("lua/list_queued.lua")),
            dead_bulk: l("dead_bulk", include_str!("lua/dead_bulk.lua")),
            limit_set: l("limit_set", include_str!("lua/limit_set.lua")),
            limit_delete: l("limit_delete", include_str!("lua/limit_delete.lua")),
            limit_read: l("limit_read", include_str!("lua/limit_read.lua")),
            queue_limits: l("queue_limits", include_str!("lua/queue_limits.lua")),
            limit_reserve: l("limit_reserve", include_str!("lua/limit_reserve.lua")),
            limit_confirm: l("limit_confirm", include_str!("lua/limit_confirm.lua")),
            limit_return: l("limit_return", include_str!("lua/limit_return.lua")),
            limit_keys: l("limit_keys", include_str!("lua/limit_keys.lua")),
        }
    }
}

fn qkey(k: &Keys, queue: &str, suffix: &str) -> String {
    format!("{}:q:{queue}:{suffix}", k.prefix())
}

fn tkey(k: &Keys, id: &str) -> String {
    format!("{}:task:{id}", k.prefix())
}

// --- enqueue.lua --------------------------------------------------------

/// One task of an enqueue call (validated).
pub(crate) struct EnqueueItem<'a> {
    pub id: String,
    pub payload: &'a str,
    pub group: &'a str,
    pub priority: i32,
    pub delay_ms: u64,
    pub run_at: i64,
    pub max_attempts: u32,
    pub timeout_ms: u64,
    pub alias: &'a str,
    pub idempotency_key: &'a str,
    pub backoff_base_ms: u64,
    pub backoff_cap_ms: u64,
    /// Its own limits, comma-separated ('' none).
    pub limits: String,
    /// Its debounce key and window (ms), if any.
    pub debounce: Option<(&'a str, u64)>,
    /// Its W3C trace context ('' none).
    pub traceparent: &'a str,
    pub tracestate: &'a str,
}

/// The values `TASK_DEFAULTS` in lua/lib.lua holds for a task's attempts
/// and backoff (a task hash leaves them out; enqueue.lua fills them in for
/// an item sent in its short form).
pub(crate) const DEFAULT_MAX_ATTEMPTS: u32 = 3;
pub(crate) const DEFAULT_BACKOFF_BASE_MS: u64 = 1_000;
pub(crate) const DEFAULT_BACKOFF_CAP_MS: u64 = 300_000;

impl EnqueueItem<'_> {
    /// Whether every setting but its id and payload holds its default, so
    /// it goes in enqueue.lua's short form (3 arguments instead of 18).
    fn is_plain(&self) -> bool {
        self.group.is_empty()
            && self.priority == 0
            && self.delay_ms == 0
            && self.run_at == 0
            && self.max_attempts == DEFAULT_MAX_ATTEMPTS
            && self.timeout_ms == 0
            && self.alias.is_empty()
            && self.idempotency_key.is_empty()
            && self.backoff_base_ms == DEFAULT_BACKOFF_BASE_MS
            && self.backoff_cap_ms == DEFAULT_BACKOFF_CAP_MS
            && self.limits.is_empty()
            && self.debounce.is_none()
            && self.traceparent.is_empty()
            && self.tracestate.is_empty()
    }
}

pub(crate) struct Enqueue<'a> {
    pub queue: &'a str,
    pub idempotency_window_ms: u64,
    pub max_queues: u32,
    pub node: &'a str,
    pub max_delay_ms: u64,
    /// Template keys in use at once, at most (`tasks.max_limit_keys`).
    pub max_limit_keys: u32,
    /// How long a task a debounce replaced is kept (cancelled).
    pub retention_ms: u64,
    pub items: Vec<EnqueueItem<'a>>,
}

/// The outcome of one enqueued item.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Enqueued {
    Created {
        id: String,
        state: String,
        /// The task a debounce replaced.
        replaced: Option<String>,
    },
    /// The idempotency key names a task already: its id, state and queue.
    Replayed {
        id: String,
        state: String,
        queue: String,
    },
    AliasTaken {
        holder: String,
    },
    TooManyQueues,
    /// `run_at` is beyond the maximum delay; Redis time now, ms.
    TooFar {
        now: i64,
    },
    /// A limit it names is not defined.
    UnknownLimit {
        name: String,
    },
    /// A template key it names is new and `max_limit_keys` are in use.
    TooManyLimitKeys {
        name: String,
    },
}

pub(crate) struct EnqueueReply(pub Vec<Enqueued>);

impl ScriptCall for Enqueue<'_> {
    type Reply = EnqueueReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![qkey(k, self.queue, "ready")]
    }
    fn args(&self) -> Vec<String> {
        let mut a = Vec::with_capacity(8 + 18 * self.items.len());
        a.extend([
            self.queue.to_string(),
            self.idempotency_window_ms.to_string(),
            self.max_queues.to_string(),
            self.node.to_string(),
            self.max_delay_ms.to_string(),
            self.max_limit_keys.to_string(),
            self.retention_ms.to_string(),
            self.items.len().to_string(),
        ]);
        for t in &self.items {
            if t.is_plain() {
                a.extend([t.id.clone(), t.payload.to_string(), String::new()]);
                continue;
            }
            a.extend([
                t.id.clone(),
                t.payload.to_string(),
                "+".to_string(),
                t.group.to_string(),
                t.priority.to_string(),
                t.delay_ms.to_string(),
                t.run_at.to_string(),
                t.max_attempts.to_string(),
                t.timeout_ms.to_string(),
                t.alias.to_string(),
                t.idempotency_key.to_string(),
                t.backoff_base_ms.to_string(),
                t.backoff_cap_ms.to_string(),
                t.limits.clone(),
                t.debounce.map(|d| d.0).unwrap_or("").to_string(),
                t.debounce.map_or(0, |d| d.1).to_string(),
                t.traceparent.to_string(),
                t.tracestate.to_string(),
            ]);
        }
        a
    }
}

impl FromRedisValue for EnqueueReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let mut out = Vec::new();
            while r.remaining() > 0 {
                let code = r.code()?;
                let (id, state) = (r.text("id")?, r.text("state")?);
                out.push(match code {
                    Ok(1) => {
                        // "state" or "state|replaced" (a debounce replaced a task).
                        let (state, replaced) = match state.split_once('|') {
                            Some((s, r)) => (s.to_string(), Some(r.to_string())),
                            None => (state, None),
                        };
                        Enqueued::Created { id, state, replaced }
                    }
                    Ok(2) => {
                        // "state:queue" (queue names have no colon).
                        let (state, queue) = state.split_once(':').unwrap_or((state.as_str(), ""));
                        Enqueued::Replayed {
                            id,
                            state: state.to_string(),
                            queue: queue.to_string(),
                        }
                    }
                    Err(Code::AliasTaken) => Enqueued::AliasTaken { holder: id },
                    Err(Code::TooManyQueues) => Enqueued::TooManyQueues,
                    Err(Code::TooFar) => Enqueued::TooFar {
                        now: state.parse().unwrap_or(0),
                    },
                    Err(Code::UnknownLimit) => Enqueued::UnknownLimit { name: state },
                    Err(Code::TooMany) => Enqueued::TooManyLimitKeys { name: state },
                    other => return Err(decode_error(format!("enqueue outcome {other:?}"))),
                });
            }
            Ok(EnqueueReply(out))
        })
    }
}

// --- claim.lua (and the claim part of complete and fail) -----------------

pub(crate) struct Claim<'a> {
    pub queue: &'a str,
    pub node: &'a str,
    pub max: u32,
    /// The claim lease (ms); 0: none.
    pub ack_ms: u64,
    /// The caller's credential (token name): a worker registered by another
    /// one is refused. "": not checked.
    pub credential: &'a str,
    /// Split namespaces, a shard other than 0: what was reserved in shard 0
    /// for a queue with limits (tasks, the limits), else None.
    /// (tasks, limits, shard 0's time of the reservation).
    pub reserved: Option<(u32, &'a str, i64)>,
    /// Outbox entries handed to shard 0 with the reservation: the claim
    /// removes them from the shard's outbox.
    pub handed: &'a [String],
    /// A look again after a wake-up: nothing ready and nothing due answers
    /// 0 at once (claim.lua, ARGV[9], which ignores it with `reserved`).
    pub recheck: bool,
}

/// A claimed task as the script returns it.
#[derive(Debug, Clone)]
pub(crate) struct ClaimedRow {
    pub id: String,
    pub token: u64,
    pub attempt: u32,
    pub payload: String,
    pub max_attempts: u32,
    pub timeout_ms: u64,
    pub group: String,
    pub priority: i32,
    pub created_at: i64,
    /// Its W3C trace context as submitted ('' none).
    pub traceparent: String,
    pub tracestate: String,
}

/// What a claim did.
#[derive(Debug, Clone)]
pub(crate) enum ClaimReply {
    Claimed {
        tasks: Vec<ClaimedRow>,
        /// When the earliest delayed task is due (Redis ms).
        next_due: Option<i64>,
        /// `max` tasks were claimed and more are ready: wake another waiter.
        more: bool,
    },
    /// NodeNotAlive, NodeDraining or NotOwner.
    Refused(Code),
    /// The queue's limits are in shard 0 and nothing was reserved there:
    /// reserve ([`LimitReserve`]), then claim again. Nothing was claimed.
    Reserve {
        next_due: Option<i64>,
        /// The head of the shard's outbox of limit slots, to hand over with
        /// the reservation.
        handed: Vec<String>,
    },
}

impl ClaimReply {
    fn read(r: &mut Reader<'_>) -> Result<ClaimReply, ParsingError> {
        let code = r.code()?;
        let next_due = r.int("next_due")?;
        let more = r.int("more")?;
        if more == 2 {
            let n = r.int("handed")?;
            let handed = (0..n).map(|_| r.text("entry")).collect::<Result<_, _>>()?;
            return Ok(ClaimReply::Reserve {
                next_due: (next_due >= 0).then_some(next_due),
                handed,
            });
        }
        if more == 3 {
            // A look again after a wake-up, answered at once (claim.lua).
            metrics::counter!("muster_claim_rechecks_empty_total").increment(1);
        }
        let more = more == 1;
        let n = match code {
            Ok(n) => n,
            Err(c @ (Code::NodeNotAlive | Code::NodeDraining | Code::NotOwner)) => return Ok(ClaimReply::Refused(c)),
            Err(c) => return Err(decode_error(format!("claim code {c:?}"))),
        };
        let mut tasks = Vec::with_capacity(n as usize);
        for _ in 0..n {
            tasks.push(ClaimedRow {
                id: r.text("id")?,
                token: r.int("token")? as u64,
                attempt: r.int("attempt")? as u32,
                payload: r.text("payload")?,
                max_attempts: r.int("max_attempts")? as u32,
                timeout_ms: r.int("timeout_ms")? as u64,
                group: r.text("group")?,
                priority: r.int("priority")? as i32,
                created_at: r.int("created_at")?,
                traceparent: r.text("traceparent")?,
                tracestate: r.text("tracestate")?,
            });
        }
        Ok(ClaimReply::Claimed {
            tasks,
            next_due: (next_due >= 0).then_some(next_due),
            more,
        })
    }
}

impl ScriptCall for Claim<'_> {
    type Reply = ClaimReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![qkey(k, self.queue, "ready")]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.queue.to_string(),
            self.node.to_string(),
            self.max.to_string(),
            self.ack_ms.to_string(),
            self.credential.to_string(),
            self.reserved.map(|r| r.0.to_string()).unwrap_or_default(),
            self.reserved.map(|r| r.1.to_string()).unwrap_or_default(),
            self.reserved.map(|r| r.2.to_string()).unwrap_or_default(),
            if self.recheck { "1" } else { "" }.to_string(),
        ]
        .into_iter()
        .chain(self.handed.iter().cloned())
        .collect()
    }
}

impl FromRedisValue for ClaimReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, ClaimReply::read)
    }
}

/// What a complete or fail claimed next, for the finished task's owner.
#[derive(Debug, Clone)]
pub(crate) struct NextReply {
    /// The node claimed for (the finished task's owner).
    pub owner: String,
    pub claim: ClaimReply,
}

impl NextReply {
    fn read(r: &mut Reader<'_>) -> Result<NextReply, ParsingError> {
        let owner = r.text("owner")?;
        Ok(NextReply {
            owner,
            claim: ClaimReply::read(r)?,
        })
    }
}

/// The next task(s) to claim in the same call as a complete or fail.
#[derive(Debug, Clone, Default)]
pub(crate) struct Next<'a> {
    /// 0: claim nothing.
    pub max: u32,
    /// '' : the finished task's queue.
    pub queue: &'a str,
    /// The next tasks' claim lease (ms); 0: none.
    pub ack_ms: u64,
}

// --- complete.lua ---------------------------------------------------------

pub(crate) struct Complete<'a> {
    pub retention_ms: u64,
    /// id, token, result JSON ('' for none), and the next tasks to claim for
    /// its owner in the same call (several: grouped single completes).
    pub items: Vec<(&'a str, u64, &'a str, Next<'a>)>,
}

/// The outcome of one completed item.
#[derive(Debug, Clone)]
pub(crate) enum Completed {
    Succeeded { queue: String, attempt: u32 },
    Stale { state: String, attempt: u32 },
    NotFound,
}

pub(crate) struct CompleteReply {
    pub items: Vec<Completed>,
    /// Per item, what was claimed next for its owner (empty when no item
    /// asked).
    pub next: Vec<Option<NextReply>>,
}

impl ScriptCall for Complete<'_> {
    type Reply = CompleteReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![format!("{}:deadlines", k.prefix())]
    }
    fn args(&self) -> Vec<String> {
        let mut a = Vec::with_capacity(2 + 6 * self.items.len());
        a.extend([self.retention_ms.to_string(), self.items.len().to_string()]);
        for (id, token, result, next) in &self.items {
            a.extend([
                id.to_string(),
                token.to_string(),
                result.to_string(),
                next.max.to_string(),
                next.queue.to_string(),
                next.ack_ms.to_string(),
            ]);
        }
        a
    }
}

impl FromRedisValue for CompleteReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let mut it = r.array("items")?;
            let mut items = Vec::with_capacity(it.remaining() / 3);
            while it.remaining() > 0 {
                let code = it.code()?;
                let (state, attempt) = (it.text("state")?, it.int("attempt")? as u32);
                items.push(match code {
                    Ok(1) => Completed::Succeeded {
                        queue: state.split_once(':').map_or("", |(_, q)| q).to_string(),
                        attempt,
                    },
                    Err(Code::Stale) => Completed::Stale { state, attempt },
                    Err(Code::NotFound) => Completed::NotFound,
                    other => return Err(decode_error(format!("complete outcome {other:?}"))),
                });
            }
            let mut claims = r.array("claims")?;
            let mut next = Vec::with_capacity(claims.remaining());
            while claims.remaining() > 0 {
                let mut claim = claims.array("claim")?;
                next.push(if claim.remaining() > 0 {
                    Some(NextReply::read(&mut claim)?)
                } else {
                    None
                });
            }
            if !next.is_empty() && next.len() != items.len() {
                return Err(decode_error(format!("{} claims for {} items", next.len(), items.len())));
            }
            Ok(CompleteReply { items, next })
        })
    }
}

// --- fail.lua ---------------------------------------------------------------

pub(crate) struct Fail<'a> {
    pub id: &'a str,
    pub token: u64,
    pub error: &'a str,
    pub retryable: bool,
    pub jitter: f64,
    pub retention_ms: u64,
    pub dead_retention_ms: u64,
    pub next: Next<'a>,
}

pub(crate) enum FailReply {
    /// 1: failed (delayed with run_at, or dead); 2: cancelled.
    Done {
        state: String,
        attempt: u32,
        run_at: Option<i64>,
        queue: String,
        next: Option<NextReply>,
    },
    Stale {
        state: String,
        attempt: u32,
    },
    NotFound,
}

impl ScriptCall for Fail<'_> {
    type Reply = FailReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![tkey(k, self.id)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.id.to_string(),
            self.token.to_string(),
            self.error.to_string(),
            if self.retryable { "1" } else { "0" }.into(),
            format!("{:.6}", self.jitter),
            self.retention_ms.to_string(),
            self.dead_retention_ms.to_string(),
            self.next.max.to_string(),
            self.next.queue.to_string(),
            self.next.ack_ms.to_string(),
        ]
    }
}

impl FromRedisValue for FailReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let (state, attempt, run_at, queue) = (
                r.text("state")?,
                r.int("attempt")? as u32,
                r.int("run_at")?,
                r.text("queue")?,
            );
            Ok(match code {
                Ok(1 | 2) => FailReply::Done {
                    state,
                    attempt,
                    run_at: (run_at > 0).then_some(run_at),
                    queue,
                    next: if r.remaining() > 0 {
                        Some(NextReply::read(r)?)
                    } else {
                        None
                    },
                },
                Err(Code::Stale) => FailReply::Stale { state, attempt },
                Err(Code::NotFound) => FailReply::NotFound,
                other => return Err(decode_error(format!("fail outcome {other:?}"))),
            })
        })
    }
}

// --- heartbeat.lua ----------------------------------------------------------

pub(crate) struct Heartbeat<'a> {
    pub id: &'a str,
    pub token: u64,
    pub progress: Option<u8>,
    pub fields: Option<String>,
}

pub(crate) enum HeartbeatReply {
    Ok { cancel_requested: bool },
    Stale { state: String },
    NotFound,
}

impl ScriptCall for Heartbeat<'_> {
    type Reply = HeartbeatReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![tkey(k, self.id)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.id.to_string(),
            self.token.to_string(),
            self.progress.map(|p| p.to_string()).unwrap_or_default(),
            self.fields.clone().unwrap_or_default(),
        ]
    }
}

impl FromRedisValue for HeartbeatReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let state = r.text("state")?;
            let cancel = r.int("cancel_requested")?;
            Ok(match code {
                Ok(_) => HeartbeatReply::Ok {
                    cancel_requested: cancel == 1,
                },
                Err(Code::Stale) => HeartbeatReply::Stale { state },
                Err(Code::NotFound) => HeartbeatReply::NotFound,
                other => return Err(decode_error(format!("heartbeat outcome {other:?}"))),
            })
        })
    }
}
