//! Cluster mode (`MUSTER_TEST_CLUSTER=1`, issue 14): the suite on one shared
//! 3-master Redis Cluster instead of a `redis-server` per test.
//!
//! The cluster is started once per test process, on first use, by a thread
//! that lives as long as the process: its servers get `PR_SET_PDEATHSIG`, so
//! they die with the process even though a static is never dropped. Each
//! `TestRedis::start()` is a namespace on it: its own `redis.key_prefix`
//! (`t<pid>_<n>`). The test's own Redis commands go through [`TestConn`]
//! (see [`Rewrite`]): `{muster}` becomes `{<prefix>}` and any other hash
//! tag `{x}` becomes `{<prefix>.x}` in arguments, and back in replies;
//! `KEYS` and `DBSIZE` see only the namespace, and commands without keys
//! (`INFO`, `FUNCTION LIST`, `TIME`, ...) go to the master owning shard 0's
//! slot (the prefix's with one shard). With `MUSTER_TEST_SHARDS` a shard
//! tag `{muster#i.k}` maps to shard `i` of the namespace, and the slow log
//! is read and set on every master. A test that needs a server of its own calls
//! [`skip_on_cluster`].

use std::cell::Cell;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{LazyLock, Mutex, OnceLock};

use muster::config::Config;
use muster::testing::{ShardMap, key_slot};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::ha::TestCluster;
use super::sharded::shard_map;

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
    conn: Mutex<Option<ClusterConnection>>,
}

impl Namespace {
    pub fn new() -> Namespace {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        Namespace {
            prefix: format!("t{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)),
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

    /// After a test's tweak: `muster` is the namespace's prefix, a prefix of
    /// the test's own `x` becomes `<prefix>.x` (as `{x}` in its commands).
    pub fn adopt(&self, cfg: &mut Config) {
        cfg.redis.key_prefix = Rewrite(&self.prefix).forward_tag(&cfg.redis.key_prefix);
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
        Ok(TestConn::Cluster(c, self.prefix.clone()))
    }
}

/// The test's connection: a server's, or the cluster's with rewriting.
#[derive(Clone)]
pub enum TestConn {
    Single(MultiplexedConnection),
    /// The cluster, and the namespace's prefix.
    Cluster(ClusterConnection, String),
}

/// What the test's commands and their replies go through in a namespace:
/// every hash tag `{x}` in an argument becomes `{<prefix>}` for `x` =
/// `muster` and `{<prefix>.x}` otherwise (`{x#i.k}` alike), and back in
/// replies. Script bodies (`EVAL`, `SCRIPT LOAD`) only get `{muster}`
/// rewritten (a Lua table `{x}` is no key), and `SCRIPT LOAD` answers the
/// hash of the text as sent, which `EVALSHA` maps to the loaded one.
struct Rewrite<'a>(&'a str);

/// Shard `i`'s tag of namespace `prefix`, the maps cached by prefix (a
/// reply of `KEYS` maps every key back).
fn shard_tag(prefix: &str, i: usize) -> String {
    static MAPS: LazyLock<Mutex<HashMap<String, ShardMap>>> = LazyLock::new(Mutex::default);
    let mut maps = MAPS.lock().unwrap();
    let map = maps.entry(prefix.to_string()).or_insert_with(|| shard_map(prefix));
    map.tag(i).to_string()
}

/// Hashes of rewritten script bodies, by the hash of the test's text.
static SCRIPT_HASHES: LazyLock<Mutex<HashMap<String, String>>> = LazyLock::new(Mutex::default);

impl Rewrite<'_> {
    fn forward_tag(&self, t: &str) -> String {
        let p = self.0;
        if t == "muster" {
            p.to_string()
        } else if t == p || t.starts_with(&format!("{p}.")) {
            t.to_string()
        } else {
            format!("{p}.{t}")
        }
    }

    fn back_tag(&self, t: &str) -> String {
        let p = self.0;
        if t == p {
            "muster".to_string()
        } else if let Some(rest) = t.strip_prefix(&format!("{p}.")) {
            rest.to_string()
        } else {
            t.to_string()
        }
    }

    /// Rewrites each `{tag}` whose tag could be a key prefix, and each shard
    /// tag `{tag#i.k}` into shard `i` of the rewritten prefix: `k` depends
    /// on the prefix (`store/shards.rs`), so a shard maps by its index.
    fn tags(&self, b: &[u8], f: impl Fn(&str) -> String) -> Vec<u8> {
        let ok = |c: &u8| c.is_ascii_alphanumeric() || b"._-:".contains(c);
        let mut out = Vec::with_capacity(b.len() + 16);
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'{' {
                let len = b[i + 1..].iter().take_while(|c| ok(c)).count();
                let end = i + 1 + len;
                if len > 0 && end < b.len() && b[end] == b'}' {
                    out.push(b'{');
                    out.extend_from_slice(f(std::str::from_utf8(&b[i + 1..end]).unwrap()).as_bytes());
                    i = end;
                    continue;
                }
                if len > 0 && end < b.len() && b[end] == b'#' {
                    let digits = b[end + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                    let idx = std::str::from_utf8(&b[end + 1..end + 1 + digits]).unwrap();
                    let close = b[end..].iter().position(|&c| c == b'}').map(|c| end + c);
                    if let (Ok(shard), Some(close)) = (idx.parse::<usize>(), close) {
                        let prefix = f(std::str::from_utf8(&b[i + 1..end]).unwrap());
                        out.extend_from_slice(shard_tag(&prefix, shard).as_bytes());
                        i = close + 1;
                        continue;
                    }
                }
            }
            out.push(b[i]);
            i += 1;
        }
        out
    }

    fn reply(&self, v: Value) -> Value {
        let back = |b: Vec<u8>| self.tags(&b, |t| self.back_tag(t));
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
    /// `{<prefix>#...}` and the test's own prefixes `{<prefix>.x}`.
    fn keys_pattern(&self, pattern: &[u8]) -> Vec<u8> {
        if pattern.starts_with(b"{") {
            return pattern.to_vec();
        }
        let mut p = format!("{{{}[}}#.]", self.0).into_bytes();
        p.extend_from_slice(pattern);
        p
    }

    async fn run(&self, c: &mut ClusterConnection, cmd: &Cmd) -> redis::RedisResult<Value> {
        let raw: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => b"0".to_vec(),
            })
            .collect();
        let name = String::from_utf8_lossy(&raw[0]).to_ascii_uppercase();
        let sub = raw.get(1).map(|a| String::from_utf8_lossy(a).to_ascii_uppercase());
        // Which argument is a script body: EVAL's and SCRIPT LOAD's get
        // `{muster}` rewritten, FUNCTION LOAD's (muster's own) nothing.
        let (body, function) = match (name.as_str(), sub.as_deref()) {
            ("EVAL", _) => (Some(1), false),
            ("SCRIPT", Some("LOAD")) => (Some(2), false),
            ("FUNCTION", Some("LOAD")) => (None, true),
            _ => (None, false),
        };
        let mut args: Vec<Vec<u8>> = raw
            .iter()
            .enumerate()
            .map(|(i, a)| {
                if function && i > 0 {
                    a.clone()
                } else if body == Some(i) {
                    let theirs = String::from_utf8_lossy(a).into_owned();
                    let ours = theirs.replace("{muster}", &format!("{{{}}}", self.0));
                    let hash = |t: &str| redis::Script::new(t).get_hash().to_string();
                    SCRIPT_HASHES.lock().unwrap().insert(hash(&theirs), hash(&ours));
                    ours.into_bytes()
                } else {
                    self.tags(a, |t| self.forward_tag(t))
                }
            })
            .collect();
        if name == "EVALSHA"
            && let Some(h) = SCRIPT_HASHES
                .lock()
                .unwrap()
                .get(String::from_utf8_lossy(&args[1]).as_ref())
        {
            args[1] = h.clone().into_bytes();
        }
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
        // Commands without keys go to the master owning shard 0's slot (the
        // prefix's with one shard: the stats, the sessions, the master a
        // node's Redis summary describes);
        // loads go to every master (the default), as muster loads them.
        let keyless = matches!(
            name.as_str(),
            "INFO" | "SLOWLOG" | "TIME" | "SCAN" | "PING" | "CONFIG" | "ACL" | "CLIENT" | "LATENCY"
        ) || (name == "FUNCTION" && !function)
            || (name == "MEMORY" && sub.as_deref() != Some("USAGE"));
        // Split namespaces are on every master: the slow log and its
        // settings are read and set on each (the log entries of every
        // master, combined; a test filters its own by their keys).
        let everywhere =
            super::test_shards() > 1 && (name == "SLOWLOG" || (name == "CONFIG" && sub.as_deref() == Some("SET")));
        let v = if everywhere {
            let policy = if sub.as_deref() == Some("GET") {
                ResponsePolicy::CombineArrays
            } else {
                ResponsePolicy::AllSucceeded
            };
            let to = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, Some(policy)));
            c.route_command(out, to).await?
        } else if keyless {
            let slot = key_slot(&shard_tag(self.0, 0));
            let to = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
            c.route_command(out, RoutingInfo::SingleNode(to)).await?
        } else {
            c.req_packed_command(&out).await?
        };
        if body == Some(2) {
            // The hash of the text the test sent, as redis-rs checks.
            let theirs = String::from_utf8_lossy(&raw[2]).into_owned();
            return Ok(Value::BulkString(redis::Script::new(&theirs).get_hash().into()));
        }
        Ok(self.reply(v))
    }
}

impl ConnectionLike for TestConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            TestConn::Single(c) => c.req_packed_command(cmd),
            TestConn::Cluster(c, p) => Box::pin(async move { Rewrite(p).run(c, cmd).await }),
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
            TestConn::Cluster(c, p) => Box::pin(async move {
                let mut out = Vec::new();
                for cmd in pipeline.cmd_iter() {
                    out.push(Rewrite(p).run(c, cmd).await?);
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
