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

pub mod bench;
pub mod cli;
pub mod routes;
mod scripts;
mod wait;
pub use wait::Entrant;
pub mod worker;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Value;
use serde::Serialize;
use utoipa::ToSchema;

use crate::config::BarriersConfig;
use crate::error::ApiError;
use crate::store::reply::{at, int};
use crate::store::{ScriptCtx, Store, StoreError};

use self::scripts::{ArriveReply, ConfigureReply, EnterReply, HoldReply, Scripts};

#[derive(Debug, thiserror::Error)]
pub enum BarrierError {
    #[error("no barrier `{0}`: configure it with PUT /api/v1/barriers/{0}")]
    NotFound(String),
    #[error("no round `{round}` of barrier `{barrier}` (it may have passed its retention)")]
    RoundNotFound { barrier: String, round: String },
    #[error("`{node}` is not a participant of round `{round}` of barrier `{barrier}`")]
    NotParticipant {
        barrier: String,
        round: String,
        node: String,
    },
    #[error("the cluster already has the maximum of {0} barriers (barriers.max_barriers)")]
    TooMany(u32),
    #[error(
        "barrier `{barrier}` already has {max} undecided rounds (barriers.max_open_rounds): arrive at an open round, or wait until one is decided"
    )]
    TooManyOpenRounds { barrier: String, max: u32 },
    #[error("barrier `{barrier}` is held by `{holder}`")]
    HeldByOther { barrier: String, holder: String },
    #[error(
        "DoubleBarrier `{name}` is full: {count} entrants are in (or have not all left yet); wait until they leave"
    )]
    TooManyEntrants { name: String, count: u32 },
    #[error("DoubleBarrier `{name}` has count {count}; every entrant must use the same count")]
    CountMismatch { name: String, count: u32 },
    #[error(
        "node `{0}` is not registered or its heartbeat expired: PUT /api/v1/nodes/{0}/heartbeat first, and keep heartbeating while inside"
    )]
    NodeNotAlive(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<BarrierError> for ApiError {
    fn from(e: BarrierError) -> Self {
        use serde_json::json;
        match e {
            BarrierError::NotFound(_) | BarrierError::RoundNotFound { .. } => ApiError::NotFound(e.to_string()),
            BarrierError::NotParticipant { .. } => ApiError::Forbidden(e.to_string()),
            BarrierError::HeldByOther { ref holder, .. } => {
                ApiError::conflict(e.to_string(), json!({"holder": holder}))
            }
            BarrierError::TooManyEntrants { count, .. } => {
                ApiError::conflict(e.to_string(), json!({"reason": "too_many", "count": count}))
            }
            BarrierError::CountMismatch { count, .. } => {
                ApiError::conflict(e.to_string(), json!({"reason": "count_mismatch", "count": count}))
            }
            BarrierError::TooManyOpenRounds { max, .. } => ApiError::conflict(
                e.to_string(),
                json!({"reason": "too_many_open_rounds", "max_open_rounds": max}),
            ),
            BarrierError::TooMany(_) | BarrierError::NodeNotAlive(_) => ApiError::conflict(e.to_string(), json!(null)),
            BarrierError::Store(s) => s.into(),
        }
    }
}

/// A round's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Not decided yet (or the caller's `wait_ms` ran out first).
    Pending,
    /// The participants that arrived before the decision may run.
    Released,
    /// Nobody runs this round.
    Aborted,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pending => "pending",
            Verdict::Released => "released",
            Verdict::Aborted => "aborted",
        }
    }

    fn parse(s: &str) -> Verdict {
        match s {
            "released" => Verdict::Released,
            "aborted" => Verdict::Aborted,
            _ => Verdict::Pending,
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A barrier's configuration.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BarrierConfigView {
    pub name: String,
    /// Node ids that take part in every round.
    pub participants: Vec<String>,
    /// How many participants may be missing at the deadline for the round to
    /// be released anyway.
    pub max_missing: u32,
    /// A round's deadline, counted from its first arrival.
    pub timeout_ms: u64,
    /// Redis ms.
    pub updated_at: i64,
    pub updated_by: String,
}

/// One participant's arrival.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Arrival {
    pub node: String,
    /// Redis ms.
    pub at: i64,
}

/// One round as stored.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Round {
    pub barrier: String,
    pub round: String,
    pub verdict: Verdict,
    /// The participants of this round (the barrier's, when it opened).
    pub participants: Vec<String>,
    pub max_missing: u32,
    pub timeout_ms: u64,
    /// Redis ms of the first arrival.
    pub opened_at: i64,
    /// Redis ms.
    pub deadline: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<i64>,
    /// `all_arrived` or `deadline`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Participants that arrived before the verdict, in arrival order.
    pub arrived: Vec<String>,
    /// Participants that had not arrived (before the verdict, or yet).
    pub missing: Vec<String>,
    /// Arrivals before the verdict with their times.
    pub arrivals: Vec<Arrival>,
    /// Arrivals after the verdict.
    pub late: Vec<Arrival>,
    /// Which incarnation of the round id this is (its `opened_id`, or its
    /// opening time for rounds stored before that field existed).
    #[serde(skip)]
    pub incarnation: String,
}

impl Round {
    /// The arrival time of `node` before the verdict, if it arrived.
    pub fn arrived_at(&self, node: &str) -> Option<i64> {
        self.arrivals.iter().find(|a| a.node == node).map(|a| a.at)
    }

    pub fn is_open(&self) -> bool {
        self.verdict == Verdict::Pending
    }
}

/// What an arrival returned.
#[derive(Debug, Clone)]
pub struct ArriveOutcome {
    pub round: Round,
    /// The verdict this call set, if it decided the round.
    pub decided_now: Option<Verdict>,
    /// Redis ms at the call.
    pub now: i64,
}

/// An etcd-style hold.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Hold {
    pub barrier: String,
    pub held: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_at: Option<i64>,
    /// Redis ms when the hold lifts itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
}

/// A DoubleBarrier's state.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DoubleBarrier {
    pub name: String,
    /// Entrants that make it ready; 0 when nobody is in.
    pub count: u32,
    /// Entrants in, with their entry time (Redis ms), in entry order.
    pub entrants: Vec<Arrival>,
    /// Whether the count was reached (until everyone has left).
    pub ready: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<i64>,
    /// Identifies the ready cycle (the stream id of its `dbarrier.ready` event).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle: Option<String>,
}

/// What an enter returned.
#[derive(Debug, Clone)]
pub struct Entered {
    pub entered_now: bool,
    pub count: u32,
    pub entrants: u32,
    pub ready_at: Option<i64>,
}

/// What a leave returned.
#[derive(Debug, Clone)]
pub struct Left {
    pub left_now: bool,
    pub entrants: u32,
    /// The ready cycle the caller must see emptied; None when the barrier was
    /// not ready (nobody needs to wait).
    pub cycle: Option<String>,
}

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

/// `",a,b,"` into `[a, b]`.
fn split_parts(parts: &str) -> Vec<String> {
    parts.split(',').filter(|p| !p.is_empty()).map(str::to_string).collect()
}

/// Builds a round from its hash; None when the hash is empty (gone).
pub fn round_from(barrier: &str, round: &str, m: &BTreeMap<String, String>) -> Option<Round> {
    if !m.contains_key("parts") {
        return None;
    }
    let num = |f: &str| m.get(f).and_then(|v| v.parse::<i64>().ok());
    let participants = split_parts(m.get("parts").map(String::as_str).unwrap_or(""));
    let mut arrivals = Vec::new();
    let mut late = Vec::new();
    for (k, v) in m {
        let at = v.parse().unwrap_or(0);
        if let Some(node) = k.strip_prefix("a:") {
            arrivals.push(Arrival { node: node.into(), at });
        } else if let Some(node) = k.strip_prefix("l:") {
            late.push(Arrival { node: node.into(), at });
        }
    }
    arrivals.sort_by(|a, b| a.at.cmp(&b.at).then_with(|| a.node.cmp(&b.node)));
    late.sort_by(|a, b| a.at.cmp(&b.at).then_with(|| a.node.cmp(&b.node)));
    let arrived: Vec<String> = arrivals.iter().map(|a| a.node.clone()).collect();
    let missing = participants.iter().filter(|p| !arrived.contains(p)).cloned().collect();
    let incarnation = match m.get("opened_id") {
        Some(id) => id.clone(),
        None => format!("t{}", num("opened_at").unwrap_or(0)),
    };
    Some(Round {
        barrier: barrier.into(),
        round: round.into(),
        verdict: Verdict::parse(m.get("verdict").map(String::as_str).unwrap_or("")),
        max_missing: num("max_missing").unwrap_or(0) as u32,
        timeout_ms: num("timeout_ms").unwrap_or(0) as u64,
        opened_at: num("opened_at").unwrap_or(0),
        deadline: num("deadline").unwrap_or(0),
        decided_at: num("decided_at"),
        reason: m.get("reason").cloned(),
        participants,
        arrived,
        missing,
        arrivals,
        late,
        incarnation,
    })
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

    fn k_index(&self) -> String {
        scripts::index_key(self.store.keys())
    }
    fn k_config(&self, b: &str) -> String {
        scripts::config_key(self.store.keys(), b)
    }
    fn k_rounds(&self, b: &str) -> String {
        scripts::rounds_key(self.store.keys(), b)
    }
    fn k_round(&self, b: &str, r: &str) -> String {
        scripts::round_key(self.store.keys(), b, r)
    }
    fn k_hold(&self, b: &str) -> String {
        scripts::hold_key(self.store.keys(), b)
    }
    fn k_holds(&self) -> String {
        scripts::holds_key(self.store.keys())
    }
    fn k_db(&self, b: &str) -> String {
        scripts::db_key(self.store.keys(), b)
    }
    fn k_db_in(&self, b: &str) -> String {
        scripts::db_in_key(self.store.keys(), b)
    }
    fn k_db_index(&self) -> String {
        scripts::db_index_key(self.store.keys())
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
        match self.store.run(&self.scripts.configure, &call).await? {
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
        if !self.store.run(&self.scripts.delete, &call).await?.0 {
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
        let mut p = redis::pipe();
        for n in names {
            p.cmd("HGETALL").arg(self.k_config(n));
        }
        let maps: Vec<BTreeMap<String, String>> = self.store.pipe("barrier_get", &p).await?;
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
        let mut names: Vec<String> = self
            .store
            .query("barriers_list", redis::cmd("SMEMBERS").arg(self.k_index()))
            .await?;
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
        let (decided_now, now, fields) = match self.store.run(&self.scripts.arrive, &call).await? {
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
        let round = round_from(name, round, &fields).ok_or_else(|| BarrierError::RoundNotFound {
            barrier: name.into(),
            round: round.into(),
        })?;
        if let Some(v) = decided_now {
            metrics::counter!("muster_barrier_rounds_total", "verdict" => v.as_str()).increment(1);
        }
        Ok(ArriveOutcome {
            round,
            decided_now,
            now,
        })
    }

    /// One round and the Redis time of the read, in one round trip.
    pub async fn round(&self, name: &str, round: &str) -> Result<Option<(Round, i64)>, BarrierError> {
        let mut p = redis::pipe();
        p.cmd("TIME").cmd("HGETALL").arg(self.k_round(name, round));
        let ((secs, micros), m): ((i64, i64), BTreeMap<String, String>) = self.store.pipe("barrier_round", &p).await?;
        Ok(round_from(name, round, &m).map(|r| (r, secs * 1000 + micros / 1000)))
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
                    self.round(name, round)
                        .await?
                        .map(|(r, _)| Arc::new(r))
                        .filter(|r| r.incarnation == incarnation),
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
        let ids: Vec<String> = self
            .store
            .query(
                "barrier_rounds",
                redis::cmd("ZRANGE")
                    .arg(self.k_rounds(name))
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
            p.cmd("HGETALL").arg(self.k_round(name, r));
        }
        let maps: Vec<BTreeMap<String, String>> = self.store.pipe("barrier_rounds_get", &p).await?;
        Ok(ids
            .iter()
            .zip(maps)
            .filter_map(|(r, m)| round_from(name, r, &m))
            .collect())
    }

    /// The newest round of each barrier, in two pipelined round trips.
    pub async fn latest_rounds(&self, names: &[String]) -> Result<Vec<Option<Round>>, BarrierError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for n in names {
            p.cmd("ZRANGE").arg(self.k_rounds(n)).arg(0).arg(0).arg("REV");
        }
        let ids: Vec<Vec<String>> = self.store.pipe("barrier_latest", &p).await?;
        let mut p = redis::pipe();
        let mut wanted = Vec::new();
        for (n, r) in names.iter().zip(&ids) {
            if let Some(r) = r.first() {
                p.cmd("HGETALL").arg(self.k_round(n, r));
                wanted.push((n, r));
            }
        }
        if wanted.is_empty() {
            return Ok(vec![None; names.len()]);
        }
        let maps: Vec<BTreeMap<String, String>> = self.store.pipe("barrier_latest_get", &p).await?;
        let found: BTreeMap<&String, Round> = wanted
            .into_iter()
            .zip(maps)
            .filter_map(|((n, r), m)| round_from(n, r, &m).map(|round| (n, round)))
            .collect();
        Ok(names.iter().map(|n| found.get(n).cloned()).collect())
    }

    /// Decides rounds past their deadline (the background loop). Returns
    /// (released, aborted) decided by this node.
    pub async fn decide_due(&self) -> Result<(i64, i64), BarrierError> {
        let (mut released, mut aborted) = (0, 0);
        for _ in 0..10 {
            let call = scripts::DecideDue {
                me: &self.node_id,
                retention_ms: self.cfg.round_retention_ms,
                limit: 100,
                rounds_kept: self.cfg.rounds_kept,
            };
            let d = self.store.run(&self.scripts.decide_due, &call).await?;
            released += d.released;
            aborted += d.aborted;
            if !d.more {
                break;
            }
        }
        if released > 0 {
            metrics::counter!("muster_barrier_rounds_total", "verdict" => "released").increment(released as u64);
        }
        if aborted > 0 {
            metrics::counter!("muster_barrier_rounds_total", "verdict" => "aborted").increment(aborted as u64);
        }
        Ok((released, aborted))
    }

    /// Raises the etcd-style barrier `name` for `ttl_ms`. Returns the hold and
    /// whether this call raised it.
    pub async fn hold(&self, name: &str, holder: &str, ttl_ms: u64) -> Result<(Hold, bool), BarrierError> {
        let call = scripts::Hold {
            name,
            holder,
            ttl_ms,
            me: &self.node_id,
        };
        match self.store.run(&self.scripts.hold, &call).await? {
            HoldReply::HeldByOther { holder } => Err(BarrierError::HeldByOther {
                barrier: name.into(),
                holder,
            }),
            HoldReply::Held {
                holder,
                held_at,
                expires_at,
                again,
            } => Ok((
                Hold {
                    barrier: name.into(),
                    held: true,
                    holder: Some(holder),
                    held_at: Some(held_at),
                    expires_at: Some(expires_at),
                },
                !again,
            )),
        }
    }

    /// Lowers the etcd-style barrier. Returns whether it was held.
    pub async fn lift(&self, name: &str, actor: &str) -> Result<bool, BarrierError> {
        let call = scripts::Lift {
            name,
            actor,
            me: &self.node_id,
        };
        Ok(self.store.run(&self.scripts.lift, &call).await?.0)
    }

    /// The hold of `name` as of now, and the milliseconds until it lifts
    /// itself (0 when not held).
    pub async fn hold_state(&self, name: &str) -> Result<(Hold, i64), BarrierError> {
        Ok(self.holds_named(&[name.to_string()]).await?.remove(0))
    }

    /// The holds of `names` as of now, each with the milliseconds until it
    /// lifts itself (0 when not held), in one round trip.
    async fn holds_named(&self, names: &[String]) -> Result<Vec<(Hold, i64)>, BarrierError> {
        let mut p = redis::pipe();
        p.cmd("TIME");
        for n in names {
            p.cmd("HMGET")
                .arg(self.k_hold(n))
                .arg("holder")
                .arg("held_at")
                .cmd("PTTL")
                .arg(self.k_hold(n));
        }
        let rows: Vec<Value> = self.store.pipe("barrier_hold_get", &p).await?;
        let (secs, micros): (i64, i64) = redis::from_redis_value_ref(at(&rows, 0)).unwrap_or((0, 0));
        let now = secs * 1000 + micros / 1000;
        Ok(names
            .iter()
            .zip(rows.get(1..).unwrap_or(&[]).chunks(2))
            .map(|(name, c)| {
                let (holder, held_at): (Option<String>, Option<i64>) =
                    redis::from_redis_value_ref(at(c, 0)).unwrap_or((None, None));
                let pttl = int(at(c, 1));
                let lifts_in = if holder.is_some() { pttl.max(0) } else { 0 };
                let hold = Hold {
                    barrier: name.clone(),
                    held: holder.is_some(),
                    expires_at: holder.as_ref().map(|_| now + lifts_in),
                    holder,
                    held_at,
                };
                (hold, lifts_in)
            })
            .collect())
    }

    /// Every barrier held now (etcd-style), configured or not, by name: at
    /// most 1000 (those lifting themselves last), in two round trips.
    pub async fn holds(&self) -> Result<Vec<Hold>, BarrierError> {
        let mut p = redis::pipe();
        p.cmd("TIME")
            .cmd("ZRANGE")
            .arg(self.k_holds())
            .arg(0)
            .arg(999)
            .arg("REV")
            .arg("WITHSCORES");
        let ((secs, micros), index): ((i64, i64), Vec<(String, f64)>) =
            self.store.pipe("barrier_holds_list", &p).await?;
        let now = secs * 1000 + micros / 1000;
        // Entries past their expiry are holds that lifted themselves.
        let mut names: Vec<String> = index
            .into_iter()
            .filter(|(_, expires)| *expires as i64 > now)
            .map(|(n, _)| n)
            .collect();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        names.sort();
        Ok(self
            .holds_named(&names)
            .await?
            .into_iter()
            .map(|(h, _)| h)
            .filter(|h| h.held)
            .collect())
    }

    /// `node` enters DoubleBarrier `name` of `count`.
    pub async fn enter(&self, name: &str, node: &str, count: u32) -> Result<Entered, BarrierError> {
        let call = scripts::Enter {
            name,
            node,
            count,
            node_ttl_ms: self.node_ttl_ms,
            idle_ttl_ms: self.cfg.idle_ttl_ms,
            me: &self.node_id,
        };
        match self.store.run(&self.scripts.enter, &call).await? {
            EnterReply::TooMany { state } => Err(BarrierError::TooManyEntrants {
                name: name.into(),
                count: state.count,
            }),
            EnterReply::CountMismatch { state } => Err(BarrierError::CountMismatch {
                name: name.into(),
                count: state.count,
            }),
            EnterReply::NodeNotAlive => Err(BarrierError::NodeNotAlive(node.into())),
            EnterReply::Entered { state, again } => Ok(Entered {
                entered_now: !again,
                count: state.count,
                entrants: state.entrants,
                ready_at: state.ready_at,
            }),
        }
    }

    /// `node` leaves DoubleBarrier `name`.
    pub async fn leave(&self, name: &str, node: &str) -> Result<Left, BarrierError> {
        let call = scripts::Leave {
            name,
            node,
            node_ttl_ms: self.node_ttl_ms,
            me: &self.node_id,
        };
        let reply = self.store.run(&self.scripts.leave, &call).await?;
        Ok(Left {
            left_now: reply.left_now,
            entrants: reply.entrants,
            cycle: (!reply.cycle.is_empty()).then_some(reply.cycle),
        })
    }

    /// One DoubleBarrier's state.
    pub async fn double_barrier(&self, name: &str) -> Result<DoubleBarrier, BarrierError> {
        Ok(self.double_barriers_named(&[name.to_string()]).await?.remove(0))
    }

    async fn double_barriers_named(&self, names: &[String]) -> Result<Vec<DoubleBarrier>, BarrierError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for n in names {
            p.cmd("HGETALL").arg(self.k_db(n));
            p.cmd("ZRANGE").arg(self.k_db_in(n)).arg(0).arg(-1).arg("WITHSCORES");
        }
        let rows: Vec<Value> = self.store.pipe("dbarrier_get", &p).await?;
        let mut out = Vec::with_capacity(names.len());
        for (name, c) in names.iter().zip(rows.chunks(2)) {
            let h: BTreeMap<String, String> = redis::from_redis_value_ref(at(c, 0)).unwrap_or_default();
            let members: Vec<(String, f64)> = redis::from_redis_value_ref(at(c, 1)).unwrap_or_default();
            let ready_at = h.get("ready_at").and_then(|v| v.parse().ok());
            out.push(DoubleBarrier {
                name: name.clone(),
                count: h.get("count").and_then(|v| v.parse().ok()).unwrap_or(0),
                entrants: members
                    .into_iter()
                    .map(|(node, at)| Arrival { node, at: at as i64 })
                    .collect(),
                ready: ready_at.is_some(),
                ready_at,
                cycle: h.get("cycle").cloned(),
            });
        }
        Ok(out)
    }

    /// Every DoubleBarrier with activity within `barriers.idle_ttl_ms`.
    pub async fn double_barriers(&self) -> Result<Vec<DoubleBarrier>, BarrierError> {
        let mut names: Vec<String> = self
            .store
            .query(
                "dbarriers_list",
                redis::cmd("ZRANGE").arg(self.k_db_index()).arg(0).arg(999),
            )
            .await?;
        names.sort();
        let all = self.double_barriers_named(&names).await?;
        Ok(all.into_iter().filter(|d| !d.entrants.is_empty()).collect())
    }

    /// Evicts dead entrants of every DoubleBarrier (the background loop).
    pub async fn sweep_double_barriers(&self) -> Result<i64, BarrierError> {
        let call = scripts::DbSweep {
            node_ttl_ms: self.node_ttl_ms,
            idle_ttl_ms: self.cfg.idle_ttl_ms,
            me: &self.node_id,
            limit: 1000,
        };
        Ok(self.store.run(&self.scripts.db_sweep, &call).await?.evicted)
    }
}
