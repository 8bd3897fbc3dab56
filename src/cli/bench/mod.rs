//! The benchmarks `muster bench`, `muster bench-ws` and
//! `muster bench-barriers`: load through a running node's API.

pub mod barriers;
mod latency;
mod redis_stats;
pub mod tasks;
pub mod ws;
