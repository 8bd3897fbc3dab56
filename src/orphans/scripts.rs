//! The orphan scripts: one argument struct and one reply type per script,
//! each mirroring the header of its `lua/*.lua` file (keys and arguments in
//! the documented order; replies decoded strictly). `lua/lib.lua` is the
//! library they share; [`RecoveryOpts`] is the five arguments its
//! `recovery_opts` reads.

use redis::{FromRedisValue, ParsingError, Value};

use super::{Recovery, Timeouts, Unacked};
use crate::store::reply::{Reader, decode_error};
use crate::store::{Keys, Lua, ScriptCall, ScriptCtx};
use crate::traces::Traced;

/// Every orphan script, loaded once per node.
pub(crate) struct Scripts {
    pub recover: Lua,
    pub timeouts: Lua,
    pub unacked: Lua,
    pub sweep: Lua,
}

impl Scripts {
    pub(crate) fn new(ctx: &ScriptCtx) -> Scripts {
        let l = |name, src| Lua::load(name, src, ctx);
        Scripts {
            recover: l("orphans_recover", include_str!("lua/recover.lua")),
            timeouts: l("orphans_timeouts", include_str!("lua/timeouts.lua")),
            unacked: l("orphans_unacked", include_str!("lua/unacked.lua")),
            sweep: l("orphans_sweep", include_str!("lua/sweep.lua")),
        }
    }
}

// Keys the scripts are called with.

/// Zset: running task id -> deadline (Redis ms), for the timeout monitor.
pub(crate) fn deadlines_key(k: &Keys) -> String {
    format!("{}:deadlines", k.prefix())
}
/// Zset: claimed task id -> end of its claim lease (Redis ms), until the
/// task is acknowledged (`lua/unacked.lua`).
pub(crate) fn unacked_key(k: &Keys) -> String {
    format!("{}:unacked", k.prefix())
}
/// Zset: the running tasks of queue `q`.
pub(crate) fn running_key(k: &Keys, q: &str) -> String {
    format!("{}:q:{q}:running", k.prefix())
}
/// Zset: recovery records by detection time (`lua/lib.lua`).
pub(crate) fn history_key(k: &Keys) -> String {
    format!("{}:orphans:history", k.prefix())
}
/// Hash: recoveries per action (`lua/lib.lua`).
pub(crate) fn counts_key(k: &Keys) -> String {
    format!("{}:orphans:counts", k.prefix())
}

/// Decodes a whole reply with a [`Reader`]; every element must be read.
fn read<T>(v: &Value, f: impl FnOnce(&mut Reader<'_>) -> Result<T, ParsingError>) -> Result<T, ParsingError> {
    let mut r = Reader::new(v);
    let out = f(&mut r)?;
    if r.remaining() != 0 {
        return Err(decode_error(format!("{} elements more than expected", r.remaining())));
    }
    Ok(out)
}

/// A non-negative count.
fn count(r: &mut Reader<'_>, what: &str) -> Result<i64, ParsingError> {
    let n = r.int(what)?;
    if n < 0 {
        return Err(decode_error(format!("{what} is negative: {n}")));
    }
    Ok(n)
}

/// A nested array of queue names.
fn names(r: &mut Reader<'_>, what: &str) -> Result<Vec<String>, ParsingError> {
    let mut a = r.array(what)?;
    let mut out = Vec::with_capacity(a.remaining());
    while a.remaining() > 0 {
        out.push(a.text(what)?);
    }
    Ok(out)
}

/// The arguments `recovery_opts` of `lua/lib.lua` reads, in its order.
pub(crate) struct RecoveryOpts<'a> {
    /// For tasks cancelled on recovery.
    pub retention_ms: u64,
    /// For tasks dead on recovery.
    pub dead_retention_ms: u64,
    /// Orphan history, most records.
    pub history_max: u32,
    /// Orphan history, oldest record.
    pub history_max_age_ms: u64,
    /// The acting node, for events.
    pub actor: &'a str,
}

impl RecoveryOpts<'_> {
    fn args(&self) -> [String; 5] {
        [
            self.retention_ms.to_string(),
            self.dead_retention_ms.to_string(),
            self.history_max.to_string(),
            self.history_max_age_ms.to_string(),
            self.actor.to_string(),
        ]
    }
}

// --- recover.lua --------------------------------------------------------------

pub(crate) struct Recover<'a> {
    /// The node ttl (sets the pass cadence, see liveness.lua).
    pub ttl_ms: u64,
    /// Most tasks recovered per pass.
    pub limit: u32,
    pub opts: RecoveryOpts<'a>,
}

impl ScriptCall for Recover<'_> {
    type Reply = Recovery;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![k.nodes()]
    }
    fn args(&self) -> Vec<String> {
        let mut args = vec![self.ttl_ms.to_string(), self.limit.to_string()];
        args.extend(self.opts.args());
        args
    }
}

impl FromRedisValue for Recovery {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(Recovery {
                requeued: count(r, "requeued")?,
                dead: count(r, "dead")?,
                cancelled: count(r, "cancelled")?,
                stale: count(r, "stale")?,
                grace_until: count(r, "grace_until_ms")?,
                dead_queues: names(r, "the dead tasks' queues")?,
                traced: traced(r, "the traced recovered tasks")?,
            })
        })
    }
}

// --- timeouts.lua -------------------------------------------------------------

pub(crate) struct TimeoutsCall<'a> {
    /// The node ttl (grace).
    pub ttl_ms: u64,
    /// Most tasks per pass.
    pub limit: u32,
    /// In [0, 1), for the retry backoff.
    pub jitter: f64,
    /// For tasks cancelled here.
    pub retention_ms: u64,
    pub dead_retention_ms: u64,
    /// The acting node, for events.
    pub actor: &'a str,
}

impl ScriptCall for TimeoutsCall<'_> {
    type Reply = Timeouts;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![deadlines_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.ttl_ms.to_string(),
            self.limit.to_string(),
            format!("{:.6}", self.jitter),
            self.retention_ms.to_string(),
            self.dead_retention_ms.to_string(),
            self.actor.to_string(),
        ]
    }
}

impl FromRedisValue for Timeouts {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(Timeouts {
                timed_out: count(r, "timed_out")?,
                retried: count(r, "retried")?,
                dead: count(r, "dead")?,
                grace_until: count(r, "grace_until_ms")?,
                timed_out_queues: names(r, "the timed-out tasks' queues")?,
                dead_queues: names(r, "the dead tasks' queues")?,
                traced: traced(r, "the traced timed-out tasks")?,
            })
        })
    }
}

// --- unacked.lua --------------------------------------------------------------

pub(crate) struct UnackedCall<'a> {
    /// The node ttl (grace).
    pub ttl_ms: u64,
    /// Most tasks per pass.
    pub limit: u32,
    /// For tasks cancelled here.
    pub retention_ms: u64,
    /// The acting node, for events.
    pub actor: &'a str,
    /// Lapses not counted as attempts, per task (0: none counted).
    pub max_unacked: u32,
    /// For tasks dead here.
    pub dead_retention_ms: u64,
}

impl ScriptCall for UnackedCall<'_> {
    type Reply = Unacked;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![unacked_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.ttl_ms.to_string(),
            self.limit.to_string(),
            self.retention_ms.to_string(),
            self.actor.to_string(),
            self.max_unacked.to_string(),
            self.dead_retention_ms.to_string(),
        ]
    }
}

impl FromRedisValue for Unacked {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(Unacked {
                requeued: count(r, "requeued")?,
                cancelled: count(r, "cancelled")?,
                grace_until: count(r, "grace_until_ms")?,
                requeued_queues: names(r, "the requeued tasks' queues")?,
                dead: count(r, "dead")?,
                dead_queues: names(r, "the dead tasks' queues")?,
                traced: traced(r, "the traced tasks put back")?,
            })
        })
    }
}

/// A flat list of (id, action, queue, traceparent) quadruples.
fn traced(r: &mut Reader<'_>, what: &str) -> Result<Vec<Traced>, ParsingError> {
    let flat = names(r, what)?;
    if flat.len() % 4 != 0 {
        return Err(decode_error(format!(
            "{what}: {} entries, not a multiple of 4",
            flat.len()
        )));
    }
    Ok(flat
        .chunks_exact(4)
        .map(|c| (c[0].clone(), c[1].clone(), c[2].clone(), c[3].clone()))
        .collect())
}

// --- sweep.lua ----------------------------------------------------------------

pub(crate) struct Sweep<'a> {
    pub queue: &'a str,
    /// The node ttl (grace).
    pub ttl_ms: u64,
    /// Entries looked at per index.
    pub window: u32,
    pub opts: RecoveryOpts<'a>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SweepReply {
    pub recovered: i64,
    /// Dangling index entries removed.
    pub removed: i64,
}

impl ScriptCall for Sweep<'_> {
    type Reply = SweepReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![running_key(k, self.queue)]
    }
    fn args(&self) -> Vec<String> {
        let mut args = vec![self.queue.to_string(), self.ttl_ms.to_string(), self.window.to_string()];
        args.extend(self.opts.args());
        args
    }
}

impl FromRedisValue for SweepReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            Ok(SweepReply {
                recovered: count(r, "recovered")?,
                removed: count(r, "dangling_removed")?,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::reply::testing::{arr, check, int, s};

    fn opts() -> RecoveryOpts<'static> {
        RecoveryOpts {
            retention_ms: 1,
            dead_retention_ms: 2,
            history_max: 3,
            history_max_age_ms: 4,
            actor: "n",
        }
    }

    #[test]
    fn every_call_passes_what_its_header_documents() {
        let recover = Recover {
            ttl_ms: 5000,
            limit: 1000,
            opts: opts(),
        };
        check(&recover, include_str!("lua/recover.lua"));
        // recovery_opts(now, 3): ARGV[3..7].
        assert_eq!(&recover.args()[2..], ["1", "2", "3", "4", "n"]);
        check(
            &TimeoutsCall {
                ttl_ms: 5000,
                limit: 1000,
                jitter: 0.5,
                retention_ms: 1,
                dead_retention_ms: 1,
                actor: "n",
            },
            include_str!("lua/timeouts.lua"),
        );
        check(
            &UnackedCall {
                ttl_ms: 5000,
                limit: 1000,
                retention_ms: 1,
                actor: "n",
                max_unacked: 5,
                dead_retention_ms: 1,
            },
            include_str!("lua/unacked.lua"),
        );
        let sweep = Sweep {
            queue: "q",
            ttl_ms: 5000,
            window: 2000,
            opts: opts(),
        };
        check(&sweep, include_str!("lua/sweep.lua"));
        // recovery_opts(now, 4): ARGV[4..8].
        assert_eq!(&sweep.args()[3..], ["1", "2", "3", "4", "n"]);
        let k = Keys::new("muster");
        assert_eq!(recover.keys(&k), ["{muster}:nodes"]);
        assert_eq!(deadlines_key(&k), "{muster}:deadlines");
        assert_eq!(unacked_key(&k), "{muster}:unacked");
        assert_eq!(running_key(&k, "q"), "{muster}:q:q:running");
        assert_eq!(history_key(&k), "{muster}:orphans:history");
        assert_eq!(counts_key(&k), "{muster}:orphans:counts");
    }

    #[test]
    fn scripts_return_no_bare_negative_codes() {
        for src in [
            include_str!("lua/recover.lua"),
            include_str!("lua/timeouts.lua"),
            include_str!("lua/unacked.lua"),
            include_str!("lua/sweep.lua"),
            include_str!("lua/lib.lua"),
        ] {
            for l in src.lines().filter(|l| l.contains("return")) {
                let after = &l[l.find("return").unwrap()..];
                assert!(!after.starts_with("return -") && !after.starts_with("return {-"), "{l}");
            }
        }
    }

    #[test]
    fn replies_decode_strictly() {
        let r = Recovery::from_redis_value(arr(vec![
            int(1),
            int(2),
            int(0),
            int(3),
            int(0),
            arr(vec![s("a"), s("b")]),
            arr(vec![s("t1"), s("requeued"), s("q"), s("00-tp")]),
        ]))
        .unwrap();
        assert_eq!(
            (r.requeued, r.dead, r.cancelled, r.stale, r.grace_until),
            (1, 2, 0, 3, 0)
        );
        assert_eq!(r.dead_queues, ["a", "b"]);
        assert_eq!(r.traced, [("t1".into(), "requeued".into(), "q".into(), "00-tp".into())]);
        // Short, with a missing list, or with a negative count: a bug.
        assert!(Recovery::from_redis_value(arr(vec![int(0), int(0), int(0), int(0), int(0)])).is_err());
        assert!(Recovery::from_redis_value(arr(vec![int(0), int(0), int(0), int(0), int(0), arr(vec![])])).is_err());
        assert!(
            Recovery::from_redis_value(arr(vec![
                int(-1),
                int(0),
                int(0),
                int(0),
                int(0),
                arr(vec![]),
                arr(vec![])
            ]))
            .is_err()
        );

        let t = Timeouts::from_redis_value(arr(vec![
            int(2),
            int(1),
            int(1),
            int(0),
            arr(vec![s("q"), s("q")]),
            arr(vec![s("q")]),
            arr(vec![s("t1"), s("dead"), s("q"), s("00-tp")]),
        ]))
        .unwrap();
        assert_eq!((t.timed_out, t.retried, t.dead, t.grace_until), (2, 1, 1, 0));
        assert_eq!(t.traced, [("t1".into(), "dead".into(), "q".into(), "00-tp".into())]);
        assert_eq!((t.timed_out_queues.len(), t.dead_queues), (2, vec!["q".to_string()]));
        // The grace reply: nothing done, empty lists.
        let t = Timeouts::from_redis_value(arr(vec![
            int(0),
            int(0),
            int(0),
            int(99),
            arr(vec![]),
            arr(vec![]),
            arr(vec![]),
        ]))
        .unwrap();
        assert_eq!(t.grace_until, 99);
        assert!(Timeouts::from_redis_value(arr(vec![int(0), int(0), int(0), int(99)])).is_err());
        // The traced list is quadruples.
        assert!(
            Timeouts::from_redis_value(arr(vec![
                int(0),
                int(0),
                int(0),
                int(0),
                arr(vec![]),
                arr(vec![]),
                arr(vec![s("t1"), s("dead")])
            ]))
            .is_err()
        );

        let u = Unacked::from_redis_value(arr(vec![
            int(2),
            int(1),
            int(0),
            arr(vec![s("q"), s("r")]),
            int(1),
            arr(vec![s("d")]),
            arr(vec![s("t2"), s("requeued"), s("q"), s("00-tp")]),
        ]))
        .unwrap();
        assert_eq!(u.traced, [("t2".into(), "requeued".into(), "q".into(), "00-tp".into())]);
        assert_eq!((u.requeued, u.cancelled, u.grace_until, u.dead), (2, 1, 0, 1));
        assert_eq!(
            (u.requeued_queues, u.dead_queues),
            (vec!["q".into(), "r".into()], vec!["d".to_string()])
        );
        assert!(Unacked::from_redis_value(arr(vec![int(0), int(0), int(99)])).is_err());
        assert!(Unacked::from_redis_value(arr(vec![int(0), int(0), int(99), arr(vec![])])).is_err());

        assert_eq!(
            SweepReply::from_redis_value(arr(vec![int(1), int(4)])).unwrap(),
            SweepReply {
                recovered: 1,
                removed: 4
            }
        );
        assert!(SweepReply::from_redis_value(arr(vec![int(1)])).is_err());
        assert!(SweepReply::from_redis_value(arr(vec![int(1), int(2), int(3)])).is_err());
    }
}
