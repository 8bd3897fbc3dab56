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
    heartbeat: Duration,
    last_ok: Mutex<Option<Instant>>,
    draining: AtomicBool,
    stopping: AtomicBool,
}

impl Health {
    pub fn new(ttl: Duration, heartbeat: Duration) -> Self {
        Health {
            ttl,
            heartbeat,
            last_ok: Mutex::new(None),
            draining: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        }
    }

    /// Records a successful heartbeat.
    pub fn heartbeat_ok(&self, draining: bool) {
        *self.last_ok.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        self.draining.store(draining, Ordering::Relaxed);
    }

    /// Time since the last successful heartbeat.
    pub fn since_heartbeat(&self) -> Option<Duration> {
        self.last_ok
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.elapsed())
    }

    /// Registered: the last heartbeat succeeded less than a ttl ago (local
    /// clock, started before the call, so this errs on the side of "not").
    pub fn registered(&self) -> bool {
        self.since_heartbeat().is_some_and(|d| d < self.ttl)
    }

    /// Whether this node may hand out work for itself: its registration is
    /// fresh with a margin of one heartbeat, it is not draining and not
    /// shutting down. A node cut off from Redis stops claiming before the
    /// cluster can consider it dead.
    pub fn can_work(&self) -> bool {
        let margin = self.ttl.saturating_sub(self.heartbeat);
        self.since_heartbeat().is_some_and(|d| d < margin)
            && !self.draining.load(Ordering::Relaxed)
            && !self.stopping.load(Ordering::Relaxed)
    }

    /// Whether this node's registration is fresh with a margin of one
    /// heartbeat: a node cut off from Redis stops handing out work before
    /// the cluster can consider it dead.
    pub fn fresh(&self) -> bool {
        let margin = self.ttl.saturating_sub(self.heartbeat);
        self.since_heartbeat().is_some_and(|d| d < margin)
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
