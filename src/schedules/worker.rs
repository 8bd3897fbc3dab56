//! The scheduler loop, run by every node.
//!
//! Each pass reads every schedule's version, cursor and timing (two
//! pipelined round trips), computes each enabled schedule's occurrences after
//! its cursor up to this node's clock plus `schedules.max_skew_ms`, and hands
//! them to `fire.lua`, which decides by Redis time which are due and gives
//! each its outcome. The loop then sleeps until the earliest occurrence the
//! script reported as not yet due (a Redis-time delta, so this node's clock
//! does not matter), at most `schedules.interval_ms`.
//!
//! The node's clock only chooses which occurrences to propose: a clock that
//! lags by up to `max_skew_ms` still proposes every due one, and a clock that
//! runs ahead proposes some early, which the script refuses. Several nodes
//! proposing the same occurrence is the normal case; the script serializes
//! them and all but the first are no-ops.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{FireOutcome, Schedules, Timing};
use crate::config::SchedulesConfig;
use crate::store::{PassLog, Store, StoreError};

/// Occurrences proposed per script call.
const BATCH: usize = 1000;
/// Script calls per schedule per pass: catching up after a long outage is
/// spread over passes instead of starving the other schedules.
const MAX_BATCHES: usize = 100;

/// This node's clock in Unix ms, shifted by `schedules.clock_offset_ms` (tests
/// use it to play a node with a wrong clock; 0 without the `test-util`
/// feature).
fn local_now_ms(cfg: &SchedulesConfig) -> i64 {
    #[cfg(feature = "test-util")]
    let offset_ms = cfg.clock_offset_ms;
    #[cfg(not(feature = "test-util"))]
    let offset_ms = {
        let _ = cfg;
        0
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    now + offset_ms
}

/// Parsed timings by schedule id, kept while the version is unchanged.
#[derive(Default)]
pub struct TimingCache {
    map: HashMap<String, (u64, Option<Arc<Timing>>)>,
}

impl TimingCache {
    fn get(&mut self, id: &str, version: u64, expr: &str, tz: &str) -> Option<Arc<Timing>> {
        if let Some((v, t)) = self.map.get(id)
            && *v == version
        {
            return t.clone();
        }
        let parsed = match Timing::parse(expr, tz) {
            Ok(t) => Some(Arc::new(t)),
            Err(e) => {
                tracing::warn!(schedule = %id, error = %e, "cannot parse a stored schedule; it is not fired");
                None
            }
        };
        self.map.insert(id.to_string(), (version, parsed.clone()));
        parsed
    }

    fn retain(&mut self, ids: &[String]) {
        let live: HashSet<&str> = ids.iter().map(String::as_str).collect();
        self.map.retain(|k, _| live.contains(k.as_str()));
    }
}

/// What a pass reads of a schedule: version, enabled, cursor, expression,
/// time zone.
type Row = (Option<u64>, Option<String>, Option<i64>, Option<String>, Option<String>);

impl Schedules {
    /// Every schedule of shard `s` with its [`Row`]: its set, then one
    /// pipeline.
    async fn scan_in(&self, s: &Store) -> Result<Vec<(String, Row)>, StoreError> {
        let key = super::scripts::schedules_key(s.keys());
        let mut ids: Vec<String> = s.query("schedule_ids", redis::cmd("SMEMBERS").arg(key)).await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        ids.sort();
        let mut p = redis::pipe();
        for id in &ids {
            p.cmd("HMGET")
                .arg(super::scripts::schedule_key(s.keys(), id))
                .arg("version")
                .arg("enabled")
                .arg("cursor")
                .arg("expr")
                .arg("tz");
        }
        let rows: Vec<Row> = s.pipe("schedule_scan", &p).await?;
        Ok(ids.into_iter().zip(rows).collect())
    }

    /// One scheduler pass over every schedule of shard `s` (the loop runs
    /// per shard: a stalled master holds up its own shards' schedules
    /// only). Returns how long to sleep before the next pass.
    pub async fn pass_in(&self, s: &Store, cache: &mut TimingCache) -> Result<Duration, StoreError> {
        let cap = Duration::from_millis(self.cfg.interval_ms);
        let rows = self.scan_in(s).await?;
        let ids: Vec<String> = rows.iter().map(|(id, _)| id.clone()).collect();
        cache.retain(&ids);
        if ids.is_empty() {
            return Ok(cap);
        }
        let mut wake = cap;
        for (id, (version, enabled, cursor, expr, tz)) in rows {
            let id = &id;
            let (Some(version), Some(mut cursor), Some(expr), Some(tz)) = (version, cursor, expr, tz) else {
                continue;
            };
            if enabled.as_deref() != Some("1") {
                continue;
            }
            let Some(timing) = cache.get(id, version, &expr, &tz) else {
                continue;
            };
            // Recomputed per batch: a long catch-up takes real time.
            for _ in 0..MAX_BATCHES {
                let horizon = local_now_ms(&self.cfg) + self.cfg.max_skew_ms as i64;
                let (due, after) = timing.occurrences(cursor, horizon, BATCH);
                if due.is_empty() {
                    break;
                }
                let r = match self.fire(id, version, &due, after).await {
                    Ok(r) => r,
                    Err(e @ StoreError::Unavailable(_)) => return Err(e),
                    Err(e) => {
                        // A script or decode error concerns this schedule only.
                        tracing::warn!(schedule = %id, error = %e, "firing failed");
                        break;
                    }
                };
                match r.outcome {
                    FireOutcome::Done => {
                        cursor = r.cursor;
                        if after.is_none_or(|a| a > horizon) {
                            break;
                        }
                    }
                    FireOutcome::NotDue => {
                        wake = wake.min(Duration::from_millis(r.wait_ms.max(1) as u64));
                        break;
                    }
                    FireOutcome::NotFound | FireOutcome::Changed | FireOutcome::Disabled => {
                        // Changed, disabled or deleted since it was read: look again soon.
                        wake = wake.min(Duration::from_millis(20));
                        break;
                    }
                }
            }
        }
        Ok(wake)
    }
}

/// Runs the scheduler until `cancel`, one loop per shard. `reconciled`:
/// whether the config schedules were already written at start; if not,
/// shard 0's loop retries first (the write goes to every schedule's shard).
pub(crate) fn spawn(schedules: Arc<Schedules>, reconciled: bool, cancel: CancellationToken) -> JoinHandle<()> {
    let store = schedules.store().clone();
    store.spawn_each_shard(move |shard| {
        let (schedules, cancel) = (schedules.clone(), cancel.clone());
        async move {
            let mut reconciled = reconciled || shard.shard_index() != 0;
            let mut cache = TimingCache::default();
            let cap = Duration::from_millis(schedules.config().interval_ms);
            let mut log = PassLog::new("schedules", &shard);
            loop {
                if !reconciled {
                    match schedules.reconcile().await {
                        Ok(_) => reconciled = true,
                        Err(e) => tracing::warn!(error = %e, "could not write the config schedules; retrying"),
                    }
                }
                let sleep = log.outcome(schedules.pass_in(&shard, &mut cache).await).unwrap_or(cap);
                tokio::select! {
                    _ = tokio::time::sleep(sleep) => {}
                    _ = schedules.changed[shard.shard_index()].notified() => {}
                    _ = cancel.cancelled() => return,
                }
            }
        }
    })
}
