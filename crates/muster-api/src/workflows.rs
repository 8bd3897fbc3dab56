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
