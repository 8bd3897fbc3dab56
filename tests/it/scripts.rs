//! Every Lua script, assembled with its includes as the node sends it,
//! loads as a function library in a real Redis (FUNCTION LOAD), so a syntax
//! error, a bad include or a body over Lua's limits (60 upvalues) fails here
//! rather than on the first call in production.

use muster::testing::LIBRARIES;
use std::time::{Duration, Instant};

use muster::testing::{Lua, ScriptCtx};

use crate::common::*;

#[tokio::test]
async fn every_script_compiles_in_redis() {
    let redis = TestRedis::start();
    let mut n = 0;
    // On a Redis Cluster the scripts' fencing checks which master runs them
    // (`fence_epoch` in the prelude): both variants load.
    for cluster in [false, true] {
        let ctx = ScriptCtx {
            events_max_len: 100_000,
            cluster,
        };
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for sub in std::fs::read_dir(&src).unwrap() {
            let Ok(files) = std::fs::read_dir(sub.unwrap().path().join("lua")) else {
                continue;
            };
            for f in files {
                let path = f.unwrap().path();
                let rel = path.strip_prefix(&src).unwrap().to_string_lossy().replace("/lua/", "/");
                let name = rel.trim_end_matches(".lua");
                let source = std::fs::read_to_string(&path).unwrap();
                // Libraries compile as part of the scripts that include them;
                // alone too (they only define functions).
                let lib = LIBRARIES.iter().any(|(l, _)| *l == name);
                let lua = if name == "store/prelude" {
                    continue;
                } else if lib {
                    Lua::load("lib", &format!("--@include {name}\nreturn 1"), &ctx)
                } else {
                    Lua::load("script", &source, &ctx)
                };
                let mut c = redis.conn().await;
                let loaded: Result<String, _> = redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg(lua.library())
                    .query_async(&mut c)
                    .await;
                assert_eq!(
                    loaded.as_deref().ok(),
                    Some(lua.function()),
                    "{name} does not load: {loaded:?}"
                );
                n += 1;
            }
        }
    }
    assert!(n > 90, "{n} scripts");
}

/// A Redis that lost the functions (a restart without persistence, a
/// failover to a replica that missed the load, `FUNCTION FLUSH`) gets them
/// again on the next call, and that call runs once: a submit after the
/// flush creates exactly one task, and the task runs to completion.
#[tokio::test]
async fn a_call_after_the_functions_are_flushed_loads_them_and_runs_once() {
    use crate::tasks::submit;
    use serde_json::json;

    let redis = TestRedis::start();
    let app = TestApp::start(&redis).await;
    let (s, _) = app.put("/api/v1/nodes/w/heartbeat", json!({"ttl_ms": 60_000})).await;
    assert_eq!(s, 200);
    submit(&app, "fl", json!({})).await;
    let mut c = redis.conn().await;
    let loaded = |list: redis::Value| format!("{list:?}").matches("library_name").count();
    let before: redis::Value = redis::cmd("FUNCTION").arg("LIST").query_async(&mut c).await.unwrap();
    assert!(loaded(before) > 0, "the node loaded no function library");
    let () = redis::cmd("FUNCTION").arg("FLUSH").query_async(&mut c).await.unwrap();

    let id = submit(&app, "fl", json!({"payload": {"after": "flush"}})).await;
    let tasks = crate::sharding::claim(&app, "fl", "w", 10, 0).await;
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    let t = tasks.iter().find(|t| t.id == id).unwrap();
    crate::sharding::complete(&app, t).await;
    let task = app.api().task(&id).await.unwrap();
    assert_eq!(task.state, "succeeded", "{task:?}");
    // On the shared Cluster the sibling tests below flush functions too, and
    // the master this reads may be flushed again between the node's reload
    // and the read: the node's loops call every shard every 200 ms, so the
    // library is back within a few of their rounds.
    let back = wait_until(Duration::from_secs(5), || {
        let mut c = c.clone();
        async move {
            let after: redis::Value = redis::cmd("FUNCTION").arg("LIST").query_async(&mut c).await.unwrap();
            loaded(after) > 0
        }
    })
    .await;
    assert!(back, "no function library is loaded 5 s after the calls");
}

/// Scripts take their namespace from their first key (`P` in the prelude),
/// so one library per script serves every namespace on a server (and, for
/// a sharded namespace, every shard): two namespaces side by side load no
/// library twice, and each one's calls touch only its own keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_on_one_server_share_each_library_and_keep_to_their_keys() {
    if skip_on_cluster("counts every function library on the server; other tests load theirs on the shared cluster") {
        return;
    }
    use crate::tasks::submit;
    use serde_json::json;

    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let work = |app: TestApp| async move {
        let (s, _) = app.put("/api/v1/nodes/w/heartbeat", json!({"ttl_ms": 60_000})).await;
        assert_eq!(s, 200);
        let id = submit(&app, "q", json!({"group": "g", "alias": "same-alias"})).await;
        let t = crate::sharding::claim(&app, "q", "w", 1, 0).await;
        assert_eq!(t[0].id, id);
        crate::sharding::complete(&app, &t[0]).await;
        app
    };
    let a = work(TestApp::start_with(&redis, |c| c.redis.key_prefix = "alpha".into()).await).await;
    let b = work(TestApp::start_with(&redis, |c| c.redis.key_prefix = "beta".into()).await).await;
    // Libraries are named `<script>_<hash of the text>`: one per script.
    let list: Vec<Vec<redis::Value>> = redis::cmd("FUNCTION").arg("LIST").query_async(&mut c).await.unwrap();
    let mut names: Vec<String> = list
        .iter()
        .map(|lib| match &lib[1] {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("library_name: {other:?}"),
        })
        .collect();
    names.sort();
    let scripts: std::collections::BTreeSet<&str> = names.iter().map(|n| n.rsplit_once('_').unwrap().0).collect();
    assert!(scripts.len() > 5, "{names:?}");
    assert_eq!(names.len(), scripts.len(), "a script loaded twice: {names:?}");
    // The same alias in both: each namespace's alias key is its own.
    let keys = redis.keys().await;
    let outside: Vec<&String> = keys
        .iter()
        .filter(|k| {
            !["alpha", "beta"].iter().any(|p| {
                k.starts_with(&format!("{{{p}}}:")) || shard_tags(p).iter().any(|t| k.starts_with(&format!("{t}:")))
            })
        })
        .collect();
    assert!(outside.is_empty(), "{outside:?}");
    for p in ["alpha", "beta"] {
        // When split: the layout stays under {p}, the alias is in its task's
        // shard (group g's), the others in one shard or every shard.
        let alias = format!("{}:alias:same-alias", name_tag(p, "g"));
        assert!(keys.contains(&alias), "{alias} in {keys:?}");
        assert!(keys.contains(&format!("{{{p}}}:layout")), "{{{p}}}:layout in {keys:?}");
        for suffix in [":nodes", ":events", ":fence"] {
            let found = shard_tags(p).iter().any(|t| keys.contains(&format!("{t}{suffix}")));
            assert!(found, "{p}'s {suffix} in {keys:?}");
        }
    }
    drop((a, b));
}

/// A connection to a real server that runs `FUNCTION FLUSH` right after the
/// first `FUNCTION LOAD` it passes on: the race of a flush between a
/// script's reload and its second call, made certain.
struct FlushAfterLoad {
    inner: redis::aio::MultiplexedConnection,
    flushed: bool,
}

impl redis::aio::ConnectionLike for FlushAfterLoad {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(async move {
            let words: Vec<Vec<u8>> = cmd
                .args_iter()
                .take(2)
                .filter_map(|a| match a {
                    redis::Arg::Simple(b) => Some(b.to_ascii_uppercase()),
                    _ => None,
                })
                .collect();
            let load = words.len() == 2 && words[0] == b"FUNCTION" && words[1] == b"LOAD";
            let answer = self.inner.req_packed_command(cmd).await?;
            if load && !self.flushed {
                self.flushed = true;
                let () = redis::cmd("FUNCTION").arg("FLUSH").query_async(&mut self.inner).await?;
            }
            Ok(answer)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// A function that is missing again on the call after its reload (a
/// `FUNCTION FLUSH` ran between the load and the call) ran nowhere: the
/// error is one the store calls unavailable (the client gets 503 and may
/// retry), not a server error (500). The next call loads it and runs once.
#[tokio::test]
async fn a_function_flushed_again_right_after_its_reload_is_unavailable_and_ran_nowhere() {
    if skip_on_cluster("flushes the server's functions, which every test on the shared cluster uses") {
        return;
    }
    use muster::testing::{StoreError, classify};

    let redis = TestRedis::start();
    let ctx = ScriptCtx {
        events_max_len: 100,
        cluster: false,
    };
    let lua = Lua::load("flush_race", "return redis.call('INCR', KEYS[1])", &ctx);
    let keys = vec!["{race}:n".to_string()];
    let args = vec![i64::MAX.to_string()]; // the deadline, far ahead
    let mut conn = FlushAfterLoad {
        inner: redis.client().get_multiplexed_async_connection().await.unwrap(),
        flushed: false,
    };
    let err = lua.call::<i64, _>(&mut conn, &keys, &args).await.unwrap_err();
    assert!(conn.flushed, "the call never loaded the library");
    match classify(&err) {
        StoreError::Unavailable(m) => assert!(m.contains("nothing ran"), "{m}"),
        other => panic!("a function missing after its reload is {other:?}, not unavailable ({err:?})"),
    }
    let n: Option<i64> = redis.cmd(&["GET", "{race}:n"]).await;
    assert_eq!(n, None, "the script ran");
    // Nothing in the way: it loads and runs, once.
    assert_eq!(lua.call::<i64, _>(&mut conn, &keys, &args).await.unwrap(), 1);
}

/// Calls retried on 503 as a client would (the same body, so a submit keeps
/// its idempotency key); every status seen is counted.
async fn until_not_503(
    app: &TestApp,
    statuses: &std::sync::Mutex<std::collections::BTreeMap<u16, u64>>,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    loop {
        let (s, b) = app.post(path, body.clone()).await;
        *statuses.lock().unwrap().entry(s).or_default() += 1;
        if s != 503 {
            return (s, b);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `FUNCTION FLUSH` every 200 ms while six loops submit, claim and complete:
/// no answer is a 5xx other than 503 (a call that found its function gone
/// twice ran nowhere and may be retried), and nothing is stranded: every
/// task submitted ends succeeded, none is left running or queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flushes_under_load_answer_at_worst_503_and_strand_nothing() {
    if skip_on_cluster("flushes the server's functions, which every test on the shared cluster uses") {
        return;
    }
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use muster::client::{NextTasks, Submitted};
    use serde_json::json;

    let redis = TestRedis::start();
    let app = Arc::new(TestApp::start(&redis).await);
    let statuses: Arc<Mutex<BTreeMap<u16, u64>>> = Arc::default();
    let q = "flushed";
    let run_for = Duration::from_secs(5);
    let started = Instant::now();

    let flusher = {
        let mut c = redis.client().get_multiplexed_async_connection().await.unwrap();
        tokio::spawn(async move {
            let mut flushes = 0u32;
            while started.elapsed() < run_for {
                let () = redis::cmd("FUNCTION").arg("FLUSH").query_async(&mut c).await.unwrap();
                flushes += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            flushes
        })
    };
    let loops: Vec<_> = (0..6)
        .map(|w| {
            let (app, statuses) = (app.clone(), statuses.clone());
            tokio::spawn(async move {
                let node = format!("w{w}");
                let beat = json!({"ttl_ms": 60_000});
                loop {
                    let (s, _) = app.put(&format!("/api/v1/nodes/{node}/heartbeat"), beat.clone()).await;
                    if s == 200 {
                        break;
                    }
                    assert_eq!(s, 503, "heartbeat");
                }
                let mut ids = Vec::new();
                let mut n = 0;
                while started.elapsed() < run_for {
                    n += 1;
                    let body = json!({"payload": {"w": w, "n": n}, "idempotency_key": format!("w{w}-{n}")});
                    let (s, b) = until_not_503(&app, &statuses, &format!("/api/v1/queues/{q}/tasks"), body).await;
                    assert!(s == 201 || s == 200, "submit: {s} {b}");
                    ids.push(serde_json::from_value::<Submitted>(b).unwrap().id);
                    let claim = json!({"node": node, "max": 1, "wait_ms": 0});
                    let (s, b) = until_not_503(&app, &statuses, &format!("/api/v1/queues/{q}/claim"), claim).await;
                    assert!(s == 200 || s == 204, "claim: {s} {b}");
                    let tasks = serde_json::from_value::<NextTasks>(b).map(|b| b.tasks);
                    for t in tasks.unwrap_or_default() {
                        let id = &t.id;
                        let done = json!({"token": t.token, "result": {"by": w}});
                        let (s, b) =
                            until_not_503(&app, &statuses, &format!("/api/v1/tasks/{id}/complete"), done).await;
                        assert_eq!(s, 200, "complete: {b}");
                    }
                }
                ids
            })
        })
        .collect();
    let mut ids = Vec::new();
    for l in loops {
        ids.extend(l.await.unwrap());
    }
    let flushes = flusher.await.unwrap();
    // What the loops left queued (claims that answered 204 or 503) is
    // worked off now, with the functions in place.
    loop {
        let tasks = crate::sharding::claim(&app, q, "w0", 100, 0).await;
        if tasks.is_empty() {
            break;
        }
        for t in &tasks {
            crate::sharding::complete(&app, t).await;
        }
    }
    let statuses = statuses.lock().unwrap().clone();
    eprintln!("{} tasks, {flushes} flushes, answers {statuses:?}", ids.len());
    assert!(flushes >= 20, "{flushes} flushes");
    let bad: Vec<_> = statuses.keys().filter(|s| **s >= 500 && **s != 503).collect();
    assert!(bad.is_empty(), "5xx other than 503: {statuses:?}");
    for id in &ids {
        let t = app.api().task(id).await.unwrap();
        assert_eq!(t.state, "succeeded", "{t:?}");
    }
    let queue = app.api().queue(q).await.unwrap().stats;
    assert_eq!(queue.running, 0, "{queue:?}");
    assert_eq!(queue.queued, 0, "{queue:?}");
}

/// The names `FUNCTION LIST` shows.
async fn library_names(redis: &TestRedis) -> std::collections::BTreeSet<String> {
    let mut c = redis.client().get_multiplexed_async_connection().await.unwrap();
    let list: Vec<Vec<redis::Value>> = redis::cmd("FUNCTION").arg("LIST").query_async(&mut c).await.unwrap();
    list.iter()
        .map(|lib| match &lib[1] {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("library_name: {other:?}"),
        })
        .collect()
}

/// One task through a node: its submit, claim and complete libraries load.
async fn one_task(app: &TestApp) {
    use serde_json::json;
    let (s, _) = app.put("/api/v1/nodes/w/heartbeat", json!({"ttl_ms": 60_000})).await;
    assert_eq!(s, 200);
    let id = crate::tasks::submit(app, "fn-sweep", json!({})).await;
    let t = crate::sharding::claim(app, "fn-sweep", "w", 1, 0).await;
    assert_eq!(t[0].id, id);
    crate::sharding::complete(app, &t[0]).await;
}

/// A node restarted ten times, each time with another `events.max_len`
/// (which is written into every library's text, so each start loads about
/// 60 libraries of its own), beside a node that stays up: afterwards
/// `FUNCTION LIST` holds no library but those of the two live nodes, and
/// none of the live node's libraries was deleted meanwhile (it ran no task
/// since, so a library of its tasks deleted would still be missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libraries_no_live_node_uses_are_deleted_and_those_in_use_are_kept() {
    if skip_on_cluster("reads every function library on the server; other tests load theirs on the shared cluster") {
        return;
    }
    let ctx = |max_len| ScriptCtx {
        events_max_len: max_len,
        cluster: false,
    };
    let redis = TestRedis::start();
    // Lengths no other test uses, so the libraries are this test's own.
    let live = TestApp::start_with(&redis, |c| c.events.max_len = 31_000).await;
    one_task(&live).await;
    let live_names: std::collections::BTreeSet<String> = ctx(31_000).libraries().into_iter().collect();
    let live_loaded: Vec<String> = library_names(&redis)
        .await
        .into_iter()
        .filter(|n| live_names.contains(n))
        .collect();
    assert!(
        live_loaded.iter().any(|n| n.starts_with("task_enqueue_")),
        "{live_loaded:?}"
    );

    let mut all_loaded = std::collections::BTreeSet::new();
    for i in 0..10u64 {
        let mut node = TestApp::start_with(&redis, |c| c.events.max_len = 32_000 + i).await;
        one_task(&node).await;
        all_loaded.extend(library_names(&redis).await);
        if i < 9 {
            node.shutdown().await;
        } else {
            let in_use: std::collections::BTreeSet<String> = live_names
                .union(&ctx(32_009).libraries().into_iter().collect())
                .cloned()
                .collect();
            let only_in_use = wait_until(Duration::from_secs(30), || async {
                library_names(&redis).await.is_subset(&in_use)
            })
            .await;
            let left: Vec<String> = library_names(&redis).await.difference(&in_use).cloned().collect();
            assert!(
                only_in_use,
                "{} libraries no live node uses are left, such as {:?}",
                left.len(),
                &left[..left.len().min(10)]
            );
            let listed = library_names(&redis).await;
            let deleted: Vec<&String> = live_loaded.iter().filter(|n| !listed.contains(*n)).collect();
            assert!(
                deleted.is_empty(),
                "libraries of the live node were deleted: {deleted:?}"
            );
            eprintln!(
                "{} libraries loaded over the restarts, {} left ({} of the live node)",
                all_loaded.len(),
                listed.len(),
                listed.intersection(&live_names).count()
            );
            drop(node);
        }
    }
    drop(live);
}

/// A call's events reach the stream when it ends (`events_flush`), in
/// entries of up to eight: also when the call fails halfway, since what it
/// changed before the error stays (Redis has no rollback) and its events
/// must say so (G9). Each event has a stream id of its own.
#[tokio::test]
async fn a_calls_events_are_written_when_it_ends_even_when_it_fails() {
    if skip_on_cluster("calls one server's functions on a plain connection") {
        return;
    }
    let redis = TestRedis::start();
    let ctx = ScriptCtx {
        events_max_len: 1000,
        cluster: false,
    };
    let source = "for i = 1, 20 do redis.call('INCR', KEYS[1]); emit('x.y', 'n', '{\"i\":' .. i .. '}') end\n\
                  if ARGV[1] == 'fail' then error('halfway') end\n\
                  if ARGV[1] == 'wrongtype' then redis.call('LPUSH', KEYS[1], 'x') end\nreturn 1";
    let lua = Lua::load("flush_on_error", source, &ctx);
    let keys = vec!["{flush}:n".to_string()];
    let mut conn = redis.client().get_multiplexed_async_connection().await.unwrap();
    let far = i64::MAX.to_string(); // the deadline
    let ok: i64 = lua
        .call(&mut conn, &keys, &["ok".to_string(), far.clone()])
        .await
        .unwrap();
    assert_eq!(ok, 1);
    let err = lua
        .call::<i64, _>(&mut conn, &keys, &["fail".to_string(), far])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("halfway"), "the script's own error: {err}");
    // A command's error reaches the caller as it was (not as a script error).
    let far = i64::MAX.to_string();
    let err = lua
        .call::<i64, _>(&mut conn, &keys, &["wrongtype".to_string(), far])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("WRONGTYPE"), "{err:?}");
    let n: i64 = redis.cmd(&["GET", "{flush}:n"]).await;
    assert_eq!(n, 60, "the three calls changed the key");
    let rows: Vec<(String, Vec<(String, String)>)> = redis.cmd(&["XRANGE", "{flush}:events", "-", "+"]).await;
    assert_eq!(
        rows.len(),
        3 * 4,
        "1 + 19 events in entries of up to 8, per call: {rows:?}"
    );
    let events: Vec<_> = rows
        .into_iter()
        .flat_map(|(id, f)| muster::testing::Event::from_entry(id, f))
        .collect();
    let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
    let want: Vec<String> = (1..=20).cycle().take(60).map(|i| format!("{{\"i\":{i}}}")).collect();
    assert_eq!(data, want, "every event of the three calls, in order");
    let ids: Vec<_> = events.iter().map(|e| e.sid.unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids grow event by event: {ids:?}");
}
