//! Node registry: who is in the cluster and who is alive.
//!
//! Invariants:
//! - Liveness is one sorted set scored by heartbeat expiry in Redis time (G11):
//!   a node is alive while its score is ahead of Redis `TIME`. No node's own
//!   clock takes part.
//! - A node is *marked* dead (event `node.dead`, orphan recovery allowed)
//!   only after a liveness pass (`lua/liveness.lua`), which gives every entry
//!   its lease back after Redis was unreachable or stalled, so an outage of
//!   any length never makes a live node look dead.
//! - A Redis error never marks anyone dead: every dead decision is made inside
//!   Redis, and a node that cannot reach Redis decides nothing.
//! - Info hashes carry a TTL; the sorted set is bounded by `nodes.max_nodes`
//!   and pruned, so nothing here grows without bound (G4).

pub(crate) mod routes;
mod scripts;
pub(crate) mod worker;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crate::config::NodesConfig;
use crate::problem::{Classify, Kind};
use crate::store::{ScriptCtx, Store, StoreError};
use scripts::{DrainReply, HeartbeatOutcome, LeaveReply, Scripts};

mod model;
pub use model::NodeKind;
pub(crate) use model::{Heartbeat, NodeInfo, NodeList, NodeState, Prune, ShardBeat};

#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    #[error("the cluster already has the maximum of {0} registered nodes (nodes.max_nodes)")]
    TooMany(u32),
    #[error("no live node `{0}`")]
    NotFound(String),
    #[error("`{0}` is a muster node, not a worker: only an admin removes nodes (DELETE /api/v1/nodes/{0})")]
    NotAWorker(String),
    #[error("`{0}` is a muster node's id: only that node heartbeats under it; pick another worker id")]
    MusterNode(String),
    #[error(
        "worker `{id}` was registered by another credential and is still registered; pick another worker id, \
         or wait until it leaves or is marked dead (an admin can remove it: DELETE /api/v1/nodes/{id})"
    )]
    OtherOwner { id: String, leave: bool },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Classify for NodesError {
    fn kind(&self) -> Kind {
        match self {
            NodesError::NotFound(_) => Kind::NotFound,
            NodesError::TooMany(_)
            | NodesError::NotAWorker(_)
            | NodesError::MusterNode(_)
            | NodesError::OtherOwner { leave: false, .. } => Kind::Conflict(serde_json::Value::Null),
            NodesError::OtherOwner { leave: true, .. } => Kind::Forbidden,
            NodesError::Store(s) => s.kind(),
        }
    }
}

/// The registry service.
pub struct Nodes {
    store: Store,
    cfg: NodesConfig,
    scripts: Scripts,
}

impl Nodes {
    pub fn new(store: Store, cfg: NodesConfig, ctx: &ScriptCtx) -> Arc<Nodes> {
        let scripts = Scripts::new(ctx);
        Arc::new(Nodes { store, cfg, scripts })
    }

    pub fn config(&self) -> &NodesConfig {
        &self.cfg
    }

    /// Registers or refreshes `id` for `ttl_ms` in every shard at once, and
    /// answers each shard's outcome in shard order (see [`Nodes::heartbeat`]).
    pub async fn heartbeat_each(
        &self,
        id: &str,
        kind: NodeKind,
        ttl_ms: u64,
        addr: &str,
        version: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<Result<ShardBeat, NodesError>> {
        let beats = self
            .store
            .every_shard()
            .map(|s| async move { self.heartbeat_in(&s, id, kind, "", ttl_ms, addr, version, labels).await });
        futures_util::future::join_all(beats).await
    }

    /// Registers or refreshes `id` for `ttl_ms` in the registry of shard
    /// `store`. The reply's Redis time is a clock sample for that shard's
    /// master. `owner` is a worker's credential (its token name): a worker
    /// heartbeat never writes a muster node's record, nor a live worker's
    /// registered by another credential (see `heartbeat.lua`); a muster
    /// node's own heartbeat passes "".
    #[allow(clippy::too_many_arguments)]
    pub async fn heartbeat_in(
        &self,
        store: &Store,
        id: &str,
        kind: NodeKind,
        owner: &str,
        ttl_ms: u64,
        addr: &str,
        version: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<ShardBeat, NodesError> {
        let labels = serde_json::to_string(labels).unwrap_or_else(|_| "{}".into());
        let call = scripts::Heartbeat {
            id,
            kind,
            ttl_ms,
            info_ttl_ms: ttl_ms + self.cfg.dead_retention_ms,
            max_nodes: self.cfg.max_nodes,
            addr,
            version,
            labels: &labels,
            owner: if kind == NodeKind::Worker { owner } else { "" },
        };
        let sent = Instant::now();
        let reply = store.run(&self.scripts.heartbeat, &call).await?;
        // The script read Redis time after the call was sent and before this
        // reply arrived: a sample for this shard's clock (G12).
        store.observe_clock(reply.now, sent, Instant::now());
        match reply.outcome {
            HeartbeatOutcome::TooMany => Err(NodesError::TooMany(self.cfg.max_nodes)),
            HeartbeatOutcome::MusterNode => Err(NodesError::MusterNode(id.into())),
            HeartbeatOutcome::OtherOwner => Err(NodesError::OtherOwner {
                id: id.into(),
                leave: false,
            }),
            outcome => Ok(ShardBeat {
                joined: outcome == HeartbeatOutcome::Joined,
                now: reply.now,
                expires_at: reply.expires_at,
                draining: reply.state == "draining",
            }),
        }
    }

    /// Registers or refreshes `id` for `ttl_ms`. On a split namespace every
    /// shard is heartbeaten at once, and a shard whose master fails costs
    /// only that shard: the answer names it in `unavailable_shards`. A stalled
    /// master does not hold the answer up: shards for which `skip` is true
    /// (this node's own heartbeat there is failing) are not tried, and once
    /// a shard has answered the others get twice as long again plus 20 ms
    /// (they run at once and normally answer together). A shard that has not
    /// answered by then is named, and its call goes on in the background:
    /// on a master that is only slow it still lands, as it would have.
    /// Refused when any shard is full (`max_nodes`) or refuses `owner`
    /// (see [`Nodes::heartbeat_in`]), and unavailable only when no shard
    /// applied it.
    #[allow(clippy::too_many_arguments)]
    pub async fn heartbeat(
        self: &Arc<Self>,
        id: &str,
        kind: NodeKind,
        owner: &str,
        ttl_ms: u64,
        addr: &str,
        version: &str,
        labels: &BTreeMap<String, String>,
        skip: impl Fn(usize) -> bool,
    ) -> Result<Heartbeat, NodesError> {
        use futures_util::StreamExt;
        let n = self.store.shard_count();
        let started = Instant::now();
        let mut each: Vec<Option<Result<ShardBeat, NodesError>>> = (0..n).map(|_| None).collect();
        let call = Arc::new((
            id.to_string(),
            owner.to_string(),
            addr.to_string(),
            version.to_string(),
            labels.clone(),
        ));
        let mut pending: futures_util::stream::FuturesUnordered<_> = self
            .store
            .every_shard()
            .filter(|s| n == 1 || !skip(s.shard_index()))
            .map(|s| {
                let (nodes, call) = (self.clone(), call.clone());
                let i = s.shard_index();
                let run = tokio::spawn(async move {
                    let (id, owner, addr, version, labels) = &*call;
                    nodes
                        .heartbeat_in(&s, id, kind, owner, ttl_ms, addr, version, labels)
                        .await
                });
                async move {
                    let r = run.await.unwrap_or_else(|e| {
                        Err(NodesError::Store(StoreError::Unavailable(format!(
                            "the heartbeat task failed: {e}"
                        ))))
                    });
                    (i, r)
                }
            })
            .collect();
        let mut cutoff: Option<tokio::time::Instant> = None;
        loop {
            let next = match cutoff {
                None => pending.next().await,
                Some(at) => match tokio::time::timeout_at(at, pending.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
            };
            let Some((i, r)) = next else { break };
            if r.is_ok() && cutoff.is_none() {
                let first = started.elapsed();
                // The rest get as long again as the first took (plus
                // 20 ms): the whole call waits at most twice the first
                // answer, and a stalled shard never holds a worker's
                // heartbeat longer than that.
                cutoff = Some(tokio::time::Instant::now() + first + std::time::Duration::from_millis(20));
            }
            each[i] = Some(r);
        }
        let each = each.into_iter().enumerate().map(|(i, r)| {
            r.unwrap_or_else(|| {
                Err(NodesError::Store(StoreError::Unavailable(format!(
                    "shard {i}'s master did not answer the heartbeat in time (it is stalled or unreachable)"
                ))))
            })
        });
        let mut out: Option<Heartbeat> = None;
        let mut failed = Vec::new();
        let mut first_error = None;
        for (shard, r) in each.into_iter().enumerate() {
            match r {
                Err(e @ (NodesError::TooMany(_) | NodesError::MusterNode(_) | NodesError::OtherOwner { .. })) => {
                    return Err(e);
                }
                Err(e) => {
                    failed.push(shard);
                    first_error.get_or_insert(e);
                }
                Ok(b) => match out.as_mut() {
                    None => {
                        out = Some(Heartbeat {
                            joined: b.joined,
                            now: b.now,
                            expires_at: b.expires_at,
                            state: if b.draining { "draining" } else { "active" }.into(),
                            unavailable_shards: Vec::new(),
                        })
                    }
                    Some(hb) => {
                        hb.joined |= b.joined;
                        if b.draining {
                            hb.state = "draining".into();
                        }
                    }
                },
            }
        }
        match (out, first_error) {
            (Some(mut hb), _) => {
                if !failed.is_empty() {
                    metrics::counter!("muster_node_heartbeats_partial_total").increment(1);
                }
                hb.unavailable_shards = failed;
                Ok(hb)
            }
            (None, Some(e)) => Err(e),
            (None, None) => Err(NodesError::Store(StoreError::Unavailable("no shard answered".into()))),
        }
    }

    /// Marks expired nodes dead and removes long-dead ones in shard `store`
    /// (one shard's pass: each shard's registry is judged on its own).
    pub async fn prune_in(&self, store: &Store) -> Result<Prune, NodesError> {
        let call = scripts::Prune {
            ttl_ms: self.cfg.ttl_ms,
            dead_retention_ms: self.cfg.dead_retention_ms,
            limit: 100,
        };
        Ok(store.run(&self.scripts.prune, &call).await?)
    }

    /// The store, for the per-shard loops.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Marks a live node draining in every shard. Returns false if it
    /// already was. A shard that fails makes the answer unavailable (503):
    /// draining again is harmless, so the caller retries until every shard
    /// has it.
    pub async fn drain(&self, id: &str, actor: &str) -> Result<bool, NodesError> {
        let call = scripts::Drain { id, actor };
        let mut changed = None;
        for reply in self.store.run_on_each_shard(&self.scripts.drain, &call).await {
            match reply? {
                DrainReply::NotAlive => {}
                DrainReply::Marked => changed = Some(true),
                DrainReply::AlreadyDraining => {
                    changed.get_or_insert(false);
                }
            }
        }
        changed.ok_or_else(|| NodesError::NotFound(id.into()))
    }

    /// Removes a node from the cluster (see `leave.lua`).
    pub async fn leave(&self, id: &str, reason: &str) -> Result<(), NodesError> {
        self.leave_as(id, reason, None, "").await
    }

    /// An external worker leaves: like [`Nodes::leave`], for worker
    /// registrations only, and only by the credential (`owner`) that
    /// registered it, both checked in the same script.
    pub async fn leave_worker(&self, id: &str, owner: &str) -> Result<(), NodesError> {
        self.leave_as(id, "left", Some(NodeKind::Worker), owner).await
    }

    async fn leave_as(&self, id: &str, reason: &str, only: Option<NodeKind>, owner: &str) -> Result<(), NodesError> {
        let call = scripts::Leave {
            id,
            reason,
            only,
            owner,
        };
        // Every shard at once; a shard that fails makes the answer
        // unavailable (503), and leaving again is harmless.
        let mut found = false;
        for reply in self.store.run_on_each_shard(&self.scripts.leave, &call).await {
            match reply? {
                LeaveReply::NotFound => {}
                LeaveReply::OtherKind => return Err(NodesError::NotAWorker(id.into())),
                LeaveReply::OtherOwner => {
                    return Err(NodesError::OtherOwner {
                        id: id.into(),
                        leave: true,
                    });
                }
                LeaveReply::Removed | LeaveReply::Kept => found = true,
            }
        }
        if found {
            Ok(())
        } else {
            Err(NodesError::NotFound(id.into()))
        }
    }

    /// Every registered node, read in two pipelined round trips per shard
    /// (the shards at once). On a split namespace each node is listed with
    /// its worst state over the shards, judged in each by that shard's own
    /// Redis time, and the shards where it is not alive; a shard that cannot
    /// be read is left out and named in `unavailable_shards`.
    pub async fn list(&self) -> Result<NodeList, NodesError> {
        let reads = self.store.every_shard().map(|s| async move { registry_of(&s).await });
        let mut now = 0;
        let mut merged: BTreeMap<String, Seen> = BTreeMap::new();
        let mut unavailable = Vec::new();
        let mut first_error = None;
        for (shard, read) in futures_util::future::join_all(reads).await.into_iter().enumerate() {
            let (shard_now, nodes) = match read {
                Ok(r) => r,
                Err(e) => {
                    unavailable.push(shard);
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            if now == 0 {
                now = shard_now;
            }
            for node in nodes {
                merge_into(&mut merged, shard, node);
            }
        }
        if unavailable.len() == self.store.shard_count()
            && let Some(e) = first_error
        {
            return Err(e.into());
        }
        let read: Vec<usize> = self
            .store
            .every_shard()
            .map(|s| s.shard_index())
            .filter(|i| !unavailable.contains(i))
            .collect();
        for node in merged.values_mut() {
            missing_is_dead(node, &read);
        }
        let mut list = NodeList {
            now,
            nodes: Vec::with_capacity(merged.len()),
            alive: 0,
            draining: 0,
            dead: 0,
            unavailable_shards: unavailable,
        };
        for Seen { node, .. } in merged.into_values() {
            match node.state {
                NodeState::Alive => list.alive += 1,
                NodeState::Draining => {
                    list.alive += 1;
                    list.draining += 1
                }
                NodeState::Dead | NodeState::Late | NodeState::Left => list.dead += 1,
            }
            list.nodes.push(node);
        }
        Ok(list)
    }

    /// The state of one node, if registered: its worst over the shards (see
    /// [`Nodes::list`]); shards that cannot be read are left out, unless
    /// none can.
    pub async fn get(&self, id: &str) -> Result<Option<NodeInfo>, NodesError> {
        let reads = self.store.every_shard().map(|s| async move {
            let k = s.keys();
            let mut p = redis::pipe();
            p.cmd("TIME")
                .cmd("ZSCORE")
                .arg(k.nodes())
                .arg(id)
                .cmd("HGETALL")
                .arg(k.node(id));
            let ((secs, micros), score, info): ((i64, i64), Option<f64>, BTreeMap<String, String>) =
                s.pipe("node_get", &p).await?;
            let now = secs * 1000 + micros / 1000;
            Ok::<_, StoreError>(score.map(|sc| model::node_info(id.to_string(), sc as i64, &info, now)))
        });
        let mut merged: BTreeMap<String, Seen> = BTreeMap::new();
        let mut read = Vec::new();
        let mut first_error = None;
        for (shard, r) in futures_util::future::join_all(reads).await.into_iter().enumerate() {
            match r {
                Ok(found) => {
                    read.push(shard);
                    if let Some(node) = found {
                        merge_into(&mut merged, shard, node);
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match (read.is_empty(), first_error) {
            (true, Some(e)) => Err(e.into()),
            _ => Ok(merged.into_values().next().map(|mut n| {
                missing_is_dead(&mut n, &read);
                n.node
            })),
        }
    }
}

/// One shard's registry: its Redis time and every node in it, judged by it.
async fn registry_of(s: &Store) -> Result<(i64, Vec<NodeInfo>), StoreError> {
    let k = s.keys();
    let mut p = redis::pipe();
    p.cmd("TIME")
        .cmd("ZRANGE")
        .arg(k.nodes())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES");
    let ((secs, micros), members): ((i64, i64), Vec<(String, f64)>) = s.pipe("nodes_list", &p).await?;
    let now = secs * 1000 + micros / 1000;
    let mut p = redis::pipe();
    for (id, _) in &members {
        p.cmd("HGETALL").arg(k.node(id));
    }
    let infos: Vec<BTreeMap<String, String>> = if members.is_empty() {
        Vec::new()
    } else {
        s.pipe("nodes_info", &p).await?
    };
    Ok((
        now,
        members
            .into_iter()
            .zip(infos)
            .map(|((id, score), info)| model::node_info(id, score as i64, &info, now))
            .collect(),
    ))
}

/// A node registered in some shards and missing from others that were read
/// (pruned there after it died, or never registered because its heartbeats
/// could not reach that shard): not alive in those, and dead at worst.
fn missing_is_dead(Seen { node, shards }: &mut Seen, read: &[usize]) {
    let mut seen: Vec<usize> = shards.clone();
    seen.sort_unstable();
    for &shard in read {
        if seen.binary_search(&shard).is_err() {
            node.shards_not_alive.push(shard);
            if badness(NodeState::Dead) > badness(node.state) {
                node.state = NodeState::Dead;
            }
        }
    }
    node.shards_not_alive.sort_unstable();
}

/// A node as merged from the shards read so far, with the shards whose
/// registry lists it.
struct Seen {
    node: NodeInfo,
    shards: Vec<usize>,
}

/// How bad a state is, for a node's worst state over the shards.
fn badness(s: NodeState) -> u8 {
    match s {
        NodeState::Alive => 0,
        NodeState::Draining => 1,
        NodeState::Late => 2,
        NodeState::Dead => 3,
        NodeState::Left => 4,
    }
}

/// Adds shard `shard`'s view of a node to `merged`: the node keeps the
/// first shard's details (shard order), its worst state, its earliest
/// expiry, and the shards where it is not alive.
fn merge_into(merged: &mut BTreeMap<String, Seen>, shard: usize, node: NodeInfo) {
    let alive_here = matches!(node.state, NodeState::Alive | NodeState::Draining);
    match merged.get_mut(&node.id) {
        None => {
            let mut node = node;
            if !alive_here {
                node.shards_not_alive.push(shard);
            }
            merged.insert(
                node.id.clone(),
                Seen {
                    node,
                    shards: vec![shard],
                },
            );
        }
        Some(Seen { node: m, shards }) => {
            if !alive_here {
                m.shards_not_alive.push(shard);
            }
            shards.push(shard);
            if badness(node.state) > badness(m.state) {
                m.state = node.state;
            }
            m.suspect |= node.suspect;
            m.expires_at = m.expires_at.min(node.expires_at);
        }
    }
}
