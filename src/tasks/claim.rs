//! The claim fan-out over a split namespace, and what it answers when some
//! shards fail.
//!
//! A claim takes the queue's shard first, then the other shards that hold
//! its tasks ([`Tasks::shards_of`]), one script each, until `max` tasks are
//! claimed. Failure isolation (a master that stalls or fails over costs only
//! its own shards):
//! - a shard where this node's own registration may have lapsed, or whose
//!   latest heartbeat failed, is skipped (`Health`), never waited for;
//! - a shard that fails or refuses is skipped, and the claim goes on with
//!   the others;
//! - once a shard has claimed tasks the answer is those tasks (200), never
//!   an error: the tokens exist only in this answer, and an error would
//!   strand them under a worker that never got them. The shards not tried
//!   are named (`not_tried`).
//!
//! A claim that claimed nothing answers: empty (204) when some shard ran
//! its claim; the refusal when every shard tried refused the worker (not
//! registered there, or draining: 409); the error when a shard failed and
//! none ran (503: nothing was applied).

use super::scripts::{self, ClaimReply};
use super::{ClaimResult, Claimed, NextClaimed, TaskError, Tasks, raw};
use crate::store::{Code, StoreError};

/// How long a reservation in shard 0 holds unsettled (a claim in another
/// shard runs between the reservation and its settling).
pub(super) const RESERVATION_TTL_MS: u64 = 30_000;

/// How long a node takes a queue to have its limits in shard 0 after a
/// claim last found so (then it asks the queue's shard again).
const LIMITED_FOR: std::time::Duration = std::time::Duration::from_secs(5);

impl Tasks {
    /// Claims up to `max` tasks of `queue` for `node`: from the queue's
    /// shard, then (split namespaces) from the other shards that hold its
    /// tasks, one script each, until `max` are claimed.
    /// `ack_ms` is the claim lease (0: none). `credential` is the caller's
    /// (token name): a worker registered by another credential is refused
    /// ("": not checked).
    pub async fn claim(
        &self,
        queue: &str,
        node: &str,
        credential: &str,
        max: u32,
        ack_ms: u64,
    ) -> Result<ClaimResult, TaskError> {
        let shards = self.shards_of(queue).await;
        self.claim_in(&shards, queue, node, credential, max, ack_ms, false)
            .await
    }

    /// Why this node skips `shard` in a claim's fan-out now, if it does:
    /// only on a split namespace (one shard is judged as a whole by the
    /// route), when this node's registration there may have lapsed or its
    /// latest heartbeat there failed (its master is likely stalled: trying
    /// it would cost a timeout per claim).
    fn skips(&self, shard: usize) -> Option<String> {
        if !self.sharded() {
            return None;
        }
        match self.health.refuses_work_in(shard) {
            Some(r) => Some(r.into_message()),
            None if self.health.failing(shard) => Some(format!(
                "this node's latest heartbeat in shard {shard} failed: its master is unreachable or stalled"
            )),
            None => None,
        }
    }

    /// Claims from `shards` in order, skipping and going past shards that
    /// fail or refuse (see the module header for the answer). `recheck`: a
    /// claim again after an event woke a long poll: a shard with nothing
    /// ready and nothing due answers empty at once, without the rest of a
    /// claim (claim.lua's ARGV[9]); most such wake-ups lost their task to a
    /// complete's next claim.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn claim_in(
        &self,
        shards: &[usize],
        queue: &str,
        node: &str,
        credential: &str,
        max: u32,
        ack_ms: u64,
        recheck: bool,
    ) -> Result<ClaimResult, TaskError> {
        let mut out = ClaimResult::default();
        let mut ran = false;
        let mut refusal: Option<TaskError> = None;
        let mut error: Option<TaskError> = None;
        for (at, &shard) in shards.iter().enumerate() {
            let got = out.tasks.len() as u32;
            if got >= max {
                break;
            }
            if let Some(why) = self.skips(shard) {
                out.not_tried.push(shard);
                error.get_or_insert(TaskError::Store(StoreError::Unavailable(format!(
                    "{why}; claim through another node"
                ))));
                continue;
            }
            let call = scripts::Claim {
                queue,
                node,
                max: max - got,
                ack_ms,
                credential,
                reserved: None,
                handed: &[],
                recheck,
            };
            // A queue known to have its limits in shard 0 reserves there
            // without asking this shard first.
            let reply = if shard != 0 && self.limited_elsewhere(queue) {
                self.claim_reserved(shard, call, None, Vec::new()).await
            } else {
                match self.store.shard(shard).run(&self.scripts.claim, &call).await {
                    Ok(ClaimReply::Reserve { next_due, handed }) => {
                        self.claim_reserved(shard, call, next_due, handed).await
                    }
                    other => other,
                }
            };
            let reply = match reply {
                Ok(r) => r,
                Err(e) => {
                    // Tried, failed: its outcome is unknown to this node, but
                    // nothing it claimed can be in this answer either.
                    out.not_tried.push(shard);
                    if at == 0 || error.is_none() {
                        error = Some(e.into());
                    }
                    continue;
                }
            };
            match self.decode_claim(queue, node, reply, ack_ms) {
                Ok(r) => {
                    ran = true;
                    out.absorb(r);
                }
                Err(e) => {
                    refusal.get_or_insert(e);
                }
            }
        }
        if out.tasks.is_empty() && !ran {
            // Nothing was applied anywhere: the refusal when the worker was
            // refused, else the error (every shard tried failed or was
            // skipped).
            if let Some(e) = refusal.or(error) {
                return Err(e);
            }
        }
        self.count_claim(queue, &out);
        if !out.not_tried.is_empty() {
            metrics::counter!("muster_claims_partial_total").increment(1);
        }
        Ok(out)
    }

    /// Split namespaces: a claim in `shard` (not 0) of a queue whose limits
    /// live in shard 0. Reserves there first (tokens taken, slots held by
    /// placeholders), claims at most that in `shard`, then settles in the
    /// background, off the answer's path: the tasks claimed keep their
    /// slots, the rest goes back. Shard 0 unreachable: the error (nothing
    /// claimed). The claim failed: the reservation lapses on its own
    /// ([`RESERVATION_TTL_MS`]; its tokens stay spent). The settling failed:
    /// the tasks are still the answer (they were handed out), and their
    /// placeholders lapse.
    async fn claim_reserved(
        &self,
        shard: usize,
        call: scripts::Claim<'_>,
        next_due: Option<i64>,
        handed: Vec<String>,
    ) -> Result<ClaimReply, StoreError> {
        if let Some(why) = self.skips(0) {
            return Err(StoreError::Unavailable(format!(
                "the queue's limits are in shard 0, and {why}"
            )));
        }
        let limits = self.store.shard(0);
        let rid = ulid::Ulid::generate().to_string();
        let reserve = scripts::LimitReserve {
            queue: call.queue,
            want: call.max,
            rid: &rid,
            ttl_ms: RESERVATION_TTL_MS,
            returned: &handed,
        };
        let got = limits.run(&self.scripts.limit_reserve, &reserve).await?;
        self.note_limited(call.queue, !got.names.is_empty());
        if got.k == 0 {
            // What was handed over leaves the outbox with the next claim or
            // the background hand-over (handing over twice is harmless).
            let due = match (next_due, got.next_due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            return Ok(ClaimReply::Claimed {
                tasks: Vec::new(),
                next_due: due,
                more: false,
            });
        }
        let call = scripts::Claim {
            reserved: Some((got.k, &got.names, got.at)),
            handed: &handed,
            ..call
        };
        let reply = self.store.shard(shard).run(&self.scripts.claim, &call).await?;
        if got.names.is_empty() {
            return Ok(reply);
        }
        let used = match &reply {
            ClaimReply::Claimed { tasks, .. } => tasks.iter().map(|t| format!("{}:{}", t.id, t.attempt)).collect(),
            _ => Vec::new(),
        };
        // Every reserved slot used: settled after the answer, off its path
        // (the placeholders hold the slots meanwhile, and a task that ends
        // first leaves a tombstone that the settling honours). Some unused:
        // settled before, so that what is left goes back at once (another
        // shard's claim, next in this fan-out, may need it).
        let lua = self.scripts.limit_confirm.clone();
        let queue = call.queue.to_string();
        let (names, k, all) = (got.names, got.k, used.len() as u32 >= got.k);
        let settle = async move {
            let settle = scripts::LimitConfirm {
                rid: &rid,
                names: &names,
                k,
                used,
            };
            if let Err(e) = limits.run(&lua, &settle).await {
                tracing::warn!(error = %e, %queue, "a claim's reservation of its limits was not settled: its slots lapse in {RESERVATION_TTL_MS} ms");
            }
        };
        if all {
            tokio::spawn(settle);
        } else {
            settle.await;
        }
        Ok(reply)
    }

    /// The next claim a complete or fail made in `shard` for `owner`, as
    /// tasks. When the queue's limits are in shard 0 (the script claimed
    /// nothing, and answered the head of the shard's outbox, the slot the
    /// finish just freed among it), reserves there, handing the outbox over
    /// in the same call, and claims again with the reservation: two calls
    /// and the settling.
    pub(super) async fn next_claimed(
        &self,
        shard: usize,
        queue: &str,
        owner: &str,
        reply: ClaimReply,
        max: u32,
        ack_ms: u64,
    ) -> Result<ClaimResult, TaskError> {
        let ClaimReply::Reserve { next_due, handed } = reply else {
            return self.claimed(queue, owner, reply, ack_ms);
        };
        self.note_limited(queue, true);
        if self.skips(shard).is_some() {
            return self.claimed(queue, owner, ClaimReply::Reserve { next_due, handed }, ack_ms);
        }
        let call = scripts::Claim {
            queue,
            node: owner,
            max,
            ack_ms,
            credential: "",
            reserved: None,
            handed: &[],
            recheck: false,
        };
        let result = match self.claim_reserved(shard, call, next_due, handed).await {
            Ok(reply) => self.decode_claim(queue, owner, reply, ack_ms),
            Err(e) => Err(e.into()),
        };
        if let Ok(r) = &result {
            self.count_claim(queue, r);
        }
        result
    }

    /// Whether a claim in a shard other than 0 lately found `queue`'s limits
    /// in shard 0 (within [`LIMITED_FOR`]).
    fn limited_elsewhere(&self, queue: &str) -> bool {
        let known = self.limited.lock().unwrap_or_else(|p| p.into_inner());
        known.get(queue).is_some_and(|at| at.elapsed() < LIMITED_FOR)
    }

    /// Notes whether `queue`'s limits are in shard 0 (a claim elsewhere just
    /// found out); bounded like the queues themselves.
    fn note_limited(&self, queue: &str, limited: bool) {
        let mut known = self.limited.lock().unwrap_or_else(|p| p.into_inner());
        if limited {
            if known.len() >= 10_000 {
                known.retain(|_, at| at.elapsed() < LIMITED_FOR);
            }
            known.insert(queue.to_string(), std::time::Instant::now());
        } else {
            known.remove(queue);
        }
    }

    /// Turns a claim reply into tasks, counting them (and empty claims).
    pub(super) fn claimed(
        &self,
        queue: &str,
        node: &str,
        reply: ClaimReply,
        ack_ms: u64,
    ) -> Result<ClaimResult, TaskError> {
        let r = self.decode_claim(queue, node, reply, ack_ms)?;
        self.count_claim(queue, &r);
        Ok(r)
    }

    fn count_claim(&self, queue: &str, r: &ClaimResult) {
        if r.tasks.is_empty() {
            metrics::counter!("muster_claims_empty_total").increment(1);
        } else {
            metrics::counter!("muster_tasks_claimed_total", "queue" => self.labels.label(queue))
                .increment(r.tasks.len() as u64);
        }
    }

    /// Turns a claim reply into tasks (claimed with the lease `ack_ms`).
    fn decode_claim(&self, queue: &str, node: &str, reply: ClaimReply, ack_ms: u64) -> Result<ClaimResult, TaskError> {
        match reply {
            ClaimReply::Refused(Code::NodeDraining) => Err(TaskError::NodeDraining(node.into())),
            ClaimReply::Refused(Code::NotOwner) => Err(TaskError::NotOwner(node.into())),
            ClaimReply::Refused(_) => Err(TaskError::NodeNotAlive(node.into())),
            // A claim made with a complete or fail in a shard whose queue's
            // limits are in shard 0: nothing claimed (the worker's next claim
            // reserves).
            ClaimReply::Reserve { next_due, .. } => Ok(ClaimResult {
                tasks: Vec::new(),
                next_due,
                more: false,
                not_tried: Vec::new(),
            }),
            ClaimReply::Claimed { tasks, next_due, more } => {
                let tasks = tasks
                    .into_iter()
                    .map(|t| Claimed {
                        id: t.id,
                        queue: queue.to_string(),
                        token: t.token,
                        attempt: t.attempt,
                        payload: raw(&t.payload),
                        max_attempts: t.max_attempts,
                        timeout_ms: t.timeout_ms,
                        group: (!t.group.is_empty()).then_some(t.group),
                        priority: t.priority,
                        created_at: t.created_at,
                        ack_ms,
                        traceparent: (!t.traceparent.is_empty()).then_some(t.traceparent),
                        tracestate: (!t.tracestate.is_empty()).then_some(t.tracestate),
                    })
                    .collect();
                Ok(ClaimResult {
                    tasks,
                    next_due,
                    more,
                    not_tried: Vec::new(),
                })
            }
        }
    }

    /// Split namespaces: the next claim a complete or fail made in shard
    /// `tried` (the finished task's), topped up to `max` from the queue's
    /// other shards. Never an error: the finish and the tasks already
    /// claimed are the answer whatever the other shards do (their failures
    /// are left out, and named in `not_tried`).
    pub(super) async fn top_up(
        &self,
        tried: usize,
        max: u32,
        ack_ms: u64,
        next: Option<NextClaimed>,
    ) -> Option<NextClaimed> {
        let mut n = next?;
        if let (true, Ok(r)) = (self.sharded(), &mut n.result) {
            let got = r.tasks.len() as u32;
            if got < max {
                let others: Vec<usize> = self
                    .shards_of(&n.queue)
                    .await
                    .into_iter()
                    .filter(|&s| s != tried)
                    .collect();
                match self
                    .claim_in(&others, &n.queue, &n.owner, "", max - got, ack_ms, false)
                    .await
                {
                    Ok(more) => r.absorb(more),
                    // Nothing was claimed in the others: the answer stands.
                    Err(_) => r.not_tried.extend(others),
                }
            }
        }
        Some(n)
    }
}
