//! The failover coordinator: watches the master, runs the rounds, keeps the
//! other servers replicating the master.
//!
//! A round: `ping` every client (each must answer `pong`: it cannot reach the
//! master either), `invalidate` every client (each stops using the master and
//! empties its master file), promote the replica with the highest replication
//! offset (`REPLICAOF NO ONE`), then `reconfigure` every client with the new
//! master. Each client runs the epoch script on the new master before it uses
//! it (the coordinator, a client of itself, first). If any client does not
//! answer as required in `answer_timeout_ms`, the round is cancelled before
//! anything is promoted, and retried after a backoff that doubles up to
//! `max_backoff_ms`. Clients invalidated by a cancelled round stay without a
//! master (they serve no Redis calls) until a later round or the next
//! re-publication of the healthy master names one: never a different one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Failover, Kind, MASTER_FILE, Message, SECRET_HEADER, now_ms, probe_master};
use crate::config::{FailoverConfig, RedisConfig};
use crate::store::ServerAuth;

pub(crate) use muster_api::system::{CoordinatorStatus, RoundStatus};

#[derive(Default)]
struct State {
    master: String,
    failures: u32,
    promotions: u64,
    round: Option<RoundStatus>,
    history: Vec<RoundStatus>,
    last_round_id: u64,
}

struct Inner {
    node_id: String,
    cfg: FailoverConfig,
    auth: ServerAuth,
    data_dir: PathBuf,
    nodes: Arc<crate::nodes::Nodes>,
    http: reqwest::Client,
    state: Mutex<State>,
    urls: RwLock<BTreeMap<String, String>>,
}

#[derive(Clone)]
pub(crate) struct Coordinator {
    inner: Arc<Inner>,
}

const HISTORY: usize = 10;

impl Coordinator {
    pub(crate) fn new(
        node_id: &str,
        cfg: &FailoverConfig,
        redis_cfg: &RedisConfig,
        data_dir: &Path,
        nodes: Arc<crate::nodes::Nodes>,
    ) -> Coordinator {
        Coordinator {
            inner: Arc::new(Inner {
                node_id: node_id.to_string(),
                cfg: cfg.clone(),
                auth: ServerAuth::from_config(redis_cfg),
                data_dir: data_dir.to_path_buf(),
                nodes,
                // No pooled connections: a message to a dead peer must fail
                // (connection refused), not reach a lingering keep-alive
                // connection; rounds are rare enough to connect each time.
                http: reqwest::Client::builder()
                    .pool_max_idle_per_host(0)
                    .timeout(Duration::from_millis(cfg.answer_timeout_ms))
                    .build()
                    .unwrap_or_default(),
                state: Mutex::new(State::default()),
                urls: RwLock::new(
                    cfg.clients
                        .iter()
                        .filter_map(|c| c.split_once('='))
                        .map(|(id, url)| (id.to_string(), url.to_string()))
                        .collect(),
                ),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn status(&self) -> CoordinatorStatus {
        let st = self.state();
        let urls = self.inner.urls.read().unwrap_or_else(|p| p.into_inner());
        CoordinatorStatus {
            master: st.master.clone(),
            redis_servers: self.inner.cfg.redis_servers.clone(),
            failures: st.failures,
            promotions: st.promotions,
            clients: self
                .clients()
                .into_iter()
                .map(|id| {
                    let url = if id == self.inner.node_id {
                        "(this node)".to_string()
                    } else {
                        urls.get(&id).cloned().unwrap_or_else(|| "(address unknown)".into())
                    };
                    (id, url)
                })
                .collect(),
            round: st.round.clone(),
            history: st.history.clone(),
        }
    }

    /// Every client id, this node included, once.
    fn clients(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .inner
            .cfg
            .clients
            .iter()
            .map(|c| c.split_once('=').map_or(c.as_str(), |(id, _)| id).to_string())
            .collect();
        v.push(self.inner.node_id.clone());
        v.sort();
        v.dedup();
        v
    }

    /// A round id above every earlier one, also across restarts (node clock ms,
    /// or the last id + 1 when the clock went back).
    fn next_round(&self) -> u64 {
        let mut st = self.state();
        let id = (st.last_round_id + 1).max(now_ms().max(0) as u64);
        st.last_round_id = id;
        id
    }

    pub(crate) fn spawn(&self, f: Failover, cancel: CancellationToken) -> JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move { me.run(f, cancel).await })
    }

    async fn run(&self, f: Failover, cancel: CancellationToken) {
        let cfg = self.inner.cfg.clone();
        let interval = Duration::from_millis(cfg.interval_ms);
        let check_timeout = Duration::from_millis(cfg.answer_timeout_ms.min(cfg.interval_ms));
        {
            let newest = std::fs::read_to_string(self.inner.data_dir.join(super::ROUND_FILE))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0);
            self.state().last_round_id = newest;
        }
        let mut master = self.initial_master(&f).await;
        self.state().master = master.clone();
        let mut backoff = interval;
        // Publish at once: a restarted coordinator re-confirms every client.
        let mut last_publish: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = cancel.cancelled() => return,
            }
            let healthy = !master.is_empty() && probe_master(&self.inner.auth, &master, check_timeout).await.is_ok();
            if healthy {
                // Only while Redis answers: with the master down the registry
                // read would wait out the store's retries and slow detection.
                self.refresh_urls().await;
                self.state().failures = 0;
                backoff = interval;
                let due = last_publish.is_none_or(|t| t.elapsed() >= Duration::from_millis(cfg.republish_ms));
                if due {
                    self.publish(&f, &master).await;
                    last_publish = Some(Instant::now());
                }
                continue;
            }
            let failures = {
                let mut st = self.state();
                st.failures += 1;
                st.failures
            };
            tracing::warn!(master = %master, failures, "the Redis master failed a check");
            if failures < cfg.retries {
                continue;
            }
            match self.round(&f, &master).await {
                Ok(new) => {
                    master = new;
                    let mut st = self.state();
                    st.master = master.clone();
                    st.failures = 0;
                    st.promotions += 1;
                    backoff = interval;
                    last_publish = Some(Instant::now());
                }
                Err(reason) => {
                    tracing::warn!(%reason, backoff_ms = backoff.as_millis() as u64, "failover round cancelled");
                    // Clients invalidated by this round get the master back at
                    // the next healthy check.
                    last_publish = None;
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = cancel.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_millis(cfg.max_backoff_ms));
                }
            }
        }
    }

    /// The master to watch at start: this node's master file, else the
    /// reachable server that says it is a master (the highest offset wins
    /// if several do), else none (the first check fails and a round picks).
    async fn initial_master(&self, f: &Failover) -> String {
        let file = std::fs::read_to_string(self.inner.data_dir.join(MASTER_FILE))
            .unwrap_or_default()
            .trim()
            .to_string();
        if !file.is_empty() {
            return file;
        }
        let addr = f.store().address();
        if !addr.is_empty() {
            return addr;
        }
        let mut best: Option<(i64, String)> = None;
        for s in &self.inner.cfg.redis_servers {
            if let Some((role, offset, _)) = self.replication(s).await
                && role == "master"
                && best.as_ref().is_none_or(|(o, _)| offset > *o)
            {
                best = Some((offset, s.clone()));
            }
        }
        best.map(|(_, s)| s).unwrap_or_default()
    }

    /// Learns the clients' addresses from the node registry while Redis is
    /// up; a round needs them when it is not.
    async fn refresh_urls(&self) {
        let Ok(list) = self.inner.nodes.list().await else {
            return;
        };
        let wanted = self.clients();
        let mut urls = self.inner.urls.write().unwrap_or_else(|p| p.into_inner());
        let configured: Vec<&str> = self
            .inner
            .cfg
            .clients
            .iter()
            .filter_map(|c| c.split_once('=').map(|(id, _)| id))
            .collect();
        // Only records of kind `node`: those are written by the muster node
        // itself (a worker heartbeat can neither write nor convert one,
        // `heartbeat.lua`), so an `addr` a worker token chose is never where
        // the secret goes (issue 36, N1).
        for n in list.nodes {
            if n.kind == "node" && wanted.contains(&n.id) && !n.addr.is_empty() && !configured.contains(&n.id.as_str())
            {
                urls.insert(n.id.clone(), n.addr.clone());
            }
        }
    }

    /// Sends one message to every client at once; the coordinator answers
    /// for itself directly. Returns each client's answer or error.
    async fn send_all(
        &self,
        f: &Failover,
        kind: Kind,
        round: u64,
        master: Option<&str>,
    ) -> BTreeMap<String, Result<String, String>> {
        let msg = Message {
            round,
            master: master.map(str::to_string),
        };
        let urls = self.inner.urls.read().unwrap_or_else(|p| p.into_inner()).clone();
        let calls = self.clients().into_iter().map(|id| {
            let msg = msg.clone();
            let url = urls.get(&id).cloned();
            let me = self.clone();
            let f = f.clone();
            async move {
                let r = if id == me.inner.node_id {
                    f.handle(kind, &msg).await.map(|a| a.answer).map_err(|e| e.to_string())
                } else {
                    match url {
                        None => Err("address unknown (the node was not seen in the registry)".to_string()),
                        Some(url) => me.post(&url, kind, &msg).await,
                    }
                };
                (id, r)
            }
        });
        futures_util::future::join_all(calls).await.into_iter().collect()
    }

    async fn post(&self, base: &str, kind: Kind, msg: &Message) -> Result<String, String> {
        let url = format!("{}/internal/failover/{}", base.trim_end_matches('/'), kind.as_str());
        let resp = self
            .inner
            .http
            .post(&url)
            .header(SECRET_HEADER, &self.inner.cfg.secret)
            .json(msg)
            .send()
            .await
            .map_err(|e| {
                if e.is_timeout() {
                    format!("no answer within {} ms", self.inner.cfg.answer_timeout_ms)
                } else {
                    format!("unreachable: {e}")
                }
            })?;
        let status = resp.status();
        let body: serde_json::Value = resp.json().await.unwrap_or_default();
        if status == reqwest::StatusCode::CONFLICT
            && let Some(newest) = body["newest_round"].as_u64()
        {
            // A client saw a newer round (another coordinator, or this host's
            // clock went back): the next round starts above it.
            let mut st = self.state();
            st.last_round_id = st.last_round_id.max(newest);
        }
        if status.is_success() {
            Ok(body["answer"].as_str().unwrap_or("").to_string())
        } else {
            Err(format!(
                "{}: {}",
                status.as_u16(),
                body["detail"].as_str().unwrap_or("refused")
            ))
        }
    }

    fn begin(&self, id: u64, phase: &str, master: &str) {
        self.state().round = Some(RoundStatus {
            id,
            phase: phase.into(),
            started_at_ms: now_ms(),
            ended_at_ms: None,
            result: String::new(),
            answers: BTreeMap::new(),
            master: master.into(),
        });
    }

    fn phase(&self, phase: &str, answers: &BTreeMap<String, Result<String, String>>) {
        let mut st = self.state();
        if let Some(r) = st.round.as_mut() {
            r.phase = phase.into();
            r.answers = answers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().unwrap_or_else(|e| format!("error: {e}"))))
                .collect();
        }
    }

    fn end(&self, phase: &str, result: String, keep: bool) {
        let mut st = self.state();
        if let Some(mut r) = st.round.take() {
            r.phase = phase.into();
            r.result = result;
            r.ended_at_ms = Some(now_ms());
            if keep {
                st.history.insert(0, r.clone());
                st.history.truncate(HISTORY);
            }
            st.round = Some(r);
        }
    }

    /// One failover round away from `old`. Returns the new master, or why
    /// the round was cancelled (nothing promoted).
    async fn round(&self, f: &Failover, old: &str) -> Result<String, String> {
        let id = self.next_round();
        tracing::warn!(round = id, master = %old, "starting a failover round");
        self.begin(id, "ping", old);
        let cancel = |me: &Self, why: String| {
            metrics::counter!("muster_failover_rounds_total", "result" => "cancelled").increment(1);
            me.end("cancelled", why.clone(), true);
            Err(why)
        };
        let answers = self.send_all(f, Kind::Ping, id, None).await;
        self.phase("ping", &answers);
        if let Some(why) = refusal(&answers, "pong") {
            return cancel(self, format!("ping: {why}"));
        }
        let answers = self.send_all(f, Kind::Invalidate, id, None).await;
        self.phase("invalidate", &answers);
        if let Some(why) = refusal(&answers, "invalidated") {
            return cancel(self, format!("invalidate: {why}"));
        }
        self.phase("promote", &answers);
        let Some(new) = self.best_replica(old).await else {
            return cancel(self, "promote: no other Redis server is reachable".into());
        };
        if let Err(e) = self.promote(&new).await {
            return cancel(self, format!("promote: REPLICAOF NO ONE on {new} failed: {e}"));
        }
        let answers = self.send_all(f, Kind::Reconfigure, id, Some(&new)).await;
        self.phase("reconfigure", &answers);
        metrics::counter!("muster_failover_rounds_total", "result" => "promoted").increment(1);
        let pending = refusal(&answers, "reconfigured");
        let result = match &pending {
            None => format!("promoted {new}; every client reconfigured"),
            Some(why) => format!("promoted {new}; re-sending to the rest: {why}"),
        };
        tracing::warn!(round = id, master = %new, "failover round promoted a new master");
        self.end("done", result, true);
        self.demote_others(&new).await;
        Ok(new)
    }

    /// Re-publishes a healthy master to every client, and makes every other
    /// server its replica.
    async fn publish(&self, f: &Failover, master: &str) {
        let id = self.next_round();
        let answers = self.send_all(f, Kind::Reconfigure, id, Some(master)).await;
        let keep_round = self.state().round.as_ref().is_some_and(|r| r.phase != "publish");
        if !keep_round || refusal(&answers, "reconfigured").is_some() {
            self.begin(id, "publish", master);
            self.phase("publish", &answers);
            let result = match refusal(&answers, "reconfigured") {
                None => "every client confirmed".to_string(),
                Some(why) => why,
            };
            self.end("publish", result, false);
        }
        self.demote_others(master).await;
    }

    /// (role, offset, master_host:port) of a server from `INFO replication`.
    async fn replication(&self, addr: &str) -> Option<(String, i64, String)> {
        let timeout = Duration::from_millis(self.inner.cfg.answer_timeout_ms);
        let run = async {
            let client = redis::Client::open(self.inner.auth.url(addr)).ok()?;
            let mut c = client.get_multiplexed_async_connection().await.ok()?;
            let text: String = redis::cmd("INFO").arg("replication").query_async(&mut c).await.ok()?;
            let field = |name: &str| {
                text.lines()
                    .find_map(|l| l.trim().strip_prefix(&format!("{name}:")).map(str::to_string))
                    .unwrap_or_default()
            };
            let role = field("role");
            let offset = if role == "master" {
                field("master_repl_offset")
            } else {
                field("slave_repl_offset")
            };
            let upstream = format!("{}:{}", field("master_host"), field("master_port"));
            Some((role, offset.parse().unwrap_or(0), upstream))
        };
        tokio::time::timeout(timeout, run).await.ok().flatten()
    }

    /// The reachable server other than `old` with the highest offset.
    async fn best_replica(&self, old: &str) -> Option<String> {
        let mut best: Option<(i64, String)> = None;
        for s in &self.inner.cfg.redis_servers {
            if s == old {
                continue;
            }
            if let Some((_, offset, _)) = self.replication(s).await
                && best.as_ref().is_none_or(|(o, _)| offset > *o)
            {
                best = Some((offset, s.clone()));
            }
        }
        best.map(|(_, s)| s)
    }

    async fn command(&self, addr: &str, cmd: &redis::Cmd) -> Result<(), String> {
        let timeout = Duration::from_millis(self.inner.cfg.answer_timeout_ms);
        let run = async {
            let client = redis::Client::open(self.inner.auth.url(addr)).map_err(|e| e.to_string())?;
            let mut c = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?;
            cmd.query_async::<()>(&mut c).await.map_err(|e| e.to_string())
        };
        tokio::time::timeout(timeout, run)
            .await
            .map_err(|_| format!("no answer within {} ms", timeout.as_millis()))?
    }

    async fn promote(&self, addr: &str) -> Result<(), String> {
        self.command(addr, redis::cmd("REPLICAOF").arg("NO").arg("ONE")).await
    }

    /// Makes every other reachable server a replica of `master` (a returning
    /// old master included, before anyone could mistake it for the master).
    async fn demote_others(&self, master: &str) {
        let Some((host, port)) = master.rsplit_once(':') else {
            return;
        };
        for s in &self.inner.cfg.redis_servers {
            if s == master {
                continue;
            }
            if let Some((role, _, upstream)) = self.replication(s).await
                && (role == "master" || upstream != master)
            {
                match self.command(s, redis::cmd("REPLICAOF").arg(host).arg(port)).await {
                    Ok(()) => tracing::info!(server = %s, master = %master, "made a replica of the master"),
                    Err(e) => tracing::warn!(server = %s, error = %e, "could not make it a replica"),
                }
            }
        }
    }
}

/// The first client that did not answer `want`, described.
fn refusal(answers: &BTreeMap<String, Result<String, String>>, want: &str) -> Option<String> {
    answers.iter().find_map(|(id, r)| match r {
        Ok(a) if a == want => None,
        Ok(a) => Some(format!("{id} answered `{a}`")),
        Err(e) => Some(format!("{id}: {e}")),
    })
}
