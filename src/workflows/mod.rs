//! Workflows: DAGs of tasks whose successors are dispatched exactly once.
//!
//! Invariants:
//! - Start is idempotent: the same `idempotency_key` within the window returns
//!   the same workflow.
//! - Advancement happens inside the task script that ends a task (complete,
//!   fail, timeout, orphan recovery, cancel), through `lua/hook.lua`, so it is
//!   serialized with the task's own transition. A successor is dispatched in
//!   the one call in which its last dependency succeeds, and only while it is
//!   still pending: concurrent completions on several nodes and duplicate
//!   completions (refused by the fencing token anyway) dispatch nothing twice.
//! - A workflow's keys expire `tasks.retention_ms` after it finishes, and the
//!   janitor trims the indexes that name it (G4).

pub mod routes;
pub(crate) mod scripts;
pub mod worker;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::config::TasksConfig;
use crate::error::ApiError;
use crate::store::{ScriptCtx, Store, StoreError};
use crate::tasks::TaskSpec;
use scripts::{CancelReply, CreateReply, Scripts};

/// Most tasks in one workflow.
pub const MAX_TASKS: usize = 500;
/// Most dependencies of one task.
pub const MAX_DEPS: usize = 100;

/// One task of a workflow, as submitted.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowTaskSpec {
    /// Unique in the workflow, `[A-Za-z0-9._-]{1,128}`.
    pub key: String,
    pub queue: String,
    /// Keys that must succeed before this task is queued.
    #[serde(default)]
    pub depends_on: Vec<String>,
    #[schema(value_type = serde_json::Value)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
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
    fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::FailFast => "fail_fast",
            FailurePolicy::Continue => "continue",
        }
    }
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewWorkflow {
    /// 1 to 500 tasks.
    pub tasks: Vec<WorkflowTaskSpec>,
    /// Same key within `tasks.idempotency_window_ms`: the same workflow.
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub failure_policy: FailurePolicy,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    #[error("no workflow `{0}` (it may have passed its retention)")]
    NotFound(String),
    #[error("workflow {0} is already {1}")]
    Finished(String, String),
    #[error("the cluster already has the maximum of {0} queues (tasks.max_queues)")]
    TooManyQueues(u32),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<WorkflowError> for ApiError {
    fn from(e: WorkflowError) -> Self {
        match e {
            WorkflowError::NotFound(_) => ApiError::NotFound(e.to_string()),
            WorkflowError::Finished(_, ref state) => {
                ApiError::conflict(e.to_string(), serde_json::json!({"state": state}))
            }
            WorkflowError::TooManyQueues(_) => ApiError::conflict(e.to_string(), serde_json::Value::Null),
            WorkflowError::Store(s) => s.into(),
        }
    }
}

/// A key's place in a workflow, with its task's live state.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkflowNode {
    pub key: String,
    pub task_id: String,
    pub queue: String,
    pub depends_on: Vec<String>,
    /// pending, queued (dispatched), succeeded, dead, cancelled or skipped.
    pub state: String,
    /// The task's own state once dispatched (queued, running, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_state: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Workflow {
    pub id: String,
    /// running, succeeded, failed or cancelled.
    pub state: String,
    pub failure_policy: String,
    pub created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    /// Keys not yet in a terminal state.
    pub open: i64,
    pub tasks: Vec<WorkflowNode>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkflowSummary {
    pub id: String,
    pub state: String,
    pub created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    /// Number of tasks.
    pub tasks: i64,
    pub open: i64,
}

/// A validated workflow ready for the create script.
pub struct Plan {
    pub id: String,
    /// (key, spec JSON, dependency count, dependents)
    pub keys: Vec<(String, String, usize, String)>,
    pub policy: FailurePolicy,
    pub idempotency_key: String,
}

pub struct Workflows {
    store: Store,
    tasks: TasksConfig,
    scripts: Scripts,
}

/// Validates a workflow: sizes, names, task options, unique keys, known
/// dependencies, and no cycle (the error names one).
pub fn plan(w: &NewWorkflow, cfg: &TasksConfig) -> Result<Plan, ApiError> {
    if w.tasks.is_empty() || w.tasks.len() > MAX_TASKS {
        return Err(ApiError::bad_request(format!(
            "`tasks` must hold 1 to {MAX_TASKS} tasks"
        )));
    }
    if let Some(k) = &w.idempotency_key {
        crate::validate::opaque_key("idempotency_key", k)?;
    }
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, t) in w.tasks.iter().enumerate() {
        crate::validate::name("key", &t.key).map_err(|e| ApiError::bad_request(format!("task {i}: {e}")))?;
        crate::validate::name("queue", &t.queue)
            .map_err(|e| ApiError::bad_request(format!("task `{}`: {e}", t.key)))?;
        if index.insert(&t.key, i).is_some() {
            return Err(ApiError::bad_request(format!(
                "the key `{}` is used twice; keys must be unique",
                t.key
            )));
        }
        if t.depends_on.len() > MAX_DEPS {
            return Err(ApiError::bad_request(format!(
                "task `{}` has more than {MAX_DEPS} dependencies",
                t.key
            )));
        }
    }
    let mut dependents: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); w.tasks.len()];
    let mut deps: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); w.tasks.len()];
    for (i, t) in w.tasks.iter().enumerate() {
        for d in &t.depends_on {
            let Some(&j) = index.get(d.as_str()) else {
                return Err(ApiError::bad_request(format!(
                    "task `{}` depends on `{d}`, which is not in the workflow",
                    t.key
                )));
            };
            if j == i {
                return Err(ApiError::bad_request(format!(
                    "cycle: {0} -> {0} (a task cannot depend on itself)",
                    t.key
                )));
            }
            deps[i].insert(j);
            dependents[j].insert(i);
        }
    }
    if let Some(cycle) = find_cycle(&deps) {
        let names: Vec<&str> = cycle.iter().map(|&i| w.tasks[i].key.as_str()).collect();
        return Err(ApiError::bad_request(format!("cycle: {}", names.join(" -> "))));
    }
    let id = ulid::Ulid::generate().to_string();
    let mut keys = Vec::with_capacity(w.tasks.len());
    for (i, t) in w.tasks.iter().enumerate() {
        let spec = TaskSpec {
            payload: t.payload.clone(),
            group: t.group.clone(),
            priority: t.priority,
            delay_ms: t.delay_ms,
            run_at: None,
            max_attempts: t.max_attempts,
            timeout_ms: t.timeout_ms,
            alias: None,
            idempotency_key: None,
            backoff_base_ms: t.backoff_base_ms,
            backoff_cap_ms: t.backoff_cap_ms,
        };
        let v = spec.validate(cfg).map_err(|e| match e {
            ApiError::BadRequest(m) => ApiError::BadRequest(format!("task `{}`: {m}", t.key)),
            ApiError::TooLarge(m) => ApiError::TooLarge(format!("task `{}`: {m}", t.key)),
            other => other,
        })?;
        let json = serde_json::json!({
            "id": ulid::Ulid::generate().to_string(),
            "queue": t.queue,
            "deps": t.depends_on,
            "t": {
                "payload": v.payload,
                "group": v.group,
                "priority": v.priority.to_string(),
                "max_attempts": v.max_attempts.to_string(),
                "timeout_ms": v.timeout_ms.to_string(),
                "backoff_base": v.backoff_base_ms.to_string(),
                "backoff_cap": v.backoff_cap_ms.to_string(),
                "delay_ms": v.delay_ms.to_string(),
            }
        });
        let next: Vec<&str> = dependents[i].iter().map(|&j| w.tasks[j].key.as_str()).collect();
        keys.push((t.key.clone(), json.to_string(), deps[i].len(), next.join(",")));
    }
    Ok(Plan {
        id,
        keys,
        policy: w.failure_policy,
        idempotency_key: w.idempotency_key.clone().unwrap_or_default(),
    })
}

/// A cycle in the dependency graph (`deps[i]` = what i depends on), as a path
/// that ends where it starts, or None.
fn find_cycle(deps: &[BTreeSet<usize>]) -> Option<Vec<usize>> {
    // 0 unvisited, 1 on the stack, 2 done; iterative DFS.
    let mut mark = vec![0u8; deps.len()];
    for start in 0..deps.len() {
        if mark[start] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, Vec<usize>)> = vec![(start, deps[start].iter().copied().collect())];
        mark[start] = 1;
        while let Some((node, rest)) = stack.last_mut() {
            match rest.pop() {
                Some(next) if mark[next] == 1 => {
                    let mut path: Vec<usize> = stack.iter().map(|(n, _)| *n).collect();
                    let from = path.iter().position(|&n| n == next).unwrap_or(0);
                    path = path[from..].to_vec();
                    path.push(next);
                    // deps point backwards (a depends on b): show the run order.
                    path.reverse();
                    return Some(path);
                }
                Some(next) if mark[next] == 0 => {
                    mark[next] = 1;
                    stack.push((next, deps[next].iter().copied().collect()));
                }
                Some(_) => {}
                None => {
                    mark[*node] = 2;
                    stack.pop();
                }
            }
        }
    }
    None
}

impl Workflows {
    pub fn new(store: Store, tasks: TasksConfig, ctx: &ScriptCtx) -> Arc<Workflows> {
        Arc::new(Workflows {
            store,
            tasks,
            scripts: Scripts::new(ctx),
        })
    }

    fn key(&self, id: &str, part: Option<&str>) -> String {
        scripts::workflow_key(self.store.keys(), id, part)
    }

    /// Starts a workflow; returns its id and whether it is new.
    pub async fn create(&self, plan: &Plan, node: &str) -> Result<(String, bool), WorkflowError> {
        let call = scripts::Create {
            id: &plan.id,
            policy: plan.policy.as_str(),
            idempotency_key: &plan.idempotency_key,
            idempotency_window_ms: self.tasks.idempotency_window_ms,
            retention_ms: self.tasks.retention_ms,
            node,
            max_queues: self.tasks.max_queues,
            dead_retention_ms: self.tasks.dead_retention_ms,
            keys: &plan.keys,
        };
        match self.store.run(&self.scripts.create, &call).await? {
            CreateReply::Created { id } => Ok((id, true)),
            CreateReply::Replayed { id } => Ok((id, false)),
            CreateReply::TooManyQueues => Err(WorkflowError::TooManyQueues(self.tasks.max_queues)),
        }
    }

    pub async fn cancel(&self, id: &str, actor: &str) -> Result<(), WorkflowError> {
        let call = scripts::Cancel { id, actor };
        match self.store.run(&self.scripts.cancel, &call).await? {
            CancelReply::Cancelled => Ok(()),
            CancelReply::Finished { state } => Err(WorkflowError::Finished(id.into(), state)),
            CancelReply::NotFound => Err(WorkflowError::NotFound(id.into())),
        }
    }

    /// One workflow with every task's state (two pipelined round trips).
    pub async fn get(&self, id: &str) -> Result<Workflow, WorkflowError> {
        let mut p = redis::pipe();
        p.cmd("HGETALL").arg(self.key(id, None));
        p.cmd("HGETALL").arg(self.key(id, Some("spec")));
        p.cmd("HGETALL").arg(self.key(id, Some("st")));
        let (h, spec, st): (
            BTreeMap<String, String>,
            BTreeMap<String, String>,
            BTreeMap<String, String>,
        ) = self.store.pipe("workflow_get", &p).await?;
        if h.is_empty() {
            return Err(WorkflowError::NotFound(id.into()));
        }
        let mut nodes: Vec<WorkflowNode> = spec
            .iter()
            .map(|(k, json)| {
                let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
                WorkflowNode {
                    key: k.clone(),
                    task_id: v["id"].as_str().unwrap_or("").into(),
                    queue: v["queue"].as_str().unwrap_or("").into(),
                    depends_on: v["deps"]
                        .as_array()
                        .map(|a| a.iter().filter_map(|d| d.as_str().map(str::to_string)).collect())
                        .unwrap_or_default(),
                    state: st.get(k).cloned().unwrap_or_else(|| "pending".into()),
                    task_state: None,
                }
            })
            .collect();
        let dispatched: Vec<usize> = (0..nodes.len())
            .filter(|&i| nodes[i].state != "pending" && nodes[i].state != "skipped")
            .collect();
        if !dispatched.is_empty() {
            let mut p = redis::pipe();
            for &i in &dispatched {
                p.cmd("HGET")
                    .arg(format!("{}:task:{}", self.store.keys().prefix(), nodes[i].task_id))
                    .arg("state");
            }
            let states: Vec<Option<String>> = self.store.pipe("workflow_task_states", &p).await?;
            for (&i, s) in dispatched.iter().zip(states) {
                nodes[i].task_state = s;
            }
        }
        let num = |f: &str| h.get(f).and_then(|v| v.parse::<i64>().ok());
        Ok(Workflow {
            id: id.to_string(),
            state: h.get("state").cloned().unwrap_or_default(),
            failure_policy: h.get("policy").cloned().unwrap_or_default(),
            created_at: num("created_at").unwrap_or(0),
            finished_at: num("finished_at"),
            open: num("open").unwrap_or(0),
            tasks: nodes,
        })
    }

    /// Workflows, newest first, optionally of one state; a page at a time.
    pub async fn list(
        &self,
        state: Option<&str>,
        limit: usize,
        cursor: usize,
    ) -> Result<(Vec<WorkflowSummary>, Option<usize>), WorkflowError> {
        let key = scripts::workflows_key(self.store.keys());
        let mut out = Vec::new();
        let mut at = cursor;
        // Scan at most ten pages of the index to fill one page of a state.
        for _ in 0..10 {
            let ids: Vec<String> = self
                .store
                .query(
                    "workflows_ids",
                    redis::cmd("ZRANGE")
                        .arg(&key)
                        .arg(at)
                        .arg(at + limit * 2 - 1)
                        .arg("REV"),
                )
                .await?;
            if ids.is_empty() {
                return Ok((out, None));
            }
            let mut p = redis::pipe();
            for id in &ids {
                p.cmd("HMGET")
                    .arg(self.key(id, None))
                    .arg("state")
                    .arg("created_at")
                    .arg("finished_at")
                    .arg("n")
                    .arg("open");
            }
            let rows: Vec<Vec<Option<String>>> = self.store.pipe("workflows_rows", &p).await?;
            for (id, row) in ids.iter().zip(rows) {
                at += 1;
                let Some(st) = row.first().cloned().flatten() else {
                    continue;
                };
                if state.is_some_and(|s| s != st) {
                    continue;
                }
                let num = |i: usize| row.get(i).cloned().flatten().and_then(|v| v.parse::<i64>().ok());
                out.push(WorkflowSummary {
                    id: id.clone(),
                    state: st,
                    created_at: num(1).unwrap_or(0),
                    finished_at: num(2),
                    tasks: num(3).unwrap_or(0),
                    open: num(4).unwrap_or(0),
                });
                if out.len() >= limit {
                    return Ok((out, Some(at)));
                }
            }
        }
        Ok((out, Some(at)))
    }

    /// Trims the indexes of workflows past retention.
    pub async fn janitor(&self) -> Result<i64, WorkflowError> {
        let call = scripts::Janitor {
            retention_ms: self.tasks.retention_ms,
            limit: 1000,
        };
        let reply = self.store.run(&self.scripts.janitor, &call).await?;
        Ok(reply.forgotten as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(key: &str, deps: &[&str]) -> WorkflowTaskSpec {
        WorkflowTaskSpec {
            key: key.into(),
            queue: "q".into(),
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            payload: serde_json::Value::Null,
            group: None,
            priority: None,
            delay_ms: None,
            max_attempts: None,
            timeout_ms: None,
            backoff_base_ms: None,
            backoff_cap_ms: None,
        }
    }

    fn check(tasks: Vec<WorkflowTaskSpec>) -> Result<Plan, ApiError> {
        plan(
            &NewWorkflow {
                tasks,
                idempotency_key: None,
                failure_policy: FailurePolicy::FailFast,
            },
            &TasksConfig::default(),
        )
    }

    #[test]
    fn diamond_plans() {
        let p = check(vec![
            spec("a", &[]),
            spec("b", &["a"]),
            spec("c", &["a"]),
            spec("d", &["b", "c"]),
        ])
        .unwrap();
        let a = &p.keys[0];
        assert_eq!((a.2, a.3.as_str()), (0, "b,c"));
        assert_eq!(p.keys[3].2, 2);
    }

    #[test]
    fn cycles_are_named() {
        let e = check(vec![spec("a", &["c"]), spec("b", &["a"]), spec("c", &["b"])])
            .err()
            .unwrap();
        let msg = e.to_string();
        assert!(msg.starts_with("cycle: "), "{msg}");
        for k in ["a", "b", "c"] {
            assert!(msg.contains(k), "{msg}");
        }
        let e = check(vec![spec("a", &["a"])]).err().unwrap();
        assert!(e.to_string().contains("a -> a"));
    }

    #[test]
    fn bad_graphs_are_refused() {
        assert!(
            check(vec![spec("a", &["zz"])])
                .err()
                .unwrap()
                .to_string()
                .contains("zz")
        );
        assert!(
            check(vec![spec("a", &[]), spec("a", &[])])
                .err()
                .unwrap()
                .to_string()
                .contains("twice")
        );
        assert!(check(vec![]).is_err());
    }
}
