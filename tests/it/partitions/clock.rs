//! A node's clock jumps an hour under libfaketime: cron fires once, leases hold (Redis time decides, G7/G11).

use super::*;
use crate::common::skip_on_cluster;

/// How far the time of day in an HTTP `Date` header (`Mon, 23 Nov 2026
/// 21:45:12 GMT`) is from this process's clock, in seconds, within ±12 h.
fn date_offset_s(date: &str) -> Option<i64> {
    let hms = date.split_whitespace().nth(4)?;
    let mut it = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (h, m, s) = (it.next()??, it.next()??, it.next()??);
    let theirs = h * 3600 + m * 60 + s;
    let ours = (wall_ms() / 1000) % 86_400;
    Some((theirs - ours + 86_400 + 43_200) % 86_400 - 43_200)
}

/// libfaketime's library, if installed (Debian's `libfaketime`).
fn libfaketime() -> Option<&'static str> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
}

/// A node's wall clock jumping an hour ahead, then an hour behind, while it
/// runs (libfaketime reading its offset from a file at every call; the
/// monotonic clock is left alone, as an NTP step would). G7: each
/// occurrence of an every-second schedule fires exactly once, none before
/// it is due by Redis time, none missed. G11: leases are judged by Redis
/// time only: the node and a worker that heartbeats through it are never
/// taken for dead, and the worker's task is still its own after the jumps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_clock_jumps_an_hour_cron_fires_once_leases_hold() {
    if skip_on_cluster("network namespaces around one Redis server") {
        return;
    }
    const TEST: &str = "node_clock_jumps_an_hour_cron_fires_once_leases_hold";
    let Some(lib) = libfaketime() else {
        if std::env::var("MUSTER_REQUIRE_NETNS").as_deref() == Ok("1") {
            panic!("{TEST}: libfaketime is required (MUSTER_REQUIRE_NETNS=1) but not installed");
        }
        eprintln!("SKIP {TEST}: libfaketime is not installed (apt-get install -y faketime)");
        return;
    };
    let t0 = Instant::now();
    let redis = TestRedis::start();
    let lo = Host {
        label: "loopback".into(),
        ip: Ipv4Addr::LOCALHOST,
        ns: None,
    };
    let offset = tempfile::NamedTempFile::new().unwrap();
    let jump = |s: &str| std::fs::write(offset.path(), format!("{s}\n")).unwrap();
    jump("+0");
    let p = std::process::id();
    let env = [
        ("LD_PRELOAD", lib.to_string()),
        ("FAKETIME_TIMESTAMP_FILE", offset.path().display().to_string()),
        ("FAKETIME_NO_CACHE", "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
    ];
    // A node lives 2 s without a heartbeat: an hour's jump is 1800 ttls.
    let cfg = "[nodes]\nttl_ms = 2000\n[redis]\ntimeout_ms = 1000\n";
    let n1 = NsNode::start(&lo, &format!("clock-n1-{p}"), &redis.url(), cfg, &env).await;
    let n2 = NsNode::start(&lo, &format!("clock-n2-{p}"), &redis.url(), cfg, &[]).await;
    let admin = reqwest::Client::new();
    let sched = format!("every-second-{p}");
    let r = admin
        .post(format!("{}/api/v1/schedules", n2.url))
        .bearer_auth(ADMIN)
        .json(&json!({"id": sched, "expression": "* * * * * *", "queue": "tick", "task": {"payload": {}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());

    // A worker on n1 only, holding one task across the jumps.
    let w = Worker::new(
        &Host {
            label: format!("clock-w-{p}"),
            ..lo.clone()
        },
        &[&n1],
        Duration::from_secs(3),
    );
    const WTTL: u64 = 1500;
    let stop = Arc::new(AtomicBool::new(false));
    assert!(w.heartbeat(WTTL).await);
    let hb = w.heartbeats(WTTL, stop.clone());
    submit(&n2, "held", 1, &format!("clock-{p}"), json!({})).await;
    let (s, b) = w
        .any(
            reqwest::Method::POST,
            "/api/v1/queues/held/claim",
            &json!({"node": w.id, "max": 1}),
        )
        .await
        .unwrap();
    assert_eq!(s, 200, "{b}");
    let (tid, tok) = {
        let t = &claimed(&b)[0];
        (t.id.clone(), t.token)
    };

    let mut marks = vec![("start", wall_ms())];
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for (label, off) in [("+1h", "+3600"), ("-1h", "-3600"), ("back", "+0")] {
        jump(off);
        marks.push((label, wall_ms()));
        // The jump reached the node: hyper's Date header comes from its
        // clock. (hyper caches the header until its clock passes the next
        // second, so after a step back it stays put: a step back is checked
        // on `date` under the same preload instead.)
        let want: i64 = off.parse::<i64>().unwrap();
        let seen = if off == "+3600" {
            wait_until(Duration::from_secs(3), || async {
                let Ok(r) = admin.get(format!("{}/readyz", n1.url)).send().await else {
                    return false;
                };
                let date = r
                    .headers()
                    .get("date")
                    .and_then(|d| d.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                date_offset_s(&date).is_some_and(|d| (d - want).abs() <= 5)
            })
            .await
        } else {
            let out = std::process::Command::new("date")
                .arg("+%s")
                .envs(env.iter().cloned())
                .output()
                .unwrap();
            let t: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
            (t - wall_ms() / 1000 - want).abs() <= 5
        };
        assert!(seen, "the clock under libfaketime did not move to {off}");
        let until = Instant::now() + Duration::from_millis(3500);
        while Instant::now() < until {
            let (s, b) = w
                .any(
                    reqwest::Method::POST,
                    &format!("/api/v1/tasks/{tid}/heartbeat"),
                    &json!({"token": tok}),
                )
                .await
                .unwrap_or((0, Value::Null));
            assert_eq!(s, 200, "the worker's task heartbeat through n1 at clock {label}: {b}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let (s, b) = w
        .any(
            reqwest::Method::POST,
            &format!("/api/v1/tasks/{tid}/complete"),
            &json!({"token": tok}),
        )
        .await
        .unwrap();
    assert_eq!(s, 200, "the worker's task is still its own after the jumps: {b}");
    stop.store(true, Ordering::Relaxed);
    hb.abort();

    let mut c = redis.conn().await;
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let redis_now = secs * 1000 + micros / 1000;
    let evs = events_at(&redis.url()).await;
    let mut fired: BTreeMap<i64, Vec<(i64, String)>> = BTreeMap::new();
    for (ms, ty, node, f) in &evs {
        if ty == "schedule.fired" && f.get("schedule") == Some(&sched) {
            fired
                .entry(data(f)["occurrence"].as_i64().unwrap())
                .or_default()
                .push((*ms, node.clone()));
        }
    }
    let twice: Vec<_> = fired.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "{} occurrences fired more than once, first: {:?}",
        twice.len(),
        &twice[..twice.len().min(5)]
    );
    let early: Vec<_> = fired.iter().filter(|(t, v)| v[0].0 < **t).collect();
    assert!(
        early.is_empty(),
        "occurrences fired before they were due by Redis time: {early:?}"
    );
    let future: Vec<_> = fired.keys().filter(|t| **t > redis_now).collect();
    assert!(
        future.is_empty(),
        "{} occurrences of the future fired, first: {:?}",
        future.len(),
        &future[..future.len().min(5)]
    );
    let occ: Vec<i64> = fired.keys().copied().collect();
    let gaps: Vec<_> = occ.windows(2).filter(|w| w[1] - w[0] != 1000).collect();
    assert!(
        gaps.is_empty(),
        "occurrences skipped between: {:?}",
        &gaps[..gaps.len().min(5)]
    );
    let first = marks[0].1;
    assert!(
        occ.first().is_some_and(|t| *t <= first + 1500) && occ.last().is_some_and(|t| *t >= redis_now - 1500),
        "the schedule fired through the whole run ({} occurrences: {:?} .. {:?}, run {first} .. {redis_now})",
        occ.len(),
        occ.first(),
        occ.last()
    );
    let missed = evs
        .iter()
        .filter(|(_, ty, _, f)| ty == "schedule.missed" && f.get("schedule") == Some(&sched))
        .count();
    assert_eq!(missed, 0, "occurrences missed");
    let dead: Vec<_> = evs
        .iter()
        .filter(|(_, ty, node, f)| {
            (ty == "node.dead" && [n1.id.as_str(), w.id.as_str()].contains(&node.as_str()))
                || (ty == "orphan.recovered" && f.get("task") == Some(&tid))
        })
        .collect();
    assert!(dead.is_empty(), "taken for dead while a clock jumped: {dead:?}");
    let by_n1 = fired.values().filter(|v| v[0].1 == n1.id).count();
    eprintln!(
        "{TEST}: {} occurrences fired once each ({by_n1} by the jumping node), none early, none missed; phases \
         {marks:?}; test took {:?}",
        occ.len(),
        t0.elapsed()
    );
}
