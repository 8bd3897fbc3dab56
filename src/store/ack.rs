//! Replicated acknowledgements (`redis.ack_replicas`, the `Durability`
//! header): a change is confirmed by `n` replicas with `WAIT` before the
//! client is told it succeeded, so a failover that promotes one of those
//! replicas cannot lose it.
//!
//! Invariants:
//! - `WAIT` waits for the replication offset of the last write made *on its
//!   own connection*. So every script of an acknowledged request runs on one
//!   connection of a small pool ([`Store::in_ack_scope`]), and the request
//!   ends on that same connection with `SET <mark> PX 60000` and `WAIT n
//!   timeout` in one pipeline ([`Store::confirm_replicated`]). The mark comes
//!   after every change the master applied before it (a master's replication
//!   stream is one sequence), so the wait also covers a change the request
//!   only found: the replay of an idempotency key whose first write was never
//!   confirmed. (The tests' "already done" and replay cases pass on Redis
//!   7.0 without the mark too: a fresh connection's `WAIT` there blocked
//!   behind the unconfirmed write all the same, for a reason not pinned
//!   down. The mark does not depend on that, so it stays.)
//! - Never on the shared connection: `WAIT` blocks the connection it runs on
//!   until enough replicas answer or the timeout passes. The pool's
//!   connections are multiplexed and shared by the requests (one picked per
//!   request, round robin): a wait delays only the requests behind it on the
//!   same pooled connection, and a long poll that holds one delays nobody.
//! - Same connection, same server: a pooled connection never reconnects by
//!   itself (it dies with its socket), so the write and the wait reach the
//!   same server or the wait fails, which is answered as not replicated. In
//!   Cluster mode the connection may reconnect to a node internally: the
//!   pipeline reads `CLIENT ID` and any change from the id read when the
//!   connection was opened counts as not replicated.
//! - A namespace split into shards (`redis.shards`) on a Cluster has its
//!   shards on several masters: the scope records each shard its scripts
//!   wrote to, with that master's `CLIENT ID` read before the first write
//!   there, and the request ends with the mark and `WAIT` on each of those
//!   masters (all at once); it is replicated only when every one confirms.
//!   Elsewhere every shard is on the one master, and one `WAIT` covers all.
//! - One pool per lane (per shard route in Cluster mode, see `Lane`): a
//!   request writes each shard through a pooled connection of that shard's
//!   lane, so a master that fails or stalls retires only its own lanes'
//!   pooled connections, never one that requests to other masters share.
//! - A pooled connection on which a call timed out or failed as unavailable
//!   is dropped, never reused (G12); a master switch (a new generation)
//!   retires every pooled connection, and the next request opens a new one.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use redis::cluster_routing::Route;

use super::call::RetryableOr;
use super::{
    CancellationToken, Conn, Duration, FromRedisValue, Instant, Link, Lua, Ordering, Store, StoreError, StoreResult,
    classify,
};

tokio::task_local! {
    /// The acknowledged request being served, set by [`Store::in_ack_scope`].
    static ACK: Arc<ScopeInner>;
}

/// The pooled connections of replicated writes (`redis.ack_connections`).
pub(super) struct Pool {
    slots: Vec<tokio::sync::Mutex<Option<Pooled>>>,
    next: AtomicUsize,
}

impl Pool {
    pub(super) fn new(size: u32) -> Pool {
        Pool {
            slots: (0..size.max(1)).map(|_| tokio::sync::Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }
}

/// One pooled connection, the lane and slot it belongs to, the generation
/// it was opened in, and (Cluster) the `CLIENT ID` the master it was opened
/// on gave it, with that master's route.
#[derive(Clone)]
struct Pooled {
    lane: usize,
    slot: usize,
    link: Link,
    generation: u64,
    client_id: Option<i64>,
    route: Option<Route>,
}

#[derive(Default)]
struct ScopeInner {
    /// The pooled connection this request uses in each lane, once its first
    /// script there ran.
    pooled: Mutex<BTreeMap<usize, Pooled>>,
    /// The shards this request's scripts ran on, each with the `CLIENT ID`
    /// its master gave the pooled connection before the first of them
    /// (Cluster; None elsewhere).
    shards: Mutex<BTreeMap<usize, Option<i64>>>,
}

/// One acknowledged request: every script it runs inside
/// [`Store::in_ack_scope`] uses the same pooled connection, and
/// [`Store::confirm_replicated`] waits there.
#[derive(Clone, Default)]
pub struct AckScope(Arc<ScopeInner>);

/// What `WAIT` said about a request's changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation {
    /// At least the required number of replicas confirmed (how many did).
    Replicated(u32),
    /// Fewer confirmed within the timeout (how many did).
    Short(u32),
    /// The wait could not be made or its answer was lost (the connection
    /// broke, a master switch, no answer in time): nothing is known.
    Unknown(String),
}

impl Store {
    /// Runs `fut` (a request handler) so that every script it runs goes to
    /// the request's pooled connection (see the module header).
    pub async fn in_ack_scope<F: std::future::Future>(&self, scope: &AckScope, fut: F) -> F::Output {
        ACK.scope(scope.0.clone(), fut).await
    }

    /// The current request's scope, when it is acknowledged.
    pub(super) fn ack_scope() -> Option<AckScope> {
        ACK.try_with(|s| AckScope(s.clone())).ok()
    }

    /// Sets the mark and waits for `replicas` confirmations of it, up to
    /// `wait`, on the request's pooled connection (a fresh pick when the
    /// request ran no script). Records the wait's metrics.
    pub async fn confirm_replicated(&self, scope: &AckScope, replicas: u32, wait: Duration) -> Confirmation {
        let start = Instant::now();
        let outcome = self.wait_replicas(scope, replicas, wait).await;
        metrics::histogram!("muster_redis_ack_wait_seconds").record(start.elapsed().as_secs_f64());
        let label = match &outcome {
            Confirmation::Replicated(_) => "replicated",
            Confirmation::Short(_) => "short",
            Confirmation::Unknown(_) => "unknown",
        };
        metrics::counter!("muster_redis_ack_waits_total", "outcome" => label).increment(1);
        if !matches!(outcome, Confirmation::Replicated(_)) {
            metrics::counter!("muster_redis_ack_shortfalls_total").increment(1);
        }
        outcome
    }

    async fn wait_replicas(&self, scope: &AckScope, replicas: u32, wait: Duration) -> Confirmation {
        let written: Vec<(usize, Option<i64>)> = scope
            .0
            .shards
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(s, id)| (*s, *id))
            .collect();
        // Outside Cluster every shard is on one master: one wait covers all.
        // A request that ran no script waits where it is (its replay's
        // first write came before the mark there).
        if self.inner.lanes.len() == 1 || written.len() <= 1 {
            let pooled = match self.ack_pooled(scope).await {
                Ok(p) => p,
                Err(e) => return Confirmation::Unknown(e.to_string()),
            };
            let (shard, id) = match written.first() {
                Some(w) => *w,
                None => {
                    if let Err(e) = self.note_ack_shard(scope, &pooled).await {
                        return Confirmation::Unknown(e.to_string());
                    }
                    let id = scope
                        .0
                        .shards
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&self.shard)
                        .copied();
                    (self.shard, id.flatten())
                }
            };
            let at = self.shard(shard);
            let pooled = match at.ack_pooled(scope).await {
                Ok(p) => p,
                Err(e) => return Confirmation::Unknown(e.to_string()),
            };
            return at.wait_one(&pooled, id, replicas, wait).await;
        }
        let waits = written.into_iter().map(|(shard, id)| async move {
            let at = self.shard(shard);
            match at.ack_pooled(scope).await {
                Ok(pooled) => at.wait_one(&pooled, id, replicas, wait).await,
                Err(e) => Confirmation::Unknown(e.to_string()),
            }
        });
        let outcomes = futures_util::future::join_all(waits).await;
        if let Some(unknown) = outcomes.iter().find(|o| matches!(o, Confirmation::Unknown(_))) {
            return unknown.clone();
        }
        let fewest = outcomes
            .iter()
            .map(|o| match o {
                Confirmation::Replicated(n) | Confirmation::Short(n) => *n,
                Confirmation::Unknown(_) => 0,
            })
            .min()
            .unwrap_or(0);
        if outcomes.iter().all(|o| matches!(o, Confirmation::Replicated(_))) {
            Confirmation::Replicated(fewest)
        } else {
            Confirmation::Short(fewest)
        }
    }

    /// The mark and `WAIT` on this shard's master, on the pooled connection;
    /// `client_id` is the id that master gave it before the request's first
    /// write there (Cluster).
    async fn wait_one(&self, pooled: &Pooled, client_id: Option<i64>, replicas: u32, wait: Duration) -> Confirmation {
        let mut pipe = redis::pipe();
        if client_id.is_some() {
            pipe.cmd("CLIENT").arg("ID");
        }
        pipe.cmd("SET")
            .arg(self.keys().ack_mark())
            .arg(1)
            .arg("PX")
            .arg(60_000)
            .ignore();
        pipe.cmd("WAIT").arg(replicas).arg(wait.as_millis() as u64);
        let mut conn = self.routed(pooled.link.clone()).conn;
        let limit = wait + self.inner.timeout;
        let res: redis::RedisResult<Vec<i64>> = tokio::select! {
            r = tokio::time::timeout(limit, pipe.query_async(&mut conn)) => match r {
                Ok(r) => r,
                Err(_) => {
                    self.retire_pooled(pooled).await;
                    return Confirmation::Unknown(format!("WAIT got no answer within {} ms", limit.as_millis()));
                }
            },
            _ = pooled.link.cut.cancelled() => {
                return Confirmation::Unknown("the connection of this write was dropped before WAIT answered".into());
            }
        };
        let values = match res {
            Ok(v) => v,
            Err(e) => {
                let err = classify(&e);
                if matches!(err, StoreError::Unavailable(_)) {
                    self.retire_pooled(pooled).await;
                }
                return Confirmation::Unknown(format!("WAIT failed: {err}"));
            }
        };
        let (now_id, acked) = match (client_id, values.as_slice()) {
            (Some(_), [id, acked]) => (Some(*id), *acked),
            (None, [acked]) => (None, *acked),
            _ => return Confirmation::Unknown(format!("unexpected reply to WAIT: {values:?}")),
        };
        if now_id != client_id {
            self.retire_pooled(pooled).await;
            return Confirmation::Unknown(
                "the cluster connection was reopened between the write and WAIT, which may have reached another server"
                    .into(),
            );
        }
        let acked = acked.max(0) as u32;
        if acked >= replicas {
            Confirmation::Replicated(acked)
        } else {
            Confirmation::Short(acked)
        }
    }

    /// [`Store::eval`] inside an acknowledged request: on the request's
    /// pooled connection, not retried (a retry on another connection would
    /// leave the request's writes where its `WAIT` cannot see them).
    pub(super) async fn eval_acked<T: FromRedisValue>(
        &self,
        scope: &AckScope,
        lua: &Lua,
        keys: &[String],
        args: &[String],
    ) -> StoreResult<T> {
        let pooled = self.ack_pooled(scope).await?;
        self.note_ack_shard(scope, &pooled).await?;
        let args = super::call::with_deadline(args, self.deadline()?);
        let mut conn = self.routed(pooled.link.clone()).conn;
        match self
            .timed_on(&pooled.link, lua.name(), lua.call::<T, _>(&mut conn, keys, &args))
            .await
        {
            Ok(v) => Ok(v),
            Err(RetryableOr::Retry(e)) => {
                // Timed out, cut, or unreachable: never reuse it (G12).
                self.retire_pooled(&pooled).await;
                Err(e)
            }
            Err(RetryableOr::Fail(e)) => Err(e),
        }
    }

    /// Records that the request writes to this shard, with the `CLIENT ID`
    /// its master gives the pooled connection now (Cluster: read once per
    /// shard and request, unless the connection was opened on that master).
    async fn note_ack_shard(&self, scope: &AckScope, pooled: &Pooled) -> StoreResult<()> {
        if scope
            .0
            .shards
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&self.shard)
        {
            return Ok(());
        }
        let route = self.inner.shard_routes.get(self.shard).copied();
        let id = match pooled.client_id {
            Some(id) if route == pooled.route => Some(id),
            Some(_) => {
                let mut c = self.routed(pooled.link.clone()).conn;
                match self
                    .timed_on(
                        &pooled.link,
                        "client_id",
                        redis::cmd("CLIENT").arg("ID").query_async(&mut c),
                    )
                    .await
                {
                    Ok(id) => Some(id),
                    Err(RetryableOr::Retry(e)) => {
                        self.retire_pooled(pooled).await;
                        return Err(e);
                    }
                    Err(RetryableOr::Fail(e)) => return Err(e),
                }
            }
            None => None,
        };
        scope
            .0
            .shards
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(self.shard)
            .or_insert(id);
        Ok(())
    }

    /// The request's pooled connection in this view's lane: the one it used
    /// already (an error if that one was dropped meanwhile), or the next
    /// slot's, opened if needed.
    async fn ack_pooled(&self, scope: &AckScope) -> StoreResult<Pooled> {
        let lane = self.lane_index();
        let held = scope
            .0
            .pooled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&lane)
            .cloned();
        if let Some(p) = held {
            if p.link.cut.is_cancelled() {
                return Err(StoreError::Unavailable(
                    "the dedicated connection of this replicated write was dropped; retry".into(),
                ));
            }
            return Ok(p);
        }
        let pool = &self.inner.acks[lane];
        let slot = pool.next.fetch_add(1, Ordering::Relaxed) % pool.slots.len();
        let p = self.pooled_at(slot).await?;
        scope
            .0
            .pooled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(lane)
            .or_insert(p.clone());
        Ok(p)
    }

    /// Slot `slot`'s connection in this view's lane, opened when it has
    /// none, was dropped, or belongs to an older master (generation).
    async fn pooled_at(&self, slot: usize) -> StoreResult<Pooled> {
        self.follow_master_file().await;
        let lane = self.lane_index();
        let mut held = self.inner.acks[lane].slots[slot].lock().await;
        let generation = self.generation();
        if let Some(p) = held.as_ref() {
            if p.generation == generation && !p.link.cut.is_cancelled() {
                return Ok(p.clone());
            }
            p.link.cut.cancel();
        }
        *held = None;
        let conn = self.open_ack_conn().await?;
        let link = Link {
            conn,
            id: self.inner.links.fetch_add(1, Ordering::SeqCst) + 1,
            cut: CancellationToken::new(),
        };
        let (client_id, route) = match link.conn {
            Conn::Cluster(_, route) => {
                let mut c = link.conn.clone();
                let id: i64 = self
                    .timed_on(&link, "client_id", redis::cmd("CLIENT").arg("ID").query_async(&mut c))
                    .await
                    .map_err(RetryableOr::into_error)?;
                (Some(id), Some(route))
            }
            _ => (None, None),
        };
        let p = Pooled {
            lane,
            slot,
            link,
            generation,
            client_id,
            route,
        };
        *held = Some(p.clone());
        metrics::counter!("muster_redis_ack_connections_opened_total").increment(1);
        Ok(p)
    }

    /// A new connection for the pool: like [`Store::dedicated`] (no response
    /// timeout of its own: every command on it is bounded by the caller), but
    /// never the shared connection.
    async fn open_ack_conn(&self) -> StoreResult<Conn> {
        self.open_own().await.unwrap_or_else(|| {
            Err(StoreError::Unavailable(
                "no Redis master in use: waiting for a failover round to name one".into(),
            ))
        })
    }

    /// Drops `p` from its slot (if it is still there) and cuts it, so every
    /// call still waiting on it gives up at once.
    async fn retire_pooled(&self, p: &Pooled) {
        p.link.cut.cancel();
        let mut held = self.inner.acks[p.lane].slots[p.slot].lock().await;
        if held.as_ref().is_some_and(|h| h.link.id == p.link.id) {
            *held = None;
        }
    }
}
