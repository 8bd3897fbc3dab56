//! The task state store: queues, atomic claim with fencing tokens, retries,
//! dead letters, idempotency keys, aliases, concurrency groups, retention.
//!
//! Invariants (each is one Lua script, so none is check-then-act):
//! - G1: a queued task is claimed by at most one node per attempt; each claim
//!   gets a token greater than every token issued before it in the namespace
//!   (`next_token` in `lua/lib.lua`); heartbeat, complete and fail need the
//!   current token and change nothing otherwise.
//! - G5: an idempotency key within its window maps to exactly one task.
//! - G6: a claim never starts a task whose group already has `limit` running
//!   anywhere; a full group does not block other tasks; FIFO within a group.
//! - G4: finished tasks carry a TTL; every index entry naming them is trimmed
//!   by the janitor; idempotency keys expire with their window.
//! - G11: every time in a task (created, started, due, finished) is Redis time.
//! - Every state change emits its event in the same script (G9).

mod admin;
pub(crate) mod bulk;
mod claim;
mod group;
mod labels;
mod limits;
mod model;
mod read;
pub(crate) use labels::QueueLabels;
pub(crate) mod routes;
mod scripts;
mod shards;
pub(crate) mod spec;
mod wait;
pub(crate) use wait::NextAsk;
pub(crate) mod worker;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use crate::config::TasksConfig;
use crate::problem::{Classify, Kind};
use crate::store::{Code, ScriptCtx, Store, StoreError};

pub(crate) use self::model::{
    Attempt, ClaimResult, Claimed, Finished, NewTask, NextClaim, NextClaimed, Submitted, Task, TaskPage,
};
use self::scripts::{Completed, Enqueued, FailReply, HeartbeatReply, ListQueuedReply, Scripts};
pub(crate) use muster_api::{GroupInfo, QueueStats, TaskSpec};

/// The furthest ahead a task may be due: `delay_ms` at most, and `run_at`
/// at most this long after the Redis time of the submit (366 days).
pub(crate) const MAX_DELAY_MS: u64 = 366 * 24 * 3600 * 1000;

/// The largest `run_at` that is meaningful at all: 2^53, the largest integer
/// every JSON client reads exactly (and far beyond Redis time + a year).
pub(crate) const MAX_RUN_AT: i64 = 1 << 53;

/// How deep the listing of queued tasks goes: its `cursor` is at most this.
/// Queued tasks are merged from the ready set and every group's queue in
/// claim order, and that work grows with the depth (other states are one
/// sorted set each, and page at any depth).
pub(crate) const MAX_QUEUED_CURSOR: usize = 10_000;

/// Every state a task can be in.
pub(crate) const STATES: &[&str] = &["queued", "delayed", "running", "succeeded", "cancelled", "dead"];

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("no task `{0}` (it may have passed its retention)")]
    NotFound(String),
    #[error("{message}")]
    Conflict {
        message: String,
        state: String,
        attempt: i64,
    },
    #[error("the alias `{alias}` is held by task {holder}")]
    AliasTaken { alias: String, holder: String },
    #[error("the cluster already has the maximum of {0} queues (tasks.max_queues)")]
    TooManyQueues(u32),
    #[error(
        "the cluster already has {room} queues: a worker token creates none beyond {room} of the {max} of \
         tasks.max_queues, the rest are kept for admin tokens"
    )]
    QueuesKeptForAdmin { room: u32, max: u32 },
    #[error("the cluster already has the maximum of {0} group limits (tasks.max_groups)")]
    TooManyGroups(u32),
    #[error(
        "`run_at` {run_at} is more than one year (366 days) after the Redis time now ({now}); the latest accepted now is {}",
        now + MAX_DELAY_MS as i64
    )]
    RunAtTooFar { run_at: i64, now: i64 },
    #[error(
        "`cursor` can be at most {MAX_QUEUED_CURSOR} for state=queued (and for every listing of a namespace \
         split into shards, which merges the shards' pages): the listing shows the first \
         {MAX_QUEUED_CURSOR} tasks (`total` counts them all)"
    )]
    CursorTooDeep,
    #[error(
        "node `{0}` is not registered or its heartbeat expired: PUT /api/v1/nodes/{0}/heartbeat first, and keep heartbeating while you work"
    )]
    NodeNotAlive(String),
    #[error("node `{0}` is draining (or has left) and takes no new work")]
    NodeDraining(String),
    #[error(
        "worker `{0}` was registered by another credential: claim under the worker id your own token \
         registered (PUT /api/v1/nodes/{{id}}/heartbeat)"
    )]
    NotOwner(String),
    #[error(
        "limit `{0}` is not defined: define it with PUT /api/v1/limits/{0} (a key `name:key` needs its \
         template `name:*`)"
    )]
    UnknownLimit(String),
    #[error("no limit `{0}` is defined")]
    LimitNotFound(String),
    #[error("the cluster already has the maximum of {0} limits and templates (tasks.max_limits)")]
    TooManyLimits(u32),
    #[error(
        "the limit key `{name}` is new, and {max} template keys are in use (tasks.max_limit_keys): a key is \
         forgotten once its tasks are done, its bucket is full and it was not named for twelve janitor intervals (a \
         minute by default); reuse keys, or raise the bound"
    )]
    TooManyLimitKeys { name: String, max: u32 },

    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Classify for TaskError {
    fn kind(&self) -> Kind {
        match self {
            TaskError::NotFound(_) | TaskError::LimitNotFound(_) => Kind::NotFound,
            TaskError::RunAtTooFar { .. } | TaskError::CursorTooDeep => Kind::BadRequest,
            TaskError::Conflict { state, attempt, .. } => {
                Kind::Conflict(serde_json::json!({"state": state, "attempt": attempt}))
            }
            TaskError::AliasTaken { holder, .. } => Kind::Conflict(serde_json::json!({"holder": holder})),
            TaskError::TooManyQueues(_)
            | TaskError::QueuesKeptForAdmin { .. }
            | TaskError::TooManyGroups(_)
            | TaskError::TooManyLimits(_)
            | TaskError::TooManyLimitKeys { .. }
            | TaskError::UnknownLimit(_)
            | TaskError::NodeNotAlive(_)
            | TaskError::NodeDraining(_)
            | TaskError::NotOwner(_) => Kind::Conflict(serde_json::Value::Null),
            TaskError::Store(s) => s.kind(),
        }
    }
}

/// The task service.
pub struct Tasks {
    store: Store,
    cfg: TasksConfig,
    /// `claim.ack_ms`: the claim lease of a claim that asks for none.
    ack_ms: u64,
    scripts: Scripts,
    /// Wakes long-poll claims (see `wait`).
    bus: Arc<crate::events::Bus>,
    /// Cancelled when the node stops: waiting claims answer at once.
    shutdown: CancellationToken,
    /// Shared with the orphan cleaner, so both label the same queues alike.
    pub labels: Arc<QueueLabels>,
    /// Split namespaces: which shards hold which queue's tasks (`shards`).
    queue_shards: Mutex<shards::QueueShards>,
    /// Split namespaces: queues whose limits are in shard 0, as a claim in
    /// another shard last found (when): claims there reserve first without
    /// asking (see `claim`).
    limited: Mutex<HashMap<String, std::time::Instant>>,
    /// This node's registration per shard: the claim fan-out skips shards
    /// where it may have lapsed (see `claim`).
    health: Arc<crate::health::Health>,
    /// Single submits in flight per shard and queue, and those queued behind
    /// them (group commit, `group.rs`).
    submits: Arc<group::Group<SubmitKey, NewTask, Submitted>>,
    /// Single completes in flight per shard, and those queued behind them.
    completes: Arc<group::Group<usize, CompleteOne, CompleteOut>>,
}

/// What single submits must share to ride in one script call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SubmitKey {
    shard: usize,
    queue: String,
    /// The callers' queue room (a worker token's and an admin's differ).
    room: u32,
    node: String,
}

/// Most single calls sent in one grouped call.
const GROUP_MAX: usize = 256;

/// One single complete, as it rides in a group: id, token, result JSON
/// ('' for none), and the next tasks to claim for its owner.
struct CompleteOne {
    id: String,
    token: u64,
    result: String,
    next: NextClaim,
}

/// A complete's outcome and what was claimed next for its owner.
type CompleteOut = (Completed, Option<scripts::NextReply>);

fn no_outcome() -> StoreError {
    StoreError::Decode("the script answered no outcome".into())
}

fn raw(json: &str) -> Box<RawValue> {
    RawValue::from_string(json.to_string())
        .unwrap_or_else(|_| RawValue::from_string("null".into()).expect("null is JSON"))
}
impl Tasks {
    /// The 409 of a submit refused for the queue quota, with the caller's
    /// `room` ([`TasksConfig::queue_room`]).
    pub fn too_many_queues(&self, room: u32) -> TaskError {
        if room < self.cfg.max_queues {
            TaskError::QueuesKeptForAdmin {
                room,
                max: self.cfg.max_queues,
            }
        } else {
            TaskError::TooManyQueues(self.cfg.max_queues)
        }
    }

    pub fn new(
        store: Store,
        cfg: TasksConfig,
        claim: &crate::config::ClaimConfig,
        ctx: &ScriptCtx,
        bus: Arc<crate::events::Bus>,
        shutdown: CancellationToken,
        health: Arc<crate::health::Health>,
    ) -> Arc<Tasks> {
        let scripts = Scripts::new(ctx);
        let shards = store.shard_count();
        let in_flight = cfg.group_in_flight as usize;
        Arc::new(Tasks {
            store,
            cfg,
            ack_ms: claim.ack_ms,
            scripts,
            bus,
            shutdown,
            labels: Arc::new(QueueLabels::default()),
            queue_shards: Mutex::new(shards::QueueShards::new(shards)),
            limited: Mutex::new(HashMap::new()),
            health,
            submits: Arc::new(group::Group::new(in_flight, GROUP_MAX)),
            completes: Arc::new(group::Group::new(in_flight, GROUP_MAX)),
        })
    }

    pub fn config(&self) -> &TasksConfig {
        &self.cfg
    }

    /// The claim lease of a claim that asked for `asked` (None: the
    /// configured `claim.ack_ms`; 0 there: no lease).
    pub fn ack_ms(&self, asked: Option<u64>) -> u64 {
        asked.unwrap_or(self.ack_ms)
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Submits tasks to `queue`, one script per shard the tasks go to (one
    /// with one shard); outcomes in order. A task goes to its group's shard,
    /// or its queue's ([`Tasks::home`]); with several shards a batch is
    /// atomic per shard, not as a whole.
    /// `room`: how many queues this caller may bring the cluster to
    /// ([`TasksConfig::queue_room`]).
    pub async fn submit(
        &self,
        queue: &str,
        items: &[NewTask],
        node: &str,
        room: u32,
    ) -> Result<Vec<Submitted>, TaskError> {
        let mut parts: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, t) in items.iter().enumerate() {
            parts.entry(self.shard_of(queue, t)).or_default().push(i);
        }
        let runs = parts
            .into_iter()
            .map(|(shard, at)| async move {
                let part: Vec<&NewTask> = at.iter().map(|&i| &items[i]).collect();
                let out = self.submit_in(shard, queue, &part, node, room, None).await?;
                self.note_queue_in(queue, shard);
                Ok::<_, TaskError>(at.into_iter().zip(out))
            })
            .collect::<Vec<_>>();
        let mut out: Vec<Option<Submitted>> = (0..items.len()).map(|_| None).collect();
        for (i, r) in futures_util::future::try_join_all(runs).await?.into_iter().flatten() {
            out[i] = Some(r);
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// The shard a task goes to: its group's or its queue's
    /// ([`Tasks::home`]); a task with limits of its own goes where they are
    /// (shard 0), so that its claim checks them in the same script.
    fn shard_of(&self, queue: &str, t: &NewTask) -> usize {
        if t.limits.is_empty() {
            self.home(queue, &t.group)
        } else {
            0
        }
    }

    /// Submits one task, as [`Tasks::submit`] would, grouped with the
    /// single submits to the same shard and queue that arrive while one is
    /// in flight (group commit, `group.rs`): alone at low load, one script
    /// call for many under load, each with its own outcome.
    pub async fn submit_one(
        self: &Arc<Self>,
        queue: &str,
        task: NewTask,
        node: &str,
        room: u32,
    ) -> Result<Submitted, TaskError> {
        let shard = self.shard_of(queue, &task);
        let deadline = self.store.shard(shard).group_deadline();
        let Some(deadline) = deadline.filter(|_| self.cfg.group_in_flight > 0) else {
            // Group commit off; before the first clock sample; or
            // acknowledged (WAIT on the request's own connection): alone.
            let out = self.submit(queue, std::slice::from_ref(&task), node, room).await?;
            return out
                .into_iter()
                .next()
                .ok_or_else(|| StoreError::Decode("enqueue answered nothing".into()).into());
        };
        let key = SubmitKey {
            shard,
            queue: queue.to_string(),
            room,
            node: node.to_string(),
        };
        let (tasks, send_key, store) = (self.clone(), key.clone(), self.store.shard(shard));
        let how = group::Sender {
            now: move || store.redis_now_estimate(),
            send: move |items: Vec<NewTask>, deadline: Option<i64>| {
                let (tasks, key) = (tasks.clone(), send_key.clone());
                async move {
                    if items.len() > 1 {
                        metrics::counter!("muster_group_commit_calls_total", "op" => "submit").increment(1);
                        metrics::counter!("muster_group_commit_items_total", "op" => "submit")
                            .increment(items.len() as u64);
                    }
                    let refs: Vec<&NewTask> = items.iter().collect();
                    let out = tasks
                        .submit_in(key.shard, &key.queue, &refs, &key.node, key.room, deadline)
                        .await;
                    if out.is_ok() {
                        tasks.note_queue_in(&key.queue, key.shard);
                    }
                    out
                }
            },
        };
        Ok(group::call(&self.submits, key, task, deadline, how).await?)
    }

    /// One complete in `shard`, grouped with the single completes to that
    /// shard that arrive while one is in flight (`group.rs`): its outcome
    /// and what was claimed next for its owner.
    async fn complete_one(self: &Arc<Self>, shard: usize, one: CompleteOne) -> Result<CompleteOut, StoreError> {
        let deadline = self.store.shard(shard).group_deadline();
        let Some(deadline) = deadline.filter(|_| self.cfg.group_in_flight > 0) else {
            return self
                .complete_in(shard, vec![one], None)
                .await?
                .pop()
                .ok_or_else(no_outcome);
        };
        let (tasks, store) = (self.clone(), self.store.shard(shard));
        let how = group::Sender {
            now: move || store.redis_now_estimate(),
            send: move |items: Vec<CompleteOne>, deadline: Option<i64>| {
                let tasks = tasks.clone();
                async move {
                    if items.len() > 1 {
                        metrics::counter!("muster_group_commit_calls_total", "op" => "complete").increment(1);
                        metrics::counter!("muster_group_commit_items_total", "op" => "complete")
                            .increment(items.len() as u64);
                    }
                    tasks.complete_in(shard, items, deadline).await
                }
            },
        };
        group::call(&self.completes, shard, one, deadline, how).await
    }

    /// Completes tasks of `shard` in one script, each with its own next
    /// claim: an outcome per item, in order.
    async fn complete_in(
        &self,
        shard: usize,
        items: Vec<CompleteOne>,
        deadline: Option<i64>,
    ) -> Result<Vec<CompleteOut>, StoreError> {
        let call = scripts::Complete {
            retention_ms: self.cfg.retention_ms,
            items: items
                .iter()
                .map(|c| {
                    let next = scripts::Next {
                        max: c.next.max,
                        queue: c.next.queue.as_deref().unwrap_or(""),
                        ack_ms: c.next.ack_ms,
                    };
                    (c.id.as_str(), c.token, c.result.as_str(), next)
                })
                .collect(),
        };
        let store = self.store.shard(shard);
        let reply = match deadline {
            Some(d) => store.run_until(&self.scripts.complete, &call, d).await?,
            None => store.run(&self.scripts.complete, &call).await?,
        };
        let mut next = reply.next.into_iter();
        Ok(reply.items.into_iter().map(|c| (c, next.next().flatten())).collect())
    }

    /// Submits tasks that all belong in `shard`, in one script (with the
    /// deadline given, for a grouped call).
    async fn submit_in(
        &self,
        shard: usize,
        queue: &str,
        items: &[&NewTask],
        node: &str,
        room: u32,
        deadline: Option<i64>,
    ) -> Result<Vec<Submitted>, StoreError> {
        let store = self.store.shard(shard);
        let call = scripts::Enqueue {
            queue,
            idempotency_window_ms: self.cfg.idempotency_window_ms,
            max_queues: room.min(self.cfg.max_queues),
            node,
            max_delay_ms: MAX_DELAY_MS,
            max_limit_keys: self.cfg.max_limit_keys,
            retention_ms: self.cfg.retention_ms,
            items: items
                .iter()
                .map(|t| scripts::EnqueueItem {
                    id: store.shards().new_id(shard),
                    payload: &t.payload,
                    group: &t.group,
                    priority: t.priority,
                    delay_ms: t.delay_ms,
                    run_at: t.run_at,
                    max_attempts: t.max_attempts,
                    timeout_ms: t.timeout_ms,
                    alias: &t.alias,
                    idempotency_key: &t.idempotency_key,
                    backoff_base_ms: t.backoff_base_ms,
                    backoff_cap_ms: t.backoff_cap_ms,
                    limits: t.limits.join(","),
                    debounce: t.debounce.as_ref().map(|(k, ms)| (k.as_str(), *ms)),
                    traceparent: &t.traceparent,
                    tracestate: &t.tracestate,
                })
                .collect(),
        };
        let reply = match deadline {
            Some(d) => store.run_until(&self.scripts.enqueue, &call, d).await?,
            None => store.run(&self.scripts.enqueue, &call).await?,
        };
        let label = self.labels.label(queue);
        Ok(reply
            .0
            .into_iter()
            .map(|r| match r {
                Enqueued::Created { id, state, replaced } => {
                    metrics::counter!("muster_tasks_enqueued_total", "queue" => label.clone()).increment(1);
                    Submitted::Created { id, state, replaced }
                }
                Enqueued::Replayed {
                    id,
                    state,
                    queue: original,
                } => Submitted::Replayed {
                    id,
                    state,
                    queue: if original.is_empty() {
                        queue.to_string()
                    } else {
                        original
                    },
                },
                Enqueued::AliasTaken { holder } => Submitted::AliasTaken { holder },
                Enqueued::TooManyQueues => Submitted::TooManyQueues,
                Enqueued::TooFar { now } => Submitted::RunAtTooFar { now },
                Enqueued::UnknownLimit { name } => Submitted::UnknownLimit { name },
                Enqueued::TooManyLimitKeys { name } => Submitted::TooManyLimitKeys { name },
            })
            .collect())
    }

    /// Completes tasks; one outcome per item, in order.
    pub async fn complete(
        self: &Arc<Self>,
        items: &[(String, u64, String)],
    ) -> Result<Vec<Result<Finished, TaskError>>, TaskError> {
        Ok(self.complete_then(items, NextClaim::default()).await?.0)
    }

    /// Completes tasks and, for a single one, claims its owner's next
    /// task(s) in the same call (`next`). One script per shard the tasks are
    /// in, all at once; a shard that fails answers its own items with its
    /// error (their outcome is unknown), and the others' outcomes stand: a
    /// batch over shards never answers an error for completions it applied.
    /// Only when every shard failed is the whole call the error.
    pub async fn complete_then(
        self: &Arc<Self>,
        items: &[(String, u64, String)],
        next: NextClaim,
    ) -> Result<(Vec<Result<Finished, TaskError>>, Option<NextClaimed>), TaskError> {
        let max = if items.len() == 1 { next.max } else { 0 };
        let mut each: Vec<Option<Result<Completed, StoreError>>> = (0..items.len()).map(|_| None).collect();
        let mut next_reply = None;
        let mut tried = 0;
        let mut first_error = None;
        let mut answered = false;
        if let [(id, token, result)] = items {
            // A single complete: grouped with the others to its shard
            // (group commit, `group.rs`), each with its own next claim.
            let shard = self.store.shards().home(id);
            let one = CompleteOne {
                id: id.clone(),
                token: *token,
                result: result.clone(),
                next: NextClaim { max, ..next.clone() },
            };
            match self.complete_one(shard, one).await {
                Ok((c, n)) => {
                    answered = true;
                    each[0] = Some(Ok(c));
                    next_reply = n;
                    tried = shard;
                }
                Err(e) => first_error = Some(e),
            }
        } else {
            // One script per shard the tasks are in (each id names its shard).
            // Per shard: the items' places in `items`, and the items.
            type Part<'a> = (Vec<usize>, Vec<&'a (String, u64, String)>);
            let mut parts: BTreeMap<usize, Part<'_>> = BTreeMap::new();
            for (i, item) in items.iter().enumerate() {
                let part = parts.entry(self.store.shards().home(&item.0)).or_default();
                part.0.push(i);
                part.1.push(item);
            }
            let runs = parts.iter().map(|(&shard, (_, part))| {
                let call = scripts::Complete {
                    retention_ms: self.cfg.retention_ms,
                    items: part
                        .iter()
                        .map(|(id, token, result)| (id.as_str(), *token, result.as_str(), scripts::Next::default()))
                        .collect(),
                };
                async move { self.store.shard(shard).run(&self.scripts.complete, &call).await }
            });
            let replies = futures_util::future::join_all(runs).await;
            for ((_, (at, _)), reply) in parts.iter().zip(replies) {
                match reply {
                    Ok(reply) => {
                        answered = true;
                        for (&i, c) in at.iter().zip(reply.items) {
                            each[i] = Some(Ok(c));
                        }
                    }
                    Err(e) => {
                        for &i in at {
                            each[i] = Some(Err(e.clone()));
                        }
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        if let (false, Some(e)) = (answered, first_error) {
            return Err(e.into());
        }
        let mut out = Vec::with_capacity(items.len());
        let mut done: BTreeMap<String, u64> = BTreeMap::new();
        let mut claim_queue = next.queue.clone();
        for ((id, _, _), c) in items.iter().zip(each) {
            let c = match c.unwrap_or(Ok(Completed::NotFound)) {
                Ok(c) => c,
                Err(e) => {
                    out.push(Err(TaskError::Store(e)));
                    continue;
                }
            };
            out.push(match c {
                Completed::Succeeded { queue, attempt } => {
                    *done.entry(self.labels.label(&queue)).or_default() += 1;
                    claim_queue.get_or_insert(queue);
                    Ok(Finished {
                        id: id.clone(),
                        state: "succeeded".into(),
                        attempt,
                        retry_at: None,
                    })
                }
                Completed::NotFound => Err(TaskError::NotFound(id.clone())),
                Completed::Stale { state, attempt } => Err(stale(id, state, attempt as i64)),
            });
        }
        for (label, n) in done {
            metrics::counter!("muster_tasks_succeeded_total", "queue" => label).increment(n);
        }
        let claimed = match next_reply {
            Some(c) => {
                let queue = claim_queue.unwrap_or_default();
                Some(NextClaimed {
                    result: self
                        .next_claimed(tried, &queue, &c.owner, c.claim, max, next.ack_ms)
                        .await,
                    owner: c.owner,
                    queue,
                })
            }
            None => None,
        };
        Ok((out, self.top_up(tried, max, next.ack_ms, claimed).await))
    }

    /// Reports a failed execution.
    pub async fn fail(&self, id: &str, token: u64, error: &str, retryable: bool) -> Result<Finished, TaskError> {
        Ok(self
            .fail_then(id, token, error, retryable, NextClaim::default())
            .await?
            .0)
    }

    /// Reports a failed execution and claims the owner's next task(s) in the
    /// same call (`next`).
    pub async fn fail_then(
        &self,
        id: &str,
        token: u64,
        error: &str,
        retryable: bool,
        next: NextClaim,
    ) -> Result<(Finished, Option<NextClaimed>), TaskError> {
        let call = scripts::Fail {
            id,
            token,
            error,
            retryable,
            jitter: rand::random(),
            retention_ms: self.cfg.retention_ms,
            dead_retention_ms: self.cfg.dead_retention_ms,
            next: scripts::Next {
                max: next.max,
                queue: next.queue.as_deref().unwrap_or(""),
                ack_ms: next.ack_ms,
            },
        };
        let shard = self.store.shards().home(id);
        match self.store.shard(shard).run(&self.scripts.fail, &call).await? {
            FailReply::NotFound => Err(TaskError::NotFound(id.into())),
            FailReply::Stale { state, attempt } => Err(stale(id, state, attempt as i64)),
            FailReply::Done {
                state,
                attempt,
                run_at,
                queue,
                next: claimed,
            } => {
                let label = self.labels.label(&queue);
                metrics::counter!("muster_tasks_failed_total", "queue" => label.clone()).increment(1);
                if state == "dead" {
                    metrics::counter!("muster_tasks_dead_total", "queue" => label).increment(1);
                }
                let claim_queue = next.queue.clone().unwrap_or_else(|| queue.clone());
                let claimed = match claimed {
                    Some(c) => Some(NextClaimed {
                        result: self
                            .next_claimed(shard, &claim_queue, &c.owner, c.claim, next.max, next.ack_ms)
                            .await,
                        owner: c.owner,
                        queue: claim_queue,
                    }),
                    None => None,
                };
                Ok((
                    Finished {
                        id: id.into(),
                        state,
                        attempt,
                        retry_at: run_at,
                    },
                    self.top_up(shard, next.max, next.ack_ms, claimed).await,
                ))
            }
        }
    }

    /// A running task's heartbeat; returns whether a cancel was requested.
    pub async fn heartbeat(
        &self,
        id: &str,
        token: u64,
        progress: Option<u8>,
        fields: Option<String>,
    ) -> Result<bool, TaskError> {
        let call = scripts::Heartbeat {
            id,
            token,
            progress,
            fields,
        };
        match self.at(id).run(&self.scripts.heartbeat, &call).await? {
            HeartbeatReply::NotFound => Err(TaskError::NotFound(id.into())),
            HeartbeatReply::Stale { state } => Err(stale(id, state, 0)),
            HeartbeatReply::Ok { cancel_requested } => Ok(cancel_requested),
        }
    }

    /// Cancels a queued or delayed task; asks a running one to stop.
    /// Returns the resulting state (`cancelled`, or `running` when requested).
    pub async fn cancel(&self, id: &str, actor: &str) -> Result<String, TaskError> {
        let call = scripts::Cancel {
            id,
            retention_ms: self.cfg.retention_ms,
            actor,
        };
        let r = self.at(id).run(&self.scripts.cancel, &call).await?;
        match r.code {
            Err(Code::NotFound) => Err(TaskError::NotFound(id.into())),
            Err(_) => Err(TaskError::Conflict {
                message: format!(
                    "task {id} is already {}; only queued, delayed and running tasks can be cancelled",
                    r.state
                ),
                state: r.state,
                attempt: 0,
            }),
            Ok(_) => Ok(r.state),
        }
    }

    /// Requeues a dead task with fresh attempts (registering its queue again
    /// if it was forgotten, within `max_queues`).
    pub async fn retry(&self, id: &str, actor: &str) -> Result<(), TaskError> {
        let call = scripts::Retry {
            id,
            actor,
            max_queues: self.cfg.max_queues,
        };
        let r = self.at(id).run(&self.scripts.retry, &call).await?;
        match r.code {
            Err(Code::NotFound) => Err(TaskError::NotFound(id.into())),
            Err(Code::TooManyQueues) => Err(TaskError::TooManyQueues(self.cfg.max_queues)),
            Err(_) => Err(TaskError::Conflict {
                message: format!("task {id} is {}; only dead tasks can be retried", r.state),
                state: r.state,
                attempt: 0,
            }),
            Ok(_) => Ok(()),
        }
    }

    /// Discards a finished task now.
    pub async fn delete(&self, id: &str, actor: &str) -> Result<(), TaskError> {
        let r = self
            .at(id)
            .run(&self.scripts.delete, &scripts::Delete { id, actor })
            .await?;
        match r.code {
            Err(Code::NotFound) => Err(TaskError::NotFound(id.into())),
            Err(_) => Err(TaskError::Conflict {
                message: format!("task {id} is {}; cancel it before deleting it", r.state),
                state: r.state,
                attempt: 0,
            }),
            Ok(_) => Ok(()),
        }
    }
}

fn stale(id: &str, state: String, attempt: i64) -> TaskError {
    let message = if state == "running" {
        format!("task {id} is held by a newer claim: this token is stale; drop the work")
    } else {
        format!("task {id} is {state}, not running under this token: the token is stale; drop the work")
    };
    TaskError::Conflict {
        message,
        state,
        attempt,
    }
}
