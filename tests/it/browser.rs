//! A browser test of the live dashboard: headless Chromium (Debian's
//! `chromium` and `chromium-driver`) driven over WebDriver by fantoccini.
//! The Overview page must update its counts without a reload when a task is
//! submitted over REST, and a barrier's page must show a round's verdict in
//! place (and count down to its deadline while it is open), and the Dead
//! letters page must retry 2 000 dead tasks in bulk; a burst of failures
//! must show on the charts within seconds (and a queue page's chart survive
//! its page's swaps); the header's search must find a task by alias.
//! Screenshots are saved under `target/`.
//!
//! Without Chromium the test says so and passes; `.ci/run` installs it and
//! sets MUSTER_REQUIRE_BROWSER=1, which turns its absence into a failure.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{ClientBuilder, Locator};
use serde_json::json;

use crate::common::*;

struct Driver(Child);
impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn find(bin: &str) -> Option<String> {
    ["/usr/bin/", "/usr/local/bin/", "/usr/lib/chromium/"]
        .iter()
        .map(|d| format!("{d}{bin}"))
        .find(|p| std::path::Path::new(p).exists())
}

/// Waits up to 10 s until the page's event feed is connected (its status
/// reads `live`); the status element is looked up afresh each time, since a
/// page that swaps its `<main>` may replace what was found.
async fn until_live(c: &fantoccini::Client) -> bool {
    for _ in 0..100 {
        if let Ok(el) = c.find(Locator::Id("live-status")).await
            && el.text().await.is_ok_and(|t| t == "live")
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// A headless Chromium session: the driver, its profile and the client.
/// `None` (after saying so) when Chromium is not installed, unless
/// MUSTER_REQUIRE_BROWSER=1 makes that a failure.
struct Browser {
    c: fantoccini::Client,
    _profile: tempfile::TempDir,
    _driver: Driver,
}

async fn browser() -> Option<Browser> {
    let (Some(driver_bin), Some(chromium)) = (find("chromedriver"), find("chromium")) else {
        if std::env::var("MUSTER_REQUIRE_BROWSER").is_ok_and(|v| v == "1") {
            panic!("chromium and chromium-driver are required (apt-get install -y chromium chromium-driver)");
        }
        eprintln!("SKIPPED the browser test: install chromium and chromium-driver to run it");
        return None;
    };
    let port = free_port();
    let driver = Driver(
        Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts"),
    );
    let profile = tempfile::tempdir().unwrap();
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-quic", "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                     format!("--user-data-dir={}", profile.path().display())]
        }),
    );
    let webdriver = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps.clone())
            .connect(&webdriver)
            .await
        {
            Ok(c) => {
                return Some(Browser {
                    c,
                    _profile: profile,
                    _driver: driver,
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("no WebDriver session within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_updates_live_in_a_real_browser() {
    let Some(browser) = browser().await else { return };
    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let c = browser.c.clone();
    c.goto(&format!("{}/", app.url)).await.unwrap();
    // The page's WebSocket is up ...
    assert!(until_live(&c).await, "the page connected to the event feed");
    let before = c.find(Locator::Id("total-queued")).await.unwrap().text().await.unwrap();
    assert_eq!(before, "0");
    // ... a marker proves there is no reload ...
    c.execute("window.__muster_marker = 42; return null;", vec![])
        .await
        .unwrap();
    // ... and a task submitted over REST shows up.
    for i in 0..3 {
        let (s, _) = app.post("/api/v1/queues/browser/tasks", json!({"payload": i})).await;
        assert_eq!(s, 201);
    }
    let mut after = String::new();
    for _ in 0..100 {
        after = c.find(Locator::Id("total-queued")).await.unwrap().text().await.unwrap();
        if after == "3" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(after, "3", "the count changed without a reload");
    let marker = c.execute("return window.__muster_marker;", vec![]).await.unwrap();
    assert_eq!(marker, json!(42), "same page, no reload");
    let png = c.screenshot().await.unwrap();
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("browser-overview.png"), png).unwrap();

    // A barrier round decided while its page is open shows its verdict in
    // place, without a reload; while it is open its deadline counts down.
    let (s, b) = app
        .put(
            "/api/v1/barriers/bb",
            json!({"participants": ["p1", "p2"], "max_missing": 0, "timeout_ms": 600_000}),
        )
        .await;
    assert!(s == 200 || s == 201, "{s} {b}");
    let (s, b) = app
        .post(
            "/api/v1/barriers/bb/rounds/r1/arrive",
            json!({"node": "p1", "wait_ms": 0}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    c.goto(&format!("{}/barriers/bb", app.url)).await.unwrap();
    // The page swaps its <main> in place on events: an element found just
    // before a swap goes stale, so each read finds it afresh and retries.
    let text_of = |c: fantoccini::Client, css: &'static str| async move {
        match c.find(Locator::Css(css)).await {
            Ok(el) => el.text().await.ok(),
            Err(_) => None,
        }
    };
    let verdict = |c: fantoccini::Client| async move {
        for _ in 0..20 {
            if let Some(t) = text_of(c.clone(), "section.round h2 .pill").await {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no verdict on the barrier page");
    };
    assert_eq!(verdict(c.clone()).await, "pending");
    let mut countdown = String::new();
    for _ in 0..50 {
        countdown = text_of(c.clone(), "[data-countdown]").await.unwrap_or_default();
        if countdown.starts_with("(in ") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        countdown.starts_with("(in 9 min") || countdown.starts_with("(in 10 min"),
        "{countdown}"
    );
    until_live(&c).await;
    c.execute("window.__muster_marker = 43; return null;", vec![])
        .await
        .unwrap();
    let (s, b) = app
        .post(
            "/api/v1/barriers/bb/rounds/r1/arrive",
            json!({"node": "p2", "wait_ms": 0}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let mut shown = String::new();
    for _ in 0..100 {
        shown = verdict(c.clone()).await;
        if shown == "released" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(shown, "released", "the verdict showed without a reload");
    let marker = c.execute("return window.__muster_marker;", vec![]).await.unwrap();
    assert_eq!(marker, json!(43), "same page, no reload");

    // A task's page follows the task: claimed and completed elsewhere, it
    // shows `succeeded` in place, without a reload.
    let (s, w) = app.put("/api/v1/nodes/bw/heartbeat", json!({"ttl_ms": 60_000})).await;
    assert_eq!(s, 200, "{w}");
    let (s, t) = app.post("/api/v1/queues/live-task/tasks", json!({"payload": 1})).await;
    assert_eq!(s, 201, "{t}");
    let id = t["id"].as_str().unwrap().to_string();
    c.goto(&format!("{}/tasks/{id}", app.url)).await.unwrap();
    until_live(&c).await;
    c.execute("window.__muster_marker = 44; return null;", vec![])
        .await
        .unwrap();
    let (s, got) = app
        .post("/api/v1/queues/live-task/claim", json!({"node": "bw", "max": 1}))
        .await;
    assert_eq!(s, 200, "{got}");
    let token = got["tasks"][0]["token"].clone();
    let (s, done) = app
        .post(&format!("/api/v1/tasks/{id}/complete"), json!({"token": token}))
        .await;
    assert_eq!(s, 200, "{done}");
    let mut state = String::new();
    for _ in 0..100 {
        state = text_of(c.clone(), "h1 .pill").await.unwrap_or_default();
        if state == "succeeded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, "succeeded", "the task page followed the task");
    let marker = c.execute("return window.__muster_marker;", vec![]).await.unwrap();
    assert_eq!(marker, json!(44), "same page, no reload");

    // A bulk retry of 2 000 dead tasks from the Dead letters page, confirmed
    // with its checkbox. The page swaps its <main> on events (not once the
    // box is ticked): a click that lands on a swapped-out element retries.
    crate::dead_bulk::make_dead(&app, "bulk-ui", 2000).await;
    c.goto(&format!("{}/dead", app.url)).await.unwrap();
    let click = |c: fantoccini::Client, css: &'static str| async move {
        for _ in 0..20 {
            if let Ok(el) = c.find(Locator::Css(css)).await
                && el.click().await.is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("cannot click {css}");
    };
    click(c.clone(), "#bulk input[name=confirm]").await;
    click(c.clone(), "#bulk button[value=retry]").await;
    let mut report = String::new();
    for _ in 0..200 {
        if let Ok(el) = c.find(Locator::Id("bulk-report")).await {
            report = el.text().await.unwrap();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(report, "Retried 2000 dead tasks; 0 left.");
    let (_, q) = app.get("/api/v1/queues/bulk-ui").await;
    assert_eq!((q["queued"].as_u64(), q["dead"].as_u64()), (Some(2000), Some(0)), "{q}");

    // Charts: a burst of failures shows on the Overview's live chart and in
    // the last hour's history within seconds, drawn by uPlot, without a
    // reload.
    c.goto(&format!("{}/", app.url)).await.unwrap();
    let drawn = |c: fantoccini::Client, id: &'static str| async move {
        let js =
            format!("var e = document.getElementById('{id}'); return !!(e && e._plot && e.querySelector('.uplot'));");
        for _ in 0..100 {
            if c.execute(&js, vec![]).await.ok() == Some(json!(true)) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    for id in [
        "chart-live",
        "chart-hour-rates",
        "chart-hour-depth",
        "chart-month-rates",
        "chart-month-depth",
    ] {
        assert!(drawn(c.clone(), id).await, "uPlot drew #{id}");
    }
    c.execute("window.__muster_marker = 45; return null;", vec![])
        .await
        .unwrap();
    let total = |c: fantoccini::Client, chart: &'static str, what: &'static str| async move {
        let js = format!(
            "return document.getElementById('{chart}').closest('.card').querySelector('[data-total={what}]').textContent;"
        );
        c.execute(&js, vec![])
            .await
            .ok()
            .and_then(|v| v.as_str().and_then(|t| t.parse::<u64>().ok()))
            .unwrap_or(0)
    };
    let (live_before, hour_before) = (
        total(c.clone(), "chart-live", "failed").await,
        total(c.clone(), "chart-hour-rates", "dead").await,
    );
    crate::dead_bulk::make_dead(&app, "burst", 30).await;
    let mut seen = (0, 0);
    for _ in 0..150 {
        seen = (
            total(c.clone(), "chart-live", "failed").await,
            total(c.clone(), "chart-hour-rates", "dead").await,
        );
        if seen.0 >= live_before + 30 && seen.1 >= hour_before + 30 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen.0 >= live_before + 30 && seen.1 >= hour_before + 30,
        "the burst showed: live failed {live_before} -> {}, hour dead {hour_before} -> {}",
        seen.0,
        seen.1
    );
    let marker = c.execute("return window.__muster_marker;", vec![]).await.unwrap();
    assert_eq!(marker, json!(45), "same page, no reload");
    let png = c.screenshot().await.unwrap();
    std::fs::write(target.join("browser-charts.png"), png).unwrap();

    // A queue's page swaps its <main> on events and keeps its charts: the
    // same plot, given new data, not drawn again.
    c.goto(&format!("{}/queues/burst", app.url)).await.unwrap();
    assert!(
        drawn(c.clone(), "chart-hour-rates").await,
        "the queue page draws its chart"
    );
    c.execute(
        "window.__plot = document.getElementById('chart-hour-rates')._plot; window.__muster_marker = 46; return null;",
        vec![],
    )
    .await
    .unwrap();
    crate::dead_bulk::make_dead(&app, "burst", 5).await;
    let mut dead = 0;
    for _ in 0..150 {
        dead = total(c.clone(), "chart-hour-rates", "dead").await;
        if dead >= 35 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(dead >= 35, "the queue's chart counted the second burst: {dead}");
    let same = c
        .execute(
            "return document.getElementById('chart-hour-rates')._plot === window.__plot && window.__muster_marker === 46;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(same, json!(true), "the plot survived the swaps, no reload");

    // The header's search finds a task by its alias.
    let (s, t) = app
        .post(
            "/api/v1/queues/search-ui/tasks",
            json!({"payload": 1, "alias": "quarterly-invoices"}),
        )
        .await;
    assert_eq!(s, 201, "{t}");
    let box_ = c.find(Locator::Css("form.search input[name=q]")).await.unwrap();
    let enter = char::from(fantoccini::key::Key::Enter);
    box_.send_keys(&format!("quarterly-invoices{enter}")).await.unwrap();
    let want = format!("/tasks/{}", t["id"].as_str().unwrap());
    let mut at = String::new();
    for _ in 0..100 {
        at = c.current_url().await.unwrap().path().to_string();
        if at == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(at, want, "the search by alias opened the task's page");
    c.close().await.unwrap();
}

/// Serves `pages` (path -> HTML) on a port of its own: another origin of the
/// same site as the node (127.0.0.1, another port), as in the review's
/// attack. Any other path is 404. Stops when dropped.
struct AttackerSite {
    url: String,
    task: tokio::task::JoinHandle<()>,
}
impl Drop for AttackerSite {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn attacker_site(pages: Vec<(&'static str, String)>) -> AttackerSite {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let pages = std::sync::Arc::new(pages);
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let pages = pages.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut n = 0;
                while n < buf.len() {
                    match conn.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => n += k,
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let head = String::from_utf8_lossy(&buf[..n]);
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (status, body) = match pages.iter().find(|(p, _)| *p == path) {
                    Some((_, html)) => ("200 OK", html.clone()),
                    None => ("404 Not Found", String::new()),
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(resp.as_bytes()).await;
            });
        }
    });
    AttackerSite { url, task }
}

/// The count of `muster_http_requests_total` for `path` (a route template)
/// and `status`, from the node's metrics.
async fn requests_counted(app: &TestApp, token: &str, path: &str, status: u16) -> u64 {
    let text = app
        .http
        .get(format!("{}/metrics", app.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("muster_http_requests_total{"))
        .filter(|l| l.contains(&format!("path=\"{path}\"")) && l.contains(&format!("status=\"{status}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Issue 36, N3 in a real browser: an admin signed in on the dashboard (the
/// session cookie is HttpOnly and SameSite=Strict) opens a page on another
/// port of the same host, which is the same site, so the cookie goes along.
/// That page's auto-submitted form (pause a queue) and its `no-cors` fetch
/// (drain a worker) reach the node with the cookie and are refused with 403:
/// nothing changes. From the dashboard's own page the same cookie, with the
/// page's CSRF token, does write: the session was real.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_origin_cannot_write_with_the_dashboard_cookie() {
    let Some(browser) = browser().await else { return };
    let c = browser.c.clone();
    let redis = TestRedis::start();
    let app = TestApp::start_with(&redis, |cfg| cfg.auth.tokens = role_tokens("browser")).await;
    let bearer = |method: reqwest::Method, path: &str| {
        app.http
            .request(method, format!("{}{path}", app.url))
            .bearer_auth("browser-a")
    };
    let (s, b) =
        send(bearer(reqwest::Method::PUT, "/api/v1/nodes/victim-w/heartbeat").json(&json!({"ttl_ms": 3_600_000})))
            .await;
    assert_eq!(s, 200, "{b}");
    for q in ["victim-q", "control-q"] {
        let (s, b) = send(bearer(reqwest::Method::POST, &format!("/api/v1/queues/{q}/tasks")).json(&json!({}))).await;
        assert_eq!(s, 201, "{b}");
    }
    let paused = |q: &'static str| {
        let req = bearer(reqwest::Method::GET, &format!("/api/v1/queues/{q}"));
        async move { send(req).await.1["paused"] == true }
    };
    let node_state = || {
        let req = bearer(reqwest::Method::GET, "/api/v1/nodes/victim-w");
        async move { send(req).await.1["state"].as_str().unwrap_or("").to_string() }
    };

    // Sign in through the login form, as an operator does.
    c.goto(&format!("{}/login", app.url)).await.unwrap();
    c.find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys("browser-a")
        .await
        .unwrap();
    c.find(Locator::Css("form button, form input[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    for _ in 0..50 {
        if !c.current_url().await.unwrap().path().starts_with("/login") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !c.current_url().await.unwrap().path().starts_with("/login"),
        "signed in"
    );

    let target = &app.url;
    let site = attacker_site(vec![
        (
            "/form.html",
            format!(
                "<!doctype html><form id=f method=post action=\"{target}/api/v1/queues/victim-q/pause\"></form>\
                 <script>document.getElementById('f').submit()</script>"
            ),
        ),
        (
            "/fetch.html",
            format!(
                "<!doctype html><title>waiting</title><script>\
                 fetch('{target}/api/v1/nodes/victim-w/drain', {{method: 'POST', mode: 'no-cors', \
                 credentials: 'include'}}).then(() => document.title = 'sent', e => document.title = 'error ' + e)\
                 </script>"
            ),
        ),
    ])
    .await;

    // The form: the browser navigates to the node's answer.
    let before = requests_counted(&app, "browser-r", "/api/v1/queues/{queue}/pause", 403).await;
    c.goto(&format!("{}/form.html", site.url)).await.unwrap();
    let mut answer = String::new();
    for _ in 0..50 {
        if c.current_url().await.unwrap().as_str().starts_with(target.as_str()) {
            answer = c.source().await.unwrap_or_default();
            if answer.contains("403") {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // 403, not 401: the cookie went along, and the origin is what was refused.
    assert!(answer.contains("\"status\":403"), "the form's answer: {answer}");
    assert!(answer.contains("Bearer"), "the refusal names the way out: {answer}");
    // (The metrics are the test process's: other tests may add to them.)
    assert!(requests_counted(&app, "browser-r", "/api/v1/queues/{queue}/pause", 403).await > before);
    assert!(!paused("victim-q").await, "a page on another origin paused a queue");

    // The no-cors fetch: its answer is opaque to the page; the node counts it.
    let before = requests_counted(&app, "browser-r", "/api/v1/nodes/{id}/drain", 403).await;
    c.goto(&format!("{}/fetch.html", site.url)).await.unwrap();
    let mut title = String::new();
    for _ in 0..50 {
        title = c.title().await.unwrap_or_default();
        if title != "waiting" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(title, "sent", "the fetch went out");
    assert!(
        requests_counted(&app, "browser-r", "/api/v1/nodes/{id}/drain", 403).await > before,
        "the fetch reached the node and was refused"
    );
    assert_eq!(node_state().await, "alive", "a page on another origin drained a worker");

    // The control: the dashboard's own page, the same cookie and its CSRF
    // token (on <body data-csrf>), pauses a queue.
    c.goto(&format!("{}/", app.url)).await.unwrap();
    let status = c
        .execute_async(
            "const done = arguments[arguments.length - 1];\
             fetch('/api/v1/queues/control-q/pause', {method: 'POST', \
               headers: {'x-csrf-token': document.body.dataset.csrf}})\
             .then(r => done(r.status), e => done(String(e)));",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        status,
        json!(204),
        "the dashboard's own page writes with its CSRF token"
    );
    assert!(paused("control-q").await);
    assert!(!paused("victim-q").await);
    c.close().await.unwrap();
}
