//! `muster barrier bench`: release latency after the last arrival.
//!
//! For each round, `participants - 1` participants arrive and long-poll for
//! the verdict (spread over the given nodes, round robin); once the round
//! shows all of them arrived, the last participant arrives and the clock
//! starts. Each waiter's latency is the time from sending the last arrival
//! to the typed client returning its own `released` answer: the decision
//! script, the event
//! through the stream, each node's tailer, the wake-up, the re-read and the
//! HTTP response. The report gives p50/p99/max over every waiter, and over
//! the slowest waiter of each round (the time until everyone may run).

use std::sync::Arc;
use std::time::{Duration, Instant};

use muster_client::{Arrive, Client, Verdict};

pub use super::latency::Latency;
use serde::Serialize;

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

/// One typed client per node URL, so each participant keeps to its node
/// (no failover: a node that fails fails the bench).
fn clients(o: &BenchOptions) -> Result<Vec<Client>, String> {
    o.urls
        .iter()
        .map(|u| {
            Client::builder()
                .url(u.as_str())
                .token_opt(o.token.clone())
                .retry_for(Duration::ZERO)
                .build()
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// Runs the benchmark and deletes its barrier afterwards.
pub async fn run(o: BenchOptions) -> Result<BenchReport, String> {
    if o.participants < 2 || o.urls.is_empty() || o.rounds == 0 {
        return Err("need at least 2 participants, 1 round and 1 node URL".into());
    }
    let nodes = Arc::new(clients(&o)?);
    let suffix = ulid::Ulid::generate().to_string().to_lowercase();
    let name = format!("bench-{}", &suffix[suffix.len() - 8..]);
    let parts: Vec<String> = (0..o.participants).map(|i| format!("p{i}")).collect();
    nodes[0]
        .put_barrier(&name, &parts, 0, 60_000)
        .await
        .map_err(|e| format!("configuring the barrier failed: {e}"))?;
    let mut waiter = Vec::new();
    let mut per_round = Vec::new();
    let mut last_call = Vec::new();
    let result = async {
        for round in 0..o.warmup + o.rounds {
            let (w, r, l) = one_round(&nodes, &name, &format!("r{round}"), &parts).await?;
            if round >= o.warmup {
                waiter.extend(w);
                per_round.push(r);
                last_call.push(l);
            }
        }
        Ok::<(), String>(())
    }
    .await;
    let _ = nodes[0].delete_barrier(&name).await;
    result?;
    Ok(BenchReport {
        participants: o.participants,
        rounds: o.rounds,
        nodes: nodes.len(),
        release_latency: Latency::of(waiter),
        round_release_latency: Latency::of(per_round),
        last_arrival_call: Latency::of(last_call),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One round: returns (each waiter's latency, the slowest, the last call), ms.
/// Latencies end when the typed client returned the answer (parsed: a few
/// microseconds for these small answers).
async fn one_round(
    nodes: &Arc<Vec<Client>>,
    name: &str,
    round: &str,
    parts: &[String],
) -> Result<(Vec<f64>, f64, f64), String> {
    let (last, waiters) = parts.split_last().ok_or("no participants")?;
    let mut tasks = Vec::new();
    for (i, p) in waiters.iter().enumerate() {
        let nodes = nodes.clone();
        let (name, round) = (name.to_string(), round.to_string());
        let arrive = Arrive {
            node: p.clone(),
            wait_ms: 30_000,
        };
        tasks.push(tokio::spawn(async move {
            let answer = nodes[i % nodes.len()].arrive(&name, &round, &arrive).await;
            (Instant::now(), answer)
        }));
    }
    // Every waiter has arrived (and is waiting) before the last one comes.
    let started = Instant::now();
    loop {
        let r = nodes[0].round(name, round).await;
        if let Ok(r) = &r
            && r.arrived.len() == waiters.len()
        {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err(format!("round {round}: the waiters did not all arrive: {r:?}"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let arrive = Arrive {
        node: last.clone(),
        wait_ms: 0,
    };
    let t0 = Instant::now();
    let v = nodes[(parts.len() - 1) % nodes.len()]
        .arrive(name, round, &arrive)
        .await
        .map_err(|e| format!("round {round}: the last arrival failed: {e}"))?;
    let last_call = ms(t0.elapsed());
    if v.verdict != Verdict::Released {
        return Err(format!("round {round}: the last arrival got {v:?}"));
    }
    let mut lat = Vec::with_capacity(tasks.len());
    for t in tasks {
        let (at, answer) = t.await.map_err(|e| e.to_string())?;
        match answer {
            Ok(v) if v.verdict == Verdict::Released && v.may_run => lat.push(ms(at.saturating_duration_since(t0))),
            other => return Err(format!("round {round}: a waiter got {other:?}")),
        }
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
