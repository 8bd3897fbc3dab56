//! Reading the streams themselves (one per shard): what they retain, resume
//! points, pages after a cursor, and the replay the HTTP feed and the
//! dashboard serve.

use serde_json::value::RawValue;

use super::{Cursor, Event, Filter, StreamId, tailer};
use crate::store::{Store, StoreError};

/// How far past both Redis time and the stream's newest id a `since` may
/// be: room for Redis clocks that differ a little across a failover, while
/// a cursor that would hide every event for longer than this is refused.
pub(crate) const SINCE_AHEAD_MS: u64 = 5_000;

/// Why a client's `since` was not taken.
#[derive(Debug)]
pub(super) enum SinceError {
    /// Not a cursor of this namespace, or past every stream and Redis time:
    /// the message says which.
    Bad(String),
    Store(StoreError),
}

/// Reads a client's resume point `since` (absent or empty: none): parsed
/// against this namespace's shards, and refused when it lies past every
/// shard's newest event and Redis time ([`check_cursor`]), which would hide
/// every new event from the caller. Answers it with what every shard's
/// stream retains, read for the check (so only when `since` was given; a
/// replay without one reads it itself).
pub(super) async fn read_since(
    store: &Store,
    since: Option<&str>,
) -> Result<Option<(Cursor, Vec<Retained>)>, SinceError> {
    let shards = store.shard_count();
    let since = match since {
        None | Some("") => None,
        Some(s) => Some(Cursor::parse(s, shards).ok_or_else(|| {
            SinceError::Bad(if shards == 1 {
                "`since` must be a stream id such as 1795388490502-0 (the `id` of the last event you saw)".to_string()
            } else {
                format!(
                    "`since` must be the `id` of the last event you saw: {shards} stream ids joined by commas \
                     (one per shard) such as 1795388490502-0,1795388490511-2,..., or one stream id for every shard"
                )
            })
        })?),
    };
    let Some(since) = since else { return Ok(None) };
    let info = retained_all(store).await.map_err(SinceError::Store)?;
    let now = store.time_ms().await.map_err(SinceError::Store)?;
    check_cursor(&since, &info, now).map_err(SinceError::Bad)?;
    Ok(Some((since, info)))
}

/// Checks a resume point against every shard's stream (see [`check_since`]).
pub(super) fn check_cursor(since: &Cursor, info: &[Retained], now_ms: i64) -> Result<(), String> {
    // Measured against the newest event of any shard, which the message names.
    let mut newest = info.first().copied().unwrap_or(Retained {
        first: None,
        max_deleted: StreamId(0, 0),
        length: 0,
        entries_added: 0,
        last: StreamId(0, 0),
    });
    newest.last = info.iter().map(|r| r.last).max().unwrap_or(StreamId(0, 0));
    (0..info.len().max(1)).try_for_each(|shard| check_since(since.get(shard), &newest, now_ms))
}

/// Whether entries after `since` may have been lost in any shard.
pub(super) fn lost_after(since: &Cursor, info: &[Retained]) -> bool {
    info.iter().enumerate().any(|(shard, r)| r.lost_after(since.get(shard)))
}

/// The oldest entry each shard still holds, as a cursor (`0-0` for an
/// empty shard); None when every stream is empty.
pub(super) fn oldest(info: &[Retained]) -> Option<String> {
    if info.iter().all(|r| r.first.is_none()) {
        return None;
    }
    Some(Cursor::from_ids(info.iter().map(|r| r.first.unwrap_or(StreamId(0, 0))).collect()).to_string())
}

/// Checks a resume point against the stream: an id later than the newest
/// entry and than Redis time (`now_ms`) by more than [`SINCE_AHEAD_MS`] would
/// make a subscriber skip every new event until Redis time caught up with it.
/// Returns the 400 message.
pub(crate) fn check_since(since: StreamId, info: &Retained, now_ms: i64) -> Result<(), String> {
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
pub(crate) struct Retained {
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
    pub(crate) fn lost_after(&self, since: StreamId) -> bool {
        let trimmed = self.entries_added > self.length;
        since < self.max_deleted || (trimmed && self.first.is_none_or(|first| since < first))
    }
}

/// What every shard's stream retains, in shard order.
pub(crate) async fn retained_all(store: &Store) -> Result<Vec<Retained>, StoreError> {
    store.fan_out(|s| async move { retained(&s).await }).await
}

/// Reads `XINFO STREAM` of the view's shard (an absent stream retains
/// nothing and lost nothing).
pub(crate) async fn retained(store: &Store) -> Result<Retained, StoreError> {
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
                // The entry's first event (an entry holds the ids of its
                // events up to its own: Event::from_entry).
                if let Some(redis::Value::BulkString(id)) = entry.first() {
                    let events = match entry.get(1) {
                        Some(redis::Value::Array(f)) => f
                            .iter()
                            .step_by(2)
                            .filter(|k| matches!(k, redis::Value::BulkString(k) if k == b"e"))
                            .count(),
                        _ => 0,
                    };
                    let id = StreamId::parse(&String::from_utf8_lossy(id));
                    out.first = id.map(|id| id.first_of(events).unwrap_or(id));
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Up to `count` entries after `after` (exclusive in every shard), oldest
/// first, each with its cursor (split namespaces). The shards' pages are
/// merged by stream id (ties: shard order); what is returned is a prefix of
/// every shard's entries after its position, so no entry is skipped.
pub(crate) async fn read_after(store: &Store, after: &Cursor, count: usize) -> Result<Vec<Event>, StoreError> {
    let n = store.shard_count();
    let pages = store
        .fan_out(|s| {
            let from = after.get(s.shard_index());
            async move { read_shard_after(&s, from, count).await }
        })
        .await?;
    if n == 1 {
        return Ok(pages.into_iter().flatten().collect());
    }
    let mut all: Vec<Event> = pages.into_iter().flatten().collect();
    all.sort_by_key(|e| (e.sid.unwrap_or(StreamId(0, 0)), e.shard));
    all.truncate(count);
    let mut at = after.clone();
    // Every shard named, even one a short cursor left out.
    at.advance(n - 1, at.get(n - 1));
    for ev in &mut all {
        if let Some(id) = ev.sid {
            at.advance(ev.shard, id);
        }
        ev.cursor = Some(at.to_string());
    }
    Ok(all)
}

/// Reads every shard's entries after `at` (moving it along), each shard in
/// its own order, `count` at a time per shard, and hands each entry to
/// `each`, until every shard is read to its end or `max` entries were read.
/// For readers that count events and need no order across shards; a merge
/// ([`read_after`]) would read up to N times what it returns. Returns how
/// many entries were read.
pub(crate) async fn scan_after(
    store: &Store,
    at: &mut Cursor,
    count: usize,
    max: usize,
    mut each: impl FnMut(&Event),
) -> Result<usize, StoreError> {
    let n = store.shard_count();
    let mut done = vec![false; n];
    let mut read = 0;
    while read < max && done.iter().any(|d| !d) {
        for (shard, finished) in done.iter_mut().enumerate() {
            if *finished {
                continue;
            }
            let page = read_shard_after(&store.shard(shard), at.get(shard), count).await?;
            *finished = page.len() < count;
            read += page.len();
            for ev in &page {
                if let Some(id) = ev.sid {
                    at.advance(shard, id);
                }
                each(ev);
            }
        }
    }
    Ok(read)
}

/// Up to `count` entries of one shard's stream after `after`, oldest first.
async fn read_shard_after(store: &Store, after: StreamId, count: usize) -> Result<Vec<Event>, StoreError> {
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
    // `count` entries hold at least `count` events after `after`, unless
    // the stream ends there: a page shorter than `count` still says so.
    let mut events = tailer::entry_events(rows, after, store.shard_index());
    events.truncate(count);
    Ok(events)
}

/// A page of the replay, each event as the JSON text it was built as.
pub(crate) type EventPage = muster_api::events::EventPage<Box<RawValue>>;

/// Reads matching events after `since` (or the latest ones), scanning at most
/// ten pages of the streams.
pub(crate) async fn replay(
    store: &Store,
    since: Option<Cursor>,
    limit: usize,
    filter: &Filter,
    info: &[Retained],
) -> Result<EventPage, StoreError> {
    let mut events = Vec::new();
    let gap = since.as_ref().is_some_and(|s| lost_after(s, info));
    let Some(start) = since else {
        // The latest `limit` matching events: walk back from the end.
        let evs = latest(store, limit * 10).await?;
        let mut evs: Vec<Event> = evs
            .into_iter()
            .rev()
            .filter(|e| filter.matches(e))
            .take(limit)
            .collect();
        evs.reverse();
        let next = evs.last().map(|e| e.resume_id().to_string());
        let events = evs
            .iter()
            .filter_map(|e| RawValue::from_string(e.json().to_string()).ok())
            .collect();
        return Ok(EventPage {
            events,
            next,
            gap: false,
            oldest: oldest(info),
        });
    };
    let mut next = start.to_string();
    let mut after = start;
    for _ in 0..10 {
        let page = read_after(store, &after, limit.max(100)).await?;
        let n = page.len();
        for ev in page {
            if let Some(id) = ev.sid {
                after.advance(ev.shard, id);
            }
            next = ev.resume_id().to_string();
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
        next: Some(next),
        gap,
        oldest: oldest(info),
    })
}

/// Up to `count` of the newest entries, oldest first, each with its
/// cursor. With several shards: the newest `count` of each shard merged by
/// stream id, cut after the oldest entry of any shard that had more (so
/// every event's cursor has read each shard up to an id it saw, or the
/// shard's whole stream).
pub(super) async fn latest(store: &Store, count: usize) -> Result<Vec<Event>, StoreError> {
    let n = store.shard_count();
    let pages = store
        .fan_out(|s| async move {
            let mut rows = tailer::read_latest(&s, count).await?;
            rows.reverse();
            // The newest `count` events of the newest `count` entries.
            let mut evs = tailer::entry_events(rows, StreamId(0, 0), s.shard_index());
            evs.drain(..evs.len().saturating_sub(count));
            Ok::<_, StoreError>(evs)
        })
        .await?;
    if n == 1 {
        return Ok(pages.into_iter().flatten().collect());
    }
    // Entries at or before the oldest one read of a shard that has older
    // ones are dropped: their cursors would not know that shard's position.
    let floor = pages
        .iter()
        .filter(|p| p.len() >= count)
        .filter_map(|p| p.first().and_then(|e| e.sid))
        .max();
    // Each shard starts just before its oldest entry read.
    let mut at = Cursor::from_ids(
        pages
            .iter()
            .map(|p| p.first().and_then(|e| e.sid).map_or(StreamId(0, 0), before))
            .collect(),
    );
    let mut all: Vec<Event> = pages.into_iter().flatten().collect();
    all.sort_by_key(|e| (e.sid.unwrap_or(StreamId(0, 0)), e.shard));
    let mut out = Vec::with_capacity(all.len());
    for mut ev in all {
        if let Some(id) = ev.sid {
            at.advance(ev.shard, id);
            if floor.is_some_and(|f| id <= f) {
                continue;
            }
        }
        ev.cursor = Some(at.to_string());
        out.push(ev);
    }
    Ok(out)
}

/// The stream id just before `id`.
fn before(id: StreamId) -> StreamId {
    match id {
        StreamId(0, 0) => id,
        StreamId(ms, 0) => StreamId(ms - 1, u64::MAX),
        StreamId(ms, seq) => StreamId(ms, seq - 1),
    }
}
