//! The REST contract of muster: the request and answer types both the server
//! and its clients use, the rules for names and the bounds of every number.
//! No runtime, no HTTP stack, no Redis: a client compiles this and serde.
//!
//! With the `openapi` feature the types also derive `utoipa::ToSchema`, for
//! the server's OpenAPI document.

pub mod barriers;
pub mod bounds;
pub mod events;
pub mod limits;
pub mod locks;
pub mod names;
pub mod nodes;
pub mod schedules;
pub mod system;
pub mod tasks;
pub mod workflows;

pub use locks::{Acquired, Renewed};
pub use names::{
    LimitName, Name, NodeId, NotA, TaskId, generated_node_id, is_id, is_limit_name, is_limit_template, is_name,
    is_node_id,
};
pub use schedules::{Overlap, ScheduleDef, TaskTemplate};
pub use tasks::{GroupInfo, QueueStats, TaskSpec};
pub use workflows::{FailurePolicy, WorkflowTaskSpec};
