//! Coordinated failover (G10) with the real `muster` binary: 3 node
//! processes (clients A and B, coordinator C), 2 Redis servers.
//!
//! - One client process stopped (SIGSTOP): no switch, and no node ever uses
//!   a different master from the others; once it runs again (SIGCONT) the
//!   round completes on every node.
//! - The coordinator process SIGKILLed at different points of the failover
//!   (while it is still detecting the master's death, and at each phase of
//!   the round): no two nodes ever use different masters, and once it is
//!   restarted (same id, data dir and config) every node agrees on the
//!   promoted replica and takes writes again.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster::client::FailoverStatus;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::common::ha::TestReplicaSet;
use crate::common::skip_on_cluster;
use crate::common::{free_port, muster_bin};

const SECRET: &str = "a-shared-secret-for-bin-tests";

/// One `muster` process with its own data directory, config file and log.
/// `child` is `None` while the process is down (killed and reaped by the
/// test), so nothing is ever signalled by a pid that may have been reused.
struct NodeProc {
    id: String,
    port: u16,
    url: String,
    dir: TempDir,
    child: Option<Child>,
}

impl NodeProc {
    /// Sends `sig` to the process; false if it is not running.
    fn signal(&self, sig: libc::c_int) -> bool {
        match &self.child {
            // SAFETY: signalling our own child, whose pid we have not reaped yet.
            Some(c) => unsafe { libc::kill(c.id() as i32, sig) == 0 },
            None => false,
        }
    }

    /// SIGKILLs the process and reaps it.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("node.log")).unwrap_or_else(|e| format!("(no log: {e})"))
    }

    /// A file of the node's data directory, trimmed (`redis-master`,
    /// `failover-round`); `None` if it does not exist.
    fn data_file(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.path().join(name))
            .ok()
            .map(|s| s.trim().to_string())
    }
}

/// Every node process; each is SIGCONTed (in case it is stopped) and
/// SIGKILLed on drop, also when the test panics (then their logs are printed).
struct Nodes(Vec<NodeProc>);

impl Drop for Nodes {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        for n in &mut self.0 {
            n.signal(libc::SIGCONT);
            n.kill();
            if panicking {
                let log = n.log();
                let tail: Vec<&str> = log.lines().rev().take(80).collect();
                eprintln!("---- log of node {} (last 80 lines) ----", n.id);
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
    }
}

/// The node's config file: coordinated failover on the replica set, fast
/// heartbeats (as `test_config` uses).
fn write_config(dir: &Path, id: &str, role: &str, set: &TestReplicaSet, clients: &[String]) {
    let list = |v: &[String]| v.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
    let text = format!(
        "[server]\n\
         node_id = {id:?}\n\
         \n\
         [nodes]\n\
         heartbeat_ms = 100\n\
         ttl_ms = 600\n\
         dead_retention_ms = 2000\n\
         \n\
         [orphans]\n\
         interval_ms = 100\n\
         \n\
         [tasks]\n\
         janitor_interval_ms = 200\n\
         \n\
         [events]\n\
         reconcile_ms = 500\n\
         \n\
         [failover]\n\
         role = {role:?}\n\
         redis_servers = [{servers}]\n\
         clients = [{clients}]\n\
         secret = {SECRET:?}\n\
         interval_ms = 1000\n\
         retries = 2\n\
         answer_timeout_ms = 500\n\
         max_backoff_ms = 2000\n\
         republish_ms = 1000\n",
        servers = list(&[set.addr(0), set.addr(1)]),
        clients = list(clients),
    );
    std::fs::write(dir.join("muster.toml"), text).unwrap();
}

/// Starts the binary with the config file and data directory `dir`, on
/// `port`, appending its output to `dir/node.log`.
fn launch(dir: &Path, port: u16) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("node.log"))
        .unwrap();
    Command::new(muster_bin())
        .arg("--config")
        .arg(dir.join("muster.toml"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(dir)
        .current_dir(dir)
        .env_remove("MUSTER_CONFIG")
        .env("RUST_LOG", "warn,muster=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("muster binary")
}

/// Returns once the freshly launched `node` answers `GET /api/v1/failover`.
/// `Err(())` when it exited because its port was taken (`log_from`: where
/// this run's output starts in the log); panics on any other early exit or
/// after 15 s.
async fn wait_started(http: &reqwest::Client, node: &mut NodeProc, log_from: usize) -> Result<(), ()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(c) = node.child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            node.child = None;
            let log = node.log();
            if log.get(log_from..).unwrap_or("").contains("cannot listen") {
                return Err(());
            }
            panic!("node {} exited at start ({status}); its log:\n{log}", node.id);
        }
        if status(http, &node.url).await.is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            node.kill();
            panic!("node {} did not answer within 15 s; its log:\n{}", node.id, node.log());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a node on `port` and returns once `GET /api/v1/failover` answers.
/// Returns `Err(())` when the port was taken in the meantime (the caller
/// picks another one).
async fn try_spawn(
    http: &reqwest::Client,
    id: &str,
    role: &str,
    set: &TestReplicaSet,
    clients: &[String],
    port: u16,
) -> Result<NodeProc, ()> {
    let dir = tempfile::Builder::new().prefix("muster-binnode").tempdir().unwrap();
    write_config(dir.path(), id, role, set, clients);
    let child = launch(dir.path(), port);
    let mut node = NodeProc {
        id: id.to_string(),
        port,
        url: format!("http://127.0.0.1:{port}"),
        dir,
        child: Some(child),
    };
    wait_started(http, &mut node, 0).await?;
    Ok(node)
}

/// [`try_spawn`] on free ports until one is really free.
async fn spawn_node(
    http: &reqwest::Client,
    id: &str,
    role: &str,
    set: &TestReplicaSet,
    clients: &[String],
    port: &mut u16,
) -> NodeProc {
    for _ in 0..5 {
        if let Ok(n) = try_spawn(http, id, role, set, clients, *port).await {
            return n;
        }
        *port = free_port();
    }
    panic!("could not start node {id} on a free port");
}

/// Starts a node that is down again: same node id, config file and data
/// directory (so it finds its master file and newest round), on its old
/// port if that is still free. Returns once it answers.
async fn restart_node(http: &reqwest::Client, node: &mut NodeProc) {
    assert!(node.child.is_none(), "node {} is still running", node.id);
    let mut port = node.port;
    for _ in 0..5 {
        let log_from = node.log().len();
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(node.dir.path().join("node.log"))
            .unwrap();
        std::io::Write::write_all(
            &mut log,
            format!("==== restarted by the test on port {port} ====\n").as_bytes(),
        )
        .unwrap();
        node.port = port;
        node.url = format!("http://127.0.0.1:{port}");
        node.child = Some(launch(node.dir.path(), port));
        if wait_started(http, node, log_from).await.is_ok() {
            return;
        }
        port = free_port();
    }
    panic!("could not restart node {} on a free port", node.id);
}

/// `GET /api/v1/failover` of the node at `url`.
/// Raw (the caller's client and its timeout): asked of node processes while
/// a master or the coordinator is down, where every error is an answer.
async fn status(http: &reqwest::Client, url: &str) -> Result<FailoverStatus, String> {
    let resp = http
        .get(format!("{url}/api/v1/failover"))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let code = resp.status().as_u16();
    let body: Value = resp.json().await.map_err(|e| e.to_string())?;
    if code == 200 {
        serde_json::from_value(body).map_err(|e| e.to_string())
    } else {
        Err(format!("{code}: {body}"))
    }
}

async fn master_of(http: &reqwest::Client, n: &NodeProc) -> String {
    match status(http, &n.url).await {
        Ok(b) => b.master,
        Err(e) => panic!("GET /api/v1/failover on {} failed: {e}", n.id),
    }
}

/// Polls every 100 ms until every node reports `master`, or panics after `within`.
async fn wait_all_master(http: &reqwest::Client, nodes: &[&NodeProc], master: &str, within: Duration) -> Duration {
    let started = Instant::now();
    let mut last = Vec::new();
    while started.elapsed() < within {
        last.clear();
        for n in nodes {
            let m = match status(http, &n.url).await {
                Ok(b) => b.master,
                Err(e) => format!("(error: {e})"),
            };
            last.push((n.id.clone(), m));
        }
        if last.iter().all(|(_, m)| m == master) {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not every node reported master {master} within {within:?}: {last:?}");
}

/// `ROLE` of a Redis server as `INFO replication` says it: `master`,
/// `slave`, or `""` when it does not answer.
fn redis_role(port: u16) -> String {
    crate::common::ha::info(port, "replication")
        .into_iter()
        .find(|(k, _)| k == "role")
        .map(|(_, v)| v)
        .unwrap_or_default()
}

/// Wall clock in ms, as the nodes number their rounds.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `POST /api/v1/queues/{q}/tasks` with an empty payload; the status code.
async fn enqueue(http: &reqwest::Client, url: &str, q: &str) -> Result<u16, String> {
    http.post(format!("{url}/api/v1/queues/{q}/tasks"))
        .json(&json!({"payload": {}}))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string())
}

/// One client process stopped (SIGSTOP, as an unreachable node): every
/// round is cancelled at `ping` naming it, the replica is never promoted,
/// and no node uses another master. After SIGCONT the next round completes
/// and all three nodes use the promoted replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinated_no_switch_while_a_client_process_is_stopped() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let t0 = Instant::now();
    let mut set = TestReplicaSet::start(1);
    let p = std::process::id();
    let (c, a, b) = (format!("bcoord-{p}"), format!("bcla-{p}"), format!("bclb-{p}"));
    // Short per-request timeout: a stuck node must fail the poll, not hang it.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();

    let (mut pa, mut pb, mut pc) = (free_port(), free_port(), free_port());
    let mut nodes = Nodes(Vec::new());
    nodes.0.push(spawn_node(&http, &a, "client", &set, &[], &mut pa).await);
    nodes.0.push(spawn_node(&http, &b, "client", &set, &[], &mut pb).await);
    let clients = vec![
        format!("{a}=http://127.0.0.1:{pa}"),
        format!("{b}=http://127.0.0.1:{pb}"),
    ];
    nodes
        .0
        .push(spawn_node(&http, &c, "coordinator", &set, &clients, &mut pc).await);
    let (na, nb, nc) = (&nodes.0[0], &nodes.0[1], &nodes.0[2]);

    let old = set.addr(0);
    let replica = set.addr(1);
    wait_all_master(&http, &[na, nb, nc], &old, Duration::from_secs(10)).await;
    // The coordinator watches server 0 and knows both clients' URLs.
    let st = status(&http, &nc.url).await.unwrap();
    let coordinator = st.coordinator.as_ref().expect("the coordinator's side");
    assert_eq!(coordinator.master, old, "{st:?}");
    for (id, port) in [(&a, pa), (&b, pb)] {
        assert_eq!(
            coordinator.clients.get(id.as_str()),
            Some(&format!("http://127.0.0.1:{port}")),
            "{st:?}"
        );
    }
    eprintln!("nodes up and agreeing on {old} after {} ms", t0.elapsed().as_millis());

    // Stop client B's process, then crash the master.
    assert!(nb.signal(libc::SIGSTOP));
    set.kill(0);
    let killed = Instant::now();

    // Rounds run (and are cancelled) every 1-3 s; watch for 6 s. With the
    // master down a status call takes a while (its reads retry), so a request
    // goes to A and to C every 100 ms without waiting for the previous one:
    // each answer is the node's master at that moment.
    let mut probes = tokio::task::JoinSet::new();
    let mut role_checks = 0;
    let mut seen = 0;
    let mut slowest = Duration::ZERO;
    let mut check = |r: Result<Result<(String, String, Duration), String>, tokio::task::JoinError>| {
        let (id, m, took) = r.unwrap().unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(m, replica, "{id} switched although {b} never confirmed");
        assert_eq!(m, old, "{id} uses no master, or another one");
        seen += 1;
        slowest = slowest.max(took);
    };
    while killed.elapsed() < Duration::from_secs(6) {
        assert_eq!(
            set.role(set.port(1)),
            "slave",
            "the replica was promoted while {b} is stopped"
        );
        role_checks += 1;
        for n in [na, nc] {
            let (http, url, id) = (http.clone(), n.url.clone(), n.id.clone());
            probes.spawn(async move {
                let sent = Instant::now();
                let st = status(&http, &url)
                    .await
                    .map_err(|e| format!("GET /api/v1/failover on {id} failed: {e}"))?;
                Ok((id, st.master, sent.elapsed()))
            });
        }
        while let Some(r) = probes.try_join_next() {
            check(r);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while let Some(r) = probes.join_next().await {
        check(r);
    }
    eprintln!(
        "watched 6 s: {role_checks} replica role checks, {seen} master answers from A and C (slowest {} ms)",
        slowest.as_millis()
    );
    let st = status(&http, &nc.url).await.unwrap();
    let history = &st.coordinator.as_ref().unwrap().history;
    assert!(!history.is_empty(), "no round was attempted: {st:?}");
    for r in history {
        assert_eq!(r.phase, "cancelled", "{st:?}");
        assert!(r.result.contains(b.as_str()), "{r:?}");
    }
    eprintln!(
        "{} cancelled round(s) and no switch in 6 s; first: {:?}",
        history.len(),
        history.last().unwrap().result
    );
    // Cancelled at ping: nobody was invalidated, A and C still agree on server 0.
    assert_eq!(master_of(&http, na).await, old);
    assert_eq!(master_of(&http, nc).await, old);

    // B runs again: every client answers, the next round completes.
    assert!(nb.signal(libc::SIGCONT));
    let resumed = Instant::now();
    let took = wait_all_master(&http, &[na, nb, nc], &replica, Duration::from_secs(15)).await;
    eprintln!("SIGCONT -> all three nodes on {replica}: {} ms", took.as_millis());
    assert_eq!(set.role(set.port(1)), "master");
    let st = status(&http, &nc.url).await.unwrap();
    let round = &st.coordinator.as_ref().unwrap().history[0];
    assert_eq!(round.phase, "done", "{st:?}");
    for id in [&a, &b, &c] {
        assert_eq!(
            round.answers.get(id.as_str()).map(String::as_str),
            Some("reconfigured"),
            "{st:?}"
        );
    }
    eprintln!(
        "recovered {} ms after SIGCONT; test took {} ms",
        resumed.elapsed().as_millis(),
        t0.elapsed().as_millis()
    );
}

// ---------------------------------------------------------------------------
// The coordinator killed during a failover
// ---------------------------------------------------------------------------

mod coordinator_kill;
