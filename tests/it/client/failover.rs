//! The client across nodes: problem+json errors and failing over, events resumed on another node.

use super::*;

/// Errors carry the problem+json fields; 4xx are not retried on the other
/// URL; a dead URL and a node that refuses work (503) are failed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_problem_json_and_calls_fail_over() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let dead = format!("http://127.0.0.1:{}", free_port());

    let c = client(&[a.url.clone(), b.url.clone()]);
    let e = c.submit("bad queue!", &TaskSpec::default()).await.unwrap_err();
    let p = e.problem().expect("a problem");
    assert_eq!(
        (p.status, p.title.as_str(), p.kind.as_str()),
        (400, "Bad Request", "about:blank")
    );
    assert!(p.detail.contains("queue"), "{p:?}");
    assert!(p.request_id.as_deref().is_some_and(|r| !r.is_empty()), "{p:?}");
    assert_eq!(c.current_url(), a.url, "a 4xx is not failed over");
    let e = c.task("01ARZ3NDEKTSV4RRFFQ69G5FAV").await.unwrap_err();
    assert!(e.is_not_found(), "{e:?}");

    // A stale token: 409 with the problem's detail.
    let hb = muster::client::NodeHeartbeat {
        ttl_ms: Some(60_000),
        ..Default::default()
    };
    c.heartbeat_node("w-err", &hb).await.unwrap();
    let id = c.submit_payload("client-err", json!(1)).await.unwrap().id;
    let req = muster::client::ClaimRequest {
        node: "w-err".into(),
        max: 1,
        wait_ms: 0,
        ack_ms: None,
    };
    let t = c.claim("client-err", &req).await.unwrap().remove(0);
    assert_eq!(t.id, id);
    let stale = muster::client::Complete {
        token: t.token + 1,
        result: json!(null),
        next: None,
    };
    let e = c.complete(&id, &stale).await.unwrap_err();
    assert!(e.is_conflict(), "{e:?}");
    assert!(!e.problem().unwrap().detail.is_empty());

    // A dead first URL: the call goes through the second, which then stays first.
    let c2 = client(&[dead.clone(), b.url.clone()]);
    assert_eq!(c2.task(&id).await.unwrap().id, id);
    assert_eq!(c2.current_url(), b.url);
    // Nothing reachable: Unreachable after the retry budget.
    let c3 = Client::builder()
        .url(dead.clone())
        .retry_for(Duration::from_millis(300))
        .build()
        .unwrap();
    let e = c3.task(&id).await.unwrap_err();
    assert!(matches!(e, muster::client::Error::Unreachable { .. }), "{e:?}");

    // A node that refuses work (draining: 503 to claims) is failed over.
    c.drain_node(&a.node_id).await.unwrap();
    let only_a = Client::builder()
        .url(a.url.clone())
        .retry_for(Duration::ZERO)
        .build()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || async {
            only_a.claim("client-err", &req).await.err().and_then(|e| e.status()) == Some(503)
        })
        .await
    );
    c.submit_payload("client-err", json!(2)).await.unwrap();
    let c4 = client(&[a.url.clone(), b.url.clone()]);
    assert!(
        wait_until(Duration::from_secs(5), || async {
            let claimed = c4.claim("client-err", &req).await.unwrap();
            !claimed.is_empty()
        })
        .await
    );
    assert_eq!(c4.current_url(), b.url);
}

/// The event stream yields events in order, and after the node it follows
/// is killed it resumes on the other node from the last id: nothing missed,
/// nothing repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_resume_on_another_node_without_loss_or_duplicates() {
    let redis = TestRedis::start();
    let mut a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let c = client(&[a.url.clone(), b.url.clone()]);
    let q = "client-events";
    let mut events = c.events(EventsOptions {
        topics: Some("task.enqueued".into()),
        queue: Some(q.into()),
        since: Some("0".into()),
    });
    let mut sent = Vec::new();
    for i in 0..3 {
        sent.push(c.submit_payload(q, json!(i)).await.unwrap().id);
    }
    let mut got = Vec::new();
    while got.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
            Ok(Some(Ok(EventFrame::Event(e)))) => got.push(e.subject("task").unwrap().to_string()),
            other => panic!("{other:?}"),
        }
    }
    a.kill().await;
    let cb = client(std::slice::from_ref(&b.url));
    for i in 3..6 {
        sent.push(cb.submit_payload(q, json!(i)).await.unwrap().id);
    }
    while got.len() < 6 {
        match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
            Ok(Some(Ok(EventFrame::Event(e)))) => got.push(e.subject("task").unwrap().to_string()),
            other => panic!("{other:?} after {got:?}"),
        }
    }
    assert_eq!(got, sent);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), events.next())
            .await
            .is_err(),
        "no duplicate after the resume"
    );
    // A bad topic is refused with the server's problem, and ends the stream.
    let mut bad = cb.events(EventsOptions {
        topics: Some("nope.*".into()),
        ..Default::default()
    });
    match tokio::time::timeout(Duration::from_secs(5), bad.next()).await {
        Ok(Some(Err(e))) => assert_eq!(e.status(), Some(400), "{e:?}"),
        other => panic!("{other:?}"),
    }
}
