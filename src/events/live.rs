//! The node's cached live view for the dashboard: node states, queue counts,
//! orphan totals and throughput over the last ten minutes.
//!
//! Invariant: events only make the view fresh between reconciliations; every
//! `events.reconcile_ms` the counts are rebuilt from Redis, so a lost or
//! dropped event cannot leave them wrong for longer than one interval. The
//! throughput is counted from the events this node sees (its tailer reads
//! every one) and recounted from the stream only when that count may be
//! wrong: at start, and after this view fell behind the bus. Recounting on
//! every pass read three intervals of events from Redis each time: at high
//! rates several times the tailer's own reading.

use std::collections::BTreeMap;
#[cfg(feature = "test-util")]
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Serialize;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use super::{Bus, Cursor, Event, StreamId};
use crate::nodes::{Nodes, NodesError};
use crate::orphans::Orphans;
use crate::store::{Store, StoreError};
use crate::tasks::{TaskError, Tasks};

/// What the live view reads from and listens to.
#[derive(Clone)]
pub struct LiveDeps {
    pub live: Arc<Live>,
    pub store: Store,
    pub nodes: Arc<Nodes>,
    pub tasks: Arc<Tasks>,
    pub orphans: Arc<Orphans>,
    pub bus: Arc<Bus>,
    /// `events.reconcile_ms`: how often the view is rebuilt from Redis.
    pub reconcile_ms: u64,
}

/// Why a reconciliation failed (it is tried again at the next period).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Nodes(#[from] NodesError),
    #[error(transparent)]
    Tasks(#[from] TaskError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Seconds of throughput history.
pub(crate) const WINDOW_SECS: usize = 600;

#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct LiveQueue {
    pub queued: i64,
    pub delayed: i64,
    pub running: i64,
    pub dead: i64,
    pub paused: bool,
    /// How long the queue's oldest claimable task has waited, ms, as of the
    /// last reconciliation.
    pub latency_ms: u64,
}

#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct LiveNode {
    pub id: String,
    pub kind: String,
    /// alive, draining, late, dead or left.
    pub state: String,
}

/// What the dashboard shows, as of `version`.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct Snapshot {
    /// Bumped on every change.
    pub version: u64,
    /// Redis ms of the last reconciliation with Redis.
    pub reconciled_at: i64,
    pub nodes_alive: i64,
    pub nodes_draining: i64,
    pub nodes_dead: i64,
    pub nodes: BTreeMap<String, LiveNode>,
    pub queues: BTreeMap<String, LiveQueue>,
    /// Recovered orphans by action since the namespace began.
    pub orphans: BTreeMap<String, u64>,
    /// Tasks finished (succeeded or dead) per second, oldest first; the last
    /// entry is the second `throughput_end` (Unix seconds, Redis time).
    pub throughput: Vec<u32>,
    pub throughput_end: i64,
    /// Failed attempts per second, the same seconds as `throughput`.
    pub failed_per_second: Vec<u32>,
    /// Tasks that became dead letters per second, the same seconds (they
    /// are counted in `throughput` as well).
    pub dead_per_second: Vec<u32>,
}

/// Which per-second series an event counts in.
#[derive(Clone, Copy)]
enum Rate {
    Finished,
    Failed,
    Dead,
}

impl Snapshot {
    /// Moves the throughput window so that it ends at `sec`.
    fn advance_to(&mut self, sec: i64) {
        let shift = (sec - self.throughput_end).clamp(0, WINDOW_SECS as i64) as usize;
        for series in [
            &mut self.throughput,
            &mut self.failed_per_second,
            &mut self.dead_per_second,
        ] {
            if series.len() != WINDOW_SECS {
                *series = vec![0; WINDOW_SECS];
            }
            series.rotate_left(shift);
            for v in &mut series[WINDOW_SECS - shift..] {
                *v = 0;
            }
        }
        self.throughput_end = self.throughput_end.max(sec);
    }

    fn series(&mut self, rate: Rate) -> &mut Vec<u32> {
        match rate {
            Rate::Finished => &mut self.throughput,
            Rate::Failed => &mut self.failed_per_second,
            Rate::Dead => &mut self.dead_per_second,
        }
    }

    fn count_at(&mut self, rate: Rate, ts_ms: i64) {
        let sec = ts_ms / 1000;
        self.advance_to(sec);
        let back = self.throughput_end - sec;
        if (0..WINDOW_SECS as i64).contains(&back) {
            let i = WINDOW_SECS - 1 - back as usize;
            let v = &mut self.series(rate)[i];
            *v = v.saturating_add(1);
        }
    }

    /// Applies one event incrementally (approximate between reconciliations):
    /// its count changes unless `counted`, its throughput unless `recounted`
    /// (a reconciliation already read it).
    fn apply(&mut self, ev: &Event, counted: bool, recounted: bool) {
        if counted && recounted {
            return;
        }
        fn q<'a>(s: &'a mut Snapshot, ev: &Event) -> &'a mut LiveQueue {
            s.queues
                .entry(ev.subject("queue").unwrap_or("").to_string())
                .or_default()
        }
        let data_has = |needle: &str| ev.data.contains(needle);
        let kind = ev.kind.as_str();
        if counted && kind != "task.succeeded" && kind != "task.dead" && kind != "task.failed" {
            return;
        }
        match kind {
            "node.joined" => {
                let n = self.nodes.entry(ev.node.clone()).or_default();
                n.id = ev.node.clone();
                n.state = "alive".into();
                if data_has("\"worker\"") {
                    n.kind = "worker".into();
                } else {
                    n.kind = "node".into();
                }
            }
            "node.draining" => self.nodes.entry(ev.node.clone()).or_default().state = "draining".into(),
            "node.dead" => self.nodes.entry(ev.node.clone()).or_default().state = "dead".into(),
            "node.left" => {
                self.nodes.remove(&ev.node);
            }
            "task.enqueued" => {
                if data_has("\"delayed\"") {
                    q(self, ev).delayed += 1
                } else {
                    q(self, ev).queued += 1
                }
            }
            "task.claimed" => {
                let e = q(self, ev);
                e.queued -= 1;
                e.running += 1;
            }
            "task.succeeded" => {
                if !counted {
                    q(self, ev).running -= 1;
                }
                if !recounted {
                    self.count_at(Rate::Finished, ev.ts);
                }
            }
            "task.failed" => {
                if !counted {
                    q(self, ev).running -= 1;
                }
                if !recounted {
                    self.count_at(Rate::Failed, ev.ts);
                }
            }
            "task.retrying" => q(self, ev).delayed += 1,
            "task.requeued" => {
                let e = q(self, ev);
                e.running -= 1;
                e.queued += 1;
            }
            "task.dead" => {
                if !counted {
                    q(self, ev).dead += 1;
                }
                if !recounted {
                    self.count_at(Rate::Finished, ev.ts);
                    self.count_at(Rate::Dead, ev.ts);
                }
            }
            "orphan.recovered" => {
                let action = if data_has("\"requeued\"") {
                    "requeued"
                } else if data_has("\"dead\"") {
                    "dead"
                } else {
                    "cancelled"
                };
                let e = q(self, ev);
                e.running -= 1;
                if action == "requeued" {
                    e.queued += 1;
                }
                *self.orphans.entry(action.to_string()).or_default() += 1;
            }
            "queue.paused" => q(self, ev).paused = true,
            "queue.resumed" => q(self, ev).paused = false,
            _ => return,
        }
        for v in self.queues.values_mut() {
            v.queued = v.queued.max(0);
            v.running = v.running.max(0);
            v.delayed = v.delayed.max(0);
        }
        self.recount_nodes();
        self.version += 1;
    }

    fn recount_nodes(&mut self) {
        self.nodes_alive = self
            .nodes
            .values()
            .filter(|n| n.state == "alive" || n.state == "draining")
            .count() as i64;
        self.nodes_draining = self.nodes.values().filter(|n| n.state == "draining").count() as i64;
        self.nodes_dead = self.nodes.len() as i64 - self.nodes_alive;
    }
}

/// The cache and its upkeep.
#[derive(Default)]
pub struct Live {
    snap: RwLock<Snapshot>,
    #[cfg(feature = "test-util")]
    drop_events: AtomicBool,
    /// The newest stream id when the last reconciliation started reading:
    /// events up to it are already in the counts it read, so applying them
    /// again (they wait in the channel meanwhile) would count them twice.
    reconciled_upto: std::sync::Mutex<Option<Cursor>>,
    /// The same for the last recount of the throughput.
    recounted_upto: std::sync::Mutex<Option<Cursor>>,
}

impl Live {
    pub fn snapshot(&self) -> Snapshot {
        self.snap.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// For tests of convergence: ignore incoming events, as if they were lost.
    #[cfg(feature = "test-util")]
    pub fn drop_events(&self, drop: bool) {
        self.drop_events.store(drop, Ordering::Relaxed);
    }

    pub fn apply(&self, ev: &Event) {
        #[cfg(feature = "test-util")]
        if self.drop_events.load(Ordering::Relaxed) {
            return;
        }
        if ev.mirrored() {
            return;
        }
        let upto = |m: &std::sync::Mutex<Option<Cursor>>| {
            let upto = m.lock().unwrap_or_else(|p| p.into_inner());
            matches!((upto.as_ref(), ev.sid), (Some(u), Some(id)) if u.covers(ev.shard, id))
        };
        let (counted, recounted) = (upto(&self.reconciled_upto), upto(&self.recounted_upto));
        self.snap
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .apply(ev, counted, recounted);
    }

    /// Rebuilds the view from Redis; recounts the throughput of the last
    /// `recount_ms` from the stream (0: keeps the counted throughput).
    pub async fn reconcile(&self, s: &LiveDeps, recount_ms: i64) -> Result<(), ReconcileError> {
        let mark = crate::events::tailer::last_cursor(&s.store).await?;
        let nodes = s.nodes.list().await?;
        let queues = s.tasks.queues().await?;
        let (_, orphan_counts) = s.orphans.history(0).await?;
        let now = nodes.now;
        // Recount finished tasks per second over the recent window from the stream.
        let from = now - recount_ms;
        let mut recent: BTreeMap<i64, [u32; 3]> = BTreeMap::new();
        let mut after = Cursor::at(s.store.shard_count(), StreamId(from.max(0) as u64, 0));
        if recount_ms > 0 {
            // At most 100 000 events, as many as a full window holds.
            super::stream::scan_after(&s.store, &mut after, 1000, 100_000, |ev| {
                // Only up to the mark: a later event is still on its way
                // through the channel and `apply` counts it (read here too,
                // as the scan of 12 shards can outlast a burst, it was
                // counted twice).
                let marked = matches!(ev.sid, Some(id) if mark.covers(ev.shard, id));
                if ev.mirrored() || !marked {
                    return;
                }
                // [finished, failed, dead], as `apply` counts them.
                let slots: &[usize] = match ev.kind.as_str() {
                    "task.succeeded" => &[0],
                    "task.failed" => &[1],
                    "task.dead" => &[0, 2],
                    _ => &[],
                };
                for &i in slots {
                    recent.entry(ev.ts / 1000).or_default()[i] += 1;
                }
            })
            .await?;
        }
        *self.reconciled_upto.lock().unwrap_or_else(|p| p.into_inner()) = Some(mark.clone());
        if recount_ms > 0 {
            *self.recounted_upto.lock().unwrap_or_else(|p| p.into_inner()) = Some(mark);
        }
        let mut snap = self.snap.write().unwrap_or_else(|p| p.into_inner());
        snap.nodes = nodes
            .nodes
            .iter()
            .map(|n| {
                (
                    n.id.clone(),
                    LiveNode {
                        id: n.id.clone(),
                        kind: n.kind.clone(),
                        state: n.state.to_string(),
                    },
                )
            })
            .collect();
        snap.recount_nodes();
        snap.queues = queues
            .iter()
            .map(|q| {
                (
                    q.name.clone(),
                    LiveQueue {
                        queued: q.queued as i64,
                        delayed: q.delayed as i64,
                        running: q.running as i64,
                        dead: q.dead as i64,
                        paused: q.paused,
                        latency_ms: q.latency_ms,
                    },
                )
            })
            .collect();
        snap.orphans = orphan_counts.into_iter().collect();
        // Advance the window to now, then overwrite the recounted seconds.
        snap.advance_to(now / 1000);
        let end = snap.throughput_end;
        let recounted = if recount_ms > 0 { from / 1000 } else { end + 1 };
        for sec in recounted..=end {
            let back = end - sec;
            if (0..WINDOW_SECS as i64).contains(&back) {
                let i = WINDOW_SECS - 1 - back as usize;
                let [finished, failed, dead] = recent.get(&sec).copied().unwrap_or_default();
                snap.throughput[i] = finished;
                snap.failed_per_second[i] = failed;
                snap.dead_per_second[i] = dead;
            }
        }
        snap.reconciled_at = now;
        snap.version += 1;
        Ok(())
    }
}

/// Feeds the cache from the bus and reconciles it on a timer.
pub(crate) fn spawn(s: LiveDeps, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut rx = s.bus.subscribe();
        let every = Duration::from_millis(s.reconcile_ms);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first reconciliation fills the whole throughput window; after
        // that the events count it, unless this view fell behind the bus.
        let mut recount = (WINDOW_SECS as i64) * 1000;
        // A recount after a lag reads the stream while events keep coming;
        // on a node too busy to keep up, recounting at every lag would feed
        // the lag. At most one per ten reconciliation periods: meanwhile the
        // throughput shown may miss what the node skipped.
        let mut recounted_at: Option<std::time::Instant> = None;
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Ok(ev) => s.live.apply(&ev),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        if recounted_at.is_none_or(|t| t.elapsed() >= every * 10) {
                            recount = recount.max((s.reconcile_ms as i64) * 3);
                            recounted_at = Some(std::time::Instant::now());
                        }
                        tick.reset_immediately();
                    }
                    Err(_) => return,
                },
                _ = tick.tick() => {
                    match s.live.reconcile(&s, recount).await {
                        Ok(()) => recount = 0,
                        Err(e) => tracing::debug!(error = %e, "live view reconciliation failed"),
                    }
                }
                _ = cancel.cancelled() => return,
            }
        }
    })
}
