//! Concurrency groups (G6) and claim order.

use super::*;

/// The groups of the tasks in running sets KEYS (every shard's, when split),
/// each task's hash looked up under the shard tags ARGV (its id's shard).
const GROUPS_RUNNING: &str = r"local out = {}
  for i = 1, #KEYS do
    for _, id in ipairs(redis.call('ZRANGE', KEYS[i], 0, -1)) do
      for _, tag in ipairs(ARGV) do
        local g = redis.call('HGET', tag .. ':task:' .. id, 'group')
        if g then
          if g ~= '' then out[#out + 1] = g end
          break
        end
      end
    end
  end
  return out";

/// The groups of the running tasks of `queues`, read from the tasks' own
/// state: one script per shard, each atomic. A group's tasks all live in
/// the group's shard, so each group's count is one atomic read (and a
/// Redis Cluster refuses one script over several shards' slots).
async fn running_groups(conn: &mut cluster_mode::TestConn, queues: &[&str]) -> Vec<String> {
    let script = redis::Script::new(GROUPS_RUNNING);
    let mut out = Vec::new();
    for tag in shard_tags("muster") {
        let mut inv = script.prepare_invoke();
        for q in queues {
            inv.key(format!("{tag}:q:{q}:running"));
        }
        inv.arg(&tag);
        out.extend(inv.invoke_async::<Vec<String>>(conn).await.unwrap());
    }
    out
}

/// Running tasks per group, read from the tasks' own state (see
/// [`running_groups`]): the ground truth the limit must hold for.
async fn running_per_group(redis: &TestRedis, queues: &[&str]) -> HashMap<String, i64> {
    let mut conn = redis.conn().await;
    let mut m = HashMap::new();
    for g in running_groups(&mut conn, queues).await {
        *m.entry(g).or_insert(0) += 1;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_group_limits_hold_fifo_within_groups() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    let b = TestApp::start(&redis).await;
    let limits = [("ga", 1u32), ("gb", 2), ("gc", 3)];
    for (g, l) in limits {
        let (s, r) = a.put(&format!("/api/v1/groups/{g}"), json!({"limit": l})).await;
        assert_eq!(s, 200, "{r}");
    }
    // 2 queues, 4 groups (gd unlimited) plus ungrouped tasks, random order.
    let queues = ["ga6", "gb6"];
    let mut order: HashMap<String, Vec<String>> = HashMap::new();
    let mut rng = 12345u64;
    let mut next = || {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) as usize
    };
    for _ in 0..400 {
        let q = queues[next() % 2];
        let g = ["ga", "gb", "gc", "gd", ""][next() % 5];
        let body = if g.is_empty() {
            json!({"payload": 0})
        } else {
            json!({"payload": 0, "group": g})
        };
        let id = submit(&a, q, body).await;
        if !g.is_empty() {
            order.entry(format!("{q}/{g}")).or_default().push(id);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let sampler = {
        let stop = stop.clone();
        let violations = violations.clone();
        let mut conn = redis.conn().await;
        tokio::spawn(async move {
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                let groups = running_groups(&mut conn, &["ga6", "gb6"]).await;
                let mut m: HashMap<&str, u32> = HashMap::new();
                for g in &groups {
                    *m.entry(g.as_str()).or_insert(0) += 1;
                }
                for (g, l) in [("ga", 1u32), ("gb", 2), ("gc", 3)] {
                    let n = m.get(g).copied().unwrap_or(0);
                    if n > l {
                        violations.lock().await.push(format!("{g}: {n} running, limit {l}"));
                    }
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            samples
        })
    };
    // 8 workers on two nodes hold each task for a random few ms.
    let claimed: Arc<Mutex<Vec<(String, String, u64)>>> = Arc::default();
    let apps = Arc::new(vec![a, b]);
    let mut workers = Vec::new();
    for w in 0..8 {
        let apps = apps.clone();
        let claimed = claimed.clone();
        workers.push(tokio::spawn(async move {
            let app = &apps[w % 2];
            let me = format!("g6w{w}");
            join(app, &me).await;
            let mut idle = 0;
            let mut seed = w as u64 + 7;
            while idle < 3 {
                let q = ["ga6", "gb6"][(seed % 2) as usize];
                seed = seed.wrapping_mul(31).wrapping_add(17);
                let got = claim_tasks(app, q, &me, 2, 0).await;
                if got.is_empty() {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                idle = 0;
                for t in &got {
                    let g = t.group.clone().unwrap_or_default();
                    claimed.lock().await.push((format!("{q}/{g}"), t.id.clone(), t.token));
                }
                tokio::time::sleep(Duration::from_millis(1 + seed % 6)).await;
                for t in &got {
                    complete_task(app, t).await;
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    assert!(samples > 50, "the sampler ran ({samples} samples)");
    let v = violations.lock().await;
    assert!(v.is_empty(), "limits exceeded: {:?}", &v[..v.len().min(10)]);
    // Everything ran.
    let qs = apps[0].api().queues().await.unwrap();
    let done: u64 = qs.iter().map(|q| q.succeeded).sum();
    assert_eq!(done, 400, "{qs:?}");
    // FIFO within each (queue, group): claim order (token order) is enqueue order.
    let claimed = claimed.lock().await;
    let mut by_group: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    for (k, id, tok) in claimed.iter() {
        if !k.ends_with('/') {
            by_group.entry(k.clone()).or_default().push((*tok, id.clone()));
        }
    }
    for (k, mut v) in by_group {
        v.sort();
        let got: Vec<String> = v.into_iter().map(|(_, id)| id).collect();
        assert_eq!(&got, order.get(&k).unwrap(), "FIFO in {k}");
    }
    assert!(running_per_group(&redis, &queues).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_a_full_group_does_not_block_others() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    // Claim order holds within a shard when split: both groups in hol's.
    let (slow, fast) = (name_like("muster", "slow", "hol"), name_like("muster", "fast", "hol"));
    a.api().set_group_limit(&slow, Some(1)).await.unwrap();
    let s1 = submit(&a, "hol", json!({"group": slow, "priority": 10})).await;
    let _s2 = submit(&a, "hol", json!({"group": slow, "priority": 10})).await;
    let _s3 = submit(&a, "hol", json!({"group": slow, "priority": 10})).await;
    let other = submit(&a, "hol", json!({"group": fast})).await;
    let plain = submit(&a, "hol", json!({})).await;
    let got = claim_tasks(&a, "hol", "w", 10, 0).await;
    let ids: Vec<&str> = got.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(
        ids,
        vec![s1.as_str(), other.as_str(), plain.as_str()],
        "slow's head, then the others"
    );
    // The group page shows the slot in use and the queued ones.
    let q = a.api().queue("hol").await.unwrap();
    let page = q.groups.iter().find(|g| g.name == slow).unwrap().clone();
    assert_eq!(page.running, 1);
    assert_eq!(page.queued, 2);
    assert_eq!(page.limit, Some(1));
    // Raising the limit lets the next one start at once.
    a.api().set_group_limit(&slow, Some(2)).await.unwrap();
    assert_eq!(claim(&a, "hol", "w", 10, 0).await.len(), 1);
    // Completing one frees a slot.
    assert_eq!(got[0].id, s1);
    complete_task(&a, &got[0]).await;
    assert_eq!(claim(&a, "hol", "w", 10, 0).await.len(), 1);
    // Removing the limit: nothing left anyway.
    let g = a.api().set_group_limit(&slow, None).await.unwrap();
    assert_eq!(g.limit, None, "{g:?}");
    assert_eq!(problem(a.api().set_group_limit(&slow, Some(0)).await).status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_then_fifo() {
    let redis = TestRedis::start();
    let a = TestApp::start(&redis).await;
    join(&a, "w").await;
    let low = submit(&a, "prio", json!({"priority": -5})).await;
    let n1 = submit(&a, "prio", json!({})).await;
    let high = submit(&a, "prio", json!({"priority": 7})).await;
    let n2 = submit(&a, "prio", json!({})).await;
    let got = claim_tasks(&a, "prio", "w", 10, 0).await;
    let ids: Vec<&str> = got.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, vec![high.as_str(), n1.as_str(), n2.as_str(), low.as_str()]);
    let toks: Vec<u64> = got.iter().map(|t| t.token).collect();
    assert!(toks.windows(2).all(|w| w[0] < w[1]), "tokens increase within a claim");
}
