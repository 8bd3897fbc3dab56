//! Workflows on the wire.

use serde::{Deserialize, Serialize};

/// One task of a workflow, as submitted.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WorkflowTaskSpec {
    /// Unique in the workflow, `[A-Za-z0-9._-]{1,128}`.
    pub key: String,
    pub queue: String,
    /// Keys that must succeed before this task is queued.
    #[serde(default)]
    pub depends_on: Vec<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    #[serde(default)]
    pub payload: serde_json::Value,
    pub group: Option<String>,
    pub priority: Option<i32>,
    /// Queued this long after its dependencies succeeded.
    pub delay_ms: Option<u64>,
    pub max_attempts: Option<u32>,
    pub timeout_ms: Option<u64>,
    pub backoff_base_ms: Option<u64>,
    pub backoff_cap_ms: Option<u64>,
    /// Flow-control limits of this step's task (G13), 1 to 8 defined names;
    /// not with `group`. On a split namespace a workflow with limits lives
    /// in shard 0, where they are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<String>,
}

/// What to do when a task of the workflow ends dead or cancelled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Cancel everything not yet started; the workflow fails.
    #[default]
    FailFast,
    /// Skip what depends on the failed task; independent branches go on. The
    /// workflow fails at the end.
    Continue,
}

impl FailurePolicy {
    /// The name as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::FailFast => "fail_fast",
            FailurePolicy::Continue => "continue",
        }
    }
}

/// A key's place in a workflow, with its task's live state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowNode {
    pub key: String,
    pub task_id: String,
    pub queue: String,
    pub depends_on: Vec<String>,
    /// pending, queued (dispatched), succeeded, dead, cancelled or skipped.
    pub state: String,
    /// The task's own state once dispatched (queued, running, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_state: Option<String>,
}

// A workflow with each task's state (no doc comment: the OpenAPI document
// has no description for it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Workflow {
    pub id: String,
    /// running, succeeded, failed or cancelled.
    pub state: String,
    pub failure_policy: String,
    pub created_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    /// Keys not yet in a terminal state.
    pub open: i64,
    pub tasks: Vec<WorkflowNode>,
}

impl Workflow {
    /// The node of `key`, if the workflow has it.
    pub fn node(&self, key: &str) -> Option<&WorkflowNode> {
        self.tasks.iter().find(|t| t.key == key)
    }
}

// One workflow of a list (no doc comment: the OpenAPI document has no
// description for it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowSummary {
    pub id: String,
    pub state: String,
    pub created_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    /// Number of tasks.
    pub tasks: i64,
    pub open: i64,
}

// A page of workflows, newest first (no doc comment: the OpenAPI document
// has no description for it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowList {
    pub workflows: Vec<WorkflowSummary>,
    // Where the next page starts; absent after the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<usize>,
}

// The answer to a workflow start (no doc comment: the document's schema has
// no description).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedWorkflow {
    pub id: String,
    /// True when the idempotency key returned an existing workflow.
    pub replayed: bool,
}
