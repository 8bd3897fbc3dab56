//! Reading the stream itself: what it retains, resume points, pages after
//! an id, and the replay the HTTP feed and the dashboard serve.

use serde::Serialize;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::{Event, Filter, StreamId, tailer};
use crate::store::{Store, StoreError};

/// How far past both Redis time and the stream's newest id a `since` may
/// be: room for Redis clocks that differ a little across a failover, while
/// a cursor that would hide every event for longer than this is refused.
pub const SINCE_AHEAD_MS: u64 = 5_000;

/// Checks a resume point against the stream: an id later than the newest
/// entry and than Redis time (`now_ms`) by more than [`SINCE_AHEAD_MS`] would
/// make a subscriber skip every new event until Redis time caught up with it.
/// Returns the 400 message.
pub fn check_since(since: StreamId, info: &Retained, now_ms: i64) -> Result<(), String> {
    let newest = info.last.0.max(now_ms.max(0) as u64);
    if since.0 <= newest.saturating_add(SINCE_AHEAD_MS) {
        return Ok(());
    }
    let last = if info.last == StreamId(0, 0) {
        "the stream is empty".to_string()
    } else {
        format!("the newest event is {}", info.last)
    };
    Err(format!(
        "`since` {since} is after every event ({last}) and after Redis time ({now_ms} ms), so no new event \
         would ever reach you; pass the `id` of the last event you received, or leave `since` out to get \
         only new events"
    ))
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
    /// The newest id ever added (`last-generated-id`, which trimming and
    /// deleting do not move); `0-0` for an absent stream.
    pub last: StreamId,
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
pub async fn retained(store: &Store) -> Result<Retained, StoreError> {
    let info: redis::Value = match store
        .query(
            "events_info",
            redis::cmd("XINFO").arg("STREAM").arg(store.keys().events()),
        )
        .await
    {
        Ok(v) => v,
        Err(StoreError::Server(m)) if m.contains("no such key") => {
            return Ok(Retained {
                first: None,
                max_deleted: StreamId(0, 0),
                length: 0,
                entries_added: 0,
                last: StreamId(0, 0),
            });
        }
        Err(e) => return Err(e),
    };
    let mut out = Retained {
        first: None,
        max_deleted: StreamId(0, 0),
        length: 0,
        entries_added: 0,
        last: StreamId(0, 0),
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
            ("last-generated-id", redis::Value::BulkString(b)) => {
                out.last = StreamId::parse(&String::from_utf8_lossy(&b)).unwrap_or(StreamId(0, 0))
            }
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
pub async fn read_after(store: &Store, after: StreamId, count: usize) -> Result<Vec<Event>, StoreError> {
    if after == StreamId::MAX {
        return Ok(Vec::new());
    }
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

#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    /// Matching events, oldest first.
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<Box<RawValue>>,
    /// Pass as `since` to continue (the last entry looked at, matching or not).
    pub next: Option<String>,
    /// True when events after `since` were already trimmed from the stream.
    pub gap: bool,
    /// The oldest event the stream still holds.
    pub oldest: Option<String>,
}

/// Reads matching events after `since` (or the latest ones), scanning at most
/// ten pages of the stream.
pub async fn replay(
    store: &Store,
    since: Option<StreamId>,
    limit: usize,
    filter: &Filter,
    info: Retained,
) -> Result<EventPage, StoreError> {
    let mut events = Vec::new();
    let mut next = since;
    let gap = since.is_some_and(|s| info.lost_after(s));
    let start = match since {
        Some(id) => id,
        None => {
            // The latest `limit` matching events: walk back from the end.
            let rows = read_latest(store, limit * 10).await?;
            let mut evs: Vec<super::Event> = rows
                .into_iter()
                .map(|(id, f)| Event::from_fields(id, f))
                .filter(|e| filter.matches(e))
                .take(limit)
                .collect();
            evs.reverse();
            let next = evs.last().map(|e| e.id.clone());
            let events = evs
                .iter()
                .filter_map(|e| RawValue::from_string(e.json().to_string()).ok())
                .collect();
            return Ok(EventPage {
                events,
                next,
                gap: false,
                oldest: info.first.map(|f| f.to_string()),
            });
        }
    };
    let mut after = start;
    for _ in 0..10 {
        let page = read_after(store, after, limit.max(100)).await?;
        let n = page.len();
        for ev in page {
            if let Some(id) = StreamId::parse(&ev.id) {
                after = id;
                next = Some(id);
            }
            if filter.matches(&ev) {
                if let Ok(raw) = RawValue::from_string(ev.json().to_string()) {
                    events.push(raw);
                }
                if events.len() >= limit {
                    break;
                }
            }
        }
        if events.len() >= limit || n < limit.max(100) {
            break;
        }
    }
    Ok(EventPage {
        events,
        next: next.map(|n| n.to_string()),
        gap,
        oldest: info.first.map(|f| f.to_string()),
    })
}

/// The newest `count` entries, newest first.
pub(super) async fn read_latest(store: &Store, count: usize) -> Result<Vec<tailer::Entry>, StoreError> {
    store
        .query(
            "events_latest",
            redis::cmd("XREVRANGE")
                .arg(store.keys().events())
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(count),
        )
        .await
}
