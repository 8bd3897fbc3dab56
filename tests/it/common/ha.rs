//! High-availability fixtures: a master with replicas, Sentinels watching it,
//! and a Redis Cluster, all real `redis-server` processes on free loopback
//! ports (never 6379) with private temporary directories, SIGKILLed on drop.
//!
//! Every start waits for the topology to be ready (replication links up,
//! Sentinels aware of each other and of the replicas, `cluster_state:ok` on
//! every node) by polling, never by fixed sleeps, and panics with the
//! relevant logs when a deadline passes.
//!
//! The cluster is created the way a user would create one; for three nodes
//! the harness runs exactly:
//!
//! ```text
//! redis-cli --cluster create 127.0.0.1:P1 127.0.0.1:P2 127.0.0.1:P3 --cluster-replicas 0 --cluster-yes
//! ```
//!
//! with each node started as
//! `redis-server --port P --cluster-enabled yes --cluster-config-file DIR/nodes-P.conf --cluster-node-timeout 2000`
//! (plus the usual `--bind 127.0.0.1 --save "" --appendonly no`).
//!
//! The binaries are `redis-server` (or `$MUSTER_TEST_REDIS_BIN`) and
//! `redis-cli` from PATH.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{TestRedis, free_port, ping, process_alive, redis_bin};

/// How long a start may take before the fixture panics.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// Connect / read / write timeout of the short-lived control connections.
const CONTROL_TIMEOUT: Duration = Duration::from_millis(500);

/// Runs one command on `127.0.0.1:port` over a fresh synchronous connection
/// with short timeouts; `None` if the server is unreachable or answers with
/// an error.
pub fn query<T: redis::FromRedisValue>(port: u16, args: &[&str]) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client.get_connection_with_timeout(CONTROL_TIMEOUT).ok()?;
    conn.set_read_timeout(Some(CONTROL_TIMEOUT)).ok()?;
    conn.set_write_timeout(Some(CONTROL_TIMEOUT)).ok()?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut conn).ok()
}

/// `INFO <section>` of a server as `field -> value` pairs ("" lines and
/// `# Section` headers dropped); empty if unreachable.
pub fn info(port: u16, section: &str) -> Vec<(String, String)> {
    let text: String = query(port, &["INFO", section]).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    info(port, section)
        .into_iter()
        .find(|(k, _)| k == field)
        .map(|(_, v)| v)
}

/// Polls `cond` every 20 ms until it holds or `within` passes.
fn poll(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn log_of(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| format!("(no {name}: {e})"))
}

fn redis_alive(r: &TestRedis) -> bool {
    r.child.as_ref().is_some_and(|c| process_alive(c.id()))
}

// ---------------------------------------------------------------------------
// Master + replicas
// ---------------------------------------------------------------------------

/// One master and N replicas (`--replicaof`), diskless full sync, no
/// persistence. Index 0 is the initial master; indexes stay fixed across
/// failovers (use [`TestReplicaSet::master_port`] for the current master).
pub struct TestReplicaSet {
    servers: Vec<TestRedis>,
}

/// On top of `TestRedis`'s own `--save "" --appendonly no`.
const REPL_ARGS: [&str; 6] = [
    "--repl-diskless-sync",
    "yes",
    "--repl-diskless-sync-delay",
    "0",
    "--replica-serve-stale-data",
    "yes",
];

impl TestReplicaSet {
    /// Starts a master and `replicas` replicas and returns once every replica
    /// reports `master_link_status:up`.
    pub fn start(replicas: usize) -> TestReplicaSet {
        let master = TestRedis::start_with(&REPL_ARGS);
        let mport = master.port.to_string();
        let mut servers = vec![master];
        for _ in 0..replicas {
            let mut args = REPL_ARGS.to_vec();
            args.extend(["--replicaof", "127.0.0.1", &mport]);
            servers.push(TestRedis::start_with(&args));
        }
        let set = TestReplicaSet { servers };
        for i in 1..set.servers.len() {
            let port = set.servers[i].port;
            let up = poll(READY_WITHIN, || {
                info_field(port, "replication", "master_link_status").as_deref() == Some("up")
            });
            if !up {
                panic!(
                    "replica {i} (port {port}) never reported master_link_status:up within {READY_WITHIN:?}\n\
                     replica log:\n{}\nmaster log:\n{}",
                    log_of(set.servers[i].dir.path(), "redis.log"),
                    log_of(set.servers[0].dir.path(), "redis.log"),
                );
            }
        }
        set
    }

    /// Every server's port; index 0 is the initial master.
    pub fn ports(&self) -> Vec<u16> {
        self.servers.iter().map(|s| s.port).collect()
    }

    pub fn port(&self, i: usize) -> u16 {
        self.servers[i].port
    }

    /// `"127.0.0.1:port"` of server `i`.
    pub fn addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.servers[i].port)
    }

    /// `"redis://127.0.0.1:port"` of server `i`.
    pub fn url(&self, i: usize) -> String {
        self.servers[i].url()
    }

    /// SIGKILLs server `i`, as a crash would.
    pub fn kill(&mut self, i: usize) {
        self.servers[i].kill();
    }

    /// Starts server `i` again on its port with its original arguments: a
    /// former master comes back as a master, a replica as a replica of the
    /// *initial* master (with Sentinels running, they reconfigure either).
    pub fn restart(&mut self, i: usize) {
        self.servers[i].restart();
    }

    pub fn is_alive(&self, i: usize) -> bool {
        redis_alive(&self.servers[i])
    }

    /// `"master"`, `"slave"`, or `""` if the server does not answer.
    pub fn role(&self, port: u16) -> String {
        info_field(port, "replication", "role").unwrap_or_default()
    }

    /// The port of the one live server that reports role master; `None` if
    /// there is none, or more than one (e.g. a restarted old master that
    /// Sentinel has not demoted yet).
    pub fn master_port(&self) -> Option<u16> {
        let masters: Vec<u16> = (0..self.servers.len())
            .filter(|&i| self.is_alive(i))
            .map(|i| self.servers[i].port)
            .filter(|&p| self.role(p) == "master")
            .collect();
        match masters[..] {
            [p] => Some(p),
            _ => None,
        }
    }

    /// Server `i` itself, for `url()`, `client()`, `cmd()`, its directory...
    pub fn server(&self, i: usize) -> &TestRedis {
        &self.servers[i]
    }
}

// ---------------------------------------------------------------------------
// Sentinels
// ---------------------------------------------------------------------------

/// One `redis-server --sentinel` process with its own config file and log.
struct Sentinel {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl Sentinel {
    fn start(master_name: &str, master_port: u16, quorum: usize) -> Sentinel {
        for _ in 0..5 {
            let dir = tempfile::Builder::new().prefix("muster-sentinel").tempdir().unwrap();
            let port = free_port();
            let conf = dir.path().join("sentinel.conf");
            let log = dir.path().join("sentinel.log");
            let text = format!(
                "port {port}\n\
                 bind 127.0.0.1\n\
                 daemonize no\n\
                 dir {dir}\n\
                 logfile {log}\n\
                 sentinel resolve-hostnames no\n\
                 sentinel monitor {master_name} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {master_name} 1000\n\
                 sentinel failover-timeout {master_name} 5000\n\
                 sentinel parallel-syncs {master_name} 1\n",
                dir = dir.path().display(),
                log = log.display(),
            );
            std::fs::write(&conf, text).unwrap();
            let mut child = Command::new(redis_bin())
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server must be installed (apt-get install -y redis-server)");
            let deadline = Instant::now() + Duration::from_secs(10);
            let started = loop {
                if let Ok(Some(_)) = child.try_wait() {
                    let text = log_of(dir.path(), "sentinel.log");
                    if text.contains("Address already in use") {
                        break false;
                    }
                    panic!("redis-server --sentinel exited at start; its log:\n{text}");
                }
                if ping(port) {
                    break true;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "sentinel did not answer PING within 10 s; its log:\n{}",
                        log_of(dir.path(), "sentinel.log")
                    );
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            if started {
                return Sentinel {
                    port,
                    dir,
                    child: Some(child),
                };
            }
        }
        panic!("could not start a sentinel on a free port");
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn alive(&self) -> bool {
        self.child.as_ref().is_some_and(|c| process_alive(c.id()))
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sentinels monitoring a [`TestReplicaSet`] under one master name, with a
/// 1 s down-after, 5 s failover timeout and quorum 2 (1 when alone).
pub struct TestSentinels {
    sentinels: Vec<Sentinel>,
    master_name: String,
}

/// `SENTINEL replicas|sentinels <name>` entries as field -> value maps.
fn sentinel_entries(port: u16, what: &str, name: &str) -> Option<Vec<Vec<(String, String)>>> {
    let rows: Vec<Vec<String>> = query(port, &["SENTINEL", what, name])?;
    Some(
        rows.into_iter()
            .map(|r| {
                r.chunks(2)
                    .filter(|p| p.len() == 2)
                    .map(|p| (p[0].clone(), p[1].clone()))
                    .collect()
            })
            .collect(),
    )
}

fn field<'a>(entry: &'a [(String, String)], name: &str) -> Option<&'a str> {
    entry.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

impl TestSentinels {
    /// Starts `count` Sentinels on the current master of `set` and returns
    /// once each one names that master, knows the other `count - 1`
    /// Sentinels and sees every live replica (flags exactly `slave`).
    pub fn start(set: &TestReplicaSet, count: usize, master_name: &str) -> TestSentinels {
        assert!(count >= 1, "at least one sentinel");
        let master_port = set.master_port().expect("the replica set has one master");
        let quorum = count.min(2);
        let sentinels: Vec<Sentinel> = (0..count)
            .map(|_| Sentinel::start(master_name, master_port, quorum))
            .collect();
        let replicas = (0..set.ports().len())
            .filter(|&i| set.is_alive(i) && set.port(i) != master_port)
            .count();
        let me = TestSentinels {
            sentinels,
            master_name: master_name.to_string(),
        };
        let want = format!("127.0.0.1:{master_port}");
        for (i, s) in me.sentinels.iter().enumerate() {
            let mut last = String::new();
            let ready = poll(READY_WITHIN, || {
                let master = me.master_addr_at(i);
                let peers = sentinel_entries(s.port, "sentinels", master_name);
                let reps = sentinel_entries(s.port, "replicas", master_name);
                let peers_n = peers.as_ref().map_or(0, |p| p.len());
                let reps_ok = reps
                    .as_ref()
                    .map_or(0, |r| r.iter().filter(|e| field(e, "flags") == Some("slave")).count());
                last = format!(
                    "master {master:?} (want {want}), {peers_n}/{} other sentinels, {reps_ok}/{replicas} healthy replicas",
                    count - 1
                );
                master.as_deref() == Some(want.as_str()) && peers_n == count - 1 && reps_ok == replicas
            });
            if !ready {
                panic!(
                    "sentinel {i} (port {}) not ready within {READY_WITHIN:?}: {last}\nits log:\n{}",
                    s.port,
                    log_of(s.dir.path(), "sentinel.log")
                );
            }
        }
        me
    }

    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// `"127.0.0.1:port"` of every Sentinel (killed ones included).
    pub fn addrs(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect()
    }

    pub fn ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// What Sentinel `i` answers to `SENTINEL get-master-addr-by-name`, as
    /// `"ip:port"`; `None` if it is unreachable or knows no master.
    pub fn master_addr_at(&self, i: usize) -> Option<String> {
        let (ip, port): (String, String) = query::<Option<(String, String)>>(
            self.sentinels[i].port,
            &["SENTINEL", "get-master-addr-by-name", &self.master_name],
        )??;
        Some(format!("{ip}:{port}"))
    }

    /// The master address according to the first live Sentinel that answers.
    pub fn master_addr(&self) -> Option<String> {
        (0..self.sentinels.len())
            .filter(|&i| self.sentinels[i].alive())
            .find_map(|i| self.master_addr_at(i))
    }

    /// SIGKILLs Sentinel `i`.
    pub fn kill(&mut self, i: usize) {
        self.sentinels[i].kill();
    }

    pub fn is_alive(&self, i: usize) -> bool {
        self.sentinels[i].alive()
    }

    /// Sentinel `i`'s log (for assertion messages).
    pub fn log(&self, i: usize) -> String {
        log_of(self.sentinels[i].dir.path(), "sentinel.log")
    }
}

// ---------------------------------------------------------------------------
// Cluster
// ---------------------------------------------------------------------------

/// A free port usable by a cluster node: at most 55535 (Redis refuses higher
/// ones) with its cluster-bus port (+10000) free too at the time of asking.
fn free_cluster_port() -> u16 {
    loop {
        let p = free_port();
        if p <= 55535 && std::net::TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
}

/// A Redis Cluster of N masters (no replicas) covering all 16384 slots.
pub struct TestCluster {
    nodes: Vec<TestRedis>,
    dir: TempDir,
    opts: ClusterOpts,
}

/// How a [`TestCluster`] is started.
#[derive(Clone)]
pub struct ClusterOpts {
    pub masters: usize,
    /// Picks each node's data port (below 22768: the bus adds 10000).
    pub pick: fn() -> u16,
    /// `cluster-node-timeout`: how long a master may not answer before the
    /// others mark it failed (and a replica takes over).
    pub node_timeout_ms: u64,
    /// `cluster-require-full-coverage`: with `false` the masters that hold
    /// their slots keep serving while another is failed, as failure
    /// isolation needs (`docs/sharding.md`).
    pub full_coverage: bool,
    /// Masters (by index) whose clock runs ahead (or behind) by this many ms.
    pub skew_ms: Vec<(usize, i64)>,
}

impl Default for ClusterOpts {
    fn default() -> Self {
        ClusterOpts {
            masters: 3,
            pick: free_cluster_port,
            node_timeout_ms: 2000,
            full_coverage: true,
            skew_ms: Vec::new(),
        }
    }
}

impl TestCluster {
    /// Starts `masters` (at least 3) cluster-enabled servers, joins them with
    /// `redis-cli --cluster create`, and returns once every node reports
    /// `cluster_state:ok` and knows all the others.
    pub fn start(masters: usize) -> TestCluster {
        Self::start_with_ports(masters, free_cluster_port)
    }

    /// As [`TestCluster::start`], with data ports drawn by `pick`.
    pub fn start_with_ports(masters: usize, pick: fn() -> u16) -> TestCluster {
        Self::start_opts(ClusterOpts {
            masters,
            pick,
            ..ClusterOpts::default()
        })
    }

    /// As [`TestCluster::start`], with the options of `opts`.
    pub fn start_opts(opts: ClusterOpts) -> TestCluster {
        let ClusterOpts { masters, pick, .. } = opts;
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 masters, got {masters}"
        );
        let dir = tempfile::Builder::new().prefix("muster-cluster").tempdir().unwrap();
        let nodes: Vec<TestRedis> = (0..masters)
            .map(|i| {
                let skew = opts.skew_ms.iter().find(|(m, _)| *m == i).map_or(0, |(_, ms)| *ms);
                Self::start_node(dir.path(), pick, &opts, skew)
            })
            .collect();
        let cluster = TestCluster { nodes, dir, opts };

        let out_path = cluster.dir.path().join("redis-cli.out");
        let out = std::fs::File::create(&out_path).unwrap();
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        cmd.args(cluster.seeds());
        cmd.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("redis-cli is installed with redis-server");
        let deadline = Instant::now() + READY_WITHIN;
        let status = loop {
            if let Ok(Some(st)) = child.try_wait() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "redis-cli --cluster create did not finish within {READY_WITHIN:?}; its output:\n{}",
                    log_of(cluster.dir.path(), "redis-cli.out")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if !status.success() {
            panic!(
                "redis-cli --cluster create failed ({status}); its output:\n{}",
                log_of(cluster.dir.path(), "redis-cli.out")
            );
        }

        for n in &cluster.nodes {
            let mut last = Vec::new();
            let ok = poll(READY_WITHIN, || {
                last = info_cluster(n.port);
                let get = |f: &str| last.iter().find(|(k, _)| k == f).map(|(_, v)| v.as_str());
                get("cluster_state") == Some("ok")
                    && get("cluster_known_nodes") == Some(&masters.to_string())
                    && get("cluster_slots_ok") == Some("16384")
            });
            if !ok {
                panic!(
                    "cluster node {} not ok within {READY_WITHIN:?}: {last:?}\nits log:\n{}",
                    n.port,
                    log_of(n.dir.path(), "redis.log")
                );
            }
        }
        cluster
    }

    fn start_node(shared: &Path, pick: fn() -> u16, opts: &ClusterOpts, skew_ms: i64) -> TestRedis {
        for _ in 0..5 {
            let port = pick();
            let conf = shared.join(format!("nodes-{port}.conf"));
            let _ = std::fs::remove_file(&conf);
            let mut extra: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &conf.to_string_lossy(),
                "--cluster-node-timeout",
                &opts.node_timeout_ms.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if !opts.full_coverage {
                extra.extend(["--cluster-require-full-coverage".to_string(), "no".to_string()]);
            }
            let mut r = TestRedis {
                port,
                dir: tempfile::Builder::new().prefix("muster-redis").tempdir().unwrap(),
                child: None,
                ns: None,
                env: if skew_ms != 0 {
                    super::skew::env(skew_ms)
                } else {
                    Vec::new()
                },
                extra,
            };
            if r.spawn() {
                return r;
            }
        }
        panic!("could not start a cluster node on a free port");
    }

    /// `"127.0.0.1:port"` of every node.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect()
    }

    /// `"redis://127.0.0.1:port"` of every node (what `ClusterClient::new` takes).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// SIGKILLs node `i`.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Node `i` itself (to freeze it).
    pub fn node(&self, i: usize) -> &TestRedis {
        &self.nodes[i]
    }

    /// Starts node `i` again (after [`TestCluster::kill`]) on its port and
    /// with its cluster config: a master that was failed over rejoins as a
    /// replica of the one that took its slots.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].restart();
    }

    /// Adds a replica of node `master` (the documented way: `CLUSTER MEET`,
    /// then `CLUSTER REPLICATE <id>`) and returns its index once its link to
    /// the master is up.
    pub fn add_replica(&mut self, master: usize) -> usize {
        let n = Self::start_node(self.dir.path(), free_cluster_port, &self.opts, 0);
        let port = n.port;
        let master_port = self.nodes[master].port;
        let master_id: String = query(master_port, &["CLUSTER", "MYID"]).expect("CLUSTER MYID");
        let _: String = query(port, &["CLUSTER", "MEET", "127.0.0.1", &master_port.to_string()]).expect("MEET");
        self.nodes.push(n);
        let known = self.nodes.len().to_string();
        assert!(
            poll(READY_WITHIN, || info_cluster(port)
                .iter()
                .any(|(k, v)| k == "cluster_known_nodes" && *v == known)),
            "the new node {port} never learned the cluster"
        );
        let replicated = poll(READY_WITHIN, || {
            query::<String>(port, &["CLUSTER", "REPLICATE", &master_id]).is_some()
        }) && poll(READY_WITHIN, || {
            info(port, "replication")
                .iter()
                .any(|(k, v)| k == "master_link_status" && v == "up")
        });
        assert!(replicated, "node {port} never became a replica of {master_port}");
        self.nodes.len() - 1
    }

    pub fn is_alive(&self, i: usize) -> bool {
        redis_alive(&self.nodes[i])
    }
}

/// `CLUSTER INFO` as `field -> value` pairs; empty if unreachable.
fn info_cluster(port: u16) -> Vec<(String, String)> {
    let text: String = query(port, &["CLUSTER", "INFO"]).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
