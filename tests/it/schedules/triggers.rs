//! Manual triggers: distinct at the same moment, idempotent when retried with their key.

use super::*;

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
