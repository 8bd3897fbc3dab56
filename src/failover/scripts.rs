//! The failover script: its argument struct and reply type, mirroring the
//! header of `lua/epoch.lua` (keys and arguments in the documented order; the
//! reply decoded strictly). The store runs it on the new master's own
//! connection during a switch ([`Store::set_epoch_script`]), so it is not
//! sent through `Store::run`; the call still builds its keys and arguments.
//!
//! [`Store::set_epoch_script`]: crate::store::Store::set_epoch_script

use redis::{FromRedisValue, ParsingError, Value};

use crate::store::reply::{Reader, decode_error};
use crate::store::{Keys, ScriptCall};

/// String: the fencing epoch (absent: 1).
pub(crate) fn epoch_key(k: &Keys) -> String {
    format!("{}:epoch", k.prefix())
}
/// String: the run_id of the master that set the epoch.
pub(crate) fn epoch_master_key(k: &Keys) -> String {
    format!("{}:epoch:master", k.prefix())
}

// --- epoch.lua ----------------------------------------------------------------

pub(crate) struct Epoch<'a> {
    /// The run_id of the master the script runs on (from INFO server).
    pub run_id: &'a str,
    /// The highest epoch the caller has seen + 1.
    pub min_epoch: u64,
    /// The caller, for the event.
    pub node: &'a str,
    /// The master's address, for the event.
    pub addr: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EpochReply {
    /// The fencing epoch now.
    pub epoch: u64,
    /// Whether this call raised it (event redis.failover emitted).
    pub bumped: bool,
}

impl ScriptCall for Epoch<'_> {
    type Reply = EpochReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![epoch_key(k), epoch_master_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.run_id.to_string(),
            self.min_epoch.to_string(),
            self.node.to_string(),
            self.addr.to_string(),
        ]
    }
}

impl FromRedisValue for EpochReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let mut r = Reader::new(&v);
        let epoch = r.int("epoch")?;
        let bumped = r.int("bumped")?;
        if epoch < 1 || !(0..=1).contains(&bumped) {
            return Err(decode_error(format!("epoch {epoch}, bumped {bumped}")));
        }
        Ok(EpochReply {
            epoch: epoch as u64,
            bumped: bumped == 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::reply::testing::{arr, header, int};

    #[test]
    fn the_call_passes_what_its_header_documents() {
        let k = Keys::new("muster");
        let call = Epoch {
            run_id: "r",
            min_epoch: 3,
            node: "n1",
            addr: "127.0.0.1:6379",
        };
        let src = include_str!("lua/epoch.lua");
        assert_eq!((call.keys(&k).len(), call.args().len()), header(src));
        assert_eq!(
            call.keys(&k),
            vec![format!("{}:epoch", k.prefix()), format!("{}:epoch:master", k.prefix())]
        );
        assert_eq!(call.args()[1], "3");
    }

    #[test]
    fn the_reply_decodes_strictly() {
        let e = |v| EpochReply::from_redis_value(v);
        assert_eq!(
            e(arr(vec![int(4), int(1)])).unwrap(),
            EpochReply { epoch: 4, bumped: true }
        );
        assert_eq!(
            e(arr(vec![int(1), int(0)])).unwrap(),
            EpochReply {
                epoch: 1,
                bumped: false
            }
        );
        assert!(e(arr(vec![int(4)])).is_err(), "short");
        assert!(e(arr(vec![int(4), int(2)])).is_err());
        assert!(e(arr(vec![int(0), int(1)])).is_err());
        assert!(e(arr(vec![int(-1), int(0)])).is_err());
    }
}
