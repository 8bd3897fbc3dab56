//! Task options as the API takes them, and their validation.

use super::{Deserialize, MAX_DELAY_MS, MAX_RUN_AT, NewTask, Serialize, TasksConfig, ToSchema};
use crate::problem::Invalid;

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
    pub fn validate(&self, cfg: &TasksConfig) -> Result<NewTask, Invalid> {
        let payload = serde_json::to_string(&self.payload).map_err(|e| Invalid::new(e.to_string()))?;
        if payload.len() > cfg.max_payload_bytes {
            return Err(Invalid::TooLarge(format!(
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
            return Err(Invalid::new("give `delay_ms` or `run_at`, not both"));
        }
        if self.delay_ms.is_some_and(|d| d > MAX_DELAY_MS) {
            return Err(Invalid::new("`delay_ms` must be at most one year"));
        }
        // The one-year bound is checked by the enqueue script against Redis
        // time (G11); this only keeps out values no clock can be near.
        if self.run_at.is_some_and(|r| !(0..=MAX_RUN_AT).contains(&r)) {
            return Err(Invalid::new(
                "`run_at` is milliseconds since the Unix epoch (Redis time), at most one year ahead",
            ));
        }
        let max_attempts = self.max_attempts.unwrap_or(cfg.max_attempts);
        crate::validate::in_range("max_attempts", max_attempts, &crate::validate::MAX_ATTEMPTS)?;
        let timeout_ms = self.timeout_ms.unwrap_or(0);
        if timeout_ms > crate::validate::TASK_TIMEOUT_MAX_MS {
            return Err(Invalid::new("`timeout_ms` must be at most 7 days"));
        }
        let base = self.backoff_base_ms.unwrap_or(cfg.backoff_base_ms);
        let cap = self.backoff_cap_ms.unwrap_or(cfg.backoff_cap_ms.max(base));
        let most = crate::validate::BACKOFF_MAX_MS;
        if base > most || cap > most || cap < base {
            return Err(Invalid::new(
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
