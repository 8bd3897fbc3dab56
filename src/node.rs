//! The node's lifecycle: [`start`] builds a node from named steps (check the
//! listener, connect to Redis, build the services, join, spawn the loops,
//! serve) and [`Running`] stops it along one ordered teardown path.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::app::{self, AppParts, AppState};
use crate::auth::Auth;
use crate::config::Config;
use crate::health::Health;
use crate::nodes::{self, Nodes};
use crate::store::embedded::EmbeddedRedis;
use crate::store::{self, Mode, ScriptCtx, Store};
use crate::{barriers, events, failover, locks, longpoll, orphans, schedules, serve, tasks, telemetry, workflows};

mod connect;
use connect::{RedisChild, connect};

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
    #[cfg(feature = "test-util")]
    kill: CancellationToken,
    join: JoinHandle<()>,
}

impl Running {
    /// Stops the node gracefully and waits until it has left the cluster and
    /// stopped its embedded Redis.
    pub async fn shutdown(self) {
        let tracer = self.state.tracer.clone();
        self.cancel.cancel();
        let _ = self.join.await;
        // The spans still queued go out (bounded by the export timeout).
        let _ = tokio::time::timeout(Duration::from_secs(6), tracer.flush()).await;
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
    #[cfg(feature = "test-util")]
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

pub use muster_api::generated_node_id;

/// Starts a node on `listener` and returns once it serves and has joined.
pub async fn start(cfg: Config, listener: TcpListener) -> Result<Running, StartError> {
    // Two rustls providers are compiled in (aws-lc-rs for Redis, ring
    // under the client crate), so rustls cannot pick one by itself: the
    // node's TLS (Redis, failover calls) uses aws-lc-rs. Installed once per
    // process; a second start finds it there.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let addr = listener.local_addr().map_err(|e| StartError::Io(e.to_string()))?;
    check(&cfg, addr)?;
    let node_id = if cfg.server.node_id.is_empty() {
        generated_node_id()
    } else {
        cfg.server.node_id.clone()
    };
    std::fs::create_dir_all(&cfg.server.data_dir)
        .map_err(|e| StartError::Io(format!("cannot create data_dir {}: {e}", cfg.server.data_dir.display())))?;

    let (redis, embedded, store) = connect(&cfg).await?;
    let (state, tail_from, functions) = match build_services(cfg, addr, &node_id, store, embedded).await {
        Ok(v) => v,
        Err(e) => {
            // The start fails after the embedded child was started: stop it,
            // as `connect` does on its own failures.
            redis.stop().await;
            return Err(e);
        }
    };
    let me = join_cluster(&state).await;
    let reconciled = reconcile_schedules(&state).await;
    // The libraries this node uses are never swept while it records them
    // (store::script::sweep); on failure its loop records them again.
    if let Err(e) = functions.record().await {
        tracing::warn!(error = %e, "could not record this node's function libraries; retrying in the background");
    }

    let cancel = CancellationToken::new();
    let loops_cancel = CancellationToken::new();
    let mut loops = spawn_loops(&state, me, tail_from, reconciled, &loops_cancel);
    loops.push(store::script::sweep::spawn(functions, loops_cancel.clone()));
    let server = spawn_server(&state, listener, cancel.clone());

    let node = Node {
        id: node_id.clone(),
        state: state.clone(),
        server,
        loops,
        loops_cancel,
        redis,
    };
    let kill = CancellationToken::new();
    let join = tokio::spawn(node.run_until_stopped(cancel.clone(), kill.clone()));

    tracing::info!(node = %node_id, "muster is serving; dashboard at {}/", state.advertise);
    Ok(Running {
        addr,
        node_id,
        state,
        cancel,
        #[cfg(feature = "test-util")]
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

/// Refuses an unauthenticated node on a non-loopback address, and logs the
/// configuration's warnings.
fn check(cfg: &Config, addr: SocketAddr) -> Result<(), StartError> {
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
    Ok(())
}

/// Raises the fencing epoch where masters can switch, builds every service
/// on the store and gathers them into the shared state. Also returns where
/// the event tailer starts (`None` without a master yet), and the records
/// of the function libraries the services use (see `store::script::sweep`).
async fn build_services(
    cfg: Config,
    addr: SocketAddr,
    node_id: &str,
    store: Store,
    embedded: Option<Arc<EmbeddedRedis>>,
) -> Result<(AppState, Option<events::Cursor>, store::script::sweep::Functions), StartError> {
    let node_id = node_id.to_string();
    let mode = store.mode();
    let ctx = ScriptCtx {
        // Per shard's stream: a namespace's events are rarely spread evenly
        // (one busy queue is one shard), and splitting the bound would
        // shorten the resume window of the busy shard.
        events_max_len: cfg.events.max_len,
        cluster: mode == Mode::Cluster,
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
    // A namespace laid out in another number of shards would be half
    // invisible to this node: refuse it before serving anything.
    if store.has_master() {
        store::layout::check(&store, &ctx).await.map_err(StartError::Config)?;
    }
    // The bus keeps client_buffer events: how far any subscriber may fall behind.
    let bus = events::Bus::new(cfg.events.client_buffer as usize, store.shard_count());
    // Cancelled when the node starts stopping: long polls answer at once.
    let shutdown = CancellationToken::new();
    let park = longpoll::Park {
        waiters: Arc::new(longpoll::Waiters::default()),
        shutdown: shutdown.clone(),
    };
    let nodes = Nodes::new(store.clone(), cfg.nodes.clone(), &ctx);
    let health = Arc::new(Health::new(
        Duration::from_millis(cfg.nodes.ttl_ms),
        store.shard_count(),
    ));
    let tasks = tasks::Tasks::new(
        store.clone(),
        cfg.tasks.clone(),
        &cfg.claim,
        &ctx,
        bus.clone(),
        shutdown.clone(),
        health.clone(),
    );
    let tracer = crate::traces::Tracer::start(&cfg.telemetry, &node_id);
    let orphans = orphans::Orphans::new(
        store.clone(),
        cfg.orphans.clone(),
        &cfg.nodes,
        &cfg.claim,
        cfg.tasks.clone(),
        node_id.clone(),
        tasks.labels.clone(),
        &ctx,
        tracer.clone(),
    );
    let workflows = workflows::Workflows::new(store.clone(), cfg.tasks.clone(), &ctx, tasks.clone());
    let schedules = schedules::Schedules::new(
        store.clone(),
        cfg.schedules.clone(),
        cfg.tasks.clone(),
        node_id.clone(),
        &ctx,
        tasks.clone(),
        tracer.clone(),
    );
    let barriers = barriers::Barriers::new(
        store.clone(),
        cfg.barriers.clone(),
        cfg.nodes.ttl_ms,
        node_id.clone(),
        &ctx,
        park.clone(),
    );
    let locks = locks::Locks::new(
        store.clone(),
        cfg.locks.clone(),
        cfg.nodes.ttl_ms,
        node_id.clone(),
        &ctx,
        park.clone(),
    );
    // Without a master yet (coordinated mode, waiting for the coordinator)
    // the tailer finds its starting point once it connects.
    let tail_from = if store.has_master() {
        Some(events::tailer::last_cursor(&store).await?)
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
    let stats = Arc::new(crate::stats::Stats::new(store.clone(), &ctx));
    // Every script is assembled now: the libraries this node uses.
    let functions = store::script::sweep::Functions::new(&store, &ctx, Duration::from_millis(cfg.nodes.ttl_ms));
    let advertise = cfg.advertise_url(addr);
    let cfg = Arc::new(cfg);
    let state = AppState::new(AppParts {
        cfg: cfg.clone(),
        node_id: node_id.into(),
        advertise: advertise.into(),
        store,
        nodes,
        tasks,
        orphans,
        workflows,
        bus,
        live: Arc::new(events::live::Live::default()),
        ws_slots: Arc::new(events::slots::Slots::new(
            cfg.events.max_clients as usize,
            cfg.events.max_clients_per_principal as usize,
        )),
        shutdown,
        health,
        auth: Arc::new(Auth::new(&cfg.auth)),
        metrics: metrics_handle(),
        embedded,
        started_at: SystemTime::now(),
        openapi: Arc::new(OnceLock::new()),
        schedules,
        barriers,
        locks,
        waiters: park.waiters.clone(),
        failover,
        stats,
        tracer,
    });
    Ok((state, tail_from, functions))
}

/// Joins the cluster with a first heartbeat before serving, so /readyz is
/// green as soon as it answers; on failure the heartbeat loop retries.
/// Returns the identity the heartbeat loop keeps announcing.
async fn join_cluster(state: &AppState) -> nodes::worker::Identity {
    let cfg = &state.cfg;
    let me = nodes::worker::Identity {
        id: state.node_id.to_string(),
        addr: state.advertise.to_string(),
        labels: cfg.server.labels.clone(),
    };
    let started = std::time::Instant::now();
    let beats = state
        .nodes
        .heartbeat_each(
            &me.id,
            nodes::NodeKind::Node,
            cfg.nodes.ttl_ms,
            &me.addr,
            env!("CARGO_PKG_VERSION"),
            &me.labels,
        )
        .await;
    for (shard, beat) in beats.into_iter().enumerate() {
        match beat {
            Ok(b) => state.health.heartbeat_ok(shard, started, b.draining),
            Err(e) => tracing::warn!(shard, error = %e, "first heartbeat failed; retrying in the background"),
        }
    }
    me
}

/// Writes the config schedules to Redis before the node serves; on failure
/// the scheduler loop retries. Returns whether they were written.
async fn reconcile_schedules(state: &AppState) -> bool {
    match state.schedules.reconcile().await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "could not write the config schedules; retrying in the background");
            false
        }
    }
}

/// Spawns every background loop; they all stop when `cancel` is cancelled.
fn spawn_loops(
    state: &AppState,
    me: nodes::worker::Identity,
    tail_from: Option<events::Cursor>,
    reconciled: bool,
    cancel: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    let s = state;
    let mut loops = vec![
        nodes::worker::spawn(s.nodes.clone(), me, s.health.clone(), cancel.clone()),
        events::tailer::spawn(s.store.clone(), s.bus.clone(), tail_from, cancel.clone()),
        tasks::worker::spawn(s.tasks.clone(), cancel.clone()),
        orphans::worker::spawn(s.orphans.clone(), cancel.clone()),
        events::live::spawn(
            events::live::LiveDeps {
                live: s.live.clone(),
                store: s.store.clone(),
                nodes: s.nodes.clone(),
                tasks: s.tasks.clone(),
                orphans: s.orphans.clone(),
                bus: s.bus.clone(),
                reconcile_ms: s.cfg.events.reconcile_ms,
            },
            cancel.clone(),
        ),
        crate::stats::worker::spawn(s.stats.clone(), s.bus.clone(), s.live.clone(), cancel.clone()),
        workflows::worker::spawn(
            s.workflows.clone(),
            Duration::from_millis(s.cfg.tasks.janitor_interval_ms),
            cancel.clone(),
        ),
        schedules::worker::spawn(s.schedules.clone(), reconciled, cancel.clone()),
        barriers::worker::spawn(s.barriers.clone(), cancel.clone()),
        locks::worker::spawn(s.locks.clone(), cancel.clone()),
        longpoll::spawn(s.bus.clone(), s.waiters.clone(), cancel.clone()),
    ];
    loops.extend(s.failover.spawn(cancel.clone()));
    loops
}

/// Spawns the HTTP server on `listener`; it stops taking requests when
/// `cancel` is cancelled.
fn spawn_server(state: &AppState, listener: TcpListener, cancel: CancellationToken) -> JoinHandle<()> {
    let surface = app::surface(state.clone());
    let limits = serve::Limits::from_config(&state.cfg.server);
    tokio::spawn(serve::serve(listener, surface, limits, cancel))
}

/// What a running node owns and stops, in this order: the server, the
/// background loops, its membership, the embedded Redis.
struct Node {
    id: String,
    state: AppState,
    server: JoinHandle<()>,
    loops: Vec<JoinHandle<()>>,
    loops_cancel: CancellationToken,
    redis: RedisChild,
}

impl Node {
    /// Waits for a graceful stop (`cancel`) or a kill (`kill`), then tears
    /// the node down.
    async fn run_until_stopped(self, cancel: CancellationToken, kill: CancellationToken) {
        let graceful = tokio::select! {
            _ = cancel.cancelled() => true,
            _ = kill.cancelled() => false,
        };
        self.stop(graceful).await;
    }

    /// The one teardown path. A graceful stop marks the node stopping, lets
    /// in-flight requests finish (bounded) and leaves the cluster; a kill
    /// aborts the server and does not leave, as if the process died.
    async fn stop(self, graceful: bool) {
        let Node {
            id,
            state: st,
            mut server,
            loops,
            loops_cancel,
            redis,
        } = self;
        if graceful {
            tracing::info!(node = %id, "shutting down");
            st.health.set_stopping();
        } else {
            tracing::warn!(node = %id, "killed: stopping without leaving the cluster");
        }
        st.shutdown.cancel();
        if graceful {
            // Long polls and WebSockets watch the same token; give in-flight
            // requests a bounded time to finish.
            if tokio::time::timeout(Duration::from_secs(5), &mut server).await.is_err() {
                tracing::warn!("HTTP requests still running after 5 s; dropping them");
                server.abort();
            }
        } else {
            server.abort();
        }
        loops_cancel.cancel();
        for l in loops {
            let _ = l.await;
        }
        if graceful {
            match st.nodes.leave(&id, "left").await {
                Ok(()) => tracing::info!(node = %id, "left the cluster"),
                Err(e) => tracing::warn!(node = %id, error = %e, "could not leave the cluster; it will expire"),
            }
        }
        redis.stop().await;
        if graceful {
            tracing::info!(node = %id, "stopped");
        }
    }
}
