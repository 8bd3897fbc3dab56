//! Every Lua script, assembled with its includes as the node sends it,
//! compiles in a real Redis (SCRIPT LOAD), so a syntax error or a bad
//! include fails here rather than on the first call in production.

use muster::store::ScriptCtx;
use muster::store::script::{LIBRARIES, assemble};

use crate::common::*;

#[tokio::test]
async fn every_script_compiles_in_redis() {
    let redis = TestRedis::start();
    let ctx = ScriptCtx {
        prefix: "{muster}".into(),
        events_max_len: 100_000,
    };
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut n = 0;
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
            let code = if name == "store/prelude" {
                continue;
            } else if lib {
                assemble(name, &format!("--@include {name}\nreturn 1"), &ctx).unwrap()
            } else {
                assemble(name, &source, &ctx).unwrap()
            };
            let mut c = redis.conn().await;
            let loaded: Result<String, _> = redis::cmd("SCRIPT").arg("LOAD").arg(&code).query_async(&mut c).await;
            assert!(loaded.is_ok(), "{name} does not compile: {loaded:?}");
            n += 1;
        }
    }
    assert!(n > 45, "{n} scripts");
}
