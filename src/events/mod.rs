//! The cluster event stream (`{prefix}:events`) as seen by this node.
//!
//! Invariants:
//! - Events are written only by state-change scripts, in the same atomic
//!   step as the change (the outbox, G9); nothing here writes to the stream.
//! - One tailer per node reads the stream with `XREAD BLOCK` from the last id
//!   it delivered; after a Redis error it reconnects with backoff and resumes
//!   from that id, so a blip leaves no gap.
//! - Local consumers (claim wake-ups, WebSocket clients, caches) receive each
//!   event through bounded channels and can never slow the tailer down.

pub mod live;
pub mod routes;
pub mod tail;
pub mod tailer;
pub mod ws;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use tokio::sync::{Notify, broadcast};

/// One event, parsed once and serialized once for every consumer.
#[derive(Debug, Clone)]
pub struct Event {
    /// The stream id, `<ms>-<seq>`.
    pub id: String,
    /// The same, parsed (for ordering).
    pub sid: Option<StreamId>,
    pub kind: String,
    /// Redis time, ms.
    pub ts: i64,
    pub node: String,
    /// Subject ids: task, queue, group, schedule, barrier, workflow, ...
    pub subjects: BTreeMap<String, String>,
    /// The `data` field as stored (JSON text).
    pub data: String,
    /// The event as JSON text, built on first use (most events are only
    /// looked at for their queue, to wake claimers).
    json: std::sync::OnceLock<Arc<str>>,
    /// The same as a WebSocket text payload, shared by every subscriber.
    frame: std::sync::OnceLock<axum::extract::ws::Utf8Bytes>,
}

impl Event {
    /// Builds an event from a stream entry's fields.
    pub fn from_fields(id: String, fields: Vec<(String, String)>) -> Event {
        let mut kind = String::new();
        // The stream id's millisecond part is the Redis time of the event.
        let ts = id.split('-').next().and_then(|ms| ms.parse().ok()).unwrap_or(0);
        let mut node = String::new();
        let mut data = String::new();
        let mut subjects = BTreeMap::new();
        for (k, v) in fields {
            match k.as_str() {
                "type" => kind = v,
                "node" => node = v,
                "data" => data = v,
                _ => {
                    subjects.insert(k, v);
                }
            }
        }
        Event {
            sid: StreamId::parse(&id),
            id,
            kind,
            ts,
            node,
            subjects,
            data,
            json: std::sync::OnceLock::new(),
            frame: std::sync::OnceLock::new(),
        }
    }

    /// The event as JSON: `{"id", "type", "ts", "node", <subjects>, "data"}`.
    pub fn json(&self) -> Arc<str> {
        self.json
            .get_or_init(|| {
                let mut obj = Map::new();
                obj.insert("id".into(), Value::String(self.id.clone()));
                obj.insert("type".into(), Value::String(self.kind.clone()));
                obj.insert("ts".into(), Value::from(self.ts));
                obj.insert("node".into(), Value::String(self.node.clone()));
                for (k, v) in &self.subjects {
                    obj.insert(k.clone(), Value::String(v.clone()));
                }
                // Lua's cjson encodes an empty table as {}; a missing field reads as {}.
                let data = serde_json::from_str(&self.data).unwrap_or_else(|_| Value::Object(Map::new()));
                obj.insert("data".into(), data);
                Value::Object(obj).to_string().into()
            })
            .clone()
    }

    /// The event as a WebSocket text payload; cloning it is a reference count.
    pub fn frame(&self) -> axum::extract::ws::Utf8Bytes {
        self.frame
            .get_or_init(|| axum::extract::ws::Utf8Bytes::from(self.json().to_string()))
            .clone()
    }

    pub fn subject(&self, name: &str) -> Option<&str> {
        self.subjects.get(name).map(String::as_str)
    }
}

/// Wakes long-polling claimers of a queue when its state changes anywhere
/// in the cluster (the tailer calls [`Wakers::on_event`]).
#[derive(Default)]
pub struct Wakers {
    map: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Wakers {
    /// The notifier of `queue`; hold it while waiting.
    pub fn get(&self, queue: &str) -> Arc<Notify> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(queue.to_string()).or_default().clone()
    }

    /// Drops the notifier of `queue` when no waiter holds it any more, so
    /// claims on made-up queue names cannot grow the map.
    pub fn release(&self, queue: &str, notify: Arc<Notify>) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        drop(notify);
        if map.get(queue).is_some_and(|n| Arc::strong_count(n) == 1) {
            map.remove(queue);
        }
    }

    /// Wakes the waiters an event may concern: those of its queue, and
    /// everyone when a group slot or a group limit changed (a slot freed by a
    /// task of one queue may let a task of another queue start).
    pub fn on_event(&self, ev: &Event) {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if ev.subject("group").is_some() || ev.kind.starts_with("node.") {
            for n in map.values() {
                n.notify_waiters();
            }
        } else if let Some(n) = ev.subject("queue").and_then(|q| map.get(q)) {
            n.notify_waiters();
        }
    }

    /// Wakes every waiter (the tailer lost events and cannot tell whom).
    pub fn wake_all(&self) {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        for n in map.values() {
            n.notify_waiters();
        }
    }
}

/// Fan-out of events to this node's consumers.
pub struct Bus {
    tx: broadcast::Sender<Arc<Event>>,
    pub wakers: Wakers,
}

impl Bus {
    pub fn new(capacity: usize) -> Arc<Bus> {
        let (tx, _) = broadcast::channel(capacity);
        Arc::new(Bus {
            tx,
            wakers: Wakers::default(),
        })
    }

    /// A receiver of every event from now on. A receiver that falls more than
    /// the channel's capacity behind gets `Lagged` and must resynchronise.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    pub fn publish(&self, ev: Arc<Event>) {
        self.wakers.on_event(&ev);
        let _ = self.tx.send(ev);
    }
}

/// A stream id `<ms>-<seq>`, ordered numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamId(pub u64, pub u64);

impl StreamId {
    /// Parses `<ms>-<seq>` or `<ms>` (seq 0).
    pub fn parse(s: &str) -> Option<StreamId> {
        let (ms, seq) = match s.split_once('-') {
            Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
            None => (s.parse().ok()?, 0),
        };
        Some(StreamId(ms, seq))
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// Which events a subscriber wants: topic patterns (`task.*`, `node.dead`,
/// `*`) and optionally one queue.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    exact: Vec<String>,
    prefixes: Vec<String>,
    all: bool,
    queue: Option<String>,
}

impl Filter {
    /// Parses a comma-separated topic list (empty: everything).
    pub fn parse(topics: Option<&str>, queue: Option<&str>) -> Result<Filter, String> {
        let mut f = Filter {
            queue: queue.map(str::to_string),
            ..Default::default()
        };
        if let Some(q) = queue
            && !crate::validate::is_name(q)
        {
            return Err("`queue` must be 1 to 128 characters from A-Z a-z 0-9 . _ -".into());
        }
        let topics = topics.unwrap_or("").trim();
        if topics.is_empty() {
            f.all = true;
            return Ok(f);
        }
        let parts: Vec<&str> = topics.split(',').map(str::trim).filter(|t| !t.is_empty()).collect();
        if parts.len() > 32 {
            return Err("at most 32 topics".into());
        }
        for t in parts {
            let ok = t.len() <= 64 && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._*-".contains(&b));
            if !ok || t[..t.len().saturating_sub(1)].contains('*') {
                return Err(format!(
                    "bad topic {}: use event types like `task.claimed`, prefixes like `task.*`, or `*`",
                    crate::validate::shorten(t)
                ));
            }
            if t == "*" {
                f.all = true;
            } else if let Some(p) = t.strip_suffix('*') {
                f.prefixes.push(p.to_string());
            } else {
                f.exact.push(t.to_string());
            }
        }
        Ok(f)
    }

    pub fn matches(&self, ev: &Event) -> bool {
        if let Some(q) = &self.queue
            && ev.subject("queue") != Some(q.as_str())
        {
            return false;
        }
        self.all || self.exact.contains(&ev.kind) || self.prefixes.iter().any(|p| ev.kind.starts_with(p.as_str()))
    }
}

/// What the stream still holds.
#[derive(Debug, Clone, Copy)]
pub struct Retained {
    /// The oldest entry still in the stream, if any.
    pub first: Option<StreamId>,
    /// Entries up to this id were deleted with XDEL (trimming does not
    /// move it; see [`Retained::lost_after`]).
    pub max_deleted: StreamId,
    pub length: u64,
    /// Entries ever added (`entries-added`); more than `length` means some
    /// were trimmed.
    pub entries_added: u64,
}

impl Retained {
    /// Whether entries after `since` may have been trimmed or deleted. Redis
    /// does not record the last trimmed id, so a client that read exactly up
    /// to the last trimmed entry is told about a gap it did not have; it is
    /// never told "no gap" when there was one.
    pub fn lost_after(&self, since: StreamId) -> bool {
        let trimmed = self.entries_added > self.length;
        since < self.max_deleted || (trimmed && self.first.is_none_or(|first| since < first))
    }
}

/// Reads `XINFO STREAM` (an absent stream retains nothing and lost nothing).
pub async fn retained(store: &crate::store::Store) -> Result<Retained, crate::store::StoreError> {
    let info: redis::Value = match store
        .query(
            "events_info",
            redis::cmd("XINFO").arg("STREAM").arg(store.keys().events()),
        )
        .await
    {
        Ok(v) => v,
        Err(crate::store::StoreError::Server(m)) if m.contains("no such key") => {
            return Ok(Retained {
                first: None,
                max_deleted: StreamId(0, 0),
                length: 0,
                entries_added: 0,
            });
        }
        Err(e) => return Err(e),
    };
    let mut out = Retained {
        first: None,
        max_deleted: StreamId(0, 0),
        length: 0,
        entries_added: 0,
    };
    let pairs: Vec<(String, redis::Value)> = match info {
        redis::Value::Array(items) => items
            .chunks(2)
            .filter_map(|c| match (&c[0], c.get(1)) {
                (redis::Value::BulkString(k), Some(v)) => Some((String::from_utf8_lossy(k).into_owned(), v.clone())),
                (redis::Value::SimpleString(k), Some(v)) => Some((k.clone(), v.clone())),
                _ => None,
            })
            .collect(),
        redis::Value::Map(items) => items
            .into_iter()
            .filter_map(|(k, v)| match k {
                redis::Value::BulkString(k) => Some((String::from_utf8_lossy(&k).into_owned(), v)),
                redis::Value::SimpleString(k) => Some((k, v)),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    for (k, v) in pairs {
        match (k.as_str(), v) {
            ("length", redis::Value::Int(n)) => out.length = n as u64,
            ("entries-added", redis::Value::Int(n)) => out.entries_added = n as u64,
            ("max-deleted-entry-id", redis::Value::BulkString(b)) => {
                out.max_deleted = StreamId::parse(&String::from_utf8_lossy(&b)).unwrap_or(StreamId(0, 0))
            }
            ("first-entry", redis::Value::Array(entry)) => {
                if let Some(redis::Value::BulkString(id)) = entry.first() {
                    out.first = StreamId::parse(&String::from_utf8_lossy(id));
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Up to `count` entries after `after` (exclusive), oldest first.
pub async fn read_after(
    store: &crate::store::Store,
    after: StreamId,
    count: usize,
) -> Result<Vec<Event>, crate::store::StoreError> {
    let rows: Vec<tailer::Entry> = store
        .query(
            "events_range",
            redis::cmd("XRANGE")
                .arg(store.keys().events())
                .arg(format!("({after}"))
                .arg("+")
                .arg("COUNT")
                .arg(count),
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, fields)| Event::from_fields(id, fields))
        .collect())
}
