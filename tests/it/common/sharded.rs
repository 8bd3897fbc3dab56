//! Split namespaces (`MUSTER_TEST_SHARDS=N`, issue 14): where a test finds
//! a key of a namespace split into shards.
//!
//! With one shard every key is `{muster}:...`, as the tests write them.
//! Split, a key carries its shard's tag (`{muster#<i>.<k>}`, see
//! `store/shards.rs`): a task's is its id's shard, a queue's keys may be in
//! several shards, locks, barriers and elections are in the shards of their
//! names, the dashboard's sessions and the stats history in shard 0, and the
//! layout record stays under `{muster}`.

use muster::testing::ShardMap;

use super::test_shards;

/// The shard map of namespace `prefix` as the test's nodes split it.
pub fn shard_map(prefix: &str) -> ShardMap {
    ShardMap::new(prefix, test_shards())
}

/// Shard `i`'s tag of namespace `prefix` (`{muster}` with one shard).
pub fn shard_tag(prefix: &str, i: usize) -> String {
    shard_map(prefix).tag(i).to_string()
}

/// Every shard's tag of namespace `prefix`, in shard order.
pub fn shard_tags(prefix: &str) -> Vec<String> {
    let m = shard_map(prefix);
    (0..m.len()).map(|i| m.tag(i).to_string()).collect()
}

/// The tag of the shard that holds task `id` (its id names it).
pub fn task_tag(prefix: &str, id: &str) -> String {
    let m = shard_map(prefix);
    m.tag(m.home(id)).to_string()
}

/// The tag of the shard a name (queue, group, schedule id) belongs to.
pub fn name_tag(prefix: &str, name: &str) -> String {
    let m = shard_map(prefix);
    m.tag(m.home(name)).to_string()
}

/// Whether the nodes split their namespace (`MUSTER_TEST_SHARDS` > 1).
pub fn sharded() -> bool {
    test_shards() > 1
}

/// True, after printing why, when the namespace is split and the test's
/// subject is by design not available then (the caller returns).
pub fn skip_when_sharded(reason: &str) -> bool {
    if sharded() {
        eprintln!("skipped with MUSTER_TEST_SHARDS={}: {reason}", test_shards());
        return true;
    }
    false
}

/// A name in shard `shard` of namespace `prefix`: `stem` itself when it is
/// there (always with one shard), else the first `<stem><n>` that is.
pub fn name_in_shard(prefix: &str, stem: &str, shard: usize) -> String {
    let m = shard_map(prefix);
    if m.home(stem) == shard {
        return stem.to_string();
    }
    (0..)
        .map(|n| format!("{stem}{n}"))
        .find(|q| m.home(q) == shard)
        .expect("some name falls in every shard")
}

/// A name in the same shard as `like` (see [`name_in_shard`]): for a
/// property that holds by design only within a shard when split.
pub fn name_like(prefix: &str, stem: &str, like: &str) -> String {
    name_in_shard(prefix, stem, shard_map(prefix).home(like))
}

/// One name per shard, in shard order (`[stem]` with one shard).
pub fn names_per_shard(prefix: &str, stem: &str) -> Vec<String> {
    (0..shard_map(prefix).len())
        .map(|i| name_in_shard(prefix, stem, i))
        .collect()
}

/// Every shard's name of key `suffix` (`{tag}:<suffix>`), in shard order.
pub fn shard_keys(prefix: &str, suffix: &str) -> Vec<String> {
    shard_tags(prefix).iter().map(|t| format!("{t}:{suffix}")).collect()
}
