//! Test harness: real `redis-server` processes on free ports, in-process
//! muster nodes on `127.0.0.1:0`, the real binary, and `wait_until`.
//!
//! Every server is killed on drop (SIGKILL: fast, and it never saves), so a
//! failing test leaves nothing behind.

#![allow(dead_code)]

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use muster::Running;
use muster::config::Config;
use serde_json::Value;
use tempfile::TempDir;

pub mod cluster_mode;
pub use cluster_mode::skip_on_cluster;
pub mod ha;
pub mod keys;
mod proxy;
pub use proxy::FaultProxy;
pub mod netns;
pub mod sharded;
pub mod skew;
mod tls;
#[allow(unused_imports)]
pub use sharded::{
    name_in_shard, name_like, name_tag, names_per_shard, shard_keys, shard_map, shard_tag, shard_tags, sharded,
    skip_when_sharded, task_tag,
};
pub use tls::{TlsProxy, test_cert_pem};
pub mod venv;

/// A free TCP port on loopback (bound and released; the caller retries if
/// someone takes it in between).
pub fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn redis_bin() -> String {
    std::env::var("MUSTER_TEST_REDIS_BIN").unwrap_or_else(|_| "redis-server".into())
}

/// A `redis-server` in a temporary directory on a free port.
pub struct TestRedis {
    pub port: u16,
    pub dir: TempDir,
    child: Option<Child>,
    extra: Vec<String>,
    /// Environment of the server process (a clock skew, see `skew.rs`).
    env: Vec<(String, String)>,
    /// Cluster mode: the test's namespace on the shared cluster (no server
    /// of its own).
    ns: Option<cluster_mode::Namespace>,
}

impl TestRedis {
    pub fn start() -> TestRedis {
        if cluster_mode::enabled() {
            let ns = cluster_mode::Namespace::new();
            return TestRedis {
                port: ns.port(),
                dir: tempfile::Builder::new().prefix("muster-redis").tempdir().unwrap(),
                child: None,
                extra: Vec::new(),
                env: Vec::new(),
                ns: Some(ns),
            };
        }
        Self::start_with(&[])
    }

    /// Cluster mode: the test's key prefix (`None` on a server of its own).
    pub fn cluster_prefix(&self) -> Option<&str> {
        self.ns.as_ref().map(|n| n.prefix.as_str())
    }

    /// A node config for this Redis: its URL, or in cluster mode the shared
    /// cluster's seeds and the test's key prefix.
    pub fn test_config(&self, data_dir: &Path) -> Config {
        match &self.ns {
            None => test_config(&self.url(), data_dir),
            Some(ns) => ns.test_config(data_dir),
        }
    }

    /// Cluster mode: moves a key prefix the test set itself into the test's
    /// namespace (`muster` is the namespace's own). Does nothing otherwise.
    pub fn adopt(&self, cfg: &mut Config) {
        if let Some(ns) = &self.ns {
            ns.adopt(cfg);
        }
    }

    /// Panics in cluster mode: `what` needs a server of the test's own.
    fn own_server(&self, what: &str) {
        assert!(
            self.ns.is_none(),
            "{what} needs a redis-server of the test's own: skip this test with skip_on_cluster"
        );
    }

    /// Starts with extra `--name value` arguments (e.g. `["--appendonly", "yes"]`).
    pub fn start_with(extra: &[&str]) -> TestRedis {
        let mut dir = tempfile::Builder::new().prefix("muster-redis").tempdir().unwrap();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _ in 0..5 {
            let port = free_port();
            let mut r = TestRedis {
                port,
                dir,
                child: None,
                extra: extra.clone(),
                env: Vec::new(),
                ns: None,
            };
            if r.spawn() {
                return r;
            }
            dir = r.take_dir();
        }
        panic!("could not start redis-server on a free port");
    }

    fn take_dir(mut self) -> TempDir {
        self.kill();
        let dir = tempfile::Builder::new().prefix("muster-redis").tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }

    fn spawn(&mut self) -> bool {
        let log = self.dir.path().join("redis.log");
        let mut cmd = Command::new(redis_bin());
        cmd.args([
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--daemonize",
            "no",
        ])
        .arg("--dir")
        .arg(self.dir.path())
        .arg("--logfile")
        .arg(&log)
        .args(["--appendonly", "no"])
        .args(&self.extra)
        .envs(self.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if cluster_mode::spawning_shared() {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl(2) only, between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .spawn()
            .expect("redis-server must be installed (apt-get install -y redis-server)");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.contains("Address already in use") {
                    return false;
                }
                panic!("redis-server exited at start; its log:\n{text}");
            }
            if ping(self.port) {
                self.child = Some(child);
                return true;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("redis-server did not answer PING within 10 s; its log:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn url(&self) -> String {
        self.own_server("a Redis URL");
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same port and directory (AOF data, if enabled, survives).
    pub fn restart(&mut self) {
        self.own_server("restart");
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.spawn() {
            assert!(Instant::now() < deadline, "port {} stayed busy", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap()
    }

    /// A connection for the test's own checks. On a busy machine a connect
    /// can time out: it is retried for up to 20 s, and a failure says what
    /// was waited for, so a test fails only for what it checks.
    pub async fn conn(&self) -> cluster_mode::TestConn {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let c = match &self.ns {
                None => self
                    .client()
                    .get_multiplexed_async_connection()
                    .await
                    .map(cluster_mode::TestConn::Single),
                Some(ns) => ns.conn().await,
            };
            match c {
                Ok(c) => return c,
                Err(e) if Instant::now() < deadline => {
                    eprintln!(
                        "test harness: connecting to redis-server on port {} failed ({e}); retrying",
                        self.port
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!(
                    "test harness: no connection to redis-server on port {} within 20 s: {e}",
                    self.port
                ),
            }
        }
    }

    /// Runs one command and decodes the reply (retried for up to 20 s on
    /// connection errors and timeouts, as `conn` is).
    pub async fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut c = self.conn().await;
            match cmd.query_async(&mut c).await {
                Ok(v) => return v,
                Err(e)
                    if (e.is_timeout() || e.is_io_error() || e.is_connection_dropped())
                        && Instant::now() < deadline =>
                {
                    eprintln!("test harness: {args:?} on port {} failed ({e}); retrying", self.port);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("test harness: {args:?} on redis-server port {} failed: {e}", self.port),
            }
        }
    }

    /// Stalls the server for `d` with `DEBUG SLEEP` (needs
    /// `--enable-debug-command yes`); returns at once, the stall runs on.
    pub fn stall(&self, d: Duration) {
        self.own_server("DEBUG SLEEP");
        let mut child = Command::new("redis-cli")
            .args([
                "-p",
                &self.port.to_string(),
                "DEBUG",
                "SLEEP",
                &format!("{:.3}", d.as_secs_f64()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli is installed with redis-server");
        std::thread::spawn(move || child.wait());
        // Let the command reach the server before the caller goes on.
        std::thread::sleep(Duration::from_millis(50));
    }

    /// Freezes the server for `d` with SIGSTOP, then SIGCONT: it neither
    /// answers nor runs anything meanwhile, as in a long GC-like pause or a
    /// stalled VM. Returns at once; join the handle to wait for the thaw.
    pub fn freeze(&self, d: Duration) -> std::thread::JoinHandle<()> {
        let pid = self.child.as_ref().expect("server is running").id() as i32;
        // SAFETY: plain kill(2) on our own child process.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        std::thread::spawn(move || {
            std::thread::sleep(d);
            unsafe { libc::kill(pid, libc::SIGCONT) };
        })
    }

    pub async fn dbsize(&self) -> i64 {
        self.cmd(&["DBSIZE"]).await
    }

    /// Every event in the stream, as (type, node, fields), read in pages; the
    /// stream id is in the `_id` field. A split namespace's streams are read
    /// one after the other, merged by stream id (`_shard` says whose), and
    /// the registry's events, which every shard writes, kept from shard 0
    /// alone, as the nodes deliver them.
    pub async fn events(&self, prefix: &str) -> Vec<(String, String, Value)> {
        let tags = shard_tags(prefix);
        if tags.len() == 1 {
            return self.stream_events(&format!("{{{prefix}}}:events")).await;
        }
        let mut all = Vec::new();
        for (i, tag) in tags.iter().enumerate() {
            for (ty, node, mut f) in self.stream_events(&format!("{tag}:events")).await {
                if i > 0 && ty.starts_with("node.") {
                    continue;
                }
                f["_shard"] = Value::from(i);
                all.push((ty, node, f));
            }
        }
        let id = |f: &Value| {
            let s = f["_id"].as_str().unwrap_or("0-0");
            let (ms, seq) = s.split_once('-').unwrap_or((s, "0"));
            (ms.parse::<u64>().unwrap_or(0), seq.parse::<u64>().unwrap_or(0))
        };
        all.sort_by_key(|(_, _, f)| (id(f), f["_shard"].as_u64()));
        all
    }

    /// Every entry of one stream `key`, as [`TestRedis::events`] gives them.
    async fn stream_events(&self, key: &str) -> Vec<(String, String, Value)> {
        let mut c = self.conn().await;
        let key = key.to_string();
        let mut out = Vec::new();
        let mut start = "-".to_string();
        let mut retry_until = Instant::now() + Duration::from_secs(20);
        loop {
            // A read, so safe to retry: on a loaded machine a reply can take
            // longer than the client's response timeout.
            let rows: Vec<(String, Vec<(String, String)>)> = match redis::cmd("XRANGE")
                .arg(&key)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut c)
                .await
            {
                Ok(rows) => rows,
                Err(e) if Instant::now() < retry_until => {
                    eprintln!("test harness: XRANGE {key} failed ({e}); retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    c = self.conn().await;
                    continue;
                }
                Err(e) => panic!("test harness: XRANGE {key} kept failing for 20 s: {e}"),
            };
            retry_until = Instant::now() + Duration::from_secs(20);
            let Some(last) = rows.last().map(|r| r.0.clone()) else {
                break;
            };
            for ev in rows
                .into_iter()
                .flat_map(|(sid, fields)| muster::testing::Event::from_entry(sid, fields))
            {
                let mut obj = serde_json::Map::new();
                for (k, v) in &ev.subjects {
                    obj.insert(k.clone(), Value::String(v.clone()));
                }
                obj.insert("data".into(), Value::String(ev.data.clone()));
                obj.insert("_id".into(), Value::String(ev.id.clone()));
                out.push((ev.kind, ev.node, Value::Object(obj)));
            }
            start = format!("({last}");
        }
        out
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if n >= 5 && &buf[..5] == b"+PONG")
}

static NEXT_NODE: AtomicU32 = AtomicU32::new(1);

/// A config for tests: the given Redis, port 0, fast heartbeats, a unique
/// node id, a private data dir.
pub fn test_config(redis_url: &str, data_dir: &Path) -> Config {
    let mut cfg = Config::default();
    cfg.redis.url = redis_url.to_string();
    cfg.server.listen = "127.0.0.1:0".into();
    cfg.server.node_id = format!("n{}-{}", std::process::id(), NEXT_NODE.fetch_add(1, Ordering::Relaxed));
    cfg.server.data_dir = data_dir.to_path_buf();
    cfg.nodes.heartbeat_ms = 100;
    cfg.nodes.ttl_ms = 600;
    cfg.nodes.dead_retention_ms = 2000;
    cfg.orphans.interval_ms = 100;
    cfg.tasks.janitor_interval_ms = 200;
    cfg.events.reconcile_ms = 500;
    cfg.redis.shards = test_shards();
    cfg
}

/// The shards every test node splits its namespace into:
/// `MUSTER_TEST_SHARDS` (default 1), so the whole suite runs on split
/// namespaces too (issue 14).
pub fn test_shards() -> u32 {
    std::env::var("MUSTER_TEST_SHARDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// An in-process muster node on `127.0.0.1:0`; shut down on drop.
pub struct TestApp {
    pub running: Option<Running>,
    pub url: String,
    pub node_id: String,
    pub http: reqwest::Client,
    pub token: Option<String>,
    /// The typed client [`TestApp::api`] hands out, built on first use.
    api: std::sync::OnceLock<muster::client::Client>,
    _dir: TempDir,
}

impl TestApp {
    pub async fn start(redis: &TestRedis) -> TestApp {
        Self::start_with(redis, |_| {}).await
    }

    pub async fn start_with(redis: &TestRedis, tweak: impl FnOnce(&mut Config)) -> TestApp {
        let dir = tempfile::Builder::new().prefix("muster-node").tempdir().unwrap();
        let mut cfg = redis.test_config(dir.path());
        tweak(&mut cfg);
        redis.adopt(&mut cfg);
        Self::start_config(cfg, dir).await
    }

    pub async fn start_config(cfg: Config, dir: TempDir) -> TestApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let running = muster::start(cfg, listener).await.expect("node starts");
        TestApp {
            url: format!("http://{}", running.addr),
            node_id: running.node_id.clone(),
            running: Some(running),
            http: reqwest::Client::new(),
            token: None,
            api: std::sync::OnceLock::new(),
            _dir: dir,
        }
    }

    pub fn with_token(mut self, token: &str) -> Self {
        self.token = Some(token.to_string());
        self.api = std::sync::OnceLock::new();
        self
    }

    /// The typed client of this node (with its token, if any), as tests
    /// speak to a node unless raw HTTP is their point. It tries once and
    /// never fails over or retries: a test sees every refusal and every
    /// outage as it happens ([`problem`] reads a refusal).
    pub fn api(&self) -> &muster::client::Client {
        self.api
            .get_or_init(|| api_client(std::slice::from_ref(&self.url), self.token.clone()))
    }

    pub fn state(&self) -> &muster::testing::AppState {
        &self.running.as_ref().unwrap().state
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut r = self.http.request(method, format!("{}{path}", self.url));
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        r
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        send(self.req(reqwest::Method::GET, path)).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        send(self.req(reqwest::Method::POST, path).json(&body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        send(self.req(reqwest::Method::PUT, path).json(&body)).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        send(self.req(reqwest::Method::DELETE, path)).await
    }

    /// The body of a GET as text (a dashboard page, `/metrics`).
    pub async fn page(&self, path: &str) -> String {
        self.req(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Waits until this node's orphan cleaner has run `n` more passes (each
    /// recovery, timeout and, when due, sweep step, attempted or skipped):
    /// what a test waits on instead of sleeping through a few intervals.
    pub async fn cleaner_passes(&self, n: u64) {
        let orphans = &self.running.as_ref().expect("the node runs").state.orphans;
        let target = orphans.passes() + n;
        let done = wait_until(Duration::from_secs(30), || async { orphans.passes() >= target }).await;
        assert!(
            done,
            "{}: the cleaner ran {} of {n} passes in 30 s",
            self.node_id,
            orphans.passes() + n - target
        );
    }

    /// A raw request builder for headers and bodies the helpers don't cover.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.req(method, path)
    }

    /// Graceful shutdown: leaves the cluster.
    pub async fn shutdown(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
    }

    /// Stops without leaving, as a crash would.
    pub async fn kill(&mut self) {
        if let Some(r) = self.running.take() {
            r.kill().await;
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.cancel_token().cancel();
        }
    }
}

/// Sends a request; returns the status and the JSON body (Null when empty or
/// not JSON).
/// The CSRF token a dashboard page carries (`<body data-csrf="...">`), for
/// posting its forms.
pub fn csrf_of(html: &str) -> String {
    html.split("data-csrf=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page carries a CSRF token")
        .to_string()
}

/// A typed client of these node URLs that tries each URL once (no retry
/// budget), with an optional token.
pub fn api_client(urls: &[String], token: Option<String>) -> muster::client::Client {
    muster::client::Client::builder()
        .urls(urls.iter().cloned())
        .token_opt(token)
        .retry_for(Duration::ZERO)
        .build()
        .expect("a test client builds")
}

/// The problem of a call that had to be refused: panics when it succeeded or
/// failed without an answer (unreachable, undecodable).
#[track_caller]
pub fn problem<T: std::fmt::Debug>(r: muster::client::Result<T>) -> muster::client::Problem {
    match r {
        Err(muster::client::Error::Api(p)) => *p,
        other => panic!("expected a refusal (a problem answer), got {other:?}"),
    }
}

/// A raw answer read as a problem (for tests whose point is raw HTTP: a
/// body the typed client would never send).
pub fn as_problem(status: u16, body: &Value) -> muster::client::Problem {
    muster::client::Problem::from_body(status, &serde_json::to_vec(body).unwrap_or_default())
}

pub async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = req.send().await.expect("request reaches the node");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Polls `cond` every 20 ms until it holds or `within` passes.
pub async fn wait_until<F, Fut>(within: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `muster` binary built for these tests.
pub fn muster_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_muster"))
}

/// Whether a process with this pid exists (and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.split_whitespace().nth(2).is_none_or(|s| s != "Z"),
        Err(_) => false,
    }
}

/// sha256 hex of a token, as it goes into [auth] tokens.
/// Three tokens, `r` (read), `w` (worker) and `a` (admin), whose secrets
/// are `{prefix}-r`, `{prefix}-w` and `{prefix}-a`.
pub fn role_tokens(prefix: &str) -> Vec<muster::config::TokenConfig> {
    use muster::config::Role;
    [("r", Role::Read), ("w", Role::Worker), ("a", Role::Admin)]
        .into_iter()
        .map(|(name, role)| muster::config::TokenConfig {
            name: name.into(),
            role,
            sha256: sha256_hex(&format!("{prefix}-{name}")),
        })
        .collect()
}

pub fn sha256_hex(token: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
