//! A namespace split into shards (`redis.shards`, issue 14), on one
//! redis-server so the tests can read each shard's keys: where tasks live,
//! claims across a queue's shards, group limits across queues in different
//! shards (G6), recovery in every shard (G3), the event cursor that
//! resumes every shard with no hole and no duplicate (G9), and locks,
//! elections and barriers in the shards of their names.
//!
//! The same properties on a Redis Cluster are the whole suite run with
//! `MUSTER_TEST_SHARDS=12 MUSTER_TEST_CLUSTER=1` (see `docs/contributing.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use muster::client::{Acquire, ClaimedTask, Complete, Event, Fail, NodeHeartbeat, WorkflowTaskSpec};
use muster::testing::ShardMap;
use serde_json::{Value, json};

use crate::common::*;
use crate::events::{collect, ws};
use crate::tasks::completions;
use crate::tasks::{join, submit};

const SHARDS: u32 = 4;

fn map() -> ShardMap {
    ShardMap::new("muster", SHARDS)
}

async fn node(redis: &TestRedis) -> TestApp {
    TestApp::start_with(redis, |c| c.redis.shards = SHARDS).await
}

/// A queue (or group) name for each shard: `<stem><n>`, the first whose home
/// is that shard.
fn names_per_shard(stem: &str) -> Vec<String> {
    let m = map();
    (0..SHARDS as usize)
        .map(|shard| {
            (0..)
                .map(|n| format!("{stem}{n}"))
                .find(|q| m.home(q) == shard)
                .unwrap()
        })
        .collect()
}

/// Claims up to `max` of a queue's tasks for a worker (empty when none came).
pub(crate) use crate::tasks::claim_tasks as claim;

/// Completes a claimed task.
pub(crate) async fn complete(app: &TestApp, t: &ClaimedTask) {
    let c = Complete {
        token: t.token,
        result: Value::Null,
        next: None,
    };
    app.api().complete(&t.id, &c).await.unwrap();
}

/// Fails a claimed task for good.
async fn fail(app: &TestApp, t: &ClaimedTask) -> String {
    let f = Fail {
        token: t.token,
        error: "x".into(),
        retry: false,
        next: None,
    };
    app.api().fail(&t.id, &f).await.unwrap().finished.state
}

/// The `task` subject of an event frame.
fn task_of(e: &Value) -> String {
    let e: Event = serde_json::from_value(e.clone()).unwrap();
    e.subject("task").unwrap().to_string()
}

/// The shard whose tag holds `key`'s task hash, if any.
async fn shard_of_task(redis: &TestRedis, id: &str) -> Vec<usize> {
    let m = map();
    let mut found = Vec::new();
    for shard in 0..SHARDS as usize {
        let key = format!("{}:task:{id}", m.tag(shard));
        if redis.cmd::<i64>(&["EXISTS", &key]).await == 1 {
            found.push(shard);
        }
    }
    found
}

/// Tasks are stored in their queue's shard, or their group's when they name
/// one, and their ids name that shard; every call by id, claims across a
/// queue's shards, and the merged reads find them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_live_in_their_home_shard_and_every_call_finds_them() {
    if skip_on_cluster("reads each shard's keys on a server of its own") {
        return;
    }
    let redis = TestRedis::start();
    let a = node(&redis).await;
    let m = map();
    join(&a, "w").await;
    let queues = names_per_shard("q");
    let groups = names_per_shard("g");
    let mut ids: BTreeMap<String, (String, usize)> = BTreeMap::new();
    for (qs, q) in queues.iter().enumerate() {
        for i in 0..3 {
            let id = submit(&a, q, json!({"payload": i})).await;
            ids.insert(id, (q.clone(), qs));
        }
        // A task naming the group of the next shard goes to that shard.
        let gs = (qs + 1) % SHARDS as usize;
        let id = submit(&a, q, json!({"payload": "g", "group": groups[gs]})).await;
        ids.insert(id, (q.clone(), gs));
    }
    for (id, (_, shard)) in &ids {
        assert_eq!(m.home(id), *shard, "the id {id} names its shard");
        assert_eq!(
            shard_of_task(&redis, id).await,
            vec![*shard],
            "{id} stored in its shard alone"
        );
    }
    // Every shard holds work: the namespace really is split.
    let per_shard: BTreeSet<usize> = ids.values().map(|v| v.1).collect();
    assert_eq!(per_shard.len(), SHARDS as usize);

    // Merged reads: the queue list and counts, one task, a page.
    let listed: BTreeMap<String, u64> = a
        .api()
        .queues()
        .await
        .unwrap()
        .into_iter()
        .map(|q| (q.name, q.queued))
        .collect();
    for q in &queues {
        assert_eq!(
            listed.get(q),
            Some(&4),
            "{q}: 3 of its own and 1 in a group's shard: {listed:?}"
        );
    }
    let page = a.api().tasks(&queues[0], "queued", 2, None).await.unwrap();
    assert_eq!(page.total, 4, "{page:?}");
    let page2 = a.api().tasks(&queues[0], "queued", 10, Some("2")).await.unwrap();
    let mut seen: Vec<String> = page.tasks.iter().chain(&page2.tasks).map(|t| t.id.clone()).collect();
    seen.sort();
    let mut want: Vec<String> = ids
        .iter()
        .filter(|(_, v)| v.0 == queues[0])
        .map(|(id, _)| id.clone())
        .collect();
    want.sort();
    assert_eq!(seen, want, "two pages list the queue's four tasks once each");

    // Claims take the queue's tasks from every shard that holds them.
    let mut claimed = Vec::new();
    for q in &queues {
        let got = claim(&a, q, "w", 10, 0).await;
        assert_eq!(got.len(), 4, "{q}: {got:?}");
        claimed.extend(got);
    }
    // Complete most in one batch across shards, fail one, then read them.
    let (failed, done) = claimed.split_first().unwrap();
    let items = completions(done, Value::Null);
    let results = a.api().complete_batch(&items).await.unwrap();
    assert_eq!(results.len(), done.len());
    for (r, t) in results.iter().zip(done) {
        assert_eq!((&r.id, r.status.as_str()), (&t.id, "completed"), "{results:?}");
    }
    let fid = failed.id.as_str();
    let f = Fail {
        token: failed.token,
        error: "boom".into(),
        retry: false,
        next: None,
    };
    let b = a.api().fail(fid, &f).await.unwrap();
    assert_eq!(b.state, "dead", "{b:?}");
    for t in done {
        let got = a.api().task(&t.id).await.unwrap();
        assert_eq!(got.state, "succeeded", "{got:?}");
    }
    let dead = a.api().dead_page(100, None).await.unwrap();
    assert_eq!(dead.total, 1, "{dead:?}");
    assert_eq!(dead.tasks[0].id, fid);
}

/// G6 across shards: a group's tasks are stored in the group's shard
/// whatever their queue, so its limit is one atomic check even for queues
/// that live in different shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_limit_holds_across_queues_in_different_shards() {
    if skip_on_cluster("reads each shard's keys on a server of its own") {
        return;
    }
    let redis = TestRedis::start();
    let a = node(&redis).await;
    let b = node(&redis).await;
    join(&a, "w").await;
    let queues = names_per_shard("lq");
    a.api().set_group_limit("shared", Some(2)).await.unwrap();
    for q in &queues {
        for i in 0..3 {
            submit(&a, q, json!({"payload": i, "group": "shared"})).await;
        }
    }
    // Claims from every queue through both nodes: two run at a time.
    let mut running: Vec<ClaimedTask> = Vec::new();
    let mut finished = 0;
    while finished < 3 * queues.len() {
        for (i, q) in queues.iter().enumerate() {
            let app = if i % 2 == 0 { &a } else { &b };
            running.extend(claim(app, q, "w", 5, 0).await);
            assert!(
                running.len() <= 2,
                "the group limit of 2 held: {} running",
                running.len()
            );
        }
        assert_eq!(running.len(), 2, "the group stays busy while it has work");
        let t = running.remove(0);
        complete(&a, &t).await;
        finished += 1;
        if finished + running.len() == 3 * queues.len() {
            break;
        }
    }
    let g = a.api().groups().await.unwrap();
    let shared = g.iter().find(|g| g.name == "shared");
    assert_eq!(shared.unwrap().limit, Some(2), "{g:?}");
}

/// G3 in every shard: a worker that stops heartbeating loses the tasks it
/// held in every shard, each requeued by the cleaner of its shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_tasks_are_recovered_in_every_shard() {
    if skip_on_cluster("reads each shard's keys on a server of its own") {
        return;
    }
    let redis = TestRedis::start();
    let a = node(&redis).await;
    let queues = names_per_shard("rq");
    let hb = NodeHeartbeat {
        ttl_ms: Some(500),
        ..Default::default()
    };
    a.api().heartbeat_node("short", &hb).await.unwrap();
    let mut held = Vec::new();
    for q in &queues {
        submit(&a, q, json!({"payload": 1})).await;
        let got = claim(&a, q, "short", 1, 0).await;
        assert_eq!(got.len(), 1);
        held.push(got[0].id.clone());
    }
    let shards: BTreeSet<usize> = held.iter().map(|id| map().home(id)).collect();
    assert_eq!(shards.len(), SHARDS as usize, "one held task per shard");
    // The worker goes silent; every shard's copy of it expires.
    let requeued = wait_until(Duration::from_secs(15), || async {
        let mut all = true;
        for id in &held {
            let t = a.api().task(id).await;
            all &= t.is_ok_and(|t| t.state == "queued" && t.attempts == 1);
        }
        all
    })
    .await;
    assert!(requeued, "every shard's cleaner requeued its task");
    let (_, o) = a.get("/api/v1/orphans").await;
    assert_eq!(o["recovered"].as_array().map(Vec::len), Some(SHARDS as usize), "{o}");
    assert_eq!(o["counts"]["requeued"], SHARDS, "{o}");
}

/// G9 across shards: an event's id is a cursor of one stream id per shard;
/// paging with it, or resuming a WebSocket from any event's id, continues
/// every shard with no hole and no duplicate, and the registry's events,
/// written to every shard, are delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_cursor_resumes_every_shard_with_no_hole_and_no_duplicate() {
    if skip_on_cluster("reads each shard's keys on a server of its own") {
        return;
    }
    let redis = TestRedis::start();
    let a = node(&redis).await;
    let queues = names_per_shard("eq");
    let mut ids = Vec::new();
    for round in 0..5 {
        for q in &queues {
            ids.push(submit(&a, q, json!({"payload": round})).await);
        }
    }
    // Paged over HTTP, 7 at a time, from the start.
    let mut since = "0".to_string();
    let mut paged = Vec::new();
    for _ in 0..20 {
        let p = a
            .api()
            .events_page(Some(&since), 7, Some("task.enqueued"))
            .await
            .unwrap();
        for e in &p.events {
            let id = &e.id;
            assert_eq!(id.split(',').count(), SHARDS as usize, "a cursor per shard: {id}");
            paged.push(e.subject("task").unwrap().to_string());
        }
        since = p.next.clone().unwrap();
        if p.events.is_empty() {
            break;
        }
    }
    let mut sorted = paged.clone();
    sorted.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(sorted, want, "every task's event once");

    // The node joined once, though every shard's stream says so.
    let joined = a.api().events_page(Some("0"), 100, Some("node.joined")).await.unwrap();
    let mine: Vec<&Event> = joined.events.iter().filter(|e| e.node == a.node_id.as_str()).collect();
    assert_eq!(mine.len(), 1, "{joined:?}");

    // A WebSocket resumed from the 7th event's id gets the rest, then the
    // new ones live, each once.
    let first = a.api().events_page(Some("0"), 7, Some("task.enqueued")).await.unwrap();
    let cursor = first.events[6].id.clone();
    let mut sub = ws(&a, &format!("topics=task.enqueued&since={cursor}")).await;
    let replayed = collect(&mut sub, ids.len() - 7, Duration::from_secs(10)).await;
    let mut more = Vec::new();
    for q in &queues {
        more.push(submit(&a, q, json!({"payload": "live"})).await);
    }
    let live = collect(&mut sub, more.len(), Duration::from_secs(10)).await;
    let got: Vec<String> = replayed.iter().chain(&live).map(task_of).collect();
    let first7: BTreeSet<String> = first
        .events
        .iter()
        .map(|e| e.subject("task").unwrap().to_string())
        .collect();
    let mut want: Vec<String> = ids.iter().filter(|id| !first7.contains(*id)).cloned().collect();
    want.extend(more);
    let mut got_sorted = got.clone();
    got_sorted.sort();
    want.sort();
    assert_eq!(got_sorted, want, "the rest and the new ones, each once");
    assert!(
        collect(&mut sub, 1, Duration::from_millis(500)).await.is_empty(),
        "nothing more"
    );
    // A cursor of the wrong length is refused, naming the form.
    let e = problem(a.api().events_page(Some("1-0,2-0"), 100, None).await);
    assert_eq!(e.status, 400, "{e:?}");
    assert!(e.detail.contains("one per shard"), "{e:?}");
}

/// G4 across shards: after a mixed workload every shard's keys return to
/// the baseline once retention passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shards_keys_return_to_baseline_after_retention() {
    if skip_on_cluster("counts the keys of a server of its own") {
        return;
    }
    let redis = TestRedis::start();
    let a = TestApp::start_with(&redis, |c| {
        c.redis.shards = SHARDS;
        c.tasks.retention_ms = 1000;
        c.tasks.dead_retention_ms = 1000;
        c.tasks.idempotency_window_ms = 1000;
    })
    .await;
    join(&a, "w").await;
    let queues = names_per_shard("kq");
    // Warm up: each shard's counters exist from its first task on.
    for q in &queues {
        let id = submit(&a, q, json!({})).await;
        let t = claim(&a, q, "w", 1, 0).await;
        let c = Complete {
            token: t[0].token,
            result: Value::Null,
            next: None,
        };
        let _ = a.api().complete(&id, &c).await;
    }
    let settled = wait_until(Duration::from_secs(10), || async {
        let keys: Vec<String> = redis.cmd(&["KEYS", "*"]).await;
        !keys.iter().any(|k| k.contains(":q:") || k.contains(":task:"))
    })
    .await;
    assert!(settled, "the warm-up tasks are gone");
    let baseline = redis.key_baseline().await;
    for (i, q) in queues.iter().enumerate() {
        for n in 0..20 {
            submit(&a, q, crate::tasks::mixed_task(i * 100 + n)).await;
        }
    }
    for q in &queues {
        loop {
            let got = claim(&a, q, "w", 50, 0).await;
            if got.is_empty() {
                break;
            }
            for (n, t) in got.iter().enumerate() {
                if n % 4 == 0 {
                    fail(&a, t).await;
                } else {
                    complete(&a, t).await;
                }
            }
        }
    }
    redis
        .assert_back_to_baseline(&baseline, Duration::from_secs(20), |_| false)
        .await;
}

/// A workflow lives in one shard with all its tasks, whatever their queues'
/// shards, so the hook that dispatches its successors runs in the same
/// script as each task's last transition; steps naming groups in two shards
/// are refused, naming them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_runs_in_one_shard_across_queues_of_every_shard() {
    if skip_on_cluster("reads each shard's keys on a server of its own") {
        return;
    }
    let redis = TestRedis::start();
    let a = node(&redis).await;
    join(&a, "w").await;
    let q = names_per_shard("wq");
    let steps = |v: Value| muster::client::NewWorkflow {
        tasks: serde_json::from_value::<Vec<WorkflowTaskSpec>>(v).unwrap(),
        ..Default::default()
    };
    let body = steps(json!([
        {"key": "a", "queue": q[0]},
        {"key": "b", "queue": q[1], "depends_on": ["a"]},
        {"key": "c", "queue": q[2], "depends_on": ["a"]},
        {"key": "d", "queue": q[3], "depends_on": ["b", "c"]}
    ]));
    let w = a.api().start_workflow(&body).await.unwrap();
    let wid = w.id;
    let home = map().home(&wid);
    let mut order = Vec::new();
    for _ in 0..3 {
        let mut round = Vec::new();
        for queue in &q {
            for t in claim(&a, queue, "w", 5, 0).await {
                assert_eq!(
                    shard_of_task(&redis, &t.id).await,
                    vec![home],
                    "in the workflow's shard"
                );
                round.push(t.payload.clone());
                complete(&a, &t).await;
                order.push(queue.clone());
            }
        }
        if order.len() == 4 {
            break;
        }
    }
    assert_eq!(order.len(), 4, "every step ran once: {order:?}");
    assert_eq!((&order[0], &order[3]), (&q[0], &q[3]), "in dependency order");
    let done = wait_until(Duration::from_secs(5), || async {
        a.get(&format!("/api/v1/workflows/{wid}")).await.1["state"] == "succeeded"
    })
    .await;
    assert!(done);
    let (_, list) = a.get("/api/v1/workflows").await;
    assert!(list.to_string().contains(&wid), "{list}");

    let g = names_per_shard("wg");
    let e = problem(
        a.api()
            .start_workflow(&steps(json!([
                {"key": "a", "queue": "x", "group": g[0]},
                {"key": "b", "queue": "x", "group": g[1]}
            ])))
            .await,
    );
    assert_eq!(e.status, 400, "{e:?}");
    let detail = &e.detail;
    assert!(detail.contains(&g[0]) && detail.contains(&g[1]), "{e:?}");
}

/// A schedule fires in the shard of its id; one whose task names a group
/// in another shard is refused with an id that fits, which then works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_with_a_group_lives_in_the_groups_shard() {
    if skip_on_cluster("reads each shard's keys on a server of its own") {
        return;
    }
    let redis = TestRedis::start();
    let a = node(&redis).await;
    join(&a, "w").await;
    let m = map();
    let group = "sg";
    let id = (0..)
        .map(|n| format!("s{n}"))
        .find(|i| m.home(i) != m.home(group))
        .unwrap();
    let body = json!({"expression": "0 0 1 1 *", "queue": "sq", "task": {"group": group}});
    let (s, e) = a.put(&format!("/api/v1/schedules/{id}"), body.clone()).await;
    assert_eq!(s, 400, "{e}");
    let detail = as_problem(s, &e).detail;
    let fit = detail
        .split('`')
        .find(|w| w.starts_with(&format!("{id}-")))
        .expect(&detail);
    assert_eq!(m.home(fit), m.home(group), "{detail}");
    let (s, b) = a.put(&format!("/api/v1/schedules/{fit}"), body).await;
    assert_eq!(s, 201, "{b}");
    let (s, t) = a.post(&format!("/api/v1/schedules/{fit}/trigger"), json!({})).await;
    assert_eq!(s, 201, "{t}");
    let task = t["task"].as_str().unwrap();
    assert_eq!(shard_of_task(&redis, task).await, vec![m.home(group)]);
    let got = claim(&a, "sq", "w", 1, 2000).await;
    assert_eq!(got.len(), 1, "claimed from the schedule's shard");
    assert_eq!(got[0].id, task);
    let (_, list) = a.get("/api/v1/schedules").await;
    assert!(list.to_string().contains(fit), "{list}");
}

/// Locks, elections and barriers live in the shards of their names: each
/// name's keys are in its shard alone, the listings merge every shard, and
/// the lease and deadline loops end leases and decide rounds in every shard
/// (nobody calls about them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_elections_and_barriers_live_in_the_shards_of_their_names() {
    if skip_on_cluster("reads each shard's keys on a server of its own") {
        return;
    }
    let redis = TestRedis::start();
    let a = node(&redis).await;
    let m = map();
    let names = names_per_shard("res");
    let parts = json!(["x", "y"]);
    for n in &names {
        let acq = Acquire {
            owner: "o".into(),
            ttl_ms: 400,
            wait_ms: 0,
            node: None,
        };
        a.api().acquire(n, &acq).await.unwrap();
        let (s, v) = a
            .post(
                &format!("/api/v1/elections/{n}/campaign"),
                json!({"candidate": "c", "ttl_ms": 60_000}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        let body = json!({"participants": parts, "max_missing": 0, "timeout_ms": 400});
        let (s, v) = a.put(&format!("/api/v1/barriers/{n}"), body).await;
        assert_eq!(s, 201, "{v}");
        let (s, v) = a
            .post(
                &format!("/api/v1/barriers/{n}/rounds/r1/arrive"),
                json!({"node": "x", "wait_ms": 0}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
    }
    // Each name's keys are in its own shard, and only there.
    for (home, n) in names.iter().enumerate() {
        for shard in 0..SHARDS as usize {
            for key in [format!("lock:{n}"), format!("election:{n}"), format!("barrier:{n}")] {
                let key = format!("{}:{key}", m.tag(shard));
                let exists: i64 = redis.cmd(&["EXISTS", &key]).await;
                assert_eq!(exists == 1, shard == home, "{key} (the home of {n} is shard {home})");
            }
        }
    }
    // The listings merge every shard.
    let listed = |v: &Value, field: &str, name: &str| -> BTreeSet<String> {
        v[field]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e[name].as_str().unwrap().to_string())
            .collect()
    };
    let all: BTreeSet<String> = names.iter().cloned().collect();
    let (_, v) = a.get("/api/v1/elections").await;
    assert_eq!(listed(&v, "elections", "name"), all, "{v}");
    let (_, v) = a.get("/api/v1/barriers").await;
    assert_eq!(listed(&v, "barriers", "name"), all, "{v}");
    let (_, v) = a.get("/api/v1/locks").await;
    assert_eq!(listed(&v, "locks", "name"), all, "{v}");
    // The loops: every lease lapses and every round is aborted at its
    // deadline (y never arrives), in every shard.
    let done = wait_until(Duration::from_secs(10), || async {
        let (_, locks) = a.get("/api/v1/locks").await;
        let mut decided = true;
        for n in &names {
            let (_, r) = a.get(&format!("/api/v1/barriers/{n}/rounds/r1")).await;
            decided &= r["verdict"] == "aborted";
        }
        decided && locks["locks"].as_array().unwrap().is_empty()
    })
    .await;
    assert!(done, "every shard's leases lapse and rounds are decided by the loops");
    // One lock.expired per lock, in the stream of the lock's own shard.
    for (home, n) in names.iter().enumerate() {
        let stream = format!("{}:events", m.tag(home));
        let rows: Vec<(String, Vec<(String, String)>)> = redis.cmd(&["XRANGE", &stream, "-", "+"]).await;
        let expired = rows
            .iter()
            .flat_map(|(id, f)| muster::testing::Event::from_entry(id.clone(), f.clone()))
            .filter(|ev| ev.kind == "lock.expired" && ev.subject("lock") == Some(n.as_str()))
            .count();
        assert_eq!(expired, 1, "lock.expired of {n} in shard {home}: {rows:?}");
    }
}

/// A worker dead in one shard only (its registration there lapsed, as when
/// its heartbeats cannot reach that shard's master): listed dead with that
/// shard in `shards_not_alive`, its `node.dead` delivered from that shard's
/// stream, and its task there recovered; alive in the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_dead_in_one_shard_only_is_dead_there_and_told() {
    if skip_on_cluster("reads each shard's keys on a server of its own") {
        return;
    }
    let redis = TestRedis::start();
    let a = node(&redis).await;
    let m = map();
    join(&a, "w1").await;
    let q = &names_per_shard("dq")[2];
    let id = submit(&a, q, json!({})).await;
    assert_eq!(claim(&a, q, "w1", 1, 0).await.len(), 1);
    // Its registration lapses in shard 2 alone.
    let lapsed: i64 = redis
        .cmd(&["ZADD", &format!("{}:nodes", m.tag(2)), "XX", "CH", "1", "w1"])
        .await;
    assert_eq!(lapsed, 1);
    let requeued = wait_until(Duration::from_secs(10), || async {
        let t = a.api().task(&id).await;
        t.is_ok_and(|t| t.state == "queued")
    })
    .await;
    assert!(requeued, "its task in shard 2 is recovered");
    let list = a.api().nodes().await.unwrap();
    let w1 = list.iter().find(|n| n.id == "w1").unwrap();
    assert_eq!(w1.state, "dead", "{w1:?}");
    assert_eq!(w1.shards_not_alive, vec![2], "{w1:?}");
    let one = a.api().node("w1").await.unwrap();
    assert_eq!(one.state, "dead", "{one:?}");
    assert_eq!(one.shards_not_alive, vec![2], "{one:?}");
    // Told from shard 2's stream (the registry's other events come from
    // shard 0's only).
    let told = wait_until(Duration::from_secs(10), || async {
        let page = a.api().events_page(Some("0"), 100, Some("node.dead")).await;
        page.is_ok_and(|p| p.events.iter().any(|e| e.node == "w1"))
    })
    .await;
    assert!(told, "node.dead of w1 is delivered");
    // Alive elsewhere: its claims in the other shards go on.
    let other = &names_per_shard("dq")[1];
    submit(&a, other, json!({})).await;
    assert_eq!(claim(&a, other, "w1", 1, 0).await.len(), 1);
}
