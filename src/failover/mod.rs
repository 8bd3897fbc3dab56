//! Redis high availability: following the master under Sentinel, and the
//! coordinated failover (the Beetle model) in which every node must confirm.
//!
//! Invariants:
//! - G10: a node uses one master at a time, and in coordinated mode only the
//!   master named by the coordinator's last completed round. A client that
//!   was told to `invalidate` makes no Redis call until it is `reconfigure`d;
//!   a round that any client fails to answer in time is cancelled before
//!   anything is promoted, so no two nodes ever use different masters.
//! - G1 across failovers: before a node sends anything to a new master it
//!   runs `epoch.lua` there, which raises the fencing epoch once per master
//!   (by run_id) above every epoch seen before, so tokens issued after a
//!   switch are greater than every token issued before it even when the
//!   asynchronous replica lost the last counter increments.
//! - Rounds are numbered by `max(last + 1, now_ms)`: increasing across
//!   coordinator restarts. A client refuses a message whose round is older
//!   than the newest it has seen (409), so a late message of an old round
//!   cannot undo a newer one. The newest round is kept in
//!   `<data_dir>/failover-round` so a restarted client refuses them too.
//! - The master file `<data_dir>/redis-master` is written by atomic rename;
//!   the store re-reads it (by mtime) before Redis operations.
//! - Sentinel mode: the sentinels are asked on every reconnect, error and
//!   `+switch-master` message, and every `redis.sentinel_poll_ms`; the answer
//!   is confirmed with `ROLE` before it is used.

pub(crate) mod coordinator;
pub(crate) mod routes;
pub(crate) mod scripts;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use crate::config::{FailoverConfig, FailoverRole, RedisConfig};
use crate::store::{Lua, Mode, ScriptCtx, ServerAuth, Store, StoreError, StoreResult, role_of};

mod probe;
pub(crate) use probe::*;

/// The master file's name under `data_dir`.
pub(crate) const MASTER_FILE: &str = "redis-master";
/// The newest round a client has seen, under `data_dir`.
pub(crate) const ROUND_FILE: &str = "failover-round";

/// Header carrying the shared secret on the internal endpoints.
pub(crate) const SECRET_HEADER: &str = "x-muster-failover-secret";

/// The epoch script, for [`Store::set_epoch_script`].
pub(crate) fn epoch_script(ctx: &ScriptCtx) -> Lua {
    Lua::load("epoch", include_str!("lua/epoch.lua"), ctx)
}

/// A message of a coordinated round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Ping,
    Invalidate,
    Reconfigure,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Ping => "ping",
            Kind::Invalidate => "invalidate",
            Kind::Reconfigure => "reconfigure",
        }
    }
}

/// Body of an internal failover message.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Message {
    pub round: u64,
    /// `reconfigure`: the new master, `host:port`.
    #[serde(default)]
    pub master: Option<String>,
}

/// A client's answer (a wire type: muster-api).
pub(crate) use muster_api::system::FailoverAnswer as Answer;

/// Why a client refused a message.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("round {round} is older than round {newest}, the newest this node has seen")]
    Stale { round: u64, newest: u64 },
    #[error("{0}")]
    Bad(String),
    #[error("cannot use {master} as the master: {error}")]
    Unusable { master: String, error: String },
}

// The answers of `GET /api/v1/failover` are wire types (muster-api).
pub(crate) use muster_api::system::{FailoverStatus as Status, LastMessage, Replica};

struct Inner {
    store: Store,
    node_id: String,
    redis_cfg: RedisConfig,
    cfg: FailoverConfig,
    data_dir: PathBuf,
    newest_round: AtomicU64,
    switches_seen: AtomicU64,
    last_message: Mutex<Option<LastMessage>>,
    /// Serializes the handling of messages (one at a time per node).
    handling: tokio::sync::Mutex<()>,
    coordinator: Option<coordinator::Coordinator>,
}

/// Cheap to clone.
#[derive(Clone)]
pub struct Failover {
    inner: Arc<Inner>,
}

impl Failover {
    pub fn new(
        store: Store,
        node_id: &str,
        redis_cfg: &RedisConfig,
        cfg: &FailoverConfig,
        data_dir: &Path,
        nodes: Arc<crate::nodes::Nodes>,
    ) -> Failover {
        let newest = std::fs::read_to_string(data_dir.join(ROUND_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let coordinator = (cfg.role == FailoverRole::Coordinator)
            .then(|| coordinator::Coordinator::new(node_id, cfg, redis_cfg, data_dir, nodes));
        Failover {
            inner: Arc::new(Inner {
                store,
                node_id: node_id.to_string(),
                redis_cfg: redis_cfg.clone(),
                cfg: cfg.clone(),
                data_dir: data_dir.to_path_buf(),
                newest_round: AtomicU64::new(newest),
                switches_seen: AtomicU64::new(0),
                last_message: Mutex::new(None),
                handling: tokio::sync::Mutex::new(()),
                coordinator,
            }),
        }
    }

    pub fn coordinated(&self) -> bool {
        self.inner.cfg.role != FailoverRole::Off
    }

    pub fn secret(&self) -> &str {
        &self.inner.cfg.secret
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Handles one message of a round (this node as a client).
    pub async fn handle(&self, kind: Kind, msg: &Message) -> Result<Answer, ClientError> {
        if !self.coordinated() {
            return Err(ClientError::Bad(
                "this node is not part of a coordinated failover ([failover] role is off)".into(),
            ));
        }
        // Only a server this node was configured with, checked before the
        // round is recorded: whoever holds the secret still cannot point the
        // node at another Redis (issue 36, N1).
        if kind == Kind::Reconfigure
            && let Some(master) = msg.master.as_deref()
            && !self
                .inner
                .cfg
                .redis_servers
                .iter()
                .any(|s| s.eq_ignore_ascii_case(master))
        {
            return Err(ClientError::Bad(format!(
                "`{master}` is not one of failover.redis_servers ({}); this node uses no other master",
                self.inner.cfg.redis_servers.join(", ")
            )));
        }
        let _one = self.inner.handling.lock().await;
        let newest = self.inner.newest_round.load(Ordering::SeqCst);
        // The same round may send several messages (ping, invalidate,
        // reconfigure); an older round may not.
        if msg.round < newest {
            return Err(ClientError::Stale {
                round: msg.round,
                newest,
            });
        }
        if msg.round > newest {
            self.inner.newest_round.store(msg.round, Ordering::SeqCst);
            let _ = write_atomic(&self.inner.data_dir.join(ROUND_FILE), &msg.round.to_string());
        }
        let store = &self.inner.store;
        let answer = match kind {
            Kind::Ping => {
                let master = store.address();
                let reachable = !master.is_empty()
                    && probe_master(
                        store.server_auth(),
                        &master,
                        Duration::from_millis(self.inner.cfg.answer_timeout_ms / 2),
                    )
                    .await
                    .is_ok();
                if reachable { "reachable" } else { "pong" }
            }
            Kind::Invalidate => {
                write_atomic(&self.master_file(), "").map_err(|e| ClientError::Unusable {
                    master: String::new(),
                    error: format!("cannot write the master file: {e}"),
                })?;
                store.invalidate();
                store.master_file_touched();
                "invalidated"
            }
            Kind::Reconfigure => {
                let Some(master) = msg.master.as_deref().filter(|m| is_addr(m)) else {
                    return Err(ClientError::Bad("reconfigure needs `master` as host:port".into()));
                };
                if store.address() != master || !store.has_master() {
                    // Check before publishing it in the file: never write a
                    // master this node cannot use.
                    if let Err(e) = store.switch_master(master).await {
                        return Err(ClientError::Unusable {
                            master: master.into(),
                            error: e.to_string(),
                        });
                    }
                    self.inner.switches_seen.fetch_add(1, Ordering::Relaxed);
                }
                write_atomic(&self.master_file(), master).map_err(|e| ClientError::Unusable {
                    master: master.into(),
                    error: format!("cannot write the master file: {e}"),
                })?;
                store.master_file_touched();
                "reconfigured"
            }
        };
        *self.inner.last_message.lock().unwrap_or_else(|p| p.into_inner()) = Some(LastMessage {
            kind: kind.as_str().into(),
            round: msg.round,
            answer: answer.into(),
            at_ms: now_ms(),
        });
        Ok(Answer {
            node: self.inner.node_id.clone(),
            round: msg.round,
            answer: answer.into(),
        })
    }

    pub fn master_file(&self) -> PathBuf {
        self.inner.data_dir.join(MASTER_FILE)
    }

    /// What the Failover page and `GET /api/v1/failover` show.
    pub async fn status(&self) -> Status {
        let store = &self.inner.store;
        let mut st = Status {
            mode: store.mode().as_str().into(),
            node: self.inner.node_id.clone(),
            master: store.address(),
            master_reachable: false,
            master_offset: None,
            replicas: Vec::new(),
            epoch: None,
            switches: self.inner.switches_seen.load(Ordering::Relaxed),
            last_switch: store.last_switch(),
            sentinels: self.inner.redis_cfg.sentinels.clone(),
            sentinel_master: None,
            role: None,
            newest_round: None,
            last_message: None,
            coordinator: None,
        };
        // The page must answer during an outage too: at most 300 ms for Redis.
        let quick = Duration::from_millis(300);
        let epoch = tokio::time::timeout(
            quick,
            store.query::<Option<u64>>(
                "failover_epoch",
                redis::cmd("GET").arg(format!("{}:epoch", store.keys().prefix())),
            ),
        )
        .await;
        if let Ok(Ok(e)) = epoch {
            st.master_reachable = true;
            st.epoch = Some(e.unwrap_or(1));
        }
        if st.master_reachable {
            let info = tokio::time::timeout(
                quick,
                store.query::<String>("failover_info", redis::cmd("INFO").arg("replication")),
            )
            .await;
            if let Ok(Ok(text)) = info {
                let (offset, replicas) = parse_replication(&text);
                st.master_offset = offset;
                st.replicas = replicas;
            }
        }
        if store.mode() == Mode::Sentinel {
            st.sentinel_master = ask_sentinels(&self.inner.redis_cfg).await.ok();
        }
        if self.coordinated() {
            st.role = Some(
                match self.inner.cfg.role {
                    FailoverRole::Coordinator => "coordinator",
                    _ => "client",
                }
                .into(),
            );
            st.newest_round = Some(self.inner.newest_round.load(Ordering::SeqCst));
            st.last_message = self
                .inner
                .last_message
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(c) = &self.inner.coordinator {
                st.coordinator = Some(c.status());
            }
        }
        st
    }

    /// Starts the background loops this mode needs: the sentinel follower,
    /// the coordinator, and the epoch watcher.
    pub fn spawn(&self, cancel: CancellationToken) -> Vec<JoinHandle<()>> {
        let mut v = Vec::new();
        let store = self.inner.store.clone();
        match store.mode() {
            Mode::Sentinel => {
                let kick = Arc::new(tokio::sync::Notify::new());
                for addr in &self.inner.redis_cfg.sentinels {
                    v.push(spawn_switch_listener(
                        self.inner.redis_cfg.clone(),
                        addr.clone(),
                        kick.clone(),
                        cancel.clone(),
                    ));
                }
                v.push(spawn_sentinel_follower(self.clone(), kick, cancel.clone()));
            }
            Mode::Coordinated => {
                if let Some(c) = &self.inner.coordinator {
                    v.push(c.spawn(self.clone(), cancel.clone()));
                }
            }
            _ => {}
        }
        if matches!(store.mode(), Mode::Sentinel | Mode::Coordinated) {
            v.push(spawn_epoch_watcher(store, cancel));
        }
        v
    }
}

/// Keeps the node's known epoch current, so a bump after a lossy failover
/// starts above what this node saw.
fn spawn_epoch_watcher(store: Store, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = cancel.cancelled() => return,
            }
            let key = format!("{}:epoch", store.keys().prefix());
            if let Ok(Some(e)) = store
                .query::<Option<u64>>("failover_epoch", redis::cmd("GET").arg(key))
                .await
            {
                store.saw_epoch(e);
            }
        }
    })
}

/// Sentinel mode: re-asks the sentinels on a tick, on trouble, and on
/// `+switch-master`, and switches when they name another master.
fn spawn_sentinel_follower(f: Failover, kick: Arc<tokio::sync::Notify>, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let store = f.inner.store.clone();
        let poll = Duration::from_millis(f.inner.redis_cfg.sentinel_poll_ms);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(poll) => {}
                _ = store.trouble().notified() => {}
                _ = kick.notified() => {}
                _ = cancel.cancelled() => return,
            }
            match ask_sentinels(&f.inner.redis_cfg).await {
                Ok(addr) if addr != store.address() || !store.healthy() => match store.switch_master(&addr).await {
                    Ok(true) => {
                        f.inner.switches_seen.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::debug!(master = %addr, error = %e, "sentinels name a master that is not usable yet")
                    }
                },
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "no sentinel answered"),
            }
            // Not more often than every 100 ms, however many errors arrive.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = cancel.cancelled() => return,
            }
        }
    })
}

/// Listens for `+switch-master` on one sentinel and kicks the follower.
fn spawn_switch_listener(
    cfg: RedisConfig,
    addr: String,
    kick: Arc<tokio::sync::Notify>,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    use futures_util::StreamExt;
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(200);
        loop {
            let run = async {
                let client = redis::Client::open(sentinel_url(&cfg, &addr)).map_err(|e| e.to_string())?;
                let mut ps = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
                ps.subscribe("+switch-master").await.map_err(|e| e.to_string())?;
                // Subscribed: a later loss starts the backoff from the bottom.
                backoff = Duration::from_millis(200);
                let mut msgs = ps.on_message();
                while let Some(m) = msgs.next().await {
                    let payload: String = m.get_payload().unwrap_or_default();
                    tracing::info!(sentinel = %addr, %payload, "+switch-master");
                    kick.notify_one();
                }
                Ok::<(), String>(())
            };
            tokio::select! {
                r = run => {
                    if let Err(e) = r {
                        tracing::debug!(sentinel = %addr, error = %e, "sentinel subscription lost");
                    }
                }
                _ = cancel.cancelled() => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = cancel.cancelled() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    })
}

pub(crate) use crate::store::node_clock_ms as now_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_info_replication() {
        let text = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n\
                    slave0:ip=127.0.0.1,port=7001,state=online,offset=90,lag=1\r\n\
                    master_repl_offset:100\r\n";
        let (offset, replicas) = parse_replication(text);
        assert_eq!(offset, Some(100));
        assert_eq!(replicas.len(), 1);
        assert_eq!(replicas[0].addr, "127.0.0.1:7001");
        assert_eq!(replicas[0].lag_bytes, 10);
        assert_eq!(replicas[0].lag_s, 1);
    }

    #[test]
    fn addresses_are_checked() {
        assert!(is_addr("127.0.0.1:6380"));
        assert!(is_addr("redis-a:6379"));
        assert!(!is_addr("127.0.0.1"));
        assert!(!is_addr(":6379"));
        assert!(!is_addr("h:0"));
        assert!(!is_addr("h:99999"));
    }
}
