//! `muster barrier bench`: release latency after the last arrival.
//!
//! For each round, `participants - 1` participants arrive and long-poll for
//! the verdict (spread over the given nodes, round robin); once the round
//! shows all of them arrived, the last participant arrives and the clock
//! starts. Each waiter's latency is the time from sending the last arrival
//! to having received its own `released` answer (before the load generator
//! parses it): the decision script, the event
//! through the stream, each node's tailer, the wake-up, the re-read and the
//! HTTP response. The report gives p50/p99/max over every waiter, and over
//! the slowest waiter of each round (the time until everyone may run).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// One or more nodes; participants are spread over them.
    pub urls: Vec<String>,
    pub token: Option<String>,
    pub participants: usize,
    pub rounds: usize,
    /// Rounds run first and not measured.
    pub warmup: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub samples: usize,
}

impl Latency {
    fn of(mut v: Vec<f64>) -> Latency {
        if v.is_empty() {
            return Latency::default();
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
        Latency {
            p50_ms: q(0.50),
            p99_ms: q(0.99),
            max_ms: v[v.len() - 1],
            samples: v.len(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchReport {
    pub participants: usize,
    pub rounds: usize,
    pub nodes: usize,
    /// Last arrival sent -> each waiter's `released` answer.
    pub release_latency: Latency,
    /// Last arrival sent -> the slowest waiter's answer, per round.
    pub round_release_latency: Latency,
    /// The last arrival's own call (it decides the round).
    pub last_arrival_call: Latency,
}

struct Client {
    http: reqwest::Client,
    token: Option<String>,
}

impl Client {
    async fn send(&self, method: reqwest::Method, url: String, body: Option<Value>) -> Result<(u16, Value), String> {
        self.send_timed(method, url, body).await.map(|(_, s, v)| (s, v))
    }

    /// Also returns when the whole answer had arrived (before the client
    /// parses it: parsing is the load generator's cost, not the server's).
    async fn send_timed(
        &self,
        method: reqwest::Method,
        url: String,
        body: Option<Value>,
    ) -> Result<(Instant, u16, Value), String> {
        let mut req = self.http.request(method, url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
        let at = Instant::now();
        Ok((at, status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    }
}

/// Runs the benchmark and deletes its barrier afterwards.
pub async fn run(o: BenchOptions) -> Result<BenchReport, String> {
    if o.participants < 2 || o.urls.is_empty() || o.rounds == 0 {
        return Err("need at least 2 participants, 1 round and 1 node URL".into());
    }
    let http = reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(o.participants * 2)
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| e.to_string())?;
    let c = Arc::new(Client {
        http,
        token: o.token.clone(),
    });
    let urls: Vec<String> = o.urls.iter().map(|u| u.trim_end_matches('/').to_string()).collect();
    let suffix = ulid::Ulid::generate().to_string().to_lowercase();
    let name = format!("bench-{}", &suffix[suffix.len() - 8..]);
    let parts: Vec<String> = (0..o.participants).map(|i| format!("p{i}")).collect();
    let (status, body) = c
        .send(
            reqwest::Method::PUT,
            format!("{}/api/v1/barriers/{name}", urls[0]),
            Some(json!({"participants": parts, "max_missing": 0, "timeout_ms": 60_000})),
        )
        .await?;
    if status >= 300 {
        return Err(format!("configuring the barrier failed: {status} {body}"));
    }
    let mut waiter = Vec::new();
    let mut per_round = Vec::new();
    let mut last_call = Vec::new();
    let result = async {
        for round in 0..o.warmup + o.rounds {
            let (w, r, l) = one_round(&c, &urls, &name, &format!("r{round}"), &parts).await?;
            if round >= o.warmup {
                waiter.extend(w);
                per_round.push(r);
                last_call.push(l);
            }
        }
        Ok::<(), String>(())
    }
    .await;
    let _ = c
        .send(
            reqwest::Method::DELETE,
            format!("{}/api/v1/barriers/{name}", urls[0]),
            None,
        )
        .await;
    result?;
    Ok(BenchReport {
        participants: o.participants,
        rounds: o.rounds,
        nodes: urls.len(),
        release_latency: Latency::of(waiter),
        round_release_latency: Latency::of(per_round),
        last_arrival_call: Latency::of(last_call),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One round: returns (each waiter's latency, the slowest, the last call), ms.
async fn one_round(
    c: &Arc<Client>,
    urls: &[String],
    name: &str,
    round: &str,
    parts: &[String],
) -> Result<(Vec<f64>, f64, f64), String> {
    let (last, waiters) = parts.split_last().ok_or("no participants")?;
    let mut tasks = Vec::new();
    for (i, p) in waiters.iter().enumerate() {
        let c = c.clone();
        let url = format!("{}/api/v1/barriers/{name}/rounds/{round}/arrive", urls[i % urls.len()]);
        let body = json!({"node": p, "wait_ms": 30_000});
        tasks.push(tokio::spawn(async move {
            c.send_timed(reqwest::Method::POST, url, Some(body)).await
        }));
    }
    // Every waiter has arrived (and is waiting) before the last one comes.
    let get = format!("{}/api/v1/barriers/{name}/rounds/{round}", urls[0]);
    let started = Instant::now();
    loop {
        let (status, r) = c.send(reqwest::Method::GET, get.clone(), None).await?;
        if status == 200 && r["arrived"].as_array().map_or(0, Vec::len) == waiters.len() {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err(format!("round {round}: the waiters did not all arrive: {r}"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let url = format!(
        "{}/api/v1/barriers/{name}/rounds/{round}/arrive",
        urls[(parts.len() - 1) % urls.len()]
    );
    let t0 = Instant::now();
    let (at, status, v) = c
        .send_timed(reqwest::Method::POST, url, Some(json!({"node": last, "wait_ms": 0})))
        .await?;
    let last_call = ms(at.saturating_duration_since(t0));
    if status != 200 || v["verdict"] != "released" {
        return Err(format!("round {round}: the last arrival got {status} {v}"));
    }
    let mut lat = Vec::with_capacity(tasks.len());
    for t in tasks {
        let (at, status, v) = t.await.map_err(|e| e.to_string())??;
        if status != 200 || v["verdict"] != "released" || v["may_run"] != true {
            return Err(format!("round {round}: a waiter got {status} {v}"));
        }
        lat.push(ms(at.saturating_duration_since(t0)));
    }
    let slowest = lat.iter().cloned().fold(0.0, f64::max);
    Ok((lat, slowest, last_call))
}

/// The report as text.
pub fn render(r: &BenchReport) -> String {
    let row = |name: &str, l: &Latency| {
        format!(
            "{name:<34} p50 {:>7.2} ms   p99 {:>7.2} ms   max {:>7.2} ms   ({} samples)\n",
            l.p50_ms, l.p99_ms, l.max_ms, l.samples
        )
    };
    let mut out = format!(
        "barrier release latency: {} participants, {} rounds, {} node(s)\n",
        r.participants, r.rounds, r.nodes
    );
    out.push_str(&row("last arrival -> each waiter", &r.release_latency));
    out.push_str(&row("last arrival -> slowest waiter", &r.round_release_latency));
    out.push_str(&row("last arrival's own call", &r.last_arrival_call));
    out
}
