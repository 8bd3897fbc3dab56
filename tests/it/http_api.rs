//! The HTTP surface: roles, problem+json for bad input, the body limit,
//! request ids, the OpenAPI document, and the dashboard's sign-in and CSRF.

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::*;
use muster::config::TokenConfig;

fn tokens() -> Vec<TokenConfig> {
    role_tokens("tok")
}

async fn status_as(app: &TestApp, token: Option<&str>, method: Method, path: &str, body: Option<Value>) -> u16 {
    let mut r = app.http.request(method, format!("{}{path}", app.url));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    r.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_matrix() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| c.auth.tokens = tokens()).await;
    let (r, w, a) = (Some("tok-r"), Some("tok-w"), Some("tok-a"));
    // (method, path, body, [none, bad, read, worker, admin])
    let cases: Vec<(Method, String, Option<Value>, [u16; 5])> = vec![
        (Method::GET, "/api/v1/nodes".into(), None, [401, 401, 200, 200, 200]),
        (Method::GET, "/api/v1/redis".into(), None, [401, 401, 200, 200, 200]),
        (Method::GET, "/metrics".into(), None, [401, 401, 200, 200, 200]),
        (Method::GET, "/healthz".into(), None, [200, 200, 200, 200, 200]),
        (Method::GET, "/readyz".into(), None, [200, 200, 200, 200, 200]),
        (
            Method::GET,
            "/api/v1/openapi.json".into(),
            None,
            [200, 200, 200, 200, 200],
        ),
        (
            Method::PUT,
            "/api/v1/nodes/wk/heartbeat".into(),
            Some(json!({})),
            // the id is the worker token's once it registered it (issue 36)
            [401, 401, 403, 200, 409],
        ),
        (
            Method::POST,
            "/api/v1/nodes/wk/drain".into(),
            None,
            [401, 401, 403, 403, 204],
        ),
    ];
    for (method, path, body, expected) in cases {
        let got = [
            status_as(&app, None, method.clone(), &path, body.clone()).await,
            status_as(&app, Some("nope"), method.clone(), &path, body.clone()).await,
            status_as(&app, r, method.clone(), &path, body.clone()).await,
            status_as(&app, w, method.clone(), &path, body.clone()).await,
            status_as(&app, a, method.clone(), &path, body.clone()).await,
        ];
        assert_eq!(got, expected, "{method} {path}");
    }
    // A 403 says which role is needed, as problem+json.
    let resp = app
        .http
        .post(format!("{}/api/v1/nodes/wk/drain", app.url))
        .bearer_auth("tok-r")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let body: Value = resp.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains("admin"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tokens_means_loopback_only() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = redis.test_config(dir.path());
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let err = muster::start(cfg, listener).await.err().expect("refused");
    assert!(err.to_string().contains("no [auth] tokens"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_problem_json() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| c.server.max_body_bytes = 2048).await;
    let check = |resp: reqwest::Response, status: u16| async move {
        assert_eq!(resp.status().as_u16(), status);
        assert_eq!(resp.headers()["content-type"], "application/problem+json");
        assert!(resp.headers().contains_key("x-request-id"));
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["status"], status);
        assert!(!body["detail"].as_str().unwrap().is_empty());
        assert!(body["request_id"].as_str().is_some());
        body
    };
    // malformed JSON
    let resp = app
        .request(Method::PUT, "/api/v1/nodes/w1/heartbeat")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let body = check(resp, 400).await;
    assert!(body["detail"].as_str().unwrap().contains("not valid JSON"), "{body}");
    // wrong field type
    let resp = app
        .request(Method::PUT, "/api/v1/nodes/w1/heartbeat")
        .json(&json!({"ttl_ms": "x"}))
        .send()
        .await
        .unwrap();
    check(resp, 400).await;
    // unknown field
    let resp = app
        .request(Method::PUT, "/api/v1/nodes/w1/heartbeat")
        .json(&json!({"tll_ms": 5}))
        .send()
        .await
        .unwrap();
    let body = check(resp, 400).await;
    assert!(body["detail"].as_str().unwrap().contains("tll_ms"), "{body}");
    // not JSON at all
    let resp = app
        .request(Method::PUT, "/api/v1/nodes/w1/heartbeat")
        .header("content-type", "text/plain")
        .body("hello")
        .send()
        .await
        .unwrap();
    check(resp, 415).await;
    // over the body limit (declared length)
    let big = json!({"labels": {"k": "v".repeat(4096)}});
    let resp = app
        .request(Method::PUT, "/api/v1/nodes/w1/heartbeat")
        .json(&big)
        .send()
        .await
        .unwrap();
    check(resp, 413).await;
    // over the body limit (chunked, no length)
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        vec![Ok(b"{\"addr\":\"".to_vec()), Ok(vec![b'a'; 4096]), Ok(b"\"}".to_vec())];
    let resp = app
        .request(Method::PUT, "/api/v1/nodes/w1/heartbeat")
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    check(resp, 413).await;
    // unknown route and wrong method (on a fresh connection: the server closes
    // the one whose body it refused mid-stream)
    let fresh = reqwest::Client::new();
    check(
        fresh.get(format!("{}/api/v1/nothing", app.url)).send().await.unwrap(),
        404,
    )
    .await;
    let resp = fresh.delete(format!("{}/api/v1/nodes", app.url)).send().await.unwrap();
    assert!(resp.headers()["allow"].to_str().unwrap().contains("GET"));
    check(resp, 405).await;
    // nothing was registered by any of these
    let (_, list) = app.get("/api/v1/nodes").await;
    assert!(
        !list["nodes"].as_array().unwrap().iter().any(|n| n["id"] == "w1"),
        "{list}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_echoed_or_made() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let resp = app
        .request(Method::GET, "/healthz")
        .header("x-request-id", "abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"], "abc-123");
    let resp = app
        .request(Method::GET, "/healthz")
        .header("x-request-id", "bad id!")
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.headers()["x-request-id"].len(),
        26,
        "a new ULID replaces an unsafe id"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_lists_every_api_route() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let (status, doc) = app.get("/api/v1/openapi.json").await;
    assert_eq!(status, 200);
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/api/v1/redis",
        "/api/v1/openapi.json",
        "/api/v1/nodes",
        "/api/v1/nodes/{id}",
        "/api/v1/nodes/{id}/heartbeat",
        "/api/v1/nodes/{id}/drain",
        "/api/v1/failover",
        "/internal/failover/{kind}",
    ] {
        assert!(paths.contains_key(p), "{p} missing from the OpenAPI document");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_expose_nodes_redis_and_http() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    app.get("/api/v1/nodes").await;
    let text = app.page("/metrics").await;
    assert!(
        text.contains("muster_redis_call_duration_seconds_bucket"),
        "redis histogram"
    );
    assert!(
        text.contains("muster_http_requests_total{method=\"GET\",path=\"/api/v1/nodes\""),
        "by matched path"
    );
    assert!(text.contains("muster_nodes{state=\"alive\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_sign_in_and_csrf() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| c.auth.tokens = tokens()).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let resp = http.get(format!("{}/nodes", app.url)).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 303);
    assert_eq!(resp.headers()["location"], "/login");
    let resp = http
        .post(format!("{}/login", app.url))
        .form(&[("token", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let resp = http
        .post(format!("{}/login", app.url))
        .form(&[("token", "tok-a")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 303);
    let cookie = resp.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_string();
    let page = http
        .get(format!("{}/nodes", app.url))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains(&app.node_id));
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    let drain = format!("{}/ui/nodes/{}/drain", app.url, app.node_id);
    let bad = http
        .post(&drain)
        .header("cookie", &session)
        .form(&[("csrf", "forged")])
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 403, "a forged CSRF token is refused");
    let (_, node) = app
        .request(Method::GET, &format!("/api/v1/nodes/{}", app.node_id))
        .bearer_auth("tok-r")
        .send()
        .await
        .map(|r| (0, r))
        .unwrap();
    let node: Value = node.json().await.unwrap();
    assert_eq!(node["state"], "alive", "and changed nothing");
    let ok = http
        .post(&drain)
        .header("cookie", &session)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 303);
    // a read-only session cannot drain even with its own CSRF token
    let resp = http
        .post(format!("{}/login", app.url))
        .form(&[("token", "tok-r")])
        .send()
        .await
        .unwrap();
    let rsession = resp.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let html = http
        .get(format!("{}/", app.url))
        .header("cookie", &rsession)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let rcsrf = csrf_of(&html);
    let resp = http
        .post(&drain)
        .header("cookie", &rsession)
        .form(&[("csrf", rcsrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
}

/// A caller without the role an operation needs gets 403 before its body is
/// read: not 400 for a bad body, 413 for a big one or 415 for a wrong type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_role_check_comes_before_the_body() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| {
        c.auth.tokens = tokens();
        c.server.max_body_bytes = 4096;
    })
    .await;
    // A 403 leaves the body unread, so the server closes that connection:
    // no pooled connections, or the next request could land on it.
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let send = |token: &'static str, path: &'static str, ctype: &'static str, body: Vec<u8>| {
        let req = http
            .post(format!("{}{path}", app.url))
            .bearer_auth(token)
            .header("content-type", ctype)
            .body(body);
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
    };
    let big = vec![b' '; 64 * 1024];
    // (token, path, what the body is wrong in, content type, body)
    let refused: Vec<(&str, &str, &str, &str, Vec<u8>)> = vec![
        (
            "tok-r",
            "/api/v1/schedules",
            "fields",
            "application/json",
            br#"{"bogus":1}"#.to_vec(),
        ),
        (
            "tok-r",
            "/api/v1/schedules",
            "syntax",
            "application/json",
            b"{".to_vec(),
        ),
        ("tok-r", "/api/v1/schedules", "type", "text/plain", b"hello".to_vec()),
        ("tok-r", "/api/v1/schedules", "size", "application/json", big.clone()),
        (
            "tok-r",
            "/api/v1/queues/q/tasks",
            "size",
            "application/json",
            big.clone(),
        ),
        ("tok-r", "/api/v1/queues/q/claim", "type", "text/plain", b"x".to_vec()),
        (
            "tok-w",
            "/api/v1/schedules",
            "fields",
            "application/json",
            br#"{"bogus":1}"#.to_vec(),
        ),
        ("tok-w", "/api/v1/schedules", "size", "application/json", big.clone()),
    ];
    for (token, path, what, ctype, body) in refused {
        let (status, text) = send(token, path, ctype, body).await;
        assert_eq!(status, 403, "{token} POST {path} with a bad {what}: {text}");
        assert!(text.contains("role"), "the 403 names the role: {text}");
    }
    // With the role, the same bodies are judged on their merits.
    let bogus = br#"{"bogus":1}"#.to_vec();
    let judged = [
        ("tok-a", "/api/v1/schedules", "application/json", bogus, 400),
        ("tok-a", "/api/v1/schedules", "text/plain", b"x".to_vec(), 415),
        ("tok-w", "/api/v1/queues/q/tasks", "application/json", big, 413),
    ];
    for (token, path, ctype, body, want) in judged {
        let (status, text) = send(token, path, ctype, body).await;
        assert_eq!(status, want, "{token} POST {path}: {text}");
    }
}

/// Every metric in the metrics table of `docs/operations.md` has `# HELP`
/// and `# TYPE` from the first scrape, and those without an open label set
/// have a zero series, so alerts can tell zero from absent. The table and
/// the catalogue agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_document_every_metric_from_the_start() {
    let table = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md")).unwrap();
    let documented: std::collections::BTreeSet<&str> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| `muster_"))
        .filter_map(|l| l.split('`').next())
        .collect();
    let catalogue: std::collections::BTreeSet<&str> = muster::testing::METRICS
        .iter()
        .map(|m| m.name.strip_prefix("muster_").unwrap())
        .collect();
    assert_eq!(
        documented, catalogue,
        "the metrics table of docs/operations.md and telemetry::METRICS differ"
    );

    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let text = app.page("/metrics").await;
    for m in muster::testing::METRICS {
        assert!(text.contains(&format!("# HELP {} ", m.name)), "no HELP for {}", m.name);
        assert!(text.contains(&format!("# TYPE {} ", m.name)), "no TYPE for {}", m.name);
        if !m.open || !m.start.is_empty() {
            let sample = text.lines().any(|l| {
                !l.starts_with('#')
                    && (l.starts_with(&format!("{} ", m.name))
                        || l.starts_with(&format!("{}{{", m.name))
                        || l.starts_with(&format!("{}_count", m.name)))
            });
            assert!(sample, "{} has no series before its first event:\n{text}", m.name);
        }
    }
    for (name, label) in [
        ("muster_orphans_recovered_total", "action=\"requeued\""),
        ("muster_schedule_fires_total", "result=\"missed\""),
    ] {
        assert!(
            text.contains(&format!("{name}{{{label}}}")),
            "{name}{{{label}}} is pre-registered"
        );
    }
}
