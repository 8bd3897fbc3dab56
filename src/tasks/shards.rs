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

/// How often each shard's set of queues is read again (per shard, in the
/// background): a grouped task submitted through another node into a shard
/// its queue was not known in waits at most this long (plus the claim's own
/// wait) before claims look there.
pub(super) const REFRESH: Duration = Duration::from_secs(1);

/// Which shards have registered which queue (a bit per shard), as last read
/// from each shard. A shard that cannot be read keeps its last known bits
/// (failure isolation: claims go on with what was known).
pub(super) struct QueueShards {
    /// Per shard: when its set was last read (None: never).
    read_at: Vec<Option<Instant>>,
    mask: HashMap<String, u64>,
}

impl QueueShards {
    pub(super) fn new(shards: usize) -> QueueShards {
        QueueShards {
            read_at: vec![None; shards],
            mask: HashMap::new(),
        }
    }

    /// Replaces shard `shard`'s bits with its set as just read.
    fn set_shard(&mut self, shard: usize, names: Vec<String>) {
        let bit = 1u64 << shard;
        for m in self.mask.values_mut() {
            *m &= !bit;
        }
        for q in names {
            *self.mask.entry(q).or_default() |= bit;
        }
        self.mask.retain(|_, m| *m != 0);
        self.read_at[shard] = Some(Instant::now());
    }
}

impl Tasks {
    /// Whether the namespace is split.
    pub(super) fn sharded(&self) -> bool {
        self.store.shard_count() > 1
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
    /// other shard known to have registered it (each shard's set as last
    /// read, this node's own submits, the events). Never waits for a shard
    /// already read once: the sets are read again in the background
    /// ([`Tasks::refresh_queue_shards`]), so a stalled master delays no
    /// claim; a shard never read yet is read now (at start), and one that
    /// cannot be read is left out until it can.
    pub(super) async fn shards_of(&self, queue: &str) -> Vec<usize> {
        let home = self.home(queue, "");
        if !self.sharded() {
            return vec![home];
        }
        let unread: Vec<usize> = {
            let known = self.queue_shards.lock().unwrap_or_else(|p| p.into_inner());
            (0..known.read_at.len())
                .filter(|&i| known.read_at[i].is_none())
                .collect()
        };
        if !unread.is_empty() {
            let reads = unread
                .into_iter()
                .map(|i| async move { (i, self.read_queue_names(i).await) });
            for (i, read) in futures_util::future::join_all(reads).await {
                if let Ok(names) = read {
                    self.queue_shards
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .set_shard(i, names);
                }
            }
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
        out.extend(
            self.store
                .other_shards(home)
                .map(|s| s.shard_index())
                .filter(|&s| mask & (1 << s) != 0),
        );
        out
    }

    /// Reads shard `store`'s set of queues again (the background loop, every
    /// [`REFRESH`], per shard): on a failure the shard keeps its last known
    /// bits.
    pub async fn refresh_queue_shards(&self, store: &Store) -> Result<(), StoreError> {
        if !self.sharded() {
            return Ok(());
        }
        let names = self.read_queue_names(store.shard_index()).await?;
        self.queue_shards
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set_shard(store.shard_index(), names);
        Ok(())
    }

    /// Shard `i`'s set of queues.
    async fn read_queue_names(&self, i: usize) -> Result<Vec<String>, StoreError> {
        let s = self.store.shard(i);
        let key = format!("{}:queues", s.keys().prefix());
        s.query::<Vec<String>>("queues_names", redis::cmd("SMEMBERS").arg(key))
            .await
    }

    /// The queues each shard has registered, in shard order.
    pub(super) async fn queue_names_by_shard(&self) -> Result<Vec<Vec<String>>, StoreError> {
        self.store
            .fan_out(|s| async move {
                let key = format!("{}:queues", s.keys().prefix());
                s.query::<Vec<String>>("queues_names", redis::cmd("SMEMBERS").arg(key))
                    .await
            })
            .await
    }
}

// `redis.shards` is bounded so that every shard has a bit in a mask.
const _: () = assert!(crate::config::MAX_SHARDS <= u64::BITS);
