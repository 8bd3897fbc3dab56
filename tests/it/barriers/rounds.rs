//! Rounds kept and open, reopened incarnations, the CLI's exit codes and the barriers page.

use super::*;

/// The CLI's exit code and the answer it printed (None when it printed none).
fn cli_arrive(app: &TestApp, round: &str, node: &str, wait: &str) -> (Option<i32>, Option<ArriveAnswer>) {
    let out = Command::new(muster_bin())
        .args([
            "barrier", "arrive", "cron", round, "--node", node, "--wait", wait, "--url", &app.url,
        ])
        .env_remove("MUSTER_CONFIG")
        .env_remove("MUSTER_TOKEN")
        .output()
        .unwrap();
    (out.status.code(), serde_json::from_slice(&out.stdout).ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cli_exit_codes_and_verdict_json() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let parts: Vec<String> = ["h1", "h2", "h3"].iter().map(|s| s.to_string()).collect();
    configure(&a, "cron", &parts, 1, 800).await;
    // h1 and h2 arrive (h3 is lost): both may run (exit 0); h3 is late (4).
    let url = a.url.clone();
    let h2 = std::thread::spawn(move || {
        let out = Command::new(muster_bin())
            .args([
                "barrier", "arrive", "cron", "day1", "--node", "h2", "--wait", "10s", "--url", &url,
            ])
            .env_remove("MUSTER_TOKEN")
            .output()
            .unwrap();
        out.status.code()
    });
    let (code, v) = cli_arrive(&a, "day1", "h1", "10s");
    assert_eq!(code, Some(0), "{v:?}");
    let v = v.expect("the verdict as JSON");
    assert_eq!(v.verdict, Verdict::Released);
    assert!(v.may_run);
    assert_eq!(names(&v.missing), BTreeSet::from(["h3".to_string()]));
    assert_eq!(h2.join().unwrap(), Some(0));
    let (code, v) = cli_arrive(&a, "day1", "h3", "10s");
    assert_eq!((code, v.as_ref().map(|v| v.late)), (Some(4), Some(true)), "{v:?}");
    // Alone: aborted at the deadline (3).
    let (code, v) = cli_arrive(&a, "day2", "h1", "10s");
    assert_eq!(
        (code, v.as_ref().map(|v| v.verdict)),
        (Some(3), Some(Verdict::Aborted)),
        "{v:?}"
    );
    // No verdict within --wait (5).
    let (code, v) = cli_arrive(&a, "day3", "h1", "100ms");
    assert_eq!(
        (code, v.as_ref().map(|v| v.verdict)),
        (Some(5), Some(Verdict::Pending)),
        "{v:?}"
    );
    // A non-participant is an error (1), with the reason on stderr.
    let (code, _) = cli_arrive(&a, "day4", "intruder", "1s");
    assert_eq!(code, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barriers_page_shows_rounds_with_arrivals() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let parts: Vec<String> = ["n-one", "n-two"].iter().map(|s| s.to_string()).collect();
    configure(&a, "nightly", &parts, 1, 60_000).await;
    arrive(&a, "nightly", "2026-11-22", "n-one", 0).await.unwrap();
    let html = a.page("/barriers").await;
    assert!(
        html.contains("nightly") && html.contains("n-one") && html.contains("n-two"),
        "{html}"
    );
    assert!(html.contains("http-equiv=\"refresh\""), "live while a round is open");
    let resp = a
        .request(reqwest::Method::GET, "/barriers/nightly")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let html = resp.text().await.unwrap();
    assert!(html.contains("2026-11-22") && html.contains("pending"), "{html}");
    arrive(&a, "nightly", "2026-11-22", "n-two", 0).await.unwrap();
    let html = a.page("/barriers/nightly").await;
    assert!(
        html.contains("released") && !html.contains("http-equiv=\"refresh\""),
        "{html}"
    );
    assert_eq!(
        a.request(reqwest::Method::GET, "/barriers/unknown")
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

/// G8 with `rounds_kept` 1 and two rounds open: the arrival that decides the
/// older round used to delete it in the same script (404 for it and its
/// waiters; a re-arrival opened it again and a second verdict followed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deciding_a_round_never_deletes_it() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start_with(&redis, |c| c.barriers.rounds_kept = 1).await);
    let parts = strings(&["pa", "pb", "pc"]);
    configure(&a, "small", &parts, 0, 60_000).await;
    for r in ["r1", "r2"] {
        let v = arrive(&a, "small", r, "pa", 0).await.unwrap();
        assert_eq!(v.verdict, Verdict::Pending, "{v:?}");
    }
    // pc waits for r1's verdict.
    let a2 = a.clone();
    let waiter = tokio::spawn(async move { arrive(&a2, "small", "r1", "pc", 10_000).await });
    let waiting = wait_until(Duration::from_secs(5), || async {
        a.api().round("small", "r1").await.is_ok_and(|r| r.arrived.len() == 2)
    })
    .await;
    assert!(waiting, "pc arrived at r1");
    // pb completes r1.
    let v = arrive(&a, "small", "r1", "pb", 200)
        .await
        .unwrap_or_else(|e| panic!("the completing arrival reads its round: {e:?}"));
    assert_eq!((v.verdict, v.may_run), (Verdict::Released, true), "{v:?}");
    let v = waiter
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the waiter reads the round: {e:?}"));
    assert_eq!((v.verdict, v.may_run), (Verdict::Released, true), "{v:?}");
    let r = a.api().round("small", "r1").await.unwrap();
    assert_eq!(r.verdict, Verdict::Released, "{r:?}");
    // Absent from the JSON: read raw.
    let (_, raw) = a.get("/api/v1/barriers/small/rounds/r1").await;
    assert!(raw.get("incarnation").is_none(), "internal: {raw}");
    // Arriving again (the documented retry) reads that verdict; nothing reopens.
    for p in &parts {
        let v = arrive(&a, "small", "r1", p, 0).await.unwrap();
        assert_eq!((v.verdict, v.may_run), (Verdict::Released, true), "{p}: {v:?}");
        assert!(!v.late, "{v:?}");
    }
    assert_eq!(decisions(&redis, "small").await["r1"], ["released"], "one verdict");
    assert_eq!(openings(&redis, "small", "r1").await, 1, "r1 opened once");
    // The bound holds: deciding r2 deletes r1, the older decided round beyond
    // rounds_kept = 1, and never r2 itself.
    arrive(&a, "small", "r2", "pb", 0).await.unwrap();
    let v = arrive(&a, "small", "r2", "pc", 0).await.unwrap();
    assert_eq!(v.verdict, Verdict::Released, "{v:?}");
    a.api().round("small", "r2").await.unwrap();
    assert_eq!(problem(a.api().round("small", "r1").await).status, 404);
    let keys: Vec<String> = redis.cmd(&["KEYS", &kn("small", "barrier:small:r:*")]).await;
    assert_eq!(keys, [kn("small", "barrier:small:r:r2")]);
    let list = a.api().rounds("small", 50).await.unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
}

/// G4 for undecided rounds: at most `max_open_rounds` per barrier; the
/// arrival that would open one more gets 409 and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_rounds_are_bounded_per_barrier() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| {
        c.barriers.max_open_rounds = 2;
        c.barriers.rounds_kept = 1;
    })
    .await;
    configure(&a, "capped", &strings(&["x", "y"]), 0, 60_000).await;
    for r in ["o1", "o2"] {
        arrive(&a, "capped", r, "x", 0).await.unwrap();
    }
    let keys_before: Vec<String> = redis.cmd(&["KEYS", "*"]).await;
    let events_before = redis.events("muster").await.len();
    let p = problem(arrive(&a, "capped", "o3", "x", 1000).await);
    assert_eq!(p.status, 409, "{p:?}");
    assert_eq!(p.extra["reason"], "too_many_open_rounds", "{p:?}");
    assert_eq!(p.extra["max_open_rounds"], 2, "{p:?}");
    assert!(p.detail.contains("barriers.max_open_rounds"), "{p:?}");
    let keys_after: Vec<String> = redis.cmd(&["KEYS", "*"]).await;
    let state = |keys: Vec<String>| {
        keys.into_iter()
            .filter(|k| !crate::common::keys::is_history(k))
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(state(keys_before), state(keys_after));
    assert_eq!(redis.events("muster").await.len(), events_before, "no event");
    assert_eq!(problem(a.api().round("capped", "o3").await).status, 404);
    // Open rounds still take arrivals; a non-participant is still 403.
    arrive(&a, "capped", "o1", "x", 0).await.unwrap();
    assert_eq!(problem(arrive(&a, "capped", "o3", "intruder", 0).await).status, 403);
    // Once one is decided, another may open.
    let v = arrive(&a, "capped", "o1", "y", 0).await.unwrap();
    assert_eq!(v.verdict, Verdict::Released);
    let v = arrive(&a, "capped", "o3", "x", 0).await.unwrap();
    assert_eq!(v.verdict, Verdict::Pending, "{v:?}");
    // A stale entry (a round decided by a node that predates the open index,
    // say) does not hold a place: at the bound, entries past their deadline
    // whose round is decided or gone are dropped first.
    assert_eq!(
        arrive(&a, "capped", "o2", "y", 0).await.unwrap().verdict,
        Verdict::Released
    );
    redis
        .cmd::<i64>(&["ZADD", &kn("capped", "barrier:capped:open"), "1", "ghost"])
        .await;
    assert_eq!(
        redis.cmd::<i64>(&["ZCARD", &kn("capped", "barrier:capped:open")]).await,
        2
    );
    let v = arrive(&a, "capped", "o4", "x", 0).await.unwrap();
    assert_eq!(v.verdict, Verdict::Pending, "{v:?}");
    let p = problem(arrive(&a, "capped", "o5", "x", 0).await);
    assert_eq!(
        (p.status, p.extra["reason"].clone()),
        (409, json!("too_many_open_rounds")),
        "{p:?}"
    );
}

/// The decided-rounds cache of a node never answers for another incarnation
/// of the round: after the barrier is deleted and configured again, a
/// participant at the reopened round waits for that round's own verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cached_verdict_never_answers_a_reopened_round() {
    let redis = TestRedis::start();
    let a = Arc::new(TestApp::start(&redis).await);
    let parts = strings(&["x", "y"]);
    configure(&a, "again", &parts, 0, 60_000).await;
    // x waits; y's arrival decides; x's waiter reads the decided round (and
    // the node keeps it for its other waiters).
    let a2 = a.clone();
    let waiter = tokio::spawn(async move { arrive(&a2, "again", "r", "x", 10_000).await });
    let waiting = wait_until(Duration::from_secs(5), || async {
        a.api().round("again", "r").await.is_ok_and(|r| r.arrived.len() == 1)
    })
    .await;
    assert!(waiting);
    let _ = arrive(&a, "again", "r", "y", 0).await;
    let v = waiter.await.unwrap().unwrap();
    assert_eq!(v.verdict, Verdict::Released, "{v:?}");
    // The same round id, a new incarnation.
    a.api().delete_barrier("again").await.unwrap();
    configure(&a, "again", &parts, 0, 60_000).await;
    // Longer than the 1 s re-check, within the cache's 5 s.
    let v = arrive(&a, "again", "r", "x", 1500).await.unwrap();
    assert_eq!(v.verdict, Verdict::Pending, "the old verdict must not answer: {v:?}");
    assert!(!v.may_run, "{v:?}");
    assert_eq!(names(&v.arrived), BTreeSet::from(["x".to_string()]), "{v:?}");
    // Its own verdict does.
    let a2 = a.clone();
    let waiter = tokio::spawn(async move { arrive(&a2, "again", "r", "x", 10_000).await });
    let _ = arrive(&a, "again", "r", "y", 0).await;
    let v = waiter.await.unwrap().unwrap();
    assert_eq!((v.verdict, v.may_run), (Verdict::Released, true), "{v:?}");
}
