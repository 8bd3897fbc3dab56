//! Every operation of the OpenAPI document has a typed call in
//! `muster::client`, and each call works against a real node: the test
//! calls every method (a method missing does not compile) and records the
//! operation it stands for; an operation of the document that no call
//! recorded fails it (a new route without its client method).

use std::collections::BTreeSet;

use muster::client::{
    Acquire, Arrive, Campaign, ClaimRequest, Complete, CompleteItem, EventsOptions, Fail, NewWorkflow, NodeHeartbeat,
    ScheduleDef, TaskHeartbeat,
};

use super::*;

/// Operations a client has no business calling: the failover coordinator's
/// messages between nodes.
const INTERNAL: &[&str] = &["internal_message"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_has_a_typed_call_that_works() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = client(std::slice::from_ref(&app.url));
    let mut hit = BTreeSet::new();
    macro_rules! op {
        ($id:literal, $call:expr) => {{
            let r = $call.await;
            hit.insert($id);
            r
        }};
    }
    let w = "cov-worker";
    let hb = NodeHeartbeat {
        ttl_ms: Some(60_000),
        ..Default::default()
    };
    assert!(op!("heartbeat_node", c.heartbeat_node(w, &hb)).unwrap().joined);

    // Tasks and queues.
    let a = op!("submit_task", c.submit("cov", &spec(json!({"n": 1}), 60_000))).unwrap();
    let batch = op!(
        "submit_batch",
        c.submit_batch("cov", &[spec(json!({"n": 2}), 60_000), spec(json!({"n": 3}), 60_000)])
    )
    .unwrap();
    assert_eq!(batch.len(), 2);
    let claim = |max| ClaimRequest {
        node: w.into(),
        max,
        wait_ms: 0,
        ack_ms: None,
    };
    let got = op!("claim_tasks", c.claim("cov", &claim(3))).unwrap();
    assert_eq!(got.len(), 3);
    let hbt = TaskHeartbeat {
        token: got[0].token,
        progress: Some(50),
        fields: None,
    };
    op!("heartbeat_task", c.heartbeat_task(&got[0].id, &hbt)).unwrap();
    let acked = op!("ack_task", c.ack_task(&got[1].id, got[1].token)).unwrap();
    assert_eq!(acked.state, "running");
    let done = Complete {
        token: got[0].token,
        result: json!("ok"),
        next: None,
    };
    assert_eq!(
        op!("complete_task", c.complete(&got[0].id, &done)).unwrap().state,
        "succeeded"
    );
    let items = [CompleteItem {
        id: got[1].id.clone(),
        token: got[1].token,
        result: json!(1),
    }];
    assert_eq!(op!("complete_batch", c.complete_batch(&items)).unwrap().len(), 1);
    let fail = Fail {
        token: got[2].token,
        error: "boom".into(),
        retry: false,
        next: None,
    };
    assert_eq!(op!("fail_task", c.fail(&got[2].id, &fail)).unwrap().state, "dead");
    op!("retry_task", c.retry_task(&got[2].id)).unwrap();
    op!("cancel_task", c.cancel(&got[2].id)).unwrap();
    assert_eq!(op!("get_task", c.task(&a.id)).unwrap().id, a.id);
    let aliased = c
        .submit(
            "cov",
            &TaskSpec {
                alias: Some("cov-alias".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(op!("get_alias", c.alias("cov-alias")).unwrap().id, aliased.id);
    c.cancel(&aliased.id).await.unwrap();
    op!("delete_task", c.delete_task(&aliased.id)).unwrap();
    assert!(!op!("list_queues", c.queues()).unwrap().is_empty());
    op!("get_queue", c.queue("cov")).unwrap();
    op!("list_tasks", c.tasks("cov", "succeeded", 10, None)).unwrap();
    op!("pause_queue", c.pause_queue("cov")).unwrap();
    op!("resume_queue", c.resume_queue("cov")).unwrap();
    op!("list_dead", c.dead()).unwrap();
    let dead = c.submit("cov-dead", &spec(json!({}), 60_000)).await.unwrap();
    let t = c.claim("cov-dead", &claim(1)).await.unwrap().remove(0);
    assert_eq!(t.id, dead.id);
    c.fail(
        &t.id,
        &Fail {
            token: t.token,
            ..fail.clone()
        },
    )
    .await
    .unwrap();
    assert_eq!(op!("retry_dead", c.retry_dead("cov-dead", None)).unwrap().done, 1);
    let t = c.claim("cov-dead", &claim(1)).await.unwrap().remove(0);
    c.fail(&t.id, &Fail { token: t.token, ..fail }).await.unwrap();
    assert_eq!(op!("discard_dead", c.discard_dead("*", Some(10))).unwrap().done, 1);
    op!("put_group", c.set_group_limit("cov-g", Some(2))).unwrap();
    // Flow-control limits.
    let lspec = muster::client::LimitSpec {
        concurrency: Some(2),
        rate: Some(muster::client::Rate {
            max: 10,
            per_ms: 1000,
            burst: 2,
        }),
    };
    let set = op!("put_limit", c.set_limit("cov-l", &lspec)).unwrap();
    assert_eq!(set.concurrency, Some(2));
    let queue_set = op!("put_queue_limits", c.set_queue_limits("cov", &["cov-l"])).unwrap();
    assert_eq!(queue_set.limits, vec!["cov-l".to_string()]);
    let queue_got = op!("get_queue_limits", c.queue_limits("cov")).unwrap();
    assert_eq!(queue_got.limits, vec!["cov-l".to_string()]);
    assert_eq!(
        op!("get_limit", c.limit("cov-l")).unwrap().queues,
        vec!["cov".to_string()]
    );
    assert_eq!(op!("list_limits", c.limits()).unwrap().len(), 1);
    c.set_queue_limits("cov", &[]).await.unwrap();
    op!("delete_limit", c.delete_limit("cov-l")).unwrap();
    assert!(
        op!("list_groups", c.groups())
            .unwrap()
            .iter()
            .any(|g| g.name == "cov-g")
    );
    op!("list_orphans", c.orphans()).unwrap();

    // Nodes.
    assert!(op!("list_nodes", c.nodes()).unwrap().iter().any(|n| n.id == w));
    assert_eq!(op!("get_node", c.node(w)).unwrap().id, w);
    op!("drain_node", c.drain_node(w)).unwrap();
    op!("leave_worker", c.leave_worker(w)).unwrap();
    c.heartbeat_node("cov-gone", &hb).await.unwrap();
    op!("delete_node", c.remove_node("cov-gone")).unwrap();

    // Workflows.
    let wf: NewWorkflow = NewWorkflow {
        tasks: serde_json::from_value(json!([{"key": "a", "queue": "cov-wf"}])).unwrap(),
        idempotency_key: None,
        failure_policy: Default::default(),
    };
    let created = op!("create_workflow", c.start_workflow(&wf)).unwrap();
    op!("list_workflows", c.workflows(Some("running"), 10)).unwrap();
    op!("get_workflow", c.workflow(&created.id)).unwrap();
    op!("cancel_workflow", c.cancel_workflow(&created.id)).unwrap();

    // Schedules.
    let mut def: ScheduleDef = serde_json::from_value(json!({"expression": "0 0 1 1 *", "queue": "cov-s"})).unwrap();
    def.id = "cov-s1".into();
    op!("create_schedule", c.create_schedule(&def)).unwrap();
    def.id = "cov-s2".into();
    op!("put_schedule", c.put_schedule(&def)).unwrap();
    op!("list_schedules", c.schedules()).unwrap();
    op!("get_schedule", c.schedule("cov-s1")).unwrap();
    op!("disable_schedule", c.set_schedule_enabled("cov-s1", false)).unwrap();
    op!("enable_schedule", c.set_schedule_enabled("cov-s1", true)).unwrap();
    op!("trigger_schedule", c.trigger_schedule("cov-s1", Some("cov-key"))).unwrap();
    op!("delete_schedule", c.delete_schedule("cov-s2")).unwrap();

    // Barriers.
    c.heartbeat_node(w, &hb).await.unwrap();
    op!("put_barrier", c.put_barrier("cov-b", &[w.to_string()], 0, 60_000)).unwrap();
    op!("list_barriers", c.barriers()).unwrap();
    op!("get_barrier", c.barrier("cov-b")).unwrap();
    let arrive = Arrive {
        node: w.into(),
        wait_ms: 0,
    };
    assert!(op!("arrive_round", c.arrive("cov-b", "r1", &arrive)).unwrap().may_run);
    op!("list_rounds", c.rounds("cov-b", 10)).unwrap();
    op!("get_round", c.round("cov-b", "r1")).unwrap();
    assert!(
        op!("hold_barrier", c.hold_barrier("cov-h", Some("me"), Some(60_000)))
            .unwrap()
            .held
    );
    assert!(op!("wait_barrier", c.wait_barrier("cov-h", 0)).unwrap().held);
    assert!(op!("release_barrier", c.release_barrier("cov-h")).unwrap());
    assert!(!c.wait_barrier("cov-h", 0).await.unwrap().held);
    op!("delete_barrier", c.delete_barrier("cov-b")).unwrap();
    let e = op!("enter_double_barrier", c.enter_double_barrier("cov-d", w, 1, 0)).unwrap();
    assert!(e.done && e.inside && e.state.ready, "{e:?}");
    assert_eq!(op!("list_double_barriers", c.double_barriers()).unwrap().len(), 1);
    assert_eq!(
        op!("get_double_barrier", c.double_barrier("cov-d")).unwrap().entrants[0].node,
        w
    );
    let l = op!("leave_double_barrier", c.leave_double_barrier("cov-d", w, 0)).unwrap();
    assert!(l.done && !l.inside, "{l:?}");

    // Locks and elections.
    let acq = Acquire {
        owner: "me".into(),
        ttl_ms: 60_000,
        wait_ms: 0,
        node: None,
    };
    let held = op!("acquire_lock", c.acquire("cov-l", &acq)).unwrap();
    op!("renew_lock", c.renew("cov-l", held.token, None)).unwrap();
    op!("list_locks", c.locks()).unwrap();
    op!("get_lock", c.lock("cov-l")).unwrap();
    op!("release_lock", c.release("cov-l", held.token)).unwrap();
    c.acquire("cov-l", &acq).await.unwrap();
    op!("break_lock", c.break_lock("cov-l")).unwrap();
    let camp = Campaign {
        candidate: "me".into(),
        ttl_ms: 60_000,
        wait_ms: 0,
        value: None,
    };
    op!("campaign", c.campaign("cov-e", &camp)).unwrap();
    op!("list_elections", c.elections()).unwrap();
    op!("get_leader", c.leader("cov-e")).unwrap();
    op!("resign", c.resign("cov-e", "me", None)).unwrap();

    // Events and the system.
    op!("list_events", c.events_page(None, 10, Some("task.*"))).unwrap();
    let mut stream = c.events(EventsOptions {
        since: Some("0".into()),
        ..Default::default()
    });
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
    assert!(matches!(first, Ok(Some(Ok(_)))), "{first:?}");
    hit.insert("events_ws");
    op!("get_live", c.live()).unwrap();
    let st = op!("get_stats", c.stats("month", Some("cov"))).unwrap();
    assert_eq!((st.step_s, st.t.len(), st.queue.as_deref()), (86_400, 30, Some("cov")));
    op!("get_redis", c.redis_summary()).unwrap();
    op!("get_failover", c.failover_status()).unwrap();
    assert!(op!("metrics", c.metrics()).unwrap().contains("muster_"));
    assert!(op!("healthz", c.healthz()).unwrap());
    assert!(op!("readyz", c.readyz()).unwrap());
    let doc = op!("openapi", c.openapi()).unwrap();

    let mut ops = BTreeSet::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for (method, o) in item.as_object().unwrap() {
            if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                ops.insert(o["operationId"].as_str().unwrap().to_string());
            }
        }
    }
    let missing: Vec<&String> = ops
        .iter()
        .filter(|o| !hit.contains(o.as_str()) && !INTERNAL.contains(&o.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "operations without a typed client call: {missing:?}"
    );
    let unknown: Vec<&&str> = hit.iter().filter(|h| !ops.contains(**h)).collect();
    assert!(
        unknown.is_empty(),
        "calls recorded for operations the document lacks: {unknown:?}"
    );
}
