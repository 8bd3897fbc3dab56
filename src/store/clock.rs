//! The node's estimate of Redis time, used only to give every script a
//! deadline in Redis time (G12): the node never decides a lease or liveness
//! with it (G11), it only tells Redis when the node will have given up.
//!
//! Each sample is a `TIME` reply read against the local *monotonic* clock at
//! the moment the reply arrived. Redis read its clock before that moment, so
//! `redis_ms - received` is a lower bound of the true offset; the estimate
//! is the largest lower bound among the last [`SAMPLES`] samples (the one
//! with the shortest round trip wins). A deadline computed from it is never
//! later than the Redis time at which the node gives up, so a script that
//! finds Redis time past its deadline knows the caller has stopped waiting.
//!
//! The monotonic clock does not jump when the node's wall clock is set; if
//! Redis's own clock is stepped back, deadlines run late by that step until
//! the older samples leave the window (about [`SAMPLES`] heartbeats).

use std::sync::Mutex;
use std::time::Instant;

/// How many samples the estimate looks at.
pub const SAMPLES: usize = 32;

pub struct RedisClock {
    base: Instant,
    samples: Mutex<Ring>,
}

#[derive(Default)]
struct Ring {
    offsets: Vec<i64>,
    next: usize,
}

impl Default for RedisClock {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisClock {
    pub fn new() -> Self {
        RedisClock {
            base: Instant::now(),
            samples: Mutex::new(Ring::default()),
        }
    }

    fn mono_ms(&self, at: Instant) -> i64 {
        at.saturating_duration_since(self.base).as_millis() as i64
    }

    /// Records a `TIME` reply (Redis ms) that arrived at `received`.
    pub fn observe(&self, redis_ms: i64, received: Instant) {
        let offset = redis_ms - self.mono_ms(received);
        let mut ring = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if ring.offsets.len() < SAMPLES {
            ring.offsets.push(offset);
        } else {
            let i = ring.next;
            ring.offsets[i] = offset;
        }
        ring.next = (ring.next + 1) % SAMPLES;
    }

    /// Forgets every sample: a different server (a new master) has its own clock.
    pub fn reset(&self) {
        *self.samples.lock().unwrap_or_else(|p| p.into_inner()) = Ring::default();
    }

    /// A lower bound of Redis time now, in ms; None before the first sample.
    pub fn now_ms(&self) -> Option<i64> {
        let ring = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let offset = ring.offsets.iter().copied().max()?;
        Some(self.mono_ms(Instant::now()) + offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn takes_the_largest_lower_bound_and_forgets_old_samples() {
        let c = RedisClock::new();
        assert_eq!(c.now_ms(), None);
        let t = Instant::now();
        // A slow reply (Redis read its clock long before it arrived) gives a
        // low bound; a fast one a better bound, which wins.
        c.observe(1_000_000, t);
        c.observe(1_000_500, t);
        let now = c.now_ms().unwrap();
        assert!((1_000_500..1_000_600).contains(&now), "{now}");
        // The good sample leaves the window after SAMPLES newer ones.
        for _ in 0..SAMPLES {
            c.observe(1_000_000, t);
        }
        let now = c.now_ms().unwrap();
        assert!((1_000_000..1_000_100).contains(&now), "{now}");
        c.reset();
        assert_eq!(c.now_ms(), None);
    }

    #[test]
    fn advances_with_the_monotonic_clock() {
        let c = RedisClock::new();
        c.observe(5_000, Instant::now());
        let a = c.now_ms().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let b = c.now_ms().unwrap();
        assert!(b - a >= 20, "{a} {b}");
    }
}
