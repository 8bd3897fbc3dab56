//! Outcome history for the dashboard's charts: tasks succeeded, failed and
//! dead per minute (the last two hours) and per day (the last 32 days), per
//! queue and for all queues, with each queue's depth and latency sampled
//! every flush.
//!
//! Every node's tailer reads every event, so every node counts every
//! outcome, from the events themselves (their stream id is Redis time): the
//! task scripts do no extra work, and the history costs Redis one script
//! call per node per [`FLUSH_EVERY`] in which something changed. Each node
//! keeps the last few minutes in memory and merges those that grew into
//! Redis with `lua/flush.lua`, which keeps the larger value of each field:
//! nodes never add up each other's counts, and a node that saw the whole
//! minute wins over one that joined halfway. A day grows by what its
//! minutes grew, in the same script.
//!
//! Bounds: at most 120 minute keys (TTL [`MINUTE_TTL_MS`]) and 32 day keys
//! (TTL [`DAY_TTL_MS`]), each with at most 5 fields per queue
//! (`tasks.max_queues`) plus 5 for all queues; an idle cluster writes none.
//!
//! A node that falls behind its own event bus (the receiver lags) reads what
//! it skipped from the stream ([`Stats::recount`]); an event is counted only
//! if its id is past the last one counted, so nothing counts twice. Limits:
//! events trimmed from the stream before the node read them again are not
//! counted (another node that did not lag still counts them, and the larger
//! count wins); a recount reads at most [`RECOUNT_MAX`] events.

pub(crate) mod routes;
pub(crate) mod scripts;
pub(crate) mod worker;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::events::{Cursor, Event};
use crate::store::{Lua, ScriptCtx, Store, StoreResult};

/// How often a node merges what it counted into Redis.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(5);
/// A minute's counters live two hours: the hour chart plus slack.
pub(crate) const MINUTE_TTL_MS: u64 = 2 * 3_600_000;
/// A day's counters live 32 days: the month chart plus slack.
pub(crate) const DAY_TTL_MS: u64 = 32 * 86_400_000;
/// Minutes a node keeps in memory (older events are not counted).
const KEEP_MINUTES: i64 = 5;
/// At most this many events are read again after the bus lagged.
pub(crate) const RECOUNT_MAX: usize = 200_000;
/// The field name for all queues together (`*` is never a queue name).
pub(crate) const ALL: &str = "*";

const MINUTE_MS: i64 = 60_000;
const DAY_MS: i64 = 86_400_000;

/// One queue's numbers in one minute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cell {
    pub succeeded: u64,
    pub failed: u64,
    pub dead: u64,
    pub queued: u64,
    pub latency_ms: u64,
}

impl Cell {
    /// Field suffixes, in the order of [`Cell::values`].
    const SUFFIXES: [&'static str; 5] = ["s", "f", "d", "q", "l"];

    fn values(&self) -> [u64; 5] {
        [self.succeeded, self.failed, self.dead, self.queued, self.latency_ms]
    }

    fn from_values(v: [u64; 5]) -> Cell {
        Cell {
            succeeded: v[0],
            failed: v[1],
            dead: v[2],
            queued: v[3],
            latency_ms: v[4],
        }
    }

    /// The larger of each field.
    fn max(self, o: Cell) -> Cell {
        let (a, b) = (self.values(), o.values());
        Cell::from_values(std::array::from_fn(|i| a[i].max(b[i])))
    }
}

/// The minutes this node counted, and what of them it already merged.
#[derive(Debug, Default)]
struct Recent {
    minutes: BTreeMap<i64, BTreeMap<String, Cell>>,
    flushed: BTreeMap<i64, BTreeMap<String, Cell>>,
    /// The newest event counted: older ones (a bus that delivers what a
    /// recount already read) are skipped.
    counted_upto: Option<Cursor>,
}

impl Recent {
    fn cell(&mut self, minute: i64, queue: &str) -> Option<&mut Cell> {
        if let Some((&newest, _)) = self.minutes.last_key_value()
            && minute <= newest - KEEP_MINUTES
        {
            return None;
        }
        Some(
            self.minutes
                .entry(minute)
                .or_default()
                .entry(queue.to_string())
                .or_default(),
        )
    }

    fn count(&mut self, ev: &Event) {
        if let Some(id) = ev.sid {
            match &mut self.counted_upto {
                Some(upto) if upto.covers(ev.shard, id) => return,
                Some(upto) => upto.advance(ev.shard, id),
                // The first: every shard where this event's cursor has it
                // (the shards' positions when it was published).
                None => {
                    let mut upto = ev
                        .cursor
                        .as_deref()
                        .and_then(|c| Cursor::parse(c, c.split(',').count()))
                        .unwrap_or_default();
                    upto.advance(ev.shard, id);
                    self.counted_upto = Some(upto);
                }
            }
        }
        let field: fn(&mut Cell) -> &mut u64 = match ev.kind.as_str() {
            "task.succeeded" => |c| &mut c.succeeded,
            "task.failed" => |c| &mut c.failed,
            "task.dead" => |c| &mut c.dead,
            _ => return,
        };
        let minute = ev.ts.div_euclid(MINUTE_MS);
        for q in [ev.subject("queue").unwrap_or(""), ALL] {
            if let Some(c) = self.cell(minute, q) {
                *field(c) += 1;
            }
        }
    }

    /// Records each queue's depth and latency at `now_ms` (the larger of
    /// this and earlier samples in the minute); `*` gets the total depth
    /// and the largest latency.
    fn sample(&mut self, now_ms: i64, queues: &[(String, u64, u64)]) {
        let minute = now_ms.div_euclid(MINUTE_MS);
        let (mut depth, mut latency) = (0, 0);
        for (q, queued, lat) in queues {
            depth += queued;
            latency = latency.max(*lat);
            if (*queued > 0 || *lat > 0)
                && let Some(c) = self.cell(minute, q)
            {
                c.queued = c.queued.max(*queued);
                c.latency_ms = c.latency_ms.max(*lat);
            }
        }
        if (depth > 0 || latency > 0)
            && let Some(c) = self.cell(minute, ALL)
        {
            c.queued = c.queued.max(depth);
            c.latency_ms = c.latency_ms.max(latency);
        }
    }

    /// Per minute, the fields that grew since they were last merged.
    fn dirty(&self) -> Vec<(i64, Vec<(String, u64)>)> {
        let mut out = Vec::new();
        for (minute, cells) in &self.minutes {
            let done = self.flushed.get(minute);
            let mut fields = Vec::new();
            for (q, c) in cells {
                let before = done.and_then(|d| d.get(q)).copied().unwrap_or_default().values();
                for (i, v) in c.values().into_iter().enumerate() {
                    if v > before[i] {
                        fields.push((format!("{q}:{}", Cell::SUFFIXES[i]), v));
                    }
                }
            }
            if !fields.is_empty() {
                out.push((*minute, fields));
            }
        }
        out
    }

    /// Marks a minute's cells merged as they are now; forgets old minutes.
    fn merged(&mut self, minute: i64) {
        if let Some(cells) = self.minutes.get(&minute) {
            self.flushed.insert(minute, cells.clone());
        }
        if let Some((&newest, _)) = self.minutes.last_key_value() {
            let keep = newest - KEEP_MINUTES;
            self.minutes.retain(|m, _| *m > keep);
            self.flushed.retain(|m, _| *m > keep);
        }
    }
}

pub(crate) use muster_api::tasks::{Range, StatsSeries as Series};

/// The history service: counts events, merges them into Redis, reads charts.
pub struct Stats {
    store: Store,
    flush: Lua,
    recent: Mutex<Recent>,
}

impl Stats {
    pub fn new(store: Store, ctx: &ScriptCtx) -> Stats {
        Stats {
            store,
            flush: Lua::load("stats_flush", include_str!("lua/flush.lua"), ctx),
            recent: Mutex::new(Recent::default()),
        }
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one event (outcomes only; anything else is ignored).
    pub fn count(&self, ev: &Event) {
        self.recent().count(ev);
    }

    /// Reads the events after the last one counted from the stream and
    /// counts them (after the bus lagged: the events it dropped for this
    /// receiver are still in the stream). Returns how many were read.
    pub async fn recount(&self) -> StoreResult<usize> {
        let Some(mut after) = self.recent().counted_upto.clone() else {
            return Ok(0);
        };
        let read = crate::events::scan_after(&self.store, &mut after, 1000, RECOUNT_MAX, |ev| {
            self.recent().count(ev);
        })
        .await?;
        Ok(read)
    }

    /// Records queue depths and latencies (queue, queued, latency ms) as of
    /// Redis time `now_ms`.
    pub fn sample(&self, now_ms: i64, queues: &[(String, u64, u64)]) {
        self.recent().sample(now_ms, queues);
    }

    /// Merges every minute that grew into Redis; returns the fields that
    /// grew there. A failed call leaves the minute to the next flush.
    pub async fn flush(&self) -> StoreResult<u64> {
        let dirty = self.recent().dirty();
        let mut grew = 0;
        for (minute, fields) in dirty {
            let call = scripts::Flush {
                minute,
                day: minute * MINUTE_MS / DAY_MS,
                fields: &fields,
            };
            grew += self.store.run(&self.flush, &call).await?;
            self.recent().merged(minute);
        }
        Ok(grew)
    }

    /// The chart for `range` ending now, for one queue or all. The minutes
    /// this node has not merged yet count too. "Now" is the node's estimate
    /// of Redis time (it only picks the keys to read), or Redis `TIME`
    /// before the first sample.
    pub async fn series(&self, range: Range, queue: Option<&str>) -> StoreResult<Series> {
        let now_ms = match self.store.redis_now_estimate() {
            Some(now) => now,
            None => self.store.time_ms().await?,
        };
        let (step_ms, points) = match range {
            Range::Hour => (MINUTE_MS, 60),
            Range::Month => (DAY_MS, 30),
        };
        let last = now_ms.div_euclid(step_ms);
        let steps: Vec<i64> = (last - points + 1..=last).collect();
        let name = queue.unwrap_or(ALL);
        let fields: Vec<String> = Cell::SUFFIXES.iter().map(|f| format!("{name}:{f}")).collect();
        let mut pipe = redis::pipe();
        for step in &steps {
            let key = match range {
                Range::Hour => self.store.keys().stats_minute(*step),
                Range::Month => self.store.keys().stats_day(*step),
            };
            pipe.cmd("HMGET").arg(key).arg(&fields);
        }
        let rows: Vec<Vec<Option<u64>>> = self.store.pipe("stats_read", &pipe).await?;
        let mut cells: Vec<Cell> = rows
            .into_iter()
            .map(|r| Cell::from_values(std::array::from_fn(|i| r.get(i).copied().flatten().unwrap_or(0))))
            .collect();
        if range == Range::Hour {
            let recent = self.recent();
            for (i, step) in steps.iter().enumerate() {
                if let Some(c) = recent.minutes.get(step).and_then(|m| m.get(name)) {
                    cells[i] = cells[i].max(*c);
                }
            }
        }
        let col = |f: fn(&Cell) -> u64| cells.iter().map(f).collect::<Vec<u64>>();
        Ok(Series {
            range,
            step_s: (step_ms / 1000) as u64,
            queue: queue.map(str::to_string),
            t: steps.iter().map(|s| s * step_ms / 1000).collect(),
            succeeded: col(|c| c.succeeded),
            failed: col(|c| c.failed),
            dead: col(|c| c.dead),
            queued: col(|c| c.queued),
            latency_ms: col(|c| c.latency_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: &str, ts: i64, queue: &str) -> Event {
        // Ids grow with every event made here, as a stream's do.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let fields = [("type", kind), ("node", "n1"), ("queue", queue), ("data", "{}")];
        Event::from_fields(
            format!("{ts}-{seq}"),
            fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        )
    }

    #[test]
    fn counts_outcomes_per_queue_and_for_all() {
        let mut r = Recent::default();
        for (kind, q) in [
            ("task.succeeded", "a"),
            ("task.succeeded", "b"),
            ("task.failed", "a"),
            ("task.dead", "a"),
            ("task.claimed", "a"),
        ] {
            r.count(&ev(kind, 120_500, q));
        }
        let m = &r.minutes[&2];
        assert_eq!((m["a"].succeeded, m["a"].failed, m["a"].dead), (1, 1, 1));
        assert_eq!((m["*"].succeeded, m["*"].failed, m["*"].dead), (2, 1, 1));
        assert_eq!(m.len(), 3, "a claim counts nothing");
    }

    #[test]
    fn only_fields_that_grew_are_merged_again() {
        let mut r = Recent::default();
        r.count(&ev("task.succeeded", 60_000, "a"));
        let d = r.dirty();
        assert_eq!(d, vec![(1, vec![("*:s".to_string(), 1), ("a:s".to_string(), 1)])]);
        r.merged(1);
        assert!(r.dirty().is_empty());
        r.count(&ev("task.failed", 60_001, "a"));
        assert_eq!(
            r.dirty(),
            vec![(1, vec![("*:f".to_string(), 1), ("a:f".to_string(), 1)])]
        );
    }

    #[test]
    fn an_event_is_counted_once_even_when_delivered_again() {
        let mut r = Recent::default();
        let first = ev("task.succeeded", 60_000, "a");
        r.count(&first);
        r.count(&ev("task.succeeded", 60_001, "a"));
        r.count(&first);
        assert_eq!(r.minutes[&1]["a"].succeeded, 2, "the repeat of the first is skipped");
    }

    #[test]
    fn old_minutes_are_forgotten_and_not_counted() {
        let mut r = Recent::default();
        r.count(&ev("task.succeeded", 10 * 60_000, "a"));
        r.merged(10);
        r.count(&ev("task.succeeded", 5 * 60_000, "a"));
        assert!(
            !r.minutes.contains_key(&5),
            "a minute older than KEEP_MINUTES is not counted"
        );
        r.count(&ev("task.succeeded", 20 * 60_000, "a"));
        r.merged(20);
        assert_eq!(r.minutes.keys().copied().collect::<Vec<_>>(), vec![20]);
    }

    #[test]
    fn samples_keep_the_minutes_peak_and_skip_empty_queues() {
        let mut r = Recent::default();
        r.sample(60_000, &[("a".into(), 5, 100), ("b".into(), 0, 0)]);
        r.sample(61_000, &[("a".into(), 3, 900), ("b".into(), 0, 0)]);
        let m = &r.minutes[&1];
        assert_eq!((m["a"].queued, m["a"].latency_ms), (5, 900));
        assert_eq!((m["*"].queued, m["*"].latency_ms), (5, 900));
        assert!(!m.contains_key("b"));
        r.sample(180_000, &[("b".into(), 0, 0)]);
        assert!(!r.minutes.contains_key(&3), "an idle sample writes nothing");
    }
}
