//! Events on the wire: pages of the event stream.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use serde_json::Value;

/// One event of the cluster stream, as `GET /api/v1/events` and the
/// WebSocket send it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The stream id, `<ms>-<seq>`: pass it as `since` to resume after it.
    pub id: String,
    /// `task.succeeded`, `node.dead`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// Redis time, ms.
    pub ts: i64,
    /// The acting node or worker.
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub data: Value,
    /// The subject ids (`task`, `queue`, `group`, `workflow`, ...).
    #[serde(flatten)]
    pub subjects: BTreeMap<String, Value>,
}

impl Event {
    /// A subject id (`task`, `queue`, ...).
    pub fn subject(&self, name: &str) -> Option<&str> {
        self.subjects.get(name).and_then(Value::as_str)
    }
}

// One page of the event replay over plain HTTP. The server writes each
// event as the JSON text it built once (`E` = `Box<RawValue>`); a client
// reads `Event`s. (No doc comment: the document gives this schema none.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = EventPage, bound = ""))]
pub struct EventPage<E = Event> {
    /// Matching events, oldest first.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub events: Vec<E>,
    /// Pass as `since` to continue (the last entry looked at, matching or not).
    pub next: Option<String>,
    /// True when events after `since` were already trimmed from the stream.
    pub gap: bool,
    /// The oldest event the stream still holds.
    pub oldest: Option<String>,
}
