//! The OpenAPI document as a contract: what utoipa derives from the
//! `#[utoipa::path]` attributes, completed with what a client generator and a
//! fuzzer need and the attributes cannot say.
//!
//! - Every error response an operation can give, with the `Problem` schema
//!   (`application/problem+json`, see [`crate::error::problem`]): 400 where
//!   it takes parameters or a body, 401 and 403 where it needs a role, 404
//!   where its path has parameters, 413 and 415 where it takes a JSON body,
//!   503 where it reads or writes Redis. 409 is documented by the attributes
//!   of the operations that can conflict; this only gives it its schema.
//! - The bounds of every name, id and number the server checks, written from
//!   the constants in [`crate::validate`] (and, for the limits an operator
//!   sets, from the config this node runs with), so the document and the
//!   checks cannot drift. utoipa's attributes take only literals for bounds.
//! - Security: `bearer` and `session` (the dashboard's cookie) with the
//!   least role as the requirement's scopes; the probes and this document are
//!   public; the internal failover endpoint takes its own secret header.
//!
//! It works on the rendered JSON after every router is merged (a
//! `utoipa::Modify` on the root document runs before the routes are added).

use serde_json::{Map, Value, json};

use crate::config::Config;
use crate::validate as v;

#[path = "openapi/bounds.rs"]
mod bounds;
use bounds::{bound_parameter, bound_schemas};

/// The finished document for a node running with `cfg`.
pub(crate) fn document(doc: utoipa::openapi::OpenApi, cfg: &Config) -> Value {
    let mut d = serde_json::to_value(doc).unwrap_or_else(|_| json!({}));
    complete(&mut d, cfg);
    d
}

/// Operations anyone may call, and the one that takes the failover secret.
const PUBLIC: &[&str] = &["/healthz", "/readyz", "/api/v1/openapi.json"];
const INTERNAL: &str = "/internal/failover/{kind}";

/// Operations that neither read nor write Redis (no 503): the probes (readyz
/// documents its own), this document, metrics, the cached live view and the
/// failover status (which reports an unreachable master in its body).
const NO_REDIS: &[&str] = &[
    "/healthz",
    "/readyz",
    "/api/v1/openapi.json",
    "/metrics",
    "/api/v1/live",
    "/api/v1/failover",
];

fn complete(d: &mut Value, cfg: &Config) {
    add_components(d);
    if let Some(paths) = d.get_mut("paths").and_then(Value::as_object_mut) {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else { continue };
            for (method, op) in item.iter_mut() {
                if !["get", "put", "post", "delete", "patch"].contains(&method.as_str()) {
                    continue;
                }
                complete_operation(path, method, op, cfg);
            }
        }
    }
    if let Some(schemas) = d.pointer_mut("/components/schemas").and_then(Value::as_object_mut) {
        bound_schemas(schemas, cfg);
    }
    // Each operation states its own requirement.
    if let Some(root) = d.as_object_mut() {
        root.remove("security");
    }
    unsigned(d);
}

fn is_integer(ty: Option<&Value>) -> bool {
    match ty {
        Some(Value::String(t)) => t == "integer",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "integer"),
        _ => false,
    }
}

/// utoipa writes Rust's `u32` and `u64` as `format: int32` / `int64` with
/// `minimum: 0`; those formats stop at 2^31 - 1 and 2^63 - 1, which serde
/// does not; `usize` gets no format and no maximum. State the real range
/// (`uint32`, `uint64`, with the maximum),
/// so a fuzzer does not expect a 400 for 2^31.
fn unsigned(v: &mut Value) {
    match v {
        Value::Object(m) => {
            let unsigned_max = match (m.get("format").and_then(Value::as_str), m.get("minimum")) {
                (Some("int32"), Some(min)) if min.as_u64() == Some(0) => Some(("uint32", u64::from(u32::MAX))),
                (Some("int64"), Some(min)) if min.as_u64() == Some(0) => Some(("uint64", u64::MAX)),
                // usize: no format at all.
                (None, Some(min)) if min.as_u64() == Some(0) && is_integer(m.get("type")) => Some(("uint64", u64::MAX)),
                _ => None,
            };
            if let Some((format, max)) = unsigned_max {
                m.insert("format".into(), json!(format));
                m.entry("maximum").or_insert(json!(max));
            }
            for (_, child) in m.iter_mut() {
                unsigned(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(unsigned),
        _ => {}
    }
}

fn add_components(d: &mut Value) {
    let Some(root) = d.as_object_mut() else { return };
    let components = root.entry("components").or_insert_with(|| json!({}));
    let Some(components) = components.as_object_mut() else {
        return;
    };
    let schemas = components.entry("schemas").or_insert_with(|| json!({}));
    if let Some(schemas) = schemas.as_object_mut() {
        schemas.insert(
            "Problem".into(),
            json!({
                "type": "object",
                "description": "An error (RFC 9457). 409s carry the state the caller needs to recover as extra members.",
                "required": ["type", "title", "status", "detail", "request_id"],
                "properties": {
                    "type": {"type": "string", "description": "Always `about:blank`: `status` and `title` say it all."},
                    "title": {"type": "string", "description": "The status code's reason phrase."},
                    "status": {"type": "integer", "minimum": 400, "maximum": 599},
                    "detail": {"type": "string", "description": "What was wrong and how to fix it; for 5xx a generic text."},
                    "request_id": {"type": "string", "description": "The `x-request-id` of the request, for the server log."},
                    "replicated": {"type": "boolean", "description": "Only on the 503 of a change that waits for replicas (`redis.ack_replicas`, the `Durability` header): always false. The change was applied on the master (or may have been) but fewer replicas than required confirmed it: it may or may not survive a failover. Retrying is safe with an idempotency key."},
                    "replicas_required": {"type": "integer", "minimum": 1, "maximum": crate::config::MAX_ACK_REPLICAS, "description": "With `replicated`: the replicas that had to confirm."},
                    "replicas_acked": {"type": ["integer", "null"], "minimum": 0, "description": "With `replicated`: how many confirmed within `redis.ack_timeout_ms`; null when the wait itself failed."},
                    "task_id": {"type": "string", "description": "With `replicated`: the task the change created (a submit) or changed (complete, fail, cancel, retry)."},
                    "result_status": {"type": "integer", "description": "With `replicated`: the status the answer would have had."},
                    "result": {"description": "With `replicated`: the body the answer would have had (for a batch submit, every task's id)."}
                },
                "additionalProperties": true
            }),
        );
        schemas.insert(
            "Name".into(),
            json!({
                "type": "string",
                "description": "A queue, group, alias, barrier, round, lock, election or schedule name: \
                                A-Z a-z 0-9 . _ -, not `.` or `..`.",
                "minLength": 1,
                "maxLength": v::NAME_MAX_LEN,
                "pattern": v::name_pattern(v::NAME_MAX_LEN),
            }),
        );
        schemas.insert(
            "NodeId".into(),
            json!({
                "type": "string",
                "description": "A node or worker id: A-Z a-z 0-9 . _ -, not `.` or `..`.",
                "minLength": 1,
                "maxLength": v::NODE_ID_MAX_LEN,
                "pattern": v::name_pattern(v::NODE_ID_MAX_LEN),
            }),
        );
        schemas.insert(
            "Id".into(),
            json!({
                "type": "string",
                "description": "A task or workflow id (a ULID).",
                "minLength": v::ID_LEN,
                "maxLength": v::ID_LEN,
                "pattern": v::id_pattern(),
            }),
        );
        schemas.insert(
            "OpaqueKey".into(),
            json!({
                "type": "string",
                "description": "Printable ASCII without spaces.",
                "minLength": 1,
                "maxLength": v::OPAQUE_KEY_MAX_LEN,
                "pattern": v::opaque_key_pattern(),
            }),
        );
    }
    // A method a path does not list: not an operation, so no operation can
    // name it; stated once here and in `info.description`.
    let responses = components.entry("responses").or_insert_with(|| json!({}));
    if let Some(responses) = responses.as_object_mut() {
        responses.insert(
            "MethodNotAllowed".into(),
            problem_response(
                "405 for a method the path does not list (every path answers it for the others); the `Allow` \
                 header and `detail` name the methods it takes",
            ),
        );
    }
    let schemes = components.entry("securitySchemes").or_insert_with(|| json!({}));
    if let Some(schemes) = schemes.as_object_mut() {
        schemes.insert(
            "bearer".into(),
            json!({"type": "http", "scheme": "bearer",
                   "description": "An API token from [auth] tokens. Scopes name the least role: read < worker < admin."}),
        );
        schemes.insert(
            "session".into(),
            json!({"type": "apiKey", "in": "cookie", "name": crate::auth::SESSION_COOKIE,
                   "description": "The dashboard's session cookie, set by signing in."}),
        );
        schemes.insert(
            "failover_secret".into(),
            json!({"type": "apiKey", "in": "header", "name": crate::failover::SECRET_HEADER,
                   "description": "The shared [failover] secret of coordinated failover."}),
        );
    }
}

fn problem_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    })
}

/// Sets `code`'s response to a problem, keeping a description the
/// attributes gave.
fn add_problem(responses: &mut Map<String, Value>, code: u16, default: &str) {
    let key = code.to_string();
    let description = responses
        .get(&key)
        .and_then(|r| r.get("description"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(default)
        .to_string();
    responses.insert(key, problem_response(&description));
}

fn complete_operation(path: &str, method: &str, op: &mut Value, cfg: &Config) {
    let Some(op) = op.as_object_mut() else { return };
    let has_body = op.contains_key("requestBody");
    optional_body(op);
    if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
        for p in params.iter_mut() {
            bound_parameter(path, method, p, cfg);
        }
    }
    if crate::durability::is_acked(method, path) {
        let params = op.entry("parameters").or_insert_with(|| json!([]));
        if let Some(params) = params.as_array_mut() {
            params.push(durability_parameter());
        }
    }
    let has_params = op
        .get("parameters")
        .and_then(Value::as_array)
        .is_some_and(|p| !p.is_empty());
    let secured = !PUBLIC.contains(&path) && path != INTERNAL;

    // Security: public, the failover secret, or the roles the attributes name.
    if !secured {
        let sec = if path == INTERNAL {
            json!([{"failover_secret": []}])
        } else {
            json!([])
        };
        op.insert("security".into(), sec);
    }

    let responses = op.entry("responses").or_insert_with(|| json!({}));
    let Some(responses) = responses.as_object_mut() else {
        return;
    };
    if has_params || has_body {
        add_problem(responses, 400, "A parameter or the body is invalid; `detail` names it");
    }
    // Every request passes `http::limit_uri` first.
    add_problem(
        responses,
        414,
        &format!(
            "The request target (path and query) is longer than {} bytes",
            crate::http::MAX_URI_BYTES
        ),
    );
    if secured {
        add_problem(
            responses,
            401,
            "No credential, or one that matches no token (only with [auth] tokens)",
        );
        add_problem(responses, 403, "The token's role is below the one this operation needs");
    }
    if path == INTERNAL {
        add_problem(responses, 401, "The failover secret header is missing or wrong");
    }
    if path.contains('{') {
        add_problem(responses, 404, "Not found");
    }
    if has_body {
        add_problem(responses, 413, "The body or a value in it is larger than allowed");
        add_problem(responses, 415, "The body is not sent as `application/json`");
        add_problem(
            responses,
            408,
            &format!(
                "The body did not arrive within `server.body_read_timeout_ms` ({} ms on this node) after the \
                 request's head; the connection is closed",
                cfg.server.body_read_timeout_ms
            ),
        );
    }
    if crate::durability::is_acked(method, path) {
        add_problem(
            responses,
            503,
            "Redis is unreachable or this node cannot serve now; or (with `replicated: false`) the change was \
             applied on the master but fewer replicas than required confirmed it in time (`redis.ack_replicas`, \
             the `Durability` header), so it may or may not survive a failover. Retry (see `Retry-After`); an \
             idempotency key makes a retried submit safe",
        );
    } else if !NO_REDIS.contains(&path) {
        add_problem(
            responses,
            503,
            "Redis is unreachable or this node cannot serve now; retry (see `Retry-After`)",
        );
    }
    // Every other 4xx and 5xx an attribute names is a problem too; every
    // response needs a description.
    for (code, r) in responses.iter_mut() {
        let status: u16 = code.parse().unwrap_or(0);
        if status >= 400 {
            let description = r.get("description").and_then(Value::as_str).unwrap_or("").to_string();
            *r = problem_response(&description);
        }
        if let Some(r) = r.as_object_mut() {
            let empty = r.get("description").and_then(Value::as_str).is_none_or(str::is_empty);
            if empty {
                let reason = axum::http::StatusCode::from_u16(status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("Response");
                r.insert("description".into(), json!(reason));
            }
        }
    }
}

/// The `Durability` header of the changes that can wait for replicas.
fn durability_parameter() -> Value {
    json!({
        "name": "Durability",
        "in": "header",
        "required": false,
        "description": "`replicated`: answer only once max(`redis.ack_replicas`, 1) replicas confirmed the change \
                        (Redis `WAIT`), else 503 with `replicated: false`. Without it the node's \
                        `redis.ack_replicas` applies (0 by default: answer as soon as the master applied it). \
                        A confirmed answer carries `Durability-Replicas`, the number of replicas that confirmed.",
        "schema": {"type": "string", "enum": ["replicated"]}
    })
}

/// utoipa writes an `Option<T>` body as `oneOf: [T, null]`, which would
/// invite a JSON `null` the server refuses. What it means is an optional
/// body: say so with `required: false` and `T`.
fn optional_body(op: &mut Map<String, Value>) {
    let Some(body) = op.get_mut("requestBody") else { return };
    let Some(schema) = body.pointer_mut("/content/application~1json/schema") else {
        return;
    };
    let inner = schema
        .get("oneOf")
        .and_then(Value::as_array)
        .and_then(|alts| match alts.as_slice() {
            [t, null] if null.get("type") == Some(&json!("null")) => Some(t.clone()),
            _ => None,
        });
    if let Some(t) = inner {
        *schema = t;
        body["required"] = json!(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        let (_, doc) = crate::app::api_router().split_for_parts();
        document(doc, &Config::default())
    }

    #[test]
    #[ignore]
    fn dump() {
        std::fs::write("/tmp/openapi.json", serde_json::to_string_pretty(&doc()).unwrap()).unwrap();
    }

    #[test]
    fn bounds_come_from_the_validators_constants() {
        let d = doc();
        let name = &d["components"]["schemas"]["Name"];
        assert_eq!(name["maxLength"], v::NAME_MAX_LEN);
        assert_eq!(name["pattern"], v::name_pattern(v::NAME_MAX_LEN));
        assert_eq!(d["components"]["schemas"]["NodeId"]["maxLength"], v::NODE_ID_MAX_LEN);
        assert_eq!(d["components"]["schemas"]["Id"]["minLength"], v::ID_LEN);

        let params = |path: &str, method: &str| d["paths"][path][method]["parameters"].as_array().unwrap().clone();
        let param = |path: &str, method: &str, n: &str| {
            params(path, method)
                .into_iter()
                .find(|p| p["name"] == n)
                .unwrap_or_else(|| panic!("{method} {path} has no parameter {n}"))
        };
        let limit = param("/api/v1/queues/{queue}/tasks", "get", "limit");
        assert_eq!(limit["schema"]["minimum"], *v::TASK_PAGE_LIMIT.start());
        assert_eq!(limit["schema"]["maximum"], *v::TASK_PAGE_LIMIT.end());
        assert_eq!(
            param("/api/v1/workflows", "get", "limit")["schema"]["maximum"],
            *v::WORKFLOW_PAGE_LIMIT.end()
        );
        assert_eq!(
            param("/api/v1/orphans", "get", "limit")["schema"]["maximum"],
            *v::LONG_PAGE_LIMIT.end()
        );
        assert_eq!(
            param("/api/v1/queues/{queue}/tasks", "get", "queue")["schema"]["$ref"],
            "#/components/schemas/Name"
        );
        assert_eq!(
            param("/api/v1/tasks/{id}", "get", "id")["schema"]["$ref"],
            "#/components/schemas/Id"
        );
        assert_eq!(
            param("/api/v1/nodes/{id}/heartbeat", "put", "id")["schema"]["$ref"],
            "#/components/schemas/NodeId"
        );

        let prop = |s: &str, p: &str| d["components"]["schemas"][s]["properties"][p].clone();
        assert_eq!(prop("ClaimRequest", "wait_ms")["maximum"], v::CLAIM_WAIT_MAX_MS);
        assert_eq!(prop("ClaimRequest", "max")["maximum"], *v::CLAIM_MAX.end());
        assert_eq!(prop("BatchRequest", "tasks")["maxItems"], *v::BATCH_ITEMS.end());
        assert_eq!(prop("NewWorkflow", "tasks")["maxItems"], crate::workflows::MAX_TASKS);
        assert_eq!(prop("BarrierSpec", "participants")["maxItems"], *v::PARTICIPANTS.end());
        assert_eq!(prop("TaskSpec", "delay_ms")["maximum"], crate::tasks::MAX_DELAY_MS);
        assert_eq!(prop("TaskSpec", "priority")["minimum"], *v::PRIORITY.start());
        assert_eq!(prop("GroupRequest", "limit")["maximum"], *v::GROUP_LIMIT.end());
        // Operator limits come from the config the node runs with.
        assert_eq!(
            prop("WaitRequest", "wait_ms")["maximum"],
            Config::default().barriers.max_wait_ms
        );
        assert_eq!(
            prop("AcquireRequest", "ttl_ms")["maximum"],
            Config::default().locks.max_ttl_ms
        );
    }

    #[test]
    fn every_response_has_a_description_and_errors_are_problems() {
        let d = doc();
        let mut ops = 0;
        for (path, item) in d["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                ops += 1;
                assert!(op.get("security").is_some(), "{method} {path} states no security");
                for (code, r) in op["responses"].as_object().unwrap() {
                    assert!(
                        r["description"].as_str().is_some_and(|s| !s.is_empty()),
                        "{method} {path} {code}"
                    );
                    if code.starts_with('4') || code.starts_with('5') {
                        assert_eq!(
                            r["content"]["application/problem+json"]["schema"]["$ref"], "#/components/schemas/Problem",
                            "{method} {path} {code}"
                        );
                    }
                }
            }
        }
        assert!(ops > 60, "{ops} operations");
        assert_eq!(d["paths"]["/healthz"]["get"]["security"], json!([]));
        assert_eq!(
            d["paths"]["/internal/failover/{kind}"]["post"]["security"],
            json!([{"failover_secret": []}])
        );
    }
}
