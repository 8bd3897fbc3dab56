//! Tracing (issue 39) end to end: nodes and a worker export spans over
//! OTLP/HTTP to a receiver in this process, which decodes the protobuf with
//! messages written from the OpenTelemetry `.proto` files (not with the
//! node's encoder), and the test follows one task's trace from its submit,
//! through a failed attempt and its retry, to the attempt that succeeded,
//! across two nodes.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use muster::client::{HandlerError, TaskSpec, Worker};
use prost::Message;
use serde_json::{Value, json};

use crate::common::*;

/// `opentelemetry/proto/collector/trace/v1`, `trace/v1`, `common/v1` and
/// `resource/v1`: the fields the test reads.
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExportTraceServiceRequest {
        #[prost(message, repeated, tag = "1")]
        pub resource_spans: Vec<ResourceSpans>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceSpans {
        #[prost(message, optional, tag = "1")]
        pub resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub scope_spans: Vec<ScopeSpans>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Resource {
        #[prost(message, repeated, tag = "1")]
        pub attributes: Vec<KeyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ScopeSpans {
        #[prost(message, optional, tag = "1")]
        pub scope: Option<Scope>,
        #[prost(message, repeated, tag = "2")]
        pub spans: Vec<Span>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Scope {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub version: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Span {
        #[prost(bytes = "vec", tag = "1")]
        pub trace_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub span_id: Vec<u8>,
        #[prost(string, tag = "3")]
        pub trace_state: String,
        #[prost(bytes = "vec", tag = "4")]
        pub parent_span_id: Vec<u8>,
        #[prost(string, tag = "5")]
        pub name: String,
        #[prost(int32, tag = "6")]
        pub kind: i32,
        #[prost(fixed64, tag = "7")]
        pub start_time_unix_nano: u64,
        #[prost(fixed64, tag = "8")]
        pub end_time_unix_nano: u64,
        #[prost(message, repeated, tag = "9")]
        pub attributes: Vec<KeyValue>,
        #[prost(message, repeated, tag = "11")]
        pub events: Vec<Event>,
        #[prost(message, repeated, tag = "13")]
        pub links: Vec<Link>,
        #[prost(message, optional, tag = "15")]
        pub status: Option<Status>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Event {
        #[prost(fixed64, tag = "1")]
        pub time_unix_nano: u64,
        #[prost(string, tag = "2")]
        pub name: String,
        #[prost(message, repeated, tag = "3")]
        pub attributes: Vec<KeyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Link {
        #[prost(bytes = "vec", tag = "1")]
        pub trace_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub span_id: Vec<u8>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Status {
        #[prost(string, tag = "2")]
        pub message: String,
        #[prost(int32, tag = "3")]
        pub code: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<AnyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AnyValue {
        #[prost(oneof = "Value", tags = "1, 2, 3, 4")]
        pub value: Option<Value>,
    }
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        Str(String),
        #[prost(bool, tag = "2")]
        Bool(bool),
        #[prost(int64, tag = "3")]
        Int(i64),
        #[prost(double, tag = "4")]
        F64(f64),
    }
}

/// A span as received, flattened: its resource's `service.instance.id`
/// beside it, attributes as text.
#[derive(Debug, Clone)]
struct Got {
    instance: String,
    service: String,
    trace: String,
    id: String,
    parent: String,
    name: String,
    kind: i32,
    error: bool,
    attrs: Vec<(String, String)>,
    events: Vec<String>,
    /// trace id, span id of each link.
    links: Vec<(String, String)>,
}

impl Got {
    fn attr(&self, k: &str) -> Option<&str> {
        self.attrs.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn text(v: &Option<proto::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(proto::Value::Str(s)) => s.clone(),
        Some(proto::Value::Bool(b)) => b.to_string(),
        Some(proto::Value::Int(n)) => n.to_string(),
        Some(proto::Value::F64(x)) => x.to_string(),
        None => String::new(),
    }
}

/// An OTLP/HTTP receiver: `POST /v1/traces` with a protobuf body.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Got>>>,
    requests: Arc<AtomicU32>,
    _server: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// A node on `redis` exporting its spans here, with `tweak` applied.
    async fn node(&self, redis: &TestRedis, tweak: impl FnOnce(&mut muster::config::Config)) -> TestApp {
        let endpoint = self.url.clone();
        TestApp::start_with(redis, |c| {
            c.telemetry.otlp_endpoint = endpoint;
            tweak(c);
        })
        .await
    }

    async fn start() -> Receiver {
        let spans: Arc<Mutex<Vec<Got>>> = Arc::default();
        let requests = Arc::new(AtomicU32::new(0));
        let (s2, r2) = (spans.clone(), requests.clone());
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: Bytes| {
                let (spans, requests) = (s2.clone(), r2.clone());
                async move {
                    requests.fetch_add(1, Ordering::Relaxed);
                    assert_eq!(
                        headers.get("content-type").and_then(|v| v.to_str().ok()),
                        Some("application/x-protobuf")
                    );
                    let req = proto::ExportTraceServiceRequest::decode(body).expect("an OTLP request");
                    let mut out = spans.lock().unwrap();
                    for rs in req.resource_spans {
                        let attr = |k: &str| {
                            rs.resource
                                .as_ref()
                                .and_then(|r| r.attributes.iter().find(|a| a.key == k))
                                .map(|a| text(&a.value))
                                .unwrap_or_default()
                        };
                        let (instance, service) = (attr("service.instance.id"), attr("service.name"));
                        for ss in rs.scope_spans {
                            for s in ss.spans {
                                out.push(Got {
                                    instance: instance.clone(),
                                    service: service.clone(),
                                    trace: hex(&s.trace_id),
                                    id: hex(&s.span_id),
                                    parent: hex(&s.parent_span_id),
                                    name: s.name,
                                    kind: s.kind,
                                    error: s.status.as_ref().is_some_and(|st| st.code == 2),
                                    attrs: s.attributes.iter().map(|a| (a.key.clone(), text(&a.value))).collect(),
                                    events: s.events.iter().map(|e| e.name.clone()).collect(),
                                    links: s.links.iter().map(|l| (hex(&l.trace_id), hex(&l.span_id))).collect(),
                                });
                            }
                        }
                    }
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver {
            url,
            spans,
            requests,
            _server: server,
        }
    }

    fn of_trace(&self, trace: &str) -> Vec<Got> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace == trace)
            .cloned()
            .collect()
    }
}

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn caller_traceparent() -> String {
    format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")
}

#[tokio::test]
async fn one_trace_follows_a_task_from_its_submit_through_a_retry_across_two_nodes() {
    let receiver = Receiver::start().await;
    let redis = TestRedis::start();
    let mut a = receiver.node(&redis, |_| {}).await;
    let mut b = receiver.node(&redis, |_| {}).await;
    let queue = "traced";

    // Submitted on node a, by a caller in trace CALLER_TRACE.
    let (status, body) = send(
        a.request(reqwest::Method::POST, &format!("/api/v1/queues/{queue}/tasks"))
            .header("traceparent", caller_traceparent())
            .header("tracestate", "vendor=opaque")
            .json(&json!({"payload": {"n": 1}, "backoff_base_ms": 10, "backoff_cap_ms": 10, "max_attempts": 3})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_string();

    // Worked through node b by a worker that fails once, then succeeds.
    let attempts = Arc::new(AtomicU32::new(0));
    let seen_tp: Arc<Mutex<Vec<String>>> = Arc::default();
    let worker = {
        let (attempts, seen_tp) = (attempts.clone(), seen_tp.clone());
        Arc::new(
            Worker::builder(api_client(&[b.url.clone()], None))
                .queue(queue)
                .id("w-traced")
                .claim_wait(Duration::from_millis(200))
                .otlp_endpoint(receiver.url.clone(), "test-worker")
                .handler(move |_task, ctx| {
                    let (attempts, seen_tp) = (attempts.clone(), seen_tp.clone());
                    async move {
                        seen_tp
                            .lock()
                            .unwrap()
                            .push(ctx.traceparent().unwrap_or("").to_string());
                        if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                            Err(HandlerError::from("the first attempt fails".to_string()))
                        } else {
                            Ok(json!({"ok": true}))
                        }
                    }
                })
                .build()
                .unwrap(),
        )
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn({
        let w = worker.clone();
        async move { w.run_until(async { stop_rx.await.unwrap_or(()) }).await }
    });
    let done = wait_until(Duration::from_secs(20), || {
        let b = &b;
        let id = id.clone();
        async move { b.get(&format!("/api/v1/tasks/{id}")).await.1["state"] == "succeeded" }
    })
    .await;
    assert!(done, "the task did not succeed");
    let _ = stop_tx.send(());
    run.await.unwrap().unwrap();
    let (_, task) = b.get(&format!("/api/v1/tasks/{id}")).await;
    a.shutdown().await;
    b.shutdown().await;

    // The task keeps the context its send span made: in the caller's trace.
    let stored = task["traceparent"].as_str().expect("the task shows its traceparent");
    assert!(stored.starts_with(&format!("00-{CALLER_TRACE}-")), "{stored}");
    assert_eq!(task["tracestate"], "vendor=opaque");
    // Each attempt's handler got its own span in that trace.
    let tps = seen_tp.lock().unwrap().clone();
    assert_eq!(tps.len(), 2, "{tps:?}");
    assert!(
        tps.iter().all(|t| t.starts_with(&format!("00-{CALLER_TRACE}-"))),
        "{tps:?}"
    );
    assert_ne!(tps[0], tps[1]);

    assert!(
        receiver.requests.load(Ordering::Relaxed) >= 2,
        "the nodes and the worker export"
    );
    let spans = receiver.of_trace(CALLER_TRACE);
    let show = || {
        spans
            .iter()
            .map(|s| format!("{} {} <- {} [{}] {:?}", s.name, s.id, s.parent, s.instance, s.attrs))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let by_name = |n: &str| spans.iter().filter(|s| s.name == n).cloned().collect::<Vec<_>>();
    let parent_of = |s: &Got| spans.iter().find(|p| p.id == s.parent).cloned();

    // The submit: node a's server span, child of the caller's span, and the
    // send span under it.
    let submit = by_name("POST /api/v1/queues/{queue}/tasks");
    assert_eq!(submit.len(), 1, "{}", show());
    assert_eq!(submit[0].parent, CALLER_SPAN);
    assert_eq!(submit[0].instance, a.node_id);
    assert_eq!(submit[0].kind, 2, "a server span");
    assert_eq!(submit[0].attr("http.route"), Some("/api/v1/queues/{queue}/tasks"));
    let send_span = by_name(&format!("send {queue}"));
    assert_eq!(send_span.len(), 1, "{}", show());
    assert_eq!(send_span[0].parent, submit[0].id);
    assert_eq!(send_span[0].kind, 4, "a producer span");
    assert_eq!(send_span[0].attr("messaging.message.id"), Some(id.as_str()));
    assert!(
        stored.contains(&send_span[0].id),
        "the task stores its send span's context"
    );
    // The enqueue script's Redis call is a child of the submit.
    assert!(
        spans
            .iter()
            .any(|s| s.name.starts_with("redis ") && s.parent == submit[0].id),
        "{}",
        show()
    );

    // Both attempts: the worker's process spans, children of the send span.
    let process = by_name(&format!("process {queue}"));
    assert_eq!(process.len(), 2, "{}", show());
    for p in &process {
        assert_eq!(p.parent, send_span[0].id, "{}", show());
        assert_eq!(p.service, "test-worker");
        assert_eq!(p.kind, 5, "a consumer span");
    }
    let first = process
        .iter()
        .find(|p| p.attr("muster.task.attempt") == Some("1"))
        .expect("attempt 1");
    let second = process
        .iter()
        .find(|p| p.attr("muster.task.attempt") == Some("2"))
        .expect("attempt 2");
    assert!(first.error && !second.error, "{}", show());
    assert!(tps.iter().any(|t| t.contains(&first.id)) && tps.iter().any(|t| t.contains(&second.id)));

    // The retry: node b's fail span, under the fail call the first attempt made.
    let fails = by_name("fail");
    assert_eq!(fails.len(), 1, "{}", show());
    assert_eq!(fails[0].attr("muster.task.outcome"), Some("retry"), "{}", show());
    assert!(fails[0].events.iter().any(|e| e == "retry scheduled"));
    let call = parent_of(&fails[0]).expect("the fail call's server span");
    assert_eq!(call.name, "POST /api/v1/tasks/{id}/fail");
    assert_eq!(call.parent, first.id, "the fail call is the first attempt's child");
    assert_eq!(call.instance, b.node_id);
    // The success: the complete span under the second attempt's call.
    let completes = by_name("complete");
    assert_eq!(completes.len(), 1, "{}", show());
    assert_eq!(completes[0].attr("muster.task.outcome"), Some("succeeded"));
    let call = parent_of(&completes[0]).expect("the complete call's server span");
    assert_eq!(call.parent, second.id);
    // Each claim: a receive span on node b, child of the send span.
    let receives = by_name(&format!("receive {queue}"));
    assert_eq!(receives.len(), 2, "{}", show());
    assert!(
        receives
            .iter()
            .all(|r| r.parent == send_span[0].id && r.instance == b.node_id)
    );

    // Across two nodes, one trace; and nothing in it without a parent in it
    // but the submit (whose parent is the caller's).
    let instances: std::collections::HashSet<_> = spans.iter().map(|s| s.instance.clone()).collect();
    assert!(instances.contains(&a.node_id) && instances.contains(&b.node_id));
    for s in &spans {
        assert!(
            s.parent == CALLER_SPAN || spans.iter().any(|p| p.id == s.parent),
            "{} has a parent outside the trace:\n{}",
            s.name,
            show()
        );
    }
}

#[tokio::test]
async fn trace_context_is_stored_handed_out_and_checked_with_tracing_off() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| {
        c.telemetry.trace_url = "http://viewer.test/trace/{trace_id}".into()
    })
    .await;
    let c = app.api();
    let queue = "trace-off";
    let tp = caller_traceparent();

    // The header on a submit: stored as given (no span of the node's).
    let (status, body) = send(
        app.request(reqwest::Method::POST, &format!("/api/v1/queues/{queue}/tasks"))
            .header("traceparent", &tp)
            .json(&json!({"payload": 1})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    // A malformed header is ignored, as the W3C recommendation asks.
    let (status, body) = send(
        app.request(reqwest::Method::POST, &format!("/api/v1/queues/{queue}/tasks"))
            .header("traceparent", "00-zz-00f067aa0ba902b7-01")
            .json(&json!({"payload": 2, "priority": -1})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    crate::tasks::join(&app, "w-off").await;
    let claimed = crate::tasks::claim_tasks(&app, queue, "w-off", 2, 0).await;
    assert_eq!(claimed.len(), 2);
    assert_eq!(claimed[0].traceparent.as_deref(), Some(tp.as_str()));
    assert_eq!(claimed[1].traceparent, None);
    // The dashboard shows the trace id, linked through telemetry.trace_url;
    // a task without a trace shows none.
    let page = app.page(&format!("/tasks/{}", claimed[0].id)).await;
    assert!(
        page.contains(&format!("href=\"http://viewer.test/trace/{CALLER_TRACE}\"")),
        "the task page links its trace"
    );
    let page = app.page(&format!("/tasks/{}", claimed[1].id)).await;
    assert!(!page.contains("viewer.test"));

    // In a batch each item has its own; bad ones fail alone, with a reason.
    let spec = |tp: Option<&str>, ts: Option<&str>| TaskSpec {
        payload: json!(0),
        traceparent: tp.map(str::to_string),
        tracestate: ts.map(str::to_string),
        ..Default::default()
    };
    let long = "k=".to_string() + &"v".repeat(511);
    let items = c
        .submit_batch(
            queue,
            &[
                spec(Some(&tp), Some("a=b")),
                spec(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"), None),
                spec(None, Some("a=b")),
                spec(Some(&tp), Some(&long)),
                spec(Some(&tp), Some("a=b\u{7}")),
            ],
        )
        .await
        .unwrap();
    assert_eq!(items[0].status, "created", "{items:?}");
    for (i, why) in [
        (1, "traceparent"),
        (2, "needs a `traceparent`"),
        (3, "512"),
        (4, "printable"),
    ] {
        assert_eq!(items[i].status, "error", "{items:?}");
        assert_eq!(items[i].code, Some(400));
        assert!(items[i].error.as_deref().unwrap_or("").contains(why), "{:?}", items[i]);
    }
    let (_, task) = app
        .get(&format!("/api/v1/tasks/{}", items[0].id.as_deref().unwrap()))
        .await;
    assert_eq!(task["traceparent"], Value::from(tp.clone()));
    assert_eq!(task["tracestate"], "a=b");
    // The single submit's body field is checked too: 400, nothing created.
    let before = c.queue(queue).await.unwrap().stats.queued;
    let (status, body) = app
        .post(
            &format!("/api/v1/queues/{queue}/tasks"),
            json!({"payload": 1, "traceparent": "not one"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["detail"].as_str().unwrap_or("").contains("traceparent"), "{body}");
    assert_eq!(c.queue(queue).await.unwrap().stats.queued, before);
}

#[tokio::test]
async fn a_receiver_that_is_down_blocks_nothing_and_the_dropped_spans_are_counted() {
    // Nothing listens there: every export fails at once.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| {
        c.telemetry.otlp_endpoint = closed.clone();
        c.telemetry.queue = 16;
    })
    .await;
    let queue = "trace-down";
    let started = std::time::Instant::now();
    for i in 0..200 {
        let (status, body) = send(
            app.request(reqwest::Method::POST, &format!("/api/v1/queues/{queue}/tasks"))
                .header("traceparent", caller_traceparent())
                .json(&json!({"payload": i})),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    // 200 submits with three spans or more each (the request, the send,
    // the enqueue script): far more than the queue of 16 holds while
    // exports fail; none waited for the exporter.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "200 submits took {took:?}");
    let counted = wait_until(Duration::from_secs(10), || async {
        app.state().tracer.counts().1 >= 600
    })
    .await;
    let (exported, dropped) = app.state().tracer.counts();
    assert!(
        counted,
        "dropped {dropped}, exported {exported}: every span should be dropped and counted"
    );
    assert_eq!(exported, 0);
    // The process's counter says so too (it sums the nodes of this test
    // process: at least this node's).
    let text = app
        .request(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counter = text
        .lines()
        .find(|l| l.starts_with("muster_trace_spans_dropped_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(counter >= 600.0, "muster_trace_spans_dropped_total {counter}");
}

#[tokio::test]
async fn a_workflows_tasks_share_its_runs_trace() {
    let receiver = Receiver::start().await;
    let redis = TestRedis::start();
    let mut app = receiver.node(&redis, |_| {}).await;
    let queue = "traced-flow";
    let (status, body) = send(
        app.request(reqwest::Method::POST, "/api/v1/workflows")
            .header("traceparent", caller_traceparent())
            .json(&json!({"tasks": [
                {"key": "a", "queue": queue, "payload": 1},
                {"key": "b", "queue": queue, "payload": 2, "depends_on": ["a"]},
            ]})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let handled: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let worker = {
        let handled = handled.clone();
        Arc::new(
            Worker::builder(api_client(&[app.url.clone()], None))
                .queue(queue)
                .id("w-flow")
                .claim_wait(Duration::from_millis(200))
                .otlp_endpoint(receiver.url.clone(), "test-worker")
                .handler(move |task, _ctx| {
                    let handled = handled.clone();
                    async move {
                        handled
                            .lock()
                            .unwrap()
                            .push((task.id.clone(), task.traceparent.clone().unwrap_or_default()));
                        Ok(json!(null))
                    }
                })
                .build()
                .unwrap(),
        )
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn({
        let w = worker.clone();
        async move { w.run_until(async { stop_rx.await.unwrap_or(()) }).await }
    });
    assert!(wait_until(Duration::from_secs(20), || async { handled.lock().unwrap().len() >= 2 }).await);
    let _ = stop_tx.send(());
    run.await.unwrap().unwrap();
    app.shutdown().await;

    // Both tasks carry the run's context: one span, in the caller's trace.
    let handled = handled.lock().unwrap().clone();
    assert_eq!(handled.len(), 2, "{handled:?}");
    assert_eq!(handled[0].1, handled[1].1, "both tasks carry the run's context");
    assert!(handled[0].1.starts_with(&format!("00-{CALLER_TRACE}-")), "{handled:?}");
    let spans = receiver.of_trace(CALLER_TRACE);
    let runs: Vec<_> = spans.iter().filter(|s| s.name == "workflow run").collect();
    assert_eq!(runs.len(), 1, "{spans:?}");
    assert!(handled[0].1.contains(&runs[0].id));
    let process: Vec<_> = spans.iter().filter(|s| s.name == format!("process {queue}")).collect();
    assert_eq!(process.len(), 2, "{spans:?}");
    assert!(process.iter().all(|p| p.parent == runs[0].id));
}

#[tokio::test]
async fn each_schedule_occurrence_starts_a_trace_and_a_trigger_joins_the_callers() {
    let receiver = Receiver::start().await;
    let redis = TestRedis::start();
    let mut app = receiver
        .node(&redis, |c| {
            c.schedules.interval_ms = 100;
        })
        .await;
    let queue = "traced-cron";
    let (status, body) = app
        .post(
            "/api/v1/schedules",
            json!({"id": "every-second", "expression": "* * * * * *", "timezone": "UTC", "queue": queue}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    crate::tasks::join(&app, "w-cron").await;
    let mut fired = Vec::new();
    let got = wait_until(Duration::from_secs(10), || {
        let app = &app;
        async move { app.api().queue(queue).await.map(|q| q.stats.queued).unwrap_or(0) >= 2 }
    })
    .await;
    assert!(got, "the schedule fired twice");
    let (status, body) = send(
        app.request(reqwest::Method::POST, "/api/v1/schedules/every-second/trigger")
            .header("traceparent", caller_traceparent()),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let triggered = body["task"].as_str().unwrap().to_string();
    for t in crate::tasks::claim_tasks(&app, queue, "w-cron", 100, 0).await {
        fired.push(t);
    }
    app.shutdown().await;

    // The occurrences: each its own trace, rooted at the node's span.
    let occurrences: Vec<_> = fired.iter().filter(|t| t.id != triggered).collect();
    assert!(occurrences.len() >= 2, "{fired:?}");
    let mut traces = std::collections::HashSet::new();
    for t in &occurrences {
        let tp = t
            .traceparent
            .as_deref()
            .expect("an occurrence's task carries its trace");
        let ctx = &tp[3..35];
        assert!(traces.insert(ctx.to_string()), "one trace per occurrence: {tp}");
        let spans = receiver.of_trace(ctx);
        let root = spans
            .iter()
            .find(|s| s.name == "schedule every-second")
            .expect("the occurrence's span");
        assert_eq!(root.parent, "", "a root span");
        assert!(tp.contains(&root.id), "the task is the occurrence span's child");
        assert!(root.attr("muster.schedule.occurrence").is_some());
    }
    // The trigger: in the caller's trace, under the request.
    let t = fired.iter().find(|t| t.id == triggered).expect("the triggered task");
    let tp = t.traceparent.as_deref().expect("the triggered task carries the trace");
    assert!(tp.starts_with(&format!("00-{CALLER_TRACE}-")), "{tp}");
    let spans = receiver.of_trace(CALLER_TRACE);
    let span = spans
        .iter()
        .find(|s| s.name == "schedule every-second")
        .expect("the trigger's span");
    assert!(tp.contains(&span.id));
    assert_eq!(span.attr("muster.schedule.manual"), Some("true"));
    let request = spans.iter().find(|s| s.id == span.parent).expect("the request's span");
    assert_eq!(request.name, "POST /api/v1/schedules/{id}/trigger");
}

#[tokio::test]
async fn a_task_recovered_from_a_dead_worker_gets_a_recover_span_in_its_trace() {
    let receiver = Receiver::start().await;
    let redis = TestRedis::start();
    let mut app = receiver
        .node(&redis, |c| {
            c.orphans.interval_ms = 100;
        })
        .await;
    let queue = "traced-orphan";
    let (status, body) = send(
        app.request(reqwest::Method::POST, &format!("/api/v1/queues/{queue}/tasks"))
            .header("traceparent", caller_traceparent())
            .json(&json!({"payload": 1})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    // A worker with a short lease claims it and dies (never heartbeats again).
    let hb = muster::client::NodeHeartbeat {
        ttl_ms: Some(500),
        ..Default::default()
    };
    app.api().heartbeat_node("w-dies", &hb).await.unwrap();
    let claimed = crate::tasks::claim_tasks(&app, queue, "w-dies", 1, 0).await;
    assert_eq!(claimed.len(), 1);
    let stored = claimed[0].traceparent.clone().expect("the task's context");
    let back = wait_until(Duration::from_secs(10), || {
        let app = &app;
        let id = id.clone();
        async move { app.get(&format!("/api/v1/tasks/{id}")).await.1["state"] == "queued" }
    })
    .await;
    assert!(back, "the orphan was requeued");
    app.shutdown().await;
    let spans = receiver.of_trace(CALLER_TRACE);
    let recover: Vec<_> = spans.iter().filter(|s| s.name == format!("recover {queue}")).collect();
    assert_eq!(recover.len(), 1, "{spans:?}");
    assert!(stored.contains(&recover[0].parent), "a child of the task's context");
    assert_eq!(recover[0].attr("muster.task.outcome"), Some("requeued"));
    assert_eq!(recover[0].attr("messaging.message.id"), Some(id.as_str()));
}

#[tokio::test]
async fn a_batch_has_one_send_span_and_a_claim_of_several_one_receive_span_linked_to_them() {
    let receiver = Receiver::start().await;
    let redis = TestRedis::start();
    let mut app = receiver.node(&redis, |_| {}).await;
    let queue = "traced-batch";
    let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let (status, body) = send(
        app.request(reqwest::Method::POST, &format!("/api/v1/queues/{queue}/tasks/batch"))
            .header("traceparent", caller_traceparent())
            .json(&json!({"tasks": [{"payload": 1}, {"payload": 2}, {"payload": 3, "traceparent": own}]})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    crate::tasks::join(&app, "w-batch").await;
    let (status, claimed) = app
        .post(
            &format!("/api/v1/queues/{queue}/claim"),
            json!({"node": "w-batch", "max": 3}),
        )
        .await;
    assert_eq!(status, 200, "{claimed}");
    let tps: Vec<String> = claimed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["traceparent"].as_str().unwrap_or("").to_string())
        .collect();
    app.shutdown().await;

    // The two items without a context of their own carry the batch's send
    // span; the third its own trace, under a send span of its own.
    let spans = receiver.of_trace(CALLER_TRACE);
    let sends: Vec<_> = spans.iter().filter(|s| s.name == format!("send {queue}")).collect();
    assert_eq!(sends.len(), 1, "{spans:?}");
    assert_eq!(sends[0].attr("messaging.batch.message_count"), Some("3"));
    let in_batch: Vec<_> = tps.iter().filter(|t| t.contains(CALLER_TRACE)).collect();
    assert_eq!(in_batch.len(), 2, "{tps:?}");
    assert!(in_batch.iter().all(|t| t.contains(&sends[0].id)));
    let mine = receiver.of_trace("0af7651916cd43dd8448eb211c80319c");
    let own_send: Vec<_> = mine.iter().filter(|s| s.name == format!("send {queue}")).collect();
    assert_eq!(own_send.len(), 1, "{mine:?}");
    assert_eq!(own_send[0].parent, "b7ad6b7169203331");
    // The claim of three: one receive span (in the claim's own trace),
    // linked to each task's context.
    let all = receiver.spans.lock().unwrap().clone();
    let receives: Vec<_> = all.iter().filter(|s| s.name == format!("receive {queue}")).collect();
    assert_eq!(receives.len(), 1, "{all:?}");
    assert_eq!(receives[0].attr("messaging.batch.message_count"), Some("3"));
    assert_eq!(receives[0].links.len(), 3);
    for tp in &tps {
        assert!(
            receives[0]
                .links
                .iter()
                .any(|(t, s)| tp.contains(t.as_str()) && tp.contains(s.as_str())),
            "{tp} is linked"
        );
    }
}

#[tokio::test]
async fn a_timed_out_task_and_a_lapsed_claim_get_spans_in_their_traces() {
    let receiver = Receiver::start().await;
    let redis = TestRedis::start();
    let mut app = receiver
        .node(&redis, |c| {
            c.orphans.interval_ms = 100;
        })
        .await;
    let submit = |queue: &'static str, body: Value| {
        let app = &app;
        async move {
            let (status, body) = send(
                app.request(reqwest::Method::POST, &format!("/api/v1/queues/{queue}/tasks"))
                    .header("traceparent", caller_traceparent())
                    .json(&body),
            )
            .await;
            assert_eq!(status, 201, "{body}");
            body["id"].as_str().unwrap().to_string()
        }
    };
    let slow = submit(
        "traced-timeout",
        json!({"payload": 1, "timeout_ms": 300, "max_attempts": 1}),
    )
    .await;
    let lost = submit("traced-unacked", json!({"payload": 2})).await;
    // A live worker claims both: it acknowledges neither, and the first runs
    // past its timeout.
    crate::tasks::join(&app, "w-live").await;
    let a = crate::tasks::claim_tasks(&app, "traced-timeout", "w-live", 1, 0).await;
    assert_eq!(a.len(), 1);
    app.api().ack_task(&slow, a[0].token).await.unwrap();
    let req = muster::client::ClaimRequest {
        node: "w-live".into(),
        max: 1,
        wait_ms: 0,
        ack_ms: Some(1000),
    };
    let b = app.api().claim("traced-unacked", &req).await.unwrap();
    assert_eq!(b.len(), 1);
    let done = wait_until(Duration::from_secs(10), || {
        let app = &app;
        let (slow, lost) = (slow.clone(), lost.clone());
        async move {
            app.get(&format!("/api/v1/tasks/{slow}")).await.1["state"] == "dead"
                && app.get(&format!("/api/v1/tasks/{lost}")).await.1["state"] == "queued"
        }
    })
    .await;
    assert!(done, "the task timed out and the claim lapsed");
    app.shutdown().await;
    let spans = receiver.of_trace(CALLER_TRACE);
    let timeout: Vec<_> = spans.iter().filter(|s| s.name == "timeout traced-timeout").collect();
    assert_eq!(timeout.len(), 1, "{spans:?}");
    assert!(
        a[0].traceparent.as_deref().unwrap().contains(&timeout[0].parent),
        "a child of the task's context"
    );
    assert_eq!(timeout[0].attr("muster.task.outcome"), Some("dead"));
    assert_eq!(timeout[0].attr("messaging.message.id"), Some(slow.as_str()));
    assert!(timeout[0].error, "a timeout is an error");
    let unacked: Vec<_> = spans.iter().filter(|s| s.name == "unacked traced-unacked").collect();
    assert_eq!(unacked.len(), 1, "{spans:?}");
    assert!(b[0].traceparent.as_deref().unwrap().contains(&unacked[0].parent));
    assert_eq!(unacked[0].attr("muster.task.outcome"), Some("requeued"));
    assert_eq!(unacked[0].attr("messaging.message.id"), Some(lost.as_str()));
    assert!(!unacked[0].error, "put back is no error");
}
