//! Sentinel mode against real Sentinels: nodes follow a failover (G10), the
//! fencing epoch puts every token issued after the switch above every token
//! issued before it (G1 across failovers), writes acknowledged by `WAIT`
//! survive, a node started after a failover uses the promoted replica, and a
//! sentinel list that answers nothing fails the start clearly.
//!
//! Test 1 prints two benchmark figures: kill -> first write acknowledged
//! through muster, and sentinel promotion -> that write.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster::client::{ClaimRequest, FailoverStatus, NextTasks, Submitted};
use muster::config::Config;
use serde_json::{Value, json};

use crate::common::ha::{TestReplicaSet, TestSentinels, query};
use crate::common::skip_on_cluster;
use crate::common::*;

/// Deadline for the nodes to follow a failover, from the kill.
const FOLLOW_WITHIN: Duration = Duration::from_secs(15);

/// A test config in sentinel mode: no URL, the sentinels and the master name.
fn sentinel_config(sentinels: &[String], master_name: &str, dir: &std::path::Path) -> Config {
    let mut cfg = test_config("", dir);
    cfg.redis.url = String::new();
    cfg.redis.sentinels = sentinels.to_vec();
    cfg.redis.master_name = master_name.to_string();
    cfg
}

async fn start_node(sentinels: &TestSentinels) -> TestApp {
    let dir = tempfile::Builder::new().prefix("muster-node").tempdir().unwrap();
    let cfg = sentinel_config(&sentinels.addrs(), sentinels.master_name(), dir.path());
    TestApp::start_config(cfg, dir).await
}

/// Like `common::send`, but a transport error or a slow answer is `None`
/// instead of a panic: during a switch the workload retries.
async fn try_send(req: reqwest::RequestBuilder) -> Option<(u16, Value)> {
    let resp = req.timeout(Duration::from_secs(5)).send().await.ok()?;
    let status = resp.status().as_u16();
    let text = resp.text().await.ok()?;
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

async fn try_post(app: &TestApp, path: &str, body: Value) -> Option<(u16, Value)> {
    try_send(app.request(reqwest::Method::POST, path).json(&body)).await
}

/// `GET /api/v1/failover`, or Null if the node did not answer 200.
async fn failover_status(app: &TestApp) -> Option<FailoverStatus> {
    // Raw: asked in loops while a master is down, where a call that fails
    // or times out must read as "not yet", as try_send bounds it.
    match try_send(app.request(reqwest::Method::GET, "/api/v1/failover")).await {
        Some((200, b)) => Some(serde_json::from_value(b).expect("a failover status")),
        _ => None,
    }
}

/// Registers a worker id for two minutes (longer than any test).
async fn join(app: &TestApp, worker: &str) {
    let (s, b) = app
        .put(&format!("/api/v1/nodes/{worker}/heartbeat"), json!({"ttl_ms": 120_000}))
        .await;
    assert_eq!(s, 200, "{b}");
}

/// Makes sure every write the master has acknowledged so far reached a
/// replica: a write and `WAIT 1 1000` on the same connection. (`WAIT` only
/// waits for the offset of its own connection's last write, so a `WAIT` on a
/// fresh connection with no write of its own returns at once and proves
/// nothing; the marker write comes after every earlier write in the
/// replication stream.) Returns how many replicas acknowledged.
fn wait_replicated(port: u16) -> i64 {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut c = client.get_connection_with_timeout(Duration::from_secs(2)).unwrap();
    let (_, acked): ((), i64) = redis::pipe()
        .cmd("SET")
        .arg("muster-test:wait-marker")
        .arg("1")
        .cmd("WAIT")
        .arg(1)
        .arg(1000)
        .query(&mut c)
        .unwrap();
    acked
}

/// When each sentinel first named a master other than `old`.
#[derive(Default)]
struct Promotion {
    per_sentinel: Vec<Option<Instant>>,
}

impl Promotion {
    fn first(&self) -> Option<Instant> {
        self.per_sentinel.iter().flatten().min().copied()
    }
}

/// Polls every sentinel on its own thread (the queries are blocking) every
/// 10 ms until each names a master other than `old`, or `within` passes.
fn watch_promotion(ports: Vec<u16>, name: String, old: String, within: Duration) -> std::thread::JoinHandle<Promotion> {
    std::thread::spawn(move || {
        let mut p = Promotion {
            per_sentinel: vec![None; ports.len()],
        };
        let deadline = Instant::now() + within;
        while Instant::now() < deadline && p.per_sentinel.iter().any(|t| t.is_none()) {
            for (i, port) in ports.iter().enumerate() {
                if p.per_sentinel[i].is_some() {
                    continue;
                }
                let named = query::<Option<(String, String)>>(*port, &["SENTINEL", "get-master-addr-by-name", &name])
                    .flatten()
                    .map(|(h, p)| format!("{h}:{p}"));
                if named.is_some_and(|m| m != old) {
                    p.per_sentinel[i] = Some(Instant::now());
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        p
    })
}

/// One successful claim: its token and when the request was sent.
struct Claimed {
    token: u64,
    sent: Instant,
}

/// One answered enqueue: status and when it was sent and answered.
struct Enqueued {
    status: u16,
    sent: Instant,
    answered: Instant,
}

#[derive(Default)]
struct Log {
    claims: Vec<Claimed>,
    completions: Vec<Instant>,
    enqueues: Vec<Enqueued>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_failover_nodes_follow_and_tokens_increase() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let test_start = Instant::now();
    let mut set = TestReplicaSet::start(1);
    let sentinels = TestSentinels::start(&set, 3, "muster-s1");
    let (old, new) = (set.addr(0), set.addr(1));
    eprintln!("replica set and sentinels ready in {:?}", test_start.elapsed());

    let nodes = [
        Arc::new(start_node(&sentinels).await),
        Arc::new(start_node(&sentinels).await),
    ];
    for n in &nodes {
        let st = failover_status(n).await.expect("a failover status");
        assert_eq!(st.mode, "sentinel", "{st:?}");
        assert_eq!(st.master, old, "{st:?}");
    }
    let epoch_before = failover_status(&nodes[0])
        .await
        .and_then(|st| st.epoch)
        .expect("epoch before");

    let log: Arc<Mutex<Log>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let queue = "ha-s1";

    // Enqueuers: four, two per node, each one task every ~20 ms, with
    // different pauses after a failure. While the master is down a write
    // waits on the old connection's reconnect cycle (~0.8 s) before it fails
    // with 503, and writes in flight when the node switches still fail at the
    // end of that cycle; the next attempt goes to the new master. So "first
    // write" is what a retrying client sees, and the nodes' `last_switch`
    // (printed too) is when muster itself was ready.
    let mut enqueuers = Vec::new();
    for k in 0..4u64 {
        let (app, log, stop) = (nodes[(k % 2) as usize].clone(), log.clone(), stop.clone());
        enqueuers.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let sent = Instant::now();
                let r = try_post(
                    &app,
                    &format!("/api/v1/queues/{queue}/tasks"),
                    json!({"payload": {"k": k, "i": i}}),
                )
                .await;
                let ok = matches!(r, Some((201, _)));
                if let Some((status, _)) = r {
                    log.lock().unwrap().enqueues.push(Enqueued {
                        status,
                        sent,
                        answered: Instant::now(),
                    });
                }
                i += 1;
                let pause = if ok { 20 } else { 10 + 60 * k };
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }));
    }

    // Workers: two per node, claiming up to 5 with a short long-poll and
    // completing each task; every error is retried after a short pause.
    let mut workers = Vec::new();
    for w in 0..4 {
        let app = nodes[w % 2].clone();
        let me = format!("s1w{w}");
        join(&app, &me).await;
        let (log, stop) = (log.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let sent = Instant::now();
                let r = try_post(
                    &app,
                    &format!("/api/v1/queues/{queue}/claim"),
                    json!({"node": me, "max": 5, "wait_ms": 200}),
                )
                .await;
                let tasks = match r {
                    Some((200, b)) => {
                        serde_json::from_value::<NextTasks>(b)
                            .expect("tokens are JSON integers")
                            .tasks
                    }
                    Some((204, _)) => continue,
                    _ => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                for t in tasks {
                    let token = t.token;
                    log.lock().unwrap().claims.push(Claimed { token, sent });
                    let id = &t.id;
                    let r = try_post(&app, &format!("/api/v1/tasks/{id}/complete"), json!({"token": token})).await;
                    if matches!(r, Some((200, _))) {
                        log.lock().unwrap().completions.push(Instant::now());
                    }
                }
            }
        }));
    }

    // Some work done on the first master.
    let warm = wait_until(Duration::from_secs(10), || async {
        log.lock().unwrap().completions.len() >= 50
    })
    .await;
    assert!(warm, "the workload did not complete 50 tasks before the failover");

    // Writes acknowledged after WAIT must survive the failover.
    let mut kept = Vec::new();
    for i in 0..5 {
        let (s, b) = nodes[i % 2]
            .post("/api/v1/queues/ha-s1-kept/tasks", json!({"payload": {"kept": i}}))
            .await;
        assert_eq!(s, 201, "{b}");
        kept.push(serde_json::from_value::<Submitted>(b).unwrap().id);
    }
    let acked = wait_replicated(set.port(0));
    assert_eq!(acked, 1, "the replica acknowledged the writes before the kill");

    let promotion = watch_promotion(
        sentinels.ports(),
        sentinels.master_name().into(),
        old.clone(),
        FOLLOW_WITHIN,
    );
    set.kill(0);
    let killed = Instant::now();
    let killed_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    eprintln!("master {old} killed; waiting for the nodes to follow to {new}");

    // Both nodes use the promoted replica within the deadline.
    let followed = wait_until(FOLLOW_WITHIN, || async {
        for n in &nodes {
            if failover_status(n).await.is_none_or(|st| st.master != new) {
                return false;
            }
        }
        true
    })
    .await;
    let followed_at = Instant::now();
    if !followed {
        let sts = [failover_status(&nodes[0]).await, failover_status(&nodes[1]).await];
        panic!(
            "the nodes did not follow to {new} within {FOLLOW_WITHIN:?}: sentinels say {:?}; node status {sts:?}\nsentinel 0 log:\n{}",
            (0..3).map(|i| sentinels.master_addr_at(i)).collect::<Vec<_>>(),
            sentinels.log(0)
        );
    }
    eprintln!(
        "both nodes use {new} {:?} after the kill",
        followed_at.duration_since(killed)
    );

    // The workload goes on after the switch.
    let more = wait_until(Duration::from_secs(10), || async {
        let l = log.lock().unwrap();
        l.completions.iter().filter(|t| **t > followed_at).count() >= 20
            && l.enqueues
                .iter()
                .filter(|e| e.status == 201 && e.sent > followed_at)
                .count()
                >= 20
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for e in enqueuers {
        e.await.unwrap();
    }
    for w in workers {
        w.await.unwrap();
    }
    let promotion = tokio::task::spawn_blocking(move || promotion.join().unwrap())
        .await
        .unwrap();
    let log = std::mem::take(&mut *log.lock().unwrap());
    assert!(
        more,
        "the workload did not go on after the switch: {} completions and {} enqueues since",
        log.completions.iter().filter(|t| **t > followed_at).count(),
        log.enqueues
            .iter()
            .filter(|e| e.status == 201 && e.sent > followed_at)
            .count()
    );

    // Status after the switch, on both nodes.
    let mut epoch_after = Vec::new();
    let mut switched_after_ms = Vec::new();
    for n in &nodes {
        let st = failover_status(n).await.expect("a failover status");
        assert_eq!(st.mode, "sentinel", "{st:?}");
        assert_eq!(st.master, new, "{st:?}");
        assert_eq!(st.sentinel_master.as_deref(), Some(new.as_str()), "{st:?}");
        assert!(st.switches >= 1, "{st:?}");
        assert_eq!(
            st.last_switch.as_ref().map(|w| w.to.as_str()),
            Some(new.as_str()),
            "{st:?}"
        );
        let e = st.epoch.expect("epoch after");
        assert!(
            e > epoch_before,
            "epoch {e} after the switch, {epoch_before} before: {st:?}"
        );
        epoch_after.push(e);
        switched_after_ms.push(st.last_switch.as_ref().map_or(0, |w| w.at_ms) - killed_ms);
    }

    // Tokens: every claim sent after the kill was served by the new master,
    // and its token is above every token of a claim sent before it.
    let before: Vec<u64> = log.claims.iter().filter(|c| c.sent < killed).map(|c| c.token).collect();
    let after: Vec<u64> = log.claims.iter().filter(|c| c.sent > killed).map(|c| c.token).collect();
    assert!(
        !before.is_empty() && !after.is_empty(),
        "{} before, {} after",
        before.len(),
        after.len()
    );
    let max_before = *before.iter().max().unwrap();
    let min_after = *after.iter().min().unwrap();
    assert!(
        min_after > max_before,
        "a token issued after the switch ({min_after:#x}) is not above one issued before ({max_before:#x})"
    );
    assert!(
        min_after >> 32 > max_before >> 32,
        "tokens after the switch carry a greater epoch: {} vs {}",
        min_after >> 32,
        max_before >> 32
    );
    let distinct: HashSet<u64> = log.claims.iter().map(|c| c.token).collect();
    assert_eq!(distinct.len(), log.claims.len(), "no token was issued twice");

    // Nothing acknowledged after WAIT was lost.
    for id in &kept {
        let b = nodes[1].api().task(id).await.unwrap_or_else(|e| {
            panic!("task {id} acknowledged by WAIT before the kill is gone after the failover: {e}")
        });
        assert_eq!(b.id, *id, "{b:?}");
    }

    // Benchmark figures.
    let first_write = log
        .enqueues
        .iter()
        .filter(|e| e.status == 201 && e.sent > killed)
        .map(|e| e.answered)
        .min()
        .expect("a write after the kill");
    let promoted = promotion.first().expect("a sentinel promoted the replica");
    let failed_writes = log
        .enqueues
        .iter()
        .filter(|e| e.status != 201 && e.sent > killed)
        .count();
    eprintln!(
        "BENCH sentinel failover: kill -> first write acknowledged through muster {:?}; \
         promotion (first sentinel naming {new}) -> that write {:?}; \
         kill -> promotion {:?}; sentinels named the new master at {:?} after the kill; \
         the nodes switched {switched_after_ms:?} ms after the kill (their last_switch); \
         both nodes showed it {:?} after the kill; {failed_writes} enqueues refused meanwhile; \
         epoch {epoch_before} -> {epoch_after:?}; {} claims before, {} after; total test time {:?}",
        first_write.duration_since(killed),
        first_write.saturating_duration_since(promoted),
        promoted.duration_since(killed),
        promotion
            .per_sentinel
            .iter()
            .map(|t| t.map(|t| t.duration_since(killed)))
            .collect::<Vec<_>>(),
        followed_at.duration_since(killed),
        before.len(),
        after.len(),
        test_start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_node_starts_against_current_master() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let mut set = TestReplicaSet::start(1);
    let sentinels = TestSentinels::start(&set, 3, "muster-s2");
    let (old, new) = (set.addr(0), set.addr(1));

    // A first node sets up the epoch on the first master, then leaves.
    let mut first = start_node(&sentinels).await;
    let st = failover_status(&first).await.expect("a failover status");
    assert_eq!(st.master, old, "{st:?}");
    let epoch_before = st.epoch.expect("epoch before");
    let (s, b) = first.post("/api/v1/queues/ha-s2/tasks", json!({"payload": 1})).await;
    assert_eq!(s, 201, "{b}");
    let id = serde_json::from_value::<Submitted>(b).unwrap().id;
    assert_eq!(wait_replicated(set.port(0)), 1);
    first.shutdown().await;

    set.kill(0);
    let killed = Instant::now();
    let promoted = tokio::task::spawn_blocking({
        let ports = sentinels.ports();
        let name = sentinels.master_name().to_string();
        move || watch_promotion(ports, name, old, FOLLOW_WITHIN).join().unwrap()
    })
    .await
    .unwrap();
    assert!(
        promoted.per_sentinel.iter().all(|t| t.is_some()),
        "not every sentinel named a new master within {FOLLOW_WITHIN:?}: {:?}\nsentinel 0 log:\n{}",
        (0..3).map(|i| sentinels.master_addr_at(i)).collect::<Vec<_>>(),
        sentinels.log(0)
    );
    assert_eq!(sentinels.master_addr(), Some(new.clone()));
    eprintln!(
        "promoted {:?} after the kill",
        promoted.first().unwrap().duration_since(killed)
    );

    let second = start_node(&sentinels).await;
    let st = failover_status(&second).await.expect("a failover status");
    assert_eq!(st.mode, "sentinel", "{st:?}");
    assert_eq!(st.master, new, "{st:?}");
    let epoch = st.epoch.expect("epoch after");
    assert!(
        epoch > epoch_before,
        "epoch {epoch} after the failover, {epoch_before} before: {st:?}"
    );
    second.api().task(&id).await.unwrap();
    // A token issued now carries the new epoch.
    join(&second, "s2w").await;
    let req = ClaimRequest {
        node: "s2w".into(),
        max: 1,
        wait_ms: 0,
        ack_ms: None,
    };
    let got = second.api().claim("ha-s2", &req).await.unwrap();
    let token = got[0].token;
    assert_eq!(token >> 32, epoch, "token {token:#x} carries epoch {epoch}");

    // Reachable sentinels that do not know the master name: a clear error.
    let dir = tempfile::Builder::new().prefix("muster-node").tempdir().unwrap();
    let cfg = sentinel_config(&sentinels.addrs(), "no-such-master", dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    match muster::start(cfg, listener).await {
        Ok(_) => panic!("a node started with a master name no sentinel knows"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("sentinel") && msg.contains("no-such-master"), "{msg}");
        }
    }
}

#[tokio::test]
async fn sentinel_start_fails_clearly_when_no_sentinel_answers() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    // Ports that were free a moment ago: connection refused.
    let addrs = vec![
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    ];
    let dir = tempfile::Builder::new().prefix("muster-node").tempdir().unwrap();
    let cfg = sentinel_config(&addrs, "muster", dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let t = Instant::now();
    match muster::start(cfg, listener).await {
        Ok(_) => panic!("a node started with no sentinel reachable"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("sentinel"), "{msg}");
            for a in &addrs {
                assert!(
                    msg.contains(a.as_str()),
                    "the error names every sentinel tried ({a}): {msg}"
                );
            }
        }
    }
    assert!(t.elapsed() < Duration::from_secs(10), "failed in {:?}", t.elapsed());
}
