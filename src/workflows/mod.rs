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

pub(crate) mod routes;
pub(crate) mod scripts;
pub(crate) mod worker;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::Deserialize;
use utoipa::ToSchema;

use crate::config::TasksConfig;
use crate::problem::Invalid;
use crate::problem::{Classify, Kind};
use crate::store::shards::ShardMap;
use crate::store::{ScriptCtx, Store, StoreError};
use crate::tasks::TaskSpec;
pub(crate) use muster_api::workflows::{Workflow, WorkflowNode, WorkflowSummary};
pub(crate) use muster_api::{FailurePolicy, WorkflowTaskSpec};
use scripts::{CancelReply, CreateReply, Scripts};

/// Most tasks in one workflow.
pub(crate) const MAX_TASKS: usize = 500;
/// Most dependencies of one task.
pub(crate) const MAX_DEPS: usize = 100;

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
    #[error(
        "the cluster already has {room} queues: a worker token creates none beyond {room} of the {max} of \
         tasks.max_queues, the rest are kept for admin tokens"
    )]
    QueuesKeptForAdmin { room: u32, max: u32 },
    #[error(
        "a task names the limit `{0}`, which is not defined: define it with PUT /api/v1/limits/{0} (a key \
         `name:key` needs its template `name:*`)"
    )]
    UnknownLimit(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Classify for WorkflowError {
    fn kind(&self) -> Kind {
        match self {
            WorkflowError::NotFound(_) => Kind::NotFound,
            WorkflowError::Finished(_, state) => Kind::Conflict(serde_json::json!({"state": state})),
            WorkflowError::TooManyQueues(_)
            | WorkflowError::QueuesKeptForAdmin { .. }
            | WorkflowError::UnknownLimit(_) => Kind::Conflict(serde_json::Value::Null),
            WorkflowError::Store(s) => s.kind(),
        }
    }
}

/// A validated workflow ready for the create script.
pub struct Plan {
    pub id: String,
    /// (key, spec JSON, dependency count, dependents)
    pub keys: Vec<(String, String, usize, String)>,
    pub policy: FailurePolicy,
    pub idempotency_key: String,
    /// The queues its tasks go to (each once).
    pub queues: Vec<String>,
}

pub struct Workflows {
    store: Store,
    tasks: TasksConfig,
    scripts: Scripts,
    /// The task service, told which queues a new workflow put tasks in (its
    /// claim-routing cache), so this node's claims look in its shard at once.
    routing: Arc<crate::tasks::Tasks>,
}

/// Validates a workflow: sizes, names, task options, unique keys, known
/// dependencies, and no cycle (the error names one); places it in a shard
/// of `shards` (see [`shard_of`]) and draws its ids there.
/// `trace`: the run's W3C trace context (traceparent, tracestate), which
/// every task of the run carries (issue 39).
pub(crate) fn plan(
    w: &NewWorkflow,
    cfg: &TasksConfig,
    shards: &ShardMap,
    trace: Option<(&str, &str)>,
) -> Result<Plan, Invalid> {
    if w.tasks.is_empty() || w.tasks.len() > MAX_TASKS {
        return Err(Invalid::new(format!("`tasks` must hold 1 to {MAX_TASKS} tasks")));
    }
    if let Some(k) = &w.idempotency_key {
        crate::validate::opaque_key("idempotency_key", k)?;
    }
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, t) in w.tasks.iter().enumerate() {
        crate::validate::name("key", &t.key).map_err(|e| Invalid::new(format!("task {i}: {e}")))?;
        crate::validate::name("queue", &t.queue).map_err(|e| Invalid::new(format!("task `{}`: {e}", t.key)))?;
        if index.insert(&t.key, i).is_some() {
            return Err(Invalid::new(format!(
                "the key `{}` is used twice; keys must be unique",
                t.key
            )));
        }
        if t.depends_on.len() > MAX_DEPS {
            return Err(Invalid::new(format!(
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
                return Err(Invalid::new(format!(
                    "task `{}` depends on `{d}`, which is not in the workflow",
                    t.key
                )));
            };
            if j == i {
                return Err(Invalid::new(format!(
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
        return Err(Invalid::new(format!("cycle: {}", names.join(" -> "))));
    }
    let shard = shard_of(w, shards)?;
    let id = shards.new_id(shard);
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
            limits: (!t.limits.is_empty()).then(|| t.limits.clone()),
            debounce: None,
            traceparent: None,
            tracestate: None,
        };
        let v = crate::tasks::spec::check(&spec, cfg).map_err(|e| e.within(&format!("task `{}`", t.key)))?;
        let json = serde_json::json!({
            "id": shards.new_id(shard),
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
                "limits": v.limits.join(","),
                "tp": trace.map_or("", |t| t.0),
                "ts": trace.map_or("", |t| t.1),
            }
        });
        let next: Vec<&str> = dependents[i].iter().map(|&j| w.tasks[j].key.as_str()).collect();
        keys.push((t.key.clone(), json.to_string(), deps[i].len(), next.join(",")));
    }
    let mut queues: Vec<String> = w.tasks.iter().map(|t| t.queue.clone()).collect();
    queues.sort();
    queues.dedup();
    Ok(Plan {
        id,
        keys,
        policy: w.failure_policy,
        idempotency_key: w.idempotency_key.clone().unwrap_or_default(),
        queues,
    })
}

/// The shard a workflow lives in, with all its tasks (so the hook that
/// advances it runs in the same script as each task's last transition): the
/// shard of the groups its steps name, which must all be in one shard (a
/// group's tasks live in its shard, for its limit to be one atomic check);
/// else the shard of its idempotency key, so a replay finds it; else any.
fn shard_of(w: &NewWorkflow, shards: &ShardMap) -> Result<usize, Invalid> {
    let mut homes: BTreeMap<usize, &str> = BTreeMap::new();
    for t in &w.tasks {
        if let Some(g) = t.group.as_deref().filter(|g| !g.is_empty()) {
            homes.entry(shards.home(g)).or_insert(g);
        }
        // Flow-control limits live in shard 0, and so do the tasks that
        // name limits of their own.
        if let Some(l) = t.limits.first() {
            homes.entry(0).or_insert(l);
        }
    }
    match homes.len() {
        0 => Ok(match &w.idempotency_key {
            Some(k) => shards.home(k),
            None => rand::random::<u32>() as usize % shards.len(),
        }),
        1 => Ok(*homes.keys().next().unwrap_or(&0)),
        _ => {
            let named: Vec<String> = homes
                .iter()
                .map(|(shard, g)| format!("`{g}` (shard {shard})"))
                .collect();
            Err(Invalid::new(format!(
                "the steps name concurrency groups (or flow-control limits, which live in shard 0) in \
                 different shards of this namespace ({}): a workflow's tasks live in one shard, and a group's \
                 tasks in the group's; use groups of one shard (redis.shards, docs/sharding.md)",
                named.join(", ")
            )))
        }
    }
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
    pub fn new(store: Store, tasks: TasksConfig, ctx: &ScriptCtx, routing: Arc<crate::tasks::Tasks>) -> Arc<Workflows> {
        Arc::new(Workflows {
            store,
            tasks,
            scripts: Scripts::new(ctx),
            routing,
        })
    }

    /// Validates `w` and places it in a shard of this namespace ([`plan`]).
    pub fn plan(&self, w: &NewWorkflow, trace: Option<(&str, &str)>) -> Result<Plan, Invalid> {
        plan(w, &self.tasks, self.store.shards(), trace)
    }

    /// The view of the shard workflow `id` lives in (its id names it).
    fn at(&self, id: &str) -> Store {
        self.store.shard(self.store.shards().home(id))
    }

    /// Starts a workflow; returns its id and whether it is new. `room`: how
    /// many queues this caller may bring the cluster to
    /// ([`crate::config::TasksConfig::queue_room`]).
    pub async fn create(&self, plan: &Plan, node: &str, room: u32) -> Result<(String, bool), WorkflowError> {
        let call = scripts::Create {
            id: &plan.id,
            policy: plan.policy.as_str(),
            idempotency_key: &plan.idempotency_key,
            idempotency_window_ms: self.tasks.idempotency_window_ms,
            retention_ms: self.tasks.retention_ms,
            node,
            max_queues: room.min(self.tasks.max_queues),
            dead_retention_ms: self.tasks.dead_retention_ms,
            keys: &plan.keys,
        };
        let created = match self.at(&plan.id).run(&self.scripts.create, &call).await? {
            CreateReply::Created { id } => (id, true),
            CreateReply::Replayed { id } => (id, false),
            CreateReply::TooManyQueues if room < self.tasks.max_queues => {
                return Err(WorkflowError::QueuesKeptForAdmin {
                    room,
                    max: self.tasks.max_queues,
                });
            }
            CreateReply::TooManyQueues => return Err(WorkflowError::TooManyQueues(self.tasks.max_queues)),
            CreateReply::UnknownLimit(name) => return Err(WorkflowError::UnknownLimit(name)),
        };
        // This node's claims look in the workflow's shard at once.
        let shard = self.store.shards().home(&created.0);
        for q in &plan.queues {
            self.routing.note_queue_in(q, shard);
        }
        Ok(created)
    }

    pub async fn cancel(&self, id: &str, actor: &str) -> Result<(), WorkflowError> {
        let call = scripts::Cancel { id, actor };
        match self.at(id).run(&self.scripts.cancel, &call).await? {
            CancelReply::Cancelled => Ok(()),
            CancelReply::Finished { state } => Err(WorkflowError::Finished(id.into(), state)),
            CancelReply::NotFound => Err(WorkflowError::NotFound(id.into())),
        }
    }

    /// One workflow with every task's state (two pipelined round trips).
    pub async fn get(&self, id: &str) -> Result<Workflow, WorkflowError> {
        let store = self.at(id);
        let key = |part| scripts::workflow_key(store.keys(), id, part);
        let mut p = redis::pipe();
        p.cmd("HGETALL").arg(key(None));
        p.cmd("HGETALL").arg(key(Some("spec")));
        p.cmd("HGETALL").arg(key(Some("st")));
        let (h, spec, st): (
            BTreeMap<String, String>,
            BTreeMap<String, String>,
            BTreeMap<String, String>,
        ) = store.pipe("workflow_get", &p).await?;
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
                    .arg(format!("{}:task:{}", store.keys().prefix(), nodes[i].task_id))
                    .arg("state");
            }
            let states: Vec<Option<String>> = store.pipe("workflow_task_states", &p).await?;
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
    /// Each shard keeps an index of its own; with several they are merged by
    /// creation time.
    pub async fn list(
        &self,
        state: Option<&str>,
        limit: usize,
        cursor: usize,
    ) -> Result<(Vec<WorkflowSummary>, Option<usize>), WorkflowError> {
        let n = self.store.shard_count();
        let mut out = Vec::new();
        let mut at = cursor;
        // Scan at most ten pages of the index to fill one page of a state.
        for _ in 0..10 {
            let window = limit * 2;
            // With several shards each is read from its start down to the
            // page's end, and the merge skips what earlier pages showed.
            let reads = self.store.every_shard().map(|s| {
                let i = s.shard_index();
                let key = scripts::workflows_key(s.keys());
                let (from, to) = if n == 1 {
                    (at, at + window - 1)
                } else {
                    (0, at + window - 1)
                };
                async move {
                    let ids: Vec<(String, f64)> = s
                        .query(
                            "workflows_ids",
                            redis::cmd("ZRANGE")
                                .arg(&key)
                                .arg(from)
                                .arg(to)
                                .arg("REV")
                                .arg("WITHSCORES"),
                        )
                        .await?;
                    Ok::<_, StoreError>(ids.into_iter().map(move |(id, score)| (id, score, i)))
                }
            });
            let mut ids: Vec<(String, f64, usize)> = futures_util::future::try_join_all(reads)
                .await?
                .into_iter()
                .flatten()
                .collect();
            if n > 1 {
                ids.sort_by(|a, b| b.1.total_cmp(&a.1));
                ids = ids.into_iter().skip(at).take(window).collect();
            }
            if ids.is_empty() {
                return Ok((out, None));
            }
            let rows = self.summaries(&ids).await?;
            for ((id, _, _), row) in ids.iter().zip(rows) {
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

    /// The summary fields of each (id, _, shard), in order: one pipelined
    /// round trip per shard, at once.
    async fn summaries(&self, ids: &[(String, f64, usize)]) -> Result<Vec<Vec<Option<String>>>, StoreError> {
        let mut parts: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, (_, _, shard)) in ids.iter().enumerate() {
            parts.entry(*shard).or_default().push(i);
        }
        let reads = parts.into_iter().map(|(shard, at)| {
            let s = self.store.shard(shard);
            let mut p = redis::pipe();
            for &i in &at {
                p.cmd("HMGET")
                    .arg(scripts::workflow_key(s.keys(), &ids[i].0, None))
                    .arg("state")
                    .arg("created_at")
                    .arg("finished_at")
                    .arg("n")
                    .arg("open");
            }
            async move {
                let rows: Vec<Vec<Option<String>>> = s.pipe("workflows_rows", &p).await?;
                Ok::<_, StoreError>(at.into_iter().zip(rows))
            }
        });
        let mut out = vec![Vec::new(); ids.len()];
        for (i, row) in futures_util::future::try_join_all(reads).await?.into_iter().flatten() {
            out[i] = row;
        }
        Ok(out)
    }

    /// Trims the indexes of workflows past retention in shard `s` (the
    /// janitor, per shard).
    pub async fn janitor_in(&self, s: &Store) -> Result<i64, WorkflowError> {
        let call = scripts::Janitor {
            retention_ms: self.tasks.retention_ms,
            limit: 1000,
        };
        Ok(s.run(&self.scripts.janitor, &call).await?.forgotten as i64)
    }

    /// The store, for the per-shard loop.
    pub fn store(&self) -> &Store {
        &self.store
    }
}

#[cfg(test)]
mod tests;
