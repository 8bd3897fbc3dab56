//! Key accounting for the chaos run: every key, and which of them leak.

use super::*;

/// Keys that may stay without a TTL: one each, bounded in size (a counter, the
/// stream trimmed to `events.max_len`, indexes pruned by the nodes, the orphan
/// history trimmed by count and age).
pub(super) const SINGLETONS: &[&str] = &[
    "{muster}:events",
    "{muster}:nodes",
    "{muster}:seq",
    "{muster}:fseq",
    "{muster}:fence",
    "{muster}:epoch",
    // Cluster mode: the master that raised the shard's epoch last.
    "{muster}:epoch:master",
    "{muster}:orphans:history",
    "{muster}:orphans:counts",
    "{muster}:layout",
];

/// Bounded singletons that may appear during the run but must carry a TTL:
/// the liveness pass's bookkeeping (`nodes/lua/liveness.lua`).
pub(super) const TTL_SINGLETONS: &[&str] = &[
    "{muster}:nodes:pass",
    "{muster}:nodes:grace",
    "{muster}:nodes:stalled_at",
];

/// Every key in Redis with its PTTL in ms (-1: none), read with SCAN (on
/// the shared cluster: `KEYS`, which the harness limits to the test's
/// namespace and asks every master).
pub(super) async fn all_keys(redis: &TestRedis) -> BTreeMap<String, i64> {
    let mut c = redis.conn().await;
    let mut keys: Vec<String> = Vec::new();
    let mut cursor = 0u64;
    if redis.cluster_prefix().is_some() {
        keys = redis::cmd("KEYS").arg("*").query_async(&mut c).await.unwrap();
    }
    while redis.cluster_prefix().is_none() {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await
            .unwrap();
        keys.extend(page);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    keys.sort();
    keys.dedup();
    if keys.is_empty() {
        return BTreeMap::new();
    }
    let mut pipe = redis::pipe();
    for k in &keys {
        pipe.cmd("PTTL").arg(k);
    }
    let ttls: Vec<i64> = pipe.query_async(&mut c).await.unwrap();
    // -2: expired between the SCAN and the PTTL.
    keys.into_iter().zip(ttls).filter(|(_, t)| *t != -2).collect()
}

/// A key of a split namespace (MUSTER_TEST_SHARDS), which carries its
/// shard's tag, as the same key under `{muster}` (a singleton is then one
/// per shard, still bounded).
pub(super) fn one(k: &str) -> String {
    match k.strip_prefix("{muster#").and_then(|r| r.split_once('}')) {
        Some((_, rest)) => format!("{{muster}}{rest}"),
        None => k.to_string(),
    }
}

/// What of the key space is not accounted for after the workload: keys
/// outside `{muster}:`, keys that were not there at the baseline and are
/// neither a singleton nor a live node's registry entry, and keys without a
/// TTL that are not in [`SINGLETONS`]. Empty when the key space is clean.
pub(super) fn key_leaks(baseline: &BTreeMap<String, i64>, now: &BTreeMap<String, i64>, live: &[String]) -> Vec<String> {
    let live_keys: Vec<String> = live.iter().map(|id| format!("{{muster}}:node:{id}")).collect();
    let baseline: BTreeMap<String, i64> = baseline.iter().map(|(k, t)| (one(k), *t)).collect();
    let mut leaks = Vec::new();
    for (k, ttl) in now {
        let k = &one(k);
        let singleton = SINGLETONS.contains(&k.as_str());
        if crate::common::keys::is_history(k) && (1..=32 * 86_400_000).contains(ttl) {
            // The charts' history: bounded by its TTL, checked elsewhere.
        } else if !k.starts_with("{muster}:") {
            leaks.push(format!("{k} (outside the prefix, pttl {ttl})"));
        } else if !baseline.contains_key(k)
            && !singleton
            && !TTL_SINGLETONS.contains(&k.as_str())
            && !live_keys.contains(k)
        {
            leaks.push(format!("{k} (new since the baseline, pttl {ttl})"));
        } else if *ttl < 0 && !singleton {
            leaks.push(format!("{k} (no TTL and not a bounded singleton)"));
        }
    }
    leaks
}
