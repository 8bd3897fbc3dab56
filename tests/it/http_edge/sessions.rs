//! Dashboard sessions and origins: sessions live in Redis, sign-out and token removal revoke them, cookie WebSockets must come from our origin.

use super::*;
use crate::common::skip_on_cluster;

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
    // (In shard 0 when split.)
    let keys: Vec<String> = redis
        .cmd(&["KEYS", &format!("{}:session:*", shard_tag("edge", 0))])
        .await;
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
    if skip_on_cluster("the rest stops the Redis server") {
        return;
    }
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
