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

pub mod routes;
mod scripts;
pub mod worker;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

use crate::config::TasksConfig;
use crate::error::ApiError;
use crate::store::{Code, ScriptCtx, Store, StoreError};

use self::scripts::{ClaimReply, Completed, Enqueued, FailReply, HeartbeatReply, ListQueuedReply, Scripts};

/// The furthest ahead a task may be due: `delay_ms` at most, and `run_at`
/// at most this long after the Redis time of the submit (366 days).
pub const MAX_DELAY_MS: u64 = 366 * 24 * 3600 * 1000;

/// The largest `run_at` that is meaningful at all: 2^53, the largest integer
/// every JSON client reads exactly (and far beyond Redis time + a year).
pub const MAX_RUN_AT: i64 = 1 << 53;

/// How deep the listing of queued tasks goes: its `cursor` is at most this.
/// Queued tasks are merged from the ready set and every group's queue in
/// claim order, and that work grows with the depth (other states are one
/// sorted set each, and page at any depth).
pub const MAX_QUEUED_CURSOR: usize = 10_000;

/// Every state a task can be in.
pub const STATES: &[&str] = &["queued", "delayed", "running", "succeeded", "cancelled", "dead"];

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
    #[error("the cluster already has the maximum of {0} group limits (tasks.max_groups)")]
    TooManyGroups(u32),
    #[error(
        "`run_at` {run_at} is more than one year (366 days) after the Redis time now ({now}); the latest accepted now is {}",
        now + MAX_DELAY_MS as i64
    )]
    RunAtTooFar { run_at: i64, now: i64 },
    #[error(
        "`cursor` can be at most {MAX_QUEUED_CURSOR} for state=queued: the listing shows the first \
         {MAX_QUEUED_CURSOR} queued tasks in claim order (`total` counts them all)"
    )]
    CursorTooDeep,
    #[error(
        "node `{0}` is not registered or its heartbeat expired: PUT /api/v1/nodes/{0}/heartbeat first, and keep heartbeating while you work"
    )]
    NodeNotAlive(String),
    #[error("node `{0}` is draining (or has left) and takes no new work")]
    NodeDraining(String),

    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<TaskError> for ApiError {
    fn from(e: TaskError) -> Self {
        match e {
            TaskError::NotFound(_) => ApiError::NotFound(e.to_string()),
            TaskError::RunAtTooFar { .. } | TaskError::CursorTooDeep => ApiError::bad_request(e.to_string()),
            TaskError::Conflict {
                message,
                state,
                attempt,
            } => ApiError::conflict(message, serde_json::json!({"state": state, "attempt": attempt})),
            TaskError::AliasTaken { ref holder, .. } => {
                ApiError::conflict(e.to_string(), serde_json::json!({"holder": holder}))
            }
            TaskError::TooManyQueues(_)
            | TaskError::TooManyGroups(_)
            | TaskError::NodeNotAlive(_)
            | TaskError::NodeDraining(_) => ApiError::conflict(e.to_string(), serde_json::Value::Null),
            TaskError::Store(s) => s.into(),
        }
    }
}

/// A task to submit (already validated).
#[derive(Debug, Clone)]
pub struct NewTask {
    pub payload: String,
    pub group: String,
    pub priority: i32,
    pub delay_ms: u64,
    pub run_at: i64,
    pub max_attempts: u32,
    pub timeout_ms: u64,
    pub alias: String,
    pub idempotency_key: String,
    pub backoff_base_ms: u64,
    pub backoff_cap_ms: u64,
}

/// The outcome of submitting one task.
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted {
    Created {
        id: String,
        state: String,
    },
    /// The idempotency key was seen within its window: the original task
    /// (`queue` is its queue, which may differ from the one asked for).
    Replayed {
        id: String,
        state: String,
        queue: String,
    },
    AliasTaken {
        holder: String,
    },
    TooManyQueues,
    /// `run_at` is more than [`MAX_DELAY_MS`] after the Redis time `now`.
    RunAtTooFar {
        now: i64,
    },
}

/// A claimed task as the worker receives it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Claimed {
    pub id: String,
    pub queue: String,
    /// The fencing token: send it with heartbeat, complete and fail.
    pub token: u64,
    /// 1 for the first execution.
    pub attempt: u32,
    #[schema(value_type = serde_json::Value)]
    pub payload: Box<RawValue>,
    pub max_attempts: u32,
    /// 0: no timeout.
    pub timeout_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub priority: i32,
    /// Redis ms.
    pub created_at: i64,
}

/// What a claim returned.
#[derive(Debug)]
pub struct ClaimResult {
    pub tasks: Vec<Claimed>,
    /// When the earliest delayed task of the queue is due (Redis ms).
    pub next_due: Option<i64>,
    /// `max` tasks were claimed and more are ready: wake another waiter.
    pub more: bool,
}

/// What a complete or fail claimed next: for whom, from which queue, and
/// the outcome.
#[derive(Debug)]
pub struct NextClaimed {
    /// The finished task's owner.
    pub owner: String,
    pub queue: String,
    pub result: Result<ClaimResult, TaskError>,
}

/// What a complete or fail should claim next, in the same call: up to `max`
/// tasks (0: none) for the finished task's owner, from `queue` (None: the
/// finished task's own).
#[derive(Debug, Clone, Default)]
pub struct NextClaim {
    pub max: u32,
    pub queue: Option<String>,
}

/// The outcome of a complete, fail or heartbeat.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Finished {
    pub id: String,
    /// The task's state after the call.
    pub state: String,
    pub attempt: u32,
    /// When a retry is due (Redis ms), after a fail with attempts left.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<i64>,
}

/// One execution of a task.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Attempt {
    pub attempt: u32,
    pub node: String,
    pub token: u64,
    pub claimed_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<i64>,
    /// succeeded, failed, orphaned, timed_out; absent while running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// A task as stored.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Task {
    pub id: String,
    pub queue: String,
    pub state: String,
    #[schema(value_type = serde_json::Value)]
    pub payload: Box<RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub priority: i32,
    pub max_attempts: u32,
    /// Executions so far.
    pub attempts: u32,
    pub timeout_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The node running it (or that ran it last).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The current (or last) fencing token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    pub created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    pub updated_at: i64,
    pub progress: u8,
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Box<RawValue>>,
    #[schema(value_type = Option<serde_json::Value>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub cancel_requested: bool,
    /// The node that submitted it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    pub attempt_log: Vec<Attempt>,
}

/// Counts of one queue.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct QueueStats {
    pub name: String,
    pub queued: u64,
    pub delayed: u64,
    pub running: u64,
    pub dead: u64,
    pub succeeded: u64,
    pub cancelled: u64,
    pub paused: bool,
    /// Tasks that reached a terminal state in the last minute.
    pub finished_last_minute: u64,
}

/// A group with its limit and the slots in use.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GroupInfo {
    pub name: String,
    /// None: unlimited.
    pub limit: Option<u32>,
    pub running: u64,
    /// Queued tasks of the group, in the queue asked about.
    pub queued: u64,
}

/// One page of a listing.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskPage {
    pub tasks: Vec<Task>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Tasks in this state in total.
    pub total: u64,
}

/// Bounds the `queue` label of metrics: the first 100 queues seen get their
/// own series, the rest share `other`.
#[derive(Default)]
pub struct QueueLabels {
    seen: Mutex<HashSet<String>>,
}

const MAX_QUEUE_LABELS: usize = 100;

impl QueueLabels {
    pub fn label(&self, queue: &str) -> String {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(queue) {
            return queue.to_string();
        }
        if seen.len() < MAX_QUEUE_LABELS {
            seen.insert(queue.to_string());
            return queue.to_string();
        }
        "other".into()
    }
}

/// The task service.
pub struct Tasks {
    store: Store,
    cfg: TasksConfig,
    scripts: Scripts,
    /// Shared with the orphan cleaner, so both label the same queues alike.
    pub labels: Arc<QueueLabels>,
}

fn raw(json: &str) -> Box<RawValue> {
    RawValue::from_string(json.to_string())
        .unwrap_or_else(|_| RawValue::from_string("null".into()).expect("null is JSON"))
}

fn opt(s: Option<&String>) -> Option<String> {
    s.filter(|v| !v.is_empty()).cloned()
}

impl Tasks {
    pub fn new(store: Store, cfg: TasksConfig, ctx: &ScriptCtx) -> Arc<Tasks> {
        let scripts = Scripts::new(ctx);
        Arc::new(Tasks {
            store,
            cfg,
            scripts,
            labels: Arc::new(QueueLabels::default()),
        })
    }

    pub fn config(&self) -> &TasksConfig {
        &self.cfg
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    fn qkey(&self, queue: &str, suffix: &str) -> String {
        format!("{}:q:{queue}:{suffix}", self.store.keys().prefix())
    }

    fn tkey(&self, id: &str) -> String {
        format!("{}:task:{id}", self.store.keys().prefix())
    }

    /// Submits tasks to `queue` in one script; outcomes in order.
    pub async fn submit(&self, queue: &str, items: &[NewTask], node: &str) -> Result<Vec<Submitted>, TaskError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let call = scripts::Enqueue {
            queue,
            idempotency_window_ms: self.cfg.idempotency_window_ms,
            max_queues: self.cfg.max_queues,
            node,
            max_delay_ms: MAX_DELAY_MS,
            items: items
                .iter()
                .map(|t| scripts::EnqueueItem {
                    id: ulid::Ulid::generate().to_string(),
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
                })
                .collect(),
        };
        let reply = self.store.run(&self.scripts.enqueue, &call).await?;
        let label = self.labels.label(queue);
        Ok(reply
            .0
            .into_iter()
            .map(|r| match r {
                Enqueued::Created { id, state } => {
                    metrics::counter!("muster_tasks_enqueued_total", "queue" => label.clone()).increment(1);
                    Submitted::Created { id, state }
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
            })
            .collect())
    }

    /// Claims up to `max` tasks of `queue` for `node`.
    pub async fn claim(&self, queue: &str, node: &str, max: u32) -> Result<ClaimResult, TaskError> {
        let reply = self
            .store
            .run(&self.scripts.claim, &scripts::Claim { queue, node, max })
            .await?;
        self.claimed(queue, node, reply)
    }

    /// Turns a claim reply into tasks, counting them (and empty claims).
    fn claimed(&self, queue: &str, node: &str, reply: ClaimReply) -> Result<ClaimResult, TaskError> {
        match reply {
            ClaimReply::Refused(Code::NodeDraining) => Err(TaskError::NodeDraining(node.into())),
            ClaimReply::Refused(_) => Err(TaskError::NodeNotAlive(node.into())),
            ClaimReply::Claimed { tasks, next_due, more } => {
                if tasks.is_empty() {
                    metrics::counter!("muster_claims_empty_total").increment(1);
                } else {
                    metrics::counter!("muster_tasks_claimed_total", "queue" => self.labels.label(queue))
                        .increment(tasks.len() as u64);
                }
                let tasks = tasks
                    .into_iter()
                    .map(|t| Claimed {
                        id: t.id,
                        queue: queue.to_string(),
                        token: t.token,
                        attempt: t.attempt,
                        payload: raw(&t.payload),
                        max_attempts: t.max_attempts,
                        timeout_ms: t.timeout_ms,
                        group: (!t.group.is_empty()).then_some(t.group),
                        priority: t.priority,
                        created_at: t.created_at,
                    })
                    .collect();
                Ok(ClaimResult { tasks, next_due, more })
            }
        }
    }

    /// Completes tasks; one outcome per item, in order.
    pub async fn complete(
        &self,
        items: &[(String, u64, String)],
    ) -> Result<Vec<Result<Finished, TaskError>>, TaskError> {
        Ok(self.complete_then(items, NextClaim::default()).await?.0)
    }

    /// Completes tasks and, for a single one, claims its owner's next
    /// task(s) in the same call (`next`).
    pub async fn complete_then(
        &self,
        items: &[(String, u64, String)],
        next: NextClaim,
    ) -> Result<(Vec<Result<Finished, TaskError>>, Option<NextClaimed>), TaskError> {
        let call = scripts::Complete {
            retention_ms: self.cfg.retention_ms,
            next: scripts::Next {
                max: if items.len() == 1 { next.max } else { 0 },
                queue: next.queue.as_deref().unwrap_or(""),
            },
            items,
        };
        let reply = self.store.run(&self.scripts.complete, &call).await?;
        let mut out = Vec::with_capacity(items.len());
        let mut done: BTreeMap<String, u64> = BTreeMap::new();
        let mut claim_queue = next.queue.clone();
        for ((id, _, _), c) in items.iter().zip(reply.items) {
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
        let claimed = reply.next.map(|c| {
            let queue = claim_queue.unwrap_or_default();
            NextClaimed {
                result: self.claimed(&queue, &c.owner, c.claim),
                owner: c.owner,
                queue,
            }
        });
        Ok((out, claimed))
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
            },
        };
        match self.store.run(&self.scripts.fail, &call).await? {
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
                let claimed = claimed.map(|c| NextClaimed {
                    result: self.claimed(&claim_queue, &c.owner, c.claim),
                    owner: c.owner,
                    queue: claim_queue,
                });
                Ok((
                    Finished {
                        id: id.into(),
                        state,
                        attempt,
                        retry_at: run_at,
                    },
                    claimed,
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
        match self.store.run(&self.scripts.heartbeat, &call).await? {
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
        let r = self.store.run(&self.scripts.cancel, &call).await?;
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
        let r = self.store.run(&self.scripts.retry, &call).await?;
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
            .store
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

    /// Pauses or resumes a queue. Returns whether it changed.
    pub async fn set_paused(&self, queue: &str, paused: bool, actor: &str) -> Result<bool, TaskError> {
        let call = scripts::Pause {
            queue,
            paused,
            actor,
            max_queues: self.cfg.max_queues,
        };
        match self.store.run(&self.scripts.pause, &call).await?.0 {
            Err(_) => Err(TaskError::TooManyQueues(self.cfg.max_queues)),
            Ok(changed) => Ok(changed == 1),
        }
    }

    /// Sets (or with None clears) a group's limit. Returns the slots in use.
    pub async fn set_group_limit(&self, group: &str, limit: Option<u32>, actor: &str) -> Result<u64, TaskError> {
        let call = scripts::SetGroup {
            group,
            limit,
            max_groups: self.cfg.max_groups,
            actor,
        };
        let r = self.store.run(&self.scripts.set_group, &call).await?;
        match r.code {
            Err(_) => Err(TaskError::TooManyGroups(self.cfg.max_groups)),
            Ok(_) => Ok(r.running),
        }
    }

    /// One task, or None.
    pub async fn get(&self, id: &str) -> Result<Option<Task>, TaskError> {
        Ok(self.get_many(&[id.to_string()]).await?.into_iter().next().flatten())
    }

    /// Several tasks in one pipelined round trip, in order (None: gone).
    pub async fn get_many(&self, ids: &[String]) -> Result<Vec<Option<Task>>, TaskError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for id in ids {
            p.cmd("HGETALL").arg(self.tkey(id));
        }
        let maps: Vec<BTreeMap<String, String>> = self.store.pipe("task_get", &p).await?;
        Ok(maps
            .iter()
            .zip(ids)
            .map(|(m, id)| if m.is_empty() { None } else { Some(task_from(id, m)) })
            .collect())
    }

    /// Tasks of `queue` in `state`, a page at a time. Queued tasks are listed
    /// in claim order, down to [`MAX_QUEUED_CURSOR`]; the others newest first.
    pub async fn list(&self, queue: &str, state: &str, limit: usize, cursor: usize) -> Result<TaskPage, TaskError> {
        if state == "queued" {
            if cursor > MAX_QUEUED_CURSOR {
                return Err(TaskError::CursorTooDeep);
            }
            let call = scripts::ListQueued {
                queue,
                offset: cursor,
                limit: limit + 1,
            };
            let ListQueuedReply { total, mut ids } = self.store.run(&self.scripts.list_queued, &call).await?;
            let more = ids.len() > limit && cursor + limit <= MAX_QUEUED_CURSOR;
            ids.truncate(limit);
            let tasks = self.get_many(&ids).await?.into_iter().flatten().collect();
            return Ok(TaskPage {
                tasks,
                next_cursor: more.then(|| (cursor + limit).to_string()),
                total,
            });
        }
        let key = self.qkey(queue, state);
        self.page(&key, state == "delayed", limit, cursor).await
    }

    /// Dead tasks of every queue, newest first.
    pub async fn dead(&self, limit: usize, cursor: usize) -> Result<TaskPage, TaskError> {
        let key = format!("{}:dead", self.store.keys().prefix());
        self.page(&key, false, limit, cursor).await
    }

    async fn page(&self, key: &str, ascending: bool, limit: usize, cursor: usize) -> Result<TaskPage, TaskError> {
        let mut p = redis::pipe();
        p.cmd("ZCARD").arg(key);
        p.cmd("ZRANGE").arg(key).arg(cursor).arg(cursor + limit);
        if !ascending {
            p.arg("REV");
        }
        let (total, mut ids): (u64, Vec<String>) = self.store.pipe("task_list", &p).await?;
        let more = ids.len() > limit;
        ids.truncate(limit);
        let tasks = self.get_many(&ids).await?.into_iter().flatten().collect();
        Ok(TaskPage {
            tasks,
            next_cursor: more.then(|| (cursor + limit).to_string()),
            total,
        })
    }

    /// Every known queue with its counts, in two pipelined round trips.
    pub async fn queues(&self) -> Result<Vec<QueueStats>, TaskError> {
        let k = self.store.keys();
        let mut names: Vec<String> = self
            .store
            .query(
                "queues_list",
                redis::cmd("SMEMBERS").arg(format!("{}:queues", k.prefix())),
            )
            .await?;
        names.sort();
        self.stats_for(&names).await
    }

    /// Counts of the named queues, read atomically.
    pub async fn stats_for(&self, names: &[String]) -> Result<Vec<QueueStats>, TaskError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self
            .store
            .run(&self.scripts.counts, &scripts::Counts { queues: names })
            .await?;
        Ok(names
            .iter()
            .zip(rows.0)
            .map(|(q, c)| QueueStats {
                name: q.clone(),
                queued: c.queued,
                delayed: c.delayed,
                running: c.running,
                dead: c.dead,
                succeeded: c.succeeded,
                cancelled: c.cancelled,
                finished_last_minute: c.finished_last_minute,
                paused: c.paused,
            })
            .collect())
    }

    /// Groups that have queued tasks in `queue` or a configured limit, with
    /// their slots in use.
    pub async fn groups(&self, queue: Option<&str>) -> Result<Vec<GroupInfo>, TaskError> {
        let k = self.store.keys();
        let limits: BTreeMap<String, String> = self
            .store
            .query(
                "group_limits",
                redis::cmd("HGETALL").arg(format!("{}:group_limits", k.prefix())),
            )
            .await?;
        let mut names: Vec<String> = limits.keys().cloned().collect();
        if let Some(q) = queue {
            let queued: Vec<String> = self
                .store
                .query("queue_groups", redis::cmd("SMEMBERS").arg(self.qkey(q, "groups")))
                .await?;
            names.extend(queued);
        }
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for g in &names {
            p.cmd("SCARD").arg(format!("{}:group:{g}:running", k.prefix()));
            p.cmd("ZCARD").arg(self.qkey(queue.unwrap_or("-"), &format!("g:{g}")));
        }
        let counts: Vec<u64> = self.store.pipe("group_counts", &p).await?;
        Ok(names
            .into_iter()
            .zip(counts.chunks(2))
            .map(|(name, c)| GroupInfo {
                limit: limits.get(&name).and_then(|l| l.parse().ok()),
                running: c[0],
                queued: c[1],
                name,
            })
            .collect())
    }

    /// One janitor pass: the cross-queue dead index, then every queue.
    /// Returns the stats it saw per queue.
    pub async fn janitor_pass(&self) -> Result<Vec<(String, [i64; 7])>, TaskError> {
        let k = self.store.keys();
        // First and on its own, so it runs even when no queue is left.
        let call = scripts::TrimDead {
            dead_retention_ms: self.cfg.dead_retention_ms,
        };
        self.store.run(&self.scripts.trim_dead, &call).await?;
        let names: Vec<String> = self
            .store
            .query(
                "queues_names",
                redis::cmd("SMEMBERS").arg(format!("{}:queues", k.prefix())),
            )
            .await?;
        let mut out = Vec::with_capacity(names.len());
        for q in &names {
            let call = scripts::Janitor {
                queue: q,
                retention_ms: self.cfg.retention_ms,
                dead_retention_ms: self.cfg.dead_retention_ms,
            };
            let r = self.store.run(&self.scripts.janitor, &call).await?;
            let mut row = [0i64; 7];
            for (slot, v) in row.iter_mut().zip(r) {
                *slot = v;
            }
            out.push((q.clone(), row));
        }
        Ok(out)
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

/// Builds a task from its hash.
fn task_from(id: &str, m: &BTreeMap<String, String>) -> Task {
    let num = |f: &str| m.get(f).and_then(|v| v.parse::<i64>().ok());
    let attempts = num("attempts").unwrap_or(0) as u32;
    let mut attempt_log = Vec::new();
    for n in 1..=attempts {
        let Some(a) = m.get(&format!("a{n}")) else { continue };
        let mut parts = a.splitn(3, '|');
        let (node, token, claimed_at) = (parts.next(), parts.next(), parts.next());
        let end = m.get(&format!("e{n}"));
        let (ended_at, outcome) = match end.and_then(|e| e.split_once('|')) {
            Some((t, o)) => (t.parse().ok(), Some(o.to_string())),
            None => (None, None),
        };
        attempt_log.push(Attempt {
            attempt: n,
            node: node.unwrap_or("").into(),
            token: token.and_then(|t| t.parse().ok()).unwrap_or(0),
            claimed_at: claimed_at.and_then(|t| t.parse().ok()).unwrap_or(0),
            ended_at,
            outcome,
        });
    }
    Task {
        id: id.to_string(),
        queue: m.get("queue").cloned().unwrap_or_default(),
        state: m.get("state").cloned().unwrap_or_default(),
        payload: raw(m.get("payload").map(String::as_str).unwrap_or("null")),
        group: opt(m.get("group")),
        priority: num("priority").unwrap_or(0) as i32,
        max_attempts: num("max_attempts").unwrap_or(0) as u32,
        attempts,
        timeout_ms: num("timeout_ms").unwrap_or(0) as u64,
        alias: opt(m.get("alias")),
        idempotency_key: opt(m.get("idem")),
        owner: opt(m.get("owner")),
        token: num("token").map(|t| t as u64),
        created_at: num("created_at").unwrap_or(0),
        run_at: num("run_at"),
        started_at: num("started_at"),
        finished_at: num("finished_at"),
        // Hot paths do not write updated_at; the latest time something
        // happened is it. Not run_at: that is when something will happen.
        updated_at: ["updated_at", "created_at", "started_at", "finished_at"]
            .iter()
            .filter_map(|f| num(f))
            .max()
            .unwrap_or(0),
        progress: if m.get("state").is_some_and(|s| s == "succeeded") {
            100
        } else {
            num("progress").unwrap_or(0).clamp(0, 100) as u8
        },
        fields: opt(m.get("fields")).map(|f| raw(&f)),
        result: opt(m.get("result")).map(|r| raw(&r)),
        error: opt(m.get("error")),
        cancel_requested: m.get("cancel_requested").is_some_and(|v| v == "1"),
        submitted_by: opt(m.get("node")),
        attempt_log,
    }
}

/// Task options as the API takes them (shared by single and batch submit,
/// and by workflows and schedules, which submit tasks too).
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Any JSON value, at most `tasks.max_payload_bytes` serialized.
    #[schema(value_type = serde_json::Value)]
    #[serde(default)]
    pub payload: serde_json::Value,
    /// Concurrency group, `[A-Za-z0-9._-]{1,128}`.
    pub group: Option<String>,
    /// -1000 to 1000; higher first. Default 0.
    pub priority: Option<i32>,
    /// Claimable after this delay, at most one year (366 days).
    pub delay_ms: Option<u64>,
    /// Claimable at this Redis time (ms since the epoch). Not with delay_ms.
    /// At most one year (366 days) after the Redis time of the submit; a
    /// time in the past means now. Refused above 2^53 before Redis is asked.
    pub run_at: Option<i64>,
    /// Executions before the task is dead, 1 to 1000. Default `tasks.max_attempts`.
    pub max_attempts: Option<u32>,
    /// One execution's time limit; 0 or absent: none. At most 7 days.
    pub timeout_ms: Option<u64>,
    /// Unique while the task lives; find it with GET /api/v1/aliases/{alias}.
    pub alias: Option<String>,
    /// Same key within `tasks.idempotency_window_ms`: the same task, never a second.
    pub idempotency_key: Option<String>,
    /// First retry delay; default `tasks.backoff_base_ms`.
    pub backoff_base_ms: Option<u64>,
    /// Largest retry delay; default `tasks.backoff_cap_ms`.
    pub backoff_cap_ms: Option<u64>,
}

impl TaskSpec {
    /// Validates and fills defaults.
    pub fn validate(&self, cfg: &TasksConfig) -> Result<NewTask, ApiError> {
        let payload = serde_json::to_string(&self.payload).map_err(|e| ApiError::bad_request(e.to_string()))?;
        if payload.len() > cfg.max_payload_bytes {
            return Err(ApiError::TooLarge(format!(
                "the payload is {} bytes; the limit is {} (tasks.max_payload_bytes)",
                payload.len(),
                cfg.max_payload_bytes
            )));
        }
        if let Some(g) = &self.group {
            crate::validate::name("group", g)?;
        }
        if let Some(a) = &self.alias {
            crate::validate::name("alias", a)?;
        }
        if let Some(k) = &self.idempotency_key {
            crate::validate::opaque_key("idempotency_key", k)?;
        }
        let priority = self.priority.unwrap_or(0);
        crate::validate::in_range("priority", priority, &crate::validate::PRIORITY)?;
        if self.delay_ms.is_some() && self.run_at.is_some() {
            return Err(ApiError::bad_request("give `delay_ms` or `run_at`, not both"));
        }
        if self.delay_ms.is_some_and(|d| d > MAX_DELAY_MS) {
            return Err(ApiError::bad_request("`delay_ms` must be at most one year"));
        }
        // The one-year bound is checked by the enqueue script against Redis
        // time (G11); this only keeps out values no clock can be near.
        if self.run_at.is_some_and(|r| !(0..=MAX_RUN_AT).contains(&r)) {
            return Err(ApiError::bad_request(
                "`run_at` is milliseconds since the Unix epoch (Redis time), at most one year ahead",
            ));
        }
        let max_attempts = self.max_attempts.unwrap_or(cfg.max_attempts);
        crate::validate::in_range("max_attempts", max_attempts, &crate::validate::MAX_ATTEMPTS)?;
        let timeout_ms = self.timeout_ms.unwrap_or(0);
        if timeout_ms > crate::validate::TASK_TIMEOUT_MAX_MS {
            return Err(ApiError::bad_request("`timeout_ms` must be at most 7 days"));
        }
        let base = self.backoff_base_ms.unwrap_or(cfg.backoff_base_ms);
        let cap = self.backoff_cap_ms.unwrap_or(cfg.backoff_cap_ms.max(base));
        let most = crate::validate::BACKOFF_MAX_MS;
        if base > most || cap > most || cap < base {
            return Err(ApiError::bad_request(
                "`backoff_base_ms` and `backoff_cap_ms` must be at most 24 h, with the cap at least the base",
            ));
        }
        Ok(NewTask {
            payload,
            group: self.group.clone().unwrap_or_default(),
            priority,
            delay_ms: self.delay_ms.unwrap_or(0),
            run_at: self.run_at.unwrap_or(0),
            max_attempts,
            timeout_ms,
            alias: self.alias.clone().unwrap_or_default(),
            idempotency_key: self.idempotency_key.clone().unwrap_or_default(),
            backoff_base_ms: base,
            backoff_cap_ms: cap,
        })
    }
}
