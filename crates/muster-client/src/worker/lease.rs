//! The worker's own registration lease, kept on this process's monotonic
//! clock, so a worker that can reach no node stops its handlers before the
//! cluster hands their tasks to another worker.
//!
//! The cluster takes a worker for dead `ttl` after the last heartbeat it
//! received, by Redis time, and then recovers its tasks. Redis received
//! that heartbeat after the worker sent it, so a lease counted from the
//! *send* time of the newest heartbeat that succeeded ends no later than
//! the registration does. It is cut short by a margin,
//! `max(ttl / 10, 100 ms)` ([`margin`]), which is the handlers' time to see
//! the cancellation and stop before the cleaner's next pass can requeue
//! their tasks. A heartbeat whose answer never came does not count: it may
//! never have arrived.
//!
//! When the lease lapses, every running handler is cancelled with
//! [`CancelReason::LeaseExpired`], the claim loops wait, and a task whose
//! claim is answered meanwhile is not started. The first heartbeat that
//! succeeds afterwards renews it (if its own send time is recent enough);
//! then the worker claims again and looks for tasks held under its id that
//! it did not start (the adopter). All of it is local bookkeeping: no call
//! is added.

use std::time::Instant;

use super::{Arc, CancellationToken, Duration, Mutex, NodeHeartbeatAnswer, Result, Shared, inc, registration_of};

/// How long before the end of its registration a worker takes its lease
/// for lapsed: a tenth of the ttl, at least 100 ms.
pub(super) fn margin(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(100))
}

pub(super) struct Lease {
    /// How long the lease lasts after a heartbeat's send time: the ttl less
    /// the margin.
    lasts: Duration,
    state: Mutex<State>,
    /// Wakes the watcher (a renewal moves the end) and those waiting for
    /// the lease to hold (claim loops, the adopter).
    changed: tokio::sync::Notify,
}

struct State {
    /// The send time of the newest heartbeat that succeeded.
    from: Option<Instant>,
    /// Lapsed: before the first heartbeat, or after `from + lasts`
    /// passed, until a heartbeat sent within `lasts` succeeds.
    lapsed: bool,
    /// Cancelled when the lease lapses; a new one once it is renewed, so a
    /// task started after the renewal runs under a live token.
    token: CancellationToken,
}

impl Lease {
    pub(super) fn new(ttl: Duration) -> Lease {
        let token = CancellationToken::new();
        token.cancel();
        Lease {
            lasts: ttl.saturating_sub(margin(ttl)),
            state: Mutex::new(State {
                from: None,
                lapsed: true,
                token,
            }),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A heartbeat sent at `sent` succeeded. True when that ended a lapse
    /// (or was the first).
    pub(super) fn renewed(&self, sent: Instant) -> bool {
        let mut st = self.state();
        if st.from.is_some_and(|f| f >= sent) {
            return false;
        }
        st.from = Some(sent);
        let ended = st.lapsed && Instant::now() < sent + self.lasts;
        if ended {
            st.lapsed = false;
            st.token = CancellationToken::new();
        }
        drop(st);
        self.changed.notify_waiters();
        ended
    }

    /// The token of the lease as it is now: cancelled when it lapses
    /// (already cancelled when it has).
    pub(super) fn token(&self) -> CancellationToken {
        self.state().token.clone()
    }

    /// Whether the lease holds.
    pub(super) fn holds(&self) -> bool {
        !self.state().lapsed
    }

    /// Resolves once the lease holds.
    pub(super) async fn held(&self) {
        loop {
            // Registered before the check: a renewal in between still wakes it.
            let renewed = self.changed.notified();
            if self.holds() {
                return;
            }
            renewed.await;
        }
    }

    /// Ends the lease when it runs out (cancelling its token) and calls
    /// `lapsed`; never returns.
    pub(super) async fn watch(&self, lapsed: impl Fn()) {
        loop {
            let changed = self.changed.notified();
            let ends = {
                let st = self.state();
                match (st.lapsed, st.from) {
                    (false, Some(from)) => Some(from + self.lasts),
                    _ => None,
                }
            };
            let Some(ends) = ends else {
                changed.await;
                continue;
            };
            tokio::select! {
                _ = tokio::time::sleep_until(ends.into()) => {}
                _ = changed => continue,
            }
            let mut st = self.state();
            // Renewed while the timer fired: it ends later.
            if st.lapsed || st.from.is_some_and(|f| Instant::now() < f + self.lasts) {
                continue;
            }
            st.lapsed = true;
            st.token.cancel();
            drop(st);
            lapsed();
            self.changed.notify_waiters();
        }
    }
}

impl Shared {
    /// One registration heartbeat (`PUT /api/v1/nodes/{id}/heartbeat`).
    /// A success renews the lease from the time it was sent; one that ends
    /// a lapse wakes the adopter (tasks whose claims were answered while
    /// the lease was lapsed were not started).
    pub(super) async fn beat(&self) -> Result<NodeHeartbeatAnswer> {
        let sent = Instant::now();
        let answer = self.client.heartbeat_node(&self.id, &registration_of(self)).await;
        if answer.is_ok() && self.lease.renewed(sent) {
            self.adopt_soon();
        }
        answer
    }
}

/// Runs the lease's watcher until the run ends.
pub(super) async fn lease_loop(s: Arc<Shared>, done: CancellationToken, killed: CancellationToken) {
    let lapsed = || {
        inc(&s.counters.lease_lapses);
        tracing::warn!(
            worker = %s.id,
            ttl = ?s.ttl,
            "no registration heartbeat succeeded within the lease (ttl less the margin): cancelling every \
             running handler and claiming nothing until one does"
        );
    };
    tokio::select! {
        _ = s.lease.watch(lapsed) => {}
        _ = done.cancelled() => {}
        _ = killed.cancelled() => {}
    }
}
