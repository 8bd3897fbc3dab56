//! "Acknowledged means replicated" (issue 20, `redis.ack_replicas`, the
//! `Durability` header) against real masters, replicas and Sentinels.
//!
//! - The proof: a client submits continuously; the master is cut off from
//!   its replica (and its Sentinel) and then killed, or only cut off while
//!   the node keeps writing to it (the Jepsen partition); after the
//!   failover every task that got a 201 is on the new master. With
//!   `ack_replicas = 1`: 0 lost, every round. With 0: the same schedule
//!   loses tasks, so the test can fail.
//! - A shortfall is a 503 problem with `replicated: false`, the task id and
//!   `Retry-After`; a replay of the same idempotency key, or a change that
//!   finds its work already done, is not confirmed either while the replica
//!   is still behind, and is once it caught up; the header asks for it per request; a bad value
//!   is a 400; the metrics count waits and shortfalls.
//! - Cluster: the wait reaches the master of the namespace's slot (the only
//!   one with a replica), not every master.
//!
//! The cut is made with ACLs, so it is exact and needs no proxy (a Sentinel
//! would re-point a replica that replicates through one): the node signs in
//! as user `muster` on both servers; the replica's link and the Sentinel use
//! the `default` user, which the test turns off on the master and whose
//! connections it kills (`ACL SETUSER default off`, `CLIENT KILL USER
//! default`). For the replica and the Sentinel the master is then gone; the
//! node still reaches it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster::client::Submitted;
use muster::config::Config;
use serde_json::{Value, json};

use crate::common::ha::{TestReplicaSet, TestSentinels};
use crate::common::skip_on_cluster;
use crate::common::*;

const USER: &str = "muster";
const PASSWORD: &str = "durability-test";

/// Runs one command as user `muster` (the only user the cut leaves in).
fn as_muster(port: u16, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let client = redis::Client::open(format!("redis://{USER}:{PASSWORD}@127.0.0.1:{port}"))?;
    let mut c = client.get_connection_with_timeout(Duration::from_secs(2))?;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut c)
}

/// Creates user `muster` on a server (ACLs are not replicated).
fn add_user(port: u16) {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut c = client.get_connection_with_timeout(Duration::from_secs(2)).unwrap();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(USER)
        .arg("on")
        .arg(format!(">{PASSWORD}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query(&mut c)
        .unwrap();
}

/// Cuts the master at `port` off from its replicas and Sentinels (see the
/// module header); the node, signed in as `muster`, keeps its connections.
fn cut_off(port: u16) {
    as_muster(port, &["ACL", "SETUSER", "default", "off"]).unwrap();
    as_muster(port, &["CLIENT", "KILL", "USER", "default"]).unwrap();
}

fn sentinel_config(sentinels: &TestSentinels, dir: &std::path::Path, ack_replicas: u32) -> Config {
    let mut cfg = test_config("", dir);
    cfg.redis.url = String::new();
    cfg.redis.sentinels = sentinels.addrs();
    cfg.redis.master_name = sentinels.master_name().to_string();
    cfg.redis.username = USER.into();
    cfg.redis.password = PASSWORD.into();
    cfg.redis.sentinel_poll_ms = 200;
    cfg.redis.ack_replicas = ack_replicas;
    cfg.redis.ack_timeout_ms = 200;
    cfg
}

/// A POST whose transport error or slow answer is `None` (during a failover
/// the workload goes on).
async fn try_post(app: &TestApp, path: &str, body: Value) -> Option<(u16, Value)> {
    let resp = app
        .request(reqwest::Method::POST, path)
        .json(&body)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    let status = resp.status().as_u16();
    let text = resp.text().await.ok()?;
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// What the submitters saw: the ids answered 201, and the other answers.
#[derive(Default)]
struct Seen {
    created: Vec<String>,
    not_replicated: usize,
    other: usize,
}

/// How the master is lost in a round.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Cut off from its replica and Sentinel, then SIGKILLed 300 ms later.
    Kill,
    /// Cut off from its replica and Sentinel right after a 201, and left
    /// running: the node writes to it until it follows the failover.
    Partition,
}

/// One round: a fresh master, replica and Sentinel; three submitters; the
/// fault; the failover; then every 201'd task is looked up on the new
/// master. Returns (acknowledged, lost).
async fn round(fault: Fault, ack_replicas: u32) -> (usize, Vec<String>) {
    let t0 = Instant::now();
    let mut set = TestReplicaSet::start(1);
    for p in set.ports() {
        add_user(p);
    }
    let sentinels = TestSentinels::start(&set, 1, &format!("muster-dur-{}", free_port()));
    let (old, new) = (set.addr(0), set.addr(1));
    let dir = tempfile::Builder::new().prefix("muster-node").tempdir().unwrap();
    let cfg = sentinel_config(&sentinels, dir.path(), ack_replicas);
    let app = Arc::new(TestApp::start_config(cfg, dir).await);
    eprintln!(
        "{fault:?} ack_replicas={ack_replicas}: topology and node up in {:?}",
        t0.elapsed()
    );

    let seen: Arc<Mutex<Seen>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut submitters = Vec::new();
    for k in 0..3u32 {
        let (app, seen, stop) = (app.clone(), seen.clone(), stop.clone());
        submitters.push(tokio::spawn(async move {
            let mut i = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let r = try_post(&app, "/api/v1/queues/dur/tasks", json!({"payload": {"k": k, "i": i}})).await;
                i += 1;
                let mut return_pause = false;
                let pause = {
                    let mut s = seen.lock().unwrap();
                    match r {
                        Some((201, b)) => s.created.push(serde_json::from_value::<Submitted>(b).unwrap().id),
                        Some((503, b)) if b["replicated"] == false => s.not_replicated += 1,
                        _ => {
                            s.other += 1;
                            return_pause = true;
                        }
                    }
                    return_pause
                };
                if pause {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }));
    }
    // Let some writes be confirmed first.
    assert!(
        wait_until(Duration::from_secs(10), || async {
            seen.lock().unwrap().created.len() >= 30
        })
        .await,
        "no 201 within 10 s before the fault"
    );
    // Right after an acknowledgement: the next 201 seen.
    let before = seen.lock().unwrap().created.len();
    wait_until(Duration::from_secs(5), || async {
        seen.lock().unwrap().created.len() > before
    })
    .await;
    cut_off(set.port(0));
    let cut_at = seen.lock().unwrap().created.len();
    if let Fault::Kill = fault {
        tokio::time::sleep(Duration::from_millis(300)).await;
        set.kill(0);
    }
    // The failover, and the node following it.
    let followed = wait_until(Duration::from_secs(20), || async {
        let st = app.api().failover_status().await;
        st.is_ok_and(|st| st.master == new)
    })
    .await;
    assert!(
        followed,
        "the node did not follow {old} -> {new} within 20 s; sentinel says {:?}\n{}",
        sentinels.master_addr(),
        sentinels.log(0)
    );
    // Writes go on a moment on the new master (which has no replica now).
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for s in submitters {
        s.await.unwrap();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let mut lost = Vec::new();
    for id in &seen.created {
        let (s, _) = app.get(&format!("/api/v1/tasks/{id}")).await;
        match s {
            200 => {}
            404 => lost.push(id.clone()),
            other => panic!("GET task {id} on the new master answered {other}"),
        }
    }
    eprintln!(
        "{fault:?} ack_replicas={ack_replicas}: {} acknowledged ({cut_at} before the cut), {} lost, {} answered \
         503 replicated:false, {} other answers; round took {:?}",
        seen.created.len(),
        lost.len(),
        seen.not_replicated,
        seen.other,
        t0.elapsed()
    );
    (seen.created.len(), lost)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_tasks_survive_a_master_kill_and_a_partition() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    // ack_replicas = 1: nothing acknowledged is lost, whichever way the
    // master goes, over several rounds.
    for fault in [Fault::Kill, Fault::Partition, Fault::Kill] {
        let (acked, lost) = round(fault, 1).await;
        assert!(
            acked >= 30,
            "{fault:?}: too few acknowledged submits to prove anything ({acked})"
        );
        assert!(
            lost.is_empty(),
            "{fault:?} with ack_replicas=1: {} of {acked} acknowledged tasks are not on the new master: {lost:?}",
            lost.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_replicated_acks_the_same_faults_lose_tasks() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    // The control: ack_replicas = 0 under the same schedule loses
    // acknowledged tasks, so the test above can fail.
    for fault in [Fault::Kill, Fault::Partition] {
        let (acked, lost) = round(fault, 0).await;
        assert!(
            !lost.is_empty(),
            "{fault:?} with ack_replicas=0: expected acknowledged tasks to be lost, but all {acked} survived"
        );
    }
}

// ---------------------------------------------------------------------------
// The answers: shortfall, replay, header, metrics, the document
// ---------------------------------------------------------------------------

async fn post_with(
    app: &TestApp,
    path: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let mut req = app.request(reqwest::Method::POST, path).json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null), headers)
}

fn replicas_header(h: &reqwest::header::HeaderMap) -> Option<String> {
    h.get("durability-replicas").map(|v| v.to_str().unwrap().to_string())
}

/// The value of an unlabelled metric (or of one labelled series) in `/metrics`.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shortfall_is_a_503_and_the_header_asks_per_request() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let set = TestReplicaSet::start(1);
    // The replica must be online at the master before the first confirmed
    // submit, or WAIT counts 0 replicas and the 201 below is a shortfall.
    let online = wait_until(Duration::from_secs(20), || async {
        crate::common::ha::info(set.port(0), "replication")
            .iter()
            .any(|(k, v)| k.starts_with("slave") && v.contains("state=online"))
    })
    .await;
    assert!(online, "the replica never came online at the master");
    // A node that waits for one replica on every change, and one that waits
    // only when asked. The confirmed calls go to nodes that wait up to 2 s
    // (a replica's acknowledgement took over 300 ms once on a loaded
    // machine); the shortfalls to nodes that give up after 300 ms, so the
    // replica's freeze covers them all.
    let node = |ack_replicas: u32, ack_timeout_ms: u64| {
        TestApp::start_with(set.server(0), move |c| {
            c.redis.ack_replicas = ack_replicas;
            c.redis.ack_timeout_ms = ack_timeout_ms;
        })
    };
    let always = node(1, 2000).await;
    let on_request = node(0, 2000).await;
    let always_short = node(1, 300).await;
    let on_request_short = node(0, 300).await;
    let submit = "/api/v1/queues/dur/tasks";

    // Confirmed: 201 with the number of replicas that confirmed.
    let (s, b, h) = post_with(&always, submit, &[], json!({"payload": 1})).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(replicas_header(&h).as_deref(), Some("1"));
    // Without the header the second node does not wait, with it it does.
    let (s, b, h) = post_with(&on_request, submit, &[], json!({"payload": 2})).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(replicas_header(&h), None, "a node with ack_replicas=0 waited unasked");
    let (s, b, h) = post_with(
        &on_request,
        submit,
        &[("Durability", "replicated")],
        json!({"payload": 3}),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(replicas_header(&h).as_deref(), Some("1"));
    // A lock acquire is one of the acknowledged changes too.
    let (s, b, h) = post_with(
        &on_request,
        "/api/v1/locks/dur-lock/acquire",
        &[("Durability", "replicated")],
        json!({"owner": "o1", "ttl_ms": 60000}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(replicas_header(&h).as_deref(), Some("1"));
    // A bad value is a 400 problem, and nothing is written.
    let (s, b, _) = post_with(
        &on_request,
        submit,
        &[("Durability", "eventually")],
        json!({"payload": 4}),
    )
    .await;
    assert_eq!(s, 400, "{b}");
    assert!(as_problem(s, &b).detail.contains("Durability"), "{b}");

    // A schedule, confirmed, for the "already so" case below.
    let (s, b, _) = post_with(
        &always,
        "/api/v1/schedules",
        &[],
        json!({"id": "dur-s", "expression": "0 0 1 1 *", "queue": "dur", "enabled": true}),
    )
    .await;
    assert_eq!(s, 201, "{b}");

    // The replica stops acknowledging (frozen): a shortfall.
    let thaw = set.server(1).freeze(Duration::from_secs(4));
    // A change, unconfirmed; then the same change again, which finds it done
    // and writes nothing: it is not confirmed either, since what it reports
    // is not on a replica yet. (Meant as the check of the mark before WAIT;
    // on Redis 7.0 it also passes without the mark, see the module header
    // of `store/ack.rs`.)
    let (s, b, _) = post_with(&always_short, "/api/v1/schedules/dur-s/disable", &[], json!({})).await;
    assert_eq!(s, 503, "{b}");
    assert_eq!(b["replicated"], false, "{b}");
    let (s, b, _) = post_with(&always_short, "/api/v1/schedules/dur-s/disable", &[], json!({})).await;
    assert_eq!(
        s, 503,
        "an unwritten \"already disabled\" was confirmed while the replica was frozen: {b}"
    );
    let t = Instant::now();
    let (s, b, h) = post_with(
        &always_short,
        submit,
        &[("Idempotency-Key", "dur-key-1")],
        json!({"payload": 5}),
    )
    .await;
    assert_eq!(s, 503, "{b}");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "answered before ack_timeout_ms"
    );
    assert_eq!(h.get("retry-after").unwrap(), "1");
    assert_eq!(h.get("content-type").unwrap(), "application/problem+json");
    assert_eq!(b["replicated"], false, "{b}");
    assert_eq!(b["replicas_required"], 1, "{b}");
    assert_eq!(b["replicas_acked"], 0, "{b}");
    assert_eq!(b["result_status"], 201, "{b}");
    let id = b["task_id"].as_str().expect("the 503 names the task").to_string();
    assert_eq!(b["result"]["id"], id.as_str(), "{b}");
    // It was applied on the master.
    let (s, _) = always_short.get(&format!("/api/v1/tasks/{id}")).await;
    assert_eq!(s, 200);
    // The retry with the same key finds the task; while the replica is still
    // behind it is not confirmed either.
    let (s, b, _) = post_with(
        &always_short,
        submit,
        &[("Idempotency-Key", "dur-key-1")],
        json!({"payload": 5}),
    )
    .await;
    assert_eq!(s, 503, "a replay was confirmed while the replica was frozen: {b}");
    assert_eq!(b["task_id"], id.as_str(), "{b}");
    assert_eq!(b["result"]["replayed"], true, "{b}");
    // A cancel names the task from its path.
    let (s, b, _) = post_with(
        &on_request_short,
        &format!("/api/v1/tasks/{id}/cancel"),
        &[("Durability", "replicated")],
        json!({}),
    )
    .await;
    assert_eq!(s, 503, "{b}");
    assert_eq!(b["task_id"], id.as_str(), "{b}");
    assert_eq!(b["result_status"], 200, "{b}");
    // An error answer waits for nothing.
    let (s, b, _) = post_with(&always_short, "/api/v1/tasks/no-such-task/cancel", &[], json!({})).await;
    assert!(s == 404 || s == 400, "{s} {b}");
    thaw.join().unwrap();
    // The thawed replica catches up before the next confirmed call (on a
    // loaded machine catching up can take longer than its WAIT: it failed
    // here once under a CPU spinner).
    // The target is what the master held at the thaw: read once. (Read
    // at every poll it moves on with each heartbeat the nodes write, and a
    // replica that acknowledges once a second can stay a write behind it
    // on a busy machine: this failed so in CI.)
    let replication = |k: &'static str| {
        let master = crate::common::ha::info(set.port(0), "replication");
        master.into_iter().find(|(n, _)| n == k).map(|(_, v)| v)
    };
    let target: u64 = replication("master_repl_offset")
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    let caught_up = wait_until(Duration::from_secs(20), || async {
        let acked = replication("slave0").and_then(|v| {
            v.split(',')
                .find_map(|kv| kv.strip_prefix("offset="))
                .and_then(|o| o.parse::<u64>().ok())
        });
        acked.is_some_and(|a| a >= target)
    })
    .await;
    assert!(caught_up, "the replica never caught up after the thaw");

    // Caught up: the replay is confirmed, same task.
    let (s, b, h) = post_with(
        &always,
        submit,
        &[("Idempotency-Key", "dur-key-1")],
        json!({"payload": 5}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let b: Submitted = serde_json::from_value(b).unwrap();
    assert_eq!(b.id, id);
    assert!(b.replayed);
    assert_eq!(replicas_header(&h).as_deref(), Some("1"));

    // The metrics count the waits and the shortfalls.
    let m = always.page("/metrics").await;
    assert!(metric(&m, "muster_redis_ack_shortfalls_total") >= 2.0, "{m}");
    assert!(
        metric(&m, "muster_redis_ack_waits_total{outcome=\"replicated\"}") >= 2.0,
        "{m}"
    );
    assert!(
        metric(&m, "muster_redis_ack_waits_total{outcome=\"short\"}") >= 2.0,
        "{m}"
    );
    assert!(metric(&m, "muster_redis_ack_wait_seconds_count") >= 4.0, "{m}");

    // The document gives every acknowledged operation the header.
    let (s, doc) = always.get("/api/v1/openapi.json").await;
    assert_eq!(s, 200);
    for (method, path) in muster::testing::ACKED {
        let op = &doc["paths"][*path][method.as_str().to_lowercase()];
        assert!(
            op.is_object(),
            "{method} {path} is in durability::ACKED but not an operation"
        );
        let params = op["parameters"].as_array().cloned().unwrap_or_default();
        assert!(
            params.iter().any(|p| p["name"] == "Durability" && p["in"] == "header"),
            "{method} {path} does not document the Durability header"
        );
    }
}

// ---------------------------------------------------------------------------
// Cluster: WAIT goes to the master of each slot the request wrote to
// ---------------------------------------------------------------------------

/// The port of the master that owns `tag`'s slot (a read there answers; the
/// others answer MOVED).
fn owner_of(cluster: &crate::common::ha::TestCluster, tag: &str) -> u16 {
    use crate::common::ha::query;
    cluster
        .ports()
        .into_iter()
        .find(|p| query::<Option<String>>(*p, &["GET", &format!("{tag}:probe")]).is_some())
        .unwrap_or_else(|| panic!("one master owns the {tag} slot"))
}

/// A new node that joins `cluster` as the replica of the master at `owner`,
/// once it is in sync.
async fn replica_of(owner: u16) -> (TestRedis, tempfile::TempDir) {
    use crate::common::ha::{info, query};
    let owner_id: String = query(owner, &["CLUSTER", "MYID"]).unwrap();
    let conf_dir = tempfile::Builder::new().prefix("muster-dur-cluster").tempdir().unwrap();
    let conf = conf_dir.path().join("replica-nodes.conf");
    let bus = free_port().to_string();
    let replica = TestRedis::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-port",
        &bus,
        "--cluster-config-file",
        &conf.to_string_lossy(),
        "--cluster-node-timeout",
        "2000",
    ]);
    let _: () = replica.cmd(&["CLUSTER", "MEET", "127.0.0.1", &owner.to_string()]).await;
    let known = wait_until(Duration::from_secs(20), || async {
        let nodes: String = replica.cmd(&["CLUSTER", "NODES"]).await;
        nodes.contains(&owner_id)
    })
    .await;
    assert!(known, "the new node never learned the slot's master");
    let _: () = replica.cmd(&["CLUSTER", "REPLICATE", &owner_id]).await;
    let up = wait_until(Duration::from_secs(20), || async {
        info(replica.port, "replication")
            .iter()
            .any(|(k, v)| k == "master_link_status" && v == "up")
    })
    .await;
    assert!(up, "the replica never synced with the slot's master");
    (replica, conf_dir)
}

/// A node on `cluster` with `ack_replicas = 1`, one pooled connection (the
/// second submit must meet a frozen replica in WAIT, not in opening a new
/// cluster connection, which contacts every node and, with one frozen, can
/// time out into a plain 503 "unavailable" on a loaded machine).
async fn acked_cluster_node(
    cluster: &crate::common::ha::TestCluster,
    tweak: impl FnOnce(&mut muster::config::Config),
) -> TestApp {
    let dir = tempfile::Builder::new().prefix("muster-node").tempdir().unwrap();
    let mut cfg = test_config("", dir.path());
    cfg.redis.url = String::new();
    cfg.redis.cluster = cluster.seeds();
    cfg.redis.ack_replicas = 1;
    cfg.redis.ack_timeout_ms = 300;
    cfg.redis.ack_connections = 1;
    tweak(&mut cfg);
    TestApp::start_config(cfg, dir).await
}

/// A 3-master Cluster in which only the master of the queue's slot (the
/// `{muster}` slot with one shard) gets a replica. redis-rs would send a
/// bare `WAIT` to every master and answer the minimum (0 here, from the two
/// without replicas); muster sends it to the slot's master on the
/// connection of the writes, so a submit is confirmed, and a frozen replica
/// makes it a shortfall.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_waits_on_the_namespace_slot_master() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let cluster = crate::common::ha::TestCluster::start(3);
    let (replica, _conf) = replica_of(owner_of(&cluster, &name_tag("muster", "dur"))).await;
    let app = acked_cluster_node(&cluster, |_| {}).await;
    let (s, b, h) = post_with(&app, "/api/v1/queues/dur/tasks", &[], json!({"payload": 1})).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(replicas_header(&h).as_deref(), Some("1"));

    let thaw = replica.freeze(Duration::from_secs(2));
    let (s, b, _) = post_with(&app, "/api/v1/queues/dur/tasks", &[], json!({"payload": 2})).await;
    assert_eq!(s, 503, "{b}");
    assert_eq!(b["replicated"], false, "{b}");
    thaw.join().unwrap();
}

/// A namespace split into 12 shards over 3 masters, only one of which has a
/// replica: a request is confirmed on the masters of the shards it wrote
/// to, every one of them. A submit to a queue on the replicated master is
/// confirmed; one to a queue on another master is a shortfall (that master
/// has none); a batch that writes to both is a shortfall too; and a frozen
/// replica turns the first into a shortfall.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_waits_on_the_master_of_every_shard_written() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let cluster = crate::common::ha::TestCluster::start(3);
    let map = muster::testing::ShardMap::new("muster", 12);
    let master_of = |name: &str| owner_of(&cluster, map.tag(map.home(name)));
    let replicated = master_of("dur");
    let (other, group) = {
        let q = (0..)
            .map(|n| format!("dur{n}"))
            .find(|q| master_of(q) != replicated)
            .unwrap();
        let g = (0..)
            .map(|n| format!("g{n}"))
            .find(|g| master_of(g) != replicated)
            .unwrap();
        (q, g)
    };
    let (replica, _conf) = replica_of(replicated).await;
    let app = acked_cluster_node(&cluster, |c| c.redis.shards = 12).await;
    let (s, b, h) = post_with(&app, "/api/v1/queues/dur/tasks", &[], json!({"payload": 1})).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(replicas_header(&h).as_deref(), Some("1"));
    let (s, b, _) = post_with(&app, &format!("/api/v1/queues/{other}/tasks"), &[], json!({})).await;
    assert_eq!(s, 503, "a queue on a master without replicas: {b}");
    assert_eq!(b["replicated"], false, "{b}");
    // One task in the queue's shard, one in its group's (on another master).
    let batch = json!({"tasks": [{"payload": 1}, {"payload": 2, "group": group}]});
    let (s, b, _) = post_with(&app, "/api/v1/queues/dur/tasks/batch", &[], batch).await;
    assert_eq!(s, 503, "a batch written to two masters, one without replicas: {b}");

    let thaw = replica.freeze(Duration::from_secs(2));
    let (s, b, _) = post_with(&app, "/api/v1/queues/dur/tasks", &[], json!({"payload": 2})).await;
    assert_eq!(s, 503, "{b}");
    assert_eq!(b["replicated"], false, "{b}");
    thaw.join().unwrap();
}
