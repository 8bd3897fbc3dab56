//! The keys of one shard of a namespace: its prefix and the fixed keys
//! shared by several subsystems. Keys of one subsystem's own records are
//! built by its `scripts.rs` (beside the Lua scripts that use them) from
//! the same prefix; scripts compute keys from ids from the `P` of the Lua
//! prelude, with the same suffixes.
//!
//! Every key starts with its shard's tag, `{<prefix>}` for a namespace of
//! one shard (see `shards`): the braces are a Cluster hash tag, so all keys
//! of one shard live in one slot and every multi-key script runs on a Redis
//! Cluster too. A namespace split into `redis.shards` shards spreads over
//! that many slots, one tag each.
//!
//! Names that come from users are validated (see `validate`) before they get
//! here, so they contain no braces, colons or spaces.

#[derive(Debug, Clone)]
pub struct Keys {
    p: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Keys {
            p: format!("{{{prefix}}}"),
        }
    }

    /// The keys of one shard, by its whole hash tag (`{muster#3.1}`, see
    /// [`ShardMap`](super::shards::ShardMap)).
    pub fn tagged(tag: &str) -> Self {
        Keys { p: tag.to_string() }
    }

    /// The hash-tagged prefix, `{muster}`.
    pub fn prefix(&self) -> &str {
        &self.p
    }

    /// Stream: the cluster event outbox.
    pub fn events(&self) -> String {
        format!("{}:events", self.p)
    }

    /// String: a dashboard session, by the hex SHA-256 of its id (never the
    /// id itself); holds the hex SHA-256 of the token that signed in. TTL
    /// `auth.session_ttl_ms`.
    pub fn session(&self, id_hash: &str) -> String {
        format!("{}:session:{id_hash}", self.p)
    }

    /// String: the marker a replicated write sets before `WAIT`, so the wait
    /// covers every change the master applied before it (see `store/ack.rs`).
    /// TTL 60 s.
    pub fn ack_mark(&self) -> String {
        format!("{}:ack:mark", self.p)
    }

    /// Hash: the outcome history of one minute (minutes since the Unix
    /// epoch), `<queue>:<s|f|d|q|l>` -> value (see `stats`). TTL 2 h.
    pub fn stats_minute(&self, minute: i64) -> String {
        format!("{}:stats:m:{minute}", self.p)
    }

    /// Hash: the outcome history of one UTC day (days since the epoch), the
    /// same fields. TTL 32 days.
    pub fn stats_day(&self, day: i64) -> String {
        format!("{}:stats:d:{day}", self.p)
    }

    // --- nodes ---------------------------------------------------------

    /// Sorted set: node id scored by the expiry of its last heartbeat (Redis ms).
    pub fn nodes(&self) -> String {
        format!("{}:nodes", self.p)
    }
    /// Hash: one node's info; TTL of ttl + dead retention.
    pub fn node(&self, id: &str) -> String {
        format!("{}:node:{id}", self.p)
    }
    /// Set: ids of the tasks a node is running (for the orphan cleaner).
    pub fn node_tasks(&self, id: &str) -> String {
        format!("{}:node:{id}:tasks", self.p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_the_hash_tag() {
        let k = Keys::new("muster");
        assert_eq!(k.nodes(), "{muster}:nodes");
        assert_eq!(k.node("a"), "{muster}:node:a");
        assert_eq!(k.events(), "{muster}:events");
        assert_eq!(k.session("ab"), "{muster}:session:ab");
    }
}
