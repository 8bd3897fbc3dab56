//! What integration tests reach inside a node: the `test-util` feature,
//! never in a release binary. Each item is named here, so the library's
//! surface stays what `lib.rs` says (the client, the config, starting a
//! node) and what tests reach beyond it is one list.

pub use crate::app::AppState;
pub use crate::durability::ACKED;
pub use crate::events::{Event, StreamId};
pub use crate::nodes::{NodeKind, Nodes};
pub use crate::store::script::LIBRARIES;
pub use crate::store::shards::{ShardMap, key_slot};
pub use crate::store::{Lua, ScriptCtx, Store, StoreError, classify};
pub use crate::telemetry::{Kind, METRICS};
pub use crate::traces::Tracer;
pub use crate::validate::plain_text_pattern;
