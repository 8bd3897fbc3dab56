//! The checks serde cannot make: ranges, relations between keys, the Redis
//! topology, the config schedules; and the warnings logged at start.

use super::{Config, ConfigError, FailoverRole, SocketAddr};

/// Most replicas `redis.ack_replicas` may require.
pub const MAX_ACK_REPLICAS: u32 = 16;
/// Longest `redis.ack_timeout_ms`: one minute.
pub const MAX_ACK_TIMEOUT_MS: u64 = 60_000;
/// Most dedicated connections for replicated writes.
pub const MAX_ACK_CONNECTIONS: u32 = 256;
/// The most shards a namespace can be split into (`redis.shards`).
pub const MAX_SHARDS: u32 = 64;

impl Config {
    /// Checks the values serde cannot: ranges and relations between keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |key: &str, msg: &str| Err(ConfigError(format!("invalid value for key `{key}`: {msg}")));
        if self.server.listen.parse::<SocketAddr>().is_err() {
            return err(
                "server.listen",
                "expected an IP address and port such as 127.0.0.1:7700",
            );
        }
        if !self.server.node_id.is_empty() && !crate::validate::is_node_id(&self.server.node_id) {
            return err("server.node_id", "use 1 to 64 characters from A-Z a-z 0-9 . _ -");
        }
        if self.server.max_body_bytes < 1024 {
            return err("server.max_body_bytes", "must be at least 1024");
        }
        for (key, v) in [
            ("server.header_read_timeout_ms", self.server.header_read_timeout_ms),
            ("server.body_read_timeout_ms", self.server.body_read_timeout_ms),
            ("server.idle_timeout_ms", self.server.idle_timeout_ms),
        ] {
            if !(100..=3_600_000).contains(&v) {
                return err(key, "must be between 100 and 3600000 (one hour)");
            }
        }
        if self.server.worker_threads > 1024 {
            return err("server.worker_threads", "must be between 0 (one per core) and 1024");
        }
        if !(1..=1_000_000).contains(&self.server.max_connections) {
            return err("server.max_connections", "must be between 1 and 1000000");
        }
        if !(1..=1_000_000).contains(&self.server.max_connections_per_address) {
            return err(
                "server.max_connections_per_address",
                "must be between 1 and 1000000 (above server.max_connections it is the same as that)",
            );
        }
        if self.events.max_clients_per_principal == 0 {
            return err("events.max_clients_per_principal", "must be at least 1");
        }
        for o in &self.server.allowed_origins {
            let ok = o.split_once("://").is_some_and(|(sch, rest)| {
                (sch == "http" || sch == "https") && !rest.is_empty() && !rest.contains('/')
            });
            if !ok {
                return err(
                    "server.allowed_origins",
                    "each entry must be an origin such as https://ops.example.com (scheme, host, optional port, no path)",
                );
            }
        }
        if !(60_000..=30 * 24 * 3600 * 1000).contains(&self.auth.session_ttl_ms) {
            return err(
                "auth.session_ttl_ms",
                "must be between 60000 (a minute) and 2592000000 (30 days)",
            );
        }
        let prefix = &self.redis.key_prefix;
        if prefix.is_empty()
            || prefix.len() > 64
            || !prefix.chars().all(|c| c.is_ascii_alphanumeric() || "._-:".contains(c))
        {
            return err("redis.key_prefix", "use 1 to 64 characters from A-Z a-z 0-9 . _ - :");
        }
        if !(1..=MAX_SHARDS).contains(&self.redis.shards) {
            return err(
                "redis.shards",
                &format!(
                    "must be between 1 and {MAX_SHARDS}: the hash tags a namespace's tasks are split into \
                     (a multiple of the Cluster's masters spreads them evenly; 1 keeps one tag)"
                ),
            );
        }
        if self.redis.timeout_ms == 0 {
            return err("redis.timeout_ms", "must be greater than 0");
        }
        if !self.redis.url.is_empty() {
            let ok = ["redis://", "rediss://", "unix://"]
                .iter()
                .any(|s| self.redis.url.starts_with(s));
            if !ok {
                return err(
                    "redis.url",
                    "expected a redis://, rediss:// or unix:// URL (or empty for the embedded server)",
                );
            }
        }
        self.validate_topology()?;
        if self.nodes.heartbeat_ms == 0 {
            return err("nodes.heartbeat_ms", "must be greater than 0");
        }
        if self.nodes.ttl_ms < 4 * self.nodes.heartbeat_ms {
            return err(
                "nodes.ttl_ms",
                "must be at least 4 times nodes.heartbeat_ms: a node's lease must outlast one lost heartbeat \
                 and a Redis stall of up to 3/8 of the ttl (shorter stalls are not told apart from a slow pass; \
                 longer ones give every lease back)",
            );
        }
        if self.nodes.max_nodes == 0 {
            return err("nodes.max_nodes", "must be greater than 0");
        }
        for (i, t) in self.auth.tokens.iter().enumerate() {
            if t.sha256.len() != 64 || !t.sha256.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(ConfigError(format!(
                    "invalid value for key `auth.tokens[{i}].sha256`: expected 64 hex digits (printf %s \"$TOKEN\" | sha256sum)"
                )));
            }
            if t.name.is_empty() {
                return Err(ConfigError(format!(
                    "invalid value for key `auth.tokens[{i}].name`: must not be empty"
                )));
            }
        }
        let t = &self.tasks;
        if t.max_attempts == 0 || t.max_attempts > 1000 {
            return err("tasks.max_attempts", "must be between 1 and 1000");
        }
        if t.max_payload_bytes == 0 {
            return err("tasks.max_payload_bytes", "must be greater than 0");
        }
        if t.backoff_cap_ms < t.backoff_base_ms {
            return err("tasks.backoff_cap_ms", "must be at least tasks.backoff_base_ms");
        }
        if t.retention_ms == 0 || t.dead_retention_ms == 0 || t.idempotency_window_ms == 0 {
            return err(
                "tasks.retention_ms",
                "retention_ms, dead_retention_ms and idempotency_window_ms must be greater than 0",
            );
        }
        if t.janitor_interval_ms == 0 {
            return err("tasks.janitor_interval_ms", "must be greater than 0");
        }
        if t.max_queues == 0 {
            return err("tasks.max_queues", "must be greater than 0");
        }
        if t.max_groups == 0 {
            return err("tasks.max_groups", "must be greater than 0");
        }
        if t.max_limits == 0 {
            return err("tasks.max_limits", "must be greater than 0");
        }
        if t.max_limit_keys == 0 {
            return err("tasks.max_limit_keys", "must be greater than 0");
        }
        if t.group_in_flight > 1024 {
            return err(
                "tasks.group_in_flight",
                "must be at most 1024 (0 turns group commit off)",
            );
        }
        let ack = self.claim.ack_ms;
        if ack != 0 && !crate::validate::CLAIM_ACK_MS.contains(&ack) {
            return err(
                "claim.ack_ms",
                &format!(
                    "must be 0 (no claim lease) or between {} and {}",
                    crate::validate::CLAIM_ACK_MS.start(),
                    crate::validate::CLAIM_ACK_MS.end()
                ),
            );
        }
        if self.orphans.interval_ms == 0 {
            return err("orphans.interval_ms", "must be greater than 0");
        }
        let e = &self.events;
        if e.max_len < 100 {
            return err("events.max_len", "must be at least 100");
        }
        if e.client_buffer < 8 {
            return err("events.client_buffer", "must be at least 8");
        }
        if e.send_timeout_ms == 0 || e.ping_ms == 0 || e.reconcile_ms == 0 {
            return err(
                "events.reconcile_ms",
                "send_timeout_ms, ping_ms and reconcile_ms must be greater than 0",
            );
        }
        #[cfg(feature = "test-util")]
        if e.session_start_delay_ms > 60_000 {
            return err(
                "events.session_start_delay_ms",
                "must be at most 60000 (and is for tests only)",
            );
        }
        let b = &self.barriers;
        if b.round_retention_ms < 1000 {
            return err("barriers.round_retention_ms", "must be at least 1000");
        }
        if !(1..=100_000).contains(&b.rounds_kept) {
            return err("barriers.rounds_kept", "must be between 1 and 100000");
        }
        if !(1..=100_000).contains(&b.max_open_rounds) {
            return err("barriers.max_open_rounds", "must be between 1 and 100000");
        }
        if b.max_barriers == 0 {
            return err("barriers.max_barriers", "must be greater than 0");
        }
        if b.interval_ms == 0 {
            return err("barriers.interval_ms", "must be greater than 0");
        }
        if b.idle_ttl_ms < 1000 {
            return err("barriers.idle_ttl_ms", "must be at least 1000");
        }
        if !(1000..=600_000).contains(&b.max_wait_ms) {
            return err("barriers.max_wait_ms", "must be between 1000 and 600000");
        }
        let l = &self.locks;
        if l.max_ttl_ms < 100 {
            return err("locks.max_ttl_ms", "must be at least 100");
        }
        if !(100..=l.max_ttl_ms).contains(&l.default_ttl_ms) {
            return err("locks.default_ttl_ms", "must be between 100 and locks.max_ttl_ms");
        }
        if l.waiter_ttl_ms < 100 {
            return err("locks.waiter_ttl_ms", "must be at least 100");
        }
        if l.interval_ms == 0 {
            return err("locks.interval_ms", "must be greater than 0");
        }
        if !(1000..=600_000).contains(&l.max_wait_ms) {
            return err("locks.max_wait_ms", "must be between 1000 and 600000");
        }
        let t = &self.telemetry;
        let url = &t.otlp_endpoint;
        if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
            return err(
                "telemetry.otlp_endpoint",
                "must be an http:// or https:// URL, or empty (tracing off)",
            );
        }
        if !(0.0..=1.0).contains(&t.sample_ratio) {
            return err("telemetry.sample_ratio", "must be between 0.0 and 1.0");
        }
        if t.service_name.is_empty() || t.service_name.len() > 128 {
            return err("telemetry.service_name", "must be 1 to 128 characters");
        }
        if !(16..=1_000_000).contains(&t.queue) {
            return err("telemetry.queue", "must be between 16 and 1000000");
        }
        if !t.trace_url.is_empty() && !t.trace_url.contains("{trace_id}") {
            return err(
                "telemetry.trace_url",
                "must contain {trace_id} (where the trace id goes), or be empty",
            );
        }
        self.validate_schedules()?;
        Ok(())
    }

    /// Settings that work but are unwise, for the log at start.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let (timeout, ttl, hb) = (self.redis.timeout_ms, self.nodes.ttl_ms, self.nodes.heartbeat_ms);
        if timeout + hb > ttl {
            out.push(format!(
                "redis.timeout_ms ({timeout}) plus nodes.heartbeat_ms ({hb}) exceeds nodes.ttl_ms ({ttl}): a heartbeat \
                 that is slow but succeeds can land after its node's lease ran out, so the node may be declared \
                 dead while its calls still succeed, and it hands out no work meanwhile; use a redis.timeout_ms of \
                 at most {}",
                ttl.saturating_sub(hb)
            ));
        }
        out
    }

    /// `[redis]` topology keys and `[failover]`: at most one way to find the
    /// master, and complete settings for the one chosen.
    fn validate_topology(&self) -> Result<(), ConfigError> {
        let err = |key: &str, msg: &str| Err(ConfigError(format!("invalid value for key `{key}`: {msg}")));
        let r = &self.redis;
        let f = &self.failover;
        let coordinated = f.role != FailoverRole::Off;
        let ways = [
            !r.url.is_empty(),
            !r.sentinels.is_empty(),
            !r.cluster.is_empty(),
            coordinated,
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if ways > 1 {
            return err(
                "redis.url",
                "set only one of redis.url, redis.sentinels, redis.cluster and failover.role",
            );
        }
        let addr_ok = |a: &String| crate::failover::is_addr(a);
        if r.sentinels.iter().any(|a| !addr_ok(a)) {
            return err("redis.sentinels", "expected host:port entries such as 10.0.0.5:26379");
        }
        if !r.sentinels.is_empty() && r.master_name.is_empty() {
            return err("redis.master_name", "must name the master the sentinels monitor");
        }
        if r.cluster.iter().any(|a| !addr_ok(a)) {
            return err("redis.cluster", "expected host:port entries such as 10.0.0.5:7000");
        }
        if r.sentinel_poll_ms < 100 {
            return err("redis.sentinel_poll_ms", "must be at least 100");
        }
        if r.ack_replicas > MAX_ACK_REPLICAS {
            return err(
                "redis.ack_replicas",
                &format!("must be between 0 and {MAX_ACK_REPLICAS} (the replicas that must confirm each change)"),
            );
        }
        if r.ack_replicas > 0 && ways == 0 {
            return err(
                "redis.ack_replicas",
                "the embedded Redis has no replicas, so no change could ever be confirmed: \
                 set it to 0, or point the node at a replicated deployment (url, sentinels, cluster or failover)",
            );
        }
        if !(1..=MAX_ACK_TIMEOUT_MS).contains(&r.ack_timeout_ms) {
            return err(
                "redis.ack_timeout_ms",
                &format!("must be between 1 and {MAX_ACK_TIMEOUT_MS} (WAIT's 0, wait forever, is not allowed)"),
            );
        }
        if !(1..=MAX_ACK_CONNECTIONS).contains(&r.ack_connections) {
            return err(
                "redis.ack_connections",
                &format!("must be between 1 and {MAX_ACK_CONNECTIONS}"),
            );
        }
        if coordinated {
            if f.redis_servers.is_empty() || f.redis_servers.iter().any(|a| !addr_ok(a)) {
                return err(
                    "failover.redis_servers",
                    "list the Redis servers as host:port entries (at least one)",
                );
            }
            if f.secret.len() < 16 {
                return err("failover.secret", "use a shared secret of at least 16 bytes");
            }
            if self.server.node_id.is_empty() {
                return err(
                    "server.node_id",
                    "coordinated failover needs a fixed node id, since the coordinator lists its clients by id",
                );
            }
            for c in &f.clients {
                let (id, url) = c.split_once('=').unwrap_or((c.as_str(), ""));
                if !crate::validate::is_node_id(id) {
                    return err(
                        "failover.clients",
                        "entries are node ids (1 to 64 characters from A-Z a-z 0-9 . _ -), optionally `id=http://host:port`",
                    );
                }
                if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
                    return err("failover.clients", "a client URL must start with http:// or https://");
                }
            }
            if f.role == FailoverRole::Coordinator && f.clients.is_empty() {
                return err("failover.clients", "the coordinator needs the ids of its client nodes");
            }
            if f.interval_ms < 100 || f.answer_timeout_ms < 100 || f.republish_ms < 100 {
                return err(
                    "failover.interval_ms",
                    "interval_ms, answer_timeout_ms and republish_ms must be at least 100",
                );
            }
            if f.retries == 0 {
                return err("failover.retries", "must be at least 1");
            }
            if f.max_backoff_ms < f.interval_ms {
                return err("failover.max_backoff_ms", "must be at least failover.interval_ms");
            }
        }
        Ok(())
    }

    /// The `[schedules]` section and every `[[schedules.items]]` entry.
    fn validate_schedules(&self) -> Result<(), ConfigError> {
        let err = |key: &str, msg: &str| Err(ConfigError(format!("invalid value for key `{key}`: {msg}")));
        let c = &self.schedules;
        if c.max_skew_ms > 3_600_000 {
            return err("schedules.max_skew_ms", "must be at most 3600000 (one hour)");
        }
        if c.interval_ms == 0 || c.interval_ms > 60_000 {
            return err("schedules.interval_ms", "must be between 1 and 60000");
        }
        if c.history_max == 0 || c.history_max > 10_000 {
            return err("schedules.history_max", "must be between 1 and 10000");
        }
        if c.record_ttl_ms < 1000 || c.record_ttl_ms < 2 * c.max_skew_ms {
            return err(
                "schedules.record_ttl_ms",
                "must be at least 1000 and at least twice schedules.max_skew_ms",
            );
        }
        if c.max_schedules == 0 {
            return err("schedules.max_schedules", "must be greater than 0");
        }
        #[cfg(feature = "test-util")]
        if c.clock_offset_ms.abs() > 24 * 3600 * 1000 {
            return err(
                "schedules.clock_offset_ms",
                "must be within one day (and is for tests only)",
            );
        }
        let mut seen = std::collections::HashSet::new();
        for (i, item) in c.items.iter().enumerate() {
            let placement = crate::store::shards::ShardMap::new(&self.redis.key_prefix, self.redis.shards);
            if let Err(e) = crate::schedules::check(item, &self.tasks, &placement) {
                return Err(ConfigError(format!(
                    "invalid value for key `schedules.items[{i}]`: {e}"
                )));
            }
            if !seen.insert(item.id.as_str()) {
                return Err(ConfigError(format!(
                    "invalid value for key `schedules.items[{i}].id`: `{}` is defined twice",
                    item.id
                )));
            }
        }
        Ok(())
    }
}
