//! The typed operations, one method per REST operation, in the order of
//! `docs/api.md`: tasks and queues, nodes, workflows, schedules, barriers,
//! locks and elections, events replay, system.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use super::types::{
    Acquire, Acquired, Arrive, ArriveAnswer, Campaign, ClaimRequest, Complete, CompleteItem, DoubleBarrier, Entrant,
    Fail, Hold, NewWorkflow, NodeHeartbeat, Renewed, ScheduleDef, TaskAck, TaskHeartbeat,
};
use super::{CallOptions, Client, Result, Retry, enc};
use muster_api::events::EventPage;
use muster_api::limits::{LimitInfo, LimitList, LimitSpec, QueueLimits};
use muster_api::nodes::{NodeHeartbeatAnswer, NodeInfo, NodeList};
use muster_api::tasks::{
    BatchItem, BatchResponse, BulkOutcome, Cancelled, ClaimResponse, ClaimedTask, CompleteBatchResponse,
    CompleteOutcome, FinishedNext, GroupInfo, GroupList, OrphanReport, QueueDetail, QueueList, QueueStats, StatsSeries,
    Submitted, TaskHeartbeatAnswer, TaskInfo, TaskPage, TaskSpec,
};
use muster_api::workflows::CreatedWorkflow;

fn idem() -> CallOptions {
    CallOptions::new(Retry::Idempotent)
}

fn once() -> CallOptions {
    CallOptions::new(Retry::Once)
}

/// The idempotency key of a create that was given none: a ULID (26
/// characters, within the keys' alphabet).
fn random_key() -> String {
    ulid::Ulid::generate().to_string()
}

/// A create that cannot carry an idempotency key: retried only if it never
/// left.
fn unkeyed() -> CallOptions {
    CallOptions::new(Retry::Connect)
}

/// A long poll's options: its wait is added to the request timeout.
fn polling(retry: Retry, wait_ms: u64) -> CallOptions {
    let mut o = CallOptions::new(retry);
    o.extra_timeout = Duration::from_millis(wait_ms);
    o
}

const NONE: Option<&Value> = None;

mod coordination;
mod flows;
mod system;

impl Client {
    // ---- tasks and queues -------------------------------------------------

    /// Submits a task. Without an idempotency key in `spec` a random one is
    /// sent (as the Python and TypeScript clients do), so the call is
    /// retried on any transient error, through another node too, and a retry
    /// returns the same task (`replayed`) instead of creating it twice.
    pub async fn submit(&self, queue: &str, spec: &TaskSpec) -> Result<Submitted> {
        let keyed;
        let spec = match spec.idempotency_key {
            Some(_) => spec,
            None => {
                keyed = TaskSpec {
                    idempotency_key: Some(random_key()),
                    ..spec.clone()
                };
                &keyed
            }
        };
        self.call_json(
            Method::POST,
            &format!("/api/v1/queues/{}/tasks", enc(queue)),
            Some(spec),
            &idem(),
        )
        .await
    }

    /// Submits a task with just a payload.
    pub async fn submit_payload(&self, queue: &str, payload: Value) -> Result<Submitted> {
        self.submit(
            queue,
            &TaskSpec {
                payload,
                ..Default::default()
            },
        )
        .await
    }

    /// Submits up to 1 000 tasks in one call; one result per task, in order.
    /// Tasks without an idempotency key get a random one, so the call is
    /// retried like a keyed submit.
    pub async fn submit_batch(&self, queue: &str, tasks: &[TaskSpec]) -> Result<Vec<BatchItem>> {
        let tasks: Vec<TaskSpec> = tasks
            .iter()
            .map(|t| TaskSpec {
                idempotency_key: Some(t.idempotency_key.clone().unwrap_or_else(random_key)),
                ..t.clone()
            })
            .collect();
        let a: BatchResponse = self
            .call_json(
                Method::POST,
                &format!("/api/v1/queues/{}/tasks/batch", enc(queue)),
                Some(&json!({ "tasks": tasks })),
                &idem(),
            )
            .await?;
        Ok(a.results)
    }

    /// Claims up to `req.max` tasks, waiting up to `req.wait_ms` (long poll).
    /// Empty when none came. Retried only when certainly not applied (a
    /// claim whose answer was lost holds its tasks until their timeout).
    pub async fn claim(&self, queue: &str, req: &ClaimRequest) -> Result<Vec<ClaimedTask>> {
        let a: Option<ClaimResponse> = self
            .call(
                Method::POST,
                &format!("/api/v1/queues/{}/claim", enc(queue)),
                Some(req),
                &polling(Retry::Once, req.wait_ms),
            )
            .await?;
        Ok(a.map(|a| a.tasks).unwrap_or_default())
    }

    /// Reports that the holder of `hb.token` still works on the task; tells
    /// whether a cancel was requested. 409 ([`Error::is_conflict`]): the
    /// token is stale, drop the work.
    pub async fn heartbeat_task(&self, id: &str, hb: &TaskHeartbeat) -> Result<TaskHeartbeatAnswer> {
        self.call_json(
            Method::POST,
            &format!("/api/v1/tasks/{}/heartbeat", enc(id)),
            Some(hb),
            &idem(),
        )
        .await
    }

    /// Acknowledges a claim (its lease ends; 409: the token is stale, the
    /// task went back to its queue or runs under a newer claim). A task
    /// heartbeat, a complete or a fail acknowledges too.
    pub async fn ack_task(&self, id: &str, token: u64) -> Result<TaskHeartbeatAnswer> {
        self.call_json(
            Method::POST,
            &format!("/api/v1/tasks/{}/ack", enc(id)),
            Some(&TaskAck { token }),
            &idem(),
        )
        .await
    }

    /// Completes a task with its fencing token (409: stale). With `next`
    /// the same call claims the worker's next task(s); then it is retried
    /// only when certainly not applied, since a lost answer would lose them.
    pub async fn complete(&self, id: &str, c: &Complete) -> Result<FinishedNext> {
        let opts = match &c.next {
            None => idem(),
            Some(n) => polling(Retry::Once, n.wait_ms.unwrap_or(0)),
        };
        self.call_json(
            Method::POST,
            &format!("/api/v1/tasks/{}/complete", enc(id)),
            Some(c),
            &opts,
        )
        .await
    }

    /// Completes several tasks in one call; one outcome per item.
    pub async fn complete_batch(&self, items: &[CompleteItem]) -> Result<Vec<CompleteOutcome>> {
        let a: CompleteBatchResponse = self
            .call_json(Method::POST, "/api/v1/tasks/complete", Some(items), &idem())
            .await?;
        Ok(a.results)
    }

    /// Fails a task with its fencing token: retried after a backoff while
    /// attempts are left and `retry` is set, else dead (cancelled when a
    /// cancel was requested). 409: stale.
    pub async fn fail(&self, id: &str, f: &Fail) -> Result<FinishedNext> {
        let opts = match &f.next {
            None => idem(),
            Some(n) => polling(Retry::Once, n.wait_ms.unwrap_or(0)),
        };
        self.call_json(Method::POST, &format!("/api/v1/tasks/{}/fail", enc(id)), Some(f), &opts)
            .await
    }

    /// Cancels a queued or delayed task, or asks a running one to stop.
    pub async fn cancel(&self, id: &str) -> Result<Cancelled> {
        self.call_json(
            Method::POST,
            &format!("/api/v1/tasks/{}/cancel", enc(id)),
            NONE,
            &idem(),
        )
        .await
    }

    /// Requeues a dead task with fresh attempts (admin).
    pub async fn retry_task(&self, id: &str) -> Result<()> {
        self.call::<Value, Value>(Method::POST, &format!("/api/v1/tasks/{}/retry", enc(id)), None, &once())
            .await
            .map(drop)
    }

    /// A task with its attempts.
    pub async fn task(&self, id: &str) -> Result<TaskInfo> {
        self.call_json(Method::GET, &format!("/api/v1/tasks/{}", enc(id)), NONE, &idem())
            .await
    }

    /// Discards a finished task (admin).
    pub async fn delete_task(&self, id: &str) -> Result<()> {
        self.call::<Value, Value>(Method::DELETE, &format!("/api/v1/tasks/{}", enc(id)), None, &idem())
            .await
            .map(drop)
    }

    /// The task holding an alias.
    pub async fn alias(&self, alias: &str) -> Result<TaskInfo> {
        self.call_json(Method::GET, &format!("/api/v1/aliases/{}", enc(alias)), NONE, &idem())
            .await
    }

    /// Counts of every queue.
    pub async fn queues(&self) -> Result<Vec<QueueStats>> {
        let l: QueueList = self.call_json(Method::GET, "/api/v1/queues", NONE, &idem()).await?;
        Ok(l.queues)
    }

    /// One queue's counts and groups.
    pub async fn queue(&self, queue: &str) -> Result<QueueDetail> {
        self.call_json(Method::GET, &format!("/api/v1/queues/{}", enc(queue)), NONE, &idem())
            .await
    }

    /// One page of a queue's tasks in `state`.
    pub async fn tasks(&self, queue: &str, state: &str, limit: usize, cursor: Option<&str>) -> Result<TaskPage> {
        let mut path = format!("/api/v1/queues/{}/tasks?state={}&limit={limit}", enc(queue), enc(state));
        if let Some(c) = cursor {
            path.push_str(&format!("&cursor={}", enc(c)));
        }
        self.call_json(Method::GET, &path, NONE, &idem()).await
    }

    /// Pauses a queue (admin).
    pub async fn pause_queue(&self, queue: &str) -> Result<()> {
        self.call::<Value, Value>(
            Method::POST,
            &format!("/api/v1/queues/{}/pause", enc(queue)),
            None,
            &idem(),
        )
        .await
        .map(drop)
    }

    /// Resumes a queue (admin).
    pub async fn resume_queue(&self, queue: &str) -> Result<()> {
        self.call::<Value, Value>(
            Method::POST,
            &format!("/api/v1/queues/{}/resume", enc(queue)),
            None,
            &idem(),
        )
        .await
        .map(drop)
    }

    /// The first page of the dead letters of every queue (the server's
    /// default page size), newest first.
    pub async fn dead(&self) -> Result<TaskPage> {
        self.call_json(Method::GET, "/api/v1/dead", NONE, &idem()).await
    }

    /// One page of the dead letters of every queue, newest first.
    pub async fn dead_page(&self, limit: usize, cursor: Option<&str>) -> Result<TaskPage> {
        let mut path = format!("/api/v1/dead?limit={limit}");
        if let Some(c) = cursor {
            path.push_str(&format!("&cursor={}", enc(c)));
        }
        self.call_json(Method::GET, &path, NONE, &idem()).await
    }

    /// Retries up to `limit` (all when None) of `queue`'s dead letters, or
    /// every queue's with `queue` = `"*"`, oldest first (admin). Retried on
    /// a lost answer: a second run retries only what is still dead.
    pub async fn retry_dead(&self, queue: &str, limit: Option<u64>) -> Result<BulkOutcome> {
        self.call_json(
            Method::POST,
            "/api/v1/dead/retry",
            Some(&json!({ "queue": queue, "limit": limit })),
            &idem(),
        )
        .await
    }

    /// Discards up to `limit` dead letters like [`Client::retry_dead`] (admin).
    pub async fn discard_dead(&self, queue: &str, limit: Option<u64>) -> Result<BulkOutcome> {
        self.call_json(
            Method::POST,
            "/api/v1/dead/discard",
            Some(&json!({ "queue": queue, "limit": limit })),
            &idem(),
        )
        .await
    }

    /// Concurrency groups.
    pub async fn groups(&self) -> Result<Vec<GroupInfo>> {
        let l: GroupList = self.call_json(Method::GET, "/api/v1/groups", NONE, &idem()).await?;
        Ok(l.groups)
    }

    /// Sets (Some) or removes (None) a group's limit (admin).
    pub async fn set_group_limit(&self, group: &str, limit: Option<u32>) -> Result<GroupInfo> {
        self.call_json(
            Method::PUT,
            &format!("/api/v1/groups/{}", enc(group)),
            Some(&json!({ "limit": limit })),
            &idem(),
        )
        .await
    }

    /// Every flow-control limit and template, with its use (G13).
    pub async fn limits(&self) -> Result<Vec<LimitInfo>> {
        let l: LimitList = self.call_json(Method::GET, "/api/v1/limits", NONE, &idem()).await?;
        Ok(l.limits)
    }

    /// A limit, template (`name:*`) or template key (`name:key`) and its use.
    pub async fn limit(&self, name: &str) -> Result<LimitInfo> {
        self.call_json(Method::GET, &format!("/api/v1/limits/{}", enc(name)), NONE, &idem())
            .await
    }

    /// Defines or changes a limit or a template `name:*` (admin).
    pub async fn set_limit(&self, name: &str, spec: &LimitSpec) -> Result<LimitInfo> {
        self.call_json(
            Method::PUT,
            &format!("/api/v1/limits/{}", enc(name)),
            Some(spec),
            &idem(),
        )
        .await
    }

    /// Removes a limit or template (admin).
    pub async fn delete_limit(&self, name: &str) -> Result<()> {
        self.call::<Value, Value>(Method::DELETE, &format!("/api/v1/limits/{}", enc(name)), None, &idem())
            .await
            .map(drop)
    }

    /// The limits that bind every task of `queue`.
    pub async fn queue_limits(&self, queue: &str) -> Result<QueueLimits> {
        self.call_json(
            Method::GET,
            &format!("/api/v1/queues/{}/limits", enc(queue)),
            NONE,
            &idem(),
        )
        .await
    }

    /// Sets the limits that bind every task of `queue` (admin); empty: none.
    pub async fn set_queue_limits(&self, queue: &str, limits: &[&str]) -> Result<QueueLimits> {
        let body = QueueLimits {
            limits: limits.iter().map(|l| l.to_string()).collect(),
        };
        self.call_json(
            Method::PUT,
            &format!("/api/v1/queues/{}/limits", enc(queue)),
            Some(&body),
            &idem(),
        )
        .await
    }

    /// Recovered tasks, suspect nodes and totals.
    pub async fn orphans(&self) -> Result<OrphanReport> {
        self.call_json(Method::GET, "/api/v1/orphans", NONE, &idem()).await
    }

    // ---- nodes ------------------------------------------------------------

    /// Registers a worker id or keeps it alive.
    pub async fn heartbeat_node(&self, id: &str, hb: &NodeHeartbeat) -> Result<NodeHeartbeatAnswer> {
        self.call_json(
            Method::PUT,
            &format!("/api/v1/nodes/{}/heartbeat", enc(id)),
            Some(hb),
            &idem(),
        )
        .await
    }

    /// Every node and worker.
    pub async fn nodes(&self) -> Result<Vec<NodeInfo>> {
        let l: NodeList = self.call_json(Method::GET, "/api/v1/nodes", NONE, &idem()).await?;
        Ok(l.nodes)
    }

    /// One node or worker.
    pub async fn node(&self, id: &str) -> Result<NodeInfo> {
        self.call_json(Method::GET, &format!("/api/v1/nodes/{}", enc(id)), NONE, &idem())
            .await
    }

    /// Drains a node: it gets no new work (admin).
    pub async fn drain_node(&self, id: &str) -> Result<()> {
        self.call::<Value, Value>(Method::POST, &format!("/api/v1/nodes/{}/drain", enc(id)), None, &idem())
            .await
            .map(drop)
    }

    /// A worker leaves (worker role): its registration goes at once, or
    /// once the orphan cleaner has recovered the tasks it still held.
    pub async fn leave_worker(&self, id: &str) -> Result<()> {
        self.call::<Value, Value>(Method::POST, &format!("/api/v1/nodes/{}/leave", enc(id)), None, &idem())
            .await
            .map(drop)
    }

    /// Removes a node from the registry (admin).
    pub async fn remove_node(&self, id: &str) -> Result<()> {
        self.call::<Value, Value>(Method::DELETE, &format!("/api/v1/nodes/{}", enc(id)), None, &idem())
            .await
            .map(drop)
    }

    // ---- barriers ---------------------------------------------------------

    /// Arrives at a barrier round and waits up to `a.wait_ms` for its
    /// verdict. Arriving again is harmless, so it is retried.
    pub async fn arrive(&self, barrier: &str, round: &str, a: &Arrive) -> Result<ArriveAnswer> {
        self.call_json(
            Method::POST,
            &format!("/api/v1/barriers/{}/rounds/{}/arrive", enc(barrier), enc(round)),
            Some(a),
            &polling(Retry::Idempotent, a.wait_ms),
        )
        .await
    }

    /// Configures a barrier (admin).
    pub async fn put_barrier(
        &self,
        name: &str,
        participants: &[String],
        max_missing: u32,
        timeout_ms: u64,
    ) -> Result<muster_api::barriers::BarrierConfigView> {
        self.call_json(
            Method::PUT,
            &format!("/api/v1/barriers/{}", enc(name)),
            Some(&json!({"participants": participants, "max_missing": max_missing, "timeout_ms": timeout_ms})),
            &idem(),
        )
        .await
    }

    /// A barrier's configuration (when it was configured) and hold.
    pub async fn barrier(&self, name: &str) -> Result<muster_api::barriers::BarrierDetail> {
        self.call_json(Method::GET, &format!("/api/v1/barriers/{}", enc(name)), NONE, &idem())
            .await
    }

    // ---- locks and elections ----------------------------------------------

    /// Acquires a lock, waiting in line up to `a.wait_ms`. A 409 `busy`
    /// ([`Error::problem`] carries `holder` and `position`) when not acquired.
    pub async fn acquire(&self, name: &str, a: &Acquire) -> Result<Acquired> {
        self.call_json(
            Method::POST,
            &format!("/api/v1/locks/{}/acquire", enc(name)),
            Some(a),
            &polling(Retry::Once, a.wait_ms),
        )
        .await
    }

    /// Renews a lease (409: stale or lapsed).
    pub async fn renew(&self, name: &str, token: u64, ttl_ms: Option<u64>) -> Result<Renewed> {
        let mut body = json!({ "token": token });
        if let Some(t) = ttl_ms {
            body["ttl_ms"] = json!(t);
        }
        self.call_json(
            Method::POST,
            &format!("/api/v1/locks/{}/renew", enc(name)),
            Some(&body),
            &idem(),
        )
        .await
    }

    /// Releases a lock (409: stale).
    pub async fn release(&self, name: &str, token: u64) -> Result<()> {
        self.call::<Value, Value>(
            Method::POST,
            &format!("/api/v1/locks/{}/release", enc(name)),
            Some(&json!({ "token": token })),
            &idem(),
        )
        .await
        .map(drop)
    }

    /// A lock's holder, token, lease and waiters.
    pub async fn lock(&self, name: &str) -> Result<muster_api::locks::LockInfo> {
        self.call_json(Method::GET, &format!("/api/v1/locks/{}", enc(name)), NONE, &idem())
            .await
    }

    /// Campaigns in an election (the leader campaigns again to renew).
    pub async fn campaign(&self, name: &str, c: &Campaign) -> Result<muster_api::locks::CampaignResponse> {
        self.call_json(
            Method::POST,
            &format!("/api/v1/elections/{}/campaign", enc(name)),
            Some(c),
            &polling(Retry::Once, c.wait_ms),
        )
        .await
    }

    /// Resigns leadership (409 unless `candidate` leads, at `epoch` when given).
    pub async fn resign(&self, name: &str, candidate: &str, epoch: Option<u64>) -> Result<()> {
        self.call::<Value, Value>(
            Method::POST,
            &format!("/api/v1/elections/{}/resign", enc(name)),
            Some(&json!({ "candidate": candidate, "epoch": epoch })),
            &idem(),
        )
        .await
        .map(drop)
    }

    // ---- events and system ------------------------------------------------

    /// One page of the event replay over plain HTTP.
    pub async fn events_page(&self, since: Option<&str>, limit: usize, topics: Option<&str>) -> Result<EventPage> {
        let mut path = format!("/api/v1/events?limit={limit}");
        if let Some(s) = since {
            path.push_str(&format!("&since={}", enc(s)));
        }
        if let Some(t) = topics {
            path.push_str(&format!("&topics={}", enc(t)));
        }
        self.call_json(Method::GET, &path, NONE, &idem()).await
    }

    /// The node's Prometheus text.
    pub async fn metrics(&self) -> Result<String> {
        let a = self.send(Method::GET, "/metrics", None, &idem()).await?;
        if a.status != 200 {
            return Err(super::Problem::from_body(a.status, &a.body).into());
        }
        Ok(String::from_utf8_lossy(&a.body).into_owned())
    }
}
