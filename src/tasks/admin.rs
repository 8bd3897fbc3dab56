//! Changing queues and groups: pause and resume (and converging them across
//! shards), group limits, and each shard's janitor pass.

use std::collections::BTreeMap;

use super::{TaskError, Tasks, scripts};
use crate::store::Store;

/// A template key not named, taken from or in use for this many janitor
/// intervals (a minute by default) is forgotten, and frees its room under
/// `tasks.max_limit_keys`.
const LIMIT_KEY_IDLE_PASSES: u64 = 12;

impl Tasks {
    /// Pauses or resumes a queue. Returns whether it changed. A split
    /// namespace pauses the queue in every shard (a group's tasks of the
    /// queue may be in any): the queue's own shard first, which decides,
    /// versions the change and emits the event (its failure is the answer);
    /// then every other shard at once, with that version. A shard that fails
    /// there does not fail the call: the queue shows `pausing` or `resuming`
    /// until every shard has it, which the janitors of every node bring
    /// about ([`Tasks::converge_pause`]), as would calling again.
    pub async fn set_paused(&self, queue: &str, paused: bool, actor: &str) -> Result<bool, TaskError> {
        let home = self.home(queue, "");
        let call = |version| scripts::Pause {
            queue,
            paused,
            actor,
            max_queues: self.cfg.max_queues,
            version,
        };
        let (changed, version) = self
            .store
            .shard(home)
            .run(&self.scripts.pause, &call(None))
            .await?
            .0
            .map_err(|_| TaskError::TooManyQueues(self.cfg.max_queues))?;
        if self.sharded() {
            let others = self.store.other_shards(home).map(|s| {
                let call = call(Some(version));
                async move { (s.shard_index(), s.run(&self.scripts.pause, &call).await) }
            });
            for (s, r) in futures_util::future::join_all(others).await {
                match r {
                    Ok(scripts::PauseReply(Ok(_))) => {}
                    Ok(scripts::PauseReply(Err(_))) => {
                        tracing::warn!(
                            queue,
                            shard = s,
                            "the queue's pause cannot be copied: that shard is at tasks.max_queues"
                        );
                    }
                    Err(e) => {
                        metrics::counter!("muster_pause_deferred_total").increment(1);
                        tracing::warn!(queue, shard = s, error = %e, "the queue's pause reaches this shard later (the janitors converge it)");
                    }
                }
            }
        }
        Ok(changed)
    }

    /// Split namespaces: brings shard `shard` in line with the pause state of
    /// every queue whose own shard decided a newer one (a shard that missed
    /// a pause or resume when its master failed). `rows` are every shard's
    /// latest janitor rows, `mine` this shard's; returns how many queues it
    /// changed. Each copy is versioned, so a stale row never undoes a newer
    /// change (see `pause.lua`).
    pub async fn converge_pause(&self, shard: usize, rows: &[Vec<(String, [i64; 10])>]) -> Result<usize, TaskError> {
        let Some(mine) = rows.get(shard) else { return Ok(0) };
        let have: BTreeMap<&str, i64> = mine.iter().map(|(q, r)| (q.as_str(), r[9])).collect();
        let mut wanted = Vec::new();
        for (home, home_rows) in rows.iter().enumerate() {
            if home == shard {
                continue;
            }
            for (q, r) in home_rows {
                if self.home(q, "") != home {
                    continue;
                }
                let (paused, version) = (r[8] == 1, r[9]);
                let behind = match have.get(q.as_str()) {
                    Some(&v) => v < version,
                    // Not registered here: only a pause needs copying.
                    None => paused,
                };
                if behind && version > 0 {
                    wanted.push((q.clone(), paused, version));
                }
            }
        }
        let store = self.store.shard(shard);
        let mut changed = 0;
        for (q, paused, version) in wanted {
            let call = scripts::Pause {
                queue: &q,
                paused,
                actor: "janitor",
                max_queues: self.cfg.max_queues,
                version: Some(version),
            };
            if let Ok((true, _)) = store.run(&self.scripts.pause, &call).await?.0 {
                changed += 1;
            }
        }
        Ok(changed)
    }

    /// Sets (or with None clears) a group's limit. Returns the slots in use.
    pub async fn set_group_limit(&self, group: &str, limit: Option<u32>, actor: &str) -> Result<u64, TaskError> {
        let call = scripts::SetGroup {
            group,
            limit,
            max_groups: self.cfg.max_groups,
            actor,
        };
        let r = self
            .store
            .shard(self.home("", group))
            .run(&self.scripts.set_group, &call)
            .await?;
        match r.code {
            Err(_) => Err(TaskError::TooManyGroups(self.cfg.max_groups)),
            Ok(_) => Ok(r.running),
        }
    }

    /// One janitor pass in shard `store`: the cross-queue dead index, then
    /// every queue of the shard. Returns the stats it saw per queue (the
    /// background loop runs it per shard, each on its own cadence).
    pub async fn janitor_in(&self, store: &Store) -> Result<Vec<(String, [i64; 10])>, TaskError> {
        // First and on its own, so it runs even when no queue is left.
        let call = scripts::TrimDead {
            dead_retention_ms: self.cfg.dead_retention_ms,
        };
        store.run(&self.scripts.trim_dead, &call).await?;
        if store.shard_index() == 0 {
            // The limits' shard: template keys no longer in use.
            let call = scripts::LimitKeys {
                idle_ms: self.cfg.janitor_interval_ms * LIMIT_KEY_IDLE_PASSES,
            };
            store.run(&self.scripts.limit_keys, &call).await?;
        }
        let names: Vec<String> = store
            .query(
                "queues_names",
                redis::cmd("SMEMBERS").arg(format!("{}:queues", store.keys().prefix())),
            )
            .await?;
        let mut out = Vec::with_capacity(names.len());
        for q in names {
            let call = scripts::Janitor {
                queue: &q,
                retention_ms: self.cfg.retention_ms,
                dead_retention_ms: self.cfg.dead_retention_ms,
            };
            let r = store.run(&self.scripts.janitor, &call).await?;
            let mut row = [0i64; 10];
            for (slot, v) in row.iter_mut().zip(r) {
                *slot = v;
            }
            out.push((q, row));
        }
        Ok(out)
    }
}
