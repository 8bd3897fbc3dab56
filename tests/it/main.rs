//! Integration tests against real Redis servers and real muster nodes.
//! One binary for all of them, so the crate links once.
//!
//! (`unreachable_pub` is for the crates: a test binary reaches nothing from
//! outside, and its helpers are `pub` for the modules beside them.)
#![allow(unreachable_pub)]

mod common;

mod barriers;
mod binary;
mod browser;
mod chaos;
mod cli_admin;
mod client;
mod client_python;
mod conformance;
mod contract;
mod dead_bulk;
mod docs;
mod durability;
mod events;
mod events_resume;
mod group_commit;
mod ha_cluster;
mod ha_coordinated;
mod ha_coordinated_bin;
mod ha_harness;
mod ha_sentinel;
mod hostile;
mod http_api;
mod http_edge;
mod isolation;
mod late_writes;
mod limits;
mod locks;
mod monitoring;
mod nodes;
mod orphans;
mod partitions;
mod schedules;
mod scripts;
mod sharding;
mod soak;
mod stalls;
mod stats;
mod tasks;
mod tracing;
mod workflows;
