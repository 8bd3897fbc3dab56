//! `muster bench`: end-to-end task throughput through a running node, with
//! the Redis bound measured in the same run.
//!
//! Phase 1 (peak): producers submit `tasks` tasks in batches while `workers`
//! REST workers drain them with batch claim and batch complete, as fast as
//! they can. Phase 2 (half load): the same at half the measured peak rate;
//! claim latency is measured there, where it reflects service time rather
//! than queueing. Around phase 1 the bench reads `INFO commandstats` and
//! `INFO cpu` from the node's Redis, and afterwards runs `redis-benchmark`
//! (unpipelined EVALSHA of a trivial script) against the same Redis, so the
//! result is also a ratio to what this Redis can do on this machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;

pub use super::latency::Latency;
use super::redis_stats::{command_calls, cpu_seconds, info, redis_benchmark};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub url: String,
    pub token: Option<String>,
    pub tasks: usize,
    pub workers: usize,
    pub batch: usize,
    pub producers: usize,
    pub queue: String,
    /// Spread the tasks over this many queues (`<queue>-0` …): a namespace
    /// split into shards spreads queues, not the tasks of one queue.
    pub queues: usize,
    /// Redis to read stats from and run redis-benchmark against; default: the
    /// node's own (from `GET /api/v1/redis`).
    pub redis_url: Option<String>,
    /// Skip phase 2.
    pub skip_half_load: bool,
    /// Phase 2 at this rate (tasks/s) instead of half the peak.
    pub latency_rate: Option<f64>,
    /// Skip redis-benchmark.
    pub skip_baseline: bool,
    /// At batch 1, complete and claim the next task in one call.
    pub claim_next: bool,
    /// Drain through the `muster::client::Worker` library instead of raw
    /// REST calls: `workers` Workers, each running `batch` handlers at once
    /// and claiming up to `batch` tasks per call (the handler returns at
    /// once), so the difference to a raw run is what the library costs.
    pub via_worker: bool,
    /// Queue every task before the peak phase's clock starts (batch
    /// submits), so its rate is the drain's alone: no submit shares the
    /// node while the workers run. For comparing drains (a worker library
    /// against raw calls); phase 2 ignores it.
    pub prefill: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchReport {
    /// `http` (raw REST calls) or `worker` (the Worker library).
    pub via: String,
    /// Whether the tasks were queued before the clock started (`--prefill`).
    pub prefill: bool,
    pub tasks: usize,
    pub workers: usize,
    pub batch: usize,
    pub peak_tasks_per_sec: f64,
    pub peak_seconds: f64,
    pub claim_latency_peak: Latency,
    pub half_load_tasks_per_sec: f64,
    /// Whether the latency phase ran at `--latency-rate` (not half the peak).
    pub latency_rate_set: bool,
    pub claim_latency_half_load: Latency,
    /// The latency phase's claims that got a task (the others found the
    /// queue empty).
    pub claim_latency_half_load_hits: Latency,
    /// Commands executed by Redis per task, counting the ones inside scripts.
    pub redis_commands_per_task: f64,
    /// Commands sent by the node per task (FCALL and plain commands).
    pub redis_round_trips_per_task: f64,
    /// Fraction of one core Redis used during phase 1.
    pub redis_cpu_utilisation: f64,
    /// Redis CPU (user + system, from `INFO cpu`) per task in phase 1, µs.
    pub redis_cpu_us_per_task: f64,
    /// Script calls (FCALL) per task in phase 1, background loops included.
    pub script_calls_per_task: f64,
    /// Claims that found nothing, per task in phase 1 (the node's
    /// `muster_claims_empty_total`).
    pub empty_claims_per_task: f64,
    pub redis_benchmark_evalsha_per_sec: Option<f64>,
    /// peak_tasks_per_sec / redis_benchmark_evalsha_per_sec.
    pub ratio_to_redis: Option<f64>,
    pub redis_version: String,
    pub redis_address: String,
}

/// The bench's calls, through the typed client's one HTTP path with no
/// retries (a failed call fails the run).
struct Client {
    api: muster_client::Client,
}

impl Client {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> anyhow::Result<(u16, Value)> {
        let opts = muster_client::CallOptions::new(muster_client::Retry::Never);
        let a = self.api.raw(method, path, body, &opts).await?;
        Ok((a.status, a.json()))
    }

    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    async fn put(&self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        self.send(reqwest::Method::PUT, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let (status, v) = self.send(reqwest::Method::GET, path, None).await?;
        anyhow::ensure!(status == 200, "GET {path}: {status} {v}");
        Ok(v)
    }
}

/// The node's count of empty claims, from its `/metrics`.
async fn empty_claims(client: &Client) -> f64 {
    let text = client.api.metrics().await.unwrap_or_default();
    text.lines()
        .filter_map(|l| l.strip_prefix("muster_claims_empty_total "))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// Runs the benchmark and returns its report.
pub async fn run(opts: BenchOptions) -> anyhow::Result<BenchReport> {
    let client = Arc::new(Client {
        api: muster_client::Client::builder()
            .url(opts.url.clone())
            .token_opt(opts.token.clone())
            .timeout(Duration::from_secs(30))
            .build()?,
    });
    let summary = client.get("/api/v1/redis").await?;
    let redis_url = match &opts.redis_url {
        Some(u) => u.clone(),
        None => summary["address"].as_str().unwrap_or("").to_string(),
    };
    if redis_url.contains("***") {
        anyhow::bail!("the node's Redis URL has a password; pass it with --redis-url");
    }
    let redis_client = redis::Client::open(redis_url.as_str())?;
    let mut rconn = redis_client.get_multiplexed_async_connection().await?;
    let mut report = BenchReport {
        via: if opts.via_worker { "worker" } else { "http" }.into(),
        prefill: opts.prefill,
        tasks: opts.tasks,
        workers: opts.workers,
        batch: opts.batch,
        redis_version: summary["version"].as_str().unwrap_or("").into(),
        redis_address: redis_url.clone(),
        ..Default::default()
    };
    for w in 0..opts.workers {
        let (s, b) = client
            .put(
                &format!("/api/v1/nodes/bench-w{w}/heartbeat"),
                &json!({"ttl_ms": 600_000}),
            )
            .await?;
        anyhow::ensure!(s == 200, "worker registration failed: {s} {b}");
    }
    // Warm-up: loads the scripts and the connection pools.
    let warm = format!("{}-warm", opts.queue);
    phase(&client, &warm, 2000.min(opts.tasks), &opts, None).await?;

    let empty_before = empty_claims(&client).await;
    let before = info(&mut rconn, "commandstats").await?;
    let cpu_before = cpu_seconds(&info(&mut rconn, "cpu").await?);
    let peak = phase(&client, &opts.queue, opts.tasks, &opts, None).await?;
    let after = info(&mut rconn, "commandstats").await?;
    let cpu_after = cpu_seconds(&info(&mut rconn, "cpu").await?);
    let empty_after = empty_claims(&client).await;
    let (all0, sent0, scripts0) = command_calls(&before);
    let (all1, sent1, scripts1) = command_calls(&after);
    let n = opts.tasks as f64;
    report.script_calls_per_task = (scripts1 - scripts0) as f64 / n;
    report.redis_cpu_us_per_task = (cpu_after - cpu_before) * 1e6 / n;
    report.empty_claims_per_task = (empty_after - empty_before) / n;
    report.peak_seconds = peak.seconds;
    report.peak_tasks_per_sec = opts.tasks as f64 / peak.seconds;
    report.claim_latency_peak = Latency::of(peak.claim_ms);
    report.redis_commands_per_task = (all1 - all0) as f64 / opts.tasks as f64;
    report.redis_round_trips_per_task = (sent1 - sent0) as f64 / opts.tasks as f64;
    report.redis_cpu_utilisation = (cpu_after - cpu_before) / peak.seconds;

    // The Worker's claims are not timed one by one: no latency phase for it.
    if !opts.skip_half_load && !opts.via_worker {
        let rate = opts.latency_rate.unwrap_or(report.peak_tasks_per_sec / 2.0);
        // Five seconds' worth, at least 1 000 tasks (at least 250 at a set
        // rate, so a low one ends in seconds).
        let least = if opts.latency_rate.is_some() { 250 } else { 1000 };
        let n = ((rate * 5.0) as usize).clamp(least, opts.tasks.max(least));
        let half = phase(&client, &format!("{}-half", opts.queue), n, &opts, Some(rate)).await?;
        report.half_load_tasks_per_sec = n as f64 / half.seconds;
        report.latency_rate_set = opts.latency_rate.is_some();
        report.claim_latency_half_load = Latency::of(half.claim_ms);
        report.claim_latency_half_load_hits = Latency::of(half.hit_ms);
    }
    if !opts.skip_baseline {
        report.redis_benchmark_evalsha_per_sec = redis_benchmark(&mut rconn, &redis_url).await.ok();
        report.ratio_to_redis = report
            .redis_benchmark_evalsha_per_sec
            .map(|r| report.peak_tasks_per_sec / r);
    }
    Ok(report)
}

struct PhaseResult {
    seconds: f64,
    claim_ms: Vec<f64>,
    /// The claims that got a task.
    hit_ms: Vec<f64>,
}

/// Submits `n` tasks (at `rate` per second, or as fast as possible) while the
/// workers drain the queue; returns when all are complete. At full speed the
/// workers long-poll their claims, as real workers do, and at batch 1 each
/// completes a task and claims its next one in the same call (`next`); at a
/// set rate they poll without waiting, so the claim latency measured there
/// is the service time, not time spent waiting for work.
async fn phase(
    client: &Arc<Client>,
    queue: &str,
    n: usize,
    opts: &BenchOptions,
    rate: Option<f64>,
) -> anyhow::Result<PhaseResult> {
    let queues: Arc<Vec<String>> = Arc::new(if opts.queues <= 1 {
        vec![queue.to_string()]
    } else {
        (0..opts.queues).map(|i| format!("{queue}-{i}")).collect()
    });
    let completed = Arc::new(AtomicU64::new(0));
    let submitted = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let claim_ms: Arc<Mutex<Vec<f64>>> = Arc::default();
    let hit_ms: Arc<Mutex<Vec<f64>>> = Arc::default();
    let finished_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let payload = json!({"kind": "bench", "data": "x".repeat(64)});
    let prefill = opts.prefill && rate.is_none();
    if prefill {
        let mut round = 0;
        let mut left = n;
        while left > 0 {
            let k = left.min(1000);
            let queue = &queues[round % queues.len()];
            round += 1;
            let tasks: Vec<Value> = (0..k).map(|_| json!({"payload": payload})).collect();
            let (s, b) = client
                .post(&format!("/api/v1/queues/{queue}/tasks/batch"), &json!({"tasks": tasks}))
                .await?;
            anyhow::ensure!(s == 200, "prefill failed: {s} {b}");
            left -= k;
        }
    }
    let start = Instant::now();
    let mut handles = Vec::new();
    let per_producer = n.div_ceil(opts.producers.max(1));
    for p in (0..opts.producers.max(1)).filter(|_| !prefill) {
        let client = client.clone();
        let submitted = submitted.clone();
        let failed = failed.clone();
        let queues = queues.clone();
        let payload = payload.clone();
        let batch = opts.batch;
        let count = per_producer.min(n.saturating_sub(p * per_producer));
        let producers = opts.producers.max(1) as f64;
        handles.push(tokio::spawn(async move {
            let mut sent = 0;
            let mut round = p;
            while sent < count {
                let k = batch.min(count - sent);
                // Each request to the next queue in turn.
                let queue = &queues[round % queues.len()];
                round += 1;
                if let Some(r) = rate {
                    let due = start + Duration::from_secs_f64((sent as f64) / (r / producers));
                    tokio::time::sleep_until(due.into()).await;
                }
                let res = if batch == 1 {
                    client
                        .post(&format!("/api/v1/queues/{queue}/tasks"), &json!({"payload": payload}))
                        .await
                        .map(|(s, b)| (if s == 201 { 200 } else { s }, b))
                } else {
                    let tasks: Vec<Value> = (0..k).map(|_| json!({"payload": payload})).collect();
                    client
                        .post(&format!("/api/v1/queues/{queue}/tasks/batch"), &json!({"tasks": tasks}))
                        .await
                };
                match res {
                    Ok((200, _)) => {}
                    other => {
                        tracing::error!(?other, "submit failed");
                        failed.store(true, Ordering::Relaxed);
                        return;
                    }
                }
                sent += k;
                submitted.fetch_add(k as u64, Ordering::Relaxed);
            }
        }));
    }
    let long_poll = rate.is_none();
    let use_next = opts.batch == 1 && opts.claim_next;
    if opts.via_worker {
        anyhow::ensure!(queues.len() == 1, "--via worker drains one queue: leave --queues at 1");
        handles.push(tokio::spawn(drain_with_workers(
            client.api.clone(),
            queue.to_string(),
            n,
            opts.workers,
            opts.batch,
            failed.clone(),
            finished_at.clone(),
        )));
    }
    for w in (0..opts.workers).filter(|_| !opts.via_worker) {
        let client = client.clone();
        let completed = completed.clone();
        let failed = failed.clone();
        let claim_ms = claim_ms.clone();
        let hit_ms = hit_ms.clone();
        let finished_at = finished_at.clone();
        let queues = queues.clone();
        let batch = opts.batch;
        handles.push(tokio::spawn(async move {
            let node = format!("bench-w{w}");
            // Each claim from the next queue in turn, starting at the
            // worker's own.
            let mut turn = w;
            let mut queue = queues[turn % queues.len()].clone();
            // Empty claims in a row: a worker long-polls a queue only after
            // a whole turn found every queue empty, so it does not wait on
            // one queue while others have work.
            let mut empty = 0;
            let mut local = Vec::new();
            let mut hits = Vec::new();
            let mut held: Vec<Value> = Vec::new();
            while completed.load(Ordering::Relaxed) < n as u64 && !failed.load(Ordering::Relaxed) {
                if held.is_empty() {
                    queue = queues[turn % queues.len()].clone();
                    turn += 1;
                    let t = Instant::now();
                    let wait = if long_poll && empty >= queues.len() - 1 { 200 } else { 0 };
                    let res = client
                        .post(
                            &format!("/api/v1/queues/{queue}/claim"),
                            &json!({"node": node, "max": batch, "wait_ms": wait}),
                        )
                        .await;
                    let ms = t.elapsed().as_secs_f64() * 1000.0;
                    local.push(ms);
                    match res {
                        Ok((200, body)) => {
                            held = body["tasks"].as_array().cloned().unwrap_or_default();
                            hits.push(ms);
                            empty = 0;
                        }
                        Ok((204, _)) => {
                            empty += 1;
                            if !long_poll {
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                            continue;
                        }
                        other => {
                            tracing::error!(?other, "claim failed");
                            failed.store(true, Ordering::Relaxed);
                            break;
                        }
                    }
                }
                let (res, k) = if use_next {
                    let t = held.remove(0);
                    // On an empty queue the complete waits for the next
                    // task itself, as a long-poll claim would.
                    let wait = if long_poll { 200 } else { 0 };
                    let next = json!({"max": 1, "queue": queue, "wait_ms": wait});
                    let body = json!({"token": t["token"], "result": true, "next": next});
                    let id = t["id"].as_str().unwrap_or("");
                    (client.post(&format!("/api/v1/tasks/{id}/complete"), &body).await, 1)
                } else {
                    let items: Vec<Value> = held
                        .drain(..)
                        .map(|t| json!({"id": t["id"], "token": t["token"], "result": true}))
                        .collect();
                    let k = items.len();
                    (client.post("/api/v1/tasks/complete", &Value::Array(items)).await, k)
                };
                match res {
                    Ok((200, body)) => {
                        if use_next {
                            held = body["next"]["tasks"].as_array().cloned().unwrap_or_default();
                        }
                        if completed.fetch_add(k as u64, Ordering::Relaxed) + k as u64 >= n as u64 {
                            finished_at.lock().await.get_or_insert_with(Instant::now);
                        }
                    }
                    other => {
                        tracing::error!(?other, "complete failed");
                        failed.store(true, Ordering::Relaxed);
                        break;
                    }
                }
            }
            claim_ms.lock().await.extend(local);
            hit_ms.lock().await.extend(hits);
        }));
    }
    for h in handles {
        h.await?;
    }
    anyhow::ensure!(!failed.load(Ordering::Relaxed), "a request failed; see the log");
    // Until the last completion, not until every long poll has returned.
    let end = finished_at.lock().await.unwrap_or_else(Instant::now);
    let seconds = end.duration_since(start).as_secs_f64();
    let claim_ms = std::mem::take(&mut *claim_ms.lock().await);
    let hit_ms = std::mem::take(&mut *hit_ms.lock().await);
    Ok(PhaseResult {
        seconds,
        claim_ms,
        hit_ms,
    })
}

/// Drains `n` tasks of `queue` with `workers` Workers (ids `bench-w<i>`),
/// each with concurrency and batch `batch`; records when the last task was
/// completed (as the server acknowledged it), then shuts them down.
async fn drain_with_workers(
    api: muster_client::Client,
    queue: String,
    n: usize,
    workers: usize,
    batch: usize,
    failed: Arc<AtomicBool>,
    finished_at: Arc<Mutex<Option<Instant>>>,
) {
    use muster_client::Worker;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut all = Vec::new();
    for w in 0..workers {
        let built = Worker::builder(api.clone())
            .queue(queue.clone())
            .id(format!("bench-w{w}"))
            .concurrency(batch)
            .batch(batch as u32)
            .ttl(Duration::from_secs(600))
            .claim_wait(Duration::from_millis(200))
            .handler(|_task, _ctx| async { Ok(Value::Bool(true)) })
            .build();
        let worker = match built {
            Ok(w) => Arc::new(w),
            Err(e) => {
                tracing::error!(error = %e, "cannot build a worker");
                failed.store(true, Ordering::Relaxed);
                return;
            }
        };
        let stop = stop.clone();
        let run = tokio::spawn({
            let worker = worker.clone();
            async move { worker.run_until(stop.cancelled_owned()).await }
        });
        all.push((worker, run));
    }
    loop {
        let stats: Vec<_> = all.iter().map(|(w, _)| w.stats()).collect();
        let done: u64 = stats.iter().map(|s| s.completed).sum();
        if done >= n as u64 {
            finished_at.lock().await.get_or_insert_with(Instant::now);
            break;
        }
        if stats.iter().any(|s| s.failed + s.dropped > 0) || all.iter().any(|(_, r)| r.is_finished()) {
            tracing::error!(?stats, "a worker failed or dropped a task, or stopped");
            failed.store(true, Ordering::Relaxed);
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    stop.cancel();
    for (_, run) in all {
        let _ = run.await;
    }
}

/// A human-readable summary.
pub fn render(r: &BenchReport) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "tasks {}  workers {}  batch {}  via {}{}  Redis {} at {}\n",
        r.tasks,
        r.workers,
        r.batch,
        r.via,
        if r.prefill { "  prefilled" } else { "" },
        r.redis_version,
        r.redis_address
    ));
    s.push_str(&format!(
        "peak:       {:>9.0} tasks/s ({:.2} s)\n",
        r.peak_tasks_per_sec, r.peak_seconds
    ));
    s.push_str(&format!(
        "  claim latency p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms ({} claims)\n",
        r.claim_latency_peak.p50_ms,
        r.claim_latency_peak.p99_ms,
        r.claim_latency_peak.max_ms,
        r.claim_latency_peak.samples
    ));
    s.push_str(&format!(
        "  Redis: {:.1} µs CPU/task, {:.1} commands/task, {:.2} script calls/task ({:.2} round trips/task), \
         {:.3} empty claims/task, {:.0}% of a core\n",
        r.redis_cpu_us_per_task,
        r.redis_commands_per_task,
        r.script_calls_per_task,
        r.redis_round_trips_per_task,
        r.empty_claims_per_task,
        r.redis_cpu_utilisation * 100.0
    ));
    if r.half_load_tasks_per_sec > 0.0 {
        s.push_str(&format!(
            "{}{:>9.0} tasks/s; claim latency p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms\n",
            if r.latency_rate_set {
                "set rate:   "
            } else {
                "half load:  "
            },
            r.half_load_tasks_per_sec,
            r.claim_latency_half_load.p50_ms,
            r.claim_latency_half_load.p99_ms,
            r.claim_latency_half_load.max_ms
        ));
        s.push_str(&format!(
            "  the claims that got a task: p50 {:.2} ms  p99 {:.2} ms ({} of {} claims)\n",
            r.claim_latency_half_load_hits.p50_ms,
            r.claim_latency_half_load_hits.p99_ms,
            r.claim_latency_half_load_hits.samples,
            r.claim_latency_half_load.samples
        ));
    }
    if let (Some(b), Some(ratio)) = (r.redis_benchmark_evalsha_per_sec, r.ratio_to_redis) {
        s.push_str(&format!(
            "redis-benchmark EVALSHA (unpipelined, 50 clients): {b:.0}/s; muster/Redis = {ratio:.2}\n"
        ));
    }
    s
}
