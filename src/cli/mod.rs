//! The command line beyond `muster serve`: the barrier, lock and events
//! commands and the benchmarks. They reach a node through its REST API and
//! the typed client (`muster_client`), as any other client does.

pub mod admin;
pub mod barrier;
pub mod bench;
pub mod duration;
pub mod events_tail;
pub mod lock;
