//! Locks with fencing tokens, and leader elections.
//!
//! Invariants:
//! - A lock has at most one holder at a time: every grant, renew and release
//!   is one script that checks the lease by Redis time (G11).
//! - Fencing tokens are strictly increasing per lock (in fact across every
//!   lock of its shard): one counter per shard, `INCR`ed in the acquire
//!   script, with the failover epoch in the high bits as for task tokens
//!   (G1). A resource that remembers the highest token it saw can refuse a
//!   holder whose lease lapsed. Renew and release with a stale token get 409 and change nothing.
//! - Waiters are served in FIFO order: a sorted set of waiting owners; each
//!   place lapses `locks.waiter_ttl_ms` after its waiter's last poll, so an
//!   abandoned waiter (its node died mid-request) cannot block the queue.
//! - A lease may be tied to a node: it also ends when that node is gone by
//!   the rules of `nodes/lua/liveness.lua` (leases given back after a Redis stall).
//! - Elections: at most one leader at a time, each leadership with a new
//!   epoch strictly greater than every epoch before it, so there is at most
//!   one leader per epoch; the leader's lease lapses by Redis time.
//! - Waiters wake on `lock.released`, `lock.expired`, `election.resigned`,
//!   `election.expired` (and `node.dead`), not by polling; the background
//!   loop (`expire.lua`) emits the expiries even when nobody calls.
//! - G4: lease keys carry a TTL (lease + one minute), queues the waiter TTL;
//!   the two indexes hold live leases only; the counters are single keys.
//! - A split namespace (`redis.shards`, `docs/sharding.md`): a lock or an
//!   election lives in the shard of its name, with its queue, its index
//!   entry and its shard's counter; listings and the lease loop visit every
//!   shard.

pub(crate) mod routes;
mod scripts;
mod wait;
pub(crate) mod worker;

use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) use muster_api::locks::{Leadership, LockInfo};
use redis::Value;

use crate::config::LocksConfig;
use crate::problem::{Classify, Kind};
use crate::store::reply::{at, int, text};
use crate::store::{ScriptCtx, Store, StoreError};

use self::scripts::{AcquireReply, Campaigned, LeaderRow, ReleaseReply, RenewReply, ResignReply, Scripts};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("lock `{name}` is not held under token {token}: the token is stale; stop using the resource")]
    Stale {
        name: String,
        token: u64,
        holder: Option<String>,
        current: Option<u64>,
    },
    #[error("the lease of lock `{name}` lapsed before this call: the lock is lost; stop using the resource")]
    Lapsed { name: String },
    #[error("lock `{0}` is not held")]
    NotHeld(String),
    #[error("`{candidate}` is not the leader of election `{name}`{}", epoch.map(|e| format!(" at epoch {e}")).unwrap_or_default())]
    NotLeader {
        name: String,
        candidate: String,
        epoch: Option<u64>,
        leader: Option<String>,
        current: Option<u64>,
    },
    #[error(
        "node `{0}` is not registered or its heartbeat expired: PUT /api/v1/nodes/{0}/heartbeat first, and keep heartbeating while holding"
    )]
    NodeNotAlive(String),
    #[error("{}; not acquired within wait_ms", busy(name, holder))]
    Busy {
        name: String,
        holder: Option<String>,
        position: u32,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn busy(name: &str, holder: &Option<String>) -> String {
    match holder {
        Some(h) => format!("lock `{name}` is held by `{h}`"),
        None => format!("lock `{name}` is free but other waiters are ahead in line"),
    }
}

impl Classify for LockError {
    fn kind(&self) -> Kind {
        use serde_json::json;
        match self {
            LockError::Stale { holder, current, .. } => {
                Kind::Conflict(json!({"reason": "stale_token", "holder": holder, "token": current}))
            }
            LockError::Lapsed { .. } => Kind::Conflict(json!({"reason": "lapsed"})),
            LockError::NotHeld(_) => Kind::NotFound,
            LockError::NotLeader { leader, current, .. } => Kind::Conflict(json!({"leader": leader, "epoch": current})),
            LockError::NodeNotAlive(_) => Kind::Conflict(json!(null)),
            LockError::Busy { holder, position, .. } => {
                Kind::Conflict(json!({"reason": "busy", "holder": holder, "position": position}))
            }
            LockError::Store(s) => s.kind(),
        }
    }
}

/// The outcome of one acquire attempt.
#[derive(Debug, Clone)]
pub enum Attempt {
    /// Granted (now, or already held by this owner).
    Granted { token: u64, expires_at: i64, again: bool },
    /// Held by someone else, or others are ahead in the queue.
    Busy { holder: Option<String>, position: u32 },
}

/// What a campaign call returned.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// 1 elected now, 2 already the leader (renewed), 0 someone else leads.
    pub code: i64,
    pub state: Leadership,
}

/// The lock and election service.
pub struct Locks {
    store: Store,
    cfg: LocksConfig,
    node_ttl_ms: u64,
    node_id: String,
    scripts: Scripts,
    /// Long polls (see `wait`).
    park: crate::longpoll::Park,
}

fn nonempty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

impl Locks {
    pub fn new(
        store: Store,
        cfg: LocksConfig,
        node_ttl_ms: u64,
        node_id: String,
        ctx: &ScriptCtx,
        park: crate::longpoll::Park,
    ) -> Arc<Locks> {
        Arc::new(Locks {
            park,
            store,
            cfg,
            node_ttl_ms,
            node_id,
            scripts: Scripts::new(ctx),
        })
    }

    pub fn config(&self) -> &LocksConfig {
        &self.cfg
    }

    /// The view of the shard lock or election `name` lives in.
    fn at(&self, name: &str) -> Store {
        self.store.home_of(name)
    }

    /// The first 1000 names in index `key` over every shard (by lease
    /// expiry), sorted by name.
    async fn indexed(
        &self,
        op: &'static str,
        key: fn(&crate::store::Keys) -> String,
    ) -> Result<Vec<String>, LockError> {
        let first = self.store.first_of_every_shard(op, key, 1000, false).await?;
        let mut names: Vec<String> = first.into_iter().map(|(n, _)| n).collect();
        names.sort();
        Ok(names)
    }

    /// One acquire attempt (see `acquire.lua`). `queue`: keep a place in
    /// line when not granted.
    pub async fn try_acquire(
        &self,
        name: &str,
        owner: &str,
        ttl_ms: u64,
        node: Option<&str>,
        queue: bool,
    ) -> Result<Attempt, LockError> {
        let call = scripts::Acquire {
            name,
            owner,
            ttl_ms,
            node: node.unwrap_or(""),
            queue,
            waiter_ttl_ms: self.cfg.waiter_ttl_ms,
            node_ttl_ms: self.node_ttl_ms,
            me: &self.node_id,
        };
        match self.at(name).run(&self.scripts.acquire, &call).await? {
            AcquireReply::NodeNotAlive => Err(LockError::NodeNotAlive(node.unwrap_or("").into())),
            AcquireReply::Granted {
                token,
                expires_at,
                again,
            } => {
                if !again {
                    metrics::counter!("muster_locks_acquired_total").increment(1);
                }
                Ok(Attempt::Granted {
                    token,
                    expires_at,
                    again,
                })
            }
            AcquireReply::Busy { holder, position } => Ok(Attempt::Busy {
                holder: nonempty(holder),
                position,
            }),
        }
    }

    /// Gives up a place in the queue (a long poll ended without the lock).
    pub async fn dequeue(&self, name: &str, owner: &str) -> Result<(), LockError> {
        let call = scripts::Dequeue {
            name,
            owner,
            me: &self.node_id,
        };
        self.at(name).run(&self.scripts.dequeue, &call).await?;
        Ok(())
    }

    /// Extends the lease held under `token`; returns the new expiry (Redis ms).
    pub async fn renew(&self, name: &str, token: u64, ttl_ms: u64) -> Result<i64, LockError> {
        let call = scripts::Renew {
            name,
            token,
            ttl_ms,
            node_ttl_ms: self.node_ttl_ms,
            me: &self.node_id,
        };
        match self.at(name).run(&self.scripts.renew, &call).await? {
            RenewReply::Renewed { expires_at } => Ok(expires_at),
            RenewReply::Lapsed => Err(LockError::Lapsed { name: name.into() }),
            RenewReply::Stale { holder, token: current } => Err(LockError::Stale {
                name: name.into(),
                token,
                holder: nonempty(holder),
                current,
            }),
        }
    }

    /// Releases the lock held under `token`, or with None breaks it.
    pub async fn release(&self, name: &str, token: Option<u64>, actor: &str) -> Result<(), LockError> {
        let call = scripts::Release {
            name,
            token,
            actor,
            node_ttl_ms: self.node_ttl_ms,
            me: &self.node_id,
        };
        match self.at(name).run(&self.scripts.release, &call).await? {
            ReleaseReply::Released => {
                metrics::counter!("muster_locks_released_total").increment(1);
                Ok(())
            }
            ReleaseReply::NotHeld => Err(LockError::NotHeld(name.into())),
            ReleaseReply::Stale { holder, token: current } => Err(LockError::Stale {
                name: name.into(),
                token: token.unwrap_or(0),
                holder: nonempty(holder),
                current,
            }),
        }
    }

    /// One lock as of now (a lapsed lease reads as free).
    pub async fn get(&self, name: &str) -> Result<LockInfo, LockError> {
        Ok(self.get_many(&[name.to_string()]).await?.remove(0))
    }

    async fn get_many(&self, names: &[String]) -> Result<Vec<LockInfo>, LockError> {
        self.store
            .by_home(names, |s, names| async move { Self::get_in(&s, &names).await })
            .await
    }

    /// Locks `names`, all in the shard of `s`: one pipeline with its `TIME`.
    async fn get_in(s: &Store, names: &[String]) -> Result<Vec<LockInfo>, LockError> {
        let k = s.keys();
        let mut p = redis::pipe();
        p.cmd("TIME");
        for n in names {
            p.cmd("HGETALL").arg(scripts::lock_key(k, n));
            p.cmd("ZRANGEBYSCORE")
                .arg(scripts::queue_key(k, n))
                .arg("-inf")
                .arg("+inf");
            p.cmd("ZRANGE")
                .arg(scripts::queue_exp_key(k, n))
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES");
        }
        let rows: Vec<Value> = s.pipe("lock_get", &p).await?;
        let (secs, micros): (i64, i64) = redis::from_redis_value_ref(at(&rows, 0)).unwrap_or((0, 0));
        let now = secs * 1000 + micros / 1000;
        let mut out = Vec::with_capacity(names.len());
        for (name, c) in names.iter().zip(rows.get(1..).unwrap_or(&[]).chunks(3)) {
            let h: BTreeMap<String, String> = redis::from_redis_value_ref(at(c, 0)).unwrap_or_default();
            let queue: Vec<String> = redis::from_redis_value_ref(at(c, 1)).unwrap_or_default();
            let lapses: BTreeMap<String, f64> = redis::from_redis_value_ref(at(c, 2)).unwrap_or_default();
            let num = |f: &str| h.get(f).and_then(|v| v.parse::<i64>().ok());
            let held = num("expires_at").is_some_and(|e| e > now);
            out.push(LockInfo {
                name: name.clone(),
                held,
                owner: h.get("owner").cloned().filter(|_| held),
                token: num("token").map(|t| t as u64).filter(|_| held),
                node: h.get("node").cloned().filter(|n| held && !n.is_empty()),
                acquired_at: num("acquired_at").filter(|_| held),
                expires_at: num("expires_at").filter(|_| held),
                waiters: queue
                    .into_iter()
                    .filter(|w| lapses.get(w).is_some_and(|x| *x as i64 > now))
                    .collect(),
            });
        }
        Ok(out)
    }

    /// Every held lock, by name.
    pub async fn list(&self) -> Result<Vec<LockInfo>, LockError> {
        let names = self.indexed("locks_list", scripts::locks_key).await?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.get_many(&names).await?.into_iter().filter(|l| l.held).collect())
    }

    /// Ends lapsed leases in shard `s` (the background loop, per shard).
    /// Returns (locks, elections).
    pub async fn expire_due_in(&self, s: &Store) -> Result<(i64, i64), LockError> {
        let call = scripts::Expire {
            limit: 100,
            node_ttl_ms: self.node_ttl_ms,
            me: &self.node_id,
        };
        let n = s.run(&self.scripts.expire, &call).await?;
        Ok((n.locks, n.elections))
    }

    /// The store, for the per-shard loop.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// A leadership from its stored fields ('' and 0 when nobody leads).
    fn leadership(name: &str, row: LeaderRow) -> Leadership {
        let leader = nonempty(row.leader);
        let value = nonempty(row.value).and_then(|v| serde_json::from_str(&v).ok());
        Leadership {
            name: name.into(),
            epoch: leader.as_ref().map(|_| row.epoch as u64),
            expires_at: leader.as_ref().map(|_| row.expires_at),
            elected_at: leader.as_ref().map(|_| row.elected_at),
            value,
            leader,
        }
    }

    /// One campaign attempt (see `campaign.lua`).
    pub async fn campaign(
        &self,
        name: &str,
        candidate: &str,
        ttl_ms: u64,
        value: Option<&str>,
    ) -> Result<Campaign, LockError> {
        let call = scripts::Campaign {
            name,
            candidate,
            ttl_ms,
            value: value.unwrap_or(""),
            me: &self.node_id,
        };
        let reply = self.at(name).run(&self.scripts.campaign, &call).await?;
        if reply.outcome == Campaigned::Elected {
            metrics::counter!("muster_elections_won_total").increment(1);
        }
        Ok(Campaign {
            code: reply.outcome as i64,
            state: Self::leadership(name, reply.row),
        })
    }

    /// The leader resigns (at `epoch`, when given).
    pub async fn resign(&self, name: &str, candidate: &str, epoch: Option<u64>) -> Result<u64, LockError> {
        let call = scripts::Resign {
            name,
            candidate,
            epoch,
            me: &self.node_id,
        };
        match self.at(name).run(&self.scripts.resign, &call).await? {
            ResignReply::Resigned { epoch } => Ok(epoch),
            ResignReply::NotLeader { leader, epoch: current } => Err(LockError::NotLeader {
                name: name.into(),
                candidate: candidate.into(),
                epoch,
                leader: nonempty(leader),
                current,
            }),
        }
    }

    /// An election as of now (a lapsed lease reads as nobody).
    pub async fn leader(&self, name: &str) -> Result<Leadership, LockError> {
        Ok(self.leaders_named(&[name.to_string()]).await?.remove(0))
    }

    async fn leaders_named(&self, names: &[String]) -> Result<Vec<Leadership>, LockError> {
        self.store
            .by_home(names, |s, names| async move { Self::leaders_in(&s, &names).await })
            .await
    }

    /// Elections `names`, all in the shard of `s`: one pipeline with its `TIME`.
    async fn leaders_in(s: &Store, names: &[String]) -> Result<Vec<Leadership>, LockError> {
        let mut p = redis::pipe();
        p.cmd("TIME");
        for n in names {
            p.cmd("HMGET")
                .arg(scripts::election_key(s.keys(), n))
                .arg("leader")
                .arg("epoch")
                .arg("expires_at")
                .arg("value")
                .arg("elected_at");
        }
        let rows: Vec<Value> = s.pipe("election_get", &p).await?;
        let (secs, micros): (i64, i64) = redis::from_redis_value_ref(at(&rows, 0)).unwrap_or((0, 0));
        let now = secs * 1000 + micros / 1000;
        Ok(names
            .iter()
            .zip(rows.get(1..).unwrap_or(&[]))
            .map(|(n, row)| {
                let f: Vec<Value> = redis::from_redis_value_ref(row).unwrap_or_default();
                // HMGET leader, epoch, expires_at, value, elected_at (nil when unset).
                let l = Self::leadership(
                    n,
                    LeaderRow {
                        leader: text(at(&f, 0)),
                        epoch: int(at(&f, 1)),
                        expires_at: int(at(&f, 2)),
                        value: text(at(&f, 3)),
                        elected_at: int(at(&f, 4)),
                    },
                );
                if l.expires_at.is_some_and(|e| e > now) {
                    l
                } else {
                    Leadership {
                        name: n.clone(),
                        leader: None,
                        epoch: None,
                        value: None,
                        elected_at: None,
                        expires_at: None,
                    }
                }
            })
            .collect())
    }

    /// Every election with a leader, by name.
    pub async fn elections(&self) -> Result<Vec<Leadership>, LockError> {
        let names = self.indexed("elections_list", scripts::elections_key).await?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self
            .leaders_named(&names)
            .await?
            .into_iter()
            .filter(|l| l.leader.is_some())
            .collect())
    }
}
