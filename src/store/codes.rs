//! The error codes scripts return: one table shared by Lua and Rust.
//!
//! Each code is a negative integer. The table is rendered into the prelude
//! as the Lua table `E` (`E.NOT_FOUND`, `E.STALE`, ...), so a script never
//! writes a bare number and the Rust side decodes every code by name. A
//! script's reply starts with its code: a non-negative number is that
//! script's own success outcome (documented in its header), a negative one
//! is one of these.

/// Declares the codes once, with their Lua names.
macro_rules! codes {
    ($($(#[doc = $doc:literal])* $name:ident = $value:literal, $lua:literal;)*) => {
        /// A script's refusal (see the module doc).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(i64)]
        pub(crate) enum Code {
            $($(#[doc = $doc])* $name = $value,)*
        }

        impl Code {
            /// Every code, in table order.
            pub(crate) const ALL: &[Code] = &[$(Code::$name,)*];

            /// The name scripts use (`E.<name>`).
            pub(crate) fn lua_name(self) -> &'static str {
                match self {
                    $(Code::$name => $lua,)*
                }
            }

            /// The code with this value, if it is one.
            pub(crate) fn from_i64(v: i64) -> Option<Code> {
                match v {
                    $($value => Some(Code::$name),)*
                    _ => None,
                }
            }
        }
    };
}

codes! {
    /// No such task, workflow, schedule, barrier, lock or node.
    NotFound = -1, "NOT_FOUND";
    /// The fencing token is not the current one, or the task is not running
    /// (G1), or the candidate is not the leader (at the epoch given): nothing
    /// changed.
    Stale = -2, "STALE";
    /// The node or worker is not registered or its heartbeat expired.
    NodeNotAlive = -3, "NODE_NOT_ALIVE";
    /// The node or worker is draining or has left: no new work.
    NodeDraining = -4, "NODE_DRAINING";
    /// `tasks.max_queues` would be exceeded.
    TooManyQueues = -5, "TOO_MANY_QUEUES";
    /// `tasks.max_groups` would be exceeded.
    TooManyGroups = -6, "TOO_MANY_GROUPS";
    /// The alias is held by another live task.
    AliasTaken = -7, "ALIAS_TAKEN";
    /// The time given is beyond the furthest allowed (a `run_at` more than
    /// the maximum delay after Redis time).
    TooFar = -8, "TOO_FAR";
    /// The state does not allow the change (a finished task cancelled, a
    /// task deleted while it runs, a barrier held by another holder, a
    /// DoubleBarrier entered with another count, a disabled schedule fired,
    /// a schedule written from config.toml changed through the API, ...).
    WrongState = -9, "WRONG_STATE";
    /// The lease lapsed (by Redis time, or its node is gone) before the
    /// call: the lock is free now.
    Lapsed = -10, "LAPSED";
    /// The node is not a participant (of the barrier round).
    NotParticipant = -11, "NOT_PARTICIPANT";
    /// A bound without a code of its own would be exceeded:
    /// `barriers.max_barriers`, `barriers.max_open_rounds`, a
    /// DoubleBarrier's count of entrants, `schedules.max_schedules`, or
    /// `nodes.max_nodes` (the script's header says which).
    TooMany = -12, "TOO_MANY";
    /// A create of something that exists already (a schedule id).
    Exists = -13, "EXISTS";
    /// The record belongs to someone else: a muster node's registration
    /// written by a worker heartbeat, or a live worker's registration by
    /// another credential than the one that registered it (issue 36).
    NotOwner = -14, "NOT_OWNER";
    /// A task names a flow-control limit that is not defined (neither the
    /// limit nor, for a key `name:key`, its template `name:*`).
    UnknownLimit = -15, "UNKNOWN_LIMIT";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_negative_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for c in Code::ALL {
            let v = *c as i64;
            assert!(v < 0, "{c:?}");
            assert!(seen.insert(v), "{c:?} repeats {v}");
            assert_eq!(Code::from_i64(v), Some(*c));
        }
        assert_eq!(Code::from_i64(0), None);
    }
}
