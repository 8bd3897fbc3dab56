//! The task types the service returns and the API serializes.

use super::{RawValue, Serialize, TaskError, ToSchema};

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
    /// The claim lease: acknowledge the task within this many ms of the
    /// claim (a task heartbeat, `POST /api/v1/tasks/{id}/ack`, or its
    /// complete or fail), or it goes back to the queue and this token is
    /// refused. 0: no lease.
    pub ack_ms: u64,
}

/// What a claim returned.
#[derive(Debug, Default)]
pub struct ClaimResult {
    pub tasks: Vec<Claimed>,
    /// When the earliest delayed task of the queue is due (Redis ms).
    pub next_due: Option<i64>,
    /// `max` tasks were claimed and more are ready: wake another waiter.
    pub more: bool,
    /// Split namespaces: shards of the queue whose claim did not run (their
    /// master failed, or this node cannot serve them now). Tasks there wait
    /// for a later claim, through this node or another.
    pub not_tried: Vec<usize>,
}

impl ClaimResult {
    /// Adds what a claim in another shard of the queue returned.
    pub(crate) fn absorb(&mut self, other: ClaimResult) {
        self.tasks.extend(other.tasks);
        self.next_due = match (self.next_due, other.next_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.more |= other.more;
        self.not_tried.extend(other.not_tried);
    }
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
    /// The next tasks' claim lease (ms); 0: none.
    pub ack_ms: u64,
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
    /// succeeded, failed, orphaned, timed_out, cancelled, or
    /// not_acknowledged: a claim its worker did not acknowledge within its
    /// `ack_ms`, put back in the queue; it does not count in `attempts`, so
    /// the next claim has the same attempt number (the latest 10 such
    /// claims are kept). Absent while running.
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
