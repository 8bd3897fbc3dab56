//! Every bound the API enforces, written into the document: path and query parameters, body fields and list sizes, read from the validators and the configuration.

use super::{Config, Map, Value, json, v};

/// The schema of a path parameter, by its name and the path it is in.
pub(super) fn path_schema(path: &str, name: &str) -> Value {
    let named = |s: &str| json!({"$ref": format!("#/components/schemas/{s}")});
    match name {
        "kind" => json!({"type": "string", "enum": ["ping", "invalidate", "reconfigure"]}),
        "id" if path.starts_with("/api/v1/tasks/") || path.starts_with("/api/v1/workflows/") => named("Id"),
        "id" if path.starts_with("/api/v1/nodes/") => named("NodeId"),
        "name" if path.starts_with("/api/v1/limits/") => json!({
            "type": "string",
            "minLength": 1,
            "maxLength": v::LIMIT_NAME_MAX_LEN,
            "pattern": muster_api::bounds::limit_name_pattern(true),
        }),
        _ => named("Name"),
    }
}

pub(super) fn range<T: serde::Serialize>(r: &std::ops::RangeInclusive<T>) -> Value {
    json!({"minimum": r.start(), "maximum": r.end()})
}

/// Bounds of query parameters and headers, by operation and name.
pub(super) fn query_bounds(path: &str, name: &str) -> Option<Value> {
    Some(match (path, name) {
        ("/api/v1/queues/{queue}/tasks" | "/api/v1/dead", "limit") => range(&v::TASK_PAGE_LIMIT),
        ("/api/v1/queues/{queue}/tasks" | "/api/v1/dead", "cursor") => {
            json!({"type": "integer", "minimum": 0, "maximum": v::TASK_CURSOR_MAX})
        }
        ("/api/v1/queues/{queue}/tasks", "state") => json!({"enum": crate::tasks::STATES}),
        ("/api/v1/workflows", "limit") => range(&v::WORKFLOW_PAGE_LIMIT),
        ("/api/v1/workflows", "state") => json!({"enum": ["running", "succeeded", "failed", "cancelled"]}),
        ("/api/v1/orphans" | "/api/v1/events" | "/api/v1/barriers/{name}/rounds", "limit") => {
            range(&v::LONG_PAGE_LIMIT)
        }
        ("/api/v1/schedules/{id}", "history") => range(&v::SCHEDULE_HISTORY),
        ("/api/v1/events" | "/api/v1/events/ws", "topics") => json!({"pattern": topics_pattern()}),
        (_, "queue") => json!({"maxLength": v::NAME_MAX_LEN, "pattern": v::name_pattern(v::NAME_MAX_LEN)}),
        (_, "Idempotency-Key") => {
            json!({"minLength": 1, "maxLength": v::OPAQUE_KEY_MAX_LEN, "pattern": v::opaque_key_pattern()})
        }
        _ => return None,
    })
}

/// The grammar of an event filter's `topics` (`src/events/mod.rs`,
/// `Filter::parse`): up to 32 comma-separated parts with spaces around them,
/// each empty, an event type or prefix of it (`task.claimed`, `task.*`) or
/// `*`. Whether a part names a real event type is checked by the server.
pub(super) fn topics_pattern() -> String {
    let part = format!(
        "([A-Za-z0-9._-]{{1,{max}}}|[A-Za-z0-9._-]{{0,{star}}}\\*)",
        max = v::TOPIC_MAX_LEN,
        star = v::TOPIC_MAX_LEN - 1
    );
    format!("^ *({part} *)?(, *({part} *)?){{0,{}}}$", v::TOPICS_MAX - 1)
}

/// The pattern of an event cursor (`since`) of a namespace split into
/// `shards`: one stream id, or one per shard joined by commas; empty is the
/// same as absent.
pub(super) fn since_pattern(shards: u32) -> String {
    let id = "[0-9]{1,19}(-[0-9]{1,19})?";
    if shards <= 1 {
        format!("^({id})?$")
    } else {
        format!("^({id}(,{id}){{{}}}|{id})?$", shards - 1)
    }
}

pub(super) fn bound_parameter(path: &str, _method: &str, p: &mut Value, cfg: &Config) {
    let Some(p) = p.as_object_mut() else { return };
    let name = p.get("name").and_then(Value::as_str).unwrap_or("").to_string();
    match p.get("in").and_then(Value::as_str) {
        Some("path") => {
            p.insert("schema".into(), path_schema(path, &name));
        }
        Some("query")
            if name == "cursor"
                && cfg.redis.shards > 1
                && matches!(path, "/api/v1/queues/{queue}/tasks" | "/api/v1/dead") =>
        {
            // A split namespace's listings merge every shard's page from its
            // start, so every state pages down to the queued listing's bound.
            merge(
                p.entry("schema").or_insert_with(|| json!({})),
                json!({"type": "integer", "minimum": 0, "maximum": crate::tasks::MAX_QUEUED_CURSOR}),
            );
        }
        Some("query") if name == "since" => {
            merge(
                p.entry("schema").or_insert_with(|| json!({})),
                json!({"pattern": since_pattern(cfg.redis.shards)}),
            );
        }
        Some("query" | "header") => {
            if let Some(bounds) = query_bounds(path, &name) {
                merge(p.entry("schema").or_insert_with(|| json!({})), bounds);
            }
        }
        _ => {}
    }
}

/// Merges the members of `extra` into `schema`. A nullable schema
/// (`type: [T, "null"]`) keeps its type.
pub(super) fn merge(schema: &mut Value, extra: Value) {
    if let (Some(s), Value::Object(extra)) = (schema.as_object_mut(), extra) {
        for (k, val) in extra {
            s.insert(k, val);
        }
    }
}

/// Bounds of request bodies' fields: (schema, property) -> members to merge.
pub(super) fn field_bounds(cfg: &Config) -> Vec<(&'static str, &'static str, Value)> {
    let name = || json!({"minLength": 1, "maxLength": v::NAME_MAX_LEN, "pattern": v::name_pattern(v::NAME_MAX_LEN)});
    let node =
        || json!({"minLength": 1, "maxLength": v::NODE_ID_MAX_LEN, "pattern": v::name_pattern(v::NODE_ID_MAX_LEN)});
    let key = || json!({"minLength": 1, "maxLength": v::OPAQUE_KEY_MAX_LEN, "pattern": v::opaque_key_pattern()});
    let upto = |max: u64| json!({"minimum": 0, "maximum": max});
    let claim_wait = || upto(v::CLAIM_WAIT_MAX_MS);
    let barrier_wait = || upto(cfg.barriers.max_wait_ms);
    let lock_wait = || upto(cfg.locks.max_wait_ms);
    let lock_ttl = || json!({"minimum": v::MIN_LEASE_MS, "maximum": cfg.locks.max_ttl_ms});
    // A list of flow-control limit names (none allowed where `min` is 0).
    let limit_list = |min: usize| {
        json!({"minItems": min, "maxItems": v::TASK_LIMITS_MAX, "uniqueItems": true,
            "items": {"type": "string", "maxLength": v::LIMIT_NAME_MAX_LEN,
                "pattern": muster_api::bounds::limit_name_pattern(false)}})
    };
    // The task options, shared by tasks, workflow tasks and schedule templates.
    let task_options = |schema: &'static str| {
        vec![
            (schema, "group", name()),
            (schema, "priority", range(&v::PRIORITY)),
            (schema, "max_attempts", range(&v::MAX_ATTEMPTS)),
            (schema, "timeout_ms", upto(v::TASK_TIMEOUT_MAX_MS)),
            (schema, "backoff_base_ms", upto(v::BACKOFF_MAX_MS)),
            (schema, "backoff_cap_ms", upto(v::BACKOFF_MAX_MS)),
        ]
    };
    let mut b = vec![
        (
            "TaskSpec",
            "run_at",
            json!({"minimum": 0, "maximum": crate::tasks::MAX_RUN_AT}),
        ),
        ("TaskSpec", "delay_ms", upto(crate::tasks::MAX_DELAY_MS)),
        ("WorkflowTaskSpec", "delay_ms", upto(crate::tasks::MAX_DELAY_MS)),
        ("TaskSpec", "alias", name()),
        ("TaskSpec", "idempotency_key", key()),
        (
            "TaskSpec",
            "traceparent",
            json!({"minLength": 55, "maxLength": 55, "pattern": "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"}),
        ),
        (
            "TaskSpec",
            "tracestate",
            json!({"maxLength": muster_trace::TRACESTATE_MAX, "pattern": "^[\\x20-\\x7e]*$"}),
        ),
        ("BatchRequest", "tasks", items(&v::BATCH_ITEMS)),
        ("ClaimRequest", "node", node()),
        ("ClaimRequest", "max", range(&v::CLAIM_MAX)),
        ("ClaimRequest", "wait_ms", claim_wait()),
        ("ClaimRequest", "ack_ms", range(&v::CLAIM_ACK_MS)),
        ("NextRequest", "ack_ms", range(&v::CLAIM_ACK_MS)),
        ("NextRequest", "max", range(&v::CLAIM_MAX)),
        ("NextRequest", "queue", name()),
        ("NextRequest", "wait_ms", claim_wait()),
        ("HeartbeatRequest", "progress", range(&v::PROGRESS)),
        ("GroupRequest", "limit", range(&v::GROUP_LIMIT)),
        ("TaskSpec", "limits", limit_list(1)),
        ("Debounce", "key", name()),
        ("Debounce", "ms", range(&v::DEBOUNCE_MS)),
        ("QueueLimits", "limits", limit_list(0)),
        ("TaskTemplate", "limits", limit_list(0)),
        ("WorkflowTaskSpec", "limits", limit_list(0)),
        ("HeartbeatBody", "ttl_ms", range(&v::WORKER_TTL_MS)),
        (
            "HeartbeatBody",
            "labels",
            json!({
                "maxProperties": v::WORKER_LABELS_MAX,
                "propertyNames": {"minLength": 1, "maxLength": v::WORKER_LABEL_KEY_MAX_LEN, "pattern": v::plain_text_pattern()},
                "additionalProperties": {"type": "string", "maxLength": v::WORKER_LABEL_VALUE_MAX_LEN, "pattern": v::plain_text_pattern()},
            }),
        ),
        (
            "HeartbeatBody",
            "addr",
            json!({"maxLength": v::WORKER_ADDR_MAX_LEN, "pattern": v::plain_text_pattern()}),
        ),
        (
            "HeartbeatBody",
            "version",
            json!({"maxLength": v::WORKER_VERSION_MAX_LEN, "pattern": v::plain_text_pattern()}),
        ),
        ("BarrierSpec", "participants", {
            let mut item = json!({"type": "string"});
            merge(&mut item, node());
            let mut p = items(&v::PARTICIPANTS);
            merge(&mut p, json!({"uniqueItems": true, "items": item}));
            p
        }),
        ("BarrierSpec", "timeout_ms", range(&v::ROUND_TIMEOUT_MS)),
        ("ArriveRequest", "node", node()),
        ("ArriveRequest", "wait_ms", barrier_wait()),
        ("HoldRequest", "holder", key()),
        (
            "HoldRequest",
            "ttl_ms",
            json!({"minimum": v::MIN_LEASE_MS, "maximum": cfg.barriers.idle_ttl_ms}),
        ),
        ("WaitRequest", "wait_ms", barrier_wait()),
        ("EnterRequest", "node", node()),
        ("EnterRequest", "count", range(&v::DOUBLE_BARRIER_COUNT)),
        ("EnterRequest", "wait_ms", barrier_wait()),
        ("LeaveRequest", "node", node()),
        ("LeaveRequest", "wait_ms", barrier_wait()),
        ("AcquireRequest", "owner", key()),
        ("AcquireRequest", "ttl_ms", lock_ttl()),
        ("AcquireRequest", "wait_ms", lock_wait()),
        ("AcquireRequest", "node", node()),
        ("RenewRequest", "ttl_ms", lock_ttl()),
        ("CampaignRequest", "candidate", key()),
        ("CampaignRequest", "ttl_ms", lock_ttl()),
        ("CampaignRequest", "wait_ms", lock_wait()),
        ("ResignRequest", "candidate", key()),
        (
            "NewWorkflow",
            "tasks",
            json!({"minItems": 1, "maxItems": crate::workflows::MAX_TASKS}),
        ),
        ("NewWorkflow", "idempotency_key", key()),
        ("WorkflowTaskSpec", "key", name()),
        ("WorkflowTaskSpec", "queue", name()),
        (
            "WorkflowTaskSpec",
            "depends_on",
            json!({"maxItems": crate::workflows::MAX_DEPS, "items": name()}),
        ),
        ("ScheduleDef", "id", name()),
        ("ScheduleDef", "queue", name()),
        (
            "ScheduleDef",
            "expression",
            json!({"minLength": v::EXPRESSION_LEN.start(), "maxLength": v::EXPRESSION_LEN.end()}),
        ),
        (
            "ScheduleDef",
            "timezone",
            json!({"minLength": v::TIMEZONE_LEN.start(), "maxLength": v::TIMEZONE_LEN.end()}),
        ),
        ("ScheduleDef", "starting_deadline_ms", range(&v::STARTING_DEADLINE_MS)),
    ];
    b.extend(task_options("TaskSpec"));
    b.extend(task_options("WorkflowTaskSpec"));
    b.extend(task_options("TaskTemplate"));
    b
}

pub(super) fn items(r: &std::ops::RangeInclusive<usize>) -> Value {
    json!({"minItems": r.start(), "maxItems": r.end()})
}

pub(super) fn bound_schemas(schemas: &mut Map<String, Value>, cfg: &Config) {
    // A batch submit checks each item's options apart: an invalid item gets
    // an error entry in a 200, so the request's schema has only the types.
    if let Some(spec) = schemas.get("TaskSpec").cloned() {
        let mut unchecked = spec;
        unchecked["description"] = json!(
            "Task options as in TaskSpec; their bounds are checked per item, and an item that breaks one \
             gets an error entry in the answer"
        );
        schemas.insert("BatchTaskSpec".into(), unchecked);
        if let Some(items) = schemas
            .get_mut("BatchRequest")
            .and_then(|b| b.pointer_mut("/properties/tasks/items"))
        {
            *items = json!({"$ref": "#/components/schemas/BatchTaskSpec"});
        }
    }
    for (schema, prop, bounds) in field_bounds(cfg) {
        if let Some(p) = schemas
            .get_mut(schema)
            .and_then(|s| s.get_mut("properties"))
            .and_then(|p| p.get_mut(prop))
        {
            merge(p, bounds);
        } else {
            debug_assert!(false, "no property {schema}.{prop} in the document");
        }
    }
    // A limit needs at least one of its two settings, and not as null:
    // not both absent or null.
    if let Some(s) = schemas.get_mut("LimitSpec") {
        s["not"] = json!({"properties": {"concurrency": {"type": "null"}, "rate": {"type": "null"}}});
    }
    // A batch of completions: bare, or wrapped as `{"tasks": [...]}`.
    if let Some(alts) = schemas
        .get_mut("CompleteBatch")
        .and_then(|s| s.get_mut("oneOf"))
        .and_then(Value::as_array_mut)
    {
        for alt in alts.iter_mut() {
            if alt.get("properties").is_some() {
                alt["additionalProperties"] = json!(false);
            }
            let list = match alt.pointer_mut("/properties/tasks") {
                Some(tasks) => tasks,
                None => alt,
            };
            merge(list, items(&v::BATCH_ITEMS));
        }
    }
    // `delay_ms` and `run_at` exclude each other (null is absent).
    if let Some(s) = schemas.get_mut("TaskSpec").and_then(Value::as_object_mut) {
        s.insert(
            "not".into(),
            json!({
                "required": ["delay_ms", "run_at"],
                "properties": {"delay_ms": {"type": "integer"}, "run_at": {"type": "integer"}},
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::since_pattern;

    #[test]
    fn the_since_pattern_is_a_cursor_of_the_namespaces_shards() {
        let id = "[0-9]{1,19}(-[0-9]{1,19})?";
        assert_eq!(since_pattern(1), format!("^({id})?$"), "one stream id, as always");
        assert_eq!(since_pattern(3), format!("^({id}(,{id}){{2}}|{id})?$"));
    }
}
