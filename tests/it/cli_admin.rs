//! The admin CLI against a real node, through the real binary: every
//! command, its table and its `--json`, and exit codes that mean something
//! (0 done, 1 refused, 2 usage, 3 unavailable). The setup goes through the
//! typed client.

use std::time::Duration;

use muster::client::{
    BulkOutcome, ClaimRequest, Client, Complete, Fail, NodeHeartbeat, NodeInfo, QueueStats, ScheduleDef, Submitted,
    TaskInfo, TaskPage, TaskSpec, Triggered,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::common::{TestApp, TestRedis, muster_bin};

/// Runs `muster <args> --url <app>` (and its token); returns the exit code,
/// stdout and stderr.
async fn muster(app: &TestApp, args: &[&str]) -> (i32, String, String) {
    let mut cmd = tokio::process::Command::new(muster_bin());
    cmd.args(args).arg("--url").arg(&app.url).env_remove("MUSTER_URL");
    match &app.token {
        Some(t) => cmd.env("MUSTER_TOKEN", t),
        None => cmd.env_remove("MUSTER_TOKEN"),
    };
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the command exits")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The same with `--json`, read as the answer it prints; the command must
/// succeed.
async fn muster_json<T: DeserializeOwned>(app: &TestApp, args: &[&str]) -> T {
    let mut all = args.to_vec();
    all.push("--json");
    let (code, out, err) = muster(app, &all).await;
    assert_eq!(code, 0, "muster {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("muster {args:?} --json printed no JSON ({e}): {out}"))
}

fn client(app: &TestApp) -> Client {
    Client::builder()
        .url(&app.url)
        .token_opt(app.token.clone())
        .build()
        .unwrap()
}

/// Claims the queue's head for worker `w` and returns (id, token).
async fn claim_one(c: &Client, queue: &str) -> (String, u64) {
    let hb = NodeHeartbeat {
        ttl_ms: Some(60_000),
        ..Default::default()
    };
    c.heartbeat_node("cli-w", &hb).await.unwrap();
    let req = ClaimRequest {
        node: "cli-w".into(),
        max: 1,
        wait_ms: 0,
        ack_ms: None,
    };
    let t = c.claim(queue, &req).await.unwrap().remove(0);
    (t.id, t.token)
}

/// A dead task of `queue`: submitted, claimed and failed for good.
async fn a_dead_task(c: &Client, queue: &str) -> String {
    c.submit(queue, &TaskSpec::default()).await.unwrap();
    let (id, token) = claim_one(c, queue).await;
    let fail = Fail {
        token,
        error: "broken".into(),
        retry: false,
        next: None,
    };
    c.fail(&id, &fail).await.unwrap();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_submit_get_wait_cancel_retry() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(&app);

    // submit: a table, and the same as JSON; the payload is JSON.
    let (code, out, err) = muster(&app, &["task", "submit", "cli-t", "--payload", r#"{"to":"a@b"}"#]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("ID") && out.contains("cli-t") && out.contains("queued"),
        "{out}"
    );
    let id = out
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let s: Submitted = muster_json(
        &app,
        &["task", "submit", "cli-t", "--priority", "5", "--idempotency-key", "k1"],
    )
    .await;
    assert_eq!((s.state.as_str(), s.replayed), ("queued", false));
    let again: Submitted = muster_json(&app, &["task", "submit", "cli-t", "--idempotency-key", "k1"]).await;
    assert_eq!((&again.id, again.replayed), (&s.id, true));

    // get
    let (code, out, _) = muster(&app, &["task", "get", &id]).await;
    assert_eq!(code, 0);
    assert!(
        out.contains(r#"{"to":"a@b"}"#) && out.contains("state") && out.contains("queued"),
        "{out}"
    );
    let t: TaskInfo = muster_json(&app, &["task", "get", &id]).await;
    assert_eq!(t.payload, json!({"to": "a@b"}));

    // wait: still queued when --timeout runs out: 3 (try again later).
    let (code, _, err) = muster(&app, &["task", "wait", &id, "--timeout", "300ms"]).await;
    assert_eq!(code, 3, "{err}");

    // cancel a queued task; waiting on it then ends at once, not succeeded: 1.
    let (code, out, _) = muster(&app, &["task", "cancel", &id]).await;
    assert_eq!((code, out.trim()), (0, format!("{id}: cancelled").as_str()));
    let (code, out, _) = muster(&app, &["task", "wait", &id]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("cancelled"), "{out}");

    // wait on a task a worker completes: 0, with its result.
    let done = c.submit("cli-done", &TaskSpec::default()).await.unwrap().id;
    let (claimed, token) = claim_one(&c, "cli-done").await;
    assert_eq!(claimed, done);
    let complete = Complete {
        token,
        result: json!({"ok": 1}),
        next: None,
    };
    c.complete(&done, &complete).await.unwrap();
    let t: TaskInfo = muster_json(&app, &["task", "wait", &done]).await;
    assert_eq!((t.state.as_str(), t.result), ("succeeded", Some(json!({"ok": 1}))));

    // retry a dead task: queued again; a task that is not dead: refused, 1.
    let dead = a_dead_task(&c, "cli-retry").await;
    /// What `task retry --json` prints.
    #[derive(Deserialize)]
    struct Requeued {
        id: String,
        state: String,
    }
    let r: Requeued = muster_json(&app, &["task", "retry", &dead]).await;
    assert_eq!((r.id.as_str(), r.state.as_str()), (dead.as_str(), "queued"));
    assert_eq!(c.task(&dead).await.unwrap().state, "queued");
    let (code, _, err) = muster(&app, &["task", "retry", &dead]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("409"), "{err}");

    // An unknown task is refused (404): 1.
    let (code, _, err) = muster(&app, &["task", "get", "01ARZ3NDEKTSV4RRFFQ69G5FAV"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("404"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_list_pause_resume() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(&app);
    for _ in 0..3 {
        c.submit("cli-q", &TaskSpec::default()).await.unwrap();
    }
    let (code, out, _) = muster(&app, &["queue", "list"]).await;
    assert_eq!(code, 0);
    let row = out
        .lines()
        .find(|l| l.starts_with("cli-q"))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(
        row.split_whitespace().take(3).collect::<Vec<_>>(),
        ["cli-q", "active", "3"]
    );

    let (code, out, _) = muster(&app, &["queue", "pause", "cli-q"]).await;
    assert_eq!((code, out.trim()), (0, "paused cli-q"));
    let list: Vec<QueueStats> = muster_json(&app, &["queue", "list"]).await;
    let q = list.iter().find(|q| q.name == "cli-q").unwrap();
    assert_eq!((q.paused, q.queued), (true, 3));

    let (code, out, _) = muster(&app, &["queue", "resume", "cli-q"]).await;
    assert_eq!((code, out.trim()), (0, "resumed cli-q"));
    assert!(c.queues().await.unwrap().iter().any(|q| q.name == "cli-q" && !q.paused));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_list_retry_discard() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(&app);
    let mut dead = Vec::new();
    for _ in 0..3 {
        dead.push(a_dead_task(&c, "cli-dead").await);
    }
    let (code, out, _) = muster(&app, &["dead", "list"]).await;
    assert_eq!(code, 0);
    for id in &dead {
        assert!(out.contains(id.as_str()), "{out}");
    }
    assert!(out.contains("broken") && out.trim_end().ends_with("3 of 3"), "{out}");
    let page: TaskPage = muster_json(&app, &["dead", "list", "--queue", "cli-dead", "--limit", "2"]).await;
    assert_eq!((page.tasks.len(), page.total), (2, 3));

    let (code, out, _) = muster(&app, &["dead", "retry", "cli-dead", "--limit", "1"]).await;
    assert_eq!(code, 0);
    assert!(
        out.starts_with("retried 1 dead tasks of cli-dead; 2 left dead"),
        "{out}"
    );
    let r: BulkOutcome = muster_json(&app, &["dead", "discard", "cli-dead"]).await;
    assert_eq!((r.done, r.left), (2, 0));
    let page = c.tasks("cli-dead", "dead", 10, None).await.unwrap();
    assert_eq!(page.total, 0);

    let (code, _, err) = muster(&app, &["dead", "list", "--limit", "0"]).await;
    assert_eq!(code, 2, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_list_drain() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(&app);
    let hb = NodeHeartbeat {
        ttl_ms: Some(60_000),
        addr: "10.0.0.9:9000".into(),
        ..Default::default()
    };
    c.heartbeat_node("cli-worker", &hb).await.unwrap();
    let (code, out, _) = muster(&app, &["node", "list"]).await;
    assert_eq!(code, 0);
    assert!(out.starts_with("ID"), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("cli-worker"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        row.contains("worker") && row.contains("alive") && row.contains("10.0.0.9:9000"),
        "{row}"
    );
    assert!(out.contains(&app.node_id), "the node itself is listed: {out}");

    let (code, out, _) = muster(&app, &["node", "drain", "cli-worker"]).await;
    assert_eq!((code, out.trim()), (0, "draining cli-worker"));
    let nodes: Vec<NodeInfo> = muster_json(&app, &["node", "list"]).await;
    let w = nodes.iter().find(|n| n.id == "cli-worker").unwrap();
    assert_eq!(w.state, "draining");

    let (code, _, err) = muster(&app, &["node", "drain", "no such node"]).await;
    assert_eq!(code, 2, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_list_trigger() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(&app);
    let def = ScheduleDef {
        id: "cli-nightly".into(),
        expression: "0 3 * * *".into(),
        timezone: "Europe/Berlin".into(),
        queue: "cli-s".into(),
        task: Default::default(),
        enabled: true,
        overlap: Default::default(),
        starting_deadline_ms: None,
        backfill: false,
    };
    c.create_schedule(&def).await.unwrap();
    let (code, out, _) = muster(&app, &["schedule", "list"]).await;
    assert_eq!(code, 0);
    let row = out
        .lines()
        .find(|l| l.starts_with("cli-nightly"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        row.contains("0 3 * * *") && row.contains("Europe/Berlin") && row.contains("cli-s"),
        "{row}"
    );

    let t: Triggered = muster_json(&app, &["schedule", "trigger", "cli-nightly", "--key", "once"]).await;
    let task = t.task;
    assert_eq!(c.task(&task).await.unwrap().queue, "cli-s");
    // The same key fires nothing more: the same task.
    let (code, out, _) = muster(&app, &["schedule", "trigger", "cli-nightly", "--key", "once"]).await;
    assert_eq!(code, 0);
    assert_eq!(out.trim(), format!("triggered cli-nightly: task {task} in cli-s"));

    let (code, _, err) = muster(&app, &["schedule", "trigger", "no-such-schedule"]).await;
    assert_eq!(code, 1, "{err}");
}

/// 2 for a wrong command line, 3 when no node answers, 1 when the node
/// refuses; nothing is sent for a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_mean_something() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let (code, _, err) = muster(&app, &["task", "submit", "cli-x", "--payload", "{not json"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--payload is not JSON"), "{err}");
    let (code, _, err) = muster(&app, &["task", "submit", "a b"]).await;
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = muster(&app, &["queue", "frobnicate"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(client(&app).queues().await.unwrap().iter().all(|q| q.name != "cli-x"));

    // Nobody listens there.
    let port = crate::common::free_port();
    let out = tokio::process::Command::new(muster_bin())
        .args([
            "queue",
            "list",
            "--retry-for",
            "0s",
            "--url",
            &format!("http://127.0.0.1:{port}"),
        ])
        .env_remove("MUSTER_URL")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));

    // Refused: a queue name the node takes but a limit it does not.
    let (code, _, err) = muster(&app, &["dead", "retry", "cli-x", "--limit", "0"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("400"), "{err}");
}
