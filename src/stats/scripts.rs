//! The history's one script, `lua/flush.lua`: its arguments mirror the
//! script's header; the reply is the number of fields that grew.

use crate::store::{Keys, ScriptCall};

pub(crate) struct Flush<'a> {
    /// Minutes since the Unix epoch (Redis time).
    pub minute: i64,
    /// The UTC day that minute falls in, days since the epoch.
    pub day: i64,
    /// `<queue>:<f>` and the node's value for it.
    pub fields: &'a [(String, u64)],
}

impl ScriptCall for Flush<'_> {
    type Reply = u64;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![k.stats_minute(self.minute), k.stats_day(self.day)]
    }
    fn args(&self) -> Vec<String> {
        let mut args = vec![
            super::MINUTE_TTL_MS.to_string(),
            super::DAY_TTL_MS.to_string(),
            self.fields.len().to_string(),
        ];
        for (f, v) in self.fields {
            args.push(f.clone());
            args.push(v.to_string());
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::reply::testing::check_with_extra;

    #[test]
    fn the_call_matches_the_header() {
        let fields = vec![("*:s".to_string(), 3), ("a:s".to_string(), 3)];
        let call = Flush {
            minute: 1,
            day: 0,
            fields: &fields,
        };
        check_with_extra(&call, include_str!("lua/flush.lua"), 4);
    }
}
