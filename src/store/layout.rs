//! The namespace's layout over hash slots, recorded in `{prefix}:layout` and
//! checked by every node at start (`lua/layout.lua`).
//!
//! A namespace is one hash tag, `{prefix}`, or split over `redis.shards`
//! tags (`docs/sharding.md`). A namespace split one way would be read by a
//! node configured another way as partly empty, without a single error; so
//! the first node records the layout under `{prefix}` (whatever the split),
//! and a node whose layout differs refuses to start, saying what the
//! namespace holds and what to do.

use redis::{FromRedisValue, ParsingError, Value};

use super::reply::{Reader, decode_error};
use super::{Code, Keys, Lua, ScriptCall, ScriptCtx, Store, StoreError};

/// Hash: the namespace's layout (`shards`, `placement`, `since_ms`).
pub(crate) fn layout_key(k: &Keys) -> String {
    format!("{}:layout", k.prefix())
}

pub(crate) struct Layout<'a> {
    pub shards: u32,
    pub placement: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LayoutReply {
    /// Whether the namespace has the caller's layout.
    pub matches: bool,
    /// The namespace's layout.
    pub shards: u32,
    pub placement: String,
}

impl ScriptCall for Layout<'_> {
    type Reply = LayoutReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        let p = k.prefix();
        vec![layout_key(k), format!("{p}:queues"), k.nodes(), format!("{p}:seq")]
    }
    fn args(&self) -> Vec<String> {
        vec![self.shards.to_string(), self.placement.to_string()]
    }
}

impl FromRedisValue for LayoutReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let mut r = Reader::new(&v);
        let matches = match r.code()? {
            Ok(0) => true,
            Err(Code::WrongState) => false,
            other => return Err(decode_error(format!("layout: unexpected code {other:?}"))),
        };
        let shards = r.int("shards")?;
        let placement = r.text("placement")?;
        if shards < 1 || placement.is_empty() || r.remaining() > 0 {
            return Err(decode_error(format!(
                "layout: shards {shards}, placement {placement:?}"
            )));
        }
        Ok(LayoutReply {
            matches,
            shards: shards as u32,
            placement,
        })
    }
}

/// Records the node's layout (`redis.shards`) on a new namespace, or checks
/// it against the recorded one. Errs with the message a refused start
/// prints.
pub(crate) async fn check(store: &Store, ctx: &ScriptCtx) -> Result<(), String> {
    let lua = Lua::load("layout", include_str!("lua/layout.lua"), ctx);
    let store = store.root();
    let map = store.shards();
    let call = Layout {
        shards: map.len() as u32,
        placement: map.placement(),
    };
    let reply = store
        .run(&lua, &call)
        .await
        .map_err(|e: StoreError| format!("cannot read the namespace's layout ({}): {e}", layout_key(store.keys())))?;
    if reply.matches {
        return record_masters(&store, ctx).await;
    }
    Err(format!(
        "the namespace {} is split into {} shard(s) (placement `{}`, recorded in {}), but this node has \
         redis.shards = {}: it would see only part of the data and the rest would go unserved. \
         Set redis.shards to the recorded count, or use another redis.key_prefix; changing the number \
         of shards of a namespace that holds data is not supported (docs/sharding.md)",
        store.keys().prefix(),
        reply.shards,
        reply.placement,
        layout_key(store.keys()),
        map.len(),
    ))
}

/// `fence.lua`: records a shard's master (Cluster mode).
pub(crate) struct Fence;

impl ScriptCall for Fence {
    type Reply = i64;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![format!("{}:epoch:master", k.prefix())]
    }
    fn args(&self) -> Vec<String> {
        Vec::new()
    }
}

/// On a Redis Cluster, records the master of every shard of a split
/// namespace (one shard: done by the layout script), so that a failover
/// before a shard's first token call raises its epoch too.
async fn record_masters(store: &Store, ctx: &ScriptCtx) -> Result<(), String> {
    let n = store.shards().len();
    if !ctx.cluster || n == 1 {
        return Ok(());
    }
    let lua = Lua::load("fence", include_str!("lua/fence.lua"), ctx);
    for i in 0..n {
        let s = store.shard(i);
        s.run(&lua, &Fence)
            .await
            .map_err(|e| format!("cannot record the master of shard {i} ({}): {e}", s.keys().prefix()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::reply::testing::{arr, check, int, s};

    #[test]
    fn the_fence_call_matches_its_header() {
        check(&Fence, include_str!("lua/fence.lua"));
    }

    #[test]
    fn the_call_matches_the_header() {
        check(
            &Layout {
                shards: 1,
                placement: "single",
            },
            include_str!("lua/layout.lua"),
        );
    }

    #[test]
    fn the_reply_decodes_strictly() {
        let d = |v| LayoutReply::from_redis_value(v);
        let ok = d(arr(vec![int(0), s("1"), s("single")])).unwrap();
        assert!(ok.matches && ok.shards == 1 && ok.placement == "single");
        let no = d(arr(vec![int(Code::WrongState as i64), s("12"), s("fnv1a32")])).unwrap();
        assert!(!no.matches && no.shards == 12 && no.placement == "fnv1a32");
        assert!(d(arr(vec![int(Code::NotFound as i64), s("1"), s("single")])).is_err());
        assert!(d(arr(vec![int(0), s("0"), s("single")])).is_err());
        assert!(d(arr(vec![int(0), s("1"), s("")])).is_err());
        assert!(d(arr(vec![int(0), s("1")])).is_err());
        assert!(d(arr(vec![int(0), s("1"), s("single"), s("x")])).is_err());
    }
}
