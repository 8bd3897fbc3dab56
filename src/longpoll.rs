//! Long polls woken by cluster events.
//!
//! One router task per node subscribes to the event bus and wakes only the
//! requests that wait on the thing an event is about (a barrier round, a
//! hold, a DoubleBarrier, a lock, an election), through one [`Notify`] per
//! key, as the task store does for queues. Waiters never receive the event
//! stream themselves, so a busy task system does not wake every waiting
//! lock holder thousands of times a second.
//!
//! A waiter enables its notification *before* it reads or changes the state
//! it waits on, so an event emitted in between is not missed (the event is
//! written by the same script as the state change); it re-reads the state
//! after every wake-up: events only say "look again". When the router lags
//! (the bus dropped events for it) it wakes everyone. [`RECHECK`] bounds the
//! wait after a lost event (for example while the node's tailer reconnects).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::events::{Bus, Event};

/// The longest a waiter sleeps without re-reading the state.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// Why [`sleep`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The thing waited on changed (or events were lost): re-read the state.
    Event,
    /// `until` passed.
    Timer,
    /// The node is shutting down: answer with what is known.
    Shutdown,
}

/// What a waiter waits on; the router maps events to these.
pub(crate) fn round_key(barrier: &str, round: &str) -> String {
    format!("round:{barrier}/{round}")
}
pub(crate) fn hold_key(barrier: &str) -> String {
    format!("hold:{barrier}")
}
pub(crate) fn dbarrier_key(name: &str) -> String {
    format!("dbarrier:{name}")
}
pub(crate) fn lock_key(name: &str) -> String {
    format!("lock:{name}")
}
pub(crate) fn election_key(name: &str) -> String {
    format!("election:{name}")
}

/// What a service needs to long-poll: the node's waiter registry and its
/// shutdown token (a waiting request answers at once when the node stops).
#[derive(Clone, Default)]
pub struct Park {
    pub waiters: Arc<Waiters>,
    pub shutdown: CancellationToken,
}

/// The notifiers of everything some request on this node waits on.
#[derive(Default)]
pub struct Waiters {
    map: Mutex<HashMap<String, Arc<Notify>>>,
}

/// One request's registration; dropping it forgets the key when nobody
/// else waits on it, so made-up names cannot grow the map.
pub struct Ticket {
    waiters: Arc<Waiters>,
    key: String,
    notify: Arc<Notify>,
}

impl Waiters {
    /// Registers a waiter on `key`.
    pub fn ticket(self: &Arc<Self>, key: String) -> Ticket {
        let notify = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(key.clone()).or_default().clone()
        };
        Ticket {
            waiters: self.clone(),
            key,
            notify,
        }
    }

    fn wake(&self, key: &str) {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get(key) {
            n.notify_waiters();
        }
    }

    fn wake_prefix(&self, prefix: &str) {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        for (k, n) in map.iter() {
            if k.starts_with(prefix) {
                n.notify_waiters();
            }
        }
    }

    /// Wakes every waiter (events were lost).
    pub fn wake_all(&self) {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        for n in map.values() {
            n.notify_waiters();
        }
    }

    /// Wakes the waiters an event concerns.
    pub fn on_event(&self, ev: &Event) {
        let subject = |s| ev.subject(s).unwrap_or("");
        match ev.kind.as_str() {
            "barrier.released" | "barrier.aborted" => self.wake(&round_key(subject("barrier"), subject("round"))),
            "barrier.lifted" => self.wake(&hold_key(subject("barrier"))),
            "barrier.deleted" => {
                self.wake_prefix(&round_key(subject("barrier"), ""));
                self.wake(&hold_key(subject("barrier")));
            }
            "lock.released" | "lock.expired" | "lock.waiter_left" => self.wake(&lock_key(subject("lock"))),
            // A lease may be tied to the node that died.
            "node.dead" => self.wake_prefix("lock:"),
            "election.resigned" | "election.expired" => self.wake(&election_key(subject("election"))),
            k if k.starts_with("dbarrier.") => self.wake(&dbarrier_key(subject("dbarrier"))),
            _ => {}
        }
    }
}

impl Ticket {
    /// Completes at the next wake-up of this key. Create and enable it
    /// (`tokio::pin!`, then `.as_mut().enable()`) before reading the state.
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut map = self.waiters.map.lock().unwrap_or_else(|p| p.into_inner());
        // The map's reference and ours: nobody else waits on this key.
        if map.get(&self.key).is_some_and(|n| Arc::strong_count(n) <= 2) {
            map.remove(&self.key);
        }
    }
}

/// Sleeps until `notified` completes, `until`, or `shutdown`.
pub(crate) async fn sleep(notified: impl Future<Output = ()>, until: Instant, shutdown: &CancellationToken) -> Wake {
    tokio::select! {
        _ = notified => Wake::Event,
        _ = tokio::time::sleep_until(until.into()) => Wake::Timer,
        _ = shutdown.cancelled() => Wake::Shutdown,
    }
}

/// The instant `ms` milliseconds from now (negative: now).
pub(crate) fn after_ms(ms: i64) -> Instant {
    Instant::now() + Duration::from_millis(ms.max(0) as u64)
}

/// The router: every event on `bus` wakes the waiters it concerns. It
/// subscribes before returning, so nothing published after this call is
/// missed.
pub(crate) fn spawn(bus: Arc<Bus>, waiters: Arc<Waiters>, cancel: CancellationToken) -> JoinHandle<()> {
    let mut rx = bus.subscribe();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                r = rx.recv() => match r {
                    Ok(ev) => waiters.on_event(&ev),
                    Err(RecvError::Lagged(_)) => waiters.wake_all(),
                    Err(RecvError::Closed) => return,
                },
                _ = cancel.cancelled() => return,
            }
        }
    })
}
