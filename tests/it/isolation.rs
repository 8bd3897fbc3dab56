//! Failure isolation on a split namespace (issue 34): a Redis Cluster master
//! that stalls, fails over, or runs on a clock of its own costs only the
//! shards it holds.
//!
//! Each test starts its own 3-master Redis Cluster and three muster nodes
//! with `redis.shards = 12` (four shards per master). A steady load runs
//! through the nodes: a producer submits to queues on every master, workers
//! on two of the nodes heartbeat, claim and complete. The test records every
//! answer (status, latency, when) and then judges the queues none of whose
//! shards are on the master in trouble ("healthy" queues) against the
//! figures the same load had before the trouble.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster::client::{ClaimedTask, FinishedNext, NextTasks, QueueDetail, Submitted, TaskInfo, TaskPage, TaskSpec};
use muster::config::Config;
use muster::testing::ShardMap;
use redis::Value as RValue;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::common::ha::{ClusterOpts, TestCluster, query};
use crate::common::skip_on_cluster;
use crate::common::*;

const SHARDS: u32 = 12;
/// A worker's registration lease: a worker that dies has its tasks
/// recovered within this + `orphans.interval_ms` + 1 s.
const WORKER_TTL_MS: i64 = 2000;
const ORPHANS_INTERVAL_MS: u64 = 250;

/// The master (by port) that holds each shard of the namespace `muster`
/// split in [`SHARDS`], read from `CLUSTER SLOTS`.
fn master_of_shards(cluster: &TestCluster) -> Vec<u16> {
    let map = ShardMap::new("muster", SHARDS);
    let any = cluster.ports()[0];
    let slots: Vec<Vec<RValue>> = query(any, &["CLUSTER", "SLOTS"]).expect("CLUSTER SLOTS");
    let ranges: Vec<(i64, i64, u16)> = slots
        .iter()
        .map(|r| {
            let int = |v: &RValue| match v {
                RValue::Int(i) => *i,
                _ => panic!("a slot bound: {v:?}"),
            };
            let port = match &r[2] {
                RValue::Array(node) => int(&node[1]) as u16,
                v => panic!("a node: {v:?}"),
            };
            (int(&r[0]), int(&r[1]), port)
        })
        .collect();
    (0..map.len())
        .map(|i| {
            let slot: i64 = query(any, &["CLUSTER", "KEYSLOT", map.tag(i)]).unwrap();
            ranges
                .iter()
                .find(|(a, b, _)| (*a..=*b).contains(&slot))
                .map(|(_, _, p)| *p)
                .expect("every slot is served")
        })
        .collect()
}

/// `n` queue names whose shard is on (`on = true`) or off the master at
/// `port`, named `<stem><i>`.
fn queues(owners: &[u16], port: u16, on: bool, stem: &str, n: usize) -> Vec<String> {
    let map = ShardMap::new("muster", SHARDS);
    (0..)
        .map(|i| format!("{stem}{i}"))
        .filter(|q| (owners[map.home(q)] == port) == on)
        .take(n)
        .collect()
}

/// A node on `cluster` split into [`SHARDS`], with timings a debug build on
/// two shared cores keeps up with.
async fn node(cluster: &TestCluster, tweak: impl Fn(&mut Config)) -> TestApp {
    let dir = tempfile::Builder::new().prefix("muster-node").tempdir().unwrap();
    let mut cfg = test_config("", dir.path());
    cfg.redis.url.clear();
    cfg.redis.cluster = cluster.seeds();
    cfg.redis.shards = SHARDS;
    cfg.nodes.heartbeat_ms = 250;
    cfg.nodes.ttl_ms = 1500;
    cfg.orphans.interval_ms = ORPHANS_INTERVAL_MS;
    cfg.tasks.janitor_interval_ms = 500;
    tweak(&mut cfg);
    TestApp::start_config(cfg, dir).await
}

/// One answer the load got.
#[derive(Clone, Debug)]
struct Rec {
    kind: &'static str,
    /// A queue none of whose shards is on the master in trouble (always
    /// true for worker heartbeats, which every worker needs).
    healthy: bool,
    status: u16,
    ms: f64,
    at: Instant,
    /// A failure's `detail`, for the report.
    detail: String,
}

#[derive(Default)]
struct Book {
    recs: Vec<Rec>,
    /// Task id -> queue, for every submit answered 201.
    submitted: HashMap<String, String>,
    /// Task id -> claims answered to a worker.
    claims: HashMap<String, u32>,
    /// Task id -> completes answered 200.
    done: HashMap<String, u32>,
    /// Tasks the drain adopted (running under a worker that never got them).
    adopted: Vec<String>,
}

type Shared = Arc<Mutex<Book>>;

struct Load {
    book: Shared,
    stop: CancellationToken,
    handles: Vec<tokio::task::JoinHandle<()>>,
    healthy: Vec<String>,
}

async fn call(http: &reqwest::Client, method: reqwest::Method, url: String, body: Value) -> (u16, Value, f64) {
    let started = Instant::now();
    let r = http.request(method, url).json(&body).send().await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    match r {
        Ok(r) => {
            let s = r.status().as_u16();
            (s, r.json().await.unwrap_or(Value::Null), ms)
        }
        Err(_) => (599, Value::Null, ms),
    }
}

fn record(book: &Shared, kind: &'static str, healthy: bool, status: u16, ms: f64, body: &Value) {
    let detail = if status >= 300 {
        as_problem(status, body).detail.chars().take(160).collect()
    } else {
        String::new()
    };
    book.lock().unwrap().recs.push(Rec {
        kind,
        healthy,
        status,
        ms,
        at: Instant::now(),
        detail,
    });
}

/// Starts the load: a producer over `healthy` and `troubled` queues through
/// every node, and on nodes 0 and 1 two workers each for the healthy queues
/// and one for the troubled ones.
fn start_load(nodes: &[TestApp], healthy: Vec<String>, troubled: Vec<String>) -> Load {
    let book: Shared = Arc::default();
    let stop = CancellationToken::new();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let mut handles = Vec::new();
    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    {
        let (book, stop, http, urls) = (book.clone(), stop.clone(), http.clone(), urls.clone());
        let all: Vec<(String, bool)> = healthy
            .iter()
            .map(|q| (q.clone(), true))
            .chain(troubled.iter().map(|q| (q.clone(), false)))
            .collect();
        handles.push(tokio::spawn(async move {
            let mut i = 0usize;
            while !stop.is_cancelled() {
                let (q, ok) = &all[i % all.len()];
                let url = format!("{}/api/v1/queues/{q}/tasks", urls[i % urls.len()]);
                i += 1;
                let (book, http, q, ok) = (book.clone(), http.clone(), q.clone(), *ok);
                // Each submit on its own: a stalled one does not hold up
                // the others.
                tokio::spawn(async move {
                    let (s, b, ms) = call(&http, reqwest::Method::POST, url, json!({"payload": {"q": q}})).await;
                    record(&book, "submit", ok, s, ms, &b);
                    if s == 201 {
                        let id = serde_json::from_value::<Submitted>(b).unwrap().id;
                        book.lock().unwrap().submitted.insert(id, q);
                    }
                });
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }));
    }
    for (n, url) in urls.iter().take(2).enumerate() {
        let lines: Vec<(Vec<String>, bool)> = vec![
            (healthy.clone(), true),
            (healthy.iter().rev().cloned().collect(), true),
            (troubled.clone(), false),
        ];
        for (w, (qs, ok)) in lines.into_iter().enumerate() {
            let id = format!("w{n}-{w}");
            handles.extend(worker(&http, url, &id, qs, ok, &book, &stop));
        }
    }
    Load {
        book,
        stop,
        handles,
        healthy,
    }
}

/// A worker `id` through the node at `url`: its heartbeat every 300 ms, and
/// a loop that claims one task of each of `queues` in turn and completes it.
fn worker(
    http: &reqwest::Client,
    url: &str,
    id: &str,
    queues: Vec<String>,
    healthy: bool,
    book: &Shared,
    stop: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let beat = {
        let (http, book, stop) = (http.clone(), book.clone(), stop.clone());
        let url = format!("{url}/api/v1/nodes/{id}/heartbeat");
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let (s, b, ms) = call(&http, reqwest::Method::PUT, url.clone(), json!({"ttl_ms": 10_000})).await;
                record(&book, "heartbeat", true, s, ms, &b);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let work = {
        let (http, book, stop, url, id) = (
            http.clone(),
            book.clone(),
            stop.clone(),
            url.to_string(),
            id.to_string(),
        );
        tokio::spawn(async move {
            let mut i = 0usize;
            while !stop.is_cancelled() {
                let q = &queues[i % queues.len()];
                i += 1;
                let (s, b, ms) = call(
                    &http,
                    reqwest::Method::POST,
                    format!("{url}/api/v1/queues/{q}/claim"),
                    json!({"node": id, "max": 1, "wait_ms": 0}),
                )
                .await;
                record(&book, "claim", healthy, s, ms, &b);
                if s != 200 {
                    tokio::time::sleep(Duration::from_millis(if s == 204 { 10 } else { 100 })).await;
                    continue;
                }
                let tasks = serde_json::from_value::<NextTasks>(b).map(|b| b.tasks);
                for t in tasks.unwrap_or_default() {
                    let tid = t.id.clone();
                    *book.lock().unwrap().claims.entry(tid.clone()).or_default() += 1;
                    // A complete that fails is sent again until it lands
                    // or is refused (409: the task is no longer ours).
                    loop {
                        let (s, b, ms) = call(
                            &http,
                            reqwest::Method::POST,
                            format!("{url}/api/v1/tasks/{tid}/complete"),
                            json!({"token": t.token}),
                        )
                        .await;
                        record(&book, "complete", healthy, s, ms, &b);
                        if s == 200 {
                            *book.lock().unwrap().done.entry(tid.clone()).or_default() += 1;
                        }
                        if s < 500 || stop.is_cancelled() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        })
    };
    vec![beat, work]
}

impl Load {
    async fn stop(self) -> Book {
        self.stop.cancel();
        for h in self.handles {
            let _ = h.await;
        }
        // Submits still in flight land within their timeout.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Arc::try_unwrap(self.book)
            .map(|m| m.into_inner().unwrap())
            .unwrap_or_else(|b| std::mem::take(&mut *b.lock().unwrap()))
    }
}

/// Lets the load warm up (connections, scripts), then records the window
/// the trouble is judged against: ten seconds, so its p99 rests on a few
/// hundred calls of each kind.
async fn baseline() -> (Instant, Instant) {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let from = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    (from, Instant::now())
}

/// The 99th percentile of `xs` (ms).
fn p99(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[((xs.len() as f64 * 0.99).ceil() as usize)
        .saturating_sub(1)
        .min(xs.len() - 1)]
}

/// What the healthy queues got in `[from, to)`, per kind: (2xx share,
/// count, p99 ms of the 2xx answers).
fn judge(book: &Book, from: Instant, to: Instant) -> HashMap<&'static str, (f64, usize, f64)> {
    let mut out = HashMap::new();
    for kind in ["submit", "claim", "complete", "heartbeat"] {
        let recs: Vec<&Rec> = book
            .recs
            .iter()
            .filter(|r| r.kind == kind && r.healthy && r.at >= from && r.at < to)
            .collect();
        let ok: Vec<f64> = recs
            .iter()
            .filter(|r| (200..300).contains(&r.status))
            .map(|r| r.ms)
            .collect();
        let share = if recs.is_empty() {
            1.0
        } else {
            ok.len() as f64 / recs.len() as f64
        };
        out.insert(kind, (share, recs.len(), p99(ok)));
    }
    out
}

/// The healthy queues kept working through the trouble: at least 99 % of
/// every kind of answer 2xx, and p99 latency at most four times the
/// figure before plus 250 ms, and never above 1.5 s. The slack is the
/// scheduling noise of a debug build on two shared cores, where the other
/// test thread and the Cluster's own failover share the CPU: seen up to 3.3
/// times a 43 ms figure (144 ms), and claims at 290 ms against 61 ms, with
/// nothing waiting on the troubled master. What the bound must tell apart
/// is far away, and the cap keeps it so: a call that waits for a stalled
/// master waits the whole `redis.timeout_ms`, 2 s, so one such call in a
/// hundred puts the p99 at 2 s.
fn assert_isolated(book: &Book, before: (Instant, Instant), during: (Instant, Instant)) {
    let base = judge(book, before.0, before.1);
    let trouble = judge(book, during.0, during.1);
    eprintln!("before: {base:?}\nduring: {trouble:?}");
    let mut failures: HashMap<(&str, u16, &str), usize> = HashMap::new();
    for r in &book.recs {
        if r.healthy && r.status >= 300 && r.at >= during.0 && r.at < during.1 {
            *failures.entry((r.kind, r.status, r.detail.as_str())).or_default() += 1;
        }
    }
    for (k, n) in &failures {
        eprintln!("healthy-queue failure x{n}: {k:?}");
    }
    for kind in ["submit", "claim", "complete", "heartbeat"] {
        let (share, n, p) = trouble[kind];
        let (_, n0, p0) = base[kind];
        // At least 15 in the window (it lasts the failover, 3 to 4 s): a CI
        // run with both cores loaded once made exactly 20 claims in it. Calls
        // that waited for a stalled master (2 s each) would make far fewer.
        assert!(
            n >= 15 && n0 > 5,
            "{kind}: too few calls to judge ({n0} before, {n} during)"
        );
        assert!(
            share >= 0.99,
            "{kind}: {:.1} % of {n} calls of healthy queues answered 2xx during the trouble",
            share * 100.0
        );
        let bound = (4.0 * p0 + 250.0).min(1500.0);
        assert!(
            p <= bound,
            "{kind}: p99 {p:.1} ms during the trouble against {p0:.1} ms before (bound {bound:.0} ms)"
        );
    }
}

/// Nothing lost, nothing run twice: every task acknowledged (201) ends
/// succeeded; no task was completed twice; no task was handed out twice
/// except `recovered` (claimed again after its worker died).
async fn assert_exactly_once(book: &Book, app: &TestApp, recovered: &[String]) {
    for (id, n) in &book.done {
        assert_eq!(*n, 1, "task {id} was completed {n} times");
    }
    for (id, n) in &book.claims {
        if !recovered.contains(id) {
            assert_eq!(*n, 1, "task {id} was handed out {n} times");
        }
    }
    let mut missing = Vec::new();
    for id in book.submitted.keys() {
        match app.api().task(id).await {
            Ok(TaskInfo { state, .. }) if state == "succeeded" => {}
            Ok(t) => missing.push(format!("{id}: 200 \"{}\"", t.state)),
            Err(e) => missing.push(format!("{id}: {e}")),
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged tasks did not succeed: {:?}",
        missing.len(),
        book.submitted.len(),
        &missing[..missing.len().min(5)]
    );
}

/// Drains every queue the load used, through node `app`, until nothing is
/// queued (the workers stopped; the troubled queues' backlog included).
/// With `adopt`, tasks still running under a worker of the load are
/// completed first, as a worker client's adopter does with a claim whose
/// answer was lost (a claim applied on a master that died before it could
/// confirm its replication; issue 35's claim leases bound that case), and
/// so are the drainer's own at the end: the old master resyncs as the new
/// one's replica meanwhile, and a claim or complete applied while `WAIT`
/// could not be answered comes back 503 though it happened.
async fn drain(app: &TestApp, queues: &[String], book: &Shared, adopt: bool) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (s, _) = app
        .put("/api/v1/nodes/drainer/heartbeat", json!({"ttl_ms": 60_000}))
        .await;
    assert_eq!(s, 200);
    if adopt {
        adopt_running(app, queues, book, |o| o.starts_with('w'), deadline).await;
    }
    for q in queues {
        let mut last = (0, Value::Null);
        loop {
            assert!(
                Instant::now() < deadline,
                "queue {q} did not drain: the last claim answered {last:?}"
            );
            let (s, b, _) = call(
                &http,
                reqwest::Method::POST,
                format!("{}/api/v1/queues/{q}/claim", app.url),
                json!({"node": "drainer", "max": 100, "wait_ms": 0}),
            )
            .await;
            if s == 204 {
                break;
            }
            last = (s, b.clone());
            if s != 200 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            for t in serde_json::from_value::<NextTasks>(b).unwrap().tasks {
                let tid = t.id.clone();
                *book.lock().unwrap().claims.entry(tid.clone()).or_default() += 1;
                let (s, _) = app
                    .post(&format!("/api/v1/tasks/{tid}/complete"), json!({"token": t.token}))
                    .await;
                if s == 200 {
                    *book.lock().unwrap().done.entry(tid).or_default() += 1;
                }
            }
        }
    }
    if adopt {
        adopt_running(app, queues, book, |o| o == "drainer", deadline).await;
    }
}

/// Completes every task of `queues` running under an owner `whose` names,
/// each until it lands (200) or is no longer that owner's (409), and
/// records it as adopted.
async fn adopt_running(
    app: &TestApp,
    queues: &[String],
    book: &Shared,
    whose: impl Fn(&str) -> bool,
    deadline: Instant,
) {
    for q in queues {
        let page: TaskPage = app.api().tasks(q, "running", 500, None).await.unwrap();
        for t in &page.tasks {
            let Some(owner) = t.owner.as_deref().filter(|o| whose(o)) else {
                continue;
            };
            let tid = t.id.clone();
            eprintln!("adopting {tid}, running under \"{owner}\" (its claim's answer was lost)");
            book.lock().unwrap().adopted.push(tid.clone());
            loop {
                let (s, b) = app
                    .post(&format!("/api/v1/tasks/{tid}/complete"), json!({"token": t.token}))
                    .await;
                if s == 200 {
                    *book.lock().unwrap().done.entry(tid.clone()).or_default() += 1;
                }
                if s < 500 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "adopting {tid}: the complete answered {s} {b}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A worker that claims one task of `queue` through `app` and dies (stops
/// heartbeating): returns the task, and the Redis time of its last
/// heartbeat.
async fn a_worker_dies(app: &TestApp, queue: &str) -> (String, i64) {
    let id = "doomed";
    let task = crate::tasks::submit(app, queue, json!({})).await;
    let (s, hb) = app
        .put(
            &format!("/api/v1/nodes/{id}/heartbeat"),
            json!({"ttl_ms": WORKER_TTL_MS}),
        )
        .await;
    assert_eq!(s, 200, "{hb}");
    let got = crate::sharding::claim(app, queue, id, 1, 0).await;
    assert_eq!(got[0].id, task);
    let hb: muster::client::NodeHeartbeatAnswer = serde_json::from_value(hb).unwrap();
    (task, hb.now)
}

/// The task's orphan record: its detection time (Redis ms), once the
/// cleaner recovered it. Err says what the listing answered meanwhile (its
/// last answer, how many polls, the slowest), for a failure's message.
async fn recovered_at(app: &TestApp, task: &str) -> Result<i64, String> {
    // Generous: on two busy cores a failover's reconnects can hold a
    // listing that reads every shard for seconds.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut polls, mut slowest, mut last) = (0, Duration::ZERO, String::new());
    while Instant::now() < deadline {
        let asked = Instant::now();
        let (s, b) = app.get("/api/v1/orphans?limit=1000").await;
        polls += 1;
        slowest = slowest.max(asked.elapsed());
        if s == 200
            && let Some(at) = b["recovered"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["task"] == task)
                .and_then(|r| r["detected_at"].as_i64())
        {
            return Ok(at);
        }
        last = format!("{s} {}", b.to_string().chars().take(300).collect::<String>());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "{polls} polls, the slowest {slowest:?}; the last answer: {last}"
    ))
}

/// Stops the load and drains every queue it used (see [`drain`]); returns
/// the whole record.
async fn finish(load: Load, app: &TestApp, troubled: &[String], dying_queue: &str, adopt: bool) -> Book {
    let all: Vec<String> = load
        .healthy
        .iter()
        .chain(troubled.iter())
        .cloned()
        .chain(std::iter::once(dying_queue.to_string()))
        .collect();
    let shared = load.book.clone();
    let mut book = load.stop().await;
    // The book is empty now: what the drain adds is merged below.
    drain(app, &all, &shared, adopt).await;
    let extra = std::mem::take(&mut *shared.lock().unwrap());
    for (id, n) in extra.claims {
        *book.claims.entry(id).or_default() += n;
    }
    for (id, n) in extra.done {
        *book.done.entry(id).or_default() += n;
    }
    for id in extra.adopted {
        book.claims.entry(id.clone()).or_insert(1);
        book.adopted.push(id);
    }
    book
}

/// The cluster of these tests: 3 masters, each with a replica, masters that
/// keep serving their slots while another is failed.
fn cluster(node_timeout_ms: u64, skew: Vec<(usize, i64)>) -> TestCluster {
    let mut cluster = TestCluster::start_opts(ClusterOpts {
        node_timeout_ms,
        full_coverage: false,
        skew_ms: skew,
        ..ClusterOpts::default()
    });
    for m in 0..3 {
        cluster.add_replica(m);
    }
    cluster
}

/// One master SIGSTOPped for 20 s under steady load: the queues whose
/// shards are elsewhere keep answering, at their usual latency; a worker
/// that dies meanwhile has its task recovered on time (G3); the stalled
/// shards serve again within 2 s of SIGCONT; nothing is lost or run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_master_stops_only_its_own_shards() {
    if skip_on_cluster("builds its own Redis Cluster (with replicas and a stalled master)") {
        return;
    }
    // No failover within the stall: this is a stall, not a master change.
    let cluster = cluster(60_000, Vec::new());
    let owners = master_of_shards(&cluster);
    // The master of shard 0: a pass that walked the shards in order and
    // stopped at the first failure would starve every other shard.
    let stalled = cluster.ports()[0];
    let master = cluster.node(0);
    assert_eq!(owners[0], stalled);
    let nodes = vec![
        node(&cluster, |_| {}).await,
        node(&cluster, |_| {}).await,
        node(&cluster, |_| {}).await,
    ];
    let healthy = queues(&owners, stalled, false, "hq", 4);
    let troubled = queues(&owners, stalled, true, "tq", 2);
    let dying_queue = queues(&owners, stalled, false, "dq", 1).remove(0);
    let load = start_load(&nodes, healthy.clone(), troubled.clone());
    let before = baseline().await;

    let stall_at = Instant::now();
    let thaw = master.freeze(Duration::from_secs(20));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (doomed, last_beat) = a_worker_dies(&nodes[0], &dying_queue).await;
    // Its task comes back on time, from a healthy shard, mid-stall.
    let detected = recovered_at(&nodes[1], &doomed)
        .await
        .unwrap_or_else(|e| panic!("the dead worker's task is not recovered: {e}"));
    let bound = WORKER_TTL_MS + ORPHANS_INTERVAL_MS as i64 + 1000;
    assert!(
        detected - last_beat <= bound,
        "recovered {} ms after the worker's last heartbeat (bound {bound} ms)",
        detected - last_beat
    );
    thaw.join().unwrap();
    let thawed = Instant::now();
    let during = (stall_at, thawed);

    // The stalled shards serve again within 2 s.
    let back = wait_until(Duration::from_secs(10), || async {
        let b = load.book.lock().unwrap();
        b.recs
            .iter()
            .any(|r| r.kind == "submit" && !r.healthy && r.status == 201 && r.at > thawed)
    })
    .await;
    assert!(
        back,
        "no submit to the stalled master's queues succeeded after the thaw"
    );
    let first = {
        let b = load.book.lock().unwrap();
        b.recs
            .iter()
            .filter(|r| r.kind == "submit" && !r.healthy && r.status == 201 && r.at > thawed)
            .map(|r| r.at - Duration::from_secs_f64(r.ms / 1000.0))
            .min()
            .unwrap()
    };
    let served_after = first.saturating_duration_since(thawed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let book = finish(load, &nodes[2], &troubled, &dying_queue, false).await;
    eprintln!("the stalled shards served again {served_after:?} after SIGCONT");
    assert!(
        served_after <= Duration::from_secs(2),
        "the stalled shards served again only {served_after:?} after SIGCONT"
    );
    assert_isolated(&book, before, during);
    assert_exactly_once(&book, &nodes[2], std::slice::from_ref(&doomed)).await;
}

/// The same with a real failover: the master is SIGKILLed and the Cluster
/// promotes its replica. Every change is acknowledged only once a replica
/// has it (`redis.ack_replicas = 1`), so "nothing lost" covers the tasks of
/// the failed master's shards too; the old master is started again and
/// rejoins as the new one's replica, so those shards can acknowledge again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_failover_stops_only_its_own_shards() {
    if skip_on_cluster("builds its own Redis Cluster (with replicas and a failover)") {
        return;
    }
    let mut cluster = cluster(2000, Vec::new());
    let owners = master_of_shards(&cluster);
    // The master of shard 0 (see the stall test); add_replica gave masters
    // 0, 1, 2 the replicas 3, 4, 5.
    let failing = cluster.ports()[0];
    let replica = cluster.ports()[3];
    assert_eq!(owners[0], failing);
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(node(&cluster, |c| c.redis.ack_replicas = 1).await);
    }
    let healthy = queues(&owners, failing, false, "hq", 4);
    let troubled = queues(&owners, failing, true, "tq", 2);
    let dying_queue = queues(&owners, failing, false, "dq", 1).remove(0);
    let load = start_load(&nodes, healthy.clone(), troubled.clone());
    let before = baseline().await;

    let killed_at = Instant::now();
    cluster.kill(0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (doomed, last_beat) = a_worker_dies(&nodes[0], &dying_queue).await;
    let promoted = wait_until(Duration::from_secs(30), || async {
        crate::common::ha::info(replica, "replication")
            .iter()
            .any(|(k, v)| k == "role" && v == "master")
    })
    .await;
    assert!(promoted, "the Cluster promoted the replica");
    let promoted_at = Instant::now();
    cluster.restart(0);
    let detected = recovered_at(&nodes[1], &doomed)
        .await
        .unwrap_or_else(|e| panic!("the dead worker's task is not recovered: {e}"));
    let bound = WORKER_TTL_MS + ORPHANS_INTERVAL_MS as i64 + 1000;
    assert!(
        detected - last_beat <= bound,
        "recovered {} ms after the worker's last heartbeat (bound {bound} ms)",
        detected - last_beat
    );
    // The trouble is the failover itself: the master's death to its
    // replica's promotion (the old master then rejoins and resyncs).
    let during = (killed_at, promoted_at);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The failed master's shards serve again, on the promoted replica.
    let back = wait_until(Duration::from_secs(20), || async {
        let b = load.book.lock().unwrap();
        b.recs
            .iter()
            .any(|r| r.kind == "submit" && !r.healthy && r.status == 201 && r.at > promoted_at)
    })
    .await;
    assert!(
        back,
        "no submit to the failed master's queues succeeded after the promotion"
    );
    eprintln!(
        "promoted {:?} after the kill",
        promoted_at.saturating_duration_since(killed_at)
    );
    let book = finish(load, &nodes[2], &troubled, &dying_queue, true).await;
    eprintln!("adopted after the failover: {:?}", book.adopted);
    assert_isolated(&book, before, during);
    assert_exactly_once(&book, &nodes[2], std::slice::from_ref(&doomed)).await;
}

/// How many scripts the Redis at `port` refused for arriving after their
/// deadline (`LATE`, G12).
fn late_refusals(port: u16) -> i64 {
    let info: String = query(port, &["INFO", "errorstats"]).unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_LATE:count="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// G11 and G12 across masters: one master's clock runs 2 s ahead of the
/// others'. Every script gets its deadline from the clock of the master it
/// goes to, so the master ahead refuses nothing (one estimate taken from
/// another master would put every deadline 2 s in its past: LATE), and a
/// call held in transit past its timeout to a master *behind* is refused
/// there, not applied (one estimate taken from the master ahead would give
/// it 2 s more).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn masters_on_clocks_two_seconds_apart() {
    if skip_on_cluster("builds its own Redis Cluster (one master's clock skewed)") {
        return;
    }
    let cluster = TestCluster::start_opts(ClusterOpts {
        node_timeout_ms: 30_000,
        full_coverage: false,
        skew_ms: vec![(2, 2000)],
        ..ClusterOpts::default()
    });
    let ports = cluster.ports();
    let t0: (i64, i64) = query(ports[0], &["TIME"]).unwrap();
    let t2: (i64, i64) = query(ports[2], &["TIME"]).unwrap();
    let skew = (t2.0 * 1000 + t2.1 / 1000) - (t0.0 * 1000 + t0.1 / 1000);
    assert!((1900..2200).contains(&skew), "master 2 runs {skew} ms ahead");
    // Master 0 is reached through a proxy that can hold what is sent to it:
    // it announces the proxy's port, so every client's slot map names it.
    let proxy = FaultProxy::start(ports[0]).await;
    let _: String = query(
        ports[0],
        &[
            "CONFIG",
            "SET",
            "cluster-announce-port",
            &proxy.port.to_string(),
            "cluster-announce-bus-port",
            &(ports[0] + 10000).to_string(),
        ],
    )
    .unwrap();
    // Every node the muster node may take its slot map from (each is a
    // seed), master 0 itself included: one that still names master 0's own
    // port would send the node around the proxy (seen under load, when the
    // gossip reached master 1 before the others).
    let announced = wait_until(Duration::from_secs(20), || async {
        ports.iter().all(|&p| {
            let text: String = query(p, &["CLUSTER", "NODES"]).unwrap_or_default();
            text.contains(&format!(":{}@", proxy.port))
        })
    })
    .await;
    assert!(announced, "every node knows master 0 by its proxy");
    let owners: Vec<u16> = master_of_shards(&cluster)
        .into_iter()
        .map(|p| if p == proxy.port { ports[0] } else { p })
        .collect();
    let app = node(&cluster, |_| {}).await;
    let on = |m: usize, stem: &str| queues(&owners, ports[m], true, stem, 1).remove(0);
    let (q0, q1, q2) = (on(0, "a"), on(1, "b"), on(2, "c"));
    crate::tasks::join(&app, "w").await;

    // Every master serves, the one ahead included: no call refused.
    let late_before: Vec<i64> = ports.iter().map(|&p| late_refusals(p)).collect();
    for round in 0..30 {
        for q in [&q0, &q1, &q2] {
            let (s, b) = app
                .post(&format!("/api/v1/queues/{q}/tasks"), json!({"payload": round}))
                .await;
            assert_eq!(s, 201, "submit to {q}: {b}");
            let got = crate::sharding::claim(&app, q, "w", 1, 0).await;
            assert_eq!(got.len(), 1, "claim of {q}");
            let (s, b) = app
                .post(
                    &format!("/api/v1/tasks/{}/complete", got[0].id),
                    json!({"token": got[0].token}),
                )
                .await;
            assert_eq!(s, 200, "complete in {q}: {b}");
        }
    }
    let late_after: Vec<i64> = ports.iter().map(|&p| late_refusals(p)).collect();
    assert_eq!(late_before, late_after, "no script was refused LATE on any master");

    // Held in transit past the timeout on the way to master 0 (2 s behind
    // master 2): answered 503, then refused there, never applied.
    let late0 = late_refusals(ports[0]);
    proxy.hold();
    let held = futures_util::future::join_all((0..5).map(|i| {
        let app = &app;
        let q0 = &q0;
        async move {
            app.post(&format!("/api/v1/queues/{q0}/tasks"), json!({"payload": {"held": i}}))
                .await
                .0
        }
    }));
    // Released well past the node's 2 s timeout: on two loaded cores the
    // node can start its calls hundreds of ms after they were posted.
    let released = async {
        tokio::time::sleep(Duration::from_millis(4000)).await;
        proxy.release();
    };
    let (statuses, _) = tokio::join!(held, released);
    assert!(
        statuses.iter().all(|&s| s == 503),
        "the held submits were answered 503: {statuses:?}"
    );
    let refused = wait_until(Duration::from_secs(10), || async {
        late_refusals(ports[0]) >= late0 + 5
    })
    .await;
    assert!(refused, "master 0 refused the held submits as late");
    // The link cut at the timeout reopens once the proxy lets it through.
    let mut read = (0, Value::Null);
    for _ in 0..50 {
        read = app.get(&format!("/api/v1/queues/{q0}")).await;
        if read.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (s, queue) = read;
    assert_eq!(s, 200, "{queue}");
    let queue: QueueDetail = serde_json::from_value(queue).unwrap();
    assert_eq!(
        queue.stats.queued, 0,
        "a submit answered 503 was applied later: {queue:?}"
    );
}

/// The ids of `queue`'s running tasks, over every shard (the listing reads
/// every shard that answers).
async fn running_ids(app: &TestApp, queue: &str) -> Vec<String> {
    let page = app.api().tasks(queue, "running", 500, None).await.unwrap();
    page.tasks.into_iter().map(|t| t.id).collect()
}

/// Audit finding 1: a claim over two shards on two masters whose second
/// master is frozen answers 200 with the first shard's tasks (and names the
/// shard not tried), and leaves no task `running` that the caller was not
/// given, after the thaw too; the same for a complete's `next`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_over_a_frozen_masters_shard_answers_what_it_claimed() {
    if skip_on_cluster("builds its own Redis Cluster (with a stalled master)") {
        return;
    }
    let cluster = TestCluster::start_opts(ClusterOpts {
        node_timeout_ms: 60_000,
        full_coverage: false,
        ..ClusterOpts::default()
    });
    let owners = master_of_shards(&cluster);
    let (healthy, frozen) = (cluster.ports()[0], cluster.ports()[1]);
    let app = node(&cluster, |_| {}).await;
    let q = queues(&owners, healthy, true, "fq", 1).remove(0);
    // A group whose shard is on the master to be frozen: its tasks of `q`
    // live there.
    let map = ShardMap::new("muster", SHARDS);
    let g = (0..)
        .map(|i| format!("fg{i}"))
        .find(|g| owners[map.home(g)] == frozen)
        .unwrap();
    let w = "w-frozen";
    let (s, b) = app
        .put(&format!("/api/v1/nodes/{w}/heartbeat"), json!({"ttl_ms": 120_000}))
        .await;
    assert_eq!(s, 200, "{b}");
    let submit = |n: usize, group: Option<&str>| {
        let (app, q) = (&app, &q);
        let group = group.map(str::to_string);
        async move {
            for _ in 0..n {
                let spec = TaskSpec {
                    group: group.clone(),
                    ..Default::default()
                };
                let b = app.api().submit(q, &spec).await.unwrap();
                assert_eq!(b.state, "queued", "{b:?}");
            }
        }
    };
    submit(10, None).await;
    submit(5, Some(&g)).await;
    let claim = |max: u32| {
        let (app, q) = (&app, &q);
        async move {
            app.post(&format!("/api/v1/queues/{q}/claim"), json!({"node": w, "max": max}))
                .await
        }
    };
    // The caller got them: it acknowledges each (or the claim lease would
    // put them back while the test runs).
    let ack = |tasks: Vec<ClaimedTask>| {
        let app = &app;
        async move {
            for t in &tasks {
                app.api().ack_task(&t.id, t.token).await.unwrap();
            }
            tasks
        }
    };
    let claimed = |b: &Value| serde_json::from_value::<NextTasks>(b.clone()).unwrap();
    // One claim first: the node learns which shards hold the queue.
    let (s, b) = claim(1).await;
    assert_eq!(s, 200, "{b}");
    let mut given: Vec<ClaimedTask> = ack(claimed(&b).tasks).await;
    let frozen_shard = map.home(&g);

    let thaw = cluster.node(1).freeze(Duration::from_secs(6));
    let (s, b) = claim(20).await;
    assert_eq!(s, 200, "a claim that claimed tasks answers them: {b}");
    let answer = claimed(&b);
    let got = ack(answer.tasks).await;
    assert_eq!(got.len(), 9, "the healthy shard's nine tasks: {b}");
    assert!(
        answer.shards_not_tried.contains(&frozen_shard),
        "the frozen shard is named: {b}"
    );
    given.extend(got);
    thaw.join().unwrap();

    // The same for a complete's `next`: the finish and what it claimed.
    submit(3, None).await;
    let thaw = cluster.node(1).freeze(Duration::from_secs(6));
    let first = given[0].clone();
    let (s, b) = app
        .post(
            &format!("/api/v1/tasks/{}/complete", first.id),
            json!({"token": first.token, "next": {"max": 10}}),
        )
        .await;
    assert_eq!(s, 200, "the finish stands: {b}");
    let finished: FinishedNext = serde_json::from_value(b.clone()).unwrap();
    assert_eq!(finished.state, "succeeded", "{b}");
    let answer = finished.next.unwrap();
    let next = ack(answer.tasks).await;
    assert_eq!(next.len(), 3, "the healthy shard's three new tasks: {b}");
    assert!(
        answer.shards_not_tried.contains(&frozen_shard),
        "the frozen shard is named: {b}"
    );
    given.extend(next);
    thaw.join().unwrap();

    // After the thaw (and a while after, for a late write to show): every
    // running task of the queue was given to the caller; the frozen shard's
    // tasks still wait, queued.
    let given: Vec<String> = given.iter().skip(1).map(|t| t.id.clone()).collect();
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let running = running_ids(&app, &q).await;
        let strays: Vec<&String> = running.iter().filter(|id| !given.contains(id)).collect();
        assert!(strays.is_empty(), "running under {w} but never given: {strays:?}");
        assert_eq!(running.len(), given.len(), "{running:?}");
    }
    let b = app.api().queue(&q).await.unwrap().stats;
    assert_eq!(b.queued, 5, "the frozen shard's tasks wait for a later claim: {b:?}");
}
