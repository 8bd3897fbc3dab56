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
            prefix: "{muster}".into(),
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
