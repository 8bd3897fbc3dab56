//! Configuration: one struct per `config.toml` section.
//!
//! Precedence, lowest first: built-in defaults, the TOML file (`--config` or
//! `MUSTER_CONFIG`), environment variables `MUSTER_<SECTION>__<KEY>`, then the
//! command-line flags. Every section denies unknown keys, so a typo stops the
//! start with a message that names the key instead of being silently ignored.
//!
//! Durations are integers in milliseconds and their keys end in `_ms`: one
//! convention throughout.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

/// Everything a node needs to start.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub redis: RedisConfig,
    pub nodes: NodesConfig,
    pub auth: AuthConfig,
    pub tasks: TasksConfig,
    pub orphans: OrphansConfig,
    pub events: EventsConfig,
    pub schedules: SchedulesConfig,
    pub barriers: BarriersConfig,
    pub locks: LocksConfig,
    pub failover: FailoverConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address the HTTP server binds (API, dashboard, metrics).
    pub listen: String,
    /// This node's id. Empty: `<hostname>-<short ulid>`, new at every start.
    pub node_id: String,
    /// Where the node keeps its files (the embedded Redis lives under `redis/`).
    pub data_dir: PathBuf,
    /// The URL other nodes and operators use to reach this node. Empty: derived
    /// from `listen`.
    pub advertise_url: String,
    /// Largest accepted request body, in bytes; larger bodies get 413.
    pub max_body_bytes: usize,
    /// Free-form labels shown on the Nodes page.
    pub labels: BTreeMap<String, String>,
    /// Kernel send buffer of each HTTP connection, in bytes (0: the kernel's
    /// autotuning, up to several MiB per connection). Bounds the memory a slow
    /// WebSocket client can pin, and lets the node notice it sooner.
    pub socket_send_buffer_bytes: usize,
    /// Longest time from a request head's first byte to its end; a slower
    /// client's connection is closed.
    pub header_read_timeout_ms: u64,
    /// Longest time to read a request body, from the end of its head; a
    /// handler still reading then answers 408 and the connection closes.
    /// Long polls are not bounded by it: they wait after the body was read.
    pub body_read_timeout_ms: u64,
    /// A keep-alive connection with no request and no traffic for this long
    /// is closed.
    pub idle_timeout_ms: u64,
    /// Most connections open at once; beyond it new connections wait in the
    /// kernel's listen backlog until one closes.
    pub max_connections: usize,
    /// Origins (`https://ops.example.com`) besides this node's own whose
    /// pages may open a WebSocket with the session cookie.
    pub allowed_origins: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7700".into(),
            node_id: String::new(),
            data_dir: PathBuf::from("muster-data"),
            advertise_url: String::new(),
            max_body_bytes: 1024 * 1024,
            labels: BTreeMap::new(),
            socket_send_buffer_bytes: 256 * 1024,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            idle_timeout_ms: 60_000,
            max_connections: 10_000,
            allowed_origins: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://`, `rediss://` or `unix://` URL. Empty (and no sentinels or
    /// cluster seeds): start an embedded `redis-server` child.
    pub url: String,
    /// Namespace of every key, used as a Cluster hash tag: `{muster}:...`.
    pub key_prefix: String,
    /// Deadline of every Redis call.
    pub timeout_ms: u64,
    /// How many times a failed read is retried (with backoff) before the
    /// error is returned. Writes are never retried blindly.
    pub read_retries: u32,
    /// Accept any TLS certificate for `rediss://`. Insecure; logs a warning
    /// at every start.
    pub insecure_skip_tls_verify: bool,
    /// The embedded server's binary (`MUSTER_REDIS_SERVER_BIN` overrides).
    pub server_bin: String,
    /// Sentinel mode: the sentinels' `host:port` addresses. The node asks them
    /// for the master of `master_name`, confirms it with `ROLE`, and follows
    /// `+switch-master`.
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the master under.
    pub master_name: String,
    /// Password of the sentinels themselves (empty: none).
    pub sentinel_password: String,
    /// Cluster mode: seed `host:port` addresses of a Redis Cluster.
    pub cluster: Vec<String>,
    /// Password (and optional user) for the data servers in sentinel, cluster
    /// and coordinated modes; in standalone mode the URL carries it.
    pub username: String,
    pub password: String,
    /// Use TLS (certificates verified) to the data servers and sentinels in
    /// sentinel, cluster and coordinated modes.
    pub tls: bool,
    /// Sentinel mode: how often the node re-asks the sentinels for the master,
    /// besides `+switch-master` messages and errors, which trigger at once.
    pub sentinel_poll_ms: u64,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            key_prefix: "muster".into(),
            timeout_ms: 2000,
            read_retries: 2,
            insecure_skip_tls_verify: false,
            server_bin: "redis-server".into(),
            sentinels: Vec::new(),
            master_name: "muster".into(),
            sentinel_password: String::new(),
            cluster: Vec::new(),
            username: String::new(),
            password: String::new(),
            tls: false,
            sentinel_poll_ms: 1000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodesConfig {
    /// How often this node heartbeats.
    pub heartbeat_ms: u64,
    /// A node whose last heartbeat is older than this (by Redis time) is dead.
    pub ttl_ms: u64,
    /// How long a dead node stays listed (marked dead) before it is pruned.
    pub dead_retention_ms: u64,
    /// Upper bound on registered nodes, external workers included.
    pub max_nodes: u32,
}

impl Default for NodesConfig {
    fn default() -> Self {
        Self {
            heartbeat_ms: 1000,
            ttl_ms: 5000,
            dead_retention_ms: 60_000,
            max_nodes: 1000,
        }
    }
}

/// `[failover]`: the coordinated failover (the Beetle model), opt-in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailoverConfig {
    /// `off` (default), `client` (follow the coordinator), or `coordinator`
    /// (watch the master, run the rounds; also a client of itself).
    pub role: FailoverRole,
    /// The Redis servers (`host:port`) the master is chosen from; the others
    /// are kept as its replicas.
    pub redis_servers: Vec<String>,
    /// Coordinator: the node ids that must all confirm a switch, each
    /// optionally with its URL (`"node-b=http://10.0.0.2:7700"`). Without a
    /// URL the address is learned from the node registry while Redis is up;
    /// give URLs so a restarted coordinator can run a round while the master
    /// is down.
    pub clients: Vec<String>,
    /// Shared secret of the internal failover endpoints (at least 16 bytes).
    pub secret: String,
    /// Coordinator: how often the master is checked.
    pub interval_ms: u64,
    /// Coordinator: consecutive failed checks before a round starts.
    pub retries: u32,
    /// Coordinator: how long each client has to answer a message.
    pub answer_timeout_ms: u64,
    /// Coordinator: longest wait between cancelled rounds (backoff doubles
    /// from `interval_ms` up to this).
    pub max_backoff_ms: u64,
    /// Coordinator: how often a healthy master is re-published to the clients
    /// and the other servers are made its replicas.
    pub republish_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailoverRole {
    Off,
    Client,
    Coordinator,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        Self {
            role: FailoverRole::Off,
            redis_servers: Vec::new(),
            clients: Vec::new(),
            secret: String::new(),
            interval_ms: 1000,
            retries: 2,
            answer_timeout_ms: 1000,
            max_backoff_ms: 30_000,
            republish_ms: 5000,
        }
    }
}

/// API roles, ordered: each includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Read,
    Worker,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// A name for logs and the dashboard; never the secret.
    pub name: String,
    pub role: Role,
    /// Hex SHA-256 of the token (`printf %s "$TOKEN" | sha256sum`).
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// With no tokens the node binds loopback only and lets everyone in.
    pub tokens: Vec<TokenConfig>,
    /// How long a dashboard sign-in lasts (the session key's TTL in Redis
    /// and the cookie's Max-Age).
    pub session_ttl_ms: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            session_ttl_ms: 12 * 3600 * 1000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TasksConfig {
    /// Largest task payload (JSON, bytes); larger gets 413.
    pub max_payload_bytes: usize,
    /// Default number of executions before a task is dead.
    pub max_attempts: u32,
    /// First retry delay; doubles each attempt, with full jitter.
    pub backoff_base_ms: u64,
    /// Largest retry delay.
    pub backoff_cap_ms: u64,
    /// How long an idempotency key returns the original task.
    pub idempotency_window_ms: u64,
    /// How long succeeded and cancelled tasks are kept.
    pub retention_ms: u64,
    /// How long dead tasks are kept for inspection and retry.
    pub dead_retention_ms: u64,
    /// Upper bound on distinct queues.
    pub max_queues: u32,
    /// Upper bound on groups with a configured limit.
    pub max_groups: u32,
    /// How often each node trims expired index entries.
    pub janitor_interval_ms: u64,
}

impl Default for TasksConfig {
    fn default() -> Self {
        Self {
            max_payload_bytes: 256 * 1024,
            max_attempts: 3,
            backoff_base_ms: 1000,
            backoff_cap_ms: 300_000,
            idempotency_window_ms: 24 * 3600 * 1000,
            retention_ms: 24 * 3600 * 1000,
            dead_retention_ms: 7 * 24 * 3600 * 1000,
            max_queues: 1000,
            max_groups: 10_000,
            janitor_interval_ms: 5000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OrphansConfig {
    /// How often every node looks for tasks of dead owners and timed-out tasks.
    pub interval_ms: u64,
    /// Recoveries kept in the orphan history (also trimmed by age).
    pub history_max: u32,
    /// Oldest recovery kept in the orphan history.
    pub history_max_age_ms: u64,
}

impl Default for OrphansConfig {
    fn default() -> Self {
        Self {
            interval_ms: 1000,
            history_max: 1000,
            history_max_age_ms: 24 * 3600 * 1000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventsConfig {
    /// Approximate length the event stream is trimmed to (`XADD MAXLEN ~`).
    pub max_len: u64,
    /// Most WebSocket subscribers per node; beyond it 503.
    pub max_clients: u32,
    /// How many events the node's event bus keeps: how far a WebSocket
    /// client may fall behind. A client further behind, or whose socket takes
    /// longer than `send_timeout_ms` to accept a write, gets a `lagged`
    /// message and is closed (it reconnects with `since`).
    pub client_buffer: u32,
    /// A send to a WebSocket client that takes longer than this closes it.
    pub send_timeout_ms: u64,
    /// Keep-alive ping interval; a client silent for two intervals is closed.
    pub ping_ms: u64,
    /// How often the node's cached live view (node states, queue counts) is
    /// rebuilt from Redis, so a lost event cannot leave it wrong.
    pub reconcile_ms: u64,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            max_len: 100_000,
            max_clients: 1024,
            client_buffer: 8192,
            send_timeout_ms: 10_000,
            ping_ms: 20_000,
            reconcile_ms: 5000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulesConfig {
    /// How far a node's clock may be off Redis time without an occurrence
    /// firing late: each node proposes occurrences up to its own clock plus
    /// this. Also the lateness up to which an occurrence counts as on time;
    /// beyond it the occurrence was missed by an outage (see `backfill`).
    pub max_skew_ms: u64,
    /// Longest sleep of the scheduler loop; new and changed schedules are
    /// picked up within it.
    pub interval_ms: u64,
    /// History entries (fired, skipped, missed) kept per schedule.
    pub history_max: u32,
    /// TTL of each occurrence record (`SET NX`); at least twice `max_skew_ms`.
    pub record_ttl_ms: u64,
    /// Upper bound on schedules in the cluster.
    pub max_schedules: u32,
    /// For tests only: shifts this node's scheduler clock (ms, may be
    /// negative), to show that a wrong clock neither duplicates nor misses.
    pub clock_offset_ms: i64,
    /// `[[schedules.items]]`: written into Redis at every start; config wins
    /// for its ids.
    pub items: Vec<crate::schedules::ScheduleDef>,
}

impl Default for SchedulesConfig {
    fn default() -> Self {
        Self {
            max_skew_ms: 30_000,
            interval_ms: 1000,
            history_max: 100,
            record_ttl_ms: 600_000,
            max_schedules: 1000,
            clock_offset_ms: 0,
            items: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BarriersConfig {
    /// How long a decided round is kept (the TTL of its key).
    pub round_retention_ms: u64,
    /// Decided rounds kept per barrier: deciding a round deletes the oldest
    /// decided ones beyond this (never the round just decided).
    pub rounds_kept: u32,
    /// Undecided rounds a barrier may have at once: an arrival that would open
    /// one more is refused (409) until one is decided. Bounds the rounds
    /// stored per barrier, with `rounds_kept`.
    pub max_open_rounds: u32,
    /// Upper bound on configured barriers (`PUT /api/v1/barriers/{name}`).
    pub max_barriers: u32,
    /// How often every node decides rounds whose deadline passed with nobody
    /// calling, and evicts DoubleBarrier entrants whose node is dead.
    pub interval_ms: u64,
    /// Idle holds and DoubleBarriers expire after this; every call refreshes it.
    pub idle_ttl_ms: u64,
    /// Longest long poll (`wait_ms`) of arrive, wait, enter and leave.
    pub max_wait_ms: u64,
}

impl Default for BarriersConfig {
    fn default() -> Self {
        Self {
            round_retention_ms: 7 * 24 * 3600 * 1000,
            rounds_kept: 100,
            max_open_rounds: 1000,
            max_barriers: 1000,
            interval_ms: 200,
            idle_ttl_ms: 24 * 3600 * 1000,
            max_wait_ms: 30_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocksConfig {
    /// Lease of a lock or a leadership when the request gives no `ttl_ms`.
    pub default_ttl_ms: u64,
    /// Longest lease a request may ask for.
    pub max_ttl_ms: u64,
    /// A waiter in a lock's FIFO queue that stops polling (its request and node
    /// gone) leaves the queue after this, so it cannot block the others.
    pub waiter_ttl_ms: u64,
    /// How often every node expires lapsed leases, so that waiters wake.
    pub interval_ms: u64,
    /// Longest long poll (`wait_ms`) of acquire and campaign.
    pub max_wait_ms: u64,
}

impl Default for LocksConfig {
    fn default() -> Self {
        Self {
            default_ttl_ms: 30_000,
            max_ttl_ms: 24 * 3600 * 1000,
            waiter_ttl_ms: 5000,
            interval_ms: 200,
            max_wait_ms: 30_000,
        }
    }
}

/// Why a configuration was refused. The message names the key.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Config {
    /// Loads defaults, then `file` (when given; it must exist), then the
    /// `MUSTER_<SECTION>__<KEY>` environment variables, and validates.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError(format!(
                    "config file {} does not exist (given by --config or MUSTER_CONFIG)",
                    path.display()
                )));
            }
            fig = fig.merge(Toml::file_exact(path));
        }
        fig = fig.merge(env_provider());
        let config: Config = fig.extract().map_err(|e| ConfigError(describe(e)))?;
        config.validate()?;
        Ok(config)
    }

    /// Parses a TOML document over the defaults (no environment). Used by tests
    /// and by `load`'s checks.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let config: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(text))
            .extract()
            .map_err(|e| ConfigError(describe(e)))?;
        config.validate()?;
        Ok(config)
    }

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
        if !(1..=1_000_000).contains(&self.server.max_connections) {
            return err("server.max_connections", "must be between 1 and 1000000");
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
        if c.clock_offset_ms.abs() > 24 * 3600 * 1000 {
            return err(
                "schedules.clock_offset_ms",
                "must be within one day (and is for tests only)",
            );
        }
        let mut seen = std::collections::HashSet::new();
        for (i, item) in c.items.iter().enumerate() {
            if let Err(e) = crate::schedules::check(item, &self.tasks) {
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

    /// The URL operators and peers use to reach this node.
    pub fn advertise_url(&self, bound: SocketAddr) -> String {
        if !self.server.advertise_url.is_empty() {
            return self.server.advertise_url.clone();
        }
        format!("http://{bound}")
    }
}

/// `MUSTER_<SECTION>__<KEY>`; variables without `__` (such as `MUSTER_CONFIG`
/// and `MUSTER_REDIS_SERVER_BIN`) are not configuration keys.
fn env_provider() -> Env {
    Env::prefixed("MUSTER_")
        .filter(|k| k.as_str().contains("__"))
        .split("__")
}

/// Figment's messages already name the key; make the wording uniform.
fn describe(e: figment::Error) -> String {
    let mut out = Vec::new();
    for err in e {
        let key = err.path.join(".");
        let what = match &err.kind {
            figment::error::Kind::UnknownField(field, _) => {
                // From a file the path ends at the section; from an
                // environment variable it already ends with the field.
                let full = if key.is_empty() {
                    field.clone()
                } else if err.path.last() == Some(field) {
                    key.clone()
                } else {
                    format!("{key}.{field}")
                };
                format!("unknown key `{full}`: check the spelling against config.toml")
            }
            _ => {
                let source = err
                    .metadata
                    .as_ref()
                    .map(|m| format!(" (from {})", m.name))
                    .unwrap_or_default();
                if key.is_empty() {
                    format!("{}{source}", err.kind)
                } else {
                    format!("invalid value for key `{key}`: {}{source}", err.kind)
                }
            }
        };
        out.push(what);
    }
    out.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_config_parses_to_defaults() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml")).unwrap();
        let parsed = Config::from_toml(&text).unwrap();
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn unknown_key_is_named() {
        let e = Config::from_toml("[nodes]\nttl_msec = 5\n").unwrap_err();
        assert!(e.0.contains("nodes.ttl_msec"), "{}", e.0);
    }

    #[test]
    fn bad_value_is_named() {
        let e = Config::from_toml("[nodes]\nttl_ms = \"soon\"\n").unwrap_err();
        assert!(e.0.contains("nodes.ttl_ms"), "{}", e.0);
        let e = Config::from_toml("[server]\nlisten = \"nowhere\"\n").unwrap_err();
        assert!(e.0.contains("server.listen"), "{}", e.0);
        let e = Config::from_toml("[nodes]\nttl_ms = 3000\nheartbeat_ms = 1000\n").unwrap_err();
        assert!(e.0.contains("nodes.ttl_ms"), "{}", e.0);
        let c = Config::from_toml("[nodes]\nttl_ms = 2000\nheartbeat_ms = 500\n[redis]\ntimeout_ms = 2000\n").unwrap();
        assert!(c.warnings()[0].contains("redis.timeout_ms"), "{:?}", c.warnings());
        assert!(Config::default().warnings().is_empty());
        let e = Config::from_toml("[barriers]\nmax_open_rounds = 0\n").unwrap_err();
        assert!(e.0.contains("barriers.max_open_rounds"), "{}", e.0);
    }

    #[test]
    fn schedules_are_checked_at_load() {
        let ok = "[schedules]\nmax_skew_ms = 1000\n[[schedules.items]]\nid = \"nightly\"\nexpression = \"0 3 * * *\"\n\
                  timezone = \"Europe/Berlin\"\nqueue = \"reports\"\ntask = { payload = { kind = \"nightly\" }, priority = 5 }\n\
                  overlap = \"forbid\"\n";
        let cfg = Config::from_toml(ok).unwrap();
        assert_eq!(cfg.schedules.items[0].id, "nightly");
        assert_eq!(cfg.schedules.items[0].overlap, crate::schedules::Overlap::Forbid);
        let e = Config::from_toml(&ok.replace("Europe/Berlin", "Europe/Berlni")).unwrap_err();
        assert!(
            e.0.contains("schedules.items[0]") && e.0.contains("timezone"),
            "{}",
            e.0
        );
        let e = Config::from_toml(&ok.replace("0 3 * * *", "0 3 * *")).unwrap_err();
        assert!(
            e.0.contains("schedules.items[0]") && e.0.contains("expression"),
            "{}",
            e.0
        );
        let e = Config::from_toml(&ok.replace("overlap", "overlapp")).unwrap_err();
        assert!(e.0.contains("overlapp"), "{}", e.0);
        let e = Config::from_toml("[schedules]\nrecord_ttl_ms = 1000\n").unwrap_err();
        assert!(e.0.contains("schedules.record_ttl_ms"), "{}", e.0);
    }

    #[test]
    fn unknown_section_is_named() {
        let e = Config::from_toml("[nodez]\nttl_ms = 5\n").unwrap_err();
        assert!(e.0.contains("nodez"), "{}", e.0);
    }
}
