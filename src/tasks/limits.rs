//! Flow-control limits (G13): the service side. A limit's settings, bucket
//! and slots live in the namespace's one shard, or in shard 0 of a split
//! namespace. There a claim takes tokens and slots in the same script that
//! hands the task out (see `lua/lib.lua`, `claim_tasks`): tasks with limits
//! of their own are placed in shard 0, and so are the queues' tasks there.
//! A queue with limits whose tasks are in another shard is marked there
//! ([`Tasks::set_queue_limits`]); a claim there reserves in shard 0 first
//! (`claim.rs`, `claim_reserved`), and the slots of its tasks come back
//! through the shard's outbox ([`Tasks::return_limit_slots`]).

use muster_api::limits::{LimitInfo, LimitSpec, Rate};

use super::{TaskError, Tasks, scripts};
use crate::store::{Code, Store, StoreError};

/// Entries handed from a shard's outbox to shard 0 per call.
pub(super) const RETURN_BATCH: usize = 200;

impl Tasks {
    /// The shard that holds limits: the only one, or shard 0.
    fn limits_shard(&self) -> Store {
        self.store.shard(0)
    }

    /// Defines or changes limit `name` (validated). Returns it as it is now,
    /// and whether it was created.
    pub async fn set_limit(&self, name: &str, spec: &LimitSpec, actor: &str) -> Result<(LimitInfo, bool), TaskError> {
        let store = self.limits_shard();
        let call = scripts::LimitSet {
            name,
            concurrency: spec.concurrency.unwrap_or(0),
            rate: spec.rate.map(|r| (r.max, r.per_ms, r.burst)),
            max_limits: self.cfg.max_limits,
            actor,
        };
        let created = match store.run(&self.scripts.limit_set, &call).await?.0 {
            Ok(created) => created,
            Err(_) => return Err(TaskError::TooManyLimits(self.cfg.max_limits)),
        };
        Ok((self.limit(name).await?, created))
    }

    /// Limit `name` (a limit, a template or a template's key) and its use.
    pub async fn limit(&self, name: &str) -> Result<LimitInfo, TaskError> {
        let store = self.limits_shard();
        let row = store
            .run(&self.scripts.limit_read, &scripts::LimitRead { name })
            .await?
            .0
            .ok_or_else(|| TaskError::LimitNotFound(name.to_string()))?;
        let mut waiting = row.waiting;
        if self.sharded() && !row.queues.is_empty() {
            // The queues' tasks in the other shards wait on it too (read at
            // once, not one shard after another).
            let call = scripts::Counts { queues: &row.queues };
            let reads = self.store.other_shards(0).map(|s| {
                let call = &call;
                async move { s.run(&self.scripts.counts, call).await }
            });
            for counts in futures_util::future::try_join_all(reads).await? {
                waiting += counts.0.iter().map(|c| c.queued).sum::<u64>();
            }
        }
        Ok(LimitInfo {
            name: name.to_string(),
            concurrency: (row.concurrency > 0).then_some(row.concurrency),
            rate: row.rate.map(|(max, per_ms, burst)| Rate { max, per_ms, burst }),
            running: row.running,
            tokens: row.tokens,
            waiting,
            queues: row.queues,
        })
    }

    /// The refusal of a submit naming template key `name` past
    /// `tasks.max_limit_keys`.
    pub fn too_many_limit_keys(&self, name: String) -> TaskError {
        TaskError::TooManyLimitKeys {
            name,
            max: self.cfg.max_limit_keys,
        }
    }

    /// Every limit and template, by name (at most `tasks.max_limits`).
    pub async fn limits(&self) -> Result<Vec<LimitInfo>, TaskError> {
        let store = self.limits_shard();
        let key = format!("{}:limits", store.keys().prefix());
        let mut names: Vec<String> = store.query("limits_names", redis::cmd("SMEMBERS").arg(key)).await?;
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            match self.limit(&n).await {
                Ok(l) => out.push(l),
                // Deleted meanwhile.
                Err(TaskError::LimitNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Removes limit `name`.
    pub async fn delete_limit(&self, name: &str, actor: &str) -> Result<(), TaskError> {
        let store = self.limits_shard();
        let r = store
            .run(&self.scripts.limit_delete, &scripts::LimitDelete { name, actor })
            .await?;
        match Code::from_i64(r.first().copied().unwrap_or(1)) {
            Some(Code::NotFound) => Err(TaskError::LimitNotFound(name.to_string())),
            _ => Ok(()),
        }
    }

    /// Sets the limits that bind every task of `queue` (empty: none). On a
    /// split namespace every other shard is marked first (a claim there then
    /// reserves in shard 0, where nothing is set yet: it reserves without
    /// limits), and shard 0 last: a failure on the way leaves the limits
    /// unset (and the call answers the error, to be repeated), never set in
    /// shard 0 while a shard holding the queue's tasks ignores them.
    pub async fn set_queue_limits(&self, queue: &str, limits: &[String], actor: &str) -> Result<(), TaskError> {
        let store = self.limits_shard();
        let call = scripts::QueueLimitsSet { queue, limits, actor };
        if self.sharded() {
            let marks = self.store.other_shards(0).map(|s| {
                let call = &call;
                async move { s.run(&self.scripts.queue_limits, call).await }
            });
            futures_util::future::try_join_all(marks).await?;
        }
        store
            .run(&self.scripts.queue_limits, &call)
            .await?
            .0
            .map_err(TaskError::UnknownLimit)
    }

    /// The limits of `queue` (empty: none).
    pub async fn queue_limits(&self, queue: &str) -> Result<Vec<String>, TaskError> {
        let store = self.limits_shard();
        let key = format!("{}:q:{queue}:limits", store.keys().prefix());
        let list: Option<String> = store.query("queue_limits", redis::cmd("GET").arg(key)).await?;
        Ok(list
            .unwrap_or_default()
            .split(',')
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// Split namespaces: hands the outbox of `shard` (not 0) to shard 0,
    /// giving back the slots of tasks that ended there, then removes what it
    /// handed over. Idempotent (two nodes may hand over the same entries).
    /// Returns how many entries it handed over.
    pub async fn return_limit_slots(&self, shard: &Store) -> Result<usize, StoreError> {
        if !self.sharded() || shard.shard_index() == 0 {
            return Ok(0);
        }
        let key = format!("{}:limit_out", shard.keys().prefix());
        let entries: Vec<String> = shard
            .query(
                "limit_out",
                redis::cmd("ZRANGE").arg(&key).arg(0).arg(RETURN_BATCH as i64 - 1),
            )
            .await?;
        if entries.is_empty() {
            return Ok(0);
        }
        let call = scripts::LimitReturn { entries: &entries };
        self.store.shard(0).run(&self.scripts.limit_return, &call).await?;
        shard
            .query::<i64>("limit_out", redis::cmd("ZREM").arg(&key).arg(&entries))
            .await?;
        Ok(entries.len())
    }
}
