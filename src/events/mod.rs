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

pub mod tailer;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use tokio::sync::{Notify, broadcast};

/// One event, parsed once and serialized once for every consumer.
#[derive(Debug, Clone)]
pub struct Event {
    /// The stream id, `<ms>-<seq>`.
    pub id: String,
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
            id,
            kind,
            ts,
            node,
            subjects,
            data,
            json: std::sync::OnceLock::new(),
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
