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

use muster::config::Config;
use serde_json::{Value, json};

use crate::common::*;
use crate::tasks::{claim, join};

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

async fn create(app: &TestApp, body: Value) -> Value {
    let (s, b) = app.post("/api/v1/schedules", body).await;
    assert_eq!(s, 201, "{b}");
    b
}

async fn get(app: &TestApp, id: &str) -> Value {
    let (s, b) = app.get(&format!("/api/v1/schedules/{id}?history=1000")).await;
    assert_eq!(s, 200, "{b}");
    b
}

async fn fired(app: &TestApp, id: &str) -> u64 {
    get(app, id).await["counts"]["fired"].as_u64().unwrap()
}

/// Waits until the schedule has fired at least `n` times.
async fn until_fired(app: &TestApp, id: &str, n: u64, within: Duration) {
    let ok = wait_until(within, || async { fired(app, id).await >= n }).await;
    let s = get(app, id).await;
    assert!(ok, "schedule {id} fired {} of {n} in {within:?}: {s}", s["counts"]);
}

/// Disables the schedule and returns its final cursor: every occurrence up
/// to it has its outcome, none after it will fire.
async fn stop(app: &TestApp, id: &str) -> i64 {
    let (s, b) = app.post(&format!("/api/v1/schedules/{id}/disable"), json!({})).await;
    assert_eq!(s, 204, "{b}");
    get(app, id).await["cursor"].as_i64().unwrap()
}

/// Moves a schedule's cursor to `cursor` and enables it: the state that all
/// nodes being down since `cursor` leaves behind.
async fn rewind(redis: &TestRedis, id: &str, cursor: i64) {
    let key = format!("{{muster}}:schedule:{id}");
    let _: i64 = redis
        .cmd(&["HSET", &key, "cursor", &cursor.to_string(), "enabled", "1"])
        .await;
}

/// Every task of a queue (any state), grouped by the occurrence in its
/// idempotency key `schedule:<id>:<T>`; a triggered task
/// (`schedule:<id>:trigger:...`) by its creation, which is its occurrence.
async fn tasks_by_occurrence(app: &TestApp, queue: &str, id: &str) -> BTreeMap<i64, Vec<Value>> {
    let mut out: BTreeMap<i64, Vec<Value>> = BTreeMap::new();
    let prefix = format!("schedule:{id}:");
    for state in ["queued", "delayed", "running", "succeeded", "cancelled", "dead"] {
        let mut cursor = String::new();
        loop {
            let (s, page) = app
                .get(&format!("/api/v1/queues/{queue}/tasks?state={state}&limit=500{cursor}"))
                .await;
            assert_eq!(s, 200, "{page}");
            for t in page["tasks"].as_array().unwrap() {
                let key = t["idempotency_key"].as_str().unwrap_or("");
                if let Some(rest) = key.strip_prefix(&prefix) {
                    let occ: i64 = if rest.starts_with("trigger:") {
                        created_at(t)
                    } else {
                        rest.parse().expect("a scheduled occurrence")
                    };
                    out.entry(occ).or_default().push(t.clone());
                }
            }
            match page["next_cursor"].as_str() {
                Some(c) => cursor = format!("&cursor={c}"),
                None => break,
            }
        }
    }
    out
}

/// Asserts one task per whole second in (from, to] and none elsewhere;
/// returns the occurrences.
fn assert_every_second_once(tasks: &BTreeMap<i64, Vec<Value>>, from: i64, to: i64) -> Vec<i64> {
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

fn created_at(t: &Value) -> i64 {
    t["created_at"].as_i64().unwrap()
}

fn every_second(id: &str, queue: &str) -> Value {
    json!({"id": id, "expression": "* * * * * *", "queue": queue})
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
    def["backfill"] = json!(true);
    def["enabled"] = json!(false);
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
        let late = created_at(&v[0]) - t;
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
    assert_eq!(s["counts"]["fired"].as_u64().unwrap() as usize, occurrences.len());
    assert_eq!(s["counts"]["missed"], 0);
    let nodes: HashSet<&str> = s["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["node"].as_str().unwrap())
        .collect();
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
    def["starting_deadline_ms"] = json!(3000);
    let from = create(&slow, def).await["cursor"].as_i64().unwrap();
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
        let late = created_at(&v[0]) - t;
        assert!(late >= 0, "occurrence {t} fired {} ms early", -late);
        assert!(late < 1500, "occurrence {t} fired {late} ms late");
    }
    assert_eq!(get(&right, "skew").await["counts"]["missed"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_nodes_killed_as_an_occurrence_falls_due_change_nothing() {
    let redis = TestRedis::start();
    let mut a = TestApp::start_with(&redis, fast).await;
    let mut b = TestApp::start_with(&redis, fast).await;
    let c = TestApp::start_with(&redis, fast).await;
    let from = create(&a, every_second("crash", "crash")).await["cursor"]
        .as_i64()
        .unwrap();
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
        let late = created_at(&v[0]) - t;
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
        create(
            &a,
            json!({"id": id, "expression": expr, "timezone": "Europe/Berlin", "queue": "dst",
                   "backfill": true, "enabled": false}),
        )
        .await;
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
    let latest = create(&a, every_second("latest", "latest")).await["cursor"]
        .as_i64()
        .unwrap();
    let mut def = every_second("all", "all");
    def["backfill"] = json!(true);
    let all = create(&a, def).await["cursor"].as_i64().unwrap();
    let mut def = every_second("recent", "recent");
    def["backfill"] = json!(true);
    def["starting_deadline_ms"] = json!(1500);
    let recent = create(&a, def).await["cursor"].as_i64().unwrap();
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
    assert_eq!(s["counts"]["missed"].as_u64().unwrap() as usize, missing.len());
    let runs: Vec<&Value> = s["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["result"] == "missed")
        .collect();
    assert_eq!(runs.len(), 1, "one history entry for the run of missed occurrences");
    assert_eq!(runs[0]["reason"], "superseded");
    assert_eq!(runs[0]["count"].as_u64().unwrap() as usize, missing.len());
    assert_eq!(runs[0]["t"], missing[0]);
    assert_eq!(runs[0]["last"], *missing.last().unwrap());

    // backfill = true: every occurrence ran, in order.
    let end = stop(&c, "all").await;
    let tasks = tasks_by_occurrence(&c, "all", "all").await;
    assert_every_second_once(&tasks, all, end);
    let order: Vec<i64> = tasks.values().map(|v| created_at(&v[0])).collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "fired in order");
    assert!(tasks.keys().filter(|t| outage(**t)).count() >= 4);
    assert_eq!(get(&c, "all").await["counts"]["missed"], 0);

    // backfill = true with a 1.5 s deadline: the older outage occurrences were
    // missed, the ones within the deadline ran.
    let end = stop(&c, "recent").await;
    let tasks = tasks_by_occurrence(&c, "recent", "recent").await;
    let expected: Vec<i64> = ((recent / 1000 + 1)..=(end / 1000)).map(|s| s * 1000).collect();
    let missing: Vec<i64> = expected.iter().copied().filter(|t| !tasks.contains_key(t)).collect();
    assert!(missing.len() >= 2, "{missing:?}");
    assert!(missing.iter().all(|t| outage(*t)));
    for (t, v) in &tasks {
        assert!(created_at(&v[0]) - t <= 1500, "occurrence {t} ran past its deadline");
    }
    let s = get(&c, "recent").await;
    for h in s["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["result"] == "missed")
    {
        assert_eq!(h["reason"], "deadline");
        assert!(h["at"].as_i64().unwrap() - h["last"].as_i64().unwrap() > 1500, "{h}");
    }
    assert_eq!(s["counts"]["missed"].as_u64().unwrap() as usize, missing.len());
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
    def["overlap"] = json!("forbid");
    create(&a, def).await;
    until_fired(&a, "solo", 1, Duration::from_secs(10)).await;
    let first = get(&a, "solo").await["last_task"].as_str().unwrap().to_string();
    // Queued, then running: every occurrence meanwhile is skipped.
    let skipped = wait_until(Duration::from_secs(10), || async {
        get(&a, "solo").await["counts"]["skipped_overlap"].as_u64().unwrap() >= 2
    })
    .await;
    assert!(skipped);
    let got = claim(&a, "solo", "w", 1, 0).await;
    assert_eq!(got[0]["id"], first.as_str());
    let s = get(&a, "solo").await;
    let n_skipped = s["counts"]["skipped_overlap"].as_u64().unwrap();
    let more = wait_until(Duration::from_secs(10), || async {
        get(&a, "solo").await["counts"]["skipped_overlap"].as_u64().unwrap() >= n_skipped + 2
    })
    .await;
    assert!(more, "skipped while running too");
    assert_eq!(
        fired(&a, "solo").await,
        1,
        "nothing fired while the first task was live"
    );
    let s = get(&a, "solo").await;
    let h = s["history"].as_array().unwrap();
    assert!(
        h.iter()
            .any(|e| e["result"] == "skipped_overlap" && e["task"] == first.as_str())
    );
    // Trigger now obeys the policy too.
    let (st, body) = a.post("/api/v1/schedules/solo/trigger", json!({})).await;
    assert_eq!(st, 409, "{body}");
    assert_eq!(body["task"], first.as_str());
    // Once it finishes, the next occurrence fires.
    let (st, body) = a
        .post(
            &format!("/api/v1/tasks/{first}/complete"),
            json!({"token": got[0]["token"]}),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    until_fired(&a, "solo", 2, Duration::from_secs(10)).await;
    let second = get(&a, "solo").await["last_task"].as_str().unwrap().to_string();
    assert_ne!(second, first);
    let (_, t) = a.get(&format!("/api/v1/tasks/{second}")).await;
    assert_eq!(t["state"], "queued");
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
    // A group of one: the replacement can only run if the old task's slot is freed.
    a.put("/api/v1/groups/one", json!({"limit": 1})).await;
    let mut def = every_second("fresh", "fresh");
    def["overlap"] = json!("replace");
    def["task"] = json!({"payload": {"kind": "refresh"}, "group": "one"});
    def["enabled"] = json!(false);
    create(&a, def).await;
    let (st, _) = a.post("/api/v1/schedules/fresh/trigger", json!({})).await;
    assert_eq!(st, 201);
    let got = claim(&a, "fresh", "w", 1, 0).await;
    let old = got[0]["id"].as_str().unwrap().to_string();
    let old_token = got[0]["token"].as_u64().unwrap();
    assert_eq!(got[0]["payload"]["kind"], "refresh");
    // The next occurrence replaces the running task.
    let (st, _) = a.post("/api/v1/schedules/fresh/enable", json!({})).await;
    assert_eq!(st, 204);
    let replaced = wait_until(Duration::from_secs(10), || async {
        let (_, t) = a.get(&format!("/api/v1/tasks/{old}")).await;
        t["state"] == "cancelled"
    })
    .await;
    assert!(replaced, "the running task is cancelled");
    let (_, t) = a.get(&format!("/api/v1/tasks/{old}")).await;
    assert_eq!(t["attempt_log"][0]["outcome"], "cancelled", "{t}");
    for (action, body) in [
        ("heartbeat", json!({"token": old_token})),
        ("complete", json!({"token": old_token})),
        ("fail", json!({"token": old_token, "error": "late"})),
    ] {
        let (st, reply) = a.post(&format!("/api/v1/tasks/{old}/{action}"), body).await;
        assert_eq!(st, 409, "{action} with the replaced task's token: {reply}");
    }
    // Everything the running task held is released: its worker's index and its
    // group slot, so a replacement runs in the group of one at once.
    let held: i64 = redis.cmd(&["SISMEMBER", "{muster}:node:w:tasks", &old]).await;
    assert_eq!(held, 0, "still in the worker's index");
    let slot: i64 = redis.cmd(&["SISMEMBER", "{muster}:group:one:running", &old]).await;
    assert_eq!(slot, 0, "still holds its group slot");
    let next = claim(&a, "fresh", "w", 1, 0).await;
    assert_eq!(next.len(), 1, "a replacement is claimable in the group of one");
    let claimed = next[0]["id"].as_str().unwrap().to_string();
    assert_ne!(claimed, old);
    // Queued tasks nobody claimed are replaced too.
    let n = fired(&a, "fresh").await;
    until_fired(&a, "fresh", n + 2, Duration::from_secs(10)).await;
    let end = stop(&a, "fresh").await;
    assert!(end > 0);
    let s = get(&a, "fresh").await;
    let replaced_queued: Vec<&str> = s["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["replaced"].as_str())
        .filter(|r| *r != old && *r != claimed)
        .collect();
    assert!(!replaced_queued.is_empty(), "a queued task was replaced: {s}");
    for r in replaced_queued {
        let (_, t) = a.get(&format!("/api/v1/tasks/{r}")).await;
        assert_eq!(t["state"], "cancelled", "{t}");
        assert_eq!(t["attempts"], 0, "it never ran: {t}");
    }
    // At most one of its tasks is live.
    let tasks = tasks_by_occurrence(&a, "fresh", "fresh").await;
    let live = tasks
        .values()
        .flatten()
        .filter(|t| ["queued", "running", "delayed"].contains(&t["state"].as_str().unwrap()))
        .count();
    assert!(live <= 1, "{live} live tasks");
    let events = redis.events("muster").await;
    assert!(
        events
            .iter()
            .any(|(t, _, e)| t == "task.cancelled" && e["task"] == old.as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_schedules_get_400_saying_what_is_wrong() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let base = json!({"id": "ok", "expression": "*/5 * * * *", "queue": "q"});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let cases = [
        (with("expression", json!("61 * * * *")), "expression"),
        (with("expression", json!("* * * *")), "expression"),
        (with("expression", json!("* * * * * * *")), "expression"),
        (with("expression", json!("0 0 30 2 *")), "never matches"),
        (with("timezone", json!("Europe/Berlni")), "timezone"),
        (with("timezone", json!("CEST+2")), "timezone"),
        (with("id", json!("a:b")), "`id`"),
        (with("queue", json!("no spaces")), "`queue`"),
        (with("overlap", json!("sometimes")), "sometimes"),
        (with("starting_deadline_ms", json!(0)), "starting_deadline_ms"),
        (with("starting_deadline_ms", json!(500)), "starting_deadline_ms"),
        (with("task", json!({"priority": 5000})), "priority"),
        (with("task", json!({"alias": "x"})), "alias"),
        (with("task", json!({"group": "a b"})), "group"),
        (with("surprise", json!(1)), "surprise"),
    ];
    for (body, needle) in cases {
        let (s, b) = a.post("/api/v1/schedules", body.clone()).await;
        assert_eq!(s, 400, "{body} -> {b}");
        let detail = b["detail"].as_str().unwrap();
        assert!(detail.contains(needle), "{body}: {detail:?} should mention {needle:?}");
    }
    let (s, b) = a.put("/api/v1/schedules/other", base.clone()).await;
    assert_eq!(s, 400, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("differs"));
    let (s, _) = a.post("/api/v1/schedules", base.clone()).await;
    assert_eq!(s, 201);
    let (s, b) = a.post("/api/v1/schedules", base.clone()).await;
    assert_eq!(s, 409, "{b}");
    for (method, path) in [
        ("GET", "/api/v1/schedules/nope"),
        ("DELETE", "/api/v1/schedules/nope"),
        ("POST", "/api/v1/schedules/nope/trigger"),
        ("POST", "/api/v1/schedules/nope/enable"),
    ] {
        let (s, b) = send(a.request(method.parse().unwrap(), path).json(&json!({}))).await;
        assert_eq!(s, 404, "{method} {path}: {b}");
    }
    let (s, _) = a.get("/api/v1/schedules/bad:id").await;
    assert_eq!(s, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_api_config_pages_trigger_and_events() {
    let redis = TestRedis::start();
    let from_config = |c: &mut Config| {
        fast(c);
        let text = r#"
            [[schedules.items]]
            id = "nightly"
            expression = "0 3 * * *"
            timezone = "Europe/Berlin"
            queue = "reports"
            task = { payload = { kind = "nightly" }, max_attempts = 2 }
            overlap = "forbid"
        "#;
        let parsed = Config::from_toml(text).unwrap();
        c.schedules.items = parsed.schedules.items;
    };
    let a = TestApp::start_with(&redis, from_config).await;
    // Config schedules are in Redis when the node serves; the API may not change them.
    let s = get(&a, "nightly").await;
    assert_eq!(s["source"], "config");
    assert_eq!(s["timezone"], "Europe/Berlin");
    assert_eq!(s["overlap"], "forbid");
    assert_eq!(s["task"]["payload"]["kind"], "nightly");
    let next: Vec<i64> = s["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(next.len(), 5);
    for w in next.windows(2) {
        // 03:00 Berlin every day: 23, 24 or 25 hours apart.
        let gap = w[1] - w[0];
        assert!([23, 24, 25].map(|h| h * 3_600_000).contains(&gap), "{gap}");
    }
    let (st, b) = a
        .put(
            "/api/v1/schedules/nightly",
            json!({"expression": "0 4 * * *", "queue": "reports"}),
        )
        .await;
    assert_eq!(st, 409, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("config.toml"));
    let (st, _) = a.delete("/api/v1/schedules/nightly").await;
    assert_eq!(st, 409);
    // A second node with the same config leaves it alone (no new version).
    let b2 = TestApp::start_with(&redis, from_config).await;
    assert_eq!(get(&b2, "nightly").await["version"], s["version"]);
    // An operator's disable stands across restarts until the entry changes.
    let (st, _) = a.post("/api/v1/schedules/nightly/disable", json!({})).await;
    assert_eq!(st, 204);
    let c3 = TestApp::start_with(&redis, from_config).await;
    assert_eq!(get(&c3, "nightly").await["enabled"], false);
    let (st, _) = c3.post("/api/v1/schedules/nightly/enable", json!({})).await;
    assert_eq!(st, 204);

    // API schedules: create, list, replace, trigger, delete.
    let created = create(
        &a,
        json!({"id": "hourly", "expression": "*/5 * * * *", "timezone": "UTC", "queue": "jobs",
               "task": {"payload": {"n": 1}, "priority": 7}}),
    )
    .await;
    assert_eq!(created["source"], "api");
    assert!(
        created["description"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("every 5 minutes")
    );
    let (_, list) = a.get("/api/v1/schedules").await;
    let ids: Vec<&str> = list["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["hourly", "nightly"]);
    let (st, replaced) = a
        .put(
            "/api/v1/schedules/hourly",
            json!({"expression": "0 * * * *", "queue": "jobs"}),
        )
        .await;
    assert_eq!(st, 200, "{replaced}");
    assert_eq!(replaced["expression"], "0 * * * *");
    assert!(replaced["version"].as_u64() > created["version"].as_u64());
    // A new expression starts a new timeline: its past is not an outage.
    assert_eq!(replaced["cursor"], replaced["updated_at"]);
    // Other changes keep the cursor: outcomes stand, pending occurrences stay pending.
    let (st, again) = a
        .put(
            "/api/v1/schedules/hourly",
            json!({"expression": "0 * * * *", "queue": "jobs", "task": {"priority": 3}}),
        )
        .await;
    assert_eq!(st, 200, "{again}");
    assert_eq!(again["cursor"], replaced["cursor"]);
    assert_eq!(again["task"]["priority"], 3);
    let (st, t) = a.post("/api/v1/schedules/hourly/trigger", json!({})).await;
    assert_eq!(st, 201, "{t}");
    assert_eq!(t["queue"], "jobs");
    let task_id = t["task"].as_str().unwrap();
    let (_, task) = a.get(&format!("/api/v1/tasks/{task_id}")).await;
    assert_eq!(task["queue"], "jobs");
    assert_eq!(task["state"], "queued");
    assert_eq!(
        task["idempotency_key"],
        format!("schedule:hourly:trigger:{task_id}").as_str()
    );
    assert_eq!(task["created_at"], t["occurrence"]);
    assert_eq!(t["replayed"], false);
    let s = get(&a, "hourly").await;
    assert_eq!(s["counts"]["fired"], 1);
    assert_eq!(s["last_task"], task_id);
    assert_eq!(s["history"][0]["manual"], true);
    let (st, _) = a
        .put(
            "/api/v1/schedules/new-one",
            json!({"expression": "0 * * * *", "queue": "jobs"}),
        )
        .await;
    assert_eq!(st, 201);

    // The pages.
    let page = |path: &str| {
        let req = a.http.get(format!("{}{path}", a.url));
        async move { req.send().await.unwrap().text().await.unwrap() }
    };
    let html = page("/schedules").await;
    assert!(html.contains("href=\"/schedules/nightly\"") && html.contains(">config<"));
    assert!(html.contains("Schedules") && html.contains("/ui/schedules/hourly/trigger"));
    let html = page("/schedules/hourly").await;
    assert!(
        html.contains(&format!("/tasks/{task_id}")),
        "the last fire links its task"
    );
    assert!(html.contains("trigger now") && html.contains("Next fire times"));
    assert!(html.contains(a.node_id.as_str()), "the history names the node");
    let html = page("/schedules/nightly").await;
    assert!(
        html.contains("03:00:00 CET") || html.contains("03:00:00 CEST"),
        "local fire times"
    );
    assert!(
        !html.contains("/ui/schedules/nightly/delete"),
        "no delete for a config schedule"
    );

    let (st, _) = a.delete("/api/v1/schedules/hourly").await;
    assert_eq!(st, 204);
    let (st, _) = a.get("/api/v1/schedules/hourly").await;
    assert_eq!(st, 404);
    let events = redis.events("muster").await;
    for ty in [
        "schedule.created",
        "schedule.updated",
        "schedule.fired",
        "schedule.disabled",
        "schedule.deleted",
    ] {
        assert!(events.iter().any(|(t, _, _)| t == ty), "{ty}");
    }
    let doc = a.get("/api/v1/openapi.json").await.1;
    for p in [
        "/api/v1/schedules",
        "/api/v1/schedules/{id}",
        "/api/v1/schedules/{id}/trigger",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} in the OpenAPI document");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g4_schedule_keys_return_to_baseline() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| {
        fast(c);
        c.schedules.max_skew_ms = 400;
        c.schedules.record_ttl_ms = 1000;
        c.schedules.history_max = 5;
        c.tasks.retention_ms = 500;
        c.tasks.idempotency_window_ms = 1000;
    })
    .await;
    join(&a, "w").await;
    // Warm up: the counters and the event stream exist from the first task on.
    let (st, _) = a.post("/api/v1/queues/warm/tasks", json!({})).await;
    assert_eq!(st, 201);
    let t = claim(&a, "warm", "w", 1, 0).await;
    a.post(
        &format!("/api/v1/tasks/{}/complete", t[0]["id"].as_str().unwrap()),
        json!({"token": t[0]["token"]}),
    )
    .await;
    let settled = wait_until(Duration::from_secs(10), || async {
        let keys: Vec<String> = redis.cmd(&["KEYS", "*"]).await;
        !keys.iter().any(|k| k.contains(":q:warm") || k.contains(":task:"))
    })
    .await;
    assert!(settled);
    let baseline: HashSet<String> = redis.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect();
    create(&a, every_second("leak", "leak")).await;
    until_fired(&a, "leak", 8, Duration::from_secs(20)).await;
    // While it runs: the history is bounded and the records expire.
    let hist: i64 = redis.cmd(&["LLEN", "{muster}:schedule:leak:history"]).await;
    assert!(hist <= 5, "history of {hist}");
    let records: Vec<String> = redis.cmd(&["KEYS", "{muster}:schedule:leak:fire:*"]).await;
    assert!(records.len() <= 3, "records outlive their TTL: {records:?}");
    for r in &records {
        let ttl: i64 = redis.cmd(&["PTTL", r]).await;
        assert!(ttl > 0 && ttl <= 1000, "{r} has PTTL {ttl}");
    }
    let (st, _) = a.delete("/api/v1/schedules/leak").await;
    assert_eq!(st, 204);
    // Work off the tasks it submitted.
    loop {
        let got = claim(&a, "leak", "w", 100, 0).await;
        if got.is_empty() {
            break;
        }
        let items: Vec<Value> = got
            .iter()
            .map(|t| json!({"id": t["id"], "token": t["token"]}))
            .collect();
        a.post("/api/v1/tasks/complete", Value::Array(items)).await;
    }
    let back = wait_until(Duration::from_secs(20), || async {
        let now: HashSet<String> = redis.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect();
        now == baseline
    })
    .await;
    let now: HashSet<String> = redis.cmd::<Vec<String>>(&["KEYS", "*"]).await.into_iter().collect();
    let extra: Vec<_> = now.difference(&baseline).take(10).collect();
    assert!(back, "keys left over: {extra:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_script_outcomes_and_limits() {
    let redis = TestRedis::start();
    // The node's own scheduler proposes nothing: its clock is a day behind, so
    // no occurrence after a cursor of today is within its reach. The test
    // calls the script itself.
    let a = TestApp::start_with(&redis, |c| {
        c.schedules.clock_offset_ms = -86_400_000;
        c.schedules.max_schedules = 2;
        c.tasks.max_queues = 1;
    })
    .await;
    let mut def = every_second("direct", "direct");
    def["enabled"] = json!(false);
    let created = create(&a, def).await;
    let v = created["version"].as_u64().unwrap();
    let s = &a.state().schedules;
    let now = redis_now(&redis).await;
    let t1 = now - now.rem_euclid(1000) - 3000;
    let occ = [t1, t1 + 1000];
    // -3 disabled, -1 unknown, -2 changed since the caller read it.
    assert_eq!(s.fire("direct", v, &occ, Some(t1 + 2000)).await.unwrap().code, -3);
    assert_eq!(s.fire("nope", v, &occ, Some(t1 + 2000)).await.unwrap().code, -1);
    rewind(&redis, "direct", t1 - 1000).await;
    assert_eq!(s.fire("direct", v + 1, &occ, Some(t1 + 2000)).await.unwrap().code, -2);
    // 1: both due (3 s late is on time within max_skew_ms), both fired.
    let r = s.fire("direct", v, &occ, Some(t1 + 2000)).await.unwrap();
    assert_eq!((r.code, r.fired, r.cursor), (1, 2, t1 + 1000));
    // The same proposal again, from any node, changes nothing; each of the three
    // guards is enough on its own: the cursor, the occurrence records (SET NX),
    // the tasks' idempotency keys. Each step hides the other two.
    let records: Vec<String> = occ
        .iter()
        .map(|t| format!("{{muster}}:schedule:direct:fire:{t}"))
        .collect();
    let idem: Vec<String> = occ
        .iter()
        .map(|t| format!("{{muster}}:idem:schedule:direct:{t}"))
        .collect();
    let hide = |keys: Vec<String>| {
        let redis = &redis;
        async move {
            for k in keys {
                let _: () = redis.cmd(&["RENAME", &k, &format!("{k}.hidden")]).await;
            }
        }
    };
    let unhide = |keys: Vec<String>| {
        let redis = &redis;
        async move {
            for k in keys {
                let _: () = redis.cmd(&["RENAME", &format!("{k}.hidden"), &k]).await;
            }
        }
    };
    // The cursor alone.
    hide([records.clone(), idem.clone()].concat()).await;
    let r = s.fire("direct", v, &occ, Some(t1 + 2000)).await.unwrap();
    assert_eq!((r.code, r.fired, r.skipped, r.missed), (1, 0, 0, 0), "the cursor");
    unhide([records.clone(), idem.clone()].concat()).await;
    // The occurrence records alone.
    rewind(&redis, "direct", t1 - 1000).await;
    hide(idem.clone()).await;
    let r = s.fire("direct", v, &occ, Some(t1 + 2000)).await.unwrap();
    assert_eq!(
        (r.code, r.fired, r.skipped, r.missed),
        (1, 0, 0, 0),
        "the occurrence records"
    );
    unhide(idem.clone()).await;
    // The idempotency keys alone.
    rewind(&redis, "direct", t1 - 1000).await;
    for k in &records {
        let _: i64 = redis.cmd(&["DEL", k]).await;
    }
    let r = s.fire("direct", v, &occ, Some(t1 + 2000)).await.unwrap();
    assert_eq!(
        (r.code, r.fired, r.skipped, r.missed),
        (1, 0, 0, 0),
        "the idempotency keys"
    );
    let tasks = tasks_by_occurrence(&a, "direct", "direct").await;
    assert_eq!(tasks.keys().copied().collect::<Vec<_>>(), occ.to_vec());
    assert!(tasks.values().all(|v| v.len() == 1));
    // 0: not due yet, with the wait in Redis time.
    let future = redis_now(&redis).await + 5000;
    let r = s.fire("direct", v, &[future], None).await.unwrap();
    assert_eq!(r.code, 0);
    assert!(r.wait_ms > 3000 && r.wait_ms <= 5000, "{}", r.wait_ms);
    assert_eq!(fired(&a, "direct").await, 2);

    // Limits: schedules (upsert -3) and queues (trigger -5, fire: missed).
    let mut other = every_second("other", "other");
    other["enabled"] = json!(false);
    let v2 = create(&a, other).await["version"].as_u64().unwrap();
    let (st, b) = a.post("/api/v1/schedules", every_second("third", "direct")).await;
    assert_eq!(st, 409, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("schedules.max_schedules"));
    let (st, b) = a.post("/api/v1/schedules/other/trigger", json!({})).await;
    assert_eq!(st, 409, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("tasks.max_queues"));
    rewind(&redis, "other", t1 - 1000).await;
    let r = s.fire("other", v2, &occ, Some(t1 + 2000)).await.unwrap();
    assert_eq!((r.code, r.fired, r.missed), (1, 0, 2));
    let h = &get(&a, "other").await["history"][0];
    assert_eq!(
        (h["result"].as_str(), h["reason"].as_str()),
        (Some("missed"), Some("too_many_queues"))
    );
}

/// A config-defined schedule `x` (03:00 Berlin) on node A's config only.
fn with_config_x(c: &mut Config) {
    fast(c);
    let text = r#"
        [[schedules.items]]
        id = "x"
        expression = "0 3 * * *"
        timezone = "Europe/Berlin"
        queue = "reports"
    "#;
    c.schedules.items = Config::from_toml(text).unwrap().schedules.items;
}

/// Sends a request and asserts a problem+json answer; returns status and body.
async fn problem(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let ctype = resp.headers().get("content-type").cloned();
    assert_eq!(
        ctype.as_ref().and_then(|v| v.to_str().ok()),
        Some("application/problem+json"),
        "status {status}"
    );
    (status, resp.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_schedules_are_protected_on_nodes_whose_config_lacks_them() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, with_config_x).await;
    let b = TestApp::start_with(&redis, fast).await;
    let before = get(&b, "x").await;
    assert_eq!(before["source"], "config");
    let events_before = redis.events("muster").await.len();
    // Through B, whose config.toml does not list x: every change is refused.
    use reqwest::Method;
    let def = json!({"expression": "*/5 * * * *", "queue": "elsewhere"});
    let (st, body) = problem(b.request(Method::DELETE, "/api/v1/schedules/x")).await;
    assert_eq!(st, 409, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("config.toml") && detail.contains("?force=true"),
        "{detail}"
    );
    let (st, body) = problem(b.request(Method::PUT, "/api/v1/schedules/x").json(&def)).await;
    assert_eq!(st, 409, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("config.toml"), "{body}");
    let mut created = def.clone();
    created["id"] = json!("x");
    let (st, body) = problem(b.request(Method::POST, "/api/v1/schedules").json(&created)).await;
    assert_eq!(st, 409, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("config.toml"), "{body}");
    // Nothing changed.
    let after = get(&b, "x").await;
    for f in ["version", "expression", "queue", "source", "updated_at"] {
        assert_eq!(after[f], before[f], "{f}");
    }
    assert_eq!(
        redis.events("muster").await.len(),
        events_before,
        "no event: nothing happened"
    );
    // Enable and disable still work from any node.
    assert_eq!(b.post("/api/v1/schedules/x/disable", json!({})).await.0, 204);
    assert_eq!(b.post("/api/v1/schedules/x/enable", json!({})).await.0, 204);
    // A node that lists it refuses even with `force` (it would write it back
    // at its next start); once the entry is gone from every config, `force`
    // deletes it.
    let (st, body) = a.delete("/api/v1/schedules/x?force=true").await;
    assert_eq!(st, 409, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("this node's config.toml"));
    assert_eq!(b.delete("/api/v1/schedules/x?force=true").await.0, 204);
    assert_eq!(b.get("/api/v1/schedules/x").await.0, 404);
    // An API schedule is still deleted without ceremony.
    create(&b, json!({"id": "api", "expression": "0 3 * * *", "queue": "q"})).await;
    assert_eq!(b.delete("/api/v1/schedules/api").await.0, 204);
}

/// Triggers `id` `n` times at once; returns each answer's status and body.
async fn trigger_at_once(app: &TestApp, id: &str, n: usize) -> Vec<(u16, Value)> {
    let path = format!("/api/v1/schedules/{id}/trigger");
    futures_util::future::join_all((0..n).map(|_| app.post(&path, json!({})))).await
}

/// Schedule `id` that only fires when triggered (disabled), with `overlap`.
async fn manual(app: &TestApp, id: &str, overlap: &str) {
    create(
        app,
        json!({"id": id, "expression": "0 3 * * *", "queue": id, "overlap": overlap, "enabled": false}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_at_the_same_moment_are_distinct_triggers() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, fast).await;
    // Redis runs a trigger in well under a millisecond: calls that arrive
    // together share Redis milliseconds, which once made them share an
    // idempotency key (and so a task).
    manual(&a, "many", "allow").await;
    let answers = trigger_at_once(&a, "many", 30).await;
    let mut tasks = HashSet::new();
    let mut occurrences = BTreeMap::<i64, usize>::new();
    for (st, t) in &answers {
        assert_eq!(*st, 201, "{t}");
        assert_eq!(t["replayed"], false);
        assert!(t.get("replaced").is_none(), "nothing to replace under allow: {t}");
        tasks.insert(t["task"].as_str().unwrap().to_string());
        *occurrences.entry(t["occurrence"].as_i64().unwrap()).or_default() += 1;
    }
    assert_eq!(tasks.len(), 30, "one task per trigger");
    for id in &tasks {
        let (_, t) = a.get(&format!("/api/v1/tasks/{id}")).await;
        assert_eq!(t["state"], "queued", "{t}");
        assert_eq!(t["idempotency_key"], format!("schedule:many:trigger:{id}").as_str());
    }
    let s = get(&a, "many").await;
    assert_eq!(s["counts"]["fired"], 30);
    assert_eq!(s["history"].as_array().unwrap().len(), 30);
    let fired = redis
        .events("muster")
        .await
        .into_iter()
        .filter(|(ty, _, e)| ty == "schedule.fired" && e["schedule"] == "many")
        .count();
    assert_eq!(fired, 30);
    println!("30 triggers fell in {} Redis milliseconds", occurrences.len());

    // Under replace, each trigger cancels the one before it, and says so: in
    // the end exactly one task is live, and every other was replaced by a
    // trigger that reported it.
    manual(&a, "swap", "replace").await;
    let answers = trigger_at_once(&a, "swap", 30).await;
    let mut tasks = HashSet::new();
    let mut replaced = HashSet::new();
    for (st, t) in &answers {
        assert_eq!(*st, 201, "{t}");
        tasks.insert(t["task"].as_str().unwrap().to_string());
        if let Some(r) = t["replaced"].as_str() {
            assert!(replaced.insert(r.to_string()), "{r} replaced twice");
        }
    }
    assert_eq!(tasks.len(), 30, "one task per trigger");
    let last = get(&a, "swap").await["last_task"].as_str().unwrap().to_string();
    let mut live = Vec::new();
    for id in &tasks {
        let (_, t) = a.get(&format!("/api/v1/tasks/{id}")).await;
        match t["state"].as_str().unwrap() {
            "queued" => live.push(id.clone()),
            "cancelled" => assert!(replaced.contains(id), "{id} cancelled but no trigger said so"),
            other => panic!("{id} is {other}"),
        }
    }
    assert_eq!(live, vec![last.clone()], "only the last trigger's task is live");
    let expected: HashSet<String> = tasks.iter().filter(|t| **t != last).cloned().collect();
    assert_eq!(replaced, expected, "every other task was reported replaced");
    assert_eq!(get(&a, "swap").await["counts"]["fired"], 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_retried_with_its_idempotency_key_returns_the_same_task() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, fast).await;
    // Replace would cancel the first task if a retry fired again.
    manual(&a, "once", "replace").await;
    let trigger = |key: &str| {
        let req = a
            .request(reqwest::Method::POST, "/api/v1/schedules/once/trigger")
            .header("Idempotency-Key", key)
            .json(&json!({}));
        send(req)
    };
    let (st, first) = trigger("run-42").await;
    assert_eq!(st, 201, "{first}");
    assert_eq!(first["replayed"], false);
    let task = first["task"].as_str().unwrap().to_string();
    let events = redis.events("muster").await.len();
    // The client lost the answer and retries: the same task, nothing fired.
    for _ in 0..3 {
        let (st, again) = trigger("run-42").await;
        assert_eq!(st, 200, "{again}");
        assert_eq!(again["replayed"], true);
        for f in ["task", "queue", "occurrence", "schedule"] {
            assert_eq!(again[f], first[f], "{f}");
        }
        assert!(again.get("replaced").is_none());
    }
    let (_, t) = a.get(&format!("/api/v1/tasks/{task}")).await;
    assert_eq!(t["state"], "queued", "not replaced by a retry: {t}");
    assert_eq!(t["idempotency_key"], "schedule:once:trigger:key:run-42");
    let s = get(&a, "once").await;
    assert_eq!(s["counts"]["fired"], 1);
    assert_eq!(s["history"].as_array().unwrap().len(), 1);
    assert_eq!(redis.events("muster").await.len(), events, "a replay emits nothing");
    // Another key is another trigger (which replaces the first task).
    let (st, second) = trigger("run-43").await;
    assert_eq!(st, 201, "{second}");
    assert_ne!(second["task"], first["task"]);
    assert_eq!(second["replaced"], task.as_str());
    // The first key still names the first task, now cancelled.
    let (st, again) = trigger("run-42").await;
    assert_eq!((st, again["task"].as_str()), (200, Some(task.as_str())));
    assert_eq!(get(&a, "once").await["counts"]["fired"], 2);
    // The key is validated like a task's idempotency key.
    for bad in ["has space", &"k".repeat(201)] {
        let req = a
            .request(reqwest::Method::POST, "/api/v1/schedules/once/trigger")
            .header("Idempotency-Key", bad);
        let (st, body) = problem(req).await;
        assert_eq!(st, 400, "{body}");
        assert!(body["detail"].as_str().unwrap().contains("Idempotency-Key"), "{body}");
    }
    assert_eq!(
        get(&a, "once").await["counts"]["fired"],
        2,
        "a refused key fires nothing"
    );
}
