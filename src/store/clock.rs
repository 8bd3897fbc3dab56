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
//! A sample whose send time is known also bounds the offset from above
//! (Redis read its clock after the call was sent). When that upper bound is
//! below the current estimate, Redis time went back: the calls now reach
//! another server (a Cluster failover promoted a replica with a clock of
//! its own) or Redis's clock was stepped back. The estimate is then
//! forgotten and starts again from that sample, so deadlines never run late
//! by the difference (G12). A clock that went forward needs nothing: the
//! larger lower bound wins at once.
//!
//! Each Cluster master has a clock of its own, so the store keeps one
//! estimate per route (`Lane`); all of them count from one monotonic base,
//! so their offsets compare, and their spread is the skew between masters.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// How many samples the estimate looks at.
pub(crate) const SAMPLES: usize = 32;

/// How far (ms) an upper bound may fall below the estimate before Redis time
/// counts as gone back: both are read at millisecond precision.
const SLACK_MS: i64 = 3;

/// The one monotonic base every estimate counts from.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

pub(crate) struct RedisClock {
    base: Instant,
    samples: Mutex<Ring>,
}

#[derive(Default)]
struct Ring {
    offsets: Vec<i64>,
    next: usize,
}

impl Ring {
    fn push(&mut self, offset: i64) {
        if self.offsets.len() < SAMPLES {
            self.offsets.push(offset);
        } else {
            let i = self.next;
            self.offsets[i] = offset;
        }
        self.next = (self.next + 1) % SAMPLES;
    }
}

impl Default for RedisClock {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisClock {
    pub(crate) fn new() -> Self {
        RedisClock {
            base: base(),
            samples: Mutex::new(Ring::default()),
        }
    }

    fn mono_ms(&self, at: Instant) -> i64 {
        at.saturating_duration_since(self.base).as_millis() as i64
    }

    /// Records a `TIME` reply (Redis ms) that arrived at `received`.
    #[cfg(test)]
    pub(crate) fn observe(&self, redis_ms: i64, received: Instant) {
        let offset = redis_ms - self.mono_ms(received);
        let mut ring = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        ring.push(offset);
    }

    /// Records a Redis time (ms) read by a call sent at `sent` whose reply
    /// arrived at `received`. Returns true when it showed that Redis time
    /// went back (another server, or a clock stepped back): the estimate
    /// then starts again from this sample.
    pub(crate) fn observe_call(&self, redis_ms: i64, sent: Instant, received: Instant) -> bool {
        let lower = redis_ms - self.mono_ms(received);
        // +1: `sent` is floored to the ms like `received`, and Redis read its
        // clock at or after it.
        let upper = redis_ms - self.mono_ms(sent) + 1;
        let mut ring = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let back = ring.offsets.iter().max().is_some_and(|&m| upper + SLACK_MS < m);
        if back {
            *ring = Ring::default();
        }
        ring.push(lower);
        back
    }

    /// The estimated offset of Redis time from the shared monotonic base
    /// (ms), None before the first sample: the spread of the offsets of two
    /// clocks is the skew between their servers.
    pub(crate) fn offset(&self) -> Option<i64> {
        let ring = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        ring.offsets.iter().copied().max()
    }

    /// Forgets every sample: a different server (a new master) has its own clock.
    pub(crate) fn reset(&self) {
        *self.samples.lock().unwrap_or_else(|p| p.into_inner()) = Ring::default();
    }

    /// A lower bound of Redis time now, in ms; None before the first sample.
    pub(crate) fn now_ms(&self) -> Option<i64> {
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
    fn forgets_the_estimate_when_redis_time_goes_back() {
        let c = RedisClock::new();
        let t = Instant::now();
        c.observe_call(2_000_000, t, t);
        // Ahead: nothing to forget, the larger bound wins.
        assert!(!c.observe_call(2_000_010, t, t));
        assert!((2_000_010..2_000_100).contains(&c.now_ms().unwrap()));
        // A slow reply from the same server: its upper bound still covers
        // the estimate, so it is only a poor sample.
        let later = t + Duration::from_millis(500);
        assert!(!c.observe_call(2_000_300, t, later));
        assert!((2_000_010..2_000_100).contains(&c.now_ms().unwrap()));
        // Another server whose clock is 1 s behind: even the upper bound is
        // below the estimate, which starts again from it.
        assert!(c.observe_call(1_999_010, t, t));
        assert!(
            (1_999_010..1_999_100).contains(&c.now_ms().unwrap()),
            "{:?}",
            c.now_ms()
        );
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
