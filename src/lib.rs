//! muster: a high-availability coordination server for worker clusters.
//!
//! Every node runs this same code; nodes share one Redis deployment and
//! coordinate only through it. Module map:
//!
//! - [`config`]: `config.toml`, environment and flags, validated at start.
//! - [`store`]: the one Redis client (embedded child, standalone, TLS, unix),
//!   key builders, the Lua script wrapper with its shared prelude.
//! - [`nodes`]: membership by heartbeat into a sorted set scored by Redis time.
//! - [`tasks`]: queues, atomic claim with fencing tokens, retries, dead
//! - [`telemetry`]: the catalogue of Prometheus metrics (help, type, zero series).
//!   letters, idempotency, concurrency groups, retention.
//! - [`orphans`]: the cleaner that recovers tasks of dead owners, and the
//!   timeout monitor.
//! - [`workflows`]: DAGs of tasks whose successors are dispatched exactly once.
//! - [`schedules`]: cron schedules, fired exactly once per occurrence across
//!   the cluster by every node's scheduler.
//! - [`events`]: the cluster event stream, tailed once per node and fanned
//!   out to local consumers (claim wake-ups, WebSockets).
//! - [`auth`], [`http`], [`error`]: tokens and roles, request ids, metrics,
//!   problem+json errors.
//! - [`system`]: probes, `/metrics`, the Redis summary, the OpenAPI document.
//! - [`barriers`]: barrier rounds decided once in Redis (G8), etcd-style
//!   Barrier and DoubleBarrier.
//! - [`locks`]: locks with fencing tokens and FIFO waiters, leader elections.
//! - [`longpoll`]: long polls woken by cluster events.
//! - [`web`]: the server-rendered dashboard.
//! - [`app`]: the shared state and the router.
//! - [`serve`]: the connection loop, with its read, idle and connection bounds.
//!
//! [`start`] takes an already-bound listener, so tests bind port 0, and
//! returns a [`Running`] node whose shutdown is explicit and ordered: stop
//! taking requests, stop the background loops, leave the cluster, then stop
//! the embedded Redis.

pub mod app;
pub mod auth;
pub mod bench;
pub mod config;
pub mod error;
pub mod events;
pub mod failover;
pub mod health;
pub mod http;
pub mod nodes;
pub mod orphans;
pub mod schedules;
pub mod serve;
pub mod store;
pub mod system;
pub mod tasks;
pub mod telemetry;
pub mod validate;
pub mod web;
pub mod workflows;

pub mod barriers;
pub mod locks;
pub mod longpoll;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::app::AppState;
use crate::auth::Auth;
use crate::config::Config;
use crate::health::Health;
use crate::nodes::Nodes;
use crate::store::embedded::EmbeddedRedis;
use crate::store::{Mode, ScriptCtx, Store};

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Embedded(#[from] store::embedded::EmbeddedError),
    #[error("{0}")]
    Redis(#[from] store::StoreError),
    #[error("{0}")]
    Io(String),
}

/// A started node. Dropping it does not stop it; call [`Running::shutdown`].
pub struct Running {
    pub addr: SocketAddr,
    pub node_id: String,
    pub state: AppState,
    cancel: CancellationToken,
    kill: CancellationToken,
    join: JoinHandle<()>,
}

impl Running {
    /// Stops the node gracefully and waits until it has left the cluster and
    /// stopped its embedded Redis.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.join.await;
    }

    /// A token that stops the node when cancelled.
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Waits until the node has stopped (after its token was cancelled).
    pub async fn wait(self) {
        let _ = self.join.await;
    }

    /// Stops the node *without* leaving the cluster: its server and loops
    /// stop at once, as if the process died (its embedded Redis, if any, is
    /// still stopped). For tests of failure handling.
    pub async fn kill(self) {
        self.kill.cancel();
        let _ = self.join.await;
    }
}

/// The process-wide Prometheus recorder (installed once; several in-process
/// nodes, as in tests, share it).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("_seconds".into()),
                    &[
                        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    ],
                )
                .expect("static bucket list is non-empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_ok() {
                telemetry::register();
            }
            handle
        })
        .clone()
}

/// `<hostname>-<ulid suffix>`, within the node id charset and length.
pub fn generated_node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_else(|_| "node".into());
    let host: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let host = if host.is_empty() { "node".to_string() } else { host };
    let ulid = ulid::Ulid::generate().to_string().to_lowercase();
    format!("{host}-{}", &ulid[ulid.len() - 8..])
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

/// Starts a node on `listener` and returns once it serves and has joined.
pub async fn start(cfg: Config, listener: TcpListener) -> Result<Running, StartError> {
    let addr = listener.local_addr().map_err(|e| StartError::Io(e.to_string()))?;
    if cfg.auth.tokens.is_empty() && !addr.ip().is_loopback() {
        return Err(StartError::Config(format!(
            "refusing to listen on {addr}: no [auth] tokens are configured, so anyone who can reach \
             this address could control the cluster. Configure [[auth.tokens]] or listen on 127.0.0.1"
        )));
    }
    if cfg.auth.tokens.is_empty() {
        tracing::warn!("no [auth] tokens configured: listening on loopback only, and every local caller is admin");
    }
    for w in cfg.warnings() {
        tracing::warn!("{w}");
    }
    let node_id = if cfg.server.node_id.is_empty() {
        generated_node_id()
    } else {
        cfg.server.node_id.clone()
    };
    std::fs::create_dir_all(&cfg.server.data_dir)
        .map_err(|e| StartError::Io(format!("cannot create data_dir {}: {e}", cfg.server.data_dir.display())))?;

    let redis_cancel = CancellationToken::new();
    let mut supervisor = None;
    let (embedded, store) = match connect_redis(&cfg, &redis_cancel, &mut supervisor).await {
        Ok(v) => v,
        Err(e) => {
            redis_cancel.cancel();
            if let Some(s) = supervisor {
                let _ = s.await;
            }
            return Err(e);
        }
    };
    let mode = store.mode();
    let info = store.server_info();
    tracing::info!(mode = mode.as_str(), address = store.address(), version = %info.version, "connected to Redis");

    let ctx = ScriptCtx {
        prefix: store.keys().prefix().to_string(),
        events_max_len: cfg.events.max_len,
    };
    if matches!(mode, Mode::Sentinel | Mode::Coordinated) {
        // Every master switch first raises the fencing epoch on the new master
        // (G1 across failovers); at start too, in case a switch happened while
        // no node was running.
        store.set_epoch_script(failover::epoch_script(&ctx), &node_id);
        if store.has_master() {
            store.ensure_epoch().await?;
        }
    }
    let nodes = Nodes::new(store.clone(), cfg.nodes.clone(), &ctx);
    let tasks = tasks::Tasks::new(store.clone(), cfg.tasks.clone(), &ctx);
    let orphans = orphans::Orphans::new(
        store.clone(),
        cfg.orphans.clone(),
        &cfg.nodes,
        cfg.tasks.clone(),
        node_id.clone(),
        tasks.labels.clone(),
        &ctx,
    );
    let workflows = workflows::Workflows::new(store.clone(), cfg.tasks.clone(), &ctx);
    let schedules = schedules::Schedules::new(
        store.clone(),
        cfg.schedules.clone(),
        cfg.tasks.clone(),
        node_id.clone(),
        &ctx,
    );
    let barriers = barriers::Barriers::new(
        store.clone(),
        cfg.barriers.clone(),
        cfg.nodes.ttl_ms,
        node_id.clone(),
        &ctx,
    );
    let locks = locks::Locks::new(
        store.clone(),
        cfg.locks.clone(),
        cfg.nodes.ttl_ms,
        node_id.clone(),
        &ctx,
    );
    // The bus keeps client_buffer events: how far any subscriber may fall behind.
    let bus = events::Bus::new(cfg.events.client_buffer as usize);
    let waiters = Arc::new(longpoll::Waiters::default());
    // Without a master yet (coordinated mode, waiting for the coordinator)
    // the tailer finds its starting point once it connects.
    let tail_from = if store.has_master() {
        Some(events::tailer::last_id(&store).await?)
    } else {
        None
    };
    let failover = failover::Failover::new(
        store.clone(),
        &node_id,
        &cfg.redis,
        &cfg.failover,
        &cfg.server.data_dir,
        nodes.clone(),
    );
    let health = Arc::new(Health::new(Duration::from_millis(cfg.nodes.ttl_ms)));
    let advertise = cfg.advertise_url(addr);
    let cfg = Arc::new(cfg);
    let state = AppState {
        cfg: cfg.clone(),
        node_id: node_id.clone().into(),
        advertise: advertise.clone().into(),
        store: store.clone(),
        nodes: nodes.clone(),
        tasks: tasks.clone(),
        orphans: orphans.clone(),
        workflows: workflows.clone(),
        bus: bus.clone(),
        live: Arc::new(events::live::Live::default()),
        ws_slots: Arc::new(tokio::sync::Semaphore::new(cfg.events.max_clients as usize)),
        shutdown: CancellationToken::new(),
        health: health.clone(),
        auth: Arc::new(Auth::new(&cfg.auth)),
        metrics: metrics_handle(),
        embedded: embedded.clone(),
        started_at: SystemTime::now(),
        openapi: Arc::new(OnceLock::new()),
        schedules: schedules.clone(),
        barriers: barriers.clone(),
        locks: locks.clone(),
        waiters: waiters.clone(),
        failover: failover.clone(),
    };

    // Join before serving, so /readyz is green as soon as it answers.
    let me = nodes::worker::Identity {
        id: node_id.clone(),
        addr: advertise.clone(),
        labels: cfg.server.labels.clone(),
    };
    let started = std::time::Instant::now();
    match nodes
        .heartbeat(
            &me.id,
            nodes::NodeKind::Node,
            cfg.nodes.ttl_ms,
            &me.addr,
            env!("CARGO_PKG_VERSION"),
            &me.labels,
        )
        .await
    {
        Ok(hb) => health.heartbeat_ok(started, hb.state == "draining"),
        Err(e) => tracing::warn!(error = %e, "first heartbeat failed; retrying in the background"),
    }

    // Config schedules are in Redis before the node serves; on failure the
    // scheduler loop retries.
    let reconciled = match schedules.reconcile().await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "could not write the config schedules; retrying in the background");
            false
        }
    };

    let cancel = CancellationToken::new();
    let loops_cancel = CancellationToken::new();
    let loops = vec![
        nodes::worker::spawn(nodes.clone(), me, health.clone(), loops_cancel.clone()),
        events::tailer::spawn(store.clone(), bus.clone(), tail_from, loops_cancel.clone()),
        tasks::worker::spawn(tasks.clone(), loops_cancel.clone()),
        orphans::worker::spawn(orphans.clone(), loops_cancel.clone()),
        events::live::spawn(state.clone(), loops_cancel.clone()),
        workflows::worker::spawn(
            workflows.clone(),
            Duration::from_millis(cfg.tasks.janitor_interval_ms),
            loops_cancel.clone(),
        ),
        schedules::worker::spawn(schedules.clone(), reconciled, loops_cancel.clone()),
        barriers::worker::spawn(barriers.clone(), loops_cancel.clone()),
        locks::worker::spawn(locks.clone(), loops_cancel.clone()),
        longpoll::spawn(bus.clone(), waiters.clone(), loops_cancel.clone()),
    ];
    let mut loops = loops;
    loops.extend(failover.spawn(loops_cancel.clone()));

    let router = app::router(state.clone());
    let server_cancel = cancel.clone();
    let limits = serve::Limits::from_config(&cfg.server);
    let server = tokio::spawn(serve::serve(listener, router, limits, server_cancel));

    let join_cancel = cancel.clone();
    let kill = CancellationToken::new();
    let join_kill = kill.clone();
    let st = state.clone();
    let id = node_id.clone();
    let join = tokio::spawn(async move {
        tokio::select! {
            _ = join_cancel.cancelled() => {}
            _ = join_kill.cancelled() => {
                tracing::warn!(node = %id, "killed: stopping without leaving the cluster");
                st.shutdown.cancel();
                server.abort();
                loops_cancel.cancel();
                for l in loops {
                    let _ = l.await;
                }
                redis_cancel.cancel();
                if let Some(s) = supervisor {
                    let _ = s.await;
                }
                return;
            }
        }
        tracing::info!(node = %id, "shutting down");
        st.health.set_stopping();
        st.shutdown.cancel();
        // Long polls and WebSockets watch the same token; give in-flight
        // requests a bounded time to finish.
        let mut server = server;
        if tokio::time::timeout(Duration::from_secs(5), &mut server).await.is_err() {
            tracing::warn!("HTTP requests still running after 5 s; dropping them");
            server.abort();
        }
        loops_cancel.cancel();
        for l in loops {
            let _ = l.await;
        }
        match st.nodes.leave(&id, "left").await {
            Ok(()) => tracing::info!(node = %id, "left the cluster"),
            Err(e) => tracing::warn!(node = %id, error = %e, "could not leave the cluster; it will expire"),
        }
        redis_cancel.cancel();
        if let Some(s) = supervisor {
            let _ = s.await;
        }
        tracing::info!(node = %id, "stopped");
    });

    tracing::info!(node = %node_id, "muster is serving; dashboard at {advertise}/");
    Ok(Running {
        addr,
        node_id,
        state,
        cancel,
        kill,
        join,
    })
}

/// Starts a node and runs it until `shutdown` completes.
pub async fn run(
    cfg: Config,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), StartError> {
    let running = start(cfg, listener).await?;
    shutdown.await;
    running.shutdown().await;
    Ok(())
}
