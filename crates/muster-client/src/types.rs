//! Request and response types of the REST API as the client sends and reads
//! them. The requests the server reads ([`TaskSpec`], [`WorkflowTaskSpec`],
//! [`ScheduleDef`]) come from the contract crate `muster-api`, which the
//! server compiles too, so the two cannot drift apart. Answers the client does not need
//! to look inside (lists of schedules, workflows, rounds) are returned as
//! JSON values.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use muster_api::{Acquired, GroupInfo, QueueStats, Renewed, TaskSpec};
pub use muster_api::{FailurePolicy, WorkflowTaskSpec};
pub use muster_api::{Overlap, ScheduleDef, TaskTemplate};

/// The answer to a submit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submitted {
    pub id: String,
    /// The task's queue (on a replay, the original task's).
    pub queue: String,
    /// `queued` or `delayed` (or the original task's state on a replay).
    pub state: String,
    /// True when the idempotency key returned an existing task.
    pub replayed: bool,
}

/// One item of a batch submit's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchItem {
    /// `created`, `replayed` or `error`.
    pub status: String,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub state: Option<String>,
    /// The HTTP status this item would have had on its own, for errors.
    #[serde(default)]
    pub code: Option<u16>,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct BatchAnswer {
    pub results: Vec<BatchItem>,
}

/// A claimed task as a worker receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimedTask {
    pub id: String,
    pub queue: String,
    /// The fencing token: heartbeat, complete and fail need it.
    pub token: u64,
    /// 1 for the first execution.
    pub attempt: u32,
    pub payload: Value,
    pub max_attempts: u32,
    /// 0: no timeout.
    pub timeout_ms: u64,
    #[serde(default)]
    pub group: Option<String>,
    pub priority: i32,
    /// Redis ms.
    pub created_at: i64,
    /// The claim lease (ms): acknowledge the task within it
    /// ([`crate::Client::ack_task`], a task heartbeat, or its
    /// complete or fail), or it goes back to the queue and the token is
    /// refused. 0: no lease (or a server without claim leases).
    #[serde(default)]
    pub ack_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ClaimAnswer {
    pub tasks: Vec<ClaimedTask>,
}

/// A claim: up to `max` tasks for worker `node`, waiting up to `wait_ms`.
#[derive(Debug, Clone, Serialize)]
pub struct ClaimRequest {
    /// The worker id; it must be registered ([`crate::Client::heartbeat_node`]).
    pub node: String,
    /// 1 to 1000.
    pub max: u32,
    /// Long poll, 0 to 30 000 ms.
    pub wait_ms: u64,
    /// The claim lease, 1 000 to 600 000 ms; None: the server's
    /// `claim.ack_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack_ms: Option<u64>,
}

/// A claim's acknowledgement.
#[derive(Debug, Clone, Serialize)]
pub struct TaskAck {
    pub token: u64,
}

/// A task heartbeat.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TaskHeartbeat {
    pub token: u64,
    /// 0 to 100.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<u8>,
    /// A small JSON object (at most 4 KiB), replacing the previous one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Value>,
}

/// The answer to a task heartbeat.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TaskHeartbeatAnswer {
    pub state: String,
    /// The task was asked to stop: finish it with `fail` and it is cancelled.
    pub cancel_requested: bool,
}

/// Claim the next task(s) in the same call as a complete or fail.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NextRequest {
    /// 1 to 1000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    /// Default: the finished task's queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// 0 to 30 000 ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// The next tasks' claim lease, 1 000 to 600 000 ms; None: the
    /// server's `claim.ack_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack_ms: Option<u64>,
}

/// A complete.
#[derive(Debug, Clone, Serialize)]
pub struct Complete {
    pub token: u64,
    pub result: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<NextRequest>,
}

/// A fail.
#[derive(Debug, Clone, Serialize)]
pub struct Fail {
    pub token: u64,
    pub error: String,
    /// False: dead (or cancelled, when a cancel was requested) at once.
    pub retry: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<NextRequest>,
}

/// What a complete or fail claimed next.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct NextTasks {
    pub tasks: Vec<ClaimedTask>,
    /// Why nothing was claimed (not registered, draining, the node refuses work).
    #[serde(default)]
    pub refused: Option<String>,
    /// Split namespaces: shards of the queue whose claim did not run (their
    /// Redis master failed or stalls); the tasks above are the worker's.
    #[serde(default)]
    pub shards_not_tried: Vec<usize>,
}

/// The outcome of a complete or fail.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Finished {
    pub id: String,
    /// The task's state after the call.
    pub state: String,
    pub attempt: u32,
    /// When a retry is due (Redis ms).
    #[serde(default)]
    pub retry_at: Option<i64>,
    #[serde(default)]
    pub next: Option<NextTasks>,
}

/// One item of a batch complete.
#[derive(Debug, Clone, Serialize)]
pub struct CompleteItem {
    pub id: String,
    pub token: u64,
    pub result: Value,
}

/// One outcome of a batch complete.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CompleteOutcome {
    pub id: String,
    /// `completed`, `conflict` (a stale token), `not_found`, `invalid`, or
    /// `unknown` (the task's shard did not answer: send it again; one that
    /// did complete then answers `conflict` with state `succeeded`).
    pub status: String,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct CompleteBatchAnswer {
    pub results: Vec<CompleteOutcome>,
}

/// The answer to a cancel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancelled {
    /// `cancelled`, or `running` when the worker was asked to stop.
    pub state: String,
    pub cancel_requested: bool,
}

/// One execution of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub attempt: u32,
    pub node: String,
    pub token: u64,
    pub claimed_at: i64,
    #[serde(default)]
    pub ended_at: Option<i64>,
    /// `succeeded`, `failed`, `orphaned`, `timed_out`, `cancelled`, or
    /// `not_acknowledged` (a claim not acknowledged within its lease: put
    /// back in the queue, not counted in `attempts`); absent while running.
    #[serde(default)]
    pub outcome: Option<String>,
}

/// A task as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInfo {
    pub id: String,
    pub queue: String,
    /// `queued`, `delayed`, `running`, `succeeded`, `dead`, `cancelled`.
    pub state: String,
    pub payload: Value,
    #[serde(default)]
    pub group: Option<String>,
    pub priority: i32,
    pub max_attempts: u32,
    pub attempts: u32,
    pub timeout_ms: u64,
    #[serde(default)]
    pub alias: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub token: Option<u64>,
    pub created_at: i64,
    #[serde(default)]
    pub run_at: Option<i64>,
    #[serde(default)]
    pub started_at: Option<i64>,
    #[serde(default)]
    pub finished_at: Option<i64>,
    pub updated_at: i64,
    pub progress: u8,
    #[serde(default)]
    pub fields: Option<Value>,
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub error: Option<String>,
    pub cancel_requested: bool,
    #[serde(default)]
    pub submitted_by: Option<String>,
    #[serde(default)]
    pub attempt_log: Vec<Attempt>,
}

impl TaskInfo {
    /// Succeeded, dead or cancelled: nothing will change it any more.
    pub fn is_terminal(&self) -> bool {
        matches!(self.state.as_str(), "succeeded" | "dead" | "cancelled")
    }
}

/// One page of a queue's tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskPage {
    pub tasks: Vec<TaskInfo>,
    #[serde(default)]
    pub next_cursor: Option<String>,
    pub total: u64,
}

/// The outcome history of `GET /api/v1/stats`, column by column, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct StatsSeries {
    /// `hour` or `month`.
    pub range: String,
    /// Seconds per point: 60 or 86400.
    pub step_s: u64,
    /// The queue, absent for all queues.
    #[serde(default)]
    pub queue: Option<String>,
    /// The start of each point, Unix seconds.
    pub t: Vec<i64>,
    pub succeeded: Vec<u64>,
    /// Failed attempts.
    pub failed: Vec<u64>,
    pub dead: Vec<u64>,
    /// The largest queued count sampled in each step.
    pub queued: Vec<u64>,
    /// The largest queue latency sampled in each step, ms.
    pub latency_ms: Vec<u64>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct QueueList {
    pub queues: Vec<QueueStats>,
}

/// One queue with its groups.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QueueDetail {
    #[serde(flatten)]
    pub stats: QueueStats,
    #[serde(default)]
    pub groups: Vec<GroupInfo>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct GroupList {
    pub groups: Vec<GroupInfo>,
}

/// A worker's registration heartbeat.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NodeHeartbeat {
    /// 500 to 3 600 000 ms; default the cluster's `nodes.ttl_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub addr: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
}

/// The answer to a registration heartbeat.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct NodeHeartbeatAnswer {
    /// True when this heartbeat (re)joined the cluster.
    pub joined: bool,
    /// Redis time, ms.
    pub now: i64,
    pub expires_at: i64,
    /// `alive` or `draining`.
    pub state: String,
    /// Split namespaces: shards where this heartbeat could not be applied
    /// (their Redis master failed or stalls; see `docs/sharding.md`).
    #[serde(default)]
    pub unavailable_shards: Vec<usize>,
}

/// A node or worker in the registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: String,
    /// `node` or `worker`.
    pub kind: String,
    /// `alive`, `draining`, `late`, `dead`, `left`: the worst over the
    /// shards of a split namespace.
    pub state: String,
    /// Split namespaces: the shards where it is not alive.
    #[serde(default)]
    pub shards_not_alive: Vec<usize>,
    #[serde(default)]
    pub addr: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub heartbeat_age_ms: Option<i64>,
    #[serde(default)]
    pub ttl_ms: Option<i64>,
    /// The remaining fields as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct NodeList {
    pub nodes: Vec<NodeInfo>,
}

/// A workflow to start: a DAG of tasks.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NewWorkflow {
    /// 1 to 500 tasks.
    pub tasks: Vec<WorkflowTaskSpec>,
    /// Same key within `tasks.idempotency_window_ms`: the same workflow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    pub failure_policy: FailurePolicy,
}

/// The answer to a workflow start.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CreatedWorkflow {
    pub id: String,
    pub replayed: bool,
}

/// A barrier arrival: `node` arrives at a round and waits up to `wait_ms`.
#[derive(Debug, Clone, Serialize)]
pub struct Arrive {
    pub node: String,
    pub wait_ms: u64,
}

/// A participant's view of a barrier round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArriveAnswer {
    /// `released`, `aborted` or `pending`.
    pub verdict: String,
    /// This node arrived before a `released` verdict.
    pub may_run: bool,
    /// The round was decided before this node arrived.
    pub late: bool,
    #[serde(default)]
    pub arrived: Vec<String>,
    #[serde(default)]
    pub missing: Vec<String>,
    /// The remaining fields (barrier, round, deadline, ...) as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An etcd-style barrier's hold.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Hold {
    pub barrier: String,
    pub held: bool,
    #[serde(default)]
    pub holder: Option<String>,
    /// Redis ms.
    #[serde(default)]
    pub held_at: Option<i64>,
    /// Redis ms when the hold lifts itself.
    #[serde(default)]
    pub expires_at: Option<i64>,
}

/// One entrant of a DoubleBarrier, with its entry time (Redis ms).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Entry {
    pub node: String,
    pub at: i64,
}

/// A DoubleBarrier's state.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DoubleBarrier {
    pub name: String,
    /// Entrants that make it ready; 0 when nobody is in.
    pub count: u32,
    pub entrants: Vec<Entry>,
    pub ready: bool,
    #[serde(default)]
    pub ready_at: Option<i64>,
    /// The ready cycle.
    #[serde(default)]
    pub cycle: Option<String>,
}

/// A DoubleBarrier as one entrant sees it after an enter or leave.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Entrant {
    #[serde(flatten)]
    pub state: DoubleBarrier,
    pub node: String,
    /// Whether `node` is among the entrants.
    pub inside: bool,
    /// enter: ready with `node` inside. leave: every entrant of the cycle left.
    pub done: bool,
}

/// What a bulk retry or discard of dead letters did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BulkOutcome {
    pub done: u64,
    /// Dead tasks left in the set acted on.
    pub left: u64,
    /// Left dead: their queue could not be registered again.
    pub refused: u64,
    /// Script calls it took.
    pub pages: u64,
}

/// A lock acquire.
#[derive(Debug, Clone, Serialize)]
pub struct Acquire {
    pub owner: String,
    pub ttl_ms: u64,
    /// Wait in line this long (0: try once).
    pub wait_ms: u64,
    /// Tie the lease to this node's liveness too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// An election campaign.
#[derive(Debug, Clone, Serialize)]
pub struct Campaign {
    pub candidate: String,
    pub ttl_ms: u64,
    pub wait_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
}

/// One event of the cluster stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The stream id, `<ms>-<seq>`: pass it as `since` to resume after it.
    pub id: String,
    /// `task.succeeded`, `node.dead`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// Redis time, ms.
    pub ts: i64,
    /// The acting node or worker.
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub data: Value,
    /// The subject ids (`task`, `queue`, `group`, `workflow`, ...).
    #[serde(flatten)]
    pub subjects: BTreeMap<String, Value>,
}

impl Event {
    /// A subject id (`task`, `queue`, ...).
    pub fn subject(&self, name: &str) -> Option<&str> {
        self.subjects.get(name).and_then(Value::as_str)
    }
}

/// One page of the event replay over plain HTTP.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EventPage {
    pub events: Vec<Event>,
    /// Pass as `since` to continue.
    #[serde(default)]
    pub next: Option<String>,
    /// Events after `since` were already trimmed.
    #[serde(default)]
    pub gap: bool,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}
