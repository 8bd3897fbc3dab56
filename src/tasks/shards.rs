//! Where a task lives in a namespace split into shards (`redis.shards`,
//! `docs/sharding.md`), and which shards hold a queue's tasks.
//!
//! A task is stored in its home shard: its concurrency group's if it names
//! one (so a group's limit stays one atomic check, whatever the queues of
//! its tasks), else its queue's. Its id is drawn into that shard, so every
//! call that names a task goes straight to its shard. A queue's tasks are
//! therefore in the queue's shard and in the shards of the groups its tasks
//! name; a claim tries the queue's shard first, then those others, which it
//! learns from each shard's set of queues (read at most once a second),
//! this node's own submits, and the events (an event of a queue from a
//! shard's stream: that shard holds its tasks). With one shard every
//! function here is the identity: shard 0, one call.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::Tasks;
use crate::store::{Store, StoreError};

/// How long the shards a queue is known in are trusted before they are read
/// again: a grouped task submitted through another node into a shard its
/// queue was not known in waits at most this long (plus the claim's own
/// wait) before claims look there.
const REFRESH: Duration = Duration::from_secs(1);

/// Which shards have registered which queue (a bit per shard).
#[derive(Default)]
pub(super) struct QueueShards {
    read_at: Option<Instant>,
    mask: HashMap<String, u64>,
}

impl Tasks {
    /// Whether the namespace is split.
    pub(super) fn sharded(&self) -> bool {
        self.store.shards().len() > 1
    }

    /// The shard a task of `queue` in `group` (empty: none) is stored in.
    pub(super) fn home(&self, queue: &str, group: &str) -> usize {
        let map = self.store.shards();
        if map.len() == 1 {
            0
        } else if group.is_empty() {
            map.home(queue)
        } else {
            map.home(group)
        }
    }

    /// The view of the shard that holds task `id` (its id names it).
    pub(super) fn at(&self, id: &str) -> Store {
        self.store.shard(self.store.shards().home(id))
    }

    /// Notes that `shard` holds tasks of `queue` (this node just put some
    /// there: a submit, a workflow, a schedule), so claims look there before
    /// the next read.
    pub fn note_queue_in(&self, queue: &str, shard: usize) {
        if self.sharded() {
            let mut known = self.queue_shards.lock().unwrap_or_else(|p| p.into_inner());
            *known.mask.entry(queue.to_string()).or_default() |= 1 << shard;
        }
    }

    /// The shards that may hold tasks of `queue`: its own first, then every
    /// other shard that has registered it.
    pub(super) async fn shards_of(&self, queue: &str) -> Result<Vec<usize>, StoreError> {
        let home = self.home(queue, "");
        if !self.sharded() {
            return Ok(vec![home]);
        }
        let stale = {
            let known = self.queue_shards.lock().unwrap_or_else(|p| p.into_inner());
            known.read_at.is_none_or(|t| t.elapsed() >= REFRESH)
        };
        if stale {
            let fresh = self.read_queue_shards().await?;
            let mut known = self.queue_shards.lock().unwrap_or_else(|p| p.into_inner());
            *known = QueueShards {
                read_at: Some(Instant::now()),
                mask: fresh,
            };
        }
        let seen = self.bus.take_seen_queues();
        let mask = {
            let mut known = self.queue_shards.lock().unwrap_or_else(|p| p.into_inner());
            for (q, bits) in seen {
                *known.mask.entry(q).or_default() |= bits;
            }
            known.mask.get(queue).copied().unwrap_or(0)
        };
        let mut out = vec![home];
        out.extend((0..self.store.shards().len()).filter(|&s| s != home && mask & (1 << s) != 0));
        Ok(out)
    }

    /// Every shard's set of queues, one read per shard at once.
    async fn read_queue_shards(&self) -> Result<HashMap<String, u64>, StoreError> {
        let names = self.queue_names_by_shard().await?;
        let mut mask: HashMap<String, u64> = HashMap::new();
        for (shard, names) in names.into_iter().enumerate() {
            for q in names {
                *mask.entry(q).or_default() |= 1 << shard;
            }
        }
        Ok(mask)
    }

    /// The queues each shard has registered, in shard order.
    pub(super) async fn queue_names_by_shard(&self) -> Result<Vec<Vec<String>>, StoreError> {
        futures_util::future::try_join_all((0..self.store.shards().len()).map(|i| async move {
            let s = self.store.shard(i);
            let key = format!("{}:queues", s.keys().prefix());
            s.query::<Vec<String>>("queues_names", redis::cmd("SMEMBERS").arg(key))
                .await
        }))
        .await
    }
}

// `redis.shards` is bounded so that every shard has a bit in a mask.
const _: () = assert!(crate::config::MAX_SHARDS <= u64::BITS);
