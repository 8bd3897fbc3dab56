//! The node's readers of the event streams: one per shard.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Bus, Cursor, Event, StreamId};
use crate::store::{Store, StoreError, classify};

/// A stream entry as XREAD/XRANGE return it.
pub(crate) type Entry = (String, Vec<(String, String)>);

const BLOCK_MS: u64 = 1000;
const BATCH: usize = 1000;
/// After a read that returned something but less than a full batch, wait
/// this long before the next: under load each read then carries the events
/// of a millisecond instead of one or two, which bounds this node's reads
/// to about a thousand a second (each a round trip Redis pays for), at the
/// cost of at most this much delay for the events that arrive meanwhile.
/// With N shards each of the node's N tailers lingers N times as long (at
/// most [`MAX_LINGER`]), so the node's reads stay about a thousand a second.
const LINGER: Duration = Duration::from_millis(1);
const MAX_LINGER: Duration = Duration::from_millis(16);

/// The events of `entries`, read after `after` from `shard`'s stream
/// (oldest first), without those at or before `after`: an entry holds the
/// events of a script call ([`Event::from_entry`]), and a reader whose
/// position is inside one reads that entry again.
pub(crate) fn entry_events(entries: Vec<Entry>, after: StreamId, shard: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(entries.len());
    for (id, fields) in entries {
        for ev in Event::from_entry(id, fields) {
            if ev.sid.is_none_or(|sid| sid > after) {
                out.push(ev.in_shard(shard));
            }
        }
    }
    out
}

/// The id of the view's shard's newest entry, or `0-0` for an empty stream.
pub(crate) async fn last_id(store: &Store) -> Result<StreamId, StoreError> {
    Ok(read_latest(store, 1)
        .await?
        .into_iter()
        .next()
        .and_then(|(id, _)| StreamId::parse(&id))
        .unwrap_or(StreamId(0, 0)))
}

/// The newest entry of every shard's stream: where new events start.
pub(crate) async fn last_cursor(store: &Store) -> Result<Cursor, StoreError> {
    let ids = store.fan_out(|s| async move { last_id(&s).await }).await?;
    Ok(Cursor::from_ids(ids))
}

/// Tails every shard's stream from `start` (exclusive; `None`: from the
/// newest entries once Redis is reachable) until `cancel`, publishing every
/// entry on `bus` in each stream's order.
pub(crate) fn spawn(store: Store, bus: Arc<Bus>, start: Option<Cursor>, cancel: CancellationToken) -> JoinHandle<()> {
    if let Some(at) = &start {
        bus.set_mark(at);
    }
    let tails: Vec<JoinHandle<()>> = store
        .every_shard()
        .map(|s| {
            let from = start.as_ref().map(|c| c.get(s.shard_index()));
            spawn_shard(s, bus.clone(), from, cancel.clone())
        })
        .collect();
    tokio::spawn(async move {
        for t in tails {
            let _ = t.await;
        }
    })
}

/// Tails one shard's stream (the view's) from `start`. A master switch (the
/// store's generation changes) makes it reconnect to the new master and
/// resume from the same id.
fn spawn_shard(store: Store, bus: Arc<Bus>, start: Option<StreamId>, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let key = store.keys().events();
        let shard = store.shard_index();
        let linger = (LINGER * store.shard_count() as u32).min(MAX_LINGER);
        let mut backoff = Duration::from_millis(50);
        let mut last = match start {
            Some(s) => s.to_string(),
            None => loop {
                match last_id(&store).await {
                    Ok(id) => break id.to_string(),
                    Err(_) => {
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                            _ = cancel.cancelled() => return,
                        }
                    }
                }
            },
        };
        if let Some(id) = StreamId::parse(&last) {
            let mut at = Cursor::default();
            at.advance(shard, id);
            bus.set_mark(&at);
        }
        'reconnect: loop {
            let generation = store.generation();
            let mut conn = tokio::select! {
                c = store.dedicated() => match c {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!(error = %e, "event tailer cannot connect; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            _ = cancel.cancelled() => return,
                        }
                        backoff = (backoff * 2).min(Duration::from_millis(500));
                        continue 'reconnect;
                    }
                },
                _ = cancel.cancelled() => return,
            };
            loop {
                if store.generation() != generation {
                    tracing::info!(resume_after = %last, "Redis master changed; event tailer reconnecting");
                    break;
                }
                let mut cmd = redis::cmd("XREAD");
                cmd.arg("COUNT")
                    .arg(BATCH)
                    .arg("BLOCK")
                    .arg(BLOCK_MS)
                    .arg("STREAMS")
                    .arg(&key)
                    .arg(&last);
                let read = tokio::time::timeout(
                    Duration::from_millis(BLOCK_MS) + store.timeout(),
                    cmd.query_async::<Option<Vec<(String, Vec<Entry>)>>>(&mut conn),
                );
                let res = tokio::select! {
                    r = read => r,
                    _ = cancel.cancelled() => return,
                };
                match res {
                    Ok(Ok(reply)) => {
                        backoff = Duration::from_millis(50);
                        let mut read = Vec::new();
                        let after = StreamId::parse(&last).unwrap_or(StreamId(0, 0));
                        for (_, entries) in reply.unwrap_or_default() {
                            if let Some((id, _)) = entries.last() {
                                last = id.clone();
                            }
                            read.extend(entry_events(entries, after, shard));
                        }
                        let n = read.len();
                        metrics::counter!("muster_events_read_total").increment(n as u64);
                        bus.publish_read(read);
                        if n > 0 && n < BATCH {
                            tokio::select! {
                                _ = tokio::time::sleep(linger) => {}
                                _ = cancel.cancelled() => return,
                            }
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %classify(&e), resume_after = %last, "event tailer lost Redis; resuming");
                        break;
                    }
                    Err(_) => {
                        tracing::warn!(resume_after = %last, "event tailer read timed out; reconnecting");
                        break;
                    }
                }
            }
            // Whatever happened while we were away may have made tasks claimable.
            bus.wakers.wake_all();
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = cancel.cancelled() => return,
            }
            // Capped low: after an outage, events reach subscribers within
            // half a second of Redis coming back.
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    })
}

/// The newest `count` entries of the view's shard, newest first.
pub(super) async fn read_latest(store: &Store, count: usize) -> Result<Vec<Entry>, StoreError> {
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
