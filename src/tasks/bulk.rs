//! Bulk actions on dead letters: retry or discard every dead task (of one
//! queue, or of all), oldest first, up to an optional count.
//!
//! Invariant: each script call handles one bounded page (`PAGE` tasks,
//! `dead_bulk.lua`), so Redis never runs one long script however many dead
//! letters there are; between pages other calls run. Each task is retried
//! or discarded by the same library code as the single-task operations, in
//! its own atomic step, so a bulk action stopped halfway (a node killed, a
//! timeout) leaves every task either done or still dead, never between. A
//! retry that cannot register a forgotten queue (tasks.max_queues) leaves
//! the task dead and is counted as refused; the action stops when a page
//! makes no progress.

use redis::{FromRedisValue, ParsingError, Value};

use super::{TaskError, Tasks};
use crate::store::reply::read;
use crate::store::{Keys, ScriptCall};

/// Dead tasks handled per script call.
pub(crate) const PAGE: u64 = 500;
/// The most a single request may ask for.
pub(crate) const MAX_TASKS: u64 = 10_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAction {
    Retry,
    Discard,
}

impl BulkAction {
    fn as_str(self) -> &'static str {
        match self {
            BulkAction::Retry => "retry",
            BulkAction::Discard => "discard",
        }
    }
}

pub(crate) use muster_api::tasks::BulkOutcome;

/// `dead_bulk.lua`: one page.
pub(crate) struct DeadBulk<'a> {
    pub queue: Option<&'a str>,
    pub action: BulkAction,
    pub max: u64,
    pub actor: &'a str,
    pub max_queues: u32,
}

pub(crate) struct DeadBulkReply {
    pub done: u64,
    pub left: u64,
    pub refused: u64,
}

impl FromRedisValue for DeadBulkReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(DeadBulkReply {
                done: r.int("done")?.max(0) as u64,
                left: r.int("left")?.max(0) as u64,
                refused: r.int("refused")?.max(0) as u64,
            })
        })
    }
}

impl ScriptCall for DeadBulk<'_> {
    type Reply = DeadBulkReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![match self.queue {
            Some(q) => format!("{}:q:{q}:dead", k.prefix()),
            None => format!("{}:dead", k.prefix()),
        }]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.action.as_str().to_string(),
            self.max.to_string(),
            self.actor.to_string(),
            self.max_queues.to_string(),
        ]
    }
}

impl Tasks {
    /// Retries or discards up to `limit` dead tasks (of `queue`, or of all
    /// queues), oldest first, one bounded page per script call.
    pub async fn dead_bulk(
        &self,
        queue: Option<&str>,
        action: BulkAction,
        limit: u64,
        actor: &str,
    ) -> Result<BulkOutcome, TaskError> {
        let mut out = BulkOutcome::default();
        // Shard by shard (one shard: the whole set, oldest first).
        for store in self.store.every_shard() {
            let shard = store.shard_index();
            let (mut left, mut refused) = (0, 0);
            while out.done < limit {
                let call = DeadBulk {
                    queue,
                    action,
                    max: PAGE.min(limit - out.done),
                    actor,
                    max_queues: self.cfg.max_queues,
                };
                let r = store.run(&self.scripts.dead_bulk, &call).await?;
                out.pages += 1;
                out.done += r.done;
                (left, refused) = (r.left, r.refused);
                if r.done == 0 || r.left == 0 {
                    break;
                }
            }
            if out.done >= limit && shard + 1 < self.store.shard_count() {
                // The shards not reached still hold theirs.
                left += self.dead_left(shard + 1, queue).await?;
            }
            out.left += left;
            out.refused += refused;
            if out.done >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// The dead letters (of `queue`, or of all) in shards `from..`.
    async fn dead_left(&self, from: usize, queue: Option<&str>) -> Result<u64, TaskError> {
        let mut left = 0;
        for store in self.store.shards_from(from) {
            let p = store.keys().prefix();
            let key = match queue {
                Some(q) => format!("{p}:q:{q}:dead"),
                None => format!("{p}:dead"),
            };
            left += store.query::<u64>("dead_count", redis::cmd("ZCARD").arg(key)).await?;
        }
        Ok(left)
    }
}
