//! Manual triggers: distinct at the same moment, idempotent when retried with their key.

use super::*;

/// Triggers `id` `n` times at once; returns each answer's status, its raw
/// body (to see what it leaves out) and the body typed.
async fn trigger_at_once(app: &TestApp, id: &str, n: usize) -> Vec<(u16, Value, Triggered)> {
    let path = format!("/api/v1/schedules/{id}/trigger");
    futures_util::future::join_all((0..n).map(|_| app.post(&path, json!({}))))
        .await
        .into_iter()
        .map(|(st, raw)| {
            let t = serde_json::from_value(raw.clone()).unwrap_or_else(|e| panic!("{e}: {st} {raw}"));
            (st, raw, t)
        })
        .collect()
}

/// Schedule `id` that only fires when triggered (disabled), with `overlap`.
async fn manual(app: &TestApp, id: &str, overlap: Overlap) {
    let mut d = def(id, "0 3 * * *", id);
    d.overlap = overlap;
    d.enabled = false;
    create(app, d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_at_the_same_moment_are_distinct_triggers() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, fast).await;
    // Redis runs a trigger in well under a millisecond: calls that arrive
    // together share Redis milliseconds, which once made them share an
    // idempotency key (and so a task).
    manual(&a, "many", Overlap::Allow).await;
    let answers = trigger_at_once(&a, "many", 30).await;
    let mut tasks = HashSet::new();
    let mut occurrences = BTreeMap::<i64, usize>::new();
    for (st, raw, t) in &answers {
        assert_eq!(*st, 201, "{raw}");
        assert!(!t.replayed);
        assert!(raw.get("replaced").is_none(), "nothing to replace under allow: {raw}");
        tasks.insert(t.task.clone());
        *occurrences.entry(t.occurrence).or_default() += 1;
    }
    assert_eq!(tasks.len(), 30, "one task per trigger");
    for id in &tasks {
        let t = a.api().task(id).await.unwrap();
        assert_eq!(t.state, "queued", "{t:?}");
        assert_eq!(
            t.idempotency_key.as_deref(),
            Some(format!("schedule:many:trigger:{id}").as_str())
        );
    }
    let s = get(&a, "many").await;
    assert_eq!(s.counts.fired, 30);
    assert_eq!(s.history.len(), 30);
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
    manual(&a, "swap", Overlap::Replace).await;
    let answers = trigger_at_once(&a, "swap", 30).await;
    let mut tasks = HashSet::new();
    let mut replaced = HashSet::new();
    for (st, raw, t) in &answers {
        assert_eq!(*st, 201, "{raw}");
        tasks.insert(t.task.clone());
        if let Some(r) = &t.replaced {
            assert!(replaced.insert(r.clone()), "{r} replaced twice");
        }
    }
    assert_eq!(tasks.len(), 30, "one task per trigger");
    let last = get(&a, "swap").await.last_task.unwrap();
    let mut live = Vec::new();
    for id in &tasks {
        let t = a.api().task(id).await.unwrap();
        match t.state.as_str() {
            "queued" => live.push(id.clone()),
            "cancelled" => assert!(replaced.contains(id), "{id} cancelled but no trigger said so"),
            other => panic!("{id} is {other}"),
        }
    }
    assert_eq!(live, vec![last.clone()], "only the last trigger's task is live");
    let expected: HashSet<String> = tasks.iter().filter(|t| **t != last).cloned().collect();
    assert_eq!(replaced, expected, "every other task was reported replaced");
    assert_eq!(get(&a, "swap").await.counts.fired, 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_retried_with_its_idempotency_key_returns_the_same_task() {
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, fast).await;
    // Replace would cancel the first task if a retry fired again.
    manual(&a, "once", Overlap::Replace).await;
    // Raw: the status (201 fired, 200 replayed) and what the body leaves out
    // are the point.
    let trigger = |key: &str| {
        let req = a
            .request(reqwest::Method::POST, "/api/v1/schedules/once/trigger")
            .header("Idempotency-Key", key)
            .json(&json!({}));
        async move {
            let (st, raw) = send(req).await;
            let t: Triggered = serde_json::from_value(raw.clone()).unwrap_or_else(|e| panic!("{e}: {st} {raw}"));
            (st, raw, t)
        }
    };
    let (st, raw, first) = trigger("run-42").await;
    assert_eq!(st, 201, "{raw}");
    assert!(!first.replayed);
    let task = first.task.clone();
    let events = redis.events("muster").await.len();
    // The client lost the answer and retries: the same task, nothing fired.
    for _ in 0..3 {
        let (st, raw, again) = trigger("run-42").await;
        assert_eq!(st, 200, "{raw}");
        assert!(again.replayed);
        assert_eq!(again.task, first.task, "task");
        assert_eq!(again.queue, first.queue, "queue");
        assert_eq!(again.occurrence, first.occurrence, "occurrence");
        assert_eq!(again.schedule, first.schedule, "schedule");
        assert!(raw.get("replaced").is_none(), "{raw}");
    }
    let t = a.api().task(&task).await.unwrap();
    assert_eq!(t.state, "queued", "not replaced by a retry: {t:?}");
    assert_eq!(t.idempotency_key.as_deref(), Some("schedule:once:trigger:key:run-42"));
    let s = get(&a, "once").await;
    assert_eq!(s.counts.fired, 1);
    assert_eq!(s.history.len(), 1);
    assert_eq!(redis.events("muster").await.len(), events, "a replay emits nothing");
    // Another key is another trigger (which replaces the first task).
    let (st, raw, second) = trigger("run-43").await;
    assert_eq!(st, 201, "{raw}");
    assert_ne!(second.task, first.task);
    assert_eq!(second.replaced.as_deref(), Some(task.as_str()));
    // The first key still names the first task, now cancelled.
    let (st, _, again) = trigger("run-42").await;
    assert_eq!((st, again.task.as_str()), (200, task.as_str()));
    assert_eq!(get(&a, "once").await.counts.fired, 2);
    // The key is validated like a task's idempotency key.
    for bad in ["has space", &"k".repeat(201)] {
        let req = a
            .request(reqwest::Method::POST, "/api/v1/schedules/once/trigger")
            .header("Idempotency-Key", bad);
        let p = raw_problem(req).await;
        assert_eq!(p.status, 400, "{p:?}");
        assert!(p.detail.contains("Idempotency-Key"), "{p:?}");
    }
    assert_eq!(get(&a, "once").await.counts.fired, 2, "a refused key fires nothing");
}
