//! The dashboard as an operator uses it: error pages, state colours, search, lock and worker actions, previews.

use super::*;

/// A browser that asks for a page and gets a problem sees an HTML page with
/// the problem's status and detail (escaped), not raw JSON; the API and
/// clients that do not ask for HTML keep `problem+json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_errors_are_html_for_browsers_and_problems_for_the_api() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let html = "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8";
    for (path, status, says) in [
        ("/tasks/no-such-task", 404, "no task `no-such-task`"),
        ("/queues/doesnotexist", 404, "no queue `doesnotexist`"),
        ("/no/such/page", 404, ""),
        ("/queues/q?state=bogus", 400, "`state` must be one of"),
        ("/queues/%3Cscript%3E", 400, "&#60;script&#62;"),
    ] {
        let resp = app
            .request(Method::GET, path)
            .header("accept", html)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), status, "{path}");
        let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("text/html"), "{path}: {ct}");
        assert!(resp.headers().contains_key("content-security-policy"), "{path}");
        let body = resp.text().await.unwrap();
        assert!(body.contains(&format!("<h1>{status} ")), "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
        assert!(!body.contains("<script>"), "{path}: unescaped input: {body}");
        assert!(body.contains("Request id"), "{path}: {body}");
    }
    // The same paths without `Accept: text/html`, and the API with it, are
    // problems.
    for (path, accept) in [
        ("/tasks/no-such-task", "application/json"),
        ("/queues/doesnotexist", "*/*"),
        ("/api/v1/tasks/no-such-task", html),
    ] {
        let resp = app
            .request(Method::GET, path)
            .header("accept", accept)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_client_error(), "{path}");
        assert_eq!(
            resp.headers()["content-type"],
            "application/problem+json",
            "{path} with Accept: {accept}"
        );
    }
    // A queue that has had a task is a page, even when empty again.
    let (s, _) = app
        .post("/api/v1/queues/known/tasks", serde_json::json!({"payload": 1}))
        .await;
    assert_eq!(s, 201);
    let resp = app
        .request(Method::GET, "/queues/known")
        .header("accept", html)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

/// Each task state has one colour, the same on every page, and no two task
/// states share one (running and succeeded, cancelled and dead used to).
#[test]
fn every_task_state_has_a_colour_of_its_own() {
    let css = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/static/css/muster.css")).unwrap();
    let colour_of = |state: &str| -> String {
        let rules: Vec<&str> = css
            .lines()
            .filter(|l| {
                let selectors = l.split('{').next().unwrap_or("");
                selectors.split(',').any(|s| s.trim() == format!(".pill.{state}"))
            })
            .collect();
        assert_eq!(rules.len(), 1, "`.pill.{state}` in {} rules: {rules:?}", rules.len());
        rules[0].split('{').nth(1).unwrap().trim().to_string()
    };
    let states = ["queued", "delayed", "running", "succeeded", "cancelled", "dead"];
    let colours: Vec<String> = states.iter().map(|s| colour_of(s)).collect();
    for (i, a) in colours.iter().enumerate() {
        for (j, b) in colours.iter().enumerate().skip(i + 1) {
            assert_ne!(a, b, "{} and {} share a colour", states[i], states[j]);
        }
    }
}

/// The header's search goes to the page of a task found by id, alias or
/// idempotency key, or of a workflow by id; anything else gets a page that
/// says nothing matched (404), or why nothing can (400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_finds_tasks_by_id_alias_and_key_and_workflows_by_id() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let (s, t) = app
        .post(
            "/api/v1/queues/search/tasks",
            serde_json::json!({"payload": 1, "alias": "nightly-report", "idempotency_key": "order-77"}),
        )
        .await;
    assert_eq!(s, 201, "{t}");
    let id = t["id"].as_str().unwrap().to_string();
    let (s, w) = app
        .post(
            "/api/v1/workflows",
            serde_json::json!({"tasks": [{"key": "a", "queue": "search-wf", "payload": 1}]}),
        )
        .await;
    assert!(s == 201 || s == 200, "{w}");
    let wf = w["id"].as_str().unwrap().to_string();
    let html = "text/html";
    let search = |term: String| {
        app.request(Method::GET, &format!("/search?q={term}"))
            .header("accept", html)
            .send()
    };
    for (term, lands) in [
        (id.clone(), format!("/tasks/{id}")),
        ("nightly-report".to_string(), format!("/tasks/{id}")),
        ("order-77".to_string(), format!("/tasks/{id}")),
        (format!("%20{wf}%20"), format!("/workflows/{wf}")),
    ] {
        let resp = search(term.clone()).await.unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{term}");
        assert_eq!(resp.url().path(), lands, "{term}");
    }
    let resp = search("no-such-thing".into()).await.unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let body = resp.text().await.unwrap();
    assert!(body.contains("Nothing found for <code>no-such-thing</code>"), "{body}");
    // `<b>` could be an idempotency key: looked for (404), shown escaped.
    let resp = search("%3Cb%3E".into()).await.unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let body = resp.text().await.unwrap();
    assert!(!body.contains("<b>") && body.contains("Nothing found"), "{body}");
    // A space inside can be nothing.
    let resp = search("%3Cb%3E%20x".into()).await.unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body = resp.text().await.unwrap();
    assert!(!body.contains("<b>") && body.contains("Nothing can match"), "{body}");
    // Every page carries the search form.
    assert!(app.page("/").await.contains("action=\"/search\""));
}

/// The admin's buttons on the Locks and Nodes pages: break a held lock (the
/// holder's token stops working), remove a departed worker; both behind the
/// CSRF token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_forms_break_a_lock_and_remove_a_departed_worker() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let (s, lock) = app
        .post(
            "/api/v1/locks/ui-lock/acquire",
            serde_json::json!({"owner": "o1", "ttl_ms": 60_000}),
        )
        .await;
    assert_eq!(s, 200, "{lock}");
    let (s, _) = app
        .put(
            "/api/v1/nodes/gone-worker/heartbeat",
            serde_json::json!({"ttl_ms": 1000}),
        )
        .await;
    assert_eq!(s, 200);
    let html = http
        .get(format!("{}/locks", app.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("/ui/locks/ui-lock/break"), "{html}");
    let csrf = csrf_of(&html);
    let form = |path: &str, csrf: &str| http.post(format!("{}{path}", app.url)).form(&[("csrf", csrf)]).send();
    // A forged token breaks nothing.
    let r = form("/ui/locks/ui-lock/break", "forged").await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(app.get("/api/v1/locks/ui-lock").await.0, 200);
    let r = form("/ui/locks/ui-lock/break", &csrf).await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let (s, b) = app
        .post(
            "/api/v1/locks/ui-lock/renew",
            serde_json::json!({"token": lock["token"], "ttl_ms": 60_000}),
        )
        .await;
    assert!(s == 409 || s == 404, "the broken lock's token still renews: {s} {b}");

    // The worker stops heartbeating; once departed it can be removed.
    let departed = wait_until(Duration::from_secs(10), || async {
        let (_, n) = app.get("/api/v1/nodes/gone-worker").await;
        n["state"] != "alive"
    })
    .await;
    assert!(departed);
    let html = http
        .get(format!("{}/nodes", app.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("/ui/nodes/gone-worker/remove"), "{html}");
    assert!(
        !html.contains(&format!("/ui/nodes/{}/remove", app.node_id)),
        "an alive node offers remove"
    );
    let r = form("/ui/nodes/gone-worker/remove", &csrf).await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(app.get("/api/v1/nodes/gone-worker").await.0, 404);
}

/// A queue's task list previews each task's payload, and its dead tab (and
/// the Dead letters page) the last error, cut to one short line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_lists_preview_payloads_and_errors() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let long = "x".repeat(500);
    for payload in [serde_json::json!({"to": "ann@example.com"}), serde_json::json!(long)] {
        let (s, _) = app
            .post("/api/v1/queues/pv/tasks", serde_json::json!({"payload": payload}))
            .await;
        assert_eq!(s, 201);
    }
    let html = app.page("/queues/pv").await;
    assert!(html.contains("ann@example.com"), "{html}");
    assert!(!html.contains(&long) && html.contains('…'), "the preview is not cut");
    crate::dead_bulk::make_dead(&app, "pv-dead", 1).await;
    for page in ["/queues/pv-dead?state=dead", "/dead"] {
        let html = app.page(page).await;
        assert!(html.contains("boom"), "{page}: {html}");
    }
}
