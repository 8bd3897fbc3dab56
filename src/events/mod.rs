//! The cluster event stream (`{prefix}:events`, one per shard) as seen by
//! this node.
//!
//! Invariants:
//! - Events are written only by state-change scripts, in the same atomic
//!   step as the change (the outbox, G9); nothing here writes to the stream.
//! - One tailer per node and shard reads the shard's stream with `XREAD
//!   BLOCK` from the last id it delivered; after a Redis error it reconnects
//!   with backoff and resumes from that id, so a blip leaves no gap.
//! - An event's `id` is a [`Cursor`]: the position in every shard's stream
//!   once this event is read (one stream id for one shard), so resuming
//!   from it continues every shard with no hole and no duplicate. The
//!   registry's events, written to every shard (`nodes`), are delivered
//!   from shard 0's stream alone ([`Event::mirrored`]).
//! - Local consumers (claim wake-ups, WebSocket clients, caches) receive each
//!   event through bounded channels and can never slow the tailer down.

mod cursor;
pub(crate) mod live;
pub(crate) mod routes;
pub(crate) mod slots;
mod stream;
pub(crate) mod tailer;
mod wakers;
pub(crate) mod ws;

pub(crate) use cursor::Cursor;
pub(crate) use stream::{EventPage, read_after, replay, retained_all, scan_after};
#[cfg(test)]
use stream::{Retained, SINCE_AHEAD_MS, check_since};
pub(crate) use wakers::{QueueWaiter, Wakers};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use tokio::sync::broadcast;

/// Every event type the Lua scripts emit, by subject: the one list that topic
/// filters are checked against (a unit test reads every script under
/// `src/*/lua/` and fails if one emits a type missing here, or if one listed
/// here is emitted nowhere).
pub(crate) const EVENT_TYPES: &[&str] = &[
    "node.joined",
    "node.left",
    "node.dead",
    "node.draining",
    "liveness.stalled",
    "task.enqueued",
    "task.claimed",
    "task.progress",
    "task.succeeded",
    "task.failed",
    "task.retrying",
    "task.requeued",
    "task.dead",
    "task.cancelled",
    "task.cancel_requested",
    "task.deleted",
    "queue.paused",
    "queue.resumed",
    "group.updated",
    "limit.updated",
    "limit.deleted",
    "queue.limits",
    "orphan.recovered",
    "workflow.started",
    "workflow.succeeded",
    "workflow.failed",
    "workflow.cancelled",
    "schedule.created",
    "schedule.updated",
    "schedule.deleted",
    "schedule.enabled",
    "schedule.disabled",
    "schedule.fired",
    "schedule.skipped",
    "schedule.missed",
    "barrier.configured",
    "barrier.deleted",
    "barrier.round_opened",
    "barrier.arrived",
    "barrier.released",
    "barrier.aborted",
    "barrier.late",
    "barrier.held",
    "barrier.lifted",
    "dbarrier.entered",
    "dbarrier.ready",
    "dbarrier.left",
    "dbarrier.evicted",
    "dbarrier.reset",
    "lock.acquired",
    "lock.released",
    "lock.expired",
    "lock.waiter_left",
    "election.elected",
    "election.resigned",
    "election.expired",
    "redis.failover",
];

/// The subjects of [`EVENT_TYPES`] as topic prefixes (`task.*`), in order.
pub(crate) fn topic_prefixes() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for t in EVENT_TYPES {
        let p = format!("{}.*", t.split('.').next().unwrap_or(t));
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// One event, parsed once and serialized once for every consumer.
#[derive(Debug, Clone)]
pub struct Event {
    /// The stream id, `<ms>-<seq>`, in its shard's stream.
    pub id: String,
    /// The same, parsed (for ordering within the shard).
    pub sid: Option<StreamId>,
    /// The shard whose stream holds it.
    pub shard: usize,
    /// A split namespace: the position in every shard once this event is
    /// read, which clients see as its `id` (None: the stream id is it).
    pub cursor: Option<String>,
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
    /// Builds an event from a stream entry's fields: the one field `e` the
    /// scripts write (lines: type, node, `subject=id` per subject, with `t`,
    /// `q`, `g` and `w` for task, queue, group and workflow, then the data;
    /// see `emit` in `store/lua/prelude.lua`), or the fields `type`,
    /// `node`, `data` and one per subject of entries written before it.
    pub fn from_fields(id: String, fields: Vec<(String, String)>) -> Event {
        let mut kind = String::new();
        // The stream id's millisecond part is the Redis time of the event.
        let ts = id.split('-').next().and_then(|ms| ms.parse().ok()).unwrap_or(0);
        let mut node = String::new();
        let mut data = String::new();
        let mut subjects = BTreeMap::new();
        for (k, v) in fields {
            match k.as_str() {
                "e" => {
                    let mut lines = v.splitn(3, '\n');
                    kind = lines.next().unwrap_or_default().to_string();
                    node = lines.next().unwrap_or_default().to_string();
                    let mut rest = lines.next().unwrap_or_default();
                    // Subject lines until the data, which starts with `{`.
                    while !rest.is_empty() && !rest.starts_with('{') {
                        let (line, after) = rest.split_once('\n').unwrap_or((rest, ""));
                        if let Some((name, value)) = line.split_once('=') {
                            // The one-letter names of the common subjects
                            // (EVENT_SUBJECTS in prelude.lua).
                            let name = match name {
                                "t" => "task",
                                "q" => "queue",
                                "g" => "group",
                                "w" => "workflow",
                                other => other,
                            };
                            subjects.insert(name.to_string(), value.to_string());
                        }
                        rest = after;
                    }
                    data = rest.to_string();
                }
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
            shard: 0,
            cursor: None,
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

    /// The events of one stream entry: one per field `e`. A script call
    /// writes its events in entries of several (`events_flush` in
    /// `store/lua/prelude.lua`): an entry `<ms>-<s>` of n events holds the
    /// ids `<ms>-<s - n + 1>` to `<ms>-<s>`, in order, so every event has a
    /// stream id of its own and the entry's id is its last event's. An entry
    /// of one event, or of the fields older versions wrote, is one event.
    pub fn from_entry(id: String, fields: Vec<(String, String)>) -> Vec<Event> {
        let n = fields.iter().filter(|(k, _)| k == "e").count();
        // (An id too small for its events is no entry muster wrote: read as one.)
        let Some(StreamId(ms, first)) = StreamId::parse(&id).and_then(|sid| sid.first_of(n)).filter(|_| n > 1) else {
            return vec![Event::from_fields(id, fields)];
        };
        fields
            .into_iter()
            .filter(|(k, _)| k == "e")
            .zip(first..)
            .map(|(field, seq)| Event::from_fields(format!("{ms}-{seq}"), vec![field]))
            .collect()
    }

    /// The same event, read from `shard`'s stream.
    pub fn in_shard(mut self, shard: usize) -> Event {
        self.shard = shard;
        self
    }

    /// A copy of an event every shard writes (the registry's, see `nodes`)
    /// read from a shard other than 0: delivered once, from shard 0. Not
    /// `node.dead`: each shard judges liveness on its own, and a node dead
    /// in one shard only (its heartbeats failed there) has its tasks there
    /// recovered, which its subscribers must hear of; a node dead
    /// everywhere is told once per shard (each with that shard's
    /// `expired_at`).
    pub fn mirrored(&self) -> bool {
        self.shard != 0 && self.kind.starts_with("node.") && self.kind != "node.dead"
    }

    /// What a client resumes from: the cursor, or for one shard the id.
    pub fn resume_id(&self) -> &str {
        self.cursor.as_deref().unwrap_or(&self.id)
    }

    /// The event as JSON: `{"id", "type", "ts", "node", <subjects>, "data"}`.
    pub fn json(&self) -> Arc<str> {
        self.json
            .get_or_init(|| {
                let mut obj = Map::new();
                obj.insert("id".into(), Value::String(self.resume_id().to_string()));
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

/// Fan-out of events to this node's consumers.
pub struct Bus {
    tx: broadcast::Sender<Arc<Event>>,
    pub wakers: Wakers,
    /// How many shards (streams) the tailers read.
    shards: usize,
    /// The position up to which the tailers have published (moved before
    /// each send): a receiver subscribed before reading it gets every event
    /// after it.
    mark: Mutex<Option<Cursor>>,
    /// Split namespaces: the shards events showed each queue in since the
    /// task service last took them (a bit per shard), so its claims look
    /// there at once (see `tasks::shards`). Bounded: cleared past
    /// [`MAX_SEEN_QUEUES`] (the task service's own reads catch up).
    seen: Mutex<std::collections::HashMap<String, u64>>,
}

/// The most queues [`Bus::take_seen_queues`] holds between two takes.
const MAX_SEEN_QUEUES: usize = 10_000;

impl Bus {
    /// A bus for the events of `shards` streams.
    pub fn new(capacity: usize, shards: usize) -> Arc<Bus> {
        let (tx, _) = broadcast::channel(capacity);
        Arc::new(Bus {
            tx,
            wakers: Wakers::default(),
            shards: shards.max(1),
            mark: Mutex::new(None),
            seen: Mutex::new(Default::default()),
        })
    }

    /// How many shards (streams) the events come from.
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// A receiver of every event from now on. A receiver that falls more than
    /// the channel's capacity behind gets `Lagged` and must resynchronise.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// Publishes the events of one read of a shard's stream, in order. A
    /// task that became claimable (enqueued, requeued) and was claimed later
    /// in the same read wakes no waiting claim: the waiter would claim for
    /// nothing (the task went to a complete's `next` or another claim). Its
    /// event still reaches every subscriber; a wake-up for anything else it
    /// says (a group slot freed) is unchanged.
    pub fn publish_read(&self, events: Vec<Event>) {
        // Each task's last claim in the read (empty, unallocated, without one).
        let mut last_claim = std::collections::HashMap::new();
        for (i, ev) in events.iter().enumerate() {
            if ev.kind == "task.claimed"
                && let Some(t) = ev.subject("task")
            {
                last_claim.insert(t, i);
            }
        }
        let claimed_later: Vec<bool> = events
            .iter()
            .enumerate()
            .map(|(i, ev)| {
                ev.subject("task")
                    .and_then(|t| last_claim.get(t))
                    .is_some_and(|&j| j > i)
            })
            .collect();
        drop(last_claim);
        for (ev, claimed) in events.into_iter().zip(claimed_later) {
            self.publish_one(ev, claimed);
        }
    }

    /// Publishes one event. With several shards the event is given the
    /// cursor it moves the mark to, and sent while the mark is held, so the
    /// cursors on the channel only grow.
    fn publish_one(&self, mut ev: Event, claimed_later: bool) {
        let mut m = self.mark.lock().unwrap_or_else(|p| p.into_inner());
        let mark = m.get_or_insert_with(|| Cursor::at(self.shards, StreamId(0, 0)));
        if let Some(id) = ev.sid {
            mark.advance(ev.shard, id);
        }
        if self.shards > 1 {
            ev.cursor = Some(mark.to_string());
            if let Some(q) = ev.subject("queue").filter(|_| !ev.mirrored()) {
                let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
                if seen.len() >= MAX_SEEN_QUEUES {
                    seen.clear();
                }
                *seen.entry(q.to_string()).or_default() |= 1 << (ev.shard % 64);
            }
        }
        let ev = Arc::new(ev);
        self.wakers.on_event(&ev, claimed_later);
        let _ = self.tx.send(ev);
    }

    /// The shards events showed each queue in since the last take.
    pub fn take_seen_queues(&self) -> std::collections::HashMap<String, u64> {
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Records that the tailers start after `at` (nothing up to it will be
    /// published).
    pub fn set_mark(&self, at: &Cursor) {
        let mut m = self.mark.lock().unwrap_or_else(|p| p.into_inner());
        m.get_or_insert_with(|| Cursor::at(self.shards, StreamId(0, 0)))
            .merge(at);
    }

    /// The position up to which events were published (None before the
    /// tailers started).
    pub fn mark(&self) -> Option<Cursor> {
        self.mark.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A stream id `<ms>-<seq>`, ordered numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamId(pub u64, pub u64);

impl StreamId {
    /// The largest id; nothing comes after it (Redis refuses `(` with it in XRANGE).
    pub const MAX: StreamId = StreamId(u64::MAX, u64::MAX);

    /// Parses `<ms>-<seq>` or `<ms>` (seq 0).
    pub fn parse(s: &str) -> Option<StreamId> {
        let (ms, seq) = match s.split_once('-') {
            Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
            None => (s.parse().ok()?, 0),
        };
        Some(StreamId(ms, seq))
    }

    /// The id of the first of the `n` events of the stream entry with this
    /// id ([`Event::from_entry`]); None for an id too small to hold them.
    pub fn first_of(self, n: usize) -> Option<StreamId> {
        let back = (n as u64).saturating_sub(1);
        self.1.checked_sub(back).map(|seq| StreamId(self.0, seq))
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
pub(crate) struct Filter {
    exact: Vec<String>,
    prefixes: Vec<String>,
    all: bool,
    queue: Option<String>,
}

impl Filter {
    /// Parses a comma-separated topic list (empty: everything).
    pub(crate) fn parse(topics: Option<&str>, queue: Option<&str>) -> Result<Filter, String> {
        let mut f = Filter {
            queue: queue.map(str::to_string),
            ..Default::default()
        };
        if let Some(q) = queue
            && !crate::validate::is_name(q)
        {
            return Err("`queue` must be 1 to 128 characters from A-Z a-z 0-9 . _ -".into());
        }
        // Parts are trimmed of spaces only: the document's pattern says so.
        let topics = topics.unwrap_or("").trim_matches(' ');
        if topics.is_empty() {
            f.all = true;
            return Ok(f);
        }
        let parts: Vec<&str> = topics.split(',').map(|t| t.trim_matches(' ')).collect();
        if parts.len() > crate::validate::TOPICS_MAX {
            return Err(format!("at most {} topics", crate::validate::TOPICS_MAX));
        }
        for t in parts.into_iter().filter(|t| !t.is_empty()) {
            let ok = t.len() <= crate::validate::TOPIC_MAX_LEN
                && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._*-".contains(&b));
            if !ok || t[..t.len().saturating_sub(1)].contains('*') {
                return Err(format!(
                    "bad topic {}: use event types like `task.claimed`, prefixes like `task.*`, or `*`",
                    crate::validate::shorten(t)
                ));
            }
            if t == "*" {
                f.all = true;
            } else if let Some(p) = t.strip_suffix('*') {
                if !EVENT_TYPES.iter().any(|k| k.starts_with(p)) {
                    return Err(unknown_topic(t, &format!("no event type starts with `{p}`")));
                }
                f.prefixes.push(p.to_string());
            } else {
                if !EVENT_TYPES.contains(&t) {
                    return Err(unknown_topic(t, "no event has this type"));
                }
                f.exact.push(t.to_string());
            }
        }
        Ok(f)
    }

    pub(crate) fn matches(&self, ev: &Event) -> bool {
        if ev.mirrored() {
            return false;
        }
        if let Some(q) = &self.queue
            && ev.subject("queue") != Some(q.as_str())
        {
            return false;
        }
        self.all || self.exact.contains(&ev.kind) || self.prefixes.iter().any(|p| ev.kind.starts_with(p.as_str()))
    }
}

/// The 400 message for a topic that can never match: it names the topic and
/// lists the valid prefixes.
fn unknown_topic(topic: &str, why: &str) -> String {
    format!(
        "unknown topic {}: {why}; use `*`, an event type such as `task.claimed`, or a prefix: {}",
        crate::validate::shorten(topic),
        topic_prefixes().join(", ")
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;

    /// The identifier at the start of `s` (Lua names).
    fn ident(s: &str) -> &str {
        let end = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        &s[..end]
    }

    /// Every string literal assigned to `name` in `code` (`name = '...'`).
    fn assigned(code: &str, name: &str) -> Vec<String> {
        let pat = format!("{name} = '");
        let mut out = Vec::new();
        let mut from = 0;
        while let Some(i) = code[from..].find(&pat) {
            let at = from + i;
            from = at + pat.len();
            let before = code[..at].chars().last();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(end) = code[from..].find('\'') {
                out.push(code[from..from + end].to_string());
            }
        }
        out
    }

    /// The event types one Lua file emits: the first argument of each
    /// `emit(` / `emit_task(` call, a literal, a literal prefix joined to a
    /// variable (`'barrier.' .. verdict`), or a variable, resolved through the
    /// literals assigned to it in the same file. The pass-through inside the
    /// `emit_task` helper is skipped: its callers are checked.
    fn emitted(file: &Path, code: &str) -> BTreeSet<String> {
        let code: String = code
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut out = BTreeSet::new();
        for call in ["emit(", "emit_now(", "emit_task("] {
            let mut from = 0;
            while let Some(i) = code[from..].find(call) {
                let at = from + i;
                from = at + call.len();
                let before = code[..at].chars().last();
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') || code[..at].ends_with("function ") {
                    continue;
                }
                let arg = code[from..].split(',').next().unwrap_or("").trim();
                if arg.starts_with("...)") {
                    continue; // emit_now's pass-through: its callers are checked
                }
                let whence = format!("{}: {call}{arg}", file.display());
                if let Some(rest) = arg.strip_prefix('\'') {
                    let (lit, tail) = rest.split_once('\'').expect(&whence);
                    let tail = tail.trim();
                    if tail.is_empty() {
                        out.insert(lit.to_string());
                    } else {
                        let var = ident(tail.strip_prefix("..").expect(&whence).trim());
                        let values = assigned(&code, var);
                        assert!(!values.is_empty(), "{whence}: no literal assigned to `{var}`");
                        out.extend(values.iter().map(|v| format!("{lit}{v}")));
                    }
                } else {
                    let var = ident(arg);
                    assert_eq!(var, arg, "{whence}: cannot tell which event type this emits");
                    if code.contains(&format!("function emit_task({var},")) && var == "etype" {
                        continue;
                    }
                    let values = assigned(&code, var);
                    assert!(!values.is_empty(), "{whence}: no literal assigned to `{var}`");
                    out.extend(values);
                }
            }
        }
        out
    }

    #[test]
    fn event_types_are_exactly_those_the_lua_scripts_emit() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = BTreeSet::new();
        let mut files = 0;
        for dir in std::fs::read_dir(&src).unwrap() {
            let lua = dir.unwrap().path().join("lua");
            let Ok(entries) = std::fs::read_dir(&lua) else { continue };
            for e in entries {
                let path = e.unwrap().path();
                if path.extension().is_some_and(|x| x == "lua") {
                    files += 1;
                    found.extend(emitted(&path, &std::fs::read_to_string(&path).unwrap()));
                }
            }
        }
        assert!(files > 20, "read only {files} Lua files under {}", src.display());
        let listed: BTreeSet<String> = EVENT_TYPES.iter().map(|t| t.to_string()).collect();
        let missing: Vec<_> = found.difference(&listed).collect();
        assert!(
            missing.is_empty(),
            "emitted by a Lua script but not in EVENT_TYPES: {missing:?}"
        );
        let stale: Vec<_> = listed.difference(&found).collect();
        assert!(
            stale.is_empty(),
            "in EVENT_TYPES but emitted by no Lua script: {stale:?}"
        );
        assert_eq!(listed.len(), EVENT_TYPES.len(), "EVENT_TYPES has a duplicate");
    }

    #[test]
    fn an_entry_of_several_events_numbers_them_up_to_its_own_id() {
        let e = |n: &str| ("e".to_string(), format!("task.enqueued\nvm-a\nt={n}\nq=q\n{{}}"));
        let evs = Event::from_entry("1700000000123-9".into(), vec![e("A"), e("B"), e("C")]);
        let ids: Vec<&str> = evs.iter().map(|ev| ev.id.as_str()).collect();
        assert_eq!(ids, ["1700000000123-7", "1700000000123-8", "1700000000123-9"]);
        let tasks: Vec<_> = evs.iter().map(|ev| ev.subjects["task"].as_str()).collect();
        assert_eq!(tasks, ["A", "B", "C"]);
        assert!(evs.iter().all(|ev| ev.ts == 1_700_000_000_123));
        assert_eq!(StreamId(5, 9).first_of(3), Some(StreamId(5, 7)));
        assert_eq!(StreamId(5, 1).first_of(3), None);
        // One event, and an id too small for its events (no entry muster
        // wrote): one event each, with the entry's id.
        assert_eq!(Event::from_entry("5-0".into(), vec![e("A")]).len(), 1);
        let odd = Event::from_entry("5-1".into(), vec![e("A"), e("B"), e("C")]);
        assert_eq!((odd.len(), odd[0].id.as_str()), (1, "5-1"));
    }

    #[test]
    fn an_entry_parses_in_the_one_field_form_and_the_old_one() {
        let f = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let one = Event::from_fields(
            "1700000000123-4".into(),
            f(&[(
                "e",
                "task.claimed\nvm-a\nt=T1\nq=q.1\n{\"attempt\":1,\"note\":\"a\\nb\"}",
            )]),
        );
        let old = Event::from_fields(
            "1700000000123-4".into(),
            f(&[
                ("type", "task.claimed"),
                ("node", "vm-a"),
                ("data", "{\"attempt\":1,\"note\":\"a\\nb\"}"),
                ("task", "T1"),
                ("queue", "q.1"),
            ]),
        );
        for ev in [&one, &old] {
            assert_eq!(ev.kind, "task.claimed");
            assert_eq!(ev.node, "vm-a");
            assert_eq!(ev.ts, 1_700_000_000_123);
            assert_eq!(ev.subject("task"), Some("T1"));
            assert_eq!(ev.subject("queue"), Some("q.1"));
            assert_eq!(ev.subjects.len(), 2);
            assert_eq!(ev.data, "{\"attempt\":1,\"note\":\"a\\nb\"}");
        }
        assert_eq!(one.json(), old.json());
        // No subjects, no node, data with a newline inside a string (JSON text
        // from a hand-built script value is still taken whole: it is last).
        let bare = Event::from_fields("5-0".into(), f(&[("e", "node.left\n\n{\"a\":\"x\ny\"}")]));
        assert_eq!((bare.kind.as_str(), bare.node.as_str()), ("node.left", ""));
        assert!(bare.subjects.is_empty());
        assert_eq!(bare.data, "{\"a\":\"x\ny\"}");
        // The one-letter subjects, and others under their own names.
        let mixed = Event::from_fields("6-0".into(), f(&[("e", "x.y\nn\ng=G\nw=W\nbarrier=B\nround=R\n{}")]));
        let names: Vec<_> = mixed.subjects.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(names, ["barrier=B", "group=G", "round=R", "workflow=W"]);
        // Malformed entries parse to something, never panic.
        for e in ["", "x", "x\n", "x\ny\nno-equals\n", "x\ny\nk=v"] {
            let ev = Event::from_fields("1-0".into(), f(&[("e", e)]));
            let _ = ev.json();
        }
    }

    #[test]
    fn topics_must_name_known_event_types() {
        for ok in [
            "*",
            "task.*",
            "task.claimed",
            "t*",
            "node.dead,barrier.*",
            "dbarrier.*",
            "redis.failover",
            "liveness.*",
        ] {
            assert!(Filter::parse(Some(ok), None).is_ok(), "{ok}");
        }
        for bad in ["nope.*", "task.bogus", "task.claimed,nope", "tasks.*", "x*"] {
            let e = Filter::parse(Some(bad), None).unwrap_err();
            assert!(
                e.contains("unknown topic") && e.contains("task.*") && e.contains("schedule.*"),
                "{bad}: {e}"
            );
        }
        let e = Filter::parse(Some("task.claimed,nope.*"), None).unwrap_err();
        assert!(e.contains("\"nope.*\""), "names the unknown topic: {e}");
        assert_eq!(topic_prefixes().len(), 14);
    }

    #[test]
    fn since_may_not_lie_past_the_stream_and_redis_time() {
        let info = |last| Retained {
            first: None,
            max_deleted: StreamId(0, 0),
            length: 0,
            entries_added: 0,
            last,
        };
        let now = 1_800_000_000_000i64;
        let tail = info(StreamId(now as u64 - 60_000, 3));
        assert!(check_since(StreamId(0, 0), &tail, now).is_ok());
        assert!(check_since(StreamId(now as u64 - 60_000, 3), &tail, now).is_ok());
        assert!(
            check_since(StreamId(now as u64, 7), &tail, now).is_ok(),
            "not ahead of Redis time"
        );
        assert!(check_since(StreamId(now as u64 + SINCE_AHEAD_MS, 0), &tail, now).is_ok());
        let e = check_since(StreamId(now as u64 + SINCE_AHEAD_MS + 1, 0), &tail, now).unwrap_err();
        assert!(
            e.contains("`since`") && e.contains(&format!("{}-3", now - 60_000)),
            "{e}"
        );
        assert!(check_since(StreamId(99_999_999_999_999, 0), &tail, now).is_err());
        assert!(check_since(StreamId::MAX, &tail, now).is_err());
        let e = check_since(StreamId::MAX, &info(StreamId(0, 0)), now).unwrap_err();
        assert!(e.contains("the stream is empty"), "{e}");
        // A Redis clock behind the newest id (after a failover): the id counts.
        let ahead = info(StreamId(now as u64 + 60_000, 0));
        assert!(check_since(StreamId(now as u64 + 61_000, 0), &ahead, now).is_ok());
    }

    /// An event as a script writes it (the one-field form).
    fn entry(seq: u64, kind: &str, task: &str, data: &str) -> Event {
        let e = format!("{kind}\nvm-a\nt={task}\nq=q\n{data}");
        Event::from_fields(format!("1700000000000-{seq}"), vec![("e".into(), e)])
    }

    /// How many wake-ups the queue's waiters got: `waiting` claims wait,
    /// each armed before the read is published.
    fn wakeups(bus: &Bus, waiting: usize, read: Vec<Event>) -> usize {
        use std::future::Future;
        let waiters: Vec<_> = (0..waiting).map(|_| bus.wakers.wait("q")).collect();
        let mut armed: Vec<_> = waiters.iter().map(|w| Box::pin(w.notified())).collect();
        for n in &mut armed {
            n.as_mut().enable();
        }
        bus.publish_read(read);
        let waker = futures_util::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        armed
            .iter_mut()
            .map(|n| n.as_mut().poll(&mut cx).is_ready())
            .filter(|&ready| ready)
            .count()
    }

    #[test]
    fn a_task_claimed_later_in_the_same_read_wakes_no_waiting_claim() {
        let bus = Bus::new(64, 1);
        let queued = r#"{"state":"queued"}"#;
        let claimed = r#"{"attempt":1,"token":5}"#;
        // Enqueued and claimed in the same read (by a complete's `next`):
        // nobody is woken to claim it again.
        let read = vec![
            entry(1, "task.enqueued", "T1", queued),
            entry(2, "task.claimed", "T1", claimed),
        ];
        assert_eq!(wakeups(&bus, 2, read), 0);
        // Two enqueued, one of them claimed after: one wake-up, for the other.
        let read = vec![
            entry(3, "task.enqueued", "T2", queued),
            entry(4, "task.enqueued", "T3", queued),
            entry(5, "task.claimed", "T2", claimed),
        ];
        assert_eq!(wakeups(&bus, 2, read), 1);
        // Claimed before it was requeued: the requeue wakes one.
        let read = vec![
            entry(6, "task.claimed", "T4", claimed),
            entry(7, "task.requeued", "T4", r#"{"attempt":1}"#),
        ];
        assert_eq!(wakeups(&bus, 2, read), 1);
        // Apart, in two reads: the enqueue wakes one (the claim came later).
        assert_eq!(wakeups(&bus, 2, vec![entry(8, "task.enqueued", "T5", queued)]), 1);
        assert_eq!(wakeups(&bus, 2, vec![entry(9, "task.claimed", "T5", claimed)]), 0);
    }
}
