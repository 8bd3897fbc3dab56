//! Muster on a Redis Cluster: every test starts its own three-master
//! cluster (`TestCluster`) and in-process nodes configured with
//! `redis.cluster` seeds (no `redis.url`). All keys share the `{muster}` hash
//! tag, so every script runs on the one master that owns that slot; these
//! tests drive the same REST calls as the standalone ones and check that
//! claims are fenced, orphans are recovered, barriers release, events replay
//! and keys return to their baseline, with every key on that one master.
//! With `MUSTER_TEST_SHARDS=N` the namespace is split: each shard's keys are
//! on the master of its own tag's slot (a lock's or a barrier's in the
//! shard of its name).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use muster::client::{Acquire, Acquired, ClaimedTask, Complete, Event, Fail, Verdict};
use muster::config::Config;
use serde_json::{Value, json};

use crate::common::ha::{TestCluster, info, query};
use crate::common::skip_on_cluster;
use crate::common::*;
use crate::sharding::claim;
use crate::tasks::completions;
use crate::tasks::{join, submit, submit_many};

/// A node on `cluster` (seeds only, no URL), with test timings and `tweak`.
async fn cluster_node(cluster: &TestCluster, tweak: impl FnOnce(&mut Config)) -> TestApp {
    let dir = tempfile::Builder::new().prefix("muster-node").tempdir().unwrap();
    let mut cfg = test_config("", dir.path());
    cfg.redis.url.clear();
    cfg.redis.cluster = cluster.seeds();
    tweak(&mut cfg);
    TestApp::start_config(cfg, dir).await
}

fn token(t: &ClaimedTask) -> u64 {
    t.token
}

/// Completes each of `tasks` with `result`, in one batch through `app`.
async fn complete_all(app: &TestApp, tasks: &[&ClaimedTask], result: Value) -> Vec<muster::client::CompleteOutcome> {
    let items = completions(tasks.iter().copied(), result);
    app.api().complete_batch(&items).await.unwrap()
}

/// Every key on every master of the cluster, by port. `KEYS *` per node is
/// fine at this size; each node answers for the slots it owns.
fn keys_by_node(cluster: &TestCluster) -> BTreeMap<u16, HashSet<String>> {
    cluster
        .ports()
        .into_iter()
        .map(|p| {
            let keys: Vec<String> = query(p, &["KEYS", "*"]).expect("a cluster node answers KEYS");
            (p, keys.into_iter().collect())
        })
        .collect()
}

/// The port of the master that owns the slot of hash tag `tag` (a shard's,
/// or `{muster}` itself).
fn owner_port_of(cluster: &TestCluster, tag: &str) -> u16 {
    let slot: i64 = query(cluster.ports()[0], &["CLUSTER", "KEYSLOT", tag]).unwrap();
    cluster
        .ports()
        .into_iter()
        .find(|&p| {
            let n: i64 = query(p, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]).unwrap_or(0);
            // COUNTKEYSINSLOT answers 0 on non-owners; the owner holds the
            // nodes registry (written to every shard) as soon as a node has
            // started.
            n > 0
        })
        .unwrap_or_else(|| panic!("one master holds the {tag} slot"))
}

/// The port of the master of shard 0's slot (the `{muster}` slot with one
/// shard): the one a node's Redis summary describes.
fn owner_port(cluster: &TestCluster) -> u16 {
    owner_port_of(cluster, &shard_tag("muster", 0))
}

/// The hash tag a key starts with (`{muster}`, `{muster#2.k}`).
fn tag_of(k: &str) -> &str {
    k.split_once('}').map_or("", |(t, _)| &k[..=t.len()])
}

/// All keys of the cluster, asserting that each shard's keys live on one
/// master and carry its hash tag: with one shard every key is `{muster}`'s,
/// on one master; split, only the layout record (and the epoch its check
/// records) stays under `{muster}`.
fn all_keys(cluster: &TestCluster) -> HashSet<String> {
    let by_node = keys_by_node(cluster);
    let tags = shard_tags("muster");
    let mut holder: BTreeMap<String, u16> = BTreeMap::new();
    for (&p, keys) in &by_node {
        for k in keys {
            let t = tag_of(k);
            // Split, `{muster}` keeps the layout record and the epoch keys
            // its check at start writes (layout.lua's fence_epoch).
            let root = ["{muster}:layout", "{muster}:epoch", "{muster}:epoch:master"];
            let known = tags.iter().any(|x| x == t) || root.contains(&k.as_str());
            assert!(known, "a key without a shard's hash tag: {k}");
            let at = *holder.entry(t.to_string()).or_insert(p);
            assert_eq!(at, p, "keys of {t} on several masters: {by_node:?}");
        }
    }
    if !sharded() {
        let holders: Vec<u16> = by_node.iter().filter(|(_, k)| !k.is_empty()).map(|(p, _)| *p).collect();
        assert!(holders.len() <= 1, "keys on several masters: {by_node:?}");
    }
    by_node.into_values().flatten().collect()
}

/// The PTTL of `k` on whichever master owns its slot (the others answer
/// MOVED).
fn pttl(cluster: &TestCluster, k: &str) -> i64 {
    cluster
        .ports()
        .into_iter()
        .find_map(|p| query::<i64>(p, &["PTTL", k]))
        .unwrap_or_else(|| panic!("no master answers PTTL {k}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_tasks_claim_fence_and_complete() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let t0 = Instant::now();
    let cluster = TestCluster::start(3);
    let a = cluster_node(&cluster, |_| {}).await;
    let b = cluster_node(&cluster, |_| {}).await;
    eprintln!("cluster and 2 nodes up in {:?}", t0.elapsed());
    let r = a.api().redis_summary().await.unwrap();
    assert_eq!((r.mode.as_str(), r.healthy), ("cluster", true), "{r:?}");
    join(&a, "wa").await;
    join(&b, "wb").await;

    // 50 tasks enqueued on A, claimed and completed alternately through both
    // nodes; every claim's tokens are above all the earlier ones.
    let total = 50;
    let ids = submit_many(&a, "ct", total).await;
    let mut seen = HashSet::new();
    let mut last_token = 0u64;
    let mut round = 0usize;
    loop {
        let (app, other, me) = if round.is_multiple_of(2) {
            (&a, &b, "wa")
        } else {
            (&b, &a, "wb")
        };
        round += 1;
        let got = claim(app, "ct", me, 4, 0).await;
        if got.is_empty() {
            break;
        }
        for t in &got {
            assert!(
                token(t) > last_token,
                "tokens strictly increase: {} after {last_token}",
                token(t)
            );
            last_token = token(t);
            assert_eq!(t.attempt, 1);
            assert!(seen.insert(t.id.clone()), "claimed twice: {t:?}");
        }
        // Complete through the other node: every node serves every task.
        let r = complete_all(other, &got.iter().collect::<Vec<_>>(), json!(round)).await;
        for x in &r {
            assert_eq!(x.status, "completed", "{x:?}");
        }
    }
    assert_eq!(seen.len(), total, "every task claimed exactly once");
    assert_eq!(seen, ids.into_iter().collect::<HashSet<_>>());
    let q = b.api().queue("ct").await.unwrap().stats;
    assert_eq!(
        (q.succeeded, q.queued, q.running, q.delayed),
        (total as u64, 0, 0, 0),
        "{q:?}"
    );

    // Fencing (G1): the same scenario as the standalone suite's.
    crate::tasks::stale_tokens_scenario(&a, &b).await;

    // A delayed task becomes claimable when due (the long poll returns then).
    submit(&a, "cd", json!({"delay_ms": 400})).await;
    assert!(claim(&b, "cd", "wb", 1, 0).await.is_empty(), "not before its time");
    let started = Instant::now();
    let got = claim(&b, "cd", "wb", 1, 3000).await;
    let waited = started.elapsed();
    assert_eq!(got.len(), 1);
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(1500),
        "{waited:?}"
    );

    // A paused queue hands out nothing until resumed.
    submit(&a, "cp", json!({})).await;
    assert_eq!(a.post("/api/v1/queues/cp/pause", Value::Null).await.0, 204);
    assert!(b.api().queue("cp").await.unwrap().stats.paused);
    assert!(claim(&b, "cp", "wb", 1, 0).await.is_empty(), "paused");
    assert_eq!(b.post("/api/v1/queues/cp/resume", Value::Null).await.0, 204);
    assert_eq!(claim(&a, "cp", "wa", 1, 0).await.len(), 1);

    all_keys(&cluster);
    eprintln!("cluster_tasks_claim_fence_and_complete: {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_orphan_recovered_after_node_death() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let t0 = Instant::now();
    let cluster = TestCluster::start(3);
    let mut a = cluster_node(&cluster, |_| {}).await;
    let b = cluster_node(&cluster, |_| {}).await;
    join(&b, "rescuer").await;
    // Past the start-up grace, as nodes.rs does, so A's death is steady state.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let victim = submit(&a, "orph", json!({"payload": "important"})).await;
    let behind = submit(&a, "orph", json!({"payload": "later"})).await;
    // Claimed in A's own name: A's heartbeats keep the claim alive.
    let got = claim(&a, "orph", &a.node_id, 1, 0).await;
    assert_eq!(got[0].id, victim);
    let old_token = token(&got[0]);
    let dead_node = a.node_id.clone();
    a.kill().await;
    let killed = Instant::now();
    let recovered = wait_until(Duration::from_secs(5), || async {
        let t = b.api().task(&victim).await;
        t.is_ok_and(|t| t.state == "queued")
    })
    .await;
    let took = killed.elapsed();
    assert!(recovered, "the orphan is requeued");
    // ttl (600 ms) after A's last heartbeat (100 ms interval) plus one cleaner
    // interval (100 ms), plus scheduling slack: as in orphans.rs and nodes.rs.
    assert!(
        took < Duration::from_millis(600 + 100 + 100 + 500),
        "recovered after {took:?}"
    );
    eprintln!("orphan requeued {took:?} after the kill");
    let next = claim(&b, "orph", "rescuer", 1, 0).await;
    assert_eq!(next[0].id, victim, "requeued at the front");
    assert_eq!(next[0].attempt, 2);
    assert!(token(&next[0]) > old_token, "a greater token");
    let with = |token| Complete {
        token,
        result: Value::Null,
        next: None,
    };
    let r = problem(b.api().complete(&victim, &with(old_token)).await);
    assert_eq!(r.status, 409, "the dead node's token is dead: {r:?}");
    b.api().complete(&victim, &with(next[0].token)).await.unwrap();
    let _ = behind;
    let (_, report) = b.get("/api/v1/orphans").await;
    let rec = &report["recovered"][0];
    assert_eq!(rec["task"], victim.as_str(), "{report}");
    assert_eq!(rec["owner"], dead_node.as_str());
    assert_eq!(rec["action"], "requeued");
    let nodes = b.api().node(&dead_node).await.unwrap();
    assert_eq!(nodes.state, "dead", "{nodes:?}");
    let task = b.api().task(&victim).await.unwrap();
    assert_eq!(task.attempt_log[0].outcome.as_deref(), Some("orphaned"));
    eprintln!("cluster_orphan_recovered_after_node_death: {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_barrier_round_releases() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let t0 = Instant::now();
    let cluster = TestCluster::start(3);
    let nodes = Arc::new(vec![
        cluster_node(&cluster, |_| {}).await,
        cluster_node(&cluster, |_| {}).await,
        cluster_node(&cluster, |_| {}).await,
    ]);
    let parts: Vec<String> = nodes.iter().map(|n| n.node_id.clone()).collect();
    let (s, v) = nodes[0]
        .put(
            "/api/v1/barriers/deploy",
            json!({"participants": parts, "max_missing": 0, "timeout_ms": 10_000}),
        )
        .await;
    assert!(s == 200 || s == 201, "{s} {v}");
    // Each node arrives as itself, through itself, and waits for the verdict.
    let mut waiters = Vec::new();
    for i in 0..3 {
        let nodes = nodes.clone();
        waiters.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100 * i as u64)).await;
            let me = nodes[i].node_id.clone();
            let arrive = muster::client::Arrive {
                node: me,
                wait_ms: 8000,
            };
            nodes[i].api().arrive("deploy", "r1", &arrive).await
        }));
    }
    let mut decided = HashSet::new();
    for w in waiters {
        let v = w.await.unwrap().unwrap();
        assert_eq!(v.verdict, Verdict::Released, "{v:?}");
        assert!(v.may_run, "{v:?}");
        assert!(!v.late);
        assert!(v.missing.is_empty(), "{v:?}");
        assert_eq!(v.arrived.len(), 3, "{v:?}");
        decided.insert(v.decided_at.unwrap());
    }
    assert_eq!(decided.len(), 1, "one decision, read by all");
    let (_, r) = nodes[2].get("/api/v1/barriers/deploy/rounds/r1").await;
    assert_eq!(r["verdict"], "released", "{r}");
    assert_eq!(r["reason"], "all_arrived");
    // Exactly one decision event.
    let page = nodes[1]
        .api()
        .events_page(None, 100, Some("barrier.released"))
        .await
        .unwrap();
    let evs = &page.events;
    assert_eq!(evs.len(), 1, "{page:?}");
    assert_eq!(evs[0].subject("round"), Some("r1"));
    eprintln!("cluster_barrier_round_releases: {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_events_replay() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let t0 = Instant::now();
    let cluster = TestCluster::start(3);
    let a = cluster_node(&cluster, |_| {}).await;
    let b = cluster_node(&cluster, |_| {}).await;
    join(&a, "w").await;
    // A mark before the workload: replay from it sees exactly the workload.
    let page = b.api().events_page(None, 1, None).await.unwrap();
    let mark = page.next.expect("node.joined events exist");
    let ids = submit_many(&a, "ev", 20).await;
    let got = claim(&a, "ev", "w", 20, 0).await;
    assert_eq!(got.len(), 20);
    complete_all(&a, &got.iter().collect::<Vec<_>>(), Value::Null).await;

    // Through the other node, in pages of 15.
    let mut events = Vec::new();
    let mut since = mark.clone();
    loop {
        // Raw: the client's events_page has no queue filter.
        let (s, page) = b
            .get(&format!("/api/v1/events?since={since}&topics=task.*&queue=ev&limit=15"))
            .await;
        assert_eq!(s, 200, "{page}");
        let page: muster::client::EventPage = serde_json::from_value(page).unwrap();
        assert!(!page.gap);
        if page.events.is_empty() {
            break;
        }
        since = page.next.unwrap();
        events.extend(page.events);
    }
    let of = |ty: &str| -> Vec<String> {
        events
            .iter()
            .filter(|e| e.kind == ty)
            .map(|e| e.subject("task").unwrap().to_string())
            .collect()
    };
    assert_eq!(of("task.enqueued"), ids, "enqueued, in order");
    let claimed: Vec<String> = got.iter().map(|t| t.id.clone()).collect();
    assert_eq!(of("task.claimed"), claimed, "claimed, in claim order");
    let done: HashSet<String> = of("task.succeeded").into_iter().collect();
    assert_eq!(
        done,
        ids.iter().cloned().collect::<HashSet<_>>(),
        "succeeded, each once"
    );
    assert_eq!(of("task.succeeded").len(), 20);
    // Enqueues name the acting muster node; claims and outcomes the worker.
    for e in &events {
        let want = if e.kind == "task.enqueued" {
            a.node_id.as_str()
        } else {
            "w"
        };
        assert_eq!(e.node, want, "{e:?}");
    }
    // Stream ids increase. Split, an id is a cursor (one stream id per
    // shard, joined by commas): the queue's tasks and their events are in
    // its shard, whose part increases, and no part goes back.
    let sids: Vec<&str> = events.iter().map(|e: &Event| e.id.as_str()).collect();
    let home = crate::common::sharded::shard_map("muster").home("ev");
    let parse = |s: &str| -> Vec<(u64, u64)> {
        let parts: Vec<(u64, u64)> = s
            .split(',')
            .map(|p| {
                let (ms, seq) = p.split_once('-').unwrap();
                (ms.parse::<u64>().unwrap(), seq.parse::<u64>().unwrap())
            })
            .collect();
        assert_eq!(parts.len(), shard_tags("muster").len(), "one part per shard: {s}");
        parts
    };
    assert!(
        sids.windows(2).all(|w| {
            let (x, y) = (parse(w[0]), parse(w[1]));
            x[home] < y[home] && x.iter().zip(&y).all(|(a, b)| a <= b)
        }),
        "{sids:?}"
    );
    // The latest page without `since` ends with the last success (the
    // queue's shard's part: the other shards' parts say where the page's
    // read of them stopped).
    let page = a.api().events_page(None, 3, Some("task.succeeded")).await.unwrap();
    let evs = &page.events;
    assert_eq!(evs.len(), 3);
    let last = events.last().unwrap().id.as_str();
    assert_eq!(parse(&evs[2].id)[home], parse(last)[home]);
    if !sharded() {
        assert_eq!(evs[2].id, last);
    }
    eprintln!("cluster_events_replay: {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_keys_return_to_baseline() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let t0 = Instant::now();
    let cluster = TestCluster::start(3);
    let tweak = |c: &mut Config| {
        c.tasks.retention_ms = 1000;
        c.tasks.dead_retention_ms = 1000;
        c.tasks.idempotency_window_ms = 1500;
    };
    let a = cluster_node(&cluster, tweak).await;
    let b = cluster_node(&cluster, tweak).await;
    join(&a, "w").await;
    a.put("/api/v1/groups/gg", json!({"limit": 5})).await;
    // Warm up: the counters and the event stream exist from the first task on.
    let warm = submit(&a, "warm", json!({})).await;
    let t = claim(&a, "warm", "w", 1, 0).await;
    let c = Complete {
        token: t[0].token,
        result: Value::Null,
        next: None,
    };
    let _ = a.api().complete(&warm, &c).await;
    let settled = wait_until(Duration::from_secs(10), || async {
        !all_keys(&cluster)
            .iter()
            .any(|k| k.contains(":q:warm") || k.contains(":task:"))
    })
    .await;
    assert!(settled, "the warm-up task is gone");
    let baseline = all_keys(&cluster);
    let owner = owner_port(&cluster);
    eprintln!(
        "baseline: {} keys, shard 0's on the master at port {owner} (of {:?})",
        baseline.len(),
        cluster.ports()
    );
    // The node's Redis summary describes the master that holds muster's
    // keys (shard 0's when split), not whichever master a keyless command
    // happens to reach.
    for i in 0..9 {
        let app = if i % 2 == 0 { &a } else { &b };
        // Short-lived bookkeeping keys may come and go between two reads:
        // the node's figure must lie between the owner's own DBSIZE just
        // before and just after (another master would say 0).
        let before: i64 = crate::common::ha::query(owner, &["DBSIZE"]).unwrap();
        let r = app.api().redis_summary().await;
        let after: i64 = crate::common::ha::query(owner, &["DBSIZE"]).unwrap();
        let r = r.unwrap();
        assert_eq!(r.mode, "cluster");
        assert_eq!(r.role, "master");
        let got = r.dbsize.unwrap() as i64;
        assert!(
            got > 0 && (before.min(after) - 1..=before.max(after) + 1).contains(&got),
            "DBSIZE of the {{muster}} slot's master (port {owner}, {before}..{after}): {r:?}"
        );
    }

    // 300 tasks with idempotency keys, aliases and groups; some fail to dead.
    let tasks: Vec<Value> = (0..300).map(crate::tasks::mixed_task).collect();
    let (s, _) = a.post("/api/v1/queues/leak/tasks/batch", json!({"tasks": tasks})).await;
    assert_eq!(s, 200);
    let mut finished = 0;
    let mut turn = 0;
    while finished < 300 {
        let app = if turn % 2 == 0 { &a } else { &b };
        turn += 1;
        let got = claim(app, "leak", "w", 50, 1000).await;
        assert!(!got.is_empty(), "work remains ({finished} finished)");
        let n = |t: &ClaimedTask| t.payload.get("n").and_then(Value::as_u64).unwrap();
        let (ok, bad): (Vec<&ClaimedTask>, Vec<&ClaimedTask>) = got.iter().partition(|t| n(t) % 7 != 0);
        if !ok.is_empty() {
            complete_all(app, &ok, Value::Null).await;
        }
        for t in bad {
            let f = Fail {
                token: t.token,
                error: "x".into(),
                retry: true,
                next: None,
            };
            app.api().fail(&t.id, &f).await.unwrap();
        }
        finished += got.len();
    }
    let q = b.api().queue("leak").await.unwrap().stats;
    assert_eq!((q.queued, q.running, q.delayed), (0, 0, 0), "{q:?}");
    let during = all_keys(&cluster);
    eprintln!("after the workload: {} keys", during.len());
    assert!(during.len() > baseline.len());
    // A shard's counters (one key each), first written in the shards the
    // workload's groups put tasks in: split, the warm-up reached only the
    // shard of its queue.
    let counter = |k: &str| {
        let t = tag_of(k);
        sharded()
            && [
                format!("{t}:seq"),
                format!("{t}:fence"),
                format!("{t}:epoch"),
                format!("{t}:epoch:master"),
            ]
            .iter()
            .any(|c| c == k)
    };
    // Every new key has a TTL or is a bounded index.
    let mut unbounded = Vec::new();
    for k in during.difference(&baseline) {
        let ttl = pttl(&cluster, k);
        // A split namespace has these in every shard holding tasks of them.
        let t = tag_of(k);
        let bounded = k.starts_with(&format!("{t}:q:leak:"))
            || *k == format!("{t}:dead")
            || *k == format!("{t}:queues")
            || counter(k);
        // -2: it expired between the listing and this check.
        if ttl == -1 && !bounded {
            unbounded.push(k.clone());
        }
    }
    assert!(unbounded.is_empty(), "keys without a TTL: {unbounded:?}");
    // After retention (1 s) and the idempotency window (1.5 s): back to
    // baseline (and the new shards' counters).
    let settled = |now: &HashSet<String>| {
        now.iter().all(|k| baseline.contains(k) || counter(k)) && baseline.iter().all(|k| now.contains(k))
    };
    let back = wait_until(Duration::from_secs(10), || async { settled(&all_keys(&cluster)) }).await;
    let now = all_keys(&cluster);
    let extra: Vec<_> = now
        .iter()
        .filter(|k| !baseline.contains(*k) && !counter(k))
        .take(10)
        .collect();
    let missing: Vec<_> = baseline.difference(&now).take(10).collect();
    assert!(
        back,
        "keys left over: {extra:?}, missing: {missing:?} ({} in all, baseline {})",
        now.len(),
        baseline.len()
    );
    eprintln!("back to {} keys after {:?}", now.len(), t0.elapsed());
}

/// The master of the slot of hash tag `tag` (`{muster}` with one shard),
/// given a replica, hands something out in `during` and dies before the replica receives it: the replica is
/// frozen and cut from its master (whose writes would otherwise wait in the
/// frozen replica's socket buffer and be applied at the thaw), the master
/// is killed, and the replica takes the slot over (`CLUSTER FAILOVER
/// TAKEOVER`). Returns what `during` returned and the new master's port.
async fn lose_the_last_write<T>(
    cluster: &mut TestCluster,
    tag: &str,
    during: impl std::future::Future<Output = T>,
) -> (T, u16) {
    let owner = owner_port_of(cluster, tag);
    let master = cluster.ports().iter().position(|&p| p == owner).unwrap();
    let replica = cluster.add_replica(master);
    // The replica has everything up to `during` (the node recorded the
    // slot's master at start, with the layout check).
    let acked: i64 = query(owner, &["WAIT", "1", "5000"]).unwrap();
    assert_eq!(acked, 1, "the replica caught up");
    let thaw = cluster.node(replica).freeze(Duration::from_millis(1500));
    let cut: i64 = query(owner, &["CLIENT", "KILL", "TYPE", "replica"]).unwrap();
    assert_eq!(cut, 1, "the replication link is cut");
    let out = during.await;
    cluster.kill(master);
    thaw.join().unwrap();
    let replica_port = cluster.ports()[replica];
    let promoted = wait_until(Duration::from_secs(20), || async {
        let _ = query::<String>(replica_port, &["CLUSTER", "FAILOVER", "TAKEOVER"]);
        info(replica_port, "replication")
            .iter()
            .any(|(k, v)| k == "role" && v == "master")
    })
    .await;
    assert!(promoted, "the replica took over the slot");
    (out, replica_port)
}

/// The `redis.failover` events in the stream of the shard of hash tag `tag`
/// on the master at `port`.
fn failover_events(port: u16, tag: &str) -> usize {
    let entries: Vec<(String, Vec<(String, String)>)> =
        query(port, &["XRANGE", &format!("{tag}:events"), "-", "+"]).unwrap_or_default();
    entries
        .into_iter()
        .flat_map(|(id, f)| muster::testing::Event::from_entry(id, f))
        .filter(|ev| ev.kind == "redis.failover")
        .count()
}

/// G1 across a Cluster-internal failover: the master of the namespace's
/// slot hands out a token and dies before its replica received it; the
/// replica takes over, and the same task claimed again gets a greater
/// token, because the first call on the new master raises the epoch
/// (`fence_epoch` in the prelude). Without the raise the new master's
/// counter repeats the lost token. The raise is an event, as in the other
/// modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_failover_raises_the_epoch_so_a_lost_token_is_never_handed_out_again() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let mut cluster = TestCluster::start(3);
    let a = cluster_node(&cluster, |_| {}).await;
    let task = submit(&a, "lost", json!({})).await;
    // The master of the task's shard (its id names it) loses the claim.
    let tag = task_tag("muster", &task);
    let (lost, new_master) = lose_the_last_write(&mut cluster, &tag, async {
        let got = claim(&a, "lost", &a.node_id, 1, 0).await;
        assert_eq!(got[0].id, task);
        token(&got[0])
    })
    .await;
    // The claim was lost with the old master: the task is queued again.
    let again = wait_until(Duration::from_secs(20), || async {
        claim_retrying(&a, "lost").await.is_some()
    })
    .await;
    assert!(again, "the task is claimable on the new master");
    let t = a.api().task(&task).await.unwrap();
    let now = t.token.expect("running, with a token");
    assert!(
        now > lost,
        "the token handed out after the failover ({now}) is above the lost one ({lost})"
    );
    assert_eq!(now >> 32, (lost >> 32) + 1, "one epoch up");
    assert_eq!(failover_events(new_master, &tag), 1, "one redis.failover event");
}

/// G10 across the same failover: a lock's fencing token handed out by the
/// old master and lost is never handed out again by the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_failover_never_repeats_a_lost_lock_token() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let mut cluster = TestCluster::start(3);
    let a = cluster_node(&cluster, |_| {}).await;
    let acquire = |owner: &'static str| {
        let a = &a;
        async move {
            a.post(
                "/api/v1/locks/res/acquire",
                json!({"owner": owner, "ttl_ms": 60_000, "wait_ms": 0}),
            )
            .await
        }
    };
    // A lock lives in the shard of its name: that shard's master loses the
    // acquire.
    let (lost, _) = lose_the_last_write(&mut cluster, &name_tag("muster", "res"), async {
        let acq = Acquire {
            owner: "first".into(),
            ttl_ms: 60_000,
            wait_ms: 0,
            node: None,
        };
        a.api().acquire("res", &acq).await.unwrap().token
    })
    .await;
    // The acquire was lost: the lock is free on the new master.
    let deadline = Instant::now() + Duration::from_secs(20);
    let now = loop {
        let (s, v) = acquire("second").await;
        if s == 200 {
            break serde_json::from_value::<Acquired>(v).unwrap().token;
        }
        assert!(
            Instant::now() < deadline,
            "the lock is acquirable on the new master: {s} {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        now > lost,
        "the lock token after the failover ({now}) is above the lost one ({lost})"
    );
}

/// One claim of one task of `queue` in the node's own name; `None` when
/// nothing is queued or the cluster does not answer yet (a failover).
async fn claim_retrying(app: &TestApp, queue: &str) -> Option<Value> {
    let (s, b) = app
        .post(
            &format!("/api/v1/queues/{queue}/claim"),
            json!({"node": app.node_id, "max": 1, "wait_ms": 0}),
        )
        .await;
    (s == 200).then(|| b["tasks"][0].clone())
}

/// The shard map's tags on a real cluster made by `redis-cli --cluster
/// create`: the slots Redis computes are the map's, and twelve shards put
/// four on each of three masters (docs/sharding.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_shards_spread_four_per_master() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    use muster::testing::{ShardMap, key_slot};
    let cluster = TestCluster::start(3);
    let map = ShardMap::new("muster", 12);
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    for i in 0..map.len() {
        let key = format!("{}:probe", map.tag(i));
        let slot: i64 = query(cluster.ports()[0], &["CLUSTER", "KEYSLOT", &key]).unwrap();
        assert_eq!(slot, i64::from(key_slot(&key)), "{key}");
        let _: () = redis::cmd("SET").arg(&key).arg(i).query_async(&mut conn).await.unwrap();
    }
    let per_master: Vec<i64> = cluster
        .ports()
        .into_iter()
        .map(|p| query(p, &["DBSIZE"]).unwrap())
        .collect();
    assert_eq!(per_master, [4, 4, 4], "keys per master");
}

/// A store on `cluster` split into `shards` (the node runs one; these tests
/// drive the store's shard views directly), with its clock read, and the
/// script context of a Cluster node.
async fn sharded_store(
    cluster: &TestCluster,
    shards: u32,
) -> (muster::testing::Store, muster::testing::ScriptCtx, Config) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config("", dir.path());
    cfg.redis.url.clear();
    cfg.redis.cluster = cluster.seeds();
    let store = muster::testing::Store::connect_cluster_sharded(&cfg.redis, shards)
        .await
        .unwrap();
    assert_eq!(store.shards().len(), shards as usize);
    store.time_ms().await.unwrap();
    let ctx = muster::testing::ScriptCtx {
        events_max_len: 1000,
        cluster: true,
    };
    (store, ctx, cfg)
}

/// A store split into 12 shards (`Store::shard`): each view's scripts and
/// keyless commands go to the master of its own shard's slot, and the
/// scripts, which take their namespace from their first key, write only
/// that shard's keys; four shards per master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_store_sends_each_shard_to_its_own_master() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    use muster::testing::Lua;
    let cluster = TestCluster::start(3);
    let (store, ctx, _) = sharded_store(&cluster, 12).await;
    let probe = Lua::load(
        "probe",
        "redis.call('SET', P .. ':probe', ARGV[1])\nreturn redis.call('CLUSTER', 'MYID')",
        &ctx,
    );
    let ids: Vec<String> = cluster
        .ports()
        .into_iter()
        .map(|p| query(p, &["CLUSTER", "MYID"]).unwrap())
        .collect();
    for i in 0..12 {
        let shard = store.shard(i);
        assert_eq!(shard.shard_index(), i);
        let key = format!("{}:probe", shard.keys().prefix());
        let ran_on: String = shard
            .eval(&probe, &[shard.keys().events()], &[i.to_string()])
            .await
            .unwrap();
        let keyless: String = shard.query("myid", redis::cmd("CLUSTER").arg("MYID")).await.unwrap();
        let owner = cluster
            .ports()
            .into_iter()
            .position(|p| query::<i64>(p, &["EXISTS", &key]) == Some(1))
            .unwrap_or_else(|| panic!("{key} is on no master"));
        assert_eq!(ran_on, ids[owner], "shard {i}'s script ran on its slot's master");
        assert_eq!(
            keyless, ids[owner],
            "shard {i}'s keyless command went to its slot's master"
        );
    }
    let per_master: Vec<i64> = cluster
        .ports()
        .into_iter()
        .map(|p| query(p, &["DBSIZE"]).unwrap())
        .collect();
    assert_eq!(per_master, [4, 4, 4], "one probe key per shard, four shards per master");
}

/// The registry on a namespace split into 12 shards: a heartbeat, a drain
/// and a leave reach every shard's copy (each shard's claims decide
/// liveness from its own), and the answer is shard 0's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_registry_is_written_to_every_shard() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    use muster::testing::{NodeKind, Nodes};
    let cluster = TestCluster::start(3);
    let (store, ctx, cfg) = sharded_store(&cluster, 12).await;
    let nodes = Nodes::new(store.clone(), cfg.nodes.clone(), &ctx);
    let hb = nodes
        .heartbeat(
            "w1",
            NodeKind::Worker,
            "test",
            60_000,
            "",
            "",
            &Default::default(),
            |_| false,
        )
        .await
        .unwrap();
    assert!(hb.joined && hb.state == "active", "{hb:?}");
    let field = |i: usize, f: &'static str| {
        let s = store.shard(i);
        async move {
            let key = s.keys().node("w1");
            s.query::<Option<String>>("t", redis::cmd("HGET").arg(key).arg(f))
                .await
                .unwrap()
        }
    };
    for i in 0..12 {
        let s = store.shard(i);
        let score: Option<f64> = s
            .query("t", redis::cmd("ZSCORE").arg(s.keys().nodes()).arg("w1"))
            .await
            .unwrap();
        assert!(score.is_some_and(|e| e as i64 > hb.now), "shard {i}: registered");
        assert_eq!(field(i, "state").await.as_deref(), Some("active"), "shard {i}");
    }
    assert!(nodes.drain("w1", "test").await.unwrap());
    for i in 0..12 {
        assert_eq!(
            field(i, "state").await.as_deref(),
            Some("draining"),
            "shard {i}: drained"
        );
    }
    nodes.leave_worker("w1", "test").await.unwrap();
    for i in 0..12 {
        let s = store.shard(i);
        let score: Option<f64> = s
            .query("t", redis::cmd("ZSCORE").arg(s.keys().nodes()).arg("w1"))
            .await
            .unwrap();
        assert_eq!(score, None, "shard {i}: left");
    }
}
