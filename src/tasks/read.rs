//! The read side of the task store: tasks, pages of a queue or the dead
//! letters, queue and group statistics.

use super::*;

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

    /// The id of the task holding `alias` (a valid name), if any.
    pub async fn alias_holder(&self, alias: &str) -> Result<Option<String>, TaskError> {
        let key = format!("{}:alias:{alias}", self.store.keys().prefix());
        Ok(self.store.query("alias_get", redis::cmd("GET").arg(key)).await?)
    }

    /// The task a search term names, in one pipelined round trip: a task id,
    /// an alias (held while its task lives, kept through retention) or an
    /// idempotency key (within its window), in that order. The term must
    /// already be a valid name.
    pub async fn lookup(&self, term: &str) -> Result<Option<(String, Found)>, TaskError> {
        let p0 = self.store.keys().prefix();
        let mut p = redis::pipe();
        p.cmd("EXISTS").arg(self.tkey(term));
        p.cmd("GET").arg(format!("{p0}:alias:{term}"));
        p.cmd("GET").arg(format!("{p0}:idem:{term}"));
        let (exists, alias, idem): (bool, Option<String>, Option<String>) = self.store.pipe("task_lookup", &p).await?;
        Ok(if exists {
            Some((term.to_string(), Found::Id))
        } else if let Some(id) = alias {
            Some((id, Found::Alias))
        } else {
            idem.map(|id| (id, Found::IdempotencyKey))
        })
    }

    /// Several tasks in one pipelined round trip, in order (None: gone).
    pub async fn get_many(&self, ids: &[String]) -> Result<Vec<Option<Task>>, TaskError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for id in ids {
            p.cmd("HGETALL").arg(self.tkey(id));
        }
        let maps: Vec<BTreeMap<String, String>> = self.store.pipe("task_get", &p).await?;
        Ok(maps
            .iter()
            .zip(ids)
            .map(|(m, id)| if m.is_empty() { None } else { Some(task_from(id, m)) })
            .collect())
    }

    /// Tasks of `queue` in `state`, a page at a time. Queued tasks are listed
    /// in claim order, down to [`MAX_QUEUED_CURSOR`]; the others newest first.
    pub async fn list(&self, queue: &str, state: &str, limit: usize, cursor: usize) -> Result<TaskPage, TaskError> {
        if state == "queued" {
            if cursor > MAX_QUEUED_CURSOR {
                return Err(TaskError::CursorTooDeep);
            }
            let call = scripts::ListQueued {
                queue,
                offset: cursor,
                limit: limit + 1,
            };
            let ListQueuedReply { total, mut ids } = self.store.run(&self.scripts.list_queued, &call).await?;
            let more = ids.len() > limit && cursor + limit <= MAX_QUEUED_CURSOR;
            ids.truncate(limit);
            let tasks = self.get_many(&ids).await?.into_iter().flatten().collect();
            return Ok(TaskPage {
                tasks,
                next_cursor: more.then(|| (cursor + limit).to_string()),
                total,
            });
        }
        let key = self.qkey(queue, state);
        self.page(&key, state == "delayed", limit, cursor).await
    }

    /// Dead tasks of every queue, newest first.
    pub async fn dead(&self, limit: usize, cursor: usize) -> Result<TaskPage, TaskError> {
        let key = format!("{}:dead", self.store.keys().prefix());
        self.page(&key, false, limit, cursor).await
    }

    async fn page(&self, key: &str, ascending: bool, limit: usize, cursor: usize) -> Result<TaskPage, TaskError> {
        let mut p = redis::pipe();
        p.cmd("ZCARD").arg(key);
        p.cmd("ZRANGE").arg(key).arg(cursor).arg(cursor + limit);
        if !ascending {
            p.arg("REV");
        }
        let (total, mut ids): (u64, Vec<String>) = self.store.pipe("task_list", &p).await?;
        let more = ids.len() > limit;
        ids.truncate(limit);
        let tasks = self.get_many(&ids).await?.into_iter().flatten().collect();
        Ok(TaskPage {
            tasks,
            next_cursor: more.then(|| (cursor + limit).to_string()),
            total,
        })
    }

    /// Every known queue with its counts, in two pipelined round trips.
    pub async fn queues(&self) -> Result<Vec<QueueStats>, TaskError> {
        let k = self.store.keys();
        let mut names: Vec<String> = self
            .store
            .query(
                "queues_list",
                redis::cmd("SMEMBERS").arg(format!("{}:queues", k.prefix())),
            )
            .await?;
        names.sort();
        self.stats_for(&names).await
    }

    /// Counts of the named queues, read atomically.
    pub async fn stats_for(&self, names: &[String]) -> Result<Vec<QueueStats>, TaskError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self
            .store
            .run(&self.scripts.counts, &scripts::Counts { queues: names })
            .await?;
        Ok(names
            .iter()
            .zip(rows.0)
            .map(|(q, c)| QueueStats {
                name: q.clone(),
                queued: c.queued,
                delayed: c.delayed,
                running: c.running,
                dead: c.dead,
                succeeded: c.succeeded,
                cancelled: c.cancelled,
                finished_last_minute: c.finished_last_minute,
                paused: c.paused,
                latency_ms: c.latency_ms,
            })
            .collect())
    }

    /// Groups that have queued tasks in `queue` or a configured limit, with
    /// their slots in use.
    pub async fn groups(&self, queue: Option<&str>) -> Result<Vec<GroupInfo>, TaskError> {
        let k = self.store.keys();
        let limits: BTreeMap<String, String> = self
            .store
            .query(
                "group_limits",
                redis::cmd("HGETALL").arg(format!("{}:group_limits", k.prefix())),
            )
            .await?;
        let mut names: Vec<String> = limits.keys().cloned().collect();
        if let Some(q) = queue {
            let queued: Vec<String> = self
                .store
                .query("queue_groups", redis::cmd("SMEMBERS").arg(self.qkey(q, "groups")))
                .await?;
            names.extend(queued);
        }
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for g in &names {
            p.cmd("SCARD").arg(format!("{}:group:{g}:running", k.prefix()));
            p.cmd("ZCARD").arg(self.qkey(queue.unwrap_or("-"), &format!("g:{g}")));
        }
        let counts: Vec<u64> = self.store.pipe("group_counts", &p).await?;
        Ok(names
            .into_iter()
            .zip(counts.chunks(2))
            .map(|(name, c)| GroupInfo {
                limit: limits.get(&name).and_then(|l| l.parse().ok()),
                running: c[0],
                queued: c[1],
                name,
            })
            .collect())
    }
}

fn opt(s: Option<&String>) -> Option<String> {
    s.filter(|v| !v.is_empty()).cloned()
}

/// Builds a task from its hash.
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
    Task {
        id: id.to_string(),
        queue: m.get("queue").cloned().unwrap_or_default(),
        state: m.get("state").cloned().unwrap_or_default(),
        payload: raw(m.get("payload").map(String::as_str).unwrap_or("null")),
        group: opt(m.get("group")),
        priority: num("priority").unwrap_or(0) as i32,
        max_attempts: num("max_attempts").unwrap_or(0) as u32,
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
    }
}
