//! Which tokens a worker started and which it still holds: a token is
//! never started twice, and one the worker could not report is never
//! adopted.

use super::{Future, Shared};

/// The tokens a worker started, the newest [`Seen::MAX`] of them (a token
/// older than that finished long ago).
#[derive(Default)]
pub(super) struct Seen {
    set: std::collections::HashSet<u64>,
    order: std::collections::VecDeque<u64>,
}

impl Seen {
    const MAX: usize = 1 << 16;

    /// Records `token`; false when it was already seen.
    fn first(&mut self, token: u64) -> bool {
        if !self.set.insert(token) {
            return false;
        }
        self.order.push_back(token);
        if self.order.len() > Self::MAX
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        true
    }
}

impl Shared {
    /// Forgets that `token` started (it never did: see `run_task`), so the
    /// adopter may start it.
    pub(super) fn forget(&self, token: u64) {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).set.remove(&token);
    }

    /// Records that `token` starts now; false when it already did.
    pub(super) fn first_start(&self, token: u64) -> bool {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).first(token)
    }

    /// Marks `token` as running here.
    pub(super) fn hold(&self, token: u64) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).insert(token);
    }

    /// Whether `token` runs here (or could not be reported).
    pub(super) fn holds(&self, token: u64) -> bool {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).contains(&token)
    }

    /// The task under `token` no longer runs under it on the server.
    pub(super) fn release(&self, token: u64) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).remove(&token);
    }

    /// Runs one call; when a try of it (or of a call beside it) ended in an
    /// error that may have hidden its outcome, retried or not, that try may
    /// have claimed tasks whose answer never arrived: the adopter looks.
    pub(super) async fn watching<T>(&self, call: impl Future<Output = T>) -> T {
        let unknown = self.client.unknown_outcomes();
        let answer = call.await;
        if self.client.unknown_outcomes() != unknown {
            self.adopt_soon();
        }
        answer
    }

    /// Asks the adopter to look for tasks whose claim's answer was lost.
    pub(super) fn adopt_soon(&self) {
        self.adopt_wanted.notify_one();
    }
}
