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

pub mod clock;
pub mod codes;
pub mod embedded;
pub mod keys;
pub mod reply;
pub mod script;

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

pub use codes::Code;
pub use keys::Keys;
pub use script::{Lua, ScriptCall, ScriptCtx};

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

pub type StoreResult<T> = Result<T, StoreError>;

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

/// A connection of either topology, usable wherever redis-rs wants a
/// `ConnectionLike` (commands, pipelines, scripts).
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Multiplexed(MultiplexedConnection),
    /// Cluster mode, with the route to the master of the `{prefix}` hash
    /// slot. Every muster key lives in that slot, so *every* command and
    /// pipeline is sent there explicitly: left to redis-rs, keyless ones
    /// would go elsewhere (PING, INFO, DBSIZE to all masters, aggregated;
    /// TIME, ROLE and keyless pipelines to a random node), so health, the
    /// Redis summary and Redis time would describe the wrong server.
    Cluster(redis::cluster_async::ClusterConnection, Route),
    /// No master: invalidated by a failover round, or not yet known. Every
    /// call fails at once as unavailable; nothing is sent anywhere.
    Down,
    /// The connection was cut after a call timed out (G12) and a new one is
    /// being opened to the same server: calls fail at once until it is up.
    Reconnecting,
}

fn down_error() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "no Redis master: invalidated by a failover round, waiting for the new master",
    ))
}

fn reconnecting_error() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "reconnecting to Redis after a call timed out",
    ))
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Multiplexed(c) => c.req_packed_command(cmd),
            Conn::Cluster(c, home) => Box::pin(c.route_command(
                cmd.clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(*home)),
            )),
            Conn::Down => Box::pin(async { Err(down_error()) }),
            Conn::Reconnecting => Box::pin(async { Err(reconnecting_error()) }),
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Multiplexed(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c, home) => {
                Box::pin(c.route_pipeline(cmd.clone(), offset, count, SingleNodeRoutingInfo::SpecificNode(*home)))
            }
            Conn::Down => Box::pin(async { Err(down_error()) }),
            Conn::Reconnecting => Box::pin(async { Err(reconnecting_error()) }),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Multiplexed(c) => c.get_db(),
            Conn::Cluster(c, _) => c.get_db(),
            Conn::Down | Conn::Reconnecting => 0,
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

/// How to reach data servers given as `host:port` (sentinel, cluster and
/// coordinated modes).
#[derive(Debug, Clone, Default)]
pub struct ServerAuth {
    pub username: String,
    pub password: String,
    pub tls: bool,
    pub insecure: bool,
}

impl ServerAuth {
    pub fn from_config(cfg: &RedisConfig) -> Self {
        ServerAuth {
            username: cfg.username.clone(),
            password: cfg.password.clone(),
            tls: cfg.tls,
            insecure: cfg.insecure_skip_tls_verify,
        }
    }

    /// `redis[s]://[user:pass@]host:port`, the password percent-encoded.
    pub fn url(&self, addr: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let cred = match (self.username.is_empty(), self.password.is_empty()) {
            (true, true) => String::new(),
            (true, false) => format!(":{}@", pct(&self.password)),
            (false, _) => format!("{}:{}@", pct(&self.username), pct(&self.password)),
        };
        let mut url = format!("{scheme}://{cred}{addr}");
        if self.tls && self.insecure {
            url.push_str("#insecure");
        }
        url
    }
}

fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A master switch, for the Failover page.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Switch {
    pub from: String,
    pub to: String,
    /// Node clock, ms since the epoch (informational only).
    pub at_ms: i64,
}

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
    /// The shared connection in use, with its identity and the token that
    /// cuts it (see [`Link`]).
    link: RwLock<Link>,
    /// Source of link ids.
    links: AtomicU64,
    /// Woken whenever the link is replaced (a reconnect finished, a switch).
    relinked: tokio::sync::Notify,
    /// The node's estimate of Redis time, for script deadlines (G12).
    clock: RedisClock,
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
    keys: Keys,
    timeout: Duration,
    read_retries: u32,
    healthy: AtomicBool,
    /// Last measured round trip, microseconds (for the dashboard).
    latency_us: AtomicU64,
    info: RwLock<ServerInfo>,
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

/// Cheap to clone; all clones share one connection.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// The oldest Redis that muster supports (functions as used here, `XADD
/// MAXLEN ~` with `LIMIT`, and effect replication of scripts that call TIME).
const MIN_VERSION: (u32, u32) = (7, 0);

impl Store {
    /// Connects to a standalone server (TCP, TLS or unix socket), checks it
    /// with PING and `INFO server`, and refuses Redis older than 7.0.
    pub async fn connect(cfg: &RedisConfig, url: &str, mode: Mode) -> StoreResult<Store> {
        let mut url = url.to_string();
        if url.starts_with("rediss://") && cfg.insecure_skip_tls_verify {
            tracing::warn!(
                "redis.insecure_skip_tls_verify is on: the Redis server's TLS certificate is NOT verified; \
                 anyone on the path can impersonate it"
            );
            if !url.contains("#insecure") {
                url.push_str("#insecure");
            }
        }
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let (client, mgr) = open_single(&url, timeout).await?;
        let store = Store::build(cfg, mode, redact(&url), Some(client), Conn::Single(mgr), None, None);
        store.check_server().await?;
        Ok(store)
    }

    /// Connects to the master at `addr` (`host:port`, from the sentinels or
    /// the master file) and confirms with `ROLE` that it is one.
    pub async fn connect_master(
        cfg: &RedisConfig,
        addr: &str,
        mode: Mode,
        master_file: Option<&Path>,
    ) -> StoreResult<Store> {
        let auth = ServerAuth::from_config(cfg);
        if auth.tls && auth.insecure {
            tracing::warn!("redis.insecure_skip_tls_verify is on: Redis TLS certificates are NOT verified");
        }
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let url = auth.url(addr);
        let (client, mgr) = open_single(&url, timeout).await?;
        let store = Store::build(
            cfg,
            mode,
            addr.to_string(),
            Some(client),
            Conn::Single(mgr),
            None,
            master_file.map(|p| p.to_path_buf()),
        );
        let role = store.role().await?;
        if role != "master" {
            return Err(StoreError::Unavailable(format!(
                "{addr} is not a master (ROLE says {role})"
            )));
        }
        store.check_server().await?;
        if let Some(f) = &store.inner.master_file {
            let mtime = std::fs::metadata(&f.path).and_then(|m| m.modified()).ok();
            *f.seen.lock().await = (mtime, addr.to_string());
        }
        Ok(store)
    }

    /// Connects to a Redis Cluster through its seed nodes.
    pub async fn connect_cluster(cfg: &RedisConfig) -> StoreResult<Store> {
        let auth = ServerAuth::from_config(cfg);
        let seeds: Vec<String> = cfg.cluster.iter().map(|a| auth.url(a)).collect();
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let builder = |response: Option<Duration>| {
            let mut b = redis::cluster::ClusterClient::builder(seeds.clone())
                .connection_timeout(timeout)
                .tcp_settings(tcp_settings());
            if let Some(r) = response {
                b = b.response_timeout(r);
            } else {
                b = b.response_timeout(Duration::from_secs(3600));
            }
            b.build()
                .map_err(|e| StoreError::Unavailable(format!("invalid redis.cluster seeds: {e}")))
        };
        let client = builder(Some(timeout))?;
        let blocking = builder(None)?;
        let conn = tokio::time::timeout(timeout * 2, client.get_async_connection())
            .await
            .map_err(|_| StoreError::Unavailable("timed out connecting to the Redis Cluster".into()))?
            .map_err(|e| StoreError::Unavailable(format!("cannot connect to the Redis Cluster: {e}")))?;
        let store = Store::build(
            cfg,
            Mode::Cluster,
            cfg.cluster.join(","),
            None,
            Conn::Cluster(conn, home_route(&Keys::new(&cfg.key_prefix))),
            Some((client, blocking)),
            None,
        );
        store.check_server().await?;
        Ok(store)
    }

    /// A store with no master yet (coordinated mode): every call fails as
    /// unavailable until the master file names one.
    pub fn without_master(cfg: &RedisConfig, mode: Mode, master_file: &Path) -> Store {
        Store::build(
            cfg,
            mode,
            String::new(),
            None,
            Conn::Down,
            None,
            Some(master_file.to_path_buf()),
        )
    }

    fn build(
        cfg: &RedisConfig,
        mode: Mode,
        address: String,
        client: Option<redis::Client>,
        conn: Conn,
        cluster: Option<(redis::cluster::ClusterClient, redis::cluster::ClusterClient)>,
        master_file: Option<PathBuf>,
    ) -> Store {
        let (cluster_client, cluster_blocking) = cluster.unzip();
        Store {
            inner: Arc::new(Inner {
                mode,
                address: RwLock::new(address),
                client: RwLock::new(client),
                cluster_client,
                cluster_blocking,
                link: RwLock::new(Link {
                    conn,
                    id: 1,
                    cut: CancellationToken::new(),
                }),
                links: AtomicU64::new(1),
                relinked: tokio::sync::Notify::new(),
                clock: RedisClock::new(),
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
                keys: Keys::new(&cfg.key_prefix),
                timeout: Duration::from_millis(cfg.timeout_ms),
                read_retries: cfg.read_retries,
                healthy: AtomicBool::new(true),
                latency_us: AtomicU64::new(0),
                info: RwLock::new(ServerInfo::default()),
            }),
        }
    }

    /// The first element of `ROLE`: `master`, `slave` or `sentinel`.
    pub async fn role(&self) -> StoreResult<String> {
        let v: Value = self.call_here("role", &redis::cmd("ROLE"), true).await?;
        Ok(role_of(&v))
    }

    /// Switches to the master at `addr` (`host:port`) after confirming with
    /// `ROLE` that it is one. Returns false (and changes nothing) when `addr`
    /// is already the master in use.
    pub async fn switch_master(&self, addr: &str) -> StoreResult<bool> {
        if self.address() == addr && self.has_master() {
            return Ok(false);
        }
        let url = self.inner.auth.url(addr);
        let (client, mgr) = open_single(&url, self.inner.timeout).await?;
        let mut probe = Conn::Single(mgr.clone());
        let v: Value = self
            .timed_on(
                &Link::probe(probe.clone()),
                "role",
                redis::cmd("ROLE").query_async(&mut probe),
            )
            .await
            .map_err(RetryableOr::into_error)?;
        let role = role_of(&v);
        if role != "master" {
            return Err(StoreError::Unavailable(format!(
                "{addr} is not a master (ROLE says {role})"
            )));
        }
        // A new server has its own clock: deadlines are computed from it
        // from now on, starting with the epoch script's.
        self.inner.clock.reset();
        self.sync_clock_on(&mut probe).await?;
        // Fencing first: no token is issued on the new master before its
        // epoch is above every epoch seen before the switch.
        self.bump_epoch_on(&mut probe, addr).await?;
        let from = self.address();
        *self.inner.client.write().unwrap_or_else(|p| p.into_inner()) = Some(client);
        self.replace_link(Conn::Single(mgr));
        *self.inner.address.write().unwrap_or_else(|p| p.into_inner()) = addr.to_string();
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        let now_ms = node_clock_ms();
        *self.inner.last_switch.write().unwrap_or_else(|p| p.into_inner()) = Some(Switch {
            from: from.clone(),
            to: addr.to_string(),
            at_ms: now_ms,
        });
        metrics::counter!("muster_redis_master_changes_total").increment(1);
        tracing::warn!(from = %from, to = %addr, "switched to a new Redis master");
        let _ = self.check_server().await;
        Ok(true)
    }

    /// Installs the epoch script run at every switch (and by [`Store::ensure_epoch`]).
    pub fn set_epoch_script(&self, lua: Lua, node_id: &str) {
        *self.inner.epoch_script.write().unwrap_or_else(|p| p.into_inner()) = Some((lua, node_id.to_string()));
    }

    /// The highest fencing epoch this node has seen (0: none yet).
    pub fn known_epoch(&self) -> u64 {
        self.inner.known_epoch.load(Ordering::SeqCst)
    }

    /// Records an epoch read from Redis, so a later bump starts above it.
    pub fn saw_epoch(&self, e: u64) {
        self.inner.known_epoch.fetch_max(e, Ordering::SeqCst);
    }

    /// Runs the epoch script on the master in use: bumps the epoch once per
    /// master (by run_id). Returns (epoch, bumped).
    pub async fn ensure_epoch(&self) -> StoreResult<(u64, bool)> {
        let mut conn = self.link().conn;
        let addr = self.address();
        if self.inner.clock.now_ms().is_none() {
            self.sync_clock_on(&mut conn).await?;
        }
        self.bump_epoch_on(&mut conn, &addr).await
    }

    async fn bump_epoch_on(&self, conn: &mut Conn, addr: &str) -> StoreResult<(u64, bool)> {
        let script = self
            .inner
            .epoch_script
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some((lua, node)) = script else {
            return Ok((0, false));
        };
        let probe = Link::probe(conn.clone());
        let info: Value = self
            .timed_on(&probe, "info", redis::cmd("INFO").arg("server").query_async(conn))
            .await
            .map_err(RetryableOr::into_error)?;
        let text = match info {
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::VerbatimString { text, .. } => text,
            _ => String::new(),
        };
        let run_id = text
            .lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|v| v.trim().to_string())
            .unwrap_or_default();
        // Sent on `conn` itself (the new master, not yet in use), so not
        // through `Store::run`; the typed call still orders keys and args.
        let call = crate::failover::scripts::Epoch {
            run_id: &run_id,
            min_epoch: self.known_epoch() + 1,
            node: &node,
            addr,
        };
        let mut inv = lua.script().prepare_invoke();
        for key in call.keys(&self.inner.keys) {
            inv.key(key);
        }
        for arg in call.args() {
            inv.arg(arg);
        }
        inv.arg(self.deadline()?);
        let reply: crate::failover::scripts::EpochReply = self
            .timed_on(&probe, lua.name(), inv.invoke_async(conn))
            .await
            .map_err(RetryableOr::into_error)?;
        let (epoch, bumped) = (reply.epoch, reply.bumped);
        self.saw_epoch(epoch);
        if bumped {
            metrics::counter!("muster_failover_switches_total").increment(1);
            tracing::warn!(epoch, master = %addr, "fencing epoch bumped for a new Redis master");
        }
        Ok((epoch, bumped))
    }

    /// Stops using the master: every call fails as unavailable until
    /// [`Store::switch_master`]. Used by a coordinated failover's `invalidate`.
    pub fn invalidate(&self) {
        self.replace_link(Conn::Down);
        *self.inner.client.write().unwrap_or_else(|p| p.into_inner()) = None;
        *self.inner.address.write().unwrap_or_else(|p| p.into_inner()) = String::new();
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        self.inner.healthy.store(false, Ordering::Relaxed);
        tracing::warn!("Redis master invalidated: no Redis calls until the failover round reconfigures");
    }

    /// Whether a master is in use (false after `invalidate`).
    pub fn has_master(&self) -> bool {
        !matches!(self.link().conn, Conn::Down)
    }

    /// Changes at every switch or invalidation.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::SeqCst)
    }

    pub fn last_switch(&self) -> Option<Switch> {
        self.inner.last_switch.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Notified when a call finds Redis unavailable or read-only.
    pub fn trouble(&self) -> &tokio::sync::Notify {
        &self.inner.trouble
    }

    pub fn server_auth(&self) -> &ServerAuth {
        &self.inner.auth
    }

    /// Coordinated mode: re-reads the master file when its mtime changed and
    /// follows it (an empty file means "no master": calls fail until it names
    /// one). Cheap when nothing changed: one `stat` at most every 20 ms.
    pub async fn follow_master_file(&self) {
        let Some(f) = &self.inner.master_file else { return };
        let now = node_clock_ms().max(0) as u64;
        let last = f.checked_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < 20 {
            return;
        }
        f.checked_ms.store(now, Ordering::Relaxed);
        let mtime = std::fs::metadata(&f.path).and_then(|m| m.modified()).ok();
        {
            let seen = f.seen.lock().await;
            if seen.0 == mtime && mtime.is_some() {
                return;
            }
        }
        let mut seen = f.seen.lock().await;
        let mtime = std::fs::metadata(&f.path).and_then(|m| m.modified()).ok();
        if seen.0 == mtime && mtime.is_some() {
            return;
        }
        let content = std::fs::read_to_string(&f.path).unwrap_or_default().trim().to_string();
        if content.is_empty() {
            if self.has_master() {
                self.invalidate();
            }
            *seen = (mtime, content);
            return;
        }
        match self.switch_master(&content).await {
            Ok(_) => *seen = (mtime, content),
            Err(e) => {
                tracing::warn!(master = %content, error = %e, "the master file names a server that is not usable");
                // Re-check at the next call; never fall back to the old master.
                if self.has_master() && self.address() != content {
                    self.invalidate();
                }
            }
        }
    }

    /// Forces the next [`Store::follow_master_file`] to stat the file.
    pub fn master_file_touched(&self) {
        if let Some(f) = &self.inner.master_file {
            f.checked_ms.store(0, Ordering::Relaxed);
        }
    }

    /// PING, then `INFO server`: records the version and refuses old servers.
    pub async fn check_server(&self) -> StoreResult<ServerInfo> {
        let _: String = self.call_here("ping", &redis::cmd("PING"), true).await?;
        // In a cluster too this reaches one server: the namespace's master.
        let text: String = self
            .call_here("info", &redis::cmd("INFO").arg("server").to_owned(), true)
            .await?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        let info = ServerInfo {
            version: field("redis_version"),
            mode: field("redis_mode"),
            run_id: field("run_id"),
        };
        if !version_supported(&info.version) {
            return Err(StoreError::Unavailable(format!(
                "Redis {} at {} is too old: muster needs Redis {}.{} or newer",
                info.version,
                self.address(),
                MIN_VERSION.0,
                MIN_VERSION.1
            )));
        }
        *self.inner.info.write().unwrap_or_else(|p| p.into_inner()) = info.clone();
        Ok(info)
    }

    pub fn keys(&self) -> &Keys {
        &self.inner.keys
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

    fn link(&self) -> Link {
        self.inner.link.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The link to send a call on. While a cut connection is being reopened
    /// the call waits for the new one (up to the call timeout) instead of
    /// failing at once: a cut is routine after one slow call, not an outage.
    async fn usable_link(&self) -> Link {
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        loop {
            let relinked = self.inner.relinked.notified();
            let link = self.link();
            if !matches!(link.conn, Conn::Reconnecting) {
                return link;
            }
            if tokio::time::timeout_at(deadline, relinked).await.is_err() {
                return link;
            }
        }
    }

    /// Installs a new shared connection (a switch, an invalidation or a
    /// reconnect) and cuts the old one: calls still waiting on it give up.
    fn replace_link(&self, conn: Conn) {
        let id = self.inner.links.fetch_add(1, Ordering::SeqCst) + 1;
        let old = std::mem::replace(
            &mut *self.inner.link.write().unwrap_or_else(|p| p.into_inner()),
            Link {
                conn,
                id,
                cut: CancellationToken::new(),
            },
        );
        old.cut.cancel();
        self.inner.relinked.notify_waiters();
    }

    /// Cuts link `id` after one of its calls timed out (G12) and reopens a
    /// connection to the same server in the background. Does nothing when
    /// that link was already replaced (several calls time out together).
    fn cut(&self, id: u64, op: &'static str) {
        let reopen = {
            let mut link = self.inner.link.write().unwrap_or_else(|p| p.into_inner());
            if link.id != id || matches!(link.conn, Conn::Down | Conn::Reconnecting) {
                return;
            }
            let reopen = self.inner.links.fetch_add(1, Ordering::SeqCst) + 1;
            let old = std::mem::replace(
                &mut *link,
                Link {
                    conn: Conn::Reconnecting,
                    id: reopen,
                    cut: CancellationToken::new(),
                },
            );
            old.cut.cancel();
            reopen
        };
        metrics::counter!("muster_redis_reconnects_total").increment(1);
        tracing::warn!(op, "a Redis call timed out: its connection is cut and a new one opened");
        let store = self.clone();
        tokio::spawn(async move { store.reopen(reopen).await });
    }

    /// Opens a new shared connection to the server in use and installs it,
    /// unless link `id` (the placeholder) was replaced meanwhile by a switch
    /// or an invalidation. Retries with backoff until it succeeds.
    async fn reopen(&self, id: u64) {
        let mut attempt = 0;
        loop {
            if self.link().id != id {
                return;
            }
            let opened = if let Some(cc) = &self.inner.cluster_client {
                tokio::time::timeout(self.inner.timeout, cc.get_async_connection())
                    .await
                    .map_err(|_| StoreError::Unavailable("timed out".into()))
                    .and_then(|r| r.map_err(|e| classify(&e)))
                    .map(|c| Conn::Cluster(c, home_route(&self.inner.keys)))
            } else {
                let client = self.inner.client.read().unwrap_or_else(|p| p.into_inner()).clone();
                match client {
                    Some(client) => open_manager(client, self.inner.timeout).await.map(Conn::Single),
                    None => return,
                }
            };
            match opened {
                Ok(conn) => {
                    let mut link = self.inner.link.write().unwrap_or_else(|p| p.into_inner());
                    if link.id == id {
                        link.conn = conn;
                        tracing::info!("reconnected to Redis");
                    }
                    drop(link);
                    self.inner.relinked.notify_waiters();
                    return;
                }
                Err(e) => {
                    attempt += 1;
                    tracing::debug!(attempt, error = %e, "reconnecting to Redis");
                    tokio::time::sleep(backoff(attempt).min(Duration::from_secs(1))).await;
                }
            }
        }
    }

    /// The deadline for a script sent now, in Redis ms (G12): the node gives
    /// up on a call after `redis.timeout_ms`; the script must have run a
    /// quarter of that earlier, which leaves its reply time to arrive before
    /// the node stops waiting. Errs only before the first clock sample.
    fn deadline(&self) -> StoreResult<i64> {
        let now = self
            .inner
            .clock
            .now_ms()
            .ok_or_else(|| StoreError::Unavailable("Redis time is not known yet".into()))?;
        let t = self.inner.timeout.as_millis() as i64;
        Ok(now + t - t / 4)
    }

    /// The node's estimate of Redis time now (a lower bound, from recent
    /// samples): for choosing when to wake up, never for a lease or liveness
    /// decision (those are made in Redis, G11). None before the first sample.
    pub fn redis_now_estimate(&self) -> Option<i64> {
        self.inner.clock.now_ms()
    }

    /// Records a Redis time (ms) read by a call whose reply arrived at
    /// `received`, as a sample for script deadlines (G12).
    pub fn observe_clock(&self, redis_ms: i64, received: Instant) {
        self.inner.clock.observe(redis_ms, received);
    }

    /// Reads Redis `TIME` on `conn` and records it as a clock sample.
    async fn sync_clock_on(&self, conn: &mut Conn) -> StoreResult<i64> {
        let (s, us): (i64, i64) = self
            .timed_on(&Link::probe(conn.clone()), "time", redis::cmd("TIME").query_async(conn))
            .await
            .map_err(RetryableOr::into_error)?;
        let ms = s * 1000 + us / 1000;
        self.inner.clock.observe(ms, Instant::now());
        Ok(ms)
    }

    /// A connection of its own for blocking commands (`XREAD BLOCK`), which
    /// would stall every other caller on the shared multiplexed connection.
    /// It has no response timeout of its own (redis-rs defaults to 500 ms,
    /// shorter than a blocking read): the caller bounds every command.
    pub async fn dedicated(&self) -> StoreResult<Conn> {
        self.follow_master_file().await;
        if let Some(cc) = &self.inner.cluster_blocking {
            let c = tokio::time::timeout(self.inner.timeout, cc.get_async_connection())
                .await
                .map_err(|_| StoreError::Unavailable("timed out opening a cluster connection".into()))?
                .map_err(|e| classify(&e))?;
            return Ok(Conn::Cluster(c, home_route(&self.inner.keys)));
        }
        let client = self.inner.client.read().unwrap_or_else(|p| p.into_inner()).clone();
        match client {
            Some(client) => {
                let cfg = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.inner.timeout))
                    .set_response_timeout(None);
                let c = tokio::time::timeout(
                    self.inner.timeout,
                    client.get_multiplexed_async_connection_with_config(&cfg),
                )
                .await
                .map_err(|_| StoreError::Unavailable("timed out opening a connection".into()))?
                .map_err(|e| classify(&e))?;
                Ok(Conn::Multiplexed(c))
            }
            None => match self.link().conn {
                Conn::Down => Err(classify(&down_error())),
                Conn::Reconnecting => Err(classify(&reconnecting_error())),
                c => Ok(c),
            },
        }
    }

    /// PING with a measured round trip.
    pub async fn ping(&self) -> StoreResult<Duration> {
        let start = Instant::now();
        let _: String = self.call("ping", &redis::cmd("PING"), false).await?;
        let rtt = start.elapsed();
        self.inner.latency_us.store(rtt.as_micros() as u64, Ordering::Relaxed);
        Ok(rtt)
    }

    /// Redis server time in milliseconds since the epoch; also a sample for
    /// the node's estimate of Redis time (script deadlines, G12).
    pub async fn time_ms(&self) -> StoreResult<i64> {
        let (s, us): (i64, i64) = self.query("time", &redis::cmd("TIME")).await?;
        let ms = s * 1000 + us / 1000;
        self.inner.clock.observe(ms, Instant::now());
        Ok(ms)
    }

    /// A read: retried on connection errors with backoff.
    pub async fn query<T: FromRedisValue>(&self, op: &'static str, cmd: &Cmd) -> StoreResult<T> {
        self.call(op, cmd, true).await
    }

    /// A write command: not retried unless nothing was sent.
    pub async fn exec<T: FromRedisValue>(&self, op: &'static str, cmd: &Cmd) -> StoreResult<T> {
        self.call(op, cmd, false).await
    }

    /// A pipeline of reads, in one round trip.
    pub async fn pipe<T: FromRedisValue>(&self, op: &'static str, pipe: &Pipeline) -> StoreResult<T> {
        self.follow_master_file().await;
        let mut attempt = 0;
        loop {
            let link = self.usable_link().await;
            let mut conn = link.conn.clone();
            let res = self.timed_on(&link, op, pipe.query_async::<T>(&mut conn)).await;
            match res {
                Err(RetryableOr::Retry(e)) if attempt < self.inner.read_retries => {
                    attempt += 1;
                    tracing::debug!(op, attempt, error = %e, "retrying read");
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(RetryableOr::Retry(e)) | Err(RetryableOr::Fail(e)) => return Err(e),
                Ok(v) => return Ok(v),
            }
        }
    }

    /// Runs a script. Retried only when the connection was refused (nothing
    /// was sent), because a script's effects must not be applied twice.
    /// Every call carries its deadline (G12, see the prelude).
    pub async fn eval<T: FromRedisValue>(&self, lua: &Lua, keys: &[String], args: &[String]) -> StoreResult<T> {
        self.follow_master_file().await;
        if self.inner.clock.now_ms().is_none() {
            self.time_ms().await?;
        }
        let mut attempt = 0;
        loop {
            let mut inv = lua.script().prepare_invoke();
            for k in keys {
                inv.key(k);
            }
            for a in args {
                inv.arg(a);
            }
            inv.arg(self.deadline()?);
            let link = self.usable_link().await;
            let mut conn = link.conn.clone();
            let res = self.timed_on(&link, lua.name(), inv.invoke_async::<T>(&mut conn)).await;
            match res {
                Ok(v) => return Ok(v),
                Err(RetryableOr::Retry(e)) if attempt < 2 && was_refused(&e) => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(RetryableOr::Retry(e)) | Err(RetryableOr::Fail(e)) => return Err(e),
            }
        }
    }

    /// Runs one typed script call (see [`ScriptCall`]).
    pub async fn run<C: ScriptCall>(&self, lua: &Lua, call: &C) -> StoreResult<C::Reply> {
        self.eval(lua, &call.keys(&self.inner.keys), &call.args()).await
    }

    async fn call<T: FromRedisValue>(&self, op: &'static str, cmd: &Cmd, read: bool) -> StoreResult<T> {
        self.follow_master_file().await;
        self.call_here(op, cmd, read).await
    }

    /// [`Store::call`] on the master in use, without following the master
    /// file (used while switching).
    async fn call_here<T: FromRedisValue>(&self, op: &'static str, cmd: &Cmd, read: bool) -> StoreResult<T> {
        let mut attempt = 0;
        loop {
            let link = self.usable_link().await;
            let mut conn = link.conn.clone();
            let res = self.timed_on(&link, op, cmd.query_async::<T>(&mut conn)).await;
            match res {
                Ok(v) => return Ok(v),
                Err(RetryableOr::Retry(e)) if attempt < self.inner.read_retries && (read || was_refused(&e)) => {
                    attempt += 1;
                    tracing::debug!(op, attempt, error = %e, "retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(RetryableOr::Retry(e)) | Err(RetryableOr::Fail(e)) => return Err(e),
            }
        }
    }

    /// Applies the timeout, records metrics and health, and classifies
    /// errors. The call gives up at once when its link is cut (a master
    /// switch, or another call on the same connection timed out): a read is
    /// then retried on the new connection, a write fails (503), since whether
    /// Redis applied it is unknown. A timeout cuts the link (G12).
    async fn timed_on<T>(
        &self,
        link: &Link,
        op: &'static str,
        fut: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, RetryableOr> {
        let start = Instant::now();
        let res = tokio::select! {
            r = tokio::time::timeout(self.inner.timeout, fut) => r,
            _ = link.cut.cancelled() => {
                metrics::counter!("muster_redis_errors_total", "op" => op, "kind" => "cut").increment(1);
                return Err(RetryableOr::Retry(StoreError::Unavailable(format!(
                    "the connection to Redis was replaced (a master switch, or a timed-out call) \
                     while waiting for an answer ({op}); retry"
                ))));
            }
        };
        metrics::histogram!("muster_redis_call_duration_seconds", "op" => op).record(start.elapsed().as_secs_f64());
        let timed_out = |store: &Store| {
            metrics::counter!("muster_redis_errors_total", "op" => op, "kind" => "timeout").increment(1);
            store.inner.healthy.store(false, Ordering::Relaxed);
            store.inner.trouble.notify_one();
            if link.id != 0 {
                store.cut(link.id, op);
            }
            Err(RetryableOr::Retry(StoreError::Unavailable(format!(
                "no answer within {} ms ({op})",
                store.inner.timeout.as_millis()
            ))))
        };
        match res {
            Ok(Ok(v)) => {
                self.inner.healthy.store(true, Ordering::Relaxed);
                Ok(v)
            }
            Ok(Err(e)) if e.is_timeout() => timed_out(self),
            Ok(Err(e)) => {
                let err = classify(&e);
                let kind = match &err {
                    StoreError::Unavailable(_) => "unavailable",
                    StoreError::Server(_) => "server",
                    StoreError::Decode(_) => "decode",
                };
                metrics::counter!("muster_redis_errors_total", "op" => op, "kind" => kind).increment(1);
                if matches!(err, StoreError::Unavailable(_)) {
                    self.inner.healthy.store(false, Ordering::Relaxed);
                    self.inner.trouble.notify_one();
                    Err(RetryableOr::Retry(err))
                } else {
                    self.inner.healthy.store(true, Ordering::Relaxed);
                    Err(RetryableOr::Fail(err))
                }
            }
            Err(_) => timed_out(self),
        }
    }
}

/// Cluster mode: the route to the master owning the hash slot of
/// `{prefix}`, which holds every muster key (see [`Keys`]).
fn home_route(keys: &Keys) -> Route {
    Route::with_key(keys.prefix(), SlotAddr::Master)
}

/// The node's clock in ms since the epoch: for display and local throttling
/// only, never for a lease or liveness decision (those use Redis time).
pub fn node_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Opens a client and a reconnecting connection to one server.
async fn open_single(url: &str, timeout: Duration) -> StoreResult<(redis::Client, ConnectionManager)> {
    use redis::IntoConnectionInfo;
    let info = url
        .into_connection_info()
        .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL {}: {e}", redact(url))))?
        .set_tcp_settings(tcp_settings());
    let client = redis::Client::open(info)
        .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL {}: {e}", redact(url))))?;
    let mgr = open_manager(client.clone(), timeout)
        .await
        .map_err(|e| StoreError::Unavailable(format!("cannot connect to {}: {e}", redact(url))))?;
    Ok((client, mgr))
}

/// A reconnecting connection through `client`, with the store's timeouts.
async fn open_manager(client: redis::Client, timeout: Duration) -> StoreResult<ConnectionManager> {
    let mgr_cfg = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(1));
    tokio::time::timeout(timeout * 2, ConnectionManager::new_with_config(client, mgr_cfg))
        .await
        .map_err(|_| StoreError::Unavailable(format!("timed out after {} ms", (timeout * 2).as_millis())))?
        .map_err(|e| classify(&e))
}

/// The role name in a `ROLE` reply.
pub fn role_of(v: &Value) -> String {
    match v {
        Value::Array(items) => match items.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => String::new(),
        },
        _ => String::new(),
    }
}

/// Whether a `redis_version` is at least [`MIN_VERSION`].
fn version_supported(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= MIN_VERSION
}

enum RetryableOr {
    Retry(StoreError),
    Fail(StoreError),
}

impl RetryableOr {
    fn into_error(self) -> StoreError {
        match self {
            RetryableOr::Retry(e) | RetryableOr::Fail(e) => e,
        }
    }
}

impl Link {
    /// A connection used outside the shared link (a server being probed
    /// before a switch): nothing cuts it, and a timeout cuts nothing.
    fn probe(conn: Conn) -> Link {
        Link {
            conn,
            id: 0,
            cut: CancellationToken::new(),
        }
    }
}

/// Socket options of every connection: no Nagle delay (muster's calls are
/// small and latency-bound), and linger 0, so a connection cut after a
/// timeout is reset and what it still had to send is discarded (G12).
fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default()
        .set_nodelay(true)
        .set_linger_time(Duration::ZERO)
}

fn was_refused(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(m) if m.starts_with("connection refused"))
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(25u64 << attempt.min(5))
}

/// Maps a redis-rs error onto the store's three kinds.
pub fn classify(e: &RedisError) -> StoreError {
    if e.code() == Some("LATE") {
        // The prelude refused a script that arrived after its deadline (G12):
        // nothing was applied, like a timeout the client may retry.
        return StoreError::Unavailable(format!(
            "Redis received the call after its deadline and did not apply it: {}",
            e.detail().unwrap_or("")
        ));
    }
    if e.is_connection_refusal() {
        return StoreError::Unavailable(format!("connection refused: {e}"));
    }
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        return StoreError::Unavailable(e.to_string());
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::TryAgain,
        )
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::MasterNameNotFoundBySentinel => StoreError::Unavailable(e.to_string()),
        ErrorKind::UnexpectedReturnType | ErrorKind::Parse => StoreError::Decode(e.to_string()),
        _ => StoreError::Server(e.to_string()),
    }
}

/// Hides a password in a URL before it is logged or shown.
pub fn redact(url: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        if let Some(at) = rest.find('@') {
            let host_start = scheme_end + 3 + at;
            return format!("{}://***{}", &url[..scheme_end], &url[host_start..]);
        }
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn refuses_redis_older_than_7() {
        assert!(super::version_supported("7.0.15"));
        assert!(super::version_supported("7.2.4"));
        assert!(super::version_supported("8.0.0"));
        assert!(!super::version_supported("6.2.14"));
        assert!(!super::version_supported(""));
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://:secret@host:1/0"), "redis://***@host:1/0");
        assert_eq!(redact("redis://host:1"), "redis://host:1");
        assert_eq!(redact("unix:///tmp/r.sock"), "unix:///tmp/r.sock");
    }
}
