//! Cluster mode (`MUSTER_TEST_CLUSTER=1`, issue 14): the suite on one shared
//! 3-master Redis Cluster instead of a `redis-server` per test.
//!
//! The cluster is started once per test process, on first use, by a thread
//! that lives as long as the process: its servers get `PR_SET_PDEATHSIG`, so
//! they die with the process even though a static is never dropped. Each
//! `TestRedis::start()` is a namespace on it: its own `redis.key_prefix`
//! (`t<pid>_<n>`). The test's own Redis commands go through [`TestConn`],
//! which writes `{muster}` as `{<prefix>}` in arguments and back in replies,
//! limits `KEYS` and `DBSIZE` to the namespace, and sends commands without
//! keys (`INFO`, `FUNCTION`, `TIME`, ...) to the master owning the prefix's
//! slot. A test that needs a server of its own calls [`skip_on_cluster`].

use std::cell::Cell;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{LazyLock, Mutex, OnceLock};

use muster::config::Config;
use muster::store::shards::key_slot;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::ha::TestCluster;

/// Whether the suite runs on the shared cluster.
pub fn enabled() -> bool {
    static ON: LazyLock<bool> = LazyLock::new(|| std::env::var("MUSTER_TEST_CLUSTER").is_ok_and(|v| v == "1"));
    *ON
}

/// In cluster mode, prints why the test is skipped and returns true.
pub fn skip_on_cluster(reason: &str) -> bool {
    if enabled() {
        eprintln!("SKIP on cluster: {reason}");
    }
    enabled()
}

thread_local! {
    static CLUSTER_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Whether a server spawned now belongs to the shared cluster (and must die
/// with the process).
pub(super) fn spawning_shared() -> bool {
    CLUSTER_THREAD.with(|c| c.get())
}

struct Shared {
    seeds: Vec<String>,
    urls: Vec<String>,
    ports: Vec<u16>,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("shared-cluster".into())
            .spawn(move || {
                CLUSTER_THREAD.with(|c| c.set(true));
                let cluster = TestCluster::start_with_ports(3, low_cluster_port);
                let _ = tx.send(Shared {
                    seeds: cluster.seeds(),
                    urls: cluster.urls(),
                    ports: cluster.ports(),
                });
                // Servers die with the thread that spawned them: park forever.
                loop {
                    std::thread::park();
                }
            })
            .unwrap();
        let s = rx.recv().expect("the shared cluster starts");
        eprintln!("test harness: shared Redis Cluster on ports {:?}", s.ports);
        s
    })
}

/// A free port below 22768 whose bus port (+10000) is free too and below
/// the ephemeral range.
fn low_cluster_port() -> u16 {
    static N: AtomicU32 = AtomicU32::new(0);
    loop {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = 20000 + ((std::process::id().wrapping_mul(7919) + n.wrapping_mul(131)) % 2768) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(p) && free(p + 10000) {
            return p;
        }
    }
}

/// One test's namespace on the shared cluster.
pub struct Namespace {
    pub prefix: String,
    /// (`{name}`, `{<prefix>}`-style replacement) pairs for arguments; the
    /// first is `{muster}`, more come from tests that set their own prefix.
    renames: Mutex<Vec<(String, String)>>,
    conn: Mutex<Option<ClusterConnection>>,
}

impl Namespace {
    pub fn new() -> Namespace {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let prefix = format!("t{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        Namespace {
            renames: Mutex::new(vec![("muster".into(), prefix.clone())]),
            prefix,
            conn: Mutex::new(None),
        }
    }

    /// The first port of the cluster (for messages only).
    pub fn port(&self) -> u16 {
        shared().ports[0]
    }

    /// A node config on the cluster in this namespace.
    pub fn test_config(&self, data_dir: &Path) -> Config {
        let mut cfg = super::test_config("", data_dir);
        cfg.redis.url.clear();
        cfg.redis.cluster = shared().seeds.clone();
        cfg.redis.key_prefix = self.prefix.clone();
        cfg
    }

    /// After a test's tweak: a prefix of its own becomes `<prefix>.<its>`,
    /// and `{its}` is rewritten as `{<prefix>.<its>}`.
    pub fn adopt(&self, cfg: &mut Config) {
        let theirs = cfg.redis.key_prefix.clone();
        if theirs == self.prefix || theirs.starts_with(&format!("{}.", self.prefix)) {
            return;
        }
        let mine = format!("{}.{theirs}", self.prefix);
        let mut r = self.renames.lock().unwrap();
        if !r.iter().any(|(a, _)| *a == theirs) {
            r.push((theirs, mine.clone()));
        }
        cfg.redis.key_prefix = mine;
    }

    pub async fn conn(&self) -> redis::RedisResult<TestConn> {
        let cached = self.conn.lock().unwrap().clone();
        let c = match cached {
            Some(c) => c,
            None => {
                let c = redis::cluster::ClusterClient::new(shared().urls.clone())?
                    .get_async_connection()
                    .await?;
                *self.conn.lock().unwrap() = Some(c.clone());
                c
            }
        };
        let renames = self.renames.lock().unwrap().clone();
        Ok(TestConn::Cluster(
            c,
            Rewrite {
                prefix: self.prefix.clone(),
                renames,
            },
        ))
    }
}

/// The test's connection: a server's, or the cluster's with rewriting.
#[derive(Clone)]
pub enum TestConn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection, Rewrite),
}

#[derive(Clone)]
pub struct Rewrite {
    prefix: String,
    renames: Vec<(String, String)>,
}

impl Rewrite {
    fn args(&self, cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => b"0".to_vec(),
            })
            .map(|a| {
                self.renames.iter().fold(a, |a, (from, to)| {
                    let a = replace(&a, format!("{{{from}}}").as_bytes(), format!("{{{to}}}").as_bytes());
                    replace(&a, format!("{{{from}#").as_bytes(), format!("{{{to}#").as_bytes())
                })
            })
            .collect()
    }

    fn reply(&self, v: Value) -> Value {
        let back = |b: Vec<u8>| {
            self.renames.iter().fold(b, |b, (from, to)| {
                let b = replace(&b, format!("{{{to}}}").as_bytes(), format!("{{{from}}}").as_bytes());
                replace(&b, format!("{{{to}#").as_bytes(), format!("{{{from}#").as_bytes())
            })
        };
        match v {
            Value::BulkString(b) => Value::BulkString(back(b)),
            Value::SimpleString(s) => Value::SimpleString(String::from_utf8_lossy(&back(s.into_bytes())).into()),
            Value::Array(a) => Value::Array(a.into_iter().map(|v| self.reply(v)).collect()),
            Value::Set(a) => Value::Set(a.into_iter().map(|v| self.reply(v)).collect()),
            Value::Map(m) => Value::Map(m.into_iter().map(|(k, v)| (self.reply(k), self.reply(v))).collect()),
            v => v,
        }
    }

    /// `KEYS <pattern>` limited to the namespace: `{<prefix>}`, its shards
    /// `{<prefix>#...}` and the prefixes of its own `{<prefix>.x}`.
    fn keys_pattern(&self, pattern: &[u8]) -> Vec<u8> {
        if pattern.starts_with(b"{") {
            return pattern.to_vec();
        }
        let mut p = format!("{{{}[}}#.]", self.prefix).into_bytes();
        p.extend_from_slice(pattern);
        p
    }

    async fn run(&self, c: &mut ClusterConnection, cmd: &Cmd) -> redis::RedisResult<Value> {
        let mut args = self.args(cmd);
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let sub = args.get(1).map(|a| String::from_utf8_lossy(a).to_ascii_uppercase());
        if name == "DBSIZE" {
            let keys = redis::cmd("KEYS")
                .arg(self.keys_pattern(b"*"))
                .query_async::<Vec<Value>>(c)
                .await?;
            return Ok(Value::Int(keys.len() as i64));
        }
        if name == "KEYS" && args.len() == 2 {
            args[1] = self.keys_pattern(&args[1]);
        }
        let mut out = redis::Cmd::new();
        for a in &args {
            out.arg(a.as_slice());
        }
        let keyless = matches!(
            name.as_str(),
            "INFO"
                | "FUNCTION"
                | "SLOWLOG"
                | "TIME"
                | "SCAN"
                | "PING"
                | "CONFIG"
                | "SCRIPT"
                | "ACL"
                | "CLIENT"
                | "LATENCY"
        ) || (name == "MEMORY" && sub.as_deref() != Some("USAGE"));
        let v = if keyless {
            let slot = key_slot(&format!("{{{}}}", self.prefix));
            let to = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
            c.route_command(out, RoutingInfo::SingleNode(to)).await?
        } else {
            c.req_packed_command(&out).await?
        };
        Ok(self.reply(v))
    }
}

fn replace(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    if from.is_empty() || hay.len() < from.len() {
        return hay.to_vec();
    }
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

impl ConnectionLike for TestConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            TestConn::Single(c) => c.req_packed_command(cmd),
            TestConn::Cluster(c, rw) => Box::pin(async move { rw.run(c, cmd).await }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            TestConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            // Plain pipelines only (no MULTI): one command after the other.
            TestConn::Cluster(c, rw) => Box::pin(async move {
                let mut out = Vec::new();
                for cmd in pipeline.cmd_iter() {
                    out.push(rw.run(c, cmd).await?);
                }
                Ok(out)
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            TestConn::Single(c) => c.get_db(),
            TestConn::Cluster(..) => 0,
        }
    }
}
