//! Barriers: fault-tolerant barrier rounds (G8), and the etcd-style Barrier
//! (hold, release, wait) and DoubleBarrier (enter, leave).
//!
//! Invariants:
//! - G8: a round has exactly one verdict. It is set by `decide` in
//!   `lua/lib.lua`, an `HSETNX` of the `verdict` field inside the same script
//!   as the check of the rule, so two nodes can never decide differently:
//!   `released` when every participant arrived, or at the deadline when at
//!   most `max_missing` are missing; `aborted` otherwise. Everyone, late
//!   arrivals included, reads that one field.
//! - `may_run` is true only for a participant that arrived before a
//!   `released` verdict; the arrival and the decision are ordered by Redis
//!   (both are writes of single scripts).
//! - A round whose deadline passes with nobody calling is decided by the
//!   background loop of any node (`decide_due.lua`, every
//!   `barriers.interval_ms`), scanning a sorted set of deadlines in Redis time
//!   (G11).
//! - Waiters are woken by the decision event on the node's bus, not by
//!   polling; a one-second re-check covers a lost event.
//! - G4: rounds carry a TTL (timeout + retention). Per barrier at most
//!   `rounds_kept` decided rounds are kept (deciding a round deletes the
//!   oldest decided ones, never the round just decided: its caller and
//!   waiters read it next) and at most `max_open_rounds` are undecided (an
//!   arrival that would open one more gets 409), each until its deadline.
//!   Configs are bounded by `max_barriers`, holds and DoubleBarriers expire
//!   when idle, the deadline index holds open rounds only, and the hold index
//!   live holds (entries past their expiry are dropped by the next hold).
//! - A round id can be reused after its round was deleted (trimmed, expired,
//!   or its barrier deleted): each incarnation carries its own `opened_id`,
//!   so nothing read from an earlier incarnation answers for a later one.
//! - A DoubleBarrier entrant's presence is tied to its node's liveness (the
//!   rules of `nodes/lua/liveness.lua`, leases given back after a Redis stall): a crashed
//!   entrant is evicted, so the others never wait for it forever.

mod etcd;
mod model;
pub(crate) mod routes;
mod scripts;
mod wait;
pub(crate) use model::*;
use model::{incarnation_of, split_parts};
pub(crate) use wait::Entrant;
pub(crate) mod worker;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Value;

use crate::config::BarriersConfig;
use crate::store::reply::{at, int};
use crate::store::{ScriptCtx, Store};

use self::scripts::{ArriveReply, ConfigureReply, EnterReply, HoldReply, Scripts};

/// A decided round shared by the waiters of one node (see [`Barriers::decided`]).
type SharedRound = Arc<tokio::sync::OnceCell<Option<Arc<Round>>>>;

/// Barrier, round id, incarnation: the key of [`Barriers::decided`]'s cache.
type RoundKey = (String, String, String);

/// How long a node keeps a decided round it read for its waiters.
const DECIDED_KEEP: Duration = Duration::from_secs(5);

/// The barrier service.
pub struct Barriers {
    store: Store,
    cfg: BarriersConfig,
    node_ttl_ms: u64,
    node_id: String,
    scripts: Scripts,
    /// Long polls (see `wait`).
    park: crate::longpoll::Park,
    /// Decided rounds read in the last few seconds, by (barrier, round,
    /// incarnation): when a round is decided, all its waiters on this node
    /// wake at once, and one read serves them all (a decided round's verdict
    /// and arrivals never change). Single-flight: the others await the first
    /// read. The incarnation is in the key because a round id can be opened
    /// again (after its barrier was deleted and configured anew) while an
    /// earlier incarnation's verdict is still cached.
    decided: Mutex<HashMap<RoundKey, (Instant, SharedRound)>>,
}

impl Barriers {
    pub fn new(
        store: Store,
        cfg: BarriersConfig,
        node_ttl_ms: u64,
        node_id: String,
        ctx: &ScriptCtx,
        park: crate::longpoll::Park,
    ) -> Arc<Barriers> {
        Arc::new(Barriers {
            park,
            store,
            cfg,
            node_ttl_ms,
            node_id,
            decided: Mutex::new(HashMap::new()),
            scripts: Scripts::new(ctx),
        })
    }

    pub fn config(&self) -> &BarriersConfig {
        &self.cfg
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The view of the shard barrier `name` lives in (with its rounds,
    /// its hold and its DoubleBarrier).
    fn at(&self, name: &str) -> Store {
        self.store.home_of(name)
    }

    /// Creates or updates a barrier (validated by the caller). Returns whether
    /// it was created.
    pub async fn configure(
        &self,
        name: &str,
        participants: &[String],
        max_missing: u32,
        timeout_ms: u64,
        actor: &str,
    ) -> Result<bool, BarrierError> {
        let call = scripts::Configure {
            name,
            participants,
            max_missing,
            timeout_ms,
            actor,
            max_barriers: self.cfg.max_barriers,
            me: &self.node_id,
        };
        match self.at(name).run(&self.scripts.configure, &call).await? {
            ConfigureReply::Done { created } => Ok(created),
            ConfigureReply::TooMany => Err(BarrierError::TooMany(self.cfg.max_barriers)),
        }
    }

    /// Deletes a barrier, its rounds and its hold (or only its hold, when it
    /// was never configured).
    pub async fn delete(&self, name: &str, actor: &str) -> Result<(), BarrierError> {
        let call = scripts::Delete {
            name,
            actor,
            me: &self.node_id,
        };
        if !self.at(name).run(&self.scripts.delete, &call).await?.0 {
            return Err(BarrierError::NotFound(name.into()));
        }
        Ok(())
    }

    /// One barrier's configuration.
    pub async fn get(&self, name: &str) -> Result<Option<BarrierConfigView>, BarrierError> {
        Ok(self.get_many(&[name.to_string()]).await?.pop().flatten())
    }

    async fn get_many(&self, names: &[String]) -> Result<Vec<Option<BarrierConfigView>>, BarrierError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let maps = self
            .store
            .by_home(names, |s, names| async move {
                let mut p = redis::pipe();
                for n in &names {
                    p.cmd("HGETALL").arg(scripts::config_key(s.keys(), n));
                }
                Ok::<Vec<BTreeMap<String, String>>, BarrierError>(s.pipe("barrier_get", &p).await?)
            })
            .await?;
        Ok(names
            .iter()
            .zip(maps)
            .map(|(name, m)| {
                let parts = m.get("parts")?;
                Some(BarrierConfigView {
                    name: name.clone(),
                    participants: split_parts(parts),
                    max_missing: m.get("max_missing").and_then(|v| v.parse().ok()).unwrap_or(0),
                    timeout_ms: m.get("timeout_ms").and_then(|v| v.parse().ok()).unwrap_or(0),
                    updated_at: m.get("updated_at").and_then(|v| v.parse().ok()).unwrap_or(0),
                    updated_by: m.get("updated_by").cloned().unwrap_or_default(),
                })
            })
            .collect())
    }

    /// Every configured barrier, by name.
    pub async fn list(&self) -> Result<Vec<BarrierConfigView>, BarrierError> {
        let reads = self.store.every_shard().map(|s| async move {
            s.query::<Vec<String>>(
                "barriers_list",
                redis::cmd("SMEMBERS").arg(scripts::index_key(s.keys())),
            )
            .await
        });
        let mut names = futures_util::future::try_join_all(reads).await?.concat();
        names.sort();
        Ok(self.get_many(&names).await?.into_iter().flatten().collect())
    }

    /// Participant `node` arrives at `round` (see `arrive.lua`).
    pub async fn arrive(&self, name: &str, round: &str, node: &str) -> Result<ArriveOutcome, BarrierError> {
        let call = scripts::Arrive {
            name,
            round,
            node,
            me: &self.node_id,
            retention_ms: self.cfg.round_retention_ms,
            rounds_kept: self.cfg.rounds_kept,
            max_open_rounds: self.cfg.max_open_rounds,
        };
        let (decided_now, now, fields) = match self.at(name).run(&self.scripts.arrive, &call).await? {
            ArriveReply::Arrived { decided, now, fields } => (decided, now, fields),
            ArriveReply::NotFound => return Err(BarrierError::NotFound(name.into())),
            ArriveReply::TooManyOpenRounds => {
                return Err(BarrierError::TooManyOpenRounds {
                    barrier: name.into(),
                    max: self.cfg.max_open_rounds,
                });
            }
            ArriveReply::NotParticipant => {
                return Err(BarrierError::NotParticipant {
                    barrier: name.into(),
                    round: round.into(),
                    node: node.into(),
                });
            }
        };
        let incarnation = incarnation_of(&fields);
        let round = round_from(name, round, &fields).ok_or_else(|| BarrierError::RoundNotFound {
            barrier: name.into(),
            round: round.into(),
        })?;
        if let Some(v) = decided_now {
            metrics::counter!("muster_barrier_rounds_total", "verdict" => v.as_str()).increment(1);
        }
        Ok(ArriveOutcome {
            round,
            incarnation,
            decided_now,
            now,
        })
    }

    /// One round and the Redis time of the read, in one round trip.
    pub async fn round(&self, name: &str, round: &str) -> Result<Option<(Round, i64)>, BarrierError> {
        Ok(self.read_round(name, round).await?.map(|(r, _, now)| (r, now)))
    }

    /// One round with its incarnation, and the Redis time of the read.
    async fn read_round(&self, name: &str, round: &str) -> Result<Option<(Round, String, i64)>, BarrierError> {
        let mut p = redis::pipe();
        let s = self.at(name);
        p.cmd("TIME")
            .cmd("HGETALL")
            .arg(scripts::round_key(s.keys(), name, round));
        let ((secs, micros), m): ((i64, i64), BTreeMap<String, String>) = s.pipe("barrier_round", &p).await?;
        Ok(round_from(name, round, &m).map(|r| (r, incarnation_of(&m), secs * 1000 + micros / 1000)))
    }

    /// The round as its waiters see it after a decision event: one read per
    /// node serves every waiter of the round. Undecided (or missing) rounds
    /// are not kept, so a later call reads again. `incarnation` is the one
    /// the waiter arrived at: None when the round id now holds another
    /// incarnation (or none), as for a deleted round.
    pub async fn decided(
        &self,
        name: &str,
        round: &str,
        incarnation: &str,
    ) -> Result<Option<Arc<Round>>, BarrierError> {
        let key = (name.to_string(), round.to_string(), incarnation.to_string());
        let cell = {
            let mut map = self.decided.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            map.retain(|_, (at, _)| now.duration_since(*at) < DECIDED_KEEP);
            map.entry(key.clone())
                .or_insert_with(|| (now, Arc::new(tokio::sync::OnceCell::new())))
                .1
                .clone()
        };
        let got = cell
            .get_or_try_init(|| async {
                Ok::<_, BarrierError>(
                    self.read_round(name, round)
                        .await?
                        .filter(|(_, inc, _)| inc == incarnation)
                        .map(|(r, _, _)| Arc::new(r)),
                )
            })
            .await
            .cloned();
        match got {
            Ok(Some(r)) if !r.is_open() => Ok(Some(r)),
            other => {
                // Not decided (or an error): forget it so the next call reads again.
                let mut map = self.decided.lock().unwrap_or_else(|p| p.into_inner());
                if map.get(&key).is_some_and(|(_, c)| Arc::ptr_eq(c, &cell)) {
                    map.remove(&key);
                }
                other
            }
        }
    }

    /// The latest `limit` rounds of a barrier, newest first.
    pub async fn rounds(&self, name: &str, limit: usize) -> Result<Vec<Round>, BarrierError> {
        let s = self.at(name);
        let ids: Vec<String> = s
            .query(
                "barrier_rounds",
                redis::cmd("ZRANGE")
                    .arg(scripts::rounds_key(s.keys(), name))
                    .arg(0)
                    .arg(limit.saturating_sub(1))
                    .arg("REV"),
            )
            .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for r in &ids {
            p.cmd("HGETALL").arg(scripts::round_key(s.keys(), name, r));
        }
        let maps: Vec<BTreeMap<String, String>> = s.pipe("barrier_rounds_get", &p).await?;
        Ok(ids
            .iter()
            .zip(maps)
            .filter_map(|(r, m)| round_from(name, r, &m))
            .collect())
    }

    /// The newest round of each barrier, in two pipelined round trips (per
    /// shard, the shards at once).
    pub async fn latest_rounds(&self, names: &[String]) -> Result<Vec<Option<Round>>, BarrierError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        self.store
            .by_home(names, |s, names| async move { Self::latest_in(&s, &names).await })
            .await
    }

    /// [`Barriers::latest_rounds`] of barriers all in the shard of `s`.
    async fn latest_in(s: &Store, names: &[String]) -> Result<Vec<Option<Round>>, BarrierError> {
        let mut p = redis::pipe();
        for n in names {
            p.cmd("ZRANGE")
                .arg(scripts::rounds_key(s.keys(), n))
                .arg(0)
                .arg(0)
                .arg("REV");
        }
        let ids: Vec<Vec<String>> = s.pipe("barrier_latest", &p).await?;
        let mut p = redis::pipe();
        let mut wanted = Vec::new();
        for (n, r) in names.iter().zip(&ids) {
            if let Some(r) = r.first() {
                p.cmd("HGETALL").arg(scripts::round_key(s.keys(), n, r));
                wanted.push((n, r));
            }
        }
        if wanted.is_empty() {
            return Ok(vec![None; names.len()]);
        }
        let maps: Vec<BTreeMap<String, String>> = s.pipe("barrier_latest_get", &p).await?;
        let found: BTreeMap<&String, Round> = wanted
            .into_iter()
            .zip(maps)
            .filter_map(|((n, r), m)| round_from(n, r, &m).map(|round| (n, round)))
            .collect();
        Ok(names.iter().map(|n| found.get(n).cloned()).collect())
    }

    /// Decides rounds past their deadline in shard `s` (the background
    /// loop, per shard). Returns (released, aborted) decided by this node.
    pub async fn decide_due_shard(&self, s: &Store) -> Result<(i64, i64), BarrierError> {
        let (released, aborted) = self.decide_due_in(s).await?;
        if released > 0 {
            metrics::counter!("muster_barrier_rounds_total", "verdict" => "released").increment(released as u64);
        }
        if aborted > 0 {
            metrics::counter!("muster_barrier_rounds_total", "verdict" => "aborted").increment(aborted as u64);
        }
        Ok((released, aborted))
    }

    /// [`Barriers::decide_due`] in the shard of `s`: at most ten batches.
    async fn decide_due_in(&self, s: &Store) -> Result<(i64, i64), BarrierError> {
        let (mut released, mut aborted) = (0, 0);
        for _ in 0..10 {
            let call = scripts::DecideDue {
                me: &self.node_id,
                retention_ms: self.cfg.round_retention_ms,
                limit: 100,
                rounds_kept: self.cfg.rounds_kept,
            };
            let d = s.run(&self.scripts.decide_due, &call).await?;
            released += d.released;
            aborted += d.aborted;
            if !d.more {
                break;
            }
        }
        Ok((released, aborted))
    }
}
