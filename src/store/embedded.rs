//! The embedded Redis: a `redis-server` child the node starts when no Redis
//! is configured.
//!
//! Invariants:
//! - It listens only on a unix socket under `<data_dir>/redis/` (`port 0`), with
//!   AOF on (`appendfsync everysec`) and `noeviction`: muster's keys are state,
//!   never a cache, and evicting one would lose a task.
//! - Readiness is a successful PING, polled; there is no fixed sleep.
//! - The child dies with the node: graceful shutdown sends SIGTERM (Redis
//!   flushes its AOF) and waits; the child also gets SIGTERM from the kernel
//!   if the node process dies (`PR_SET_PDEATHSIG`), so a SIGKILLed node
//!   leaves no Redis behind.
//! - If the child dies while the node runs, the node turns not-ready and the
//!   supervisor restarts it with capped exponential backoff; the store's
//!   connection manager reconnects by itself.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Longest unix socket path the kernel accepts (sun_path is 108 bytes).
const MAX_SOCKET_PATH: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(
        "`{bin}` was not found. Install Redis 7 or newer (Debian/Ubuntu: `apt-get install -y redis-server`; \
         macOS: `brew install redis`), set MUSTER_REDIS_SERVER_BIN to the redis-server binary, \
         or use an existing Redis with --redis-url redis://host:6379"
    )]
    NotInstalled { bin: String },
    #[error("cannot prepare {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("the socket path {0} is too long for a unix socket; use a shorter --data-dir")]
    SocketPathTooLong(PathBuf),
    #[error(
        "an embedded Redis is already running on {0} (another node uses this data directory?). \
         Join it with --redis-url unix://{0}, or give this node its own --data-dir"
    )]
    AlreadyRunning(PathBuf),
    #[error("redis-server did not become ready: {reason}\n--- {log} ---\n{tail}")]
    NotReady { reason: String, log: PathBuf, tail: String },
}

/// A supervised `redis-server` child.
pub struct EmbeddedRedis {
    dir: PathBuf,
    socket: PathBuf,
    bin: String,
    healthy: Arc<AtomicBool>,
}

impl EmbeddedRedis {
    /// Prepares `<data_dir>/redis/`, starts the child and waits for PING.
    /// Returns the handle and the running child, which [`supervise`] takes over.
    pub async fn start(data_dir: &Path, bin: &str) -> Result<(Arc<EmbeddedRedis>, Child), EmbeddedError> {
        let dir = absolute(&data_dir.join("redis"));
        std::fs::create_dir_all(&dir).map_err(|source| EmbeddedError::Io {
            path: dir.clone(),
            source,
        })?;
        let socket = dir.join("redis.sock");
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(EmbeddedError::SocketPathTooLong(socket));
        }
        if socket.exists() && ping(&socket).await {
            return Err(EmbeddedError::AlreadyRunning(socket));
        }
        let conf = format!(
            "# written by muster at every start; edits are overwritten\n\
             port 0\n\
             unixsocket {sock}\n\
             unixsocketperm 700\n\
             dir {dir}\n\
             daemonize no\n\
             pidfile {dir}/redis.pid\n\
             logfile {dir}/redis.log\n\
             appendonly yes\n\
             appendfsync everysec\n\
             save \"\"\n\
             maxmemory-policy noeviction\n",
            sock = socket.display(),
            dir = dir.display(),
        );
        let conf_path = dir.join("redis.conf");
        std::fs::write(&conf_path, conf).map_err(|source| EmbeddedError::Io {
            path: conf_path.clone(),
            source,
        })?;
        let me = Arc::new(EmbeddedRedis {
            dir,
            socket,
            bin: bin.to_string(),
            healthy: Arc::new(AtomicBool::new(false)),
        });
        let child = me.spawn_and_wait().await?;
        tracing::info!(socket = %me.socket.display(), "embedded Redis is ready; other local nodes can join with --redis-url {}", me.url());
        Ok((me, child))
    }

    /// `unix://<socket>`.
    pub fn url(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// False while the child is down or restarting.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    async fn spawn_and_wait(&self) -> Result<Child, EmbeddedError> {
        let mut cmd = Command::new(&self.bin);
        cmd.arg(self.dir.join("redis.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                EmbeddedError::NotInstalled { bin: self.bin.clone() }
            } else {
                EmbeddedError::Io {
                    path: PathBuf::from(&self.bin),
                    source: e,
                }
            }
        })?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(self.not_ready(format!("it exited with {status}")));
            }
            if ping(&self.socket).await {
                self.healthy.store(true, Ordering::Relaxed);
                return Ok(child);
            }
            if Instant::now() > deadline {
                let _ = child.start_kill();
                return Err(self.not_ready("no PING answer within 60 s".into()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn not_ready(&self, reason: String) -> EmbeddedError {
        let log = self.dir.join("redis.log");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        EmbeddedError::NotReady { reason, log, tail }
    }

    /// Watches the child until `cancel`; restarts it when it dies; on cancel
    /// stops it with SIGTERM (SIGKILL after 5 s).
    pub fn supervise(self: &Arc<Self>, mut child: Child, cancel: CancellationToken) -> JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(100);
            loop {
                tokio::select! {
                    status = child.wait() => {
                        me.healthy.store(false, Ordering::Relaxed);
                        tracing::error!(?status, "embedded Redis exited; this node is not ready until it is back");
                        loop {
                            tokio::select! {
                                _ = tokio::time::sleep(delay) => {}
                                _ = cancel.cancelled() => return,
                            }
                            delay = (delay * 2).min(Duration::from_secs(5));
                            match me.spawn_and_wait().await {
                                Ok(c) => {
                                    tracing::info!("embedded Redis restarted");
                                    child = c;
                                    delay = Duration::from_millis(100);
                                    break;
                                }
                                Err(e) => tracing::error!(error = %e, "embedded Redis restart failed"),
                            }
                        }
                    }
                    _ = cancel.cancelled() => {
                        stop_child(&mut child).await;
                        me.healthy.store(false, Ordering::Relaxed);
                        return;
                    }
                }
            }
        })
    }
}

async fn stop_child(child: &mut Child) {
    if let Some(pid) = child.id() {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
        match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
            Ok(_) => tracing::info!("embedded Redis stopped"),
            Err(_) => {
                tracing::warn!("embedded Redis did not stop within 5 s; killing it");
                let _ = child.kill().await;
            }
        }
    }
}

async fn ping(socket: &Path) -> bool {
    let Ok(client) = redis::Client::open(format!("unix://{}", socket.display())) else {
        return false;
    };
    let attempt = async {
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let pong: String = redis::cmd("PING").query_async(&mut conn).await.ok()?;
        Some(pong)
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), attempt).await,
        Ok(Some(_))
    )
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}
