//! muster: a high-availability coordination server for worker clusters.
//!
//! Every node runs this same code; nodes share one Redis deployment and
//! coordinate only through it. The library's surface is small: [`config`],
//! [`start`] and [`Running`], the [`client`] crate, the commands of [`cli`],
//! and with the `test-util` feature, [`testing`] (what integration tests
//! reach inside). Module map:
//!
//! - [`config`]: `config.toml`, environment and flags, validated at start.
//! - `store`: the one Redis client (embedded child, standalone, TLS, unix,
//!   Sentinel, Cluster), the split of a namespace into shards (placement,
//!   fan-out over every shard), the pool of connections that wait for
//!   replicas, and the Lua script wrapper with its shared prelude.
//! - `nodes`: membership by heartbeat into a sorted set scored by Redis time.
//! - `failover`: Redis high availability: following the master under
//!   Sentinel, and the coordinated failover in which every node confirms.
//! - `tasks`: queues, atomic claim with fencing tokens, retries, dead
//!   letters, idempotency, concurrency groups, retention.
//! - `orphans`: the cleaner that recovers tasks of dead owners, and the
//!   timeout monitor.
//! - `workflows`: DAGs of tasks whose successors are dispatched exactly once.
//! - `schedules`: cron schedules, fired exactly once per occurrence across
//!   the cluster by every node's scheduler.
//! - `events`: the cluster event stream, tailed once per node and fanned
//!   out to local consumers (claim wake-ups, WebSockets).
//! - `durability`: which changes wait for replicas (`redis.ack_replicas`,
//!   the `Durability` header) and the 503 when they cannot be confirmed.
//! - `problem`: what kind of failure a domain error is (`problem::Classify`),
//!   without HTTP; `auth`, `http`, `error`: tokens and roles, request
//!   ids, metrics, problem+json errors (the one mapping from a kind to a status).
//! - `system`: probes, `/metrics`, the Redis summary, the OpenAPI document.
//! - `telemetry`: the catalogue of Prometheus metrics (help, type, zero series).
//! - `health`: this node's own view of whether it can serve.
//! - `validate`: the API's bounds (names that become parts of Redis keys,
//!   ids, sizes, waits, ttls), read by the checks and the OpenAPI document.
//! - `stats`: the outcome history behind the charts (per minute and per day).
//! - `barriers`: barrier rounds decided once in Redis (G8), etcd-style
//!   Barrier and DoubleBarrier.
//! - `locks`: locks with fencing tokens and FIFO waiters, leader elections.
//! - `longpoll`: long polls woken by cluster events.
//! - `web`: the server-rendered dashboard.
//! - `app`: the shared state and the router.
//! - `serve`: the connection loop, with its read, idle and connection bounds.
//! - [`client`]: a typed client of the REST API and a `Worker` library
//!   (heartbeats, fencing, cancel and graceful shutdown done for the user).
//! - [`cli`]: the admin commands and the benchmarks, on the client crate only.
//! - `node`: the composition root: [`start`] builds a node in named steps
//!   and [`Running`] stops it along one ordered teardown path.
//!
//! [`start`] takes an already-bound listener, so tests bind port 0, and
//! returns a [`Running`] node whose shutdown is explicit and ordered: stop
//! taking requests, stop the background loops, leave the cluster, then stop
//! the embedded Redis.

// Items that only tests reach (through `testing`) are `pub` but unreachable
// without the `test-util` feature; the lint holds in the build that has it.
#![cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]

pub mod cli;
pub mod config;
#[cfg(feature = "test-util")]
pub mod testing;

pub use muster_client as client;

mod app;
mod auth;
mod barriers;
mod durability;
mod error;
mod events;
mod failover;
mod health;
mod http;
mod lenient;
mod locks;
mod longpoll;
mod node;
mod nodes;
mod orphans;
mod problem;
mod schedules;
mod serve;
mod stats;
mod store;
mod system;
mod tasks;
mod telemetry;
mod traces;
mod validate;
// askama's derives put `pub` on what they generate: the lint cannot be
// fixed there.
#[allow(unreachable_pub)]
mod web;
mod workflows;

pub use node::{Running, StartError, generated_node_id, metrics_handle, run, start};
pub use serve::{bind, raise_open_files_limit};
pub use store::redact;
