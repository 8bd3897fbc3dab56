//! The conformance suite (`tests/conformance/*.json`, described in its
//! README.md) run by the Rust client: each scenario against a fresh Redis
//! (or, with `MUSTER_TEST_CLUSTER=1`, a namespace of the shared cluster) and
//! two in-process nodes sharing it, with `muster::client::Client` and
//! `Worker`. One test per scenario file; `every_scenario_has_a_test` fails
//! when a file is added without one.
//!
//! A *worker process* is this test binary run again
//! (`--exact conformance::worker_process_main`) with [`WORKER_ENV`] naming
//! its config: it runs the scripted handler under a `Worker` of its own,
//! which handles SIGTERM, and appends one JSON line per handler event to a
//! file. Without the variable `worker_process_main` returns at once.
//!
//! `kill_node` crashes an in-process node (`Running::kill`: its server and
//! loops stop at once, without leaving), which is what SIGKILL does to a
//! node process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use muster::client::{
    CancelReason, ClaimRequest, ClaimedTask, Client, Complete, Ctx, Event, EventFrame, EventsOptions, Fail,
    HandlerError, NodeHeartbeat, Task, TaskInfo, TaskSpec, Worker, WorkerStats,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::common::*;

/// Names the worker process's config (JSON: urls, queue, out, id, ttl_ms,
/// grace_ms).
const WORKER_ENV: &str = "MUSTER_CONFORMANCE_WORKER";

/// Scenarios this runner cannot run, and why (none).
const SKIP: &[(&str, &str)] = &[];

fn scenario_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("conformance")
}

/// The scenario files this module has a test for.
const FILES: &[&str] = &[
    "01-submit.json",
    "02-claim.json",
    "03-complete.json",
    "04-fail-and-retry.json",
    "05-cancel.json",
    "06-stale-token.json",
    "07-node-failover.json",
    "08-kill-worker.json",
    "09-graceful-stop.json",
    "10-event-resume.json",
];

macro_rules! scenario_tests {
    ($($name:ident => $file:literal),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                run_file($file).await;
            }
        )*
    };
}

scenario_tests! {
    s01_submit => "01-submit.json",
    s02_claim => "02-claim.json",
    s03_complete => "03-complete.json",
    s04_fail_and_retry => "04-fail-and-retry.json",
    s05_cancel => "05-cancel.json",
    s06_stale_token => "06-stale-token.json",
    s07_node_failover => "07-node-failover.json",
    s08_kill_worker => "08-kill-worker.json",
    s09_graceful_stop => "09-graceful-stop.json",
    s10_event_resume => "10-event-resume.json",
}

#[test]
fn every_scenario_has_a_test() {
    let mut on_disk: Vec<String> = std::fs::read_dir(scenario_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".json"))
        .collect();
    on_disk.sort();
    assert_eq!(
        on_disk, FILES,
        "tests/conformance has scenarios without a test here (add them to FILES and scenario_tests!)"
    );
}

// ---------------------------------------------------------------- handler

/// The suite's handler (README, "The handler"): its behaviour comes from
/// the payload; every start and abort goes to `note`.
async fn scripted(task: Task, ctx: Ctx, note: Arc<dyn Fn(Note) + Send + Sync>) -> Result<Value, HandlerError> {
    // A payload that is not a script (not an object) scripts nothing.
    let p: Script = serde_json::from_value(task.payload.clone()).unwrap_or_default();
    note(Note::of("start", &task));
    if let Some(k) = p.fail_until
        && u64::from(task.attempt) < k
    {
        return Err(format!("planned failure on attempt {}", task.attempt).into());
    }
    let blocks = p.block && p.block_attempts.as_ref().is_none_or(|on| on.contains(&task.attempt));
    if blocks {
        let ms = p.block_ms.unwrap_or(30_000);
        tokio::select! {
            _ = ctx.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
        }
        if let Some(why) = ctx.cancel_reason() {
            note(Note {
                reason: Some(reason_name(why).into()),
                ..Note::of("aborted", &task)
            });
        }
    }
    if let Some(ms) = p.sleep_ms {
        tokio::select! {
            _ = ctx.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
        }
    }
    if ctx.cancel_reason() == Some(CancelReason::CancelRequested) && p.on_cancel.as_deref() != Some("return") {
        return Err("stopped on a cancel request".into());
    }
    Ok(json!({"echo": p.echo, "attempt": task.attempt, "by": ctx.worker_id()}))
}

/// What the handler does, from the task's payload (README, "The handler").
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Script {
    fail_until: Option<u64>,
    block: bool,
    block_attempts: Option<Vec<u32>>,
    block_ms: Option<u64>,
    sleep_ms: Option<u64>,
    on_cancel: Option<String>,
    echo: Value,
}

/// One thing a handler recorded (a line of a worker process's file).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Note {
    /// start, aborted, or exit (a worker process's last line).
    event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    task: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// The worker's stats at exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stats: Option<String>,
}

impl Note {
    fn of(event: &str, task: &Task) -> Note {
        Note {
            event: event.into(),
            task: Some(task.id.clone()),
            attempt: Some(task.attempt),
            ..Note::default()
        }
    }
}

/// The suite's names for the reasons (the Python worker's).
fn reason_name(r: CancelReason) -> &'static str {
    match r {
        CancelReason::Lost => "stale",
        CancelReason::LeaseExpired => "lease_expired",
        CancelReason::CancelRequested => "cancel_requested",
        CancelReason::Shutdown => "shutdown",
    }
}

/// A scenario's name for a counter, read from the Rust worker's stats.
fn stat(s: &WorkerStats, name: &str) -> u64 {
    match name {
        "claimed" => s.claimed,
        "completed" => s.completed,
        "failed" => s.failed,
        // Results dropped because the token was stale.
        "stale" | "dropped" => s.dropped,
        // Handlers told of a cancel request.
        "cancelled" | "cancel_requests" => s.cancel_requests,
        "handed_back" => s.handed_back,
        "panicked" => s.panicked,
        "adopted" => s.adopted,
        "lease_lapses" => s.lease_lapses,
        other => panic!("the Rust worker has no counter for `{other}`"),
    }
}

fn client(urls: &[String]) -> Client {
    Client::builder()
        .urls(urls.iter().cloned())
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_millis(500))
        .retry_for(Duration::from_secs(20))
        .backoff(Duration::from_millis(20), Duration::from_millis(300))
        .build()
        .unwrap()
}

fn ms(v: Option<u64>, default: u64) -> Duration {
    Duration::from_millis(v.unwrap_or(default))
}

// ---------------------------------------------------------- worker process

/// The worker process's entry point: returns at once unless [`WORKER_ENV`]
/// is set (so it passes, doing nothing, in an ordinary test run).
#[test]
fn worker_process_main() {
    let Ok(cfg) = std::env::var(WORKER_ENV) else {
        return;
    };
    let cfg: ProcConfig = serde_json::from_str(&cfg).expect("the worker config is JSON");
    let out = cfg.out.clone();
    let note = {
        let out = out.clone();
        move |e: Note| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&out)
                .unwrap();
            writeln!(f, "{}", serde_json::to_string(&e).unwrap()).unwrap();
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stats = rt.block_on(async {
        let note: Arc<dyn Fn(Note) + Send + Sync> = Arc::new(note.clone());
        let worker = Worker::builder(client(&cfg.urls))
            .queue(&cfg.queue)
            .id(&cfg.id)
            .ttl(ms(Some(cfg.ttl_ms), 1000))
            .grace(ms(Some(cfg.grace_ms), 30_000))
            .task_heartbeat(Duration::from_millis(300))
            .claim_wait(Duration::from_millis(1000))
            .handler(move |t, c| scripted(t, c, note.clone()))
            .build()
            .unwrap();
        // SIGTERM or ctrl-c: a graceful stop.
        worker.run().await.expect("the worker runs")
    });
    note(Note {
        event: "exit".into(),
        stats: Some(format!("{stats:?}")),
        ..Note::default()
    });
}

/// A worker process's config, in [`WORKER_ENV`].
#[derive(Debug, Serialize, Deserialize)]
struct ProcConfig {
    urls: Vec<String>,
    queue: String,
    /// The file it appends its [`Note`]s to.
    out: PathBuf,
    id: String,
    ttl_ms: u64,
    grace_ms: u64,
}

// -------------------------------------------------------------- scenarios

/// A scenario file (tests/conformance/README.md).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    name: String,
    /// The client behaviour it holds the client to.
    #[serde(default)]
    checks: String,
    steps: Vec<Step>,
}

/// One step: its `op` and the fields the README's table lists for it.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Step {
    op: String,
    /// The alias a step names what it makes (a task, claim, worker, follow).
    #[serde(rename = "as", default, skip_serializing_if = "Option::is_none")]
    alias: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    task: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    claim: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    worker: Option<String>,
    /// A worker id (`register`, `claim`) or a node's index (`kill_node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<NodeRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    payload: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backoff_base_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry: Option<bool>,
    /// ok or conflict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expect: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    succeeded_attempts: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    within_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    for_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    concurrency: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ttl_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    heartbeat_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    grace_ms: Option<u64>,
    /// start or aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    event: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    /// KILL or TERM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signal: Option<String>,
    /// Worker counters and their least values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at_least: Option<HashMap<String, u64>>,
    /// `start`, or the alias of an earlier follow to resume after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    since: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    count: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topics: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expect_tasks: Option<Vec<String>>,
}

/// A step's `node`: a worker id, or the index of one of the run's nodes.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
enum NodeRef {
    Index(usize),
    Id(String),
}

impl Step {
    /// A text field the step must have.
    #[track_caller]
    fn need<'a>(&self, field: &'a Option<String>, name: &str) -> &'a str {
        match field {
            Some(v) => v,
            None => panic!("step {} needs `{name}`", self.op),
        }
    }

    fn node_id(&self) -> &str {
        match &self.node {
            Some(NodeRef::Id(id)) => id,
            other => panic!("step {} needs `node` (a worker id), got {other:?}", self.op),
        }
    }
}

// ------------------------------------------------------------------ runner

enum AnyWorker {
    In {
        id: String,
        worker: Arc<Worker>,
        events: Arc<Mutex<Vec<Note>>>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        done: Option<tokio::task::JoinHandle<muster::client::Result<WorkerStats>>>,
    },
    Proc {
        id: String,
        child: Child,
        out: PathBuf,
    },
}

impl AnyWorker {
    fn events(&self) -> Vec<Note> {
        match self {
            AnyWorker::In { events, .. } => events.lock().unwrap().clone(),
            AnyWorker::Proc { out, .. } => std::fs::read_to_string(out)
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
        }
    }

    fn id(&self) -> &str {
        match self {
            AnyWorker::In { id, .. } | AnyWorker::Proc { id, .. } => id,
        }
    }
}

struct Run {
    name: String,
    nodes: Vec<TestApp>,
    urls: Vec<String>,
    queue: String,
    client: Client,
    tmp: tempfile::TempDir,
    tasks: HashMap<String, String>,
    claims: HashMap<String, ClaimedTask>,
    workers: HashMap<String, AnyWorker>,
    follows: HashMap<String, Vec<Event>>,
}

/// Fails with what was seen last when `cond` does not hold within `within`.
async fn wait_for<F, Fut>(what: &str, within: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, String>>,
{
    let deadline = Instant::now() + within;
    let mut last = String::new();
    loop {
        match cond().await {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => last = e,
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what} (last: {last})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Run {
    fn task(&self, alias: Option<&str>) -> String {
        let a = alias.expect("a task alias");
        self.tasks.get(a).unwrap_or_else(|| panic!("no task `{a}`")).clone()
    }

    fn worker_id(&self, alias: &str) -> String {
        format!(
            "conf-rs-{}-{alias}-{}",
            self.name.replace('_', "-"),
            std::process::id() % 10_000
        )
    }

    fn worker(&mut self, s: &Step) -> &mut AnyWorker {
        let a = s.worker.as_deref().expect("a worker alias");
        self.workers.get_mut(a).unwrap_or_else(|| panic!("no worker `{a}`"))
    }

    async fn get(&self, id: &str) -> TaskInfo {
        self.client
            .task(id)
            .await
            .unwrap_or_else(|e| panic!("GET task {id}: {e}"))
    }

    async fn step(&mut self, s: &Step) {
        let within = ms(s.within_ms, 15_000);
        let op = s.op.as_str();
        let task = s.task.as_deref();
        match op {
            "submit" => {
                let spec = TaskSpec {
                    payload: s.payload.clone().unwrap_or_default(),
                    max_attempts: s.max_attempts,
                    timeout_ms: s.timeout_ms,
                    backoff_base_ms: s.backoff_base_ms,
                    ..Default::default()
                };
                let r = self.client.submit(&self.queue, &spec).await.unwrap();
                assert_eq!(r.state, "queued", "{r:?}");
                self.tasks.insert(s.need(&s.alias, "as").into(), r.id);
            }
            "register" => {
                let hb = NodeHeartbeat {
                    ttl_ms: Some(30_000),
                    ..Default::default()
                };
                self.client.heartbeat_node(s.node_id(), &hb).await.unwrap();
            }
            "claim" => {
                let req = ClaimRequest {
                    node: s.node_id().into(),
                    max: 1,
                    wait_ms: 2000,
                    ack_ms: None,
                };
                let got = self.client.claim(&self.queue, &req).await.unwrap();
                assert_eq!(got.len(), 1, "one task claimed: {got:?}");
                let c = got.into_iter().next().unwrap();
                assert_eq!(c.id, self.task(task));
                assert!(c.token > 0, "a fencing token: {c:?}");
                self.claims.insert(s.need(&s.alias, "as").into(), c);
            }
            "complete" | "fail" => {
                let c = &self.claims[s.need(&s.claim, "claim")];
                let r = if op == "complete" {
                    let body = Complete {
                        token: c.token,
                        result: s.result.clone().unwrap_or_default(),
                        next: None,
                    };
                    self.client.complete(&c.id, &body).await
                } else {
                    let body = Fail {
                        token: c.token,
                        error: "failed by the scenario".into(),
                        retry: s.retry != Some(false),
                        next: None,
                    };
                    self.client.fail(&c.id, &body).await
                };
                match s.expect.as_deref() {
                    Some("conflict") => match r {
                        Err(e) => assert!(e.is_conflict(), "a 409 conflict, got {e}"),
                        Ok(f) => panic!("a 409 conflict, got {f:?}"),
                    },
                    _ => {
                        r.unwrap();
                    }
                }
            }
            "cancel" => {
                self.client.cancel(&self.task(task)).await.unwrap();
            }
            "expect_task" => self.expect_task(s).await,
            "wait_task" => {
                let id = self.task(task);
                let state = s.need(&s.state, "state");
                if ["succeeded", "dead", "cancelled"].contains(&state) {
                    let t = self
                        .client
                        .wait_for_result(&id, within)
                        .await
                        .unwrap_or_else(|e| panic!("task {task:?}: {e}"));
                    assert_eq!(t.state, state, "task {task:?}: {t:?}");
                } else {
                    let client = self.client.clone();
                    wait_for(&format!("task {task:?} {state}"), within, || {
                        let (client, id) = (client.clone(), id.clone());
                        async move {
                            match client.task(&id).await {
                                Ok(t) if t.state == state => Ok(true),
                                Ok(t) => Err(format!("state {}", t.state)),
                                Err(e) => Err(e.to_string()),
                            }
                        }
                    })
                    .await;
                }
            }
            "stays" => {
                tokio::time::sleep(ms(s.for_ms, 500)).await;
                let t = self.get(&self.task(task)).await;
                assert_eq!(t.state, s.need(&s.state, "state"), "task {task:?}: {t:?}");
            }
            "worker" => {
                let alias = s.need(&s.alias, "as");
                let id = self.worker_id(alias);
                let events: Arc<Mutex<Vec<Note>>> = Arc::default();
                let note: Arc<dyn Fn(Note) + Send + Sync> = {
                    let events = events.clone();
                    Arc::new(move |e| events.lock().unwrap().push(e))
                };
                let worker = Arc::new(
                    Worker::builder(client(&self.urls))
                        .queue(&self.queue)
                        .id(&id)
                        .concurrency(s.concurrency.unwrap_or(1))
                        .ttl(ms(s.ttl_ms, 2000))
                        .task_heartbeat(ms(s.heartbeat_ms, 300))
                        .grace(ms(s.grace_ms, 5000))
                        .claim_wait(Duration::from_millis(500))
                        .handler(move |t, c| scripted(t, c, note.clone()))
                        .build()
                        .unwrap(),
                );
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                let done = tokio::spawn({
                    let w = worker.clone();
                    async move { w.run_until(async { rx.await.unwrap_or(()) }).await }
                });
                let w = AnyWorker::In {
                    id,
                    worker,
                    events,
                    stop: Some(tx),
                    done: Some(done),
                };
                self.workers.insert(alias.into(), w);
            }
            "worker_process" => {
                let alias = s.need(&s.alias, "as");
                let id = self.worker_id(alias);
                let out = self.tmp.path().join(format!("{id}.jsonl"));
                let cfg = ProcConfig {
                    urls: self.urls.clone(),
                    queue: self.queue.clone(),
                    out: out.clone(),
                    id: id.clone(),
                    ttl_ms: s.ttl_ms.unwrap_or(1000),
                    grace_ms: s.grace_ms.unwrap_or(30_000),
                };
                let mut cmd = Command::new(std::env::current_exe().unwrap());
                cmd.args([
                    "--exact",
                    "conformance::worker_process_main",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(WORKER_ENV, serde_json::to_string(&cfg).unwrap())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
                {
                    use std::os::unix::process::CommandExt;
                    // SAFETY: prctl(2) only, between fork and exec: the
                    // worker dies with the test.
                    unsafe {
                        cmd.pre_exec(|| {
                            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                            Ok(())
                        });
                    }
                }
                let child = cmd.spawn().expect("the test binary runs again as a worker process");
                self.workers.insert(alias.into(), AnyWorker::Proc { id, child, out });
            }
            "wait_handler" => {
                let tid = self.task(task);
                let what = format!("{:?}: {:?} of {task:?} ({:?})", s.worker, s.event, s.reason);
                let w = self.worker(s);
                let deadline = Instant::now() + within;
                loop {
                    let seen = w.events();
                    let hit = seen.iter().any(|e| {
                        e.task.as_deref() == Some(tid.as_str())
                            && Some(&e.event) == s.event.as_ref()
                            && (s.reason.is_none() || e.reason == s.reason)
                            && (s.attempt.is_none() || e.attempt == s.attempt)
                    });
                    if hit {
                        break;
                    }
                    if let AnyWorker::Proc { child, id, .. } = w
                        && let Ok(Some(code)) = child.try_wait()
                    {
                        panic!("waiting for {what}: worker process {id} exited ({code}); its events: {seen:?}");
                    }
                    assert!(
                        Instant::now() < deadline,
                        "timed out after {within:?} waiting for {what}; the handler's events: {seen:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            "signal_worker" => {
                let sig = match s.signal.as_deref() {
                    Some("KILL") => libc::SIGKILL,
                    Some("TERM") => libc::SIGTERM,
                    other => panic!("unknown signal {other:?}"),
                };
                let AnyWorker::Proc { child, .. } = self.worker(s) else {
                    panic!("signal_worker needs a worker process");
                };
                // SAFETY: kill(2) on our own child, not yet reaped.
                assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
            }
            "wait_exit" => {
                let AnyWorker::Proc { child, id, .. } = self.worker(s) else {
                    panic!("wait_exit needs a worker process");
                };
                let deadline = Instant::now() + within;
                let status = loop {
                    if let Some(st) = child.try_wait().unwrap() {
                        break st;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "worker process {id} did not exit within {within:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                assert_eq!(status.code(), Some(0), "worker process {id} exit: {status}");
            }
            "stop_worker" => {
                let AnyWorker::In { stop, done, id, .. } = self.worker(s) else {
                    panic!("stop_worker needs an in-process worker");
                };
                let id = id.clone();
                if let Some(tx) = stop.take() {
                    let _ = tx.send(());
                }
                let done = done.take().expect("the worker was stopped once");
                match tokio::time::timeout(Duration::from_secs(15), done).await {
                    Ok(r) => {
                        r.unwrap().unwrap_or_else(|e| panic!("worker {id}: {e}"));
                    }
                    Err(_) => panic!("worker {id} did not stop within 15 s"),
                }
            }
            "expect_worker_stats" => {
                let AnyWorker::In { worker, .. } = self.worker(s) else {
                    panic!("expect_worker_stats needs an in-process worker");
                };
                let stats = worker.stats();
                for (k, &v) in s.at_least.as_ref().expect("at_least") {
                    assert!(stat(&stats, k) >= v, "stats.{k} = {} < {v}: {stats:?}", stat(&stats, k));
                }
            }
            "kill_node" => {
                let Some(NodeRef::Index(n)) = s.node else {
                    panic!("kill_node needs `node` (an index), got {:?}", s.node);
                };
                self.nodes[n].kill().await;
            }
            "follow" => {
                let since = match s.since.as_deref() {
                    Some("start") => Some("0".to_string()),
                    Some(alias) => Some(self.follows[alias].last().expect("the followed events").id.clone()),
                    None => None,
                };
                let want = s.count.expect("count");
                let mut stream = self.client.events(EventsOptions {
                    topics: s.topics.clone(),
                    queue: Some(self.queue.clone()),
                    since,
                });
                let mut got: Vec<Event> = Vec::new();
                let mut err = None;
                let _ = tokio::time::timeout(within, async {
                    while got.len() < want {
                        match stream.next().await {
                            Some(Ok(EventFrame::Event(e))) => got.push(e),
                            Some(Ok(gap)) => {
                                err = Some(format!("{gap:?}"));
                                return;
                            }
                            Some(Err(e)) => {
                                err = Some(e.to_string());
                                return;
                            }
                            None => return,
                        }
                    }
                })
                .await;
                let expect: Vec<String> = s
                    .expect_tasks
                    .as_ref()
                    .expect("expect_tasks")
                    .iter()
                    .map(|a| self.task(Some(a)))
                    .collect();
                let tasks: Vec<&str> = got.iter().map(|e| e.subject("task").unwrap_or("")).collect();
                assert_eq!(tasks, expect, "followed {got:?} ({err:?})");
                self.follows.insert(s.need(&s.alias, "as").into(), got);
            }
            other => panic!("unknown op {other}"),
        }
    }

    async fn expect_task(&self, s: &Step) {
        let t = self.get(&self.task(s.task.as_deref())).await;
        let what = format!("task {:?}: {t:?}", s.task);
        if let Some(state) = &s.state {
            assert_eq!(&t.state, state, "{what}");
        }
        if let Some(payload) = &s.payload {
            assert_eq!(&t.payload, payload, "{what}");
        }
        if let Some(owner) = &s.owner {
            assert_eq!(t.owner.as_ref(), Some(owner), "{what}");
        }
        if let Some(n) = s.attempts {
            assert_eq!(t.attempts, n, "{what}");
        }
        if let Some(n) = s.succeeded_attempts {
            let ok = t
                .attempt_log
                .iter()
                .filter(|a| a.outcome.as_deref() == Some("succeeded"))
                .count();
            assert_eq!(ok as u64, n, "{what}");
        }
        let result = t.result.clone().unwrap_or(Value::Null);
        if let Some(want) = &s.result {
            match (want, &result) {
                (Value::Object(want), Value::Object(got)) => {
                    for (k, v) in want {
                        assert_eq!(got.get(k).unwrap_or(&Value::Null), v, "result.{k} of {what}");
                    }
                }
                _ => assert_eq!(&result, want, "{what}"),
            }
        }
        if let Some(by) = s.result_by.as_deref() {
            let id = self
                .workers
                .get(by)
                .map(|w| w.id().to_string())
                .unwrap_or_else(|| self.worker_id(by));
            assert_eq!(result.get("by"), Some(&json!(id)), "result_by {by}: {what}");
        }
    }

    async fn close(&mut self) {
        for (_, w) in self.workers.drain() {
            match w {
                AnyWorker::In { stop, done, .. } => {
                    if let Some(tx) = stop {
                        let _ = tx.send(());
                    }
                    if let Some(done) = done {
                        let _ = tokio::time::timeout(Duration::from_secs(10), done).await;
                    }
                }
                AnyWorker::Proc { mut child, .. } => {
                    if child.try_wait().ok().flatten().is_none() {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                }
            }
        }
    }
}

async fn run_file(file: &str) {
    let path = scenario_dir().join(file);
    let scenario: Scenario = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{file} is not a scenario (tests/conformance/README.md): {e}"));
    let name = scenario.name.clone();
    eprintln!("conformance {name}: {}", scenario.checks);
    if let Some((_, why)) = SKIP.iter().find(|(n, _)| *n == name) {
        eprintln!("SKIP conformance {name}: {why}");
        return;
    }
    let redis = TestRedis::start();
    let tweak = |cfg: &mut muster::config::Config| {
        cfg.nodes.ttl_ms = 1000;
        cfg.orphans.interval_ms = 200;
    };
    let nodes = vec![
        TestApp::start_with(&redis, tweak).await,
        TestApp::start_with(&redis, tweak).await,
    ];
    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let mut run = Run {
        queue: format!("conf-rs-{}", name.replace('_', "-")),
        name: name.clone(),
        client: client(&urls),
        urls,
        nodes,
        tmp: tempfile::Builder::new().prefix("muster-conf").tempdir().unwrap(),
        tasks: HashMap::new(),
        claims: HashMap::new(),
        workers: HashMap::new(),
        follows: HashMap::new(),
    };
    let started = Instant::now();
    for (i, s) in scenario.steps.iter().enumerate() {
        // A failing step names itself; the workers are stopped either way.
        let r = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(run.step(s))).await;
        if let Err(panic) = r {
            run.close().await;
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!(
                "conformance {name}, step {} {}: {msg}",
                i + 1,
                serde_json::to_string(s).unwrap_or_default()
            );
        }
    }
    run.close().await;
    eprintln!("conformance {name}: passed in {:?}", started.elapsed());
}
