//! Coordinated failover with a client cut from the coordinator, or its answers lost: never two masters (G10).

use super::*;

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
            Ok(r) => r
                .json::<Value>()
                .await
                .map_or("(error)".into(), |b| b["master"].as_str().unwrap_or("").to_string()),
            Err(_) => "(error)".into(),
        };
        out.push((n.id.clone(), m));
    }
    out
}

/// A coordinated-failover client partitioned from the coordinator (G10):
/// two Redis servers (r0 master, r1 its replica), clients a and b and the
/// coordinator c, each in a namespace. With `answers_only` false, b and c
/// cannot reach each other at all; with true, b hears c but its answers
/// are lost. Then r0 dies. b still reaches r1 and the test: for 6 s the
/// replica is never promoted and no node reports a master other than r0
/// (or none); once healed, every node switches to r1 within 15 s.
async fn coordinated_client_cut_from_coordinator(test: &str, answers_only: bool) {
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

    if answers_only {
        net.cut_oneway(&bh, &ch);
    } else {
        net.cut(&bh, &ch);
    }
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
            probes.spawn(async move { masters_of(&http, &node).await });
        }
        assert_eq!(
            redis_role(r1h.ip).await,
            "slave",
            "r1 promoted while {b} cannot confirm"
        );
        polls += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut answers = 0;
    while let Some(r) = probes.join_next().await {
        for (id, m) in r.unwrap() {
            assert!(
                m.is_empty() || *m == r0addr || m == "(error)",
                "{id} used {m} while {b} could not confirm"
            );
            answers += 1;
        }
    }
    let st: Value = http
        .get(format!("{}/api/v1/failover", nc.url))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let history = st["coordinator"]["history"].as_array().cloned().unwrap_or_default();
    assert!(!history.is_empty(), "the coordinator never tried a round: {st}");
    for r in &history {
        assert_eq!(r["phase"], "cancelled", "{st}");
        assert!(r["result"].as_str().unwrap_or("").contains(b.as_str()), "{r}");
    }
    let during = masters(&http, &all).await;
    net.heal(&bh, &ch);
    let healed = Instant::now();
    assert!(
        agree(r1addr.clone()).await,
        "every node on r1 after healing: {:?}",
        masters(&http, &all).await
    );
    assert_eq!(redis_role(r1h.ip).await, "master");
    eprintln!(
        "{test}: {polls} polls in 6 s, {answers} answers, no switch and no second master (last: {during:?}); {} \
         cancelled rounds; all on r1 {:?} after healing; test took {:?}",
        history.len(),
        healed.elapsed(),
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinated_client_cut_from_coordinator_never_two_masters() {
    coordinated_client_cut_from_coordinator("coordinated_client_cut_from_coordinator_never_two_masters", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinated_client_answers_lost_never_two_masters() {
    coordinated_client_cut_from_coordinator("coordinated_client_answers_lost_never_two_masters", true).await;
}
