//! One struct per `config.toml` section, with its built-in defaults.

use super::{BTreeMap, Deserialize, PathBuf, Serialize};

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
    /// Most connections open at once. At the bound the longest-idle
    /// keep-alive connection is closed to make room; with none idle, new
    /// connections wait in the kernel's listen backlog until one closes or
    /// idles.
    pub max_connections: usize,
    /// Most connections open at once from one client address (an IPv4
    /// address, an IPv6 /64). At the bound that address's longest-idle
    /// connection is closed to make room; with none idle, the new one is
    /// refused at once. Behind a proxy every client has the proxy's address.
    pub max_connections_per_address: usize,
    /// Origins (`https://ops.example.com`) besides this node's own whose
    /// pages may open a WebSocket, or send an API write, with the session
    /// cookie.
    pub allowed_origins: Vec<String>,
    /// No-auth mode: `Host` values (`name` or `name:port`) accepted besides
    /// loopback names and the listen address; any other `Host` gets 421
    /// (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Threads of the node's async runtime (`muster serve`). 0: one per
    /// core (see `runtime_threads`).
    pub worker_threads: usize,
}

impl ServerConfig {
    /// The runtime's worker threads: `worker_threads`, or with 0 one per
    /// core (tokio's default). Fewer saves CPU where the node shares a small
    /// machine with Redis (BENCHMARKS.md, "Runtime threads": on two cores
    /// one thread spent 15 to 29 % less node CPU per task than two), but a
    /// single thread leaves the node's heartbeat no slack under a burst: a
    /// flood of 10 000 connections held it past a 600 ms ttl.
    pub fn runtime_threads(&self) -> usize {
        if self.worker_threads > 0 {
            return self.worker_threads;
        }
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
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
            max_connections_per_address: 256,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            worker_threads: 0,
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
    /// How many hash tags the namespace's task data is split into, so a
    /// Redis Cluster spreads it over its masters (`docs/sharding.md`). 1: one
    /// tag, `{key_prefix}`, as always. Fixed for the life of a namespace.
    pub shards: u32,
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
    /// Durability: how many replicas must confirm a change (`WAIT`) before
    /// the client is told it succeeded. 0: answer as soon as the master
    /// applied it (a failover can lose it). See `docs/high-availability.md`.
    pub ack_replicas: u32,
    /// How long a change waits for `ack_replicas` confirmations; past it the
    /// client gets 503 with `replicated: false`.
    pub ack_timeout_ms: u64,
    /// Dedicated connections the replicated writes share (`WAIT` blocks the
    /// connection it runs on, so never the shared one).
    pub ack_connections: u32,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            key_prefix: "muster".into(),
            shards: 1,
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
            ack_replicas: 0,
            ack_timeout_ms: 1000,
            ack_connections: 8,
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
    /// Upper bound on flow-control limits and templates (`PUT /api/v1/limits/{name}`).
    pub max_limits: u32,
    /// Upper bound on a template's keys in use at once (`tenant:acme` of
    /// `tenant:*`), over every template: a submit naming a new key past it
    /// is refused.
    pub max_limit_keys: u32,
    /// How often each node trims expired index entries.
    pub janitor_interval_ms: u64,
    /// Group commit (issue 41): how many single submits (per queue and
    /// shard) or completes (per shard) a node keeps in flight at once before
    /// the next ones queue and ride together in one script call. 0: never
    /// grouped.
    pub group_in_flight: u32,
}

impl TasksConfig {
    /// How many queues a caller of `role` may bring the cluster to: all of
    /// `max_queues` for an admin, all but the last tenth for the others, so
    /// a worker token filling the quota with junk queues leaves an admin
    /// room to create the real ones (issue 36 N14).
    pub fn queue_room(&self, role: Role) -> u32 {
        if role >= Role::Admin {
            self.max_queues
        } else {
            self.max_queues - self.max_queues / 10
        }
    }
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
            max_limits: 1000,
            max_limit_keys: 100_000,
            janitor_interval_ms: 5000,
            group_in_flight: 4,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClaimConfig {
    /// The claim lease: a claimed task that is not acknowledged (a task
    /// heartbeat, an ack, or its complete or fail) within this long, by
    /// Redis time, goes back to its queue with its token fenced off and no
    /// attempt counted. A claim may ask for another within
    /// `validate::CLAIM_ACK_MS`. 0: no claim lease.
    pub ack_ms: u64,
    /// A task put back this many times for want of an acknowledgement has
    /// its attempt counted at every later lapse (requeued while attempts
    /// remain, else dead), so a task whose worker crashes on receipt and
    /// comes back under the same id reaches the dead letters. 0: never
    /// counted.
    pub max_unacked: u32,
}

impl Default for ClaimConfig {
    fn default() -> Self {
        Self {
            ack_ms: 10_000,
            max_unacked: 5,
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
    /// Most WebSocket subscribers one principal holds on a node (a token
    /// with all its sessions; in no-auth mode a client address); beyond it
    /// 429, so one reader cannot take every slot.
    pub max_clients_per_principal: u32,
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
    /// For tests only (the `test-util` feature): a WebSocket session starts
    /// this long after its upgrade, to show that what is published meanwhile
    /// still reaches a live-only subscriber.
    #[cfg(feature = "test-util")]
    pub session_start_delay_ms: u64,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            max_len: 100_000,
            max_clients: 1024,
            max_clients_per_principal: 256,
            client_buffer: 8192,
            send_timeout_ms: 10_000,
            ping_ms: 20_000,
            reconcile_ms: 5000,
            #[cfg(feature = "test-util")]
            session_start_delay_ms: 0,
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
    /// For tests only (the `test-util` feature): shifts this node's
    /// scheduler clock (ms, may be negative), to show that a wrong clock
    /// neither duplicates nor misses.
    #[cfg(feature = "test-util")]
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
            #[cfg(feature = "test-util")]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP receiver spans are exported to (`http://collector:4318`,
    /// posted to `<endpoint>/v1/traces` as protobuf). Empty: tracing is off,
    /// and costs nothing (issue 39).
    pub otlp_endpoint: String,
    /// The share of new traces recorded (0.0 to 1.0), decided by the trace id
    /// so every node and worker decides the same. A request that comes with a
    /// `traceparent` follows its `sampled` flag.
    pub sample_ratio: f64,
    /// `service.name` of the node's spans.
    pub service_name: String,
    /// Spans waiting for export at most; more are dropped and counted
    /// (`muster_trace_spans_dropped_total`).
    pub queue: usize,
    /// The dashboard's link from a task to its trace: a URL with
    /// `{trace_id}` in it (`http://jaeger:16686/trace/{trace_id}`). Empty:
    /// the task page shows the trace id without a link.
    pub trace_url: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: String::new(),
            sample_ratio: 1.0,
            service_name: "muster".into(),
            queue: 4096,
            trace_url: String::new(),
        }
    }
}
