//! Integration tests against real Redis servers and real muster nodes.
//! One binary for all of them, so the crate links once.

mod common;

mod binary;
mod chaos;
mod http_api;
mod nodes;
mod orphans;
mod tasks;

mod barriers;
mod locks;
