//! Cron schedules that fire exactly once per occurrence across the cluster.
//!
//! Every node runs the scheduler ([`worker`]); none is special. A schedule's
//! occurrences are computed on the node (croner, in the schedule's IANA time
//! zone, DST included), but whether an occurrence is due is decided inside
//! Redis by Redis time, and each due occurrence gets its one outcome (fired,
//! skipped_overlap or missed) in one script, `lua/fire.lua`.
//!
//! Invariants:
//! - G7 exactly once: an occurrence T is fired by at most one script call,
//!   cluster-wide. The script moves the schedule's cursor (the latest
//!   occurrence with an outcome) past T in the same atomic step as it records
//!   (schedule, T) with `SET NX` and a TTL, submits the task with the
//!   idempotency key `schedule:<id>:<T>`, appends to the bounded history and
//!   emits `schedule.fired`. A node that crashes mid-call leaves either all of
//!   that or none of it.
//! - G7 never missed by a slow clock: a node proposes the occurrences from the
//!   cursor up to its own clock plus `schedules.max_skew_ms`, so a node whose
//!   clock lags by up to that bound still proposes every due occurrence on
//!   time, and one whose clock runs ahead proposes occurrences the script
//!   refuses until Redis time reaches them (G11).
//! - Missed occurrences follow the schedule's policy: later than
//!   `starting_deadline_ms` they are missed, never run; after an outage
//!   (lateness beyond `max_skew_ms`) only the latest due occurrence runs unless
//!   `backfill` is set. Missed runs are recorded and counted.
//! - G4: occurrence records carry a TTL; the history is a list trimmed to
//!   `schedules.history_max`; schedules are bounded by
//!   `schedules.max_schedules`; a deleted schedule leaves only records that
//!   expire.
//! - Every state change emits its event in the same script (G9).

mod def;
pub(crate) mod routes;
mod scripts;
mod timing;
mod view;
pub(crate) mod worker;

use std::collections::{BTreeMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, TimeZone};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use redis::Value;

use self::scripts::{DeleteReply, Scripts, SetEnabledReply, TriggerReply, UpsertMode, UpsertReply};
use crate::config::{SchedulesConfig, TasksConfig};
use crate::problem::Invalid;
use crate::problem::{Classify, Kind};
use crate::store::{ScriptCtx, Store, StoreError};
use crate::tasks::{NewTask, TaskSpec};

pub(crate) use self::def::{Checked, check};
pub(crate) use self::timing::Timing;
use self::view::{redis_ms, schedule_from};
pub(crate) use muster_api::schedules::{HistoryEntry, Schedule, Triggered};
pub(crate) use muster_api::{Overlap, ScheduleDef};

/// Why a schedule operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// 404
    #[error("no schedule `{0}`")]
    NotFound(String),
    /// 409
    #[error("schedule `{0}` already exists; PUT /api/v1/schedules/{0} replaces it")]
    Exists(String),
    /// 409
    #[error(
        "schedule `{0}` is defined in this node's config.toml ([[schedules.items]]), which wins at every start; change or remove it there"
    )]
    InThisConfig(String),
    /// 409
    #[error(
        "schedule `{0}` was written from a node's config.toml ([[schedules.items]]), and config wins: change it there. \
         Once no node's config.toml defines it any more, DELETE /api/v1/schedules/{0}?force=true removes it"
    )]
    FromConfig(String),
    /// 409
    #[error(
        "the cluster already has the maximum of {0} schedules (schedules.max_schedules, counted per shard when redis.shards > 1): delete one or raise the limit"
    )]
    TooMany(u32),
    /// 409
    #[error(
        "not fired: the overlap policy is forbid and the previous occurrence's task {0} is still live; cancel it or wait"
    )]
    Overlap(String),
    /// 409
    #[error("the cluster already has the maximum of {0} queues (tasks.max_queues)")]
    TooManyQueues(u32),
    /// 409
    #[error(
        "the task names the limit `{0}`, which is not defined: define it with PUT /api/v1/limits/{0} (a key \
         `name:key` needs its template `name:*`)"
    )]
    UnknownLimit(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Classify for ScheduleError {
    fn kind(&self) -> Kind {
        match self {
            ScheduleError::NotFound(_) => Kind::NotFound,
            ScheduleError::Overlap(task) => Kind::Conflict(serde_json::json!({"task": task})),
            ScheduleError::Exists(_)
            | ScheduleError::InThisConfig(_)
            | ScheduleError::FromConfig(_)
            | ScheduleError::TooMany(_)
            | ScheduleError::TooManyQueues(_)
            | ScheduleError::UnknownLimit(_) => Kind::Conflict(serde_json::Value::Null),
            ScheduleError::Store(s) => s.kind(),
        }
    }
}
/// How one fire script call ended (see `lua/fire.lua`, whose refusals are
/// the shared codes `E.NOT_FOUND`, `E.STALE` and `E.WRONG_STATE`). The
/// discriminant is [`FireResult::code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i64)]
pub enum FireOutcome {
    /// Every proposed occurrence was due and has its outcome.
    Done = 1,
    /// Stopped at a proposed occurrence not yet due (`wait_ms` until it is).
    NotDue = 0,
    /// The schedule is gone.
    NotFound = -1,
    /// The definition changed (another version) since it was read.
    Changed = -2,
    /// The schedule is disabled.
    Disabled = -3,
}

/// What one fire script call did (see `lua/fire.lua`).
#[derive(Debug, Clone)]
pub struct FireResult {
    pub outcome: FireOutcome,
    /// `outcome` as a number: 1 done, 0 not due, -1 no such schedule, -2 the
    /// definition changed, -3 disabled.
    pub code: i64,
    pub cursor: i64,
    pub fired: u64,
    pub skipped: u64,
    pub missed: u64,
    pub wait_ms: i64,
    /// The occurrences this call fired.
    pub fired_at: Vec<i64>,
}

/// The schedule service.
pub struct Schedules {
    store: Store,
    cfg: SchedulesConfig,
    tasks: TasksConfig,
    node_id: String,
    /// Ids defined in this node's config.toml: the API may not change them.
    config_ids: HashSet<String>,
    scripts: Scripts,
    /// Wakes this node's scheduler when a schedule is written through it, so
    /// a new schedule's first occurrence is not up to `interval_ms` late here
    /// (other nodes see it at their next pass).
    /// Per shard: woken when a schedule of that shard changes, so its
    /// scheduler loop looks again at once.
    pub(crate) changed: Vec<tokio::sync::Notify>,
    /// The task service, told which queue a trigger put a task in (its
    /// claim-routing cache), so this node's claims look in its shard at once.
    routing: Arc<crate::tasks::Tasks>,
    /// Starts a trace per occurrence fired (issue 39).
    tracer: crate::traces::Tracer,
}

impl Schedules {
    pub fn new(
        store: Store,
        cfg: SchedulesConfig,
        tasks: TasksConfig,
        node_id: String,
        ctx: &ScriptCtx,
        routing: Arc<crate::tasks::Tasks>,
        tracer: crate::traces::Tracer,
    ) -> Arc<Schedules> {
        let config_ids = cfg.items.iter().map(|d| d.id.clone()).collect();
        let shards = store.shard_count();
        for result in ["fired", "skipped_overlap", "missed"] {
            metrics::counter!("muster_schedule_fires_total", "result" => result).increment(0);
        }
        Arc::new(Schedules {
            store,
            cfg,
            tasks,
            node_id,
            config_ids,
            scripts: Scripts::new(ctx),
            changed: (0..shards).map(|_| tokio::sync::Notify::new()).collect(),
            routing,
            tracer,
        })
    }

    pub fn config(&self) -> &SchedulesConfig {
        &self.cfg
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Checks a definition against this node's task limits.
    pub fn check(&self, def: &ScheduleDef) -> Result<Checked, Invalid> {
        check(def, &self.tasks, self.store.shards())
    }

    /// Whether this node's config.toml defines `id`.
    pub fn in_config(&self, id: &str) -> bool {
        self.config_ids.contains(id)
    }

    /// The view of the shard schedule `id` lives in (the shard of its id).
    /// Wakes the scheduler loop of schedule `id`'s shard.
    fn changed_in(&self, id: &str) {
        self.changed[self.at(id).shard_index()].notify_one();
    }

    /// The store, for the per-shard loop.
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn at(&self, id: &str) -> Store {
        self.store.shard(self.store.shards().home(id))
    }

    /// A task id drawn into schedule `id`'s shard, where it fires.
    fn task_id(&self, id: &str) -> String {
        let map = self.store.shards();
        map.new_id(map.home(id))
    }

    /// Writes a checked definition with `upsert.lua`.
    async fn upsert(
        &self,
        c: &Checked,
        mode: UpsertMode,
        actor: &str,
        config_hash: &str,
    ) -> Result<UpsertReply, StoreError> {
        let d = &c.def;
        let t = &c.task;
        let spec = serde_json::to_string(d).unwrap_or_default();
        let fields: Vec<(&str, String)> = vec![
            ("expr", d.expression.clone()),
            ("tz", d.timezone.clone()),
            ("queue", d.queue.clone()),
            ("overlap", d.overlap.as_str().into()),
            ("backfill", if d.backfill { "1" } else { "0" }.into()),
            (
                "deadline",
                d.starting_deadline_ms.map(|v| v.to_string()).unwrap_or_default(),
            ),
            ("enabled", if d.enabled { "1" } else { "0" }.into()),
            ("spec", spec),
            ("payload", t.payload.clone()),
            ("group", t.group.clone()),
            ("limits", t.limits.join(",")),
            ("priority", t.priority.to_string()),
            ("max_attempts", t.max_attempts.to_string()),
            ("timeout_ms", t.timeout_ms.to_string()),
            ("backoff_base", t.backoff_base_ms.to_string()),
            ("backoff_cap", t.backoff_cap_ms.to_string()),
        ];
        let call = scripts::Upsert {
            id: &d.id,
            mode,
            actor,
            max_schedules: self.cfg.max_schedules,
            config_hash,
            fields,
        };
        self.at(&d.id).run(&self.scripts.upsert, &call).await
    }

    /// Creates a schedule; refused if the id exists.
    pub async fn create(&self, c: &Checked, actor: &str) -> Result<(), ScheduleError> {
        if self.in_config(&c.def.id) {
            return Err(ScheduleError::InThisConfig(c.def.id.clone()));
        }
        match self.upsert(c, UpsertMode::Create, actor, "").await? {
            UpsertReply::Exists => Err(ScheduleError::Exists(c.def.id.clone())),
            UpsertReply::TooMany => Err(ScheduleError::TooMany(self.cfg.max_schedules)),
            UpsertReply::FromConfig => Err(ScheduleError::FromConfig(c.def.id.clone())),
            UpsertReply::UnknownLimit(name) => Err(ScheduleError::UnknownLimit(name)),
            UpsertReply::Created { .. } | UpsertReply::Replaced { .. } | UpsertReply::Unchanged { .. } => {
                self.changed_in(&c.def.id);
                Ok(())
            }
        }
    }

    /// Creates or replaces a schedule. Returns true if it was created.
    /// Refused for a schedule written from config.toml, by any node.
    pub async fn put(&self, c: &Checked, actor: &str) -> Result<bool, ScheduleError> {
        if self.in_config(&c.def.id) {
            return Err(ScheduleError::InThisConfig(c.def.id.clone()));
        }
        match self.upsert(c, UpsertMode::Put, actor, "").await? {
            UpsertReply::TooMany => Err(ScheduleError::TooMany(self.cfg.max_schedules)),
            UpsertReply::FromConfig => Err(ScheduleError::FromConfig(c.def.id.clone())),
            // Exists: mode create only.
            UpsertReply::Exists => Err(ScheduleError::Exists(c.def.id.clone())),
            UpsertReply::UnknownLimit(name) => Err(ScheduleError::UnknownLimit(name)),
            reply => {
                self.changed_in(&c.def.id);
                Ok(matches!(reply, UpsertReply::Created { .. }))
            }
        }
    }

    /// Writes this node's `[[schedules.items]]` into Redis: config wins for its
    /// ids. An entry whose config text is unchanged since it was last written
    /// is left alone. Returns how many were created or replaced.
    pub async fn reconcile(&self) -> Result<usize, ScheduleError> {
        let mut changed = 0;
        for def in &self.cfg.items {
            // Checked when the configuration was loaded; a failure here is a bug.
            let c = match self.check(def) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(schedule = %def.id, error = %e, "config schedule is invalid; skipped");
                    continue;
                }
            };
            let text = serde_json::to_string(def).unwrap_or_default();
            let hash = format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(text.as_bytes()));
            match self.upsert(&c, UpsertMode::Config, &self.node_id, &hash).await? {
                UpsertReply::TooMany => return Err(ScheduleError::TooMany(self.cfg.max_schedules)),
                UpsertReply::Created { .. } | UpsertReply::Replaced { .. } => changed += 1,
                // Unchanged; Exists and FromConfig are not answers to mode config.
                UpsertReply::Unchanged { .. }
                | UpsertReply::Exists
                | UpsertReply::FromConfig
                | UpsertReply::UnknownLimit(_) => {}
            }
        }
        Ok(changed)
    }

    /// Deletes a schedule and its history. A schedule written from
    /// config.toml is refused unless `force` (its entry was removed from every
    /// node's config); one in this node's config is refused even then, since
    /// this node would write it back at its next start.
    pub async fn delete(&self, id: &str, actor: &str, force: bool) -> Result<(), ScheduleError> {
        if self.in_config(id) {
            return Err(ScheduleError::InThisConfig(id.into()));
        }
        let call = scripts::Delete { id, actor, force };
        match self.at(id).run(&self.scripts.delete, &call).await? {
            DeleteReply::Deleted => Ok(()),
            DeleteReply::NotFound => Err(ScheduleError::NotFound(id.into())),
            DeleteReply::FromConfig => Err(ScheduleError::FromConfig(id.into())),
        }
    }

    /// Enables or disables a schedule (config schedules too: an operator's
    /// switch stands until their config entry changes). Returns true if it
    /// changed.
    pub async fn set_enabled(&self, id: &str, enabled: bool, actor: &str) -> Result<bool, ScheduleError> {
        let call = scripts::SetEnabled { id, enabled, actor };
        match self.at(id).run(&self.scripts.set_enabled, &call).await? {
            SetEnabledReply::NotFound => Err(ScheduleError::NotFound(id.into())),
            reply => {
                self.changed_in(id);
                Ok(matches!(reply, SetEnabledReply::Changed { .. }))
            }
        }
    }

    /// Fires a schedule now, outside its expression. `key`: the client's
    /// idempotency key (validated): a trigger with a key seen within
    /// `tasks.idempotency_window_ms` returns that trigger's task and fires nothing.
    pub async fn trigger(&self, id: &str, actor: &str, key: Option<&str>) -> Result<Triggered, ScheduleError> {
        let task_id = self.task_id(id);
        // Traced: the task joins the request's trace under a span of the
        // trigger (issue 39).
        let mut traceparent = String::new();
        let span = crate::traces::sending(&mut traceparent, "", false);
        let call = scripts::Trigger {
            id,
            actor,
            node: &self.node_id,
            task_id: &task_id,
            history_max: self.cfg.history_max,
            idempotency_window_ms: self.tasks.idempotency_window_ms,
            max_queues: self.tasks.max_queues,
            retention_ms: self.tasks.retention_ms,
            key,
            traceparent: &traceparent,
        };
        let reply = self.at(id).run(&self.scripts.trigger, &call).await?;
        if let (Some(span), TriggerReply::Fired { task, .. }) = (span, &reply) {
            span.finish(
                format!("schedule {id}"),
                vec![
                    ("muster.schedule.id", id.to_string().into()),
                    ("messaging.message.id", task.clone().into()),
                    ("muster.schedule.manual", true.into()),
                ],
            );
        }
        if let TriggerReply::Fired { queue, .. } | TriggerReply::Replayed { queue, .. } = &reply {
            // This node's claims look in the schedule's shard at once.
            self.routing.note_queue_in(queue, self.store.shards().home(id));
        }
        match reply {
            TriggerReply::Fired {
                task,
                occurrence,
                queue,
                replaced,
            } => {
                metrics::counter!("muster_schedule_fires_total", "result" => "fired").increment(1);
                Ok(Triggered {
                    schedule: id.into(),
                    task,
                    queue,
                    occurrence,
                    replaced,
                    replayed: false,
                })
            }
            TriggerReply::Replayed {
                task,
                occurrence,
                queue,
            } => Ok(Triggered {
                schedule: id.into(),
                task,
                queue,
                occurrence,
                replaced: None,
                replayed: true,
            }),
            TriggerReply::Skipped { live_task } => {
                metrics::counter!("muster_schedule_fires_total", "result" => "skipped_overlap").increment(1);
                Err(ScheduleError::Overlap(live_task))
            }
            TriggerReply::TooManyQueues => Err(ScheduleError::TooManyQueues(self.tasks.max_queues)),
            TriggerReply::NotFound => Err(ScheduleError::NotFound(id.into())),
        }
    }

    /// One fire script call: `occurrences` ascending, `after` the occurrence
    /// that follows the last of them.
    pub async fn fire(
        &self,
        id: &str,
        version: u64,
        occurrences: &[i64],
        after: Option<i64>,
    ) -> Result<FireResult, StoreError> {
        // The trace of each occurrence, should it fire (issue 39).
        let traces: Vec<_> = occurrences.iter().map(|_| self.tracer.new_root()).collect();
        let call = scripts::Fire {
            id,
            version,
            node: &self.node_id,
            grace_ms: self.cfg.max_skew_ms,
            record_ttl_ms: self.cfg.record_ttl_ms,
            history_max: self.cfg.history_max,
            idempotency_window_ms: self.tasks.idempotency_window_ms,
            max_queues: self.tasks.max_queues,
            retention_ms: self.tasks.retention_ms,
            after,
            occurrences: occurrences
                .iter()
                .zip(&traces)
                .map(|(t, trace)| {
                    let tp = trace.map(|c| c.traceparent()).unwrap_or_default();
                    (*t, self.task_id(id), tp)
                })
                .collect(),
        };
        let res = self.at(id).run(&self.scripts.fire, &call).await?;
        // Each occurrence fired starts a trace (tracing on): its root span.
        for (t, trace) in occurrences.iter().zip(&traces) {
            if let Some(ctx) = trace
                && res.fired_at.contains(t)
            {
                self.tracer.record_root(
                    ctx,
                    format!("schedule {id}"),
                    vec![
                        ("muster.schedule.id", id.to_string().into()),
                        ("muster.schedule.occurrence", (*t).into()),
                    ],
                );
            }
        }
        for (result, n) in [
            ("fired", res.fired),
            ("skipped_overlap", res.skipped),
            ("missed", res.missed),
        ] {
            if n > 0 {
                metrics::counter!("muster_schedule_fires_total", "result" => result).increment(n);
            }
        }
        Ok(res)
    }

    /// Each shard's view with the ids of its schedules (sorted), every
    /// shard read at once; shards without schedules are left out.
    async fn ids_by_shard(&self) -> Result<Vec<(Store, Vec<String>)>, StoreError> {
        let reads = self.store.every_shard().map(|s| async move {
            let key = scripts::schedules_key(s.keys());
            let mut ids: Vec<String> = s.query("schedule_ids", redis::cmd("SMEMBERS").arg(key)).await?;
            ids.sort();
            Ok::<_, StoreError>((s, ids))
        });
        let shards = futures_util::future::try_join_all(reads).await?;
        Ok(shards.into_iter().filter(|(_, ids)| !ids.is_empty()).collect())
    }

    /// The ids of every schedule (of every shard), sorted.
    pub async fn ids(&self) -> Result<Vec<String>, StoreError> {
        let mut ids: Vec<String> = self
            .ids_by_shard()
            .await?
            .into_iter()
            .flat_map(|(_, ids)| ids)
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Every schedule (without history): two pipelined round trips per
    /// shard, the shards at once.
    pub async fn list(&self) -> Result<Vec<Schedule>, StoreError> {
        let reads = self.ids_by_shard().await?.into_iter().map(|(s, ids)| async move {
            let mut p = redis::pipe();
            p.cmd("TIME");
            for id in &ids {
                p.cmd("HGETALL").arg(scripts::schedule_key(s.keys(), id));
            }
            let replies: Vec<Value> = s.pipe("schedule_list", &p).await?;
            let now = redis_ms(replies.first());
            let mut out = Vec::with_capacity(ids.len());
            for (id, v) in ids.iter().zip(replies.into_iter().skip(1)) {
                let m: BTreeMap<String, String> =
                    redis::from_redis_value(v).map_err(|e| StoreError::Decode(e.to_string()))?;
                if !m.is_empty() {
                    out.push(schedule_from(id, &m, now, Vec::new()));
                }
            }
            Ok::<_, StoreError>(out)
        });
        let mut out = futures_util::future::try_join_all(reads).await?.concat();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// One schedule with up to `history` history entries, or None.
    pub async fn get(&self, id: &str, history: usize) -> Result<Option<Schedule>, StoreError> {
        let store = self.at(id);
        let mut p = redis::pipe();
        p.cmd("TIME");
        p.cmd("HGETALL").arg(scripts::schedule_key(store.keys(), id));
        // LRANGE 0 -1 would be the whole list: ask for none as an empty range.
        let (start, stop) = if history == 0 { (1, 0) } else { (0, history as i64 - 1) };
        p.cmd("LRANGE")
            .arg(scripts::history_key(store.keys(), id))
            .arg(start)
            .arg(stop);
        let ((s, us), m, rows): ((i64, i64), BTreeMap<String, String>, Vec<String>) =
            store.pipe("schedule_get", &p).await?;
        if m.is_empty() {
            return Ok(None);
        }
        let hist = rows.iter().filter_map(|r| serde_json::from_str(r).ok()).collect();
        Ok(Some(schedule_from(id, &m, s * 1000 + us / 1000, hist)))
    }
}
