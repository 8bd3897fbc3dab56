//! Workers behind asymmetric, flapping and lossy links: nothing lost, nothing done twice, no false death.

use super::*;
use crate::common::skip_on_cluster;

/// What the workers of a run share: accepted completions (task, token) and
/// every claim's outcome.
#[derive(Default)]
struct Tally {
    completions: Mutex<Vec<(String, u64)>>,
    claims: Mutex<Vec<ClaimTry>>,
}

/// A worker loop: claims up to `max` through its nodes in order, "works"
/// 10 to 30 ms per task, completes through its nodes in order (retrying a
/// transport error or 5xx on the next node with the same token), until `stop`.
fn work(w: Worker, max: usize, tally: Arc<Tally>, stop: Arc<AtomicBool>, t0: Instant) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut seed =
            w.id.bytes()
                .fold(7u64, |a, b| a.wrapping_mul(31).wrapping_add(b as u64));
        while !stop.load(Ordering::Relaxed) {
            let sent = Instant::now();
            let r = w
                .any(
                    reqwest::Method::POST,
                    "/api/v1/queues/flaky/claim",
                    &json!({"node": w.id, "max": max, "wait_ms": 200}),
                )
                .await;
            let tasks = match &r {
                Some((200, b)) => claimed(b),
                _ => Vec::new(),
            };
            let status = r.as_ref().map_or(0, |(s, _)| *s);
            tally
                .claims
                .lock()
                .await
                .push((sent - t0, status, tasks.len(), sent.elapsed()));
            if status != 200 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            for t in tasks {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                tokio::time::sleep(Duration::from_millis(10 + (seed >> 33) % 20)).await;
                let (id, tok) = (t.id.clone(), t.token);
                let path = format!("/api/v1/tasks/{id}/complete");
                for _ in 0..20 {
                    match w
                        .any(
                            reqwest::Method::POST,
                            &path,
                            &json!({"token": tok, "result": {"by": w.id}}),
                        )
                        .await
                    {
                        Some((200, _)) => {
                            tally.completions.lock().await.push((id.clone(), tok));
                            break;
                        }
                        // Stale: recovered meanwhile, or an earlier try whose
                        // answer was lost already completed it.
                        Some(_) => break,
                        None => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            }
        }
    })
}

/// Checks G1 and G2 over a finished run: each task of `all` has exactly one
/// terminal event, `task.succeeded`; no task has accepted completions under
/// two tokens (a replayed completion under the same token is fine); and no
/// task was recovered from one of `live` (they never stopped heartbeating).
fn assert_exactly_once(evs: &[Event], all: &[String], completions: &[(String, u64)], live: &[&str]) {
    let terminal = terminal_states(evs);
    for id in all {
        assert_eq!(
            terminal.get(id).cloned().unwrap_or_default(),
            vec!["task.succeeded".to_string()],
            "task {id}"
        );
    }
    let mut tokens: HashMap<&str, HashSet<u64>> = HashMap::new();
    for (id, tok) in completions {
        tokens.entry(id).or_default().insert(*tok);
    }
    let doubles: Vec<_> = tokens.iter().filter(|(_, t)| t.len() > 1).collect();
    assert!(doubles.is_empty(), "tasks completed under two tokens: {doubles:?}");
    let false_deaths: Vec<_> = evs
        .iter()
        .filter(|(_, ty, node, f)| {
            (ty == "orphan.recovered" && live.contains(&data(f)["owner"].as_str().unwrap_or("")))
                || (ty == "node.dead" && live.contains(&node.as_str()))
        })
        .collect();
    assert!(
        false_deaths.is_empty(),
        "live workers or nodes taken for dead: {false_deaths:?}"
    );
}

/// Asymmetric and flapping cuts between workers and nodes (G1, G2, G3):
/// w1's requests to n1 are dropped; then n1's answers to w1 are (the
/// request is applied, the worker never hears: ambiguous claims and
/// completions); then w1-n1 and w2-n2 flap every 300 ms. Each worker
/// always reaches one node. Every task succeeds exactly once, under one
/// token, and neither worker is ever taken for dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asymmetric_and_flapping_worker_partitions_lose_and_double_nothing() {
    if skip_on_cluster("network namespaces around one Redis server") {
        return;
    }
    const TEST: &str = "asymmetric_and_flapping_worker_partitions_lose_and_double_nothing";
    let Some(net) = Net::new_or_skip(TEST) else { return };
    let t0 = Instant::now();
    let rdir = tempfile::tempdir().unwrap();
    let rh = net.host("redis");
    let _redis = start_redis(&rh, rdir.path()).await;
    let url = format!("redis://{}:{REDIS_PORT}", rh.ip);
    let (h1, h2) = (net.host("n1"), net.host("n2"));
    let p = std::process::id();
    let n1 = NsNode::start(&h1, &format!("flap-n1-{p}"), &url, "", &[]).await;
    let n2 = NsNode::start(&h2, &format!("flap-n2-{p}"), &url, "", &[]).await;
    let (wh1, wh2) = (net.local(&format!("fw1-{p}")), net.local(&format!("fw2-{p}")));
    let timeout = Duration::from_millis(800);
    let w1 = Worker::new(&wh1, &[&n1, &n2], timeout);
    let w2 = Worker::new(&wh2, &[&n2, &n1], timeout);
    const WTTL: u64 = 2500;
    let stop = Arc::new(AtomicBool::new(false));
    assert!(w1.heartbeat(WTTL).await && w2.heartbeat(WTTL).await);
    let hbs = [w1.heartbeats(WTTL, stop.clone()), w2.heartbeats(WTTL, stop.clone())];

    // A task whose claim answer was lost comes back after its timeout.
    let extra = json!({"max_attempts": 10, "timeout_ms": 3000});
    let mut all = submit(&n2, "flaky", 100, "flap-0", extra.clone()).await;
    let tally = Arc::new(Tally::default());
    let workers = [
        work(w1.clone(), 2, tally.clone(), stop.clone(), t0),
        work(w2.clone(), 2, tally.clone(), stop.clone(), t0),
    ];
    let phase = |d: u64| tokio::time::sleep(Duration::from_millis(d));
    phase(1000).await;
    // Answers lost: n1 -> w1 dropped, w1 -> n1 flows (pooled connections
    // carry requests that are applied).
    net.cut_oneway(&h1, &wh1);
    all.extend(submit(&n2, "flaky", 50, "flap-1", extra.clone()).await);
    phase(2500).await;
    net.heal(&h1, &wh1);
    // Requests lost: w1 -> n1 dropped.
    net.cut_oneway(&wh1, &h1);
    all.extend(submit(&n2, "flaky", 50, "flap-2", extra.clone()).await);
    phase(2500).await;
    net.heal(&wh1, &h1);
    // Flapping: w1-n1 and w2-n2 cut and healed every 300 ms.
    all.extend(submit(&n2, "flaky", 50, "flap-3", extra.clone()).await);
    for i in 0..14 {
        if i % 2 == 0 {
            net.cut(&wh1, &h1);
            net.cut(&wh2, &h2);
        } else {
            net.heal(&wh1, &h1);
            net.heal(&wh2, &h2);
        }
        phase(300).await;
    }
    net.heal(&wh1, &h1);
    net.heal(&wh2, &h2);
    let faults_over = t0.elapsed();

    let done = wait_until(Duration::from_secs(30), || async {
        let t = terminal_states(&events(rh.ip).await);
        all.iter().all(|id| t.contains_key(id))
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for h in workers {
        h.await.unwrap();
    }
    for h in hbs {
        h.abort();
    }
    let evs = events(rh.ip).await;
    let terminal = terminal_states(&evs);
    let open: Vec<_> = all.iter().filter(|id| !terminal.contains_key(*id)).collect();
    assert!(done, "{} of {} tasks never finished: {open:?}", open.len(), all.len());
    let completions = tally.completions.lock().await.clone();
    assert_exactly_once(&evs, &all, &completions, &[&w1.id, &w2.id, &n1.id, &n2.id]);
    let timeouts = evs
        .iter()
        .filter(|(_, ty, _, f)| ty == "task.retrying" && f.get("data").is_some_and(|d| d.contains("timeout")))
        .count();
    let claims = tally.claims.lock().await;
    eprintln!(
        "{TEST}: {} tasks succeeded once each ({} accepted completions, {} retried after a timeout); {} claims, {} \
         failed on every node; faults over after {faults_over:?}, test took {:?}",
        all.len(),
        completions.len(),
        timeouts,
        claims.len(),
        claims.iter().filter(|c| c.1 == 0).count(),
        t0.elapsed()
    );
}

/// 30 % packet loss and 500 ms of latency between a node and Redis (G2,
/// G3): n1 reaches Redis through a proxy that delays each chunk 250 ms
/// each way, and drops 30 % of the packets it sends there. Its two workers
/// talk to n1 only. Neither n1 nor a worker is ever taken for dead, every
/// task succeeds exactly once, and n1 answers every claim within twice its
/// Redis deadline (work or a 503, never a hang).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_slow_link_to_redis_no_false_death_no_lost_task() {
    if skip_on_cluster("network namespaces around one Redis server") {
        return;
    }
    const TEST: &str = "lossy_slow_link_to_redis_no_false_death_no_lost_task";
    let Some(net) = Net::new_or_skip(TEST) else { return };
    let t0 = Instant::now();
    let rdir = tempfile::tempdir().unwrap();
    let rh = net.host("redis");
    let _redis = start_redis(&rh, rdir.path()).await;
    let url = format!("redis://{}:{REDIS_PORT}", rh.ip);
    let ph = net.local("proxy");
    let proxy = crate::common::FaultProxy::start_at(ph.ip.into(), (rh.ip, REDIS_PORT).into()).await;
    let (h1, h2) = (net.host("n1"), net.host("n2"));
    let p = std::process::id();
    // Deadlines for a 500 ms round trip: a Redis call may take 2 s, a node
    // lives 6 s without a heartbeat (each node checks its peers by its own
    // ttl, so both get the same).
    const TIMEOUT_MS: u64 = 2000;
    let cfg = format!("[redis]\ntimeout_ms = {TIMEOUT_MS}\n[nodes]\nheartbeat_ms = 500\nttl_ms = 6000\n");
    let n1 = NsNode::start(
        &h1,
        &format!("lossy-n1-{p}"),
        &format!("redis://{}:{}", ph.ip, proxy.port),
        &cfg,
        &[],
    )
    .await;
    let n2 = NsNode::start(&h2, &format!("lossy-n2-{p}"), &url, &cfg, &[]).await;
    let (wh1, wh2) = (net.local(&format!("lw1-{p}")), net.local(&format!("lw2-{p}")));
    let timeout = Duration::from_secs(10);
    let w1 = Worker::new(&wh1, &[&n1], timeout);
    let w2 = Worker::new(&wh2, &[&n1], timeout);
    const WTTL: u64 = 6000;
    let stop = Arc::new(AtomicBool::new(false));
    assert!(w1.heartbeat(WTTL).await && w2.heartbeat(WTTL).await);
    let hbs = [w1.heartbeats(WTTL, stop.clone()), w2.heartbeats(WTTL, stop.clone())];

    proxy.set_latency(Duration::from_millis(250), Duration::ZERO);
    net.lose(&h1, &ph, 0.3);
    let faulty = Instant::now();
    let all = submit(&n2, "flaky", 24, "lossy", json!({"max_attempts": 10})).await;
    let tally = Arc::new(Tally::default());
    let workers = [
        work(w1.clone(), 3, tally.clone(), stop.clone(), t0),
        work(w2.clone(), 3, tally.clone(), stop.clone(), t0),
    ];
    let done = wait_until(Duration::from_secs(60), || async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = terminal_states(&events(rh.ip).await);
        all.iter().all(|id| t.contains_key(id))
    })
    .await;
    let took = faulty.elapsed();
    stop.store(true, Ordering::Relaxed);
    for h in workers {
        h.await.unwrap();
    }
    // The liveness verdicts of the whole run are in before the link heals.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for h in hbs {
        h.abort();
    }
    let evs = events(rh.ip).await;
    let terminal = terminal_states(&evs);
    let open: Vec<_> = all.iter().filter(|id| !terminal.contains_key(*id)).collect();
    assert!(
        done,
        "{} of {} tasks never finished over the lossy link: {open:?}",
        open.len(),
        all.len()
    );
    let completions = tally.completions.lock().await.clone();
    assert_exactly_once(&evs, &all, &completions, &[&w1.id, &w2.id, &n1.id, &n2.id]);
    let claims = tally.claims.lock().await.clone();
    let mut lat: Vec<Duration> = claims.iter().map(|c| c.3).collect();
    lat.sort();
    let pct = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize];
    let bound = Duration::from_millis(2 * TIMEOUT_MS + 200 + 500);
    let slow: Vec<_> = claims.iter().filter(|c| c.3 > bound).collect();
    eprintln!(
        "{TEST}: {} tasks succeeded once each in {took:?} over 30 % loss + 500 ms RTT; {} claims ({} got a 503 or no answer), \
         claim answer p50 {:?} p99 {:?} max {:?} (bound {bound:?}); test took {:?}",
        all.len(),
        claims.len(),
        claims.iter().filter(|c| c.1 == 0).count(),
        pct(0.5),
        pct(0.99),
        lat.last().unwrap(),
        t0.elapsed()
    );
    assert!(slow.is_empty(), "claims answered later than {bound:?}: {slow:?}");
}
