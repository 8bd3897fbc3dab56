//! The election scripts: campaign and resign.

use super::{
    Code, FromRedisValue, Keys, ParsingError, ScriptCall, Value, decode_error, election_key, elections_key, positive,
    read,
};

// --- campaign.lua -------------------------------------------------------------

pub(crate) struct Campaign<'a> {
    pub name: &'a str,
    pub candidate: &'a str,
    pub ttl_ms: u64,
    /// The leader's value (JSON text, may be '').
    pub value: &'a str,
    pub me: &'a str,
}

/// What a campaign did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Campaigned {
    /// Another candidate leads.
    Lost = 0,
    /// Elected now.
    Elected = 1,
    /// Already the leader: lease renewed.
    Renewed = 2,
}

/// A leadership's fields as stored ('' and 0 when nobody leads).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LeaderRow {
    pub leader: String,
    pub epoch: i64,
    pub expires_at: i64,
    /// JSON text, or ''.
    pub value: String,
    pub elected_at: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CampaignReply {
    pub outcome: Campaigned,
    pub row: LeaderRow,
}

impl ScriptCall for Campaign<'_> {
    type Reply = CampaignReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![election_key(k, self.name), elections_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.name.to_string(),
            self.candidate.to_string(),
            self.ttl_ms.to_string(),
            self.value.to_string(),
            self.me.to_string(),
        ]
    }
}

impl FromRedisValue for CampaignReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let outcome = match r.code()? {
                Ok(0) => Campaigned::Lost,
                Ok(1) => Campaigned::Elected,
                Ok(2) => Campaigned::Renewed,
                other => return Err(decode_error(format!("campaign outcome {other:?}"))),
            };
            Ok(CampaignReply {
                outcome,
                row: LeaderRow {
                    leader: r.text("leader")?,
                    epoch: r.int("epoch")?,
                    expires_at: r.int("expires_at")?,
                    value: r.text("value")?,
                    elected_at: r.int("elected_at")?,
                },
            })
        })
    }
}

// --- resign.lua ---------------------------------------------------------------

pub(crate) struct Resign<'a> {
    pub name: &'a str,
    pub candidate: &'a str,
    /// None: whatever epoch it leads.
    pub epoch: Option<u64>,
    pub me: &'a str,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ResignReply {
    /// The epoch that ended.
    Resigned { epoch: u64 },
    /// Not the leader (at that epoch): the current leader and epoch ('' and
    /// None when nobody leads).
    NotLeader { leader: String, epoch: Option<u64> },
}

impl ScriptCall for Resign<'_> {
    type Reply = ResignReply;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![election_key(k, self.name), elections_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![
            self.name.to_string(),
            self.candidate.to_string(),
            self.epoch.map(|e| e.to_string()).unwrap_or_default(),
            self.me.to_string(),
        ]
    }
}

impl FromRedisValue for ResignReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        read(&v, |r| {
            let code = r.code()?;
            let (leader, epoch) = (r.text("leader")?, r.int("epoch")?);
            Ok(match code {
                Ok(1) => ResignReply::Resigned { epoch: epoch as u64 },
                Err(Code::Stale) => ResignReply::NotLeader {
                    leader,
                    epoch: positive(epoch),
                },
                other => return Err(decode_error(format!("resign outcome {other:?}"))),
            })
        })
    }
}
