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
pub mod worker;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use redis::Value;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

use crate::config::TasksConfig;
use crate::error::ApiError;
use crate::store::reply::{at, int, text};
use crate::store::{Lua, ScriptCtx, Store, StoreError};

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
    #[schema(value_type = Object)]
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
    #[schema(value_type = Object)]
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
    #[schema(value_type = Object)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Box<RawValue>>,
    #[schema(value_type = Object)]
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

struct Scripts {
    enqueue: Lua,
    claim: Lua,
    complete: Lua,
    fail: Lua,
    heartbeat: Lua,
    cancel: Lua,
    retry: Lua,
    delete: Lua,
    pause: Lua,
    set_group: Lua,
    janitor: Lua,
    counts: Lua,
    list_queued: Lua,
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

/// The task helpers (`lua/lib.lua`) followed by the workflow hook that every
/// terminal transition calls; prepended to every script that changes tasks.
pub const LIB: &str = concat!(
    include_str!("lua/lib.lua"),
    "\n",
    include_str!("../workflows/lua/hook.lua")
);

fn raw(json: &str) -> Box<RawValue> {
    RawValue::from_string(json.to_string())
        .unwrap_or_else(|_| RawValue::from_string("null".into()).expect("null is JSON"))
}

fn opt(s: Option<&String>) -> Option<String> {
    s.filter(|v| !v.is_empty()).cloned()
}

impl Tasks {
    pub fn new(store: Store, cfg: TasksConfig, ctx: &ScriptCtx) -> Arc<Tasks> {
        let l = |name, src| Lua::with_libs(name, &[LIB], src, ctx);
        let scripts = Scripts {
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
            counts: l("queue_counts", include_str!("lua/counts.lua")),
            list_queued: l("queue_list_queued", include_str!("lua/list_queued.lua")),
        };
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
        let mut args = vec![
            queue.to_string(),
            self.cfg.idempotency_window_ms.to_string(),
            self.cfg.max_queues.to_string(),
            node.to_string(),
            items.len().to_string(),
        ];
        for t in items {
            args.extend([
                ulid::Ulid::generate().to_string(),
                t.payload.clone(),
                t.group.clone(),
                t.priority.to_string(),
                t.delay_ms.to_string(),
                t.run_at.to_string(),
                t.max_attempts.to_string(),
                t.timeout_ms.to_string(),
                t.alias.clone(),
                t.idempotency_key.clone(),
                t.backoff_base_ms.to_string(),
                t.backoff_cap_ms.to_string(),
            ]);
        }
        let reply: Vec<Value> = self
            .store
            .eval(&self.scripts.enqueue, &[self.qkey(queue, "ready")], &args)
            .await?;
        let label = self.labels.label(queue);
        let mut out = Vec::with_capacity(items.len());
        for chunk in reply.chunks(3) {
            let (code, id, state) = (int(at(chunk, 0)), text(at(chunk, 1)), text(at(chunk, 2)));
            out.push(match code {
                1 => {
                    metrics::counter!("muster_tasks_enqueued_total", "queue" => label.clone()).increment(1);
                    Submitted::Created { id, state }
                }
                2 => {
                    let (state, original) = state.split_once(':').unwrap_or((state.as_str(), queue));
                    Submitted::Replayed {
                        id,
                        state: state.to_string(),
                        queue: original.to_string(),
                    }
                }
                -1 => Submitted::AliasTaken { holder: id },
                _ => Submitted::TooManyQueues,
            });
        }
        Ok(out)
    }

    /// Claims up to `max` tasks of `queue` for `node`.
    pub async fn claim(&self, queue: &str, node: &str, max: u32) -> Result<ClaimResult, TaskError> {
        let reply: Vec<Value> = self
            .store
            .eval(
                &self.scripts.claim,
                &[self.qkey(queue, "ready")],
                &[queue.into(), node.into(), max.to_string()],
            )
            .await?;
        let code = reply.first().map(int).unwrap_or(-1);
        let next_due = reply.get(1).map(int).filter(|v| *v >= 0);
        match code {
            -1 => return Err(TaskError::NodeNotAlive(node.into())),
            -2 => return Err(TaskError::NodeDraining(node.into())),
            _ => {}
        }
        let mut tasks = Vec::with_capacity(code.max(0) as usize);
        for c in reply[2.min(reply.len())..].chunks(9) {
            if c.len() < 9 {
                break;
            }
            let group = text(at(c, 6));
            tasks.push(Claimed {
                id: text(at(c, 0)),
                queue: queue.to_string(),
                token: int(at(c, 1)) as u64,
                attempt: int(at(c, 2)) as u32,
                payload: raw(&text(at(c, 3))),
                max_attempts: int(at(c, 4)) as u32,
                timeout_ms: int(at(c, 5)) as u64,
                group: (!group.is_empty()).then_some(group),
                priority: int(at(c, 7)) as i32,
                created_at: int(at(c, 8)),
            });
        }
        if !tasks.is_empty() {
            metrics::counter!("muster_tasks_claimed_total", "queue" => self.labels.label(queue))
                .increment(tasks.len() as u64);
        }
        Ok(ClaimResult { tasks, next_due })
    }

    /// Completes tasks; one outcome per item, in order.
    pub async fn complete(
        &self,
        items: &[(String, u64, String)],
    ) -> Result<Vec<Result<Finished, TaskError>>, TaskError> {
        let mut args = vec![self.cfg.retention_ms.to_string(), items.len().to_string()];
        for (id, token, result) in items {
            args.extend([id.clone(), token.to_string(), result.clone()]);
        }
        let deadlines = format!("{}:deadlines", self.store.keys().prefix());
        let reply: Vec<Value> = self.store.eval(&self.scripts.complete, &[deadlines], &args).await?;
        let mut out = Vec::with_capacity(items.len());
        let mut done: BTreeMap<String, u64> = BTreeMap::new();
        for ((id, _, _), c) in items.iter().zip(reply.chunks(3)) {
            let (code, state, attempt) = (int(at(c, 0)), text(at(c, 1)), int(at(c, 2)));
            out.push(match code {
                1 => {
                    let queue = state.split_once(':').map_or("", |(_, q)| q);
                    *done.entry(self.labels.label(queue)).or_default() += 1;
                    Ok(Finished {
                        id: id.clone(),
                        state: "succeeded".into(),
                        attempt: attempt as u32,
                        retry_at: None,
                    })
                }
                -2 => Err(TaskError::NotFound(id.clone())),
                _ => Err(stale(id, state, attempt)),
            });
        }
        for (label, n) in done {
            metrics::counter!("muster_tasks_succeeded_total", "queue" => label).increment(n);
        }
        Ok(out)
    }

    /// Reports a failed execution.
    pub async fn fail(&self, id: &str, token: u64, error: &str, retryable: bool) -> Result<Finished, TaskError> {
        let jitter: f64 = rand::random();
        let reply: Vec<Value> = self
            .store
            .eval(
                &self.scripts.fail,
                &[self.tkey(id)],
                &[
                    id.into(),
                    token.to_string(),
                    error.into(),
                    if retryable { "1" } else { "0" }.into(),
                    format!("{jitter:.6}"),
                    self.cfg.retention_ms.to_string(),
                    self.cfg.dead_retention_ms.to_string(),
                ],
            )
            .await?;
        let (code, state, attempt, run_at) = (
            int(at(&reply, 0)),
            text(at(&reply, 1)),
            int(at(&reply, 2)),
            int(at(&reply, 3)),
        );
        match code {
            -2 => Err(TaskError::NotFound(id.into())),
            -1 => Err(stale(id, state, attempt)),
            _ => {
                let label = self.labels.label(&text(at(&reply, 4)));
                metrics::counter!("muster_tasks_failed_total", "queue" => label.clone()).increment(1);
                if state == "dead" {
                    metrics::counter!("muster_tasks_dead_total", "queue" => label).increment(1);
                }
                Ok(Finished {
                    id: id.into(),
                    state,
                    attempt: attempt as u32,
                    retry_at: (run_at > 0).then_some(run_at),
                })
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
        let reply: Vec<Value> = self
            .store
            .eval(
                &self.scripts.heartbeat,
                &[self.tkey(id)],
                &[
                    id.into(),
                    token.to_string(),
                    progress.map(|p| p.to_string()).unwrap_or_default(),
                    fields.unwrap_or_default(),
                ],
            )
            .await?;
        match int(at(&reply, 0)) {
            -2 => Err(TaskError::NotFound(id.into())),
            -1 => Err(stale(id, text(at(&reply, 1)), 0)),
            _ => Ok(int(at(&reply, 2)) == 1),
        }
    }

    /// Cancels a queued or delayed task; asks a running one to stop.
    /// Returns the resulting state (`cancelled`, or `running` when requested).
    pub async fn cancel(&self, id: &str, actor: &str) -> Result<String, TaskError> {
        let reply: Vec<Value> = self
            .store
            .eval(
                &self.scripts.cancel,
                &[self.tkey(id)],
                &[id.into(), self.cfg.retention_ms.to_string(), actor.into()],
            )
            .await?;
        match int(at(&reply, 0)) {
            -2 => Err(TaskError::NotFound(id.into())),
            0 => Err(TaskError::Conflict {
                message: format!(
                    "task {id} is already {}; only queued, delayed and running tasks can be cancelled",
                    text(at(&reply, 1))
                ),
                state: text(at(&reply, 1)),
                attempt: 0,
            }),
            _ => Ok(text(at(&reply, 1))),
        }
    }

    /// Requeues a dead task with fresh attempts.
    pub async fn retry(&self, id: &str, actor: &str) -> Result<(), TaskError> {
        let reply: Vec<Value> = self
            .store
            .eval(&self.scripts.retry, &[self.tkey(id)], &[id.into(), actor.into()])
            .await?;
        match int(at(&reply, 0)) {
            -2 => Err(TaskError::NotFound(id.into())),
            0 => Err(TaskError::Conflict {
                message: format!("task {id} is {}; only dead tasks can be retried", text(at(&reply, 1))),
                state: text(at(&reply, 1)),
                attempt: 0,
            }),
            _ => Ok(()),
        }
    }

    /// Discards a finished task now.
    pub async fn delete(&self, id: &str, actor: &str) -> Result<(), TaskError> {
        let reply: Vec<Value> = self
            .store
            .eval(&self.scripts.delete, &[self.tkey(id)], &[id.into(), actor.into()])
            .await?;
        match int(at(&reply, 0)) {
            -2 => Err(TaskError::NotFound(id.into())),
            0 => Err(TaskError::Conflict {
                message: format!("task {id} is {}; cancel it before deleting it", text(at(&reply, 1))),
                state: text(at(&reply, 1)),
                attempt: 0,
            }),
            _ => Ok(()),
        }
    }

    /// Pauses or resumes a queue. Returns whether it changed.
    pub async fn set_paused(&self, queue: &str, paused: bool, actor: &str) -> Result<bool, TaskError> {
        let code: i64 = self
            .store
            .eval(
                &self.scripts.pause,
                &[self.qkey(queue, "meta")],
                &[
                    queue.into(),
                    if paused { "1" } else { "0" }.into(),
                    actor.into(),
                    self.cfg.max_queues.to_string(),
                ],
            )
            .await?;
        if code == -2 {
            return Err(TaskError::TooManyQueues(self.cfg.max_queues));
        }
        Ok(code == 1)
    }

    /// Sets (or with None clears) a group's limit. Returns the slots in use.
    pub async fn set_group_limit(&self, group: &str, limit: Option<u32>, actor: &str) -> Result<u64, TaskError> {
        let key = format!("{}:group_limits", self.store.keys().prefix());
        let (code, running): (i64, u64) = self
            .store
            .eval(
                &self.scripts.set_group,
                &[key],
                &[
                    group.into(),
                    limit.map(|l| l.to_string()).unwrap_or_default(),
                    self.cfg.max_groups.to_string(),
                    actor.into(),
                ],
            )
            .await?;
        if code == -1 {
            return Err(TaskError::TooManyGroups(self.cfg.max_groups));
        }
        Ok(running)
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
    /// in claim order; the others newest first.
    pub async fn list(&self, queue: &str, state: &str, limit: usize, cursor: usize) -> Result<TaskPage, TaskError> {
        if state == "queued" {
            let reply: Vec<Value> = self
                .store
                .eval(
                    &self.scripts.list_queued,
                    &[self.qkey(queue, "ready")],
                    &[queue.to_string(), cursor.to_string(), (limit + 1).to_string()],
                )
                .await?;
            let total = reply.first().map(int).unwrap_or(0) as u64;
            let mut ids: Vec<String> = reply.iter().skip(1).map(text).collect();
            let more = ids.len() > limit;
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
        let key = format!("{}:queues", self.store.keys().prefix());
        let vals: Vec<Value> = self.store.eval(&self.scripts.counts, &[key], names).await?;
        Ok(names
            .iter()
            .zip(vals.get(1..).unwrap_or(&[]).chunks(10))
            .map(|(q, c)| QueueStats {
                name: q.clone(),
                queued: int(at(c, 0)) as u64,
                delayed: int(at(c, 1)) as u64,
                running: int(at(c, 2)) as u64,
                dead: int(at(c, 3)) as u64,
                succeeded: int(at(c, 4)) as u64,
                cancelled: int(at(c, 5)) as u64,
                finished_last_minute: int(at(c, 6)) as u64,
                paused: text(at(c, 7)) == "1",
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

    /// One janitor pass over every queue. Returns the stats it saw.
    pub async fn janitor_pass(&self) -> Result<Vec<(String, [i64; 7])>, TaskError> {
        let k = self.store.keys();
        let names: Vec<String> = self
            .store
            .query(
                "queues_names",
                redis::cmd("SMEMBERS").arg(format!("{}:queues", k.prefix())),
            )
            .await?;
        let mut out = Vec::with_capacity(names.len());
        for (i, q) in names.iter().enumerate() {
            let r: Vec<i64> = self
                .store
                .eval(
                    &self.scripts.janitor,
                    &[self.qkey(q, "meta")],
                    &[
                        q.clone(),
                        self.cfg.retention_ms.to_string(),
                        self.cfg.dead_retention_ms.to_string(),
                        if i == 0 { "1" } else { "0" }.into(),
                    ],
                )
                .await?;
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
        // Hot paths do not write updated_at; the latest recorded time is it.
        updated_at: ["updated_at", "created_at", "started_at", "finished_at", "run_at"]
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
    #[schema(value_type = Object)]
    #[serde(default)]
    pub payload: serde_json::Value,
    /// Concurrency group, `[A-Za-z0-9._-]{1,128}`.
    pub group: Option<String>,
    /// -1000 to 1000; higher first. Default 0.
    pub priority: Option<i32>,
    /// Claimable after this delay.
    pub delay_ms: Option<u64>,
    /// Claimable at this Redis time (ms since the epoch). Not with delay_ms.
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
        if !(-1000..=1000).contains(&priority) {
            return Err(ApiError::bad_request("`priority` must be between -1000 and 1000"));
        }
        if self.delay_ms.is_some() && self.run_at.is_some() {
            return Err(ApiError::bad_request("give `delay_ms` or `run_at`, not both"));
        }
        const YEAR_MS: u64 = 366 * 24 * 3600 * 1000;
        if self.delay_ms.is_some_and(|d| d > YEAR_MS) {
            return Err(ApiError::bad_request("`delay_ms` must be at most one year"));
        }
        if self.run_at.is_some_and(|r| r < 0) {
            return Err(ApiError::bad_request(
                "`run_at` is milliseconds since the Unix epoch (Redis time)",
            ));
        }
        let max_attempts = self.max_attempts.unwrap_or(cfg.max_attempts);
        if !(1..=1000).contains(&max_attempts) {
            return Err(ApiError::bad_request("`max_attempts` must be between 1 and 1000"));
        }
        let timeout_ms = self.timeout_ms.unwrap_or(0);
        if timeout_ms > 7 * 24 * 3600 * 1000 {
            return Err(ApiError::bad_request("`timeout_ms` must be at most 7 days"));
        }
        let base = self.backoff_base_ms.unwrap_or(cfg.backoff_base_ms);
        let cap = self.backoff_cap_ms.unwrap_or(cfg.backoff_cap_ms.max(base));
        if base > 24 * 3600 * 1000 || cap > 24 * 3600 * 1000 || cap < base {
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
