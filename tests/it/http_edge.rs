//! The HTTP edge as a public service sees it: slow and idle connections,
//! the connection bound, server-side dashboard sessions, the WebSocket
//! Origin check, security headers, and problem+json for 405 and 414.
//!
//! The connection tests speak raw HTTP/1.1 over `TcpStream`, so nothing
//! between the test and the node retries or pools.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::common::*;
use muster::config::{Config, TokenConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_not_allowed_names_the_methods() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let resp = app.request(Method::POST, "/api/v1/queues/tasks").send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 405);
    let allow = resp.headers()["allow"].to_str().unwrap().to_string();
    let body: Value = resp.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("GET"), "{detail} (allow: {allow})");
    assert!(detail.ends_with(&allow), "{detail} (allow: {allow})");
}

fn tokens() -> Vec<TokenConfig> {
    role_tokens("tok")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sign_in_page_shows_no_identity() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| c.auth.tokens = tokens()).await;
    let html = app.page("/login").await;
    assert!(html.contains("Sign in"), "{html}");
    assert!(!html.contains("sign out"), "{html}");
    assert!(!html.contains("()"), "{html}");
}

fn short_timeouts(c: &mut Config) {
    c.server.header_read_timeout_ms = 500;
    c.server.body_read_timeout_ms = 700;
    c.server.idle_timeout_ms = 1000;
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.running.as_ref().unwrap().addr).await.unwrap()
}

/// Reads until the node closes the connection (or `within` passes: then
/// None); returns what it sent.
async fn read_until_closed(s: &mut TcpStream, within: Duration) -> Option<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(String::from_utf8_lossy(&out).into_owned()),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads one response (head and a Content-Length body) from a keep-alive
/// connection.
async fn read_response(s: &mut TcpStream, within: Duration) -> Option<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let text = String::from_utf8_lossy(&out).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if out.len() >= end + 4 + len {
                return Some(text);
            }
        }
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return None,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_header_is_cut_at_the_header_timeout() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, short_timeouts).await;
    let mut s = connect(&app).await;
    let start = Instant::now();
    s.write_all(b"GET /api/v1/nodes HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let got = read_until_closed(&mut s, Duration::from_secs(5)).await;
    assert!(got.is_some(), "a half header holds the connection past 5 s");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(2500),
        "closed after {took:?}; header_read_timeout_ms is 500"
    );
    // The idle bound (1000 ms) is longer: a connection that sent a byte is
    // cut by the header bound, not the idle one.
    assert!(took < Duration::from_millis(1000), "closed after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_body_gets_408_at_the_body_timeout() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, short_timeouts).await;
    let mut s = connect(&app).await;
    let start = Instant::now();
    s.write_all(
        b"POST /api/v1/queues/q/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"payload\":",
    )
    .await
    .unwrap();
    let got = read_until_closed(&mut s, Duration::from_secs(5))
        .await
        .expect("a body short of its Content-Length holds the connection past 5 s");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(600), "answered after {took:?}");
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(
        got.to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "{got}"
    );
    assert!(got.contains("body_read_timeout_ms"), "{got}");
    let (n, _) = app.get("/api/v1/queues/q/tasks").await;
    assert_eq!(n, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, short_timeouts).await;
    let mut s = connect(&app).await;
    // One complete exchange, then silence: longer than the header bound is
    // fine (the connection is idle, not in a head), the idle bound is not.
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let resp = read_response(&mut s, Duration::from_secs(5)).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let resp = read_response(&mut s, Duration::from_secs(5))
        .await
        .expect("idle for 700 ms, past the header bound but within the idle bound, the connection still serves");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let idle_from = Instant::now();
    assert!(
        read_until_closed(&mut s, Duration::from_secs(5)).await.is_some(),
        "still open after 5 s idle"
    );
    let took = idle_from.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "closed after {took:?}; idle_timeout_ms is 1000"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_outlives_the_read_timeouts() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, short_timeouts).await;
    let start = Instant::now();
    let (st, _) = app
        .post(
            "/api/v1/queues/q/claim",
            json!({"node": app.node_id, "max": 1, "wait_ms": 2000}),
        )
        .await;
    let took = start.elapsed();
    assert_eq!(st, 204, "an empty long poll ends with 204");
    assert!(
        took >= Duration::from_millis(1900),
        "the long poll was cut after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_bound_wait() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| c.server.max_connections = 2).await;
    let mut a = connect(&app).await;
    let mut b = connect(&app).await;
    for s in [&mut a, &mut b] {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        assert!(read_response(s, Duration::from_secs(5)).await.is_some());
    }
    // The third is not accepted while two are open: it waits in the backlog.
    let mut c = connect(&app).await;
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    assert!(
        read_response(&mut c, Duration::from_millis(800)).await.is_none(),
        "a third connection was served beyond max_connections = 2"
    );
    drop(a);
    let resp = read_response(&mut c, Duration::from_secs(5))
        .await
        .expect("served once a slot is free");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_and_api_carry_security_headers() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    for path in [
        "/",
        "/barriers",
        "/api/v1/nodes",
        "/static/css/muster.css",
        "/no/such/page",
    ] {
        let resp = app.request(Method::GET, path).send().await.unwrap();
        let h = resp.headers();
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe-inline"), "{path}: {csp}");
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["referrer-policy"], "same-origin", "{path}");
    }
    // The policy forbids inline script and style: the pages have none.
    for path in [
        "/",
        "/nodes",
        "/queues",
        "/barriers",
        "/events",
        "/schedules",
        "/workflows",
    ] {
        let html = app.page(path).await;
        assert!(!html.contains("style=\""), "{path} has an inline style");
        assert!(!html.contains("<script>"), "{path} has an inline script");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_targets_get_414_problem_json() {
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let long = format!("/api/v1/queues/{}/tasks", "a".repeat(9000));
    let resp = app.request(Method::GET, &long).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 414);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let body: Value = resp.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains("8192"), "{body}");
    // Just under the bound is an ordinary request (a 400 for the bad name).
    let ok = format!("/api/v1/queues/{}/tasks", "a".repeat(8000));
    let resp = app.request(Method::GET, &ok).send().await.unwrap();
    assert_ne!(resp.status().as_u16(), 414);
    // Beyond hyper's own bound (65534 bytes) hyper answers 414 itself, with
    // an empty body (documented in docs/configuration.md, Security).
    let mut s = connect(&app).await;
    let huge = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    s.write_all(huge.as_bytes()).await.unwrap();
    let got = read_until_closed(&mut s, Duration::from_secs(5)).await.unwrap();
    assert!(got.starts_with("HTTP/1.1 414"), "{got}");
}

async fn sign_in(http: &reqwest::Client, app: &TestApp, token: &str) -> String {
    let resp = http
        .post(format!("{}/login", app.url))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 303);
    resp.headers()["set-cookie"].to_str().unwrap().to_string()
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// GET `url` with `cookie` as the only credential.
async fn get_with_cookie(http: &reqwest::Client, url: &str, cookie: &str) -> reqwest::Response {
    http.get(url).header("cookie", cookie).send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_live_in_redis_and_sign_out_revokes_them() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| {
        c.auth.tokens = tokens();
        c.redis.key_prefix = "edge".into();
    })
    .await;
    let other = TestApp::start_with(&redis, |c| {
        c.auth.tokens = tokens();
        c.redis.key_prefix = "edge".into();
    })
    .await;
    let http = no_redirects();
    let set_cookie = sign_in(&http, &app, "tok-a").await;
    assert!(
        set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict") && set_cookie.contains("Path=/"),
        "{set_cookie}"
    );
    assert!(set_cookie.contains("Max-Age=43200"), "{set_cookie}");
    let session = set_cookie.split(';').next().unwrap().to_string();
    let id = session.strip_prefix("muster_session=").unwrap();
    assert!(!id.contains("tok-a"), "the cookie carries the token: {session}");
    assert_eq!(id.len(), 64, "256 random bits in hex: {id}");

    // Redis holds one session key, by the hash of the id, with a TTL.
    let keys: Vec<String> = redis.cmd(&["KEYS", "{edge}:session:*"]).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(!keys[0].contains(id), "the key names the id itself");
    let ttl: i64 = redis.cmd(&["PTTL", &keys[0]]).await;
    assert!(ttl > 12 * 3600 * 1000 - 60_000 && ttl <= 12 * 3600 * 1000, "pttl {ttl}");
    let stored: String = redis.cmd(&["GET", &keys[0]]).await;
    assert_ne!(stored, "tok-a");

    // The cookie works on both nodes, for pages and the API.
    for node in [&app, &other] {
        let page = get_with_cookie(&http, &format!("{}/nodes", node.url), &session).await;
        assert_eq!(page.status().as_u16(), 200);
        let api = get_with_cookie(&http, &format!("{}/api/v1/nodes", node.url), &session).await;
        assert_eq!(api.status().as_u16(), 200);
    }

    // The CSRF token comes from the session, not from the token.
    let html = get_with_cookie(&http, &format!("{}/", app.url), &session)
        .await
        .text()
        .await
        .unwrap();
    let csrf = csrf_of(&html);
    let second = sign_in(&http, &app, "tok-a").await;
    let second = second.split(';').next().unwrap().to_string();
    let html2 = get_with_cookie(&http, &format!("{}/", app.url), &second)
        .await
        .text()
        .await
        .unwrap();
    assert_ne!(csrf, csrf_of(&html2), "two sessions of one token share a CSRF token");

    // Sign out on one node: the cookie stops working on both at once.
    let out = http
        .post(format!("{}/logout", other.url))
        .header("cookie", &session)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(out.status().as_u16(), 303);
    for node in [&app, &other] {
        let page = get_with_cookie(&http, &format!("{}/nodes", node.url), &session).await;
        assert_eq!(page.status().as_u16(), 303, "a signed-out cookie still opens pages");
        assert_eq!(page.headers()["location"], "/login");
        let api = get_with_cookie(&http, &format!("{}/api/v1/nodes", node.url), &session).await;
        assert_eq!(api.status().as_u16(), 401, "a signed-out cookie still reaches the API");
    }
    // The other session is untouched.
    let page = get_with_cookie(&http, &format!("{}/nodes", app.url), &second).await;
    assert_eq!(page.status().as_u16(), 200);
    // The raw token as a cookie is no credential.
    let page = get_with_cookie(&http, &format!("{}/api/v1/nodes", app.url), "muster_session=tok-a").await;
    assert_eq!(page.status().as_u16(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_of_a_removed_token_stop_working() {
    let redis = TestRedis::start();
    let mut app = TestApp::start_with(&redis, |c| c.auth.tokens = tokens()).await;
    let http = no_redirects();
    let session = sign_in(&http, &app, "tok-a")
        .await
        .split(';')
        .next()
        .unwrap()
        .to_string();
    // A node whose config no longer has the admin token, on the same Redis.
    let only_read = TestApp::start_with(&redis, |c| c.auth.tokens = tokens().into_iter().take(1).collect()).await;
    let page = http
        .get(format!("{}/nodes", only_read.url))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status().as_u16(), 303);
    // Redis down: a cookie gets 503 problem+json, never an anonymous page.
    drop(redis);
    let resp = get_with_cookie(&http, &format!("{}/nodes", app.url), &session).await;
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    app.kill().await;
}

async fn ws_status(url: &str, headers: &[(&str, &str)]) -> u16 {
    let mut req = url.into_client_request().unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(
            reqwest::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((_, resp)) => resp.status().as_u16(),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            if resp.status().as_u16() == 403 {
                let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned();
                assert!(body.contains("allowed_origins"), "{body}");
            }
            resp.status().as_u16()
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_websocket_must_come_from_our_origin() {
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |c| {
        c.auth.tokens = tokens();
        c.server.allowed_origins = vec!["https://ops.example.com".into()];
    })
    .await;
    let http = no_redirects();
    let session = sign_in(&http, &app, "tok-r")
        .await
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let addr = app.running.as_ref().unwrap().addr;
    let ws = format!("ws://{addr}/api/v1/events/ws?topics=task.*");
    let own = format!("http://{addr}");
    assert_eq!(ws_status(&ws, &[("cookie", &session), ("origin", &own)]).await, 101);
    assert_eq!(
        ws_status(&ws, &[("cookie", &session), ("origin", "https://ops.example.com")]).await,
        101
    );
    let other_port = format!("http://127.0.0.1:{}", addr.port() + 1);
    for bad in ["http://evil.example", other_port.as_str(), "null"] {
        assert_eq!(
            ws_status(&ws, &[("cookie", &session), ("origin", bad)]).await,
            403,
            "origin {bad}"
        );
    }
    // Tokens are for non-browser clients: no Origin check.
    assert_eq!(
        ws_status(
            &ws,
            &[("authorization", "Bearer tok-r"), ("origin", "http://evil.example")]
        )
        .await,
        101
    );
    assert_eq!(ws_status(&format!("{ws}&token=tok-r"), &[]).await, 101);
    assert_eq!(ws_status(&ws, &[]).await, 401);
}

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
    let resp = search("%3Cb%3E".into()).await.unwrap();
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
