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
        self.claim_in(&shards, queue, node, credential, max, ack_ms).await
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
    /// fail or refuse (see the module header for the answer).
    pub(super) async fn claim_in(
        &self,
        shards: &[usize],
        queue: &str,
        node: &str,
        credential: &str,
        max: u32,
        ack_ms: u64,
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
            };
            let reply = match self.store.shard(shard).run(&self.scripts.claim, &call).await {
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
                match self.claim_in(&others, &n.queue, &n.owner, "", max - got, ack_ms).await {
                    Ok(more) => r.absorb(more),
                    // Nothing was claimed in the others: the answer stands.
                    Err(_) => r.not_tried.extend(others),
                }
            }
        }
        Some(n)
    }
}
