//! This node's own view of whether it can serve: registered in the cluster
//! (its last heartbeat succeeded recently) and able to reach Redis.
//!
//! These are local decisions about *this* node, so they use the local
//! monotonic clock; every decision about *other* nodes is made in Redis.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub struct Health {
    ttl: Duration,
    last_ok: Mutex<Option<Instant>>,
    /// The latest heartbeat to finish failed (timeout, Redis unreachable,
    /// refused): distinguishes a node cut off from Redis from one whose
    /// heartbeats are merely slow (a busy machine), which may still work.
    failing: AtomicBool,
    draining: AtomicBool,
    stopping: AtomicBool,
}

impl Health {
    pub fn new(ttl: Duration) -> Self {
        Health {
            ttl,
            last_ok: Mutex::new(None),
            failing: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        }
    }

    /// Records a successful heartbeat sent at `started` (before the call:
    /// its lease in Redis runs from a later instant, so every judgement made
    /// from this errs on the side of "not registered"). Heartbeats run
    /// concurrently, so an older one finishing late never moves it back.
    pub fn heartbeat_ok(&self, started: Instant, draining: bool) {
        let mut last = self.last_ok.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t <= started) {
            *last = Some(started);
            self.draining.store(draining, Ordering::Relaxed);
        }
        self.failing.store(false, Ordering::Relaxed);
    }

    /// Records a failed heartbeat.
    pub fn heartbeat_failed(&self) {
        self.failing.store(true, Ordering::Relaxed);
    }

    /// Time since the last successful heartbeat.
    pub fn since_heartbeat(&self) -> Option<Duration> {
        self.last_ok
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.elapsed())
    }

    /// Registered: the last successful heartbeat was sent less than a ttl ago.
    pub fn registered(&self) -> bool {
        self.since_heartbeat().is_some_and(|d| d < self.ttl)
    }

    /// Why this node hands out no work now, if it doesn't: its heartbeats
    /// fail and none sent in the last ttl succeeded, so its own lease in the
    /// cluster may have run out (it cannot reach Redis, or Redis refuses it;
    /// G3); it never registered; it is draining; or it is shutting down.
    /// Workers then claim through another node. Heartbeats that are slow but
    /// succeed (a busy machine) do not stop the node.
    pub fn refuses_work(&self) -> Option<String> {
        if self.stopping.load(Ordering::Relaxed) {
            return Some("this node is shutting down".into());
        }
        match self.since_heartbeat() {
            None => return Some("this node has not registered with the cluster yet".into()),
            Some(d) if d >= self.ttl && self.failing.load(Ordering::Relaxed) => {
                return Some(format!(
                    "this node's heartbeats fail: the last one that succeeded was sent {} ms ago, longer than \
                     its lease of {} ms",
                    d.as_millis(),
                    self.ttl.as_millis()
                ));
            }
            Some(_) => {}
        }
        if self.draining.load(Ordering::Relaxed) {
            return Some("this node is draining".into());
        }
        None
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }
}
