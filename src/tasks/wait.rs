//! Long-poll claims: a claim that waits for a task, and a complete or fail
//! that claims the worker's next task in the same call and may wait for it.
//!
//! A waiting claim registers on its queue's notifier (`events::Wakers`)
//! and arms the wake-up *before* it claims, so a task enqueued in between is
//! not missed; it claims again after every wake-up (events only say "look
//! again"; the claim script decides by Redis time, G1/G11).

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::sync::futures::Notified;

use super::{ClaimResult, NextClaim, NextClaimed, TaskError, Tasks};

use crate::events::QueueWaiter;

/// The task(s) claimed next by a complete or fail that asked for them.
pub(crate) type NextTasks = muster_api::tasks::NextTasks<Box<serde_json::value::RawValue>>;

/// What a complete or fail with `next` asks for.
#[derive(Debug, Default)]
pub struct NextAsk {
    pub claim: NextClaim,
    /// Why this node claims nothing now (draining, stopping, cut off from
    /// Redis: the same reasons a claim gets 503 for). The finish still runs.
    pub refused_here: Option<String>,
    /// How long to wait for a task when none is claimable.
    pub wait: Duration,
}

/// A wake-up of `waiter`'s queue, enabled now: a wake-up from here on is
/// not lost, even before it is awaited. Arm it before the claim it follows.
fn armed<'a>(waiter: &'a QueueWaiter<'_>) -> Pin<Box<Notified<'a>>> {
    let mut n = Box::pin(waiter.notified());
    n.as_mut().enable();
    n
}

/// Why a next claim failed, worded as the claim's own error would be.
fn refusal(e: TaskError) -> String {
    crate::problem::detail(&e)
}

impl Tasks {
    /// Claims up to `max` tasks of `queue` for `node`, waiting up to `wait`
    /// for one to become claimable anywhere in the cluster. Empty when none
    /// came in time or the node is stopping. Dropping the future (the client
    /// went away) drops the registration. `ack_ms`: the claim lease (0: none).
    #[allow(clippy::too_many_arguments)]
    pub async fn claim_wait(
        &self,
        queue: &str,
        node: &str,
        credential: &str,
        max: u32,
        ack_ms: u64,
        wait: Duration,
    ) -> Result<ClaimResult, TaskError> {
        let deadline = Instant::now() + wait;
        let waiter = self.bus.wakers.wait(queue);
        let notified = armed(&waiter);
        self.claim_until(queue, node, credential, max, ack_ms, deadline, &waiter, notified, None)
            .await
    }

    /// A long-poll claim: claims up to `max` tasks of `queue` for `node`
    /// until it gets some, `deadline` passes or the node stops (then the
    /// result is empty). `first` is a claim already made (by a complete's or
    /// fail's `next`), after `notified` was armed; None: claim first.
    #[allow(clippy::too_many_arguments)]
    async fn claim_until<'a>(
        &self,
        queue: &str,
        node: &str,
        credential: &str,
        max: u32,
        ack_ms: u64,
        deadline: Instant,
        waiter: &'a QueueWaiter<'_>,
        mut notified: Pin<Box<Notified<'a>>>,
        first: Option<ClaimResult>,
    ) -> Result<ClaimResult, TaskError> {
        // `again`: after an event woke the poll (`recheck` in Tasks::claim_in).
        let claim = |again: bool| async move {
            let started = Instant::now();
            let shards = self.shards_of(queue).await;
            let r = self
                .claim_in(&shards, queue, node, credential, max, ack_ms, again)
                .await;
            metrics::histogram!("muster_claim_duration_seconds").record(started.elapsed().as_secs_f64());
            r
        };
        let mut r = match first {
            Some(r) => r,
            None => claim(false).await?,
        };
        loop {
            if !r.tasks.is_empty() {
                if r.more {
                    waiter.wake_another();
                }
                return Ok(r);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(r);
            }
            // Sleep until woken by an event, the next delayed task is due, the
            // deadline passes, or the node stops. The 2 s cap is a safety net
            // against a lost wake-up, not the wake mechanism.
            let mut until = deadline.min(now + Duration::from_secs(2));
            if let Some(due) = r.next_due {
                // The node's estimate of Redis time is enough to pick a wake-up
                // time (the claim itself decides by Redis time).
                let redis_now = self.store.redis_now_estimate().unwrap_or(due);
                let in_ms = (due - redis_now).max(0) as u64;
                until = until.min(now + Duration::from_millis(in_ms + 1));
            }
            // Woken by an event, the claim looks again cheaply; after a
            // timer (a delayed task due, the 2 s net) it is a whole claim,
            // which also checks the worker's registration.
            let woken = tokio::select! {
                _ = notified.as_mut() => true,
                _ = tokio::time::sleep_until(until.into()) => false,
                _ = self.shutdown.cancelled() => return Ok(r),
            };
            notified = armed(waiter);
            r = claim(woken).await?;
        }
    }

    /// Runs a complete or fail (`finish`) that may claim next, then, when it
    /// claimed nothing and the caller asked to wait, waits for a task as a
    /// long-poll claim does. The waiter is armed before `finish` when the
    /// queue is known, so a task enqueued meanwhile is not missed; otherwise
    /// one claim runs after arming it.
    pub async fn finish_then_claim<T, F>(
        &self,
        ask: NextAsk,
        finish: impl FnOnce(NextClaim) -> F,
    ) -> Result<(T, Option<NextTasks>), TaskError>
    where
        F: Future<Output = Result<(T, Option<NextClaimed>), TaskError>>,
    {
        let started = Instant::now();
        let early = match (&ask.claim.queue, ask.wait.is_zero()) {
            (Some(q), false) => Some(self.bus.wakers.wait(q)),
            _ => None,
        };
        let notified = early.as_ref().map(armed);
        let (max, ack_ms) = (ask.claim.max, ask.claim.ack_ms);
        let (out, next) = finish(ask.claim).await?;
        if let Some(why) = ask.refused_here {
            return Ok((
                out,
                Some(NextTasks {
                    tasks: Vec::new(),
                    refused: Some(why),
                    shards_not_tried: Vec::new(),
                }),
            ));
        }
        let Some(next) = next else {
            return Ok((out, None));
        };
        let result = match next.result {
            Ok(r) if r.tasks.is_empty() && !ask.wait.is_zero() => {
                let deadline = started + ask.wait;
                match (&early, notified) {
                    (Some(w), Some(n)) if next.queue == w.queue() => {
                        self.claim_until(&next.queue, &next.owner, "", max, ack_ms, deadline, w, n, Some(r))
                            .await
                    }
                    _ => {
                        let late = self.bus.wakers.wait(&next.queue);
                        let n = armed(&late);
                        self.claim_until(&next.queue, &next.owner, "", max, ack_ms, deadline, &late, n, None)
                            .await
                    }
                }
                .map_err(refusal)
            }
            Ok(r) => Ok(r),
            Err(e) => Err(refusal(e)),
        };
        Ok((
            out,
            Some(match result {
                Ok(r) => NextTasks {
                    tasks: r.tasks,
                    refused: None,
                    shards_not_tried: r.not_tried,
                },
                Err(why) => NextTasks {
                    tasks: Vec::new(),
                    refused: Some(why),
                    shards_not_tried: Vec::new(),
                },
            }),
        ))
    }
}
