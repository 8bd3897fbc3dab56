//! Every Lua script, assembled with its includes as the node sends it,
//! loads as a function library in a real Redis (FUNCTION LOAD), so a syntax
//! error, a bad include or a body over Lua's limits (60 upvalues) fails here
//! rather than on the first call in production.

use muster::store::script::LIBRARIES;
use muster::store::{Lua, ScriptCtx};

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
    use crate::tasks::{claim, submit};
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
    let tasks = claim(&app, "fl", "w", 10, 0).await;
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    let t = tasks.iter().find(|t| t["id"] == id.as_str()).unwrap();
    let (s, body) = app
        .post(&format!("/api/v1/tasks/{id}/complete"), json!({"token": t["token"]}))
        .await;
    assert_eq!(s, 200, "{body}");
    let (_, task) = app.get(&format!("/api/v1/tasks/{id}")).await;
    assert_eq!(task["state"], "succeeded", "{task}");
    let after: redis::Value = redis::cmd("FUNCTION").arg("LIST").query_async(&mut c).await.unwrap();
    assert!(loaded(after) > 0);
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
    use crate::tasks::{claim, submit};
    use serde_json::json;

    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let work = |app: TestApp| async move {
        let (s, _) = app.put("/api/v1/nodes/w/heartbeat", json!({"ttl_ms": 60_000})).await;
        assert_eq!(s, 200);
        let id = submit(&app, "q", json!({"group": "g", "alias": "same-alias"})).await;
        let t = claim(&app, "q", "w", 1, 0).await;
        let (s, body) = app
            .post(&format!("/api/v1/tasks/{id}/complete"), json!({"token": t[0]["token"]}))
            .await;
        assert_eq!(s, 200, "{body}");
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
