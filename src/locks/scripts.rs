//! The lock and election scripts: one argument struct and one reply type per
//! script, each mirroring the header of its `lua/*.lua` file (keys and
//! arguments in the documented order; replies decoded strictly, codes by
//! name).

use redis::{FromRedisValue, ParsingError, Value};

use crate::store::reply::{decode_error, read};
use crate::store::{Code, Keys, Lua, ScriptCall, ScriptCtx};

mod elections;
pub(crate) use elections::*;

/// Every lock and election script, loaded once per node.
pub(crate) struct Scripts {
    pub acquire: Lua,
    pub renew: Lua,
    pub release: Lua,
    pub dequeue: Lua,
    pub expire: Lua,
    pub campaign: Lua,
    pub resign: Lua,
}

impl Scripts {
    pub(super) fn new(ctx: &ScriptCtx) -> Scripts {
        let l = |name, src| Lua::load(name, src, ctx);
        Scripts {
            acquire: l("lock_acquire", include_str!("lua/acquire.lua")),
            renew: l("lock_renew", include_str!("lua/renew.lua")),
            release: l("lock_release", include_str!("lua/release.lua")),
            dequeue: l("lock_dequeue", include_str!("lua/dequeue.lua")),
            expire: l("lease_expire", include_str!("lua/expire.lua")),
            campaign: l("election_campaign", include_str!("lua/campaign.lua")),
            resign: l("election_resign", include_str!("lua/resign.lua")),
        }
    }
}

// The key layout of `lua/lib.lua`.

/// Hash: the lease of lock `l`.
pub(crate) fn lock_key(k: &Keys, l: &str) -> String {
    format!("{}:lock:{l}", k.prefix())
}
/// Sorted set: lock `l`'s FIFO queue of waiting owners.
pub(crate) fn queue_key(k: &Keys, l: &str) -> String {
    format!("{}:lock:{l}:q", k.prefix())
}
/// Sorted set: lock `l`'s waiting owner -> when its place lapses.
pub(crate) fn queue_exp_key(k: &Keys, l: &str) -> String {
    format!("{}:lock:{l}:qx", k.prefix())
}
/// Sorted set: held locks by lease expiry.
pub(crate) fn locks_key(k: &Keys) -> String {
    format!("{}:locks", k.prefix())
}
/// Hash: the leadership of election `e`.
pub(crate) fn election_key(k: &Keys, e: &str) -> String {
    format!("{}:election:{e}", k.prefix())
}
/// Sorted set: led elections by lease expiry.
pub(crate) fn elections_key(k: &Keys) -> String {
    format!("{}:elections", k.prefix())
}

/// A token or epoch as returned: 0 means none.
fn positive(v: i64) -> Option<u64> {
    (v > 0).then_some(v as u64)
}

// --- acquire.lua --------------------------------------------------------------

pub(crate) struct Acquire<'a> {
    pub name: &'a str,
    pub owner: &'a str,
    pub ttl_ms: u64,
    /// '' or the node the lease is tied to.
    pub node: &'a str,
    /// Keep a place in the queue when not granted.
    pub queue: bool,
    pub waiter_ttl_ms: u64,
    pub node_ttl_ms: u64,
    /// The acting muster node (events).
    pub me: &'a str,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AcquireReply {
    /// 1 acquired now, or 2 already held by this owner (`again`).
    Granted { token: u64, expires_at: i64, again: bool },
    /// 0: the holder ('' when free but others are ahead) and the 1-based
    /// place in the queue (0 when not queued).
    Busy { holder: String, position: u32 },
    /// The given node is not alive.
    NodeNotAlive,
}

impl ScriptCall for Acquire<'_> {
    type Reply = AcquireReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![
            lock_key(k, self.name),
            queue_key(k, self.name),
            queue_exp_key(k, self.name),
            locks_key(k),
        ]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.name.to_string(),
            self.owner.to_string(),
            self.ttl_ms.to_string(),
            self.node.to_string(),
            if self.queue { "1" } else { "0" }.into(),
            self.waiter_ttl_ms.to_string(),
            self.node_ttl_ms.to_string(),
            self.me.to_string(),
        ]
    }
}

impl FromRedisValue for AcquireReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let (token, expires_at) = (r.int("token")?, r.int("expires_at")?);
            let (holder, position) = (r.text("holder")?, r.int("position")?);
            Ok(match code {
                Ok(c @ (1 | 2)) => AcquireReply::Granted {
                    token: token as u64,
                    expires_at,
                    again: c == 2,
                },
                Ok(0) => AcquireReply::Busy {
                    holder,
                    position: position as u32,
                },
                Err(Code::NodeNotAlive) => AcquireReply::NodeNotAlive,
                other => return Err(decode_error(format!("acquire outcome {other:?}"))),
            })
        })
    }
}

// --- dequeue.lua --------------------------------------------------------------

pub(crate) struct Dequeue<'a> {
    pub name: &'a str,
    pub owner: &'a str,
    pub me: &'a str,
}

/// Whether the owner was waiting (and left the queue).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Dequeued(pub bool);

impl ScriptCall for Dequeue<'_> {
    type Reply = Dequeued;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![
            lock_key(k, self.name),
            queue_key(k, self.name),
            queue_exp_key(k, self.name),
        ]
    }
    fn args(&self) -> Vec<String> {
        vec![self.name.to_string(), self.owner.to_string(), self.me.to_string()]
    }
}

impl FromRedisValue for Dequeued {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| match r.code()? {
            Ok(c @ (0 | 1)) => Ok(Dequeued(c == 1)),
            other => Err(decode_error(format!("dequeue outcome {other:?}"))),
        })
    }
}

// --- renew.lua ----------------------------------------------------------------

pub(crate) struct Renew<'a> {
    pub name: &'a str,
    pub token: u64,
    pub ttl_ms: u64,
    pub node_ttl_ms: u64,
    pub me: &'a str,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RenewReply {
    Renewed {
        expires_at: i64,
    },
    /// The current holder and token ('' and None when free).
    Stale {
        holder: String,
        token: Option<u64>,
    },
    /// The lease had lapsed (or its node is gone): the lock is free now.
    Lapsed,
}

impl ScriptCall for Renew<'_> {
    type Reply = RenewReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![lock_key(k, self.name), locks_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.name.to_string(),
            self.token.to_string(),
            self.ttl_ms.to_string(),
            self.node_ttl_ms.to_string(),
            self.me.to_string(),
        ]
    }
}

impl FromRedisValue for RenewReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let expires_at = r.int("expires_at")?;
            let (holder, token) = (r.text("holder")?, r.int("token")?);
            Ok(match code {
                Ok(1) => RenewReply::Renewed { expires_at },
                Err(Code::Stale) => RenewReply::Stale {
                    holder,
                    token: positive(token),
                },
                Err(Code::Lapsed) => RenewReply::Lapsed,
                other => return Err(decode_error(format!("renew outcome {other:?}"))),
            })
        })
    }
}

// --- release.lua --------------------------------------------------------------

pub(crate) struct Release<'a> {
    pub name: &'a str,
    /// None breaks the lock whoever holds it.
    pub token: Option<u64>,
    /// Who released, for the event.
    pub actor: &'a str,
    pub node_ttl_ms: u64,
    pub me: &'a str,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ReleaseReply {
    Released,
    /// The current holder and token ('' and None when free).
    Stale {
        holder: String,
        token: Option<u64>,
    },
    /// Not held (and no token given).
    NotHeld,
}

impl ScriptCall for Release<'_> {
    type Reply = ReleaseReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![lock_key(k, self.name), locks_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.name.to_string(),
            self.token.map(|t| t.to_string()).unwrap_or_default(),
            self.actor.to_string(),
            self.node_ttl_ms.to_string(),
            self.me.to_string(),
        ]
    }
}

impl FromRedisValue for ReleaseReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let (holder, token) = (r.text("holder")?, r.int("token")?);
            Ok(match code {
                Ok(1) => ReleaseReply::Released,
                Err(Code::Stale) => ReleaseReply::Stale {
                    holder,
                    token: positive(token),
                },
                Err(Code::NotFound) => ReleaseReply::NotHeld,
                other => return Err(decode_error(format!("release outcome {other:?}"))),
            })
        })
    }
}

// --- expire.lua ---------------------------------------------------------------

pub(crate) struct Expire<'a> {
    /// Most leases looked at per kind and call.
    pub limit: u32,
    pub node_ttl_ms: u64,
    pub me: &'a str,
}

/// How many leases ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Expired {
    pub locks: i64,
    pub elections: i64,
}

impl ScriptCall for Expire<'_> {
    type Reply = Expired;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![locks_key(k), elections_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.limit.to_string(),
            self.node_ttl_ms.to_string(),
            self.me.to_string(),
        ]
    }
}

impl FromRedisValue for Expired {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(Expired {
                locks: r.int("locks_expired")?,
                elections: r.int("elections_expired")?,
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
            &Acquire {
                name: "l",
                owner: "o",
                ttl_ms: 1,
                node: "",
                queue: true,
                waiter_ttl_ms: 1,
                node_ttl_ms: 1,
                me: "n",
            },
            include_str!("lua/acquire.lua"),
        );
        check(
            &Dequeue {
                name: "l",
                owner: "o",
                me: "n",
            },
            include_str!("lua/dequeue.lua"),
        );
        check(
            &Renew {
                name: "l",
                token: 1,
                ttl_ms: 1,
                node_ttl_ms: 1,
                me: "n",
            },
            include_str!("lua/renew.lua"),
        );
        check(
            &Release {
                name: "l",
                token: None,
                actor: "a",
                node_ttl_ms: 1,
                me: "n",
            },
            include_str!("lua/release.lua"),
        );
        check(
            &Expire {
                limit: 100,
                node_ttl_ms: 1,
                me: "n",
            },
            include_str!("lua/expire.lua"),
        );
        check(
            &Campaign {
                name: "e",
                candidate: "c",
                ttl_ms: 1,
                value: "",
                me: "n",
            },
            include_str!("lua/campaign.lua"),
        );
        check(
            &Resign {
                name: "e",
                candidate: "c",
                epoch: Some(3),
                me: "n",
            },
            include_str!("lua/resign.lua"),
        );
        let k = Keys::new("muster");
        assert_eq!(lock_key(&k, "l"), "{muster}:lock:l");
        assert_eq!(queue_exp_key(&k, "l"), "{muster}:lock:l:qx");
        assert_eq!(elections_key(&k), "{muster}:elections");
    }

    #[test]
    fn replies_decode_by_code_name_and_strictly() {
        let r = |v| AcquireReply::from_redis_value(v);
        assert_eq!(
            r(arr(vec![int(2), int(7), int(9), s("o"), int(0)])).unwrap(),
            AcquireReply::Granted {
                token: 7,
                expires_at: 9,
                again: true
            }
        );
        assert_eq!(
            r(arr(vec![int(0), int(0), int(0), s(""), int(3)])).unwrap(),
            AcquireReply::Busy {
                holder: String::new(),
                position: 3
            }
        );
        let nna = Code::NodeNotAlive as i64;
        assert_eq!(
            r(arr(vec![int(nna), int(0), int(0), s(""), int(0)])).unwrap(),
            AcquireReply::NodeNotAlive
        );
        assert!(r(arr(vec![int(1), int(7)])).is_err());
        assert!(r(arr(vec![int(Code::Stale as i64), int(0), int(0), s(""), int(0)])).is_err());

        let stale = Code::Stale as i64;
        assert_eq!(
            RenewReply::from_redis_value(arr(vec![int(stale), int(0), s("x"), int(5)])).unwrap(),
            RenewReply::Stale {
                holder: "x".into(),
                token: Some(5)
            }
        );
        assert_eq!(
            RenewReply::from_redis_value(arr(vec![int(Code::Lapsed as i64), int(0), s(""), int(0)])).unwrap(),
            RenewReply::Lapsed
        );
        assert_eq!(
            ReleaseReply::from_redis_value(arr(vec![int(Code::NotFound as i64), s(""), int(0)])).unwrap(),
            ReleaseReply::NotHeld
        );
        assert_eq!(
            ResignReply::from_redis_value(arr(vec![int(stale), s(""), int(0)])).unwrap(),
            ResignReply::NotLeader {
                leader: String::new(),
                epoch: None
            }
        );
        assert_eq!(Dequeued::from_redis_value(int(1)).unwrap(), Dequeued(true));
        assert!(Dequeued::from_redis_value(int(2)).is_err());
        let c = CampaignReply::from_redis_value(arr(vec![int(1), s("c"), int(4), int(10), s(""), int(3)])).unwrap();
        assert_eq!(c.outcome, Campaigned::Elected);
        assert_eq!(c.row.epoch, 4);
        assert!(CampaignReply::from_redis_value(arr(vec![int(1), s("c")])).is_err());
        assert_eq!(
            Expired::from_redis_value(arr(vec![int(2), int(1)])).unwrap(),
            Expired { locks: 2, elections: 1 }
        );
    }
}
