//! Elections: one leader per epoch, a lapsed leader replaced with a greater epoch.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_leader_per_epoch_under_contention() {
    let redis = TestRedis::start();
    let apps = Arc::new(vec![
        TestApp::start(&redis).await,
        TestApp::start(&redis).await,
        TestApp::start(&redis).await,
    ]);
    let won = Arc::new(Mutex::new(Vec::<(u64, String)>::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..9 {
        let (apps, won) = (apps.clone(), won.clone());
        tasks.push(tokio::spawn(async move {
            let app = &apps[c % 3];
            let me = format!("cand{c}");
            let mut terms = 0;
            while terms < 3 {
                let (s, v) = app
                    .post(
                        "/api/v1/elections/leader/campaign",
                        json!({"candidate": me, "ttl_ms": 5000, "wait_ms": 10_000, "value": {"c": c}}),
                    )
                    .await;
                assert_eq!(s, 200, "{v}");
                if v["elected"] != true {
                    continue;
                }
                let epoch = v["epoch"].as_u64().unwrap();
                won.lock().unwrap().push((epoch, me.clone()));
                let (_, l) = app.get("/api/v1/elections/leader").await;
                assert_eq!(
                    (l["leader"].as_str(), l["epoch"].as_u64()),
                    (Some(me.as_str()), Some(epoch))
                );
                assert_eq!(l["value"]["c"], c);
                let (s, _) = app
                    .post(
                        "/api/v1/elections/leader/resign",
                        json!({"candidate": me, "epoch": epoch}),
                    )
                    .await;
                assert_eq!(s, 204);
                terms += 1;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Candidates wake on each resignation: 27 hand-offs in well under the
    // one-second re-check each.
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
    let won = won.lock().unwrap().clone();
    assert_eq!(won.len(), 27);
    let epochs: BTreeSet<u64> = won.iter().map(|(e, _)| *e).collect();
    assert_eq!(epochs.len(), won.len(), "every leadership has its own epoch");
    // In the event log: epochs strictly increase, and a new leader is elected
    // only after the previous one resigned or lapsed.
    let mut current: Option<u64> = None;
    let mut last = 0u64;
    for (t, _, f) in redis.events("muster").await {
        if f["election"] != "leader" {
            continue;
        }
        let data: Value = serde_json::from_str(f["data"].as_str().unwrap()).unwrap();
        let epoch = data["epoch"].as_u64().unwrap();
        match t.as_str() {
            "election.elected" => {
                assert!(current.is_none(), "elected {epoch} while {current:?} leads");
                assert!(epoch > last, "epoch {epoch} after {last}");
                current = Some(epoch);
                last = epoch;
            }
            "election.resigned" | "election.expired" => {
                assert_eq!(current, Some(epoch));
                current = None;
            }
            _ => {}
        }
    }
    let (_, l) = apps[0].get("/api/v1/elections/leader").await;
    assert_eq!(l["leader"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_leader_is_replaced_with_a_greater_epoch() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let (_, first) = a
        .post(
            "/api/v1/elections/e/campaign",
            json!({"candidate": "c1", "ttl_ms": 400}),
        )
        .await;
    assert_eq!(first["elected"], true);
    // The leader renews by campaigning again: same epoch.
    let (_, again) = a
        .post(
            "/api/v1/elections/e/campaign",
            json!({"candidate": "c1", "ttl_ms": 400}),
        )
        .await;
    assert_eq!(
        (again["elected"].clone(), again["epoch"].clone()),
        (json!(true), first["epoch"].clone())
    );
    let (_, other) = b.post("/api/v1/elections/e/campaign", json!({"candidate": "c2"})).await;
    assert_eq!(
        (other["elected"].clone(), other["leader"].clone()),
        (json!(false), json!("c1"))
    );
    // c1 stops renewing: c2, waiting, is elected when the lease lapses.
    let (_, second) = b
        .post(
            "/api/v1/elections/e/campaign",
            json!({"candidate": "c2", "ttl_ms": 5000, "wait_ms": 5000}),
        )
        .await;
    assert_eq!(second["elected"], true, "{second}");
    assert!(second["epoch"].as_u64() > first["epoch"].as_u64());
    let (_, l) = a.get("/api/v1/elections/e").await;
    assert_eq!(
        (l["leader"].clone(), l["epoch"].clone()),
        (json!("c2"), second["epoch"].clone())
    );
    // The old leader cannot resign the new leadership, nor renew into it.
    let (s, v) = a
        .post(
            "/api/v1/elections/e/resign",
            json!({"candidate": "c1", "epoch": first["epoch"]}),
        )
        .await;
    assert_eq!((s, v["leader"].clone()), (409, json!("c2")));
    let (_, v) = a.post("/api/v1/elections/e/campaign", json!({"candidate": "c1"})).await;
    assert_eq!(v["elected"], false);
    let (_, list) = a.get("/api/v1/elections").await;
    assert_eq!(list["elections"][0]["leader"], "c2");
}
