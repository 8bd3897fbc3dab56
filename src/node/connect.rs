//! Connecting a node to its Redis: the embedded child, a configured
//! deployment, or the master the coordinated failover names.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::StartError;
use crate::config::{self, Config};
use crate::failover;
use crate::store::embedded::EmbeddedRedis;
use crate::store::{self, Mode, Store};

/// The embedded Redis child's supervisor, if the node started one.
pub(super) struct RedisChild {
    cancel: CancellationToken,
    supervisor: Option<JoinHandle<()>>,
}

impl RedisChild {
    /// Stops the embedded Redis (if any) and waits for its supervisor.
    pub(super) async fn stop(self) {
        self.cancel.cancel();
        if let Some(s) = self.supervisor {
            let _ = s.await;
        }
    }
}

/// Connects to Redis; on failure, stops an embedded child that was started.
pub(super) async fn connect(cfg: &Config) -> Result<(RedisChild, Option<Arc<EmbeddedRedis>>, Store), StartError> {
    let mut redis = RedisChild {
        cancel: CancellationToken::new(),
        supervisor: None,
    };
    let (embedded, store) = match connect_redis(cfg, &redis.cancel, &mut redis.supervisor).await {
        Ok(v) => v,
        Err(e) => {
            redis.stop().await;
            return Err(e);
        }
    };
    let info = store.server_info();
    tracing::info!(mode = store.mode().as_str(), address = store.address(), version = %info.version, "connected to Redis");
    Ok((redis, embedded, store))
}

/// Connects the store in the configured topology: a Redis Cluster, the
/// master named by the sentinels, the master of the coordinated failover
/// (from `<data_dir>/redis-master`), a standalone URL, or an embedded child.
async fn connect_redis(
    cfg: &Config,
    redis_cancel: &CancellationToken,
    supervisor: &mut Option<tokio::task::JoinHandle<()>>,
) -> Result<(Option<Arc<EmbeddedRedis>>, Store), StartError> {
    if !cfg.redis.cluster.is_empty() {
        return Ok((None, Store::connect_cluster(&cfg.redis).await?));
    }
    if !cfg.redis.sentinels.is_empty() {
        let addr = failover::ask_sentinels(&cfg.redis).await?;
        return Ok((
            None,
            Store::connect_master(&cfg.redis, &addr, Mode::Sentinel, None).await?,
        ));
    }
    if cfg.failover.role != config::FailoverRole::Off {
        return Ok((None, connect_coordinated(cfg).await?));
    }
    if cfg.redis.url.is_empty() {
        let bin = std::env::var("MUSTER_REDIS_SERVER_BIN").unwrap_or_else(|_| cfg.redis.server_bin.clone());
        let (e, child) = EmbeddedRedis::start(&cfg.server.data_dir, &bin).await?;
        *supervisor = Some(e.supervise(child, redis_cancel.clone()));
        let url = e.url();
        return Ok((Some(e), Store::connect(&cfg.redis, &url, Mode::Embedded).await?));
    }
    Ok((
        None,
        Store::connect(&cfg.redis, &cfg.redis.url, Mode::Standalone).await?,
    ))
}

/// Coordinated mode: the master is the one in the master file when it really
/// is a master; with no file, the one server that says it is a master. In
/// every other case the node starts without a master (serving, not ready)
/// and waits for the coordinator to name one.
async fn connect_coordinated(cfg: &Config) -> Result<Store, StartError> {
    let path = cfg.server.data_dir.join(failover::MASTER_FILE);
    let auth = store::ServerAuth::from_config(&cfg.redis);
    let timeout = Duration::from_millis(cfg.redis.timeout_ms);
    let file = std::fs::read_to_string(&path).unwrap_or_default().trim().to_string();
    let candidate = if !file.is_empty() {
        Some(file)
    } else if !path.exists() {
        let mut masters = Vec::new();
        for s in &cfg.failover.redis_servers {
            if failover::probe_master(&auth, s, timeout).await.is_ok() {
                masters.push(s.clone());
            }
        }
        if masters.len() == 1 { masters.pop() } else { None }
    } else {
        None
    };
    if let Some(addr) = candidate {
        match Store::connect_master(&cfg.redis, &addr, Mode::Coordinated, Some(&path)).await {
            Ok(s) => {
                failover::write_atomic(&path, &addr)
                    .map_err(|e| StartError::Io(format!("cannot write {}: {e}", path.display())))?;
                return Ok(s);
            }
            Err(e) => tracing::warn!(master = %addr, error = %e, "the master file's server is not a usable master"),
        }
    }
    tracing::warn!("no Redis master known: waiting for the failover coordinator to name one");
    failover::write_atomic(&path, "").map_err(|e| StartError::Io(format!("cannot write {}: {e}", path.display())))?;
    Ok(Store::without_master(&cfg.redis, Mode::Coordinated, &path))
}
