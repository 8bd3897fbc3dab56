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
                let value = json!({"c": c});
                let v = app
                    .api()
                    .campaign("leader", &campaign(&me, 5000, 10_000, Some(value.clone())))
                    .await
                    .unwrap();
                if !v.elected {
                    continue;
                }
                let epoch = v.leadership.epoch.unwrap();
                won.lock().unwrap().push((epoch, me.clone()));
                let l = app.api().leader("leader").await.unwrap();
                assert_eq!((l.leader.as_deref(), l.epoch), (Some(me.as_str()), Some(epoch)));
                assert_eq!(l.value, Some(value));
                app.api().resign("leader", &me, Some(epoch)).await.unwrap();
                terms += 1;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Candidates wake on each resignation: 27 hand-offs in well under the
    // one-second re-check each (without the wake-up they take 27 s; the
    // 12-shard Cluster pass on two busy cores has taken 8 s with it).
    assert!(started.elapsed() < Duration::from_secs(14), "{:?}", started.elapsed());
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
    let l = apps[0].api().leader("leader").await.unwrap();
    assert_eq!(l.leader, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_leader_is_replaced_with_a_greater_epoch() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    // 30 s: locks.default_ttl_ms, where the lease does not matter.
    let first = a.api().campaign("e", &campaign("c1", 400, 0, None)).await.unwrap();
    assert!(first.elected);
    let first_epoch = first.leadership.epoch;
    // The leader renews by campaigning again: same epoch.
    let again = a.api().campaign("e", &campaign("c1", 400, 0, None)).await.unwrap();
    assert_eq!((again.elected, again.leadership.epoch), (true, first_epoch));
    let other = b.api().campaign("e", &campaign("c2", 30_000, 0, None)).await.unwrap();
    assert_eq!((other.elected, other.leadership.leader.as_deref()), (false, Some("c1")));
    // c1 stops renewing: c2, waiting, is elected when the lease lapses.
    let second = b.api().campaign("e", &campaign("c2", 5000, 5000, None)).await.unwrap();
    assert!(second.elected, "{second:?}");
    assert!(second.leadership.epoch > first_epoch);
    let l = a.api().leader("e").await.unwrap();
    assert_eq!((l.leader.as_deref(), l.epoch), (Some("c2"), second.leadership.epoch));
    // The old leader cannot resign the new leadership, nor renew into it.
    // (The problem's extension members are untyped: read from its map.)
    let p = problem(a.api().resign("e", "c1", first_epoch).await);
    assert_eq!((p.status, p.extra["leader"].clone()), (409, json!("c2")));
    let v = a.api().campaign("e", &campaign("c1", 30_000, 0, None)).await.unwrap();
    assert!(!v.elected);
    let list = a.api().elections().await.unwrap();
    assert_eq!(list[0].leader.as_deref(), Some("c2"));
}
