//! Connections: the [`Conn`] of each topology, how data servers are
//! reached ([`ServerAuth`]), and opening the store in each mode.

use super::{
    Cmd, ConnectionLike, ConnectionManager, ConnectionManagerConfig, Duration, Keys, Mode, MultiplexedConnection, Path,
    Pipeline, RedisConfig, RedisError, RedisFuture, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr, Store,
    StoreError, StoreResult, Value, classify,
};

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

pub(super) fn down_error() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "no Redis master: invalidated by a failover round, waiting for the new master",
    ))
}

pub(super) fn reconnecting_error() -> RedisError {
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
        let store = Store::build(
            cfg,
            mode,
            redact(&url),
            Some(client),
            vec![Conn::Single(mgr)],
            None,
            None,
            cfg.shards,
        );
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
            vec![Conn::Single(mgr)],
            None,
            master_file.map(|p| p.to_path_buf()),
            cfg.shards,
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
        Self::connect_cluster_sharded(cfg, cfg.shards).await
    }

    /// [`Store::connect_cluster`] for a namespace split into `shards`, each
    /// reached through [`Store::shard`] (the node runs one shard in this
    /// version; see `docs/sharding.md`).
    pub async fn connect_cluster_sharded(cfg: &RedisConfig, shards: u32) -> StoreResult<Store> {
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
        // One connection per lane (each shard's route, then the root's): a
        // timeout cuts one lane's connection, never the others' (see `Lane`).
        let lanes = if shards > 1 { shards as usize + 1 } else { 1 };
        let conns = futures_util::future::try_join_all((0..lanes).map(|_| async {
            tokio::time::timeout(timeout * 2, client.get_async_connection())
                .await
                .map_err(|_| StoreError::Unavailable("timed out connecting to the Redis Cluster".into()))?
                .map_err(|e| StoreError::Unavailable(format!("cannot connect to the Redis Cluster: {e}")))
        }))
        .await?;
        let map = super::shards::ShardMap::new(&cfg.key_prefix, shards);
        let mut routes: Vec<Route> = (0..map.len()).map(|i| home_route(&Keys::tagged(map.tag(i)))).collect();
        if map.len() > 1 {
            routes.push(home_route(&Keys::tagged(&format!("{{{}}}", cfg.key_prefix))));
        }
        let conns = conns
            .into_iter()
            .zip(routes)
            .map(|(c, route)| Conn::Cluster(c, route))
            .collect();
        let store = Store::build(
            cfg,
            Mode::Cluster,
            cfg.cluster.join(","),
            None,
            conns,
            Some((client, blocking)),
            None,
            shards,
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
            vec![Conn::Down],
            None,
            Some(master_file.to_path_buf()),
            cfg.shards,
        )
    }
}

/// Cluster mode: the route to the master owning the hash slot of
/// `{prefix}`, which holds every muster key (see [`Keys`]).
pub(super) fn home_route(keys: &Keys) -> Route {
    Route::with_key(keys.prefix(), SlotAddr::Master)
}

/// Opens a client and a reconnecting connection to one server.
pub(super) async fn open_single(url: &str, timeout: Duration) -> StoreResult<(redis::Client, ConnectionManager)> {
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
pub(super) async fn open_manager(client: redis::Client, timeout: Duration) -> StoreResult<ConnectionManager> {
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

/// Socket options of every connection: no Nagle delay (muster's calls are
/// small and latency-bound), and linger 0, so a connection cut after a
/// timeout is reset and what it still had to send is discarded (G12).
pub(super) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default()
        .set_nodelay(true)
        .set_linger_time(Duration::ZERO)
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
    fn redacts_passwords() {
        assert_eq!(redact("redis://:secret@host:1/0"), "redis://***@host:1/0");
        assert_eq!(redact("redis://host:1"), "redis://host:1");
        assert_eq!(redact("unix:///tmp/r.sock"), "unix:///tmp/r.sock");
    }
}
