//! The store: the one Redis client every subsystem shares.
//!
//! Invariants:
//! - Every call has a deadline (`redis.timeout_ms`); a call that misses it is
//!   an `Unavailable` error, never a hang.
//! - Reads are retried a bounded number of times with backoff; writes and
//!   scripts are not retried when their outcome is unknown (a timeout after
//!   sending), because replaying a claim could hand a task out twice. They are
//!   retried only when the connection was refused, i.e. nothing was sent.
//! - Every key is built by [`Keys`]; every script goes through [`Lua`].
//! - `healthy()` reflects the last call's outcome, so readiness and the claim
//!   path learn about an outage from real traffic, not only from a probe.

pub mod embedded;
pub mod keys;
pub mod reply;
pub mod script;

use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};

pub use keys::Keys;
pub use script::{Lua, ScriptCtx};

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
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Embedded => "embedded",
            Mode::Standalone => "standalone",
            Mode::Sentinel => "sentinel",
            Mode::Cluster => "cluster",
        }
    }
}

/// A connection of either topology, usable wherever redis-rs wants a
/// `ConnectionLike` (commands, pipelines, scripts).
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Multiplexed(MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Multiplexed(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
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
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Multiplexed(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// What `INFO server` told us at connect time.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ServerInfo {
    pub version: String,
    pub mode: String,
}

struct Inner {
    mode: Mode,
    address: String,
    client: Option<redis::Client>,
    conn: RwLock<Conn>,
    keys: Keys,
    timeout: Duration,
    read_retries: u32,
    healthy: AtomicBool,
    /// Last measured round trip, microseconds (for the dashboard).
    latency_us: AtomicU64,
    info: RwLock<ServerInfo>,
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
        let client = redis::Client::open(url.as_str())
            .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL {}: {e}", redact(&url))))?;
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let mgr_cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1));
        let mgr = tokio::time::timeout(timeout * 2, ConnectionManager::new_with_config(client.clone(), mgr_cfg))
            .await
            .map_err(|_| StoreError::Unavailable(format!("timed out connecting to {}", redact(&url))))?
            .map_err(|e| StoreError::Unavailable(format!("cannot connect to {}: {e}", redact(&url))))?;
        let store = Store {
            inner: Arc::new(Inner {
                mode,
                address: redact(&url),
                client: Some(client),
                conn: RwLock::new(Conn::Single(mgr)),
                keys: Keys::new(&cfg.key_prefix),
                timeout,
                read_retries: cfg.read_retries,
                healthy: AtomicBool::new(true),
                latency_us: AtomicU64::new(0),
                info: RwLock::new(ServerInfo::default()),
            }),
        };
        store.check_server().await?;
        Ok(store)
    }

    /// PING, then `INFO server`: records the version and refuses old servers.
    pub async fn check_server(&self) -> StoreResult<ServerInfo> {
        self.ping().await?;
        let text: String = self.query("info", &redis::cmd("INFO").arg("server").to_owned()).await?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        let info = ServerInfo {
            version: field("redis_version"),
            mode: field("redis_mode"),
        };
        if !version_supported(&info.version) {
            return Err(StoreError::Unavailable(format!(
                "Redis {} at {} is too old: muster needs Redis {}.{} or newer",
                info.version, self.inner.address, MIN_VERSION.0, MIN_VERSION.1
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
    pub fn address(&self) -> &str {
        &self.inner.address
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

    fn conn(&self) -> Conn {
        self.inner.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A connection of its own for blocking commands (`XREAD BLOCK`), which
    /// would stall every other caller on the shared multiplexed connection.
    /// It has no response timeout of its own (redis-rs defaults to 500 ms,
    /// shorter than a blocking read): the caller bounds every command.
    pub async fn dedicated(&self) -> StoreResult<Conn> {
        match &self.inner.client {
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
            None => Ok(self.conn()),
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

    /// Redis server time in milliseconds since the epoch.
    pub async fn time_ms(&self) -> StoreResult<i64> {
        let (s, us): (i64, i64) = self.query("time", &redis::cmd("TIME")).await?;
        Ok(s * 1000 + us / 1000)
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
        let mut attempt = 0;
        loop {
            let mut conn = self.conn();
            let res = self.timed(op, pipe.query_async::<T>(&mut conn)).await;
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
    pub async fn eval<T: FromRedisValue>(&self, lua: &Lua, keys: &[String], args: &[String]) -> StoreResult<T> {
        let mut attempt = 0;
        loop {
            let mut inv = lua.script().prepare_invoke();
            for k in keys {
                inv.key(k);
            }
            for a in args {
                inv.arg(a);
            }
            let mut conn = self.conn();
            let res = self.timed(lua.name(), inv.invoke_async::<T>(&mut conn)).await;
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

    async fn call<T: FromRedisValue>(&self, op: &'static str, cmd: &Cmd, read: bool) -> StoreResult<T> {
        let mut attempt = 0;
        loop {
            let mut conn = self.conn();
            let res = self.timed(op, cmd.query_async::<T>(&mut conn)).await;
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

    /// Applies the deadline, records metrics and health, and classifies errors.
    async fn timed<T>(
        &self,
        op: &'static str,
        fut: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, RetryableOr> {
        let start = Instant::now();
        let res = tokio::time::timeout(self.inner.timeout, fut).await;
        metrics::histogram!("muster_redis_call_duration_seconds", "op" => op).record(start.elapsed().as_secs_f64());
        match res {
            Ok(Ok(v)) => {
                self.inner.healthy.store(true, Ordering::Relaxed);
                Ok(v)
            }
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
                    Err(RetryableOr::Retry(err))
                } else {
                    self.inner.healthy.store(true, Ordering::Relaxed);
                    Err(RetryableOr::Fail(err))
                }
            }
            Err(_) => {
                metrics::counter!("muster_redis_errors_total", "op" => op, "kind" => "timeout").increment(1);
                self.inner.healthy.store(false, Ordering::Relaxed);
                Err(RetryableOr::Retry(StoreError::Unavailable(format!(
                    "no answer within {} ms ({op})",
                    self.inner.timeout.as_millis()
                ))))
            }
        }
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

fn was_refused(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(m) if m.starts_with("connection refused"))
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(25u64 << attempt.min(5))
}

/// Maps a redis-rs error onto the store's three kinds.
pub fn classify(e: &RedisError) -> StoreError {
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
