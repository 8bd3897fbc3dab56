//! The one key-leak check (G4): the keys a test Redis holds before a
//! workload, and whether it returns to them after.

use std::collections::HashSet;
use std::time::Duration;

use super::{TestRedis, wait_until};

/// Whether `k` is a key of the outcome history behind the dashboard's charts
/// (`{p}:stats:m:<minute>`, `{p}:stats:d:<day>`): every node writes them every
/// few seconds while tasks finish, and they stay until their TTL (2 h, 32
/// days), so a leak check cannot wait for them to go; it checks their bounds
/// instead ([`TestRedis::assert_history_bounded`]).
pub fn is_history(k: &str) -> bool {
    k.contains(":stats:m:") || k.contains(":stats:d:")
}

/// The keys of a Redis at one moment.
pub struct KeyBaseline(pub HashSet<String>);

impl TestRedis {
    /// Every key now (`KEYS *`: test Redis servers are small).
    pub async fn keys(&self) -> HashSet<String> {
        self.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect()
    }

    /// The keys now, to compare with after a workload.
    pub async fn key_baseline(&self) -> KeyBaseline {
        KeyBaseline(self.keys().await)
    }

    /// Keys created since `baseline` that have no TTL and are not
    /// `bounded` (an index trimmed by a janitor, a counter).
    pub async fn keys_without_ttl(&self, baseline: &KeyBaseline, bounded: impl Fn(&str) -> bool) -> Vec<String> {
        let mut out = Vec::new();
        for k in self.keys().await {
            if baseline.0.contains(&k) || bounded(&k) {
                continue;
            }
            // -2: it expired between the listing and this check.
            if self.cmd::<i64>(&["PTTL", &k]).await == -1 {
                out.push(k);
            }
        }
        out.sort();
        out
    }

    /// Waits up to `within` until every key created since `baseline` is
    /// gone, except those `kept` says may stay (counters, the event stream,
    /// node registrations); panics naming what is left.
    pub async fn assert_back_to_baseline(&self, baseline: &KeyBaseline, within: Duration, kept: impl Fn(&str) -> bool) {
        let left = |now: HashSet<String>| -> Vec<String> {
            let mut l: Vec<String> = now
                .into_iter()
                .filter(|k| !baseline.0.contains(k) && !kept(k) && !is_history(k))
                .collect();
            l.sort();
            l
        };
        let back = wait_until(within, || async { left(self.keys().await).is_empty() }).await;
        if !back {
            let l = left(self.keys().await);
            panic!(
                "keys left over after {within:?}: {} ({:?}{})",
                l.len(),
                &l[..l.len().min(10)],
                if l.len() > 10 { ", ..." } else { "" }
            );
        }
        self.assert_history_bounded().await;
    }

    /// Asserts the outcome history's bounds: at most 120 minute keys with a
    /// TTL of at most 2 h, at most 32 day keys with at most 32 days.
    pub async fn assert_history_bounded(&self) {
        let (mut minutes, mut days) = (0, 0);
        for k in self.keys().await.into_iter().filter(|k| is_history(k)) {
            let pttl: i64 = self.cmd(&["PTTL", &k]).await;
            let (max, n) = if k.contains(":stats:m:") {
                (2 * 3_600_000, &mut minutes)
            } else {
                (32 * 86_400_000, &mut days)
            };
            *n += 1;
            // -2: it expired between the listing and this check.
            assert!(
                pttl == -2 || (1..=max).contains(&pttl),
                "history key {k} has PTTL {pttl} (at most {max})"
            );
        }
        assert!(minutes <= 120 && days <= 32, "{minutes} minute keys, {days} day keys");
    }
}
