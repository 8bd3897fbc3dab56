//! Tasks on the wire.

use serde::{Deserialize, Serialize};

/// Task options as the API takes them (shared by single and batch submit,
/// and by workflows and schedules, which submit tasks too).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Any JSON value, at most `tasks.max_payload_bytes` serialized.
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
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
    /// Flow-control limits of its own (1 to 8, each defined: a limit, or a
    /// key `name:key` of a template `name:*`), on top of its queue's: it
    /// starts only when every one has room (G13). Not with `group`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Vec<String>>,
    /// Keep only the newest task per key in the queue: this task waits `ms`
    /// (it is delayed), and a later submit with the same key within that
    /// time replaces it (the replaced task ends cancelled, and the answer
    /// names it in `replaced`), so the last one runs `ms` after the last
    /// submit. Not with `delay_ms` or `run_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<Debounce>,
    /// The W3C `traceparent` of the trace the task belongs to
    /// (`00-<32 hex>-<16 hex>-<2 hex>`, 55 characters); on a single submit
    /// the `traceparent` header does the same (this field wins). Stored with
    /// the task, kept by its retries, and handed to every claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The W3C `tracestate` beside it, at most 512 printable ASCII
    /// characters; only with `traceparent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

/// A debounce: the key (`[A-Za-z0-9._-]{1,128}`, per queue) and the window.
/// Checked as it is read: a bad one makes the whole request malformed (in
/// a batch too), like a field of the wrong type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, try_from = "DebounceWire")]
pub struct Debounce {
    pub key: String,
    /// 1 to 86 400 000 (one day).
    pub ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DebounceWire {
    key: String,
    ms: u64,
}

impl TryFrom<DebounceWire> for Debounce {
    type Error = String;
    fn try_from(w: DebounceWire) -> Result<Self, String> {
        if !crate::names::is_name(&w.key) {
            return Err(format!(
                "`debounce.key` must be 1 to {} characters of [A-Za-z0-9._-], not only dots",
                crate::bounds::NAME_MAX_LEN
            ));
        }
        if !crate::bounds::DEBOUNCE_MS.contains(&w.ms) {
            return Err(format!(
                "`debounce.ms` must be {} to {} (one day)",
                crate::bounds::DEBOUNCE_MS.start(),
                crate::bounds::DEBOUNCE_MS.end()
            ));
        }
        Ok(Debounce { key: w.key, ms: w.ms })
    }
}

/// Counts of one queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueStats {
    pub name: String,
    pub queued: u64,
    pub delayed: u64,
    pub running: u64,
    pub dead: u64,
    pub succeeded: u64,
    pub cancelled: u64,
    pub paused: bool,
    /// `active`, `paused`, or on a split namespace while a pause or resume
    /// has not reached every shard yet (a master failed), `pausing` or
    /// `resuming`: some shards still hand out (or still hold back) the
    /// queue's grouped tasks until the janitors converge them.
    #[serde(default)]
    pub pause_state: String,
    /// Tasks that reached a terminal state in the last minute.
    pub finished_last_minute: u64,
    /// Queue latency: how long the longest-waiting task at the head of a
    /// line (the ready set, each group's line) has been claimable, in Redis
    /// ms; 0 with nothing queued.
    #[serde(default)]
    pub latency_ms: u64,
}

/// A group with its limit and the slots in use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupInfo {
    pub name: String,
    /// None: unlimited.
    #[serde(default)]
    pub limit: Option<u32>,
    pub running: u64,
    /// Queued tasks of the group, in the queue asked about.
    #[serde(default)]
    pub queued: u64,
}

// ---- answers ---------------------------------------------------------------
//
// The answers that carry caller JSON (a payload, a result, runtime fields)
// take its type as a parameter `J`: the client reads it as a
// `serde_json::Value` (the default), the server writes the text it stored
// as it is (`Box<RawValue>`), so a result keeps its bytes on the wire and a
// claim never parses a payload. Both are the same JSON, and the schema is
// written once for any `J`.

/// The answer to a submit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = SubmitResponse))]
pub struct Submitted {
    pub id: String,
    pub queue: String,
    /// queued or delayed (or the original task's state on a replay).
    pub state: String,
    /// True when an idempotency key returned an existing task.
    pub replayed: bool,
    /// The task this submit replaced (`debounce`): it ended cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<String>,
}

/// One item's outcome in a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchItem {
    /// created, replayed or error.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// For errors: the HTTP status this item would have had.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The task this item replaced (`debounce`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<String>,
}

// The answer to a batch submit. (Plain comments where the server's
// document has no description: a doc comment would add one.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchResponse {
    /// One entry per submitted task, in order.
    pub results: Vec<BatchItem>,
}

/// A claimed task as the worker receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Claimed, bound = ""))]
pub struct ClaimedTask<J = serde_json::Value> {
    pub id: String,
    pub queue: String,
    /// The fencing token: send it with heartbeat, complete and fail.
    pub token: u64,
    /// 1 for the first execution.
    pub attempt: u32,
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub payload: J,
    pub max_attempts: u32,
    /// 0: no timeout.
    pub timeout_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub priority: i32,
    /// Redis ms.
    pub created_at: i64,
    /// The claim lease: acknowledge the task within this many ms of the
    /// claim (a task heartbeat, `POST /api/v1/tasks/{id}/ack`, or its
    /// complete or fail), or it goes back to the queue and this token is
    /// refused. 0: no lease.
    pub ack_ms: u64,
    /// The task's W3C trace context, as submitted (or as the node's submit
    /// span made it, with tracing on): a worker starts its attempt's span as
    /// a child of it. Absent when the submit had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

// The answer to a claim that got tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = ClaimResponse, bound = ""))]
pub struct ClaimResponse<J = serde_json::Value> {
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<ClaimedTask>))]
    pub tasks: Vec<ClaimedTask<J>>,
    /// Split namespaces: shards of the queue whose claim did not run (their
    /// master failed or stalls, or this node cannot serve them now). Tasks
    /// there wait for a later claim; the tasks above are yours either way.
    /// Absent when every shard was tried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards_not_tried: Vec<usize>,
}

// The answer to a task heartbeat or ack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = HeartbeatResponse))]
pub struct TaskHeartbeatAnswer {
    pub state: String,
    /// The task was asked to stop: finish with `fail` and it is cancelled.
    pub cancel_requested: bool,
}

/// The task(s) claimed next by a complete or fail that asked for them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = NextTasks, bound = ""))]
pub struct NextTasks<J = serde_json::Value> {
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<ClaimedTask>))]
    pub tasks: Vec<ClaimedTask<J>>,
    /// Why nothing was claimed although tasks may be waiting: the worker is
    /// not registered or is draining, or this node refuses work now (it is
    /// draining, stopping, or cannot heartbeat); absent when the claim ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Split namespaces: shards of the queue whose claim did not run (their
    /// master failed or stalls); absent when every shard was tried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards_not_tried: Vec<usize>,
}

/// The outcome of a complete, fail or heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Finished {
    pub id: String,
    /// The task's state after the call.
    pub state: String,
    pub attempt: u32,
    /// When a retry is due (Redis ms), after a fail with attempts left.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<i64>,
}

/// The outcome of a complete or fail, with the next task(s) when asked for.
// It reads as its `Finished` too (`f.state`), through `Deref`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = FinishedNext, bound = ""))]
pub struct FinishedNext<J = serde_json::Value> {
    #[serde(flatten)]
    pub finished: Finished,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<NextTasks>))]
    pub next: Option<NextTasks<J>>,
}

impl<J> std::ops::Deref for FinishedNext<J> {
    type Target = Finished;

    fn deref(&self) -> &Finished {
        &self.finished
    }
}

// One outcome of a batch complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CompleteOutcome {
    pub id: String,
    /// completed, conflict (stale token), not_found, invalid, or unknown:
    /// the task's shard did not answer (its master failed or stalls, on a
    /// split namespace), so whether it completed is not known. Send the
    /// unknown items again: a completion that did apply answers `conflict`
    /// with state `succeeded`.
    pub status: String,
    /// The task's state after the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

// The answer to a batch complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CompleteBatchResponse {
    pub results: Vec<CompleteOutcome>,
}

// The answer to a cancel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = CancelResponse))]
pub struct Cancelled {
    /// cancelled, or running when the worker was asked to stop.
    pub state: String,
    pub cancel_requested: bool,
}

/// One execution of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Attempt {
    pub attempt: u32,
    pub node: String,
    pub token: u64,
    pub claimed_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<i64>,
    /// succeeded, failed, orphaned, timed_out, cancelled, or
    /// not_acknowledged: a claim its worker did not acknowledge within its
    /// `ack_ms`, put back in the queue; it does not count in `attempts`, so
    /// the next claim has the same attempt number (the latest 10 such
    /// claims are kept). Absent while running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// A task as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Task, bound = ""))]
pub struct TaskInfo<J = serde_json::Value> {
    pub id: String,
    pub queue: String,
    pub state: String,
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub payload: J,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Its own flow-control limits (G13), as submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Vec<String>>,
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
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<J>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<serde_json::Value>))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<J>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub cancel_requested: bool,
    /// The node that submitted it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    pub attempt_log: Vec<Attempt>,
    /// Its W3C trace context, as its claims hand it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl<J> TaskInfo<J> {
    /// Succeeded, dead or cancelled: nothing will change it any more.
    pub fn is_terminal(&self) -> bool {
        matches!(self.state.as_str(), "succeeded" | "dead" | "cancelled")
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = TaskPage, bound = ""))]
pub struct TaskPage<J = serde_json::Value> {
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<TaskInfo>))]
    pub tasks: Vec<TaskInfo<J>>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Tasks in this state in total.
    pub total: u64,
}

// Every queue with its counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueList {
    pub queues: Vec<QueueStats>,
}

// One queue's counts and its groups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueDetail {
    #[serde(flatten)]
    pub stats: QueueStats,
    /// Groups with queued tasks here or a configured limit.
    pub groups: Vec<GroupInfo>,
}

// Groups with a configured limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupList {
    pub groups: Vec<GroupInfo>,
}

/// What a bulk action did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BulkOutcome {
    /// Tasks retried (queued again with a fresh set of attempts) or discarded.
    pub done: u64,
    /// Dead tasks left in the set acted on (of the queue, or of all queues).
    pub left: u64,
    /// Tasks left dead because their queue was forgotten and could not be
    /// registered again (the cluster has `tasks.max_queues` queues).
    pub refused: u64,
    /// Script calls (pages of at most 500 tasks) it took.
    pub pages: u64,
}

/// One recovered task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OrphanRecord {
    pub task: String,
    pub queue: String,
    /// The owner that stopped heartbeating.
    pub owner: String,
    /// The attempt that was lost.
    pub attempt: u32,
    /// Redis ms.
    pub detected_at: i64,
    /// requeued, dead or cancelled.
    pub action: String,
    #[serde(default)]
    pub reason: String,
}

// Recovered tasks, suspect nodes and totals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OrphanReport {
    /// Recent recoveries, newest first.
    pub recovered: Vec<OrphanRecord>,
    /// Totals per action since the namespace began (requeued, dead, cancelled).
    pub counts: std::collections::BTreeMap<String, u64>,
    /// Nodes whose heartbeat is overdue (suspect), expired but not yet marked
    /// dead (late), or dead with tasks still to recover.
    pub suspects: Vec<crate::nodes::NodeInfo>,
}

/// The span a chart covers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Range {
    /// The last 60 minutes, one point per minute (the last one still filling).
    #[default]
    Hour,
    /// The last 30 days (UTC), one point per day (the last one still filling).
    Month,
}

/// A chart's data, column by column (the layout uPlot draws).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Series))]
pub struct StatsSeries {
    pub range: Range,
    /// Seconds per point: 60 (hour) or 86400 (month).
    pub step_s: u64,
    /// The queue these numbers are for; absent for all queues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// The start of each point, Unix seconds (Redis time), oldest first.
    pub t: Vec<i64>,
    /// Tasks that succeeded in each step.
    pub succeeded: Vec<u64>,
    /// Failed attempts in each step (a task retried three times counts three).
    pub failed: Vec<u64>,
    /// Tasks that became dead letters in each step.
    pub dead: Vec<u64>,
    /// The largest number of queued tasks sampled in each step (0: none
    /// sampled, or the queue was empty).
    pub queued: Vec<u64>,
    /// The largest queue latency sampled in each step, ms.
    pub latency_ms: Vec<u64>,
}
