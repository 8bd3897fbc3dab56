//! The client crate speaks TLS: calls through an `https://` URL and the
//! events WebSocket through `wss://`, behind a TLS-terminating proxy, with
//! the certificate checked (a client that does not trust it is refused).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reaches_a_node_through_https_and_its_events_through_wss() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let port: u16 = app.url.rsplit(':').next().unwrap().parse().unwrap();
    let proxy = TlsProxy::start(port).await;

    // The certificate is self-signed: a client that does not trust it
    // refuses the node, so the check is on.
    let untrusting = Client::builder()
        .url(proxy.url())
        .retry_for(Duration::ZERO)
        .build()
        .unwrap();
    let err = untrusting.task("01ARZ3NDEKTSV4RRFFQ69G5FAV").await.unwrap_err();
    assert!(
        !matches!(err, muster::client::Error::Api(_)),
        "an untrusted certificate must not get an answer: {err}"
    );

    let c = Client::builder()
        .url(proxy.url())
        .add_root_certificate_pem(test_cert_pem())
        .retry_for(Duration::from_secs(5))
        .build()
        .unwrap();
    let q = "over-tls";
    let spec = TaskSpec {
        payload: json!({"secret": "sent over TLS"}),
        ..Default::default()
    };
    let id = c.submit(q, &spec).await.unwrap().id;
    let task = c.task(&id).await.unwrap();
    assert_eq!(task.payload, json!({"secret": "sent over TLS"}));

    // The events WebSocket takes the same TLS settings: replay what is
    // retained and find the submit.
    let mut events = c.events(EventsOptions {
        queue: Some(q.into()),
        since: Some("0".into()),
        ..Default::default()
    });
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(frame) = events.next().await {
            if let EventFrame::Event(e) = frame.expect("the events stream over wss://")
                && e.kind == "task.enqueued"
                && e.subjects.get("task") == Some(&json!(id))
            {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "the task's task.enqueued event over wss://");
}
