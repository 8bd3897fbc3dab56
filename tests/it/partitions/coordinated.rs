//! Coordinated failover with a client cut from the coordinator: before the
//! round (no link at all, or its answers lost) and during each phase (one
//! message kind lost: `invalidate`, `reconfigure`). Never two masters in use
//! (G10).

use super::*;
use crate::common::skip_on_cluster;
use muster::client::FailoverStatus;

/// `role` of the Redis on `ip` (`master`, `slave`), or "" if it does not answer.
async fn redis_role(ip: Ipv4Addr) -> String {
    let Ok(c) = redis::Client::open(format!("redis://{ip}:{REDIS_PORT}")) else {
        return String::new();
    };
    let Ok(Ok(mut c)) = tokio::time::timeout(Duration::from_millis(500), c.get_multiplexed_async_connection()).await
    else {
        return String::new();
    };
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut c)
        .await
        .unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("role:"))
        .unwrap_or("")
        .trim()
        .to_string()
}

/// A node's id and URL, for probes that outlive the borrow.
struct NsNodeRef {
    id: String,
    url: String,
}

/// `master` as each node reports it (`GET /api/v1/failover`), "" while it
/// uses none, `(error)` when it does not answer.
async fn masters(http: &reqwest::Client, nodes: &[&NsNode]) -> Vec<(String, String)> {
    let refs: Vec<NsNodeRef> = nodes
        .iter()
        .map(|n| NsNodeRef {
            id: n.id.clone(),
            url: n.url.clone(),
        })
        .collect();
    masters_of(http, &refs).await
}

async fn masters_of(http: &reqwest::Client, nodes: &[NsNodeRef]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for n in nodes {
        let m = match http
            .get(format!("{}/api/v1/failover", n.url))
            .bearer_auth(ADMIN)
            .send()
            .await
        {
            Ok(r) => r.json::<Value>().await.map_or("(error)".into(), |b| {
                serde_json::from_value::<FailoverStatus>(b).map_or(String::new(), |st| st.master)
            }),
            Err(_) => "(error)".into(),
        };
        out.push((n.id.clone(), m));
    }
    out
}

/// How client b is cut from the coordinator c.
#[derive(Clone, Copy, PartialEq)]
enum Cut {
    /// No packet either way: the round's `ping` fails.
    All,
    /// b hears c, its answers are lost: `ping` times out.
    AnswersOnly,
    /// Only the coordinator's messages of this kind to b are lost (the
    /// packets carrying `/internal/failover/<kind>`): the round passes the
    /// phases before it and is cut in it.
    Message(&'static str),
}

/// A coordinated-failover client partitioned from the coordinator (G10):
/// two Redis servers (r0 master, r1 its replica), clients a and b and the
/// coordinator c, each in a namespace. b is cut from c as `cut` says, then
/// r0 dies; b still reaches r1 and the test. For 6 s no node may use r0
/// once any node used r1 (an answer naming r0 must have been asked before
/// the first answer naming r1 arrived): never two masters. Cut before the
/// round or in `invalidate`, the round is cancelled and r1 never promoted;
/// cut in `reconfigure`, r1 is promoted, a and c use it and b uses none
/// (it confirmed `invalidate`). Once healed, every node uses r1 within 15 s.
async fn coordinated_client_cut_from_coordinator(test: &str, cut: Cut) {
    let Some(net) = Net::new_or_skip(test) else { return };
    let t0 = Instant::now();
    let (rd0, rd1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (r0h, r1h) = (net.host("r0"), net.host("r1"));
    let mut r0 = start_redis(&r0h, rd0.path()).await;
    let r0addr = format!("{}:{REDIS_PORT}", r0h.ip);
    let r1addr = format!("{}:{REDIS_PORT}", r1h.ip);
    let _r1 = start_redis_with(
        &r1h,
        rd1.path(),
        &["--replicaof", &r0h.ip.to_string(), &REDIS_PORT.to_string()],
    )
    .await;
    assert!(
        wait_until(Duration::from_secs(10), || async {
            redis_role(r1h.ip).await == "slave"
        })
        .await,
        "r1 replicates r0"
    );
    let (ah, bh, ch) = (net.host("a"), net.host("b"), net.host("c"));
    let p = std::process::id();
    let (a, b, c) = (format!("fa-{p}"), format!("fb-{p}"), format!("fc-{p}"));
    let failover = |role: &str, clients: &str| {
        format!(
            "[failover]\nrole = {role:?}\nredis_servers = [{r0addr:?}, {r1addr:?}]\nclients = [{clients}]\n\
             secret = \"partition-test-secret\"\ninterval_ms = 1000\nretries = 2\nanswer_timeout_ms = 500\n\
             max_backoff_ms = 2000\nrepublish_ms = 1000\n"
        )
    };
    let na = NsNode::start(&ah, &a, "", &failover("client", ""), &[]).await;
    let nb = NsNode::start(&bh, &b, "", &failover("client", ""), &[]).await;
    let clients = format!("{:?}, {:?}", format!("{a}={}", na.url), format!("{b}={}", nb.url));
    let nc = NsNode::start(&ch, &c, "", &failover("coordinator", &clients), &[]).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let all = [&na, &nb, &nc];
    let agree = |want: String| {
        let http = http.clone();
        async move {
            wait_until(Duration::from_secs(15), || async {
                masters(&http, &all).await.iter().all(|(_, m)| *m == want)
            })
            .await
        }
    };
    assert!(
        agree(r0addr.clone()).await,
        "every node on r0: {:?}",
        masters(&http, &all).await
    );

    match cut {
        Cut::All => net.cut(&bh, &ch),
        Cut::AnswersOnly => net.cut_oneway(&bh, &ch),
        Cut::Message(kind) => net.drop_containing(&ch, &bh, &format!("/internal/failover/{kind}")),
    }
    let promotes = matches!(cut, Cut::Message("reconfigure"));
    r0.kill();
    let killed = Instant::now();
    // One request to each node every 100 ms, not waiting for the previous
    // one (with the master down an answer can take a second).
    let mut probes = tokio::task::JoinSet::new();
    let mut polls = 0;
    while killed.elapsed() < Duration::from_secs(6) {
        for n in all {
            let (http, node) = (
                http.clone(),
                [NsNodeRef {
                    id: n.id.clone(),
                    url: n.url.clone(),
                }],
            );
            probes.spawn(async move {
                let asked = Instant::now();
                let got = masters_of(&http, &node).await;
                (asked, Instant::now(), got)
            });
        }
        if !promotes {
            assert_eq!(
                redis_role(r1h.ip).await,
                "slave",
                "r1 promoted while {b} cannot confirm"
            );
        }
        polls += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut answers = Vec::new();
    while let Some(r) = probes.join_next().await {
        let (asked, answered, got) = r.unwrap();
        for (id, m) in got {
            answers.push((asked, answered, id, m));
        }
    }
    let first_r1 = answers.iter().filter(|a| a.3 == r1addr).map(|a| a.1).min();
    for (asked, _, id, m) in &answers {
        assert!(
            m.is_empty() || *m == r0addr || *m == r1addr || m == "(error)",
            "{id} used {m}"
        );
        if *m == r0addr
            && let Some(t) = first_r1
        {
            assert!(
                *asked < t,
                "{id} still used r0 after a node used r1: two masters in use"
            );
        }
        if !promotes {
            assert!(*m != r1addr, "{id} used r1 while {b} could not confirm");
        }
    }
    let answers = answers.len();
    let st: FailoverStatus = http
        .get(format!("{}/api/v1/failover", nc.url))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let history = st.coordinator.as_ref().map(|c| c.history.clone()).unwrap_or_default();
    assert!(!history.is_empty(), "the coordinator never tried a round: {st:?}");
    let during = masters(&http, &all).await;
    if promotes {
        // Promoted once; b, which confirmed `invalidate`, uses nothing until
        // its `reconfigure` gets through.
        assert_eq!(redis_role(r1h.ip).await, "master");
        assert!(history.iter().any(|r| r.phase == "done"), "{st:?}");
        for (id, m) in &during {
            let want = if *id == b { "" } else { r1addr.as_str() };
            assert_eq!(m, want, "{id} while b's reconfigure is lost: {during:?}");
        }
    } else {
        for r in &history {
            assert_eq!(r.phase, "cancelled", "{st:?}");
            assert!(r.result.contains(b.as_str()), "{r:?}");
            if let Cut::Message(kind) = cut {
                assert!(r.result.starts_with(kind), "cut in {kind}: {r:?}");
            }
        }
    }
    net.heal(&bh, &ch);
    let healed = Instant::now();
    assert!(
        agree(r1addr.clone()).await,
        "every node on r1 after healing: {:?}",
        masters(&http, &all).await
    );
    assert_eq!(redis_role(r1h.ip).await, "master");
    eprintln!(
        "{test}: {polls} polls in 6 s, {answers} answers, never two masters (last: {during:?}); {} \
         rounds; all on r1 {:?} after healing; test took {:?}",
        history.len(),
        healed.elapsed(),
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinated_client_cut_from_coordinator_never_two_masters() {
    if skip_on_cluster("network namespaces and its own Redis servers") {
        return;
    }
    coordinated_client_cut_from_coordinator("coordinated_client_cut_from_coordinator_never_two_masters", Cut::All)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinated_client_cut_during_invalidate_never_two_masters() {
    if skip_on_cluster("network namespaces and its own Redis servers") {
        return;
    }
    coordinated_client_cut_from_coordinator(
        "coordinated_client_cut_during_invalidate_never_two_masters",
        Cut::Message("invalidate"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinated_client_cut_during_reconfigure_never_two_masters() {
    if skip_on_cluster("network namespaces and its own Redis servers") {
        return;
    }
    coordinated_client_cut_from_coordinator(
        "coordinated_client_cut_during_reconfigure_never_two_masters",
        Cut::Message("reconfigure"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinated_client_answers_lost_never_two_masters() {
    if skip_on_cluster("network namespaces and its own Redis servers") {
        return;
    }
    coordinated_client_cut_from_coordinator("coordinated_client_answers_lost_never_two_masters", Cut::AnswersOnly)
        .await;
}
