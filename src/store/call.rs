//! The call path: the shared link and its cuts (G12), deadlines and the
//! Redis clock, bounded retries, metrics, and error classification.

use super::conn::{down_error, open_manager, reconnecting_error};
use super::{
    CancellationToken, Cmd, Conn, Duration, ErrorKind, FromRedisValue, Instant, Link, Lua, Ordering, Pipeline,
    RedisError, ScriptCall, ServerErrorKind, Store, StoreError, StoreResult,
};

impl Store {
    pub(super) fn link(&self) -> Link {
        self.lane().link.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The link to send a call on. While a cut connection is being reopened
    /// the call waits for the new one (up to the call timeout) instead of
    /// failing at once: a cut is routine after one slow call, not an outage.
    /// Once reopening has failed (the master is down or stalled), calls fail
    /// at once until it succeeds.
    pub(super) async fn usable_link(&self) -> Link {
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        loop {
            let relinked = self.lane().relinked.notified();
            let link = self.link();
            if !matches!(link.conn, Conn::Reconnecting) || self.lane().reopen_failing.load(Ordering::Relaxed) {
                return self.routed(link);
            }
            if tokio::time::timeout_at(deadline, relinked).await.is_err() {
                return self.routed(link);
            }
        }
    }

    /// `link` with its calls sent to this view's shard: in Cluster mode a
    /// connection (shared, pooled or dedicated) sends every command to one
    /// slot's master, and each view sends its calls to its own shard's.
    pub(super) fn routed(&self, mut link: Link) -> Link {
        if let Conn::Cluster(c, _) = link.conn {
            link.conn = Conn::Cluster(c, self.inner.shard_routes[self.shard]);
        }
        link
    }

    /// Installs a new shared connection (a switch, an invalidation or a
    /// reconnect) and cuts the old one: calls still waiting on it give up.
    /// Switches happen outside Cluster mode only, where one lane serves
    /// every shard.
    pub(super) fn replace_link(&self, conn: Conn) {
        let id = self.inner.links.fetch_add(1, Ordering::SeqCst) + 1;
        let lane = self.lane();
        let old = std::mem::replace(
            &mut *lane.link.write().unwrap_or_else(|p| p.into_inner()),
            Link {
                conn,
                id,
                cut: CancellationToken::new(),
            },
        );
        old.cut.cancel();
        lane.relinked.notify_waiters();
    }

    /// Cuts link `id` of this view's lane after one of its calls timed out
    /// (G12) and reopens a connection to the same server in the background.
    /// Does nothing when that link was already replaced (several calls time
    /// out together). Other lanes (other Cluster masters) are not touched.
    pub(super) fn cut(&self, id: u64, op: &'static str) {
        let reopen = {
            let mut link = self.lane().link.write().unwrap_or_else(|p| p.into_inner());
            if link.id != id || matches!(link.conn, Conn::Down | Conn::Reconnecting) {
                return;
            }
            let reopen = self.inner.links.fetch_add(1, Ordering::SeqCst) + 1;
            let old = std::mem::replace(
                &mut *link,
                Link {
                    conn: Conn::Reconnecting,
                    id: reopen,
                    cut: CancellationToken::new(),
                },
            );
            old.cut.cancel();
            reopen
        };
        metrics::counter!("muster_redis_reconnects_total").increment(1);
        tracing::warn!(
            op,
            shard = self.shard,
            "a Redis call timed out: its connection is cut and a new one opened"
        );
        let store = self.clone();
        tokio::spawn(async move { store.reopen(reopen).await });
    }

    /// Opens a new shared connection to the server in use and installs it,
    /// unless link `id` (the placeholder) was replaced meanwhile by a switch
    /// or an invalidation. Retries with backoff until it succeeds. The
    /// lane's clock is forgotten: the new connection may reach another
    /// server (a promoted replica), whose clock is sampled afresh.
    pub(super) async fn reopen(&self, id: u64) {
        let mut attempt = 0;
        loop {
            if self.link().id != id {
                return;
            }
            let opened = if let Some(cc) = &self.inner.cluster_client {
                tokio::time::timeout(self.inner.timeout, cc.get_async_connection())
                    .await
                    .map_err(|_| StoreError::Unavailable("timed out".into()))
                    .and_then(|r| r.map_err(|e| classify(&e)))
                    .map(|c| Conn::Cluster(c, self.inner.shard_routes[self.shard]))
            } else {
                let client = self.inner.client.read().unwrap_or_else(|p| p.into_inner()).clone();
                match client {
                    Some(client) => open_manager(client, self.inner.timeout).await.map(Conn::Single),
                    None => return,
                }
            };
            match opened {
                Ok(conn) => {
                    let lane = self.lane();
                    let mut link = lane.link.write().unwrap_or_else(|p| p.into_inner());
                    if link.id == id {
                        link.conn = conn;
                        lane.clock.reset();
                        tracing::info!(shard = self.shard, "reconnected to Redis");
                    }
                    lane.reopen_failing.store(false, Ordering::Relaxed);
                    drop(link);
                    lane.relinked.notify_waiters();
                    return;
                }
                Err(e) => {
                    attempt += 1;
                    self.lane().reopen_failing.store(true, Ordering::Relaxed);
                    tracing::debug!(attempt, error = %e, "reconnecting to Redis");
                    tokio::time::sleep(backoff(attempt).min(Duration::from_secs(1))).await;
                }
            }
        }
    }

    /// The deadline for a script sent now, in Redis ms (G12): the node gives
    /// up on a call after `redis.timeout_ms`; the script must have run a
    /// quarter of that earlier, which leaves its reply time to arrive before
    /// the node stops waiting. Errs only before the first clock sample.
    pub(super) fn deadline(&self) -> StoreResult<i64> {
        let now = self
            .lane()
            .clock
            .now_ms()
            .ok_or_else(|| StoreError::Unavailable("Redis time is not known yet".into()))?;
        let t = self.inner.timeout.as_millis() as i64;
        Ok(now + t - t / 4)
    }

    /// The node's estimate of Redis time now (a lower bound, from recent
    /// samples): for choosing when to wake up, never for a lease or liveness
    /// decision (those are made in Redis, G11). None before the first sample.
    pub fn redis_now_estimate(&self) -> Option<i64> {
        self.lane().clock.now_ms()
    }

    /// Records a Redis time (ms) read by a call of this view sent at `sent`
    /// whose reply arrived at `received`, as a sample for the deadlines of
    /// this view's lane (G12; see `clock.rs`).
    pub fn observe_clock(&self, redis_ms: i64, sent: Instant, received: Instant) {
        if self.lane().clock.observe_call(redis_ms, sent, received) {
            metrics::counter!("muster_redis_clock_resets_total").increment(1);
            tracing::warn!(
                shard = self.shard,
                "Redis time went back on this shard's connection (a new master, or its clock was set back): \
                 script deadlines now follow the new clock"
            );
        }
    }

    /// The spread (ms) of the estimated Redis clocks of the lanes: the skew
    /// between Cluster masters as this node sees it (0 with one lane, or
    /// before two lanes have samples).
    pub fn clock_skew_ms(&self) -> i64 {
        let offsets: Vec<i64> = self.inner.lanes.iter().filter_map(|l| l.clock.offset()).collect();
        match (offsets.iter().max(), offsets.iter().min()) {
            (Some(hi), Some(lo)) => hi - lo,
            _ => 0,
        }
    }

    /// Reads Redis `TIME` on `conn` and records it as a clock sample.
    pub(super) async fn sync_clock_on(&self, conn: &mut Conn) -> StoreResult<i64> {
        let sent = Instant::now();
        let (s, us): (i64, i64) = self
            .timed_on(&Link::probe(conn.clone()), "time", redis::cmd("TIME").query_async(conn))
            .await
            .map_err(RetryableOr::into_error)?;
        let ms = s * 1000 + us / 1000;
        self.observe_clock(ms, sent, Instant::now());
        Ok(ms)
    }

    /// A connection of its own for blocking commands (`XREAD BLOCK`), which
    /// would stall every other caller on the shared multiplexed connection.
    /// It has no response timeout of its own (redis-rs defaults to 500 ms,
    /// shorter than a blocking read): the caller bounds every command.
    pub async fn dedicated(&self) -> StoreResult<Conn> {
        self.follow_master_file().await;
        match self.open_own().await {
            Some(opened) => opened,
            None => match self.routed(self.link()).conn {
                Conn::Down => Err(classify(&down_error())),
                Conn::Reconnecting => Err(classify(&reconnecting_error())),
                c => Ok(c),
            },
        }
    }

    /// A new connection of its own to the master in use (no response
    /// timeout: the caller bounds every command), or None when no master is
    /// named (coordinated mode before a failover round named one).
    pub(super) async fn open_own(&self) -> Option<StoreResult<Conn>> {
        if let Some(cc) = &self.inner.cluster_blocking {
            let opened = tokio::time::timeout(self.inner.timeout, cc.get_async_connection())
                .await
                .map_err(|_| StoreError::Unavailable("timed out opening a cluster connection".into()))
                .and_then(|r| r.map_err(|e| classify(&e)));
            return Some(opened.map(|c| Conn::Cluster(c, self.inner.shard_routes[self.shard])));
        }
        let client = self.inner.client.read().unwrap_or_else(|p| p.into_inner()).clone()?;
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.inner.timeout))
            .set_response_timeout(None);
        let opened = tokio::time::timeout(
            self.inner.timeout,
            client.get_multiplexed_async_connection_with_config(&cfg),
        )
        .await
        .map_err(|_| StoreError::Unavailable("timed out opening a connection".into()))
        .and_then(|r| r.map_err(|e| classify(&e)));
        Some(opened.map(Conn::Multiplexed))
    }

    /// PING with a measured round trip.
    pub async fn ping(&self) -> StoreResult<Duration> {
        let start = Instant::now();
        let _: String = self.call("ping", &redis::cmd("PING"), false).await?;
        let rtt = start.elapsed();
        self.inner.latency_us.store(rtt.as_micros() as u64, Ordering::Relaxed);
        Ok(rtt)
    }

    /// Redis server time in milliseconds since the epoch; also a sample for
    /// the node's estimate of Redis time (script deadlines, G12).
    pub async fn time_ms(&self) -> StoreResult<i64> {
        let sent = Instant::now();
        let (s, us): (i64, i64) = self.query("time", &redis::cmd("TIME")).await?;
        let ms = s * 1000 + us / 1000;
        // A retried read is sent after `sent`, which only widens the upper
        // bound: the check stays sound.
        self.observe_clock(ms, sent, Instant::now());
        Ok(ms)
    }

    /// A read: retried on connection errors with backoff.
    pub async fn query<T: FromRedisValue>(&self, op: &'static str, cmd: &Cmd) -> StoreResult<T> {
        self.call(op, cmd, true).await
    }

    /// A write command: not retried unless nothing was sent.
    pub async fn exec<T: FromRedisValue>(&self, op: &'static str, cmd: &Cmd) -> StoreResult<T> {
        self.call(op, cmd, false).await
    }

    /// A pipeline of reads, in one round trip.
    pub async fn pipe<T: FromRedisValue>(&self, op: &'static str, pipe: &Pipeline) -> StoreResult<T> {
        self.follow_master_file().await;
        let mut attempt = 0;
        loop {
            let link = self.usable_link().await;
            let mut conn = link.conn.clone();
            let res = self.timed_on(&link, op, pipe.query_async::<T>(&mut conn)).await;
            match res {
                Err(RetryableOr::Retry(e)) if attempt < self.inner.read_retries => {
                    attempt += 1;
                    tracing::debug!(op, attempt, error = %e, "retrying read");
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(RetryableOr::Retry(e)) | Err(RetryableOr::Fail(e)) => return Err(e),
                Ok(v) => return Ok(v),
            }
        }
    }

    /// Runs a script. Retried only when the connection was refused (nothing
    /// was sent), because a script's effects must not be applied twice.
    /// Every call carries its deadline (G12, see the prelude).
    pub async fn eval<T: FromRedisValue>(&self, lua: &Lua, keys: &[String], args: &[String]) -> StoreResult<T> {
        self.eval_by(lua, keys, args, None).await
    }

    /// [`Store::eval`] with the deadline given (Redis ms, G12) instead of
    /// one from now: a grouped call goes with the earliest of its members'
    /// (`tasks/group.rs`). Not in an acknowledged request's scope.
    async fn eval_by<T: FromRedisValue>(
        &self,
        lua: &Lua,
        keys: &[String],
        args: &[String],
        deadline: Option<i64>,
    ) -> StoreResult<T> {
        self.follow_master_file().await;
        if self.lane().clock.now_ms().is_none() {
            self.time_ms().await?;
        }
        if let Some(scope) = Store::ack_scope().filter(|_| deadline.is_none()) {
            return self.eval_acked(&scope, lua, keys, args).await;
        }
        let mut attempt = 0;
        loop {
            let args = with_deadline(args, deadline.map_or_else(|| self.deadline(), Ok)?);
            let link = self.usable_link().await;
            let mut conn = link.conn.clone();
            let res = self
                .timed_on(&link, lua.name(), lua.call::<T, _>(&mut conn, keys, &args))
                .await;
            match res {
                Ok(v) => return Ok(v),
                Err(RetryableOr::Retry(e)) if attempt < 2 && was_refused(&e) => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(RetryableOr::Retry(e)) | Err(RetryableOr::Fail(e)) => return Err(e),
            }
        }
    }

    /// Runs one typed script call (see [`ScriptCall`]).
    pub async fn run<C: ScriptCall>(&self, lua: &Lua, call: &C) -> StoreResult<C::Reply> {
        self.eval(lua, &call.keys(self.keys()), &call.args()).await
    }

    /// [`Store::run`] with the deadline given (Redis ms, G12), for a call
    /// made on behalf of callers that arrived earlier (`tasks/group.rs`).
    pub(crate) async fn run_until<C: ScriptCall>(&self, lua: &Lua, call: &C, deadline: i64) -> StoreResult<C::Reply> {
        self.eval_by(lua, &call.keys(self.keys()), &call.args(), Some(deadline))
            .await
    }

    /// The deadline a script sent now would carry (Redis ms, G12); None
    /// before the first clock sample, or inside an acknowledged request
    /// (its scripts must run on its own connection: never grouped).
    pub(crate) fn group_deadline(&self) -> Option<i64> {
        if Store::ack_scope().is_some() {
            return None;
        }
        self.deadline().ok()
    }

    /// Runs one typed script call on every shard of the namespace at once (a
    /// change each shard keeps a copy of, such as the node registry; see
    /// `docs/sharding.md`) and answers each shard's outcome, in shard order.
    /// A shard that fails or stalls costs only its own outcome: the others
    /// are applied and answered all the same (failure isolation). One shard:
    /// one call, as [`Store::run`].
    pub async fn run_on_each_shard<C: ScriptCall>(&self, lua: &Lua, call: &C) -> Vec<StoreResult<C::Reply>> {
        futures_util::future::join_all(self.every_shard().map(|s| async move { s.run(lua, call).await })).await
    }

    pub(super) async fn call<T: FromRedisValue>(&self, op: &'static str, cmd: &Cmd, read: bool) -> StoreResult<T> {
        self.follow_master_file().await;
        self.call_here(op, cmd, read).await
    }

    /// [`Store::call`] on the master in use, without following the master
    /// file (used while switching).
    pub(super) async fn call_here<T: FromRedisValue>(&self, op: &'static str, cmd: &Cmd, read: bool) -> StoreResult<T> {
        let mut attempt = 0;
        loop {
            let link = self.usable_link().await;
            let mut conn = link.conn.clone();
            let res = self.timed_on(&link, op, cmd.query_async::<T>(&mut conn)).await;
            match res {
                Ok(v) => return Ok(v),
                Err(RetryableOr::Retry(e)) if attempt < self.inner.read_retries && (read || was_refused(&e)) => {
                    attempt += 1;
                    tracing::debug!(op, attempt, error = %e, "retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(RetryableOr::Retry(e)) | Err(RetryableOr::Fail(e)) => return Err(e),
            }
        }
    }

    /// Applies the timeout, records metrics and health, and classifies
    /// errors. The call gives up at once when its link is cut (a master
    /// switch, or another call on the same connection timed out): a read is
    /// then retried on the new connection, a write fails (503), since whether
    /// Redis applied it is unknown. A timeout cuts the link (G12).
    pub(super) async fn timed_on<T>(
        &self,
        link: &Link,
        op: &'static str,
        fut: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, RetryableOr> {
        let start = Instant::now();
        let res = tokio::select! {
            r = tokio::time::timeout(self.inner.timeout, fut) => r,
            _ = link.cut.cancelled() => {
                metrics::counter!("muster_redis_errors_total", "op" => op, "kind" => "cut").increment(1);
                return Err(RetryableOr::Retry(StoreError::Unavailable(format!(
                    "the connection to Redis was replaced (a master switch, or a timed-out call) \
                     while waiting for an answer ({op}); retry"
                ))));
            }
        };
        let took = start.elapsed();
        metrics::histogram!("muster_redis_call_duration_seconds", "op" => op).record(took.as_secs_f64());
        // A span of the request being served, when it is traced (issue 39).
        let shard = self.shard_index();
        match &res {
            Ok(Ok(_)) => crate::traces::redis_call(op, shard, took, None),
            Ok(Err(e)) => crate::traces::redis_call(op, shard, took, Some(e)),
            Err(_) => crate::traces::redis_call(op, shard, took, Some(&"timed out")),
        }
        let timed_out = |store: &Store| {
            metrics::counter!("muster_redis_errors_total", "op" => op, "kind" => "timeout").increment(1);
            store.inner.healthy.store(false, Ordering::Relaxed);
            store.inner.trouble.notify_one();
            if link.id != 0 {
                store.cut(link.id, op);
            }
            Err(RetryableOr::Retry(StoreError::Unavailable(format!(
                "no answer within {} ms ({op})",
                store.inner.timeout.as_millis()
            ))))
        };
        match res {
            Ok(Ok(v)) => {
                self.inner.healthy.store(true, Ordering::Relaxed);
                Ok(v)
            }
            Ok(Err(e)) if e.is_timeout() => timed_out(self),
            Ok(Err(e)) => {
                let err = classify(&e);
                let kind = match &err {
                    StoreError::Unavailable(_) => "unavailable",
                    StoreError::Server(_) => "server",
                    StoreError::Decode(_) => "decode",
                };
                metrics::counter!("muster_redis_errors_total", "op" => op, "kind" => kind).increment(1);
                if matches!(err, StoreError::Unavailable(_)) {
                    self.inner.healthy.store(false, Ordering::Relaxed);
                    self.inner.trouble.notify_one();
                    Err(RetryableOr::Retry(err))
                } else {
                    self.inner.healthy.store(true, Ordering::Relaxed);
                    Err(RetryableOr::Fail(err))
                }
            }
            Err(_) => timed_out(self),
        }
    }
}

pub(super) enum RetryableOr {
    Retry(StoreError),
    Fail(StoreError),
}

impl RetryableOr {
    pub(super) fn into_error(self) -> StoreError {
        match self {
            RetryableOr::Retry(e) | RetryableOr::Fail(e) => e,
        }
    }
}

impl Link {
    /// A connection used outside the shared link (a server being probed
    /// before a switch): nothing cuts it, and a timeout cuts nothing.
    pub(super) fn probe(conn: Conn) -> Link {
        Link {
            conn,
            id: 0,
            cut: CancellationToken::new(),
        }
    }
}

/// A script's arguments with the call's deadline appended (see the prelude).
pub(super) fn with_deadline(args: &[String], deadline: impl ToString) -> Vec<String> {
    let mut all = Vec::with_capacity(args.len() + 1);
    all.extend_from_slice(args);
    all.push(deadline.to_string());
    all
}

pub(super) fn was_refused(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(m) if m.starts_with("connection refused"))
}

pub(super) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(25u64 << attempt.min(5))
}

/// Maps a redis-rs error onto the store's three kinds.
pub fn classify(e: &RedisError) -> StoreError {
    if e.code() == Some("LATE") {
        // The prelude refused a script that arrived after its deadline (G12):
        // nothing was applied, like a timeout the client may retry.
        return StoreError::Unavailable(format!(
            "Redis received the call after its deadline and did not apply it: {}",
            e.detail().unwrap_or("")
        ));
    }
    if e.is_connection_refusal() {
        return StoreError::Unavailable(format!("connection refused: {e}"));
    }
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        return StoreError::Unavailable(e.to_string());
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::TryAgain,
        )
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::MasterNameNotFoundBySentinel => StoreError::Unavailable(e.to_string()),
        ErrorKind::UnexpectedReturnType | ErrorKind::Parse => StoreError::Decode(e.to_string()),
        _ => StoreError::Server(e.to_string()),
    }
}
