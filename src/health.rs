//! This node's own view of whether it can serve: registered in the cluster
//! (its last heartbeat succeeded recently) and able to reach Redis.
//!
//! A namespace split into shards (`redis.shards`) has a registry in every
//! shard, and the node heartbeats each on its own: its registration in one
//! shard can lapse while the others' hold (that shard's master is stalled
//! or failing over). So every judgement here is per shard: a shard where
//! the node's registration may have lapsed makes it refuse work *in that
//! shard only*, and the node is ready while any shard serves.
//!
//! These are local decisions about *this* node, so they use the local
//! monotonic clock; every decision about *other* nodes is made in Redis.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub struct Health {
    ttl: Duration,
    shards: Vec<ShardHealth>,
    draining: AtomicBool,
    stopping: AtomicBool,
}

/// This node's registration in one shard.
#[derive(Default)]
struct ShardHealth {
    /// When the last heartbeat that succeeded here was sent.
    last_ok: Mutex<Option<Instant>>,
    /// The latest heartbeat to finish here failed (timeout, Redis
    /// unreachable, refused): distinguishes a shard cut off from one whose
    /// heartbeats are merely slow (a busy machine), which may still work.
    failing: AtomicBool,
}

impl ShardHealth {
    fn since_heartbeat(&self) -> Option<Duration> {
        self.last_ok
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.elapsed())
    }
}

/// Why this node hands out no work in a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The whole node refuses (stopping, draining, never registered).
    Node(String),
    /// Only this shard: the node's registration there may have lapsed.
    Shard(String),
}

impl Refusal {
    pub fn into_message(self) -> String {
        match self {
            Refusal::Node(m) | Refusal::Shard(m) => m,
        }
    }
}

impl Health {
    /// Health for a namespace of `shards` shards (1 when not split).
    pub fn new(ttl: Duration, shards: usize) -> Self {
        Health {
            ttl,
            shards: (0..shards.max(1)).map(|_| ShardHealth::default()).collect(),
            draining: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        }
    }

    fn shard(&self, i: usize) -> &ShardHealth {
        &self.shards[i % self.shards.len()]
    }

    /// Records a successful heartbeat in `shard`, sent at `started` (before
    /// the call: its lease in Redis runs from a later instant, so every
    /// judgement made from this errs on the side of "not registered").
    /// Heartbeats run concurrently, so an older one finishing late never
    /// moves it back.
    pub fn heartbeat_ok(&self, shard: usize, started: Instant, draining: bool) {
        let sh = self.shard(shard);
        let mut last = sh.last_ok.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t <= started) {
            *last = Some(started);
            self.draining.store(draining, Ordering::Relaxed);
        }
        sh.failing.store(false, Ordering::Relaxed);
    }

    /// Records a failed heartbeat in `shard`.
    pub fn heartbeat_failed(&self, shard: usize) {
        self.shard(shard).failing.store(true, Ordering::Relaxed);
    }

    /// Time since the last successful heartbeat in any shard.
    pub fn since_heartbeat(&self) -> Option<Duration> {
        self.shards.iter().filter_map(ShardHealth::since_heartbeat).min()
    }

    /// Registered: the last successful heartbeat in some shard was sent less
    /// than a ttl ago (the node serves that shard at least).
    pub fn registered(&self) -> bool {
        self.since_heartbeat().is_some_and(|d| d < self.ttl)
    }

    /// Why this node hands out no work in `shard` now, if it doesn't: its
    /// heartbeats there fail and none sent there in the last ttl succeeded,
    /// so its own lease in that shard may have run out (it cannot reach that
    /// shard's master, or the master refuses it; G3); it never registered
    /// there; it is draining; or it is shutting down. Workers then claim
    /// through another node, or from other shards. Heartbeats that are slow
    /// but succeed (a busy machine) do not stop the node.
    pub fn refuses_work_in(&self, shard: usize) -> Option<Refusal> {
        if let Some(why) = self.refuses_all_work() {
            return Some(Refusal::Node(why));
        }
        let sh = self.shard(shard);
        match sh.since_heartbeat() {
            None => Some(Refusal::Shard(format!(
                "this node has not registered in shard {shard} yet (its master has not answered a heartbeat)"
            ))),
            Some(d) if d >= self.ttl && sh.failing.load(Ordering::Relaxed) => Some(Refusal::Shard(format!(
                "this node's heartbeats fail in shard {shard}: the last one that succeeded there was sent {} ms \
                 ago, longer than its lease of {} ms",
                d.as_millis(),
                self.ttl.as_millis()
            ))),
            Some(_) => None,
        }
    }

    /// Why this node hands out no work in any shard, if so: it is shutting
    /// down, draining, never registered anywhere, or every shard refuses.
    pub fn refuses_work(&self) -> Option<String> {
        if let Some(why) = self.refuses_all_work() {
            return Some(why);
        }
        let mut first = None;
        for i in 0..self.shards.len() {
            match self.refuses_work_in(i) {
                None => return None,
                Some(r) => {
                    first.get_or_insert(r);
                }
            }
        }
        first.map(Refusal::into_message)
    }

    /// The node-wide reasons: stopping, never registered, draining.
    fn refuses_all_work(&self) -> Option<String> {
        if self.stopping.load(Ordering::Relaxed) {
            return Some("this node is shutting down".into());
        }
        if self.since_heartbeat().is_none() {
            return Some("this node has not registered with the cluster yet".into());
        }
        if self.draining.load(Ordering::Relaxed) {
            return Some("this node is draining".into());
        }
        None
    }

    /// Whether the latest heartbeat to finish in `shard` failed (its master
    /// is unreachable or stalled now, though the registration there may
    /// still hold).
    pub fn failing(&self, shard: usize) -> bool {
        self.shard(shard).failing.load(Ordering::Relaxed)
    }

    /// The shards where this node refuses work for the shard's own reason
    /// (its registration there may have lapsed), in shard order.
    pub fn failing_shards(&self) -> Vec<usize> {
        (0..self.shards.len())
            .filter(|&i| matches!(self.refuses_work_in(i), Some(Refusal::Shard(_))))
            .collect()
    }

    /// How many shards refuse work now (the `muster_shards_failing` gauge).
    pub fn failing_count(&self) -> usize {
        (0..self.shards.len())
            .filter(|&i| matches!(self.refuses_work_in(i), Some(Refusal::Shard(_))))
            .count()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_that_lapses_refuses_work_there_only() {
        let h = Health::new(Duration::from_millis(50), 3);
        assert!(h.refuses_work().is_some(), "not registered yet");
        let t = Instant::now();
        for s in 0..3 {
            h.heartbeat_ok(s, t, false);
        }
        assert_eq!(h.refuses_work(), None);
        std::thread::sleep(Duration::from_millis(60));
        // Shard 1's heartbeats fail for longer than the ttl; the others
        // succeed again.
        h.heartbeat_failed(1);
        h.heartbeat_ok(0, Instant::now(), false);
        h.heartbeat_ok(2, Instant::now(), false);
        assert!(matches!(h.refuses_work_in(1), Some(Refusal::Shard(_))));
        assert_eq!(h.refuses_work_in(0), None);
        assert_eq!(h.refuses_work_in(2), None);
        assert_eq!(h.refuses_work(), None);
        assert_eq!(h.failing_shards(), vec![1]);
        assert_eq!(h.failing_count(), 1);
        assert!(h.registered());
        // Every shard lapsed: the node refuses everywhere.
        std::thread::sleep(Duration::from_millis(60));
        for s in 0..3 {
            h.heartbeat_failed(s);
        }
        assert!(h.refuses_work().is_some());
        assert!(!h.registered());
        // Draining is node-wide.
        let d = Health::new(Duration::from_secs(10), 2);
        d.heartbeat_ok(0, Instant::now(), true);
        assert!(matches!(d.refuses_work_in(0), Some(Refusal::Node(_))));
    }
}
