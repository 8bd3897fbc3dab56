//! Task options as the API takes them, and their validation.

use super::{MAX_DELAY_MS, MAX_RUN_AT, NewTask, TaskSpec, TasksConfig};
use crate::problem::Invalid;

/// Validates a task's options and fills the defaults.
pub(crate) fn check(spec: &TaskSpec, cfg: &TasksConfig) -> Result<NewTask, Invalid> {
    let payload = serde_json::to_string(&spec.payload).map_err(|e| Invalid::new(e.to_string()))?;
    if payload.len() > cfg.max_payload_bytes {
        return Err(Invalid::TooLarge(format!(
            "the payload is {} bytes; the limit is {} (tasks.max_payload_bytes)",
            payload.len(),
            cfg.max_payload_bytes
        )));
    }
    if let Some(g) = &spec.group {
        crate::validate::name("group", g)?;
    }
    let limits = spec.limits.clone().unwrap_or_default();
    if spec.limits.is_some() {
        crate::validate::limit_list("limits", &limits, 1)?;
        if spec.group.is_some() {
            return Err(Invalid::new(
                "give `group` or `limits`, not both: a limit with `concurrency` bounds tasks as a group does",
            ));
        }
    }
    if let Some(a) = &spec.alias {
        crate::validate::name("alias", a)?;
    }
    if let Some(k) = &spec.idempotency_key {
        crate::validate::opaque_key("idempotency_key", k)?;
    }
    let priority = spec.priority.unwrap_or(0);
    crate::validate::in_range("priority", priority, &crate::validate::PRIORITY)?;
    if spec.delay_ms.is_some() && spec.run_at.is_some() {
        return Err(Invalid::new("give `delay_ms` or `run_at`, not both"));
    }
    if spec.delay_ms.is_some_and(|d| d > MAX_DELAY_MS) {
        return Err(Invalid::new("`delay_ms` must be at most one year"));
    }
    // The one-year bound is checked by the enqueue script against Redis
    // time (G11); this only keeps out values no clock can be near.
    if spec.run_at.is_some_and(|r| !(0..=MAX_RUN_AT).contains(&r)) {
        return Err(Invalid::new(
            "`run_at` is milliseconds since the Unix epoch (Redis time), at most one year ahead",
        ));
    }
    if let Some(d) = &spec.debounce {
        crate::validate::name("debounce.key", &d.key)?;
        crate::validate::in_range("debounce.ms", d.ms, &crate::validate::DEBOUNCE_MS)?;
        if spec.delay_ms.is_some() || spec.run_at.is_some() {
            return Err(Invalid::new(
                "give `debounce` or `delay_ms`/`run_at`, not both: a debounced task waits `debounce.ms` after the \
                 last submit with its key",
            ));
        }
    }
    if let Some(tp) = &spec.traceparent
        && (tp.len() != 55 || !tp.starts_with("00-") || muster_trace::SpanContext::parse(tp).is_none())
    {
        return Err(Invalid::new(
            "`traceparent` must be a W3C trace context: 00-<32 lower-case hex>-<16 lower-case hex>-<2 hex>, \
             neither id all zeros",
        ));
    }
    if let Some(ts) = &spec.tracestate {
        if spec.traceparent.is_none() {
            return Err(Invalid::new("`tracestate` needs a `traceparent`"));
        }
        if !muster_trace::valid_tracestate(ts) {
            return Err(Invalid::new(format!(
                "`tracestate` must be at most {} printable ASCII characters",
                muster_trace::TRACESTATE_MAX
            )));
        }
    }
    let max_attempts = spec.max_attempts.unwrap_or(cfg.max_attempts);
    crate::validate::in_range("max_attempts", max_attempts, &crate::validate::MAX_ATTEMPTS)?;
    let timeout_ms = spec.timeout_ms.unwrap_or(0);
    if timeout_ms > crate::validate::TASK_TIMEOUT_MAX_MS {
        return Err(Invalid::new("`timeout_ms` must be at most 7 days"));
    }
    let base = spec.backoff_base_ms.unwrap_or(cfg.backoff_base_ms);
    let cap = spec.backoff_cap_ms.unwrap_or(cfg.backoff_cap_ms.max(base));
    let most = crate::validate::BACKOFF_MAX_MS;
    if base > most || cap > most || cap < base {
        return Err(Invalid::new(
            "`backoff_base_ms` and `backoff_cap_ms` must be at most 24 h, with the cap at least the base",
        ));
    }
    Ok(NewTask {
        payload,
        group: spec.group.clone().unwrap_or_default(),
        priority,
        delay_ms: spec.delay_ms.unwrap_or(0),
        run_at: spec.run_at.unwrap_or(0),
        max_attempts,
        timeout_ms,
        alias: spec.alias.clone().unwrap_or_default(),
        idempotency_key: spec.idempotency_key.clone().unwrap_or_default(),
        backoff_base_ms: base,
        backoff_cap_ms: cap,
        limits,
        debounce: spec.debounce.as_ref().map(|d| (d.key.clone(), d.ms)),
        traceparent: spec.traceparent.clone().unwrap_or_default(),
        tracestate: spec.tracestate.clone().unwrap_or_default(),
    })
}
