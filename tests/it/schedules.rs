//! Cron schedules (G7): exactly once per occurrence across nodes, whatever
//! the nodes' clocks say and whichever node dies; missed occurrences, backfill
//! and the starting deadline after an outage; Europe/Berlin DST days; overlap
//! forbid and replace; config schedules, the API, the pages, and no leaks.
//!
//! Every test uses every-second schedules (6 fields) so that a run of a few
//! seconds covers many occurrences. Outages are real (every node killed, Redis
//! time allowed to pass) except where a test needs one longer than it can
//! wait: there it moves the schedule's cursor back, which is exactly the
//! state an outage of that length leaves behind.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use muster::client::{
    ClaimedTask, Complete, Fail, Overlap, Problem, Schedule, ScheduleDef, TaskHeartbeat, TaskInfo, TaskTemplate,
    Triggered,
};
use muster::config::Config;
use serde_json::{Value, json};

use crate::common::*;
use crate::tasks::completions;
use crate::tasks::join;

/// Redis time, ms.
async fn redis_now(redis: &TestRedis) -> i64 {
    let (s, us): (i64, i64) = redis.cmd(&["TIME"]).await;
    s * 1000 + us / 1000
}

/// Waits until Redis time reaches `t` (ms).
async fn until_redis(redis: &TestRedis, t: i64) {
    let ok = wait_until(Duration::from_secs(120), || async { redis_now(redis).await >= t }).await;
    assert!(ok, "Redis time did not reach {t}");
}

/// A fast scheduler for tests.
fn fast(c: &mut Config) {
    c.schedules.interval_ms = 100;
}

/// A definition with the defaults: UTC, enabled, overlap allow, no
/// deadline, no backfill, an empty task.
fn def(id: &str, expression: &str, queue: &str) -> ScheduleDef {
    ScheduleDef {
        id: id.into(),
        expression: expression.into(),
        timezone: "UTC".into(),
        queue: queue.into(),
        task: TaskTemplate::default(),
        enabled: true,
        overlap: Overlap::Allow,
        starting_deadline_ms: None,
        backfill: false,
    }
}

/// Creates a schedule (POST: 201, or a refusal).
async fn create(app: &TestApp, def: ScheduleDef) -> Schedule {
    app.api().create_schedule(&def).await.unwrap()
}

/// A schedule with up to 1000 history entries.
async fn get(app: &TestApp, id: &str) -> Schedule {
    app.api().schedule_with_history(id, 1000).await.unwrap()
}

async fn fired(app: &TestApp, id: &str) -> u64 {
    get(app, id).await.counts.fired
}

/// Waits until the schedule has fired at least `n` times.
async fn until_fired(app: &TestApp, id: &str, n: u64, within: Duration) {
    let ok = wait_until(within, || async { fired(app, id).await >= n }).await;
    let s = get(app, id).await;
    assert!(ok, "schedule {id} fired {:?} of {n} in {within:?}", s.counts);
}

/// Disables the schedule and returns its final cursor: every occurrence up
/// to it has its outcome, none after it will fire.
async fn stop(app: &TestApp, id: &str) -> i64 {
    app.api().set_schedule_enabled(id, false).await.unwrap();
    get(app, id).await.cursor
}

/// Claims up to `max` of a queue's tasks for a worker (empty when none came).
use crate::tasks::claim_tasks as claim;

/// Completes a claimed task with its token (no result).
async fn complete(app: &TestApp, t: &ClaimedTask) -> muster::client::Result<muster::client::FinishedNext> {
    let c = Complete {
        token: t.token,
        result: Value::Null,
        next: None,
    };
    app.api().complete(&t.id, &c).await
}

/// Moves a schedule's cursor to `cursor` and enables it: the state that all
/// nodes being down since `cursor` leaves behind.
async fn rewind(redis: &TestRedis, id: &str, cursor: i64) {
    let key = format!("{}:schedule:{id}", name_tag("muster", id));
    let _: i64 = redis
        .cmd(&["HSET", &key, "cursor", &cursor.to_string(), "enabled", "1"])
        .await;
}

/// Every task of a queue (any state), grouped by the occurrence in its
/// idempotency key `schedule:<id>:<T>`; a triggered task
/// (`schedule:<id>:trigger:...`) by its creation, which is its occurrence.
async fn tasks_by_occurrence(app: &TestApp, queue: &str, id: &str) -> BTreeMap<i64, Vec<TaskInfo>> {
    let mut out: BTreeMap<i64, Vec<TaskInfo>> = BTreeMap::new();
    let prefix = format!("schedule:{id}:");
    for state in ["queued", "delayed", "running", "succeeded", "cancelled", "dead"] {
        let mut cursor: Option<String> = None;
        loop {
            let page = app.api().tasks(queue, state, 500, cursor.as_deref()).await.unwrap();
            for t in page.tasks {
                let key = t.idempotency_key.as_deref().unwrap_or("");
                if let Some(rest) = key.strip_prefix(&prefix) {
                    let occ: i64 = if rest.starts_with("trigger:") {
                        t.created_at
                    } else {
                        rest.parse().expect("a scheduled occurrence")
                    };
                    out.entry(occ).or_default().push(t);
                }
            }
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
    }
    out
}

/// Asserts one task per whole second in (from, to] and none elsewhere;
/// returns the occurrences.
fn assert_every_second_once(tasks: &BTreeMap<i64, Vec<TaskInfo>>, from: i64, to: i64) -> Vec<i64> {
    let expected: Vec<i64> = ((from / 1000 + 1)..=(to / 1000)).map(|s| s * 1000).collect();
    let dups: Vec<_> = tasks
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(t, v)| (*t, v.len()))
        .collect();
    assert!(dups.is_empty(), "occurrences with more than one task: {dups:?}");
    let got: Vec<i64> = tasks.keys().copied().collect();
    let missing: Vec<_> = expected.iter().filter(|t| !tasks.contains_key(t)).take(10).collect();
    let extra: Vec<_> = got.iter().filter(|t| !expected.contains(t)).take(10).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing occurrences {missing:?}, unexpected ones {extra:?} (window {from}..{to})"
    );
    expected
}

fn every_second(id: &str, queue: &str) -> ScheduleDef {
    def(id, "* * * * * *", queue)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_200_every_second_occurrences_over_three_nodes_give_exactly_200_tasks() {
    let redis = TestRedis::start();
    let tweak = |c: &mut Config| {
        fast(c);
        c.schedules.max_skew_ms = 2000;
        c.schedules.history_max = 1000;
    };
    let a = TestApp::start_with(&redis, tweak).await;
    let b = TestApp::start_with(&redis, tweak).await;
    let c = TestApp::start_with(&redis, tweak).await;
    let mut def = every_second("tick", "tick");
    def.backfill = true;
    def.enabled = false;
    create(&a, def).await;
    // 200 occurrences: the first 185 lie in the past, as if every node had been
    // down for 185 s (a backfill the three nodes race for), the last 15 are
    // fired live, the three nodes racing at each second.
    let now = redis_now(&redis).await;
    let start = now - now.rem_euclid(1000) - 185_000;
    rewind(&redis, "tick", start).await;
    until_fired(&b, "tick", 200, Duration::from_secs(60)).await;
    let end = stop(&c, "tick").await;
    let tasks = tasks_by_occurrence(&a, "tick", "tick").await;
    let occurrences = assert_every_second_once(&tasks, start, end);
    assert!(occurrences.len() >= 200, "{} occurrences", occurrences.len());
    let first_200: Vec<_> = tasks.keys().take_while(|t| **t <= start + 200_000).collect();
    assert_eq!(first_200.len(), 200, "exactly 200 tasks for the first 200 occurrences");
    // The live ones were fired on time, never early.
    for (t, v) in tasks.range(now + 1000..) {
        let late = v[0].created_at - t;
        assert!(
            (0..1500).contains(&late),
            "occurrence {t} fired {late} ms after its time"
        );
    }
    // One schedule.fired event and one history entry per task.
    let events = redis.events("muster").await;
    let fired_events = events.iter().filter(|(t, _, _)| t == "schedule.fired").count();
    assert_eq!(fired_events, occurrences.len());
    let s = get(&a, "tick").await;
    assert_eq!(s.counts.fired as usize, occurrences.len());
    assert_eq!(s.counts.missed, 0);
    let nodes: HashSet<&str> = s.history.iter().map(|h| h.node.as_str()).collect();
    eprintln!("occurrences fired by {} distinct nodes", nodes.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_nodes_with_clocks_25_s_off_neither_duplicate_nor_miss() {
    let redis = TestRedis::start();
    // The default max_skew_ms (30 s) covers a clock 25 s off either way.
    let lagging = |c: &mut Config| {
        fast(c);
        c.schedules.clock_offset_ms = -25_000;
    };
    let leading = |c: &mut Config| {
        fast(c);
        c.schedules.clock_offset_ms = 25_000;
    };
    let mut slow = TestApp::start_with(&redis, lagging).await;
    let mut def = every_second("skew", "skew");
    // A late firing would be missed: lateness shows up as missing tasks too.
    def.starting_deadline_ms = Some(3000);
    let from = create(&slow, def).await.cursor;
    // 1. Only the node whose clock lags 25 s: it still fires every occurrence on time.
    until_fired(&slow, "skew", 4, Duration::from_secs(15)).await;
    // 2. Only the node whose clock leads 25 s: it fires nothing early.
    let fast_node = TestApp::start_with(&redis, leading).await;
    slow.kill().await;
    let n = fired(&fast_node, "skew").await;
    until_fired(&fast_node, "skew", n + 4, Duration::from_secs(15)).await;
    // 3. Both wrong clocks and a right one together.
    let slow2 = TestApp::start_with(&redis, lagging).await;
    let right = TestApp::start_with(&redis, fast).await;
    let n = fired(&right, "skew").await;
    until_fired(&right, "skew", n + 4, Duration::from_secs(15)).await;
    let end = stop(&slow2, "skew").await;
    let tasks = tasks_by_occurrence(&right, "skew", "skew").await;
    assert_every_second_once(&tasks, from, end);
    for (t, v) in &tasks {
        let late = v[0].created_at - t;
        assert!(late >= 0, "occurrence {t} fired {} ms early", -late);
        assert!(late < 1500, "occurrence {t} fired {late} ms late");
    }
    assert_eq!(get(&right, "skew").await.counts.missed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_nodes_killed_as_an_occurrence_falls_due_change_nothing() {
    let redis = TestRedis::start();
    let mut a = TestApp::start_with(&redis, fast).await;
    let mut b = TestApp::start_with(&redis, fast).await;
    let c = TestApp::start_with(&redis, fast).await;
    let from = create(&a, every_second("crash", "crash")).await.cursor;
    until_fired(&c, "crash", 2, Duration::from_secs(10)).await;
    // Kill a node at the instant an occurrence falls due, while all three race for it.
    for victim in [&mut a, &mut b] {
        let now = redis_now(&redis).await;
        until_redis(&redis, now - now.rem_euclid(1000) + 1000).await;
        victim.kill().await;
        let n = fired(&c, "crash").await;
        until_fired(&c, "crash", n + 3, Duration::from_secs(10)).await;
    }
    let end = stop(&c, "crash").await;
    let tasks = tasks_by_occurrence(&c, "crash", "crash").await;
    assert_every_second_once(&tasks, from, end);
    for (t, v) in &tasks {
        let late = v[0].created_at - t;
        assert!(
            (0..1500).contains(&late),
            "occurrence {t} fired {late} ms after its time"
        );
    }
}

/// Unix ms of a UTC date and time.
fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
    use chrono::TimeZone;
    chrono::Utc
        .with_ymd_and_hms(y, mo, d, h, mi, 0)
        .unwrap()
        .timestamp_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_europe_berlin_dst_days_fire_the_right_occurrences() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, fast).await;
    // Each schedule matches only on a DST day; fired by backfill from a cursor
    // the day before, through the same scripts as live firing.
    let cases: Vec<(&str, &str, i64, Vec<i64>)> = vec![
        (
            // 2025-03-30: 02:00 CET jumps to 03:00 CEST; the day has 23 hours.
            "spring-hourly",
            "0 * 30 3 *",
            utc(2025, 3, 29, 0, 0),
            std::iter::once(utc(2025, 3, 29, 23, 0))
                .chain((0..22).map(|h| utc(2025, 3, 30, h, 0)))
                .collect(),
        ),
        // 02:30 does not exist that day: it runs once, right after the gap (03:00 CEST).
        (
            "spring-fixed",
            "30 2 30 3 *",
            utc(2025, 3, 29, 0, 0),
            vec![utc(2025, 3, 30, 1, 0)],
        ),
        (
            // 2025-10-26: 03:00 CEST goes back to 02:00 CET; the day has 25 hours.
            "fall-hourly",
            "0 * 26 10 *",
            utc(2025, 10, 25, 0, 0),
            vec![utc(2025, 10, 25, 22, 0), utc(2025, 10, 25, 23, 0)]
                .into_iter()
                .chain((0..23).map(|h| utc(2025, 10, 26, h, 0)))
                .collect(),
        ),
        // 02:30 happens twice: a fixed time runs once, on the first pass (CEST).
        (
            "fall-fixed",
            "30 2 26 10 *",
            utc(2025, 10, 25, 0, 0),
            vec![utc(2025, 10, 26, 0, 30)],
        ),
        // An interval runs on both passes of the repeated hour.
        (
            "fall-interval",
            "*/30 2 26 10 *",
            utc(2025, 10, 25, 0, 0),
            vec![
                utc(2025, 10, 26, 0, 0),
                utc(2025, 10, 26, 0, 30),
                utc(2025, 10, 26, 1, 0),
                utc(2025, 10, 26, 1, 30),
            ],
        ),
    ];
    for (id, expr, _, _) in &cases {
        let mut d = def(id, expr, "dst");
        d.timezone = "Europe/Berlin".into();
        d.backfill = true;
        d.enabled = false;
        create(&a, d).await;
    }
    for (id, _, from, want) in &cases {
        rewind(&redis, id, *from).await;
        until_fired(&a, id, want.len() as u64, Duration::from_secs(20)).await;
        let tasks = tasks_by_occurrence(&a, "dst", id).await;
        let in_2025: Vec<i64> = tasks.keys().copied().filter(|t| *t < utc(2026, 1, 1, 0, 0)).collect();
        assert_eq!(&in_2025, want, "{id}");
        assert!(tasks.values().all(|v| v.len() == 1), "{id}: one task per occurrence");
    }
    // The page shows local wall-clock times with the zone's abbreviation.
    let html = a.page("/schedules/fall-hourly").await;
    assert!(html.contains("2025-10-26 02:00:00 CEST") && html.contains("2025-10-26 02:00:00 CET"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_after_all_nodes_were_down_missed_occurrences_follow_backfill_and_deadline() {
    let redis = TestRedis::start();
    // An occurrence more than 500 ms late was missed by an outage.
    let tweak = |c: &mut Config| {
        fast(c);
        c.schedules.max_skew_ms = 500;
        c.schedules.record_ttl_ms = 60_000;
    };
    let mut a = TestApp::start_with(&redis, tweak).await;
    let mut b = TestApp::start_with(&redis, tweak).await;
    let latest = create(&a, every_second("latest", "latest")).await.cursor;
    let mut def = every_second("all", "all");
    def.backfill = true;
    let all = create(&a, def).await.cursor;
    let mut def = every_second("recent", "recent");
    def.backfill = true;
    def.starting_deadline_ms = Some(1500);
    let recent = create(&a, def).await.cursor;
    for id in ["latest", "all", "recent"] {
        until_fired(&a, id, 2, Duration::from_secs(10)).await;
    }
    // Every node goes down for 4.5 s.
    a.kill().await;
    b.kill().await;
    let down = redis_now(&redis).await;
    until_redis(&redis, down + 4500).await;
    let c = TestApp::start_with(&redis, tweak).await;
    let up = redis_now(&redis).await;
    for id in ["latest", "all", "recent"] {
        let n = fired(&c, id).await;
        until_fired(&c, id, n + 3, Duration::from_secs(10)).await;
    }
    // Occurrences due while no node was up (from just before the last kill to
    // just after the first node was back).
    let outage = |t: i64| t > down - 1000 && t < up + 1500;

    // backfill = false: of the occurrences missed during the outage only the
    // latest ran; the others are recorded as missed (superseded).
    let end = stop(&c, "latest").await;
    let tasks = tasks_by_occurrence(&c, "latest", "latest").await;
    let expected: Vec<i64> = ((latest / 1000 + 1)..=(end / 1000)).map(|s| s * 1000).collect();
    let missing: Vec<i64> = expected.iter().copied().filter(|t| !tasks.contains_key(t)).collect();
    assert!(missing.len() >= 3, "missed during the outage: {missing:?}");
    assert!(
        missing.iter().all(|t| outage(*t)),
        "{missing:?} outside the outage ({down}, {up})"
    );
    let first_after: i64 = *tasks.keys().find(|t| **t > *missing.last().unwrap()).unwrap();
    assert!(
        outage(first_after) || first_after <= up + 1000,
        "the latest missed one ran"
    );
    assert!(tasks.values().all(|v| v.len() == 1));
    let s = get(&c, "latest").await;
    assert_eq!(s.counts.missed as usize, missing.len());
    let runs: Vec<_> = s.history.iter().filter(|h| h.result == "missed").collect();
    assert_eq!(runs.len(), 1, "one history entry for the run of missed occurrences");
    assert_eq!(runs[0].reason.as_deref(), Some("superseded"));
    assert_eq!(runs[0].count.unwrap() as usize, missing.len());
    assert_eq!(runs[0].t, missing[0]);
    assert_eq!(runs[0].last, Some(*missing.last().unwrap()));

    // backfill = true: every occurrence ran, in order.
    let end = stop(&c, "all").await;
    let tasks = tasks_by_occurrence(&c, "all", "all").await;
    assert_every_second_once(&tasks, all, end);
    let order: Vec<i64> = tasks.values().map(|v| v[0].created_at).collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "fired in order");
    assert!(tasks.keys().filter(|t| outage(**t)).count() >= 4);
    assert_eq!(get(&c, "all").await.counts.missed, 0);

    // backfill = true with a 1.5 s deadline: the older outage occurrences were
    // missed, the ones within the deadline ran.
    let end = stop(&c, "recent").await;
    let tasks = tasks_by_occurrence(&c, "recent", "recent").await;
    let expected: Vec<i64> = ((recent / 1000 + 1)..=(end / 1000)).map(|s| s * 1000).collect();
    let missing: Vec<i64> = expected.iter().copied().filter(|t| !tasks.contains_key(t)).collect();
    assert!(missing.len() >= 2, "{missing:?}");
    assert!(missing.iter().all(|t| outage(*t)));
    for (t, v) in &tasks {
        assert!(v[0].created_at - t <= 1500, "occurrence {t} ran past its deadline");
    }
    let s = get(&c, "recent").await;
    for h in s.history.iter().filter(|h| h.result == "missed") {
        assert_eq!(h.reason.as_deref(), Some("deadline"));
        assert!(h.at - h.last.unwrap() > 1500, "{h:?}");
    }
    assert_eq!(s.counts.missed as usize, missing.len());
    let events = redis.events("muster").await;
    assert!(
        events
            .iter()
            .any(|(t, _, e)| t == "schedule.missed" && e["schedule"] == "recent")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_overlap_forbid_skips_while_the_previous_task_is_live() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, fast).await;
    join(&a, "w").await;
    let mut def = every_second("solo", "solo");
    def.overlap = Overlap::Forbid;
    create(&a, def).await;
    until_fired(&a, "solo", 1, Duration::from_secs(10)).await;
    let first = get(&a, "solo").await.last_task.unwrap();
    // Queued, then running: every occurrence meanwhile is skipped.
    let skipped = wait_until(Duration::from_secs(10), || async {
        get(&a, "solo").await.counts.skipped_overlap >= 2
    })
    .await;
    assert!(skipped);
    let got = claim(&a, "solo", "w", 1, 0).await;
    assert_eq!(got[0].id, first);
    let s = get(&a, "solo").await;
    let n_skipped = s.counts.skipped_overlap;
    let more = wait_until(Duration::from_secs(10), || async {
        get(&a, "solo").await.counts.skipped_overlap >= n_skipped + 2
    })
    .await;
    assert!(more, "skipped while running too");
    assert_eq!(
        fired(&a, "solo").await,
        1,
        "nothing fired while the first task was live"
    );
    let s = get(&a, "solo").await;
    assert!(
        s.history
            .iter()
            .any(|e| e.result == "skipped_overlap" && e.task.as_deref() == Some(first.as_str()))
    );
    // Trigger now obeys the policy too; the refusal names the live task.
    let p = problem(a.api().trigger_schedule("solo", None).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert_eq!(
        p.extra.get("task").and_then(Value::as_str),
        Some(first.as_str()),
        "{p:?}"
    );
    // Once it finishes, the next occurrence fires.
    complete(&a, &got[0]).await.unwrap();
    until_fired(&a, "solo", 2, Duration::from_secs(10)).await;
    let second = get(&a, "solo").await.last_task.unwrap();
    assert_ne!(second, first);
    assert_eq!(a.api().task(&second).await.unwrap().state, "queued");
    let metrics = a.page("/metrics").await;
    assert!(metrics.contains("muster_schedule_fires_total{result=\"skipped_overlap\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_overlap_replace_cancels_the_previous_task_and_stales_its_token() {
    let redis = TestRedis::start();
    // No orphan sweep during the test: it would repair a slot left behind.
    let a = TestApp::start_with(&redis, |c| {
        fast(c);
        c.orphans.interval_ms = 60_000;
    })
    .await;
    join(&a, "w").await;
    // A group of one: the replacement can only run if the old task's slot is
    // freed. (Split, a schedule's group must share its shard: `one` itself
    // with one shard.)
    let one = name_like("muster", "one", "fresh");
    a.api().set_group_limit(&one, Some(1)).await.unwrap();
    let mut def = every_second("fresh", "fresh");
    def.overlap = Overlap::Replace;
    def.task = TaskTemplate {
        payload: Some(json!({"kind": "refresh"})),
        group: Some(one.clone()),
        ..TaskTemplate::default()
    };
    def.enabled = false;
    create(&a, def).await;
    let t = a.api().trigger_schedule("fresh", None).await.unwrap();
    assert!(!t.replayed, "fired (201), not a replay: {t:?}");
    let got = claim(&a, "fresh", "w", 1, 0).await;
    let old = got[0].id.clone();
    let old_token = got[0].token;
    assert_eq!(got[0].payload, json!({"kind": "refresh"}));
    // The next occurrence replaces the running task.
    a.api().set_schedule_enabled("fresh", true).await.unwrap();
    let replaced = wait_until(Duration::from_secs(10), || async {
        a.api().task(&old).await.unwrap().state == "cancelled"
    })
    .await;
    assert!(replaced, "the running task is cancelled");
    let t = a.api().task(&old).await.unwrap();
    assert_eq!(t.attempt_log[0].outcome.as_deref(), Some("cancelled"), "{t:?}");
    let hb = TaskHeartbeat {
        token: old_token,
        ..TaskHeartbeat::default()
    };
    let p = problem(a.api().heartbeat_task(&old, &hb).await);
    assert_eq!(p.status, 409, "heartbeat with the replaced task's token: {p:?}");
    let c = Complete {
        token: old_token,
        result: Value::Null,
        next: None,
    };
    let p = problem(a.api().complete(&old, &c).await);
    assert_eq!(p.status, 409, "complete with the replaced task's token: {p:?}");
    let f = Fail {
        token: old_token,
        error: "late".into(),
        retry: true,
        next: None,
    };
    let p = problem(a.api().fail(&old, &f).await);
    assert_eq!(p.status, 409, "fail with the replaced task's token: {p:?}");
    // Everything the running task held is released: its worker's index and its
    // group slot, so a replacement runs in the group of one at once.
    let held: i64 = redis
        .cmd(&["SISMEMBER", &format!("{}:node:w:tasks", task_tag("muster", &old)), &old])
        .await;
    assert_eq!(held, 0, "still in the worker's index");
    let slot: i64 = redis
        .cmd(&[
            "SISMEMBER",
            &format!("{}:group:{one}:running", name_tag("muster", &one)),
            &old,
        ])
        .await;
    assert_eq!(slot, 0, "still holds its group slot");
    let next = claim(&a, "fresh", "w", 1, 0).await;
    assert_eq!(next.len(), 1, "a replacement is claimable in the group of one");
    let claimed = next[0].id.clone();
    assert_ne!(claimed, old);
    // Queued tasks nobody claimed are replaced too.
    let n = fired(&a, "fresh").await;
    until_fired(&a, "fresh", n + 2, Duration::from_secs(10)).await;
    let end = stop(&a, "fresh").await;
    assert!(end > 0);
    let s = get(&a, "fresh").await;
    let replaced_queued: Vec<&str> = s
        .history
        .iter()
        .filter_map(|e| e.replaced.as_deref())
        .filter(|r| *r != old && *r != claimed)
        .collect();
    assert!(!replaced_queued.is_empty(), "a queued task was replaced: {s:?}");
    for r in replaced_queued {
        let t = a.api().task(r).await.unwrap();
        assert_eq!(t.state, "cancelled", "{t:?}");
        assert_eq!(t.attempts, 0, "it never ran: {t:?}");
    }
    // At most one of its tasks is live.
    let tasks = tasks_by_occurrence(&a, "fresh", "fresh").await;
    let live = tasks
        .values()
        .flatten()
        .filter(|t| ["queued", "running", "delayed"].contains(&t.state.as_str()))
        .count();
    assert!(live <= 1, "{live} live tasks");
    let events = redis.events("muster").await;
    assert!(
        events
            .iter()
            .any(|(t, _, e)| t == "task.cancelled" && e["task"] == old.as_str())
    );
}

/// Sends a raw request and asserts a problem+json answer (its content type
/// too, which the typed client does not check); returns the problem.
async fn raw_problem(req: reqwest::RequestBuilder) -> Problem {
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let ctype = resp.headers().get("content-type").cloned();
    assert_eq!(
        ctype.as_ref().and_then(|v| v.to_str().ok()),
        Some("application/problem+json"),
        "status {status}"
    );
    as_problem(status, &resp.json().await.unwrap())
}

mod api;

mod triggers;
