//! The claim lease (issue 35, "no stranded claim"): a claimed task that its
//! worker does not acknowledge (a task heartbeat, an ack, its complete or
//! fail) within the claim's `ack_ms` goes back to its queue, its token
//! refused and its attempt not counted; an acknowledged one is left alone
//! however long it runs.

use muster::client::{Attempt, Event, TaskInfo};

use super::*;

/// The lease these tests use: short, so a lost answer comes back fast.
const ACK_MS: u64 = 1000;

async fn task_of(app: &TestApp, id: &str) -> TaskInfo {
    app.api().task(id).await.unwrap()
}

/// The claims of a task's log that were not acknowledged.
fn unacked_entries(t: &TaskInfo) -> Vec<Attempt> {
    t.attempt_log
        .iter()
        .filter(|a| a.outcome.as_deref() == Some("not_acknowledged"))
        .cloned()
        .collect()
}

/// The outcomes of a task's attempt log, in order ("" while running).
fn outcomes(t: &TaskInfo) -> Vec<&str> {
    t.attempt_log
        .iter()
        .map(|a| a.outcome.as_deref().unwrap_or(""))
        .collect()
}

/// The latest events of a topic, through the replay.
async fn events_of(app: &TestApp, topic: &str) -> Vec<Event> {
    app.api().events_page(None, 10, Some(topic)).await.unwrap().events
}

/// The complete of a claimed task, without a result.
fn done(token: u64) -> Complete {
    Complete {
        token,
        result: Value::Null,
        next: None,
    }
}

/// One claim of the races, with the fault it met: Some(tasks) when the
/// answer reached the worker, None when it was lost (the client gave up
/// first, or the answer was dropped on its way back).
async fn racing_claim(app: &TestApp, queue: &str, worker: &str, i: usize) -> Option<Vec<ClaimedTask>> {
    let body = json!({"node": worker, "max": 1, "wait_ms": 100});
    let mut req = app
        .request(reqwest::Method::POST, &format!("/api/v1/queues/{queue}/claim"))
        .json(&body);
    // Half the claims are cut by a client timeout racing the task's
    // arrival (the answer, when the claim ran, goes into a closed socket);
    // a quarter are answered and the answer is dropped on its way back, as
    // a proxy or a load balancer would; the rest arrive.
    let cut = i.is_multiple_of(2);
    if cut {
        req = req.timeout(Duration::from_millis(rand::random::<u64>() % 60));
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(_) if cut => return None,
        Err(e) => panic!("claim {i}: {e}"),
    };
    let status = resp.status().as_u16();
    let text = match resp.text().await {
        Ok(t) => t,
        Err(_) if cut => return None,
        Err(e) => panic!("claim {i}: {e}"),
    };
    if i % 4 == 1 {
        return None;
    }
    match status {
        200 => Some(
            serde_json::from_str::<muster::client::ClaimResponse>(&text)
                .unwrap()
                .tasks,
        ),
        204 => Some(Vec::new()),
        _ => panic!("claim {i}: {status} {text}"),
    }
}

/// 200 claim races in which the answer is lost at random: every task the
/// worker never got is back in its queue within `ack_ms` + 1 s (by the
/// Redis times in its attempt log), no attempt is counted for it, and every
/// task runs exactly once overall. Without the lease (`claim.ack_ms = 0`)
/// the lost tasks stay running under a worker that lives on, and this fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_claim_answers_come_back_within_the_lease_and_run_once() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| c.claim.ack_ms = ACK_MS).await;
    let (q, w) = ("lease-race", "w-race");
    join(&app, w).await;
    let runs: Arc<Mutex<HashMap<String, u32>>> = Default::default();
    // Runs a delivered task: counts the run, completes it at once (the
    // complete is its acknowledgement).
    let run = |t: ClaimedTask| {
        let (runs, app) = (runs.clone(), &app);
        async move {
            assert_eq!(t.ack_ms, ACK_MS, "{t:?}");
            *runs.lock().await.entry(t.id.clone()).or_default() += 1;
            let r = app.api().complete(&t.id, &done(t.token)).await;
            assert!(r.is_ok(), "a delivered task completes at once: {r:?}");
        }
    };
    let mut ids = Vec::new();
    let mut lost = 0;
    for i in 0..200 {
        // The task arrives while the claim waits, or before it.
        let submit = {
            let http = app.http.clone();
            let url = format!("{}/api/v1/queues/{q}/tasks", app.url);
            let delay = Duration::from_millis(rand::random::<u64>() % 40);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let b: Submitted = http
                    .post(url)
                    .json(&json!({"payload": {"i": i}}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                b.id
            })
        };
        match racing_claim(&app, q, w, i).await {
            Some(tasks) => {
                for t in tasks {
                    run(t).await;
                }
            }
            None => lost += 1,
        }
        ids.push(submit.await.unwrap());
    }
    // A worker that keeps claiming: what was lost comes back to it.
    let all_done = || async {
        let mut done = 0;
        for id in &ids {
            if task_of(&app, id).await.state == "succeeded" {
                done += 1;
            }
        }
        done == ids.len()
    };
    let deadline = Instant::now() + Duration::from_millis(ACK_MS + 5000);
    while Instant::now() < deadline {
        for t in claim_tasks(&app, q, w, 50, 200).await {
            run(t).await;
        }
        if all_done().await {
            break;
        }
    }
    let runs = runs.lock().await.clone();
    let mut stranded = Vec::new();
    let mut requeued = 0;
    for id in &ids {
        let t = task_of(&app, id).await;
        if t.state != "succeeded" {
            stranded.push(format!("{id}: {} under {:?}", t.state, t.owner));
            continue;
        }
        assert_eq!(runs.get(id), Some(&1), "task {id} ran {:?} times: {t:?}", runs.get(id));
        assert_eq!(t.attempts, 1, "a claim not acknowledged counts no attempt: {t:?}");
        for e in unacked_entries(&t) {
            requeued += 1;
            let took = e.ended_at.unwrap() - e.claimed_at;
            assert!(
                took <= (ACK_MS + 1000) as i64,
                "task {id} came back {took} ms after its claim (lease {ACK_MS} ms): {t:?}"
            );
            assert!(took >= ACK_MS as i64, "task {id} came back early ({took} ms): {t:?}");
        }
    }
    assert!(
        stranded.is_empty(),
        "{} of {} tasks never finished (lost answers: {lost}): {stranded:?}",
        stranded.len(),
        ids.len()
    );
    assert_eq!(runs.len(), ids.len());
    // The faults stranded tasks, or this proved nothing.
    assert!(
        requeued >= 20,
        "only {requeued} claims were lost and put back ({lost} answers lost)"
    );
    let metrics = app.page("/metrics").await;
    assert!(metrics.contains("muster_tasks_not_acknowledged_total"), "{metrics}");
}

/// An acknowledged claim (by an ack or a task heartbeat) is never put back,
/// however long it runs; one not acknowledged is put back, its token
/// refused (heartbeat, ack, complete: 409), its attempt not counted (even
/// with `max_attempts` 1), and it says so in its attempt log and events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_claim_outlives_its_lease_and_an_unacknowledged_one_is_fenced_off() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| c.claim.ack_ms = ACK_MS).await;
    let (q, w) = ("lease", "w-lease");
    join(&app, w).await;
    let acked = submit(&app, q, json!({"payload": 1})).await;
    let beat = submit(&app, q, json!({"payload": 2})).await;
    let silent = submit(&app, q, json!({"payload": 3, "max_attempts": 1})).await;
    let longer = submit(&app, q, json!({"payload": 4})).await;
    let take = |max: u32, ack_ms: Option<u64>| {
        let app = &app;
        async move {
            let req = ClaimRequest {
                node: w.into(),
                max,
                wait_ms: 0,
                ack_ms,
            };
            let got = app.api().claim(q, &req).await.unwrap();
            assert!(!got.is_empty(), "nothing claimed");
            got
        }
    };
    let got = take(3, None).await;
    assert_eq!(got.len(), 3);
    let tok = |id: &str| got.iter().find(|t| t.id == id).unwrap().token;
    assert!(got.iter().all(|t| t.ack_ms == ACK_MS), "{got:?}");
    let claimed = Instant::now();
    // A claim asking for its own lease gets it.
    let long = take(1, Some(5000)).await;
    assert_eq!((long[0].id.as_str(), long[0].ack_ms), (longer.as_str(), 5000));

    let b = app.api().ack_task(&acked, tok(&acked)).await.unwrap();
    assert_eq!(b.state, "running", "{b:?}");
    let hb = TaskHeartbeat {
        token: tok(&beat),
        progress: Some(10),
        fields: None,
    };
    app.api().heartbeat_task(&beat, &hb).await.unwrap();

    // The unacknowledged one is back in the queue after its lease, not before.
    let back = wait_until(Duration::from_millis(ACK_MS + 3000), || async {
        task_of(&app, &silent).await.state == "queued"
    })
    .await;
    assert!(back, "not put back: {:?}", task_of(&app, &silent).await);
    assert!(claimed.elapsed() >= Duration::from_millis(ACK_MS - 100));
    // Past twice the lease, by a few cleaner passes.
    while claimed.elapsed() < Duration::from_millis(2 * ACK_MS) {
        app.cleaner_passes(1).await;
    }
    app.cleaner_passes(2).await;
    for (id, token) in [(&acked, tok(&acked)), (&beat, tok(&beat)), (&longer, long[0].token)] {
        let t = task_of(&app, id).await;
        assert_eq!((t.state.as_str(), t.token), ("running", Some(token)), "{t:?}");
        assert!(unacked_entries(&t).is_empty(), "{t:?}");
    }

    // The put-back task: its token is refused everywhere, nothing counted.
    let old = tok(&silent);
    for path in ["heartbeat", "ack", "complete", "fail"] {
        let (s, b) = app
            .post(&format!("/api/v1/tasks/{silent}/{path}"), json!({"token": old}))
            .await;
        assert_eq!(s, 409, "{path} with the token of a claim put back: {b}");
    }
    let t = task_of(&app, &silent).await;
    assert_eq!((t.state.as_str(), t.attempts), ("queued", 0), "{t:?}");
    let e = unacked_entries(&t);
    assert_eq!(e.len(), 1, "{t:?}");
    assert_eq!((e[0].attempt, e[0].node.as_str()), (1, w), "{t:?}");
    assert_eq!(e[0].token, old, "{t:?}");
    let evs = events_of(&app, "task.requeued").await;
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0].subject("task"), Some(silent.as_str()), "{evs:?}");
    assert_eq!(evs[0].data.get("reason"), Some(&json!("not_acknowledged")), "{evs:?}");

    // Claimed again: the same attempt number, a greater token; it completes.
    let again = take(1, None).await;
    assert_eq!(again[0].id, silent);
    assert_eq!(again[0].attempt, 1, "{again:?}");
    assert!(again[0].token > old);
    app.api().complete(&silent, &done(again[0].token)).await.unwrap();
    let t = task_of(&app, &silent).await;
    assert_eq!(t.attempts, 1, "{t:?}");
    assert_eq!(outcomes(&t), ["not_acknowledged", "succeeded"], "{t:?}");

    // A complete's next task gets the lease too.
    let next_one = submit(&app, q, json!({"payload": 5})).await;
    let with_next = Complete {
        next: Some(NextRequest {
            max: Some(1),
            ack_ms: Some(2000),
            ..Default::default()
        }),
        ..done(tok(&acked))
    };
    let b = app.api().complete(&acked, &with_next).await.unwrap();
    let next = b.next.as_ref().expect("next tasks");
    assert_eq!(next.tasks[0].id, next_one, "{b:?}");
    assert_eq!(next.tasks[0].ack_ms, 2000, "{b:?}");
}

/// `ack_ms` is bounded (1 000 to 600 000), on a claim and on `next`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lease_out_of_bounds_is_refused() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    join(&app, "w-b").await;
    for bad in [0, 999, 600_001] {
        let (s, b) = app
            .post("/api/v1/queues/qb/claim", json!({"node": "w-b", "ack_ms": bad}))
            .await;
        assert!(s == 400 || s == 422, "ack_ms {bad}: {s} {b}");
        assert!(as_problem(s, &b).detail.contains("ack_ms"), "{b}");
    }
    let id = submit(&app, "qb", json!({})).await;
    let t = claim_tasks(&app, "qb", "w-b", 1, 0).await;
    assert_eq!(t[0].ack_ms, 10_000, "the default lease is claim.ack_ms: {t:?}");
    let c = Complete {
        next: Some(NextRequest {
            ack_ms: Some(500),
            ..Default::default()
        }),
        ..done(t[0].token)
    };
    let p = problem(app.api().complete(&id, &c).await);
    assert!(p.status == 400 || p.status == 422, "{p:?}");
    assert!(p.detail.contains("next.ack_ms"), "{p:?}");
}

/// `claim.ack_ms = 0` switches the lease off: a claim nobody acknowledges
/// stays running under its (live) worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_claim_lease_an_unacknowledged_claim_stays_running() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| c.claim.ack_ms = 0).await;
    join(&app, "w-off").await;
    let id = submit(&app, "qoff", json!({})).await;
    let t = claim_tasks(&app, "qoff", "w-off", 1, 0).await;
    assert_eq!(t[0].ack_ms, 0, "{t:?}");
    let since = Instant::now();
    while since.elapsed() < Duration::from_millis(2000) {
        app.cleaner_passes(1).await;
    }
    assert_eq!(task_of(&app, &id).await.state, "running");
}

/// A task whose worker never acknowledges it (one that crashes on receipt
/// and comes back under the same id before its registration lapses) is put
/// back `claim.max_unacked` times for free; every later lapse counts an
/// attempt, so it goes dead when its attempts run out instead of cycling
/// for ever. Without the bound it would be queued again at the 4th lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_never_acknowledged_goes_dead_after_max_unacked_lapses() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| {
        c.claim.ack_ms = ACK_MS;
        c.claim.max_unacked = 2;
    })
    .await;
    let (q, w) = ("poison", "w-poison");
    join(&app, w).await;
    let id = submit(&app, q, json!({"payload": 0, "max_attempts": 2})).await;
    // (state after the lapse, attempts after it)
    let expected = [("queued", 0), ("queued", 0), ("queued", 1), ("dead", 2)];
    for (lapse, (state, attempts)) in expected.iter().enumerate() {
        let got = claim_tasks(&app, q, w, 1, 2000).await;
        assert_eq!(got.len(), 1, "claim {}: {got:?}", lapse + 1);
        assert_eq!(got[0].id, id);
        let left = wait_until(Duration::from_millis(ACK_MS + 3000), || async {
            task_of(&app, &id).await.state != "running"
        })
        .await;
        assert!(left, "lapse {}: still running", lapse + 1);
        let t = task_of(&app, &id).await;
        assert_eq!(
            (t.state.as_str(), t.attempts),
            (*state, *attempts),
            "after lapse {}: {t:?}",
            lapse + 1
        );
    }
    let t = task_of(&app, &id).await;
    assert_eq!(outcomes(&t), ["not_acknowledged"; 4], "{t:?}");
    assert!(
        t.error.as_deref().unwrap_or("").contains("claim.max_unacked"),
        "the dead task says why: {t:?}"
    );
    let evs = events_of(&app, "task.dead").await;
    assert_eq!(evs[0].data.get("reason"), Some(&json!("not_acknowledged")), "{evs:?}");
}
