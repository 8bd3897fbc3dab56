//! How few calls the Worker makes, and the answers it loses: a task claimed
//! under the worker's id whose answer never reached it is found and run
//! once, with its token; a busy worker takes its next task from its
//! complete's answer; a batching worker completes its tasks together.

use super::*;

/// A claim applied whose answer was lost (here: made by another client under
/// the worker's id, as the answer of a claim that failed over would be) is
/// found when the worker starts (a worker restarted under the same id) and
/// run once, with the token of that claim; a second look adopts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_was_lost_is_adopted_once() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(std::slice::from_ref(&app.url));
    let q = "client-adopt";
    let id = c.submit(q, &spec(json!("lost"), 0)).await.unwrap().id;
    let hb = muster::client::NodeHeartbeat {
        ttl_ms: Some(5_000),
        ..Default::default()
    };
    c.heartbeat_node("w-adopt", &hb).await.unwrap();
    let req = muster::client::ClaimRequest {
        node: "w-adopt".into(),
        max: 1,
        wait_ms: 0,
        ack_ms: None,
    };
    let lost = c.claim(q, &req).await.unwrap().remove(0);
    assert_eq!(lost.id, id);
    let runs = Arc::new(AtomicU64::new(0));
    let worker = Worker::builder(c.clone())
        .queue(q)
        .id("w-adopt")
        .concurrency(2)
        .claim_wait(Duration::from_millis(200))
        .handler(counting(&runs))
        .build()
        .unwrap();
    let stop = async { tokio::time::sleep(Duration::from_secs(3)).await };
    let stats = worker.run_until(stop).await.unwrap();
    assert_eq!((stats.adopted, stats.completed), (1, 1), "{stats:?}");
    assert_eq!(runs.load(Ordering::Relaxed), 1);
    let t = c.task(&id).await.unwrap();
    assert_eq!(t.state, "succeeded", "{t:?}");
    assert_eq!(t.token, Some(lost.token), "run with the lost claim's token: {t:?}");
    assert_eq!(t.result, Some(json!({"token": lost.token, "n": "lost"})));
    assert_eq!(t.attempts, 1, "never claimed again: {t:?}");
}

/// A handler that counts its runs and answers with the task's token and
/// payload.
fn counting(
    runs: &Arc<AtomicU64>,
) -> impl Fn(muster::client::Task, muster::client::Ctx) -> std::future::Ready<Result<Value, HandlerError>>
+ Send
+ Sync
+ 'static {
    let runs = runs.clone();
    move |t, _ctx| {
        runs.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Ok(json!({"token": t.token, "n": t.payload})))
    }
}

/// The slow log is the server's, and on the shared cluster every test's:
/// one test at a time makes it log every command, and puts it back after.
static SLOW_LOG: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Makes Redis's slow log record every command until [`log_as_before`]
/// (which takes the guard this returns).
async fn log_every_command(redis: &TestRedis) -> tokio::sync::MutexGuard<'static, ()> {
    let guard = SLOW_LOG.lock().await;
    redis
        .cmd::<()>(&["CONFIG", "SET", "slowlog-log-slower-than", "0"])
        .await;
    redis.cmd::<()>(&["CONFIG", "SET", "slowlog-max-len", "100000"]).await;
    redis.cmd::<()>(&["SLOWLOG", "RESET"]).await;
    guard
}

/// Redis's default slow log again, emptied: on the shared cluster a log of
/// every command would slow every later test's calls, and reading it whole
/// would hold a master for as long as 100 000 entries take to send.
async fn log_as_before(redis: &TestRedis, _guard: tokio::sync::MutexGuard<'static, ()>) {
    redis
        .cmd::<()>(&["CONFIG", "SET", "slowlog-log-slower-than", "10000"])
        .await;
    redis.cmd::<()>(&["CONFIG", "SET", "slowlog-max-len", "128"]).await;
    redis.cmd::<()>(&["SLOWLOG", "RESET"]).await;
}

/// Calls of a script function (`task_claim_<hash>`, ...) on this test's
/// namespace (its first key is `{muster...}`: on the shared cluster other
/// tests' calls are logged too), logged by Redis's slow log, which logs
/// every command once its threshold is 0.
async fn fcalls(redis: &TestRedis, function_prefix: &str) -> usize {
    let log: Vec<redis::Value> = match redis.cluster_prefix() {
        Some(_) => redis.cmd(&["SLOWLOG", "GET", "-1"]).await,
        // The log of every command can take longer to send than the
        // harness's 500 ms reply timeout on a loaded machine (the event
        // tailers of a split namespace add a read per shard every few ms).
        None => {
            let cfg = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(20)));
            let mut c = redis
                .client()
                .get_multiplexed_async_connection_with_config(&cfg)
                .await
                .unwrap();
            redis::cmd("SLOWLOG")
                .arg("GET")
                .arg(-1)
                .query_async(&mut c)
                .await
                .unwrap()
        }
    };
    log.iter()
        .filter(|entry| {
            let redis::Value::Array(fields) = entry else {
                return false;
            };
            let Some(redis::Value::Array(args)) = fields.get(3) else {
                return false;
            };
            let arg = |i: usize| match args.get(i) {
                Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            };
            arg(0).eq_ignore_ascii_case("fcall") && arg(1).starts_with(function_prefix) && arg(3).starts_with("{muster")
        })
        .count()
}

/// With `batch` 1 a complete claims the slot's next task: 50 tasks take
/// about 50 worker calls, not 100. Counted in Redis: the claim script runs
/// a few times (the first claim, the long polls once the queue is empty),
/// not once per task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_claims_the_next_task_in_the_same_call() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(std::slice::from_ref(&app.url));
    let q = "client-chain";
    let mut ids = Vec::new();
    for i in 0..50 {
        ids.push(c.submit(q, &spec(json!(i), 0)).await.unwrap().id);
    }
    let logging = log_every_command(&redis).await;
    let unknown = c.unknown_outcomes();
    let worker = Worker::builder(c.clone())
        .queue(q)
        .id("w-chain")
        .claim_wait(Duration::from_millis(200))
        .handler(|_t, _ctx| async { Ok(json!("ok")) })
        .build()
        .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move { worker.run_until(async { rx.await.unwrap_or(()) }).await });
    let all_done = wait_until(Duration::from_secs(20), || async {
        let p = c.tasks(q, "succeeded", 100, None).await.unwrap();
        p.tasks.len() == 50
    })
    .await;
    assert!(all_done, "not every task succeeded");
    let _ = tx.send(());
    let stats = run.await.unwrap().unwrap();
    assert_eq!(
        (stats.claimed, stats.completed, stats.adopted),
        (50, 50, 0),
        "{stats:?}"
    );
    assert_eq!(c.unknown_outcomes(), unknown, "no outcome was in doubt");
    let (claims, completes) = (
        fcalls(&redis, "task_claim_").await,
        fcalls(&redis, "task_complete_").await,
    );
    log_as_before(&redis, logging).await;
    // The first call of a function in a fresh Redis finds it missing, loads
    // it and calls again: both calls are logged.
    assert!((50..=51).contains(&completes), "{completes} completes for 50 tasks");
    assert!(
        claims < 20,
        "{claims} claim calls for 50 tasks: the completes did not claim next"
    );
}

/// With `batch` above 1, results that finish together are completed in one
/// `POST /api/v1/tasks/complete`: 200 tasks at batch 20 take a few dozen
/// complete calls, not 200 (each batch complete runs the complete script
/// once, counted in Redis's slow log), and each task is completed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batching_worker_completes_its_tasks_together() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(std::slice::from_ref(&app.url));
    let q = "client-batch";
    let specs: Vec<TaskSpec> = (0..200).map(|i| spec(json!(i), 0)).collect();
    c.submit_batch(q, &specs).await.unwrap();
    let logging = log_every_command(&redis).await;
    let runs = Arc::new(AtomicU64::new(0));
    let worker = Worker::builder(c.clone())
        .queue(q)
        .id("w-batch")
        .concurrency(20)
        .batch(20)
        .claim_wait(Duration::from_millis(200))
        .handler(counting(&runs))
        .build()
        .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move { worker.run_until(async { rx.await.unwrap_or(()) }).await });
    let all_done = wait_until(Duration::from_secs(20), || async {
        c.queue(q).await.map(|d| d.stats.succeeded == 200).unwrap_or(false)
    })
    .await;
    let _ = tx.send(());
    let stats = run.await.unwrap().unwrap();
    assert!(all_done, "not every task succeeded: {stats:?}");
    assert_eq!(
        (stats.claimed, stats.completed, stats.dropped),
        (200, 200, 0),
        "{stats:?}"
    );
    assert_eq!(runs.load(Ordering::Relaxed), 200);
    let completes = fcalls(&redis, "task_complete_").await;
    log_as_before(&redis, logging).await;
    assert!(
        completes <= 60,
        "{completes} complete calls for 200 tasks at batch 20: not completed together"
    );
}
