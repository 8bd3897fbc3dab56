//! The node registry scripts: one argument struct and one reply type per
//! script, each mirroring the header of its `lua/*.lua` file (keys and
//! arguments in the documented order; replies decoded strictly, codes by
//! name). `lua/liveness.lua` is a library the other subsystems include, not a
//! script of its own.

use redis::{FromRedisValue, ParsingError, Value};

use super::{NodeKind, Prune as PruneResult};
use crate::store::reply::{decode_error, read};
use crate::store::{Code, Keys, Lua, ScriptCall, ScriptCtx};

/// Every node registry script, loaded once per node.
pub(crate) struct Scripts {
    pub heartbeat: Lua,
    pub prune: Lua,
    pub drain: Lua,
    pub leave: Lua,
}

impl Scripts {
    pub(super) fn new(ctx: &ScriptCtx) -> Scripts {
        let l = |name, src| Lua::load(name, src, ctx);
        Scripts {
            heartbeat: l("node_heartbeat", include_str!("lua/heartbeat.lua")),
            prune: l("node_prune", include_str!("lua/prune.lua")),
            drain: l("node_drain", include_str!("lua/drain.lua")),
            leave: l("node_leave", include_str!("lua/leave.lua")),
        }
    }
}

// --- heartbeat.lua ------------------------------------------------------------

pub(crate) struct Heartbeat<'a> {
    pub id: &'a str,
    pub kind: NodeKind,
    /// The lifetime of this heartbeat.
    pub ttl_ms: u64,
    /// The TTL of the info hash (ttl + dead retention).
    pub info_ttl_ms: u64,
    /// `nodes.max_nodes`: a new node beyond this many registered is refused.
    pub max_nodes: u32,
    /// Address or URL, may be empty.
    pub addr: &'a str,
    /// May be empty.
    pub version: &'a str,
    /// A JSON object.
    pub labels: &'a str,
    /// A worker's credential (token name); empty for a muster node's own.
    pub owner: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeartbeatOutcome {
    /// New, or back after leaving or being marked dead.
    Joined,
    Refreshed,
    /// `nodes.max_nodes` registered already: nothing written.
    TooMany,
    /// A worker heartbeat for a muster node's id: nothing written.
    MusterNode,
    /// A live worker registered by another credential: nothing written.
    OtherOwner,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeartbeatReply {
    pub outcome: HeartbeatOutcome,
    /// Redis time as the script read it (ms), whatever the outcome: a clock
    /// sample for the node.
    pub now: i64,
    /// Redis ms at which this heartbeat expires (0 when refused).
    pub expires_at: i64,
    /// `active` or `draining` ('' when refused).
    pub state: String,
}

impl ScriptCall for Heartbeat<'_> {
    type Reply = HeartbeatReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![k.nodes(), k.node(self.id)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.id.to_string(),
            self.ttl_ms.to_string(),
            self.info_ttl_ms.to_string(),
            self.max_nodes.to_string(),
            self.kind.as_str().to_string(),
            self.addr.to_string(),
            self.version.to_string(),
            self.labels.to_string(),
            self.owner.to_string(),
        ]
    }
}

impl FromRedisValue for HeartbeatReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let (now, expires_at, state) = (r.int("now_ms")?, r.int("expires_ms")?, r.text("state")?);
            let outcome = match code {
                Ok(1) => HeartbeatOutcome::Joined,
                Ok(0) => HeartbeatOutcome::Refreshed,
                Err(Code::TooMany) => HeartbeatOutcome::TooMany,
                Err(Code::WrongState) => HeartbeatOutcome::MusterNode,
                Err(Code::NotOwner) => HeartbeatOutcome::OtherOwner,
                other => return Err(decode_error(format!("heartbeat outcome {other:?}"))),
            };
            Ok(HeartbeatReply {
                outcome,
                now,
                expires_at,
                state,
            })
        })
    }
}

// --- prune.lua ----------------------------------------------------------------

pub(crate) struct Prune {
    /// The cluster's node ttl (sets the liveness pass cadence).
    pub ttl_ms: u64,
    pub dead_retention_ms: u64,
    /// At most this many expired nodes handled per pass.
    pub limit: u32,
}

impl ScriptCall for Prune {
    type Reply = PruneResult;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![k.nodes()]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.ttl_ms.to_string(),
            self.dead_retention_ms.to_string(),
            self.limit.to_string(),
        ]
    }
}

impl FromRedisValue for PruneResult {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(PruneResult {
                marked: r.int("marked")?,
                removed: r.int("removed")?,
                alive: r.int("alive")?,
                expired: r.int("expired")?,
                grace_until: r.int("grace_until_ms")?,
            })
        })
    }
}

// --- drain.lua ----------------------------------------------------------------

pub(crate) struct Drain<'a> {
    pub id: &'a str,
    /// Who asked (a node id or token name), for the event.
    pub actor: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainReply {
    Marked,
    AlreadyDraining,
    /// No such live node.
    NotAlive,
}

impl ScriptCall for Drain<'_> {
    type Reply = DrainReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![k.nodes(), k.node(self.id)]
    }
    fn args(&self) -> Vec<String> {
        vec![self.id.to_string(), self.actor.to_string()]
    }
}

impl FromRedisValue for DrainReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(match r.code()? {
                Ok(1) => DrainReply::Marked,
                Ok(2) => DrainReply::AlreadyDraining,
                Err(Code::NodeNotAlive) => DrainReply::NotAlive,
                other => return Err(decode_error(format!("drain outcome {other:?}"))),
            })
        })
    }
}

// --- leave.lua ----------------------------------------------------------------

pub(crate) struct Leave<'a> {
    pub id: &'a str,
    /// "left" (the node itself) or "removed" (an admin).
    pub reason: &'a str,
    /// Only a registration of this kind (`Some(Worker)`), or any.
    pub only: Option<NodeKind>,
    /// With `only`: the credential that asks (a worker registered by
    /// another one is refused).
    pub owner: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaveReply {
    /// Left and forgotten.
    Removed,
    /// Left, kept (dead) until the orphan cleaner recovers its tasks.
    Kept,
    NotFound,
    /// Not of the kind the call required.
    OtherKind,
    /// A worker registered by another credential.
    OtherOwner,
}

impl ScriptCall for Leave<'_> {
    type Reply = LeaveReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![k.nodes(), k.node(self.id), k.node_tasks(self.id)]
    }
    fn args(&self) -> Vec<String> {
        let only = match self.only {
            None => "",
            Some(NodeKind::Worker) => "worker",
            Some(NodeKind::Node) => "node",
        };
        vec![
            self.id.to_string(),
            self.reason.to_string(),
            only.to_string(),
            self.owner.to_string(),
        ]
    }
}

impl FromRedisValue for LeaveReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(match r.code()? {
                Ok(1) => LeaveReply::Removed,
                Ok(2) => LeaveReply::Kept,
                Err(Code::NotFound) => LeaveReply::NotFound,
                Err(Code::WrongState) => LeaveReply::OtherKind,
                Err(Code::NotOwner) => LeaveReply::OtherOwner,
                other => return Err(decode_error(format!("leave outcome {other:?}"))),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::reply::testing::{arr, check, int, s};

    #[test]
    fn every_call_passes_what_its_header_documents() {
        check(
            &Heartbeat {
                id: "n1",
                kind: NodeKind::Worker,
                ttl_ms: 10_000,
                info_ttl_ms: 70_000,
                max_nodes: 100,
                addr: "",
                version: "",
                labels: "{}",
                owner: "w",
            },
            include_str!("lua/heartbeat.lua"),
        );
        check(
            &Prune {
                ttl_ms: 10_000,
                dead_retention_ms: 60_000,
                limit: 100,
            },
            include_str!("lua/prune.lua"),
        );
        check(&Drain { id: "n1", actor: "a" }, include_str!("lua/drain.lua"));
        check(
            &Leave {
                id: "n1",
                reason: "left",
                only: Some(NodeKind::Worker),
                owner: "w",
            },
            include_str!("lua/leave.lua"),
        );
    }

    #[test]
    fn keys_are_the_registry_s() {
        let k = Keys::new("muster");
        let leave = Leave {
            id: "n1",
            reason: "removed",
            only: None,
            owner: "",
        };
        assert_eq!(leave.keys(&k), vec![k.nodes(), k.node("n1"), k.node_tasks("n1")]);
        let hb = Heartbeat {
            id: "n1",
            kind: NodeKind::Worker,
            ttl_ms: 1,
            info_ttl_ms: 2,
            max_nodes: 3,
            addr: "a",
            version: "v",
            labels: "{}",
            owner: "w",
        };
        assert_eq!(hb.keys(&k), vec![k.nodes(), k.node("n1")]);
        assert_eq!(hb.args()[4], "worker");
    }

    #[test]
    fn scripts_return_no_bare_negative_or_zero_failure_codes() {
        for src in [
            include_str!("lua/heartbeat.lua"),
            include_str!("lua/prune.lua"),
            include_str!("lua/drain.lua"),
            include_str!("lua/leave.lua"),
        ] {
            for l in src.lines().filter(|l| l.contains("return")) {
                let after = &l[l.find("return").unwrap()..];
                assert!(!after.starts_with("return -") && !after.starts_with("return {-"), "{l}");
            }
        }
        for src in [include_str!("lua/drain.lua"), include_str!("lua/leave.lua")] {
            assert!(!src.lines().any(|l| l.trim() == "return 0"), "{src}");
        }
    }

    #[test]
    fn replies_decode_by_code_name_and_strictly() {
        let h = |v| HeartbeatReply::from_redis_value(v);
        assert_eq!(
            h(arr(vec![int(1), int(1000), int(11_000), s("active")])).unwrap(),
            HeartbeatReply {
                outcome: HeartbeatOutcome::Joined,
                now: 1000,
                expires_at: 11_000,
                state: "active".into()
            }
        );
        let r = h(arr(vec![int(0), int(1000), int(11_000), s("draining")])).unwrap();
        assert_eq!((r.outcome, r.state.as_str()), (HeartbeatOutcome::Refreshed, "draining"));
        let r = h(arr(vec![int(Code::TooMany as i64), int(1000), int(0), s("")])).unwrap();
        assert_eq!((r.outcome, r.now), (HeartbeatOutcome::TooMany, 1000));
        assert!(h(arr(vec![int(1), int(1000), int(11_000)])).is_err(), "short");
        assert!(h(arr(vec![int(2), int(1000), int(11_000), s("active")])).is_err());
        let r = h(arr(vec![int(Code::WrongState as i64), int(1000), int(0), s("")])).unwrap();
        assert_eq!(r.outcome, HeartbeatOutcome::MusterNode);
        let r = h(arr(vec![int(Code::NotOwner as i64), int(1000), int(0), s("")])).unwrap();
        assert_eq!(r.outcome, HeartbeatOutcome::OtherOwner);
        assert!(
            h(arr(vec![int(Code::NotFound as i64), int(1000), int(0), s("")])).is_err(),
            "not heartbeat's code"
        );
        assert!(h(arr(vec![int(-999), int(1000), int(0), s("")])).is_err());

        let p = |v| PruneResult::from_redis_value(v);
        let r = p(arr(vec![int(1), int(2), int(3), int(4), int(5)])).unwrap();
        assert_eq!(
            (r.marked, r.removed, r.alive, r.expired, r.grace_until),
            (1, 2, 3, 4, 5)
        );
        assert!(p(arr(vec![int(1), int(2), int(3), int(4)])).is_err(), "short");
        assert!(p(arr(vec![int(1), int(2), s("x"), int(4), int(5)])).is_err());

        let d = |v| DrainReply::from_redis_value(v);
        assert_eq!(d(int(1)).unwrap(), DrainReply::Marked);
        assert_eq!(d(int(2)).unwrap(), DrainReply::AlreadyDraining);
        assert_eq!(d(int(Code::NodeNotAlive as i64)).unwrap(), DrainReply::NotAlive);
        assert!(d(int(0)).is_err());
        assert!(d(int(Code::NotFound as i64)).is_err());
        assert!(d(arr(vec![])).is_err());

        let l = |v| LeaveReply::from_redis_value(v);
        assert_eq!(l(int(1)).unwrap(), LeaveReply::Removed);
        assert_eq!(l(int(2)).unwrap(), LeaveReply::Kept);
        assert_eq!(l(int(Code::NotFound as i64)).unwrap(), LeaveReply::NotFound);
        assert_eq!(l(int(Code::NotOwner as i64)).unwrap(), LeaveReply::OtherOwner);
        assert!(l(int(0)).is_err());
        assert!(l(int(3)).is_err());
        assert!(l(s("x")).is_err());
    }
}
