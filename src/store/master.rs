//! The master in use: `ROLE`, switching to a new master, the fencing epoch
//! raised on every new master, the coordinated master file, and the server
//! check at connect time.

use super::call::RetryableOr;
use super::conn::open_single;
use super::{
    Conn, Link, Lua, MIN_VERSION, Ordering, ScriptCall, ServerAuth, ServerInfo, Store, StoreError, StoreResult, Switch,
    Value, node_clock_ms,
};

impl Store {
    /// The first element of `ROLE`: `master`, `slave` or `sentinel`.
    pub async fn role(&self) -> StoreResult<String> {
        let v: Value = self.call_here("role", &redis::cmd("ROLE"), true).await?;
        Ok(role_of(&v))
    }

    /// Switches to the master at `addr` (`host:port`) after confirming with
    /// `ROLE` that it is one. Returns false (and changes nothing) when `addr`
    /// is already the master in use.
    pub async fn switch_master(&self, addr: &str) -> StoreResult<bool> {
        if self.address() == addr && self.has_master() {
            return Ok(false);
        }
        let url = self.inner.auth.url(addr);
        let (client, mgr) = open_single(&url, self.inner.timeout).await?;
        let mut probe = Conn::Single(mgr.clone());
        let v: Value = self
            .timed_on(
                &Link::probe(probe.clone()),
                "role",
                redis::cmd("ROLE").query_async(&mut probe),
            )
            .await
            .map_err(RetryableOr::into_error)?;
        let role = role_of(&v);
        if role != "master" {
            return Err(StoreError::Unavailable(format!(
                "{addr} is not a master (ROLE says {role})"
            )));
        }
        // A new server has its own clock: deadlines are computed from it
        // from now on, starting with the epoch script's.
        self.lane().clock.reset();
        self.sync_clock_on(&mut probe).await?;
        // Fencing first: no token is issued on the new master before its
        // epoch is above every epoch seen before the switch.
        self.bump_epoch_on(&mut probe, addr).await?;
        let from = self.address();
        *self.inner.client.write().unwrap_or_else(|p| p.into_inner()) = Some(client);
        self.replace_link(Conn::Single(mgr));
        *self.inner.address.write().unwrap_or_else(|p| p.into_inner()) = addr.to_string();
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        let now_ms = node_clock_ms();
        *self.inner.last_switch.write().unwrap_or_else(|p| p.into_inner()) = Some(Switch {
            from: from.clone(),
            to: addr.to_string(),
            at_ms: now_ms,
        });
        metrics::counter!("muster_redis_master_changes_total").increment(1);
        tracing::warn!(from = %from, to = %addr, "switched to a new Redis master");
        let _ = self.check_server().await;
        Ok(true)
    }

    /// Installs the epoch script run at every switch (and by [`Store::ensure_epoch`]).
    pub fn set_epoch_script(&self, lua: Lua, node_id: &str) {
        *self.inner.epoch_script.write().unwrap_or_else(|p| p.into_inner()) = Some((lua, node_id.to_string()));
    }

    /// The highest fencing epoch this node has seen (0: none yet).
    pub fn known_epoch(&self) -> u64 {
        self.inner.known_epoch.load(Ordering::SeqCst)
    }

    /// Records an epoch read from Redis, so a later bump starts above it.
    pub fn saw_epoch(&self, e: u64) {
        self.inner.known_epoch.fetch_max(e, Ordering::SeqCst);
    }

    /// Runs the epoch script on the master in use: bumps the epoch once per
    /// master (by run_id). Returns (epoch, bumped).
    pub async fn ensure_epoch(&self) -> StoreResult<(u64, bool)> {
        let mut conn = self.link().conn;
        let addr = self.address();
        if self.lane().clock.now_ms().is_none() {
            self.sync_clock_on(&mut conn).await?;
        }
        self.bump_epoch_on(&mut conn, &addr).await
    }

    pub(super) async fn bump_epoch_on(&self, conn: &mut Conn, addr: &str) -> StoreResult<(u64, bool)> {
        let script = self
            .inner
            .epoch_script
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some((lua, node)) = script else {
            return Ok((0, false));
        };
        let probe = Link::probe(conn.clone());
        let info: Value = self
            .timed_on(&probe, "info", redis::cmd("INFO").arg("server").query_async(conn))
            .await
            .map_err(RetryableOr::into_error)?;
        let text = match info {
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::VerbatimString { text, .. } => text,
            _ => String::new(),
        };
        let run_id = text
            .lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|v| v.trim().to_string())
            .unwrap_or_default();
        // Sent on `conn` itself (the new master, not yet in use), so not
        // through `Store::run`; the typed call still orders keys and args.
        // Every shard has its own epoch and fence: each is raised, in shard
        // order (one master holds them all outside Cluster mode).
        let call = crate::failover::scripts::Epoch {
            run_id: &run_id,
            min_epoch: self.known_epoch() + 1,
            node: &node,
            addr,
        };
        let (mut epoch, mut bumped) = (0, false);
        for i in 0..self.shards().len() {
            let keys = call.keys(self.shard(i).keys());
            let args = super::call::with_deadline(&call.args(), self.deadline()?);
            let reply: crate::failover::scripts::EpochReply = self
                .timed_on(&probe, lua.name(), lua.call(conn, &keys, &args))
                .await
                .map_err(RetryableOr::into_error)?;
            epoch = epoch.max(reply.epoch);
            bumped |= reply.bumped;
        }
        self.saw_epoch(epoch);
        if bumped {
            metrics::counter!("muster_failover_switches_total").increment(1);
            tracing::warn!(epoch, master = %addr, "fencing epoch bumped for a new Redis master");
        }
        Ok((epoch, bumped))
    }

    /// Stops using the master: every call fails as unavailable until
    /// [`Store::switch_master`]. Used by a coordinated failover's `invalidate`.
    pub fn invalidate(&self) {
        self.replace_link(Conn::Down);
        *self.inner.client.write().unwrap_or_else(|p| p.into_inner()) = None;
        *self.inner.address.write().unwrap_or_else(|p| p.into_inner()) = String::new();
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        self.inner.healthy.store(false, Ordering::Relaxed);
        tracing::warn!("Redis master invalidated: no Redis calls until the failover round reconfigures");
    }

    /// Whether a master is in use (false after `invalidate`).
    pub fn has_master(&self) -> bool {
        !matches!(self.link().conn, Conn::Down)
    }

    /// Changes at every switch or invalidation.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::SeqCst)
    }

    pub fn last_switch(&self) -> Option<Switch> {
        self.inner.last_switch.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Notified when a call finds Redis unavailable or read-only.
    pub fn trouble(&self) -> &tokio::sync::Notify {
        &self.inner.trouble
    }

    pub fn server_auth(&self) -> &ServerAuth {
        &self.inner.auth
    }

    /// Coordinated mode: re-reads the master file when its mtime changed and
    /// follows it (an empty file means "no master": calls fail until it names
    /// one). Cheap when nothing changed: one `stat` at most every 20 ms.
    pub async fn follow_master_file(&self) {
        let Some(f) = &self.inner.master_file else { return };
        let now = node_clock_ms().max(0) as u64;
        let last = f.checked_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < 20 {
            return;
        }
        f.checked_ms.store(now, Ordering::Relaxed);
        let mtime = std::fs::metadata(&f.path).and_then(|m| m.modified()).ok();
        {
            let seen = f.seen.lock().await;
            if seen.0 == mtime && mtime.is_some() {
                return;
            }
        }
        let mut seen = f.seen.lock().await;
        let mtime = std::fs::metadata(&f.path).and_then(|m| m.modified()).ok();
        if seen.0 == mtime && mtime.is_some() {
            return;
        }
        let content = std::fs::read_to_string(&f.path).unwrap_or_default().trim().to_string();
        if content.is_empty() {
            if self.has_master() {
                self.invalidate();
            }
            *seen = (mtime, content);
            return;
        }
        match self.switch_master(&content).await {
            Ok(_) => *seen = (mtime, content),
            Err(e) => {
                tracing::warn!(master = %content, error = %e, "the master file names a server that is not usable");
                // Re-check at the next call; never fall back to the old master.
                if self.has_master() && self.address() != content {
                    self.invalidate();
                }
            }
        }
    }

    /// Forces the next [`Store::follow_master_file`] to stat the file.
    pub fn master_file_touched(&self) {
        if let Some(f) = &self.inner.master_file {
            f.checked_ms.store(0, Ordering::Relaxed);
        }
    }

    /// PING, then `INFO server`: records the version and refuses old servers.
    pub async fn check_server(&self) -> StoreResult<ServerInfo> {
        let _: String = self.call_here("ping", &redis::cmd("PING"), true).await?;
        // In a cluster too this reaches one server: the namespace's master.
        let text: String = self
            .call_here("info", &redis::cmd("INFO").arg("server").to_owned(), true)
            .await?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        let info = ServerInfo {
            version: field("redis_version"),
            mode: field("redis_mode"),
            run_id: field("run_id"),
        };
        if !version_supported(&info.version) {
            return Err(StoreError::Unavailable(format!(
                "Redis {} at {} is too old: muster needs Redis {}.{} or newer",
                info.version,
                self.address(),
                MIN_VERSION.0,
                MIN_VERSION.1
            )));
        }
        *self.inner.info.write().unwrap_or_else(|p| p.into_inner()) = info.clone();
        Ok(info)
    }
}

/// The role name in a `ROLE` reply.
pub(crate) fn role_of(v: &Value) -> String {
    match v {
        Value::Array(items) => match items.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => String::new(),
        },
        _ => String::new(),
    }
}

/// Whether a `redis_version` is at least [`MIN_VERSION`].
pub(super) fn version_supported(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= MIN_VERSION
}

#[cfg(test)]
mod tests {
    #[test]
    fn refuses_redis_older_than_7() {
        assert!(super::version_supported("7.0.15"));
        assert!(super::version_supported("7.2.4"));
        assert!(super::version_supported("8.0.0"));
        assert!(!super::version_supported("6.2.14"));
        assert!(!super::version_supported(""));
    }
}
