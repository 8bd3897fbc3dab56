//! The store: the one Redis client every subsystem shares.
//!
//! Invariants:
//! - Every call has a deadline (`redis.timeout_ms`); a call that misses it is
//!   an `Unavailable` error, never a hang.
//! - Reads are retried a bounded number of times with backoff; writes and
//!   scripts are not retried when their outcome is unknown (a timeout after
//!   sending), because replaying a claim could hand a task out twice. They are
//!   retried only when the connection was refused, i.e. nothing was sent.
//! - Every key starts with the hash-tagged prefix of [`Keys`] (subsystems
//!   build their own suffixes from it, as their scripts do); every script
//!   goes through [`Lua`].
//! - `healthy()` reflects the last call's outcome, so readiness and the claim
//!   path learn about an outage from real traffic, not only from a probe.

pub(crate) mod clock;
pub(crate) mod codes;
pub(crate) mod embedded;
pub(crate) mod keys;
pub(crate) mod layout;
pub(crate) mod passes;
pub(crate) mod reply;
pub(crate) mod script;
pub(crate) mod shards;

mod ack;
mod call;
mod conn;
mod master;
mod plain;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};
use tokio_util::sync::CancellationToken;

use self::clock::RedisClock;

pub(crate) use codes::Code;
pub(crate) use keys::Keys;
pub(crate) use passes::PassLog;
pub(crate) use script::ScriptCall;
pub use script::{Lua, ScriptCtx};

pub(crate) use self::ack::{AckScope, Confirmation};
pub use self::call::classify;
pub use self::conn::redact;
pub(crate) use self::conn::{Conn, ServerAuth};
pub(crate) use self::master::role_of;

use crate::config::RedisConfig;

/// Errors a store call can return.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Redis could not be reached, timed out, or is loading / read-only.
    #[error("{0}")]
    Unavailable(String),
    /// Redis answered with an error (a script bug, a wrong type).
    #[error("redis error: {0}")]
    Server(String),
    /// The reply did not have the expected shape.
    #[error("unexpected reply: {0}")]
    Decode(String),
}

pub(crate) type StoreResult<T> = Result<T, StoreError>;

/// How the node reaches Redis, for `GET /api/v1/redis` and the dashboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Embedded,
    Standalone,
    Sentinel,
    Cluster,
    /// The master is the one in `<data_dir>/redis-master`, written by the
    /// failover coordinator's rounds.
    Coordinated,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Embedded => "embedded",
            Mode::Standalone => "standalone",
            Mode::Sentinel => "sentinel",
            Mode::Cluster => "cluster",
            Mode::Coordinated => "coordinated",
        }
    }
}
/// What `INFO server` told us at connect time.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ServerInfo {
    pub version: String,
    pub mode: String,
    /// The server process's `run_id`: a new one means a different server (or
    /// the same one restarted), which is how a master change is recognised.
    pub run_id: String,
}
/// A master switch, for the Failover page (a wire type: muster-api).
pub(crate) use muster_api::system::Switch;

/// Coordinated mode: the master file and what was last read from it.
struct MasterFile {
    path: PathBuf,
    /// (mtime, content) of the last read; guarded by an async lock so one
    /// caller switches while the others wait for the outcome.
    seen: tokio::sync::Mutex<(Option<SystemTime>, String)>,
    /// Node-clock ms of the last stat, to stat at most every few ms.
    checked_ms: AtomicU64,
}

struct Inner {
    mode: Mode,
    address: RwLock<String>,
    client: RwLock<Option<redis::Client>>,
    /// Cluster mode: the client of the shared connection (to reopen it after
    /// a cut) and one whose connections have no response timeout, for
    /// blocking reads.
    cluster_client: Option<redis::cluster::ClusterClient>,
    cluster_blocking: Option<redis::cluster::ClusterClient>,
    /// The lanes calls travel: one outside Cluster mode (every shard is on
    /// the one server), one per shard route in Cluster mode (each shard's,
    /// then the root's), so that a master that stalls or fails over costs
    /// only the lanes of the shards it holds (see [`Lane`]).
    lanes: Vec<Lane>,
    /// Source of link ids.
    links: AtomicU64,
    auth: ServerAuth,
    master_file: Option<MasterFile>,
    /// Incremented at every master switch (dedicated connections reopen).
    generation: AtomicU64,
    last_switch: RwLock<Option<Switch>>,
    /// Woken when a call fails as unavailable (sentinel mode rediscovers).
    trouble: tokio::sync::Notify,
    /// The epoch script and this node's id: run on a new master before any
    /// call goes to it (see `failover/lua/epoch.lua`).
    epoch_script: RwLock<Option<(Lua, String)>>,
    /// The highest fencing epoch this node has seen.
    known_epoch: AtomicU64,
    /// How the namespace is split (`redis.shards`, `docs/sharding.md`), and
    /// each shard's keys, then the root's (`{p}`) when there are several.
    shards: shards::ShardMap,
    shard_keys: Vec<Keys>,
    /// Cluster mode: the route to each shard's slot (and the root's),
    /// computed once (every call is routed by it).
    shard_routes: Vec<Route>,
    timeout: Duration,
    read_retries: u32,
    healthy: AtomicBool,
    /// Last measured round trip, microseconds (for the dashboard).
    latency_us: AtomicU64,
    info: RwLock<ServerInfo>,
    /// The dedicated connections of replicated writes (see `ack.rs`).
    acks: Vec<ack::Pool>,
}

/// One route to Redis: the shared connection of the shards that use it and
/// the node's estimate of that server's clock. A timeout on a lane cuts
/// only its own link (calls in flight on other lanes, to other masters, go
/// on), and every script sent on it gets its deadline from its own clock
/// (G12 per master: Cluster masters run on clocks of their own).
struct Lane {
    /// The shared connection in use, with its identity and the token that
    /// cuts it (see [`Link`]).
    link: RwLock<Link>,
    /// Woken whenever the link is replaced (a reconnect finished, a switch).
    relinked: tokio::sync::Notify,
    /// The node's estimate of this lane's Redis time, for script deadlines.
    clock: RedisClock,
    /// The link was cut and reopening it has failed at least once (its
    /// master is down or stalled): calls fail at once instead of waiting for
    /// the reconnect, so a listing over every shard is not held up by one.
    reopen_failing: AtomicBool,
}

impl Lane {
    fn new(conn: Conn) -> Lane {
        Lane {
            link: RwLock::new(Link {
                conn,
                id: 1,
                cut: CancellationToken::new(),
            }),
            relinked: tokio::sync::Notify::new(),
            clock: RedisClock::new(),
            reopen_failing: AtomicBool::new(false),
        }
    }
}

/// The shared connection and what cuts it. A call that times out cuts the
/// link it used (G12): the token is cancelled, so every call still waiting
/// on that connection fails at once and drops its handle; the socket, set to
/// linger 0, is then reset rather than flushed, so commands still in the
/// kernel's send buffer never reach Redis; and a new connection is opened in
/// the background. Scripts that reach Redis anyway (a unix socket delivers
/// what was written) are refused by their deadline.
#[derive(Clone)]
struct Link {
    conn: Conn,
    id: u64,
    cut: CancellationToken,
}

/// Cheap to clone; all clones share one connection. A store is a view of
/// one shard of the namespace ([`Store::shard`]): its keys, and in Cluster
/// mode the master its calls go to, are that shard's.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
    shard: usize,
}

/// The oldest Redis that muster supports (functions as used here, `XADD
/// MAXLEN ~` with `LIMIT`, and effect replication of scripts that call TIME).
const MIN_VERSION: (u32, u32) = (7, 0);

impl Store {
    /// The keys of this view's shard.
    pub fn keys(&self) -> &Keys {
        &self.inner.shard_keys[self.shard]
    }
    /// How the namespace is split into shards.
    pub fn shards(&self) -> &shards::ShardMap {
        &self.inner.shards
    }
    /// The same store, viewing shard `i` (modulo the number of shards): its
    /// calls use that shard's keys and, in Cluster mode, go to the master of
    /// that shard's slot. Shares the connection and everything else.
    pub fn shard(&self, i: usize) -> Store {
        Store {
            inner: self.inner.clone(),
            shard: i % self.inner.shards.len(),
        }
    }
    /// The same store, viewing the namespace's own tag `{prefix}` (shard 0
    /// when the namespace is one shard): where the layout record lives, so
    /// a node finds it whatever the number of shards it was started with.
    pub fn root(&self) -> Store {
        Store {
            inner: self.inner.clone(),
            shard: self.inner.shard_keys.len() - 1,
        }
    }
    /// The lane this view's calls travel (its shard's in Cluster mode).
    fn lane(&self) -> &Lane {
        &self.inner.lanes[self.lane_index()]
    }
    /// The index of this view's lane (see [`Lane`]).
    fn lane_index(&self) -> usize {
        if self.inner.lanes.len() > 1 { self.shard } else { 0 }
    }
    /// Which shard this view is of.
    pub fn shard_index(&self) -> usize {
        self.shard
    }
    /// The view of the shard that name `name` (a lock, an election, a
    /// barrier, a schedule) belongs to.
    pub fn home_of(&self, name: &str) -> Store {
        self.shard(self.inner.shards.home(name))
    }
    /// How many shards the namespace is split into (1: not split).
    pub fn shard_count(&self) -> usize {
        self.inner.shards.len()
    }
    /// Every shard's view, in shard order.
    pub fn every_shard(&self) -> impl Iterator<Item = Store> + '_ {
        (0..self.inner.shards.len()).map(|i| self.shard(i))
    }
    /// Every shard's view but shard `home`'s, in shard order.
    pub fn other_shards(&self, home: usize) -> impl Iterator<Item = Store> + '_ {
        self.every_shard().filter(move |s| s.shard != home)
    }
    /// The views of shards `from..`, in shard order.
    pub fn shards_from(&self, from: usize) -> impl Iterator<Item = Store> + '_ {
        (from.min(self.inner.shards.len())..self.inner.shards.len()).map(|i| self.shard(i))
    }
    /// Runs `f` on every shard's view at once: the answers in shard order,
    /// or the first error. The one fan-out over a namespace's shards.
    pub async fn fan_out<T, E, F, Fut>(&self, f: F) -> Result<Vec<T>, E>
    where
        F: FnMut(Store) -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        futures_util::future::try_join_all(self.every_shard().map(f)).await
    }
    /// The first `n` members of sorted set `key` (lowest scores first, or
    /// highest with `rev`) over every shard: each shard's first `n`, read at
    /// once and merged by score, so a bound of `n` holds split as unsplit.
    pub async fn first_of_every_shard(
        &self,
        op: &'static str,
        key: impl Fn(&Keys) -> String,
        n: usize,
        rev: bool,
    ) -> StoreResult<Vec<(String, f64)>> {
        let reads = self.every_shard().map(|s| {
            let mut cmd = redis::cmd("ZRANGE");
            cmd.arg(key(s.keys())).arg(0).arg(n.saturating_sub(1));
            if rev {
                cmd.arg("REV");
            }
            cmd.arg("WITHSCORES");
            async move { s.query::<Vec<(String, f64)>>(op, &cmd).await }
        });
        let mut all = futures_util::future::try_join_all(reads).await?.concat();
        all.sort_by(|a, b| if rev { b.1.total_cmp(&a.1) } else { a.1.total_cmp(&b.1) });
        all.truncate(n);
        Ok(all)
    }
    /// Reads `names` with `read`, one call per shard they belong to (all at
    /// once, each given its shard's view and its names), and answers in the
    /// order of `names`: `read` answers one item per name given.
    pub async fn by_home<T, E, F, Fut>(&self, names: &[String], read: F) -> Result<Vec<T>, E>
    where
        F: Fn(Store, Vec<String>) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<T>, E>>,
    {
        let mut groups: std::collections::BTreeMap<usize, Vec<(usize, String)>> = Default::default();
        for (i, n) in names.iter().enumerate() {
            groups
                .entry(self.inner.shards.home(n))
                .or_default()
                .push((i, n.clone()));
        }
        let reads = groups.into_iter().map(|(shard, group)| {
            let (order, names): (Vec<usize>, Vec<String>) = group.into_iter().unzip();
            let read = read(self.shard(shard), names);
            async move { Ok::<_, E>(order.into_iter().zip(read.await?)) }
        });
        let mut out: Vec<(usize, T)> = futures_util::future::try_join_all(reads)
            .await?
            .into_iter()
            .flatten()
            .collect();
        out.sort_by_key(|(i, _)| *i);
        Ok(out.into_iter().map(|(_, t)| t).collect())
    }
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }
    /// The master in use (`host:port`), the URL (password hidden), or the
    /// cluster seeds; empty while invalidated.
    pub fn address(&self) -> String {
        self.inner.address.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
    pub fn server_info(&self) -> ServerInfo {
        self.inner.info.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
    /// Whether the last call reached Redis.
    pub fn healthy(&self) -> bool {
        self.inner.healthy.load(Ordering::Relaxed)
    }
    /// The last PING round trip.
    pub fn latency(&self) -> Duration {
        Duration::from_micros(self.inner.latency_us.load(Ordering::Relaxed))
    }
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }
}

/// The node's clock in ms since the epoch: for display and local throttling
/// only, never for a lease or liveness decision (those use Redis time).
pub(crate) fn node_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Store {
    /// The store of a namespace split into `shards` (`redis.shards`),
    /// assembled from its connections: the one place its parts (lanes,
    /// acknowledgement pools, shard routes) are put together.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn build(
        cfg: &RedisConfig,
        mode: Mode,
        address: String,
        client: Option<redis::Client>,
        conns: Vec<Conn>,
        cluster: Option<(redis::cluster::ClusterClient, redis::cluster::ClusterClient)>,
        master_file: Option<PathBuf>,
        shards: u32,
    ) -> Store {
        let (cluster_client, cluster_blocking) = cluster.unzip();
        let map = shards::ShardMap::new(&cfg.key_prefix, shards);
        // The shards, then (split namespaces only) the namespace's own tag,
        // `{prefix}`, where the layout record lives ([`Store::root`]).
        let mut shard_keys: Vec<Keys> = (0..map.len()).map(|i| Keys::tagged(map.tag(i))).collect();
        if map.len() > 1 {
            shard_keys.push(Keys::tagged(&format!("{{{}}}", cfg.key_prefix)));
        }
        let shard_routes = shard_keys.iter().map(conn::home_route).collect();
        Store {
            shard: 0,
            inner: Arc::new(Inner {
                mode,
                address: RwLock::new(address),
                client: RwLock::new(client),
                cluster_client,
                cluster_blocking,
                acks: conns.iter().map(|_| ack::Pool::new(cfg.ack_connections)).collect(),
                lanes: conns.into_iter().map(Lane::new).collect(),
                links: AtomicU64::new(1),
                auth: ServerAuth::from_config(cfg),
                master_file: master_file.map(|path| MasterFile {
                    path,
                    seen: tokio::sync::Mutex::new((None, String::new())),
                    checked_ms: AtomicU64::new(0),
                }),
                generation: AtomicU64::new(0),
                last_switch: RwLock::new(None),
                trouble: tokio::sync::Notify::new(),
                epoch_script: RwLock::new(None),
                known_epoch: AtomicU64::new(0),
                shards: map,
                shard_keys,
                shard_routes,
                timeout: Duration::from_millis(cfg.timeout_ms),
                read_retries: cfg.read_retries,
                healthy: AtomicBool::new(true),
                latency_us: AtomicU64::new(0),
                info: RwLock::new(ServerInfo::default()),
            }),
        }
    }
}
