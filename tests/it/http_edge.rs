//! The HTTP edge as a public service sees it: slow and idle connections,
//! the connection bound, server-side dashboard sessions, the WebSocket
//! Origin check, security headers, and problem+json for 405 and 414.
//!
//! The connection tests speak raw HTTP/1.1 over `TcpStream`, so nothing
//! between the test and the node retries or pools.

use reqwest::Method;
use serde_json::Value;

use crate::common::*;
use muster::config::{Role, TokenConfig};

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
    [("r", Role::Read), ("a", Role::Admin)]
        .into_iter()
        .map(|(name, role)| TokenConfig {
            name: name.into(),
            role,
            sha256: sha256_hex(&format!("tok-{name}")),
        })
        .collect()
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
