//! Coordinated failover (G10): 3 nodes, 2 Redis servers. A switch happens
//! only when every client confirmed; a node never uses a different master
//! from the others; a coordinator killed mid-round leaves no split.

use std::time::{Duration, Instant};

use muster::client::{ClaimRequest, FailoverAnswer, FailoverStatus};
use muster::config::FailoverRole;
use serde_json::{Value, json};

use crate::common::ha::TestReplicaSet;
use crate::common::skip_on_cluster;
use crate::common::{TestApp, as_problem, test_config, wait_until};

const SECRET: &str = "a-shared-secret-for-tests";

fn ids(tag: &str) -> (String, String, String) {
    let p = std::process::id();
    (
        format!("coord-{tag}-{p}"),
        format!("cla-{tag}-{p}"),
        format!("clb-{tag}-{p}"),
    )
}

async fn node(set: &TestReplicaSet, id: &str, role: FailoverRole, clients: Vec<String>) -> TestApp {
    let dir = tempfile::Builder::new().prefix("muster-node").tempdir().unwrap();
    let mut cfg = test_config("", dir.path());
    cfg.redis.url.clear();
    cfg.server.node_id = id.to_string();
    cfg.failover.role = role;
    cfg.failover.redis_servers = vec![set.addr(0), set.addr(1)];
    cfg.failover.secret = SECRET.into();
    cfg.failover.clients = clients;
    cfg.failover.interval_ms = 1000;
    cfg.failover.retries = 2;
    cfg.failover.answer_timeout_ms = 500;
    cfg.failover.max_backoff_ms = 2000;
    cfg.failover.republish_ms = 1000;
    TestApp::start_config(cfg, dir).await
}

async fn status(app: &TestApp) -> FailoverStatus {
    app.api().failover_status().await.unwrap()
}

async fn master_of(app: &TestApp) -> String {
    status(app).await.master
}

async fn enqueue(app: &TestApp, q: &str) -> u16 {
    app.post(&format!("/api/v1/queues/{q}/tasks"), json!({"payload": {}}))
        .await
        .0
}

async fn claim_token(app: &TestApp, q: &str) -> Option<u64> {
    let req = ClaimRequest {
        node: app.node_id.clone(),
        max: 1,
        wait_ms: 0,
        ack_ms: None,
    };
    let got = app.api().claim(q, &req).await.ok()?;
    got.first().map(|t| t.token)
}

async fn internal(app: &TestApp, kind: &str, body: Value, secret: &str) -> (u16, Value) {
    let req = app
        .http
        .post(format!("{}/internal/failover/{kind}", app.url))
        .header("x-muster-failover-secret", secret)
        .json(&body);
    crate::common::send(req).await
}

/// Kill the master: every client confirms, the replica is promoted, all
/// nodes use it, tokens after the switch are above every token before.
/// Prints the time from the master's death to the first write through muster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinated_failover_switches_when_all_confirm() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let mut set = TestReplicaSet::start(1);
    let (c, a, b) = ids("ok");
    let na = node(&set, &a, FailoverRole::Client, vec![]).await;
    let nb = node(&set, &b, FailoverRole::Client, vec![]).await;
    let nc = node(&set, &c, FailoverRole::Coordinator, vec![a.clone(), b.clone()]).await;
    for n in [&na, &nb, &nc] {
        assert_eq!(master_of(n).await, set.addr(0));
    }
    // The coordinator learns the clients' addresses from the registry.
    assert!(
        wait_until(Duration::from_secs(5), || async {
            let st = status(&nc).await;
            let clients = st.coordinator.map(|c| c.clients).unwrap_or_default();
            [&a, &b]
                .iter()
                .all(|id| clients.get(id.as_str()).is_some_and(|u| u.starts_with("http")))
        })
        .await,
        "coordinator never learned its clients' URLs"
    );
    let epoch_before = status(&na).await.epoch.unwrap();
    for _ in 0..20 {
        assert_eq!(enqueue(&na, "cf").await, 201);
    }
    let mut before = Vec::new();
    for n in [&na, &nb] {
        for _ in 0..5 {
            before.push(claim_token(n, "cf").await.expect("claim before the switch"));
        }
    }
    // Every write so far reached the replica before the kill.
    let _: Option<i64> = crate::common::ha::query(set.port(0), &["WAIT", "1", "2000"]);

    set.kill(0);
    let killed = Instant::now();
    let mut first_write = None;
    let deadline = killed + Duration::from_secs(20);
    while Instant::now() < deadline {
        if enqueue(&na, "cf").await == 201 {
            first_write = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_write = first_write.expect("no write succeeded within 20 s of the master's death");
    eprintln!(
        "BENCH coordinated failover: master death -> first write through muster: {} ms",
        first_write.as_millis()
    );
    for n in [&na, &nb, &nc] {
        let addr = set.addr(1);
        assert!(
            wait_until(Duration::from_secs(5), || async { master_of(n).await == addr }).await,
            "{} did not switch to the promoted replica",
            n.node_id
        );
    }
    assert_eq!(set.role(set.port(1)), "master");
    let st = status(&nc).await;
    let round = &st.coordinator.as_ref().unwrap().history[0];
    assert_eq!(round.phase, "done", "{st:?}");
    for id in [&a, &b, &c] {
        assert_eq!(
            round.answers.get(id.as_str()).map(String::as_str),
            Some("reconfigured"),
            "{st:?}"
        );
    }
    let epoch_after = st.epoch.unwrap();
    // The Failover page shows the round and every client's answer.
    let html = nc.page("/failover").await;
    assert!(html.contains("Coordinator") && html.contains(&set.addr(1)), "{html}");
    for id in [&a, &b, &c] {
        assert!(html.contains(id.as_str()), "{id} missing from the page");
    }
    assert!(html.contains("reconfigured"), "{html}");
    assert!(epoch_after > epoch_before, "epoch {epoch_before} -> {epoch_after}");
    // Tasks claimed before survive (WAITed), and new tokens are above all old ones.
    let max_before = *before.iter().max().unwrap();
    for n in [&na, &nb] {
        // A node resumes claiming once its heartbeat went through again.
        let mut t = None;
        let until = Instant::now() + Duration::from_secs(5);
        while t.is_none() && Instant::now() < until {
            t = claim_token(n, "cf").await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let t = t.expect("claim after the switch");
        assert!(t > max_before, "token {t} after the switch <= {max_before} before it");
    }
}

/// One client unreachable (its process stopped): no switch ever happens,
/// and no node ever uses a different master from the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinated_no_switch_while_a_client_is_unreachable() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let mut set = TestReplicaSet::start(1);
    let (c, a, b) = ids("stop");
    let na = node(&set, &a, FailoverRole::Client, vec![]).await;
    let mut nb = node(&set, &b, FailoverRole::Client, vec![]).await;
    let nc = node(&set, &c, FailoverRole::Coordinator, vec![a.clone(), b.clone()]).await;
    assert!(
        wait_until(Duration::from_secs(5), || async {
            let st = status(&nc).await;
            st.coordinator
                .and_then(|c| c.clients.get(b.as_str()).cloned())
                .is_some_and(|u| u.starts_with("http"))
        })
        .await
    );
    nb.kill().await;
    set.kill(0);
    let replica = set.addr(1);
    // Rounds run (and are cancelled) every 1-2 s; watch for 6 s.
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        for n in [&na, &nc] {
            let m = master_of(n).await;
            assert_ne!(m, replica, "{} switched although a client never confirmed", n.node_id);
        }
        assert_eq!(set.role(set.port(1)), "slave", "the replica was promoted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let st = status(&nc).await;
    let history = &st.coordinator.as_ref().unwrap().history;
    assert!(!history.is_empty(), "no round was attempted: {st:?}");
    for r in history {
        assert_eq!(r.phase, "cancelled", "{st:?}");
        assert!(r.result.contains(b.as_str()), "{r:?}");
    }
    // Stopping nodes from using the master is itself refused without the
    // unreachable client's answer: nobody was invalidated at ping.
    assert_eq!(master_of(&na).await, set.addr(0));
}

/// The coordinator dies after `invalidate`: the clients use no master at
/// all (never a different one) until a new coordinator finishes a round.
/// Also: stale rounds and a wrong secret are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_killed_mid_round_leaves_no_split() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let mut set = TestReplicaSet::start(1);
    let (c, a, b) = ids("mid");
    let na = node(&set, &a, FailoverRole::Client, vec![]).await;
    let nb = node(&set, &b, FailoverRole::Client, vec![]).await;
    assert_eq!(enqueue(&na, "mid").await, 201);

    // Refusals first: wrong secret, unknown message, then stale rounds.
    let (s, _) = internal(&na, "ping", json!({"round": 5}), "wrong-secret-wrong-secret").await;
    assert_eq!(s, 401);
    let (s, _) = internal(&na, "promote", json!({"round": 5}), SECRET).await;
    assert_eq!(s, 404);

    // The test plays a coordinator that dies after invalidate.
    set.kill(0);
    // A round id a day ahead of the clock, as a coordinator on a host whose
    // clock runs fast would send: the next coordinator must get past it (it
    // learns the newest round from the clients' 409s).
    let round = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 86_400_000;
    for n in [&na, &nb] {
        let answer = |body: &Value| {
            serde_json::from_value::<FailoverAnswer>(body.clone())
                .map(|a| a.answer)
                .ok()
        };
        let (s, body) = internal(n, "ping", json!({"round": round}), SECRET).await;
        assert_eq!((s, answer(&body).as_deref()), (200, Some("pong")), "{body}");
        let (s, body) = internal(n, "invalidate", json!({"round": round}), SECRET).await;
        assert_eq!((s, answer(&body).as_deref()), (200, Some("invalidated")), "{body}");
    }
    // An older round is refused and changes nothing.
    let (s, body) = internal(
        &na,
        "reconfigure",
        json!({"round": round - 1, "master": set.addr(1)}),
        SECRET,
    )
    .await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(body["newest_round"], round);
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        for n in [&na, &nb] {
            assert_eq!(master_of(n).await, "", "{} uses a master after invalidate", n.node_id);
            assert_eq!(enqueue(n, "mid").await, 503, "a write went somewhere while invalidated");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(set.role(set.port(1)), "slave");

    // A new coordinator (knowing the clients' URLs from config, since the
    // registry lived on the dead master) finishes the job.
    let nc = node(
        &set,
        &c,
        FailoverRole::Coordinator,
        vec![format!("{a}={}", na.url), format!("{b}={}", nb.url)],
    )
    .await;
    let replica = set.addr(1);
    for n in [&na, &nb, &nc] {
        assert!(
            wait_until(Duration::from_secs(15), || async { master_of(n).await == replica }).await,
            "{} did not get the new master",
            n.node_id
        );
    }
    assert_eq!(enqueue(&na, "mid").await, 201);
    assert_eq!(enqueue(&nb, "mid").await, 201);
}

/// Without HA configured the status still tells the mode, master and epoch,
/// the page renders, and the internal endpoints refuse (404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_status_in_standalone_mode() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let redis = crate::common::TestRedis::start();
    let app = TestApp::start(&redis).await;
    let st = status(&app).await;
    assert_eq!(st.mode, "standalone");
    assert!(st.master_reachable);
    assert!(st.epoch.is_some(), "{st:?}");
    assert!(st.coordinator.is_none());
    let resp = app.request(reqwest::Method::GET, "/failover").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("standalone"));
    let (s, body) = internal(&app, "ping", json!({"round": 1}), SECRET).await;
    assert_eq!(s, 404, "{body}");
    assert!(as_problem(s, &body).detail.contains("role is off"), "{body}");
    // A message kind that does not exist is a 404 naming the three there are,
    // decided by the path before the handler runs.
    let (s, body) = internal(&app, "promote", json!({"round": 1}), SECRET).await;
    assert_eq!(s, 404, "{body}");
    assert!(
        as_problem(s, &body)
            .detail
            .contains("use ping, invalidate or reconfigure"),
        "{body}"
    );
}
