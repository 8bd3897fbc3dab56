//! The read side of the task store: tasks, pages of a queue or the dead
//! letters, queue and group statistics.

use super::{
    Attempt, BTreeMap, GroupInfo, ListQueuedReply, MAX_QUEUED_CURSOR, QueueStats, Store, StoreError, Task, TaskError,
    TaskPage, Tasks, raw, scripts,
};
use crate::store::Keys;

/// How [`Tasks::lookup`] found a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Id,
    Alias,
    IdempotencyKey,
}

impl Found {
    pub fn as_str(self) -> &'static str {
        match self {
            Found::Id => "task id",
            Found::Alias => "alias",
            Found::IdempotencyKey => "idempotency key",
        }
    }
}

impl Tasks {
    /// One task, or None.
    pub async fn get(&self, id: &str) -> Result<Option<Task>, TaskError> {
        Ok(self.get_many(&[id.to_string()]).await?.into_iter().next().flatten())
    }

    /// The id of the task holding `alias` (a valid name), if any. An alias
    /// is held in its task's shard: every shard is asked, at once. When
    /// several hold it (a finished task keeps it through retention while a
    /// new one in another shard takes it), the newest task wins: ids are
    /// ULIDs, ordered by when they were drawn.
    pub async fn alias_holder(&self, alias: &str) -> Result<Option<String>, TaskError> {
        let found = self
            .every_shard(|s| {
                let key = format!("{}:alias:{alias}", s.keys().prefix());
                async move { s.query::<Option<String>>("alias_get", redis::cmd("GET").arg(key)).await }
            })
            .await?;
        Ok(found.into_iter().flatten().max())
    }

    /// The task a search term names, in one pipelined round trip per shard
    /// (at once): a task id, an alias (held while its task lives, kept
    /// through retention) or an idempotency key (within its window), in that
    /// order; the newest task when several shards hold the alias or the key
    /// (see [`Tasks::alias_holder`]). The term must already be a valid
    /// opaque key; one that is not also a name (`:`, `/`, `*`...) can only
    /// be an idempotency key, and only that is looked up for it.
    pub async fn lookup(&self, term: &str) -> Result<Option<(String, Found)>, TaskError> {
        let id_shard = self.store.shards().home(term);
        let named = crate::validate::is_name(term);
        let found = self
            .every_shard(|s| {
                let p0 = s.keys().prefix().to_string();
                let mut p = redis::pipe();
                p.cmd("GET").arg(format!("{p0}:idem:{term}"));
                if named {
                    p.cmd("EXISTS").arg(tkey(&s, term));
                    p.cmd("GET").arg(format!("{p0}:alias:{term}"));
                }
                async move {
                    if named {
                        let (idem, exists, alias) = s
                            .pipe::<(Option<String>, bool, Option<String>)>("task_lookup", &p)
                            .await?;
                        Ok((exists, alias, idem))
                    } else {
                        let (idem,) = s.pipe::<(Option<String>,)>("task_lookup", &p).await?;
                        Ok((false, None, idem))
                    }
                }
            })
            .await?;
        let exists = found[id_shard].0;
        let alias = found.iter().filter_map(|f| f.1.clone()).max();
        let idem = found.iter().filter_map(|f| f.2.clone()).max();
        Ok(if exists {
            Some((term.to_string(), Found::Id))
        } else if let Some(id) = alias {
            Some((id, Found::Alias))
        } else {
            idem.map(|id| (id, Found::IdempotencyKey))
        })
    }

    /// Runs `read` on every shard's view at once; the answers in shard order.
    async fn every_shard<T, F, Fut>(&self, read: F) -> Result<Vec<T>, StoreError>
    where
        F: Fn(Store) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        self.store.fan_out(read).await
    }

    /// Several tasks in one pipelined round trip per shard they are in (at
    /// once), in order (None: gone).
    pub async fn get_many(&self, ids: &[String]) -> Result<Vec<Option<Task>>, TaskError> {
        let mut parts: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, id) in ids.iter().enumerate() {
            parts.entry(self.store.shards().home(id)).or_default().push(i);
        }
        let reads = parts.into_iter().map(|(shard, at)| {
            let s = self.store.shard(shard);
            let mut p = redis::pipe();
            for &i in &at {
                p.cmd("HGETALL").arg(tkey(&s, &ids[i]));
            }
            async move {
                let maps: Vec<BTreeMap<String, String>> = s.pipe("task_get", &p).await?;
                Ok::<_, StoreError>(at.into_iter().zip(maps))
            }
        });
        let mut out: Vec<Option<Task>> = (0..ids.len()).map(|_| None).collect();
        for (i, m) in futures_util::future::try_join_all(reads).await?.into_iter().flatten() {
            if !m.is_empty() {
                out[i] = Some(task_from(&ids[i], &m));
            }
        }
        Ok(out)
    }

    /// Tasks of `queue` in `state`, a page at a time. Queued tasks are listed
    /// in claim order, down to [`MAX_QUEUED_CURSOR`]; the others newest first.
    /// A split namespace lists the queue's shards one after the other for
    /// queued tasks (claim order holds within a shard) and merges the others
    /// by time; its pages of any state go down to [`MAX_QUEUED_CURSOR`].
    pub async fn list(&self, queue: &str, state: &str, limit: usize, cursor: usize) -> Result<TaskPage, TaskError> {
        if cursor > MAX_QUEUED_CURSOR && (state == "queued" || self.sharded()) {
            return Err(TaskError::CursorTooDeep);
        }
        let shards = self.shards_of(queue).await;
        if state == "queued" {
            let one = shards.len() == 1;
            let reads = shards.iter().map(|&shard| {
                let call = scripts::ListQueued {
                    queue,
                    offset: if one { cursor } else { 0 },
                    limit: if one { limit + 1 } else { cursor + limit + 1 },
                };
                async move { self.store.shard(shard).run(&self.scripts.list_queued, &call).await }
            });
            let mut total = 0;
            let mut ids = Vec::new();
            for ListQueuedReply { total: t, ids: i } in futures_util::future::try_join_all(reads).await? {
                total += t;
                ids.extend(i);
            }
            let mut ids: Vec<String> = ids.into_iter().skip(if one { 0 } else { cursor }).collect();
            let more = ids.len() > limit && cursor + limit <= MAX_QUEUED_CURSOR;
            ids.truncate(limit);
            let tasks = self.get_many(&ids).await?.into_iter().flatten().collect();
            return Ok(TaskPage {
                tasks,
                next_cursor: more.then(|| (cursor + limit).to_string()),
                total,
            });
        }
        let suffix = state.to_string();
        self.page(
            &shards,
            |k| format!("{}:q:{queue}:{suffix}", k.prefix()),
            state == "delayed",
            limit,
            cursor,
        )
        .await
    }

    /// Dead tasks of every queue, newest first.
    pub async fn dead(&self, limit: usize, cursor: usize) -> Result<TaskPage, TaskError> {
        if cursor > MAX_QUEUED_CURSOR && self.sharded() {
            return Err(TaskError::CursorTooDeep);
        }
        let shards: Vec<usize> = self.store.every_shard().map(|s| s.shard_index()).collect();
        self.page(&shards, |k| format!("{}:dead", k.prefix()), false, limit, cursor)
            .await
    }

    /// A page of the sorted set `key` names in each of `shards`, merged by
    /// score (ties: shard order).
    async fn page(
        &self,
        shards: &[usize],
        key: impl Fn(&Keys) -> String,
        ascending: bool,
        limit: usize,
        cursor: usize,
    ) -> Result<TaskPage, TaskError> {
        let one = shards.len() == 1;
        let reads = shards.iter().map(|&shard| {
            let s = self.store.shard(shard);
            let key = key(s.keys());
            let mut p = redis::pipe();
            p.cmd("ZCARD").arg(&key);
            p.cmd("ZRANGE")
                .arg(&key)
                .arg(if one { cursor } else { 0 })
                .arg(cursor + limit);
            if !ascending {
                p.arg("REV");
            }
            p.arg("WITHSCORES");
            async move { s.pipe::<(u64, Vec<(String, f64)>)>("task_list", &p).await }
        });
        let mut total = 0;
        let mut rows = Vec::new();
        for (t, r) in futures_util::future::try_join_all(reads).await? {
            total += t;
            rows.extend(r);
        }
        if !one {
            // Stable: equal scores keep shard order.
            rows.sort_by(|a, b| {
                let o = a.1.total_cmp(&b.1);
                if ascending { o } else { o.reverse() }
            });
        }
        let mut ids: Vec<String> = rows
            .into_iter()
            .skip(if one { 0 } else { cursor })
            .map(|(id, _)| id)
            .collect();
        let more = ids.len() > limit;
        ids.truncate(limit);
        let tasks = self.get_many(&ids).await?.into_iter().flatten().collect();
        Ok(TaskPage {
            tasks,
            next_cursor: more.then(|| (cursor + limit).to_string()),
            total,
        })
    }

    /// Every known queue (in any shard) with its counts.
    pub async fn queues(&self) -> Result<Vec<QueueStats>, TaskError> {
        let mut names: Vec<String> = self.queue_names_by_shard().await?.into_iter().flatten().collect();
        names.sort();
        names.dedup();
        self.stats_for(&names).await
    }

    /// Counts of the named queues, read atomically in each shard (one
    /// script per shard, at once) and summed; a queue is paused when its
    /// own shard says so, and its latency is the longest of its shards'.
    pub async fn stats_for(&self, names: &[String]) -> Result<Vec<QueueStats>, TaskError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let call = scripts::Counts { queues: names };
        let rows = self
            .every_shard(|s| {
                let call = &call;
                async move { s.run(&self.scripts.counts, call).await }
            })
            .await?;
        Ok(names
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let home = self.home(q, "");
                let mut st = QueueStats {
                    name: q.clone(),
                    ..QueueStats::default()
                };
                let (mut some_paused, mut some_not) = (false, false);
                for (shard, r) in rows.iter().enumerate() {
                    let Some(c) = r.0.get(i) else { continue };
                    st.queued += c.queued;
                    st.delayed += c.delayed;
                    st.running += c.running;
                    st.dead += c.dead;
                    st.succeeded += c.succeeded;
                    st.cancelled += c.cancelled;
                    st.finished_last_minute += c.finished_last_minute;
                    st.latency_ms = st.latency_ms.max(c.latency_ms);
                    if shard == home {
                        st.paused = c.paused;
                    }
                    some_paused |= c.paused;
                    some_not |= !c.paused;
                }
                st.pause_state = match (st.paused, some_paused, some_not) {
                    (true, _, true) => "pausing",
                    (true, _, false) => "paused",
                    (false, true, _) => "resuming",
                    (false, false, _) => "active",
                }
                .to_string();
                st
            })
            .collect())
    }

    /// Groups that have queued tasks in `queue` or a configured limit, with
    /// their slots in use (each read in the group's shard).
    pub async fn groups(&self, queue: Option<&str>) -> Result<Vec<GroupInfo>, TaskError> {
        let q = queue.unwrap_or("-");
        let named = self
            .every_shard(|s| {
                let p0 = s.keys().prefix().to_string();
                let mut p = redis::pipe();
                p.cmd("HGETALL").arg(format!("{p0}:group_limits"));
                p.cmd("SMEMBERS").arg(format!("{p0}:q:{q}:groups"));
                async move {
                    s.pipe::<(BTreeMap<String, String>, Vec<String>)>("group_limits", &p)
                        .await
                }
            })
            .await?;
        let mut limits: BTreeMap<String, String> = BTreeMap::new();
        let mut names: Vec<String> = Vec::new();
        for (l, queued) in named {
            names.extend(l.keys().cloned());
            limits.extend(l);
            if queue.is_some() {
                names.extend(queued);
            }
        }
        // `@<limit>` is the line of tasks waiting on their own limits, not a
        // group (see GET /api/v1/limits/{name}).
        names.retain(|g| !g.starts_with('@'));
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut parts: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, g) in names.iter().enumerate() {
            parts.entry(self.home("", g)).or_default().push(i);
        }
        let reads = parts.into_iter().map(|(shard, at)| {
            let s = self.store.shard(shard);
            let p0 = s.keys().prefix().to_string();
            let mut p = redis::pipe();
            for &i in &at {
                let g = &names[i];
                p.cmd("SCARD").arg(format!("{p0}:group:{g}:running"));
                p.cmd("ZCARD").arg(format!("{p0}:q:{q}:g:{g}"));
            }
            async move {
                let counts: Vec<u64> = s.pipe("group_counts", &p).await?;
                Ok::<_, StoreError>(
                    at.into_iter()
                        .zip(counts.chunks(2).map(|c| (c[0], c[1])).collect::<Vec<_>>()),
                )
            }
        });
        let mut counts = vec![(0, 0); names.len()];
        for (i, c) in futures_util::future::try_join_all(reads).await?.into_iter().flatten() {
            counts[i] = c;
        }
        Ok(names
            .into_iter()
            .zip(counts)
            .map(|(name, (running, queued))| GroupInfo {
                limit: limits.get(&name).and_then(|l| l.parse().ok()),
                running,
                queued,
                name,
            })
            .collect())
    }
}

/// The key of task `id` in the shard `s` views.
fn tkey(s: &Store, id: &str) -> String {
    format!("{}:task:{id}", s.keys().prefix())
}

fn opt(s: Option<&String>) -> Option<String> {
    s.filter(|v| !v.is_empty()).cloned()
}

/// Builds a task from its hash.
/// A task's payload: its `payload` field, or its parts `p1`..`pN` joined
/// (`parts` = N: see `payload_fields` in tasks/lua/lib.lua), or `null`.
fn payload_of(m: &BTreeMap<String, String>) -> String {
    if let Some(p) = m.get("payload") {
        return p.clone();
    }
    let n: usize = m.get("parts").and_then(|n| n.parse().ok()).unwrap_or(0);
    if n == 0 {
        return "null".into();
    }
    (1..=n)
        .filter_map(|k| m.get(&format!("p{k}")).map(String::as_str))
        .collect()
}

fn task_from(id: &str, m: &BTreeMap<String, String>) -> Task {
    let num = |f: &str| m.get(f).and_then(|v| v.parse::<i64>().ok());
    let attempts = num("attempts").unwrap_or(0) as u32;
    let mut attempt_log = Vec::new();
    for n in 1..=attempts {
        let Some(a) = m.get(&format!("a{n}")) else { continue };
        let mut parts = a.splitn(3, '|');
        let (node, token, claimed_at) = (parts.next(), parts.next(), parts.next());
        let end = m.get(&format!("e{n}"));
        let (ended_at, outcome) = match end.and_then(|e| e.split_once('|')) {
            Some((t, o)) => (t.parse().ok(), Some(o.to_string())),
            None => (None, None),
        };
        attempt_log.push(Attempt {
            attempt: n,
            node: node.unwrap_or("").into(),
            token: token.and_then(|t| t.parse().ok()).unwrap_or(0),
            claimed_at: claimed_at.and_then(|t| t.parse().ok()).unwrap_or(0),
            ended_at,
            outcome,
        });
    }
    // Claims not acknowledged within their lease (the latest 10): they went
    // back to the queue, and their attempt was not counted.
    for k in 1..=10 {
        let Some(x) = m.get(&format!("x{k}")) else { continue };
        let p: Vec<&str> = x.splitn(5, '|').collect();
        let at = |i: usize| p.get(i).and_then(|v| v.parse::<i64>().ok());
        attempt_log.push(Attempt {
            attempt: at(0).unwrap_or(0) as u32,
            node: p.get(1).copied().unwrap_or("").into(),
            token: at(2).unwrap_or(0) as u64,
            claimed_at: at(3).unwrap_or(0),
            ended_at: at(4),
            outcome: Some("not_acknowledged".into()),
        });
    }
    attempt_log.sort_by_key(|a| a.claimed_at);
    Task {
        id: id.to_string(),
        queue: m.get("queue").cloned().unwrap_or_default(),
        state: m.get("state").cloned().unwrap_or_default(),
        payload: raw(&payload_of(m)),
        // A task with limits of its own waits in the line `@<first limit>`,
        // kept in its group field: not a group.
        group: opt(m.get("group")).filter(|g| !g.starts_with('@')),
        limits: opt(m.get("limits")).map(|l| l.split(',').map(str::to_string).collect()),
        // Left out of the hash while they hold these (TASK_DEFAULTS in
        // lua/lib.lua).
        priority: num("priority").unwrap_or(0) as i32,
        max_attempts: num("max_attempts").unwrap_or(scripts::DEFAULT_MAX_ATTEMPTS as i64) as u32,
        attempts,
        timeout_ms: num("timeout_ms").unwrap_or(0) as u64,
        alias: opt(m.get("alias")),
        idempotency_key: opt(m.get("idem")),
        owner: opt(m.get("owner")),
        token: num("token").map(|t| t as u64),
        created_at: num("created_at").unwrap_or(0),
        run_at: num("run_at"),
        started_at: num("started_at"),
        finished_at: num("finished_at"),
        // Hot paths do not write updated_at; the latest time something
        // happened is it. Not run_at: that is when something will happen.
        updated_at: ["updated_at", "created_at", "started_at", "finished_at"]
            .iter()
            .filter_map(|f| num(f))
            .max()
            .unwrap_or(0),
        progress: if m.get("state").is_some_and(|s| s == "succeeded") {
            100
        } else {
            num("progress").unwrap_or(0).clamp(0, 100) as u8
        },
        fields: opt(m.get("fields")).map(|f| raw(&f)),
        result: opt(m.get("result")).map(|r| raw(&r)),
        error: opt(m.get("error")),
        cancel_requested: m.get("cancel_requested").is_some_and(|v| v == "1"),
        submitted_by: opt(m.get("node")),
        attempt_log,
        traceparent: opt(m.get("tp")),
        tracestate: opt(m.get("ts")),
    }
}
