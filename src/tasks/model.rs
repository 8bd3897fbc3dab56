//! The task types the service works with; the ones the API serializes are
//! the contract's (`muster_api::tasks`), with JSON kept as stored.

use super::{RawValue, TaskError};

pub(crate) use muster_api::tasks::{Attempt, Finished};

/// A claimed task as the worker receives it, its payload as stored.
pub(crate) type Claimed = muster_api::tasks::ClaimedTask<Box<RawValue>>;
/// A task as stored, its JSON fields as stored.
pub(crate) type Task = muster_api::tasks::TaskInfo<Box<RawValue>>;
/// One page of a listing.
pub(crate) type TaskPage = muster_api::tasks::TaskPage<Box<RawValue>>;

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
    /// Its own flow-control limits (validated; empty: none).
    pub limits: Vec<String>,
    /// Its debounce key and window (ms), if any (validated).
    pub debounce: Option<(String, u64)>,
    /// Its W3C trace context (validated; empty: none).
    pub traceparent: String,
    pub tracestate: String,
}

/// The outcome of submitting one task.
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted {
    Created {
        id: String,
        state: String,
        /// The task it replaced (debounce).
        replaced: Option<String>,
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
    /// A limit it names is not defined.
    UnknownLimit {
        name: String,
    },
    /// A template key it names is new, and `tasks.max_limit_keys` keys are
    /// in use.
    TooManyLimitKeys {
        name: String,
    },
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
