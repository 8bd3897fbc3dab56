//! The long polls of barriers: arriving at a round and waiting for its
//! verdict, waiting for a hold to lift, entering and leaving a DoubleBarrier.
//!
//! Each listens (`longpoll`) *before* it changes or reads the state, so a
//! decision cannot slip in between, and re-reads the state after every
//! wake-up; [`RECHECK`] bounds a wait after a lost event.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{BarrierError, Barriers, DoubleBarrier, Hold, Round};
use crate::longpoll::{self, RECHECK, Wake};

/// A DoubleBarrier as one entrant sees it after an enter or leave.
#[derive(Debug)]
pub struct Entrant {
    pub state: DoubleBarrier,
    /// Whether the entrant is among the entrants.
    pub inside: bool,
    /// enter: the barrier is ready and the entrant is inside. leave: every
    /// entrant of the cycle has left (or there was nothing to wait for).
    pub done: bool,
}

fn is_inside(d: &DoubleBarrier, node: &str) -> bool {
    d.entrants.iter().any(|e| e.node == node)
}

impl Barriers {
    /// `node` arrives at `round` and waits up to `wait` for its verdict;
    /// the round as last read (still open when the wait ran out or the node
    /// is stopping).
    pub async fn arrive_wait(
        &self,
        name: &str,
        round: &str,
        node: &str,
        wait: Duration,
    ) -> Result<Arc<Round>, BarrierError> {
        let give_up = Instant::now() + wait;
        // Listen before arriving, so the decision cannot slip in between.
        let ticket = self.park.waiters.ticket(longpoll::round_key(name, round));
        let notified = ticket.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let out = self.arrive(name, round, node).await?;
        let waited_here = out.round.is_open() || out.decided_now.is_some();
        let mut round_deadline = longpoll::after_ms(out.round.deadline - out.now);
        let mut r = Arc::new(out.round);
        let mut incarnation = out.incarnation;
        let mut next_check = Instant::now() + RECHECK;
        while r.is_open() {
            let now = Instant::now();
            if now >= give_up {
                break;
            }
            let until = give_up.min(next_check).min(round_deadline);
            // Woken by the decision (or the barrier's deletion) only: arrivals
            // of others do not change the answer, and waking every waiter on
            // each of them would cost O(participants²) reads per round.
            if longpoll::sleep(notified.as_mut(), until, &self.park.shutdown).await == Wake::Shutdown {
                break;
            }
            notified.set(ticket.notified());
            notified.as_mut().enable();
            if Instant::now() >= round_deadline {
                // The deadline passed: arriving again (a no-op for this
                // participant) decides the round if nobody has yet.
                let again = self.arrive(name, round, node).await?;
                round_deadline = if again.round.is_open() {
                    longpoll::after_ms(again.round.deadline - again.now)
                } else {
                    give_up
                };
                r = Arc::new(again.round);
                incarnation = again.incarnation;
            } else {
                r = self
                    .decided(name, round, &incarnation)
                    .await?
                    .ok_or_else(|| BarrierError::RoundNotFound {
                        barrier: name.to_string(),
                        round: round.to_string(),
                    })?;
            }
            next_check = Instant::now() + RECHECK;
        }
        if waited_here
            && !r.is_open()
            && let (Some(arrived), Some(decided)) = (r.arrived_at(node), r.decided_at)
        {
            metrics::histogram!("muster_barrier_wait_seconds").record((decided - arrived).max(0) as f64 / 1000.0);
        }
        Ok(r)
    }

    /// etcd-style Barrier.Wait: the hold once it is lifted, or as it stands
    /// when `wait` runs out or the node stops.
    pub async fn hold_wait(&self, name: &str, wait: Duration) -> Result<Hold, BarrierError> {
        let give_up = Instant::now() + wait;
        let ticket = self.park.waiters.ticket(longpoll::hold_key(name));
        loop {
            let notified = ticket.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (hold, lifts_in) = self.hold_state(name).await?;
            let now = Instant::now();
            if !hold.held || now >= give_up || self.park.shutdown.is_cancelled() {
                return Ok(hold);
            }
            // Until it is lifted, its TTL passes, or the re-check.
            let until = give_up.min(now + RECHECK).min(longpoll::after_ms(lifts_in + 1));
            longpoll::sleep(notified, until, &self.park.shutdown).await;
        }
    }

    /// DoubleBarrier.Enter: joins and waits up to `wait` until `count`
    /// entrants are in. An evicted entrant (its node stopped heartbeating)
    /// stops waiting.
    pub async fn enter_wait(
        &self,
        name: &str,
        node: &str,
        count: u32,
        wait: Duration,
    ) -> Result<Entrant, BarrierError> {
        let change = self.enter(name, node, count);
        self.watch_double(name, node, wait, change, |_, state, inside| {
            if !inside {
                Some(false)
            } else {
                state.ready.then_some(true)
            }
        })
        .await
    }

    /// DoubleBarrier.Leave: leaves and waits up to `wait` until every
    /// entrant of the ready cycle has left or been evicted.
    pub async fn leave_wait(&self, name: &str, node: &str, wait: Duration) -> Result<Entrant, BarrierError> {
        let change = self.leave(name, node);
        self.watch_double(name, node, wait, change, |left, state, _| {
            let done = match &left.cycle {
                None => true,
                Some(c) => state.entrants.is_empty() || state.cycle.as_deref() != Some(c.as_str()),
            };
            done.then_some(true)
        })
        .await
    }

    /// The wait both DoubleBarrier calls share: listens on `name`, applies
    /// `change` (an enter or a leave), then reads the barrier after every
    /// wake-up until `settled` ends the wait (`Some(done)`), `wait` runs out
    /// or the node stops (then not done).
    async fn watch_double<C>(
        &self,
        name: &str,
        node: &str,
        wait: Duration,
        change: impl Future<Output = Result<C, BarrierError>>,
        settled: impl Fn(&C, &DoubleBarrier, bool) -> Option<bool>,
    ) -> Result<Entrant, BarrierError> {
        let give_up = Instant::now() + wait;
        let ticket = self.park.waiters.ticket(longpoll::dbarrier_key(name));
        let notified = ticket.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let changed = change.await?;
        loop {
            let state = self.double_barrier(name).await?;
            let inside = is_inside(&state, node);
            let done = settled(&changed, &state, inside);
            if done.is_some() || Instant::now() >= give_up || self.park.shutdown.is_cancelled() {
                return Ok(Entrant {
                    state,
                    inside,
                    done: done.unwrap_or(false),
                });
            }
            let until = give_up.min(Instant::now() + RECHECK);
            longpoll::sleep(notified.as_mut(), until, &self.park.shutdown).await;
            notified.set(ticket.notified());
            notified.as_mut().enable();
        }
    }
}
