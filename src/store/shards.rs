//! The shard map: which hash tag a name's keys carry (`docs/sharding.md`).
//!
//! A namespace of one shard (this version) keeps every key under `{prefix}`,
//! as it always has. Split into N shards, shard `i`'s keys carry the tag
//! `{prefix#i.k}`: `#` cannot occur in a `key_prefix` (`:` can, so
//! `{prefix:i}` could be the whole of another namespace), and `k` is the
//! smallest number that puts the tag's slot in the middle half of the
//! `i`-th N-th of the slot space. `redis-cli --cluster create` gives each
//! master one contiguous run of slots, so N shards over M masters, N a
//! multiple of M, put N/M shards on each master; twelve arbitrary tags
//! could put five on one and three on another.
//!
//! A name (a queue, a group, a workflow, a schedule) belongs to shard
//! `fnv1a32(name) mod N`, and a task id is a ULID drawn until its own hash
//! names its home shard, so an id alone says where its task lives.

/// Redis Cluster's hash slots.
pub(crate) const SLOTS: u16 = 16384;

/// The slot of a key, as `CLUSTER KEYSLOT` computes it (CRC16-XMODEM of the
/// hash tag, or of the whole key without one).
pub fn key_slot(key: &str) -> u16 {
    let b = key.as_bytes();
    let tagged = b
        .iter()
        .position(|&c| c == b'{')
        .and_then(|open| {
            let rest = &b[open + 1..];
            rest.iter().position(|&c| c == b'}').map(|close| &rest[..close])
        })
        .filter(|t| !t.is_empty());
    crc16(tagged.unwrap_or(b)) % SLOTS
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// 32-bit FNV-1a: the placement hash (stable across versions and
/// platforms, and a dozen lines in any client language).
pub(crate) fn fnv1a32(s: &str) -> u32 {
    s.bytes()
        .fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// How a namespace is split: its tags and the rule that places names.
#[derive(Debug, Clone)]
pub struct ShardMap {
    tags: Vec<String>,
}

impl ShardMap {
    /// The map of namespace `prefix` split into `shards` (at least 1).
    pub fn new(prefix: &str, shards: u32) -> ShardMap {
        let n = shards.max(1);
        if n == 1 {
            return ShardMap {
                tags: vec![format!("{{{prefix}}}")],
            };
        }
        let width = f64::from(SLOTS) / f64::from(n);
        let tags = (0..n)
            .map(|i| {
                let lo = (f64::from(i) * width + width / 4.0) as u16;
                let hi = (f64::from(i) * width + 3.0 * width / 4.0) as u16;
                let tag = |k: u32| format!("{{{prefix}#{i}.{k}}}");
                // A hit is one try in 2N on average; the bound is never
                // reached, and stays deterministic if it were.
                (0..1_000_000)
                    .map(tag)
                    .find(|t| (lo..hi).contains(&key_slot(t)))
                    .unwrap_or_else(|| tag(0))
            })
            .collect();
        ShardMap { tags }
    }

    /// How many shards.
    pub fn len(&self) -> usize {
        self.tags.len()
    }

    /// Always false: a namespace has at least one shard.
    pub fn is_empty(&self) -> bool {
        self.tags.is_empty()
    }

    /// Shard `i`'s hash-tagged prefix (`{muster}` for one shard).
    pub fn tag(&self, i: usize) -> &str {
        &self.tags[i % self.tags.len()]
    }

    /// The placement rule's name, recorded in the namespace's layout.
    pub fn placement(&self) -> &'static str {
        if self.tags.len() == 1 {
            "single"
        } else {
            "fnv1a32-spread"
        }
    }

    /// The shard a name belongs to.
    pub fn home(&self, name: &str) -> usize {
        (fnv1a32(name) as usize) % self.tags.len()
    }

    /// A new task id (a ULID) whose own [`ShardMap::home`] is `shard`; a
    /// plain ULID for one shard.
    pub fn new_id(&self, shard: usize) -> String {
        loop {
            let id = ulid::Ulid::generate().to_string();
            if self.tags.len() == 1 || self.home(&id) == shard % self.tags.len() {
                return id;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_cluster_keyslot() {
        // CLUSTER KEYSLOT answers, from redis-server 7.
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("somekey"), 11058);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("{}x"), key_slot("{}x"), "an empty tag hashes the whole key");
        assert_eq!(key_slot("{muster}:events"), key_slot("muster"));
    }

    #[test]
    fn fnv1a32_is_the_published_function() {
        assert_eq!(fnv1a32(""), 0x811c_9dc5);
        assert_eq!(fnv1a32("a"), 0xe40c_292c);
        assert_eq!(fnv1a32("foobar"), 0xbf9c_f968);
    }

    #[test]
    fn one_shard_is_the_namespace_as_it_always_was() {
        let m = ShardMap::new("muster", 1);
        assert_eq!((m.len(), m.tag(0), m.placement()), (1, "{muster}", "single"));
        assert_eq!(m.home("any queue"), 0);
        assert_eq!(m.new_id(0).len(), 26, "a plain ULID");
        assert_eq!(ShardMap::new("muster", 0).len(), 1);
    }

    #[test]
    fn shards_spread_evenly_over_the_slot_space_and_never_collide() {
        for n in [2, 3, 6, 12, 24, 64] {
            let m = ShardMap::new("muster", n);
            assert_eq!(m.len(), n as usize);
            let width = f64::from(SLOTS) / f64::from(n);
            for i in 0..n as usize {
                let tag = m.tag(i);
                assert!(tag.starts_with("{muster#") && tag.ends_with('}'), "{tag}");
                let slot = f64::from(key_slot(tag));
                assert!(
                    slot >= i as f64 * width && slot < (i + 1) as f64 * width,
                    "shard {i} of {n}: {tag} in slot {slot}"
                );
            }
            // The same map on every node.
            assert_eq!(m.tags, ShardMap::new("muster", n).tags);
        }
        // Three masters of `redis-cli --cluster create` (0-5460, 5461-10922,
        // 10923-16383) get four of twelve shards each.
        let m = ShardMap::new("muster", 12);
        let mut per_master = [0; 3];
        for i in 0..12 {
            let s = key_slot(m.tag(i));
            per_master[if s <= 5460 {
                0
            } else if s <= 10922 {
                1
            } else {
                2
            }] += 1;
        }
        assert_eq!(per_master, [4, 4, 4]);
    }

    #[test]
    fn ids_are_drawn_into_their_home_shard() {
        let m = ShardMap::new("muster", 12);
        for shard in 0..12 {
            for _ in 0..20 {
                let id = m.new_id(shard);
                assert_eq!(m.home(&id), shard);
                assert!(ulid::Ulid::from_string(&id).is_ok(), "{id} is a ULID");
            }
        }
        // Names spread: 12 000 queue names, every shard within 20 % of 1 000.
        let mut count = [0u32; 12];
        for q in 0..12_000 {
            count[m.home(&format!("queue-{q}"))] += 1;
        }
        assert!(count.iter().all(|&c| (800..1200).contains(&c)), "{count:?}");
    }
}
