//! Request types of the REST API as the client sends them (calls whose
//! server side reads optional fields as defaults, so the two are not one
//! type: a claim, an arrival, an acquire). Every answer, and the requests the
//! server reads as they are ([`TaskSpec`], [`WorkflowTaskSpec`],
//! [`ScheduleDef`]), come from the contract crate `muster-api`, which the
//! server compiles too, so the two cannot drift apart.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

pub use muster_api::{Acquired, GroupInfo, QueueStats, Renewed, TaskSpec};
pub use muster_api::{FailurePolicy, WorkflowTaskSpec};
pub use muster_api::{Overlap, ScheduleDef, TaskTemplate};

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

/// One item of a batch complete.
#[derive(Debug, Clone, Serialize)]
pub struct CompleteItem {
    pub id: String,
    pub token: u64,
    pub result: Value,
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

/// A barrier arrival: `node` arrives at a round and waits up to `wait_ms`.
#[derive(Debug, Clone, Serialize)]
pub struct Arrive {
    pub node: String,
    pub wait_ms: u64,
}

// The barrier answers are the server's own, from the contract crate.
pub use muster_api::barriers::{DoubleBarrier, Hold};

/// A participant's view of a barrier round, as the client reads it (owned;
/// the server borrows it from the round its waiters share).
pub type ArriveAnswer = muster_api::barriers::ArriveResponse<'static>;

/// One entrant of a DoubleBarrier, with its entry time (Redis ms).
pub type Entry = muster_api::barriers::Arrival;

/// A DoubleBarrier as one entrant sees it after an enter or leave.
pub type Entrant = muster_api::barriers::DoubleBarrierReply;

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
