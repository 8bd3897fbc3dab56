//! The long polls of locks and elections: waiting in a lock's FIFO line,
//! and campaigning until elected.
//!
//! Each listens (`longpoll`) *before* it tries, so a release or a
//! resignation in between is not missed, and tries again after every
//! wake-up; [`RECHECK`] bounds a wait after a lost event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Attempt, Campaign, LockError, Locks};
use crate::longpoll::{self, RECHECK};

/// A granted lock.
#[derive(Debug, Clone, Copy)]
pub struct Grant {
    pub token: u64,
    pub expires_at: i64,
}

/// Gives up a place in line if the request is dropped while waiting (client
/// gone), so the next waiter need not wait for the place to lapse.
struct LineGuard {
    locks: Arc<Locks>,
    name: String,
    owner: String,
    armed: bool,
}

impl Drop for LineGuard {
    fn drop(&mut self) {
        if self.armed {
            let (locks, name, owner) = (self.locks.clone(), self.name.clone(), self.owner.clone());
            tokio::spawn(async move {
                let _ = locks.dequeue(&name, &owner).await;
            });
        }
    }
}

impl Locks {
    /// Acquires `name` for `owner`, waiting in line up to `wait` (zero: try
    /// once). [`LockError::Busy`] when it is still held by someone else (or
    /// others are ahead) when the wait runs out or the node stops.
    pub async fn acquire_wait(
        self: &Arc<Self>,
        name: &str,
        owner: &str,
        ttl_ms: u64,
        node: Option<&str>,
        wait: Duration,
    ) -> Result<Grant, LockError> {
        let give_up = Instant::now() + wait;
        let queue = !wait.is_zero();
        // A waiter polls well within its place's TTL, so a live waiter keeps it.
        let refresh = RECHECK.min(Duration::from_millis(self.cfg.waiter_ttl_ms / 3).max(Duration::from_millis(10)));
        let ticket = self.park.waiters.ticket(longpoll::lock_key(name));
        let mut guard = LineGuard {
            locks: self.clone(),
            name: name.to_string(),
            owner: owner.to_string(),
            armed: queue,
        };
        loop {
            // Listen before trying, so a release in between is not missed.
            let notified = ticket.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.try_acquire(name, owner, ttl_ms, node, queue).await? {
                Attempt::Granted { token, expires_at, .. } => {
                    guard.armed = false;
                    return Ok(Grant { token, expires_at });
                }
                Attempt::Busy { holder, position } => {
                    if Instant::now() >= give_up || self.park.shutdown.is_cancelled() {
                        guard.armed = false;
                        if queue {
                            self.dequeue(name, owner).await?;
                        }
                        return Err(LockError::Busy {
                            name: name.to_string(),
                            holder,
                            position,
                        });
                    }
                }
            }
            // Woken by a release, an expiry, the head of the line leaving, or
            // a node's death (the lease may be tied to it); polled within the
            // place's TTL so that a live waiter keeps it.
            let until = give_up.min(Instant::now() + refresh);
            longpoll::sleep(notified, until, &self.park.shutdown).await;
        }
    }

    /// Campaigns for leadership of `name`, waiting up to `wait` to be
    /// elected; the last campaign's outcome.
    pub async fn campaign_wait(
        &self,
        name: &str,
        candidate: &str,
        ttl_ms: u64,
        value: Option<&str>,
        wait: Duration,
    ) -> Result<Campaign, LockError> {
        let give_up = Instant::now() + wait;
        let ticket = self.park.waiters.ticket(longpoll::election_key(name));
        loop {
            let notified = ticket.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let c = self.campaign(name, candidate, ttl_ms, value).await?;
            if c.code > 0 || Instant::now() >= give_up || self.park.shutdown.is_cancelled() {
                return Ok(c);
            }
            // Woken by a resignation or an expiry; also at the lease's end.
            let mut until = give_up.min(Instant::now() + RECHECK);
            if let Some(lapses) = c.state.expires_at.map(|e| e + 1) {
                let now = self.store.time_ms().await.unwrap_or(lapses);
                until = until.min(longpoll::after_ms(lapses - now));
            }
            longpoll::sleep(notified, until, &self.park.shutdown).await;
        }
    }
}
